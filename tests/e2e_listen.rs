//! Listening: the unix socket next to TCP (as PgBouncer and PostgreSQL do), its permissions,
//! and never taking over a socket file another live process holds.

mod support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

/// A fresh directory for this test's sockets, removed on drop.
struct SockDir(PathBuf);

impl SockDir {
    fn new(tag: &str) -> SockDir {
        let d = std::env::temp_dir().join(format!("parsnip-e2e-sock-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("socket dir");
        SockDir(d)
    }
}

impl Drop for SockDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).expect("socket file").permissions().mode() & 0o777
}

/// Runs parsnip expecting it to refuse to start; returns its exit code and output.
fn start_fails(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_parsnip"))
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn parsnip");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stderr.read_to_string(&mut out);
        let _ = tx.send(out);
    });
    // stderr closes when parsnip exits; one that keeps running (listening) fails the test.
    let out = rx.recv_timeout(Duration::from_secs(30));
    let _ = child.kill();
    let status = child.wait().expect("wait");
    (status.code(), out.unwrap_or_else(|_| "parsnip did not exit".into()))
}

#[tokio::test]
async fn unix_socket_beside_tcp_with_its_mode() {
    let dir = SockDir::new("mode");
    let d = dir.0.display().to_string();
    let p = Parsnip::trust(&format!("unix_socket_dir = \"{d}\""));
    let sock = dir.0.join(format!(".s.PGSQL.{}", p.port()));
    assert_eq!(mode_of(&sock), 0o777, "default mode, as PgBouncer's");
    bounded(30, "unix_socket_beside_tcp_with_its_mode", async {
        let mut cfg = pg_config(p.port(), "postgres", Some(SUPER_PW), "postgres");
        cfg.host_path(&dir.0);
        let c = Pg::connect_config(&mut cfg).await.unwrap_or_else(|e| panic!("over the socket: {e}\n{}", p.log_tail()));
        assert_eq!(c.scalar("select 1").await.expect("query"), "1");
        // The console over the socket, under PgBouncer's database name too.
        for db in ["parsnip", "pgbouncer"] {
            let mut cfg = pg_config(p.port(), "postgres", Some(SUPER_PW), db);
            cfg.host_path(&dir.0);
            let console = Pg::connect_config(&mut cfg).await.unwrap_or_else(|e| panic!("console {db}: {e}"));
            let rows = console.simple_query("SHOW VERSION").await.expect("SHOW VERSION");
            assert!(
                rows.iter().any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))),
                "console {db}: no row"
            );
        }
    })
    .await;
    // SIGINT (immediate exit) removes the socket file too.
    let mut p = p;
    p.signal(libc::SIGINT);
    assert!(p.wait_exit(Duration::from_secs(10)).is_some(), "SIGINT");
    assert!(!sock.exists(), "socket file left behind after SIGINT");

    let p = Parsnip::trust(&format!("unix_socket_dir = \"{d}\"\nunix_socket_mode = \"0700\""));
    assert_eq!(mode_of(&dir.0.join(format!(".s.PGSQL.{}", p.port()))), 0o700);
    drop(p);

    // unix_socket_group (PgBouncer's), by name: a group other than the process's own when
    // it may give the file one (root may give any: daemon's, gid 1 on Debian).
    // SAFETY: getegid/geteuid only read the process's ids.
    let (egid, euid) = unsafe { (libc::getegid(), libc::geteuid()) };
    let (name, gid) = if euid == 0 { ("daemon".to_string(), 1) } else { (egid.to_string(), egid) };
    let p = Parsnip::trust(&format!("unix_socket_dir = \"{d}\"\nunix_socket_group = \"{name}\""));
    let meta = std::fs::metadata(dir.0.join(format!(".s.PGSQL.{}", p.port()))).expect("socket file");
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), gid, "the socket file's group");
}

#[tokio::test]
async fn a_live_socket_is_never_taken_over_and_a_stale_one_is_replaced() {
    let dir = SockDir::new("live");
    let url = cluster().url();
    // Someone else's live socket: parsnip refuses to start, and the socket still answers.
    let live = dir.0.join("live.sock");
    let holder = UnixListener::bind(&live).expect("bind");
    let live_s = live.display().to_string();
    let (code, out) = start_fails(&[&url, "--listen", "127.0.0.1:0", "--listen", &live_s, "--unix-socket-dir", ""]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("another process is listening"), "{out}");
    assert!(UnixStream::connect(&live).is_ok(), "the other process's socket was removed");
    drop(holder);

    // A stale file (its process gone): replaced.
    let stale = dir.0.join("stale.sock");
    drop(UnixListener::bind(&stale).expect("bind"));
    assert!(stale.exists() && UnixStream::connect(&stale).is_err());
    let stale_s = stale.display().to_string();
    let p = Parsnip::start(&[&url, "--listen", &stale_s, "--unix-socket-dir", ""]);
    assert!(UnixStream::connect(&stale).is_ok(), "parsnip listens on the replaced file\n{}", p.log_tail());

    // An explicit unix_socket_dir that cannot be used is an error, not silently skipped.
    let missing = dir.0.join("missing").display().to_string();
    let (code, out) = start_fails(&[&url, "--listen", "127.0.0.1:0", "--unix-socket-dir", &missing]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("missing"), "{out}");
}
