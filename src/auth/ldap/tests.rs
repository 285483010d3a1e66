//! LDAP options as PostgreSQL reads them: both modes, `ldapurl`, the refused combinations,
//! and the user names refused before a server is asked.

use super::*;

fn parse(text: &str) -> Result<LdapOptions, String> {
    LdapOptions::from_text(text)
}

#[test]
fn simple_bind_options() {
    let o = parse(r#"ldapserver=127.0.0.1 ldapport=3890 ldapprefix="uid=" ldapsuffix=",ou=people,dc=example,dc=net""#)
        .expect("valid");
    assert_eq!(o.servers, ["127.0.0.1"]);
    assert_eq!(o.port, 3890);
    assert_eq!(o.mode, Mode::Simple { prefix: "uid=".into(), suffix: ",ou=people,dc=example,dc=net".into() });
    assert_eq!(o.urls(), ["ldap://127.0.0.1:3890"]);
    // Several servers in one quoted value; the default port.
    let o = parse(r#"ldapserver="a.example b.example" ldapsuffix="@example.net" ldapscheme=ldap ldaptls=0"#)
        .expect("valid");
    assert_eq!(o.urls(), ["ldap://a.example:389", "ldap://b.example:389"]);
}

#[test]
fn search_bind_options() {
    let o = parse(
        "ldapserver=::1 ldapbasedn=\"dc=example,dc=net\" ldapbinddn=\"cn=admin,dc=example,dc=net\" \
         ldapbindpasswd=secret ldapsearchattribute=cn",
    )
    .expect("valid");
    assert_eq!(o.urls(), ["ldap://[::1]:389"]);
    let Mode::Search { base, scope, bind_dn, bind_password, attribute, filter } = o.mode else { panic!("search") };
    assert_eq!((base.as_str(), scope), ("dc=example,dc=net", Scope::Sub));
    assert_eq!((bind_dn.as_deref(), bind_password.as_str()), (Some("cn=admin,dc=example,dc=net"), "secret"));
    assert_eq!((attribute.as_str(), filter), ("cn", None));
    let o = parse(r#"ldapserver=h ldapbasedn="dc=x" ldapsearchfilter="(|(uid=$username)(mail=$username))""#)
        .expect("valid");
    let Mode::Search { filter, attribute, .. } = &o.mode else { panic!("search") };
    assert_eq!(
        LdapOptions::search_filter(attribute, filter.as_deref(), "bob").as_deref(),
        Some("(|(uid=bob)(mail=bob))")
    );
}

#[test]
fn tls_options() {
    let o = parse("ldapserver=h ldaptls=1 ldapprefix=x").expect("valid");
    assert_eq!((o.tls, o.urls()), (Security::StartTls, vec!["ldap://h:389".to_owned()]));
    let o = parse("ldapserver=h ldapscheme=ldaps ldapprefix=x").expect("valid");
    assert_eq!((o.tls, o.urls()), (Security::Ldaps, vec!["ldaps://h:636".to_owned()]));
    let o = parse(r#"ldapurl="ldaps://h:1636/dc=x?uid?sub""#).expect("valid");
    assert_eq!((o.tls, o.urls()), (Security::Ldaps, vec!["ldaps://h:1636".to_owned()]));
    let o = parse("ldapserver=h ldaptls=0 ldapprefix=x").expect("valid");
    assert_eq!(o.tls, Security::Plain);
}

#[test]
fn ldap_url() {
    let o = parse(r#"ldapurl="ldap://127.0.0.1:3890/dc=example,dc=net?uid?sub""#).expect("valid");
    assert_eq!(o.urls(), ["ldap://127.0.0.1:3890"]);
    let Mode::Search { base, scope, bind_dn, attribute, filter, .. } = o.mode else { panic!("search") };
    assert_eq!(
        (base.as_str(), scope, bind_dn, attribute.as_str(), filter),
        ("dc=example,dc=net", Scope::Sub, None, "uid", None)
    );
    // Scope base by default (RFC 4516); a filter; percent-encoding; binddn alongside.
    let o = parse(r#"ldapurl="ldap://h/ou=a%20b,dc=x??one?(objectClass=person)" ldapbinddn="cn=r""#).expect("valid");
    assert_eq!(o.port, 389);
    let Mode::Search { base, scope, filter, attribute, bind_dn, .. } = o.mode else { panic!("search") };
    assert_eq!((base.as_str(), scope, filter.as_deref()), ("ou=a b,dc=x", Scope::One, Some("(objectClass=person)")));
    assert_eq!((attribute.as_str(), bind_dn.as_deref()), ("uid", Some("cn=r")));
    let Mode::Search { scope, .. } = parse("ldapurl=ldap://h/dc=x").expect("valid").mode else { panic!() };
    assert_eq!(scope, Scope::Base);
}

#[test]
fn refused_options() {
    for (text, why) in [
        ("", "ldapserver"),
        ("ldapserver=h", "ldapprefix"),
        (r#"ldapserver=h ldapprefix="uid=" ldapbasedn="dc=x""#, "together with ldapprefix"),
        (r#"ldapurl="ldap://h/dc=x?uid?sub" ldapsuffix=",dc=x""#, "together with ldapprefix"),
        (r#"ldapserver=h ldapbasedn=x ldapsearchattribute=uid ldapsearchfilter="(uid=$username)""#, "together"),
        ("ldapserver=h ldapbinddn=cn=x", "ldapbasedn"),
        ("ldapserver=h ldapport=0 ldapprefix=x", "port"),
        ("ldapserver=h ldapport=x ldapprefix=x", "port"),
        ("ldapserver=h ldaptls=1 ldapscheme=ldaps ldapprefix=x", "ldaptls=1 together with ldaps"),
        ("ldapurl=ldaps://h/dc=x ldaptls=1", "ldaptls=1 together with ldaps"),
        ("ldapserver=h ldaptls=yes ldapprefix=x", "invalid ldaptls"),
        ("ldapserver=h ldapscheme=ldapi ldapprefix=x", "invalid ldapscheme"),
        ("ldapurl=http://h/dc=x", "scheme"),
        ("ldapurl=ldap:///dc=x", "no host"),
        (r#"ldapurl="ldap://h/dc=x?uid,cn""#, "more than one"),
        ("ldapurl=ldap://h/dc=x?uid?deep", "scope"),
        ("ldapserver=h ldapprefix=x pamservice=y", "invalid authentication option"),
        ("ldapserver", "name=value"),
    ] {
        let e = parse(text).expect_err(text);
        assert!(e.contains(why), "{text}: {e}");
    }
}

#[test]
fn user_names_that_could_reach_another_entry_are_refused() {
    assert_eq!(LdapOptions::bind_dn("uid=", ",dc=x", "bob").as_deref(), Some("uid=bob,dc=x"));
    for bad in ["a,b", "a+b", "a\"b", "a\\b", "a<b", "a>b", "a;b", "a=b", "#a", " a", "a ", "a\0b", ""] {
        assert_eq!(LdapOptions::bind_dn("uid=", ",dc=x", bad), None, "{bad:?}");
    }
    assert_eq!(LdapOptions::search_filter("uid", None, "bob").as_deref(), Some("(uid=bob)"));
    for bad in ["*", "a(b", "a)b", "a\\2a", "a/b", "a\0"] {
        assert_eq!(LdapOptions::search_filter("uid", None, bad), None, "{bad:?}");
    }
}

#[test]
fn the_bind_password_is_not_shown() {
    assert_eq!(
        redacted(r#"ldapserver=h ldapbindpasswd="a b""c" ldapbasedn="dc=x",ldapbindpasswd=plain"#),
        r#"ldapserver=h ldapbindpasswd=******** ldapbasedn="dc=x",ldapbindpasswd=********"#
    );
    assert_eq!(redacted("ldapserver=h ldapprefix=x"), "ldapserver=h ldapprefix=x");
}
