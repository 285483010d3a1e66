//! Autoprepared simple Queries (`stmts::autoprepare`): a client's later texts that differ
//! only in their integers reuse its lift and bind the cached statement.

use super::*;

fn autoprepared() -> H {
    let cfg = StmtConfig { autoprepare: true, autoprepare_after: 2, ..Default::default() };
    H::new(PoolMode::Transaction, Some(Arc::new(Registry::new(cfg))))
}

/// The server's replies to one autoprepared Query's batch (statement cached: no
/// ParseComplete from the server).
pub(super) fn answer(h: &mut H, parse: bool) {
    let rows = [rowdesc(&["abalance"], 16400), msg(b'D', b"\0\x01\0\0\0\x010"), msg(b'C', b"SELECT 1\0")];
    answer_with(h, parse, &rows, b'I');
}

/// The server's replies to an autoprepared batch: its ParseComplete if `parse`, its
/// BindComplete, `rest`, and ReadyForQuery with `status`.
pub(super) fn answer_with(h: &mut H, parse: bool, rest: &[Vec<u8>], status: u8) {
    if parse {
        h.server(msg(b'1', b""));
    }
    h.server(msg(b'2', b""));
    for f in rest {
        h.server(f.clone());
    }
    h.server(rfq(status));
}

#[test]
fn later_numbers_in_the_same_text_reuse_the_first_querys_lift() {
    let mut h = autoprepared();
    let sql = |aid: u32| query(&format!("SELECT abalance FROM pgbench_accounts WHERE aid = {aid};"));
    // Linked first, as the driver feeds it again once a server is there.
    assert_eq!(h.s.handle_client(&sql(4711), None), Fed::NeedsServer);
    assert_eq!(h.s.poll_action(), Some(Action::AcquireServer));
    h.s.handle_server_linked(&mut h.srv);
    h.linked = true;
    assert_eq!(h.s.handle_client(&sql(4711), Some(&mut h.srv)), Fed::Consumed);
    h.pump();
    let out = h.server_out();
    assert_eq!(out.iter().map(|f| f[0] as char).collect::<String>(), "PBDES");
    assert!(text(&out[0]).contains("aid = $1"), "{}", text(&out[0]));
    assert!(text(&out[1]).ends_with("4711\0\0"), "{:?}", text(&out[1]));
    answer(&mut h, true);
    assert_eq!(h.client_out(), "TDCZ");

    // The second sighting caches it; the third only binds it. Both through the first
    // Query's lift (its template), with their own numbers.
    let mut bound = vec![];
    for aid in [22, 333] {
        h.client(sql(aid));
        let out = h.server_out();
        let tags: String = out.iter().map(|f| f[0] as char).collect();
        let b = out.iter().find(|f| f[0] == b'B').expect("a Bind");
        assert!(text(b).contains("pn_"), "the cached statement: {}", text(b));
        assert!(text(b).ends_with(&format!("{aid}\0\0")), "{:?}", text(b));
        answer(&mut h, tags.starts_with('P'));
        assert_eq!(h.client_out(), "TDCZ");
        bound.push(tags);
    }
    assert_eq!(bound, ["PBDES", "BDES"], "prepared once, then bound");
    assert_eq!(h.s.busy.lifts.as_ref().map(|m| m.len()), Some(1), "one template");
}

/// The batch an autoprepared Query becomes is one request of the client's: its server
/// is not given back between the cache's answer to its Parse and its Bind (given back, it
/// was acquired again for the Bind, and maybe another one).
#[test]
fn the_batch_keeps_its_server_between_its_frames() {
    let mut h = autoprepared();
    let sql = |aid: u32| query(&format!("SELECT abalance FROM pgbench_accounts WHERE aid = {aid};"));
    for aid in [1, 2, 3, 4] {
        h.client(sql(aid));
        let out = h.server_out();
        let tags: String = out.iter().map(|f| f[0] as char).collect();
        assert!(tags.ends_with("BDES"), "{tags}");
        let acts = h.actions();
        assert!(!acts.iter().any(|a| matches!(a, Action::ReleaseServer { .. })), "{aid}: {acts:?}");
        answer(&mut h, tags.starts_with('P'));
        assert_eq!(h.client_out(), "TDCZ");
        assert_eq!(h.actions(), [Action::ReleaseServer { reusable: true }], "given back after its Sync");
    }
}

