//! A pool's counters, readable without its lock, and the snapshot the console reads.

use super::key::PoolKey;
use crate::config::PoolMode;
use crate::stmt::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters, readable without the lock.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Server connections opened.
    pub(crate) connects: AtomicU64,
    /// Failed connect attempts.
    pub(crate) connect_failures: AtomicU64,
    /// Checkouts served.
    pub(crate) checkouts: AtomicU64,
    /// Checkouts that had to wait.
    pub(crate) waits: AtomicU64,
    /// Checkouts that timed out.
    pub(crate) wait_timeouts: AtomicU64,
    /// Checkouts served with a ticket on a connection busy with other batches.
    pub(crate) pipelined: AtomicU64,
    /// Cancels sent with `pg_cancel_backend` because batches were queued behind the query.
    pub(crate) pipelined_cancels: AtomicU64,
}

/// A pool as the console shows it, read at one moment.
#[derive(Clone, Debug)]
pub(crate) struct PoolSnapshot {
    /// The pool's key.
    pub(crate) key: PoolKey,
    /// Pool mode of its clients.
    pub(crate) mode: PoolMode,
    /// Maximum open connections.
    pub(crate) size: usize,
    /// Idle connections.
    pub(crate) idle: usize,
    /// Open connections (idle, in use, being opened).
    pub(crate) open: usize,
    /// Queued checkouts.
    pub(crate) waiting: usize,
    /// Counters: connects, connect failures, checkouts, waits, wait timeouts, pipelined,
    /// pipelined cancels.
    pub(crate) connects: u64,
    /// See [`PoolStats::connect_failures`].
    pub(crate) connect_failures: u64,
    /// See [`PoolStats::checkouts`].
    pub(crate) checkouts: u64,
    /// See [`PoolStats::waits`].
    pub(crate) waits: u64,
    /// See [`PoolStats::wait_timeouts`].
    pub(crate) wait_timeouts: u64,
    /// See [`PoolStats::pipelined`].
    pub(crate) pipelined: u64,
    /// See [`PoolStats::pipelined_cancels`].
    pub(crate) pipelined_cancels: u64,
    /// The pool's statement cache (its counters and statements).
    pub(crate) stmts: Arc<Registry>,
}

impl PoolStats {
    /// The counters into `s`.
    pub(super) fn fill(&self, s: &mut PoolSnapshot) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.connects = n(&self.connects);
        s.connect_failures = n(&self.connect_failures);
        s.checkouts = n(&self.checkouts);
        s.waits = n(&self.waits);
        s.wait_timeouts = n(&self.wait_timeouts);
        s.pipelined = n(&self.pipelined);
        s.pipelined_cancels = n(&self.pipelined_cancels);
    }
}
