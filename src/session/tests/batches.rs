//! Where a batch ends and what waits for it: a released server, errors before Sync, row
//! shape checks and the replies their flushes bring, batches behind an injected Parse.

use super::*;

#[test]
fn a_released_server_is_never_used_for_the_next_frame() {
    let mut h = H::cached();
    h.client(parse("", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    h.server_out();
    // The driver still holds the server state when it feeds the next frame: the session
    // must ask for a server again rather than write to the one it gave back.
    assert_eq!(h.s.handle_client(&bind(""), Some(&mut h.srv)), Fed::NeedsServer);
    assert!(h.s.to_server.is_empty());
    assert_eq!(h.s.poll_action(), Some(Action::AcquireServer));
}

#[test]
fn error_before_the_client_sent_sync_skips_what_follows() {
    // P D H, error; then B E S: the server ignores B and E, answers only the Sync.
    let mut h = H::cached();
    h.client(parse("s1", "selec 1"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(msg(b'H', b""));
    h.server(err("42601"));
    assert_eq!(h.client_out(), "E");
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    assert_eq!(h.s.outstanding(), 1, "only the Sync expects a reply");
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "Z");
    assert_eq!(h.s.prepared_count(), 0);
}

#[test]
fn fresh_parse_with_a_different_row_shape_never_sends_rows() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let rowdesc3 = rowdesc(&["a", "b", "c"], 1);
    let rowdesc4 = rowdesc(&["a", "b", "c", "d"], 1);
    h.client(parse("s1", "select * from t"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), rowdesc3.clone(), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "1tTZ");
    h.server_out();
    // ALTER TABLE happened; the next checkout is a server without the statement.
    h.srv = ServerState::default();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    // Parse, a Describe to check the shape, and Flush: the client's Bind waits.
    assert_eq!(h.server_tags(), "PDH");
    assert_eq!(h.pending.len(), 3, "Bind, Execute, Sync held");
    h.server(msg(b'1', b""));
    h.server(msg(b't', b"\0\0"));
    h.server(rowdesc4);
    // Shape differs: the stale statement is closed there, and the Bind fails with 0A000
    // (through a probe so the server skips to Sync as PostgreSQL would).
    let sent = h.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "CDES");
    assert!(text(&sent[1]).contains("parsnip_probe"));
    h.server(msg(b'3', b""));
    h.server(msg(b'E', b"SERROR\0C26000\0Mprepared statement \"parsnip_probe\" does not exist\0\0"));
    h.server(rfq(b'I'));
    let out = h.s.to_client.split();
    assert_eq!(tags_of(&out), "EZ");
    assert!(text(&out).contains("0A000") && text(&out).contains("cached plan must not change result type"));
    // Re-preparing the same text gets a new generation.
    h.client(parse("s2", "select * from t"));
    h.client(sync());
    let sent = h.server_out();
    assert!(!text(&sent[0]).contains("pn_1\0"), "{}", text(&sent[0]));
}

#[test]
fn same_shape_on_a_fresh_server_goes_on() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg));
    // The same columns, from a table re-created since (another table OID).
    let (before, after) = (rowdesc(&["one"], 1), rowdesc(&["one"], 2));
    h.client(parse("s1", "select 1"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), before, rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    h.server_out();
    h.srv = ServerState::default();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    h.server_out();
    // The Bind is held for the check: the backend waits for it, and a cancel then would be
    // dropped (`driver::cancel` holds it until the client's request runs).
    assert!(!h.s.request_running(), "the client's Bind is held");
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), after] {
        h.server(m);
    }
    assert_eq!(h.server_tags(), "BES");
    assert!(h.s.request_running(), "all written, nothing of the pooler's ahead");
    for m in [msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ");
}

