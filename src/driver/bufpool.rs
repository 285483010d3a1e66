//! Per-thread free lists of IO buffers and reply-queue storage. A client borrows them when
//! bytes arrive and gives them back when it goes idle (an idle client holds none), so they
//! are recycled instead of being allocated, grown and freed on every transaction. The
//! same goes for the busy half of a session (`Session::park`): blank sessions are kept
//! here while their clients are idle.

use crate::session::Session;
use bytes::BytesMut;
use std::cell::RefCell;
use std::collections::VecDeque;

/// Size of a pooled buffer (also the read chunk).
pub(crate) const BUF_SIZE: usize = 8192;
/// Larger buffers (a big result went through) are freed rather than kept.
const MAX_KEPT: usize = 64 * 1024;
/// Buffers kept per thread at most (256 KiB): enough for the clients a thread has in
/// flight at once; more would only show up as memory per idle client (4000 idle clients
/// measured 3.85 KiB each with 256, most of it this list, filled by their logins).
const MAX_FREE: usize = 32;

thread_local! {
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static QUEUES: RefCell<Vec<VecDeque<crate::session::reply_queue::Pending>>> = const { RefCell::new(Vec::new()) };
    // Boxed: a client unparked takes the allocation itself (the proxy holds a box).
    #[allow(clippy::vec_box)]
    static SESSIONS: RefCell<Vec<Box<Session>>> = const { RefCell::new(Vec::new()) };
}

/// A blank session (one `Session::park` left) from this thread's free list, if any.
pub(crate) fn take_session() -> Option<Box<Session>> {
    SESSIONS.try_with(|f| f.borrow_mut().pop()).ok().flatten()
}

/// Keeps a blank session for the next client of this thread that becomes active.
pub(crate) fn give_session(s: Box<Session>) {
    let _ = SESSIONS.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < MAX_FREE {
            f.push(s);
        }
    });
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
    let _ = QUEUES.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < MAX_FREE {
            f.push(q);
        }
    });
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
    let _ = FREE.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < MAX_FREE {
            f.push(buf);
        }
    });
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

    #[test]
    fn a_buffer_with_data_is_kept_by_its_owner() {
        let mut b = take();
        b.extend_from_slice(b"x");
        release(&mut b);
        assert_eq!(&b[..], b"x");
    }
}
