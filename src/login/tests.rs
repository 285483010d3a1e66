//! Logins driven with bytes, without sockets: every startup packet kind and every
//! authentication method, with the randomness fixed.

use super::*;
use crate::auth::{ScramClient, ScramSecret};
use crate::config::UserConfig;
use crate::protocol::startup::{cancel_request, startup_message};
use crate::protocol::{frontend, tags, tags_of};

mod external;
mod hba;
mod wire;

const NONCE: &str = "fixed+server+nonce";

fn config(auth: AuthType, users: &[(&str, &str)]) -> Arc<Config> {
    let mut cfg = Config { auth_type: auth, ..Config::default() };
    cfg.databases.insert("*".into(), DatabaseConfig::default());
    for (u, p) in users {
        cfg.users.insert((*u).into(), UserConfig { password: Some((*p).into()), ..UserConfig::default() });
    }
    Arc::new(cfg)
}

/// The salt key of these tests' "process".
const SALT_KEY: [u8; 32] = [7; 32];

fn login(cfg: Arc<Config>) -> Login {
    Login::new(cfg, None, Entropy { md5_salt: [1, 2, 3, 4], scram_nonce: NONCE.into(), salt_key: SALT_KEY })
}

fn startup(params: &[(&str, &str)]) -> BytesMut {
    let mut b = BytesMut::new();
    startup_message(&mut b, params);
    b
}

/// A 4-byte request code packet (SSLRequest 80877103, GSSENCRequest 80877104).
fn request(code: i32) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_i32(8);
    b.put_i32(code);
    b
}

fn password_msg(data: &[u8], nul: bool) -> BytesMut {
    let mut b = BytesMut::new();
    frontend::password(&mut b, data, nul);
    b
}

/// The error `step` closes the login with, asserted to carry SQLSTATE `code`.
fn closed_with(step: Step, code: &str) -> Error {
    match step {
        Step::Close(Some(e)) => {
            assert_eq!(e.code.0, code, "{e}");
            e
        }
        other => panic!("expected a close with {code}, got {other:?}"),
    }
}

/// The AuthenticationRequest code of the last frame in `out`.
fn auth_code(out: &[u8]) -> i32 {
    assert_eq!(out[0], tags::AUTHENTICATION, "{out:?}");
    i32::from_be_bytes(out[5..9].try_into().unwrap())
}

#[test]
fn trust_login_ends_with_the_welcome() {
    let mut m = login(config(AuthType::Trust, &[]));
    let mut buf = startup(&[("user", "alice"), ("database", "app"), ("application_name", "x")]);
    let Step::Authenticated(creds) = m.handle_bytes(&mut buf) else { panic!("trust authenticates at once") };
    assert!(matches!(creds, Credentials::None));
    assert!(buf.is_empty());
    assert_eq!((m.user.as_str(), m.db.as_str()), ("alice", "app"));
    let mut defaults = Settings::default();
    defaults.set_reported("application_name", "");
    let (settings, normalize) = m.client_settings(&defaults);
    assert!(!normalize, "application_name needs no normalizing");
    assert_eq!(settings.reported("application_name"), Some("x"));
    m.welcome(&[("application_name".into(), "".into()), ("server_version".into(), "18".into())], &settings, 9, 7);
    assert_eq!(tags_of(&m.to_client), "RSSKZ");
}

#[test]
fn ssl_and_gssenc_requests_are_answered_n_then_the_startup_goes_on() {
    for code in [80877103, 80877104] {
        let mut m = login(config(AuthType::Trust, &[]));
        let mut buf = request(code);
        assert!(matches!(m.handle_bytes(&mut buf), Step::NeedBytes));
        assert_eq!(&m.to_client[..], b"N");
        m.to_client.clear();
        buf.extend_from_slice(&startup(&[("user", "u")]));
        assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)));
    }
    // Both in one read: one 'N', then the login.
    let mut m = login(config(AuthType::Trust, &[]));
    let mut buf = request(80877103);
    buf.extend_from_slice(&startup(&[("user", "u")]));
    assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)));
    assert_eq!(m.to_client[0], b'N');
}

#[test]
fn a_partial_packet_waits_for_more_bytes() {
    let mut m = login(config(AuthType::Trust, &[]));
    let full = startup(&[("user", "u")]);
    let mut buf = BytesMut::from(&full[..5]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::NeedBytes));
    buf.extend_from_slice(&full[5..]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)));
}

