//! Moving frames: reading what the client and the server have sent, feeding whole frames to
//! the session (large server rows pass through as they arrive, large client frames through
//! `inflow`), and writing the session's output to both sides.

use super::inflow::Inflow;
use super::{HIGH_WATER, Linked, Proxy, READ_CHUNK};
use crate::driver::budget::{self, Budget, Reservation};
use crate::driver::bufpool;
use crate::driver::server_conn::ServerConn;
use crate::error::Error;
use crate::protocol::{FrameError, split_frame};
use crate::session::{Fed, Session, Streamed};
use crate::state::ServerState;
use bytes::{Buf, BytesMut};
use std::sync::Arc;
use tokio::time::Instant;

impl Proxy {
    /// Reads what the client has sent, up to what `cbuf` may hold (`cbuf_cap`: a large
    /// frame passes through or is held under the budget, it is not read ahead of its turn).
    /// False when the client is gone.
    pub(super) fn read_client(&mut self) -> bool {
        bufpool::ensure(&mut self.cbuf);
        bufpool::ensure(&mut self.session.get().to_client);
        bufpool::ensure(&mut self.session.get().to_server);
        bufpool::ensure_queue(self.session.get());
        let cap = self.cbuf_cap();
        loop {
            self.cbuf.reserve(READ_CHUNK);
            match self.client.try_read_buf(&mut self.cbuf) {
                Ok(0) => return false,
                Ok(n) => {
                    self.meter_received(n);
                    if self.cbuf.capacity() > self.cbuf.len() || self.cbuf.len() >= cap {
                        return true;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
    }

    /// Feeds the whole frames read so far to the session, until one needs a server.
    /// True when something happened (frames consumed or actions queued).
    pub(super) fn feed_client(&mut self) -> bool {
        if self.midway() {
            // Nothing else is fed until the frame passing through is all queued.
            return self.pump_inflow();
        }
        if let Some(mut replay) = self.session.get().take_replay() {
            replay.extend_from_slice(&self.cbuf);
            self.cbuf = BytesMut::from(&replay[..]);
        }
        if self.cbuf.is_empty() || self.session.get().is_closing() || self.session.get().is_acquiring() {
            return false;
        }
        let cfg = self.shared.cfg.load();
        let Proxy { server, session, cbuf, inflow, shared, .. } = self;
        let mut f =
            Feed { cbuf, inflow, budget: &shared.budget, max: cfg.max_message_size, limit: cfg.max_buffered_bytes };
        let session = session.get();
        match server {
            None => f.frames(session, None),
            Some(Linked::Own(s)) => f.frames(session, Some(&mut s.state)),
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                // A lent session writes nothing more there: its client's next frames wait
                // until its replies are in and the server is released.
                if g.dead || !g.is_writer(*t) {
                    return false;
                }
                let state = g.conn.as_mut().map(|c| &mut c.state);
                f.frames(session, state)
            }
        }
    }

    /// Reads all the server has sent and feeds whole frames to the session.
    pub(super) fn read_server(&mut self) {
        // While a client frame passes through, what the session writes for the server
        // waits behind it.
        let after = match self.inflow.as_deref_mut() {
            Some(Inflow::Through { after, .. }) => Some(after),
            _ => None,
        };
        if let Some(after) = after {
            std::mem::swap(after, &mut self.session.get().to_server);
        }
        self.read_server_frames();
        if let Some(Inflow::Through { after, .. }) = self.inflow.as_deref_mut() {
            std::mem::swap(after, &mut self.session.get().to_server);
        }
    }

    fn read_server_frames(&mut self) {
        let cfg = self.shared.cfg.load();
        let Proxy { server, session, shared, inflow, .. } = self;
        let mut handled = None;
        pump_linked(server, session.get(), (&shared.budget, cfg.max_buffered_bytes), &mut handled);
        // A frame held whole was handled: its reservation stays until the copy the session
        // made of it is written out (`settle_held`).
        if let Some(res) = handled
            && inflow.is_none()
        {
            *inflow = Some(Box::new(Inflow::Held { res, done: true }));
        }
    }

    /// Writes what is pending to both sides, without blocking. `Ok(true)`: a frame passing
    /// through was all queued meanwhile, and the client's next frames are to be fed.
    pub(super) fn flush(&mut self) -> std::io::Result<bool> {
        let mut passed = false;
        if !self.session.get().to_server.is_empty() {
            let cork = self.cork_ahead();
            self.flush_server(cork);
            // A frame passing through: what the server took makes room for more of it
            // (the client's buffer may be full, so no read would come to move it on).
            while self.midway() && self.session.get().to_server.len() < HIGH_WATER && self.pump_inflow() {
                passed = !self.midway();
                if !self.session.get().to_server.is_empty() {
                    self.flush_server(false);
                }
            }
            // (A batch with a frame still passing through is not written out.)
            let lent = self.session.get().to_server.is_empty()
                && self.server.is_some()
                && !self.midway()
                && self.batch_written();
            if cork && !lent {
                // Nobody writes behind it after all: it goes now.
                if let Some(Linked::Shared(pipe, _)) = &self.server {
                    pipe.lock().push();
                }
            }
        }
        let session = self.session.get();
        let before = session.to_client.len();
        let writable = session.writable_to_client();
        let r = if writable == before {
            self.client.flush_some(&mut session.to_client).map(|_| passed)
        } else if writable == 0 {
            Ok(passed)
        } else {
            // What waits for the client's Sync or Flush stays (`session::flush`).
            let rest = session.to_client.split_off(writable);
            let r = self.client.flush_some(&mut session.to_client).map(|_| passed);
            session.to_client.unsplit(rest);
            r
        };
        let sent = before - session.to_client.len();
        self.meter_sent(sent);
        r
    }

    /// A batch is written out: if it may have others queued behind it, it is timed, and
    /// lent to a waiting client when its statements are known to be fast. True when lent.
    fn batch_written(&mut self) -> bool {
        let cfg = self.shared.cfg.load();
        if cfg.pipeline_depth <= 1 {
            return false;
        }
        let Some(p) = self.session.get().pipelinable(cfg.pipeline_max_statement_us()) else { return false };
        let now = Instant::now();
        match &mut self.server {
            Some(Linked::Own(s)) => s.timing = Some((now.into_std(), p.timed)),
            Some(Linked::Shared(pipe, t)) => pipe.lock().time_ticket(*t, p.timed, now.into_std()),
            None => return false,
        }
        // A client that has already sent more (a pipelining client) keeps its server for it.
        p.fast && self.cbuf.is_empty() && self.pool.ticket_waiter() && self.lend()
    }

    /// Whether the batch about to be written may wait in the kernel for the next client's
    /// (`Stream::flush_some_more`), so that the server gets both in one segment: one
    /// transmission and at most one wake-up of its backend instead of two. Only a batch
    /// written behind others still running (the backend has work meanwhile), on plain
    /// TCP, that will be lent on (`batch_written`'s conditions, checked before the write,
    /// and a client waiting); if it is not lent after all, it is pushed at once.
    fn cork_ahead(&mut self) -> bool {
        let Some(Linked::Shared(pipe, t)) = &self.server else { return false };
        if !self.cbuf.is_empty() || self.midway() {
            return false;
        }
        let cfg = self.shared.cfg.load();
        {
            let g = pipe.lock();
            if g.is_head(*t)
                || !g.may_lend(*t, cfg.pipeline_depth)
                || g.conn.as_ref().is_none_or(|c| !c.stream.can_cork())
            {
                return false;
            }
        }
        self.pool.ticket_waiter()
            && self.session.get().pipelinable_unwritten(cfg.pipeline_max_statement_us()).is_some_and(|p| p.fast)
    }

    /// Writes what the session has for the server, without blocking; `cork`: with
    /// `MSG_MORE` (`cork_ahead`).
    fn flush_server(&mut self, cork: bool) {
        let ok = match &self.server {
            Some(Linked::Own(s)) => s.stream.flush_some(&mut self.session.get().to_server).is_ok(),
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                let out = &mut self.session.get().to_server;
                let ok = !g.dead
                    && g.is_writer(*t)
                    && g.conn.as_ref().is_some_and(|c| {
                        if cork { c.stream.flush_some_more(out) } else { c.stream.flush_some(out) }.is_ok()
                    });
                g.note_write(*t, cork && ok);
                if !ok {
                    if !g.dead && !g.is_writer(*t) {
                        tracing::warn!("a lent session wrote to its server: closing that connection");
                    }
                    // What the server does with this batch is unknown; the batches ahead of
                    // it are answered first, and still read (`Pipe::doom`).
                    g.doom(*t);
                }
                ok
            }
            None => true,
        };
        if !ok {
            self.session.get().handle_server_lost();
        }
    }
}

/// Server frames at least this large are not held whole: their bytes go on as they arrive.
const STREAM_FROM: usize = 64 * 1024;

/// The size of the frame that starts `buf` when it is at least `STREAM_FROM` and not all
/// read yet (its header is).
pub(super) fn large_frame(buf: &[u8]) -> Option<usize> {
    let missing = crate::protocol::frame::missing(buf);
    (buf.len() >= 5 && missing > 0 && buf.len() + missing >= STREAM_FROM).then_some(buf.len() + missing)
}

/// Passes on (to `out`, or nowhere) what `rbuf` holds from `at` of the frame being
/// streamed; returns where the bytes after it start.
pub(super) fn pass_streamed(s: &mut ServerConn, at: usize, out: Option<&mut BytesMut>) -> usize {
    let n = (s.rbuf.len() - at).min(s.streaming);
    if let Some(out) = out {
        out.extend_from_slice(&s.rbuf[at..at + n]);
    }
    s.streaming -= n;
    at + n
}

/// Reads the linked server (`pump`), and carries out what its end or a frame over the budget
/// means for the session and the connection.
fn pump_linked(
    server: &mut Option<Linked>,
    session: &mut Session,
    budget: (&Arc<Budget>, usize),
    handled: &mut Option<Reservation>,
) {
    match server {
        None => {}
        Some(Linked::Own(s)) => match pump(session, s, budget, handled) {
            Pumped::Eof if session.is_linked() => session.handle_server_lost(),
            Pumped::OverBudget(e) => session.handle_server_over_budget(e),
            _ => {}
        },
        Some(Linked::Shared(pipe, t)) => {
            let t = *t;
            let mut g = pipe.lock();
            if g.dead {
                drop(g);
                return session.handle_server_lost();
            }
            if !g.is_head(t) || !session.is_linked() {
                return;
            }
            g.take_handed_over();
            let Some(c) = g.conn.as_mut() else { return };
            match pump(session, c, budget, handled) {
                Pumped::Eof if session.is_linked() => {
                    g.kill();
                    drop(g);
                    session.handle_server_lost();
                }
                Pumped::OverBudget(e) => {
                    g.kill();
                    drop(g);
                    session.handle_server_over_budget(e);
                }
                _ => {}
            }
        }
    }
}

/// What feeding client frames works on: the client's buffer, the large frame in progress,
/// the budget (`max_buffered_bytes` = `limit`) and `max_message_size`.
struct Feed<'a> {
    cbuf: &'a mut BytesMut,
    inflow: &'a mut Option<Box<Inflow>>,
    budget: &'a Arc<Budget>,
    max: usize,
    limit: usize,
}

impl Feed<'_> {
    /// Feeds the whole frames in `cbuf` to the session, until one needs a server (or a
    /// release or close must be carried out first); a large frame the session takes starts
    /// passing through, and one it does not is read whole under the budget. True when
    /// something happened.
    fn frames(&mut self, session: &mut Session, mut state: Option<&mut ServerState>) -> bool {
        let cbuf = &mut *self.cbuf;
        let mut at = 0;
        let mut stalled = false;
        loop {
            let n = match split_frame(&cbuf[at..], self.max) {
                Ok(n) => n,
                Err(e) => {
                    let msg = match e {
                        FrameError::TooLarge(_) => format!("invalid message length: {e}"),
                        FrameError::BadLength(_) => format!("invalid message format: {e}"),
                    };
                    session.fail(Error::protocol(msg));
                    cbuf.clear();
                    return true;
                }
            };
            let head = &cbuf[at..];
            // The size of the frame that starts here (its header is checked above).
            let total = match head.get(1..5) {
                Some(l) => u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize + 1,
                None => 0,
            };
            if head.len() >= 5 && crate::session::stream_from(head[0]).is_some_and(|from| total >= from) {
                match session.stream_client_frame(head, total, state.as_deref_mut()) {
                    Streamed::Whole => tracing::debug!(total, "a client frame is read whole"),
                    Streamed::NeedBytes => {
                        tracing::debug!(total, "a client frame's start is awaited");
                        break;
                    }
                    Streamed::Later(f) => {
                        tracing::debug!(total, ?f, "a client frame waits");
                        stalled = true;
                        break;
                    }
                    Streamed::Started { taken, pass, after } => {
                        tracing::debug!(total, taken, pass, after = after.len(), "a client frame passes through");
                        at += taken;
                        let after = BytesMut::from(&after[..]);
                        *self.inflow = Some(Box::new(Inflow::Through { left: total - taken, pass, after }));
                        break;
                    }
                }
            }
            let Some(n) = n else {
                // More than a connection buffers, and not passing through: read whole, if
                // the budget takes it.
                if head.len() >= 5 && total > HIGH_WATER && self.inflow.is_none() {
                    match self.budget.reserve(total, self.limit) {
                        Some(res) => *self.inflow = Some(Box::new(Inflow::Held { res, done: false })),
                        None => {
                            tracing::warn!(bytes = total, "a client message is over the budget for buffered messages");
                            session.fail(budget::exhausted(total, self.limit));
                            cbuf.clear();
                            return true;
                        }
                    }
                }
                break;
            };
            if cbuf[at] == crate::protocol::tags::PARSE {
                session.note_synced_ahead(crate::protocol::frontend::syncs_before_flush(&cbuf[at + n..]));
            }
            match session.handle_client(&cbuf[at..at + n], state.as_deref_mut()) {
                Fed::Consumed => {}
                // Fed again from `at` once linked, or after the server's next frames.
                Fed::NeedsServer | Fed::AwaitsReplies => {
                    stalled = true;
                    break;
                }
            }
            at += n;
            if let Some(Inflow::Held { done, .. }) = self.inflow.as_deref_mut() {
                // The frame held whole was the first in the buffer.
                *done = true;
            }
            // Carry out releases and closes before the next frame; frames the session
            // queued to be fed (`take_replay`) go before the client's next ones.
            if session.is_closing() || session.has_actions() || session.has_replay() {
                break;
            }
        }
        cbuf.advance(at);
        // A frame left unconsumed either waits for a server (an action is queued) or for a
        // server reply (nothing to do until it arrives).
        at > 0 || (stalled && session.has_actions())
    }
}

