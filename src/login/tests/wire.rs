//! What a client sees of refusals, byte for byte as PostgreSQL shows them: users parsnip
//! does not know (asked as known ones are, refused at the end), malformed password
//! messages, bad startup packets, and connections refused beyond `max_client_conn`.

use super::*;
use crate::auth::ClientBinding;

/// What a SCRAM login as `user` with `password` shows the client: AuthenticationSASL, the
/// server-first-message, and how it ends.
struct Exchange {
    sasl: Vec<u8>,
    server_first: String,
    end: Step,
}

fn exchange(mut m: Login, user: &str, password: &str, binding: Option<ClientBinding>) -> Exchange {
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", user)])), Step::NeedBytes));
    let sasl = m.to_client.to_vec();
    let (mechanism, client) = match binding {
        Some(b) => (crate::auth::SCRAM_SHA_256_PLUS, ScramClient::with_password(password, "c".into()).with_binding(b)),
        None => (crate::auth::SCRAM_SHA_256, ScramClient::with_password(password, "c".into())),
    };
    let mut client = client;
    m.to_client.clear();
    let mut b = BytesMut::new();
    frontend::sasl_initial_response(&mut b, mechanism, &client.client_first());
    assert!(matches!(m.handle_bytes(&mut b), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 11, "AuthenticationSASLContinue");
    let server_first = String::from_utf8(m.to_client[9..].to_vec()).expect("server-first is text");
    m.to_client.clear();
    let client_final = client.handle_server_first(server_first.as_bytes()).expect("server-first");
    let end = m.handle_bytes(&mut password_msg(&client_final, false));
    Exchange { sasl, server_first, end }
}

/// The salt of a server-first-message; checks the rest of its shape (the nonce is the
/// client's "c" and the injected one, 4096 iterations).
fn salt_of(server_first: &str) -> String {
    let parts: Vec<&str> = server_first.split(',').collect();
    assert_eq!(parts.len(), 3, "{server_first}");
    assert_eq!(parts[0], format!("r=c{NONCE}"));
    assert_eq!(parts[2], "i=4096");
    let salt = parts[1].strip_prefix("s=").expect("salt attribute");
    assert_eq!(salt.len(), 24, "16 bytes in base64, as PostgreSQL's salts: {salt}");
    salt.to_owned()
}

fn refused_as_wrong_password(step: Step, user: &str) {
    match step {
        Step::Close(Some(e)) => {
            assert_eq!(e.code.0, "28P01");
            assert_eq!(e.message, format!("password authentication failed for user \"{user}\""));
        }
        other => panic!("expected 28P01, got {other:?}"),
    }
}

fn closed_with_message(step: Step, code: &str, message: &str) {
    match step {
        Step::Close(Some(e)) => assert_eq!((e.code.0, &*e.message), (code, message), "{e:?}"),
        other => panic!("expected {code} {message:?}, got {other:?}"),
    }
}

#[test]
fn an_unknown_user_gets_the_scram_exchange_a_known_one_gets_then_28p01() {
    let verifier = ScramSecret::from_password("pw", b"0123456789abcdef", 4096).to_pg_string();
    for secret in [verifier.as_str(), "pw"] {
        let cfg = config(AuthType::ScramSha256, &[("known", secret)]);
        let known = exchange(login(cfg.clone()), "known", "wrong", None);
        let unknown = exchange(login(cfg), "ghost", "wrong", None);
        assert_eq!(known.sasl, unknown.sasl, "the same AuthenticationSASL");
        assert_eq!(sasl_mechanisms(&unknown.sasl), ["SCRAM-SHA-256"]);
        salt_of(&known.server_first);
        salt_of(&unknown.server_first);
        refused_as_wrong_password(known.end, "known");
        refused_as_wrong_password(unknown.end, "ghost");
    }
    // Whatever the password.
    let cfg = config(AuthType::ScramSha256, &[]);
    refused_as_wrong_password(exchange(login(cfg.clone()), "ghost", "", None).end, "ghost");
    refused_as_wrong_password(exchange(login(cfg), "ghost", "pw", None).end, "ghost");
}

#[test]
fn the_made_up_salts_are_stable_per_name_and_differ_across_names() {
    let cfg = config(AuthType::ScramSha256, &[("plain", "pw")]);
    let salt = |user: &str, key: [u8; 32]| {
        let m = Login::new(cfg.clone(), None, Entropy { md5_salt: [0; 4], scram_nonce: NONCE.into(), salt_key: key });
        salt_of(&exchange(m, user, "x", None).server_first)
    };
    let ghost = salt("ghost", SALT_KEY);
    assert_eq!(ghost, salt("ghost", SALT_KEY), "the same at the next login");
    assert_ne!(ghost, salt("ghost2", SALT_KEY), "another name, another salt");
    assert_ne!(ghost, salt("ghost", [8; 32]), "another process key, another salt");
    // A plain password's verifier is made up the same way: stable, like a stored one's.
    let plain = salt("plain", SALT_KEY);
    assert_eq!(plain, salt("plain", SALT_KEY));
    assert_ne!(plain, ghost);
    // The right password still logs in with it.
    assert!(matches!(exchange(login(cfg), "plain", "pw", None).end, Step::Authenticated(_)));
}

#[test]
fn over_tls_an_unknown_user_is_offered_plus_and_refused_after_the_binding_checks() {
    let verifier = ScramSecret::from_password("pw", b"0123456789abcdef", 4096).to_pg_string();
    let cfg = config(AuthType::ScramSha256, &[("known", &verifier)]);
    let plus = || Some(ClientBinding::Plus(END_POINT.into()));
    let known = exchange(over_tls(cfg.clone()), "known", "wrong", plus());
    let unknown = exchange(over_tls(cfg.clone()), "ghost", "wrong", plus());
    assert_eq!(known.sasl, unknown.sasl);
    assert_eq!(sasl_mechanisms(&unknown.sasl), ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]);
    refused_as_wrong_password(known.end, "known");
    refused_as_wrong_password(unknown.end, "ghost");
    // Another certificate's hash fails the binding check first, for both.
    for user in ["known", "ghost"] {
        let e = exchange(over_tls(cfg.clone()), user, "wrong", Some(ClientBinding::Plus(vec![1; 32]))).end;
        closed_with_message(e, "28000", "SCRAM channel binding check failed");
    }
}

