//! `ldap` and `pam` against the real things: a slapd started by the test (its own
//! directory, an mdb database loaded with `slapadd`, a port of its own) and a PAM service
//! kept in a temp directory (`auth_pam_config_dir`) whose `pam_exec` script compares the
//! password. Simple bind and search+bind (hba lines, and the global `auth_type = "ldap"`),
//! wrong passwords, unknown and ambiguous users, and LDAP servers that refuse connections
//! or never answer, each refused with PostgreSQL's words, 28000, before the login's
//! timeout. The right password reaches the server too: parsnip logs in to PostgreSQL with
//! it (role `app`'s password is the same in LDAP, PAM and the cluster).
//!
//! slapd is needed (scripts/test.sh installs it): without it the LDAP test fails, saying so.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const SUFFIX: &str = "dc=example,dc=net";
const ROOT_DN: &str = "cn=admin,dc=example,dc=net";
const ROOT_PW: &str = "admin-pw";

/// A slapd of the test's own, killed on drop.
struct Slapd {
    child: Child,
    port: u16,
    /// With TLS: its ldaps port (its ldap port then needs StartTLS for anything).
    ldaps_port: u16,
    dir: PathBuf,
}

impl Slapd {
    /// Loads the entries (`app` with APP_PW; `dup1` and `dup2`, both cn=dup) and starts it.
    fn start() -> Slapd {
        Self::start_with(None)
    }

