//! TLS on both sides, judged by libpq (psql, pgbench) and a raw rustls client:
//!
//! * clients: `client_tls_sslmode = require` lets psql in with `sslmode=verify-full` and
//!   refuses a plaintext one with PostgreSQL's 28000 wording; PostgreSQL 17's direct TLS
//!   (ALPN `postgresql`) works, without ALPN it is refused; bytes sent after an SSLRequest
//!   before the handshake get 08P01;
//! * servers: a PostgreSQL that accepts only `hostssl` is reached with `sslmode=verify-full`
//!   from the URL, its certificate checked (a certificate for another name passes
//!   verify-ca and fails verify-full); `require` against a server without TLS is an error;
//!   cancel works behind TLS; pgbench runs over TLS on both sides;
//! * SCRAM channel binding: psql with `channel_binding=require` binds to parsnip's
//!   certificate (SCRAM-SHA-256-PLUS) whether parsnip holds a plain password or
//!   PostgreSQL's SCRAM secret; parsnip's `channel_binding=require` binds to a TLS
//!   PostgreSQL and refuses a plaintext one.

mod support;

use parsnip::embedded::Cluster;
use std::io::{Read, Write};
use std::process::Command;
use std::sync::{Arc, LazyLock};
use support::*;

/// The certificate the TLS-only cluster and parsnip show: for 127.0.0.1 and localhost.
static CERTS: LazyLock<Certs> = LazyLock::new(|| Certs::new(&["127.0.0.1", "localhost"]));

/// A PostgreSQL that takes TCP connections only over TLS (`hostssl`), SCRAM auth.
static TLS_PG: LazyLock<Cluster> = LazyLock::new(|| {
    let mut opts = cluster_options("scram-sha-256", Some(SUPER_PW));
    opts.tls = Some((CERTS.cert_pem.clone(), CERTS.key_pem.clone()));
    let c = Cluster::start(opts).unwrap_or_else(|e| panic!("starting the TLS-only cluster: {e}"));
    register_cluster_cleanup(&c);
    c
});

