//! The direct bind of autoprepared Queries (`stmts::fastbind`) against the batch fed as
//! frames: every conversation runs twice, once with the direct bind and once with frames
//! only, and the server and the client must get the same bytes (statement names aside,
//! which differ between registries), the counters the same counts.

use super::*;
use crate::session::stmts::autoprepare::Memo;
use crate::stmt::registry::StmtKind;

const ACCOUNT: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = ";

/// `pn_<hex>_<id>` names as `pn_*`.
fn norm(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let mut out = String::new();
    let mut rest = &s[..];
    while let Some(i) = rest.find("pn_") {
        out.push_str(&rest[..i + 3]);
        rest = rest[i + 3..].trim_start_matches(|c: char| c.is_ascii_hexdigit() || c == '_');
        out.push('*');
    }
    out.push_str(rest);
    out
}

/// A frame as its tag and normalized body (lengths left out: names differ in length).
fn norm_frames(buf: &[u8]) -> Vec<String> {
    frames(buf).iter().map(|f| format!("{}:{}", f[0] as char, norm(&f[5..]))).collect()
}

/// Plays the server until nothing more is written to it: answers every request, but the
/// first one of type `fail.0`, answered with the error `fail.1` (the server then skips to
/// the Sync). Logs what the server and the client got.
fn serve(h: &mut H, log: &mut Vec<String>, fail: Option<(u8, Vec<u8>)>) {
    serve_as(h, log, fail, true)
}

/// `serve`, for statements that return rows (`rows`) or none (an UPDATE's NoData and tag).
fn serve_as(h: &mut H, log: &mut Vec<String>, mut fail: Option<(u8, Vec<u8>)>, rows: bool) {
    loop {
        let out = h.s.to_server.split();
        if out.is_empty() {
            break;
        }
        log.push(format!("server got {:?}", norm_frames(&out)));
        let mut skipping = false;
        for f in frames(&out) {
            if skipping && f[0] != b'S' {
                continue;
            }
            if let Some((_, e)) = fail.take_if(|(t, _)| *t == f[0]) {
                h.server(e);
                skipping = true;
                continue;
            }
            match f[0] {
                b'P' => h.server(msg(b'1', b"")),
                b'B' => h.server(msg(b'2', b"")),
                b'D' => {
                    if f[5] == b'S' {
                        h.server(msg(b't', b"\0\0"));
                    }
                    h.server(if rows { rowdesc(&["abalance"], 16400) } else { msg(b'n', b"") });
                }
                b'E' if !rows => h.server(msg(b'C', b"UPDATE 1\0")),
                b'E' => {
                    h.server(msg(b'D', b"\0\x01\0\0\0\x010"));
                    h.server(msg(b'C', b"SELECT 1\0"));
                }
                b'C' => h.server(msg(b'3', b"")),
                b'H' => {}
                b'S' => {
                    skipping = false;
                    h.server(rfq(b'I'));
                }
                b'Q' => {
                    h.server(msg(b'C', b"SELECT 1\0"));
                    h.server(rfq(b'I'));
                }
                t => panic!("unexpected request {}", t as char),
            }
        }
        let writable = h.s.writable_to_client();
        log.push(format!("client got {}", norm(&h.s.to_client.split_to(writable))));
    }
}

/// One Query and the server's answers (`fail` as in `serve`).
fn round(h: &mut H, log: &mut Vec<String>, sql: &str, fail: Option<(u8, Vec<u8>)>) {
    h.client(query(sql));
    log.push(state(h));
    serve(h, log, fail);
    log.push(state(h));
    log.push(format!("actions {:?}", h.actions()));
}

