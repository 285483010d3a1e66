//! The proxy loop of one logged-in client: it moves bytes between the client, the session
//! state machine and the linked server connection. Reads happen when a socket is readable
//! and take everything available; writes go out in one call per batch; output buffers are
//! bounded (a full buffer stops reading the other side), and freed whenever the client is
//! idle. `relay` reads, feeds and writes frames; `link` gets, lends, gives back and settles
//! server connections.

mod link;
mod meter;
mod relay;

use crate::driver::Shared;
use crate::driver::bufpool;
use crate::driver::cancel::CancelSlot;
use crate::driver::pipe::Pipe;
use crate::driver::server_conn::ServerConn;
use crate::driver::servers::ServerPool;
use crate::driver::stream::Stream;
use crate::error::{Error, SqlState};
use crate::session::{Action, Session, Timeouts};
use bytes::BytesMut;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use tokio::time::Instant;

/// Stop reading one side while this much is waiting to be written to the other.
const HIGH_WATER: usize = 256 * 1024;
const READ_CHUNK: usize = bufpool::BUF_SIZE;

/// One logged-in client: its socket, its session, the server it is linked to.
pub(super) struct Proxy {
    client: Stream,
    cbuf: BytesMut,
    session: Session,
    server: Option<Linked>,
    pool: Arc<ServerPool>,
    slot: Arc<CancelSlot>,
    shared: Arc<Shared>,
    meter: meter::Meter,
}

/// The server connection a client is linked to.
enum Linked {
    /// Its own.
    Own(Box<ServerConn>),
    /// A ticket on a connection shared with other clients' batches in flight (`pipe`).
    Shared(Arc<Pipe>, u32),
}

/// What the proxy loop waits on for the linked server.
#[derive(Clone, Copy)]
enum ServerWait<'a> {
    Own(&'a Stream),
    Shared(&'a Pipe, u32),
}

impl ServerWait<'_> {
    /// Replies to read: readable, or (shared) this ticket's turn has come with bytes read
    /// ahead for it, or the connection broke.
    fn poll_read(self, cx: &mut std::task::Context<'_>) -> bool {
        match self {
            ServerWait::Own(s) => s.poll_read_ready(cx).is_ready(),
            ServerWait::Shared(p, t) => {
                let mut g = p.lock();
                if g.dead {
                    return true;
                }
                if !g.wait_head(t, cx.waker()) {
                    return false;
                }
                if g.take_handed_over() {
                    return true;
                }
                g.conn.as_ref().is_none_or(|c| c.stream.poll_read_ready(cx).is_ready())
            }
        }
    }

    /// Room to write (only the writer of a shared connection writes).
    fn poll_write(self, cx: &mut std::task::Context<'_>) -> bool {
        match self {
            ServerWait::Own(s) => s.poll_write_ready(cx).is_ready(),
            ServerWait::Shared(p, t) => {
                let g = p.lock();
                g.dead || !g.is_writer(t) || g.conn.as_ref().is_none_or(|c| c.stream.poll_write_ready(cx).is_ready())
            }
        }
    }
}

impl Linked {
    fn wait(&self) -> ServerWait<'_> {
        match self {
            Linked::Own(s) => ServerWait::Own(&s.stream),
            Linked::Shared(p, t) => ServerWait::Shared(p, *t),
        }
    }
}

enum Event {
    Client,
    Server,
    Writable,
    Timer,
    Shutdown,
}

impl Proxy {
    /// A client's proxy, not linked to a server yet.
    pub(in crate::driver) fn new(
        client: Stream,
        cbuf: BytesMut,
        session: Session,
        pool: Arc<ServerPool>,
        slot: Arc<CancelSlot>,
        shared: Arc<Shared>,
    ) -> Proxy {
        Proxy { client, cbuf, session, server: None, pool, slot, shared, meter: Default::default() }
    }

    /// The client's pid (its cancel key's first half).
    pub(in crate::driver) fn pid(&self) -> i32 {
        self.slot.pid
    }