/// Runs psql with `conninfo` and `sql`: (success, stdout, stderr).
fn psql_with(conninfo: &str, sql: &str) -> (bool, String, String) {
    let out = Command::new(cluster().bin_dir().join("psql"))
        .args(["-X", "-A", "-t", "-c", sql, conninfo])
        .env("PGCONNECT_TIMEOUT", "20")
        .env_remove("PGSSLMODE")
        .output()
        .expect("running psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// parsnip in front of the shared cluster, showing clients `CERTS`, with `mode`.
fn tls_front(mode: &str) -> Parsnip {
    Parsnip::trust(&format!(
        "client_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\nclient_tls_sslmode = \"{mode}\"",
        CERTS.cert(),
        CERTS.key()
    ))
}

#[test]
fn psql_verify_full_gets_in_and_plaintext_is_refused_under_require() {
    let p = tls_front("require");
    let base = format!("host=127.0.0.1 port={} user=postgres dbname=postgres", p.port());
    let (ok, out, err) = psql_with(&format!("{base} sslmode=verify-full sslrootcert={}", CERTS.ca()), "select 40 + 2");
    assert!(ok, "psql over TLS failed: {err}\n{}", p.log_tail());
    assert_eq!(out, "42");
    let (ok, _, err) = psql_with(&format!("{base} sslmode=disable"), "select 1");
    assert!(!ok, "a plaintext client got in under require");
    assert!(
        err.contains(
            "no pg_hba.conf entry for host \"127.0.0.1\", user \"postgres\", database \"postgres\", no encryption"
        ),
        "{err}"
    );
}

#[test]
fn prefer_serves_both_and_a_client_checking_another_ca_is_refused() {
    let p = tls_front("prefer");
    let base = format!("host=127.0.0.1 port={} user=postgres dbname=postgres", p.port());
    let (ok, out, err) = psql_with(&format!("{base} sslmode=require"), "select 'tls'");
    assert!(ok && out == "tls", "{err}");
    let (ok, out, err) = psql_with(&format!("{base} sslmode=disable"), "select 'plain'");
    assert!(ok && out == "plain", "{err}");
    let other = Certs::new(&["127.0.0.1"]);
    let (ok, _, err) = psql_with(&format!("{base} sslmode=verify-ca sslrootcert={}", other.ca()), "select 1");
    assert!(!ok, "a certificate from another CA was accepted");
    assert!(err.contains("certificate verify failed"), "{err}");
}

/// A rustls client trusting `CERTS`' CA, with `alpn`.
fn client_config(alpn: Option<&[u8]>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&CERTS.ca_file).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.map(|a| vec![a.to_vec()]).unwrap_or_default();
    Arc::new(cfg)
}

/// Reads one backend message: (tag, body).
fn read_msg(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = i32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len - 4];
    r.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// The messages up to the first ReadyForQuery or ErrorResponse, as tags; the error's text.
fn read_until_ready(r: &mut impl Read) -> (String, String) {
    let mut tags = String::new();
    loop {
        let (tag, body) = read_msg(r).expect("a message");
        tags.push(tag as char);
        if tag == b'E' {
            return (tags, String::from_utf8_lossy(&body).into_owned());
        }
        if tag == b'Z' {
            return (tags, String::new());
        }
    }
}

fn direct_tls(port: u16, alpn: Option<&[u8]>) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(client_config(alpn), name).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

#[test]
fn direct_tls_with_alpn_logs_in_and_without_alpn_is_refused() {
    let p = tls_front("require");
    let mut s = direct_tls(p.port(), Some(b"postgresql"));
    s.write_all(&startup_packet(&[("user", "postgres"), ("database", "postgres")])).unwrap();
    let (tags, err) = read_until_ready(&mut s);
    assert!(err.is_empty(), "{err}\n{}", p.log_tail());
    assert!(tags.starts_with('R') && tags.ends_with('Z'), "{tags}");
    assert_eq!(s.conn.alpn_protocol(), Some(&b"postgresql"[..]));
    s.write_all(&query_msg("select 7")).unwrap();
    let (tags, err) = read_until_ready(&mut s);
    assert_eq!((tags.as_str(), err.as_str()), ("TDCZ", ""));

    let mut s = direct_tls(p.port(), None);
    s.write_all(&startup_packet(&[("user", "postgres"), ("database", "postgres")])).unwrap();
    let (tags, err) = read_until_ready(&mut s);
    assert_eq!(tags, "E");
    assert!(err.contains("08P01") && err.contains("without ALPN"), "{err}");
}

#[test]
fn bytes_sent_after_an_ssl_request_before_the_handshake_get_08p01() {
    let p = tls_front("prefer");
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", p.port())).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let mut both = vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    both.extend_from_slice(&startup_packet(&[("user", "postgres"), ("database", "postgres")]));
    sock.write_all(&both).unwrap();
    let (tag, body) = read_msg(&mut sock).expect("an error, not 'S'");
    assert_eq!(tag, b'E');
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("08P01") && text.contains("unencrypted data after SSL request"), "{text}");
    let mut rest = Vec::new();
    assert_eq!(sock.read_to_end(&mut rest).unwrap(), 0, "the connection is closed");
}

/// Beyond max_client_conn, a TLS client is refused over TLS, after its startup packet, as
/// PostgreSQL refuses it: libpq shows "sorry, too many clients already", not "server sent
/// an error response during SSL exchange".
#[test]
fn beyond_max_client_conn_libpq_over_tls_reads_why() {
    let p = Parsnip::trust(&format!(
        "max_client_conn = 1\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"",
        CERTS.cert(),
        CERTS.key()
    ));
    // A logged-in client holds the one slot (once the start-up probe's connection has given
    // it back: until then a login is refused, and tried again).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let _holder = loop {
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", p.port())).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        sock.write_all(&startup_packet(&[("user", "postgres"), ("database", "postgres")])).unwrap();
        let (tags, err) = read_until_ready(&mut sock);
        if err.is_empty() {
            break sock;
        }
        assert!(err.contains("53300") && std::time::Instant::now() < deadline, "{tags} {err}\n{}", p.log_tail());
    };
    let conninfo = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
        p.port(),
        CERTS.ca()
    );
    let (ok, _, err) = psql_with(&conninfo, "select 1");
    assert!(!ok, "a client beyond max_client_conn got in");
    assert!(err.contains("FATAL:  sorry, too many clients already"), "psql said: {err}\n{}", p.log_tail());
}

