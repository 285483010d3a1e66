//! The async shell, and the only code that touches sockets, timers and signals: listeners,
//! one task per client (login, then the proxy loop), server connections, cancel
//! forwarding, the periodic pool janitor and shutdown. Protocol decisions are made by
//! `session`; this layer reads bytes, feeds frames in, and writes what comes out.

mod admin;
pub(crate) mod budget;
pub(crate) mod bufpool;
pub(crate) mod cancel;
pub(crate) mod census;
pub mod client;
mod hosts;
pub(crate) mod hunt;
mod ldap;
pub(crate) mod listen;
pub(crate) mod login;
mod metrics;
pub(crate) mod notify;
mod pam;
pub(crate) mod peers;
pub(crate) mod pipe;
mod proxy;
pub mod reload;
pub(crate) mod server_auth;
pub mod server_conn;
mod server_query;
pub mod servers;
pub(crate) mod shards;
pub(crate) mod split;
pub(crate) mod stream;
pub(crate) mod tls;
pub(crate) mod tls_config;

use crate::admin::ShutdownMode;
use crate::config::LiveConfig;
use crate::config::{Config, PoolMode};
use crate::error::{Error, SqlState};
use crate::login::Refusal;
use crate::pool::PoolKey;
use arc_swap::{ArcSwap, ArcSwapOption};
use cancel::CancelRegistry;
use listen::Listener;
use servers::ServerPool;
pub use shards::{Threads, default_loops};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stream::Stream;
use tokio::sync::{Semaphore, watch};

/// State shared by all connection tasks.
#[derive(Debug)]
pub struct Shared {
    /// The configuration in force, shared with every pool and connector (swapped whole,
    /// once, by a reload: `reload::apply`).
    pub(crate) cfg: LiveConfig,
    /// Pools by (database, user).
    pub(crate) pools: Mutex<HashMap<PoolKey, Arc<ServerPool>>>,
    /// Cancel keys.
    pub(crate) cancels: CancelRegistry,
    /// One permit per client connection.
    pub(crate) client_slots: Arc<Semaphore>,
    /// One permit per connection being refused beyond `max_client_conn` (`REFUSALS_AT_ONCE`).
    pub(crate) refusal_slots: Arc<Semaphore>,
    /// Becomes true when a graceful shutdown starts.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The same, read with one atomic load on every turn of a client's loop.
    pub(crate) stopping: AtomicBool,
    /// TLS for clients (None: no certificate configured).
    pub(crate) tls_clients: ArcSwapOption<tls_config::ClientTls>,
    /// TLS to servers.
    pub(crate) tls_servers: ArcSwap<tls_config::ServerTls>,
    /// The open server connections (`SHOW SERVERS`).
    pub(crate) census: Arc<census::Census>,
    /// What was learnt about servers' hosts (down, role), shared by every pool.
    pub(crate) hosts: Arc<crate::pool::hosts::HostMemory>,
    /// What `PAUSE` and `KILL` hold (SIGUSR1 too), read by every pool.
    pub(crate) pauses: Arc<crate::pool::Pauses>,
    /// Databases `DISABLE db` closed to new clients.
    pub(crate) disabled: Mutex<HashSet<String>>,
    /// Console connections open.
    pub(crate) consoles: AtomicUsize,
    /// Those connections, for `SHOW CLIENTS`.
    pub(crate) console_clients: Mutex<Vec<Arc<census::ConsoleClient>>>,
    /// What the console's `SHUTDOWN` asked for (`Handle::stop_requests`).
    pub(crate) stop_requests: watch::Sender<Option<ShutdownMode>>,
    /// How to re-read the configuration (`Handle::set_reloader`); unset: RELOAD fails.
    pub(crate) reloader: std::sync::OnceLock<reload::Reloader>,
    /// The event-loop threads clients run on (None: the runtime that called `start`).
    pub(crate) shards: Option<shards::Shards>,
    /// Bytes of large messages held whole, all connections together (`max_buffered_bytes`).
    pub(crate) budget: Arc<budget::Budget>,
    /// The connection limits per database and per user (`pool::limit`).
    pub(crate) caps: crate::pool::limit::Caps,
}

/// How the process should stop, as the console's `SHUTDOWN` asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `SHUTDOWN`: at once.
    Now,
    /// `SHUTDOWN WAIT_FOR_SERVERS`: as SIGTERM, transactions finish first.
    Graceful,
    /// `SHUTDOWN WAIT_FOR_CLIENTS`: stop accepting, wait for every client to leave.
    WaitForClients,
}