#[test]
fn an_unknown_user_under_md5_or_password_is_asked_the_same_and_refused() {
    let md5 = crate::auth::md5_secret("known", "pw");
    for (auth, code) in [(AuthType::Md5, 5), (AuthType::Password, 3)] {
        let cfg = config(auth, &[("known", md5.as_str()), ("plain", "pw")]);
        let mut asked = Vec::new();
        for user in ["known", "plain", "ghost"] {
            let mut m = login(cfg.clone());
            assert!(matches!(m.handle_bytes(&mut startup(&[("user", user)])), Step::NeedBytes));
            assert_eq!(auth_code(&m.to_client), code, "{auth:?} {user}");
            asked.push(m.to_client.to_vec());
            refused_as_wrong_password(m.handle_bytes(&mut password_msg(b"md5wrong", true)), user);
        }
        assert!(asked.iter().all(|a| *a == asked[0]), "{auth:?}: the same request for all");
        // A malformed answer is a protocol violation for an unknown user as for a known one.
        for user in ["known", "ghost"] {
            let mut m = login(cfg.clone());
            m.handle_bytes(&mut startup(&[("user", user)]));
            closed_with_message(
                m.handle_bytes(&mut password_msg(b"md5wrong", false)),
                "08P01",
                "invalid password packet size",
            );
            let mut m = login(cfg.clone());
            m.handle_bytes(&mut startup(&[("user", user)]));
            let mut q = BytesMut::new();
            frontend::query(&mut q, "SELECT 1");
            closed_with_message(m.handle_bytes(&mut q), "08P01", "expected password response, got message type 81");
        }
    }
}

