//! The proxy loop of one logged-in client: it moves bytes between the client, the session
//! state machine and the linked server connection. Reads happen when a socket is readable
//! and take everything available; writes go out in one call per batch; output buffers are
//! bounded (a full buffer stops reading the other side), and freed whenever the client is
//! idle. `relay` reads, feeds and writes frames; `link` gets, lends, gives back and settles
//! server connections; `inflow` passes large client frames through or holds them under the
//! process-wide budget; `parking` parks the session of an idle client; `meter` times its
//! queries and transactions for its pool's figures; `notes` carries a listening client's
//! LISTEN changes and notifications.

mod inflow;
mod link;
mod meter;
mod notes;
mod parking;
mod relay;

use crate::driver::Shared;
use crate::driver::bufpool;
use crate::driver::cancel::CancelSlot;
use crate::driver::pipe::Pipe;
use crate::driver::server_conn::ServerConn;
use crate::driver::servers::ServerPool;
use crate::driver::stream::Stream;
use crate::error::{Error, SqlState};
use crate::session::{Action, BackendPhase, Session, Timeouts};
use bytes::BytesMut;
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

/// One logged-in client: its socket, its session, the server it is linked to.
pub(super) struct Proxy {
    client: Stream,
    cbuf: BytesMut,
    session: parking::Sess,
    server: Option<Linked>,
    pool: Arc<ServerPool>,
    slot: Arc<CancelSlot>,
    shared: Arc<Shared>,
    meter: meter::Meter,
    /// A large client frame passing through or held whole (`inflow`).
    inflow: Option<Box<inflow::Inflow>>,
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
        Proxy {
            client,
            cbuf,
            session: parking::Sess::new(session),
            server: None,
            pool,
            slot,
            shared,
            meter: Default::default(),
            inflow: None,
        }
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
        // One registration for the client's life: a wait made per loop turn would join and
        // leave a waiter list on every transaction. The task's waker is left with the
        // client's slot on the first wait; a wake-up (a shutdown, or a `KILL` of this
        // client: both kick every slot they concern) finds `stopping` or the kill flag set.
        let mut stop_registered = false;
        let mut idle_since = std::time::Instant::now();
        // The clock is read per batch only when a timeout needs it (and a reload may add
        // one: `idle_since` then starts at the reload, not at the client's last request).
        let mut timed = self.timeouts().any();
        // Only with an idle timeout configured.
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            if self.slot.is_killed() {
                return Box::pin(self.killed()).await;
            }
            if self.slot.has_notes() {
                self.take_notes();
            }
            if self.pool.mode == crate::config::PoolMode::Session && self.fast_close() {
                continue;
            }
            // Act on everything the session asked for.
            while let Some(a) = self.session.get().poll_action() {
                match a {
                    Action::AcquireServer => self.acquire().await,
                    // Never reused with part of a client frame on it.
                    Action::ReleaseServer { reusable } => self.release(reusable && !self.midway()),
                    Action::Subscribe => Box::pin(self.subscribe()).await,
                    Action::RetireServers => self.pool.reconnect(),
                    Action::Close => {
                        self.abandon_inflow();
                        return Box::pin(self.close()).await;
                    }
                }
            }
            if self.feed_client() {
                continue;
            }
            if !self.midway() {
                self.session.deliver_notifications();
            }
            // Write what we have, without blocking.
            match self.flush() {
                Err(_) => {
                    self.abandon_inflow();
                    return Box::pin(self.client_gone()).await;
                }
                // A large frame got through: what the client sent after it is fed now.
                Ok(true) => continue,
                Ok(false) => {}
            }
            self.settle_held();
            // A cancel is forwarded at once only while the backend runs the client's request;
            // one that came before (or was held while the batch waited behind others') goes
            // as it begins to.
            if self.server.is_some() {
                let midway = self.midway();
                let session = self.session.get();
                // Part of a large frame still to pass: the request is not all written.
                let phase = if midway { BackendPhase::Holding } else { session.backend_phase() };
                self.slot.set_phase(phase, session.requests_sent());
                if phase != BackendPhase::Holding && self.slot.is_armed() {
                    self.slot.fire_armed();
                }
            }
            let graceful = self.shared.stopping.load(Ordering::Acquire);
            let unlinked_idle = {
                let session = self.session.get();
                let unlinked_idle =
                    !session.is_linked() && !session.is_acquiring() && self.cbuf.is_empty() && self.inflow.is_none();
                if graceful && unlinked_idle {
                    session.fail(Error::fatal(
                        SqlState::ADMIN_SHUTDOWN,
                        "terminating connection due to administrator command",
                    ));
                    continue;
                }
                if unlinked_idle {
                    // An idle client holds no buffers: they go back to this thread's free list.
                    bufpool::release(&mut self.cbuf);
                    bufpool::release(&mut session.to_client);
                    bufpool::release(&mut session.to_server);
                    bufpool::release_queue(session);
                }
                unlinked_idle
            };
            let has_deadline = {
                let timeouts = self.timeouts();
                if timeouts.any() != timed {
                    timed = !timed;
                    idle_since = std::time::Instant::now();
                }
                let buffered = !self.cbuf.is_empty();
                let deadline = self.session.get().poll_timeout(&timeouts, idle_since, buffered).map(Instant::from_std);
                match (deadline, timer.as_mut()) {
                    (Some(d), Some(t)) if t.deadline() != d => t.as_mut().reset(d),
                    (Some(d), None) => timer = Some(Box::pin(tokio::time::sleep_until(d))),
                    _ => {}
                }
                deadline.is_some()
            };
            let timer = timer.as_mut().filter(|_| has_deadline);
            // A writer that waits without having written sends what waited for its write.
            if let Some(Linked::Shared(pipe, t)) = &self.server {
                let mut g = pipe.lock();
                if g.is_corked() && g.is_writer(*t) {
                    g.push();
                }
            }
            let ev = self.wait(timer, &mut stop_registered, graceful, unlinked_idle).await;
            match ev {
                Event::Client => {
                    if !self.read_client() {
                        self.abandon_inflow();
                        return Box::pin(self.client_gone()).await;
                    }
                    self.meter_request();
                    if timed {
                        idle_since = std::time::Instant::now();
                    }
                }
                Event::Server => {
                    let now = self.meter_server_read();
                    self.read_server();
                    self.meter_replies(now);
                }
                Event::Writable | Event::Shutdown => {}
                Event::Timer => {
                    let now = std::time::Instant::now();
                    let timeouts = self.timeouts();
                    if self.session.get().handle_timeout(&timeouts, idle_since, !self.cbuf.is_empty(), now) {
                        self.slot.cancel_own();
                    }
                }
            }
        }
    }

    /// Waits for the next event: the client's or the server's bytes, room to write what is
    /// pending, the timer, a shutdown or a `KILL`. `unlinked_idle`: the session is parked
    /// meanwhile. The future holds only what its poll needs (every idle client's task holds
    /// it, `task_size`).
    fn wait<'a>(
        &'a mut self,
        mut timer: Option<&'a mut Pin<Box<tokio::time::Sleep>>>,
        stop_registered: &'a mut bool,
        graceful: bool,
        unlinked_idle: bool,
    ) -> impl Future<Output = Event> + 'a {
        let client_room = self.cbuf.len() < self.cbuf_cap();
        let server = self.server.as_ref().map(Linked::wait);
        let session = self.session.get();
        let to_client = session.writable_to_client() > 0;
        let to_server = server.is_some() && !session.to_server.is_empty();
        // Idle: only the client, a timeout and a shutdown can wake us. A shutdown only acts
        // on idle clients: the loop looks at it after each event.
        let idle = server.is_none() && !to_client;
        let read_server = session.to_client.len() < HIGH_WATER;
        // Nor while the client's buffer is full (a frame held whole may fill more of it).
        let want_client = (idle || session.to_server.len() < HIGH_WATER) && client_room;
        if unlinked_idle {
            // The session's busy half goes back to this thread too, until the client sends
            // something (`parking`).
            self.session.park();
        }
        let Proxy { client, slot, shared, .. } = self;
        let stopping = &shared.stopping;
        std::future::poll_fn(move |cx| {
            // Readiness is polled in place: no future, allocation or waiter-list entry per
            // wait. An error counts as ready (the read or write then reports it).
            if let Some(s) = server.filter(|_| read_server)
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
            if !*stop_registered {
                *stop_registered = true;
                slot.watch(cx.waker());
            }
            if slot.has_notes() || slot.has_recheck() {
                return Poll::Ready(Event::Writable);
            }
            if idle && !graceful && stopping.load(Ordering::Acquire) || slot.is_killed() {
                return Poll::Ready(Event::Shutdown);
            }
            Poll::Pending
        })
    }

    /// The session's timeouts, from the configuration (not kept in the loop's state: every
    /// idle client's task would carry them): each looked up once per configuration
    /// generation for the pool (`servers::KeptTimeouts`), not on every turn of the loop.
    fn timeouts(&self) -> Timeouts {
        let live = &self.shared.cfg;
        let (user, db) = (self.pool.key.user.as_str(), self.pool.key.db.as_str());
        let kept = &self.pool.connector().timeouts;
        let get = |k: &crate::config::PerGeneration, f: &dyn Fn(&crate::config::Config) -> Option<Duration>| {
            let ms = k.get(live, |c| f(c).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
            (ms > 0).then(|| Duration::from_millis(ms))
        };
        let set = kept.set.get(live, |c| {
            let all = [
                c.client_idle_timeout(user),
                c.idle_transaction_timeout(user),
                c.pinned_timeout(db),
                c.query_timeout(user),
                c.transaction_timeout(user),
            ];
            all.iter().enumerate().fold(0, |m, (i, t)| if t.is_some() { m | 1 << i } else { m })
        });
        if set == 0 {
            return Timeouts::default();
        }
        Timeouts {
            client_idle: get(&kept.client_idle, &|c| c.client_idle_timeout(user)),
            idle_in_transaction: get(&kept.idle_in_transaction, &|c| c.idle_transaction_timeout(user)),
            // Looked up only for a pinned client (a parked session never is one).
            pinned: if self.session.is_pinned() { get(&kept.pinned, &|c| c.pinned_timeout(db)) } else { None },
            query: get(&kept.query, &|c| c.query_timeout(user)),
            transaction: get(&kept.transaction, &|c| c.transaction_timeout(user)),
        }
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
        // 224: the session is parked while the client is idle (`parking`): the task holds
        // what the session keeps (settings, statements, counts), not its busy half (608 B
        // inline before). The loop's wait holds what its poll needs (`wait`), and the
        // shutdown and KILL wake-ups are the task's waker left with the client's slot, not
        // a `Notify` wait of its own.
        assert!(proxy <= 224, "Proxy is {proxy} B");
        assert!(run <= 112, "the proxy loop's future is {run} B");
        assert!(acquire <= 64, "acquire()'s future is {acquire} B: box its waits");
    }
}