/// The console's `SHUTDOWN` requests (`Handle::stop_requests`).
pub struct StopRequests(watch::Receiver<Option<ShutdownMode>>);

impl StopRequests {
    /// Waits for the console's `SHUTDOWN`, and says how it asked to stop.
    pub async fn next(&mut self) -> Stop {
        let Ok(mode) = self.0.wait_for(Option::is_some).await else {
            return std::future::pending().await;
        };
        match *mode {
            Some(ShutdownMode::WaitForServers) => Stop::Graceful,
            Some(ShutdownMode::WaitForClients) => Stop::WaitForClients,
            _ => Stop::Now,
        }
    }
}

/// A running pooler.
pub struct Handle {
    /// Unix socket files bound.
    pub(crate) unix_paths: Vec<listen::SocketFile>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    stop_requests: watch::Receiver<Option<ShutdownMode>>,
    /// Each accept loop says here that it no longer takes clients (a stop waits for all).
    accepting: Vec<tokio::sync::oneshot::Receiver<()>>,
}

/// Binds every listen address and starts serving. Must run inside a tokio runtime, which
/// runs the listeners, the janitor and the metrics endpoint, and with `Threads::One` the
/// clients too; `Threads::PerCore(n)` starts n event-loop threads for the clients.
pub async fn start(cfg: Arc<Config>, threads: shards::Threads) -> std::io::Result<Handle> {
    let shards = match threads {
        shards::Threads::One => None,
        shards::Threads::PerCore(n) => Some(shards::Shards::start(n.max(1))?),
    };
    let (stop, shutdown) = watch::channel(false);
    let tls_clients = tls_config::for_clients(&cfg).map_err(std::io::Error::other)?;
    let tls_servers = Arc::new(tls_config::for_servers(&cfg).map_err(std::io::Error::other)?);
    let shared = Arc::new(Shared {
        cfg: LiveConfig::new(cfg.clone()),
        pools: Mutex::new(HashMap::new()),
        caps: Default::default(),
        cancels: CancelRegistry::new(cfg.peer_id),
        client_slots: Arc::new(Semaphore::new(cfg.max_client_conn)),
        refusal_slots: Arc::new(Semaphore::new(REFUSALS_AT_ONCE)),
        shutdown,
        stopping: AtomicBool::new(false),
        tls_clients: ArcSwapOption::new(tls_clients),
        tls_servers: ArcSwap::new(tls_servers),
        census: Arc::default(),
        hosts: Arc::default(),
        pauses: Arc::default(),
        disabled: Mutex::default(),
        consoles: AtomicUsize::new(0),
        console_clients: Mutex::default(),
        stop_requests: watch::Sender::new(None),
        reloader: std::sync::OnceLock::new(),
        shards,
        budget: Arc::default(),
    });
    let stop_requests = shared.stop_requests.subscribe();
    let metrics = match &cfg.metrics_listen {
        Some(a) => Some(
            metrics::bind(a).await.map_err(|e| std::io::Error::new(e.kind(), format!("metrics_listen {a}: {e}")))?,
        ),
        None => None,
    };
    let listeners = listen::bind_all(&cfg).await?;
    let unix_paths = listeners.iter().filter_map(|l| l.socket_file().cloned()).collect();
    let accepting = listeners
        .into_iter()
        .map(|l| {
            let (closed, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(accept_loop(l, shared.clone(), closed));
            rx
        })
        .collect();
    tokio::spawn(janitor(shared.clone()));
    if let Some(l) = metrics {
        tokio::spawn(metrics::serve(l, shared.clone()));
    }
    Ok(Handle { unix_paths, shared, stop, stop_requests, accepting })
}

/// The socket files go on every way out of the pooler: a graceful shutdown (at its start),
/// SIGINT, or an error return from `main`'s loop. (SIGKILL leaves them: the next start
/// replaces a file nothing listens on.)
impl Drop for Handle {
    fn drop(&mut self) {
        remove_socket_files(&mut self.unix_paths);
    }
}

fn remove_socket_files(paths: &mut Vec<listen::SocketFile>) {
    for f in paths.drain(..) {
        f.remove();
    }
}

impl Handle {
    /// Graceful shutdown: stop accepting, let transactions finish (at most
    /// `shutdown_timeout_ms`), close clients as they go idle. Returns when all are gone.
    pub async fn shutdown(self) {
        let t = Duration::from_millis(self.shared.cfg.load().shutdown_timeout_ms);
        self.stop(true, Some(t)).await;
    }

    /// `SHUTDOWN WAIT_FOR_CLIENTS`: stop accepting, and return when every client has left
    /// by itself.
    pub async fn shutdown_waiting_for_clients(self) {
        self.stop(false, None).await;
    }

    /// Stops accepting; with `close_idle_clients`, clients are closed as they go idle.
    /// Returns when all are gone (or `limit` has passed).
    async fn stop(mut self, close_idle_clients: bool, limit: Option<Duration>) {
        let _ = self.stop.send(true);
        if close_idle_clients {
            self.shared.stopping.store(true, Ordering::SeqCst);
            self.shared.cancels.kick_all();
        }
        // Every listener closed to clients (the connections queued on it accepted first,
        // each with its client slot: counted in the wait below), and new clients find no
        // socket file (but the one of the instance's own [peers] entry, still open for
        // cancels: removed on exit).
        for l in self.accepting.drain(..) {
            let _ = l.await;
        }
        let cfg = self.shared.cfg.load_full();
        self.unix_paths.retain(|f| {
            let keep = f.is_own_peer_address(&cfg);
            if !keep {
                f.remove();
            }
            keep
        });
        let all = self.shared.cfg.load().max_client_conn as u32;
        let wait = self.shared.client_slots.acquire_many(all);
        match limit {
            Some(t) => {
                if tokio::time::timeout(t, wait).await.is_err() {
                    tracing::warn!("shutdown timeout: closing remaining clients");
                }
            }
            None => drop(wait.await),
        }
        for p in self.shared.pools.lock().unwrap_or_else(|e| e.into_inner()).values() {
            p.close_idle();
        }
    }
}

impl Handle {
    /// Where the console's `SHUTDOWN` is heard.
    pub fn stop_requests(&self) -> StopRequests {
        StopRequests(self.stop_requests.clone())
    }

    /// SIGUSR1: PAUSE every pool (in the background: the pause completes as server
    /// connections come back).
    pub fn pause_all(&self) {
        self.shared.pause(None);
        let shared = self.shared.clone();
        tokio::spawn(async move { admin::wait_until_closed(&shared, None).await });
    }

    /// How RELOAD and SIGHUP re-read the configuration.
    pub fn set_reloader(&self, r: reload::Reloader) {
        let _ = self.shared.reloader.set(r);
    }

    /// SIGHUP: re-reads and applies the configuration (an invalid one changes nothing and
    /// is logged).
    pub fn reload(&self) {
        let _ = self.shared.reload();
    }

    /// SIGUSR2: RESUME.
    pub fn resume_all(&self) {
        if let Err(e) = self.shared.resume(None) {
            tracing::info!("SIGUSR2: {}", e.message);
        }
    }
}

async fn accept_loop(l: Listener, shared: Arc<Shared>, closed: tokio::sync::oneshot::Sender<()>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            r = accept(&l) => r,
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok(s) => admit(s, &shared),
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                // Out of file descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    if l.is_own_peer_address(&shared.cfg.load_full()).await {
        let _ = closed.send(());
        return cancels_only(l, shared).await;
    }
    // Stopping: what the kernel already queued on this listener is served rather than reset
    // by the close (under so_reuseport, another process takes the new connections).
    for s in listen::drain(l) {
        admit(s, &shared);
    }
    let _ = closed.send(());
}

