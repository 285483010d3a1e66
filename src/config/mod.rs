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
pub(crate) use live::PerGeneration;
mod effective;
mod sections;
mod settings;
mod tls;
mod url;
mod validate;

pub use sections::{DatabaseConfig, UserConfig};
pub use settings::Config;

pub use cli::Cli;
pub use tls::{ChannelBinding, ClientTlsMode, ServerTlsMode};
pub use url::DbUrl;

use serde::{Deserialize, Serialize};

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
    /// A TLS client certificate, verified against `client_tls_ca_file`, whose common name
    /// is the user name (PgBouncer's global `cert`).
    Cert,
    /// A cleartext password, checked by binding to an LDAP server (`auth_ldap_options`).
    Ldap,
    /// A cleartext password, checked by PAM (`auth_pam_service`).
    Pam,
    /// PgBouncer's `any`: as `trust`, and the user name does not matter: every database
    /// logs in to its server as the `user` it names, and any user is a console admin.
    Any,
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

#[cfg(test)]
mod tests;
