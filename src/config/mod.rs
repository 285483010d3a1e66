//! Configuration: the TOML file and the command line, merged and validated into one typed
//! `Config` that the rest of the pooler receives as `Arc<Config>`, or while running as the
//! one `LiveConfig` handle a reload swaps (`live`). Every key is documented
//! in docs/configuration.md. This module reads files and nothing else: no sockets.

pub mod cli;
mod entries;
pub(crate) use entries::{KEYS, Reload, key};
mod peers;
pub use peers::{MAX_PEER_ID, PeerConfig};
mod hosts;
mod ini;
mod limits;
mod live;
mod load;
mod pgbouncer;
pub use hosts::{HostList, LoadBalanceHosts, TargetSessionAttrs};
pub use live::LiveConfig;
mod tls;
mod url;

pub use cli::Cli;
pub use tls::{ChannelBinding, ClientTlsMode, ServerTlsMode};
pub use url::DbUrl;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a client keeps a server connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// Until the client disconnects.
    Session,
    /// Until the transaction ends (ReadyForQuery 'I').
    Transaction,
    /// Until the statement ends; multi-statement transactions are refused.
    Statement,
}

impl PoolMode {
    /// The name as configured (and as PgBouncer's console shows it).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// How clients prove who they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthType {
    /// No password asked.
    Trust,
    /// Cleartext password.
    Password,
    /// MD5 challenge (SCRAM secrets cannot answer it; such users get SCRAM instead).
    Md5,
    /// SCRAM-SHA-256.
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// Per connection, by the first matching line of `auth_hba_file` (pg_hba.conf).
    Hba,
}

