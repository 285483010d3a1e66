//! Streaming replication for the multi-host tests: a primary (an embedded cluster with
//! `wal_level = replica`, WAL senders, hot standby, a `replicator` role and its
//! `replication` line in pg_hba.conf) and standbys made from it with
//! `pg_basebackup -R`, each on its own port and unix socket directory, run as the
//! embedded cluster runs its servers (its unprivileged user when the tests run as root).
//! Also: stopping the primary at once, promoting a standby, and waiting for replay.

#![allow(dead_code)]

use super::*;
use parsnip::embedded::Cluster;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Password of the `replicator` role.
pub const REPL_PW: &str = "repl-pw";

/// A primary ready to stream WAL to standbys (superuser password `SUPER_PW`, SCRAM).
pub fn start_primary() -> Cluster {
    let mut opts = cluster_options("scram-sha-256", Some(SUPER_PW));
    opts.extra_conf.extend(
        [
            "wal_level = replica",
            "max_wal_senders = 10",
            "hot_standby = on",
            "wal_keep_size = '128MB'",
            // A commit is flushed before it is acknowledged, so the primary's
            // pg_current_wal_lsn() afterwards covers it (the suite's default is off).
            "synchronous_commit = on",
        ]
        .map(String::from),
    );
    let primary = Cluster::start(opts).unwrap_or_else(|e| panic!("starting a primary: {e}"));
    let hba = primary.data_dir().join("pg_hba.conf");
    let mut text = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    text.push_str("host replication replicator 127.0.0.1/32 scram-sha-256\n");
    std::fs::write(&hba, text).expect("writing pg_hba.conf");
    primary
        .psql(
            "postgres",
            &format!("CREATE ROLE replicator REPLICATION LOGIN PASSWORD '{REPL_PW}'; SELECT pg_reload_conf();"),
        )
        .unwrap_or_else(|e| panic!("creating the replication role: {e}"));
    primary
}

/// A hot standby of a primary, streaming from it; stopped and removed on drop.
pub struct Standby {
    bin_dir: PathBuf,
    root: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    port: u16,
    ids: (u32, u32),
}

/// A command for PostgreSQL program `program` in `bin`, run as the owner of `owned` (the
/// embedded cluster's user) when the tests run as root, without the caller's PG* variables.
fn command_as(bin: &Path, program: &str, owned: &Path, cwd: &Path) -> Command {
    let mut cmd = Command::new(bin.join(program));
    for (key, _) in std::env::vars_os() {
        if key.as_encoded_bytes().starts_with(b"PG") {
            cmd.env_remove(key);
        }
    }
    cmd.env("LC_ALL", "C").env("LANG", "C").env("HOME", cwd).current_dir(cwd).stdin(Stdio::null());
    let meta = std::fs::metadata(owned).expect("owned path");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(meta.uid()).gid(meta.gid());
    }
    cmd
}

