//! The connection limits as they apply to one database, user or pool: PgBouncer's
//! `max_db_connections`, `max_user_connections`, `max_db_client_connections`,
//! `max_user_client_connections` and `reserve_pool_size`, each a global key that a
//! `[databases]` or `[users]` entry may override (as in PgBouncer, a limit's override of 0
//! leaves the global value in force, while a reserve of 0 is a reserve of 0), and
//! `reserve_pool_timeout_ms`.

use super::effective::ms;
use super::{Config, DatabaseConfig};
use std::time::Duration;

/// A per-entry override, else the global value (0 is no override, as in PgBouncer).
fn or_global(v: Option<usize>, global: usize) -> usize {
    v.filter(|v| *v > 0).unwrap_or(global)
}

impl Config {
    /// (`max_db_connections`, `max_db_client_connections`) of database `db` (the name
    /// clients use; one reached through `[databases."*"]` takes that entry's).
    pub(crate) fn db_limits(&self, db: &str) -> (usize, usize) {
        let d = self.database_entry(db);
        (
            or_global(d.and_then(|d| d.max_db_connections), self.max_db_connections),
            or_global(d.and_then(|d| d.max_db_client_connections), self.max_db_client_connections),
        )
    }

    /// (`max_user_connections`, `max_user_client_connections`) of user `user`.
    pub(crate) fn user_limits(&self, user: &str) -> (usize, usize) {
        let u = self.users.get(user);
        (
            or_global(u.and_then(|u| u.max_user_connections), self.max_user_connections),
            or_global(u.and_then(|u| u.max_user_client_connections), self.max_user_client_connections),
        )
    }

    /// `reserve_pool_size` of a (database, user) pool: the user's, then the database's,
    /// then the global one (PgBouncer's order; 0 set on an entry is 0).
    pub(crate) fn reserve_pool_size_for(&self, db: &DatabaseConfig, user: &str) -> usize {
        let per_user = self.users.get(user).and_then(|u| u.reserve_pool_size);
        per_user.or(db.reserve_pool_size).unwrap_or(self.reserve_pool_size)
    }

    /// See `reserve_pool_timeout_ms`; None: the reserve is never used.
    pub(crate) fn reserve_pool_timeout(&self) -> Option<Duration> {
        ms(self.reserve_pool_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_and_zero_as_in_pgbouncer() {
        let cfg = Config::from_toml(
            r#"
            max_db_connections = 7
            max_user_client_connections = 9
            reserve_pool_size = 2
            [databases.a]
            host = "h"
            port = 1
            max_db_connections = 3
            reserve_pool_size = 4
            [databases.b]
            host = "h"
            port = 1
            max_db_connections = 0
            max_db_client_connections = 5
            [databases.c]
            host = "h"
            port = 1
            reserve_pool = 0
            [users.u]
            max_user_connections = 2
            reserve_pool_size = 1
            "#,
        )
        .expect("valid");
        assert_eq!(cfg.db_limits("a"), (3, 0));
        assert_eq!(cfg.db_limits("b"), (7, 5), "0 per database: the global value");
        assert_eq!(cfg.user_limits("u"), (2, 9));
        assert_eq!(cfg.user_limits("v"), (0, 9));
        let a = &cfg.databases["a"];
        let b = &cfg.databases["b"];
        assert_eq!(cfg.reserve_pool_size_for(a, "u"), 1, "the user's first");
        assert_eq!(cfg.reserve_pool_size_for(a, "v"), 4, "then the database's");
        assert_eq!(cfg.reserve_pool_size_for(b, "v"), 2, "then the global one");
        assert_eq!(cfg.reserve_pool_size_for(&cfg.databases["c"], "v"), 0, "0 on an entry, by its old name");
        assert_eq!(cfg.reserve_pool_timeout(), Some(Duration::from_secs(5)));
    }
}
