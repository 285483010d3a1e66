//! Timeouts decided from the time the driver reports, and the error tally.

use super::*;

#[test]
fn timeouts_are_decided_by_the_session_from_the_time_the_driver_reports() {
    use std::time::{Duration, Instant};
    let t = Timeouts { client_idle: Some(Duration::from_secs(10)), idle_in_transaction: Some(Duration::from_secs(3)) };
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
    // A request in flight: no timeout applies.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("SELECT pg_sleep(60)"));
    assert_eq!(h.s.poll_timeout(&t, t0, false), None);
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