#[test]
fn a_cancel_request_is_handed_to_the_driver() {
    let mut m = login(config(AuthType::Trust, &[]));
    let mut buf = cancel_request(42, &7i32.to_be_bytes());
    match m.handle_bytes(&mut buf) {
        Step::Cancel { pid, key } => assert_eq!((pid, key), (42, 7i32.to_be_bytes().to_vec())),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_startup_packets_get_postgres_errors() {
    // Protocol 2.0.
    let mut buf = BytesMut::new();
    buf.put_i32(8);
    buf.put_i32(2 << 16);
    closed_with(login(config(AuthType::Trust, &[])).handle_bytes(&mut buf), "0A000");
    // No user, an unknown database (no "*" entry), a replication connection, shutting down.
    closed_with(login(config(AuthType::Trust, &[])).handle_bytes(&mut startup(&[("database", "x")])), "28000");
    let strict = Arc::new(Config { auth_type: AuthType::Trust, ..Config::default() });
    closed_with(login(strict).handle_bytes(&mut startup(&[("user", "u"), ("database", "nope")])), "3D000");
    closed_with(
        login(config(AuthType::Trust, &[])).handle_bytes(&mut startup(&[("user", "u"), ("replication", "true")])),
        "0A000",
    );
    let mut m = Login::new(config(AuthType::Trust, &[]), Some(Refusal::ShuttingDown), Entropy::random());
    closed_with(m.handle_bytes(&mut startup(&[("user", "u")])), "57P03");
}

#[test]
fn a_newer_minor_version_and_unknown_options_are_negotiated_down() {
    let mut m = login(config(AuthType::Trust, &[]));
    let mut buf = startup(&[("user", "u"), ("_pq_.x", "1")]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)));
    assert_eq!(tags_of(&m.to_client), "vR", "NegotiateProtocolVersion, then AuthenticationOk");
}

#[test]
fn cleartext_password_right_and_wrong() {
    for (given, ok) in [("secret", true), ("nope", false)] {
        let mut m = login(config(AuthType::Password, &[("u", "secret")]));
        assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
        assert_eq!(auth_code(&m.to_client), 3);
        m.to_client.clear();
        let step = m.handle_bytes(&mut password_msg(given.as_bytes(), true));
        match (step, ok) {
            (Step::Authenticated(Credentials::Password(p)), true) => assert_eq!(p, "secret"),
            (step, false) => {
                closed_with(step, "28P01");
            }
            (other, _) => panic!("{other:?}"),
        }
    }
}

#[test]
fn md5_challenge_uses_the_injected_salt() {
    let stored = crate::auth::md5_secret("u", "pw");
    for (given, ok) in [("pw", true), ("other", false)] {
        let mut m = login(config(AuthType::Md5, &[("u", &stored)]));
        assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
        assert_eq!(auth_code(&m.to_client), 5);
        assert_eq!(&m.to_client[9..13], &[1, 2, 3, 4]);
        let answer = crate::auth::md5_response(&crate::auth::md5_secret("u", given), [1, 2, 3, 4]);
        let step = m.handle_bytes(&mut password_msg(answer.as_bytes(), true));
        match (step, ok) {
            (Step::Authenticated(Credentials::Md5Secret(s)), true) => assert_eq!(s, stored),
            (step, false) => {
                closed_with(step, "28P01");
            }
            (other, _) => panic!("{other:?}"),
        }
    }
}

/// Runs a SCRAM exchange against the login with `password`; the step after client-final.
fn scram(m: &mut Login, password: &str) -> Step {
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 10, "AuthenticationSASL");
    m.to_client.clear();
    let mut client = ScramClient::with_password(password, "client+nonce".into());
    let mut b = BytesMut::new();
    frontend::sasl_initial_response(&mut b, crate::auth::SCRAM_SHA_256, &client.client_first());
    assert!(matches!(m.handle_bytes(&mut b), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 11, "AuthenticationSASLContinue");
    let server_first = m.to_client[9..].to_vec();
    assert!(String::from_utf8_lossy(&server_first).contains(NONCE), "the injected nonce is used");
    m.to_client.clear();
    let client_final = client.handle_server_first(&server_first).expect("server-first");
    m.handle_bytes(&mut password_msg(&client_final, false))
}