/// parsnip requiring TLS from clients (`--tls-cert`, `--tls-key`) in front of the TLS-only
/// cluster reached with verify-full.
fn tls_both_sides() -> Parsnip {
    let url = format!(
        "postgres://postgres:{SUPER_PW}@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        TLS_PG.port(),
        CERTS.ca()
    );
    Parsnip::start(&[&url, "--tls-cert", &CERTS.cert(), "--tls-key", &CERTS.key()])
}

/// parsnip in front of the TLS-only cluster through a URL with `params`.
fn tls_back(params: &str) -> Parsnip {
    let url = format!("postgres://postgres:{SUPER_PW}@127.0.0.1:{}/postgres?{params}", TLS_PG.port());
    Parsnip::start(&[&url])
}

fn through(p: &Parsnip, sql: &str) -> (bool, String, String) {
    psql_with(&format!("host=127.0.0.1 port={} user=postgres password={SUPER_PW} dbname=postgres", p.port()), sql)
}

const SSL_IN_USE: &str = "select ssl from pg_stat_ssl where pid = pg_backend_pid()";

#[test]
fn a_hostssl_only_server_is_reached_with_verify_full_from_the_url() {
    let p = tls_back(&format!("sslmode=verify-full&sslrootcert={}", CERTS.ca()));
    let (ok, out, err) = through(&p, SSL_IN_USE);
    assert!(ok, "{err}\n{}", p.log_tail());
    assert_eq!(out, "t", "the server connection is encrypted");
    // The same server refuses parsnip without TLS: the check above means something.
    let p = tls_back("sslmode=disable");
    let (ok, _, err) = through(&p, "select 1");
    assert!(!ok);
    assert!(err.contains("no pg_hba.conf entry") && err.contains("no encryption"), "{err}");
}

#[test]
fn verify_full_checks_the_name_and_verify_ca_does_not() {
    let elsewhere = Certs::new(&["db.example"]);
    let mut opts = cluster_options("scram-sha-256", Some(SUPER_PW));
    opts.tls = Some((elsewhere.cert_pem.clone(), elsewhere.key_pem.clone()));
    let pg = Cluster::start(opts).expect("cluster with a certificate for another name");
    let url = |mode: &str| {
        format!(
            "postgres://postgres:{SUPER_PW}@127.0.0.1:{}/postgres?sslmode={mode}&sslrootcert={}",
            pg.port(),
            elsewhere.ca()
        )
    };
    let p = Parsnip::start(&[&url("verify-ca")]);
    let (ok, out, err) = through(&p, SSL_IN_USE);
    assert!(ok && out == "t", "verify-ca: {err}\n{}", p.log_tail());
    let p = Parsnip::start(&[&url("verify-full")]);
    let (ok, _, err) = through(&p, "select 1");
    assert!(!ok, "verify-full accepted a certificate for db.example at 127.0.0.1");
    assert!(err.contains("certificate not valid for name"), "{err}");
}

#[test]
fn require_against_a_server_without_tls_is_an_error_not_plaintext() {
    let url = format!("{}?sslmode=require", cluster().url());
    let p = Parsnip::start(&[&url]);
    let (ok, _, err) = through(&p, "select 1");
    assert!(!ok, "require fell back to plaintext");
    assert!(err.contains("server does not support SSL, but SSL was required"), "{err}");
}

#[test]
fn an_unknown_url_parameter_stops_the_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_parsnip"))
        .args([&format!("{}?sslmdoe=require", cluster().url()), "--listen", "127.0.0.1:1", "--unix-socket-dir", ""])
        .output()
        .expect("running parsnip");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sslmdoe"), "{err}");
}

