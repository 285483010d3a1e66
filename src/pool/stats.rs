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
    pub connects: AtomicU64,
    /// Failed connect attempts.
    pub connect_failures: AtomicU64,
    /// Checkouts served.
    pub checkouts: AtomicU64,
    /// Checkouts that had to wait.
    pub waits: AtomicU64,
    /// Checkouts that timed out.
    pub wait_timeouts: AtomicU64,
    /// Checkouts served with a ticket on a connection busy with other batches.
    pub pipelined: AtomicU64,
    /// Cancels sent with `pg_cancel_backend` because batches were queued behind the query.
    pub pipelined_cancels: AtomicU64,
}

/// A pool as the console shows it, read at one moment.
#[derive(Clone, Debug)]
pub struct PoolSnapshot {
    /// The pool's key.
    pub key: PoolKey,
    /// Pool mode of its clients.
    pub mode: PoolMode,
    /// Maximum open connections.
    pub size: usize,
    /// Idle connections.
    pub idle: usize,
    /// Open connections (idle, in use, being opened).
    pub open: usize,
    /// Queued checkouts.
    pub waiting: usize,
    /// Counters: connects, connect failures, checkouts, waits, wait timeouts, pipelined,
    /// pipelined cancels.
    pub connects: u64,
    /// See [`PoolStats::connect_failures`].
    pub connect_failures: u64,
    /// See [`PoolStats::checkouts`].
    pub checkouts: u64,
    /// See [`PoolStats::waits`].
    pub waits: u64,
    /// See [`PoolStats::wait_timeouts`].
    pub wait_timeouts: u64,
    /// See [`PoolStats::pipelined`].
    pub pipelined: u64,
    /// See [`PoolStats::pipelined_cancels`].
    pub pipelined_cancels: u64,
    /// The pool's statement cache (its counters and statements).
    pub stmts: Arc<Registry>,
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
