//! A lone BEGIN answered without a server and sent with the transaction's first statement
//! (`session::begin`).

use super::*;

fn deferring() -> H {
    let mut h = H::new(PoolMode::Transaction, None);
    h.s.set_defer_begin(true);
    h
}

/// The client's output as whole frames (not only what may be written yet).
fn client_frames(h: &mut H) -> Vec<Vec<u8>> {
    frames(&h.s.to_client.split())
}

#[test]
fn a_lone_begin_is_answered_without_a_server_and_goes_ahead_of_the_first_statement() {
    let mut h = deferring();
    h.client(query("BEGIN"));
    assert!(h.actions().is_empty(), "no server taken for the BEGIN");
    assert_eq!(client_frames(&mut h), vec![msg(b'C', b"BEGIN\0"), rfq(b'T')]);
    assert!(h.s.in_transaction() && h.s.begin_deferred());
    assert!(h.s.park().is_none(), "a client in a transaction block is not at rest");
    h.client(query("UPDATE t SET x = 1"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    let out = h.server_out();
    assert_eq!(out, vec![query("BEGIN"), query("UPDATE t SET x = 1")], "one write, BEGIN first");
    assert!(!h.s.begin_deferred());
    assert!(!h.s.request_running(), "the BEGIN runs ahead of the client's request");
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T')] {
        h.server(m);
    }
    assert!(h.s.request_running(), "the backend is on the client's UPDATE");
    for m in [msg(b'C', b"UPDATE 1\0"), rfq(b'T')] {
        h.server(m);
    }
    assert_eq!(client_frames(&mut h), vec![msg(b'C', b"UPDATE 1\0"), rfq(b'T')], "the BEGIN's replies hidden");
    assert!(h.actions().is_empty(), "kept inside the block");
    h.client(query("COMMIT"));
    for m in [msg(b'C', b"COMMIT\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: true }]);
    assert_eq!(client_frames(&mut h), vec![msg(b'C', b"COMMIT\0"), rfq(b'I')]);
    assert!(!h.s.in_transaction());
}

#[test]
fn the_deferred_begin_follows_the_clients_settings_on_the_server() {
    let mut h = deferring();
    h.client(query("SET search_path = app"));
    h.server_out();
    for m in [msg(b'C', b"SET\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    h.client_out();
    h.client(query("begin;"));
    assert!(h.actions().is_empty());
    // Another server, without the client's setting.
    h.srv = ServerState::default();
    h.client(query("SELECT 1"));
    let out = h.server_out();
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(text(&out[0]).contains("search_path"), "the setting first: {}", text(&out[0]));
    assert_eq!(out[1], query("BEGIN"), "then the BEGIN: a ROLLBACK must not take the setting back");
    assert_eq!(out[2], query("SELECT 1"));
}

#[test]
fn only_a_lone_begin_with_no_server_is_answered_here() {
    // With options, or with another statement: to the server as written.
    for sql in ["BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN; SELECT 1", "START TRANSACTION READ ONLY"] {
        let mut h = deferring();
        h.client(query(sql));
        assert_eq!(h.actions(), vec![Action::AcquireServer], "{sql}");
        assert_eq!(h.server_out(), vec![query(sql)], "{sql}");
    }
    // Turned off, and in session mode.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("BEGIN"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    let mut h = H::new(PoolMode::Session, None);
    h.s.set_defer_begin(true);
    h.client(query("BEGIN"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    // A second BEGIN inside the deferred block goes to the server behind the first, which
    // warns as PostgreSQL does.
    let mut h = deferring();
    h.client(query("BEGIN"));
    h.client(query("BEGIN"));
    assert_eq!(h.server_out(), vec![query("BEGIN"), query("BEGIN")]);
}

/// A failed wait for a server (a cancel, `query_wait_timeout`) inside a deferred block fails
/// the block as PostgreSQL's error would: ERROR and ReadyForQuery 'E'; its ROLLBACK (or
/// COMMIT) is answered ROLLBACK without a server, and anything else reaches a server whose
/// block was made to fail the same way, which refuses it.
#[test]
fn a_failed_wait_for_a_server_fails_a_deferred_block() {
    for next in ["ROLLBACK", "COMMIT", "SELECT 1"] {
        let mut h = deferring();
        h.client(query("BEGIN"));
        h.client_out();
        // As the driver: the pool could not give a server for the statement.
        h.pending.push(query("UPDATE t SET x = 1"));
        assert_eq!(h.s.handle_client(&h.pending[0], None), Fed::NeedsServer);
        assert_eq!(h.s.poll_action(), Some(Action::AcquireServer));
        h.s.handle_acquire_failed(Error::new(SqlState::QUERY_CANCELED, "canceling statement due to user request"));
        h.pump();
        assert!(!h.s.is_closing());
        let out = client_frames(&mut h);
        assert!(text(&out[0]).contains("C57014"), "{out:?}");
        assert_eq!(out[1], rfq(b'E'));
        h.client(query(next));
        if next == "SELECT 1" {
            assert_eq!(h.actions(), vec![Action::AcquireServer]);
            let out = h.server_out();
            assert_eq!(out.len(), 3, "{out:?}");
            assert_eq!(out[0], query("BEGIN"));
            assert!(text(&out[1]).contains("RAISE EXCEPTION"), "{}", text(&out[1]));
            assert_eq!(out[2], query("SELECT 1"));
            for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), err("P0001"), rfq(b'E'), err("25P02"), rfq(b'E')] {
                h.server(m);
            }
            let out = client_frames(&mut h);
            assert_eq!(out.len(), 2, "only the client's own answer: {out:?}");
            assert!(text(&out[0]).contains("C25P02"));
            assert_eq!(out[1], rfq(b'E'));
        } else {
            assert!(h.actions().is_empty(), "{next}: no server");
            assert_eq!(client_frames(&mut h), vec![msg(b'C', b"ROLLBACK\0"), rfq(b'I')], "{next}");
        }
    }
}

#[test]
fn an_error_answering_the_deferred_begin_reaches_the_client_and_gives_the_server_up() {
    let mut h = deferring();
    h.client(query("BEGIN"));
    h.client_out();
    h.client(query("SELECT 1"));
    h.actions();
    h.server(err("XX000"));
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("CXX000"));
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: false }, Action::Close]);
}

#[test]
fn idle_in_a_deferred_block_is_idle_in_a_transaction() {
    use std::time::{Duration, Instant};
    let t = idle_timeouts();
    let t0 = Instant::now();
    let mut h = deferring();
    h.client(query("BEGIN"));
    h.client_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(3)));
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(3));
    assert!(text(&h.s.to_client).contains("C25P03"), "{}", text(&h.s.to_client));
}

