//! Server connections per (database, user): checkout with a FIFO wait queue and a wait
//! timeout, a size limit, lifetime and idle limits, and direct hand-off of a returned
//! connection (or a pipelining ticket) to the longest-waiting client. One small mutex per
//! pool, held only to move a connection in or out; never across IO.
//!
//! Generic over what it holds (`conn::Pooled`) and over who opens it
//! (`conn::Connector`): the driver supplies both for its server connections, and the unit
//! tests a connection of their own. So the pool does no IO, spawns no task and never
//! sleeps; opening a connection (with its retries) is the connector's, and the periodic
//! `prune` / `expire_waiters` calls are the driver's janitor.
//!
//! Must not know about sockets, client sessions or protocol state beyond "reusable or not".

mod capped;
mod conn;
mod defaults;
pub(crate) mod fence;
pub mod home;
pub(crate) mod hosts;
mod key;
pub(crate) mod limit;
mod pause;
mod queue;
mod stats;
#[cfg(test)]
mod tests;
mod warm;

pub(crate) use conn::{Connecting, Connector, Pooled};
pub(crate) use defaults::ServerDefaults;
pub use key::{PoolKey, PoolPurpose};
pub use pause::Pauses;
pub(crate) use queue::{Checkout, Lease, Queued};
pub(crate) use stats::{Figures, LastPeriod, PoolSnapshot, PoolStats, WAIT_BUCKETS};

use crate::config::{LiveConfig, PerGeneration, PoolMode};
use crate::error::Error;
use crate::state::settings::Settings;
use capped::Locked;
use queue::{Handoff, SWEEP_EVERY, SWEEP_FROM, Waiter};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

struct Inner<K: Connector> {
    // Boxed so a checkout moves a pointer, and a client holding one stays small.
    #[allow(clippy::vec_box)]
    idle: Vec<Box<K::Conn>>,
    /// Connections open or being opened (idle + in use + connecting).
    open: usize,
    waiters: VecDeque<Waiter<K>>,
    /// Slots closed under the lock whose cap slots (`limit`) go back once it is released.
    freed: usize,
    /// A cap slot was taken and given back under the lock: the caps wake a waiter once it
    /// is released (someone refused meanwhile may now fit).
    rewake: bool,
    /// The first queued client has waited `reserve_pool_timeout`: the pool may open up to
    /// `reserve_pool_size` connections beyond its size (set by the janitor).
    reserve_open: bool,
    /// The janitor's ticks, and the queue's length after its last look at every waiter's
    /// channel (`expire_waiters`).
    ticks: u32,
    swept_len: usize,
}

impl<K: Connector> Inner<K> {
    /// `n` connections closed.
    fn close_slots(&mut self, n: usize) {
        self.open -= n;
        self.freed += n;
    }
}

/// One pool.
pub struct Pool<K: Connector> {
    /// Its key.
    pub(crate) key: PoolKey,
    /// Pool mode of its clients.
    pub(crate) mode: PoolMode,
    /// Maximum open connections (a reload may change it: `resize`).
    size: AtomicUsize,
    connector: K,
    inner: Mutex<Inner<K>>,
    defaults: OnceLock<Arc<ServerDefaults>>,
    /// The configuration in force (shared with the driver: a reload swaps it there).
    cfg: LiveConfig,
    /// Counters.
    pub(crate) stats: PoolStats,
    /// The prepared-statement cache of this pool.
    pub(crate) stmts: Arc<crate::stmt::Registry>,
    /// Clients' settings, shared between clients that have the same (most do).
    settings: Mutex<std::collections::HashMap<u64, std::sync::Weak<Settings>>>,
    /// The pooler's pauses: while they hold this pool's database, checkouts queue,
    /// returned connections stay idle (and are closed by the pauser), nothing is handed
    /// over until `resumed`.
    pauses: Arc<Pauses>,
    /// Bumped by `reconnect`: connections of an older epoch are closed, not reused.
    epoch: AtomicU64,
    /// The limits across pools its connections count in (its database's and its user's).
    caps: Vec<Arc<limit::Cap>>,
    /// The limits its clients count in (its database's and its clients' user's).
    client_caps: Vec<Arc<limit::Cap>>,
    /// Connections it may open beyond its size once a client waited
    /// `reserve_pool_timeout` (a reload may change it).
    reserve: AtomicUsize,
    /// `server_lifetime_ms` of its database and `query_wait_timeout_ms`, looked up once
    /// per configuration generation (both are read per transaction).
    lifetime_ms: PerGeneration,
    wait_timeout_ms: PerGeneration,
}

