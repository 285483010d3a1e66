//! Stored credentials and PostgreSQL's `pg_authid` formats, and the salts and verifiers
//! parsnip makes up where it has none stored (`derived_salt`, `mock_secret`).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::scram::{DEFAULT_ITERATIONS, DEFAULT_SALT_LEN, hmac_sha256, salted_password, saslprep, sha256};

/// A stored credential for one user.
///
/// `Debug` is implemented by hand so that passwords and password-equivalent hashes never end up
/// in logs.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Secret {
    /// A cleartext password.
    Plain(String),
    /// "md5" + hex(md5(password || username)), as stored by PostgreSQL.
    Md5(String),
    /// A SCRAM-SHA-256 verifier, as stored by PostgreSQL.
    Scram(ScramSecret),
}

/// A SCRAM-SHA-256 verifier: what PostgreSQL stores instead of the password.
///
/// `Debug` shows the iteration count and salt but not the keys.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ScramSecret {
    /// PBKDF2 iteration count.
    pub(crate) iterations: u32,
    /// PBKDF2 salt (raw bytes, not base64).
    pub(crate) salt: Vec<u8>,
    /// StoredKey = SHA-256(ClientKey).
    pub(crate) stored_key: [u8; 32],
    /// ServerKey = HMAC(SaltedPassword, "Server Key").
    pub(crate) server_key: [u8; 32],
}

/// The prefix of PostgreSQL's SCRAM-SHA-256 verifiers.
const SCRAM_PREFIX: &str = "SCRAM-SHA-256$";

impl Secret {
    /// Parses a stored secret: "md5" followed by 32 lowercase hex chars -> Md5; PostgreSQL's
    /// `"SCRAM-SHA-256$<iterations>:<salt base64>$<StoredKey base64>:<ServerKey base64>"` -> Scram;
    /// anything else -> Plain.
    ///
    /// A SCRAM verifier whose iteration count is not a positive decimal `u32`, or whose keys do
    /// not decode to 32 bytes, is "anything else" and thus Plain (as in PostgreSQL).
    #[must_use]
    pub(crate) fn parse(s: &str) -> Secret {
        if is_md5_secret(s) {
            Secret::Md5(s.to_owned())
        } else if let Some(scram) = ScramSecret::parse_pg(s) {
            Secret::Scram(scram)
        } else {
            Secret::Plain(s.to_owned())
        }
    }
}

fn is_md5_secret(s: &str) -> bool {
    match s.strip_prefix("md5") {
        Some(hex) => hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        None => false,
    }
}

impl ScramSecret {
    /// Derives a secret from a plain password (SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)).
    ///
    /// The password goes through this module's limited SASLprep (see `scram::saslprep`).
    /// An iteration count of 0 is treated as 1 (and stored as 1).
    #[must_use]
    pub(crate) fn from_password(password: &str, salt: &[u8], iterations: u32) -> ScramSecret {
        ScramSecret::from_password_bytes(password.as_bytes(), salt, iterations)
    }

    /// [`ScramSecret::from_password`] for a password that may not be UTF-8.
    pub(crate) fn from_password_bytes(password: &[u8], salt: &[u8], iterations: u32) -> ScramSecret {
        let iterations = iterations.max(1);
        let salted = salted_password(&saslprep(password), salt, iterations);
        let client_key = hmac_sha256(&salted, &[b"Client Key"]);
        ScramSecret {
            iterations,
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key: hmac_sha256(&salted, &[b"Server Key"]),
        }
    }

    /// Formats in PostgreSQL's pg_authid format.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn to_pg_string(&self) -> String {
        format!(
            "{SCRAM_PREFIX}{}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(self.stored_key),
            STANDARD.encode(self.server_key)
        )
    }

    /// Parses PostgreSQL's pg_authid format; None if `s` is not a valid SCRAM-SHA-256 verifier.
    fn parse_pg(s: &str) -> Option<ScramSecret> {
        let rest = s.strip_prefix(SCRAM_PREFIX)?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored_key, server_key) = keys.split_once(':')?;
        if iterations.is_empty() || !iterations.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let iterations: u32 = iterations.parse().ok()?;
        if iterations == 0 {
            return None;
        }
        Some(ScramSecret {
            iterations,
            salt: STANDARD.decode(salt).ok()?,
            stored_key: STANDARD.decode(stored_key).ok()?.try_into().ok()?,
            server_key: STANDARD.decode(server_key).ok()?.try_into().ok()?,
        })
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Plain(_) => f.write_str("Plain(<redacted>)"),
            Secret::Md5(_) => f.write_str("Md5(<redacted>)"),
            Secret::Scram(s) => f.debug_tuple("Scram").field(s).finish(),
        }
    }
}

impl fmt::Debug for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramSecret")
            .field("iterations", &self.iterations)
            .field("salt", &STANDARD.encode(&self.salt))
            .field("stored_key", &"<redacted>")
            .field("server_key", &"<redacted>")
            .finish()
    }
}