#[test]
fn scram_right_and_wrong_password() {
    let secret = ScramSecret::from_password("pw", b"0123456789abcdef", 4096).to_pg_string();
    let mut m = login(config(AuthType::ScramSha256, &[("u", &secret)]));
    match scram(&mut m, "pw") {
        Step::Authenticated(Credentials::ScramKeys { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(tags_of(&m.to_client), "RR", "SASLFinal, then AuthenticationOk");
    let mut m = login(config(AuthType::ScramSha256, &[("u", &secret)]));
    closed_with(scram(&mut m, "wrong"), "28P01");
}

#[test]
fn a_non_password_message_during_authentication_is_a_protocol_violation() {
    let mut m = login(config(AuthType::Password, &[("u", "secret")]));
    let _ = m.handle_bytes(&mut startup(&[("user", "u")]));
    let mut q = BytesMut::new();
    frontend::query(&mut q, "SELECT 1");
    closed_with(m.handle_bytes(&mut q), "08P01");
}

#[test]
fn auth_query_users_are_looked_up_and_unknown_ones_refused_as_postgres_does() {
    let mut cfg = (*config(AuthType::ScramSha256, &[])).clone();
    cfg.auth_query = Some("SELECT usename, passwd FROM pg_shadow WHERE usename = $1".into());
    cfg.auth_user = Some("auth".into());
    let mut m = login(Arc::new(cfg));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "ghost")])), Step::NeedSecret));
    assert!(m.to_client.is_empty(), "nothing said until the secret is known");
    assert!(matches!(m.handle_secret(None), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 10, "a mock SCRAM exchange, as PostgreSQL runs for an unknown role");
    let mut client = ScramClient::with_password("anything", "c".into());
    closed_with(finish_scram(&mut m, crate::auth::SCRAM_SHA_256, &mut client), "28P01");
}

#[test]
fn the_console_needs_an_admin_user() {
    // Trust with no admin_users: anyone.
    let mut m = login(config(AuthType::Trust, &[]));
    assert!(matches!(
        m.handle_bytes(&mut startup(&[("user", "u"), ("database", ADMIN_DB)])),
        Step::Console { read_only: false }
    ));
    assert_eq!(tags_of(&m.to_client), "RSSSSSSKZ");
    // A password user not in admin_users: refused after authenticating.
    let mut cfg = (*config(AuthType::Password, &[("u", "pw")])).clone();
    cfg.admin_users = vec!["boss".into()];
    let mut m = login(Arc::new(cfg));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u"), ("database", ADMIN_DB)])), Step::NeedBytes));
    closed_with(m.handle_bytes(&mut password_msg(b"pw", true)), "28000");
}

#[test]
fn database_pgbouncer_reaches_the_console_unless_configured() {
    let mut m = login(config(AuthType::Trust, &[]));
    assert!(matches!(
        m.handle_bytes(&mut startup(&[("user", "u"), ("database", "pgbouncer")])),
        Step::Console { read_only: false }
    ));
    // A configured database of that name is a database.
    let mut cfg = (*config(AuthType::Trust, &[])).clone();
    cfg.databases.insert("pgbouncer".into(), DatabaseConfig::default());
    let mut m = login(Arc::new(cfg));
    assert!(matches!(
        m.handle_bytes(&mut startup(&[("user", "u"), ("database", "pgbouncer")])),
        Step::Authenticated(_)
    ));
}

fn tls_login(mode: crate::config::ClientTlsMode, unix: bool) -> Login {
    login(config(AuthType::Trust, &[])).with_transport(Transport {
        tls: true,
        mode,
        unix,
        peer: "10.1.2.3".into(),
        ..Transport::default()
    })
}

