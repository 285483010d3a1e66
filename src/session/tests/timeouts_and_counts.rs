//! Timeouts decided from the time the driver reports, and the error tally.

use super::*;

#[test]
fn timeouts_are_decided_by_the_session_from_the_time_the_driver_reports() {
    use std::time::{Duration, Instant};
    let t = idle_timeouts();
    let t0 = Instant::now();
    // Idle without a server: the idle-session timeout applies, not before it is due.
    let mut h = H::new(PoolMode::Transaction, None);
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(10)));
    assert_eq!(h.s.poll_timeout(&t, t0, true), None, "unread client bytes: not idle");
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(9));
    assert!(!h.s.is_closing() && h.s.to_client.is_empty());
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(10));
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("C57P05"), "{}", text(&h.s.to_client));
    // Idle inside a transaction: the idle-in-transaction timeout applies.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("BEGIN"));
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T')] {
        h.server(m);
    }
    h.client_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), None, "BEGIN not written to the server yet");
    h.server_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(3)));
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(2));
    assert!(!h.s.is_closing());
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(3));
    assert!(text(&h.s.to_client).contains("C25P03"), "{}", text(&h.s.to_client));
    let actions: Vec<_> = std::iter::from_fn(|| h.s.poll_action()).collect();
    // The server stays linked: closing rolls its transaction back and gives it back
    // (`settle`), instead of throwing the connection away.
    assert_eq!(actions, vec![Action::Close]);
    assert!(h.s.is_linked());
    // A request in flight: no timeout applies, unless query_timeout is set.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("SELECT pg_sleep(60)"));
    assert_eq!(h.s.poll_timeout(&t, t0, false), None);
    let t = Timeouts { query: Some(Duration::from_secs(5)), ..t };
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(5)), "query_timeout");
    assert!(!h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(4)));
    assert!(!h.s.is_closing());
    assert!(h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(5)), "the driver cancels the query");
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("C57014"), "{}", text(&h.s.to_client));
    assert!(text(&h.s.to_client).contains("query_timeout"), "{}", text(&h.s.to_client));
}

#[test]
fn transaction_timeout_runs_from_the_transactions_first_request_whatever_it_does() {
    use std::time::{Duration, Instant};
    let t = Timeouts { transaction: Some(Duration::from_secs(5)), ..Timeouts::default() };
    let t0 = Instant::now();
    let mut h = H::new(PoolMode::Transaction, None);
    assert_eq!(h.s.poll_timeout(&t, t0, false), None, "no transaction, no timeout");
    h.client(query("BEGIN"));
    let _ = h.server_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(5)));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    // Later requests do not move it: the transaction's start does.
    let t1 = t0 + Duration::from_secs(3);
    h.client(query("SELECT pg_sleep(60)"));
    assert_eq!(h.s.poll_timeout(&t, t1, false), Some(t0 + Duration::from_secs(5)));
    assert!(!h.s.handle_timeout(&t, t1, false, t0 + Duration::from_secs(4)));
    assert!(!h.s.is_closing());
    assert!(h.s.handle_timeout(&t, t1, false, t0 + Duration::from_secs(5)), "running: the driver cancels it");
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("C25P04"), "{}", text(&h.s.to_client));
    assert!(text(&h.s.to_client).contains("transaction_timeout"), "{}", text(&h.s.to_client));

    // Idle in the transaction: closed too, with nothing to cancel; a transaction that ended
    // forgets its start.
    let mut h = H::new(PoolMode::Session, None);
    h.client(query("BEGIN"));
    let _ = h.server_out();
    assert!(h.s.poll_timeout(&t, t0, false).is_some());
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.s.poll_timeout(&t, t0, false), None, "between transactions");
    let t2 = t0 + Duration::from_secs(60);
    h.begin();
    assert_eq!(h.s.poll_timeout(&t, t2, false), Some(t2 + Duration::from_secs(5)), "a new start");
    assert!(!h.s.handle_timeout(&t, t2, false, t2 + Duration::from_secs(5)), "nothing running");
    assert!(text(&h.s.to_client).contains("C25P04"), "{}", text(&h.s.to_client));
}

