//! The scalar settings, one table row per key (`KEYS`): what the console's `SHOW CONFIG`
//! shows for it, what a reload does when it changes, and whether (and how) the console's
//! `SET key = value` changes it. Secrets are left out; databases and users are
//! `SHOW DATABASES` and `SHOW USERS`.
//!
//! Adding a key: one `key!` line in `KEYS`, at its place in docs/configuration.md's order
//! (the field in `Config` and its doc there as for any key).

use super::Config;
use crate::error::{Error, SqlState};

/// What a reload does with a key whose value changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reload {
    /// Applies at once (to every pool, login and timeout from then on).
    AtOnce,
    /// Applies to pools created after the reload (a pool's statement cache is sized when
    /// it is made); a warning says so.
    NewPools,
    /// Only a restart changes it (listening sockets, the log format, the janitor's
    /// averaging period, `peer_id`: the keys already handed out carry the old one); a
    /// warning says so.
    Restart,
}

/// How the console's `SET` writes a key's value into a `Config` (the value checked as a
/// file's would be); None: only the file and RELOAD change the key.
type Setter = Option<fn(&mut Config, &str) -> Result<(), Error>>;

/// One scalar setting.
pub(crate) struct Key {
    /// Its name, as in the file.
    pub(crate) name: &'static str,
    /// Its value as `SHOW CONFIG` shows it.
    pub(crate) show: fn(&Config) -> String,
    /// What a reload does when it changed.
    pub(crate) reload: Reload,
    /// What `SET` does with it.
    set: Setter,
}

impl Key {
    /// Whether the console's `SET` changes it.
    pub(crate) fn settable(&self) -> bool {
        self.set.is_some()
    }
}

/// One row of `KEYS`: `key!(name, reload, |c| shown value)` for a key only the file
/// changes; `, set parse` after it for one `SET` changes by parsing the value into the
/// field (`FromStr`), `, set text` for a text field `SET` stores as given.
macro_rules! key {
    ($name:ident, $reload:ident, $show:expr) => {
        Key { name: stringify!($name), show: $show, reload: Reload::$reload, set: None }
    };
    ($name:ident, $reload:ident, $show:expr, set parse) => {
        Key {
            name: stringify!($name),
            show: $show,
            reload: Reload::$reload,
            set: Some(|c, v| {
                c.$name = parse(stringify!($name), v)?;
                Ok(())
            }),
        }
    };
    ($name:ident, $reload:ident, $show:expr, set text) => {
        Key {
            name: stringify!($name),
            show: $show,
            reload: Reload::$reload,
            set: Some(|c, v| {
                c.$name = v.to_owned();
                Ok(())
            }),
        }
    };
}

