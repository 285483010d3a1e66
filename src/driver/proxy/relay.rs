//! Moving frames: reading what the client and the server have sent, feeding whole frames to
//! the session (large server rows pass through as they arrive), and writing the session's
//! output to both sides.

use super::{HIGH_WATER, Linked, Proxy, READ_CHUNK};
use crate::driver::bufpool;
use crate::driver::server_conn::ServerConn;
use crate::error::Error;
use crate::protocol::{FrameError, split_frame};
use crate::session::{Fed, Session};
use crate::state::ServerState;
use bytes::{Buf, BytesMut};
use tokio::time::Instant;

impl Proxy {
    /// Reads all the client has sent. False when the client is gone.
    pub(super) fn read_client(&mut self) -> bool {
        bufpool::ensure(&mut self.cbuf);
        bufpool::ensure(&mut self.session.get().to_client);
        bufpool::ensure(&mut self.session.get().to_server);
        bufpool::ensure_queue(self.session.get());
        loop {
            self.cbuf.reserve(READ_CHUNK);
            match self.client.try_read_buf(&mut self.cbuf) {
                Ok(0) => return false,
                Ok(n) => {
                    self.meter_received(n);
                    if self.cbuf.capacity() > self.cbuf.len() {
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
        if let Some(mut replay) = self.session.get().take_replay() {
            replay.extend_from_slice(&self.cbuf);
            self.cbuf = BytesMut::from(&replay[..]);
        }
        if self.cbuf.is_empty() || self.session.get().is_closing() || self.session.get().is_acquiring() {
            return false;
        }
        let max = self.shared.cfg.load().max_message_size;
        let Proxy { server, session, cbuf, .. } = self;
        let session = session.get();
        match server {
            None => feed_frames(session, cbuf, None, max),
            Some(Linked::Own(s)) => feed_frames(session, cbuf, Some(&mut s.state), max),
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                // A lent session writes nothing more there: its client's next frames wait
                // until its replies are in and the server is released.
                if g.dead || !g.is_writer(*t) {
                    return false;
                }
                let state = g.conn.as_mut().map(|c| &mut c.state);
                feed_frames(session, cbuf, state, max)
            }
        }
    }

    /// Reads all the server has sent and feeds whole frames to the session.
    pub(super) fn read_server(&mut self) {
        match &mut self.server {
            None => {}
            Some(Linked::Own(s)) => {
                let eof = pump(self.session.get(), s);
                if eof && self.session.get().is_linked() {
                    self.session.get().handle_server_lost();
                }
            }
            Some(Linked::Shared(pipe, t)) => {
                let t = *t;
                let mut g = pipe.lock();
                if g.dead {
                    drop(g);
                    return self.session.get().handle_server_lost();
                }
                if !g.is_head(t) || !self.session.get().is_linked() {
                    return;
                }
                g.take_handed_over();
                let Some(c) = g.conn.as_mut() else { return };
                if pump(self.session.get(), c) && self.session.get().is_linked() {
                    g.kill();
                    drop(g);
                    self.session.get().handle_server_lost();
                }
            }
        }
    }

    pub(super) fn flush(&mut self) -> std::io::Result<()> {
        if !self.session.get().to_server.is_empty() {
            self.flush_server();
            if self.session.get().to_server.is_empty() && self.server.is_some() {
                self.batch_written();
            }
        }
        let session = self.session.get();
        let before = session.to_client.len();
        let writable = session.writable_to_client();
        let r = if writable == before {
            self.client.flush_some(&mut session.to_client).map(|_| ())
        } else if writable == 0 {
            Ok(())
        } else {
            // What waits for the client's Sync or Flush stays (`session::flush`).
            let rest = session.to_client.split_off(writable);
            let r = self.client.flush_some(&mut session.to_client).map(|_| ());
            session.to_client.unsplit(rest);
            r
        };
        let sent = before - session.to_client.len();
        self.meter_sent(sent);
        r
    }

    /// A batch is written out: if it may have others queued behind it, it is timed, and
    /// lent to a waiting client when its statements are known to be fast.
    fn batch_written(&mut self) {
        let cfg = self.shared.cfg.load();
        if cfg.pipeline_depth <= 1 {
            return;
        }
        let Some(p) = self.session.get().pipelinable(cfg.pipeline_max_statement_us()) else { return };
        let now = Instant::now();
        match &mut self.server {
            Some(Linked::Own(s)) => s.timing = Some((now.into_std(), p.timed)),
            Some(Linked::Shared(pipe, t)) => pipe.lock().time_ticket(*t, p.timed, now.into_std()),
            None => return,
        }
        // A client that has already sent more (a pipelining client) keeps its server for it.
        if p.fast && self.cbuf.is_empty() && self.pool.ticket_waiter() {
            self.lend();
        }
    }

    /// Writes what the session has for the server, without blocking.
    fn flush_server(&mut self) {
        let ok = match &self.server {
            Some(Linked::Own(s)) => s.stream.flush_some(&mut self.session.get().to_server).is_ok(),
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                let ok = !g.dead
                    && g.is_writer(*t)
                    && g.conn.as_ref().is_some_and(|c| c.stream.flush_some(&mut self.session.get().to_server).is_ok());
                g.note_write(*t);
                if !ok {
                    if !g.dead && !g.is_writer(*t) {
                        tracing::warn!("a lent session wrote to its server: closing that connection");
                    }
                    g.kill();
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

/// Feeds the whole frames in `cbuf` to the session, until one needs a server (or a
/// release or close must be carried out first). True when something happened.
fn feed_frames(session: &mut Session, cbuf: &mut BytesMut, mut state: Option<&mut ServerState>, max: usize) -> bool {
    let mut at = 0;
    let mut stalled = false;
    loop {
        match split_frame(&cbuf[at..], max) {
            Ok(Some(n)) => {
                match session.handle_client(&cbuf[at..at + n], state.as_deref_mut()) {
                    Fed::Consumed => {}
                    // Fed again from `at` once linked, or after the server's next frames.
                    Fed::NeedsServer | Fed::AwaitsReplies => {
                        stalled = true;
                        break;
                    }
                }
                at += n;
                // Carry out releases and closes before the next frame; frames the session
                // queued to be fed (`take_replay`) go before the client's next ones.
                if session.is_closing() || session.has_actions() || session.has_replay() {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                let msg = match e {
                    FrameError::TooLarge(_) => format!("invalid message length: {e}"),
                    FrameError::BadLength(_) => format!("invalid message format: {e}"),
                };
                session.fail(Error::protocol(msg));
                cbuf.clear();
                return true;
            }
        }
    }
    cbuf.advance(at);
    // A frame left unconsumed either waits for a server (an action is queued) or for a
    // server reply (nothing to do until it arrives).
    at > 0 || (stalled && session.has_actions())
}

/// Reads all the server has sent and feeds whole frames to the session, until the
/// session gives the server back (what follows is the next ticket's). True at end of
/// stream or on a read error.
pub(super) fn pump(session: &mut Session, s: &mut ServerConn) -> bool {
    bufpool::ensure(&mut session.to_client);
    let eof = read_available(s);
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
                _ => break,
            },
            Err(_) => break,
        }
    }
    s.consume(at);
    eof
}

/// Reads what the server has sent into `rbuf`, without blocking, up to `HIGH_WATER` bytes
/// held (more waits in the socket: a server sending a large result faster than its client
/// reads it fills the socket, not parsnip). True at end of stream or on a read error.
pub(super) fn read_available(s: &mut ServerConn) -> bool {
    // A frame that is held whole (one that does not stream) is read whole, whatever its size.
    let first = if s.streaming == 0 { s.rbuf.len() + crate::protocol::frame::missing(&s.rbuf) } else { 0 };
    while s.rbuf.len() < HIGH_WATER.max(first) {
        s.rbuf.reserve(READ_CHUNK);
        match s.stream.try_read_buf(&mut s.rbuf) {
            Ok(0) => return true,
            // A read that did not fill the buffer took all there was.
            Ok(_) if s.rbuf.capacity() > s.rbuf.len() => return false,
            Ok(_) => {}
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
    false
}
