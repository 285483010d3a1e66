//! Server connections per (database, user): checkout with a FIFO wait queue and a wait
//! timeout, a size limit, connect retries, lifetime and idle limits, and direct hand-off
//! of a returned connection to the longest-waiting client. One small mutex per pool, held
//! only to move a connection in or out; never across IO.
//!
//! Must not know about client sessions or protocol state beyond "reusable or not".

use crate::config::{Config, PoolMode};
use crate::driver::pipe::Pipe;
use crate::driver::server_conn::{self, ConnectError, Credentials, ServerConn, ServerTarget};
use crate::error::{Error, SqlState};
use crate::state::settings::{Settings, TRACKED};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Identifies a pool: the database name clients use and the client user name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    /// Database name as the client gave it.
    pub db: String,
    /// Client user name.
    pub user: String,
}

/// What a new client is told about the server at login, learnt from the first connection.
#[derive(Debug)]
pub struct ServerDefaults {
    /// Every ParameterStatus the server sent at startup.
    pub params: Vec<(String, String)>,
    /// The tracked subset, as session settings.
    pub settings: Settings,
}

/// What a waiting checkout is woken with.
enum Handoff {
    /// A connection handed over directly.
    Conn(Box<ServerConn>),
    /// A ticket on a connection still busy with other clients' batches (`driver::pipe`).
    Ticket(Arc<Pipe>, u32),
    /// A slot was freed: try again (the waiter may open a connection).
    SlotFreed,
    /// `query_wait_timeout` passed (found by `expire_waiters`).
    TimedOut,
}

/// What `Pool::checkout` found.
pub enum Checkout {
    /// An idle connection.
    Ready(Box<ServerConn>),
    /// A place in the wait queue: `Pool::wait_queued`.
    Queued(Queued),
    /// A connection must be opened: `Pool::acquire`.
    Slow,
}

/// A place in a pool's wait queue.
pub struct Queued(oneshot::Receiver<Handoff>);

/// What a queued client is given.
pub enum Lease {
    /// A connection of its own.
    Own(Box<ServerConn>),
    /// A ticket on a shared connection (`driver::pipe`): its batch goes behind others'.
    Ticket(Arc<Pipe>, u32),
}

/// A queued checkout. Its deadline is enforced by `expire_waiters` (the janitor), not by
/// a timer per wait: arming and cancelling a timer cost more than the rest of a hand-off.
struct Waiter {
    tx: oneshot::Sender<Handoff>,
    deadline: Option<Instant>,
    /// A client's checkout (`checkout`), which can take a ticket on a shared connection.
    takes_ticket: bool,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("deadline", &self.deadline).finish()
    }
}

#[derive(Debug, Default)]
struct Inner {
    // Boxed so a checkout moves a pointer, and a client holding one stays small.
    #[allow(clippy::vec_box)]
    idle: Vec<Box<ServerConn>>,
    /// Connections open or being opened (idle + in use + connecting).
    open: usize,
    waiters: VecDeque<Waiter>,
}

/// Counters, readable without the lock.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Server connections opened.
    pub connects: AtomicU64,
    /// Failed connect attempts.
    pub connect_failures: AtomicU64,
    /// Checkouts served.
    pub checkouts: AtomicU64,
    /// Checkouts that had to wait.
    pub waits: AtomicU64,
    /// Checkouts that timed out.
    pub wait_timeouts: AtomicU64,
    /// Checkouts served with a ticket on a connection busy with other batches.
    pub pipelined: AtomicU64,
    /// Cancels sent with `pg_cancel_backend` because batches were queued behind the query.
    pub pipelined_cancels: AtomicU64,
}

/// One pool.
#[derive(Debug)]
pub struct Pool {
    /// Its key.
    pub key: PoolKey,
    /// Where it connects.
    pub target: ServerTarget,
    /// Pool mode of its clients.
    pub mode: PoolMode,
    /// Maximum open connections.
    pub size: usize,
    creds: Mutex<Credentials>,
    inner: Mutex<Inner>,
    defaults: OnceLock<Arc<ServerDefaults>>,
    cfg: Arc<Config>,
    /// Counters.
    pub stats: PoolStats,
    /// The prepared-statement cache of this pool.
    pub stmts: Arc<crate::stmt::Registry>,
    /// Clients' settings, shared between clients that have the same (most do).
    settings: Mutex<std::collections::HashMap<u64, std::sync::Weak<Settings>>>,
}

