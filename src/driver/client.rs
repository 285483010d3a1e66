//! One client connection's task: login, then the proxy loop that moves bytes between the
//! client, the session state machine and the linked server connection. Reads happen when
//! a socket is readable and take everything available; writes go out in one call per
//! batch; output buffers are bounded (a full buffer stops reading the other side), and
//! freed whenever the client is idle.

use super::Shared;
use super::bufpool;
use super::cancel::CancelSlot;
use super::login::{self, LoginEnd};
use super::pipe::Pipe;
use super::server_conn::ServerConn;
use super::servers::{self, ServerPool};
use super::stream::Stream;
use crate::admin::ConsoleStep;
use crate::config::PoolMode;
use crate::error::{Error, SqlState};
use crate::pool::{Checkout, Lease, PoolPurpose};
use crate::protocol::{FrameError, split_frame};
use crate::session::{Action, Fed, Session, Timeouts};
use crate::state::{ServerState, TxStatus};
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
    slot.bind_pool(&pool);
    let registry = (pool.mode != PoolMode::Session && shared.cfg.prepared_statements).then(|| pool.stmts.clone());
    let session = Session::new(pool.mode, settings, pid as u64, registry);
    let mut p = Proxy { client: stream, cbuf: buf, session, server: None, pool, slot, shared };
    p.run().await;
    p.shared.cancels.unregister(pid);
}

