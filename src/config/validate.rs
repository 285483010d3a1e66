//! Checking a `Config` as a whole: the rules that tie settings together, run after every
//! read of the file (start, reload) and before a console `SET` takes effect.

use super::{AuthType, ChannelBinding, ClientTlsMode, Config, ConfigError, ServerTlsMode, TargetSessionAttrs};

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

    /// `unix_socket_group` as a group id (None: the process's own): a number, or a name
    /// the system's group database knows.
    pub(crate) fn socket_group(&self) -> Result<Option<u32>, ConfigError> {
        let g = self.unix_socket_group.trim();
        if g.is_empty() {
            return Ok(None);
        }
        if let Ok(n) = g.parse::<u32>() {
            return Ok(Some(n));
        }
        group_id(g).map(Some).ok_or_else(|| ConfigError(format!("unix_socket_group: no group named {g:?}")))
    }

    /// Checks cross-field rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError("listen: at least one address is needed".into()));
        }
        self.socket_mode()?;
        self.socket_group()?;
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
        if self.auth_type == AuthType::Any
            && let Some((name, _)) = self.databases.iter().find(|(_, d)| d.user.is_none())
        {
            return Err(ConfigError(format!(
                "auth_type = \"any\" needs every database to name the user it logs in as: [databases.{name}] has no user"
            )));
        }
        if self.auth_type == AuthType::Hba && self.auth_hba_file.is_none() {
            return Err(ConfigError("auth_type \"hba\" needs auth_hba_file".into()));
        }
        if self.auth_type == AuthType::Cert && !self.client_tls_mode().verifies() {
            return Err(ConfigError(
                "auth_type \"cert\" needs client_tls_sslmode verify-ca or verify-full (and client_tls_ca_file)".into(),
            ));
        }
        if self.auth_type == AuthType::Ldap {
            let Some(opts) = &self.auth_ldap_options else {
                return Err(ConfigError("auth_type \"ldap\" needs auth_ldap_options".into()));
            };
            ldap_options(opts)?;
        }
        if self.auth_pam_service.is_empty() {
            return Err(ConfigError("auth_pam_service must not be empty".into()));
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
}

/// `auth_ldap_options` read (by `validate`, and by `read_hba` to keep).
pub(super) fn ldap_options(text: &str) -> Result<crate::auth::ldap::LdapOptions, ConfigError> {
    crate::auth::ldap::LdapOptions::from_text(text).map_err(|e| ConfigError(format!("auth_ldap_options: {e}")))
}

/// The id of the group named `name` (`getgrnam_r`), if there is one.
fn group_id(name: &str) -> Option<u32> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getgrnam_r fills `grp` and `buf` (of the length given) and sets `result` to
    // `grp` when found, to null otherwise; nothing is kept past the call.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(cname.as_ptr(), &mut grp, buf.as_mut_ptr().cast(), buf.len(), &mut result);
        (rc == 0 && !result.is_null()).then_some(grp.gr_gid)
    }
}
