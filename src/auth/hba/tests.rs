//! The rules-and-cases idea of PgBouncer's hba test, with cases of our own: a file, then
//! one line per connection with the method expected ("reject" for a refusal or no rule).

use super::*;
use crate::auth::ldap;

const RULES: &str = r#"
# comments, blank lines and odd whitespace are nothing
 	 	
		# indented comment
local   ldb      all                        peer
local   all      lpw                        password
local   all      all                        md5

hostssl all      all      10.0.0.0/8        cert
hostnossl all    all      11.0.0.0/8        md5
host    all      all      127.0.0.0  255.255.255.0  password
host    db1      all      0.0.0.0/0         scram-sha-256
host    all      u1       15.0.0.0/8        md5
host    t1,all   a1,a2 , a3   16.0.0.0/8    trust   # lists with spaces around a comma
host    "all"    "all"    19.0.0.0/8        cert
host    "q""x"   "a , b"  19.0.0.0/8        trust
host    sameuser all      20.0.0.0/8        trust
host    @dbs.txt @users.txt 21.0.0.0/8      md5
host    m        u        128.0.0.0/9       trust
host    m        u        128.0.0.0/1       reject
host    m        u        fe80::/10         md5
host    m        u        ::1/128           trust
host    m2       u        all               scram-sha-256
host    replication,r admin ::1/128         trust
"#;

/// Expected method, database, user, address ("unix" for a unix socket), and "tls" or
/// "replication" when the connection is.
const CASES: &str = "
peer          ldb    x     unix
password      d      lpw   unix
md5           d      x     unix
cert          d      x     10.1.2.3   tls
reject        d      x     10.1.2.3
md5           d      x     11.1.2.3
reject        d      x     11.1.2.3   tls
password      d      x     127.0.0.9
password      d      x     127.0.0.9  tls
scram-sha-256 db1    x     127.0.1.1
reject        db1x   x     127.0.1.1
md5           d      u1    15.9.9.9
reject        d      u2    15.9.9.9
trust         d      a1    16.0.0.1
trust         d      a3    16.0.0.1
reject        d      a4    16.0.0.1
reject        d      x     19.0.0.1
cert          all    all   19.0.0.1
trust         q\"x   a~,~b 19.0.0.1
trust         bob    bob   20.1.1.1
reject        bob    ann   20.1.1.1
md5           inc2   iu1   21.0.0.1
md5           inc1   iu2   21.0.0.1
reject        inc3   iu1   21.0.0.1
trust         m      u     128.1.2.3
reject        m      u     200.1.2.3
reject        m      u     127.1.2.3
md5           m      u     fe80::1
trust         m      u     ::1
trust         m      u     ::ffff:128.0.0.1
reject        m      u     ::2
scram-sha-256 m2     u     1.2.3.4
scram-sha-256 m2     u     face::1
md5           m2     u     unix
trust         m      admin ::1    replication
reject        m      u     ::1    replication
trust         r      admin ::1
trust         x      admin ::1    replication
";

fn read(name: &str) -> Result<String, String> {
    match name {
        "dbs.txt" => Ok("inc1, inc2\n# comment\n".into()),
        "users.txt" => Ok("iu1\n\"iu2\" @more.txt\n".into()),
        "more.txt" => Ok("iu3".into()),
        other => Err(format!("no file {other}")),
    }
}

fn name(m: Option<Method>) -> &'static str {
    match m {
        None | Some(Method::Reject) => "reject",
        Some(Method::Trust) => "trust",
        Some(Method::Md5) => "md5",
        Some(Method::Password) => "password",
        Some(Method::ScramSha256) => "scram-sha-256",
        Some(Method::Cert) => "cert",
        Some(Method::Peer) => "peer",
        Some(Method::Ldap) => "ldap",
        Some(Method::Pam) => "pam",
    }
}

