//! The console's driver side: the connection loop around the sans-IO `admin::Console`,
//! the live `admin::View` over `Shared` (pools, the cancel registry's clients, the census's
//! server connections, the configuration), and the console commands carried out (PAUSE,
//! RESUME, RECONNECT, KILL, KILL_CLIENT, DISABLE, ENABLE, WAIT_CLOSE, SHUTDOWN). What a
//! command means is decided here and in `pool`; the console only parses and answers.

use super::Shared;
use super::census::unix_us;
use super::servers::ServerPool;
use super::stream::Stream;
use crate::admin::{
    ConfigRow, ConnRow, Console, ConsoleStep, DatabaseRow, FenceRow, PeerRow, StateChange, UserRow, View,
};
use crate::config::Config;
use crate::error::{Error, SqlState};
use crate::pool::{PoolPurpose, PoolSnapshot};
use bytes::BytesMut;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often PAUSE and WAIT_CLOSE look whether the connections they wait for are gone.
const POLL: Duration = Duration::from_millis(10);

/// Serves one console connection (after its login) to the end.
pub(crate) async fn serve(
    mut stream: Stream,
    mut buf: BytesMut,
    shared: &Arc<Shared>,
    read_only: bool,
    mut who: super::census::ConsoleClient,
) {
    shared.consoles.fetch_add(1, Ordering::Relaxed);
    // Listed in SHOW CLIENTS while it is served (ids above every client pid).
    who.id = (1 << 32) + NEXT_CONSOLE.fetch_add(1, Ordering::Relaxed);
    let id = who.id;
    shared.console_clients.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(who));
    let mut console = Console::new(read_only);
    loop {
        let step = console.handle_bytes(&mut buf, &Live(shared));
        if let ConsoleStep::Run(action) = &step {
            tracing::info!(?action, "console command");
            let res = run(action, shared).await;
            if let Err(e) = &res {
                tracing::info!(error = %e, "console command failed");
            }
            console.finished(res);
        }
        if !console.to_client.is_empty() {
            if stream.write_all(&console.to_client).await.is_err() {
                break;
            }
            console.to_client.clear();
        }
        match step {
            ConsoleStep::Close => break,
            ConsoleStep::Run(_) => continue,
            ConsoleStep::NeedBytes => {}
        }
        buf.reserve(1024);
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    shared.console_clients.lock().unwrap_or_else(|e| e.into_inner()).retain(|c| c.id != id);
    shared.consoles.fetch_sub(1, Ordering::Relaxed);
}

/// Console connections served so far (their `SHOW CLIENTS` ids).
static NEXT_CONSOLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The pools serving clients (read pools of a read/write split included), optionally only
/// those of database `db`.
fn pools_of(shared: &Shared, db: Option<&str>) -> Vec<Arc<ServerPool>> {
    let map = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
    map.values()
        .filter(|p| p.key.purpose != PoolPurpose::AuthQuery && db.is_none_or(|d| p.key.db == d))
        .cloned()
        .collect()
}

/// Whether `db` names a database the pooler serves (configured, or with a pool now).
fn known(shared: &Shared, db: &str) -> Result<(), Error> {
    if shared.cfg.load().databases.contains_key(db) || !pools_of(shared, Some(db)).is_empty() {
        Ok(())
    } else {
        Err(Error::new(SqlState::UNDEFINED_DATABASE, format!("no such database: {db}")))
    }
}

/// `known` for a command's optional database.
fn known_if_named(shared: &Shared, db: &Option<String>) -> Result<(), Error> {
    db.as_deref().map_or(Ok(()), |d| known(shared, d))
}

