//! The shape epoch: a process-wide counter that moves whenever the schema may have changed
//! under cached statements (a client sent a statement that may be DDL, its transaction
//! ended, or a server answered 0A000). A statement's description confirmed by a server at
//! the current epoch can be given to a client without asking a server again; once the
//! epoch moves, the next Describe goes to a server and confirms it anew.
//!
//! What it cannot see: DDL run by a function or `DO` block called from plain DML, or sent
//! to PostgreSQL without going through this process. A client given a description that such
//! a change made stale is still never sent rows of another shape: the server's statement
//! keeps its result type and answers the next use with 0A000, as PostgreSQL answers a client
//! that described a statement just before the change.

use std::sync::atomic::{AtomicU64, Ordering};

static EPOCH: AtomicU64 = AtomicU64::new(1);

/// The current epoch.
#[inline]
pub(crate) fn current() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// The schema may have changed: descriptions confirmed before now are not answered locally.
pub(crate) fn advance() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
}
