//! The settings as text, one (key, value) per scalar key, for the console's `SHOW CONFIG`
//! (secrets left out; databases and users are `SHOW DATABASES` and `SHOW USERS`).

use super::Config;
use crate::error::{Error, SqlState};

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

impl Config {
    /// `[peers]` on one line, "ID=HOST:PORT" by id, comma-separated.
    fn peers_text(&self) -> String {
        let mut v: Vec<(u16, String)> =
            self.peers.iter().map(|(id, p)| (id.parse().unwrap_or(0), format!("{id}={}:{}", p.host, p.port))).collect();
        v.sort();
        v.into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(",")
    }
}

fn lower<T: std::fmt::Debug>(v: T) -> String {
    format!("{v:?}").to_lowercase()
}

impl Config {
    /// Every scalar setting as (key, value), in the order of docs/configuration.md.
    pub(crate) fn entries(&self) -> Vec<(&'static str, String)> {
        vec![
            ("listen", self.listen.join(",")),
            ("unix_socket_dir", self.unix_socket_dir.clone()),
            ("unix_socket_mode", self.unix_socket_mode.clone()),
            ("so_reuseport", self.so_reuseport.to_string()),
            ("peer_id", self.peer_id.to_string()),
            ("peers", self.peers_text()),
            ("pool_mode", lower(self.pool_mode)),
            ("pool_size", self.pool_size.to_string()),
            ("min_pool_size", self.min_pool_size.to_string()),
            ("max_client_conn", self.max_client_conn.to_string()),
            ("auth_type", lower(self.auth_type)),
            ("auth_query", opt(&self.auth_query)),
            ("auth_user", opt(&self.auth_user)),
            ("auth_dbname", opt(&self.auth_dbname)),
            ("server_connect_timeout_ms", self.server_connect_timeout_ms.to_string()),
            ("server_login_retry_ms", self.server_login_retry_ms.to_string()),
            ("server_connect_attempts", self.server_connect_attempts.to_string()),
            ("query_wait_timeout_ms", self.query_wait_timeout_ms.to_string()),
            ("server_lifetime_ms", self.server_lifetime_ms.to_string()),
            ("server_idle_timeout_ms", self.server_idle_timeout_ms.to_string()),
            ("client_idle_timeout_ms", self.client_idle_timeout_ms.to_string()),
            ("idle_transaction_timeout_ms", self.idle_transaction_timeout_ms.to_string()),
            ("client_login_timeout_ms", self.client_login_timeout_ms.to_string()),
            ("max_message_size", self.max_message_size.to_string()),
            ("max_buffered_bytes", self.max_buffered_bytes.to_string()),
            ("prepared_statements", self.prepared_statements.to_string()),
            ("max_prepared_statements", self.max_prepared_statements.to_string()),
            ("max_client_prepared_statements", self.max_client_prepared_statements.to_string()),
            ("max_cached_statements", self.max_cached_statements.to_string()),
            ("promote_unnamed_after", self.promote_unnamed_after.to_string()),
            ("describe_from_cache", self.describe_from_cache.to_string()),
            ("autoprepare", self.autoprepare.to_string()),
            ("autoprepare_after", self.autoprepare_after.to_string()),
            ("plan_guard", self.plan_guard.to_string()),
            ("plan_guard_sample", self.plan_guard_sample.to_string()),
            ("plan_guard_ratio", self.plan_guard_ratio.to_string()),
            ("stats_top_statements", self.stats_top_statements.to_string()),
            ("pipeline_depth", self.pipeline_depth.to_string()),
            ("pipeline_max_statement_ms", self.pipeline_max_statement_ms.to_string()),
            ("server_reset_query", self.server_reset_query.clone()),
            ("shutdown_timeout_ms", self.shutdown_timeout_ms.to_string()),
            ("autodb_idle_timeout_ms", self.autodb_idle_timeout_ms.to_string()),
            ("client_tls_cert_file", opt(&self.client_tls_cert_file)),
            ("client_tls_key_file", opt(&self.client_tls_key_file)),
            ("client_tls_sslmode", lower(self.client_tls_mode())),
            ("server_tls_sslmode", self.server_tls_sslmode.as_str().into()),
            ("server_tls_ca_file", opt(&self.server_tls_ca_file)),
            ("server_tls_cert_file", opt(&self.server_tls_cert_file)),
            ("server_tls_key_file", opt(&self.server_tls_key_file)),
            ("server_channel_binding", self.server_channel_binding.as_str().into()),
            ("admin_users", self.admin_users.join(",")),
            ("stats_users", self.stats_users.join(",")),
            ("stats_period", self.stats_period.to_string()),
            ("metrics_listen", opt(&self.metrics_listen)),
            ("log_level", self.log_level.clone()),
            ("log_format", lower(self.log_format)),
        ]
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
}

/// The settings the console's `SET key = value` changes (what a reload applies at once and
/// is one scalar value).
pub(crate) const CHANGEABLE: &[&str] = &[
    "pool_size",
    "min_pool_size",
    "max_client_conn",
    "server_connect_timeout_ms",
    "server_login_retry_ms",
    "server_connect_attempts",
    "query_wait_timeout_ms",
    "server_lifetime_ms",
    "server_idle_timeout_ms",
    "client_idle_timeout_ms",
    "idle_transaction_timeout_ms",
    "client_login_timeout_ms",
    "max_message_size",
    "max_buffered_bytes",
    "pipeline_depth",
    "pipeline_max_statement_ms",
    "server_reset_query",
    "shutdown_timeout_ms",
    "autodb_idle_timeout_ms",
    "log_level",
];

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, Error> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::new(SqlState::INVALID_PARAMETER_VALUE, format!("invalid value for {key}: \"{value}\"")))
}

