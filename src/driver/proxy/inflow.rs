//! Large client frames: passing one through to the server as it arrives (the session took
//! its start, `Session::stream_client_frame`), or holding one whole under the process-wide
//! budget (`driver::budget`). While a frame passes through, nothing else is fed to the
//! session or written to its server in between: what the session writes for the server
//! meanwhile (in answer to server frames) waits in `after` until the frame's last byte is
//! queued, the batch is not lent, and the server is never reused with half a message on it.

use super::{HIGH_WATER, Linked, Proxy};
use crate::driver::budget::Reservation;
use bytes::{Buf, BytesMut};

/// A large client frame in progress.
pub(super) enum Inflow {
    /// Passing through: `left` bytes of it still to come from the client, queued for the
    /// server as they come (`pass`) or dropped (the session answered it itself, or the
    /// server went away); `after`: what the session wrote for the server behind it.
    Through { left: usize, pass: bool, after: BytesMut },
    /// Read whole with its size reserved from the budget; `done` once the session has
    /// handled it (the reservation is kept until what it wrote for the frame is sent).
    Held { res: Reservation, done: bool },
}

impl Proxy {
    /// A frame is passing through, part of it not yet queued.
    pub(super) fn midway(&self) -> bool {
        matches!(self.inflow.as_deref(), Some(Inflow::Through { .. }))
    }

    /// How many bytes `cbuf` may hold before the client is read no more: what every
    /// connection may buffer, or a frame held whole under the budget.
    pub(super) fn cbuf_cap(&self) -> usize {
        match self.inflow.as_deref() {
            Some(Inflow::Held { res, done: false }) => HIGH_WATER.max(res.size()),
            _ => HIGH_WATER,
        }
    }

    /// Moves what has arrived of the frame passing through to the server (at most what
    /// `to_server` has room for) or drops it. True when something moved.
    pub(super) fn pump_inflow(&mut self) -> bool {
        let linked = self.server.is_some() && self.session.get().is_linked();
        let Proxy { inflow, cbuf, session, server, .. } = self;
        let Some(Inflow::Through { left, pass, after }) = inflow.as_deref_mut() else { return false };
        let out = &mut session.get().to_server;
        if !linked {
            // The server went away (lost, or given back closed): the rest means nothing.
            *pass = false;
        }
        let mut n = (*left).min(cbuf.len());
        if *pass {
            n = n.min(HIGH_WATER.saturating_sub(out.len()));
        }
        if n == 0 && *left > 0 {
            return false;
        }
        if *pass {
            // Straight from the client's buffer when nothing is queued before it: one copy
            // less (a shared connection's writes go through its pipe, queued as usual).
            let mut sent = 0;
            if out.is_empty()
                && let Some(Linked::Own(s)) = server.as_ref()
            {
                while sent < n {
                    match s.stream.try_write(&cbuf[sent..n]) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => sent += k,
                    }
                }
            }
            out.extend_from_slice(&cbuf[sent..n]);
        }
        cbuf.advance(n);
        *left -= n;
        if *left == 0 {
            tracing::debug!("a client frame passed through");
            if *pass {
                out.extend_from_slice(after);
            }
            *inflow = None;
        }
        true
    }

    /// The session handled the frame held whole (a client's, or a server's) and what it
    /// wrote for it is sent: its reservation goes back, and buffers grown for it are given
    /// up.
    pub(super) fn settle_held(&mut self) {
        if !matches!(self.inflow.as_deref(), Some(Inflow::Held { done: true, .. })) {
            return;
        }
        let session = self.session.get();
        if session.to_server.len() < HIGH_WATER && session.to_client.len() < HIGH_WATER {
            shrink(&mut session.to_server);
            shrink(&mut session.to_client);
            shrink(&mut self.cbuf);
            self.inflow = None;
        }
    }

    /// The client or the session ends while a frame passes through: the server has part
    /// of a message and must not be reused (nor settled with a ROLLBACK written after it).
    pub(super) fn abandon_inflow(&mut self) {
        let Some(Inflow::Through { pass: true, .. }) = self.inflow.as_deref() else {
            self.inflow = None;
            return;
        };
        self.inflow = None;
        self.slot.clear();
        match self.server.take() {
            Some(Linked::Own(s)) => crate::driver::servers::release(&self.pool, s, false),
            Some(Linked::Shared(pipe, t)) => {
                // The tickets ahead still get their replies; the connection breaks when
                // this ticket's turn comes (`Pipe::doom`).
                pipe.lock().doom(t);
                self.server = Some(Linked::Shared(pipe, t));
            }
            None => {}
        }
    }
}

/// Gives up a buffer's memory when it grew far past what a connection keeps (a large frame
/// was held in it), keeping what it holds.
pub(super) fn shrink(buf: &mut BytesMut) {
    if buf.capacity() > 4 * HIGH_WATER && buf.len() <= HIGH_WATER {
        let mut fresh = BytesMut::with_capacity(HIGH_WATER.max(buf.len()));
        fresh.extend_from_slice(buf);
        *buf = fresh;
    }
}
