//! SCRAM-SHA-256 as PostgreSQL does it (RFC 5802 / RFC 7677), with channel binding of type
//! `tls-server-end-point` (RFC 5929) as SCRAM-SHA-256-PLUS.
//!
//! The mechanism names are [`SCRAM_SHA_256`] and [`SCRAM_SHA_256_PLUS`]; parsnip advertises
//! PLUS to clients on TLS connections (first, as PostgreSQL lists it) and uses it towards
//! servers that offer it over TLS (`channel_binding`, as libpq). [`ScramServer`]
//! authenticates clients, [`ScramClient`] authenticates parsnip to PostgreSQL, and
//! [`tls_server_end_point`] computes the binding data from a certificate. This file holds
//! what both sides share: the primitives, the attribute parser and nonces.

mod binding;
mod client;
mod server;

pub(crate) use self::binding::{TLS_SERVER_END_POINT, tls_server_end_point};
pub(crate) use self::client::{ClientBinding, ScramClient};
pub(crate) use self::server::{ScramServer, ServerBinding};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::AuthError;

/// The SASL mechanism name of SCRAM without channel binding.
pub(crate) const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// The SASL mechanism name of SCRAM with channel binding (`tls-server-end-point`).
pub(crate) const SCRAM_SHA_256_PLUS: &str = "SCRAM-SHA-256-PLUS";

/// Iteration count for SCRAM secrets parsnip derives itself (PostgreSQL's default).
pub(crate) const DEFAULT_ITERATIONS: u32 = 4096;

/// Salt length for SCRAM secrets parsnip derives itself (PostgreSQL's default).
pub(crate) const DEFAULT_SALT_LEN: usize = 16;

/// Raw length of a random nonce, before base64 (PostgreSQL's choice).
const NONCE_LEN: usize = 18;

/// HMAC-SHA-256 of the concatenation of `parts` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC is defined for keys of any length (long keys are hashed), so this cannot fail.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// SHA-256 of `data`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations); 0 iterations count as 1.
pub(crate) fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations.max(1))
}

/// `salted_password`, remembered per (password, salt, iterations) for the process: a
/// server's salt and iteration count for a user do not change between logins, and the
/// PBKDF2 is nearly all the cost of one, which a burst of server logins (a pool filling,
/// the clients waiting out a failover woken at once) would pay on the runtime's threads
/// for each. Keyed by a hash of the three, never by the password itself; at most
/// `SALTED_KEPT` entries.
pub(crate) fn salted_password_cached(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    const SALTED_KEPT: usize = 256;
    static SALTED: LazyLock<Mutex<HashMap<[u8; 32], [u8; 32]>>> = LazyLock::new(Default::default);
    let key: [u8; 32] = Sha256::new()
        .chain_update((password.len() as u64).to_be_bytes())
        .chain_update(password)
        .chain_update((salt.len() as u64).to_be_bytes())
        .chain_update(salt)
        .chain_update(iterations.to_be_bytes())
        .finalize()
        .into();
    if let Some(v) = SALTED.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return *v;
    }
    let v = salted_password(password, salt, iterations);
    let mut m = SALTED.lock().unwrap_or_else(|e| e.into_inner());
    if m.len() >= SALTED_KEPT {
        m.clear();
    }
    m.insert(key, v);
    v
}

/// SASLprep (RFC 4013) of a password, applied as PostgreSQL applies it.
///
/// PostgreSQL runs the password through SASLprep and, when the password is not valid for it
/// (not UTF-8, prohibited characters such as ASCII control characters, bad bidi), uses the raw
/// bytes instead. For ASCII input SASLprep is the identity (and control characters fall back to
/// the raw bytes), so this function is exact for ASCII passwords.
///
/// Non-ASCII passwords are normalized with the `stringprep` crate's SASLprep (RFC 4013:
/// NFKC, non-ASCII spaces mapped to a space, "commonly mapped to nothing" characters
/// dropped), as PostgreSQL's `pg_saslprep` does, so a secret made by PostgreSQL matches.
pub(crate) fn saslprep(password: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    if password.is_ascii() {
        return Cow::Borrowed(password);
    }
    let Ok(text) = std::str::from_utf8(password) else {
        return Cow::Borrowed(password);
    };
    match stringprep::saslprep(text) {
        Ok(Cow::Borrowed(_)) | Err(_) => Cow::Borrowed(password),
        Ok(Cow::Owned(prepped)) => Cow::Owned(prepped.into_bytes()),
    }
}