/// Output format of the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The whole configuration. Durations are in milliseconds in the file (`*_ms` keys).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Addresses to listen on: "host:port" for TCP, or an absolute path for a unix socket
    /// (a directory gets the PostgreSQL-style `.s.PGSQL.<port>` file inside it).
    pub listen: Vec<String>,
    /// Directory of the unix socket `.s.PGSQL.<port>` (port: the first TCP listen port), as
    /// PgBouncer's `unix_socket_dir`: "auto" (the default) is /var/run/postgresql when it is
    /// a writable directory (where Debian's psql looks), else /tmp; "" turns it off.
    pub unix_socket_dir: String,
    /// Permissions of the unix socket files, octal as in PgBouncer ("0777").
    pub unix_socket_mode: String,
    /// TCP listeners set SO_REUSEPORT: several parsnip processes may listen on one port
    /// and the kernel spreads new connections over them (docs/scaling.md).
    pub so_reuseport: bool,
    /// This instance's id among its `[peers]` (1..=`MAX_PEER_ID`), carried in the cancel
    /// keys it hands out so that a peer receiving a CancelRequest for one of its clients
    /// forwards it here; 0 turns peering off.
    pub peer_id: u16,
    /// Default pool mode.
    pub pool_mode: PoolMode,
    /// Server connections per (database, user) pool.
    pub pool_size: usize,
    /// Server connections kept open even when idle, per pool.
    pub min_pool_size: usize,
    /// Client connections accepted at once; beyond, 53300.
    pub max_client_conn: usize,
    /// Connections a pool may open beyond its size once a client has waited
    /// `reserve_pool_timeout_ms` (0: none).
    pub reserve_pool_size: usize,
    /// How long the first queued client waits before the reserve is used (0: never).
    pub reserve_pool_timeout_ms: u64,
    /// Server connections per database across its users (0: no limit).
    pub max_db_connections: usize,
    /// Server connections per user across databases (0: no limit).
    pub max_user_connections: usize,
    /// Client connections per database (0: no limit); beyond, 08P01.
    pub max_db_client_connections: usize,
    /// Client connections per user (0: no limit); beyond, 08P01.
    pub max_user_client_connections: usize,
    /// How clients authenticate.
    pub auth_type: AuthType,
    /// The pg_hba.conf file `auth_type = "hba"` decides by (re-read on reload).
    pub auth_hba_file: Option<String>,
    /// `auth_hba_file` as read (by `Config::read_hba`).
    #[serde(skip)]
    pub(crate) hba: Option<std::sync::Arc<crate::auth::hba::Hba>>,
    /// Query looking up (name, secret) for users not in `[users]`; `$1` is the user name.
    pub auth_query: Option<String>,
    /// User that runs `auth_query` (its password comes from `[users]` or the database entry).
    pub auth_user: Option<String>,
    /// Database `auth_query` runs in (default: the client's database).
    pub auth_dbname: Option<String>,
    /// Give up connecting to a server after this long.
    pub server_connect_timeout_ms: u64,
    /// Wait this long before retrying a failed server connect.
    pub server_login_retry_ms: u64,
    /// Connect attempts before the waiting client gets an error.
    pub server_connect_attempts: u32,
    /// A database with several hosts or a `target_session_attrs`: while no host suits, a
    /// client asking for a server waits this long while parsnip keeps looking, before it
    /// gets 08006 (0: `server_connect_attempts` as for any other database).
    pub failover_hold_ms: u64,
    /// A client waits at most this long for a free server connection (0 = forever).
    pub query_wait_timeout_ms: u64,
    /// Close server connections older than this when they come back to the pool (0 = never).
    pub server_lifetime_ms: u64,
    /// Close server connections idle in the pool longer than this (0 = never).
    pub server_idle_timeout_ms: u64,
    /// Close clients idle (not in a transaction) longer than this (0 = never).
    pub client_idle_timeout_ms: u64,
    /// Close clients idle inside a transaction longer than this (0 = never).
    pub idle_transaction_timeout_ms: u64,
    /// A client pinned to its server connection by session state (transaction pooling),
    /// idle outside a transaction this long, is closed with FATAL 57P05; 0: never.
    pub pinned_timeout_ms: u64,
    /// A client must finish logging in within this long.
    pub client_login_timeout_ms: u64,
    /// Largest message a client may send, in bytes.
    pub max_message_size: usize,
    /// Bytes of large messages held whole (not streamed) that all connections together may
    /// buffer at once; a message beyond it gets 53200 (docs/design.md "Memory").
    pub max_buffered_bytes: usize,
    /// Prepared-statement cache in transaction and statement modes (session mode passes
    /// statements through unchanged).
    pub prepared_statements: bool,
    /// Statements kept prepared on one server connection; beyond, the least recently used
    /// is closed.
    pub max_prepared_statements: usize,
    /// Statements one client may hold at once; one more gets an error (54000).
    pub max_client_prepared_statements: usize,
    /// Statements the cache of one pool remembers; beyond, unreferenced ones are dropped.
    pub max_cached_statements: usize,
    /// An unnamed statement whose text was seen this many times is served by a cached
    /// named server statement, skipping parse and plan (0 = never).
    pub promote_unnamed_after: u32,
    /// A statement Describe is answered from the description a server gave for the same
    /// cached statement, while no schema change was seen since (`stmt::epoch`). Off by
    /// default: DDL that does not go through parsnip is not seen.
    pub describe_from_cache: bool,
    /// A simple Query holding one data statement (SELECT, INSERT, UPDATE, DELETE, VALUES,
    /// WITH) outside a transaction block has its numeric literals lifted into parameters
    /// and runs as a cached statement once its lifted text was seen `autoprepare_after`
    /// times (`stmt::lift`).
    pub autoprepare: bool,
    /// Sightings of a lifted text before it is cached (0 = never).
    pub autoprepare_after: u32,
    /// The plan guard (`stmt::guard`): promoted and autoprepared texts run as the client
    /// sent them now and then, and are demoted when the cache is reliably slower.
    pub plan_guard: bool,
    /// One execution in this many runs as sent to keep the guard's baseline (at least 2).
    pub plan_guard_sample: u32,
    /// Cached executions must be this many times slower than the baseline to demote.
    pub plan_guard_ratio: f64,
    /// Statements per pool in the Prometheus metrics (the top ones by total time).
    pub stats_top_statements: usize,
    /// Batches in flight at once on one server connection when clients wait for one:
    /// another client's qualifying batch may be written behind the one whose replies are
    /// still coming (`driver::pipe`). 1 = one batch at a time (no pipelining).
    pub pipeline_depth: usize,
    /// A batch is pipelined behind only when each statement it runs recently took at
    /// most this long on a server (so a client queued behind it waits no longer).
    pub pipeline_max_statement_ms: f64,
    /// Query run on a server connection before it is reused after a session-mode client.
    pub server_reset_query: String,
    /// Session mode: a server connection to be closed (`RECONNECT`, a reload that changed
    /// its database) is closed at the end of its client's transaction, with the client.
    pub server_fast_close: bool,
    /// On SIGTERM, wait at most this long for transactions to finish.
    pub shutdown_timeout_ms: u64,
    /// A pool for a database reached through `[databases."*"]` is dropped once no client
    /// uses it and it has had no server connection for this long (PgBouncer's
    /// `autodb_idle_timeout`); 0 keeps them. Pools that never got a server connection (a
    /// database or user that does not exist) are dropped as soon as nothing uses them.
    pub autodb_idle_timeout_ms: u64,
    /// Certificate chain (PEM) parsnip shows its clients; with `client_tls_key_file`, turns
    /// TLS on for clients.
    pub client_tls_cert_file: Option<String>,
    /// Private key (PEM) of `client_tls_cert_file`.
    pub client_tls_key_file: Option<String>,
    /// TLS for clients: disable, allow, prefer, require. Default: prefer when a certificate
    /// is configured, else disable.
    pub client_tls_sslmode: Option<ClientTlsMode>,
    /// CA certificates (PEM) client certificates are checked against: asked for, and
    /// verified when shown (required under verify-ca / verify-full); hba's `cert`.
    pub client_tls_ca_file: Option<String>,
    /// TLS to servers, as libpq's sslmode: disable, allow, prefer (the default), require,
    /// verify-ca, verify-full.
    pub server_tls_sslmode: ServerTlsMode,
    /// CA certificates (PEM) a server's certificate must chain to (verify-ca, verify-full).
    pub server_tls_ca_file: Option<String>,
    /// Client certificate (PEM) parsnip shows servers that ask for one.
    pub server_tls_cert_file: Option<String>,
    /// Private key (PEM) of `server_tls_cert_file`.
    pub server_tls_key_file: Option<String>,
    /// SCRAM channel binding to servers, as libpq's channel_binding: disable, prefer (the
    /// default: SCRAM-SHA-256-PLUS when a server offers it over TLS), require.
    pub server_channel_binding: ChannelBinding,
    /// Users allowed on the admin console (database `parsnip`). Empty: anyone, but only
    /// when auth_type is trust.
    pub admin_users: Vec<String>,
    /// Users allowed on the console for its SHOW commands only (PgBouncer's stats_users).
    pub stats_users: Vec<String>,
    /// Seconds over which the console's averages (`SHOW STATS`'s avg_*) are taken.
    pub stats_period: u64,
    /// ADDR:PORT serving Prometheus `/metrics` and the `/ready` and `/live` probes over
    /// HTTP (None: off).
    pub metrics_listen: Option<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "parsnip=debug".
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// Databases clients can connect to; the key is the name clients use. The key "*" is a
    /// fallback: any other name goes to that server with the client's database name.
    pub databases: BTreeMap<String, DatabaseConfig>,
    /// Users and their secrets (plain, "md5…" or "SCRAM-SHA-256$…"), with per-user pool settings.
    pub users: BTreeMap<String, UserConfig>,
    /// The other parsnip instances cancel requests are forwarded to, by peer id (the
    /// table's key, "1".."1023"); an entry for this instance's own id is ignored.
    pub peers: BTreeMap<String, PeerConfig>,
    /// What reading the file left out (a pgbouncer.ini's settings parsnip ignores or, with
    /// `--lenient`, cannot honour), each "FILE:LINE: setting ...: why"; logged at start.
    #[serde(skip)]
    pub load_notes: Vec<String>,
}

