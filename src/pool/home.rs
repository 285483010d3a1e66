//! Which worker thread the caller runs on, as the pool sees it: a number the driver gives
//! each of its event-loop threads (`enter`) and every connection remembers from the thread
//! that opened it (`Pooled::home`). The pool prefers to hand a client a connection of its
//! own thread, so the client's task and the socket's events stay on one core.
//!
//! Holds no IO and no runtime: a thread-local number, 0 on any thread never entered (one
//! event loop, and the unit tests).

use std::cell::Cell;

thread_local! {
    static HERE: Cell<u16> = const { Cell::new(0) };
}

/// Marks the current thread as worker `n` (the driver, once per thread at its start).
pub fn enter(n: u16) {
    HERE.with(|h| h.set(n));
}

/// The current thread's worker number.
pub fn here() -> u16 {
    HERE.with(Cell::get)
}
