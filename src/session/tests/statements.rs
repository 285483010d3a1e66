//! The statement cache: client names mapped to server statements, unnamed statements
//! promoted, SQL PREPARE/EXECUTE/DEALLOCATE, eviction and stale plans.

use super::*;

#[test]
fn named_statements_are_renamed_and_parsed_once_per_server() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut a = H::new(PoolMode::Transaction, Some(reg.clone()));
    a.client(parse("s1", "select 1"));
    a.client(sync());
    let sent = a.server_out();
    assert_eq!(sent.len(), 2);
    assert!(text(&sent[0]).contains("pn_"), "renamed: {}", text(&sent[0]));
    a.server(msg(b'1', b""));
    a.server(rfq(b'I'));
    assert_eq!(a.client_out(), "1Z");
    // Another client, same text, different name, on the same server: no server Parse.
    let mut b = H::new(PoolMode::Transaction, Some(reg.clone()));
    b.srv = std::mem::take(&mut a.srv);
    b.client(parse("other", "select 1"));
    // Answered locally, and held until the client flushes, as PostgreSQL holds it.
    assert_eq!(b.client_out(), "", "held");
    b.client(msg(b'H', b""));
    assert_eq!(b.client_out(), "1", "answered locally");
    b.client(bind("other"));
    b.client(execute());
    b.client(sync());
    let sent = b.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "BES");
    assert!(text(&sent[0]).contains("pn_"));
    assert_eq!(reg.stats.server_parses.load(Ordering::Relaxed), 1);
    assert_eq!(reg.stats.hits.load(Ordering::Relaxed), 1);
}

#[test]
fn bind_on_a_new_server_injects_parse_and_hides_its_reply() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut a = H::new(PoolMode::Transaction, Some(reg.clone()));
    a.client(parse("s1", "select 1"));
    a.client(sync());
    a.server(msg(b'1', b""));
    a.server(rfq(b'I'));
    a.client_out();
    a.server_out();
    a.srv = ServerState::default(); // next checkout: a fresh server
    a.client(bind("s1"));
    a.client(execute());
    a.client(sync());
    assert_eq!(a.server_tags(), "PBES");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        a.server(m);
    }
    assert_eq!(a.client_out(), "2CZ");
}

#[test]
fn duplicate_and_unknown_names_get_postgres_errors_without_disconnect() {
    let mut h = H::cached();
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    // Unlinked: answered locally, then skip to Sync.
    h.client(parse("s1", "select 2"));
    h.client(bind("s1"));
    h.client(sync());
    let out = h.s.to_client.split();
    assert_eq!(tags_of(&out), "EZ");
    assert!(text(&out).contains("42P05") && text(&out).contains("prepared statement \"s1\" already exists"));
    // Linked (inside a transaction): the server is made to fail so its state matches.
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    h.client_out();
    h.server_out();
    h.client(bind("nope"));
    h.client(sync());
    let sent = h.server_out();
    assert!(text(&sent[0]).contains("parsnip_probe"));
    h.server(msg(b'E', b"SERROR\0C26000\0Mprepared statement \"parsnip_probe\" does not exist\0\0"));
    h.server(rfq(b'E'));
    let out = h.s.to_client.split();
    assert_eq!(tags_of(&out), "EZ");
    assert!(text(&out).contains("prepared statement \"nope\" does not exist"));
    assert!(h.actions().iter().all(|a| *a != Action::Close));
}