#[test]
fn tally_counts_errors_by_class() {
    let mut t = super::Tally::default();
    assert!(!t.has_errors());
    for c in [&b"22012"[..], b"42P01", b"22003", b"23505", b"40001", b""] {
        t.error(c);
    }
    let v: Vec<_> = t.errors().collect();
    // Three classes apart; a fourth and fifth class, rare in one tally, count under the last.
    assert_eq!(v, vec![(*b"22", 2), (*b"42", 1), (*b"23", 3)]);
}

/// A batch that ran half as long as a statement timeout in effect may have ended as the
/// timer fired: the backend may then send an error and a ReadyForQuery of its own, unasked
/// (`state::timers`), so the server is closed when given back, whether the timer is the
/// session's or ended with its transaction (`SET LOCAL`). So is one whose session arms a
/// timer of 100 ms or less, however short the batch. A cancelled statement (a cancel
/// request's signal may come twice) leaves a signal the server's next user absorbs with a
/// `SELECT 1` of the pooler's first, unseen by the client. A short batch, or one with no
/// timer in effect, leaves nothing.
#[test]
fn a_cancel_a_timeout_may_have_left_is_absorbed_or_the_server_closed() {
    let frames_of = |h: &mut H| h.server_out().iter().map(|f| text(f)).collect::<Vec<_>>();
    let answer = |h: &mut H, clock: u64, replies: &[Vec<u8>]| {
        h.s.set_clock(clock);
        for r in replies {
            h.server(r.clone());
        }
    };
    let done = [msg(b'C', b"SELECT 1\0"), rfq(b'I')];
    let mut h = H::new(PoolMode::Transaction, None);
    h.s.set_clock(1_000);
    h.client(query("SELECT 1"));
    frames_of(&mut h);
    answer(&mut h, 90_000, &done);
    assert!(!h.srv.cancel_risk, "no timer in effect: a long batch leaves nothing");
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: true }));
    // A timer for one transaction (10 ms), in a block sent at `from` and answered at `to`.
    let local_block = |h: &mut H, from: u64, to: u64| {
        h.s.set_clock(from);
        h.client(query("BEGIN; SET LOCAL statement_timeout = 10; SELECT 3; COMMIT"));
        frames_of(h);
        let replies = [msg(b'C', b"BEGIN\0"), msg(b'C', b"SET\0"), done[0].clone(), msg(b'C', b"COMMIT\0"), rfq(b'I')];
        answer(h, to, &replies);
    };
    // A 6 ms batch against it: closed.
    local_block(&mut h, 99_000, 105_000);
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: false }));
    // A 2 ms one: nothing.
    local_block(&mut h, 150_000, 152_000);
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: true }));
    h.client_out();
    // A cancelled statement: the next user (here the same client, on the same
    // connection) absorbs what a second signal would cancel.
    h.s.set_clock(160_000);
    h.client(query("SELECT 5"));
    frames_of(&mut h);
    answer(&mut h, 160_010, &[err("57014"), rfq(b'I')]);
    assert!(h.srv.cancel_risk);
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: true }), "no timer left there: absorbed");
    h.client_out();
    h.s.set_clock(200_000);
    h.client(query("SELECT 4"));
    let out = frames_of(&mut h);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out[0].contains("SELECT 1") && out[1].contains("SELECT 4"), "{out:?}");
    assert!(!h.srv.cancel_risk);
    answer(&mut h, 200_100, &[err("57014"), rfq(b'I'), msg(b'C', b"SELECT 1\0"), rfq(b'I')]);
    assert_eq!(h.client_out(), "CZ", "the cancel it absorbed is not the client's");
    // A session timer: 30 ms against 200 ms leaves nothing; 120 ms closes the server.
    h.s.set_clock(299_900);
    h.client(query("SET statement_timeout = 200"));
    frames_of(&mut h);
    answer(&mut h, 300_000, &[msg(b'C', b"SET\0"), rfq(b'I')]);
    h.s.set_clock(400_000);
    h.client(query("SELECT 2"));
    frames_of(&mut h);
    answer(&mut h, 430_000, &done);
    assert!(!h.srv.cancel_risk, "a batch far shorter than the timeout");
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: true }));
    h.s.set_clock(500_000);
    h.client(query("SELECT 3"));
    frames_of(&mut h);
    answer(&mut h, 620_000, &done);
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: false }));
    assert_eq!(h.client_out(), "CZCZCZ");
    // A session timer of 100 ms or less: the server never serves another client (the
    // pooler's own statements would run under it), however short the batch.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("SET statement_timeout = '50ms'"));
    frames_of(&mut h);
    answer(&mut h, 10, &[msg(b'C', b"SET\0"), rfq(b'I')]);
    h.s.set_clock(1_000);
    h.client(query("SELECT 6"));
    frames_of(&mut h);
    answer(&mut h, 1_100, &done);
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: false }));
}