/// Carries out one console command; the tag PgBouncer answers with, or the error.
async fn run(change: &StateChange, shared: &Arc<Shared>) -> Result<&'static str, Error> {
    match change {
        StateChange::Pause(db) => {
            known_if_named(shared, db)?;
            shared.pause(db.as_deref());
            wait_until_closed(shared, db.as_deref()).await;
            Ok("PAUSE")
        }
        StateChange::Resume(db) => {
            shared.resume(db.as_deref())?;
            Ok("RESUME")
        }
        StateChange::Reconnect(db) => {
            known_if_named(shared, db)?;
            for p in pools_of(shared, db.as_deref()) {
                p.reconnect();
            }
            // After a schema change parsnip did not see (a migration run elsewhere):
            // descriptions are confirmed by a server again (`describe_from_cache`).
            crate::stmt::epoch::advance();
            Ok("RECONNECT")
        }
        StateChange::Kill(db) => {
            known_if_named(shared, db)?;
            shared.pause(db.as_deref());
            for slot in shared.cancels.clients() {
                if slot.info.get().is_some() && slot.pool().is_some_and(|p| db.as_ref().is_none_or(|d| p.key.db == *d))
                {
                    slot.kill();
                }
            }
            for p in pools_of(shared, db.as_deref()) {
                p.reconnect();
            }
            Ok("KILL")
        }
        StateChange::KillClient(id) => {
            let slot = shared.cancels.clients().into_iter().find(|s| s.pid as u64 == *id);
            match slot {
                Some(s) => {
                    s.kill();
                    Ok("KILL_CLIENT")
                }
                None => Err(Error::new(SqlState::UNDEFINED_OBJECT, format!("client {id} not found"))),
            }
        }
        StateChange::Disable(db) => {
            known(shared, db)?;
            shared.disabled.lock().unwrap_or_else(|e| e.into_inner()).insert(db.clone());
            Ok("DISABLE")
        }
        StateChange::Enable(db) => {
            known(shared, db)?;
            shared.disabled.lock().unwrap_or_else(|e| e.into_inner()).remove(db);
            Ok("ENABLE")
        }
        StateChange::WaitClose(db) => {
            known_if_named(shared, db)?;
            while outdated_servers(shared, db.as_deref()) > 0 {
                tokio::time::sleep(POLL).await;
            }
            Ok("WAIT_CLOSE")
        }
        StateChange::Shutdown(mode) => {
            shared.stop_requests.send_replace(Some(*mode));
            // SHUTDOWN without WAIT_*: the process exits before a reply could matter.
            Ok("SHUTDOWN")
        }
        StateChange::Unfence(db) => {
            known_if_named(shared, db)?;
            let hosts = db.as_deref().map(|d| {
                let cfg = shared.cfg.load();
                let mut hosts = cfg.database(d).map(|(c, _)| c.host.endpoints_or_skip(c.port)).unwrap_or_default();
                for p in pools_of(shared, Some(d)) {
                    hosts.extend(p.connector().hosts().iter().cloned());
                }
                hosts
            });
            let n = shared.hosts.fences.unfence(hosts.as_deref());
            tracing::info!(db = db.as_deref().unwrap_or("(all)"), hosts = n, "UNFENCE: fenced servers accepted again");
            Ok("UNFENCE")
        }
        StateChange::Reload => {
            shared.reload()?;
            Ok("RELOAD")
        }
        StateChange::Set(key, value) => {
            let mut cfg = Config::clone(&shared.cfg.load());
            cfg.set(key, value)?;
            shared.apply(Arc::new(cfg)).map_err(|why| Error::new(SqlState::INVALID_PARAMETER_VALUE, why))?;
            if let Some(r) = shared.reloader.get() {
                (r.applied)(&shared.cfg.load());
            }
            tracing::info!("SET {key} = {value:?}");
            Ok("SET")
        }
        StateChange::Suspend => Err(Error::new(
            SqlState::FEATURE_NOT_SUPPORTED,
            "SUSPEND is not supported: parsnip has no online restart by socket handover",
        )),
    }
}