/// A stopping instance's own `[peers]` address stays open until the process exits, for the
/// cancel requests its peers forward to its remaining clients (after an online restart,
/// every new connection, cancels included, reaches the new process first). Anything else
/// gets 57P03. No client slot is taken: a stop waits for those to come back.
async fn cancels_only(l: Listener, shared: Arc<Shared>) {
    tracing::info!("stopped accepting clients; this instance's [peers] address stays open for cancel requests");
    loop {
        match accept(&l).await {
            Ok(s) => {
                let shared = shared.clone();
                tokio::spawn(client::serve(s, shared, Some(Refusal::ShuttingDown), ()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Connections refused beyond `max_client_conn` that may be in their login at once. Each
/// is refused as PostgreSQL refuses it: its SSLRequest answered (and TLS started), its
/// startup packet read, then 53300, so that the client reads why (libpq reports an error
/// sent in place of the answer to its SSLRequest as "server sent an error response during
/// SSL exchange"); a CancelRequest is forwarded. Bounded like any login by
/// `client_login_timeout`, and in number by this: beyond it, 53300 is written at once.
const REFUSALS_AT_ONCE: usize = 256;

/// Serves an accepted connection in a task of its own, or refuses it (53300) beyond
/// `max_client_conn`.
fn admit(stream: Stream, shared: &Arc<Shared>) {
    match shared.client_slots.clone().try_acquire_owned() {
        Ok(permit) => match &shared.shards {
            Some(shards) => shards.spawn(stream, |s, leave| client::serve(s, shared.clone(), None, (permit, leave))),
            None => drop(tokio::spawn(client::serve(stream, shared.clone(), None, permit))),
        },
        Err(_) => match shared.refusal_slots.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(client::serve(stream, shared.clone(), Some(Refusal::TooManyClients), permit));
            }
            Err(_) => {
                tokio::spawn(async move {
                    let mut stream = stream;
                    let e = Error::fatal(SqlState::TOO_MANY_CONNECTIONS, "sorry, too many clients already");
                    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&e.to_bytes())).await;
                });
            }
        },
    }
}

async fn accept(l: &Listener) -> std::io::Result<Stream> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
        Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
    }
}

