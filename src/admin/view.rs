//! What the console reads of the running pooler, as plain rows: the `View` trait the driver
//! implements over its live state (a test implements it over fixed rows). The console
//! never holds a pool or a socket, only these.

use crate::pool::PoolSnapshot;

/// One client or server connection, as `SHOW CLIENTS` and `SHOW SERVERS` list it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConnRow {
    /// Its unique id (`KILL_CLIENT` takes a client's).
    pub(crate) id: u64,
    /// Database and user names.
    pub(crate) database: String,
    pub(crate) user: String,
    /// PgBouncer's state name (active, idle, waiting, used, ...).
    pub(crate) state: &'static str,
    /// Peer address and port (a unix socket: "unix" and parsnip's port).
    pub(crate) addr: String,
    pub(crate) port: i32,
    /// Local address and port.
    pub(crate) local_addr: String,
    pub(crate) local_port: i32,
    /// When it connected, and its latest request (µs since the epoch; 0: none).
    pub(crate) connect_us: u64,
    pub(crate) request_us: u64,
    /// How long it has been waiting for a server (µs), 0 when not waiting.
    pub(crate) wait_us: u64,
    /// The connection it is linked to (its `ptr`), if any.
    pub(crate) link: Option<String>,
    /// A server's backend pid; a unix-socket client's process id; else 0.
    pub(crate) remote_pid: i32,
    /// The TLS in use, empty for none.
    pub(crate) tls: String,
    /// application_name (clients).
    pub(crate) application_name: String,
    /// Prepared statements it holds.
    pub(crate) prepared: u32,
    /// The pid parsnip gave the client (its cancel key's first half); servers: 0.
    pub(crate) client_pid: i32,
    /// A server's RECONNECT generation is older than its pool's: it closes when released.
    pub(crate) close_needed: bool,
    /// Why a client is pinned to its server connection by session state (transaction
    /// pooling): `PinReasons::names`, empty when it is not.
    pub(crate) pinned: String,
}

impl ConnRow {
    /// The `ptr` shown for a client (`server`: false) or server connection with this id.
    pub(crate) fn ptr(server: bool, id: u64) -> String {
        format!("{:#x}", if server { 0x5e00_0000_0000 } else { 0xc100_0000_0000 } | id)
    }
}

/// One configured database (or one reached through `[databases."*"]`), for `SHOW DATABASES`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DatabaseRow {
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) port: i32,
    /// The server's database name.
    pub(crate) database: String,
    pub(crate) force_user: String,
    pub(crate) pool_size: i32,
    pub(crate) min_pool_size: i32,
    pub(crate) server_lifetime_s: i32,
    pub(crate) pool_mode: String,
    /// The order its hosts are tried in (disable, random).
    pub(crate) load_balance_hosts: String,
    /// Its `reserve_pool_size`.
    pub(crate) reserve_pool_size: i32,
    /// `max_db_connections` (0: no limit) and the server connections it has.
    pub(crate) max_connections: i32,
    pub(crate) current_connections: i32,
    /// `max_db_client_connections` (0: no limit) and the clients it has.
    pub(crate) max_client_connections: i32,
    pub(crate) current_client_connections: i32,
    pub(crate) paused: bool,
    pub(crate) disabled: bool,
}

/// One user, for `SHOW USERS`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct UserRow {
    pub(crate) name: String,
    pub(crate) pool_size: Option<i32>,
    /// Its own `reserve_pool_size`, if its entry sets one.
    pub(crate) reserve_pool_size: Option<i32>,
    pub(crate) pool_mode: Option<String>,
    /// `max_user_connections` (0: no limit) and the server connections logged in as it.
    pub(crate) max_user_connections: i32,
    pub(crate) current_connections: i32,
    /// `max_user_client_connections` (0: no limit) and the clients logged in as it.
    pub(crate) max_user_client_connections: i32,
    pub(crate) current_client_connections: i32,
}

/// One setting, for `SHOW CONFIG`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConfigRow {
    pub(crate) key: &'static str,
    pub(crate) value: String,
    pub(crate) default: String,
    pub(crate) changeable: bool,
}

/// One `[peers]` entry, for `SHOW PEERS`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerRow {
    pub(crate) peer_id: i32,
    pub(crate) host: String,
    pub(crate) port: i32,
}

/// One LISTEN channel of a pool, as `SHOW LISTENERS` lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ListenerRow {
    pub(crate) database: String,
    pub(crate) user: String,
    /// The channel name (as the server has it; not UTF-8: lossy).
    pub(crate) channel: String,
    /// Clients listening on it.
    pub(crate) listeners: usize,
    /// The pool's listening connection has run LISTEN on it.
    pub(crate) listened: bool,
    /// Notifications the listening connection received on it.
    pub(crate) received: u64,
}

/// A server refused as a primary (`pool::fence`), for `SHOW FENCES`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FenceRow {
    pub(crate) host: String,
    pub(crate) port: i32,
    pub(crate) system_identifier: String,
    /// The timeline it claimed read-write on.
    pub(crate) timeline: i32,
    /// The newer timeline seen, and the server it was seen on (`host:port`).
    pub(crate) newer_timeline: i32,
    pub(crate) newer_server: String,
    /// Times it was refused.
    pub(crate) refusals: i64,
}

/// The running pooler, read by the console.
pub(crate) trait View {
    /// The client pools, sorted by key.
    fn pools(&self) -> Vec<PoolSnapshot>;
    /// Every client connection, the console's included (database `pgbouncer` or `parsnip`).
    fn clients(&self) -> Vec<ConnRow>;
    /// The open server connections, by id.
    fn servers(&self) -> Vec<ConnRow>;
    /// The databases, by name.
    fn databases(&self) -> Vec<DatabaseRow>;
    /// The users, by name.
    fn users(&self) -> Vec<UserRow>;
    /// The settings.
    fn config(&self) -> Vec<ConfigRow>;
    /// Whether every pool is paused (`PAUSE` without a database, SIGUSR1).
    fn paused(&self) -> bool;
    /// Console connections open now.
    fn console_clients(&self) -> usize;
    /// Statements per pool the metrics list (`stats_top_statements`).
    fn top_statements(&self) -> usize {
        20
    }
    /// The other instances cancel requests are forwarded to (`[peers]`), by id.
    fn peers(&self) -> Vec<PeerRow> {
        Vec::new()
    }
    /// The LISTEN channels of every pool (`driver::notify`), by pool and channel.
    fn listeners(&self) -> Vec<ListenerRow> {
        Vec::new()
    }
    /// The servers refused as primaries, by host and port.
    fn fences(&self) -> Vec<FenceRow> {
        Vec::new()
    }
}
