//! `ldap` and `pam`: the client is asked for a cleartext password, which the driver checks
//! (`Step::CheckPassword`); its verdict lets the client in or refuses it with PostgreSQL's
//! words. Neither `[users]` nor `auth_query` is asked; console users keep their secrets, and
//! one with none is checked as everyone is.

use super::*;
use crate::auth::ldap::LdapOptions;

fn ldap_options() -> Arc<LdapOptions> {
    Arc::new(LdapOptions::from_text(r#"ldapserver=127.0.0.1 ldapprefix="uid=" ldapsuffix=",dc=x""#).expect("valid"))
}

fn external_config(auth: AuthType) -> Arc<Config> {
    let mut cfg = (*config(auth, &[("admin", "adminpw")])).clone();
    cfg.ldap = Some(ldap_options());
    cfg.auth_pam_service = "svc".into();
    // Not asked: an unknown user is not looked up.
    cfg.auth_query = Some("SELECT usename, passwd FROM pg_shadow WHERE usename = $1".into());
    cfg.auth_user = Some("admin".into());
    cfg.admin_users = vec!["admin".into()];
    Arc::new(cfg)
}

/// A login under `auth` up to the password check of `password` by user `user`.
fn up_to_the_check(auth: AuthType, user: &str, password: &str) -> (Login, Checker) {
    let mut m = login(external_config(auth));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", user), ("database", "app")])), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 3, "a cleartext password is asked for");
    m.to_client.clear();
    match m.handle_bytes(&mut password_msg(password.as_bytes(), true)) {
        Step::CheckPassword { checker, user: u, password: p } => {
            assert_eq!((u.as_str(), p.0.as_slice()), (user, password.as_bytes()));
            assert!(m.to_client.is_empty());
            // Nothing more is read meanwhile.
            assert!(matches!(m.handle_bytes(&mut BytesMut::from(&b"garbage"[..])), Step::NeedBytes));
            (m, checker)
        }
        other => panic!("expected a password check, got {other:?}"),
    }
}

#[test]
fn ldap_asks_cleartext_and_the_verdict_decides() {
    let (mut m, checker) = up_to_the_check(AuthType::Ldap, "ghost", "pw");
    assert_eq!(checker, Checker::Ldap(ldap_options()));
    match m.handle_password_verdict(true) {
        Step::Authenticated(Credentials::Password(p)) => assert_eq!(p, "pw", "the server login uses it too"),
        other => panic!("{other:?}"),
    }
    assert_eq!(tags_of(&m.to_client), "R", "AuthenticationOk");
    assert_eq!(auth_code(&m.to_client), 0);
    // A second verdict is nothing.
    assert!(matches!(m.handle_password_verdict(true), Step::NeedBytes));

    let (mut m, _) = up_to_the_check(AuthType::Ldap, "ghost", "pw");
    let e = closed_with(m.handle_password_verdict(false), "28000");
    assert_eq!(e.message, "LDAP authentication failed for user \"ghost\"");
}

#[test]
fn pam_asks_cleartext_and_the_verdict_decides() {
    let (mut m, checker) = up_to_the_check(AuthType::Pam, "u", "s3cret");
    assert_eq!(checker, Checker::Pam { service: "svc".into() });
    assert!(matches!(m.handle_password_verdict(true), Step::Authenticated(Credentials::Password(_))));
    let (mut m, _) = up_to_the_check(AuthType::Pam, "u", "s3cret");
    let e = closed_with(m.handle_password_verdict(false), "28000");
    assert_eq!(e.message, "PAM authentication failed for user \"u\"");
}

#[test]
fn an_empty_password_is_refused_without_a_check() {
    for auth in [AuthType::Ldap, AuthType::Pam] {
        let mut m = login(external_config(auth));
        assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
        let e = closed_with(m.handle_bytes(&mut password_msg(b"", true)), "28P01");
        assert_eq!(e.message, "empty password returned by client", "{auth:?}");
    }
}

#[test]
fn console_users_keep_their_configured_secrets() {
    // SCRAM against the [users] secret, not LDAP.
    let mut m = login(external_config(AuthType::Ldap));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "admin"), ("database", ADMIN_DB)])), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 10);
    let mut client = ScramClient::with_password("adminpw", "c".into());
    assert!(matches!(
        finish_scram(&mut m, crate::auth::SCRAM_SHA_256, &mut client),
        Step::Console { read_only: false }
    ));
    // An admin with no configured secret (a pgbouncer.ini's auth_file is not read under
    // pam) is checked as everyone is, and is then the admin it is listed as.
    let mut cfg = (*external_config(AuthType::Pam)).clone();
    cfg.admin_users.push("ops".into());
    let mut m = login(Arc::new(cfg));
    assert!(matches!(m.handle_bytes(&mut startup(&[("user", "ops"), ("database", ADMIN_DB)])), Step::NeedBytes));
    assert_eq!(auth_code(&m.to_client), 3, "a cleartext password for PAM");
    m.to_client.clear();
    assert!(matches!(m.handle_bytes(&mut password_msg(b"pw", true)), Step::CheckPassword { .. }));
    assert!(matches!(m.handle_password_verdict(true), Step::Console { read_only: false }));
}

#[test]
fn hba_ldap_and_pam_lines_name_their_checker() {
    let rules = "host all all 10.0.0.0/8 ldap ldapserver=127.0.0.1 ldapprefix=\"uid=\" ldapsuffix=\",dc=x\"\n\
                 host all all 11.0.0.0/8 pam pamservice=mine\n\
                 host all all 12.0.0.0/8 pam\n";
    let mut cfg = (*external_config(AuthType::Hba)).clone();
    cfg.hba = Some(Arc::new(crate::auth::hba::Hba::parse(rules, &mut |_| Err("no".into())).expect("rules")));
    let cfg = Arc::new(cfg);
    for (addr, want) in [
        ("10.0.0.1", Checker::Ldap(ldap_options())),
        ("11.0.0.1", Checker::Pam { service: "mine".into() }),
        ("12.0.0.1", Checker::Pam { service: "svc".into() }),
    ] {
        let mut m = login(cfg.clone())
            .with_transport(Transport { addr: Some(addr.parse().expect("ip")), ..Transport::default() });
        assert!(matches!(m.handle_bytes(&mut startup(&[("user", "u")])), Step::NeedBytes));
        assert_eq!(auth_code(&m.to_client), 3);
        match m.handle_bytes(&mut password_msg(b"pw", true)) {
            Step::CheckPassword { checker, .. } => assert_eq!(checker, want, "{addr}"),
            other => panic!("{addr}: {other:?}"),
        }
        let e = closed_with(m.handle_password_verdict(false), "28000");
        let what = if addr == "10.0.0.1" { "LDAP" } else { "PAM" };
        assert_eq!(e.message, format!("{what} authentication failed for user \"u\""));
    }
}