    /// What all clients share.
    pub(in crate::driver) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(in crate::driver) async fn run(&mut self) {
        // One registration for the client's life: a future made per wait would join and
        // leave a waiter list (two locks) on every transaction. It is polled once;
        // afterwards its waker stays registered, and a wake-up (a shutdown, or a `KILL` of
        // this client: both kick every slot they concern) finds `stopping` or the kill
        // flag set.
        let slot = self.slot.clone();
        let mut stop_registered = false;
        let mut stop = std::pin::pin!(async move { slot.kicked.notified().await });
        let mut idle_since = std::time::Instant::now();
        // The clock is read per batch only when a timeout needs it.
        let timed = self.timeouts().any();
        // Only with an idle timeout configured.
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            if self.slot.is_killed() {
                return Box::pin(self.killed()).await;
            }
            // Act on everything the session asked for.
            while let Some(a) = self.session.poll_action() {
                match a {
                    Action::AcquireServer => self.acquire().await,
                    Action::ReleaseServer { reusable } => self.release(reusable),
                    Action::Close => return Box::pin(self.close()).await,
                }
            }
            if self.feed_client() {
                continue;
            }
            // Write what we have, without blocking.
            if self.flush().is_err() {
                return Box::pin(self.client_gone()).await;
            }
            let stopping = &self.shared.stopping;
            let graceful = stopping.load(Ordering::Acquire);
            if graceful && !self.session.is_linked() && !self.session.is_acquiring() && self.cbuf.is_empty() {
                self.session.fail(Error::fatal(
                    SqlState::ADMIN_SHUTDOWN,
                    "terminating connection due to administrator command",
                ));
                continue;
            }
            let unlinked_idle = !self.session.is_linked() && !self.session.is_acquiring() && self.cbuf.is_empty();
            if unlinked_idle {
                // An idle client holds no buffers: they go back to this thread's free list.
                bufpool::release(&mut self.cbuf);
                bufpool::release(&mut self.session.to_client);
                bufpool::release(&mut self.session.to_server);
                bufpool::release_queue(&mut self.session);
            }
            let deadline =
                self.session.poll_timeout(&self.timeouts(), idle_since, !self.cbuf.is_empty()).map(Instant::from_std);
            match (deadline, timer.as_mut()) {
                (Some(d), Some(t)) if t.deadline() != d => t.as_mut().reset(d),
                (Some(d), None) => timer = Some(Box::pin(tokio::time::sleep_until(d))),
                _ => {}
            }
            let server = self.server.as_ref().map(Linked::wait);
            let client = &self.client;
            let to_client = !self.session.to_client.is_empty();
            let to_server = server.is_some() && !self.session.to_server.is_empty();
            // Idle: only the client, a timeout and a shutdown can wake us. A shutdown only
            // acts on idle clients: the loop looks at it after each event.
            let idle = server.is_none() && !to_client;
            let want_server = server.filter(|_| self.session.to_client.len() < HIGH_WATER);
            let want_client = idle || self.session.to_server.len() < HIGH_WATER;
            let mut timer = timer.as_mut().filter(|_| deadline.is_some());
            let slot = &self.slot;
            let ev = std::future::poll_fn(|cx| {
                // Readiness is polled in place: no future, allocation or waiter-list entry
                // per wait. An error counts as ready (the read or write then reports it).
                if let Some(s) = want_server
                    && s.poll_read(cx)
                {
                    return Poll::Ready(Event::Server);
                }
                if want_client && client.poll_read_ready(cx).is_ready() {
                    return Poll::Ready(Event::Client);
                }
                if to_client && client.poll_write_ready(cx).is_ready() {
                    return Poll::Ready(Event::Writable);
                }
                if let Some(s) = server.filter(|_| to_server)
                    && s.poll_write(cx)
                {
                    return Poll::Ready(Event::Writable);
                }
                if let Some(t) = timer.as_mut()
                    && t.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Event::Timer);
                }
                if !stop_registered {
                    stop_registered = true;
                    if stop.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Event::Shutdown);
                    }
                }
                if idle && !graceful && stopping.load(Ordering::Acquire) || slot.is_killed() {
                    return Poll::Ready(Event::Shutdown);
                }
                Poll::Pending
            })
            .await;
            match ev {
                Event::Client => {
                    if !self.read_client() {
                        return Box::pin(self.client_gone()).await;
                    }
                    self.meter_request();
                    if timed {
                        idle_since = std::time::Instant::now();
                    }
                }
                Event::Server => {
                    self.read_server();
                    self.meter_replies();
                }
                Event::Writable | Event::Shutdown => {}
                Event::Timer => {
                    let now = std::time::Instant::now();
                    self.session.handle_timeout(&self.timeouts(), idle_since, !self.cbuf.is_empty(), now);
                }
            }
        }
    }

    /// The session's timeouts, from the configuration (not kept in the loop's state: every
    /// idle client's task would carry them).
    fn timeouts(&self) -> Timeouts {
        let cfg = self.shared.cfg.load();
        Timeouts { client_idle: cfg.client_idle_timeout(), idle_in_transaction: cfg.idle_transaction_timeout() }
    }
}

/// An idle client's task holds the proxy and the proxy loop's own state for its whole life:
/// these bounds keep a future that grows (an await of something large, not boxed) from
/// silently raising every idle client's memory (docs/benchmarks.md "Idle clients").
#[cfg(test)]
mod task_size {
    use super::Proxy;

    fn future_size<F: FnOnce(&'static mut Proxy) -> Fut, Fut>(_: F) -> usize {
        std::mem::size_of::<Fut>()
    }

    #[test]
    fn proxy_loop_state_stays_small() {
        let proxy = std::mem::size_of::<Proxy>();
        let run = future_size(|p| p.run());
        let acquire = future_size(|p| p.acquire());
        eprintln!("Proxy {proxy} B, run() {run} B, acquire() {acquire} B");
        // 752: the link to a server carries a pipelining ticket (`pipe`), 8 B more than a
        // box; the meter (`meter`) and the session's tally take 48 B (of which 8 B for the
        // errors by SQLSTATE class of the metrics). The loop's future
        // waits on the slot's `Notify` alone (shutdown and KILL both kick it), 112 B less
        // than the shutdown watch it replaced.
        assert!(proxy <= 752, "Proxy is {proxy} B");
        assert!(run <= 300, "the proxy loop's future is {run} B");
        assert!(acquire <= 64, "acquire()'s future is {acquire} B: box its waits");
    }
}
