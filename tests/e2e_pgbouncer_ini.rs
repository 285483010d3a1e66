//! pgbouncer.ini files run unchanged (tests/pgbouncer_ini/: `%include`, per-database and
//! per-user overrides with an hba file, auth_query): parsnip started with each serves
//! queries with the meaning PgBouncer gives it; a setting parsnip does not know is named
//! and refused without `--lenient`; `--print-config` prints TOML that reads back the same.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use support::*;

/// Copies tests/pgbouncer_ini/NAME to a temp dir with `@PGHOST@` and `@PGPORT@` filled in
/// for the shared cluster (nothing else changes); returns the copy's pgbouncer.ini.
fn judge(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pgbouncer_ini").join(name);
    let dst = temp_path(&format!("ini-{name}"));
    copy_filled(&src, &dst);
    dst.join("pgbouncer.ini")
}

fn copy_filled(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("temp dir");
    for e in std::fs::read_dir(src).expect("judge dir") {
        let e = e.expect("dir entry");
        let to = dst.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_filled(&e.path(), &to);
        } else {
            let text = std::fs::read_to_string(e.path()).expect("judge file");
            let text = text.replace("@PGHOST@", "127.0.0.1").replace("@PGPORT@", &cluster().port().to_string());
            std::fs::write(&to, text).expect("writing the copy");
        }
    }
}

/// Runs parsnip to its exit (bounded: a parsnip that starts instead is killed).
fn run_to_exit(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_parsnip"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning parsnip");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(out) => out.expect("parsnip's output"),
        Err(_) => {
            // SAFETY: kill(2) on our own child, not reaped while its waiting thread waits.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("parsnip {args:?} did not exit within 30s");
        }
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn an_ini_split_with_include() {
    let ini = judge("include");
    // The role whose SCRAM secret userlist.txt holds, as on a server managed elsewhere.
    let userlist = std::fs::read_to_string(ini.with_file_name("userlist.txt")).expect("userlist");
    let secret = userlist.lines().find_map(|l| l.strip_prefix("\"ini_scram\" ")).expect("ini_scram's line");
    psql(
        "postgres",
        &format!(
            "DO $$BEGIN CREATE ROLE ini_scram LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$;\n\
             ALTER ROLE ini_scram PASSWORD '{}';",
            secret.trim_matches('"')
        ),
    );
    let p = Parsnip::start(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path")]);
    for db in ["postgres", "reporting"] {
        let c = p.connect("postgres", SUPER_PW, db).await;
        assert_eq!(c.scalar("select count(*) from items").await.unwrap(), "10", "{db}");
    }
    // A SCRAM secret from the auth_file: the client's proof also logs parsnip in.
    let c = p.connect("ini_scram", "ini-scram-pw", "postgres").await;
    assert_eq!(c.scalar("select current_user").await.unwrap(), "ini_scram");
    // owner_db (from the nested include) logs in to the server as its user=.
    let c = p.connect("ini_scram", "ini-scram-pw", "owner_db").await;
    assert_eq!(c.scalar("select current_user").await.unwrap(), "postgres");
    // conf.d/pool.ini's pool_mode: transaction pooling lets two clients share a server.
    let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
    let rows = console_rows(&console, "SHOW CONFIG").await;
    let field = |r: &Row, c: &str| r.get(c).cloned().flatten();
    let value = |k: &str| rows.iter().find(|r| field(r, "key").as_deref() == Some(k)).and_then(|r| field(r, "value"));
    assert_eq!(value("pool_mode").as_deref(), Some("transaction"));
    assert_eq!(value("pool_size").as_deref(), Some("10"));
    assert_eq!(value("server_idle_timeout_ms").as_deref(), Some("60000"), "seconds to milliseconds");
    assert_eq!(value("max_prepared_statements").as_deref(), Some("100"));
    let wrong = p.try_connect("postgres", Some("wrong"), "postgres").await.map(|_| ());
    expect_code(wrong, "28P01", "a wrong password");
    assert!(p.wait_for_log("logfile ignored", Duration::from_secs(5)), "ignored settings are named:\n{}", p.log_tail());
    // RELOAD reads the included files again.
    let pool_ini = ini.with_file_name("conf.d").join("pool.ini");
    let text = std::fs::read_to_string(&pool_ini).expect("pool.ini");
    std::fs::write(&pool_ini, text.replace("default_pool_size = 10", "default_pool_size = 12")).expect("rewriting");
    console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}\n{}", describe(&e), p.log_tail()));
    let rows = console_rows(&console, "SHOW CONFIG").await;
    let pool_size =
        rows.iter().find(|r| field(r, "key").as_deref() == Some("pool_size")).and_then(|r| field(r, "value"));
    assert_eq!(pool_size.as_deref(), Some("12"));
}