/// One `[databases.NAME]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// Server host name or IP, or a directory holding the server's unix socket; or several
    /// (a list, or one string with commas), each optionally with its own `:port`.
    pub(crate) host: HostList,
    /// Server port (of the hosts that name none).
    pub(crate) port: u16,
    /// Which of the hosts new server connections go to (libpq's target_session_attrs).
    pub(crate) target_session_attrs: TargetSessionAttrs,
    /// Hosts tried in order (disable) or in a random order (random).
    pub(crate) load_balance_hosts: LoadBalanceHosts,
    /// Autocommit plain reads (simple Query) go to standbys whose replay lag is within
    /// `max_replica_lag_ms`; everything else to the primary (`driver::split`).
    pub(crate) read_write_split: bool,
    /// With `read_write_split`: reads go to standbys only while their replay lag, sampled
    /// about every half second, is at most this (default 1000).
    pub(crate) max_replica_lag_ms: Option<u64>,
    /// With `read_write_split`: a client's reads go to the primary for this long after it
    /// last used the primary (a write, a transaction; default 1000), so it reads its writes.
    pub(crate) read_your_writes_ms: Option<u64>,
    /// Database name on the server (default: the name clients use).
    pub(crate) dbname: Option<String>,
    /// Connect to the server as this user instead of the client's.
    pub(crate) user: Option<String>,
    /// Password for `user` (or for the client's user when `user` is unset).
    pub(crate) password: Option<String>,
    /// `failover_hold_ms` for this database (overrides the global one).
    pub(crate) failover_hold_ms: Option<u64>,
    /// Pool size for this database (overrides the global one).
    pub(crate) pool_size: Option<usize>,
    /// Pool mode for this database (overrides the global one).
    pub(crate) pool_mode: Option<PoolMode>,
    /// `autoprepare` for this database (overrides the global one).
    pub(crate) autoprepare: Option<bool>,
    /// `reserve_pool_size` for this database (overrides the global one; `reserve_pool`,
    /// PgBouncer's old name, is accepted).
    #[serde(alias = "reserve_pool")]
    pub(crate) reserve_pool_size: Option<usize>,
    /// `max_db_connections` for this database (overrides the global one).
    pub(crate) max_db_connections: Option<usize>,
    /// `max_db_client_connections` for this database (overrides the global one).
    pub(crate) max_db_client_connections: Option<usize>,
    /// Query run on each new server connection before any client uses it (errors are
    /// logged and otherwise ignored).
    pub(crate) connect_query: Option<String>,
    /// `pinned_timeout_ms` for this database (overrides the global one).
    pub(crate) pinned_timeout_ms: Option<u64>,
}

