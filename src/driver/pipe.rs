//! A server connection carrying the batches of several clients at once (pipelining).
//!
//! When clients are queued for a server and the linked client's batch is written out and
//! qualifies (`Session::pipelinable`: an autocommit batch of statements already prepared
//! there, sure to leave the server idle and unchanged), the client keeps reading its
//! replies but lets the first queued client write its own batch behind them. PostgreSQL
//! then runs the next batch without waiting for the pooler, and the pooler reads several
//! replies per read.
//!
//! Each batch in flight holds a *ticket*, numbered (wrapping) in the order the batches were written.
//! Only the ticket at the head reads from the socket: it feeds its replies to its own
//! session and, at its final ReadyForQuery, passes the head (and the bytes it read past
//! that point, left in `rbuf`) to the next ticket and wakes it. Only the last ticket may
//! write. The connection goes back to the pool when the last ticket is done, or is closed
//! for all of them when it broke; what goes wrong for a ticket behind the head breaks it
//! only from that ticket's turn on (`doom`).
//!
//! Owns the ticket order and the connection while it is shared; knows nothing of protocol
//! state (the sessions decide what qualifies and when a batch is done).

use super::cancel::CancelSlot;
use super::server_conn::ServerConn;
use crate::session::Timed;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Instant;

/// A shared server connection. Locked only for the length of one read, write or link.
#[derive(Debug)]
pub struct Pipe {
    inner: Mutex<PipeInner>,
}

/// The state behind a pipe's lock.
#[derive(Debug)]
pub(crate) struct PipeInner {
    /// The connection; None once given back to the pool.
    pub(crate) conn: Option<Box<ServerConn>>,
    /// The ticket reading replies now; the tickets in flight are `head..next`.
    head: u32,
    next: u32,
    /// Tickets not finished yet (`next - head`, until the connection breaks: then they
    /// leave in any order).
    in_flight: usize,
    /// The ticket allowed to write (always the last one), if it has not passed that on.
    writer: Option<u32>,
    /// The writer has written since it got that role.
    wrote: bool,
    /// Batches written with `MSG_MORE` wait in the kernel for the writer's next write
    /// (`Stream::flush_some_more`): whoever gives up the writer's role without writing
    /// pushes them out (`push`).
    corked: bool,
    /// A new head has bytes waiting in `rbuf` (read by the ticket before it).
    handed_over: bool,
    /// Tickets waiting to become head.
    waiting: Vec<(u32, Waker)>,
    /// The connection broke (or was found in an unknown state): every ticket fails.
    pub(crate) dead: bool,
    /// The first ticket whose batch the connection can no longer be trusted past (its
    /// write failed or stopped mid-message, it left before its turn, it was given up):
    /// the tickets ahead of it still get their replies, which the server sends before it
    /// reads that far, so nothing they sent is lost to another client's failure; nothing
    /// more is lent, and the connection breaks (`dead`) once that ticket's turn comes.
    doomed: Option<u32>,
    /// Tickets whose batch is timed, with what its duration is recorded on and when it
    /// was written.
    timed: VecDeque<(u32, Timed, Instant)>,
    /// Since when the head's batch has had the server to itself: when the replies of the
    /// batch before it were read (`ServerConn::read_at`), or when it was written if later.
    head_since: Instant,
    /// Cancel slots of tickets behind the head, told when their batch reaches it.
    slots: VecDeque<(u32, Arc<CancelSlot>)>,
}

impl Pipe {
    /// Shares `conn`, whose current user becomes ticket 0 (the head and the writer).
    pub(crate) fn new(conn: Box<ServerConn>) -> Arc<Pipe> {
        Arc::new(Pipe { inner: Mutex::new(PipeInner::with(Some(conn))) })
    }

    /// Locks the pipe.
    pub(crate) fn lock(&self) -> MutexGuard<'_, PipeInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PipeInner {
    /// Ticket 0, the head and writer, on `conn` (its batch's timing carried over).
    fn with(mut conn: Option<Box<ServerConn>>) -> PipeInner {
        let (head_since, timed) = match conn.as_mut().and_then(|c| c.timing.take()) {
            Some((t0, s)) => (t0, VecDeque::from([(0, s, t0)])),
            None => (Instant::now(), VecDeque::new()),
        };
        PipeInner {
            conn,
            head: 0,
            next: 1,
            in_flight: 1,
            writer: Some(0),
            wrote: true,
            corked: false,
            handed_over: false,
            waiting: Vec::new(),
            dead: false,
            doomed: None,
            timed,
            head_since,
            slots: VecDeque::new(),
        }
    }

