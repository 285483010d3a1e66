//! Authentication: stored secrets, password checks and SCRAM-SHA-256 exchanges.
//!
//! # What this module owns
//!
//! * Stored credentials: parsing PostgreSQL's `pg_authid` formats into a [`Secret`] and
//!   formatting a [`ScramSecret`] back ([`Secret::parse`]; `ScramSecret::to_pg_string` in tests).
//! * Password checks for clients that log in to parsnip: cleartext ([`verify_cleartext`]) and
//!   md5 ([`verify_md5`], [`md5_response`]).
//! * SCRAM-SHA-256 and SCRAM-SHA-256-PLUS (RFC 5802 / RFC 7677, channel binding of type
//!   `tls-server-end-point` from RFC 5929, as PostgreSQL does it) in both directions: as a
//!   server towards clients ([`ScramServer`]) and as a client towards PostgreSQL
//!   ([`ScramClient`]), including logging in to PostgreSQL with a ClientKey recovered from a
//!   client's exchange ([`ScramServer::client_key`], [`ScramClient::with_client_key`]).
//!
//! # What it must not touch
//!
//! Everything here is pure: functions take message payloads as byte slices and return the
//! payloads to send. This module must not do IO of any kind: no sockets, no tokio, no timers, no
//! files. Framing payloads into protocol messages (AuthenticationSASL, SASLInitialResponse,
//! PasswordMessage, ...) belongs to `protocol`/`session`, and where secrets come from
//! (config files, `auth_query`, the command line) belongs to `config`; neither is parsed here.

pub(crate) mod hba;
pub(crate) mod ident;
pub(crate) mod ldap;
mod md5;
mod scram;
mod secret;

pub(crate) use self::md5::*;
pub(crate) use self::scram::*;
pub use self::secret::*;

use std::fmt;

/// Why an authentication step failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthError {
    /// The peer's message could not be parsed or violates the protocol; the string says how.
    Malformed(&'static str),
    /// The client says it supports channel binding but thinks the server does not (gs2 flag
    /// `y`), while SCRAM-SHA-256-PLUS was offered: a downgrade, refused as PostgreSQL refuses it.
    ChannelBindingNegotiation,
    /// The channel-binding data of client-final-message (`c=`) is not the hash of the
    /// certificate this connection's TLS showed.
    ChannelBindingCheck,
    /// The client's proof (or password) does not match the stored secret.
    WrongPassword,
    /// PostgreSQL answered the SCRAM exchange with a `e=...` server error; the value is its text.
    ServerRejected(String),
    /// PostgreSQL's server signature (`v=...`) does not match the expected one.
    BadServerSignature,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Malformed(what) => write!(f, "malformed authentication message: {what}"),
            AuthError::ChannelBindingNegotiation => f.write_str("SCRAM channel binding negotiation error"),
            AuthError::ChannelBindingCheck => f.write_str("SCRAM channel binding check failed"),
            AuthError::WrongPassword => f.write_str("password authentication failed"),
            AuthError::ServerRejected(msg) => {
                write!(f, "server rejected SCRAM authentication: {msg}")
            }
            AuthError::BadServerSignature => f.write_str("invalid SCRAM server signature"),
        }
    }
}

impl std::error::Error for AuthError {}

/// Compares two byte strings in time that depends only on their lengths, not their contents.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_works() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
    }

    #[test]
    fn errors_display() {
        assert_eq!(
            AuthError::Malformed("missing nonce").to_string(),
            "malformed authentication message: missing nonce"
        );
        assert!(AuthError::ServerRejected("invalid-proof".into()).to_string().contains("invalid-proof"));
    }
}