    /// With `certs`: also on an ldaps port, and TLS required (`security tls=1`).
    fn start_with(certs: Option<&Certs>) -> Slapd {
        let slapd = ["/usr/sbin/slapd", "/usr/local/sbin/slapd"].into_iter().find(|p| Path::new(p).exists());
        let Some(slapd) = slapd else {
            panic!("slapd is not installed (Debian: apt-get install slapd ldap-utils; scripts/test.sh does)");
        };
        let slapadd = Path::new(slapd).with_file_name("slapadd");
        let dir = temp_path("slapd");
        std::fs::create_dir_all(dir.join("db")).expect("slapd dir");
        let conf = dir.join("slapd.conf");
        std::fs::write(
            &conf,
            format!(
                "include /etc/ldap/schema/core.schema\ninclude /etc/ldap/schema/cosine.schema\n\
                 include /etc/ldap/schema/inetorgperson.schema\npidfile {d}/slapd.pid\n\
                 modulepath /usr/lib/ldap\nmoduleload back_mdb\ndatabase mdb\nmaxsize 10485760\n\
                 suffix \"{SUFFIX}\"\nrootdn \"{ROOT_DN}\"\nrootpw {ROOT_PW}\ndirectory {d}/db\n{tls}",
                d = dir.display(),
                tls = certs.map_or_else(String::new, |c| format!(
                    "TLSCACertificateFile {}\nTLSCertificateFile {}\nTLSCertificateKeyFile {}\nsecurity tls=1\n",
                    c.ca(),
                    c.cert(),
                    c.key()
                )),
            ),
        )
        .expect("slapd.conf");
        let person = |uid: &str, cn: &str, pw: &str| {
            format!(
                "dn: uid={uid},ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {cn}\nsn: {cn}\n\
                 userPassword: {pw}\n\n"
            )
        };
        let ldif = format!(
            "dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: Example\ndc: example\n\n\
             dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n\n{}{}{}",
            person("app", "App", APP_PW),
            person("dup1", "dup", "dup-pw"),
            person("dup2", "dup", "dup-pw"),
        );
        std::fs::write(dir.join("data.ldif"), ldif).expect("ldif");
        let out = Command::new(&slapadd)
            .arg("-f")
            .arg(&conf)
            .arg("-l")
            .arg(dir.join("data.ldif"))
            .output()
            .expect("running slapadd");
        assert!(out.status.success(), "slapadd: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let ldaps_port = if certs.is_some() { free_port() } else { 0 };
        let mut urls = format!("ldap://127.0.0.1:{port}/");
        if certs.is_some() {
            urls.push_str(&format!(" ldaps://127.0.0.1:{ldaps_port}/"));
        }
        let child = Command::new(slapd)
            .arg("-f")
            .arg(&conf)
            .arg("-h")
            .arg(urls)
            .args(["-d", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting slapd");
        let mut s = Slapd { child, port, ldaps_port, dir };
        // Ready once it takes connections (bounded).
        let deadline = Instant::now() + Duration::from_secs(20);
        for p in [port, ldaps_port].into_iter().filter(|&p| p != 0) {
            while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
                if let Ok(Some(status)) = s.child.try_wait() {
                    panic!("slapd exited: {status}");
                }
                assert!(Instant::now() < deadline, "slapd did not listen on {p} within 20s");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        s
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn db_section() -> String {
    format!("[databases.postgres]\nhost = \"127.0.0.1\"\nport = {}\n", cluster().port())
}

/// Logs in from `source` as `user` (cleartext asked for): a query's answer, or the error,
/// and how long the login took.
async fn login_from(port: u16, source: &str, user: &str, password: &str) -> (Result<String, PgError>, Duration) {
    let started = Instant::now();
    let mut raw = Raw::tcp_from(source, port).await;
    let res = raw.startup(&[("user", user), ("database", "postgres")], Some(password)).await;
    let took = started.elapsed();
    let res = match res {
        Ok(()) => {
            assert_eq!(raw.auth_requests.first(), Some(&3), "a cleartext password is asked for");
            let who = raw.scalar("select current_user").await.expect("a query").unwrap_or_default();
            Ok(who)
        }
        Err(e) => {
            // Closed after the error.
            assert!(raw.read_frame().await.is_none(), "the connection is closed after {e:?}");
            Err(e)
        }
    };
    (res, took)
}

fn ldap_refused(res: Result<String, PgError>, user: &str, context: &str) {
    let e = res.expect_err(context);
    assert_eq!(
        (e.code(), e.message()),
        ("28000", format!("LDAP authentication failed for user \"{user}\"").as_str()),
        "{context}"
    );
}

#[tokio::test]
async fn ldap_simple_and_search_bind() {
    let slapd = Slapd::start();
    let p = slapd.port;
    // A port nobody listens on; one that takes connections and never answers.
    let dead = free_port();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let silent_port = silent.local_addr().expect("its port").port();
    let search = format!("ldapbasedn=\"{SUFFIX}\" ldapbinddn=\"{ROOT_DN}\" ldapbindpasswd={ROOT_PW}");
    let hba = temp_path("ldap_hba.conf");
    std::fs::write(
        &hba,
        format!(
            "host all all 127.0.0.1/32 ldap ldapserver=127.0.0.1 ldapport={p} ldapprefix=\"uid=\" \
             ldapsuffix=\",ou=people,{SUFFIX}\"\n\
             host all all 127.0.0.2/32 ldap ldapurl=\"ldap://127.0.0.1:{p}/{SUFFIX}?uid?sub\"\n\
             host all all 127.0.0.3/32 ldap ldapserver=127.0.0.1 ldapport={dead} {search}\n\
             host all all 127.0.0.4/32 ldap ldapserver=127.0.0.1 ldapport={p} {search} \
             ldapsearchfilter=\"(|(uid=$username)(cn=$username))\"\n\
             host all all 127.0.0.5/32 ldap ldapserver=127.0.0.1 ldapport={silent_port} ldapprefix=\"uid=\"\n"
        ),
    )
    .expect("hba file");
    let login_timeout_ms = 3000;
    let px = Parsnip::with_config(&format!(
        "auth_type = \"hba\"\nauth_hba_file = \"{}\"\nclient_login_timeout_ms = {login_timeout_ms}\n{}",
        hba.display(),
        db_section()
    ));
    let port = px.port();
    bounded(60, "ldap logins", async {
        // Simple bind; search+bind by ldapurl and by a filter: in, and the server login
        // used the same password.
        for source in ["127.0.0.1", "127.0.0.2", "127.0.0.4"] {
            let (res, _) = login_from(port, source, "app", APP_PW).await;
            assert_eq!(res.expect(source), "app", "{source}");
            let (res, _) = login_from(port, source, "app", "wrong").await;
            ldap_refused(res, "app", &format!("{source}: a wrong password"));
            let (res, _) = login_from(port, source, "ghost", "whatever").await;
            ldap_refused(res, "ghost", &format!("{source}: an unknown user"));
            // Names that would mean something in a DN or a filter never reach the server.
            let (res, _) = login_from(port, source, "app,ou=people", APP_PW).await;
            ldap_refused(res, "app,ou=people", &format!("{source}: a DN in the name"));
            let (res, _) = login_from(port, source, "a*", APP_PW).await;
            ldap_refused(res, "a*", &format!("{source}: a wildcard in the name"));
        }
        // Two entries match: refused, even with their password.
        let (res, _) = login_from(port, "127.0.0.4", "dup", "dup-pw").await;
        ldap_refused(res, "dup", "not unique");
        // A server that refuses connections, and one that never answers: 28000 before the
        // login's timeout (whose own error is another).
        let (res, took) = login_from(port, "127.0.0.3", "app", APP_PW).await;
        ldap_refused(res, "app", "no LDAP server");
        assert!(took < Duration::from_millis(login_timeout_ms), "took {took:?}");
        let (res, took) = login_from(port, "127.0.0.5", "app", APP_PW).await;
        ldap_refused(res, "app", "a silent LDAP server");
        assert!(took < Duration::from_millis(login_timeout_ms), "took {took:?}");
    })
    .await;
    drop(silent);
    let logged = |needle: &str| px.wait_for_log(needle, Duration::from_secs(5));
    assert!(logged("could not connect to the LDAP server"), "the reason is logged: {}", px.logs());
    assert!(logged("is not unique"), "{}", px.logs());
    let _ = std::fs::remove_file(&hba);
}

#[tokio::test]
async fn ldap_over_starttls_and_ldaps() {
    let certs = Certs::new(&["127.0.0.1"]);
    let slapd = Slapd::start_with(Some(&certs));
    let (p, ps) = (slapd.port, slapd.ldaps_port);
    let hba = temp_path("ldap_tls_hba.conf");
    let simple = format!("ldapprefix=\"uid=\" ldapsuffix=\",ou=people,{SUFFIX}\"");
    std::fs::write(
        &hba,
        format!(
            "host all all 127.0.0.1/32 ldap ldapserver=127.0.0.1 ldapport={p} ldaptls=1 {simple}\n\
             host all all 127.0.0.2/32 ldap ldapurl=\"ldaps://127.0.0.1:{ps}/{SUFFIX}?uid?sub\"\n\
             host all all 127.0.0.3/32 ldap ldapserver=127.0.0.1 ldapport={p} {simple}\n\
             host all all 127.0.0.4/32 ldap ldapserver=localhost ldapport={ps} ldapscheme=ldaps {simple}\n"
        ),
    )
    .expect("hba file");
    let px = Parsnip::with_config(&format!(
        "auth_type = \"hba\"\nauth_hba_file = \"{}\"\nauth_ldap_tls_ca_file = \"{}\"\n{}",
        hba.display(),
        certs.ca(),
        db_section()
    ));
    let port = px.port();
    bounded(60, "ldap over TLS", async {
        // StartTLS, and ldaps: in; a wrong password still refused.
        for source in ["127.0.0.1", "127.0.0.2"] {
            let (res, _) = login_from(port, source, "app", APP_PW).await;
            assert_eq!(res.expect(source), "app", "{source}");
            let (res, _) = login_from(port, source, "app", "wrong").await;
            ldap_refused(res, "app", &format!("{source}: a wrong password"));
        }
        // The server wants TLS: a plaintext bind is refused by it.
        let (res, _) = login_from(port, "127.0.0.3", "app", APP_PW).await;
        ldap_refused(res, "app", "plaintext to a server that requires TLS");
        // A certificate for another name.
        let (res, _) = login_from(port, "127.0.0.4", "app", APP_PW).await;
        ldap_refused(res, "app", "the certificate does not name localhost");
    })
    .await;
    // Logged as the client is refused: it may reach the test's reader a moment after.
    let logged = |needle: &str| px.wait_for_log(needle, Duration::from_secs(5));
    assert!(logged("onfidentiality required"), "slapd's reason is logged: {}", px.logs());
    assert!(
        logged("certificate not valid for name \"localhost\""),
        "the certificate name check is logged: {}",
        px.logs()
    );
    let _ = std::fs::remove_file(&hba);
}

#[tokio::test]
async fn global_ldap_with_auth_ldap_options() {
    let slapd = Slapd::start();
    let opts = format!("ldapurl=\\\"ldap://127.0.0.1:{}/ou=people,{SUFFIX}?uid?one\\\"", slapd.port);
    let px = Parsnip::with_config(&format!(
        "auth_type = \"ldap\"\nauth_ldap_options = \"{opts}\"\nadmin_users = [\"postgres\"]\n\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n{}",
        db_section()
    ));
    bounded(60, "global ldap", async {
        let c = px.connect("app", APP_PW, "postgres").await;
        assert_eq!(c.scalar("select current_user").await.expect("a query"), "app");
        let db = expect_code(
            px.try_connect("app", Some("wrong"), "postgres").await.map(|_| ()),
            "28000",
            "a wrong password",
        );
        assert_eq!(db.message(), "LDAP authentication failed for user \"app\"");
        // The console keeps to its configured users (postgres is not in LDAP).
        px.try_connect("postgres", Some(SUPER_PW), "pgbouncer").await.expect("the console, by its [users] secret");
    })
    .await;
}

/// A PAM service in a temp directory: `pam_exec` runs a script that reads the password
/// on stdin and accepts user app with APP_PW.
fn pam_service() -> PathBuf {
    let dir = temp_path("pam.d");
    std::fs::create_dir_all(&dir).expect("pam dir");
    let script = dir.join("check.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\npw=$(tr -d '\\000')\n[ \"$PAM_USER\" = app ] && [ \"$pw\" = \"{APP_PW}\" ]\n"),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    std::fs::write(
        dir.join("parsnip-test"),
        format!(
            "auth required pam_exec.so expose_authtok quiet {}\naccount required pam_permit.so\n",
            script.display()
        ),
    )
    .expect("service file");
    dir
}

#[tokio::test]
async fn pam_with_a_service_of_its_own() {
    let dir = pam_service();
    let px = Parsnip::with_config(&format!(
        "auth_type = \"pam\"\nauth_pam_service = \"parsnip-test\"\nauth_pam_config_dir = \"{}\"\n{}",
        dir.display(),
        db_section()
    ));
    bounded(60, "pam logins", async {
        let c = px.connect("app", APP_PW, "postgres").await;
        assert_eq!(c.scalar("select current_user").await.expect("a query"), "app");
        for (user, pw) in [("app", "wrong"), ("ghost", APP_PW)] {
            let db = expect_code(px.try_connect(user, Some(pw), "postgres").await.map(|_| ()), "28000", user);
            assert_eq!(db.message(), format!("PAM authentication failed for user \"{user}\""));
        }
        // Several at once (more than run at a time) all get their answer.
        let port = px.port();
        let logins = (0..6).map(|i| {
            let pw = if i % 2 == 0 { APP_PW } else { "wrong" };
            async move { (i, Pg::connect(port, "app", Some(pw), "postgres").await.is_ok()) }
        });
        for (i, ok) in futures_join(logins).await {
            assert_eq!(ok, i % 2 == 0, "login {i}");
        }
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs futures concurrently (no futures crate in the tests).
async fn futures_join<F: std::future::Future + Send + 'static>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a login task"));
    }
    out
}