#[tokio::test]
async fn an_ini_with_overrides_and_an_hba_file() {
    let ini = judge("overrides");
    let path = ini.to_str().expect("utf-8 path");
    // auth_type = hba with its auth_hba_file: carried over, so parsnip starts without
    // --lenient, the file found beside the ini.
    let printed = run_to_exit(&["--pgbouncer-ini", path, "--print-config"]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let toml = String::from_utf8_lossy(&printed.stdout).into_owned();
    let hba = ini.with_file_name("pg_hba.conf");
    assert!(toml.contains("auth_type = \"hba\""), "{toml}");
    assert!(toml.contains(&format!("auth_hba_file = \"{}\"", hba.display())), "{toml}");
    let p = Parsnip::start(&["--pgbouncer-ini", path]);
    // [databases] reports: statement pooling refuses a transaction block.
    let c = p.connect("postgres", SUPER_PW, "reports").await;
    assert_eq!(c.scalar("select count(*) from items").await.unwrap(), "10");
    expect_code(c.simple_query("BEGIN").await, "0A000", "BEGIN on a statement-mode database");
    // [databases] postgres is session mode, but [users] app's transaction mode wins.
    let c = p.connect("postgres", SUPER_PW, "postgres").await;
    c.simple_query("BEGIN").await.expect("session mode allows transactions");
    let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
    let app = p.connect("app", APP_PW, "postgres").await;
    assert_eq!(app.scalar("select current_user").await.unwrap(), "app");
    let pools = console_rows(&console, "SHOW POOLS").await;
    let field = |r: &Row, c: &str| r.get(c).cloned().flatten();
    let mode = |user: &str| {
        pools
            .iter()
            .find(|r| field(r, "database").as_deref() == Some("postgres") && field(r, "user").as_deref() == Some(user))
            .and_then(|r| field(r, "pool_mode"))
    };
    assert_eq!(mode("postgres").as_deref(), Some("session"));
    assert_eq!(mode("app").as_deref(), Some("transaction"));
    // An md5 secret from the auth_file, through the database that logs in as its user=.
    let mut raw = p.raw().await;
    raw.startup(&[("user", "md5user"), ("database", "admin_db")], Some(MD5_PW)).await.expect("md5user logs in");
    assert_eq!(raw.scalar("select current_user").await.unwrap().as_deref(), Some("postgres"));
    assert_eq!(raw.auth_requests, [5, 0], "the hba file's md5 line for 127.0.0.1");
    // No line for a client from another address.
    let mut raw = Raw::tcp_from("127.0.0.5", p.port()).await;
    let e = raw.startup(&[("user", "md5user"), ("database", "admin_db")], Some(MD5_PW)).await.expect_err("no line");
    assert_eq!(e.code(), "28000", "{e:?}");
    assert!(e.message().starts_with("no pg_hba.conf entry for host \"127.0.0.5\""), "{e:?}");
}

#[tokio::test]
async fn an_ini_with_auth_query() {
    let ini = judge("auth_query");
    let p = Parsnip::start(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path")]);
    // aq is in no file: its secret comes from PostgreSQL through auth_user.
    let c = p.connect("aq", AQ_PW, "postgres").await;
    assert_eq!(c.scalar("select current_user").await.unwrap(), "aq");
    let c = p.connect("app", APP_PW, "other").await;
    assert_eq!(c.scalar("select current_database()").await.unwrap(), "other", "the * database");
    let wrong = p.try_connect("aq", Some("wrong"), "postgres").await.map(|_| ());
    expect_code(wrong, "28P01", "a wrong password for an auth_query user");
}

/// `auth_type = any`: no password is asked, whatever the user name; the database's `user`
/// (and `password`) is who the server sees; any user reaches the console as admin.
#[tokio::test]
async fn an_ini_with_auth_type_any() {
    let dir = temp_path("ini-any");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ini = dir.join("pgbouncer.ini");
    let port = cluster().port();
    let listen_port = free_port();
    std::fs::write(
        &ini,
        format!(
            "[databases]\npostgres = host=127.0.0.1 port={port} user=postgres password={SUPER_PW}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen_port}\nunix_socket_dir =\nauth_type = any\n"
        ),
    )
    .expect("writing the ini");
    let p = Parsnip::start(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path")]);
    let c = p.connect("nobody_in_particular", "not a password", "postgres").await;
    assert_eq!(c.scalar("select current_user").await.unwrap(), "postgres");
    let console = p.connect("someone_else", "", "pgbouncer").await;
    console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("an admin command: {}", describe(&e)));
}

#[test]
fn an_unknown_setting_is_named_and_refused_without_lenient() {
    let dir = temp_path("ini-unknown");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ini = dir.join("pgbouncer.ini");
    let port = cluster().port();
    std::fs::write(
        &ini,
        format!(
            "[databases]\npostgres = host=127.0.0.1 port={port}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             auth_type = trust\nfrobnicate_level = 3\n"
        ),
    )
    .expect("writing the ini");
    let path = ini.to_str().expect("utf-8 path");
    let listen = format!("127.0.0.1:{}", free_port());
    // -c recognises the ini by its extension.
    for flag in ["--pgbouncer-ini", "-c"] {
        let out = run_to_exit(&[flag, path, "--listen", &listen, "--unix-socket-dir", ""]);
        let err = stderr(&out);
        assert!(!out.status.success(), "started with an unknown setting: {err}");
        assert!(err.contains("pgbouncer.ini:6: frobnicate_level not supported"), "{err}");
    }
    let p = Parsnip::start(&["-c", path, "--lenient"]);
    assert!(p.wait_for_log("frobnicate_level", Duration::from_secs(5)), "named on startup:\n{}", p.log_tail());
}

#[test]
fn print_config_reads_back_the_same() {
    let ini = judge("include");
    let first = run_to_exit(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path"), "--print-config"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let printed = String::from_utf8(first.stdout).expect("utf-8");
    assert!(printed.contains("# ") && printed.contains("logfile ignored"), "notes head it:\n{printed}");
    assert!(printed.contains("[databases.reporting]") && printed.contains("pool_size = 10"), "{printed}");
    let toml = ini.with_file_name("parsnip.toml");
    std::fs::write(&toml, &printed).expect("writing the TOML");
    let again = run_to_exit(&["-c", toml.to_str().expect("utf-8 path"), "--print-config"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let body = printed.split_once("\n\n").map_or(printed.as_str(), |(_, b)| b);
    assert_eq!(String::from_utf8_lossy(&again.stdout), body);
}
