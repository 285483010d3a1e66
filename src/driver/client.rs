//! One client connection's task: login, then the proxy loop that moves bytes between the
//! client, the session state machine and the linked server connection. Reads happen when
//! a socket is readable and take everything available; writes go out in one call per
//! batch; output buffers are bounded (a full buffer stops reading the other side), and
//! freed whenever the client is idle.

use super::Shared;
use super::bufpool;
use super::cancel::CancelSlot;
use super::login::{self, LoginEnd};
use super::server_conn::ServerConn;
use super::stream::Stream;
use crate::config::PoolMode;
use crate::error::{Error, SqlState};
use crate::pool::{Checkout, Pool};
use crate::protocol::{FrameError, split_frame};
use crate::session::{Action, Session};
use bytes::{Buf, BytesMut};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// Stop reading one side while this much is waiting to be written to the other.
const HIGH_WATER: usize = 256 * 1024;
const READ_CHUNK: usize = bufpool::BUF_SIZE;

/// Serves one accepted client connection to the end.
pub async fn serve(mut stream: Stream, shared: Arc<Shared>) {
    stream.set_nodelay();
    let mut buf = BytesMut::new();
    let timeout = shared.cfg.client_login_timeout();
    // Boxed: the login future is large and only needed once.
    let res = match tokio::time::timeout(timeout, Box::pin(login::login(&mut stream, &shared, &mut buf))).await {
        Ok(r) => r,
        Err(_) => Err(LoginEnd::Close(Some(Error::protocol(
            "timeout while waiting for the startup packet or authentication",
        )))),
    };
    let client = match res {
        Ok(c) => c,
        Err(LoginEnd::Cancel) => return,
        Err(LoginEnd::Admin) => return Box::pin(serve_admin(stream, buf, &shared)).await,
        Err(LoginEnd::Close(err)) => {
            if let Some(e) = err {
                tracing::debug!(error = %e, "login refused");
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&e.to_bytes())).await;
            }
            return;
        }
    };
    tracing::debug!(user = %client.user, db = %client.db, pid = client.pid, "client logged in");
    // Only what the proxy needs lives on in the task (names and strings are dropped here).
    let login::LoggedIn { pool, settings, pid, .. } = client;
    let slot = shared.cancels.slot(pid);
    let registry = (pool.mode != PoolMode::Session && shared.cfg.prepared_statements).then(|| pool.stmts.clone());
    let session = Session::new(pool.mode, settings, pid as u64, registry);
    let mut p = Proxy { client: stream, cbuf: buf, session, server: None, pool, slot, shared };
    p.run().await;
    p.shared.cancels.unregister(pid);
}