/// With a read/write split, an autoprepared plain read runs its whole batch on the
/// standby it was given (its frames were held as if they were not the read's: nothing was
/// sent, and the client waited forever).
#[test]
fn an_autoprepared_read_runs_on_its_standby() {
    let mut h = autoprepared();
    h.reads = true;
    h.s.set_read_split(true);
    h.client(query("SELECT abalance FROM pgbench_accounts WHERE aid = 1"));
    let tags = h.server_tags();
    assert_eq!(tags, "PBDES");
    assert!(h.pending.is_empty(), "every frame fed");
    answer(&mut h, true);
    assert_eq!(h.client_out(), "TDCZ");
}

/// A lift template belongs to its text, not to the client that made it: it stays with the
/// busy half when that client parks, and the next client served by that half binds its
/// own numbers through it at once. An idle client keeps no template.
#[test]
fn a_template_serves_the_next_client_of_its_busy_half() {
    let mut h = autoprepared();
    let sql = |aid: u32| query(&format!("SELECT abalance FROM pgbench_accounts WHERE aid = {aid};"));
    let mut tags = vec![];
    for aid in [1, 2, 3] {
        h.client(sql(aid));
        let t = h.server_tags();
        answer(&mut h, t.starts_with('P'));
        assert_eq!(h.client_out(), "TDCZ");
        tags.push(t);
    }
    assert_eq!(tags, ["PBDES", "PBDES", "BDES"]);
    let bound_before = h.s.busy.lifts.as_ref().map_or(0, |m| m.fast_binds);
    assert!(bound_before >= 1, "the third Query was bound directly");

    // The first client parks; another client of the same pool, idle and holding no
    // template (it never sent a Query), is unparked into the busy half it left.
    let registry = h.s.stmts.registry.clone();
    let first = h.s.park().expect("at rest");
    let mut other = Session::new(PoolMode::Transaction, Arc::new(Settings::default()), 8, registry);
    let second = other.park().expect("a new session is at rest");
    assert!(other.busy.lifts.is_none(), "nothing was lifted for the second client");
    h.s.unpark(second);
    h.client(sql(4444));
    let out = h.server_out();
    assert_eq!(out.iter().map(|f| f[0] as char).collect::<String>(), "BDES", "bound at its first Query");
    assert!(text(&out[0]).ends_with("4444\0\0"), "{:?}", text(&out[0]));
    answer(&mut h, false);
    assert_eq!(h.client_out(), "TDCZ");
    assert_eq!(h.s.busy.lifts.as_ref().map_or(0, |m| m.fast_binds), bound_before + 1);
    drop(first);
}

/// Inside a transaction block the cache serves a statement that returns rows too, under a
/// savepoint guard at its first use there (a stale plan's 0A000 is then rolled back and
/// retried, not the client's transaction): the Query is bound directly, not parsed and
/// planned again. After the block it is bound directly with no guard.
#[test]
fn inside_a_transaction_block_a_query_that_returns_rows_is_served_under_a_guard() {
    let mut h = autoprepared();
    let sql = |aid: u32| query(&format!("SELECT abalance FROM pgbench_accounts WHERE aid = {aid};"));
    let mut sent = vec![];
    for aid in [1, 2] {
        h.client(sql(aid));
        let t = h.server_tags();
        answer(&mut h, t.starts_with('P'));
        assert_eq!(h.client_out(), "TDCZ");
        sent.push(t);
    }
    assert_eq!(sent, ["PBDES", "PBDES"], "cached at the second");
    h.client(query("BEGIN"));
    assert_eq!(h.server_tags(), "Q");
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    assert_eq!(h.client_out(), "CZ");
    let bound_before = h.s.busy.lifts.as_ref().map_or(0, |m| m.fast_binds);
    h.client(sql(3));
    let out = h.server_out();
    let tags: String = out.iter().map(|f| f[0] as char).collect();
    // SAVEPOINT (its statement parsed on this server first), the Bind, RELEASE, then the
    // Describe, Execute and Sync of the client's batch.
    assert_eq!(tags, "PBECBPBECDES", "the cached statement under a guard");
    assert_eq!(h.s.busy.lifts.as_ref().map_or(0, |m| m.fast_binds), bound_before + 1, "bound directly");
    assert!(text(&out[0]).contains("SAVEPOINT parsnip_guard"), "{}", text(&out[0]));
    assert!(text(&out[4]).ends_with("3\0\0"), "{:?}", text(&out[4]));
    assert!(text(&out[5]).contains("RELEASE SAVEPOINT parsnip_guard"), "{}", text(&out[5]));
    answer_guarded_read(&mut h);
    assert_eq!(h.client_out(), "TDCZ", "the guard's replies are hidden");
    h.client(query("COMMIT"));
    h.server_out();
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZ");
    h.client(sql(4));
    let t = h.server_tags();
    assert_eq!(t, "BDES", "bound directly after the block");
    answer(&mut h, false);
    assert_eq!(h.client_out(), "TDCZ");
}