async fn janitor(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(janitor_period(&shared.cfg.load()));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unused_since: HashMap<PoolKey, std::time::Instant> = HashMap::new();
    let stats_period = Duration::from_secs(shared.cfg.load().stats_period);
    let mut period_start = std::time::Instant::now();
    let mut heap = HeapTrim::default();
    let mut promotions = shared.hosts.fences.promotions();
    let mut epochs: HashMap<PoolKey, u64> = HashMap::new();
    loop {
        tick.tick().await;
        if heap.burst_over(shared.client_slots.available_permits()) {
            trim_heap();
        }
        let pools: Vec<Arc<ServerPool>> =
            shared.pools.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let now = std::time::Instant::now();
        let roll = now.duration_since(period_start) >= stats_period;
        if roll {
            period_start = now;
        }
        // A promotion seen (`pool::fence`): the connections of pools that choose servers
        // by role are opened again as they come back, so that none stays on a server whose
        // role changed (a promoted standby's sessions in a standby pool, an old primary's
        // still open in a read-write one).
        let seen = shared.hosts.fences.promotions();
        if seen != promotions {
            promotions = seen;
            for p in pools.iter().filter(|p| p.connector().by_role()) {
                tracing::info!(db = %p.key.db, user = %p.key.user, "a promotion was seen: the pool's connections are opened again");
                p.reconnect();
            }
        }
        for p in pools {
            p.expire_waiters();
            let min = min_wanted(&shared, &p);
            p.prune(min);
            warm(&p, min);
            if roll {
                p.stats.roll_period(&p.stmts, now);
            }
        }
        reap_pools(&shared, &mut unused_since, std::time::Instant::now());
        shared.caps.prune();
        fast_close_check(&shared, &mut epochs);
    }
}

/// `min_pool_size`: what a pool keeps open, as PgBouncer does for a pool with a client
/// connected (here: a pool some client holds, beside the pool map and the janitor's list)
/// or of a database with a forced `user`; 0 for any other (so that `server_idle_timeout`
/// closes its connections and an unused pool can be dropped).
fn min_wanted(shared: &Shared, p: &Arc<ServerPool>) -> usize {
    let forced = || shared.cfg.load().database_entry(&p.key.db).is_some_and(|d| d.user.is_some());
    if Arc::strong_count(p) > 2 || forced() { p.min_size() } else { 0 }
}

/// Opens the connections a pool lacks of `min` (`min_wanted`).
fn warm(p: &Arc<ServerPool>, min: usize) {
    while p.warm_slot(min) {
        let p = p.clone();
        tokio::spawn(async move {
            if let Err(e) = p.warm().await {
                tracing::debug!(db = %p.key.db, user = %p.key.user, error = %e, "min_pool_size connect failed");
            }
        });
    }
}

/// `server_fast_close`: the clients of session-mode pools whose connections were marked to
/// close since the last tick (`RECONNECT`, a reload) look at their server now, as
/// PgBouncer's janitor closes such servers between transactions (`Proxy::fast_close`).
fn fast_close_check(shared: &Shared, epochs: &mut HashMap<PoolKey, u64>) {
    let pools: Vec<Arc<ServerPool>> = shared
        .pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .filter(|p| p.mode == PoolMode::Session)
        .cloned()
        .collect();
    epochs.retain(|k, _| pools.iter().any(|p| &p.key == k));
    // A pool first seen already reconnected counts as changed (its clients' servers may
    // predate that): a client whose server is current is left alone anyway.
    let changed: Vec<&Arc<ServerPool>> = pools
        .iter()
        .filter(|p| epochs.insert(p.key.clone(), p.epoch()).map_or(p.epoch() > 0, |e| e != p.epoch()))
        .collect();
    if changed.is_empty() || !shared.cfg.load().server_fast_close {
        return;
    }
    for slot in shared.cancels.clients() {
        if slot.pool().is_some_and(|p| changed.iter().any(|c| Arc::ptr_eq(c, &p))) {
            slot.recheck();
        }
    }
}