    /// `t` reads replies now.
    #[inline]
    pub(crate) fn is_head(&self, t: u32) -> bool {
        self.head == t
    }

    /// `t` may write.
    #[inline]
    pub(crate) fn is_writer(&self, t: u32) -> bool {
        self.writer == Some(t)
    }

    /// Only `t` is in flight: its cancel requests cannot reach another client's query.
    #[inline]
    pub(crate) fn is_alone(&self, t: u32) -> bool {
        self.head == t && self.next == t.wrapping_add(1)
    }

    /// Batches in flight.
    #[cfg(test)]
    pub(crate) fn depth(&self) -> usize {
        self.in_flight
    }

    /// The writer `from` may lend the connection on: it is not doomed and has fewer than
    /// `depth` batches in flight.
    #[inline]
    pub(crate) fn may_lend(&self, from: u32, depth: usize) -> bool {
        !self.is_doomed() && self.in_flight < depth && self.is_writer(from)
    }

    /// A new last ticket, which becomes the writer (taken from `from`).
    pub(crate) fn add_ticket(&mut self) -> u32 {
        let t = self.next;
        self.next = self.next.wrapping_add(1);
        self.in_flight += 1;
        self.writer = Some(t);
        self.wrote = false;
        self.publish_depth();
        t
    }

    /// Ticket `t`'s batch, just written, is timed for `s` (from when it is head, or from
    /// now if later).
    pub(crate) fn time_ticket(&mut self, t: u32, s: Timed, now: Instant) {
        if self.head == t {
            self.head_since = now;
        }
        self.timed.push_back((t, s, now));
    }

    /// Ticket `t` (behind the head) holds its client's cancels in `slot` until its batch
    /// reaches the head (`CancelSlot::reached_head`, called from `finish`).
    pub(crate) fn watch_cancel(&mut self, t: u32, slot: Arc<CancelSlot>) {
        self.slots.push_back((t, slot));
    }

    /// `t` has written to the connection (it is not a writer that never did).
    #[inline]
    pub(crate) fn wrote_as(&self, t: u32) -> bool {
        self.writer != Some(t) || self.wrote
    }

    /// The writer `t` wrote to the connection; `corked`: with `MSG_MORE`, so that its
    /// batch waits in the kernel for the next writer's. A write without it sends whatever
    /// waited.
    #[inline]
    pub(crate) fn note_write(&mut self, t: u32, corked: bool) {
        if self.writer == Some(t) {
            self.wrote = true;
            self.corked = corked;
        }
    }

    /// Whether batches wait in the kernel for the writer's next write.
    #[inline]
    pub(crate) fn is_corked(&self) -> bool {
        self.corked
    }

    /// Sends the batches written with `MSG_MORE` now.
    pub(crate) fn push(&mut self) {
        if std::mem::take(&mut self.corked)
            && let Some(c) = &self.conn
        {
            c.stream.push();
        }
    }

    /// Takes back the last ticket `t`, which never wrote (its client left, or the handoff
    /// found nobody): the writer becomes `back` again (None: nobody). Returns the
    /// connection when no ticket is left.
    pub(crate) fn retract(&mut self, t: u32, back: Option<u32>) -> Option<Box<ServerConn>> {
        if t.wrapping_add(1) == self.next && self.writer == Some(t) {
            // What was written ahead of it waited for its write.
            self.push();
            self.next = t;
            self.in_flight -= 1;
            self.writer = back;
            self.wrote = true;
            self.waiting.retain(|(w, _)| *w != t);
            self.slots.retain(|(w, _)| *w != t);
        }
        self.take_if_done()
    }

    /// Wakes `t` when it becomes head (or the connection breaks). True when it already is.
    pub(crate) fn wait_head(&mut self, t: u32, waker: &Waker) -> bool {
        if self.head == t || self.dead {
            return true;
        }
        match self.waiting.iter_mut().find(|(w, _)| *w == t) {
            Some((_, w)) => w.clone_from(waker),
            None => self.waiting.push((t, waker.clone())),
        }
        false
    }

    /// The head has unread bytes handed over from the ticket before it: returns and
    /// clears that flag (so the next wait does not report them again).
    pub(crate) fn take_handed_over(&mut self) -> bool {
        std::mem::take(&mut self.handed_over)
    }