/// A shape check asks the server to flush (issue 23 item 6): the replies that flush
/// brings for the client's own requests, which PostgreSQL would have kept until the
/// client's Sync, are held until that Sync; an error is not (PostgreSQL flushes errors).
#[test]
fn replies_flushed_for_the_pooler_wait_for_the_clients_sync() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg));
    h.client(parse("s1", "select 1"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), rowdesc(&["one"], 1), rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    h.server_out();
    // Another server: the client's own Parse goes first, then s1 is injected and checked.
    h.srv = ServerState::default();
    h.client(parse("s2", "select 2"));
    h.client(bind("s1"));
    h.client(execute());
    assert_eq!(h.server_tags(), "PPDH");
    for m in [msg(b'1', b""), msg(b'1', b""), msg(b't', b"\0\0"), rowdesc(&["one"], 1)] {
        h.server(m);
    }
    assert_eq!(h.server_tags(), "BE");
    assert_eq!(h.client_out(), "", "the client's ParseComplete came only because of the pooler's Flush");
    h.client(sync());
    for m in [msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "12CZ");
    // An error goes at once, with what was held before it.
    h.srv = ServerState::default();
    h.client(parse("s3", "select 3"));
    h.client(bind("s1"));
    h.client(execute());
    h.server_out();
    for m in [msg(b'1', b""), msg(b'1', b""), msg(b't', b"\0\0"), rowdesc(&["one"], 1)] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "");
    h.server(err("22012"));
    assert_eq!(h.client_out(), "1E");
}

#[test]
fn a_batch_ended_by_flush_keeps_the_server() {
    // pg-cursor: Bind/Execute(max rows)/Flush outside a transaction; the portal lives in
    // the implicit transaction until Sync, so the server must stay linked.
    let mut h = H::cached();
    h.client(parse("s", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.actions();
    h.client(msg(b'B', b"c\0s\0\0\0\0\0\0\0"));
    h.client(msg(b'E', b"c\0\0\0\0\x02"));
    h.client(msg(b'H', b""));
    for m in [msg(b'2', b""), msg(b'D', b"\0\0"), msg(b's', b"")] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer], "not released before Sync");
    h.client(msg(b'E', b"c\0\0\0\0\x02"));
    h.client(sync());
    for m in [msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: true }]);
}

