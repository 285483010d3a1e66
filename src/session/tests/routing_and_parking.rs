//! Which server a batch asks for (primary or standby), and parking an idle session.

use super::*;

#[test]
fn a_plain_autocommit_read_asks_for_a_standby_and_anything_else_waits_for_the_primary() {
    // Without a split in the pool, no batch is looked at.
    let mut h = H::cached();
    h.client(query("select abalance from pgbench_accounts where aid = 1"));
    assert!(!h.s.wants_reads(), "no read/write split");
    let mut h = H::cached();
    h.reads = true;
    h.s.set_read_split(true);
    h.client(query("select abalance from pgbench_accounts where aid = 1"));
    assert!(h.s.wants_reads(), "one plain read outside a transaction");
    // Sent before the read's replies: another read goes to the same standby, a write waits.
    h.client(query("select 2"));
    h.client(query("update pgbench_accounts set abalance = 0"));
    assert_eq!(h.server_out().len(), 2, "the two reads are written, the update is held");
    for _ in 0..2 {
        h.server(msg(b'C', b"SELECT 1\0"));
        h.server(rfq(b'I'));
    }
    // Given back, then the update asks for a server of its own: the primary.
    assert_eq!(
        h.actions(),
        vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }, Action::AcquireServer]
    );
    assert!(!h.s.wants_reads());
    assert_eq!(h.server_out().len(), 1, "the update, on its new server");
    // Not reads: locking clauses, several statements, set_config, transactions, writes.
    for sql in [
        "select * from t for update",
        "select 1; select 2",
        "select set_config('a.b', '1', false)",
        "insert into t values (1)",
        "begin",
    ] {
        let mut h = H::cached();
        h.s.set_read_split(true);
        h.client(query(sql));
        assert!(!h.s.wants_reads(), "{sql}");
    }
    let mut h = H::cached();
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    assert!(!h.s.is_read_batch(&query("select 1")), "inside a transaction block");
    let h = H::new(PoolMode::Session, None);
    assert!(!h.s.is_read_batch(&query("select 1")), "session mode");
}

#[test]
fn an_idle_session_is_parked_and_comes_back_whole() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    // Logged in, nothing sent: at rest.
    h.pump();
    assert_eq!(h.parks, 1);
    h.client(parse("s1", "select 1"));
    h.client(sync());
    assert_eq!(h.parks, 1, "not parked while a request is in flight");
    h.server_out();
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
    assert_eq!(h.parks, 2, "parked once idle, with a statement");
    // In a transaction block: never parked.
    // One statement sent, completed by `tag`, ending with status `status`, written out.
    let round_trip = |h: &mut H, sql: &str, tag: &[u8], status: u8| {
        h.client(query(sql));
        h.server_out();
        h.server(msg(b'C', tag));
        h.server(rfq(status));
        assert_eq!(h.client_out(), "CZ");
    };
    round_trip(&mut h, "begin", b"BEGIN\0", b'T');
    assert_eq!(h.parks, 2);
    assert!(h.s.park().is_none(), "a session in a transaction is not at rest");
    round_trip(&mut h, "commit", b"COMMIT\0", b'I');
    assert_eq!(h.parks, 3);
    // The statement came through the swaps: its Bind on a fresh server re-parses it.
    h.srv = ServerState::default();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    assert_eq!(h.server_tags(), "PBES");
    assert_eq!(h.s.prepared_count(), 1);
}

/// A transaction run through the extended protocol (pgbench `-M extended` and `prepared`,
/// drivers' BEGIN and COMMIT): the portal of its COMMIT, tracked for the settings it may
/// end, ends with the transaction, and the idle client is parked like any other.
#[test]
fn a_client_idle_after_an_extended_commit_is_parked() {
    for named in [false, true] {
        let mut h = H::cached();
        h.pump();
        let parks = h.parks;
        for (sql, tag, status) in
            [("BEGIN", "BEGIN", b'T'), ("UPDATE t SET a = 1", "UPDATE 1", b'T'), ("END", "COMMIT", b'I')]
        {
            let name = if named { format!("s_{tag}") } else { String::new() };
            for f in [parse(&name, sql), bind(&name), execute(), sync()] {
                h.client(f);
            }
            let sent = h.server_tags();
            if sent.starts_with('P') {
                h.server(msg(b'1', b""));
            }
            h.server(msg(b'2', b""));
            h.server(msg(b'C', format!("{tag}\0").as_bytes()));
            h.server(rfq(status));
            assert!(h.client_out().ends_with("2CZ"), "{sql}");
        }
        assert_eq!(h.parks, parks + 1, "named {named}: parked once the transaction ended");
    }
}

