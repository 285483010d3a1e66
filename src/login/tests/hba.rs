//! `auth_type = "hba"` in the login: the client's address, socket and TLS pick the line,
//! whose method then runs as the global one would.

use super::*;

const RULES: &str = "
local all  os      peer
local all  all     trust
host  all  cert    0.0.0.0/0    cert
host  all  shut    all          reject
host  all  all     127.0.0.1/32 md5
host  all  all     10.0.0.0/8   scram-sha-256
";

fn hba_login(addr: Option<&str>, os_user: Option<&str>) -> Login {
    let mut cfg = (*config(AuthType::Hba, &[("u", "pw")])).clone();
    let hba = crate::auth::hba::Hba::parse(RULES, &mut |_| Err("no includes".into())).expect("rules");
    cfg.hba = Some(Arc::new(hba));
    login(Arc::new(cfg)).with_transport(Transport {
        unix: addr.is_none(),
        addr: addr.map(|a| a.parse().expect("ip")),
        os_user: os_user.map(str::to_owned),
        ..Transport::default()
    })
}

fn refused(m: &mut Login, user: &str, message: &str) {
    match m.handle_bytes(&mut startup(&[("user", user), ("database", "d")])) {
        Step::Close(Some(e)) => {
            assert_eq!(e.code.0, "28000", "{e}");
            assert_eq!(e.message, message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_line_decides_the_method() {
    // md5 from 127.0.0.1, SCRAM from 10/8, trust on the unix socket.
    let mut m = hba_login(Some("127.0.0.1"), None);
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 5);
    let mut m = hba_login(Some("10.9.8.7"), None);
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 10);
    let mut m = hba_login(None, None);
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::Authenticated(_)));
}

#[test]
fn reject_and_no_line_are_refused_as_postgresql_refuses() {
    refused(
        &mut hba_login(Some("127.0.0.1"), None),
        "shut",
        "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"shut\", database \"d\", no encryption",
    );
    refused(
        &mut hba_login(Some("192.168.1.1"), None),
        "u",
        "no pg_hba.conf entry for host \"192.168.1.1\", user \"u\", database \"d\", no encryption",
    );
}

#[test]
fn peer_needs_the_same_os_user() {
    let mut m = hba_login(None, Some("os"));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "os")])), Step::Authenticated(_)));
    refused(&mut hba_login(None, Some("root")), "os", "Peer authentication failed for user \"os\"");
    refused(&mut hba_login(None, None), "os", "Peer authentication failed for user \"os\"");
}

#[test]
fn cert_needs_a_certificate_naming_the_user() {
    refused(&mut hba_login(Some("1.2.3.4"), None), "cert", "connection requires a valid client certificate");
    let mut m = hba_login(Some("1.2.3.4"), None);
    m.set_cert_name(Some("other".into()));
    refused(&mut m, "cert", "certificate authentication failed for user \"cert\"");
    let mut m = hba_login(Some("1.2.3.4"), None);
    m.set_cert_name(Some("cert".into()));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "cert")])), Step::Authenticated(_)));
}

#[test]
fn without_a_parsed_file_nobody_gets_in() {
    let mut m = login(config(AuthType::Hba, &[])).with_transport(Transport::default());
    closed_with(m.handle_bytes(&mut startup(&[("user", "u")])), "28000");
}