/// A fresh random nonce: [`NONCE_LEN`] random bytes, base64-encoded.
pub(crate) fn random_nonce() -> String {
    let mut raw = [0u8; NONCE_LEN];
    rand::fill(&mut raw[..]);
    STANDARD.encode(raw)
}

/// A random salt of [`DEFAULT_SALT_LEN`] bytes.
pub(crate) fn random_salt() -> [u8; DEFAULT_SALT_LEN] {
    let mut salt = [0u8; DEFAULT_SALT_LEN];
    rand::fill(&mut salt[..]);
    salt
}

/// Whether `s` is a valid nonce: non-empty printable ASCII (0x21..=0x7E) without ','.
pub(crate) fn is_valid_nonce(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// The message as text; SCRAM messages are UTF-8 (mostly ASCII).
fn as_str(msg: &[u8]) -> Result<&str, AuthError> {
    std::str::from_utf8(msg).map_err(|_| AuthError::Malformed("SCRAM message is not valid UTF-8"))
}

/// Splits one `name=value` attribute; the name is a single ASCII letter.
fn attribute(part: &str) -> Option<(u8, &str)> {
    match part.as_bytes() {
        [name, b'=', ..] if name.is_ascii_alphabetic() => Some((*name, part.get(2..)?)),
        _ => None,
    }
}

/// The value of `part` if it is the attribute `name`, else `Malformed(missing)`.
fn expect_attribute<'a>(part: Option<&'a str>, name: u8, missing: &'static str) -> Result<&'a str, AuthError> {
    match part.and_then(attribute) {
        Some((n, value)) if n == name => Ok(value),
        _ => Err(AuthError::Malformed(missing)),
    }
}

/// Checks that the remaining parts are well-formed (optional, ignored) extension attributes.
fn check_extensions<'a>(parts: impl Iterator<Item = &'a str>) -> Result<(), AuthError> {
    for part in parts {
        if attribute(part).is_none() {
            return Err(AuthError::Malformed("invalid SCRAM attribute"));
        }
    }
    Ok(())
}

fn decode_base64(s: &str, what: &'static str) -> Result<Vec<u8>, AuthError> {
    STANDARD.decode(s).map_err(|_| AuthError::Malformed(what))
}

/// Decodes a base64 proof, signature or key, which must be exactly 32 bytes.
fn decode_key(s: &str, what: &'static str) -> Result<[u8; 32], AuthError> {
    decode_base64(s, what)?.try_into().map_err(|_| AuthError::Malformed(what))
}