/// Every scalar setting, in the order of docs/configuration.md (`SHOW CONFIG`'s order).
pub(crate) static KEYS: &[Key] = &[
    key!(listen, Restart, |c| c.listen.join(",")),
    key!(unix_socket_dir, Restart, |c| c.unix_socket_dir.clone()),
    key!(unix_socket_mode, Restart, |c| c.unix_socket_mode.clone()),
    key!(unix_socket_group, Restart, |c| c.unix_socket_group.clone()),
    key!(so_reuseport, Restart, |c| c.so_reuseport.to_string()),
    key!(peer_id, Restart, |c| c.peer_id.to_string()),
    // Not restart-only: each cancel request reads the current table.
    key!(peers, AtOnce, Config::peers_text),
    key!(pool_mode, AtOnce, |c| lower(c.pool_mode)),
    key!(pool_size, AtOnce, |c| c.pool_size.to_string(), set parse),
    key!(min_pool_size, AtOnce, |c| c.min_pool_size.to_string(), set parse),
    key!(max_client_conn, AtOnce, |c| c.max_client_conn.to_string(), set parse),
    key!(reserve_pool_size, AtOnce, |c| c.reserve_pool_size.to_string(), set parse),
    key!(reserve_pool_timeout_ms, AtOnce, |c| c.reserve_pool_timeout_ms.to_string(), set parse),
    key!(max_db_connections, AtOnce, |c| c.max_db_connections.to_string(), set parse),
    key!(max_user_connections, AtOnce, |c| c.max_user_connections.to_string(), set parse),
    key!(max_db_client_connections, AtOnce, |c| c.max_db_client_connections.to_string(), set parse),
    key!(max_user_client_connections, AtOnce, |c| c.max_user_client_connections.to_string(), set parse),
    key!(auth_type, AtOnce, |c| lower(c.auth_type)),
    key!(auth_hba_file, AtOnce, |c| opt(&c.auth_hba_file)),
    key!(auth_ident_file, AtOnce, |c| opt(&c.auth_ident_file)),
    key!(auth_query, AtOnce, |c| opt(&c.auth_query)),
    key!(auth_user, AtOnce, |c| opt(&c.auth_user)),
    key!(auth_dbname, AtOnce, |c| opt(&c.auth_dbname)),
    key!(auth_ldap_options, AtOnce, |c| c
        .auth_ldap_options
        .as_deref()
        .map_or_else(String::new, crate::auth::ldap::redacted)),
    key!(auth_ldap_tls_ca_file, AtOnce, |c| opt(&c.auth_ldap_tls_ca_file)),
    key!(auth_pam_service, AtOnce, |c| c.auth_pam_service.clone()),
    key!(auth_pam_config_dir, AtOnce, |c| c.auth_pam_config_dir.clone()),
    key!(server_connect_timeout_ms, AtOnce, |c| c.server_connect_timeout_ms.to_string(), set parse),
    key!(server_login_retry_ms, AtOnce, |c| c.server_login_retry_ms.to_string(), set parse),
    key!(server_connect_attempts, AtOnce, |c| c.server_connect_attempts.to_string(), set parse),
    key!(failover_hold_ms, AtOnce, |c| c.failover_hold_ms.to_string(), set parse),
    key!(query_wait_timeout_ms, AtOnce, |c| c.query_wait_timeout_ms.to_string(), set parse),
    key!(server_lifetime_ms, AtOnce, |c| c.server_lifetime_ms.to_string(), set parse),
    key!(server_idle_timeout_ms, AtOnce, |c| c.server_idle_timeout_ms.to_string(), set parse),
    key!(client_idle_timeout_ms, AtOnce, |c| c.client_idle_timeout_ms.to_string(), set parse),
    key!(query_timeout_ms, AtOnce, |c| c.query_timeout_ms.to_string(), set parse),
    key!(transaction_timeout_ms, AtOnce, |c| c.transaction_timeout_ms.to_string(), set parse),
    key!(idle_transaction_timeout_ms, AtOnce, |c| c.idle_transaction_timeout_ms.to_string(), set parse),
    key!(pinned_timeout_ms, AtOnce, |c| c.pinned_timeout_ms.to_string(), set parse),
    key!(client_login_timeout_ms, AtOnce, |c| c.client_login_timeout_ms.to_string(), set parse),
    key!(max_message_size, AtOnce, |c| c.max_message_size.to_string(), set parse),
    key!(max_buffered_bytes, AtOnce, |c| c.max_buffered_bytes.to_string(), set parse),
    key!(prepared_statements, AtOnce, |c| c.prepared_statements.to_string()),
    key!(max_prepared_statements, NewPools, |c| c.max_prepared_statements.to_string()),
    key!(max_client_prepared_statements, NewPools, |c| c.max_client_prepared_statements.to_string()),
    key!(max_cached_statements, NewPools, |c| c.max_cached_statements.to_string()),
    key!(promote_unnamed_after, NewPools, |c| c.promote_unnamed_after.to_string()),
    key!(describe_from_cache, NewPools, |c| c.describe_from_cache.to_string()),
    key!(autoprepare, NewPools, |c| c.autoprepare.to_string()),
    key!(autoprepare_after, NewPools, |c| c.autoprepare_after.to_string()),
    key!(plan_guard, NewPools, |c| c.plan_guard.to_string()),
    key!(plan_guard_sample, NewPools, |c| c.plan_guard_sample.to_string()),
    key!(plan_guard_ratio, NewPools, |c| c.plan_guard_ratio.to_string()),
    key!(stats_top_statements, AtOnce, |c| c.stats_top_statements.to_string()),
    key!(pipeline_depth, AtOnce, |c| c.pipeline_depth.to_string(), set parse),
    key!(pipeline_max_statement_ms, AtOnce, |c| c.pipeline_max_statement_ms.to_string(), set parse),
    key!(defer_begin, AtOnce, |c| c.defer_begin.to_string(), set parse),
    key!(server_reset_query, AtOnce, |c| c.server_reset_query.clone(), set text),
    key!(server_fast_close, AtOnce, |c| c.server_fast_close.to_string()),
    key!(shutdown_timeout_ms, AtOnce, |c| c.shutdown_timeout_ms.to_string(), set parse),
    key!(autodb_idle_timeout_ms, AtOnce, |c| c.autodb_idle_timeout_ms.to_string(), set parse),
    key!(client_tls_cert_file, AtOnce, |c| opt(&c.client_tls_cert_file)),
    key!(client_tls_key_file, AtOnce, |c| opt(&c.client_tls_key_file)),
    key!(client_tls_sslmode, AtOnce, |c| c.client_tls_mode().as_str().into()),
    key!(client_tls_ca_file, AtOnce, |c| opt(&c.client_tls_ca_file)),
    key!(server_tls_sslmode, AtOnce, |c| c.server_tls_sslmode.as_str().into()),
    key!(server_tls_ca_file, AtOnce, |c| opt(&c.server_tls_ca_file)),
    key!(server_tls_cert_file, AtOnce, |c| opt(&c.server_tls_cert_file)),
    key!(server_tls_key_file, AtOnce, |c| opt(&c.server_tls_key_file)),
    key!(server_channel_binding, AtOnce, |c| c.server_channel_binding.as_str().into()),
    key!(admin_users, AtOnce, |c| c.admin_users.join(",")),
    key!(stats_users, AtOnce, |c| c.stats_users.join(",")),
    key!(stats_period, Restart, |c| c.stats_period.to_string()),
    key!(metrics_listen, Restart, |c| opt(&c.metrics_listen)),
    key!(log_level, AtOnce, |c| c.log_level.clone(), set text),
    key!(log_format, Restart, |c| lower(c.log_format)),
];

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn lower<T: std::fmt::Debug>(v: T) -> String {
    format!("{v:?}").to_lowercase()
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, Error> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::new(SqlState::INVALID_PARAMETER_VALUE, format!("invalid value for {key}: \"{value}\"")))
}