/// The absorbing `SELECT 1` is a simple Query, which drops the server's unnamed statement:
/// a client whose plain unnamed statement was parsed on that server parses it again before
/// its Bind, instead of binding a statement that is gone (sqlx's persistent(false) got
/// 26000 "unnamed prepared statement does not exist" after a forwarded cancel).
#[test]
fn the_absorbing_query_makes_a_plain_unnamed_statement_parse_again() {
    let mut h = H::cached();
    for f in [parse("", "SELECT 7"), sync()] {
        h.client(f);
    }
    h.server_out();
    for f in [msg(b'1', b""), rfq(b'I')] {
        h.server(f);
    }
    assert_eq!(h.client_out(), "1Z");
    h.srv.cancel_risk = true;
    for f in [bind(""), execute(), sync()] {
        h.client(f);
    }
    let out: Vec<u8> = h.server_out().iter().map(|f| f[0]).collect();
    assert_eq!(out, b"QPBES", "the absorb, then the Parse again before the Bind");
}

/// A client whose own settings arm a 1 ms statement timeout leaves in the middle of a batch:
/// the Sync that settles its server runs under that timer like any statement of the
/// client's, and the server is not reused (its next user's reset of the timeout would run
/// under it too, and a signal it left would cancel that user's first statement).
#[test]
fn a_server_settled_under_a_tiny_timer_is_not_reused() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("SET statement_timeout = 1"));
    h.server_out();
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    h.client_out();
    h.log.clear();
    h.s.set_clock(1_000);
    for f in [parse("", "SELECT 1"), bind(""), execute()] {
        h.client(f);
    }
    h.server_out();
    assert!(!h.s.server_settled(), "a batch without its Sync");
    h.s.settle_server();
    assert!(h.server_tags().ends_with('S'));
    for f in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(f);
    }
    assert_eq!(h.s.outstanding(), 0);
    // (The harness takes the actions the driver's `settled_reusable` would read.)
    assert_eq!(h.log.last(), Some(&Action::ReleaseServer { reusable: false }), "closed, not handed to another client");
}

/// The ROLLBACK the driver sends for a client that left inside a block runs under the
/// block's `SET LOCAL` timer: so short, it may fire as the ROLLBACK ends, and the server is
/// closed. Under a long timer nothing happens.
#[test]
fn statements_run_at_release_under_a_tiny_timer_cost_the_server() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("BEGIN; SET LOCAL statement_timeout = 1"));
    h.server_out();
    for f in [msg(b'C', b"BEGIN\0"), msg(b'C', b"SET\0"), rfq(b'T')] {
        h.server(f);
    }
    assert!(h.s.server_settled());
    assert!(!h.s.ran_at_release());

    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("SET statement_timeout = '30s'"));
    h.server_out();
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    h.client(query("BEGIN; SELECT 1"));
    h.server_out();
    for f in [msg(b'C', b"BEGIN\0"), msg(b'C', b"SELECT 1\0"), rfq(b'T')] {
        h.server(f);
    }
    assert!(h.s.ran_at_release(), "a ROLLBACK does not run for 30 s");
}