    /// The head `t` has all its replies: the next ticket reads from here on. Returns the
    /// connection when no ticket is left (for the pool).
    /// A ticket that never wrote may leave before its turn (it is taken back); once the
    /// connection is dead, tickets may leave in any order.
    pub(crate) fn finish(&mut self, t: u32) -> Option<Box<ServerConn>> {
        if self.writer == Some(t) && !self.wrote && t.wrapping_add(1) == self.next && !self.dead {
            return self.retract(t, None);
        }
        if self.writer == Some(t) {
            self.push();
            self.writer = None;
        }
        if self.dead {
            self.in_flight = self.in_flight.saturating_sub(1);
            return self.take_if_done();
        }
        if self.head != t {
            // Not in order: nobody reads its replies, so the connection's state is unknown
            // from its turn on.
            self.doom(t);
            self.in_flight = self.in_flight.saturating_sub(1);
            return self.take_if_done();
        }
        // Its replies were in when they were read, however long its session took to get
        // to them: under load that wait is the event loop's, not the server's, and
        // replies read together took the server about no time apart.
        let end = self.conn.as_ref().map_or_else(Instant::now, |c| c.read_at).max(self.head_since);
        if let Some((_, s, written)) = self.timed.iter().find(|(w, ..)| *w == t) {
            let start = self.head_since.max(*written);
            s.note(end.saturating_duration_since(start).as_micros() as u64);
        }
        // Its entries (a client may have sent several batches), and any left by a ticket
        // that never finished in order.
        self.timed.retain(|(w, ..)| w.wrapping_sub(t) as i32 > 0);
        self.head_since = end;
        self.head = self.head.wrapping_add(1);
        self.in_flight -= 1;
        self.handed_over = self.conn.as_ref().is_some_and(|c| !c.rbuf.is_empty());
        let head = self.head;
        if self.doomed == Some(head) {
            // Everything before the doomed ticket's batch is read.
            self.kill();
            return self.take_if_done();
        }
        if let Some(i) = self.waiting.iter().position(|(w, _)| *w == head) {
            self.waiting.swap_remove(i).1.wake();
        }
        self.slots.retain(|(w, _)| *w != t);
        if let Some((_, slot)) = self.slots.front().filter(|(w, _)| *w == head) {
            slot.reached_head();
            self.slots.pop_front();
        }
        self.take_if_done()
    }

    /// The connection cannot be trusted from ticket `t`'s batch on (see `doomed`): broken
    /// at once when `t` reads now, else once the tickets ahead of it are done.
    #[track_caller]
    pub(crate) fn doom(&mut self, t: u32) {
        if self.dead {
            return;
        }
        if self.head == t {
            return self.kill();
        }
        // The earliest doomed ticket counts (tickets are numbered from the head, wrapping).
        let behind = |x: u32| x.wrapping_sub(self.head);
        if self.doomed.is_none_or(|d| behind(t) < behind(d)) {
            let at = std::panic::Location::caller();
            tracing::debug!(at = %at, ticket = t, head = self.head, "pipelined connection doomed from a ticket");
            self.doomed = Some(t);
        }
    }

    /// Whether the connection is doomed (`doom`) or broken: it takes no more batches.
    #[inline]
    pub(crate) fn is_doomed(&self) -> bool {
        self.dead || self.doomed.is_some()
    }

    /// The connection broke: every ticket waiting is woken to find out.
    #[track_caller]
    pub(crate) fn kill(&mut self) {
        if !self.dead {
            let at = std::panic::Location::caller();
            tracing::debug!(at = %at, tickets = self.in_flight, "pipelined connection given up");
        }
        self.dead = true;
        for (_, w) in self.waiting.drain(..) {
            w.wake();
        }
    }

    fn take_if_done(&mut self) -> Option<Box<ServerConn>> {
        self.publish_depth();
        if self.in_flight == 0 && self.writer.is_none() { self.conn.take() } else { None }
    }