/// The salt parsnip gives user `user` when it has no stored verifier to take one from (a
/// plain password, or a user it does not know): derived from `key`, a secret of the process,
/// so it is the same at every login of that name, another name's differs, and nobody without
/// the key can tell it from a stored verifier's random salt. PostgreSQL's mock salt is such
/// a hash of the user name and a secret of the cluster.
pub(crate) fn derived_salt(key: &[u8; 32], user: &str) -> [u8; DEFAULT_SALT_LEN] {
    let mac = hmac_sha256(key, &[b"parsnip SCRAM salt\0", user.as_bytes()]);
    let mut salt = [0u8; DEFAULT_SALT_LEN];
    salt.copy_from_slice(&mac[..DEFAULT_SALT_LEN]);
    salt
}

/// The verifier of a mock SCRAM exchange with a user parsnip does not know: its derived
/// salt, the default iteration count, and keys derived from `key` that no password gives
/// (finding one would take a SHA-256 preimage). The exchange runs as for a real user and
/// fails at its proof, as PostgreSQL's does.
pub(crate) fn mock_secret(key: &[u8; 32], user: &str) -> ScramSecret {
    ScramSecret {
        iterations: DEFAULT_ITERATIONS,
        salt: derived_salt(key, user).to_vec(),
        stored_key: hmac_sha256(key, &[b"parsnip mock StoredKey\0", user.as_bytes()]),
        server_key: hmac_sha256(key, &[b"parsnip mock ServerKey\0", user.as_bytes()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example password/salt; the expected string computed with python3 hashlib.
    const PENCIL: &str = "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
        wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";

    fn pencil_salt() -> Vec<u8> {
        STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("valid base64")
    }

    #[test]
    fn from_password_matches_known_verifier() {
        let s = ScramSecret::from_password("pencil", &pencil_salt(), 4096);
        assert_eq!(s.to_pg_string(), PENCIL);
    }

    #[test]
    fn parse_scram_round_trip() {
        let Secret::Scram(s) = Secret::parse(PENCIL) else {
            panic!("expected a SCRAM secret");
        };
        assert_eq!(s.iterations, 4096);
        assert_eq!(s.salt, pencil_salt());
        assert_eq!(s.to_pg_string(), PENCIL);
        assert_eq!(s, ScramSecret::from_password("pencil", &pencil_salt(), 4096));

        let other = ScramSecret::from_password("hunter2", b"0123456789abcdef", 10);
        assert_eq!(Secret::parse(&other.to_pg_string()), Secret::Scram(other));
    }

    #[test]
    fn parse_md5() {
        let s = "md553f48b7c4b76a86ce72276c5755f217d";
        assert_eq!(Secret::parse(s), Secret::Md5(s.to_owned()));
        // Uppercase hex, wrong length or missing prefix: plain text.
        for p in [
            "md553F48B7C4B76A86CE72276C5755F217D",
            "md553f48b7c4b76a86ce72276c5755f217",
            "md553f48b7c4b76a86ce72276c5755f217d0",
            "53f48b7c4b76a86ce72276c5755f217d",
            "md5",
        ] {
            assert_eq!(Secret::parse(p), Secret::Plain(p.to_owned()), "{p}");
        }
    }

    #[test]
    fn parse_invalid_scram_is_plain() {
        let bad = [
            "SCRAM-SHA-256$",
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==",
            "SCRAM-SHA-256$0:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
            "SCRAM-SHA-256$+4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
            "SCRAM-SHA-256$99999999999:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
            "SCRAM-SHA-256$4096:!!!$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
            // StoredKey too short.
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
            // Trailing garbage after ServerKey.
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=:x",
            "SCRAM-SHA-1$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
            "",
            "pencil",
        ];
        for p in bad {
            assert_eq!(Secret::parse(p), Secret::Plain(p.to_owned()), "{p}");
        }
    }

    #[test]
    fn zero_iterations_clamped() {
        let s = ScramSecret::from_password("pw", b"salt", 0);
        assert_eq!(s.iterations, 1);
        assert_eq!(s, ScramSecret::from_password("pw", b"salt", 1));
    }

    #[test]
    fn debug_redacts() {
        let dbg = format!(
            "{:?} {:?} {:?}",
            Secret::Plain("hunter2".into()),
            Secret::Md5("md553f48b7c4b76a86ce72276c5755f217d".into()),
            Secret::parse(PENCIL)
        );
        assert!(!dbg.contains("hunter2"));
        assert!(!dbg.contains("53f48b7c"));
        assert!(!dbg.contains("WG5d8oPm"));
        assert!(dbg.contains("4096"));
    }

    proptest::proptest! {
        #[test]
        fn pg_string_round_trip(
            iterations in 1u32..,
            salt in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            stored_key in proptest::prelude::any::<[u8; 32]>(),
            server_key in proptest::prelude::any::<[u8; 32]>(),
        ) {
            let secret = ScramSecret { iterations, salt, stored_key, server_key };
            proptest::prop_assert_eq!(Secret::parse(&secret.to_pg_string()), Secret::Scram(secret));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,120}") {
            let _ = Secret::parse(&s);
        }
    }
}

/// What the pooler can log in to a server with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Credentials {
    /// Nothing: the server must trust us.
    #[default]
    None,
    /// A plain password (any method).
    Password(String),
    /// A stored md5 secret ("md5…"): answers md5 challenges.
    Md5Secret(String),
    /// SCRAM keys recovered from a client's SCRAM exchange.
    ScramKeys {
        /// ClientKey.
        client_key: [u8; 32],
        /// ServerKey, to check the server's signature.
        server_key: [u8; 32],
    },
}