/// PAUSE's wait: until every matching pool has no connection open (idle ones are closed
/// as they come back; clients in transactions finish them first).
pub(super) async fn wait_until_closed(shared: &Shared, db: Option<&str>) {
    loop {
        let mut open = 0;
        for p in pools_of(shared, db) {
            if !p.is_paused() {
                // RESUMEd meanwhile.
                return;
            }
            p.close_idle();
            open += p.counts().1;
        }
        if open == 0 {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Server connections RECONNECT marked (older than their pool's epoch) still open.
fn outdated_servers(shared: &Shared, db: Option<&str>) -> usize {
    let epochs: HashMap<_, u64> = pools_of(shared, db).iter().map(|p| (p.key.clone(), p.epoch())).collect();
    shared
        .census
        .servers()
        .iter()
        .filter(|(k, t)| epochs.get(k).is_some_and(|e| t.info.epoch.load(Ordering::Relaxed) < *e))
        .count()
}

impl Shared {
    /// PAUSE: the pools of `db` (all: None) hold their checkouts, and so will pools made
    /// for it later.
    pub(crate) fn pause(&self, db: Option<&str>) {
        self.pauses.pause(db);
    }

    /// RESUME: undoes PAUSE and KILL.
    pub(crate) fn resume(&self, db: Option<&str>) -> Result<(), Error> {
        self.pauses.resume(db)?;
        for p in pools_of(self, db) {
            p.resumed();
        }
        Ok(())
    }

    /// Whether clients of `db` are held by PAUSE or KILL.
    pub(crate) fn is_paused(&self, db: &str) -> bool {
        self.pauses.holds(db)
    }

    /// Whether DISABLE refuses new clients of `db`.
    pub(crate) fn is_disabled(&self, db: &str) -> bool {
        self.disabled.lock().unwrap_or_else(|e| e.into_inner()).contains(db)
    }
}

/// The running pooler as the console (and the metrics) read it.
pub(super) struct Live<'a>(pub(super) &'a Shared);

fn listen_port(cfg: &Config) -> i32 {
    cfg.listen.iter().find_map(|l| l.rsplit(':').next()?.parse().ok()).unwrap_or(6432)
}

impl Live<'_> {
    /// (addr, port, local_addr, local_port) of a connection's ends.
    fn addresses(&self, ends: &super::census::Endpoints) -> (String, i32, String, i32) {
        match ends.tcp() {
            Some((peer, local)) => {
                (peer.ip().to_string(), i32::from(peer.port()), local.ip().to_string(), i32::from(local.port()))
            }
            None => {
                let port = listen_port(&self.0.cfg.load());
                ("unix".into(), port, "unix".into(), port)
            }
        }
    }
}

impl Live<'_> {
    /// The console connections, as PgBouncer lists its own console's clients.
    fn console_rows(&self) -> Vec<ConnRow> {
        let consoles = self.0.console_clients.lock().unwrap_or_else(|e| e.into_inner()).clone();
        consoles
            .iter()
            .map(|c| {
                let (addr, port, local_addr, local_port) = self.addresses(&c.ends);
                ConnRow {
                    id: c.id,
                    database: c.db.clone(),
                    user: c.user.clone(),
                    state: "active",
                    addr,
                    port,
                    local_addr,
                    local_port,
                    connect_us: c.connected_us,
                    request_us: 0,
                    wait_us: 0,
                    link: None,
                    remote_pid: c.ends.peer_pid().unwrap_or(0),
                    tls: c.ends.tls.as_deref().unwrap_or("").into(),
                    application_name: c.application_name.clone(),
                    prepared: 0,
                    client_pid: 0,
                    close_needed: false,
                    pinned: String::new(),
                }
            })
            .collect()
    }
}

impl View for Live<'_> {
    fn pools(&self) -> Vec<PoolSnapshot> {
        // One row per (database, user), as PgBouncer: a read pool's figures are not in it.
        let mut v: Vec<_> = pools_of(self.0, None)
            .iter()
            .filter(|p| p.key.purpose == PoolPurpose::Clients)
            .map(|p| p.snapshot())
            .collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    fn clients(&self) -> Vec<ConnRow> {
        let now = unix_us();
        self.0
            .cancels
            .clients()
            .iter()
            .filter_map(|s| {
                let info = s.info.get()?;
                let pool = s.pool()?;
                let waiting_since = s.live.waiting_since_us.load(Ordering::Relaxed);
                let (addr, port, local_addr, local_port) = self.addresses(&info.ends);
                Some(ConnRow {
                    id: s.pid as u64,
                    database: pool.key.db.clone(),
                    user: pool.key.user.clone(),
                    state: if waiting_since > 0 { "waiting" } else { "active" },
                    addr,
                    port,
                    local_addr,
                    local_port,
                    connect_us: info.connected_us,
                    request_us: s.live.request_us.load(Ordering::Relaxed),
                    wait_us: if waiting_since > 0 { now.saturating_sub(waiting_since) } else { 0 },
                    link: s.linked_server().map(|id| ConnRow::ptr(true, id)),
                    remote_pid: info.ends.peer_pid().unwrap_or(0),
                    tls: info.ends.tls.as_deref().unwrap_or("").into(),
                    application_name: info.settings.reported("application_name").unwrap_or("").to_owned(),
                    prepared: s.live.prepared.load(Ordering::Relaxed),
                    client_pid: s.pid,
                    close_needed: false,
                    pinned: crate::stmt::pins::PinReasons(s.live.pinned.load(Ordering::Relaxed)).names(),
                })
            })
            .chain(self.console_rows())
            .collect()
    }

    fn servers(&self) -> Vec<ConnRow> {
        let epochs: HashMap<_, u64> = pools_of(self.0, None).iter().map(|p| (p.key.clone(), p.epoch())).collect();
        let mut rows: Vec<ConnRow> = self
            .0
            .census
            .servers()
            .iter()
            .filter(|(k, _)| k.purpose != PoolPurpose::AuthQuery)
            .map(|(k, t)| {
                let i = &t.info;
                let client = i.client.load(Ordering::Relaxed);
                let (addr, port, local_addr, local_port) = match i.ends.tcp() {
                    Some((peer, local)) => {
                        (peer.ip().to_string(), i32::from(peer.port()), local.ip().to_string(), i32::from(local.port()))
                    }
                    None => ("unix".into(), i32::from(t.port), "unix".into(), i32::from(t.port)),
                };
                ConnRow {
                    id: i.id,
                    database: k.db.clone(),
                    user: k.user.clone(),
                    state: if client != 0 { "active" } else { "idle" },
                    addr,
                    port,
                    local_addr,
                    local_port,
                    connect_us: i.connected_us,
                    request_us: i.released_us.load(Ordering::Relaxed),
                    wait_us: 0,
                    link: (client != 0).then(|| ConnRow::ptr(false, client as u64)),
                    remote_pid: t.pid,
                    tls: i.ends.tls.as_deref().unwrap_or("").into(),
                    application_name: String::new(),
                    prepared: i.prepared.load(Ordering::Relaxed),
                    client_pid: 0,
                    pinned: String::new(),
                    close_needed: epochs.get(k).is_some_and(|e| i.epoch.load(Ordering::Relaxed) < *e),
                }
            })
            .collect();
        rows.sort_by_key(|r| r.id);
        rows
    }

    fn databases(&self) -> Vec<DatabaseRow> {
        let cfg = self.0.cfg.load();
        let pools = pools_of(self.0, None);
        let mut names: BTreeMap<String, ()> =
            cfg.databases.keys().filter(|n| *n != "*").map(|n| (n.clone(), ())).collect();
        for p in &pools {
            names.insert(p.key.db.clone(), ());
        }
        let clients = self.0.cancels.clients();
        names
            .into_keys()
            .filter_map(|name| {
                let (db, server_db) = cfg.database(&name)?;
                // Its cap counts every pool's connections (read pools' too), as the limit does.
                let current = match self.0.caps.db_if_any(&name) {
                    Some(cap) => cap.open(),
                    None => pools.iter().filter(|p| p.key.db == name).map(|p| p.counts().1).sum(),
                };
                let client_count = clients.iter().filter(|s| s.pool().is_some_and(|p| p.key.db == name)).count();
                let (max_connections, max_client_connections) = cfg.db_limits(&name);
                Some(DatabaseRow {
                    host: db.host.joined(),
                    port: i32::from(db.port),
                    load_balance_hosts: db.load_balance_hosts.as_str().into(),
                    database: server_db,
                    force_user: db.user.clone().unwrap_or_default(),
                    pool_size: db.pool_size.unwrap_or(cfg.pool_size) as i32,
                    min_pool_size: cfg.min_pool_size_for(&name) as i32,
                    server_lifetime_s: (cfg.server_lifetime_ms_for(&name) / 1000) as i32,
                    pool_mode: db.pool_mode.unwrap_or(cfg.pool_mode).as_str().into(),
                    reserve_pool_size: db.reserve_pool_size.unwrap_or(cfg.reserve_pool_size) as i32,
                    max_connections: max_connections as i32,
                    current_connections: current as i32,
                    max_client_connections: max_client_connections as i32,
                    current_client_connections: client_count as i32,
                    paused: self.0.is_paused(&name),
                    disabled: self.0.is_disabled(&name),
                    name,
                })
            })
            .collect()
    }

    fn users(&self) -> Vec<UserRow> {
        let cfg = self.0.cfg.load();
        let pools = pools_of(self.0, None);
        let mut names: BTreeMap<String, ()> = cfg.users.keys().map(|n| (n.clone(), ())).collect();
        for p in &pools {
            names.insert(p.key.user.clone(), ());
        }
        let clients = self.0.cancels.clients();
        names
            .into_keys()
            .map(|name| {
                let u = cfg.users.get(&name);
                // As PgBouncer: server connections logged in as the user (a database's
                // forced user's included), clients that logged in as it.
                let current = match self.0.caps.user_if_any(&name) {
                    Some(cap) => cap.open(),
                    None => pools.iter().filter(|p| p.key.user == name).map(|p| p.counts().1).sum(),
                };
                let client_count = clients.iter().filter(|s| s.pool().is_some_and(|p| p.key.user == name)).count();
                let (max_user_connections, max_user_client_connections) = cfg.user_limits(&name);
                UserRow {
                    pool_size: u.and_then(|u| u.pool_size).map(|s| s as i32),
                    reserve_pool_size: u.and_then(|u| u.reserve_pool_size).map(|s| s as i32),
                    pool_mode: u.and_then(|u| u.pool_mode).map(|m| m.as_str().to_owned()),
                    max_user_connections: max_user_connections as i32,
                    current_connections: current as i32,
                    max_user_client_connections: max_user_client_connections as i32,
                    current_client_connections: client_count as i32,
                    name,
                }
            })
            .collect()
    }

    fn config(&self) -> Vec<ConfigRow> {
        let defaults: HashMap<_, _> = Config::default().entries().into_iter().collect();
        self.0
            .cfg
            .load()
            .entries()
            .into_iter()
            .map(|(key, value)| ConfigRow {
                key,
                value,
                default: defaults.get(key).cloned().unwrap_or_default(),
                changeable: crate::config::key(key).is_some_and(|k| k.settable()),
            })
            .collect()
    }

    fn paused(&self) -> bool {
        self.0.pauses.all()
    }

    fn console_clients(&self) -> usize {
        self.0.consoles.load(Ordering::Relaxed)
    }

    fn top_statements(&self) -> usize {
        self.0.cfg.load().stats_top_statements
    }

    fn fences(&self) -> Vec<FenceRow> {
        let fenced = self.0.hosts.fences.list();
        fenced
            .into_iter()
            .map(|f| FenceRow {
                host: f.host,
                port: i32::from(f.port),
                system_identifier: f.system_identifier,
                timeline: f.timeline as i32,
                newer_timeline: f.newest.timeline as i32,
                newer_server: format!("{}:{}", f.newest.host, f.newest.port),
                refusals: f.refusals as i64,
            })
            .collect()
    }

    fn peers(&self) -> Vec<PeerRow> {
        let cfg = self.0.cfg.load();
        let mut rows: Vec<PeerRow> = cfg
            .peers
            .iter()
            .map(|(id, p)| PeerRow { peer_id: id.parse().unwrap_or(0), host: p.host.clone(), port: i32::from(p.port) })
            .collect();
        rows.sort_by_key(|r| r.peer_id);
        rows
    }

    fn listeners(&self) -> Vec<crate::admin::ListenerRow> {
        let mut rows = Vec::new();
        for p in pools_of(self.0, None) {
            let Some(notifier) = p.connector().notifier_if_any() else { continue };
            for c in notifier.rows() {
                rows.push(crate::admin::ListenerRow {
                    database: p.key.db.to_string(),
                    user: p.key.user.to_string(),
                    channel: c.channel,
                    listeners: c.listeners,
                    listened: c.listened,
                    received: c.received,
                });
            }
        }
        rows.sort_by(|a, b| (&a.database, &a.user, &a.channel).cmp(&(&b.database, &b.user, &b.channel)));
        rows
    }
}