/// One `[users.NAME]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserConfig {
    /// Secret: plain text, "md5…" or PostgreSQL's "SCRAM-SHA-256$…"; also used to log in
    /// to the server as this user when it is plain text.
    pub(crate) password: Option<String>,
    /// Pool mode for this user (overrides database and global).
    pub(crate) pool_mode: Option<PoolMode>,
    /// Pool size for this user (overrides database and global).
    pub(crate) pool_size: Option<usize>,
    /// `autoprepare` for this user (overrides database and global).
    pub(crate) autoprepare: Option<bool>,
    /// `reserve_pool_size` for this user (overrides database and global).
    pub(crate) reserve_pool_size: Option<usize>,
    /// `max_user_connections` for this user (overrides the global one).
    pub(crate) max_user_connections: Option<usize>,
    /// `max_user_client_connections` for this user (overrides the global one).
    pub(crate) max_user_client_connections: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: vec!["127.0.0.1:6432".into()],
            unix_socket_dir: "auto".into(),
            unix_socket_mode: "0777".into(),
            so_reuseport: false,
            peer_id: 0,
            pool_mode: PoolMode::Transaction,
            pool_size: 20,
            min_pool_size: 0,
            max_client_conn: 10_000,
            reserve_pool_size: 0,
            reserve_pool_timeout_ms: 5_000,
            max_db_connections: 0,
            max_user_connections: 0,
            max_db_client_connections: 0,
            max_user_client_connections: 0,
            auth_type: AuthType::ScramSha256,
            auth_hba_file: None,
            hba: None,
            auth_query: None,
            auth_user: None,
            auth_dbname: None,
            server_connect_timeout_ms: 5_000,
            server_login_retry_ms: 500,
            server_connect_attempts: 3,
            failover_hold_ms: 30_000,
            query_wait_timeout_ms: 120_000,
            server_lifetime_ms: 3_600_000,
            server_idle_timeout_ms: 600_000,
            client_idle_timeout_ms: 0,
            idle_transaction_timeout_ms: 0,
            pinned_timeout_ms: 0,
            client_login_timeout_ms: 60_000,
            max_message_size: 256 * 1024 * 1024,
            max_buffered_bytes: 256 * 1024 * 1024,
            prepared_statements: true,
            max_prepared_statements: 500,
            max_client_prepared_statements: 10_000,
            max_cached_statements: 100_000,
            promote_unnamed_after: 3,
            describe_from_cache: false,
            autoprepare: false,
            autoprepare_after: 3,
            plan_guard: true,
            plan_guard_sample: 256,
            plan_guard_ratio: 1.5,
            stats_top_statements: 20,
            pipeline_depth: 8,
            pipeline_max_statement_ms: 2.0,
            server_reset_query: "DISCARD ALL".into(),
            server_fast_close: false,
            shutdown_timeout_ms: 30_000,
            autodb_idle_timeout_ms: 3_600_000,
            client_tls_cert_file: None,
            client_tls_key_file: None,
            client_tls_sslmode: None,
            client_tls_ca_file: None,
            server_tls_sslmode: ServerTlsMode::Prefer,
            server_tls_ca_file: None,
            server_tls_cert_file: None,
            server_tls_key_file: None,
            server_channel_binding: ChannelBinding::Prefer,
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            stats_period: 60,
            metrics_listen: None,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            databases: BTreeMap::new(),
            users: BTreeMap::new(),
            peers: BTreeMap::new(),
            load_notes: Vec::new(),
        }
    }
}