/// What the session keeps of the batch and the server's statements: the reply queue's
/// entries and what a retry, the plan guard and the next Bind would read.
fn state(h: &H) -> String {
    let s = &h.s;
    let q: Vec<String> = s
        .busy
        .replies
        .iter()
        .map(|p| {
            format!(
                "{:?}/{:?}/{:?} simple {} uses {} portal_of {} replay_from {:?} timed {} {} at {} client {:?}",
                p.req,
                p.on_reply,
                p.purpose,
                p.simple.is_some(),
                p.fx.uses.is_some(),
                p.fx.portal_of.is_some(),
                p.fx.replay_from,
                p.timed.is_some(),
                p.timed_cached,
                p.sent_us,
                p.fx.client,
            )
        })
        .collect();
    let r = &s.busy.retry;
    format!(
        "queue {q:?} pushed since the client's flush {} unsynced {} | retry batch {:?} last {:?} at {} executed {} retried {} | \
         unnamed {:?} last_bind {} described {} binds {} | server owner {:?} statements {}",
        // Not `pushes` itself: a counter that only ever counts relative to `flushed_at`, and
        // that a recycled blank session (the harness's `park`) carries over from an earlier
        // conversation; and only as far as it concerns requests still queued.
        (s.busy.replies.pushed_since_flush() as usize).min(s.busy.replies.len()),
        s.busy.replies.is_unsynced(),
        norm_frames(&r.batch),
        norm_frames(&r.last_batch),
        r.frame_at,
        r.batch_executed,
        r.retried,
        matches!(s.stmts.unnamed, crate::session::stmts::Unnamed::None),
        s.stmts.last_bind.is_some(),
        s.stmts.described.len(),
        s.kept.tally.binds,
        h.srv.stmts.unnamed_owner,
        h.srv.stmts.len(),
    )
}

/// What the registry and its statements counted.
fn counts(reg: &Registry) -> Vec<String> {
    let st = &reg.stats;
    let mut v = vec![format!(
        "parses {} server {} hits {} evictions {} promotions {} invalidations {} retries {}",
        st.client_parses.load(Ordering::Relaxed),
        st.server_parses.load(Ordering::Relaxed),
        st.hits.load(Ordering::Relaxed),
        st.evictions.load(Ordering::Relaxed),
        st.promotions.load(Ordering::Relaxed),
        st.invalidations.load(Ordering::Relaxed),
        st.retries.load(Ordering::Relaxed),
    )];
    let mut stmts = reg.statements();
    stmts.sort_by(|a, b| a.query.cmp(&b.query));
    for s in stmts {
        let seq = s.guard.get().map(|g| g.seq.load(Ordering::Relaxed));
        v.push(format!("{} {:?} guard seq {seq:?}", norm(&s.query), s.exec.figures()));
    }
    v
}

/// Runs `conversation` with the direct bind and with frames only; asserts that both sent
/// and answered the same and counted the same. The direct bind's session and registry,
/// and how many Queries it bound directly.
fn both(cfg: StmtConfig, conversation: impl Fn(&mut H, &Arc<Registry>, &mut Vec<String>)) -> (H, Arc<Registry>, u32) {
    let mut runs = vec![];
    for frames_only in [false, true] {
        let reg = Arc::new(Registry::new(cfg.clone()));
        let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
        h.s.busy.lifts = Some(Box::new(Memo::with_frames_only(frames_only)));
        let mut log = vec![];
        conversation(&mut h, &reg, &mut log);
        log.extend(counts(&reg));
        log.push(format!("server statements {}", h.srv.stmts.len()));
        let fast = h.s.busy.lifts.as_ref().map_or(0, |m| m.fast_binds);
        runs.push((h, reg, log, fast));
    }
    let (slow, fast) = (runs.pop(), runs.pop());
    let (Some((_, _, slow_log, slow_binds)), Some((h, reg, fast_log, fast_binds))) = (slow, fast) else {
        unreachable!()
    };
    assert_eq!(slow_binds, 0);
    assert_eq!(fast_log, slow_log, "direct bind vs frames");
    (h, reg, fast_binds)
}

fn cfg() -> StmtConfig {
    StmtConfig { autoprepare: true, autoprepare_after: 2, ..Default::default() }
}

#[test]
fn a_known_statement_is_bound_directly_as_its_frames_would_bind_it() {
    let (h, _, fast) = both(cfg(), |h, _, log| {
        for aid in [1, 22, 333, 4444, 1, 7] {
            round(h, log, &format!("{ACCOUNT}{aid}"), None);
            if aid == 333 {
                // The client's own unnamed statement on the server: a bound Query leaves
                // it there (no simple Query reaches the server).
                for f in [parse("", "select 1"), bind(""), execute(), sync()] {
                    h.client(f);
                }
                serve(h, log, None);
                log.push(state(h));
            }
        }
    });
    assert_eq!(fast, 4, "from the third Query on (cached at the second, prepared with it)");
    assert!(h.s.busy.retry.batch.is_empty() && h.s.busy.retry.autoprep.is_none(), "nothing of the batch left");
}

