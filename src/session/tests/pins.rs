//! Pinning that ends (`session::pins`): SQL that may begin or end session state makes the
//! session ask the server what remains before giving it back, and the answer decides.

use super::*;
use crate::stmt::pins::PinReasons;

/// The DataRow answering the session's question: advisory lock, held cursor, temp, listen.
fn answer(cols: [bool; 4]) -> Vec<u8> {
    let mut b = 4u16.to_be_bytes().to_vec();
    for c in cols {
        b.extend_from_slice(&1i32.to_be_bytes());
        b.push(if c { b't' } else { b'f' });
    }
    msg(b'D', &b)
}

/// The server answers a simple Query `sql` the session sent.
fn run(h: &mut H, tag: &str) {
    h.server(msg(b'C', format!("{tag}\0").as_bytes()));
    h.server(rfq(b'I'));
}

/// The question is the one frame the session wrote; the server answers it with `cols`.
fn asked(h: &mut H, cols: [bool; 4]) {
    let out = h.server_out();
    assert_eq!(out.len(), 1, "one question");
    assert_eq!(frontend::query_text(&out[0][5..]), Some(crate::session::pins::CHECK_SQL.as_bytes()));
    h.server(msg(b'T', b"\0\x04"));
    h.server(answer(cols));
    run(h, "SELECT 1");
}

#[test]
fn an_advisory_lock_pins_until_the_server_says_it_is_released() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("select pg_advisory_lock(1)"));
    assert_eq!(h.server_out().len(), 1);
    run(&mut h, "SELECT 1");
    assert_eq!(h.client_out(), "CZ", "the client's answer, nothing of the question");
    assert!(!h.actions().iter().any(|a| matches!(a, Action::ReleaseServer { .. })));
    asked(&mut h, [true, false, false, false]);
    assert_eq!(h.client_out(), "");
    assert!(h.linked && h.s.is_pinned());
    assert_eq!(h.s.pin_reasons(), PinReasons(PinReasons::ADVISORY_LOCK));
    // A statement that ends nothing: no question.
    h.client(query("select 2"));
    assert_eq!(h.server_out().len(), 1);
    run(&mut h, "SELECT 1");
    assert!(h.s.to_server.is_empty());
    assert!(h.linked);
    assert_eq!(h.client_out(), "CZ");
    // An unlock: asked again; none left, the server is given back, reusable.
    h.client(query("select pg_advisory_unlock(1)"));
    h.server_out();
    run(&mut h, "SELECT 1");
    asked(&mut h, [false; 4]);
    assert!(!h.linked && !h.s.is_pinned());
    assert!(h.actions().contains(&Action::ReleaseServer { reusable: true }));
    assert_eq!(h.client_out(), "CZ");
}

#[test]
fn a_try_lock_that_took_nothing_does_not_pin() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("select pg_try_advisory_lock(1)"));
    h.server_out();
    run(&mut h, "SELECT 1");
    asked(&mut h, [false; 4]);
    assert!(!h.linked && !h.s.is_pinned());
}

#[test]
fn a_failed_question_keeps_the_client_pinned_and_asks_again() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("create temp table t (x int)"));
    h.server_out();
    run(&mut h, "CREATE TABLE");
    h.server_out();
    h.server(err("57014"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZ", "the question's error is not the client's");
    assert!(h.linked);
    assert_eq!(h.s.pin_reasons(), PinReasons(PinReasons::TEMP_TABLE | PinReasons::UNVERIFIED));
    h.client(query("select 1"));
    h.server_out();
    run(&mut h, "SELECT 1");
    asked(&mut h, [false; 4]);
    assert!(!h.linked);
}

#[test]
fn session_mode_never_asks() {
    let mut h = H::new(PoolMode::Session, None);
    h.client(query("select pg_advisory_lock(1)"));
    h.server_out();
    run(&mut h, "SELECT 1");
    assert!(h.s.to_server.is_empty());
    assert!(h.s.pin_reasons().is_empty());
}

#[test]
fn a_pinned_client_idle_past_pinned_timeout_is_told_why() {
    use std::time::{Duration, Instant};
    let t = Timeouts { pinned: Some(Duration::from_secs(5)), ..Timeouts::default() };
    let mut h = H::new(PoolMode::Transaction, None);
    let t0 = Instant::now();
    assert_eq!(h.s.poll_timeout(&t, t0, false), None, "not pinned: no pinned timeout");
    h.client(query("select pg_advisory_lock(1)"));
    h.server_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), None, "busy");
    run(&mut h, "SELECT 1");
    asked(&mut h, [true, false, false, false]);
    h.client_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(5)));
    assert_eq!(h.s.poll_timeout(&t, t0, true), None, "the client sent something");
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(4));
    assert!(!h.s.is_closing());
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(5));
    assert!(h.s.is_closing());
    let out = text(&h.s.to_client);
    assert!(out.contains("FATAL") && out.contains("57P05"), "{out}");
    assert!(out.contains("pinned_timeout (pinned by advisory_lock)"), "{out}");
}

