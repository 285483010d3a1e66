//! The plan guard inside a session: sampling, demotion, and the counts by kind.

use super::*;

/// The server's answers to one round's Parse, Bind, Execute and Sync (`out`), and what the
/// client is sent.
fn answer(h: &mut H, out: Vec<Vec<u8>>) {
    for f in out {
        match f[0] {
            b'P' => h.server(msg(b'1', b"")),
            b'B' => h.server(msg(b'2', b"")),
            b'E' => h.server(msg(b'C', b"SELECT 1\0")),
            b'S' => h.server(rfq(b'I')),
            _ => {}
        }
    }
    assert_eq!(h.client_out(), "12CZ");
}

/// The plan guard in the session: a promoted unnamed statement whose cached executions are
/// slow (a bad generic plan) is sampled as sent, demoted, and then runs as the client sent
/// it; its executions are counted for the cached statement, by kind.
#[test]
fn the_plan_guard_demotes_a_slow_promoted_statement() {
    let cfg = StmtConfig {
        promote_unnamed_after: 2,
        guard: crate::stmt::guard::GuardConfig { sample_one_in: 64, ratio: 1.5 },
        ..Default::default()
    };
    let reg = Arc::new(Registry::new(cfg));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let mut clock = 1_000u64;
    // (ran as sent, demoted after it)
    let mut round = |h: &mut H| {
        // The clock is told before every feed, as the driver does: the session may have
        // been parked (and its busy half swapped) in between.
        // The parameter's type is given: an inferred one would start a new generation of
        // the statement whenever another test advances the process-wide schema epoch.
        let typed = msg(b'P', b"\0select 1 where $1\0\0\x01\0\0\0\x10");
        for f in [typed, bind(""), execute(), sync()] {
            h.s.set_clock(clock);
            h.client(f);
        }
        let out = h.server_out();
        // As sent: the client's own unnamed Parse (its name is empty).
        let as_sent = out.iter().any(|f| f[0] == b'P' && f.get(5) == Some(&0));
        let cached = out.iter().any(|f| f[0] == b'B' && f.get(6) != Some(&0));
        clock += if as_sent || !cached { 100 } else { 5_000 };
        h.s.set_clock(clock);
        answer(h, out);
        (as_sent, cached)
    };
    let mut demoted_at = None;
    let mut runs = vec![];
    for i in 0..120 {
        let r = round(&mut h);
        runs.push(r);
        if demoted_at.is_none() && reg.stats.demotions.load(Ordering::Relaxed) == 1 {
            demoted_at = Some(i);
        }
    }
    let at = demoted_at.unwrap_or_else(|| panic!("never demoted: {runs:?}"));
    assert!(at < 60, "demoted at round {at}");
    assert!(runs[at + 1..].iter().all(|&(as_sent, _)| as_sent), "demoted: every execution runs as sent");
    assert!(runs[..at].iter().any(|&(_, cached)| cached), "it ran from the cache before");
    let stmts = reg.statements();
    let f = stmts[0].exec.figures();
    assert!(f.cached > 0 && f.as_sent > 60, "{f:?}");
    assert_eq!(f.rows, f.cached + f.as_sent, "one row per execution");
    assert!((4_375..=5_625).contains(&f.p99_us), "the cached executions' time, within 12.5 %: {f:?}");
}

/// A batch written behind another client's on a shared connection waits for that one: its
/// executions are counted for the statement, but their times (which would include the wait)
/// go neither to the statistics nor to the guard, which would otherwise see the cache slow.
#[test]
fn executions_queued_behind_another_batch_are_counted_not_timed() {
    let cfg = StmtConfig { promote_unnamed_after: 1, ..Default::default() };
    let reg = Arc::new(Registry::new(cfg));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    h.behind = true;
    let mut clock = 1_000u64;
    for _ in 0..100 {
        let typed = msg(b'P', b"\0select 2 where $1\0\0\x01\0\0\0\x10");
        for f in [typed, bind(""), execute(), sync()] {
            h.s.set_clock(clock);
            h.client(f);
        }
        let out = h.server_out();
        // Every execution "takes" 50 ms: the wait behind the other batch.
        clock += 50_000;
        h.s.set_clock(clock);
        answer(&mut h, out);
    }
    let stmts = reg.statements();
    let f = stmts[0].exec.figures();
    assert_eq!(f.calls(), 100, "{f:?}");
    assert_eq!(f.rows, 100, "{f:?}");
    assert_eq!((f.total_us, f.p99_us), (0, 0), "no time recorded: {f:?}");
    assert_eq!(reg.stats.demotions.load(Ordering::Relaxed), 0);
}