/// An error with a position: mapped back to the client's text through the lift's origin.
#[test]
fn an_error_of_a_bound_query_points_into_the_clients_text() {
    let (_, _, fast) = both(cfg(), |h, _, log| {
        for aid in [1, 22, 333] {
            round(h, log, &format!("{ACCOUNT}{aid} AND abalance = 5"), None);
        }
        // At `$2` in the lifted text (69); the client's `5` is at 71.
        let e = msg(b'E', b"SERROR\0C42601\0Msyntax error at or near \"$2\"\0P69\0\0");
        round(h, log, &format!("{ACCOUNT}4444 AND abalance = 5"), Some((b'E', e)));
        let got = log.iter().rev().find(|l| l.starts_with("client got")).cloned().unwrap_or_default();
        assert!(got.contains("near \"5\"") && got.contains("P71"), "{got}");
        round(h, log, &format!("{ACCOUNT}55555 AND abalance = 5"), None);
    });
    assert_eq!(fast, 3);
}

/// The plan guard runs this execution as sent: the Parse sends the client's lifted text,
/// having taken the guard's sample once (its sequence counts the same).
#[test]
fn an_execution_the_plan_guard_runs_as_sent_is_left_to_the_frames() {
    let cfg = StmtConfig {
        guard: crate::stmt::guard::GuardConfig { sample_one_in: u32::MAX, ..Default::default() },
        ..cfg()
    };
    let (_, _, fast) = both(cfg, |h, reg, log| {
        // Made before the first Query (and so promoted at once), its guard told when to
        // sample: otherwise it samples one in two at random while young, by statement id.
        let l = crate::stmt::lift::lift(format!("{ACCOUNT}1").as_bytes(), false).expect("lifted");
        let types: Vec<u8> = l.types.iter().flat_map(|t| t.to_be_bytes()).collect();
        let mut key = vec![];
        crate::stmt::registry::make_key(&mut key, &StmtKind::Protocol, b"", &l.text, &types);
        let s = reg.for_parse(&key, StmtKind::Protocol, &l.text, &types);
        let g = s.guard(&reg.cfg).expect("guarded");
        for (i, aid) in [1, 22, 333, 4444, 55555, 6].into_iter().enumerate() {
            // Sampled at the fourth (as while probing or demoted): it runs as sent.
            g.one_in.store(if i == 3 { 1 } else { u32::MAX }, Ordering::Relaxed);
            h.client(query(&format!("{ACCOUNT}{aid}")));
            log.push(state(h));
            let as_sent = frames(&h.s.to_server).iter().any(|f| f[0] == b'P' && f[5..].starts_with(b"\0SELECT"));
            assert_eq!(as_sent, i == 3, "{i}");
            serve(h, log, None);
            log.push(state(h));
        }
    });
    assert_eq!(fast, 4, "all but the first (prepared) and the sampled one");
}

/// A statement the server no longer has (evicted for another, at a cap of one): prepared
/// again by the frames, then bound directly again.
#[test]
fn a_statement_evicted_from_the_server_is_prepared_again_by_the_frames() {
    let cfg = StmtConfig { server_cap: 1, ..cfg() };
    let (_, _, fast) = both(cfg, |h, _, log| {
        for aid in [1, 2, 3] {
            round(h, log, &format!("{ACCOUNT}{aid}"), None);
        }
        for aid in [1, 2, 3] {
            round(h, log, &format!("SELECT bbalance FROM pgbench_branches WHERE bid = {aid}"), None);
        }
        for aid in [4, 5] {
            round(h, log, &format!("{ACCOUNT}{aid}"), None);
        }
    });
    assert_eq!(fast, 3, "the third of each text, and the second after the eviction");
}

