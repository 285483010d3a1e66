//! The driver's side of the pool (`crate::pool` is generic and does no IO): how server
//! connections are opened (`ServerConnector`, with the configured retries), given back
//! (`release`: a connection with a cancel on its way waits for it to land), and shared by
//! pipelining (`lend`, `retract_ticket`, `release_from_pipe`).

use super::pipe::Pipe;
use super::server_conn::{ConnectError, ServerConn, ServerTarget};
use crate::auth::Credentials;
use crate::config::LiveConfig;
use crate::error::{Error, SqlState};
use crate::pool::{Connecting, Connector, Pool, PoolKey, PoolPurpose, PoolStats, Pooled};
use crate::state::Settings;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A pool of server connections.
pub(crate) type ServerPool = Pool<ServerConnector>;

/// A pipelining ticket: a place behind other clients' batches on a shared connection.
pub(crate) type Ticket = (Arc<Pipe>, u32);

/// Opens one pool's server connections.
#[derive(Debug)]
pub struct ServerConnector {
    /// The pool's key (for logs).
    key: PoolKey,
    /// Where it connects (a reload may change it: `retarget`).
    target: Mutex<ServerTarget>,
    creds: Mutex<Credentials>,
    /// The configuration in force (shared with the driver: a reload swaps it there).
    cfg: LiveConfig,
    /// Where opened connections are listed (`SHOW SERVERS`).
    census: Arc<super::census::Census>,
    /// What was learnt about the database's hosts, shared by all pools.
    hosts: Arc<crate::pool::hosts::HostMemory>,
    /// A clients pool with `read_write_split`: its read pool and settings.
    split: std::sync::OnceLock<Arc<super::split::Split>>,
    /// A read pool: the clients pool it belongs to.
    primary: std::sync::OnceLock<std::sync::Weak<ServerPool>>,
    /// The pool's listening connection and its listeners (`notify`).
    notifier: std::sync::OnceLock<Arc<super::notify::Notifier>>,
    /// The search shared by the clients waiting for a server while none suits.
    hunt: super::hunt::Hunt,
    /// When a server closed one of this pool's connections last (`split::now_ms`; 0:
    /// not lately): for `SUSPECT_FOR` after, idle connections are checked before use.
    lost_at: std::sync::atomic::AtomicU64,
    /// Its clients' timeouts in milliseconds, looked up once per configuration generation
    /// (`Proxy::timeouts` reads them on every turn of a client's loop).
    pub(crate) timeouts: KeptTimeouts,
}

/// A pool's clients' timeouts (`session::Timeouts`), in milliseconds (0: off), each kept
/// for the configuration generation it was looked up in.
#[derive(Debug, Default)]
pub(crate) struct KeptTimeouts {
    /// Which of them are set (bits in field order): none, in the default configuration.
    pub(crate) set: crate::config::PerGeneration,
    pub(crate) client_idle: crate::config::PerGeneration,
    pub(crate) idle_in_transaction: crate::config::PerGeneration,
    pub(crate) pinned: crate::config::PerGeneration,
    pub(crate) query: crate::config::PerGeneration,
    pub(crate) transaction: crate::config::PerGeneration,
}

/// How long after a server closed one of a pool's connections its idle connections are
/// checked (one round trip) before a client gets one: a server going down closes them
/// all, but not all at the same instant.
const SUSPECT_FOR_MS: u64 = 1000;

impl ServerConnector {
    /// Connects to `target` with `creds` (attempts, retry pause and timeout from `cfg`).
    pub fn new(key: PoolKey, target: ServerTarget, creds: Credentials, cfg: impl Into<LiveConfig>) -> ServerConnector {
        ServerConnector {
            key,
            target: Mutex::new(target),
            creds: Mutex::new(creds),
            cfg: cfg.into(),
            census: Default::default(),
            hosts: Default::default(),
            split: Default::default(),
            primary: Default::default(),
            notifier: Default::default(),
            hunt: Default::default(),
            lost_at: Default::default(),
            timeouts: Default::default(),
        }
    }