/// An autoprepared unlock (the Query becomes Parse/Bind/Describe/Execute/Sync of the
/// lifted text) asks the server what remains, as the simple Query would: the client is
/// no longer pinned once none is left (it stayed pinned for good with autoprepare on).
#[test]
fn an_autoprepared_unlock_asks_and_unpins() {
    let cfg = crate::stmt::registry::StmtConfig { autoprepare: true, ..Default::default() };
    let mut h = H::new(PoolMode::Transaction, Some(Arc::new(crate::stmt::registry::Registry::new(cfg))));
    let batch = |h: &mut H| {
        let tags = h.server_tags();
        assert_eq!(tags, "PBDES", "autoprepared");
        super::autoprepare::answer(h, true);
    };
    h.client(query("select pg_advisory_lock(1)"));
    batch(&mut h);
    assert_eq!(h.client_out(), "TDCZ");
    asked(&mut h, [true, false, false, false]);
    assert!(h.linked && h.s.is_pinned());
    h.client(query("select pg_advisory_unlock(1)"));
    batch(&mut h);
    assert_eq!(h.client_out(), "TDCZ");
    asked(&mut h, [false; 4]);
    assert!(!h.linked && !h.s.is_pinned());
}

/// Unlocks whose lifted statement is prepared on the pinned server: the cache may answer
/// their Parse, and the question must still follow the unlock's Execute, not come between
/// the cached Parse and the Bind (asked there, the server still holds the lock, and the
/// client stayed pinned after its last unlock).
#[test]
fn a_cached_autoprepared_unlock_is_asked_about_after_it_ran() {
    let cfg = crate::stmt::registry::StmtConfig { autoprepare: true, ..Default::default() };
    let mut h = H::new(PoolMode::Transaction, Some(Arc::new(crate::stmt::registry::Registry::new(cfg))));
    // One autoprepared statement and the question after it; the question's answer says
    // whether an advisory lock remains.
    let run_one = |h: &mut H, sql: &str, lock_left: bool| {
        h.client(query(sql));
        let tags = h.server_tags();
        assert!(!tags.contains('Q'), "{sql}: the question came before the statement ran: {tags}");
        assert!(tags.ends_with("ES"), "{sql}: {tags}");
        assert!(tags.contains('D'), "{sql}: each Query gets its row description: {tags}");
        super::autoprepare::answer(h, tags.starts_with('P'));
        assert_eq!(h.client_out(), "TDCZ", "{sql}");
        asked(h, [lock_left, false, false, false]);
        tags
    };
    let mut seen = Vec::new();
    for _ in 0..5 {
        run_one(&mut h, "select pg_advisory_lock(1)", true);
    }
    for i in 0..5 {
        seen.push(run_one(&mut h, "select pg_advisory_unlock(1)", i < 4));
        assert_eq!(h.s.is_pinned(), i < 4);
    }
    assert!(!h.linked);
    assert!(seen.iter().any(|t| !t.starts_with('P')), "no unlock had its Parse answered by the cache: {seen:?}");
}

#[test]
fn a_lock_taken_by_sql_execute_of_a_parsed_statement_pins() {
    // EXECUTE runs the statement's text: the server is asked what it left after it, as
    // after the statement's own Bind (the question its Parse made due goes first).
    let mut h = H::cached();
    h.client(parse("l", "select pg_advisory_lock(1)"));
    h.client(sync());
    let _ = h.server_out();
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
    h.client(query("EXECUTE l"));
    let out = h.server_out();
    assert_eq!(out.len(), 2, "the question due since the Parse, then the EXECUTE");
    h.server(msg(b'T', b"\0\x04"));
    h.server(answer([false; 4]));
    run(&mut h, "SELECT 1");
    run(&mut h, "SELECT 1");
    assert_eq!(h.client_out(), "CZ");
    asked(&mut h, [true, false, false, false]);
    assert!(h.linked && h.s.is_pinned());
}
