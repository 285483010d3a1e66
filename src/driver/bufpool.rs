//! Per-thread free lists of IO buffers and reply-queue storage. A client borrows them when
//! bytes arrive and gives them back when it goes idle (an idle client holds none), so they
//! are recycled instead of being allocated, grown and freed on every transaction. The
//! same goes for the busy half of a session (`Session::park`): blank sessions are kept
//! here while their clients are idle.
//!
//! The lists are sized by the thread's busy clients (`busy`: sessions not parked): each
//! keeps up to `MIN_FREE` items, or as many as the busy clients use, whichever is more.
//! At 1,000 clients hundreds are busy at once (queued for a server), and the clients that
//! finish a transaction give back what the next ones take; with the lists capped at a
//! fixed 32, most transactions allocated a session and buffers and freed them again. When
//! clients go idle the lists are trimmed back to `MIN_FREE`, so an idle client costs no
//! more than before (docs/benchmarks.md "Idle clients").

use crate::session::Session;
use bytes::BytesMut;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// Size of a pooled buffer (also the read chunk).
pub(crate) const BUF_SIZE: usize = 8192;
/// Larger buffers (a big result went through) are freed rather than kept.
const MAX_KEPT: usize = 64 * 1024;
/// Items kept per list and thread at least (256 KiB of buffers): enough while few clients
/// are busy; more would only show up as memory per idle client (4000 idle clients measured
/// 3.85 KiB each with 256, most of it this list, filled by their logins).
const MIN_FREE: usize = 32;
/// Buffers a busy client holds at most: its read buffer and its two output buffers.
const BUFS_PER_CLIENT: usize = 3;

thread_local! {
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static QUEUES: RefCell<Vec<VecDeque<crate::session::reply_queue::Pending>>> = const { RefCell::new(Vec::new()) };
    // Boxed: a client unparked takes the allocation itself (the proxy holds a box).
    #[allow(clippy::vec_box)]
    static SESSIONS: RefCell<Vec<Box<Session>>> = const { RefCell::new(Vec::new()) };
    /// Clients of this thread whose session is not parked (`parking`).
    static BUSY: Cell<usize> = const { Cell::new(0) };
}

/// How many items a list keeps, `per_client` for each busy client of this thread.
fn cap(per_client: usize) -> usize {
    BUSY.try_with(Cell::get).unwrap_or(0).saturating_mul(per_client).max(MIN_FREE)
}

/// Puts `item` on `list` if it is below the cap for `per_client` items per busy client
/// (`cap`), and drops what is above it (the busy clients it was sized for went idle).
fn keep<T>(list: &'static std::thread::LocalKey<RefCell<Vec<T>>>, item: T, per_client: usize) {
    let cap = cap(per_client);
    let dropped = list.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < cap {
            f.push(item);
            return None;
        }
        Some((item, shed(&mut f, cap, per_client)))
    });
    // Freed outside the borrow.
    drop(dropped);
}

/// Takes off `list` what is above `cap`, at most one more than a client's share per call:
/// called once for each client that goes idle, it keeps up with the cap coming down.
fn shed<T>(list: &mut Vec<T>, cap: usize, per_client: usize) -> Vec<T> {
    let at = list.len() - list.len().saturating_sub(cap).min(per_client + 1);
    list.split_off(at)
}

/// A client of this thread became busy (its session unparked or new) or idle again (parked
/// or gone): the free lists follow their number.
pub(crate) fn busy(up: bool) {
    let _ = BUSY.try_with(|b| b.set(if up { b.get() + 1 } else { b.get().saturating_sub(1) }));
    if !up {
        trim();
    }
}

/// Drops what each list holds above what this thread's busy clients need.
fn trim() {
    fn over<T>(list: &'static std::thread::LocalKey<RefCell<Vec<T>>>, per_client: usize) {
        let cap = cap(per_client);
        let extra = list.try_with(|f| shed(&mut f.borrow_mut(), cap, per_client));
        drop(extra);
    }
    over(&FREE, BUFS_PER_CLIENT);
    over(&QUEUES, 1);
    over(&SESSIONS, 1);
}