impl Pool {
    /// A pool with no connections yet.
    pub fn new(
        key: PoolKey,
        target: ServerTarget,
        mode: PoolMode,
        size: usize,
        creds: Credentials,
        cfg: Arc<Config>,
    ) -> Pool {
        Pool {
            key,
            target,
            mode,
            size,
            creds: Mutex::new(creds),
            inner: Mutex::new(Inner::default()),
            defaults: OnceLock::new(),
            stmts: Arc::new(crate::stmt::Registry::new(cfg.stmt_config())),
            settings: Mutex::new(std::collections::HashMap::new()),
            cfg,
            stats: PoolStats::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the pool credentials if it has none (learnt from a client's login).
    pub fn offer_credentials(&self, creds: &Credentials) {
        let mut c = self.creds.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*c, Credentials::None) && !matches!(creds, Credentials::None) {
            *c = creds.clone();
        }
    }

    /// The server's startup parameters, connecting once if none is known yet.
    pub async fn defaults(&self) -> Result<Arc<ServerDefaults>, Error> {
        if let Some(d) = self.defaults.get() {
            return Ok(d.clone());
        }
        let conn = self.acquire().await?;
        let d = self.learn_defaults(&conn);
        self.release_now(conn, true);
        Ok(d)
    }

    fn learn_defaults(&self, conn: &ServerConn) -> Arc<ServerDefaults> {
        self.defaults
            .get_or_init(|| {
                let mut settings = Settings::default();
                for name in TRACKED {
                    settings.set_reported(name, conn.state.settings.reported(name).unwrap_or(""));
                }
                Arc::new(ServerDefaults { params: conn.params.clone(), settings })
            })
            .clone()
    }

    /// One shared copy of `s` for every client of this pool with the same settings, so an
    /// idle client costs a pointer, not a copy.
    pub fn intern_settings(&self, s: Settings) -> Arc<Settings> {
        let mut map = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = map.get(&s.key()).and_then(std::sync::Weak::upgrade)
            && *shared == s
        {
            return shared;
        }
        if map.len() >= 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let a = Arc::new(s);
        map.insert(a.key(), Arc::downgrade(&a));
        a
    }

    /// An idle, healthy connection right now, if there is one and nobody is waiting.
    pub fn try_acquire(&self) -> Option<Box<ServerConn>> {
        let mut g = self.lock();
        if !g.waiters.is_empty() {
            return None;
        }
        while let Some(mut c) = g.idle.pop() {
            if c.is_healthy() && !self.expired(&c) {
                drop(g);
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                return Some(c);
            }
            g.open -= 1;
        }
        None
    }

    /// A checkout that awaits nothing unless it must queue: an idle connection, or a place
    /// in the wait queue (`wait_queued`), or `Slow` when a connection must be opened (then
    /// call `acquire`). What a client does per transaction, so it allocates no future.
    pub fn checkout(&self) -> Checkout {
        let mut g = self.lock();
        while let Some(mut c) = g.idle.pop() {
            if c.is_healthy() && !self.expired(&c) {
                drop(g);
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                return Checkout::Ready(c);
            }
            g.open -= 1;
        }
        if g.open < self.size && g.waiters.is_empty() {
            return Checkout::Slow;
        }
        let (tx, rx) = oneshot::channel();
        let deadline = self.cfg.query_wait_timeout().map(|t| Instant::now() + t);
        g.waiters.push_back(Waiter { tx, deadline, takes_ticket: true });
        drop(g);
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        Checkout::Queued(Queued(rx))
    }

    /// Waits for a queued checkout: a connection, the timeout error, or None when the
    /// pool asks the waiter to try again through `acquire_woken` (a slot was freed).
    pub async fn wait_queued(&self, q: &mut Queued) -> Result<Option<Lease>, Error> {
        match (&mut q.0).await {
            Ok(Handoff::Conn(c)) => {
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                Ok(Some(Lease::Own(c)))
            }
            Ok(Handoff::Ticket(p, t)) => {
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                self.stats.pipelined.fetch_add(1, Ordering::Relaxed);
                Ok(Some(Lease::Ticket(p, t)))
            }
            Ok(Handoff::TimedOut) => Err(self.wait_timed_out()),
            Ok(Handoff::SlotFreed) | Err(_) => Ok(None),
        }
    }

    /// Leaves the queue (the client gave up): a connection handed over meanwhile comes
    /// back to the pool instead of being dropped with the receiver.
    pub fn abandon(self: &Arc<Self>, mut q: Queued) {
        q.0.close();
        match q.0.try_recv() {
            Ok(Handoff::Conn(c)) => self.release_now(c, true),
            Ok(Handoff::Ticket(p, t)) => self.retract_ticket(&p, t, None),
            _ => {}
        }
    }

    /// Gives up ticket `t`, which never wrote: the writer is `back` again. The connection
    /// comes back to the pool if no other ticket holds it.
    pub fn retract_ticket(self: &Arc<Self>, p: &Pipe, t: u32, back: Option<u32>) {
        let mut g = p.lock();
        let dead = g.dead;
        if let Some(c) = g.retract(t, back) {
            drop(g);
            self.release_from_pipe(c, dead);
        }
    }

    /// Returns a connection no ticket holds any more: closed if its pipe broke or bytes
    /// are left unread in it (they would belong to nobody).
    pub fn release_from_pipe(self: &Arc<Self>, c: Box<ServerConn>, dead: bool) {
        let clean = !dead && c.rbuf.is_empty() && c.streaming == 0;
        self.release(c, clean);
    }

    /// True when the client first in the queue could take a ticket on a shared connection.
    pub fn ticket_waiter(&self) -> bool {
        self.lock().waiters.front().is_some_and(|w| w.takes_ticket && !w.tx.is_closed())
    }

    /// Lets the first queued client write its batch on `pipe` behind the batches in flight
    /// there (at most `depth` of them), taking the writer's role from ticket `from`. False
    /// when nobody could take it (the writer stays `from`).
    pub fn lend(self: &Arc<Self>, pipe: &Arc<Pipe>, from: u32, depth: usize) -> bool {
        let mut g = self.lock();
        while g.waiters.front().is_some_and(|w| w.tx.is_closed()) {
            g.waiters.pop_front();
        }
        if !g.waiters.front().is_some_and(|w| w.takes_ticket) {
            return false;
        }
        let t = {
            let mut p = pipe.lock();
            // A connection past its lifetime takes no more batches: it must come back to
            // the pool once to be closed.
            if p.dead || p.depth() >= depth || !p.is_writer(from) || p.conn.as_ref().is_none_or(|c| self.expired(c)) {
                return false;
            }
            let t = p.add_ticket();
            // A cancel on its way now could land on the batch written behind. Checked after
            // `add_ticket` published that batches are queued (`CancelTarget::behind`): a
            // cancel counted in flight later sees it and signals the backend only once.
            if p.conn.as_ref().is_some_and(|c| c.cancel.in_flight.load(Ordering::SeqCst) > 0) {
                p.retract(t, Some(from));
                return false;
            }
            t
        };
        let Some(w) = g.waiters.pop_front() else { return false };
        match w.tx.send(Handoff::Ticket(pipe.clone(), t)) {
            Ok(()) => true,
            Err(_) => {
                drop(g);
                // The waiter left meanwhile: the ticket is taken back before anyone used it.
                self.retract_ticket(pipe, t, Some(from));
                false
            }
        }
    }

    fn wait_timed_out(&self) -> Error {
        self.stats.wait_timeouts.fetch_add(1, Ordering::Relaxed);
        Error::new(
            SqlState::QUERY_CANCELED,
            format!(
                "canceling statement due to query_wait_timeout: no server connection became free within {} ms",
                self.cfg.query_wait_timeout_ms
            ),
        )
    }

    /// Checks out a connection: an idle one, a new one if below size, or the next one
    /// returned, waiting at most `query_wait_timeout` (give or take the janitor's period,
    /// see `expire_waiters`).
    pub async fn acquire(&self) -> Result<Box<ServerConn>, Error> {
        let deadline = self.cfg.query_wait_timeout().map(|t| Instant::now() + t);
        let mut waited = false;
        loop {
            let rx = {
                let mut g = self.lock();
                let mut found = None;
                while let Some(mut c) = g.idle.pop() {
                    if c.is_healthy() && !self.expired(&c) {
                        found = Some(c);
                        break;
                    }
                    g.open -= 1;
                }
                if let Some(c) = found {
                    drop(g);
                    self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                    return Ok(c);
                }
                if g.open < self.size && g.waiters.is_empty() {
                    g.open += 1;
                    None
                } else {
                    let (tx, rx) = oneshot::channel();
                    g.waiters.push_back(Waiter { tx, deadline, takes_ticket: false });
                    Some(rx)
                }
            };
            let Some(rx) = rx else {
                return match self.connect().await {
                    Ok(c) => {
                        self.learn_defaults(&c);
                        self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                        Ok(c)
                    }
                    Err(e) => {
                        self.slot_freed();
                        Err(e)
                    }
                };
            };
            if !waited {
                waited = true;
                self.stats.waits.fetch_add(1, Ordering::Relaxed);
            }
            match rx.await {
                Ok(Handoff::Conn(c)) => {
                    self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                    return Ok(c);
                }
                Ok(Handoff::TimedOut) => return Err(self.wait_timed_out()),
                // Never sent to this kind of waiter.
                Ok(Handoff::Ticket(..)) => return Err(Error::protocol("unexpected shared server connection")),
                // A slot was freed (or the sender vanished): try again; we may connect.
                Ok(Handoff::SlotFreed) | Err(_) => {
                    if self.reserve_freed_slot() {
                        return self.connect_reserved().await;
                    }
                }
            }
        }
    }

    /// After `wait_queued` gave None (this waiter was told a slot is free): open a
    /// connection in that slot, or queue again. The freed slot is this waiter's even if
    /// others are queued (they were not told).
    pub async fn acquire_woken(&self) -> Result<Box<ServerConn>, Error> {
        if self.reserve_freed_slot() {
            return self.connect_reserved().await;
        }
        self.acquire().await
    }

    fn reserve_freed_slot(&self) -> bool {
        let mut g = self.lock();
        let ok = g.open < self.size;
        if ok {
            g.open += 1;
        }
        ok
    }

    async fn connect_reserved(&self) -> Result<Box<ServerConn>, Error> {
        match self.connect().await {
            Ok(c) => {
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                Ok(c)
            }
            Err(e) => {
                self.slot_freed();
                Err(e)
            }
        }
    }

    /// Cancels what backend `pid` of this pool runs, with `pg_cancel_backend` over a
    /// short-lived connection of its own (outside the pool's count). Used when other
    /// clients' batches are queued behind that query on its connection: for a
    /// CancelRequest, PostgreSQL up to version 17 signals the backend twice (the process
    /// and its group), and the second signal can land on the next batch once the first
    /// has ended the query. `pg_cancel_backend` signals once. False when it could not be
    /// sent this way (the caller falls back to a CancelRequest).
    pub async fn cancel_backend(&self, pid: i32) -> bool {
        let Ok(mut c) = self.connect().await else { return false };
        let sent =
            c.run_checked(&format!("SELECT pg_cancel_backend({pid})"), self.cfg.server_connect_timeout()).await.is_ok();
        if sent {
            self.stats.pipelined_cancels.fetch_add(1, Ordering::Relaxed);
        }
        c.terminate().await;
        sent
    }

    async fn connect(&self) -> Result<Box<ServerConn>, Error> {
        let attempts = self.cfg.server_connect_attempts.max(1);
        let mut last = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(self.cfg.server_login_retry_ms)).await;
            }
            let creds = self.creds.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match server_conn::connect(&self.target, &creds, self.cfg.server_connect_timeout()).await {
                Ok(c) => {
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(db = %self.key.db, user = %self.key.user, pid = c.cancel.pid, "server connection opened");
                    return Ok(Box::new(c));
                }
                Err(e) => {
                    self.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(db = %self.key.db, user = %self.key.user, error = ?e, "server connect failed");
                    let retry = matches!(e, ConnectError::Io(_))
                        || matches!(&e, ConnectError::Server(_) if e.to_error().code == SqlState::CANNOT_CONNECT_NOW);
                    last = Some(e);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last
            .map(|e| e.to_error())
            .unwrap_or_else(|| Error::fatal(SqlState::CONNECTION_FAILURE, "could not connect to server")))
    }

    fn expired(&self, c: &ServerConn) -> bool {
        self.cfg.server_lifetime().is_some_and(|l| c.created.elapsed() >= l)
    }

    /// A connection slot was given up: let one waiter open a new connection.
    fn slot_freed(&self) {
        let mut g = self.lock();
        g.open -= 1;
        while let Some(w) = g.waiters.pop_front() {
            if w.tx.send(Handoff::SlotFreed).is_ok() {
                break;
            }
        }
    }

    /// Returns a connection. Not reusable or past its lifetime: it is closed.
    pub fn release(self: &Arc<Self>, conn: Box<ServerConn>, reusable: bool) {
        if !reusable || self.expired(&conn) {
            drop(conn);
            return self.slot_freed();
        }
        if conn.cancel.in_flight.load(std::sync::atomic::Ordering::Acquire) > 0 {
            // A cancel request is on its way to this backend: the next client's query would
            // take it. Hand the connection on once it has landed.
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                drop(conn);
                return self.slot_freed();
            };
            let pool = self.clone();
            rt.spawn(async move {
                let settled = conn.cancel.wait_settled(Duration::from_secs(6)).await;
                pool.release_now(conn, settled);
            });
            return;
        }
        self.release_now(conn, true);
    }

