//! The entries of `[databases]` and `[users]`: one server database (hosts, credentials,
//! its per-database overrides) and one user (secret, per-user overrides).

use super::{HostList, LoadBalanceHosts, PoolMode, TargetSessionAttrs};
use serde::{Deserialize, Serialize};

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
    /// `min_pool_size` for this database's pools (overrides the global one; 0 set here is
    /// 0).
    pub(crate) min_pool_size: Option<usize>,
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
    /// `auth_user` for clients of this database (overrides the global one).
    pub(crate) auth_user: Option<String>,
    /// `auth_query` for clients of this database (overrides the global one).
    pub(crate) auth_query: Option<String>,
    /// `auth_dbname` for clients of this database (overrides the global one).
    pub(crate) auth_dbname: Option<String>,
    /// PgBouncer's per-database `client_encoding`, `datestyle`, `timezone` and
    /// `application_name`: sent in the startup packet of this database's server
    /// connections, as PgBouncer does, so they are its clients' defaults (a client's own
    /// startup value wins, as any client setting).
    pub(crate) client_encoding: Option<String>,
    /// See `client_encoding`.
    pub(crate) datestyle: Option<String>,
    /// See `client_encoding`.
    pub(crate) timezone: Option<String>,
    /// See `client_encoding`.
    pub(crate) application_name: Option<String>,
    /// `server_lifetime_ms` for this database's server connections (overrides the global
    /// one; 0 leaves the global one, as PgBouncer's per-database `server_lifetime`).
    pub(crate) server_lifetime_ms: Option<u64>,
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
    /// `client_idle_timeout_ms` for this user's clients (overrides the global one; 0: off).
    pub(crate) client_idle_timeout_ms: Option<u64>,
    /// `query_timeout_ms` for this user's clients (overrides the global one; 0: off).
    pub(crate) query_timeout_ms: Option<u64>,
    /// `transaction_timeout_ms` for this user's clients (overrides the global one; 0: off).
    pub(crate) transaction_timeout_ms: Option<u64>,
    /// `idle_transaction_timeout_ms` for this user's clients (overrides the global one; 0:
    /// off).
    pub(crate) idle_transaction_timeout_ms: Option<u64>,
}

impl DatabaseConfig {
    /// The startup parameters of this entry's server connections beyond user and
    /// database (`client_encoding`, `datestyle`, `timezone`, `application_name`).
    pub(crate) fn default_params(&self) -> Vec<(String, String)> {
        [
            ("client_encoding", &self.client_encoding),
            ("DateStyle", &self.datestyle),
            ("TimeZone", &self.timezone),
            ("application_name", &self.application_name),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_owned(), v.clone())))
        .collect()
    }
    /// `max_replica_lag_ms`, defaulted.
    pub(crate) fn max_replica_lag_ms(&self) -> u64 {
        self.max_replica_lag_ms.unwrap_or(1000)
    }
    /// `read_your_writes_ms`, defaulted.
    pub(crate) fn read_your_writes_ms(&self) -> u64 {
        self.read_your_writes_ms.unwrap_or(1000)
    }
}