impl<K: Connector> std::fmt::Debug for Pool<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("key", &self.key).field("mode", &self.mode).field("size", &self.size()).finish()
    }
}

impl<K: Connector> Pool<K> {
    /// A pool with no connections yet, opening them with `connector`.
    pub fn new(key: PoolKey, mode: PoolMode, size: usize, connector: K, cfg: impl Into<LiveConfig>) -> Pool<K> {
        let cfg = cfg.into();
        let stmt_config = cfg.load().stmt_config_for(&key.db, &key.user);
        Pool {
            key,
            mode,
            size: AtomicUsize::new(size),
            connector,
            inner: Mutex::new(Inner {
                idle: Vec::new(),
                open: 0,
                waiters: VecDeque::new(),
                freed: 0,
                rewake: false,
                reserve_open: false,
                ticks: 0,
                swept_len: 0,
            }),
            defaults: OnceLock::new(),
            stmts: Arc::new(crate::stmt::Registry::new(stmt_config)),
            settings: Mutex::new(std::collections::HashMap::new()),
            cfg,
            stats: PoolStats::default(),
            pauses: Arc::default(),
            epoch: AtomicU64::new(0),
            caps: Vec::new(),
            client_caps: Vec::new(),
            reserve: AtomicUsize::new(0),
            lifetime_ms: PerGeneration::default(),
            wait_timeout_ms: PerGeneration::default(),
        }
    }

    /// Reads `pauses` (the pooler's) instead of pauses of its own.
    pub(crate) fn with_pauses(mut self, pauses: Arc<Pauses>) -> Pool<K> {
        self.pauses = pauses;
        self
    }

    /// Maximum open connections.
    pub(crate) fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// A reload: the new pool size. A bigger size lets queued checkouts open connections at
    /// once; a smaller one closes idle connections above it, and the others as they come
    /// back.
    pub(crate) fn resize(&self, size: usize) {
        let old = self.size.swap(size, Ordering::Relaxed);
        if size > old {
            self.wake_for_free_slots();
        } else if size < old {
            let mut g = self.lock();
            while g.open > size + self.reserve() && g.idle.pop().is_some() {
                g.close_slots(1);
            }
        }
    }

