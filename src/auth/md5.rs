//! md5 and cleartext password checks (PostgreSQL's `password` and `md5` methods).

// `::md5` is the md-5 crate; plain `md5` would be ambiguous with this module.
use ::md5::{Digest as _, Md5};

use super::scram::sha256;
use super::{ScramSecret, Secret, ct_eq};

/// Lowercase hex of md5 over the concatenation of `parts`.
fn md5_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Md5::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut out = String::with_capacity(digest.len() * 2);
    for byte in &digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// "md5" + hex(md5(password || user)), for a password that may not be UTF-8.
fn md5_secret_bytes(user: &[u8], password: &[u8]) -> String {
    format!("md5{}", md5_hex(&[password, user]))
}

/// "md5" + hex(md5(password || user)).
#[must_use]
pub(crate) fn md5_secret(user: &str, password: &str) -> String {
    md5_secret_bytes(user.as_bytes(), password.as_bytes())
}

/// What a client sends in reply to AuthenticationMD5Password:
/// "md5" + hex(md5(hex_of_secret_without_md5_prefix || salt)).
///
/// If `md5_secret` lacks the "md5" prefix it is used whole.
#[must_use]
pub(crate) fn md5_response(md5_secret: &str, salt: [u8; 4]) -> String {
    let hex = md5_secret.strip_prefix("md5").unwrap_or(md5_secret);
    format!("md5{}", md5_hex(&[hex.as_bytes(), &salt]))
}

/// Checks a client's PasswordMessage payload (without the trailing NUL) against a secret.
/// Works for Secret::Plain (derive md5 secret first) and Secret::Md5; Scram -> false.
#[must_use]
pub(crate) fn verify_md5(secret: &Secret, user: &str, salt: [u8; 4], response: &[u8]) -> bool {
    let stored = match secret {
        Secret::Plain(password) => md5_secret(user, password),
        Secret::Md5(stored) => stored.clone(),
        Secret::Scram(_) => return false,
    };
    ct_eq(md5_response(&stored, salt).as_bytes(), response)
}

/// Checks a cleartext password (PasswordMessage payload without NUL) against any Secret kind
/// (Plain: constant-time compare; Md5: compare md5_secret(user, pw); Scram: derive with the
/// secret's salt/iterations and compare StoredKey and ServerKey).
///
/// The Plain comparison is made on SHA-256 digests so that not even the password's length
/// shows in the timing. The Scram path applies the same limited SASLprep as the rest of this
/// module (see `scram::saslprep`).
#[must_use]
pub(crate) fn verify_cleartext(secret: &Secret, user: &str, password: &[u8]) -> bool {
    match secret {
        Secret::Plain(stored) => ct_eq(&sha256(stored.as_bytes()), &sha256(password)),
        Secret::Md5(stored) => ct_eq(md5_secret_bytes(user.as_bytes(), password).as_bytes(), stored.as_bytes()),
        Secret::Scram(stored) => {
            let derived = ScramSecret::from_password_bytes(password, &stored.salt, stored.iterations);
            // Non-short-circuiting `&` keeps both comparisons in the timing.
            ct_eq(&derived.stored_key, &stored.stored_key) & ct_eq(&derived.server_key, &stored.server_key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values computed with python3 hashlib:
    //   'md5' + md5(b'secret' + b'postgres').hexdigest()
    //   'md5' + md5(b'53f48b7c4b76a86ce72276c5755f217d' + bytes([1, 2, 3, 4])).hexdigest()
    const SECRET: &str = "md553f48b7c4b76a86ce72276c5755f217d";
    const RESPONSE: &str = "md5bb41a296aab6baccb36ff243a562abff";
    const SALT: [u8; 4] = [1, 2, 3, 4];

    #[test]
    fn known_values() {
        assert_eq!(md5_secret("postgres", "secret"), SECRET);
        assert_eq!(md5_response(SECRET, SALT), RESPONSE);
        // Without the prefix, the secret is used whole.
        assert_eq!(md5_response(&SECRET[3..], SALT), RESPONSE);
    }

    #[test]
    fn verify_md5_plain_and_md5() {
        let plain = Secret::Plain("secret".into());
        let md5 = Secret::parse(SECRET);
        assert!(matches!(md5, Secret::Md5(_)));
        for s in [&plain, &md5] {
            assert!(verify_md5(s, "postgres", SALT, RESPONSE.as_bytes()));
            assert!(!verify_md5(s, "postgres", [1, 2, 3, 5], RESPONSE.as_bytes()));
            assert!(!verify_md5(s, "postgres", SALT, b""));
            assert!(!verify_md5(s, "postgres", SALT, &RESPONSE.as_bytes()[..34]));
            assert!(!verify_md5(s, "postgres", SALT, b"md5bb41a296aab6baccb36ff243a562abfe"));
        }
        // A plain secret is hashed with the user name; a stored md5 secret already contains it.
        assert!(!verify_md5(&plain, "other", SALT, RESPONSE.as_bytes()));
        assert!(verify_md5(&md5, "other", SALT, RESPONSE.as_bytes()));
        let scram = Secret::Scram(ScramSecret::from_password("secret", b"salt", 16));
        assert!(!verify_md5(&scram, "postgres", SALT, RESPONSE.as_bytes()));
    }

    #[test]
    fn verify_cleartext_all_kinds() {
        let kinds = [
            Secret::Plain("secret".into()),
            Secret::Md5(SECRET.into()),
            Secret::Scram(ScramSecret::from_password("secret", b"0123456789abcdef", 64)),
        ];
        for s in &kinds {
            assert!(verify_cleartext(s, "postgres", b"secret"), "{s:?}");
            assert!(!verify_cleartext(s, "postgres", b"secreT"), "{s:?}");
            assert!(!verify_cleartext(s, "postgres", b""), "{s:?}");
            assert!(!verify_cleartext(s, "postgres", b"secret "), "{s:?}");
            assert!(!verify_cleartext(s, "postgres", b"\xff\xfe"), "{s:?}");
        }
        // The md5 secret depends on the user name; the others do not.
        assert!(!verify_cleartext(&kinds[1], "other", b"secret"));
        assert!(verify_cleartext(&kinds[0], "other", b"secret"));
        assert!(verify_cleartext(&kinds[2], "other", b"secret"));
    }
}