#[test]
fn auth_query_unknown_users_get_the_configured_method() {
    for (auth, code) in [(AuthType::ScramSha256, 10), (AuthType::Md5, 5), (AuthType::Password, 3)] {
        let mut cfg = (*config(auth, &[])).clone();
        cfg.auth_query = Some("SELECT usename, passwd FROM pg_shadow WHERE usename = $1".into());
        cfg.auth_user = Some("auth".into());
        let mut m = login(Arc::new(cfg));
        assert!(matches!(m.handle_bytes(&mut startup(&[("user", "ghost")])), Step::NeedSecret));
        assert!(matches!(m.handle_secret(None), Step::NeedBytes));
        assert_eq!(auth_code(&m.to_client), code, "{auth:?}");
    }
}

/// A login of `user` (under `auth`, known with password "pw") waiting for its password
/// message.
fn asked(auth: AuthType, user: &str) -> Login {
    let mut m = login(config(auth, &[("known", "pw")]));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", user)])), Step::NeedBytes));
    m.to_client.clear();
    m
}

#[test]
fn password_messages_are_read_as_postgres_reads_them() {
    for auth in [AuthType::Password, AuthType::Md5] {
        for user in ["known", "ghost"] {
            for bad in [&b"pw"[..], b"", b"p\0w\0", b"pw\0\0"] {
                let step = asked(auth, user).handle_bytes(&mut password_msg(bad, false));
                closed_with_message(step, "08P01", "invalid password packet size");
            }
            let step = asked(auth, user).handle_bytes(&mut password_msg(b"", true));
            closed_with_message(step, "28P01", "empty password returned by client");
            // Longer than PostgreSQL reads: closed without a word.
            let step = asked(auth, user).handle_bytes(&mut password_msg(&[b'a'; 70_000], true));
            assert!(matches!(step, Step::Close(None)), "{step:?}");
        }
    }
    // A password of 20000 bytes is read (and is wrong).
    let step = asked(AuthType::Password, "known").handle_bytes(&mut password_msg(&[b'a'; 20_000], true));
    closed_with(step, "28P01");
}

/// A SASLInitialResponse body as raw bytes.
fn sasl_initial(body: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u8(b'p');
    b.put_i32(body.len() as i32 + 4);
    b.put_slice(body);
    b
}

#[test]
fn sasl_messages_are_read_as_postgres_reads_them() {
    let first = b"n,,n=,r=abc";
    let with_len = |mech: &[u8], len: i32, data: &[u8]| {
        let mut v = mech.to_vec();
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(data);
        v
    };
    let cases: [(Vec<u8>, &str); 7] = [
        (b"SCRAM-SHA-256".to_vec(), "invalid string in message"),
        (with_len(b"FOO\0", 11, first), "client selected an invalid SASL authentication mechanism"),
        (b"SCRAM-SHA-256\0\0\0".to_vec(), "insufficient data left in message"),
        (with_len(b"SCRAM-SHA-256\0", 50, first), "insufficient data left in message"),
        (with_len(b"SCRAM-SHA-256\0", -2, first), "insufficient data left in message"),
        (with_len(b"SCRAM-SHA-256\0", 3, first), "invalid message format"),
        (with_len(b"SCRAM-SHA-256\0", 0, b""), "malformed SCRAM message"),
    ];
    for user in ["known", "ghost"] {
        for (body, message) in &cases {
            let step = asked(AuthType::ScramSha256, user).handle_bytes(&mut sasl_initial(body));
            closed_with_message(step, "08P01", message);
        }
        let mut q = BytesMut::new();
        frontend::query(&mut q, "SELECT 1");
        let step = asked(AuthType::ScramSha256, user).handle_bytes(&mut q);
        closed_with_message(step, "08P01", "expected SASL response, got message type 81");
        // Longer than PostgreSQL reads: the exchange fails.
        let step = asked(AuthType::ScramSha256, user).handle_bytes(&mut password_msg(&[b'a'; 70_000], false));
        refused_as_wrong_password(step, user);
    }
}