#[tokio::test]
async fn cancel_reaches_a_query_on_a_tls_server() {
    let p = tls_back(&format!("sslmode=verify-full&sslrootcert={}", CERTS.ca()));
    bounded(60, "cancel_reaches_a_query_on_a_tls_server", async {
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        let token = c.cancel_token();
        let q = tokio::spawn(async move {
            let r = c.client.simple_query("select pg_sleep(30) /* tls server cancel */").await;
            (c, r)
        });
        // Cancel once the query is running on the server (found by its comment: autoprepare
        // sends `pg_sleep($1)`).
        loop {
            let n = TLS_PG.psql(
                "postgres",
                "select count(*) from pg_stat_activity where strpos(query, '/* tls server cancel */') > 0 \
                 and state = 'active' and pid <> pg_backend_pid()",
            );
            if n.map(|s| s.trim() == "1").unwrap_or(false) {
                break;
            }
            tokio::task::yield_now().await;
        }
        token.cancel_query(tokio_postgres::NoTls).await.expect("cancel sent");
        let (_c, r) = q.await.unwrap();
        let e = r.expect_err("the query was cancelled");
        assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e}");
    })
    .await;
}

#[test]
fn pgbench_runs_over_tls_on_both_sides() {
    let p = tls_both_sides();
    let pgbench = cluster().bin_dir().join("pgbench");
    let conn = |extra: &[&str]| {
        let mut c = Command::new(&pgbench);
        c.args(["-h", "127.0.0.1", "-p", &p.port().to_string(), "-U", "postgres"])
            .args(extra)
            .arg("postgres")
            .env("PGPASSWORD", SUPER_PW)
            .env("PGSSLMODE", "verify-full")
            .env("PGSSLROOTCERT", CERTS.ca());
        c.output().expect("running pgbench")
    };
    let init = conn(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}\n{}", String::from_utf8_lossy(&init.stderr), p.log_tail());
    let run = conn(&["-n", "-S", "-M", "prepared", "-c", "4", "-j", "2", "-t", "100"]);
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{out}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(out.contains("number of transactions actually processed: 400/400"), "{out}");
}

#[test]
fn megabytes_cross_tls_on_both_sides_intact() {
    let p = tls_both_sides();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=postgres password={SUPER_PW} dbname=postgres sslmode=verify-full sslrootcert={}",
        p.port(),
        CERTS.ca()
    );
    // 3 MB down: a reply many TLS records long.
    let (ok, out, err) = psql_with(&conninfo, "select md5(repeat('ab', 1500000)), repeat('ab', 1500000)");
    assert!(ok, "{err}\n{}", p.log_tail());
    let (sum, text) = out.split_once('|').expect("two columns");
    assert_eq!(text.len(), 3_000_000);
    assert!(text.bytes().all(|b| b == b'a' || b == b'b'));
    // 2 MB up: a query text many records long (from a file: too long for an argument).
    let file = temp_path("big.sql");
    std::fs::write(&file, format!("select md5('{}');\n", "ab".repeat(1_000_000))).unwrap();
    let out = Command::new(cluster().bin_dir().join("psql"))
        .args(["-X", "-A", "-t", "-f", &file.display().to_string(), &conninfo])
        .output()
        .expect("running psql");
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let up = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (ok, direct, err) = psql_with(&conninfo, "select md5(repeat('ab', 1000000))");
    assert!(ok, "{err}");
    assert_eq!(up, direct, "the 2 MB text arrived intact");
    assert_ne!(sum, direct);
}