    /// Returns a connection no client's cancel key can reach (login, the pool's own use).
    pub fn release_now(&self, mut conn: Box<ServerConn>, reusable: bool) {
        if !reusable {
            drop(conn);
            return self.slot_freed();
        }
        conn.last_used = Instant::now();
        let mut g = self.lock();
        while let Some(w) = g.waiters.pop_front() {
            match w.tx.send(Handoff::Conn(conn)) {
                Ok(()) => return,
                Err(Handoff::Conn(back)) => conn = back,
                Err(_) => return,
            }
        }
        g.idle.push(conn);
    }

    /// Closes idle connections past server_idle_timeout or lifetime. Called periodically.
    pub fn prune(&self) {
        let idle_limit = self.cfg.server_idle_timeout();
        let mut g = self.lock();
        let before = g.idle.len();
        g.idle.retain(|c| {
            !(idle_limit.is_some_and(|l| c.last_used.elapsed() >= l)
                || self.cfg.server_lifetime().is_some_and(|l| c.created.elapsed() >= l))
        });
        let closed = before - g.idle.len();
        g.open -= closed;
        for _ in 0..closed {
            match g.waiters.pop_front() {
                Some(w) => {
                    let _ = w.tx.send(Handoff::SlotFreed);
                }
                None => break,
            }
        }
    }

