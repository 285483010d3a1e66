//! The wait queue: what a checkout finds, what a queued client is woken with, the
//! waiter entries, and the error a wait that timed out ends with.

use super::conn::Connector;
use crate::error::{Error, SqlState};
use std::collections::VecDeque;
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
    /// The worker thread it waits on (`home::here`): a connection given back on that
    /// thread goes to it before waiters ahead of it on other threads (`pick`), within
    /// `MAX_PASSED_OVER`.
    pub(super) home: u16,
    /// How many times a waiter behind it was handed a connection first.
    pub(super) passed_over: u8,
}

/// How many times a waiter may be passed over for one behind it on the connection's own
/// thread before it is served first come, first served.
pub(super) const MAX_PASSED_OVER: u8 = 2;
/// Every how many janitor ticks `Pool::expire_waiters` reads every waiter's channel for
/// clients that left; below `SWEEP_FROM` waiters, every tick.
pub(super) const SWEEP_EVERY: u32 = 16;
pub(super) const SWEEP_FROM: usize = 256;
/// How far into the queue a connection looks for a waiter of its own thread.
const LOOK_AHEAD: usize = 4;
/// Shorter queues are served strictly first come, first served: the thread a connection
/// happens to be on must not reorder a few clients (the pipelining of a read queued first
/// with one queued behind it depends on that order), while a saturated pool's queue of
/// hundreds saves a wake-up and a move per hand-over.
const AFFINE_FROM: usize = 8;

impl<K: Connector> Waiter<K> {
    pub(super) fn new(
        tx: oneshot::Sender<Handoff<K>>,
        deadline: Option<Instant>,
        since: Instant,
        takes_ticket: bool,
    ) -> Self {
        Waiter { tx, deadline, since, takes_ticket, home: super::home::here(), passed_over: 0 }
    }
}

/// The waiter a connection of thread `home` goes to: in a queue of `AFFINE_FROM` or more,
/// the first waiter of that thread among the first `LOOK_AHEAD`, unless one ahead of it
/// has been passed over `MAX_PASSED_OVER` times already (then the first such); in a
/// shorter queue, the first. A connection and its next client then stay on one thread (no
/// cross-thread wake-up, no move of the socket's registration: `shards`), while no waiter
/// waits more than `MAX_PASSED_OVER` hand-overs longer than first come, first served. The
/// ones passed over are counted.
pub(super) fn pick<K: Connector>(waiters: &mut VecDeque<Waiter<K>>, home: u16) -> Option<Waiter<K>> {
    if waiters.len() < AFFINE_FROM {
        return waiters.pop_front();
    }
    let end = waiters.len().min(LOOK_AHEAD);
    let at = (0..end).find(|&i| waiters[i].passed_over >= MAX_PASSED_OVER || waiters[i].home == home).unwrap_or(0);
    for w in waiters.iter_mut().take(at) {
        w.passed_over += 1;
    }
    waiters.remove(at)
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
