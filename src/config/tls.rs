//! TLS settings as PgBouncer and libpq spell them: the client side's `client_tls_sslmode`
//! and the server side's `server_tls_sslmode` (also a URL's `sslmode`) and
//! `server_channel_binding` (a URL's `channel_binding`).

use super::ConfigError;
use serde::{Deserialize, Serialize};

/// What parsnip asks of its clients (PgBouncer's `client_tls_sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientTlsMode {
    /// SSLRequest answered 'N': plaintext only.
    Disable,
    /// TLS when the client asks for it.
    Allow,
    /// TLS when the client asks for it (as `allow`: the server side cannot prefer).
    Prefer,
    /// TCP clients must use TLS (unix-socket clients need not, as in PgBouncer).
    Require,
    /// As `require`, and the client must show a certificate signed by
    /// `client_tls_ca_file` (the handshake fails otherwise).
    #[serde(rename = "verify-ca")]
    VerifyCa,
    /// As `verify-ca` (PgBouncer treats them alike for clients: the certificate names a
    /// user, not a host).
    #[serde(rename = "verify-full")]
    VerifyFull,
}

impl ClientTlsMode {
    /// PgBouncer's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ClientTlsMode::Disable => "disable",
            ClientTlsMode::Allow => "allow",
            ClientTlsMode::Prefer => "prefer",
            ClientTlsMode::Require => "require",
            ClientTlsMode::VerifyCa => "verify-ca",
            ClientTlsMode::VerifyFull => "verify-full",
        }
    }

    /// TCP clients must use TLS.
    pub(crate) fn required(self) -> bool {
        self >= ClientTlsMode::Require
    }

    /// Clients must show a verified certificate.
    pub(crate) fn verifies(self) -> bool {
        self >= ClientTlsMode::VerifyCa
    }
}

/// What parsnip asks of its servers (libpq's `sslmode`, PgBouncer's `server_tls_sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerTlsMode {
    /// Plaintext.
    Disable,
    /// As `prefer` (parsnip asks for TLS first; a server that refuses gets plaintext).
    Allow,
    /// TLS when the server offers it, plaintext otherwise.
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS, with a certificate signed by `server_tls_ca_file`.
    #[serde(rename = "verify-ca")]
    VerifyCa,
    /// As `verify-ca`, and the certificate names the host connected to.
    #[serde(rename = "verify-full")]
    VerifyFull,
}

/// SCRAM channel binding towards servers (libpq's `channel_binding`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelBinding {
    /// Never: SCRAM-SHA-256 even where SCRAM-SHA-256-PLUS is offered.
    Disable,
    /// SCRAM-SHA-256-PLUS when the server offers it over TLS.
    #[default]
    Prefer,
    /// SCRAM-SHA-256-PLUS or no connection: a server that authenticates parsnip any other
    /// way (no TLS, no PLUS offered, trust, md5, a cleartext password) is refused.
    Require,
}

impl ChannelBinding {
    /// Parses libpq's spelling.
    pub(crate) fn parse(s: &str) -> Result<ChannelBinding, ConfigError> {
        Ok(match s {
            "disable" => ChannelBinding::Disable,
            "prefer" => ChannelBinding::Prefer,
            "require" => ChannelBinding::Require,
            _ => {
                return Err(ConfigError(format!("invalid channel_binding value: \"{s}\" (disable, prefer, require)")));
            }
        })
    }

    /// libpq's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChannelBinding::Disable => "disable",
            ChannelBinding::Prefer => "prefer",
            ChannelBinding::Require => "require",
        }
    }
}

impl ServerTlsMode {
    /// Parses libpq's spelling.
    pub(crate) fn parse(s: &str) -> Result<ServerTlsMode, ConfigError> {
        Ok(match s {
            "disable" => ServerTlsMode::Disable,
            "allow" => ServerTlsMode::Allow,
            "prefer" => ServerTlsMode::Prefer,
            "require" => ServerTlsMode::Require,
            "verify-ca" => ServerTlsMode::VerifyCa,
            "verify-full" => ServerTlsMode::VerifyFull,
            _ => {
                return Err(ConfigError(format!(
                    "invalid sslmode value: \"{s}\" (disable, allow, prefer, require, verify-ca, verify-full)"
                )));
            }
        })
    }

    /// libpq's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ServerTlsMode::Disable => "disable",
            ServerTlsMode::Allow => "allow",
            ServerTlsMode::Prefer => "prefer",
            ServerTlsMode::Require => "require",
            ServerTlsMode::VerifyCa => "verify-ca",
            ServerTlsMode::VerifyFull => "verify-full",
        }
    }

    /// A connection must be encrypted.
    pub(crate) fn required(self) -> bool {
        self >= ServerTlsMode::Require
    }

    /// The certificate chain is checked.
    pub(crate) fn verifies(self) -> bool {
        self >= ServerTlsMode::VerifyCa
    }
}