    /// Fails the queued checkouts whose `query_wait_timeout` has passed, and forgets the
    /// ones whose client went away. Called by the janitor, often enough for the timeout's
    /// precision (see `janitor_period`).
    pub fn expire_waiters(&self) {
        let now = Instant::now();
        let mut g = self.lock();
        if g.waiters.is_empty() {
            return;
        }
        let mut kept = VecDeque::with_capacity(g.waiters.len());
        for w in g.waiters.drain(..) {
            if w.tx.is_closed() {
                continue;
            }
            if w.deadline.is_some_and(|d| d <= now) {
                let _ = w.tx.send(Handoff::TimedOut);
            } else {
                kept.push_back(w);
            }
        }
        g.waiters = kept;
    }

    /// (idle, open, waiting) counts.
    pub fn counts(&self) -> (usize, usize, usize) {
        let g = self.lock();
        (g.idle.len(), g.open, g.waiters.len())
    }

    /// The server connect timeout, also used for the pooler's own short queries.
    pub fn connect_timeout(&self) -> Duration {
        self.cfg.server_connect_timeout()
    }

    /// Closes every idle connection (shutdown).
    pub fn close_idle(&self) {
        let mut g = self.lock();
        let n = g.idle.len();
        g.idle.clear();
        g.open -= n;
    }
}
