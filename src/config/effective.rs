//! The settings in force for one pool, client or server connection: the per-user and
//! per-database overrides resolved against the global keys, and the `*_ms` keys as
//! `Duration`s (`None`: off).

use super::{ClientTlsMode, Config, DatabaseConfig, PoolMode};
use std::time::Duration;

/// A `*_ms` value as a duration; 0 is off.
pub(super) fn ms(v: u64) -> Option<Duration> {
    (v > 0).then(|| Duration::from_millis(v))
}

impl Config {
    /// `client_tls_sslmode`, defaulted: prefer with a certificate, else disable.
    pub(crate) fn client_tls_mode(&self) -> ClientTlsMode {
        self.client_tls_sslmode.unwrap_or(if self.client_tls_cert_file.is_some() {
            ClientTlsMode::Prefer
        } else {
            ClientTlsMode::Disable
        })
    }

    /// Whether every configured server runs on this machine (a unix socket, loopback,
    /// `localhost`): then PostgreSQL's backends share its cores with parsnip, and the
    /// default number of event loops leaves them half (`driver::default_loops`). False
    /// with no database configured.
    pub fn servers_on_this_machine(&self) -> bool {
        !self.databases.is_empty() && self.databases.values().all(|db| db.host.on_this_machine())
    }

    /// The database entry clients reach with `name`, and the server database name.
    pub(crate) fn database(&self, name: &str) -> Option<(&DatabaseConfig, String)> {
        if let Some(db) = self.databases.get(name) {
            return Some((db, db.dbname.clone().unwrap_or_else(|| name.to_owned())));
        }
        self.databases.get("*").map(|db| (db, name.to_owned()))
    }

    /// The database entry clients reach with `name` (`database` without the server
    /// database name, so without allocating: `server_lifetime` runs at every checkout and
    /// release of a server connection).
    pub(crate) fn database_entry(&self, name: &str) -> Option<&DatabaseConfig> {
        self.databases.get(name).or_else(|| self.databases.get("*"))
    }

    /// Pool mode for a (database, user) pair: user, then database, then global.
    pub(crate) fn pool_mode_for(&self, db: &DatabaseConfig, user: &str) -> PoolMode {
        self.users.get(user).and_then(|u| u.pool_mode).or(db.pool_mode).unwrap_or(self.pool_mode)
    }

    /// The statement cache's settings for the pool of clients reaching database `db` as
    /// `user`: `autoprepare` from the user, then the database, then the global key.
    pub(crate) fn stmt_config_for(&self, db: &str, user: &str) -> crate::stmt::StmtConfig {
        let mut c = self.stmt_config();
        let per_db = self.database_entry(db).and_then(|d| d.autoprepare);
        c.autoprepare = self.users.get(user).and_then(|u| u.autoprepare).or(per_db).unwrap_or(c.autoprepare);
        c
    }

    /// How users not in `[users]` are looked up for clients of database entry `db`:
    /// (`auth_query`, `auth_user`, `auth_dbname`), each the entry's, else the global one
    /// (PgBouncer's per-database overrides). None: no `auth_user`, no lookup. An
    /// `auth_user` without any `auth_query` (only a database entry can have that) runs
    /// the default query.
    pub(crate) fn auth_lookup<'a>(&'a self, db: &'a DatabaseConfig) -> Option<(&'a str, &'a str, Option<&'a str>)> {
        let user = db.auth_user.as_deref().or(self.auth_user.as_deref())?;
        let query = db.auth_query.as_deref().or(self.auth_query.as_deref()).unwrap_or(super::DEFAULT_AUTH_QUERY);
        Some((query, user, db.auth_dbname.as_deref().or(self.auth_dbname.as_deref())))
    }

    /// `min_pool_size` of the pools of database `db` (the name clients use): the
    /// database's, else the global one.
    pub(crate) fn min_pool_size_for(&self, db: &str) -> usize {
        self.database_entry(db).and_then(|d| d.min_pool_size).unwrap_or(self.min_pool_size)
    }

    /// Pool size for a (database, user) pair: user, then database, then global.
    pub(crate) fn pool_size_for(&self, db: &DatabaseConfig, user: &str) -> usize {
        self.users.get(user).and_then(|u| u.pool_size).or(db.pool_size).unwrap_or(self.pool_size)
    }

    /// How long clients of database `db` (the name clients use) wait for a server of
    /// the role it needs (`failover_hold_ms`: the database's, else the global one).
    pub(crate) fn failover_hold(&self, db: &str) -> Duration {
        let per_db = self.database_entry(db).and_then(|d| d.failover_hold_ms);
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
    /// `server_lifetime_ms` of the server connections of database `db` (the name clients
    /// use): the database's when set and not 0, else the global one.
    pub(crate) fn server_lifetime(&self, db: &str) -> Option<Duration> {
        ms(self.server_lifetime_ms_for(db))
    }
    /// `server_lifetime_ms` in force for database `db`, in milliseconds.
    pub(crate) fn server_lifetime_ms_for(&self, db: &str) -> u64 {
        let per_db = self.database_entry(db).and_then(|d| d.server_lifetime_ms).filter(|v| *v > 0);
        per_db.unwrap_or(self.server_lifetime_ms)
    }
    /// See `server_idle_timeout_ms`.
    pub(crate) fn server_idle_timeout(&self) -> Option<Duration> {
        ms(self.server_idle_timeout_ms)
    }
    /// `client_idle_timeout_ms` for clients logged in as `user`: the user's, else the
    /// global one (None: off).
    pub(crate) fn client_idle_timeout(&self, user: &str) -> Option<Duration> {
        let per_user = self.users.get(user).and_then(|u| u.client_idle_timeout_ms);
        ms(per_user.unwrap_or(self.client_idle_timeout_ms))
    }
    /// `pinned_timeout_ms` for clients of database `db`: the database's, else the global
    /// one (None: off).
    pub(crate) fn pinned_timeout(&self, db: &str) -> Option<Duration> {
        let per_db = self.databases.get(db).or_else(|| self.databases.get("*")).and_then(|d| d.pinned_timeout_ms);
        ms(per_db.unwrap_or(self.pinned_timeout_ms))
    }
    /// `query_timeout_ms` for clients logged in as `user`: the user's, else the global one
    /// (None: off).
    pub(crate) fn query_timeout(&self, user: &str) -> Option<Duration> {
        let per_user = self.users.get(user).and_then(|u| u.query_timeout_ms);
        ms(per_user.unwrap_or(self.query_timeout_ms))
    }
    /// `transaction_timeout_ms` for clients logged in as `user`: the user's, else the global
    /// one (None: off).
    pub(crate) fn transaction_timeout(&self, user: &str) -> Option<Duration> {
        let per_user = self.users.get(user).and_then(|u| u.transaction_timeout_ms);
        ms(per_user.unwrap_or(self.transaction_timeout_ms))
    }
    /// `idle_transaction_timeout_ms` for clients logged in as `user`: the user's, else the
    /// global one (None: off).
    pub(crate) fn idle_transaction_timeout(&self, user: &str) -> Option<Duration> {
        let per_user = self.users.get(user).and_then(|u| u.idle_transaction_timeout_ms);
        ms(per_user.unwrap_or(self.idle_transaction_timeout_ms))
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