/// The config file's server_tls_* keys: a server that wants a client certificate
/// (`clientcert=verify-full`, CN = user name) gets parsnip's, with the chain checked.
#[test]
fn a_client_certificate_from_the_config_file_is_shown_to_a_server_that_asks() {
    let client = Certs::new(&["postgres"]);
    let mut opts = cluster_options("scram-sha-256", Some(SUPER_PW));
    opts.tls = Some((CERTS.cert_pem.clone(), CERTS.key_pem.clone()));
    opts.extra_conf.push(format!("ssl_ca_file = '{}'", client.ca()));
    let pg = Cluster::start(opts).expect("cluster");
    std::fs::write(
        pg.data_dir().join("pg_hba.conf"),
        "local all postgres trust\nhostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n",
    )
    .expect("pg_hba.conf");
    pg.psql("postgres", "select pg_reload_conf()").expect("reload");
    let config = |with_cert: bool| {
        let cert = if with_cert {
            format!("server_tls_cert_file = \"{}\"\nserver_tls_key_file = \"{}\"\n", client.cert(), client.key())
        } else {
            String::new()
        };
        format!(
            "auth_type = \"trust\"\nserver_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"{}\"\n{cert}\n\
             [databases.\"*\"]\nhost = \"127.0.0.1\"\nport = {}\n\n[users.postgres]\npassword = \"{SUPER_PW}\"\n",
            CERTS.ca(),
            pg.port()
        )
    };
    let p = Parsnip::with_config(&config(true));
    let (ok, out, err) = through(&p, "select client_dn from pg_stat_ssl where pid = pg_backend_pid()");
    assert!(ok, "{err}\n{}", p.log_tail());
    assert_eq!(out, "/CN=postgres");
    let p = Parsnip::with_config(&config(false));
    let (ok, _, err) = through(&p, "select 1");
    assert!(!ok, "the server let parsnip in without a client certificate");
    assert!(err.contains("certificate"), "{err}");
}

/// libpq 17+'s own direct TLS (`sslnegotiation=direct`), when the suite's psql has it (the
/// PostgreSQL 18 pass; PostgreSQL 15's psql does not know the option, and the raw client
/// test above covers direct TLS there).
#[test]
fn libpq_direct_tls_negotiation_gets_in() {
    let version = Command::new(cluster().bin_dir().join("psql")).arg("--version").output().expect("psql --version");
    let text = String::from_utf8_lossy(&version.stdout);
    let major: u32 = text.split_whitespace().nth(2).and_then(|v| v.split('.').next()?.parse().ok()).unwrap_or(0);
    if major < 17 {
        eprintln!("psql {major}: no sslnegotiation option; covered by the raw direct-TLS test");
        return;
    }
    let p = tls_front("require");
    let (ok, out, err) = psql_with(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslnegotiation=direct \
                sslrootcert={}",
            p.port(),
            CERTS.ca()
        ),
        "select 'direct'",
    );
    assert!(ok, "{err}\n{}", p.log_tail());
    assert_eq!(out, "direct");
}

/// A certificate and key at paths that stay the same while a test replaces the files (and
/// reloads).
struct CertFiles {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl CertFiles {
    fn new(name: &str) -> CertFiles {
        let dir = temp_path(name);
        std::fs::create_dir_all(&dir).expect("dir");
        CertFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem") }
    }

    fn install(&self, c: &Certs) {
        std::fs::write(&self.cert, &c.cert_pem).expect("cert");
        std::fs::write(&self.key, &c.key_pem).expect("key");
    }
}

/// A reload re-reads the certificate files: after the files are replaced (a renewed
/// certificate from another CA) and SIGHUP, new clients are shown the new certificate;
/// before it, the old one.
#[test]
fn reload_rereads_the_certificate_files() {
    let first = Certs::new(&["127.0.0.1", "localhost"]);
    let second = Certs::new(&["127.0.0.1", "localhost"]);
    // parsnip reads the certificate from paths that stay the same.
    let files = CertFiles::new("tls-reload");
    let (cert, key) = (&files.cert, &files.key);
    let install = |c: &Certs| files.install(c);
    install(&first);
    let p = Parsnip::trust(&format!(
        "client_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\nclient_tls_sslmode = \"require\"",
        cert.display(),
        key.display()
    ));
    let base = format!("host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full", p.port());
    let with = |c: &Certs| psql_with(&format!("{base} sslrootcert={}", c.ca()), "select 1").0;
    assert!(with(&first), "{}", p.log_tail());
    assert!(!with(&second), "a certificate of another CA was accepted");
    install(&second);
    let (ok, _, err) = psql_with(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=parsnip sslmode=verify-full sslrootcert={}",
            p.port(),
            first.ca()
        ),
        "RELOAD",
    );
    assert!(ok, "RELOAD: {err}\n{}", p.log_tail());
    assert!(with(&second), "the renewed certificate is not shown after RELOAD\n{}", p.log_tail());
    assert!(!with(&first), "the old certificate is still shown after RELOAD");
}