/// The client parses statement `name` of one column and has it described; the server
/// answers; the session, now at rest, is parked.
fn parse_describe_park(h: &mut H, name: &str) -> crate::session::Parked {
    for f in [parse(name, "select 1 as a"), msg(b'D', format!("S{name}\0").as_bytes()), sync()] {
        h.client(f);
    }
    h.server_out();
    h.server(msg(b'1', b""));
    h.server(msg(b't', b"\0\0"));
    h.server(rowdesc(&["a"], 0));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1tTZ");
    h.s.park().expect("at rest")
}

/// A client of the extended protocol with no named statement parks its unnamed statement
/// (and the descriptions it was given) alone, not a whole set of statements, and gets it
/// back whole: a later Bind of it runs, re-parsed on a server that does not have it.
#[test]
fn an_idle_client_with_only_its_unnamed_statement_parks_it_alone() {
    let mut h = H::cached();
    let p = parse_describe_park(&mut h, "");
    assert!(Session::parked_unnamed_only(&p), "parked alone");
    assert!(!Session::parked_cached_unnamed(&p), "a plain statement keeps its frame");
    h.s.unpark(p);
    h.srv = ServerState::default();
    for f in [bind(""), execute(), sync()] {
        h.client(f);
    }
    // Re-parsed from what it kept, its shape checked against the description it was given.
    assert_eq!(h.server_tags(), "PDH");
    h.server(msg(b'1', b""));
    h.server(msg(b't', b"\0\0"));
    h.server(rowdesc(&["a"], 0));
    assert_eq!(h.server_tags(), "BES");
    h.server(msg(b'2', b""));
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "2CZ");
}

/// A client of named statements (pgx, asyncpg, pgjdbc, `-M prepared`) parks its names and
/// the descriptions it was given in a box of their own, not a whole set of statements, and
/// gets them back: a Describe is answered from what it was told, a Bind runs.
#[test]
fn an_idle_client_with_named_statements_parks_them_alone() {
    let mut h = H::cached();
    let p = parse_describe_park(&mut h, "s1");
    assert!(Session::parked_names_only(&p), "names parked alone");
    h.s.unpark(p);
    assert_eq!(h.s.prepared_count(), 1);
    let s1 = h.s.stmts.named.get(b"s1").expect("the name came back").clone();
    assert!(h.s.stmts.described.contains(&s1.id), "and the description it was given");
    for f in [bind("s1"), execute(), sync()] {
        h.client(f);
    }
    assert_eq!(h.server_tags(), "BES");
}

/// A client that holds an unnamed statement beside its named ones (psycopg, which parses
/// unnamed until a text reaches its prepare threshold) parks them in the names' box too,
/// and gets both back: the unnamed one is parsed again on a server that lacks it.
#[test]
fn an_idle_client_with_named_and_unnamed_statements_parks_them_in_one_small_box() {
    let mut h = H::cached();
    let p = parse_describe_park(&mut h, "s1");
    h.s.unpark(p);
    for f in [parse("", "select 2 as b"), bind(""), execute(), sync()] {
        h.client(f);
    }
    assert_eq!(h.server_tags(), "PBES");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "12CZ");
    let p = h.s.park().expect("at rest");
    assert!(Session::parked_names_only(&p), "not a whole set of statements");
    h.s.unpark(p);
    assert_eq!(h.s.prepared_count(), 1);
    h.srv = ServerState::default();
    for f in [bind(""), execute(), sync()] {
        h.client(f);
    }
    assert_eq!(h.server_tags(), "PBES", "the unnamed statement came back, parsed again here");
}

/// A client of unnamed statements only (TPC-B through `-M extended`: a few texts in turn)
/// is told the rows of each; parked (as the harness parks it at each ReadyForQuery, and
/// here once more), it keeps the description of its last one only: it can name no other
/// without a Parse, which forgets that description anyway. (Kept, the set grew with every
/// text the client used.)
#[test]
fn a_parked_unnamed_client_keeps_only_its_last_statements_description() {
    let mut h = H::cached();
    for text in ["select 1 as a", "select 2 as b"] {
        for _ in 0..3 {
            for f in [parse("", text), bind(""), msg(b'D', b"P\0"), execute(), sync()] {
                h.client(f);
            }
            let tags = h.server_tags();
            if tags.starts_with('P') {
                h.server(msg(b'1', b""));
            }
            h.server(msg(b'2', b""));
            h.server(rowdesc(&[&text[text.len() - 1..]], 0));
            h.server(msg(b'C', b"SELECT 1\0"));
            h.server(rfq(b'I'));
            assert_eq!(h.client_out(), "12TCZ");
        }
    }
    let p = h.s.park().expect("at rest");
    assert!(Session::parked_cached_unnamed(&p), "in its small box");
    h.s.unpark(p);
    let crate::session::stmts::Unnamed::Cached(last) = &h.s.stmts.unnamed else { panic!("the last one is cached") };
    assert_eq!(h.s.stmts.described.iter().copied().collect::<Vec<_>>(), [last.id]);
}