/// The console: the sans-IO `admin::Console` answers; this moves the bytes.
async fn serve_admin(mut stream: Stream, mut buf: BytesMut, shared: &Shared) {
    let mut console = crate::admin::Console::default();
    loop {
        let step = console.handle_bytes(&mut buf, || {
            let pools: Vec<Arc<ServerPool>> = {
                let map = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
                map.values().filter(|p| p.key.purpose == PoolPurpose::Clients).cloned().collect()
            };
            let mut v: Vec<_> = pools.iter().map(|p| p.snapshot()).collect();
            v.sort_by(|a, b| a.key.cmp(&b.key));
            v
        });
        if !console.to_client.is_empty() {
            if stream.write_all(&console.to_client).await.is_err() {
                return;
            }
            console.to_client.clear();
        }
        if step == ConsoleStep::Close {
            return;
        }
        buf.reserve(1024);
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

struct Proxy {
    client: Stream,
    cbuf: BytesMut,
    session: Session,
    server: Option<Linked>,
    pool: Arc<ServerPool>,
    slot: Arc<CancelSlot>,
    shared: Arc<Shared>,
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
        let mut idle_since = std::time::Instant::now();
        // The clock is read per batch only when a timeout needs it.
        let timed = self.timeouts().any();
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
                        idle_since = std::time::Instant::now();
                    }
                }
                Event::Server => self.read_server(),
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
        let cfg = &self.shared.cfg;
        Timeouts { client_idle: cfg.client_idle_timeout(), idle_in_transaction: cfg.idle_transaction_timeout() }
    }

    async fn acquire(&mut self) {
        // An idle connection or a place in the queue: no future beyond a oneshot receiver.
        // The slow path's future (connect, authenticate) is large, so it lives on the heap
        // only while used, not in every idle client's task.
        // The waits are boxed: their futures would otherwise be part of every client's task
        // for its whole life (idle clients' memory), and a free connection needs none.
        loop {
            let got = match self.pool.checkout() {
                Checkout::Ready(c) => Ok(Lease::Own(c)),
                Checkout::Queued(q) => Box::pin(self.wait_in_queue(q)).await,
                Checkout::Slow => Box::pin(self.acquire_slow(false)).await.map(Lease::Own),
            };
            match got {
                Ok(Lease::Own(mut s)) => {
                    self.session.handle_server_linked(&mut s.state);
                    self.slot.set(&s.cancel);
                    self.server = Some(Linked::Own(s));
                }
                Ok(Lease::Ticket((pipe, t))) => {
                    let mut g = pipe.lock();
                    let head = g.is_head(t);
                    let dead = g.dead;
                    match g.conn.as_mut() {
                        Some(c) if !dead => {
                            self.session.handle_server_linked(&mut c.state);
                            if head {
                                self.slot.set(&c.cancel);
                            } else {
                                self.slot.set_later(&c.cancel);
                                g.watch_cancel(t, self.slot.clone());
                            }
                        }
                        _ => {
                            // It broke before this client wrote anything: ask again.
                            leave(&self.pool, g, t);
                            continue;
                        }
                    }
                    drop(g);
                    self.server = Some(Linked::Shared(pipe, t));
                }
                Err(e) => self.session.handle_acquire_failed(e),
            }
            return;
        }
    }

    async fn wait_in_queue(
        &self,
        mut q: crate::pool::Queued<servers::ServerConnector>,
    ) -> Result<Lease<servers::ServerConnector>, Error> {
        let r = tokio::select! {
            biased;
            r = self.pool.wait_queued(&mut q) => r,
            _ = self.slot.cancelled_while_queued() => Err(canceled_by_user()),
        };
        if r.is_err() {
            servers::abandon(&self.pool, q);
        }
        match r {
            Ok(Some(c)) => Ok(c),
            Ok(None) => self.acquire_slow(true).await.map(Lease::Own),
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
        match self.server.take() {
            Some(Linked::Own(mut s)) => {
                if let Some((t0, stmt)) = s.timing.take() {
                    stmt.note(t0.elapsed().as_micros() as u64);
                }
                // Bytes left unread would belong to nobody: never reuse such a connection.
                let clean = reusable && s.rbuf.is_empty() && s.streaming == 0 && self.session.to_server.is_empty();
                servers::release(&self.pool, s, clean);
            }
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                if !g.dead && !g.is_head(t) && g.wrote_as(t) && self.session.is_closing() {
                    // Given up before its turn (its client failed): its replies are still to
                    // come, and the tickets around it must not suffer. Settled on close.
                    drop(g);
                    self.server = Some(Linked::Shared(pipe, t));
                    return;
                }
                if !reusable || !self.session.to_server.is_empty() {
                    // Its state is unknown: nobody behind this ticket can use it either.
                    g.kill();
                }
                leave(&self.pool, g, t);
            }
            None => {}
        }
    }

    /// Lets the first queued client write its batch behind this one's on the linked
    /// server (the session has found the batch qualifies, and it is written out): this
    /// client goes on reading its replies, and writes nothing more there.
    fn lend(&mut self) {
        let depth = self.shared.cfg.pipeline_depth;
        let (pipe, t) = match self.server.take() {
            Some(Linked::Own(s)) => (Pipe::new(s), 0),
            Some(Linked::Shared(pipe, t)) => (pipe, t),
            None => return,
        };
        // (`Pool::lend` refuses while a cancel is on its way: it could land on the batch
        // written behind this one.)
        if servers::lend(&self.pool, &pipe, t, depth) {
            self.session.set_lent();
        }
        self.server = Some(Linked::Shared(pipe, t));
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
        let Proxy { server, session, cbuf, .. } = self;
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
    fn read_server(&mut self) {
        match &mut self.server {
            None => {}
            Some(Linked::Own(s)) => {
                let eof = pump(&mut self.session, s);
                if eof && self.session.is_linked() {
                    self.session.handle_server_lost();
                }
            }
            Some(Linked::Shared(pipe, t)) => {
                let t = *t;
                let mut g = pipe.lock();
                if g.dead {
                    drop(g);
                    return self.session.handle_server_lost();
                }
                if !g.is_head(t) || !self.session.is_linked() {
                    return;
                }
                g.take_handed_over();
                let Some(c) = g.conn.as_mut() else { return };
                if pump(&mut self.session, c) && self.session.is_linked() {
                    g.kill();
                    drop(g);
                    self.session.handle_server_lost();
                }
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.session.to_server.is_empty() {
            self.flush_server();
            if self.session.to_server.is_empty() && self.server.is_some() {
                self.batch_written();
            }
        }
        self.client.flush_some(&mut self.session.to_client).map(|_| ())
    }

    /// A batch is written out: if it may have others queued behind it, it is timed, and
    /// lent to a waiting client when its statements are known to be fast.
    fn batch_written(&mut self) {
        let cfg = &self.shared.cfg;
        if cfg.pipeline_depth <= 1 {
            return;
        }
        let Some(p) = self.session.pipelinable(cfg.pipeline_max_statement_us()) else { return };
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
            Some(Linked::Own(s)) => s.stream.flush_some(&mut self.session.to_server).is_ok(),
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                let ok = !g.dead
                    && g.is_writer(*t)
                    && g.conn.as_ref().is_some_and(|c| c.stream.flush_some(&mut self.session.to_server).is_ok());
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
            self.session.handle_server_lost();
        }
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
        if matches!(self.server, Some(Linked::Shared(..))) && !Box::pin(self.settle_shared()).await {
            return;
        }
        let Some(Linked::Own(mut s)) = self.server.take() else {
            return;
        };
        let t = self.shared.cfg.server_connect_timeout();
        let mut ok = self.session.outstanding() == 0 && s.rbuf.is_empty() && self.session.to_server.is_empty();
        if ok && s.state.tx_status != TxStatus::Idle {
            ok = s.run_internal("ROLLBACK", t).await;
        }
        if ok && self.pool.mode == PoolMode::Session && !self.shared.cfg.server_reset_query.is_empty() {
            ok = s.run_internal(&self.shared.cfg.server_reset_query, t).await;
            if ok {
                s.state.settings.reset_all_extra();
            }
        }
        servers::release(&self.pool, s, ok);
    }

    /// The client left with a ticket on a shared connection. With tickets behind it (its
    /// batch was a plain one, lent), its replies are read and dropped, up to the
    /// ReadyForQuery messages it is owed, so the next ticket gets its own. Otherwise it
    /// waits for its turn and takes the connection back (true: settle it as an own one).
    async fn settle_shared(&mut self) -> bool {
        let Some(Linked::Shared(pipe, t)) = self.server.take() else { return false };
        let limit = self.shared.cfg.server_connect_timeout();
        let mut owed = self.session.owed_ready();
        {
            let mut g = pipe.lock();
            if !self.session.to_server.is_empty() && g.is_writer(t) && g.wrote_as(t) {
                // Part of a message is on the wire: the rest of the stream means nothing.
                g.kill();
            }
            if g.dead || !g.wrote_as(t) {
                // Broken, or a ticket that never wrote: it leaves at once.
                leave(&self.pool, g, t);
                return false;
            }
        }
        let done = tokio::time::timeout(limit, async {
            loop {
                std::future::poll_fn(|cx| {
                    if ServerWait::Shared(&pipe, t).poll_read(cx) { Poll::Ready(()) } else { Poll::Pending }
                })
                .await;
                let mut g = pipe.lock();
                if g.dead {
                    return false;
                }
                let last = g.is_alone(t) || g.is_writer(t);
                let Some(c) = g.conn.as_mut() else { return false };
                if last {
                    return true;
                }
                if drop_replies(c, &mut owed) {
                    return false;
                }
                if owed == 0 {
                    return true;
                }
            }
        })
        .await
        .unwrap_or(false);
        let mut g = pipe.lock();
        if !done {
            g.kill();
        }
        if !g.dead && g.is_head(t) && g.is_writer(t) && g.is_alone(t) {
            // Nobody else holds a ticket or can get one (only the writer lends).
            if let Some(c) = g.conn.take() {
                drop(g);
                self.server = Some(Linked::Own(c));
                return true;
            }
        }
        leave(&self.pool, g, t);
        false
    }
}

/// Ticket `t` leaves the pipe whose lock `g` is; the connection goes back to the pool (or
/// is closed, if broken or left with unread bytes) when no ticket is left.
fn leave(pool: &Arc<ServerPool>, mut g: std::sync::MutexGuard<'_, super::pipe::PipeInner>, t: u32) {
    let dead = g.dead;
    if let Some(c) = g.finish(t) {
        drop(g);
        servers::release_from_pipe(pool, c, dead);
    }
}

/// Reads what the server sent and drops whole frames up to the `owed`-th ReadyForQuery
/// (counted down), leaving what follows for the next ticket. True at end of stream.
fn drop_replies(c: &mut ServerConn, owed: &mut usize) -> bool {
    let eof = read_available(c);
    let mut at = 0;
    while *owed > 0 {
        if c.streaming > 0 {
            at = pass_streamed(c, at, None);
            if c.streaming > 0 {
                break;
            }
        }
        match split_frame(&c.rbuf[at..], 1 << 30) {
            Ok(Some(n)) => {
                if c.rbuf[at] == crate::protocol::tags::READY_FOR_QUERY {
                    *owed -= 1;
                }
                at += n;
            }
            Ok(None) => match large_frame(&c.rbuf[at..]) {
                // Not a ReadyForQuery (that is small): dropped as it comes.
                Some(total) => {
                    c.streaming = total - 5;
                    at += 5;
                }
                None => break,
            },
            Err(_) => break,
        }
    }
    c.consume(at);
    eof && *owed > 0
}

/// Server frames at least this large are not held whole: their bytes go on as they arrive.
const STREAM_FROM: usize = 64 * 1024;

/// The size of the frame that starts `buf` when it is at least `STREAM_FROM` and not all
/// read yet (its header is).
fn large_frame(buf: &[u8]) -> Option<usize> {
    let missing = crate::protocol::frame::missing(buf);
    (buf.len() >= 5 && missing > 0 && buf.len() + missing >= STREAM_FROM).then_some(buf.len() + missing)
}

/// Passes on (to `out`, or nowhere) what `rbuf` holds from `at` of the frame being
/// streamed; returns where the bytes after it start.
fn pass_streamed(s: &mut ServerConn, at: usize, out: Option<&mut BytesMut>) -> usize {
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
                // Carry out releases and closes before the next frame.
                if session.is_closing() || session.has_actions() {
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
fn pump(session: &mut Session, s: &mut ServerConn) -> bool {
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
fn read_available(s: &mut ServerConn) -> bool {
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
        // 704: the link to a server carries a pipelining ticket (`pipe`), 8 B more than a box.
        assert!(proxy <= 704, "Proxy is {proxy} B");
        assert!(run <= 400, "the proxy loop's future is {run} B");
        assert!(acquire <= 64, "acquire()'s future is {acquire} B: box its waits");
    }
}