#[test]
fn failed_parse_leaves_no_mapping() {
    let mut h = H::cached();
    h.client(parse("s1", "selec 1"));
    h.client(sync());
    h.server(err("42601"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ");
    assert_eq!(h.s.prepared_count(), 0);
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
    assert_eq!(h.s.prepared_count(), 1);
}

#[test]
fn skipped_messages_roll_back_their_effects() {
    let mut h = H::cached();
    // s1 is known and valid: a second client's Parse would be answered locally.
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    // An error before a locally answered Parse: that Parse never happened.
    h.client(parse("bad", "selec"));
    h.client(parse("s2", "select 1"));
    h.client(close_s("s1"));
    h.client(sync());
    h.server(err("42601"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ");
    assert_eq!(h.s.prepared_count(), 1, "s2 rolled back, s1's close rolled back");
    assert!(h.s.stmts.named.contains_key(&b"s1"[..]));
}

#[test]
fn close_is_local_and_in_order() {
    let mut h = H::cached();
    h.client(query("select 1"));
    h.client(close_s("whatever"));
    h.client(sync());
    // The Query's replies come first, then the local CloseComplete, then Sync's Z.
    h.server(msg(b'C', b"SELECT 1\0"));
    assert_eq!(h.client_out(), "C");
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "Z3");
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "Z");
}

#[test]
fn unnamed_parse_and_bind_across_syncs_and_servers() {
    let mut h = H::new(
        PoolMode::Transaction,
        Some(Arc::new(Registry::new(StmtConfig { promote_unnamed_after: 0, ..Default::default() }))),
    );
    h.client(parse("", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.server_out();
    h.srv = ServerState::default(); // another server
    h.client(bind(""));
    h.client(execute());
    h.client(sync());
    let sent = h.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBES", "unnamed Parse replayed");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ");
}

#[test]
fn repeated_unnamed_statements_are_promoted() {
    let reg = Arc::new(Registry::new(StmtConfig { promote_unnamed_after: 2, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let round = |h: &mut H| {
        h.client(parse("", "select 1"));
        h.client(bind(""));
        h.client(execute());
        h.client(sync());
        let sent = h.server_tags();
        for f in sent.chars() {
            match f {
                'P' => h.server(msg(b'1', b"")),
                'B' => h.server(msg(b'2', b"")),
                'E' => h.server(msg(b'C', b"SELECT 1\0")),
                'S' => h.server(rfq(b'I')),
                _ => {}
            }
        }
        assert_eq!(h.client_out(), "12CZ");
        sent
    };
    assert_eq!(round(&mut h), "PBES");
    assert_eq!(round(&mut h), "PBES", "promoted: Parse of the named server statement");
    assert_eq!(round(&mut h), "BES", "no Parse at all any more");
    assert_eq!(reg.stats.promotions.load(Ordering::Relaxed), 1);
}

#[test]
fn sql_deallocate_all_is_answered_locally_and_clears_the_namespace() {
    let mut h = H::cached();
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.client(query("DEALLOCATE ALL"));
    assert_eq!(h.client_out(), "CZ");
    assert_eq!(h.s.prepared_count(), 0);
    // Pipelined after it: Parse/Bind of the same name works.
    h.client(parse("s1", "select 1"));
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    let sent = h.server_tags();
    assert!(sent.ends_with("BES") && !sent.ends_with("PBES"), "{sent}: Parse answered locally");
    assert_eq!(tags_of(&h.s.to_client), "1", "statement known and valid: Parse answered locally");
    assert_eq!(h.client_out(), "", "its ParseComplete goes with the server's answers to the batch");
}

#[test]
fn sql_prepare_execute_deallocate_across_checkouts() {
    let mut h = H::cached();
    h.client(query("PREPARE q (int) AS SELECT $1"));
    let sent = h.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBES");
    assert!(text(&sent[0]).contains("PREPARE pn_"));
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "CZ");
    h.srv = ServerState::default(); // another server
    h.client(query("EXECUTE q(5)"));
    let sent = h.server_out();
    // The PREPARE ends with a Sync of its own, so no implicit transaction of it is left
    // open when the Query runs.
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBESQ");
    assert!(text(&sent[4]).contains("EXECUTE pn_"));
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(b'I'), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "CZ");
    h.client(query("DEALLOCATE q"));
    assert_eq!(h.client_out(), "CZ");
    h.client(query("DEALLOCATE q"));
    let sent = h.server_out();
    assert!(text(&sent[0]).contains("parsnip_probe"));
}

#[test]
fn failed_prepare_ahead_of_execute_answers_it() {
    let mut h = H::cached();
    let client_text = "PREPARE q AS SELECT a FROM gone";
    h.client(query(client_text));
    h.server_out();
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "CZ");
    for in_tx in [false, true] {
        h.srv = ServerState::default(); // another server, which lacks the statement
        let status = if in_tx { b'T' } else { b'I' };
        h.s.busy.tx.status = TxStatus::from_byte(status);
        h.client(query("EXECUTE q"));
        let sent = h.server_out();
        assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBESQ");
        // The table went away: the PREPARE fails when executed, and the EXECUTE after it
        // for want of the statement (or of a live transaction).
        let server_text = text(&sent[0]);
        let at = |t: &str| t.find("gone").expect("table name") - t.find("PREPARE").expect("PREPARE") + 1;
        let e = format!("SERROR\0C42P01\0Mrelation \"gone\" does not exist\0P{}\0\0", at(&server_text));
        let failed = if in_tx { b'E' } else { b'I' };
        let second = if in_tx { err("25P02") } else { err("26000") };
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b'E', e.as_bytes()), rfq(failed), second, rfq(failed)] {
            h.server(m);
        }
        let out = h.s.to_client.split();
        assert_eq!(tags_of(&out), "EZ", "in a transaction: {in_tx}");
        let reply = frames(&out);
        assert!(text(&reply[0]).contains("C42P01"), "{}", text(&reply[0]));
        assert!(text(&reply[0]).contains(&format!("P{}\0", at(client_text))), "{}", text(&reply[0]));
        assert_eq!(reply[1][5], failed);
        // Not prepared there: the next EXECUTE prepares it again.
        h.s.busy.tx.status = TxStatus::from_byte(status);
        h.client(query("EXECUTE q"));
        assert_eq!(h.server_tags(), "PBESQ");
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(status), msg(b'C', b"SELECT 1\0")] {
            h.server(m);
        }
        h.server(rfq(status));
        assert_eq!(h.client_out(), "CZ");
    }
}