/// A configuration that cannot be used, with the reason.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// The default auth_query: PostgreSQL's stored secret for a user.
pub(crate) const DEFAULT_AUTH_QUERY: &str = "SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = $1";

fn ms(v: u64) -> Option<Duration> {
    (v > 0).then(|| Duration::from_millis(v))
}

impl DatabaseConfig {
    /// `max_replica_lag_ms`, defaulted.
    pub(crate) fn max_replica_lag_ms(&self) -> u64 {
        self.max_replica_lag_ms.unwrap_or(1000)
    }
    /// `read_your_writes_ms`, defaulted.
    pub(crate) fn read_your_writes_ms(&self) -> u64 {
        self.read_your_writes_ms.unwrap_or(1000)
    }
}

impl Config {
    /// Parses and validates TOML text.
    #[cfg(test)]
    pub(crate) fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// `unix_socket_mode` as permission bits.
    pub(crate) fn socket_mode(&self) -> Result<u32, ConfigError> {
        u32::from_str_radix(self.unix_socket_mode.trim_start_matches("0o"), 8).ok().filter(|m| *m <= 0o777).ok_or_else(
            || ConfigError(format!("unix_socket_mode: {:?} is not octal permissions", self.unix_socket_mode)),
        )
    }

    /// Checks cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError("listen: at least one address is needed".into()));
        }
        self.socket_mode()?;
        if self.pool_size == 0 {
            return Err(ConfigError("pool_size must be at least 1".into()));
        }
        if let Some(a) = &self.metrics_listen
            && a.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError(format!("metrics_listen: \"{a}\" is not an ADDR:PORT address")));
        }
        if self.stats_period == 0 {
            return Err(ConfigError("stats_period must be at least 1 (seconds)".into()));
        }
        if self.plan_guard_sample < 2 || self.plan_guard_ratio.is_nan() || self.plan_guard_ratio < 1.0 {
            return Err(ConfigError("plan_guard_sample must be at least 2 and plan_guard_ratio at least 1".into()));
        }
        if self.min_pool_size > self.pool_size {
            return Err(ConfigError("min_pool_size must not exceed pool_size".into()));
        }
        if self.max_message_size < 1024 {
            return Err(ConfigError("max_message_size must be at least 1024".into()));
        }
        if self.max_buffered_bytes < 1024 * 1024 {
            return Err(ConfigError("max_buffered_bytes must be at least 1048576".into()));
        }
        if self.databases.is_empty() {
            return Err(ConfigError("no [databases] entry: give a database URL or a databases table".into()));
        }
        for (name, db) in &self.databases {
            if db.host.is_empty() {
                return Err(ConfigError(format!("databases.{name}: host is required")));
            }
            if db.port == 0 && !db.host.all_have_ports() {
                return Err(ConfigError(format!("databases.{name}: port is required")));
            }
            db.host.endpoints(db.port).map_err(|e| ConfigError(format!("databases.{name}: {e}")))?;
            if db.read_your_writes_ms() > 600_000 {
                return Err(ConfigError(format!(
                    "databases.{name}: read_your_writes_ms is at most 600000 (10 minutes)"
                )));
            }
            if db.read_write_split
                && !matches!(db.target_session_attrs, TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary)
            {
                return Err(ConfigError(format!(
                    "databases.{name}: read_write_split needs target_session_attrs = \"read-write\" or \"primary\" \
                     (where everything but plain reads goes)"
                )));
            }
            if db.pool_size == Some(0) {
                return Err(ConfigError(format!("databases.{name}: pool_size must be at least 1")));
            }
        }
        if self.max_prepared_statements == 0 || self.max_client_prepared_statements == 0 {
            return Err(ConfigError(
                "max_prepared_statements and max_client_prepared_statements must be at least 1".into(),
            ));
        }
        if self.auth_type == AuthType::Hba && self.auth_hba_file.is_none() {
            return Err(ConfigError("auth_type \"hba\" needs auth_hba_file".into()));
        }
        if self.auth_user.is_some() && self.auth_query.is_none() {
            return Err(ConfigError("auth_user is set but auth_query is not".into()));
        }
        self.validate_peers()?;
        self.validate_tls()
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.client_tls_cert_file.is_some() != self.client_tls_key_file.is_some() {
            return Err(ConfigError("client_tls_cert_file and client_tls_key_file go together".into()));
        }
        if self.client_tls_cert_file.is_none() && self.client_tls_mode() != ClientTlsMode::Disable {
            return Err(ConfigError(
                "client_tls_sslmode other than disable needs client_tls_cert_file and client_tls_key_file".into(),
            ));
        }
        if self.client_tls_mode().verifies() && self.client_tls_ca_file.is_none() {
            return Err(ConfigError("client_tls_sslmode verify-ca and verify-full need client_tls_ca_file".into()));
        }
        if self.server_tls_cert_file.is_some() != self.server_tls_key_file.is_some() {
            return Err(ConfigError("server_tls_cert_file and server_tls_key_file go together".into()));
        }
        if self.server_tls_sslmode.verifies() && self.server_tls_ca_file.is_none() {
            return Err(ConfigError(
                "server_tls_sslmode verify-ca and verify-full need server_tls_ca_file (sslrootcert)".into(),
            ));
        }
        if self.server_channel_binding == ChannelBinding::Require && self.server_tls_sslmode == ServerTlsMode::Disable {
            return Err(ConfigError(
                "server_channel_binding require (channel_binding) needs TLS: server_tls_sslmode (sslmode) is disable"
                    .into(),
            ));
        }
        Ok(())
    }

    /// `client_tls_sslmode`, defaulted: prefer with a certificate, else disable.
    pub(crate) fn client_tls_mode(&self) -> ClientTlsMode {
        self.client_tls_sslmode.unwrap_or(if self.client_tls_cert_file.is_some() {
            ClientTlsMode::Prefer
        } else {
            ClientTlsMode::Disable
        })
    }

    /// The database entry clients reach with `name`, and the server database name.
    pub(crate) fn database(&self, name: &str) -> Option<(&DatabaseConfig, String)> {
        if let Some(db) = self.databases.get(name) {
            return Some((db, db.dbname.clone().unwrap_or_else(|| name.to_owned())));
        }
        self.databases.get("*").map(|db| (db, name.to_owned()))
    }

    /// Pool mode for a (database, user) pair: user, then database, then global.
    pub(crate) fn pool_mode_for(&self, db: &DatabaseConfig, user: &str) -> PoolMode {
        self.users.get(user).and_then(|u| u.pool_mode).or(db.pool_mode).unwrap_or(self.pool_mode)
    }

    /// The statement cache's settings for the pool of clients reaching database `db` as
    /// `user`: `autoprepare` from the user, then the database, then the global key.
    pub(crate) fn stmt_config_for(&self, db: &str, user: &str) -> crate::stmt::StmtConfig {
        let mut c = self.stmt_config();
        let per_db = self.database(db).and_then(|(d, _)| d.autoprepare);
        c.autoprepare = self.users.get(user).and_then(|u| u.autoprepare).or(per_db).unwrap_or(c.autoprepare);
        c
    }

    /// Pool size for a (database, user) pair: user, then database, then global.
    pub(crate) fn pool_size_for(&self, db: &DatabaseConfig, user: &str) -> usize {
        self.users.get(user).and_then(|u| u.pool_size).or(db.pool_size).unwrap_or(self.pool_size)
    }

    /// How long clients of database `db` (the name clients use) wait for a server of
    /// the role it needs (`failover_hold_ms`: the database's, else the global one).
    pub(crate) fn failover_hold(&self, db: &str) -> Duration {
        let per_db = self.database(db).and_then(|(d, _)| d.failover_hold_ms);
        Duration::from_millis(per_db.unwrap_or(self.failover_hold_ms))
    }

    /// Duration getters; `None` means disabled.
    /// `pipeline_max_statement_ms` in µs.
    pub(crate) fn pipeline_max_statement_us(&self) -> u32 {
        (self.pipeline_max_statement_ms.max(0.0) * 1000.0).min(u32::MAX as f64) as u32
    }

    pub(crate) fn autodb_idle_timeout(&self) -> Option<Duration> {
        ms(self.autodb_idle_timeout_ms)
    }
    /// See `query_wait_timeout_ms`.
    pub(crate) fn query_wait_timeout(&self) -> Option<Duration> {
        ms(self.query_wait_timeout_ms)
    }
    /// See `server_lifetime_ms`.
    pub(crate) fn server_lifetime(&self) -> Option<Duration> {
        ms(self.server_lifetime_ms)
    }
    /// See `server_idle_timeout_ms`.
    pub(crate) fn server_idle_timeout(&self) -> Option<Duration> {
        ms(self.server_idle_timeout_ms)
    }
    /// See `client_idle_timeout_ms`.
    pub(crate) fn client_idle_timeout(&self) -> Option<Duration> {
        ms(self.client_idle_timeout_ms)
    }
    /// `pinned_timeout_ms` for clients of database `db`: the database's, else the global
    /// one (None: off).
    pub(crate) fn pinned_timeout(&self, db: &str) -> Option<Duration> {
        let per_db = self.databases.get(db).or_else(|| self.databases.get("*")).and_then(|d| d.pinned_timeout_ms);
        ms(per_db.unwrap_or(self.pinned_timeout_ms))
    }
    /// See `idle_transaction_timeout_ms`.
    pub(crate) fn idle_transaction_timeout(&self) -> Option<Duration> {
        ms(self.idle_transaction_timeout_ms)
    }
    /// See `server_connect_timeout_ms` (never disabled).
    pub(crate) fn server_connect_timeout(&self) -> Duration {
        Duration::from_millis(self.server_connect_timeout_ms.max(1))
    }
    /// The statement cache limits.
    pub(crate) fn stmt_config(&self) -> crate::stmt::StmtConfig {
        crate::stmt::StmtConfig {
            server_cap: self.max_prepared_statements,
            client_cap: self.max_client_prepared_statements,
            registry_cap: self.max_cached_statements,
            promote_unnamed_after: self.promote_unnamed_after,
            describe_from_cache: self.describe_from_cache,
            autoprepare: self.autoprepare,
            autoprepare_after: self.autoprepare_after,
            guard: crate::stmt::guard::GuardConfig {
                sample_one_in: if self.plan_guard { self.plan_guard_sample } else { 0 },
                ratio: self.plan_guard_ratio,
            },
        }
    }
    /// See `client_login_timeout_ms` (never disabled).
    pub(crate) fn client_login_timeout(&self) -> Duration {
        Duration::from_millis(self.client_login_timeout_ms.max(1))
    }
}

#[cfg(test)]
mod tests;