/// With the cache on, statement messages the cache answers without a server outside a
/// block take one inside a deferred block (an error there must fail the server's
/// transaction), and a lone Sync reports the block.
#[test]
fn the_cache_answers_nothing_locally_inside_a_deferred_block() {
    let mut h = H::cached();
    h.s.set_defer_begin(true);
    h.client(query("BEGIN"));
    assert!(h.actions().is_empty());
    h.client_out();
    h.client(sync());
    assert_eq!(client_frames(&mut h), vec![rfq(b'T')], "a Sync in the block");
    h.client(close_s("nope"));
    h.client(sync());
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    let out = h.server_out();
    assert_eq!(out[0], query("BEGIN"), "{out:?}");
}

/// BEGIN, then COMMIT or ROLLBACK with nothing between: no server at all, PostgreSQL's
/// answers; with a LISTEN between, the end goes to a server as before (the block's LISTEN
/// takes effect at its COMMIT).
#[test]
fn a_block_that_ran_nothing_ends_without_a_server() {
    for (end, tag) in
        [("COMMIT", &b"COMMIT\0"[..]), ("end;", b"COMMIT\0"), ("ROLLBACK", b"ROLLBACK\0"), ("abort", b"ROLLBACK\0")]
    {
        let mut h = deferring();
        h.client(query("BEGIN"));
        h.client_out();
        h.client(query(end));
        assert!(h.actions().is_empty(), "{end}: no server");
        assert_eq!(client_frames(&mut h), vec![msg(b'C', tag), rfq(b'I')], "{end}");
        assert!(!h.s.in_transaction() && !h.s.begin_deferred());
        assert!(h.s.take_tally().is_some_and(|t| t.xacts == 1 && t.queries == 2), "{end}");
    }
    // A LISTEN in the block: its COMMIT goes to a server.
    let mut h = deferring();
    h.client(query("BEGIN"));
    h.client(query("LISTEN x"));
    h.client(query("COMMIT"));
    assert!(h.actions().contains(&Action::AcquireServer));
    assert_eq!(h.server_out(), vec![query("BEGIN"), query("COMMIT")]);
    // COMMIT AND CHAIN keeps a block open: the server runs it.
    let mut h = deferring();
    h.client(query("BEGIN"));
    h.client(query("COMMIT AND CHAIN"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert_eq!(h.server_out(), vec![query("BEGIN"), query("COMMIT AND CHAIN")]);
}

fn describe_p() -> Vec<u8> {
    msg(b'D', b"P\0")
}

/// A cached session with `defer_begin` that has prepared statement `b` as `BEGIN` (and
/// been given its ParseComplete).
fn prepared_begin(sql: &str) -> H {
    let mut h = H::cached();
    h.s.set_defer_begin(true);
    h.client(parse("b", sql));
    h.client(sync());
    h.pump();
    for m in h.server_out().iter().filter(|f| f[0] == b'P' || f[0] == b'S') {
        let reply = if m[0] == b'P' { msg(b'1', b"") } else { rfq(b'I') };
        h.server(reply);
    }
    h.actions();
    client_frames(&mut h);
    h
}

/// A session inside a block its prepared BEGIN opened, answered here (see below); the
/// client has read the answers.
fn in_a_block_of_a_prepared_begin() -> H {
    let mut h = prepared_begin("BEGIN");
    for f in [bind("b"), execute(), sync()] {
        h.client(f);
    }
    client_frames(&mut h);
    assert!(h.s.begin_deferred());
    h
}

/// pgbench `-M prepared`'s BEGIN: Bind of its prepared BEGIN, Describe, Execute, Sync, all
/// answered without a server; the BEGIN goes ahead of the transaction's first statement.
#[test]
fn an_extended_begin_is_answered_without_a_server_and_goes_ahead_of_the_first_statement() {
    let mut h = prepared_begin("BEGIN");
    for f in [bind("b"), describe_p(), execute(), sync()] {
        h.client(f);
    }
    assert!(h.actions().is_empty(), "no server taken for the BEGIN");
    assert!(h.server_out().is_empty());
    assert_eq!(
        client_frames(&mut h),
        vec![msg(b'2', b""), msg(b'n', b""), msg(b'C', b"BEGIN\0"), rfq(b'T')],
        "PostgreSQL's answers"
    );
    assert!(h.s.in_transaction() && h.s.begin_deferred());
    h.client(query("UPDATE t SET x = 1"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert_eq!(h.server_out(), vec![query("BEGIN"), query("UPDATE t SET x = 1")]);
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), msg(b'C', b"UPDATE 1\0"), rfq(b'T')] {
        h.server(m);
    }
    assert_eq!(client_frames(&mut h), vec![msg(b'C', b"UPDATE 1\0"), rfq(b'T')], "the BEGIN's replies hidden");
    // pgjdbc's way: the BEGIN's Bind/Execute and the first statement in one batch.
    let mut h = prepared_begin("begin");
    for f in [bind("b"), execute(), query("SELECT 1")] {
        h.client(f);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert_eq!(h.server_out(), vec![query("BEGIN"), query("SELECT 1")]);
}

/// A message that needs a server between the BEGIN portal's Bind and its Execute: the Bind
/// goes to the server first (its BindComplete, given already, hidden), and the Execute runs
/// there, as PostgreSQL would have run it.
#[test]
fn a_begin_portal_used_on_a_server_is_bound_there_first() {
    let mut h = prepared_begin("BEGIN");
    h.client(bind("b"));
    assert!(h.actions().is_empty());
    h.client(close_s("other"));
    h.client(describe_p());
    h.client(execute());
    h.client(sync());
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    let tags = h.server_tags();
    assert!(tags.ends_with("DES") && tags.contains('B'), "the Bind, then the Describe and Execute: {tags}");
    assert!(tags.find('B') < tags.find('C').or(tags.find('D')), "the Bind ahead of the Close: {tags}");
    // The server's answers: any injected Parse, then the Bind, Close, Describe, Execute.
    for t in tags.bytes() {
        let reply = match t {
            b'P' => msg(b'1', b""),
            b'B' => msg(b'2', b""),
            b'C' => msg(b'3', b""),
            b'D' => msg(b'n', b""),
            b'E' => msg(b'C', b"BEGIN\0"),
            _ => rfq(b'T'),
        };
        h.server(reply);
    }
    assert_eq!(
        client_frames(&mut h),
        vec![msg(b'2', b""), msg(b'3', b""), msg(b'n', b""), msg(b'C', b"BEGIN\0"), rfq(b'T')],
        "one BindComplete, in its place"
    );
    assert!(h.s.in_transaction() && !h.s.begin_deferred());
}

/// Only a Bind of the unnamed portal to a bare BEGIN without parameters is answered here;
/// a Bind not executed before Sync opens nothing.
#[test]
fn only_a_bare_extended_begin_is_answered_here() {
    for sql in ["BEGIN ISOLATION LEVEL SERIALIZABLE", "SELECT 1", "START TRANSACTION READ ONLY"] {
        let mut h = prepared_begin(sql);
        h.client(bind("b"));
        assert_eq!(h.actions(), vec![Action::AcquireServer], "{sql}");
    }
    let mut h = prepared_begin("BEGIN");
    h.client(msg(b'B', b"portal\0b\0\0\0\0\0\0\0"));
    assert_eq!(h.actions(), vec![Action::AcquireServer], "a named portal");
    let mut h = prepared_begin("BEGIN");
    h.client(msg(b'B', b"\0b\0\0\0\0\x01\0\0\0\x01x\0\0"));
    assert_eq!(h.actions(), vec![Action::AcquireServer], "a parameter");
    let mut h = prepared_begin("BEGIN");
    h.client(bind("b"));
    h.client(sync());
    assert!(h.actions().is_empty());
    assert_eq!(client_frames(&mut h), vec![msg(b'2', b""), rfq(b'I')]);
    assert!(!h.s.in_transaction() && !h.s.begin_deferred());
    // Turned off: to the server.
    let mut h = prepared_begin("BEGIN");
    h.s.set_defer_begin(false);
    h.client(bind("b"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
}

/// Inside a deferred block a named Parse is answered without a server (pgbench `-M
/// prepared` prepares with a blocking call there); a Parse under a name in use takes a
/// server, whose block its error then fails.
#[test]
fn a_named_parse_is_answered_inside_a_deferred_block() {
    let mut h = prepared_begin("BEGIN");
    // Another client's Parse made `UPDATE t SET x = 1` known valid.
    h.client(parse("u0", "UPDATE t SET x = 1"));
    h.client(sync());
    for m in h.server_out().iter().filter(|f| f[0] == b'P' || f[0] == b'S') {
        h.server(if m[0] == b'P' { msg(b'1', b"") } else { rfq(b'I') });
    }
    h.actions();
    client_frames(&mut h);
    for f in [bind("b"), execute(), sync()] {
        h.client(f);
    }
    client_frames(&mut h);
    assert!(h.s.begin_deferred());
    h.client(parse("u", "UPDATE t SET x = 1"));
    h.client(sync());
    assert!(h.actions().is_empty(), "no server for a Parse the cache answers");
    assert_eq!(client_frames(&mut h), vec![msg(b'1', b""), rfq(b'T')]);
    h.client(parse("u", "UPDATE t SET x = 2"));
    assert_eq!(h.actions(), vec![Action::AcquireServer], "a name in use: the error fails the server's block");
    assert_eq!(h.server_out()[0], query("BEGIN"));
    let mut h = in_a_block_of_a_prepared_begin();
    h.client(parse("n", "SELECT 42"));
    h.client(sync());
    assert!(h.actions().is_empty(), "no server for a statement no server has checked yet");
    assert_eq!(client_frames(&mut h), vec![msg(b'1', b""), rfq(b'T')]);
    // Its first use takes a server: the BEGIN, then the statement parsed ahead of the Bind.
    for f in [bind("n"), execute(), sync()] {
        h.client(f);
    }
    assert_eq!(begin_then(&mut h, b"SELECT 1\0"), "PBES", "parsed on the server ahead of the client's Bind");
    assert_eq!(client_frames(&mut h), vec![msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'T')]);
}

/// A deferred block's first batch that needs a server (a Parse, Bind, Execute, Sync): the
/// server gets the BEGIN first, then the batch, whose tags are returned; it answers both, the
/// batch's Execute with the CommandComplete `tag`.
fn begin_then(h: &mut H, tag: &[u8]) -> String {
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    let out = h.server_out();
    assert_eq!(out[0], query("BEGIN"));
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), msg(b'1', b""), msg(b'2', b""), msg(b'C', tag), rfq(b'T')] {
        h.server(m);
    }
    out[1..].iter().map(|f| f[0] as char).collect()
}

/// A named Parse answered inside a deferred block that the server then refuses: its first
/// use gets the server's error, and the block is failed, as the Parse would have left it.
#[test]
fn a_parse_answered_ahead_that_the_server_refuses_fails_its_first_use() {
    let mut h = in_a_block_of_a_prepared_begin();
    h.client(parse("n", "SELEC 42"));
    h.client(sync());
    assert!(h.actions().is_empty());
    assert_eq!(client_frames(&mut h), vec![msg(b'1', b""), rfq(b'T')]);
    for f in [bind("n"), execute(), sync()] {
        h.client(f);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    h.server_out();
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), err("42601"), rfq(b'E')] {
        h.server(m);
    }
    assert_eq!(client_frames(&mut h), vec![err("42601"), rfq(b'E')]);
    assert!(h.s.in_transaction() && !h.s.begin_deferred());
}

/// pgbench `-M extended`'s BEGIN: a Parse of the unnamed statement, its Bind, Execute and
/// Sync, all answered without a server; the BEGIN goes ahead of the transaction's first
/// statement, and the unnamed statement is parsed on a server only when it is used there.
#[test]
fn an_unnamed_extended_begin_is_answered_without_a_server() {
    let mut h = H::cached();
    h.s.set_defer_begin(true);
    for f in [parse("", "BEGIN;"), bind(""), describe_p(), execute(), sync()] {
        h.client(f);
    }
    assert!(h.actions().is_empty(), "no server taken for the BEGIN");
    assert!(h.server_out().is_empty());
    assert_eq!(
        client_frames(&mut h),
        vec![msg(b'1', b""), msg(b'2', b""), msg(b'n', b""), msg(b'C', b"BEGIN\0"), rfq(b'T')],
        "PostgreSQL's answers"
    );
    assert!(h.s.in_transaction() && h.s.begin_deferred());
    for f in [parse("", "UPDATE t SET x = 1"), bind(""), execute(), sync()] {
        h.client(f);
    }
    assert_eq!(begin_then(&mut h, b"UPDATE 1\0"), "PBES", "the client's batch, after the BEGIN");
    assert_eq!(client_frames(&mut h), vec![msg(b'1', b""), msg(b'2', b""), msg(b'C', b"UPDATE 1\0"), rfq(b'T')]);
    // A BEGIN parsed here, then described: the server parses it first, as the client's.
    let mut h = H::cached();
    h.s.set_defer_begin(true);
    h.client(parse("", "begin"));
    assert!(h.actions().is_empty());
    h.client(msg(b'D', b"S\0"));
    h.client(sync());
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert_eq!(h.server_tags(), "PDS");
    // A BEGIN with transaction modes, or parameter types: the server's.
    for sql in ["BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN; SELECT 1"] {
        let mut h = H::cached();
        h.s.set_defer_begin(true);
        h.client(parse("", sql));
        assert_eq!(h.actions(), vec![Action::AcquireServer], "{sql}");
    }
}