fn xor(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// AuthMessage = client-first-message-bare + "," + server-first-message + "," +
/// client-final-message-without-proof.
fn auth_message(client_first_bare: &str, server_first: &str, client_final_no_proof: &str) -> String {
    format!("{client_first_bare},{server_first},{client_final_no_proof}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saslprep_as_postgres_applies_it() {
        assert_eq!(&*saslprep(b"plain ascii\x07"), b"plain ascii\x07", "ASCII as is, controls too");
        assert_eq!(&*saslprep("I\u{00AD}X".as_bytes()), b"IX", "mapped to nothing");
        assert_eq!(&*saslprep("\u{2168}".as_bytes()), b"IX", "NFKC");
        assert_eq!(&*saslprep("a\u{00A0}b".as_bytes()), b"a b", "non-ASCII space");
        assert_eq!(&*saslprep(b"\xff\xfe"), b"\xff\xfe", "not UTF-8: raw bytes");
        let bidi = "\u{0627}1".as_bytes();
        assert_eq!(&*saslprep(bidi), bidi, "prohibited (bidi): raw bytes");
    }
    use crate::auth::{ScramSecret, Secret};
    use proptest::prelude::*;

    /// Runs a whole exchange; returns the server (for its client key) or the first error.
    fn exchange(client: &mut ScramClient, server: &mut ScramServer) -> Result<(), AuthError> {
        let first = server.handle_client_first(&client.client_first())?;
        let final_msg = client.handle_server_first(&first)?;
        let server_final = server.handle_client_final(&final_msg)?;
        client.handle_server_final(&server_final)
    }

    fn cheap_secret(password: &str) -> Secret {
        Secret::Scram(ScramSecret::from_password(password, b"NaCl-NaCl-NaCl!!", 32))
    }

    #[test]
    fn round_trip_plain_secret() {
        let secret = Secret::Plain("correct horse".into());
        let mut server = ScramServer::with_random_nonce(&secret).expect("plain supports SCRAM");
        let mut client = ScramClient::with_password("correct horse", ScramClient::random_nonce());
        exchange(&mut client, &mut server).expect("exchange succeeds");
        assert!(server.client_key().is_some());
    }

    #[test]
    fn round_trip_scram_secret() {
        let secret = cheap_secret("correct horse");
        let mut server = ScramServer::with_random_nonce(&secret).expect("scram supports SCRAM");
        let mut client = ScramClient::with_password("correct horse", ScramClient::random_nonce());
        exchange(&mut client, &mut server).expect("exchange succeeds");
        assert!(server.client_key().is_some());
    }

    #[test]
    fn round_trip_parsed_pg_secret() {
        let stored = ScramSecret::from_password("pencil", b"0123456789abcdef", 64).to_pg_string();
        let secret = Secret::parse(&stored);
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        let mut client = ScramClient::with_password("pencil", "cli".into());
        exchange(&mut client, &mut server).expect("exchange succeeds");
    }

    #[test]
    fn non_ascii_password_round_trip() {
        let secret = cheap_secret("pässwörd");
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        let mut client = ScramClient::with_password("pässwörd", "cli".into());
        exchange(&mut client, &mut server).expect("exchange succeeds");
    }

    #[test]
    fn wrong_password() {
        for secret in [Secret::Plain("right".into()), cheap_secret("right")] {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            let mut client = ScramClient::with_password("wrong", "cli".into());
            assert_eq!(exchange(&mut client, &mut server), Err(AuthError::WrongPassword));
            assert_eq!(server.client_key(), None);
            // The exchange is over: a retry of the final message is refused.
            assert!(server.handle_client_final(b"c=biws,r=clisrv,p=").is_err());
        }
    }

    #[test]
    fn md5_secret_cannot_do_scram() {
        let secret = Secret::Md5("md553f48b7c4b76a86ce72276c5755f217d".into());
        assert!(ScramServer::new(&secret, "srv".into()).is_none());
        assert!(ScramServer::with_random_nonce(&secret).is_none());
    }

    #[test]
    fn invalid_server_nonce_rejected() {
        let secret = cheap_secret("pw");
        for nonce in ["", "a,b", "a b", "é", "a\u{7f}"] {
            assert!(ScramServer::new(&secret, nonce.into()).is_none(), "{nonce:?}");
        }
    }

    #[test]
    fn client_key_pass_through() {
        // The pooler authenticates a client, then logs in to "PostgreSQL" (a second server with
        // the same stored secret) with the recovered ClientKey.
        let pg_secret = cheap_secret("s3cret");
        let Secret::Scram(scram) = &pg_secret else { unreachable!() };
        let mut front = ScramServer::new(&pg_secret, "front".into()).expect("scram");
        let mut client = ScramClient::with_password("s3cret", "c1".into());
        exchange(&mut client, &mut front).expect("client authenticates");
        let client_key = front.client_key().expect("client key after success");

        // With the ServerKey known, the server signature is verified.
        let mut backend = ScramServer::new(&pg_secret, "pg".into()).expect("scram");
        let mut pooler = ScramClient::with_client_key(client_key, Some(scram.server_key), "c2".into());
        exchange(&mut pooler, &mut backend).expect("pooler authenticates with the client key");
        assert_eq!(backend.client_key(), Some(client_key));

        // Without it, only the shape of server-final is checked.
        let mut backend = ScramServer::new(&pg_secret, "pg".into()).expect("scram");
        let mut pooler = ScramClient::with_client_key(client_key, None, "c3".into());
        exchange(&mut pooler, &mut backend).expect("pooler authenticates without server key");

        // A wrong ServerKey makes the client reject the server.
        let mut backend = ScramServer::new(&pg_secret, "pg".into()).expect("scram");
        let mut pooler = ScramClient::with_client_key(client_key, Some([7; 32]), "c4".into());
        assert_eq!(exchange(&mut pooler, &mut backend), Err(AuthError::BadServerSignature));

        // A wrong ClientKey is refused by the server.
        let mut backend = ScramServer::new(&pg_secret, "pg".into()).expect("scram");
        let mut pooler = ScramClient::with_client_key([1; 32], None, "c5".into());
        assert_eq!(exchange(&mut pooler, &mut backend), Err(AuthError::WrongPassword));
    }

    #[test]
    fn server_rejects_malformed_client_first() {
        let secret = cheap_secret("pw");
        let cases: &[(&[u8], AuthError)] = &[
            (b"", AuthError::Malformed("")),
            (b"n", AuthError::Malformed("")),
            (b"n,", AuthError::Malformed("")),
            (b"n,,", AuthError::Malformed("")),
            (b"n,,n=", AuthError::Malformed("")),
            (b"n,,n=user", AuthError::Malformed("")),
            (b"n,,n=user,r=", AuthError::Malformed("")),
            (b"n,,n=user,x=abc", AuthError::Malformed("")),
            (b"n,,r=abc", AuthError::Malformed("")),
            (b"x,,n=,r=abc", AuthError::Malformed("")),
            (b"n,a=admin,n=,r=abc", AuthError::Malformed("")),
            (b"n,junk,n=,r=abc", AuthError::Malformed("")),
            (b"n,,m=ext,n=,r=abc", AuthError::Malformed("")),
            (b"n,,n=,r=abc,garbage", AuthError::Malformed("")),
            (b"n,,n=,r=a b", AuthError::Malformed("")),
            (b"n,,n=,r=abc\xff", AuthError::Malformed("")),
            // Binding data where SCRAM-SHA-256 was chosen (or PLUS not offered).
            (b"p=tls-server-end-point,,n=,r=abc", AuthError::Malformed("")),
        ];
        for (msg, want) in cases {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            let got = server.handle_client_first(msg);
            match (want, &got) {
                (AuthError::Malformed(_), Err(AuthError::Malformed(_))) => {}
                (want, Err(got)) if want == got => {}
                _ => panic!("{:?}: got {got:?}", String::from_utf8_lossy(msg)),
            }
        }
        // Valid variants: "y,,", empty user name, a trailing extension.
        for msg in [&b"y,,n=,r=abc"[..], b"n,,n=someone,r=abc", b"n,,n=,r=abc,x=1"] {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            assert!(server.handle_client_first(msg).is_ok(), "{msg:?}");
        }
    }

    #[test]
    fn server_rejects_malformed_client_final() {
        let secret = cheap_secret("pw");
        let cases: &[&[u8]] = &[
            b"",
            b"c=biws",
            b"c=biws,r=clisrv",
            b"c=biws,r=clisrv,p=",
            b"c=biws,r=clisrv,p=!!notbase64!!",
            b"c=biws,r=clisrv,p=AAAA",
            b"c=biws,r=other,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            b"r=clisrv,c=biws,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            b"c=biws,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            b"c=biws,r=clisrv,junk,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            b"c=biws,r=clisrv,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,x=1",
        ];
        for msg in cases {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            server.handle_client_first(b"n,,n=,r=cli").expect("valid client-first");
            let got = server.handle_client_final(msg);
            assert!(matches!(got, Err(AuthError::Malformed(_))), "{:?}: got {got:?}", String::from_utf8_lossy(msg));
        }
        // Channel-binding attribute that does not repeat the gs2 header.
        for (first, cb) in [
            (&b"n,,n=,r=cli"[..], "eSws"),
            (b"y,,n=,r=cli", "biws"),
            (b"n,,n=,r=cli", "cD10bHMtc2VydmVyLWVuZC1wb2ludCws"),
        ] {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            server.handle_client_first(first).expect("valid client-first");
            let msg = format!("c={cb},r=clisrv,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
            let got = server.handle_client_final(msg.as_bytes());
            assert!(matches!(got, Err(AuthError::Malformed(_))), "{first:?} {cb}: {got:?}");
        }
        // Out of order.
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        assert!(matches!(server.handle_client_final(b"c=biws,r=clisrv,p=AAAA"), Err(AuthError::Malformed(_))));
        server.handle_client_first(b"n,,n=,r=cli").expect("still usable");
        assert!(server.handle_client_first(b"n,,n=,r=cli").is_err());
    }

    /// A certificate hash as a TLS connection would give one (any bytes do here).
    const CERT_HASH: [u8; 32] = [0xab; 32];

    #[test]
    fn plus_round_trip_with_every_kind_of_secret() {
        let scram = cheap_secret("pw");
        let Secret::Scram(keys) = &scram else { unreachable!() };
        // Plain passwords are turned into SCRAM secrets, and bind the same way.
        for secret in [Secret::Plain("pw".into()), scram.clone()] {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            server.set_binding(ServerBinding::Selected(CERT_HASH.to_vec()));
            let mut client =
                ScramClient::with_password("pw", "cli".into()).with_binding(ClientBinding::Plus(CERT_HASH.to_vec()));
            assert_eq!(client.mechanism(), SCRAM_SHA_256_PLUS);
            assert!(client.client_first().starts_with(b"p=tls-server-end-point,,n=,r=cli"));
            exchange(&mut client, &mut server).expect("bound exchange succeeds");
            assert!(client.channel_bound());
            assert!(server.client_key().is_some());
        }
        // The ClientKey recovered from a bound exchange logs in to a bound server too.
        let mut front = ScramServer::new(&scram, "front".into()).expect("scram");
        front.set_binding(ServerBinding::Selected(CERT_HASH.to_vec()));
        let mut client =
            ScramClient::with_password("pw", "c1".into()).with_binding(ClientBinding::Plus(CERT_HASH.to_vec()));
        exchange(&mut client, &mut front).expect("client binds to parsnip");
        let client_key = front.client_key().expect("client key");
        let mut backend = ScramServer::new(&scram, "pg".into()).expect("scram");
        backend.set_binding(ServerBinding::Selected(vec![7; 48]));
        let mut pooler = ScramClient::with_client_key(client_key, Some(keys.server_key), "c2".into())
            .with_binding(ClientBinding::Plus(vec![7; 48]));
        exchange(&mut pooler, &mut backend).expect("parsnip binds to PostgreSQL with the client key");
        assert!(pooler.channel_bound());
    }

    #[test]
    fn plus_with_another_certificate_hash_is_refused() {
        let secret = cheap_secret("pw");
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        server.set_binding(ServerBinding::Selected(CERT_HASH.to_vec()));
        // A man in the middle: the client saw another certificate.
        let mut client =
            ScramClient::with_password("pw", "cli".into()).with_binding(ClientBinding::Plus(vec![0xcd; 32]));
        assert_eq!(exchange(&mut client, &mut server), Err(AuthError::ChannelBindingCheck));
        assert_eq!(server.client_key(), None);
        assert!(!client.channel_bound());
        // The gs2 header alone, without the hash, does not do either.
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        server.set_binding(ServerBinding::Selected(CERT_HASH.to_vec()));
        server.handle_client_first(b"p=tls-server-end-point,,n=,r=cli").expect("client-first");
        let msg = b"c=cD10bHMtc2VydmVyLWVuZC1wb2ludCws,r=clisrv,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        assert_eq!(server.handle_client_final(msg), Err(AuthError::ChannelBindingCheck));
    }

    #[test]
    fn gs2_flags_follow_what_was_offered_and_chosen() {
        let secret = cheap_secret("pw");
        let first = |binding: ServerBinding, msg: &[u8]| {
            let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
            server.set_binding(binding);
            server.handle_client_first(msg).map(|_| ())
        };
        let plus = || ServerBinding::Selected(CERT_HASH.to_vec());
        // PLUS offered, SCRAM-SHA-256 chosen: "y" is a downgrade (28000 in PostgreSQL).
        assert_eq!(first(ServerBinding::Declined, b"y,,n=,r=abc"), Err(AuthError::ChannelBindingNegotiation));
        assert_eq!(first(ServerBinding::Declined, b"n,,n=,r=abc"), Ok(()));
        // Not offered (plaintext): "y" is fine.
        assert_eq!(first(ServerBinding::NotOffered, b"y,,n=,r=abc"), Ok(()));
        // "p=" without PLUS chosen.
        for b in [ServerBinding::NotOffered, ServerBinding::Declined] {
            let got = first(b, b"p=tls-server-end-point,,n=,r=abc");
            assert!(matches!(got, Err(AuthError::Malformed(m)) if m.contains("without channel binding")), "{got:?}");
        }
        // PLUS chosen without "p=".
        for msg in [&b"n,,n=,r=abc"[..], b"y,,n=,r=abc"] {
            let got = first(plus(), msg);
            assert!(matches!(got, Err(AuthError::Malformed(m)) if m.contains("SCRAM-SHA-256-PLUS")), "{got:?}");
        }
        // Another binding type, an authzid.
        assert!(matches!(first(plus(), b"p=tls-unique,,n=,r=abc"), Err(AuthError::Malformed(_))));
        assert!(matches!(first(plus(), b"p=tls-server-end-point,a=x,n=,r=abc"), Err(AuthError::Malformed(_))));
        assert_eq!(first(plus(), b"p=tls-server-end-point,,n=,r=abc"), Ok(()));
    }

    #[test]
    fn a_client_that_could_bind_says_y_and_a_binding_server_refuses_it() {
        let secret = cheap_secret("pw");
        let mut client = ScramClient::with_password("pw", "cli".into()).with_binding(ClientBinding::NotOffered);
        assert_eq!(client.mechanism(), SCRAM_SHA_256);
        assert!(client.client_first().starts_with(b"y,,"));
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        exchange(&mut client, &mut server).expect("a server offering no binding accepts y");
        assert!(!client.channel_bound(), "y is not a bound exchange");
        let mut server = ScramServer::new(&secret, "srv".into()).expect("scram");
        server.set_binding(ServerBinding::Declined);
        let client = ScramClient::with_password("pw", "cli".into()).with_binding(ClientBinding::NotOffered);
        assert_eq!(server.handle_client_first(&client.client_first()), Err(AuthError::ChannelBindingNegotiation));
    }

    #[test]
    fn client_rejects_malformed_server_first() {
        let cases: &[&[u8]] = &[
            b"",
            b"r=cli",
            b"r=clisrv",
            b"r=clisrv,s=c2FsdA==",
            b"r=clisrv,s=c2FsdA==,i=",
            b"r=clisrv,s=c2FsdA==,i=0",
            b"r=clisrv,s=c2FsdA==,i=-1",
            b"r=clisrv,s=c2FsdA==,i=+5",
            b"r=clisrv,s=c2FsdA==,i=99999999999",
            b"r=clisrv,s=c2FsdA==,i=4096x",
            b"r=clisrv,s=!!!,i=4096",
            b"r=cli,s=c2FsdA==,i=4096",
            b"r=other,s=c2FsdA==,i=4096",
            b"r=xcli,s=c2FsdA==,i=4096",
            b"r=cli srv,s=c2FsdA==,i=4096",
            b"s=c2FsdA==,r=clisrv,i=4096",
            b"m=ext,r=clisrv,s=c2FsdA==,i=4096",
            b"r=clisrv,s=c2FsdA==,i=4096,garbage",
            b"e=other-error",
            b"r=clisrv,s=c2FsdA==,i=4096\xff",
        ];
        for msg in cases {
            let mut client = ScramClient::with_password("pw", "cli".into());
            let got = client.handle_server_first(msg);
            assert!(matches!(got, Err(AuthError::Malformed(_))), "{:?}: got {got:?}", String::from_utf8_lossy(msg));
        }
        let mut client = ScramClient::with_password("pw", "cli".into());
        assert!(client.handle_server_first(b"r=clisrv,s=c2FsdA==,i=1").is_ok());
        assert!(client.handle_server_first(b"r=clisrv,s=c2FsdA==,i=1").is_err());
    }

    #[test]
    fn client_rejects_bad_server_final() {
        let ready = || {
            let mut client = ScramClient::with_password("pw", "cli".into());
            client.handle_server_first(b"r=clisrv,s=c2FsdA==,i=1").expect("valid server-first");
            client
        };
        for msg in [
            &b""[..],
            b"v=",
            b"v=!!!",
            b"v=AAAA",
            b"x=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,junk",
        ] {
            assert!(matches!(ready().handle_server_final(msg), Err(AuthError::Malformed(_))), "{msg:?}");
        }
        assert_eq!(
            ready().handle_server_final(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            Err(AuthError::BadServerSignature)
        );
        assert_eq!(
            ready().handle_server_final(b"e=invalid-proof"),
            Err(AuthError::ServerRejected("invalid-proof".into()))
        );
        // Out of order.
        let mut client = ScramClient::with_password("pw", "cli".into());
        assert!(client.handle_server_final(b"v=AAAA").is_err());
    }

    #[test]
    fn random_nonces() {
        let a = ScramClient::random_nonce();
        let b = ScramClient::random_nonce();
        assert_ne!(a, b);
        assert_eq!(a.len(), 24);
        assert!(is_valid_nonce(&a));
        assert!(is_valid_nonce(&random_nonce()));
    }

    fn fresh_server() -> ScramServer {
        let secret = Secret::Scram(ScramSecret::from_password("pw", b"salt", 1));
        ScramServer::new(&secret, "srv".into()).expect("scram")
    }

    /// Mostly-plausible SCRAM messages, to reach deeper into the parsers than random bytes.
    fn scramish() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..128),
            "[nyprcvesima=,A-Za-z0-9+/ -]{0,64}".prop_map(String::into_bytes),
            "(n|y|p=x),(a=[a-z]*)?,(n=[a-z]*)?,(r=[!-~]*)?(,[a-z]=[a-z]*)*".prop_map(String::into_bytes),
            "c=(biws|eSws|[A-Za-z0-9+/=]*),r=cli(srv)?[a-z]*(,[a-z]=[a-z]*)*(,p=[A-Za-z0-9+/=]{0,48})?"
                .prop_map(String::into_bytes),
            "r=cli[!-~]{0,8},s=[A-Za-z0-9+/=]{0,12},i=[0-9+-]{0,12}(,[a-z]=[a-z]*)*".prop_map(String::into_bytes),
            "(v|e)=[A-Za-z0-9+/=]{0,48}(,[a-z]=[a-z]*)*".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        #[test]
        fn client_first_never_panics(msg in scramish()) {
            let _ = fresh_server().handle_client_first(&msg);
            let mut server = fresh_server();
            server.set_binding(ServerBinding::Selected(vec![1; 32]));
            let _ = server.handle_client_first(&msg);
        }

        #[test]
        fn client_final_never_panics(first in scramish(), msg in scramish()) {
            let mut server = fresh_server();
            let _ = server.handle_client_first(&first);
            let _ = server.handle_client_final(&msg);
            let mut server = fresh_server();
            server.handle_client_first(b"n,,n=,r=cli").expect("valid client-first");
            let _ = server.handle_client_final(&msg);
            let _ = server.client_key();
        }

        #[test]
        fn server_first_and_final_never_panic(first in scramish(), fin in scramish()) {
            // ClientKey mode: no PBKDF2, so arbitrary iteration counts cost nothing.
            let mut client = ScramClient::with_client_key([3; 32], Some([4; 32]), "cli".into());
            let _ = client.handle_server_first(&first);
            let _ = client.handle_server_final(&fin);
            let mut client = ScramClient::with_client_key([3; 32], None, "cli".into());
            let _ = client.handle_server_first(b"r=clisrv,s=,i=1");
            let _ = client.handle_server_final(&fin);
        }
    }
}