    fn lock(&self) -> Locked<'_, K> {
        Locked { pool: self, g: Some(self.inner.lock().unwrap_or_else(|e| e.into_inner())) }
    }

    /// Who opens this pool's connections.
    pub(crate) fn connector(&self) -> &K {
        &self.connector
    }

    /// An idle, healthy connection from the idle list (closing the ones that are not),
    /// counted as a checkout.
    fn take_idle(&self, g: &mut Inner<K>) -> Option<Box<K::Conn>> {
        if self.is_paused() {
            return None;
        }
        // The most recently used connection of this thread's, else anyone's (it then
        // keeps its socket's events on its own thread: correct, one wake-up dearer).
        let here = home::here();
        while let Some(mut c) = match g.idle.iter().rposition(|c| c.home() == here) {
            Some(i) => Some(g.idle.remove(i)),
            None => g.idle.pop(),
        } {
            if c.is_healthy() && !self.expired(&c) && !self.outdated(&c) {
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                return Some(c);
            }
            if c.says_going_down() && !self.outdated(&c) {
                // The others of its epoch are closed as they are met here or come back
                // (`outdated`), as after a `reconnect`.
                tracing::info!(db = %self.key.db, user = %self.key.user, "an idle server connection said its server is going down: the pool's connections are opened again");
                self.epoch.fetch_add(1, Ordering::Relaxed);
            }
            g.close_slots(1);
        }
        None
    }

    /// An idle, healthy connection right now, if there is one and nobody is waiting.
    pub fn try_acquire(&self) -> Option<Box<K::Conn>> {
        let mut g = self.lock();
        if !g.waiters.is_empty() {
            return None;
        }
        self.take_idle(&mut g)
    }

    /// A checkout that awaits nothing unless it must queue: an idle connection, or a place
    /// in the wait queue (`wait_queued`), or `Slow` when a connection must be opened (then
    /// call `acquire`). What a client does per transaction, so it allocates no future.
    pub(crate) fn checkout(&self) -> Checkout<K> {
        let mut g = self.lock();
        if let Some(c) = self.take_idle(&mut g) {
            return Checkout::Ready(c);
        }
        if g.open < self.size() && g.waiters.is_empty() && !self.is_paused() {
            return Checkout::Slow;
        }
        let (tx, rx) = oneshot::channel();
        let since = Instant::now();
        let wait_ms = self.wait_timeout_ms.get(&self.cfg, |c| c.query_wait_timeout_ms);
        let deadline = (wait_ms > 0).then(|| since + Duration::from_millis(wait_ms));
        g.waiters.push_back(Waiter::new(tx, deadline, since, true));
        drop(g);
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        Checkout::Queued(Queued(rx))
    }

    /// Waits for a queued checkout: a connection, the timeout error, or None when the
    /// pool asks the waiter to try again through `acquire_woken` (a slot was freed).
    pub(crate) async fn wait_queued(&self, q: &mut Queued<K>) -> Result<Option<Lease<K>>, Error> {
        match (&mut q.0).await {
            Ok(Handoff::Conn(c)) => {
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                Ok(Some(Lease::Own(c)))
            }
            Ok(Handoff::Ticket(t)) => {
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                self.stats.pipelined.fetch_add(1, Ordering::Relaxed);
                Ok(Some(Lease::Ticket(t)))
            }
            Ok(Handoff::TimedOut) => Err(self.wait_timed_out()),
            Ok(Handoff::SlotFreed) | Err(_) => Ok(None),
        }
    }

    /// Leaves the queue (the client gave up): a connection handed over meanwhile comes
    /// back to the pool instead of being dropped with the receiver; a ticket handed over
    /// is returned for the caller to give back.
    #[must_use]
    pub(crate) fn abandon(&self, mut q: Queued<K>) -> Option<K::Ticket> {
        q.0.close();
        match q.0.try_recv() {
            Ok(Handoff::Conn(c)) => self.release_now(c, true),
            Ok(Handoff::Ticket(t)) => return Some(t),
            _ => {}
        }
        None
    }

    /// True when the client first in the queue could take a ticket on a shared connection.
    pub(crate) fn ticket_waiter(&self) -> bool {
        self.lock().waiters.front().is_some_and(|w| w.takes_ticket && !w.tx.is_closed())
    }

    /// Hands a ticket to the first queued client that can take one. `make` makes it (with
    /// the pool's lock held, so no checkout slips in between) or declines (None). Ok(true):
    /// handed over; Ok(false): nobody took one; Err(ticket): the waiter left just then, and
    /// the caller takes its ticket back.
    pub(crate) fn lend(&self, make: impl FnOnce() -> Option<K::Ticket>) -> Result<bool, K::Ticket> {
        let mut g = self.lock();
        if self.is_paused() {
            return Ok(false);
        }
        while g.waiters.front().is_some_and(|w| w.tx.is_closed()) {
            g.waiters.pop_front();
        }
        if !g.waiters.front().is_some_and(|w| w.takes_ticket) {
            return Ok(false);
        }
        let Some(ticket) = make() else { return Ok(false) };
        let Some(w) = g.waiters.pop_front() else { return Err(ticket) };
        match w.tx.send(Handoff::Ticket(ticket)) {
            Ok(()) => Ok(true),
            Err(Handoff::Ticket(back)) => Err(back),
            Err(_) => Ok(false),
        }
    }

    /// Checks out a connection: an idle one, a new one if below size, or the next one
    /// returned, waiting at most `query_wait_timeout` (give or take the janitor's period,
    /// see `expire_waiters`).
    pub async fn acquire(&self) -> Result<Box<K::Conn>, Error> {
        let deadline = self.cfg.load().query_wait_timeout().map(|t| Instant::now() + t);
        let mut waited = false;
        loop {
            let mut evict = false;
            let rx = {
                let mut g = self.lock();
                if let Some(c) = self.take_idle(&mut g) {
                    return Ok(c);
                }
                let room = g.open < self.size() && g.waiters.is_empty() && !self.is_paused();
                if room && self.take_caps(&mut g) {
                    g.open += 1;
                    None
                } else {
                    // Full, or room of its own but its database or user is at its limit:
                    // wait like for a full pool (a cap's slot given back wakes it).
                    evict = room;
                    let (tx, rx) = oneshot::channel();
                    g.waiters.push_back(Waiter::new(tx, deadline, Instant::now(), false));
                    Some(rx)
                }
            };
            if evict {
                self.evict_for_room();
            }
            let Some(rx) = rx else {
                return match self.connector.connect(&self.stats).await {
                    Ok(mut c) => {
                        c.set_epoch(self.epoch.load(Ordering::Relaxed));
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
    pub(crate) async fn acquire_woken(&self) -> Result<Box<K::Conn>, Error> {
        if self.reserve_freed_slot() {
            return self.connect_reserved().await;
        }
        self.acquire().await
    }

    fn reserve_freed_slot(&self) -> bool {
        let mut g = self.lock();
        let ok = self.has_room(&g) && !self.is_paused() && self.take_caps(&mut g);
        if ok {
            g.open += 1;
        }
        ok
    }

    async fn connect_reserved(&self) -> Result<Box<K::Conn>, Error> {
        match self.connector.connect(&self.stats).await {
            Ok(mut c) => {
                c.set_epoch(self.epoch.load(Ordering::Relaxed));
                self.stats.checkouts.fetch_add(1, Ordering::Relaxed);
                Ok(c)
            }
            Err(e) => {
                self.slot_freed();
                Err(e)
            }
        }
    }

    /// A connection slot was given up: let one waiter open a new connection.
    fn slot_freed(&self) {
        let mut g = self.lock();
        g.close_slots(1);
        if self.is_paused() {
            return;
        }
        while let Some(w) = g.waiters.pop_front() {
            if w.tx.send(Handoff::SlotFreed).is_ok() {
                break;
            }
        }
    }

    /// Returns a connection. Not reusable or past its lifetime: it is closed.
    pub(crate) fn release(&self, conn: Box<K::Conn>, reusable: bool) {
        // One clock read for the lifetime check and the idle time's start.
        let now = Instant::now();
        if !reusable || self.expired_at(&conn, now) || self.outdated(&conn) {
            drop(conn);
            return self.slot_freed();
        }
        self.release_at(conn, true, now);
    }

    /// Returns a connection as it is (lifetime not checked): to the first waiter, else to
    /// the idle list. Not reusable: it is closed.
    pub(crate) fn release_now(&self, conn: Box<K::Conn>, reusable: bool) {
        self.release_at(conn, reusable, Instant::now());
    }

    /// `release_now`, idle from `now`.
    fn release_at(&self, mut conn: Box<K::Conn>, reusable: bool, now: Instant) {
        if !reusable || self.outdated(&conn) {
            drop(conn);
            return self.slot_freed();
        }
        conn.touch(now);
        let mut g = self.lock();
        if g.open > self.size() + self.reserve() {
            // A reload made the pool smaller: this one goes.
            g.close_slots(1);
            drop(g);
            drop(conn);
            return;
        }
        while !self.is_paused()
            && let Some(w) = queue::pick(&mut g.waiters, conn.home())
        {
            match w.tx.send(Handoff::Conn(conn)) {
                Ok(()) => return,
                Err(Handoff::Conn(back)) => conn = back,
                Err(_) => return,
            }
        }
        g.idle.push(conn);
        drop(g);
        self.offer_idle();
    }

    /// Closes idle connections past lifetime, and past server_idle_timeout while more than
    /// `min` are open (`min_size` while the pool is in use, as PgBouncer). Periodic.
    pub(crate) fn prune(&self, min: usize) {
        let idle_limit = self.cfg.load().server_idle_timeout();
        let lifetime = self.cfg.load().server_lifetime(&self.key.db);
        let mut g = self.lock();
        let before = g.idle.len();
        let mut open = g.open;
        g.idle.retain(|c| {
            let close = lifetime.is_some_and(|l| c.created().elapsed() >= l)
                || (open > min && idle_limit.is_some_and(|l| c.last_used().elapsed() >= l));
            open -= usize::from(close);
            !close
        });
        let closed = before - g.idle.len();
        g.close_slots(closed);
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
    /// ones whose client went away; opens the reserve (`reserve_pool_size`) while the
    /// first queued client has waited `reserve_pool_timeout`, and tells the clients that
    /// waited that long to open a connection in it. Called by the janitor, often enough
    /// for the timeouts' precision (see `janitor_period`).
    pub(crate) fn expire_waiters(&self) {
        let now = Instant::now();
        let mut g = self.lock();
        if g.waiters.is_empty() {
            g.reserve_open = false;
            return;
        }
        // A deadline is read from the queue's own entries, in order in memory; whether a
        // waiter's client left is read from its channel, a cache miss per waiter (with
        // 10,000 queued, 3 % of the pooler's CPU and a stall of the event loop each tick
        // when every tick read them all). So every tick looks at every deadline, and at
        // the channels of the waiters first in line (a client served hands the next one
        // over, `release_at`, and skips those gone); in a short queue, every `SWEEP_EVERY`
        // ticks, or once the queue doubled since, at every channel, which bounds what
        // clients that left a stalled pool leave behind.
        g.ticks = g.ticks.wrapping_add(1);
        let len = g.waiters.len();
        let sweep = len <= SWEEP_FROM || g.ticks.is_multiple_of(SWEEP_EVERY) || len > 2 * g.swept_len.max(SWEEP_FROM);
        while g.waiters.front().is_some_and(|w| w.tx.is_closed()) {
            g.waiters.pop_front();
        }
        let expired = |w: &Waiter<K>| w.deadline.is_some_and(|d| d <= now);
        let doomed = |w: &Waiter<K>| expired(w) || (sweep && w.tx.is_closed());
        if g.waiters.iter().any(doomed) {
            let mut kept = VecDeque::with_capacity(g.waiters.len());
            for w in g.waiters.drain(..) {
                if sweep && w.tx.is_closed() {
                    continue;
                }
                if expired(&w) {
                    let _ = w.tx.send(Handoff::TimedOut);
                } else {
                    kept.push_back(w);
                }
            }
            g.waiters = kept;
        }
        if sweep {
            g.swept_len = g.waiters.len();
        }
        self.open_reserve(&mut g, now);
        let stuck = !g.waiters.is_empty() && self.has_room(&g) && !self.is_paused();
        drop(g);
        if stuck {
            // Waiting on a full database or user: make room as PgBouncer's janitor does.
            self.evict_for_room();
        }
    }

    /// (idle, open, waiting) counts.
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let g = self.lock();
        (g.idle.len(), g.open, g.waiters.len())
    }

    /// The server connect timeout, also used for the pooler's own short queries.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.cfg.load().server_connect_timeout()
    }

    /// Closes every idle connection (shutdown, `PAUSE`).
    pub(crate) fn close_idle(&self) {
        let mut g = self.lock();
        let n = g.idle.len();
        g.idle.clear();
        g.close_slots(n);
    }

    /// Whether `PAUSE`d: checkouts queue; connections coming back stay idle (the pauser
    /// closes them with `close_idle`). An auth_query pool is never paused.
    pub(crate) fn is_paused(&self) -> bool {
        self.key.purpose != PoolPurpose::AuthQuery && self.pauses.holds(&self.key.db)
    }

    /// After `RESUME`: unless still paused, idle connections go to the queued checkouts,
    /// and as many more as there are free slots are told to open one.
    pub(crate) fn resumed(&self) {
        let mut g = self.lock();
        if self.is_paused() {
            return;
        }
        let mut free = self.size().saturating_sub(g.open);
        while let Some(w) = g.waiters.pop_front() {
            if let Some(c) = g.idle.pop() {
                if let Err(Handoff::Conn(back)) = w.tx.send(Handoff::Conn(c)) {
                    g.idle.push(back);
                }
            } else if free > 0 {
                if w.tx.send(Handoff::SlotFreed).is_ok() {
                    free -= 1;
                }
            } else {
                g.waiters.push_front(w);
                break;
            }
        }
    }

    /// `RECONNECT`: every connection open now is closed instead of reused, the idle ones
    /// at once, the others as they come back.
    pub(crate) fn reconnect(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
        self.close_idle();
        self.wake_for_free_slots();
    }

    /// Tells as many queued checkouts as there are free slots to open a connection.
    fn wake_for_free_slots(&self) {
        let mut g = self.lock();
        if self.is_paused() {
            return;
        }
        let mut free = self.size().saturating_sub(g.open);
        while free > 0
            && let Some(w) = g.waiters.pop_front()
        {
            if w.tx.send(Handoff::SlotFreed).is_ok() {
                free -= 1;
            }
        }
    }

    /// Connections opened before the last `reconnect` still open (`WAIT_CLOSE`), counted
    /// by the caller's `live` list of their epochs; here, the current epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }
}