#[test]
fn a_batch_behind_a_failing_parse_waits_for_its_outcome() {
    let mut h = H::cached();
    h.client(parse("s", "selec"));
    h.client(sync());
    h.client(parse("s", "select 1"));
    h.client(sync());
    assert_eq!(h.pending.len(), 2, "second Parse waits: does \"s\" exist?");
    h.server(err("42601"));
    h.server(rfq(b'I'));
    // Now it is known that "s" does not exist: the second Parse goes through.
    assert!(h.pending.is_empty());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ1Z");
}
#[test]
fn a_batch_behind_a_skipped_injected_parse_waits_for_its_outcome() {
    let reg = Arc::new(Registry::new(StmtConfig { server_cap: 1, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg));
    h.client(parse("a", "select 'a'"));
    h.client(parse("b", "select 'b'"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b'1', b""), rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    h.server_out();
    for m in
        [bind("a"), execute(), bind("unknown"), execute(), bind("b"), execute(), sync(), bind("b"), execute(), sync()]
    {
        h.client(m);
    }
    assert_eq!(h.pending.len(), 3, "the second batch waits: is b prepared there or was its Parse skipped?");
    let sent = h.server_tags();
    assert_eq!(sent, "CCPBEDEPBES");
    for m in [msg(b'3', b""), msg(b'3', b""), msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0")] {
        h.server(m);
    }
    h.server(msg(b'E', b"SERROR\0C26000\0Mprepared statement \"parsnip_probe\" does not exist\0\0"));
    h.server(rfq(b'I'));
    // b's Parse was skipped: the held batch now prepares it again.
    let sent = h.server_tags();
    assert_eq!(sent, "PBES");
}

#[test]
fn a_local_parse_waits_for_an_earlier_batch_that_may_abort_the_transaction() {
    let mut h = H::cached();
    h.client(parse("s", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    // In a transaction: a failing batch, then a Parse of a known statement.
    h.client(query("begin"));
    h.client(parse("bad", "selec"));
    h.client(sync());
    h.client(parse("t", "select 1"));
    h.client(sync());
    assert_eq!(h.pending.len(), 2, "the Parse waits for the earlier batches");
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), err("42601"), rfq(b'E')] {
        h.server(m);
    }
    // The transaction is aborted: the Parse goes to the server, which answers 25P02.
    let sent = h.server_tags();
    assert!(sent.ends_with("PS"), "{sent}");
    assert!(h.pending.is_empty());
}

/// The session's Close of a leftover portal sits behind whatever the client sent before it
/// in the batch: when an earlier request fails, the server skips the Close with the rest,
/// and the portal is still there after the Sync. The next Execute of it must be closed
/// again. (The concurrent hostile-client test crashed PostgreSQL 15 so: a Bind of portal
/// "hs1" failed, the Close behind it was skipped, and a later Execute of "" went as it was.)
#[test]
fn a_leftover_portal_whose_close_was_skipped_is_closed_again() {
    for mut h in [H::cached(), H::new(PoolMode::Session, None)] {
        h.begin();
        h.client(query("SELECT 1/g FROM generate_series(0, 0) g"));
        h.server(err("22012"));
        h.server(rfq(b'E'));
        h.client_out();
        h.server_out();
        // A Bind of another portal fails first; the Close and the Bind "" behind it are skipped.
        h.client(msg(b'B', b"hs1\0\0\0\0\0\0\0\0"));
        h.client(bind(""));
        h.client(sync());
        assert_eq!(h.server_tags(), "BCBS");
        h.server(err("25P02"));
        h.server(rfq(b'E'));
        assert_eq!(h.client_out(), "EZ");
        h.client(execute());
        h.client(sync());
        assert_eq!(h.server_tags(), "CES", "the portal is still there: closed before the Execute");
    }
}

/// A message PostgreSQL refuses during COPY FROM STDIN goes to the server as it is; but a
/// timeout or a bad row may end the copy before the server reads it, and a COPY that failed
/// in a block leaves its portal as any failed Query does: a Bind or Execute of the unnamed
/// portal is preceded by its Close there too.
#[test]
fn an_execute_sent_into_a_copy_closes_the_leftover_portal_first() {
    let mut h = H::new(PoolMode::Session, None);
    h.begin();
    h.client(query("COPY t FROM STDIN"));
    h.server(msg(b'G', b"\0\0\0"));
    assert_eq!(h.client_out(), "CZG");
    h.server_out();
    h.client(execute());
    assert_eq!(h.server_tags(), "CE", "the Close, then the client's Execute");
}

/// A simple Query that failed inside a transaction block may have left PostgreSQL's unnamed
/// portal behind with its statements freed: before the next Bind or Execute of that portal
/// the session closes it (its CloseComplete is not the client's). Once the block is over,
/// or after a Query that succeeded, nothing is added. With and without the statement cache
/// (session mode reaches PostgreSQL the same way).
#[test]
fn the_unnamed_portal_a_failed_query_may_leave_is_closed_before_its_next_use() {
    for mut h in [H::cached(), H::new(PoolMode::Session, None)] {
        h.begin();
        h.client(query("SELECT 1/g FROM generate_series(0, 0) g"));
        h.server(err("22012"));
        h.server(rfq(b'E'));
        assert_eq!(h.client_out(), "CZEZ");
        h.server_out();
        h.client(execute());
        h.client(sync());
        assert_eq!(h.server_tags(), "CES", "Close of the unnamed portal, then the client's Execute and Sync");
        h.server(msg(b'3', b""));
        h.server(err("34000"));
        h.server(rfq(b'E'));
        assert_eq!(h.client_out(), "EZ", "the CloseComplete is the pooler's");
        // Closed once: the next Execute goes as it is.
        h.client(execute());
        h.client(sync());
        assert_eq!(h.server_tags(), "ES");
        h.server(err("34000"));
        h.server(rfq(b'E'));
        h.client_out();
        // Another failed Query, then a Bind of the unnamed portal: closed before it.
        h.client(query("SELECT 1/g FROM generate_series(0, 0) g"));
        h.server(err("25P02"));
        h.server(rfq(b'E'));
        h.client_out();
        h.server_out();
        h.client(bind(""));
        h.client(sync());
        let sent = h.server_tags();
        assert!(sent.ends_with("CBS"), "{sent}");
        h.server(msg(b'3', b""));
        h.server(err("25P02"));
        h.server(rfq(b'E'));
        assert_eq!(h.client_out(), "EZ");
        h.client(query("ROLLBACK"));
        h.server(msg(b'C', b"ROLLBACK\0"));
        h.server(rfq(b'I'));
        h.client_out();
        h.server_out();
        // A block whose Queries succeed: the client's portal is never touched.
        h.begin();
        h.client(parse("", "SELECT 1"));
        h.client(bind(""));
        h.client(msg(b'E', b"\0\0\0\0\x01"));
        h.client(sync());
        let sent = h.server_tags();
        assert!(sent.ends_with("BES") && !sent.contains('C'), "{sent}");
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b's', b""), rfq(b'T')] {
            h.server(m);
        }
        h.client(execute());
        h.client(sync());
        assert_eq!(h.server_tags(), "ES", "the suspended portal runs on");
    }
}