/// 26000 (the server lost it) and 0A000 (stale) at the Bind: the batch the retry kept is
/// replayed as frames, as after frames.
#[test]
fn a_bound_query_is_retried_after_26000_and_0a000() {
    for code in ["26000", "0A000"] {
        let (_, _, fast) = both(cfg(), |h, _, log| {
            for aid in [1, 2, 3] {
                round(h, log, &format!("{ACCOUNT}{aid}"), None);
            }
            let e = msg(b'E', format!("SERROR\0C{code}\0Mgone\0\0").as_bytes());
            round(h, log, &format!("{ACCOUNT}4"), Some((b'B', e)));
            let got = log.iter().rev().find(|l| l.starts_with("client got")).cloned().unwrap_or_default();
            assert!(!got.contains("gone"), "{code} hidden by the retry: {got}");
            for aid in [5, 6, 7] {
                round(h, log, &format!("{ACCOUNT}{aid}"), None);
            }
        });
        assert_eq!(fast, 5, "{code}: from the third on");
    }
}

/// A text that may call set_config() for the session: its Bind marks the server not to be
/// reused, so it is never bound directly.
#[test]
fn a_text_that_may_set_config_is_left_to_the_frames() {
    let (_, _, fast) = both(cfg(), |h, _, log| {
        for n in [1, 2, 3, 4] {
            round(h, log, &format!("SELECT set_config('parsnip.t', 'x', false), {n}"), None);
        }
        assert!(log.iter().any(|l| l.contains("reusable: false")), "{log:#?}");
    });
    assert_eq!(fast, 0);
}

/// An UPDATE is bound directly like any data statement: the LISTEN/UNLISTEN test a bound
/// text goes through reads the statement, not only its first letter (every UPDATE starts
/// with a `u`, and none was bound directly: pgbench's TPC-B script fed 3 of its 5 lifted
/// statements as frames).
#[test]
fn an_update_is_bound_directly() {
    let (_, _, fast) = both(cfg(), |h, _, log| {
        for (delta, tid) in [(5, 1), (17, 2), (-4, 3), (300, 4), (8, 5)] {
            round(h, log, &format!("UPDATE pgbench_tellers SET tbalance = tbalance + {delta} WHERE tid = {tid}"), None);
        }
    });
    assert_eq!(fast, 2, "the third is a negative delta, another lift; then the fourth and fifth");
}

/// A transaction's first statement after a BEGIN the session answered (`defer_begin`) is
/// bound directly behind that BEGIN: the link's preamble queued ahead of it (the BEGIN's
/// hidden replies) is no reason to send its text unprepared. (Before, the first of
/// TPC-B's five statements went as a plain Query in every transaction: parsed and planned
/// again by the server.)
#[test]
fn the_first_statement_after_a_deferred_begin_is_bound_directly() {
    let reg = Arc::new(Registry::new(cfg()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    h.s.set_defer_begin(true);
    let mut log = vec![];
    let update = |tid: u32| format!("UPDATE pgbench_tellers SET tbalance = tbalance + 5 WHERE tid = {tid}");
    for tid in [1, 2, 3] {
        h.client(query(&update(tid)));
        serve_as(&mut h, &mut log, None, false);
    }
    let fast = |h: &H| h.s.busy.lifts.as_ref().map_or(0, |m| m.fast_binds);
    assert_eq!(fast(&h), 1, "the third, outside a block");
    h.client(query("BEGIN"));
    assert!(h.s.begin_deferred());
    // (Not `client_out`: the harness's park would hand the session a busy half without
    // the templates; the driver's recycled halves keep them.)
    let writable = h.s.writable_to_client();
    let _ = h.s.to_client.split_to(writable);
    h.client(query(&update(4)));
    let out = h.server_out();
    let tags: String = out.iter().map(|f| f[0] as char).collect();
    assert_eq!(
        (out[0].clone(), &tags[1..]),
        (query("BEGIN"), "BDES"),
        "one write: the BEGIN, then the bound statement"
    );
    assert_eq!(fast(&h), 2);
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), msg(b'2', b""), msg(b'n', b""), msg(b'C', b"UPDATE 1\0"), rfq(b'T')] {
        h.server(m);
    }
    let writable = h.s.writable_to_client();
    assert_eq!(
        frames(&h.s.to_client.split_to(writable)),
        vec![msg(b'C', b"UPDATE 1\0"), rfq(b'T')],
        "the client sees its Query's replies only"
    );
    assert!(h.s.in_transaction() && h.s.busy.replies.is_empty());
}
