//! The wait queue: what a checkout finds, what a queued client is woken with, the
//! waiter entries, and the error a wait that timed out ends with.

use super::conn::Connector;
use crate::error::{Error, SqlState};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::oneshot;

/// What a waiting checkout is woken with.
pub(super) enum Handoff<K: Connector> {
    /// A connection handed over directly.
    Conn(Box<K::Conn>),
    /// A ticket on a connection still busy with other clients' batches.
    Ticket(K::Ticket),
    /// A slot was freed: try again (the waiter may open a connection).
    SlotFreed,
    /// `query_wait_timeout` passed (found by `expire_waiters`).
    TimedOut,
}

/// What `Pool::checkout` found.
pub(crate) enum Checkout<K: Connector> {
    /// An idle connection.
    Ready(Box<K::Conn>),
    /// A place in the wait queue: `Pool::wait_queued`.
    Queued(Queued<K>),
    /// A connection must be opened: `Pool::acquire`.
    Slow,
}

/// A place in a pool's wait queue.
pub(crate) struct Queued<K: Connector>(pub(super) oneshot::Receiver<Handoff<K>>);

/// What a queued client is given.
pub(crate) enum Lease<K: Connector> {
    /// A connection of its own.
    Own(Box<K::Conn>),
    /// A ticket on a shared connection: its batch goes behind others'.
    Ticket(K::Ticket),
}

/// A queued checkout. Its deadline is enforced by `expire_waiters` (the janitor), not by
/// a timer per wait: arming and cancelling a timer cost more than the rest of a hand-off.
pub(super) struct Waiter<K: Connector> {
    pub(super) tx: oneshot::Sender<Handoff<K>>,
    pub(super) deadline: Option<Instant>,
    /// When it was queued (`SHOW POOLS`'s maxwait).
    pub(super) since: Instant,
    /// A client's checkout (`checkout`), which can take a ticket on a shared connection.
    pub(super) takes_ticket: bool,
}

impl<K: Connector> std::fmt::Debug for Waiter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("deadline", &self.deadline).finish()
    }
}

impl<K: Connector> super::Pool<K> {
    pub(super) fn wait_timed_out(&self) -> Error {
        self.stats.wait_timeouts.fetch_add(1, Ordering::Relaxed);
        Error::new(
            SqlState::QUERY_CANCELED,
            format!(
                "canceling statement due to query_wait_timeout: no server connection became free within {} ms",
                self.cfg.load().query_wait_timeout_ms
            ),
        )
    }
}
