//! The command line: `parsnip [URL] [flags]`.

use super::{
    AuthType, Config, ConfigError, DEFAULT_AUTH_QUERY, DatabaseConfig, DbUrl, HostList, LogFormat, PoolMode, UserConfig,
};
use clap::Parser;
use std::path::PathBuf;

/// parsnip: a PostgreSQL connection pooler with a transparent prepared-statement cache.
///
/// With a URL, pools connections to that server (any other database or user name a client
/// asks for is routed to the same server). With neither a URL nor a config file, starts a
/// throwaway local PostgreSQL cluster and pools in front of it.
#[derive(Parser, Debug, Default)]
#[command(name = "parsnip", version, about, long_about = None)]
pub struct Cli {
    /// postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME of the server to pool.
    pub(crate) url: Option<String>,
    /// Configuration file: parsnip's TOML, or a pgbouncer.ini (recognised by its .ini
    /// extension or a [pgbouncer] section).
    #[arg(short = 'c', long = "config", conflicts_with = "pgbouncer_ini")]
    pub(crate) config: Option<PathBuf>,
    /// A pgbouncer.ini, read as PgBouncer reads it (with its %include and auth_file).
    #[arg(long, value_name = "FILE")]
    pub(crate) pgbouncer_ini: Option<PathBuf>,
    /// Start even when the pgbouncer.ini has settings parsnip cannot honour (they are
    /// named in the log and left out).
    #[arg(long)]
    pub(crate) lenient: bool,
    /// Print the configuration as parsnip's TOML and exit (with a pgbouncer.ini: what it
    /// amounts to).
    #[arg(long)]
    pub print_config: bool,
    /// Address to listen on (host:port or unix socket path); repeatable.
    #[arg(long)]
    pub(crate) listen: Vec<String>,
    /// Directory for the unix socket ("auto": /var/run/postgresql if writable, else /tmp;
    /// "": none).
    #[arg(long)]
    pub(crate) unix_socket_dir: Option<String>,
    /// Pool mode.
    #[arg(long, value_enum)]
    pub(crate) pool_mode: Option<PoolMode>,
    /// Server connections per (database, user) pair.
    #[arg(long)]
    pub(crate) pool_size: Option<usize>,
    /// Maximum client connections.
    #[arg(long)]
    pub(crate) max_client_conn: Option<usize>,
    /// Log format.
    #[arg(long, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// Log filter, e.g. "info" or "parsnip=debug".
    #[arg(long)]
    pub(crate) log_level: Option<String>,
    /// Certificate chain (PEM) for clients' TLS (config `client_tls_cert_file`).
    #[arg(long)]
    pub(crate) tls_cert: Option<String>,
    /// Its private key (PEM) (config `client_tls_key_file`).
    #[arg(long)]
    pub(crate) tls_key: Option<String>,
    /// Serve Prometheus /metrics and the /ready and /live probes on ADDR:PORT (config
    /// `metrics_listen`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_listen: Option<String>,
    /// Start a throwaway local PostgreSQL and pool in front of it (the default when neither
    /// a URL nor a config file is given).
    #[arg(long)]
    pub(crate) embedded: bool,
}

impl Cli {
    /// True when parsnip should start its own PostgreSQL.
    pub fn wants_embedded(&self) -> bool {
        self.embedded || (self.url.is_none() && self.config_file().is_none())
    }

    /// The configuration file given, if any, and whether it was given as a pgbouncer.ini.
    fn config_file(&self) -> Option<(&PathBuf, bool)> {
        self.pgbouncer_ini.as_ref().map(|p| (p, true)).or(self.config.as_ref().map(|p| (p, false)))
    }