#[test]
fn an_ssl_request_gets_s_and_a_handshake_when_tls_is_offered() {
    use crate::config::ClientTlsMode;
    for mode in [ClientTlsMode::Allow, ClientTlsMode::Prefer, ClientTlsMode::Require] {
        let mut m = tls_login(mode, false);
        let mut buf = request(80877103);
        assert!(matches!(m.handle_bytes(&mut buf), Step::StartTls { direct: false }), "{mode:?}");
        assert_eq!(&m.to_client[..], b"S");
        m.to_client.clear();
        assert!(matches!(m.handle_tls_started(false, None, None), Step::NeedBytes));
        buf.extend_from_slice(&startup(&[("user", "u")]));
        assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)), "{mode:?}");
    }
    // Disabled: 'N', as without a certificate.
    let mut m = tls_login(ClientTlsMode::Disable, false);
    let mut buf = request(80877103);
    assert!(matches!(m.handle_bytes(&mut buf), Step::NeedBytes));
    assert_eq!(&m.to_client[..], b"N");
}

#[test]
fn bytes_after_an_ssl_request_close_the_connection() {
    let mut m = tls_login(crate::config::ClientTlsMode::Prefer, false);
    let mut buf = request(80877103);
    buf.extend_from_slice(&startup(&[("user", "u")]));
    closed_with(m.handle_bytes(&mut buf), "08P01");
    assert!(m.to_client.is_empty(), "no 'S' before the error");
}

#[test]
fn a_second_ssl_request_on_an_encrypted_connection_is_refused() {
    let mut m = tls_login(crate::config::ClientTlsMode::Prefer, false);
    let mut buf = request(80877103);
    assert!(matches!(m.handle_bytes(&mut buf), Step::StartTls { .. }));
    m.handle_tls_started(false, None, None);
    let mut buf = request(80877103);
    closed_with(m.handle_bytes(&mut buf), "08P01");
}

#[test]
fn require_refuses_plaintext_tcp_with_postgres_wording_and_lets_unix_sockets_in() {
    use crate::config::ClientTlsMode;
    let mut m = tls_login(ClientTlsMode::Require, false);
    let mut buf = startup(&[("user", "alice"), ("database", "app")]);
    match m.handle_bytes(&mut buf) {
        Step::Close(Some(e)) => {
            assert_eq!(e.code.0, "28000");
            assert_eq!(
                e.message,
                "no pg_hba.conf entry for host \"10.1.2.3\", user \"alice\", database \"app\", no encryption"
            );
        }
        other => panic!("{other:?}"),
    }
    let mut m = tls_login(ClientTlsMode::Require, true);
    let mut buf = startup(&[("user", "alice"), ("database", "app")]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)));
    // Encrypted: in.
    let mut m = tls_login(ClientTlsMode::Require, false);
    let mut buf = request(80877103);
    m.handle_bytes(&mut buf);
    m.handle_tls_started(false, None, None);
    let mut buf = startup(&[("user", "alice"), ("database", "app")]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::Authenticated(_)));
}

#[test]
fn a_direct_tls_hello_starts_tls_and_needs_alpn() {
    use crate::config::ClientTlsMode;
    // A TLS record header (handshake, TLS 1.0 record version) where a length would be.
    let hello = [0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01];
    let mut m = tls_login(ClientTlsMode::Prefer, false);
    let mut buf = BytesMut::from(&hello[..]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::StartTls { direct: true }));
    assert!(m.to_client.is_empty(), "nothing is answered before the handshake");
    assert_eq!(buf.len(), hello.len(), "the hello is left for the handshake");
    closed_with(m.handle_tls_started(true, None, None), "08P01");
    let mut m = tls_login(ClientTlsMode::Prefer, false);
    let mut buf = BytesMut::from(&hello[..]);
    m.handle_bytes(&mut buf);
    assert!(matches!(m.handle_tls_started(true, Some(b"postgresql"), None), Step::NeedBytes));
    // Without TLS configured the same bytes are a bad startup packet: closed without a word.
    let mut m = login(config(AuthType::Trust, &[]));
    let mut buf = BytesMut::from(&hello[..]);
    assert!(matches!(m.handle_bytes(&mut buf), Step::Close(None)));
}

/// The mechanisms an AuthenticationSASL frame at the start of `out` lists.
fn sasl_mechanisms(out: &[u8]) -> Vec<String> {
    assert_eq!(auth_code(out), 10, "AuthenticationSASL");
    let len = u32::from_be_bytes(out[1..5].try_into().unwrap()) as usize;
    out[9..1 + len].split(|&b| b == 0).filter(|m| !m.is_empty()).map(|m| String::from_utf8_lossy(m).into()).collect()
}

