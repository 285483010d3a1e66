//! The `Config` struct: every global setting with its documentation and its default
//! (docs/configuration.md lists them in the same words).

use super::{
    AuthType, ChannelBinding, ClientTlsMode, DatabaseConfig, LogFormat, PeerConfig, PoolMode, ServerTlsMode, UserConfig,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Group of the unix socket files, a name or a number (PgBouncer's; "": the process's).
    pub unix_socket_group: String,
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
    /// The user name maps (pg_ident.conf) hba's `map=` on cert and peer lines name (read
    /// with `auth_hba_file`, re-read on reload).
    pub auth_ident_file: Option<String>,
    /// `auth_ident_file` as read (by `Config::read_hba`).
    #[serde(skip)]
    pub(crate) ident: Option<std::sync::Arc<crate::auth::ident::IdentMap>>,
    /// Query looking up (name, secret) for users not in `[users]`; `$1` is the user name.
    pub auth_query: Option<String>,
    /// User that runs `auth_query` (its password comes from `[users]` or the database entry).
    pub auth_user: Option<String>,
    /// Database `auth_query` runs in (default: the client's database).
    pub auth_dbname: Option<String>,
    /// The LDAP options of `auth_type = "ldap"` (PostgreSQL's pg_hba.conf ones, written
    /// as there: `auth::ldap`).
    pub auth_ldap_options: Option<String>,
    /// The CA certificates an LDAP server's certificate is verified against (`ldaptls=1`,
    /// `ldaps`); None: the system's trust store.
    pub auth_ldap_tls_ca_file: Option<String>,
    /// `auth_ldap_options` as read (by `Config::read_hba`).
    #[serde(skip)]
    pub(crate) ldap: Option<std::sync::Arc<crate::auth::ldap::LdapOptions>>,
    /// The PAM service of `auth_type = "pam"` (and of hba `pam` lines without
    /// `pamservice=`).
    pub auth_pam_service: String,
    /// Where PAM reads its service files (empty: the system's, /etc/pam.d): for services
    /// kept outside /etc/pam.d.
    pub auth_pam_config_dir: String,
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
    /// Close clients (and their server connection) whose query has run longer than this,
    /// timed from the client's last message (PgBouncer's query_timeout; 0 = never).
    pub query_timeout_ms: u64,
    /// Close clients (and their server connection) whose transaction, or statement outside
    /// one, has held its server longer than this, timed from its first request (PgBouncer's
    /// transaction_timeout; 0 = never).
    pub transaction_timeout_ms: u64,
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
    /// A lone BEGIN from a client with no server (transaction pooling) is answered by the
    /// pooler and sent with the transaction's first statement (`session::begin`): the
    /// transaction costs one server round trip less, and holds no server until it runs
    /// something.
    pub defer_begin: bool,
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

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: vec!["127.0.0.1:6432".into()],
            unix_socket_dir: "auto".into(),
            unix_socket_mode: "0777".into(),
            unix_socket_group: String::new(),
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
            auth_ident_file: None,
            ident: None,
            auth_query: None,
            auth_user: None,
            auth_dbname: None,
            auth_ldap_options: None,
            auth_ldap_tls_ca_file: None,
            ldap: None,
            auth_pam_service: "pgbouncer".into(),
            auth_pam_config_dir: String::new(),
            server_connect_timeout_ms: 5_000,
            server_login_retry_ms: 500,
            server_connect_attempts: 3,
            failover_hold_ms: 30_000,
            query_wait_timeout_ms: 120_000,
            server_lifetime_ms: 3_600_000,
            server_idle_timeout_ms: 600_000,
            client_idle_timeout_ms: 0,
            idle_transaction_timeout_ms: 0,
            query_timeout_ms: 0,
            transaction_timeout_ms: 0,
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
            autoprepare: true,
            autoprepare_after: 3,
            plan_guard: true,
            plan_guard_sample: 256,
            plan_guard_ratio: 1.5,
            stats_top_statements: 20,
            pipeline_depth: 8,
            defer_begin: true,
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