    /// Builds the configuration: the file (if any), then the URL's database, then flags.
    pub fn to_config(&self) -> Result<Config, ConfigError> {
        let cfg = self.to_config_without_databases()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Like `to_config`, without validating (the caller adds databases, e.g. embedded).
    pub fn to_config_without_databases(&self) -> Result<Config, ConfigError> {
        let mut cfg = match self.config_file() {
            Some((path, ini)) => Config::read_file(path, ini, self.lenient)?,
            None => Config::default(),
        };
        if let Some(url) = &self.url {
            apply_url(&mut cfg, &DbUrl::parse(url)?, self.config_file().is_none());
        }
        if !self.listen.is_empty() {
            cfg.listen = self.listen.clone();
        }
        if let Some(d) = &self.unix_socket_dir {
            cfg.unix_socket_dir = d.clone();
        }
        if let Some(m) = self.pool_mode {
            cfg.pool_mode = m;
        }
        if let Some(n) = self.pool_size {
            cfg.pool_size = n;
        }
        if let Some(n) = self.max_client_conn {
            cfg.max_client_conn = n;
        }
        if let Some(f) = self.log_format {
            cfg.log_format = f;
        }
        if let Some(l) = &self.log_level {
            cfg.log_level = l.clone();
        }
        if self.tls_cert.is_some() {
            cfg.client_tls_cert_file.clone_from(&self.tls_cert);
        }
        if self.tls_key.is_some() {
            cfg.client_tls_key_file.clone_from(&self.tls_key);
        }
        if self.metrics_listen.is_some() {
            cfg.metrics_listen.clone_from(&self.metrics_listen);
        }
        cfg.read_hba()?;
        Ok(cfg)
    }
}

/// Makes `url` the fallback database. Without a config file, client auth follows the URL:
/// trust when it has no password; otherwise SCRAM, with the URL's user checked against its
/// password and other users looked up in PostgreSQL through the URL's user (auth_query).
pub fn apply_url(cfg: &mut Config, url: &DbUrl, set_auth: bool) {
    let db = DatabaseConfig {
        host: HostList::from(url.host.as_str()),
        port: url.port,
        target_session_attrs: url.target_session_attrs.unwrap_or_default(),
        load_balance_hosts: url.load_balance_hosts.unwrap_or_default(),
        ..Default::default()
    };
    cfg.databases.entry("*".into()).or_insert_with(|| db.clone());
    cfg.databases.entry(url.dbname.clone()).or_insert(db);
    cfg.users
        .entry(url.user.clone())
        .or_insert_with(|| UserConfig { password: url.password.clone(), ..Default::default() });
    if let Some(m) = url.sslmode {
        cfg.server_tls_sslmode = m;
    }
    if let Some(b) = url.channel_binding {
        cfg.server_channel_binding = b;
    }
    for (key, v) in [
        (&mut cfg.server_tls_ca_file, &url.sslrootcert),
        (&mut cfg.server_tls_cert_file, &url.sslcert),
        (&mut cfg.server_tls_key_file, &url.sslkey),
    ] {
        if v.is_some() {
            key.clone_from(v);
        }
    }
    if set_auth {
        if url.password.is_some() {
            cfg.auth_type = AuthType::ScramSha256;
            cfg.auth_query = Some(DEFAULT_AUTH_QUERY.into());
            cfg.auth_user = Some(url.user.clone());
        } else {
            cfg.auth_type = AuthType::Trust;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_and_flags() {
        let cli = Cli::parse_from([
            "parsnip",
            "postgres://u:p@h:7/d",
            "--pool-size",
            "4",
            "--pool-mode",
            "session",
            "--listen",
            "0.0.0.0:1",
        ]);
        assert!(!cli.wants_embedded());
        let cfg = cli.to_config().unwrap();
        assert_eq!(cfg.pool_size, 4);
        assert_eq!(cfg.pool_mode, PoolMode::Session);
        assert_eq!(cfg.listen, vec!["0.0.0.0:1".to_string()]);
        assert_eq!(cfg.auth_type, AuthType::ScramSha256);
        assert_eq!(cfg.database("d").unwrap().0.port, 7);
        assert_eq!(cfg.database("other").unwrap().1, "other");
        assert_eq!(cfg.users["u"].password.as_deref(), Some("p"));
        assert!(Cli::parse_from(["parsnip"]).wants_embedded());
        let cfg = Cli::parse_from(["parsnip", "postgres://u@h/d"]).to_config().unwrap();
        assert_eq!(cfg.auth_type, AuthType::Trust);
    }
}
