//! `auth_type = "hba"`: an auth_hba_file mixing reject, trust, scram-sha-256, md5,
//! password and peer over address ranges and the unix socket, checked line by line with
//! clients connecting from different loopback addresses; the refusals compared with what
//! PostgreSQL itself answers for the same lines; the file re-read on RELOAD.

mod support;

use parsnip::embedded::Cluster;
use std::sync::Arc;
use support::*;

/// The lines clients reach parsnip (and, for the host lines, PostgreSQL) through.
const HOST_LINES: &str = "
host    all       shut      all           reject
host    all       postgres  127.0.0.1/32  scram-sha-256
host    all       app       127.0.0.1/32  scram-sha-256
host    all       md5user   127.0.0.1/32  md5
host    all       all       127.0.0.2/32  trust
host    postgres  app       127.0.0.0 255.255.255.248  password
";

fn os_user() -> String {
    let out = std::process::Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

struct Setup {
    p: Parsnip,
    hba: std::path::PathBuf,
    sock_dir: std::path::PathBuf,
}

fn start() -> Setup {
    let port = cluster().port();
    let sock_dir = temp_path("hba-sock");
    std::fs::create_dir_all(&sock_dir).expect("socket dir");
    let hba = temp_path("pg_hba.conf");
    let me = os_user();
    std::fs::write(&hba, format!("local forced {me} peer\nlocal all all reject\n{HOST_LINES}")).expect("hba file");
    let toml = format!(
        "auth_type = \"hba\"\nauth_hba_file = \"{}\"\nunix_socket_dir = \"{}\"\nadmin_users = [\"postgres\"]\n\n\
         [databases.postgres]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [databases.forced]\nhost = \"127.0.0.1\"\nport = {port}\ndbname = \"postgres\"\n\
         user = \"postgres\"\npassword = \"{SUPER_PW}\"\n\n\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n\n[users.app]\npassword = \"{APP_PW}\"\n\n\
         [users.md5user]\npassword = \"{MD5_PW}\"\n",
        hba.display(),
        sock_dir.display()
    );
    Setup { p: Parsnip::with_config(&toml), hba, sock_dir }
}

/// A client of the unix socket only.
fn unix_config(dir: &std::path::Path, port: u16, user: &str, db: &str) -> tokio_postgres::Config {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host_path(dir).port(port).user(user).dbname(db);
    cfg
}

/// Logs in from `source` as `user` to `db`: the authentication requests seen, or the error.
async fn login(port: u16, source: &str, user: &str, password: Option<&str>, db: &str) -> Result<Vec<i32>, PgError> {
    let mut raw = Raw::tcp_from(source, port).await;
    raw.startup(&[("user", user), ("database", db)], password).await?;
    assert_eq!(raw.scalar("select 1").await.expect("a query").as_deref(), Some("1"));
    Ok(raw.auth_requests)
}

#[tokio::test]
async fn each_line_decides_its_clients() {
    let s = start();
    let port = s.p.port();
    bounded(60, "hba lines", async {
        // scram-sha-256 (10), md5 (5), trust (0 only), password (3), by address (md5user
        // to `forced`: the cluster's own SCRAM lines cannot check its md5 secret).
        let scram = login(port, "127.0.0.1", "app", Some(APP_PW), "postgres").await.expect("app by SCRAM");
        assert_eq!(scram.first(), Some(&10), "{scram:?}");
        let e = login(port, "127.0.0.1", "app", Some("wrong"), "postgres").await.expect_err("a wrong password");
        assert_eq!((e.code(), e.message()), ("28P01", "password authentication failed for user \"app\""));
        let md5 = login(port, "127.0.0.1", "md5user", Some(MD5_PW), "forced").await.expect("md5user by md5");
        assert_eq!(md5.first(), Some(&5), "{md5:?}");
        assert_eq!(login(port, "127.0.0.2", "app", None, "postgres").await.expect("trust"), vec![0]);
        let pw = login(port, "127.0.0.3", "app", Some(APP_PW), "postgres").await.expect("cleartext");
        assert_eq!(pw, vec![3, 0]);
        // The password line is for database postgres only: from .3, forced has no line.
        let e = login(port, "127.0.0.3", "app", Some(APP_PW), "forced").await.expect_err("no line");
        assert_eq!(
            (e.code(), e.message()),
            ("28000", "no pg_hba.conf entry for host \"127.0.0.3\", user \"app\", database \"forced\", no encryption")
        );
        let e = login(port, "127.0.0.2", "shut", None, "postgres").await.expect_err("reject");
        assert_eq!(
            (e.code(), e.message()),
            ("28000", "pg_hba.conf rejects connection for host \"127.0.0.2\", user \"shut\", database \"postgres\", no encryption")
        );
        // The unix socket: peer for this process's own user, reject for the rest.
        let me = os_user();
        let mut cfg = unix_config(&s.sock_dir, port, &me, "forced");
        let c = Pg::connect_config(&mut cfg).await.unwrap_or_else(|e| panic!("peer as {me}: {e}\n{}", s.p.log_tail()));
        assert_eq!(c.scalar("select current_user").await.expect("query"), "postgres");
        let mut cfg = unix_config(&s.sock_dir, port, "app", "postgres");
        cfg.password(APP_PW);
        let e = Pg::connect_config(&mut cfg).await.err().expect("local reject");
        let db = e.as_db_error().expect("a server error");
        assert_eq!(
            db.message(),
            "pg_hba.conf rejects connection for host \"[local]\", user \"app\", database \"postgres\", no encryption"
        );
    })
    .await;
}

#[tokio::test]
async fn the_file_is_read_again_on_reload_and_a_broken_one_keeps_the_old() {
    let s = start();
    let port = s.p.port();
    bounded(60, "hba reload", async {
        assert!(login(port, "127.0.0.9", "app", None, "postgres").await.is_err(), "no line for .9 yet");
        let console = s.p.connect("postgres", SUPER_PW, "parsnip").await;
        let rows = console_rows(&console, "SHOW CONFIG").await;
        let row = rows.iter().find(|r| r["key"].as_deref() == Some("auth_hba_file")).expect("in SHOW CONFIG");
        assert_eq!(row["value"].as_deref(), Some(s.hba.display().to_string().as_str()));
        // A broken file: RELOAD fails and the old lines stay.
        std::fs::write(&s.hba, format!("host all all 127.0.0.9 trust\n{HOST_LINES}")).expect("hba file");
        let e = console.simple_query("RELOAD").await.expect_err("a broken file");
        let why = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
        assert!(why.contains("auth_hba_file") && why.contains("line 1"), "{why}");
        assert!(login(port, "127.0.0.9", "app", None, "postgres").await.is_err(), "old lines kept");
        std::fs::write(&s.hba, format!("host all all 127.0.0.9/32 trust\n{HOST_LINES}")).expect("hba file");
        console.simple_query("RELOAD").await.expect("RELOAD");
        assert_eq!(login(port, "127.0.0.9", "app", None, "postgres").await.expect("trust now"), vec![0]);
    })
    .await;
}

#[tokio::test]
async fn refusals_are_worded_as_postgresql_words_them_for_the_same_lines() {
    let s = start();
    let mut pg = Cluster::start(cluster_options("trust", Some(SUPER_PW))).expect("a throwaway cluster");
    register_cluster_cleanup(&pg);
    std::fs::write(pg.data_dir().join("pg_hba.conf"), format!("local all all trust\n{HOST_LINES}")).expect("hba");
    pg.restart().expect("restart with the lines");
    bounded(60, "compared with PostgreSQL", async {
        for (source, user, db) in
            [("127.0.0.9", "app", "postgres"), ("127.0.0.1", "shut", "postgres"), ("127.0.0.3", "x", "forced")]
        {
            let ours = login(s.p.port(), source, user, None, db).await.expect_err("refused by parsnip");
            let theirs = login(pg.port(), source, user, None, db).await.expect_err("refused by PostgreSQL");
            assert_eq!((ours.code(), ours.message()), (theirs.code(), theirs.message()), "{source} {user} {db}");
        }
    })
    .await;
}

/// A TLS client trusting `server`'s CA, showing `client`'s certificate when given.
fn tls_connector(server: &Certs, client: Option<&Certs>) -> tokio_postgres_rustls::MakeRustlsConnect {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&server.ca_file).expect("CA file") {
        roots.add(c.expect("CA certificate")).expect("a root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    let config = match client {
        Some(c) => {
            let chain = CertificateDer::pem_file_iter(&c.cert_file).expect("cert").map(|c| c.expect("cert")).collect();
            let key = PrivateKeyDer::from_pem_file(&c.key_file).expect("key");
            builder.with_client_auth_cert(chain, key).expect("client certificate")
        }
        None => builder.with_no_client_auth(),
    };
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}

/// Logs in over TLS: the user parsnip's server connection runs as, or the error's text.
async fn tls_login(
    port: u16,
    tls: &tokio_postgres_rustls::MakeRustlsConnect,
    user: &str,
    db: &str,
) -> Result<String, String> {
    let mut cfg = pg_config(port, user, None, db);
    cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
    let (client, conn) = cfg.connect(tls.clone()).await.map_err(|e| match e.as_db_error() {
        Some(d) => format!("{} {}", d.code().code(), d.message()),
        None => e.to_string(),
    })?;
    tokio::spawn(conn);
    Ok(client.query_one("select current_user", &[]).await.expect("a query").get(0))
}

#[tokio::test]
async fn cert_lines_take_the_verified_certificates_common_name() {
    let port = cluster().port();
    let server = Certs::new(&["127.0.0.1"]);
    let app = Certs::new(&["app"]);
    let hba = temp_path("pg_hba-cert.conf");
    std::fs::write(&hba, "hostssl all app,md5user 127.0.0.1/32 cert\nhostnossl all all all reject\n")
        .expect("hba file");
    let p = Parsnip::with_config(&format!(
        "auth_type = \"hba\"\nauth_hba_file = \"{}\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\n\
         client_tls_ca_file = \"{}\"\n\n\
         [databases.postgres]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [databases.forced]\nhost = \"127.0.0.1\"\nport = {port}\ndbname = \"postgres\"\n\
         user = \"postgres\"\npassword = \"{SUPER_PW}\"\n\n[users.app]\npassword = \"{APP_PW}\"\n",
        hba.display(),
        server.cert(),
        server.key(),
        app.ca()
    ));
    bounded(60, "cert", async {
        let with_cert = tls_connector(&server, Some(&app));
        assert_eq!(tls_login(p.port(), &with_cert, "app", "postgres").await, Ok("app".to_owned()), "{}", p.log_tail());
        // A certificate says who the client is, not that it may run the console (with no
        // admin_users, only trust lines make admins).
        let e = tls_login(p.port(), &with_cert, "app", "pgbouncer").await.expect_err("console");
        assert!(e.contains("not allowed to use the parsnip console"), "{e}");
        assert_eq!(
            tls_login(p.port(), &with_cert, "md5user", "forced").await,
            Err("28000 certificate authentication failed for user \"md5user\"".to_owned())
        );
        let without = tls_connector(&server, None);
        assert_eq!(
            tls_login(p.port(), &without, "app", "postgres").await,
            Err("28000 connection requires a valid client certificate".to_owned())
        );
        // A certificate from a CA parsnip does not trust ends the handshake.
        let stranger = Certs::new(&["app"]);
        let e = tls_login(p.port(), &tls_connector(&server, Some(&stranger)), "app", "postgres").await;
        assert!(e.as_ref().is_err_and(|e| !e.starts_with("28000")), "{e:?}");
        let e = login(p.port(), "127.0.0.1", "app", Some(APP_PW), "postgres").await.expect_err("plaintext");
        assert!(e.message().starts_with("pg_hba.conf rejects connection"), "{e:?}");
    })
    .await;
}

/// The `[databases]` and `[users]` of the cert tests, on the shared cluster.
fn cert_entries() -> String {
    let port = cluster().port();
    format!(
        "[databases.postgres]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [users.app]\npassword = \"{APP_PW}\"\n\n[users.postgres]\npassword = \"{SUPER_PW}\"\n"
    )
}

#[tokio::test]
async fn auth_type_cert_takes_the_user_from_the_certificate() {
    let server = Certs::new(&["127.0.0.1"]);
    let app = Certs::new(&["app"]);
    let tls = format!(
        "client_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\nclient_tls_ca_file = \"{}\"\n",
        server.cert(),
        server.key(),
        app.ca()
    );
    // Without verify-ca or verify-full, auth_type = cert is refused at start.
    let cfg = temp_path("cert-require.toml");
    std::fs::write(&cfg, format!("auth_type = \"cert\"\nclient_tls_sslmode = \"require\"\n{tls}\n{}", cert_entries()))
        .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_parsnip"))
        .args(["-c", cfg.to_str().expect("utf-8"), "--print-config"])
        .output()
        .expect("parsnip --print-config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("needs client_tls_sslmode verify-ca or verify-full"), "{err}");
    let p = Parsnip::with_config(&format!(
        "auth_type = \"cert\"\nclient_tls_sslmode = \"verify-full\"\nadmin_users = [\"postgres\"]\n{tls}\n{}",
        cert_entries()
    ));
    bounded(60, "auth_type cert", async {
        let with_cert = tls_connector(&server, Some(&app));
        assert_eq!(tls_login(p.port(), &with_cert, "app", "postgres").await, Ok("app".to_owned()), "{}", p.log_tail());
        assert_eq!(
            tls_login(p.port(), &with_cert, "postgres", "postgres").await,
            Err("28000 certificate authentication failed for user \"postgres\"".to_owned()),
            "the common name must be the user name"
        );
        // Logged in by certificate, app is no console admin (admin_users decides).
        let e = tls_login(p.port(), &with_cert, "app", "pgbouncer").await.expect_err("console");
        assert!(e.contains("not allowed to use the parsnip console"), "{e}");
        let e = tls_login(p.port(), &tls_connector(&server, None), "app", "postgres").await.expect_err("no cert");
        assert!(!e.is_empty(), "verify-full: no certificate, no login");
        let e = login(p.port(), "127.0.0.1", "app", Some(APP_PW), "postgres").await.expect_err("plaintext");
        assert_eq!(e.code(), "28000", "{e:?}");
    })
    .await;
}

#[tokio::test]
async fn hba_map_lines_map_certificate_and_os_users_through_auth_ident_file() {
    let server = Certs::new(&["127.0.0.1"]);
    let alice = Certs::new(&["app@example.com"]);
    let ops = Certs::new(&["ops-cert"]);
    let cas = temp_path("cert-cas.pem");
    let both = format!(
        "{}{}",
        std::fs::read_to_string(&alice.ca_file).expect("CA"),
        std::fs::read_to_string(&ops.ca_file).expect("CA")
    );
    std::fs::write(&cas, both).expect("CA file");
    let me = os_user();
    let sock_dir = temp_path("ident-sock");
    std::fs::create_dir_all(&sock_dir).expect("socket dir");
    let hba = temp_path("pg_hba-map.conf");
    std::fs::write(&hba, "local all all peer map=os\nhostssl all all 127.0.0.1/32 cert map=certs\n").expect("hba");
    let ident = temp_path("pg_ident.conf");
    std::fs::write(
        &ident,
        format!("# MAP SYSTEM-USER DB-USER\ncerts /^(.*)@example\\.com$ \\1\ncerts ops-cert postgres\nos {me} app\n"),
    )
    .expect("ident file");
    let p = Parsnip::with_config(&format!(
        "auth_type = \"hba\"\nauth_hba_file = \"{}\"\nauth_ident_file = \"{}\"\nunix_socket_dir = \"{}\"\n\
         client_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\nclient_tls_ca_file = \"{}\"\n{}",
        hba.display(),
        ident.display(),
        sock_dir.display(),
        server.cert(),
        server.key(),
        cas.display(),
        cert_entries()
    ));
    bounded(60, "ident maps", async {
        let tls = tls_connector(&server, Some(&alice));
        assert_eq!(tls_login(p.port(), &tls, "app", "postgres").await, Ok("app".to_owned()), "{}", p.log_tail());
        assert_eq!(
            tls_login(p.port(), &tls, "postgres", "postgres").await,
            Err("28000 certificate authentication failed for user \"postgres\"".to_owned()),
            "\\1 is app for app@example.com"
        );
        let tls = tls_connector(&server, Some(&ops));
        assert_eq!(tls_login(p.port(), &tls, "postgres", "postgres").await, Ok("postgres".to_owned()));
        assert!(tls_login(p.port(), &tls, "ops-cert", "postgres").await.is_err(), "a map is not the identity");
        // peer map=os: this OS user may log in as app, not as itself.
        let c = Pg::connect_config(&mut unix_config(&sock_dir, p.port(), "app", "postgres"))
            .await
            .unwrap_or_else(|e| panic!("peer {me} as app: {e}\n{}", p.log_tail()));
        assert_eq!(c.scalar("select current_user").await.expect("query"), "app");
        let e =
            Pg::connect_config(&mut unix_config(&sock_dir, p.port(), &me, "postgres")).await.err().expect("refused");
        let db = e.as_db_error().expect("a server error");
        assert_eq!(db.message(), format!("Peer authentication failed for user \"{me}\""));
    })
    .await;
}
