//! The async shell, and the only code that touches sockets, timers and signals: listeners,
//! one task per client (login, then the proxy loop), server connections, cancel
//! forwarding, the periodic pool janitor and shutdown. Protocol decisions are made by
//! `session`; this layer reads bytes, feeds frames in, and writes what comes out.

pub(crate) mod bufpool;
pub(crate) mod cancel;
pub mod client;
pub(crate) mod listen;
pub(crate) mod login;
pub(crate) mod pipe;
mod proxy;
pub mod server_conn;
pub mod servers;
pub(crate) mod stream;
pub(crate) mod tls;
pub(crate) mod tls_config;

use crate::config::Config;
use crate::error::{Error, SqlState};
use crate::pool::PoolKey;
use cancel::CancelRegistry;
use listen::Listener;
use servers::ServerPool;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stream::Stream;
use tokio::sync::{Semaphore, watch};

/// State shared by all connection tasks.
#[derive(Debug)]
pub struct Shared {
    /// The configuration.
    pub(crate) cfg: Arc<Config>,
    /// Pools by (database, user).
    pub(crate) pools: Mutex<HashMap<PoolKey, Arc<ServerPool>>>,
    /// Cancel keys.
    pub(crate) cancels: CancelRegistry,
    /// One permit per client connection.
    pub(crate) client_slots: Arc<Semaphore>,
    /// Becomes true when a graceful shutdown starts.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The same, read with one atomic load on every turn of a client's loop.
    pub(crate) stopping: AtomicBool,
    /// TLS for clients (None: no certificate configured).
    pub(crate) tls_clients: Option<Arc<rustls::ServerConfig>>,
    /// TLS to servers.
    pub(crate) tls_servers: Arc<tls_config::ServerTls>,
}

/// A running pooler.
pub struct Handle {
    /// Unix socket paths bound.
    pub(crate) unix_paths: Vec<std::path::PathBuf>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

/// Binds every listen address and starts serving. Must run inside a tokio runtime.
pub async fn start(cfg: Arc<Config>) -> std::io::Result<Handle> {
    let (stop, shutdown) = watch::channel(false);
    let tls_clients = tls_config::for_clients(&cfg).map_err(std::io::Error::other)?;
    let tls_servers = Arc::new(tls_config::for_servers(&cfg).map_err(std::io::Error::other)?);
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        pools: Mutex::new(HashMap::new()),
        cancels: CancelRegistry::default(),
        client_slots: Arc::new(Semaphore::new(cfg.max_client_conn)),
        shutdown,
        stopping: AtomicBool::new(false),
        tls_clients,
        tls_servers,
    });
    let listeners = listen::bind_all(&cfg).await?;
    let unix_paths = listeners.iter().filter_map(|l| l.path().map(Path::to_path_buf)).collect();
    for l in listeners {
        tokio::spawn(accept_loop(l, shared.clone()));
    }
    tokio::spawn(janitor(shared.clone()));
    Ok(Handle { unix_paths, shared, stop })
}

/// The socket files go on every way out of the pooler: a graceful shutdown (at its start),
/// SIGINT, or an error return from `main`'s loop. (SIGKILL leaves them: the next start
/// replaces a file nothing listens on.)
impl Drop for Handle {
    fn drop(&mut self) {
        remove_socket_files(&mut self.unix_paths);
    }
}

fn remove_socket_files(paths: &mut Vec<std::path::PathBuf>) {
    for p in paths.drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

impl Handle {
    /// Graceful shutdown: stop accepting, let transactions finish (at most
    /// `shutdown_timeout_ms`), close clients as they go idle. Returns when all are gone.
    pub async fn shutdown(mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.stop.send(true);
        // New clients find no socket from now on.
        remove_socket_files(&mut self.unix_paths);
        let all = self.shared.cfg.max_client_conn as u32;
        let wait = self.shared.client_slots.acquire_many(all);
        let t = Duration::from_millis(self.shared.cfg.shutdown_timeout_ms);
        if tokio::time::timeout(t, wait).await.is_err() {
            tracing::warn!("shutdown timeout: closing remaining clients");
        }
        for p in self.shared.pools.lock().unwrap_or_else(|e| e.into_inner()).values() {
            p.close_idle();
        }
    }
}

async fn accept_loop(l: Listener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            r = accept(&l) => r,
            _ = shutdown.changed() => break,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                // Out of file descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match shared.client_slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    client::serve(stream, shared).await;
                    drop(permit);
                });
            }
            Err(_) => {
                tokio::spawn(async move {
                    let mut stream = stream;
                    let e = Error::fatal(SqlState::TOO_MANY_CONNECTIONS, "sorry, too many clients already");
                    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&e.to_bytes())).await;
                });
            }
        }
    }
}

async fn accept(l: &Listener) -> std::io::Result<Stream> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
        Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
    }
}

async fn janitor(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(janitor_period(&shared.cfg));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unused_since: HashMap<PoolKey, std::time::Instant> = HashMap::new();
    loop {
        tick.tick().await;
        let pools: Vec<Arc<ServerPool>> =
            shared.pools.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for p in pools {
            p.expire_waiters();
            p.prune();
        }
        reap_pools(&shared, &mut unused_since, std::time::Instant::now());
    }
}

/// Drops the pools nothing uses: no client holds one (the map's reference is the only one),
/// no server connection is open or opening and nobody waits. One that never had a server
/// connection (a database or user name that does not exist: a stream of bad logins must
/// not grow memory) goes at once; one for a database reached through `[databases."*"]`
/// after `autodb_idle_timeout`; pools of configured databases stay (their counters too).
fn reap_pools(shared: &Shared, unused_since: &mut HashMap<PoolKey, std::time::Instant>, now: std::time::Instant) {
    let idle_limit = shared.cfg.autodb_idle_timeout();
    let mut pools = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
    pools.retain(|key, p| {
        let unused = Arc::strong_count(p) == 1 && p.counts() == (0, 0, 0);
        if !unused {
            unused_since.remove(key);
            return true;
        }
        let since = *unused_since.entry(key.clone()).or_insert(now);
        let never_connected = p.stats.connects.load(Ordering::Relaxed) == 0;
        let auto_db = !shared.cfg.databases.contains_key(&key.db);
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
    cfg.query_wait_timeout().map_or(second, |t| (t / 4).clamp(Duration::from_millis(10), second))
}