    /// The pool's LISTEN fan-out (`notify`), made on first use.
    pub(crate) fn notifier(&self) -> &Arc<super::notify::Notifier> {
        self.notifier.get_or_init(Default::default)
    }

    /// The pool's LISTEN fan-out, if a client ever listened.
    pub(crate) fn notifier_if_any(&self) -> Option<&Arc<super::notify::Notifier>> {
        self.notifier.get()
    }

    /// A server closed one of this pool's connections.
    fn lost_one(&self) {
        self.lost_at.store(super::split::now_ms(), Ordering::Relaxed);
    }

    /// Whether a server closed one of this pool's connections lately (its idle ones may be
    /// dying too).
    pub(crate) fn suspect(&self) -> bool {
        let at = self.lost_at.load(Ordering::Relaxed);
        at != 0 && super::split::now_ms().saturating_sub(at) < SUSPECT_FOR_MS
    }

    /// Makes this clients pool's plain reads go to `split`'s read pool.
    pub(crate) fn set_split(&self, split: Arc<super::split::Split>) {
        let _ = self.split.set(split);
    }

    /// The read/write split of this clients pool, if it has one.
    pub(crate) fn split(&self) -> Option<&Arc<super::split::Split>> {
        self.split.get()
    }

    /// Makes this a read pool of `primary`.
    pub(crate) fn set_primary(&self, primary: &Arc<ServerPool>) {
        let _ = self.primary.set(Arc::downgrade(primary));
    }

    /// The clients pool of this read pool.
    pub(crate) fn primary(&self) -> Option<Arc<ServerPool>> {
        self.primary.get().and_then(std::sync::Weak::upgrade)
    }

    /// Whether its connections are chosen by role (`target_session_attrs` other than
    /// `any`): a promotion may have changed the role of the servers they are to.
    pub(crate) fn by_role(&self) -> bool {
        self.target.lock().unwrap_or_else(|e| e.into_inner()).attrs != crate::config::TargetSessionAttrs::Any
    }

    /// The database's hosts, in the order configured.
    pub(crate) fn hosts(&self) -> Arc<[(String, u16)]> {
        self.target.lock().unwrap_or_else(|e| e.into_inner()).hosts.clone()
    }

    /// Shares `hosts` (what was learnt about servers' hosts) with the other pools.
    pub(crate) fn with_host_memory(mut self, hosts: Arc<crate::pool::hosts::HostMemory>) -> ServerConnector {
        self.hosts = hosts;
        self
    }

    /// A reload: connect to `target` with `creds` from now on. True if the target or
    /// credentials changed (the pool's open connections should then go).
    pub(crate) fn retarget(&self, target: ServerTarget, creds: Option<Credentials>) -> bool {
        let mut t = self.target.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = !t.same_place(&target);
        *t = target;
        if let Some(new) = creds {
            let mut c = self.creds.lock().unwrap_or_else(|e| e.into_inner());
            changed |= *c != new;
            *c = new;
        }
        changed
    }

    /// Lists the connections it opens in `census`.
    pub(crate) fn with_census(mut self, census: Arc<super::census::Census>) -> ServerConnector {
        self.census = census;
        self
    }

