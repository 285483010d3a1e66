//! What a client sees of refusals, byte for byte as PostgreSQL shows them: bad startup
//! packets, and connections refused beyond `max_client_conn`.

use super::*;

fn closed_with_message(step: Step, code: &str, message: &str) {
    match step {
        Step::Close(Some(e)) => assert_eq!((e.code.0, &*e.message), (code, message), "{e:?}"),
        other => panic!("expected {code} {message:?}, got {other:?}"),
    }
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