/// A driver over TLS: tokio-postgres (rustls, the CA checked, the name 127.0.0.1 verified)
/// through parsnip requiring TLS from clients: prepared statements through the statement
/// cache, a transaction, and a cancel request reaching its query.
#[tokio::test]
async fn tokio_postgres_over_tls_prepares_and_cancels() {
    let p = tls_front("require");
    bounded(60, "tokio_postgres_over_tls_prepares_and_cancels", async {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&CERTS.ca_file).expect("CA file");
        for c in rustls_pemfile_certs(&pem) {
            roots.add(c).expect("CA certificate");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(config);
        let mut cfg = pg_config(p.port(), "postgres", Some(SUPER_PW), "postgres");
        cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
        let (client, conn) =
            cfg.connect(tls.clone()).await.unwrap_or_else(|e| panic!("TLS connect: {e}\n{}", p.log_tail()));
        tokio::spawn(conn);
        let st = client.prepare("select $1::int * 2").await.expect("prepare");
        for i in 0..5i32 {
            assert_eq!(client.query_one(&st, &[&i]).await.expect("execute").get::<_, i32>(0), i * 2);
        }
        client.batch_execute("begin; select 1; commit").await.expect("tx");
        let token = client.cancel_token();
        let sql = "select pg_sleep(30) /* tls prepares and cancels */";
        let sleeper = tokio::spawn(async move { client.simple_query(sql).await.map(|_| ()) });
        wait_query_active("/* tls prepares and cancels */", std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", p.log_tail()));
        token.cancel_query(tls).await.expect("cancel over TLS");
        let e = sleeper.await.expect("task").expect_err("the sleep was not cancelled");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{}", describe(&e));
    })
    .await;
}

/// The certificates of a PEM file (rustls' own PEM reader).
fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem).map(|c| c.expect("PEM certificate")).collect()
}

/// parsnip with SCRAM for clients, showing them `CERTS`, in front of the shared cluster:
/// `postgres` with its plain password, `app` with PostgreSQL's own SCRAM secret, `md5user`
/// with its md5 secret.
fn scram_tls_front() -> Parsnip {
    Parsnip::with_config(&format!(
        "auth_type = \"scram-sha-256\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\n\n\
         [databases.\"*\"]\nhost = \"127.0.0.1\"\nport = {}\n\n\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n\n\
         [users.app]\npassword = \"{}\"\n\n\
         [users.md5user]\npassword = \"{}\"\n",
        CERTS.cert(),
        CERTS.key(),
        cluster().port(),
        stored_secret("app"),
        stored_secret("md5user"),
    ))
}