#[test]
fn server_cap_evicts_least_recently_used_with_close() {
    let reg = Arc::new(Registry::new(StmtConfig { server_cap: 2, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    for (i, q) in ["select 1", "select 2", "select 3"].iter().enumerate() {
        h.client(parse(&format!("s{i}"), q));
        h.client(sync());
        let sent = h.server_tags();
        for c in sent.chars() {
            match c {
                'C' => h.server(msg(b'3', b"")),
                'P' => h.server(msg(b'1', b"")),
                'S' => h.server(rfq(b'I')),
                _ => {}
            }
        }
        assert_eq!(h.client_out(), "1Z");
        assert_eq!(sent, if i < 2 { "PS" } else { "CPS" });
    }
    assert_eq!(h.srv.stmts.len(), 2);
    assert_eq!(reg.stats.evictions.load(Ordering::Relaxed), 1);
}

#[test]
fn stale_plan_starts_a_new_generation() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    h.client(parse("s1", "select * from t"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), msg(b'T', b"\0\x01old"), rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    let old = h.server_out();
    // The client was told the old shape: PostgreSQL's 0A000 reaches it.
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    h.server_out();
    h.server(msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ");
    // The client re-prepares the same text under a new name: a fresh server statement.
    h.client(parse("s2", "select * from t"));
    h.client(sync());
    let sent = h.server_out();
    assert_eq!(sent[0][0], b'P');
    assert_ne!(text(&sent[0]), text(&old[0]), "new generation, new server name");
}

#[test]
fn stale_plan_is_retried_when_the_client_never_saw_the_old_shape() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    h.client(parse("s1", "select * from t"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.server_out();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    h.server_out();
    h.server(msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"));
    // Close of the stale statement, then the batch again on a new generation.
    let sent = h.server_tags();
    assert_eq!(sent, "CPBES");
    h.server(rfq(b'I')); // the first Sync's answer: hidden
    for m in [msg(b'3', b""), msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ", "no error, one ReadyForQuery");
    assert_eq!(reg.stats.retries.load(Ordering::Relaxed), 1);
}

#[test]
fn unnamed_reads_of_pg_prepared_statements_are_rewritten_and_never_promoted() {
    let reg = Arc::new(Registry::new(StmtConfig { promote_unnamed_after: 1, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let sql = "select count(*) from pg_prepared_statements";
    for _ in 0..4 {
        h.client(parse("", sql));
        h.client(bind(""));
        h.client(execute());
        h.client(sync());
        let sent = h.server_out();
        assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBES", "a plain unnamed Parse each time");
        let p = frontend::parse_fields(&sent[0][5..]).expect("a Parse");
        assert_eq!(p.name, b"", "never a named (promoted) server statement");
        let text = String::from_utf8_lossy(p.query);
        assert!(
            text.starts_with("select count(*) from (SELECT r.* FROM pg_catalog.jsonb_array_elements($pn$[]$pn$"),
            "{text}"
        );
        assert!(text.ends_with(" AS pg_prepared_statements"), "{text}");
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
            h.server(m);
        }
        assert_eq!(h.client_out(), "12CZ");
    }
    assert_eq!(reg.stats.promotions.load(Ordering::Relaxed), 0);
}

/// Inside a transaction block, a Parse the cache answers is guarded at its first use
/// (SAVEPOINT before it), unless the statement is known to return no rows: a replan of a
/// statement without a result type cannot fail with 0A000, so there is nothing to retry.
#[test]
fn a_cached_parse_in_a_block_is_guarded_unless_it_returns_nothing() {
    for (sql, returns_rows) in [("UPDATE t SET a = 1", false), ("SELECT a FROM t", true)] {
        let mut h = H::cached();
        let describe_s = |name: &str| msg(b'D', format!("S{name}\0").as_bytes());
        // Described and run once outside a block: its shape is known, and the server has it.
        for f in [parse("s1", sql), describe_s("s1"), bind("s1"), execute(), sync()] {
            h.client(f);
        }
        let sent = h.server_tags();
        assert!(sent.ends_with("PDBES"), "{sent}");
        h.server(msg(b'1', b""));
        h.server(msg(b't', b"\0\0"));
        h.server(if returns_rows { rowdesc(&["a"], 16400) } else { msg(b'n', b"") });
        h.server(msg(b'2', b""));
        h.server(msg(b'C', if returns_rows { b"SELECT 0\0" } else { b"UPDATE 0\0" }));
        h.server(rfq(b'I'));
        h.client(query("BEGIN"));
        h.server_out();
        h.server(msg(b'C', b"BEGIN\0"));
        h.server(rfq(b'T'));
        // Parsed again in the block under another name: the cache answers it.
        for f in [parse("s2", sql), bind("s2"), execute(), sync()] {
            h.client(f);
        }
        let out = h.server_out();
        let guarded = out.iter().any(|f| text(f).contains("parsnip_guard"));
        assert_eq!(guarded, returns_rows, "{sql}: {:?}", out.iter().map(|f| text(f)).collect::<Vec<_>>());
        assert!(!out.iter().any(|f| f[0] == b'P' && text(f).contains(sql)), "{sql}: answered by the cache");
    }
}

/// Inside a block, an unnamed read the cache holds is served from it (under a savepoint
/// guard at its first use there) only in a batch whose Sync the driver read with it: a
/// 0A000 is retried at that Sync. A batch the client ends with Flush (node-postgres'
/// pg-cursor reads a portal in chunks so), or whose Sync has not arrived yet, goes as sent.
#[test]
fn an_unnamed_read_in_a_block_is_served_only_with_its_sync_read() {
    // No parameter: a text whose parameter types PostgreSQL infers is made again after any
    // possible schema change (`infers_stale_types`), and other tests move that epoch.
    let sql = "SELECT a FROM t WHERE id = 7";
    let batch = |end: Vec<Vec<u8>>| {
        let mut fs = vec![parse("", sql), bind(""), msg(b'D', b"P\0"), execute()];
        fs.extend(end);
        fs
    };
    for (case, end, served) in [
        ("synced", vec![sync()], true),
        ("flushed", vec![msg(b'H', b""), sync()], false),
        ("sync not read yet", vec![], false),
    ] {
        let mut h = H::cached();
        // Promoted, run and described outside a block.
        for _ in 0..4 {
            h.client_batch(batch(vec![sync()]));
            let sent = h.server_tags();
            answer_read(&mut h, sent.starts_with('P'), b'I');
            h.client_out();
        }
        h.begin();
        h.server_out();
        h.client_batch(batch(end));
        let out = h.server_out();
        let texts: Vec<String> = out.iter().map(|f| text(f)).collect();
        let parsed = out.iter().any(|f| f[0] == b'P' && text(f).contains(sql));
        assert_eq!(!parsed, served, "{case}: {texts:?}");
        assert_eq!(texts.iter().any(|t| t.contains("SAVEPOINT parsnip_guard")), served, "{case}: {texts:?}");
    }
}

/// A client that sends its next batch before a guarded one is answered (it pipelines inside
/// the block) waits for that answer, once: a 0A000 there is rolled back and replayed only
/// while nothing after the batch reached the server (a COMMIT behind it would end the failed
/// transaction). From then on the cache serves it, inside blocks, only what needs no guard:
/// its next block's read goes as it sent it, and is not held.
#[test]
fn a_batch_behind_a_guarded_one_waits_once_then_reads_go_as_sent_in_blocks() {
    let mut h = H::cached();
    // No parameter: a text whose parameter types PostgreSQL infers is made again after any
    // possible schema change (`infers_stale_types`), and other tests move that epoch.
    let sql = "SELECT a FROM t WHERE id = 7";
    let read = |h: &mut H| h.client_batch(vec![parse("", sql), bind(""), msg(b'D', b"P\0"), execute(), sync()]);
    // Promoted, run and described outside a block.
    for _ in 0..4 {
        read(&mut h);
        let sent = h.server_tags();
        answer_read(&mut h, sent.starts_with('P'), b'I');
        h.client_out();
    }
    // The read, and the COMMIT right behind it.
    let (out, texts) = block_of_a_read_and_commit(&mut h, read);
    assert!(texts.iter().any(|t| t.contains("SAVEPOINT parsnip_guard")), "guarded: {texts:?}");
    assert!(!texts.iter().any(|t| t.contains("COMMIT")), "the COMMIT waits: {texts:?}");
    assert!(!out.iter().any(|f| f[0] == b'P' && text(f).contains(sql)), "served by the cache: {texts:?}");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SAVEPOINT\0"), msg(b'3', b"")] {
        h.server(m);
    }
    for m in [msg(b'2', b""), msg(b'1', b""), msg(b'2', b""), msg(b'C', b"RELEASE\0"), msg(b'3', b"")] {
        h.server(m);
    }
    for m in [rowdesc(&["a"], 16400), msg(b'D', b"\0\x01\0\0\0\x010"), msg(b'C', b"SELECT 1\0"), rfq(b'T')] {
        h.server(m);
    }
    assert_eq!(h.server_tags(), "Q", "the COMMIT goes once the guarded batch is answered");
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "12TDCZCZ");
    assert!(h.s.stmts.pipelines_in_block);
    // The next block: the read goes as sent (no guard), and the COMMIT is not held.
    let (out, texts) = block_of_a_read_and_commit(&mut h, read);
    assert!(!texts.iter().any(|t| t.contains("parsnip_guard")), "no guard: {texts:?}");
    assert!(out.first().is_some_and(|f| f[0] == b'P' && text(f).contains(sql)), "parsed as sent: {texts:?}");
    assert!(out.last().is_some_and(|f| text(f).contains("COMMIT")), "not held: {texts:?}");
}

/// The replies to an unnamed read: its ParseComplete (when the server parsed it), then
/// BindComplete, its row and ReadyForQuery with `status`.
fn answer_read(h: &mut H, parse: bool, status: u8) {
    let row = [rowdesc(&["a"], 16400), msg(b'D', b"\0\x01\0\0\0\x010"), msg(b'C', b"SELECT 1\0")];
    super::autoprepare::answer_with(h, parse, &row, status);
}

/// BEGIN (answered), then `read` and a COMMIT sent right behind it: what reached the server
/// for them, and its text.
fn block_of_a_read_and_commit(h: &mut H, read: impl Fn(&mut H)) -> (Vec<Vec<u8>>, Vec<String>) {
    h.client(query("BEGIN"));
    h.server_out();
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    h.client_out();
    read(h);
    h.client(query("COMMIT"));
    let out = h.server_out();
    let texts = out.iter().map(|f| text(f)).collect();
    (out, texts)
}

/// A Parse the cache answers: its ParseComplete waits for the client's Sync, and then for
/// the server's first answer to the batch, and goes with it (PostgreSQL sends a batch's
/// replies together at its Sync): one write to the client, not two. A Flush lets it go at
/// once, as PostgreSQL would.
#[test]
fn a_local_parse_complete_goes_with_the_servers_first_answer() {
    let mut h = H::cached();
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server_out();
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
    for f in [parse("s2", "select 1"), bind("s2"), execute(), sync()] {
        h.client(f);
    }
    let sent = h.server_tags();
    assert_eq!(sent, "BES", "answered locally");
    assert_eq!(h.client_out(), "", "held for the server's answer");
    h.server(msg(b'2', b""));
    assert_eq!(h.client_out(), "12", "with the server's first answer");
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZ");
    // An error as the first answer lets it go too.
    for f in [parse("s3", "select 1"), bind("s3"), execute(), sync()] {
        h.client(f);
    }
    h.server_out();
    assert_eq!(h.client_out(), "");
    h.server(err("22012"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1EZ");
    // A Flush asks for it now.
    h.client(parse("s4", "select 1"));
    h.client(msg(b'H', b""));
    assert_eq!(h.client_out(), "1");
}

/// A statement parsed under `name` with `sql`, prepared on the session's server.
fn parsed_on_server(h: &mut H, name: &str, sql: &str) {
    h.client(parse(name, sql));
    h.client(sync());
    let _ = h.server_out();
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
}

#[test]
fn sql_execute_of_a_parsed_set_is_tracked_as_the_set() {
    // EXECUTE runs the statement's text, not the Query's: the hostile-client test found a
    // search_path set this way left, unrecorded, on a connection the next client got.
    for q in ["EXECUTE s", "SELECT 1; EXECUTE s"] {
        let mut h = H::cached();
        parsed_on_server(&mut h, "s", "SET search_path = elsewhere");
        h.client(query(q));
        let sent = h.server_out();
        assert!(text(sent.last().unwrap()).contains("EXECUTE pn_"), "{q}");
        if q.starts_with("SELECT") {
            h.server(msg(b'C', b"SELECT 1\0"));
        }
        h.server(msg(b'C', b"SET\0"));
        h.server(rfq(b'I'));
        assert_eq!(h.s.settings().extra.len(), 1, "{q}: the setting is the client's now");
        assert_eq!(h.s.settings().extra[0].0, "search_path", "{q}");
        assert_eq!(h.s.settings().key(), h.srv.settings.key(), "{q}: and the server's record says so");
    }
}

#[test]
fn sql_execute_of_a_parsed_set_config_is_followed() {
    // A session timeout set through set_config: the server is not reused (`config`).
    let mut h = H::cached();
    parsed_on_server(&mut h, "t", "SELECT set_config('statement_timeout', '1', false)");
    let _ = h.actions();
    h.client(query("EXECUTE t"));
    let _ = h.server_out();
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: false }]);
}