/// What reading a server connection came to.
pub(super) enum Pumped {
    /// Frames (or nothing) read; go on.
    Read,
    /// End of stream or a read error.
    Eof,
    /// A frame that must be held whole is more than the budget can take now.
    OverBudget(Error),
}

/// Reads all the server has sent and feeds whole frames to the session, until the
/// session gives the server back (what follows is the next ticket's). A frame held whole
/// beyond `HIGH_WATER` reserves its size from `budget` (the budget and its limit) first;
/// once it is handled, its reservation is put in `handled`.
pub(super) fn pump(
    session: &mut Session,
    s: &mut ServerConn,
    budget: (&Arc<Budget>, usize),
    handled: &mut Option<Reservation>,
) -> Pumped {
    bufpool::ensure(&mut session.to_client);
    let eof = read_available(s);
    let mut over = None;
    let mut at = 0;
    loop {
        if s.streaming > 0 {
            at = pass_streamed(s, at, Some(&mut session.to_client));
            if s.streaming > 0 {
                break;
            }
        }
        match split_frame(&s.rbuf[at..], 1 << 30) {
            Ok(Some(n)) => {
                session.handle_server(&s.rbuf[at..at + n], &mut s.state);
                at += n;
                if s.held.as_ref().is_some_and(|r| r.size() == n) {
                    // The frame held whole is handled (what the session copied of it is
                    // still to be written: the reservation goes to the caller).
                    *handled = s.held.take();
                }
                if !session.is_linked() {
                    break;
                }
            }
            // A large row (or COPY chunk) on its way: its bytes go to the client as they
            // come instead of being held whole here and again in `to_client`.
            Ok(None) => match large_frame(&s.rbuf[at..]) {
                Some(total) if session.stream_server_frame(&s.rbuf[at..at + 5]) => {
                    s.streaming = total - 5;
                    at += 5;
                }
                // Any other: read whole, if the budget takes it.
                Some(total) if total > HIGH_WATER && s.held.is_none() => {
                    match budget.0.reserve(total, budget.1) {
                        Some(r) => s.held = Some(r),
                        None => {
                            tracing::warn!(bytes = total, "a server message is over the budget for buffered messages");
                            over = Some(budget::exhausted(total, budget.1));
                        }
                    }
                    break;
                }
                _ => break,
            },
            Err(_) => break,
        }
    }
    s.consume(at);
    if s.held.is_none() {
        super::inflow::shrink(&mut s.rbuf);
    }
    match over {
        Some(e) => Pumped::OverBudget(e),
        None if eof => Pumped::Eof,
        None => Pumped::Read,
    }
}

/// Reads what the server has sent into `rbuf`, without blocking, up to `HIGH_WATER` bytes
/// held (more waits in the socket: a server sending a large result faster than its client
/// reads it fills the socket, not parsnip). True at end of stream or on a read error.
pub(super) fn read_available(s: &mut ServerConn) -> bool {
    // A frame that is held whole (one that does not stream) is read whole once the budget
    // has taken its size (`pump`).
    let first =
        if s.streaming == 0 && s.held.is_some() { s.rbuf.len() + crate::protocol::frame::missing(&s.rbuf) } else { 0 };
    while s.rbuf.len() < HIGH_WATER.max(first) {
        s.rbuf.reserve(READ_CHUNK);
        match s.stream.try_read_buf(&mut s.rbuf) {
            Ok(0) => return true,
            Ok(_) => {
                s.read_at = std::time::Instant::now();
                // A read that did not fill the buffer took all there was.
                if s.rbuf.capacity() > s.rbuf.len() {
                    return false;
                }
            }
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
    false
}