/// The console loop: simple queries in, SHOW results out.
async fn serve_admin(mut stream: Stream, mut buf: BytesMut, shared: &Shared) {
    let mut out = BytesMut::new();
    loop {
        let frame = loop {
            match split_frame(&buf, 1 << 20) {
                Ok(Some(n)) => break buf.split_to(n),
                Ok(None) => {}
                Err(e) => {
                    let _ = stream.write_all(&Error::protocol(e.to_string()).to_bytes()).await;
                    return;
                }
            }
            buf.reserve(1024);
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        match frame[0] {
            crate::protocol::tags::QUERY => {
                let sql = crate::protocol::frontend::query_text(crate::protocol::body(&frame)).unwrap_or_default();
                let pools: Vec<Arc<Pool>> = {
                    let map = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
                    let mut v: Vec<_> = map.values().filter(|p| !p.key.db.contains('\0')).cloned().collect();
                    v.sort_by(|a, b| a.key.cmp(&b.key));
                    v
                };
                crate::admin::respond(&String::from_utf8_lossy(sql), &pools, &mut out);
                crate::protocol::backend::ready_for_query(&mut out, b'I');
            }
            crate::protocol::tags::TERMINATE => return,
            t => {
                Error::new(
                    SqlState::FEATURE_NOT_SUPPORTED,
                    format!("the parsnip console accepts simple queries only (got message type {t})"),
                )
                .write_to(&mut out);
                crate::protocol::backend::ready_for_query(&mut out, b'I');
            }
        }
        if stream.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
}

struct Proxy {
    client: Stream,
    cbuf: BytesMut,
    session: Session,
    server: Option<Box<ServerConn>>,
    pool: Arc<Pool>,
    slot: Arc<CancelSlot>,
    shared: Arc<Shared>,
}

enum Event {
    Client,
    Server,
    Writable,
    Timer,
    Shutdown,
}

impl Proxy {
    async fn run(&mut self) {
        // One registration for the client's life: a `changed()` future made per wait
        // would join and leave the watch's waiter list (two locks) on every transaction.
        // It is polled once; afterwards its waker stays registered and a wake-up finds
        // `stopping` set.
        let mut rx = self.shared.shutdown.clone();
        let mut stop_registered = false;
        let mut stop = std::pin::pin!(async move {
            if rx.wait_for(|v| *v).await.is_err() {
                // The pooler is being dropped without a shutdown: nothing to wait for.
                std::future::pending::<()>().await;
            }
        });
        let mut idle_since = Instant::now();
        // The clock is read per batch only when a timeout needs it.
        let timed =
            self.shared.cfg.client_idle_timeout().is_some() || self.shared.cfg.idle_transaction_timeout().is_some();
        // Only with an idle timeout configured.
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        loop {
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
            let deadline = self.deadline(idle_since, unlinked_idle);
            match (deadline, timer.as_mut()) {
                (Some(d), Some(t)) if t.deadline() != d => t.as_mut().reset(d),
                (Some(d), None) => timer = Some(Box::pin(tokio::time::sleep_until(d))),
                _ => {}
            }
            let server = self.server.as_ref().map(|s| &s.stream);
            let client = &self.client;
            let to_client = !self.session.to_client.is_empty();
            let to_server = server.is_some() && !self.session.to_server.is_empty();
            // Idle: only the client, a timeout and a shutdown can wake us. A shutdown only
            // acts on idle clients: the loop looks at it after each event.
            let idle = server.is_none() && !to_client;
            let want_server = server.filter(|_| self.session.to_client.len() < HIGH_WATER);
            let want_client = idle || self.session.to_server.len() < HIGH_WATER;
            let mut timer = timer.as_mut().filter(|_| deadline.is_some());
            let ev = std::future::poll_fn(|cx| {
                // Readiness is polled in place: no future, allocation or waiter-list entry
                // per wait. An error counts as ready (the read or write then reports it).
                if let Some(s) = want_server
                    && s.poll_read_ready(cx).is_ready()
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
                    && s.poll_write_ready(cx).is_ready()
                {
                    return Poll::Ready(Event::Writable);
                }
                if let Some(t) = timer.as_mut()
                    && t.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Event::Timer);
                }
                if idle && !graceful {
                    if stopping.load(Ordering::Acquire) {
                        return Poll::Ready(Event::Shutdown);
                    }
                    if !stop_registered {
                        stop_registered = true;
                        if stop.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(Event::Shutdown);
                        }
                    }
                }
                Poll::Pending
            })
            .await;
            match ev {
                Event::Client => {
                    if !self.read_client() {
                        return Box::pin(self.client_gone()).await;
                    }
                    if timed {
                        idle_since = Instant::now();
                    }
                }
                Event::Server => self.read_server(),
                Event::Writable | Event::Shutdown => {}
                Event::Timer => self.on_timer(),
            }
        }
    }

    fn deadline(&self, idle_since: Instant, unlinked_idle: bool) -> Option<Instant> {
        let cfg = &self.shared.cfg;
        if unlinked_idle {
            cfg.client_idle_timeout().map(|t| idle_since + t)
        } else if self.session.is_idle_in_transaction() && self.session.to_server.is_empty() {
            cfg.idle_transaction_timeout().map(|t| idle_since + t)
        } else {
            None
        }
    }

    fn on_timer(&mut self) {
        if self.session.is_idle_in_transaction() {
            self.session.fail(Error::fatal(
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                "terminating connection due to idle-in-transaction timeout",
            ));
        } else if !self.session.is_linked() {
            self.session.fail(Error::fatal(
                SqlState::IDLE_SESSION_TIMEOUT,
                "terminating connection due to idle-session timeout",
            ));
        }
    }

    async fn acquire(&mut self) {
        // An idle connection or a place in the queue: no future beyond a oneshot receiver.
        // The slow path's future (connect, authenticate) is large, so it lives on the heap
        // only while used, not in every idle client's task.
        // The waits are boxed: their futures would otherwise be part of every client's task
        // for its whole life (idle clients' memory), and a free connection needs none.
        let got = match self.pool.checkout() {
            Checkout::Ready(c) => Ok(c),
            Checkout::Queued(q) => Box::pin(self.wait_in_queue(q)).await,
            Checkout::Slow => Box::pin(self.acquire_slow(false)).await,
        };
        match got {
            Ok(mut s) => {
                self.session.handle_server_linked(&mut s.state);
                self.slot.set(&s.cancel);
                self.server = Some(s);
            }
            Err(e) => self.session.handle_acquire_failed(e),
        }
    }

    async fn wait_in_queue(&self, mut q: crate::pool::Queued) -> Result<Box<ServerConn>, Error> {
        let r = tokio::select! {
            biased;
            r = self.pool.wait_queued(&mut q) => r,
            _ = self.slot.cancelled_while_queued() => Err(canceled_by_user()),
        };
        if r.is_err() {
            self.pool.abandon(q);
        }
        match r {
            Ok(Some(c)) => Ok(c),
            Ok(None) => self.acquire_slow(true).await,
            Err(e) => Err(e),
        }
    }

    /// `woken`: the pool freed a slot for this client while it was queued.
    async fn acquire_slow(&self, woken: bool) -> Result<Box<ServerConn>, Error> {
        tokio::select! {
            r = Box::pin(async { if woken { self.pool.acquire_woken().await } else { self.pool.acquire().await } }) => r,
            _ = self.slot.cancelled_while_queued() => Err(canceled_by_user()),
        }
    }

    fn release(&mut self, reusable: bool) {
        self.slot.clear();
        if let Some(s) = self.server.take() {
            // Bytes left unread would belong to nobody: never reuse such a connection.
            let clean = reusable && s.rbuf.is_empty() && self.session.to_server.is_empty();
            self.pool.release(s, clean);
        }
    }

    /// Reads all the client has sent. False when the client is gone.
    fn read_client(&mut self) -> bool {
        bufpool::ensure(&mut self.cbuf);
        bufpool::ensure(&mut self.session.to_client);
        bufpool::ensure(&mut self.session.to_server);
        bufpool::ensure_queue(&mut self.session);
        loop {
            self.cbuf.reserve(READ_CHUNK);
            match self.client.try_read_buf(&mut self.cbuf) {
                Ok(0) => return false,
                Ok(_) => {
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
    fn feed_client(&mut self) -> bool {
        if let Some(mut replay) = self.session.take_replay() {
            replay.extend_from_slice(&self.cbuf);
            self.cbuf = BytesMut::from(&replay[..]);
        }
        if self.cbuf.is_empty() || self.session.is_closing() || self.session.is_acquiring() {
            return false;
        }
        let max = self.shared.cfg.max_message_size;
        let mut at = 0;
        let mut stalled = false;
        loop {
            match split_frame(&self.cbuf[at..], max) {
                Ok(Some(n)) => {
                    let state = self.server.as_mut().map(|s| &mut s.state);
                    if !self.session.handle_client(&self.cbuf[at..at + n], state) {
                        stalled = true;
                        break;
                    }
                    at += n;
                    // Carry out releases and closes before the next frame.
                    if self.session.is_closing() || self.session.has_actions() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let msg = match e {
                        FrameError::TooLarge(_) => format!("invalid message length: {e}"),
                        FrameError::BadLength(_) => format!("invalid message format: {e}"),
                    };
                    self.session.fail(Error::protocol(msg));
                    self.cbuf.clear();
                    return true;
                }
            }
        }
        self.cbuf.advance(at);
        // A frame left unconsumed either waits for a server (an action is queued) or for a
        // server reply (nothing to do until it arrives).
        at > 0 || (stalled && self.session.has_actions())
    }

    /// Reads all the server has sent and feeds whole frames to the session.
    fn read_server(&mut self) {
        let Some(s) = self.server.as_mut() else {
            return;
        };
        let mut eof = false;
        bufpool::ensure(&mut self.session.to_client);
        loop {
            s.rbuf.reserve(READ_CHUNK);
            match s.stream.try_read_buf(&mut s.rbuf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(_) => {
                    if s.rbuf.capacity() - s.rbuf.len() > 0 {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        let mut at = 0;
        while let Ok(Some(n)) = split_frame(&s.rbuf[at..], 1 << 30) {
            self.session.handle_server(&s.rbuf[at..at + n], &mut s.state);
            at += n;
            if !self.session.is_linked() {
                break;
            }
        }
        s.consume(at);
        if eof && self.session.is_linked() {
            self.session.handle_server_lost();
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(s) = &self.server
            && !self.session.to_server.is_empty()
            && s.stream.flush_some(&mut self.session.to_server).is_err()
        {
            self.session.handle_server_lost();
        }
        self.client.flush_some(&mut self.session.to_client).map(|_| ())
    }

    /// The session ended normally: send what is left, settle the server, close.
    async fn close(&mut self) {
        let out = std::mem::take(&mut self.session.to_client);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.write_all(&out)).await;
        self.settle_server().await;
    }

    /// The client vanished: settle the server.
    async fn client_gone(&mut self) {
        self.settle_server().await;
    }

    /// Gives the linked server back in a clean state, or closes it.
    async fn settle_server(&mut self) {
        self.slot.clear();
        let Some(mut s) = self.server.take() else {
            return;
        };
        let t = self.shared.cfg.server_connect_timeout();
        let mut ok = self.session.outstanding() == 0 && s.rbuf.is_empty() && self.session.to_server.is_empty();
        if ok && s.state.tx_status != b'I' {
            ok = s.run_internal("ROLLBACK", t).await;
        }
        if ok && self.pool.mode == PoolMode::Session && !self.shared.cfg.server_reset_query.is_empty() {
            ok = s.run_internal(&self.shared.cfg.server_reset_query, t).await;
            if ok {
                s.state.settings.reset_all_extra();
            }
        }
        self.pool.release(s, ok);
    }
}

fn canceled_by_user() -> Error {
    Error::new(SqlState::QUERY_CANCELED, "canceling statement due to user request")
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
        assert!(proxy <= 700, "Proxy is {proxy} B");
        assert!(run <= 400, "the proxy loop's future is {run} B");
        assert!(acquire <= 64, "acquire()'s future is {acquire} B: box its waits");
    }
}