/// A client that sends its next Query before a guarded read is answered (it pipelines inside
/// the block) waits for that answer, once: a 0A000 there is rolled back and replayed only
/// while nothing after the batch reached the server (a COMMIT behind it would end the failed
/// transaction). From then on the cache serves it, inside blocks, only what needs no guard:
/// its next block's read goes as the Query it is, and is not held.
#[test]
fn a_query_behind_a_guarded_read_waits_once_then_reads_go_as_they_are_in_blocks() {
    let mut h = autoprepared();
    let sql = |aid: u32| query(&format!("SELECT abalance FROM pgbench_accounts WHERE aid = {aid};"));
    for aid in [1, 2] {
        h.client(sql(aid));
        let t = h.server_tags();
        answer(&mut h, t.starts_with('P'));
        h.client_out();
    }
    let begin = |h: &mut H| {
        h.begin();
        h.server_out();
        assert_eq!(h.client_out(), "CZ");
    };
    begin(&mut h);
    // The read, and the COMMIT right behind it.
    h.client(sql(3));
    h.client(query("COMMIT"));
    assert_eq!(h.server_tags(), "PBECBPBECDES", "the read under its guard; the COMMIT waits");
    answer_guarded_read(&mut h);
    assert_eq!(h.server_tags(), "Q", "the COMMIT goes once the guarded read is answered");
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "TDCZCZ");
    assert!(h.s.stmts.pipelines_in_block);
    // The next block: the read goes as it is (no guard), and the COMMIT is not held.
    begin(&mut h);
    h.client(sql(4));
    h.client(query("COMMIT"));
    assert_eq!(h.server_tags(), "QQ", "the read as it is, the COMMIT behind it");
}

/// The server's replies to an autoprepared read bound under its guard inside a block: the
/// SAVEPOINT (parsed first), the read's BindComplete, the RELEASE (parsed first), the row and
/// ReadyForQuery.
fn answer_guarded_read(h: &mut H) {
    for reply in [&b"1"[..], b"2", b"C", b"3", b"2", b"1", b"2", b"C", b"3"] {
        let body: &[u8] = if reply == b"C" { b"SAVEPOINT\0" } else { b"" };
        h.server(msg(reply[0], body));
    }
    h.server(rowdesc(&["abalance"], 16400));
    h.server(msg(b'D', b"\0\x01\0\0\0\x010"));
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'T'));
}

/// The server's replies to one autoprepared UPDATE's batch inside a block.
fn answer_update(h: &mut H, parse: bool) {
    answer_with(h, parse, &[msg(b'n', b""), msg(b'C', b"UPDATE 1\0")], b'T');
}

/// A write inside a transaction block (TPC-B's UPDATEs and INSERT, which run only there)
/// is promoted and then served by the cache in the block: it returns nothing, so its
/// replan can never fail with 0A000 and it needs no savepoint guard. Each statement is
/// parsed and planned once per server, not once per transaction.
#[test]
fn a_write_inside_a_transaction_block_is_served_by_the_cache_without_a_guard() {
    let mut h = autoprepared();
    let sql = |aid: u32| query(&format!("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = {aid};"));
    h.client(query("BEGIN"));
    h.server_out();
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    assert_eq!(h.client_out(), "CZ");
    let mut sent = vec![];
    for aid in [1, 2, 3, 4] {
        h.client(sql(aid));
        let out = h.server_out();
        let t: String = out.iter().map(|f| f[0] as char).collect();
        assert!(!out.iter().any(|f| text(f).contains("SAVEPOINT")), "no guard: {t}");
        let b = out.iter().find(|f| f[0] == b'B').expect("a Bind");
        assert!(text(b).ends_with(&format!("{aid}\0\0")), "{:?}", text(b));
        answer_update(&mut h, t.starts_with('P'));
        assert_eq!(h.client_out(), "CZ", "{aid}: the Query's replies");
        sent.push(t);
    }
    assert_eq!(sent, ["PBDES", "PBDES", "BDES", "BDES"], "promoted at the second, then bound");
    let parses = |out: &[Vec<u8>]| out.iter().filter(|f| f[0] == b'P').count();
    // The next transaction binds it at once, on this server.
    h.client(query("COMMIT"));
    h.server_out();
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    h.client(query("BEGIN"));
    h.server_out();
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    let _ = h.client_out();
    h.client(sql(5));
    let out = h.server_out();
    assert_eq!(parses(&out), 0, "no Parse: {}", out.iter().map(|f| f[0] as char).collect::<String>());
    answer_update(&mut h, false);
    assert_eq!(h.client_out(), "CZ");
}