impl Config {
    /// The console's `SET key = value` (one of `CHANGEABLE`), checked as a file would be.
    pub(crate) fn set(&mut self, key: &str, value: &str) -> Result<(), Error> {
        match key {
            "pool_size" => self.pool_size = parse(key, value)?,
            "min_pool_size" => self.min_pool_size = parse(key, value)?,
            "max_client_conn" => self.max_client_conn = parse(key, value)?,
            "server_connect_timeout_ms" => self.server_connect_timeout_ms = parse(key, value)?,
            "server_login_retry_ms" => self.server_login_retry_ms = parse(key, value)?,
            "server_connect_attempts" => self.server_connect_attempts = parse(key, value)?,
            "query_wait_timeout_ms" => self.query_wait_timeout_ms = parse(key, value)?,
            "server_lifetime_ms" => self.server_lifetime_ms = parse(key, value)?,
            "server_idle_timeout_ms" => self.server_idle_timeout_ms = parse(key, value)?,
            "client_idle_timeout_ms" => self.client_idle_timeout_ms = parse(key, value)?,
            "idle_transaction_timeout_ms" => self.idle_transaction_timeout_ms = parse(key, value)?,
            "client_login_timeout_ms" => self.client_login_timeout_ms = parse(key, value)?,
            "max_message_size" => self.max_message_size = parse(key, value)?,
            "max_buffered_bytes" => self.max_buffered_bytes = parse(key, value)?,
            "pipeline_depth" => self.pipeline_depth = parse(key, value)?,
            "pipeline_max_statement_ms" => self.pipeline_max_statement_ms = parse(key, value)?,
            "server_reset_query" => self.server_reset_query = value.to_owned(),
            "shutdown_timeout_ms" => self.shutdown_timeout_ms = parse(key, value)?,
            "autodb_idle_timeout_ms" => self.autodb_idle_timeout_ms = parse(key, value)?,
            "log_level" => self.log_level = value.to_owned(),
            _ if self.entries().iter().any(|(k, _)| *k == key) => {
                return Err(Error::new(
                    SqlState::CANT_CHANGE_RUNTIME_PARAM,
                    format!("{key} cannot be changed with SET: change the file and RELOAD"),
                ));
            }
            _ => return Err(Error::new(SqlState::UNDEFINED_OBJECT, format!("unknown setting \"{key}\""))),
        }
        self.validate().map_err(|e| Error::new(SqlState::INVALID_PARAMETER_VALUE, e.0))
    }
}

#[cfg(test)]
mod set_tests {
    use super::*;

    #[test]
    fn set_changes_the_changeable_and_refuses_the_rest() {
        let mut c = Config::default();
        c.databases.insert("db".into(), Default::default());
        c.databases.get_mut("db").expect("db").host = crate::config::HostList::from("h");
        c.databases.get_mut("db").expect("db").port = 5432;
        c.set("pool_size", "33").expect("pool_size");
        assert_eq!(c.pool_size, 33);
        c.set("log_level", "debug").expect("log_level");
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.set("pool_size", "many").unwrap_err().code, SqlState::INVALID_PARAMETER_VALUE);
        assert_eq!(c.set("listen", "0.0.0.0:1").unwrap_err().code, SqlState::CANT_CHANGE_RUNTIME_PARAM);
        assert_eq!(c.set("nonsense", "1").unwrap_err().code, SqlState::UNDEFINED_OBJECT);
        for k in CHANGEABLE {
            assert!(c.entries().iter().any(|(e, _)| e == k), "{k} is not a setting");
        }
    }
}