/// libpq's channel_binding=require succeeds only when the exchange was SCRAM-SHA-256-PLUS
/// bound to the certificate its TLS connection saw: parsnip offered PLUS and checked the
/// binding against the certificate it showed.
#[test]
fn psql_with_channel_binding_require_binds_to_parsnips_certificate() {
    let p = scram_tls_front();
    let conninfo = |user: &str, password: &str, extra: &str| {
        format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname=postgres sslmode=verify-full \
             sslrootcert={} {extra}",
            p.port(),
            CERTS.ca()
        )
    };
    // A plain password (parsnip derives a SCRAM secret) and PostgreSQL's SCRAM secret
    // (whose ClientKey then logs parsnip in to the server).
    for (user, password) in [("postgres", SUPER_PW), ("app", APP_PW)] {
        let (ok, out, err) = psql_with(&conninfo(user, password, "channel_binding=require"), "select current_user");
        assert!(ok, "{user}: {err}\n{}", p.log_tail());
        assert_eq!(out, user);
    }
    // Binding does not let a wrong password in.
    let (ok, _, err) = psql_with(&conninfo("app", "wrong", "channel_binding=require"), "select 1");
    assert!(!ok);
    assert!(err.contains("password authentication failed for user \"app\""), "{err}");
    // Without binding (disable: "n"), the same login works as before.
    let (ok, out, err) = psql_with(&conninfo("app", APP_PW, "channel_binding=disable"), "select 'unbound'");
    assert!(ok && out == "unbound", "{err}");
    // An md5 secret cannot do SCRAM: parsnip asks for md5, which binds nothing, and libpq
    // refuses to answer it under require.
    let (ok, _, err) = psql_with(&conninfo("md5user", MD5_PW, "channel_binding=require"), "select 1");
    assert!(!ok, "an md5 login passed channel_binding=require");
    assert!(err.contains("channel binding required but not supported by server's authentication request"), "{err}");
}

/// parsnip's own `channel_binding=require` (URL): against the hostssl SCRAM cluster it
/// binds (else the login would fail), against the plaintext shared cluster it refuses with
/// libpq's wording instead of logging in unbound.
#[test]
fn parsnip_channel_binding_require_binds_to_a_tls_server_and_refuses_plaintext() {
    let p = tls_back(&format!("sslmode=verify-full&sslrootcert={}&channel_binding=require", CERTS.ca()));
    let (ok, out, err) = through(&p, SSL_IN_USE);
    assert!(ok, "{err}\n{}", p.log_tail());
    assert_eq!(out, "t");
    // With TLS only "required", the certificate unchecked, binding is what proves the server.
    let p = tls_back("sslmode=require&channel_binding=require");
    let (ok, out, err) = through(&p, "select 'bound'");
    assert!(ok && out == "bound", "{err}\n{}", p.log_tail());

    let p = Parsnip::start(&[&format!("{}?channel_binding=require", cluster().url())]);
    let (ok, _, err) = through(&p, "select 1");
    assert!(!ok, "channel_binding=require logged in over plaintext");
    assert!(err.contains("channel binding required, but SSL not in use"), "{err}\n{}", p.log_tail());
}

/// After a reload swaps the certificate, a bound login checks the binding against the
/// certificate its own handshake showed (the new one), not the one parsnip started with.
#[test]
fn channel_binding_follows_a_reloaded_certificate() {
    let (first, second) = (Certs::new(&["127.0.0.1"]), Certs::new(&["127.0.0.1"]));
    let files = CertFiles::new("tls-binding-reload");
    let (cert, key) = (&files.cert, &files.key);
    let install = |c: &Certs| files.install(c);
    install(&first);
    let p = Parsnip::with_config(&format!(
        "auth_type = \"scram-sha-256\"\nadmin_users = [\"postgres\"]\nclient_tls_cert_file = \"{}\"\n\
         client_tls_key_file = \"{}\"\n\n[databases.\"*\"]\nhost = \"127.0.0.1\"\nport = {}\n\n\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n",
        cert.display(),
        key.display(),
        cluster().port()
    ));
    let run = |c: &Certs, db: &str, sql: &str| {
        psql_with(
            &format!(
                "host=127.0.0.1 port={} user=postgres password={SUPER_PW} dbname={db} sslmode=verify-full \
                 sslrootcert={} channel_binding=require",
                p.port(),
                c.ca()
            ),
            sql,
        )
    };
    let (ok, _, err) = run(&first, "postgres", "select 1");
    assert!(ok, "{err}\n{}", p.log_tail());
    install(&second);
    let (ok, _, err) = run(&first, "parsnip", "RELOAD");
    assert!(ok, "RELOAD: {err}\n{}", p.log_tail());
    let (ok, out, err) = run(&second, "postgres", "select 'bound to the new certificate'");
    assert!(ok, "{err}\n{}", p.log_tail());
    assert_eq!(out, "bound to the new certificate");
}