/// A copy message reaches the server only inside COPY FROM STDIN. With nothing outstanding
/// that may start one it is dropped (PostgreSQL ignores it; sent, a timer's error raised as
/// the server reads it would end the batch with a ReadyForQuery of its own). Behind an
/// Execute that may start one, it waits for the Execute's answer, the server asked to flush
/// it: a CopyInResponse lets it go, a plain answer drops it, and the frames after it wait
/// their turn.
#[test]
fn a_copy_message_reaches_the_server_only_inside_copy() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(parse("", "select 1"));
    h.client(msg(b'c', b""));
    h.client(msg(b'd', b"x"));
    h.client(msg(b'f', b"no\0"));
    h.client(sync());
    assert_eq!(h.server_tags(), "PS", "only the Parse and the Sync");
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");

    // Behind an Execute of a COPY FROM STDIN: the data waits for the CopyInResponse.
    h.client(parse("", "copy t from stdin"));
    h.client(bind(""));
    h.client(execute());
    h.client(msg(b'd', b"1\n"));
    h.client(msg(b'c', b""));
    h.client(sync());
    assert_eq!(h.server_tags(), "PBEH", "the data waits; the server is asked to flush the Execute's answer");
    for m in [msg(b'1', b""), msg(b'2', b"")] {
        h.server(m);
    }
    assert!(h.server_out().is_empty(), "still waiting");
    h.server(msg(b'G', &[0, 0, 1, 0, 0]));
    assert_eq!(h.server_tags(), "dcS", "the copy goes once it started");
    h.server(msg(b'C', b"COPY 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "12GCZ");

    // Behind an Execute of a plain SELECT: dropped once it is answered, and the Bind after
    // it (fed only then) runs as its own request.
    h.client(parse("", "select 2"));
    h.client(bind(""));
    h.client(execute());
    h.client(msg(b'f', b"no\0"));
    h.client(bind(""));
    h.client(execute());
    h.client(sync());
    assert_eq!(h.server_tags(), "PBEH");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'D', b"\0\x01\0\0\0\x012"), msg(b'C', b"SELECT 1\0")] {
        h.server(m);
    }
    assert_eq!(h.server_tags(), "BES", "the CopyFail is not sent");
    assert_eq!(h.client_out(), "", "nothing before the client's Sync (the flush was the pooler's)");
    for m in [msg(b'2', b""), msg(b'D', b"\0\x01\0\0\0\x012"), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "12DC2DCZ");
}

/// A Flush with a body is refused as PostgreSQL words it, and never sent on: the server's
/// ERROR for it would answer no request the session knows of.
#[test]
fn a_flush_with_a_body_closes_the_client_and_is_not_sent_on() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(parse("", "select 1"));
    h.client(msg(b'H', b"junk"));
    assert_eq!(h.server_tags(), "P", "the Parse only");
    let out = text(&h.s.to_client);
    assert!(out.contains("08P01") && out.contains("invalid message format"), "{out}");
    assert!(h.s.is_closing());
    // Unlinked too.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(msg(b'H', b"x"));
    assert!(text(&h.s.to_client).contains("invalid message format"));
    assert!(h.s.is_closing());
}
