//! Pipelining (`pipeline`): which batches may have others queued behind them.

use super::*;

/// A session with statement `s1` (`sql`) prepared on its server and idle.
fn with_prepared(sql: &str) -> H {
    prepared_in(H::cached(), sql)
}

fn prepared_in(mut h: H, sql: &str) -> H {
    h.client(parse("s1", sql));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.server_out();
    h.actions();
    h
}

#[test]
fn autocommit_batch_of_a_prepared_statement_is_pipelinable_once_timed_fast() {
    let mut h = with_prepared("select 1");
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert_eq!(h.server_out().len(), 3, "Bind, Execute, Sync sent");
    let p = h.s.pipelinable(2000).expect("a plain autocommit batch");
    assert!(matches!(p.timed, Timed::Stmt(_)));
    assert!(!p.fast, "never timed: nothing may queue behind it yet");
    p.timed.note(150);
    assert!(h.s.pipelinable(2000).expect("still").fast);
    assert!(!h.s.pipelinable(100).expect("still").fast, "over the limit");
    // One slow run counts at once.
    p.timed.note(50_000);
    assert!(!h.s.pipelinable(2000).expect("still").fast);
    for m in [msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert!(h.s.pipelinable(2000).is_none(), "released: nothing in flight");
}

#[test]
fn batches_that_change_the_server_are_not_pipelinable() {
    // A Parse the server must run.
    let mut h = H::cached();
    for m in [parse("s1", "select 1"), bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "Parse in the batch");

    // A statement that is not plain DML.
    let mut h = with_prepared("begin");
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "BEGIN");

    // No Sync yet (Flush): the server is not idle after it.
    let mut h = with_prepared("select 1");
    for m in [bind("s1"), execute(), msg(b'H', b"")] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "Flush without Sync");

    // Inside a transaction block.
    let mut h = with_prepared("select 1");
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "in a transaction");

    // Simple Queries that are not one plain read.
    for sql in ["update t set a = 1", "select 1; select 2", "select * from t for update", "begin"] {
        let mut h = with_prepared("select 1");
        h.client(query(sql));
        h.server_out();
        assert!(h.s.pipelinable(u32::MAX).is_none(), "{sql}");
    }
}

#[test]
fn a_simple_query_of_one_plain_read_is_pipelinable_once_reads_are_timed_fast() {
    let mut h = H::cached();
    h.client(query("select abalance from pgbench_accounts where aid = 1"));
    assert!(h.s.pipelinable(2000).is_none(), "not written out yet");
    h.server_out();
    let p = h.s.pipelinable(2000).expect("one plain read");
    assert!(matches!(p.timed, Timed::SimpleReads(_)));
    assert!(!p.fast, "never timed");
    p.timed.note(300);
    assert!(h.s.pipelinable(2000).expect("still").fast, "the pool's simple reads are fast now");
    // Inside a transaction block it is not.
    let mut h = H::cached();
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    h.client(query("select 1"));
    h.server_out();
    assert!(h.s.pipelinable(u32::MAX).is_none(), "in a transaction");
}

#[test]
fn a_lent_session_retries_a_stale_plan_on_its_next_server_and_writes_nothing_here() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = prepared_in(H::new(PoolMode::Transaction, Some(reg.clone())), "select * from t");
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    h.server_out();
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert!(h.s.pipelinable(u32::MAX).is_some());
    h.s.set_lent();
    h.server(msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"));
    assert!(h.server_out().is_empty(), "another client's batch is behind: nothing written here");
    h.server(rfq(b'I')); // hidden: the batch is retried
    assert_eq!(h.client_out(), "", "the error and its ReadyForQuery are hidden");
    // Released, then linked again for the replay, which prepares the new generation.
    assert_eq!(
        h.actions(),
        vec![Action::ReleaseServer { reusable: true }, Action::AcquireServer],
        "the replay goes to the next server the client gets"
    );
    let sent = h.server_tags();
    assert_eq!(sent, "PBES");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ", "no error, one ReadyForQuery");
    assert_eq!(reg.stats.retries.load(Ordering::Relaxed), 1);
}