#[test]
fn each_case_gets_the_first_matching_line() {
    let hba = Hba::parse(RULES, &mut read).expect("the rules parse");
    let mut failed = Vec::new();
    for line in CASES.lines().filter(|l| !l.trim().is_empty()) {
        // A `~` in a name is a space, `\"` a quote.
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (want, db, addr) = (cols[0], cols[1].replace("\\\"", "\""), cols[3]);
        let user = cols[2].replace('~', " ");
        let flag = cols.get(4).copied().unwrap_or("");
        let client = Client {
            addr: if addr == "unix" { None } else { Some(addr.parse().expect("an address")) },
            tls: flag == "tls",
            replication: flag == "replication",
            db: &db,
            user: &user,
        };
        let got = name(hba.find(&client).map(|r| r.method));
        if got != want {
            failed.push(format!("{line}: got {got}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn cert_and_peer_lines_may_name_a_map() {
    let hba =
        Hba::parse("hostssl all all all cert map=certs\nlocal all all peer map=os\nlocal all all peer\n", &mut read)
            .expect("parses");
    let maps: Vec<_> = hba.rules.iter().map(|r| r.map.as_deref()).collect();
    assert_eq!(maps, [Some("certs"), Some("os"), None]);
}

#[test]
fn ldap_and_pam_lines_carry_their_options() {
    let text = r#"
host all l1 all ldap ldapserver=127.0.0.1 ldapport=3890 ldapprefix="uid=" ldapsuffix=",dc=example,dc=net"
host all l2 all ldap ldapurl="ldap://127.0.0.1:3890/dc=example,dc=net?uid?sub"
host all l3 all ldap ldapserver="h1 h2",ldapbasedn="dc=x" ldapsearchfilter="(|(uid=$username)(cn=$username))"
host all l4 all ldap ldapserver=h ldap"prefix"="cn=""q"" "
local all p1 pam
local all p2 pam pamservice=parsnip-test
"#;
    let hba = Hba::parse(text, &mut read).expect("parses");
    let r = &hba.rules;
    assert_eq!(
        r.iter().map(|r| name(Some(r.method))).collect::<Vec<_>>(),
        ["ldap", "ldap", "ldap", "ldap", "pam", "pam"]
    );
    let o = r[0].ldap.as_deref().expect("options");
    assert_eq!(
        (o.urls(), &o.mode),
        (
            vec!["ldap://127.0.0.1:3890".to_owned()],
            &ldap::Mode::Simple { prefix: "uid=".into(), suffix: ",dc=example,dc=net".into() }
        )
    );
    let o = r[1].ldap.as_deref().expect("options");
    assert!(matches!(&o.mode, ldap::Mode::Search { base, scope: ldap::Scope::Sub, attribute, filter: None, .. }
        if base == "dc=example,dc=net" && attribute == "uid"));
    let o = r[2].ldap.as_deref().expect("options");
    assert_eq!(o.servers, ["h1", "h2"], "a comma outside quotes separates options");
    assert!(matches!(&o.mode, ldap::Mode::Search { filter: Some(f), .. } if f == "(|(uid=$username)(cn=$username))"));
    // Quotes anywhere in a token, `""` as a quote; an unquoted comma ends an option.
    let o = r[3].ldap.as_deref().expect("options");
    assert_eq!(o.mode, ldap::Mode::Simple { prefix: "cn=\"q\" ".into(), suffix: String::new() });
    assert_eq!((r[4].pam_service.as_deref(), r[5].pam_service.as_deref()), (None, Some("parsnip-test")));
    assert!(r.iter().all(|r| r.map.is_none()));
}

#[test]
fn bad_lines_fail_the_file_naming_the_line() {
    for (text, why) in [
        ("host all all 1.2.3.4 md5", "invalid IP mask \"md5\""),
        ("host all all 1.2.3.0/33 md5", "invalid CIDR mask"),
        ("host all all 1.2.3.0 ffff::0 md5", "do not match"),
        ("host all all example.com md5", "host names"),
        ("host all all samenet md5", "not supported"),
        ("host all all 1.2.3.0/24 ident", "\"ident\" is not supported"),
        ("host all all 1.2.3.0/24", "before the authentication method"),
        ("host all +grp 1.2.3.0/24 md5", "group names"),
        ("host samerole all 1.2.3.0/24 md5", "not supported"),
        ("host all all 1.2.3.0/24 md5 map=x", "only supported on cert and peer"),
        ("host all all 1.2.3.0/24 cert clientcert=verify-full", "option \"clientcert=verify-full\""),
        ("host all all 1.2.3.0/24 peer", "only supported on local"),
        ("hostgssenc all all all md5", "GSSAPI"),
        ("hots all all all md5", "invalid connection type"),
        ("host all,,x all all md5", "empty item"),
        ("host \"all all all md5", "unterminated"),
        ("host @gone.txt all all md5", "no file gone.txt"),
        ("local all", "user field"),
        ("host all all all ldap", "ldapserver"),
        ("host all all all ldap ldapserver=h ldapprefix=x ldapbasedn=y", "together with ldapprefix"),
        ("host all all all ldap ldapserver=h ldaptls=2 ldapprefix=x", "invalid ldaptls"),
        ("host all all all ldap ldapserver=h ldapprefix=x map=m", "invalid authentication option \"map\""),
        ("host all all all ldap ldapserver=h ldapsuffix=,dc=x", "invalid authentication option \"dc\""),
        ("local all all pam map=x", "only supported on cert and peer"),
        ("local all all pam pam_use_hostname=1", "option \"pam_use_hostname=1\""),
        ("local all all md5 pamservice=x", "option \"pamservice=x\""),
    ] {
        let text = format!("# first\n{text}\n");
        match Hba::parse(&text, &mut read) {
            Ok(_) => panic!("{text:?} parsed"),
            Err(e) => assert!(e.starts_with("line 2: ") && e.contains(why), "{text:?}: {e}"),
        }
    }
}

#[test]
fn refusals_say_what_postgresql_says() {
    let c = Client { addr: Some("127.0.0.1".parse().expect("ip")), tls: false, replication: false, db: "d", user: "u" };
    let e = refusal(&c, false);
    assert_eq!(e.code, SqlState::INVALID_AUTHORIZATION_SPECIFICATION);
    assert_eq!(e.message, "no pg_hba.conf entry for host \"127.0.0.1\", user \"u\", database \"d\", no encryption");
    let local = Client { addr: None, tls: false, ..c };
    assert_eq!(
        refusal(&local, true).message,
        "pg_hba.conf rejects connection for host \"[local]\", user \"u\", database \"d\", no encryption"
    );
    let tls = Client { addr: Some("::ffff:10.0.0.1".parse().expect("ip")), tls: true, ..c };
    assert_eq!(
        refusal(&tls, false).message,
        "no pg_hba.conf entry for host \"10.0.0.1\", user \"u\", database \"d\", SSL encryption"
    );
}