/// The channel-binding hash of the certificate "shown" in these tests.
const END_POINT: [u8; 32] = [0x5a; 32];

/// A login on a TLS connection (certificate hash `END_POINT`) with the TLS handshake done.
pub(super) fn over_tls(cfg: Arc<Config>) -> Login {
    let mut m = login(cfg).with_transport(Transport {
        tls: true,
        mode: crate::config::ClientTlsMode::Prefer,
        unix: false,
        ..Transport::default()
    });
    assert!(matches!(m.handle_bytes(&mut request(80877103)), Step::StartTls { direct: false }));
    m.to_client.clear();
    assert!(matches!(m.handle_tls_started(false, None, Some(END_POINT.to_vec())), Step::NeedBytes));
    m
}

/// A SCRAM login (`secret` for user "u") on a TLS connection whose certificate hash is
/// `END_POINT`, up to AuthenticationSASL.
fn scram_over_tls(secret: &str) -> Login {
    let mut m = over_tls(config(AuthType::ScramSha256, &[("u", secret)]));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    m
}

/// Runs the rest of a SCRAM exchange with `client` naming `mechanism`: the step after
/// client-final (or after client-first, if that one ends the login).
fn finish_scram(m: &mut Login, mechanism: &str, client: &mut ScramClient) -> Step {
    m.to_client.clear();
    let mut b = BytesMut::new();
    frontend::sasl_initial_response(&mut b, mechanism, &client.client_first());
    match m.handle_bytes(&mut b) {
        Step::NeedBytes => {}
        other => return other,
    }
    assert_eq!(auth_code(&m.to_client), 11, "AuthenticationSASLContinue");
    let server_first = m.to_client[9..].to_vec();
    m.to_client.clear();
    let client_final = client.handle_server_first(&server_first).expect("server-first");
    m.handle_bytes(&mut password_msg(&client_final, false))
}