/// Runs `cmd`; panics with its output unless it succeeds.
fn run(mut cmd: Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// `pg_ctl stop -m immediate` on `primary`: its server is gone at once, as in a crash.
pub fn kill_primary(primary: &Cluster) {
    stop_primary(primary, "immediate");
}

/// `pg_ctl stop -m MODE` on `primary` (`fast`: a planned switchover's clean shutdown).
pub fn stop_primary(primary: &Cluster, mode: &str) {
    let root = primary.data_dir().parent().expect("root").to_path_buf();
    let mut cmd = command_as(primary.bin_dir(), "pg_ctl", primary.data_dir(), &root);
    cmd.arg("-D").arg(primary.data_dir()).args(["-w", "-t", "30", "-m", mode, "stop"]);
    run(cmd, &format!("pg_ctl stop -m {mode} (primary)"));
}

/// SIGKILL to `primary`'s postmaster (its backends notice its death by themselves);
/// returns once it is gone.
pub fn sigkill_postmaster(primary: &Cluster) {
    let pidfile = std::fs::read_to_string(primary.data_dir().join("postmaster.pid")).expect("postmaster.pid");
    let pid: i32 = pidfile.lines().next().and_then(|l| l.trim().parse().ok()).expect("postmaster pid");
    // SAFETY: kill has no memory preconditions; the pid is the postmaster's.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}");
    let t0 = Instant::now();
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the postmaster outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts `primary` again after `kill_primary`, as it was: an old primary back after a
/// failover, read-write on its old timeline. Its synchronous_standby_names is cleared
/// first (its standby follows another server now: its writes would wait forever).
pub fn start_again(primary: &Cluster) {
    let auto = primary.data_dir().join("postgresql.auto.conf");
    let text = std::fs::read_to_string(&auto).expect("postgresql.auto.conf");
    let kept: String =
        text.lines().filter(|l| !l.starts_with("synchronous_standby_names")).map(|l| format!("{l}\n")).collect();
    std::fs::write(&auto, kept).expect("writing postgresql.auto.conf");
    let root = primary.data_dir().parent().expect("root").to_path_buf();
    let mut cmd = command_as(primary.bin_dir(), "pg_ctl", primary.data_dir(), &root);
    cmd.arg("-D").arg(primary.data_dir()).arg("-l").arg(primary.log_file()).args(["-w", "-t", "60", "start"]);
    run(cmd, "pg_ctl start (old primary)");
}

impl Standby {
    /// `pg_basebackup -R` from `primary`, then started on a port of its own; returns once
    /// it accepts connections.
    pub fn start(primary: &Cluster) -> Standby {
        let root = temp_path("standby");
        std::fs::create_dir_all(&root).expect("standby root");
        let owner = std::fs::metadata(primary.data_dir()).expect("primary data dir");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&root, Some(owner.uid()), Some(owner.gid())).expect("chown standby root");
        }
        let data_dir = root.join("data");
        let socket_dir = root.join("sock");
        let mut cmd = command_as(primary.bin_dir(), "pg_basebackup", &root, &root);
        cmd.arg("-D").arg(&data_dir).args(["-R", "-X", "stream", "-c", "fast", "-d"]).arg(format!(
            "host=127.0.0.1 port={} user=replicator password={REPL_PW} application_name=standby",
            primary.port()
        ));
        run(cmd, "pg_basebackup");
        // -R wrote standby.signal and a primary_conninfo with every option this
        // pg_basebackup's libpq knows; the server's walreceiver may load an older libpq
        // (PostgreSQL 18 binaries on a system libpq of 15 refuse `sslnegotiation`), so
        // the conninfo is rewritten with the options that matter.
        let auto = data_dir.join("postgresql.auto.conf");
        let text = std::fs::read_to_string(&auto).expect("postgresql.auto.conf");
        let mut kept: String =
            text.lines().filter(|l| !l.starts_with("primary_conninfo")).map(|l| format!("{l}\n")).collect();
        kept.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=replicator password={REPL_PW} application_name=standby'\n",
            primary.port()
        ));
        std::fs::write(&auto, kept).expect("writing postgresql.auto.conf");
        let mut s = Standby {
            bin_dir: primary.bin_dir().to_path_buf(),
            log_file: root.join("server.log"),
            port: 0,
            data_dir,
            socket_dir,
            root,
            ids: (owner.uid(), owner.gid()),
        };
        std::fs::create_dir(&s.socket_dir).expect("standby socket dir");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&s.socket_dir, Some(s.ids.0), Some(s.ids.1)).expect("chown socket dir");
        }
        // The primary's settings (copied with the data) name its port and socket.
        let conf_path = s.data_dir.join("parsnip.conf");
        let conf = std::fs::read_to_string(&conf_path).expect("parsnip.conf in the backup");
        let mut last = String::new();
        for _ in 0..5 {
            s.port = free_port();
            let mut mine: String = conf
                .lines()
                .filter(|l| !l.starts_with("port =") && !l.starts_with("unix_socket_directories ="))
                .map(|l| format!("{l}\n"))
                .collect();
            mine.push_str(&format!("port = {}\nunix_socket_directories = '{}'\n", s.port, s.socket_dir.display()));
            std::fs::write(&conf_path, mine).expect("writing the standby's settings");
            let mut cmd = s.pg_ctl();
            cmd.arg("-l").arg(&s.log_file).args(["-w", "-t", "60", "start"]);
            match cmd.output() {
                Ok(o) if o.status.success() => return s,
                Ok(o) => {
                    last = format!("{} {}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
                }
                Err(e) => last = e.to_string(),
            }
        }
        panic!("standby did not start: {last}\n{}", std::fs::read_to_string(&s.log_file).unwrap_or_default());
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = command_as(&self.bin_dir, "pg_ctl", &self.root, &self.root);
        cmd.arg("-D").arg(&self.data_dir);
        cmd
    }

    /// Its TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs SQL as superuser over its unix socket (psql -At); Err with psql's error.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let mut cmd = command_as(&self.bin_dir, "psql", &self.root, &self.root);
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"]).arg(&self.socket_dir).args([
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            sql,
        ]);
        let out = cmd.output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// [`Standby::try_psql`], panicking on error.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql).unwrap_or_else(|e| panic!("psql on the standby: {sql}\n{e}"))
    }

    /// `pg_ctl promote -w`: returns once it is a primary.
    pub fn promote(&self) {
        let mut cmd = self.pg_ctl();
        cmd.args(["-w", "-t", "60", "promote"]);
        run(cmd, "pg_ctl promote");
    }

    /// Waits (bounded, polling) until it has replayed WAL up to `lsn`.
    pub fn wait_replayed(&self, lsn: &str, within: Duration) {
        let deadline = Instant::now() + within;
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        loop {
            let got = self.try_psql(&sql);
            if got.as_deref() == Ok("t") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "standby did not replay up to {lsn} within {within:?} (last answer {got:?}); its log:\n{}",
                std::fs::read_to_string(&self.log_file).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let mut cmd = self.pg_ctl();
        cmd.args(["-w", "-t", "30", "-m", "immediate", "stop"]).stdout(Stdio::null()).stderr(Stdio::null());
        let _ = cmd.status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// What one writer saw: the ids whose INSERT was acknowledged (when it was sent, when
/// acknowledged), and its errors.
#[derive(Default)]
pub struct Writes {
    pub acked: Vec<(i64, Instant, Instant)>,
    pub errors: Vec<String>,
}

/// A client writing short transactions (one INSERT each) through `db` until `stop`,
/// reconnecting when its connection is closed.
pub fn writer(
    p: std::sync::Arc<Parsnip>,
    db: &'static str,
    base: i64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    log: std::sync::Arc<std::sync::Mutex<Writes>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut c = p.connect("postgres", SUPER_PW, db).await;
        let mut id = base;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            id += 1;
            let sent = Instant::now();
            let failed = match c.simple_query(&format!("INSERT INTO t VALUES ({id}, 'w')")).await {
                Ok(_) => {
                    log.lock().unwrap().acked.push((id, sent, Instant::now()));
                    false
                }
                Err(e) => {
                    log.lock().unwrap().errors.push(describe(&e));
                    true
                }
            };
            // After an error the client starts afresh, as an application would (a FATAL
            // closes the connection, perhaps only after its reply was read).
            if failed || c.is_closed() {
                match p.try_connect("postgres", Some(SUPER_PW), db).await {
                    Ok(n) => c = n,
                    Err(e) => log.lock().unwrap().errors.push(format!("connect: {}", describe(&e))),
                }
            }
        }
    })
}

/// The writers of a failover test: `n` writers (`writer`, the i-th from id
/// (i+1)·1,000,000) on `db`, and four clients that each wrote one row (ids 100–103) and
/// now sit between transactions. Returns the writers' logs and tasks, and the idle clients.
pub async fn writers_and_idle(
    p: &std::sync::Arc<Parsnip>,
    db: &'static str,
    n: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<std::sync::Arc<std::sync::Mutex<Writes>>>, Vec<tokio::task::JoinHandle<()>>, Vec<Pg>) {
    let logs: Vec<std::sync::Arc<std::sync::Mutex<Writes>>> = (0..n).map(|_| Default::default()).collect();
    let tasks = logs
        .iter()
        .enumerate()
        .map(|(i, log)| writer(p.clone(), db, (i as i64 + 1) * 1_000_000, stop.clone(), log.clone()))
        .collect();
    let mut idle = Vec::new();
    for i in 0..4 {
        let c = p.connect("postgres", SUPER_PW, db).await;
        c.simple_query(&format!("INSERT INTO t VALUES ({}, 'idle')", 100 + i)).await.expect("idle client's write");
        idle.push(c);
    }
    (logs, tasks, idle)
}

/// Waits (bounded, polling) until `cond` holds.
pub async fn until_true(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