#[test]
fn a_sasl_initial_response_without_data_gets_an_empty_challenge() {
    let mut m = asked(AuthType::ScramSha256, "known");
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(-1i32).to_be_bytes());
    assert!(matches!(m.handle_bytes(&mut sasl_initial(&body)), Step::NeedBytes));
    assert_eq!(&m.to_client[..], &[b'R', 0, 0, 0, 8, 0, 0, 0, 11], "an empty AuthenticationSASLContinue");
    m.to_client.clear();
    let mut client = ScramClient::with_password("pw", "c".into());
    assert!(matches!(m.handle_bytes(&mut password_msg(&client.client_first(), false)), Step::NeedBytes));
    let server_first = m.to_client[9..].to_vec();
    m.to_client.clear();
    let client_final = client.handle_server_first(&server_first).expect("server-first");
    assert!(matches!(m.handle_bytes(&mut password_msg(&client_final, false)), Step::Authenticated(_)));
}

#[test]
fn bad_startup_lengths_close_without_a_word() {
    let mut cancel_without_key = BytesMut::new();
    cancel_without_key.put_i32(8);
    cancel_without_key.put_i32(80877102);
    for bytes in [
        &b"X\0\0\0\x04"[..], // Terminate before any startup packet (node-postgres's end())
        &[0, 0, 0, 3, 0, 0, 0, 0],
        &[0, 0, 0x4e, 0x21, 0, 3, 0, 0],
        &[0xff, 0xff, 0xff, 0xff],
        b"GET / HTTP/1.1\r\n\r\n",
        &cancel_without_key,
    ] {
        let mut m = login(config(AuthType::Trust, &[]));
        let step = m.handle_bytes(&mut BytesMut::from(bytes));
        assert!(matches!(step, Step::Close(None)), "{bytes:?}: {step:?}");
        assert!(m.to_client.is_empty());
    }
    // After an SSLRequest too.
    let mut m = login(config(AuthType::Trust, &[]));
    let mut buf = request(80877103);
    buf.extend_from_slice(b"X\0\0\0\x04");
    assert!(matches!(m.handle_bytes(&mut buf), Step::Close(None)));
    // A bad layout is answered, in PostgreSQL's words.
    let mut buf = BytesMut::new();
    buf.put_i32(14);
    buf.put_i32(196608);
    buf.put_slice(b"user\0x");
    closed_with_message(
        login(config(AuthType::Trust, &[])).handle_bytes(&mut buf),
        "08P01",
        "invalid startup packet layout: expected terminator as last byte",
    );
}

#[test]
fn too_many_clients_is_said_after_the_ssl_answer_and_the_startup_packet() {
    let refused = |transport: Transport| {
        Login::new(config(AuthType::Trust, &[]), Some(Refusal::TooManyClients), Entropy::random())
            .with_transport(transport)
    };
    let too_many = |step| closed_with_message(step, "53300", "sorry, too many clients already");
    for code in [80877103, 80877104] {
        let mut m = refused(Transport::default());
        assert!(matches!(m.handle_bytes(&mut request(code)), Step::NeedBytes));
        assert_eq!(&m.to_client[..], b"N");
        too_many(m.handle_bytes(&mut startup(&[("user", "u")])));
    }
    // TLS configured: 'S', the handshake, then the refusal.
    let mut m = refused(Transport { tls: true, mode: crate::config::ClientTlsMode::Prefer, ..Transport::default() });
    assert!(matches!(m.handle_bytes(&mut request(80877103)), Step::StartTls { direct: false }));
    assert_eq!(&m.to_client[..], b"S");
    m.to_client.clear();
    assert!(matches!(m.handle_tls_started(false, None, None), Step::NeedBytes));
    too_many(m.handle_bytes(&mut startup(&[("user", "u")])));
    // Without a request; and a cancel is still handed on.
    too_many(refused(Transport::default()).handle_bytes(&mut startup(&[("user", "u")])));
    let step = refused(Transport::default()).handle_bytes(&mut cancel_request(42, &7i32.to_be_bytes()));
    assert!(matches!(step, Step::Cancel { pid: 42, .. }), "{step:?}");
}