    /// Tells the cancel path whether batches are queued behind the head (`CancelTarget::behind`).
    fn publish_depth(&self) {
        if let Some(c) = &self.conn {
            c.cancel.behind.store(self.in_flight > 1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The ticket bookkeeping alone (no connection).
    fn inner() -> PipeInner {
        PipeInner::with(None)
    }

    struct Count(AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn tickets_read_in_order_and_only_the_last_writes() {
        let mut p = inner();
        let b = p.add_ticket();
        let c = p.add_ticket();
        assert_eq!((b, c, p.depth()), (1, 2, 3));
        assert!(p.is_head(0) && !p.is_writer(0) && p.is_writer(c));
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        assert!(!p.wait_head(b, &waker), "b waits for a");
        p.note_write(b, false);
        p.note_write(c, false);
        p.finish(0);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "b woken when a is done");
        assert!(p.is_head(b) && !p.is_alone(b));
        p.finish(b);
        assert!(p.is_head(c) && p.is_alone(c) && p.is_writer(c));
        p.finish(c);
        assert_eq!(p.depth(), 0);
        assert!(!p.dead);
    }

    #[test]
    fn a_ticket_that_never_wrote_is_taken_back_wherever_it_is() {
        let mut p = inner();
        let b = p.add_ticket();
        assert!(!p.wrote_as(b));
        // b's client left before writing, while a still reads: b leaves without a trace.
        p.finish(b);
        assert!(!p.dead && p.depth() == 1 && p.is_head(0) && p.writer.is_none());
        // A handoff that found nobody gives the writer's role back.
        let c = p.add_ticket();
        p.retract(c, Some(0));
        assert!(p.is_writer(0) && p.depth() == 1);
    }

    #[test]
    fn leaving_out_of_turn_breaks_the_connection_from_that_ticket_on() {
        let mut p = inner();
        let b = p.add_ticket();
        p.note_write(b, false);
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let c = p.add_ticket();
        assert!(!p.wait_head(c, &waker));
        p.finish(b);
        assert!(!p.dead && p.is_head(0), "a, ahead of b, still reads its replies");
        assert!(p.is_doomed(), "nothing more is lent on it");
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        p.finish(0);
        assert!(p.dead, "b's replies come next, and nobody reads them");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "c is told");
        assert!(p.wait_head(c, &waker), "a dead pipe never makes anyone wait");
        p.finish(c);
        assert_eq!(p.depth(), 0);
    }

    #[test]
    fn a_failed_writer_costs_the_batches_ahead_nothing() {
        let mut p = inner();
        let b = p.add_ticket();
        p.note_write(b, false);
        // b's write broke (its client's garbage made the server end the connection, say):
        // a's replies were sent before the server read b's batch.
        p.doom(b);
        assert!(!p.dead && p.is_head(0));
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        assert!(!p.wait_head(b, &Waker::from(woken.clone())));
        assert!(p.finish(0).is_none());
        assert!(p.dead && p.is_head(b), "b finds the connection broken at its turn");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        // The last ticket out gets the connection, to close it (`leave` reads `dead`).
        assert!(p.finish(b).is_none(), "no connection in these tests");
        assert_eq!(p.depth(), 0);
    }

    #[test]
    fn whoever_gives_up_the_writers_role_without_writing_pushes_what_waited() {
        // b wrote behind a with MSG_MORE and lent on to c: b's batch waits for c's write.
        let mut p = inner();
        let b = p.add_ticket();
        p.note_write(b, true);
        assert!(p.is_corked());
        let c = p.add_ticket();
        // c writes: its plain write sent both.
        p.note_write(c, false);
        assert!(!p.is_corked());
        // c corks in turn and lends to d, whose client leaves before writing.
        p.note_write(c, true);
        let d = p.add_ticket();
        p.retract(d, Some(c));
        assert!(!p.is_corked(), "taken back: pushed");
        // Lent again, to e, who finishes without ever writing.
        p.note_write(c, true);
        let e = p.add_ticket();
        p.finish(e);
        assert!(!p.is_corked(), "left without writing: pushed");
        // A writer that leaves having written with MSG_MORE pushes too.
        let f = p.add_ticket();
        p.note_write(f, true);
        p.finish(f);
        assert!(!p.is_corked(), "the last writer's own batch goes");
        // Only the writer's write counts.
        let g = p.add_ticket();
        p.note_write(b, true);
        assert!(!p.is_corked() && !p.wrote_as(g));
    }

    #[test]
    fn a_doomed_head_breaks_at_once_and_the_earliest_doom_counts() {
        let mut p = inner();
        let b = p.add_ticket();
        p.note_write(b, false);
        let c = p.add_ticket();
        p.note_write(c, false);
        p.doom(c);
        p.doom(b);
        p.finish(0);
        assert!(p.dead, "b, the earlier doomed ticket, breaks it at its turn");
        let mut q = inner();
        q.doom(0);
        assert!(q.dead, "the head's own failure breaks it now");
    }
}