/// A blank session (one `Session::park` left) from this thread's free list, if any.
pub(crate) fn take_session() -> Option<Box<Session>> {
    SESSIONS.try_with(|f| f.borrow_mut().pop()).ok().flatten()
}

/// Keeps a blank session for the next client of this thread that becomes active.
pub(crate) fn give_session(s: Box<Session>) {
    keep(&SESSIONS, s, 1);
}

/// Reply-queue storage larger than this (entries) is freed rather than kept.
const MAX_KEPT_ENTRIES: usize = 64;

/// Lends `session` reply-queue storage from this thread's free list (none if it has its own).
#[inline]
pub(crate) fn ensure_queue(session: &mut Session) {
    session.lend_storage(|| QUEUES.try_with(|f| f.borrow_mut().pop()).ok().flatten());
}

/// Takes the empty reply-queue storage of an idle `session` back to this thread's free list.
pub(crate) fn release_queue(session: &mut Session) {
    if let Some(q) = session.take_idle_storage() {
        give_queue(q);
    }
}

fn give_queue(q: VecDeque<crate::session::reply_queue::Pending>) {
    if q.capacity() > MAX_KEPT_ENTRIES || !q.is_empty() {
        return;
    }
    keep(&QUEUES, q, 1);
}

/// An empty buffer with room for at least `BUF_SIZE` bytes.
pub(crate) fn take() -> BytesMut {
    FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten().unwrap_or_else(|| BytesMut::with_capacity(BUF_SIZE))
}

/// Makes sure `buf` has memory: an empty buffer without any borrows one.
#[inline]
pub(crate) fn ensure(buf: &mut BytesMut) {
    if buf.capacity() == 0 {
        *buf = take();
    }
}

/// Gives the memory of `buf` back if it is empty, leaving it without any.
#[inline]
pub(crate) fn release(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        give(std::mem::take(buf));
    }
}

fn give(mut buf: BytesMut) {
    buf.clear();
    // Bytes consumed from the front are reclaimed without copying or allocating when the
    // buffer owns its memory alone.
    buf.reserve(BUF_SIZE);
    if buf.capacity() > MAX_KEPT {
        return;
    }
    keep(&FREE, buf, BUFS_PER_CLIENT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    #[test]
    fn a_consumed_buffer_comes_back_whole() {
        let mut b = take();
        let p = b.as_ptr();
        b.extend_from_slice(&[1; 100]);
        b.advance(100);
        release(&mut b);
        assert_eq!(b.capacity(), 0);
        let again = take();
        assert_eq!(again.as_ptr(), p);
        assert!(again.capacity() >= BUF_SIZE && again.is_empty());
    }

    fn kept() -> usize {
        FREE.with(|f| f.borrow().len())
    }

    #[test]
    fn the_lists_grow_with_busy_clients_and_shrink_when_they_go_idle() {
        // 100 busy clients, each with its three buffers.
        for _ in 0..100 {
            busy(true);
        }
        let mut held: Vec<BytesMut> = (0..300).map(|_| take()).collect();
        for b in &mut held {
            release(b);
        }
        assert_eq!(kept(), 300, "every buffer the busy clients gave back is kept");
        // The same clients again: nothing allocated.
        let ptrs: std::collections::HashSet<_> = FREE.with(|f| f.borrow().iter().map(|b| b.as_ptr()).collect());
        let again: Vec<BytesMut> = (0..300).map(|_| take()).collect();
        assert!(again.iter().all(|b| ptrs.contains(&b.as_ptr())));
        for mut b in again {
            release(&mut b);
        }
        // They go idle: back to the floor.
        for _ in 0..100 {
            busy(false);
        }
        assert_eq!(kept(), MIN_FREE, "trimmed back when the clients went idle");
        release(&mut take());
        assert_eq!(kept(), MIN_FREE);
    }

    #[test]
    fn a_buffer_with_data_is_kept_by_its_owner() {
        let mut b = take();
        b.extend_from_slice(b"x");
        release(&mut b);
        assert_eq!(&b[..], b"x");
    }
}