/// Gives the allocator's free memory back to the system once a burst of logins or logouts
/// is over (a tick with no change in the number of clients after ticks with some): the
/// buffers and login state of many clients in flight at once are freed afterwards but stay
/// in the process's heaps, between the clients that stayed, unless trimmed. Never during
/// a burst, nor under a steady churn of connections, where the memory is being reused.
#[derive(Default)]
struct HeapTrim {
    clients_free: usize,
    moved: bool,
}

impl HeapTrim {
    /// Called once a tick with the number of free client slots: true when it is time to trim.
    fn burst_over(&mut self, clients_free: usize) -> bool {
        if clients_free != self.clients_free {
            self.clients_free = clients_free;
            self.moved = true;
            return false;
        }
        std::mem::take(&mut self.moved)
    }
}

fn trim_heap() {
    let t0 = std::time::Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    tracing::debug!(took_us = t0.elapsed().as_micros() as u64, "heap trimmed after a burst of logins or logouts");
}

/// Drops the pools nothing uses: no client holds one (the map's reference is the only one),
/// no server connection is open or opening and nobody waits. One that never had a server
/// connection (a database or user name that does not exist: a stream of bad logins must
/// not grow memory) goes at once; one for a database reached through `[databases."*"]`
/// after `autodb_idle_timeout`; pools of configured databases stay (their counters too).
fn reap_pools(shared: &Shared, unused_since: &mut HashMap<PoolKey, std::time::Instant>, now: std::time::Instant) {
    let cfg = shared.cfg.load();
    let idle_limit = cfg.autodb_idle_timeout();
    let mut pools = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
    pools.retain(|key, p| {
        let unused = Arc::strong_count(p) == 1 && p.counts() == (0, 0, 0);
        if !unused {
            unused_since.remove(key);
            return true;
        }
        let since = *unused_since.entry(key.clone()).or_insert(now);
        let never_connected = p.stats.connects.load(Ordering::Relaxed) == 0;
        let auto_db = !cfg.databases.contains_key(&key.db);
        let reap = never_connected || (auto_db && idle_limit.is_some_and(|l| now.duration_since(since) >= l));
        if reap {
            tracing::debug!(db = %key.db, user = %key.user, never_connected, "unused pool dropped");
            unused_since.remove(key);
        }
        !reap
    });
}

/// How often the janitor runs: once a second, or often enough that a client waiting for
/// a server is failed at most a quarter of `query_wait_timeout` late.
fn janitor_period(cfg: &Config) -> Duration {
    let second = Duration::from_secs(1);
    let reserve = cfg.reserve_pool_timeout().filter(|_| cfg.reserve_pool_size > 0 || reserve_anywhere(cfg));
    [cfg.query_wait_timeout(), reserve]
        .into_iter()
        .flatten()
        .fold(second, |p, t| p.min((t / 4).max(Duration::from_millis(10))))
}

/// Whether a database or user entry has a reserve of its own.
fn reserve_anywhere(cfg: &Config) -> bool {
    cfg.databases.values().any(|d| d.reserve_pool_size.is_some_and(|n| n > 0))
        || cfg.users.values().any(|u| u.reserve_pool_size.is_some_and(|n| n > 0))
}

#[cfg(test)]
mod heap_trim {
    #[test]
    fn the_heap_is_trimmed_once_when_a_burst_is_over() {
        let mut h = super::HeapTrim { clients_free: 100, moved: false };
        assert!(!h.burst_over(100), "nothing happened");
        assert!(!h.burst_over(90), "logins under way");
        assert!(!h.burst_over(80));
        assert!(h.burst_over(80), "a quiet tick after the burst");
        assert!(!h.burst_over(80), "once");
        // A steady churn of connections: never (its memory is being reused).
        for n in [70, 71, 70, 72, 71] {
            assert!(!h.burst_over(n));
        }
        assert!(h.burst_over(71));
    }
}