/// The row of `key`, if it is a scalar setting.
pub(crate) fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

impl Config {
    /// `[peers]` on one line, "ID=HOST:PORT" by id, comma-separated.
    fn peers_text(&self) -> String {
        let mut v: Vec<(u16, String)> =
            self.peers.iter().map(|(id, p)| (id.parse().unwrap_or(0), format!("{id}={}:{}", p.host, p.port))).collect();
        v.sort();
        v.into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(",")
    }

    /// Every scalar setting as (key, value), in the order of docs/configuration.md.
    pub(crate) fn entries(&self) -> Vec<(&'static str, String)> {
        KEYS.iter().map(|k| (k.name, (k.show)(self))).collect()
    }

    /// The console's `SET key = value` (a key whose row has a setter), checked as a file
    /// would be.
    pub(crate) fn set(&mut self, name: &str, value: &str) -> Result<(), Error> {
        match key(name) {
            Some(Key { set: Some(set), .. }) => set(self, value)?,
            Some(_) => {
                return Err(Error::new(
                    SqlState::CANT_CHANGE_RUNTIME_PARAM,
                    format!("{name} cannot be changed with SET: change the file and RELOAD"),
                ));
            }
            None => return Err(Error::new(SqlState::UNDEFINED_OBJECT, format!("unknown setting \"{name}\""))),
        }
        self.validate().map_err(|e| Error::new(SqlState::INVALID_PARAMETER_VALUE, e.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_once_with_its_value() {
        let c = Config::default();
        let e = c.entries();
        let mut keys: Vec<_> = e.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), e.len(), "no key twice");
        let get = |k| e.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("max_client_conn"), Some("10000"));
        assert_eq!(get("pool_mode"), Some("transaction"));
        assert_eq!(get("server_tls_sslmode"), Some("prefer"));
        let c = Config { server_tls_sslmode: crate::config::ServerTlsMode::VerifyFull, ..Config::default() };
        assert!(c.entries().contains(&("server_tls_sslmode", "verify-full".into())));
    }

    fn valid() -> Config {
        let mut c = Config::default();
        c.databases.insert("db".into(), Default::default());
        c.databases.get_mut("db").expect("db").host = crate::config::HostList::from("h");
        c.databases.get_mut("db").expect("db").port = 5432;
        c
    }

    #[test]
    fn set_changes_the_changeable_and_refuses_the_rest() {
        let mut c = valid();
        c.set("pool_size", "33").expect("pool_size");
        assert_eq!(c.pool_size, 33);
        c.set("log_level", "debug").expect("log_level");
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.set("pool_size", "many").unwrap_err().code, SqlState::INVALID_PARAMETER_VALUE);
        assert_eq!(c.set("listen", "0.0.0.0:1").unwrap_err().code, SqlState::CANT_CHANGE_RUNTIME_PARAM);
        assert_eq!(c.set("nonsense", "1").unwrap_err().code, SqlState::UNDEFINED_OBJECT);
    }

    /// A value `SET` should take for a key shown as `shown`, and differing from it.
    fn other_value(shown: &str) -> String {
        match (shown.parse::<f64>(), shown.parse::<bool>()) {
            (Ok(n), _) => (n.trunc() as u64 + 1).to_string(),
            (_, Ok(b)) => (!b).to_string(),
            _ => format!("{shown}x"),
        }
    }

    #[test]
    fn each_key_facets_agree() {
        for k in KEYS {
            let mut c = valid();
            let before = (k.show)(&c);
            let value = other_value(&before);
            match c.set(k.name, &value) {
                // SET writes the field SHOW CONFIG reads, and only that one.
                Ok(()) => {
                    assert!(k.settable(), "{}", k.name);
                    assert_eq!((k.show)(&c), value, "SET {} is not what SHOW CONFIG shows", k.name);
                    let changed: Vec<_> =
                        valid().entries().into_iter().zip(c.entries()).filter(|(a, b)| a != b).collect();
                    assert_eq!(changed.len(), 1, "SET {} changed {changed:?}", k.name);
                    // What SET changes, a reload applies at once.
                    assert_eq!(k.reload, Reload::AtOnce, "SET {} of a key a reload does not apply", k.name);
                }
                Err(e) => {
                    assert!(!k.settable(), "SET {} = {value}: {}", k.name, e.message);
                    assert_eq!(e.code, SqlState::CANT_CHANGE_RUNTIME_PARAM, "{}", k.name);
                }
            }
        }
    }
}