    /// Takes `creds` if it has none (learnt from a client's login).
    pub(crate) fn offer_credentials(&self, creds: &Credentials) {
        let mut c = self.creds.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*c, Credentials::None) && !matches!(creds, Credentials::None) {
            *c = creds.clone();
        }
    }

    /// One connection to exactly `host`:`port`, outside the pool's count and census:
    /// `pg_cancel_backend` of a backend's pid must run on that backend's server, whatever
    /// host the pool would choose now.
    pub(crate) async fn connect_to(&self, host: &str, port: u16) -> Result<ServerConn, ConnectError> {
        let timeout = self.cfg.load().server_connect_timeout();
        let creds = self.creds.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut target = self.target.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (target.host, target.port) = (host.to_owned(), port);
        target.hosts = Arc::from([(host.to_owned(), port)]);
        target.attrs = crate::config::TargetSessionAttrs::Any;
        super::server_conn::connect(&target, &creds, timeout).await
    }

    /// How long a client waits for a server of the role this pool needs while none can be
    /// had: `failover_hold_ms` for a database with several hosts or a
    /// `target_session_attrs` (a failover may be under way); none for other databases and
    /// for a read pool (its reads go to the primary instead).
    fn hold(&self, cfg: &crate::config::Config, target: &ServerTarget) -> Duration {
        let failover_aware = target.hosts.len() > 1 || target.attrs != crate::config::TargetSessionAttrs::Any;
        if !failover_aware || self.key.purpose == crate::pool::PoolPurpose::Reads {
            return Duration::ZERO;
        }
        cfg.failover_hold(&self.key.db)
    }

    async fn connect_with_retries(&self, stats: &PoolStats) -> Result<Box<ServerConn>, Error> {
        let cfg = self.cfg.load_full();
        let hold = {
            let target = self.target.lock().unwrap_or_else(|e| e.into_inner());
            self.hold(&cfg, &target)
        };
        if !hold.is_zero() {
            return self.connect_holding(stats, hold).await.map_err(|e| e.to_error());
        }
        let attempts = cfg.server_connect_attempts.max(1);
        let mut attempt = 0u32;
        let last = loop {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(cfg.server_login_retry_ms)).await;
            }
            attempt += 1;
            match self.connect_once(stats).await {
                Ok(c) => return Ok(c),
                Err(e) => {
                    tracing::warn!(db = %self.key.db, user = %self.key.user, error = %e, "server connect failed");
                    if !retryable(&e) || attempt >= attempts {
                        break e;
                    }
                }
            }
        };
        Err(last.to_error())
    }

    /// The database's `connect_query`, on a connection just opened, before any client
    /// uses it: its errors are logged and otherwise ignored, as PgBouncer does (a
    /// transaction it leaves open is rolled back); a connection lost meanwhile is an error.
    async fn run_connect_query(&self, c: &mut ServerConn) -> Result<(), Error> {
        if self.key.purpose == PoolPurpose::AuthQuery {
            return Ok(());
        }
        let cfg = self.cfg.load_full();
        let Some(sql) = cfg.database_entry(&self.key.db).and_then(|d| d.connect_query.clone()) else {
            return Ok(());
        };
        let lost = || Error::fatal(SqlState::CONNECTION_FAILURE, "server connection lost while running connect_query");
        match c.run_checked(&sql, cfg.server_connect_timeout()).await {
            Ok(()) => {}
            Err(None) => return Err(lost()),
            Err(Some(frame)) => {
                let e = ConnectError::Server(frame).to_error();
                tracing::warn!(db = %self.key.db, user = %self.key.user, error = %e.message, "connect_query failed");
            }
        }
        if c.state.tx_status != crate::state::TxStatus::Idle {
            c.run_checked("ROLLBACK", cfg.server_connect_timeout()).await.map_err(|_| lost())?;
        }
        Ok(())
    }

    /// Connects, and while no host suits keeps trying for `hold` (`hunt`: one try at a
    /// time for the pool, backing off from milliseconds; the first success wakes every
    /// waiting client). The last error when the hold runs out.
    async fn connect_holding(&self, stats: &PoolStats, hold: Duration) -> Result<Box<ServerConn>, ConnectError> {
        let end = Instant::now() + hold;
        let mut found = self.hunt.watch();
        let mut last = match self.connect_once(stats).await {
            Ok(c) => return Ok(c),
            Err(e) if !retryable(&e) => return Err(e),
            Err(e) => e,
        };
        tracing::warn!(db = %self.key.db, user = %self.key.user, error = %last, hold_ms = hold.as_millis() as u64,
            "no server to be had: the client waits while parsnip keeps trying");
        loop {
            let turn = match self.hunt.next(&mut found, end).await {
                super::hunt::Next::Expired => break,
                super::hunt::Next::Now => None,
                super::hunt::Next::Try(g) => Some(g),
            };
            match self.connect_once(stats).await {
                Ok(c) => return Ok(c),
                Err(e) if !retryable(&e) => return Err(e),
                Err(e) => {
                    tracing::debug!(db = %self.key.db, user = %self.key.user, error = %e, "server connect failed");
                    last = e;
                }
            }
            drop(turn);
        }
        tracing::warn!(db = %self.key.db, user = %self.key.user, error = %last, "no server came within failover_hold_ms");
        Err(last)
    }

    /// One connect to a host that suits the target, counted in `stats`.
    async fn connect_once(&self, stats: &PoolStats) -> Result<Box<ServerConn>, ConnectError> {
        let timeout = self.cfg.load().server_connect_timeout();
        let creds = self.creds.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let target = self.target.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match super::hosts::connect(&target, &creds, timeout, &self.hosts).await {
            Ok(c) => {
                stats.connects.fetch_add(1, Ordering::Relaxed);
                self.census.add_server(&self.key, &c.cancel);
                let (db, user) = (&self.key.db, &self.key.user);
                tracing::debug!(db = %db, user = %user, pid = c.cancel.pid, "server connection opened");
                self.hunt.found();
                Ok(Box::new(c))
            }
            Err(e) => {
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

/// Whether a failed connect may succeed if tried again: no host of the right role (one
/// may be being promoted), a host down or starting up.
fn retryable(e: &ConnectError) -> bool {
    matches!(e, ConnectError::Io(_) | ConnectError::NoHost(_))
        || matches!(e, ConnectError::Server(_) if e.to_error().code == SqlState::CANNOT_CONNECT_NOW)
}

impl Connector for ServerConnector {
    type Conn = ServerConn;
    type Ticket = Ticket;

    fn connect<'a>(&'a self, stats: &'a PoolStats) -> Connecting<'a, ServerConn> {
        Box::pin(async move {
            let mut c = self.connect_with_retries(stats).await?;
            self.run_connect_query(&mut c).await?;
            Ok(c)
        })
    }
}

impl Pooled for ServerConn {
    fn is_healthy(&mut self) -> bool {
        ServerConn::is_healthy(self)
    }
    fn says_going_down(&self) -> bool {
        ServerConn::says_going_down(self)
    }
    fn created(&self) -> Instant {
        self.created
    }
    fn last_used(&self) -> Instant {
        self.last_used
    }
    fn touch(&mut self, now: Instant) {
        self.last_used = now;
    }
    fn startup_params(&self) -> &[(String, String)] {
        &self.params
    }
    fn settings(&self) -> &Settings {
        &self.state.settings
    }
    fn epoch(&self) -> u64 {
        self.cancel.info.epoch.load(Ordering::Relaxed)
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.cancel.info.epoch.store(epoch, Ordering::Relaxed);
    }
    fn home(&self) -> u16 {
        self.home
    }
}

/// Gives a client's connection back to `pool`. One with a cancel request on its way to its
/// backend is handed on only once that has landed (the next client's query would take it).
pub fn release(pool: &Arc<ServerPool>, mut conn: Box<ServerConn>, reusable: bool) {
    // Whatever path gave it back: a session arming a timer this short serves nobody else
    // (`state::timers`).
    let mut reusable = reusable && !conn.state.settings.arm_a_tiny_timer();
    if !reusable && conn.peer_closed() {
        pool.connector().lost_one();
    }
    if conn.cancel.signalled.swap(false, Ordering::AcqRel) {
        // Its signal may still be pending there: the next user absorbs it first, unless the
        // session there still arms a statement or lock timer, under which that absorbing
        // statement could leave a signal of its own: then it is closed.
        conn.state.cancel_risk = true;
        reusable &= conn.state.settings.cancel_timer_us() == 0;
    }
    let info = &conn.cancel.info;
    info.released_us.store(super::census::unix_us(), Ordering::Relaxed);
    info.prepared.store(conn.state.stmts.len() as u32, Ordering::Relaxed);
    // (The cancel first: the lifetime is looked at again when the connection goes back.)
    if reusable && conn.cancel.in_flight.load(Ordering::Acquire) > 0 && !pool.expired(&conn) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return pool.release(conn, false);
        };
        let pool = pool.clone();
        rt.spawn(async move {
            let settled = conn.cancel.wait_settled(Duration::from_secs(6)).await;
            pool.release_now(conn, settled);
        });
        return;
    }
    pool.release(conn, reusable);
}

/// An idle connection of a pool whose server closed another one lately (`suspect`),
/// checked with an empty query before a client gets it: None when it failed (it is
/// closed).
pub(crate) async fn checked(pool: &Arc<ServerPool>, mut conn: Box<ServerConn>) -> Option<Box<ServerConn>> {
    if conn.run_internal("", pool.connect_timeout()).await {
        return Some(conn);
    }
    tracing::debug!(db = %pool.key.db, "an idle server connection failed its check: closed");
    release(pool, conn, false);
    None
}

/// Returns a connection no ticket holds any more: closed if its pipe broke or bytes are
/// left unread in it (they would belong to nobody).
pub(crate) fn release_from_pipe(pool: &Arc<ServerPool>, c: Box<ServerConn>, dead: bool) {
    let clean = !dead && c.rbuf.is_empty() && c.streaming == 0;
    release(pool, c, clean);
}

/// Gives up ticket `t` on `p`, which never wrote: the writer is `back` again. The
/// connection comes back to the pool if no other ticket holds it.
pub(crate) fn retract_ticket(pool: &Arc<ServerPool>, p: &Pipe, t: u32, back: Option<u32>) {
    let mut g = p.lock();
    if let Some(c) = g.retract(t, back) {
        let dead = g.dead;
        drop(g);
        release_from_pipe(pool, c, dead);
    }
}

/// Leaves the pool's queue (the client gave up): a ticket handed over meanwhile is given
/// back.
pub(crate) fn abandon(pool: &Arc<ServerPool>, q: crate::pool::Queued<ServerConnector>) {
    if let Some((p, t)) = pool.abandon(q) {
        retract_ticket(pool, &p, t, None);
    }
}

/// Lets the first queued client write its batch on `pipe` behind the batches in flight
/// there (at most `depth` of them), taking the writer's role from ticket `from`. False
/// when nobody could take it (the writer stays `from`).
pub(crate) fn lend(pool: &Arc<ServerPool>, pipe: &Arc<Pipe>, from: u32, depth: usize) -> bool {
    let offered = pool.lend(|| {
        let mut p = pipe.lock();
        // A connection past its lifetime takes no more batches: it must come back to the
        // pool once to be closed.
        if !p.may_lend(from, depth) || p.conn.as_ref().is_none_or(|c| pool.expired(c)) {
            return None;
        }
        let t = p.add_ticket();
        // A cancel on its way now could land on the batch written behind. Checked after
        // `add_ticket` published that batches are queued (`CancelTarget::behind`): a cancel
        // counted in flight later sees it and signals the backend only once.
        if p.conn.as_ref().is_some_and(|c| c.cancel.in_flight.load(Ordering::SeqCst) > 0) {
            p.retract(t, Some(from));
            return None;
        }
        Some((pipe.clone(), t))
    });
    match offered {
        Ok(lent) => lent,
        Err((p, t)) => {
            // The waiter left meanwhile: the ticket is taken back before anyone used it.
            retract_ticket(pool, &p, t, Some(from));
            false
        }
    }
}