#[test]
fn scram_sha_256_plus_is_offered_first_over_tls_and_binds() {
    use crate::auth::ClientBinding;
    let scram_secret = ScramSecret::from_password("pw", b"0123456789abcdef", 4096).to_pg_string();
    // A SCRAM secret, and a plain password parsnip turns into one.
    for secret in [scram_secret.as_str(), "pw"] {
        let mut m = scram_over_tls(secret);
        assert_eq!(sasl_mechanisms(&m.to_client), ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"], "as PostgreSQL lists them");
        let mut client =
            ScramClient::with_password("pw", "c".into()).with_binding(ClientBinding::Plus(END_POINT.into()));
        let step = finish_scram(&mut m, crate::auth::SCRAM_SHA_256_PLUS, &mut client);
        assert!(matches!(step, Step::Authenticated(_)), "{secret}: {step:?}");
        assert_eq!(tags_of(&m.to_client), "RR", "SASLFinal, then AuthenticationOk");
        let fin = &m.to_client[9..m.to_client.len() - 9];
        client.handle_server_final(fin).expect("server signature");
        assert!(client.channel_bound());
    }
    // Plain SCRAM-SHA-256 ("n") still works on TLS.
    let mut m = scram_over_tls("pw");
    let mut client = ScramClient::with_password("pw", "c".into());
    assert!(matches!(finish_scram(&mut m, crate::auth::SCRAM_SHA_256, &mut client), Step::Authenticated(_)));
}

#[test]
fn plus_with_another_certificates_hash_is_refused_with_28000() {
    use crate::auth::ClientBinding;
    let mut m = scram_over_tls("pw");
    // The client saw another certificate: someone in the middle.
    let mut client = ScramClient::with_password("pw", "c".into()).with_binding(ClientBinding::Plus(vec![1; 32]));
    match finish_scram(&mut m, crate::auth::SCRAM_SHA_256_PLUS, &mut client) {
        Step::Close(Some(e)) => {
            assert_eq!((e.code.0, &*e.message), ("28000", "SCRAM channel binding check failed"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn y_over_tls_is_a_downgrade_and_refused_as_postgres_does() {
    use crate::auth::ClientBinding;
    let mut m = scram_over_tls("pw");
    let mut client = ScramClient::with_password("pw", "c".into()).with_binding(ClientBinding::NotOffered);
    match finish_scram(&mut m, crate::auth::SCRAM_SHA_256, &mut client) {
        Step::Close(Some(e)) => {
            assert_eq!((e.code.0, &*e.message), ("28000", "SCRAM channel binding negotiation error"));
            assert!(e.detail.as_deref().is_some_and(|d| d.contains("this server does support channel binding")));
            let frame = e.to_bytes();
            assert!(frame.windows(2).any(|w| w == b"\0D"), "the detail is sent");
        }
        other => panic!("{other:?}"),
    }
    // On plaintext nothing was offered: "y" is fine.
    let mut m = login(config(AuthType::ScramSha256, &[("u", "pw")]));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    assert_eq!(sasl_mechanisms(&m.to_client), ["SCRAM-SHA-256"], "no PLUS without TLS");
    let mut client = ScramClient::with_password("pw", "c".into()).with_binding(ClientBinding::NotOffered);
    assert!(matches!(finish_scram(&mut m, crate::auth::SCRAM_SHA_256, &mut client), Step::Authenticated(_)));
}

#[test]
fn binding_flags_that_do_not_fit_the_mechanism_are_protocol_violations() {
    use crate::auth::ClientBinding;
    // "p=" while choosing SCRAM-SHA-256.
    let mut m = scram_over_tls("pw");
    let mut client = ScramClient::with_password("pw", "c".into()).with_binding(ClientBinding::Plus(END_POINT.into()));
    match finish_scram(&mut m, crate::auth::SCRAM_SHA_256, &mut client) {
        Step::Close(Some(e)) => {
            assert_eq!((e.code.0, &*e.message), ("08P01", "malformed SCRAM message"));
            assert!(e.detail.as_deref().is_some_and(|d| d.contains("includes channel binding data")), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    // SCRAM-SHA-256-PLUS without "p=".
    let mut m = scram_over_tls("pw");
    let mut client = ScramClient::with_password("pw", "c".into());
    closed_with(finish_scram(&mut m, crate::auth::SCRAM_SHA_256_PLUS, &mut client), "08P01");
    // SCRAM-SHA-256-PLUS on plaintext, where it was not offered.
    let mut m = login(config(AuthType::ScramSha256, &[("u", "pw")]));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    let mut client = ScramClient::with_password("pw", "c".into()).with_binding(ClientBinding::Plus(END_POINT.into()));
    match finish_scram(&mut m, crate::auth::SCRAM_SHA_256_PLUS, &mut client) {
        Step::Close(Some(e)) => assert!(e.message.contains("invalid SASL authentication mechanism"), "{e:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_certificate_without_a_hash_offers_no_plus() {
    let cfg = config(AuthType::ScramSha256, &[("u", "pw")]);
    let mut m = login(cfg).with_transport(Transport {
        tls: true,
        mode: crate::config::ClientTlsMode::Prefer,
        unix: false,
        ..Transport::default()
    });
    m.handle_bytes(&mut request(80877103));
    m.to_client.clear();
    m.handle_tls_started(false, None, None);
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    assert_eq!(sasl_mechanisms(&m.to_client), ["SCRAM-SHA-256"]);
}

/// PgBouncer's `auth_type = any`: nobody is asked for a password, the database names the
/// server's user, and any user is a console admin.
#[test]
fn auth_type_any_asks_nothing_and_admits_anyone_to_the_console() {
    let mut cfg = (*config(AuthType::Any, &[])).clone();
    cfg.databases.get_mut("*").expect("the wildcard entry").user = Some("app".into());
    let cfg = Arc::new(cfg);
    let mut m = login(cfg.clone());
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "whoever"), ("database", "d")])), Step::Authenticated(_)));
    assert_eq!(auth_code(&m.to_client), 0, "AuthenticationOk at once");
    let mut m = login(cfg);
    let step = m.handle_bytes(&mut startup(&[("user", "whoever"), ("database", ADMIN_DB)]));
    assert!(matches!(step, Step::Console { read_only: false }), "{step:?}");
    // A database that names no user cannot serve under `any`.
    let mut cfg = (*config(AuthType::Any, &[])).clone();
    cfg.databases.get_mut("*").expect("the wildcard entry").host = "h".into();
    cfg.databases.get_mut("*").expect("the wildcard entry").port = 5432;
    let e = cfg.validate().expect_err("no user named");
    assert!(e.0.contains("[databases.*] has no user"), "{}", e.0);
}
