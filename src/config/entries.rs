//! The settings as text, one (key, value) per scalar key, for the console's `SHOW CONFIG`
//! (secrets left out; databases and users are `SHOW DATABASES` and `SHOW USERS`).

use super::Config;

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
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
            ("prepared_statements", self.prepared_statements.to_string()),
            ("max_prepared_statements", self.max_prepared_statements.to_string()),
            ("max_client_prepared_statements", self.max_client_prepared_statements.to_string()),
            ("max_cached_statements", self.max_cached_statements.to_string()),
            ("promote_unnamed_after", self.promote_unnamed_after.to_string()),
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
