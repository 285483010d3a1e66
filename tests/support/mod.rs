//! Shared harness of the end-to-end tests.
//!
//! * [`cluster`]: one throwaway PostgreSQL per test binary (SCRAM auth, roles `app`,
//!   `md5user`, `aq`, database `other`), stopped by an `atexit` hook when the binary exits.
//!   Its binaries are found as the embedded module finds them: `PARSNIP_PG_BIN` first
//!   (scripts/test.sh's second pass, PostgreSQL 18), else Debian's PostgreSQL 15.
//! * [`Parsnip`]: the pooler binary on a free port, its stderr/stdout collected, killed on
//!   drop (and by the kernel if the test thread dies first).
//! * [`Pg`]: a tokio-postgres client whose connection task forwards NOTICEs and reports how
//!   the connection ended.
//! * [`Raw`]: a hand-rolled v3 protocol client for protocol-level tests (own SCRAM/md5/cleartext).
//!
//! Setting `PARSNIP_E2E_DIRECT=1` makes [`Parsnip`] point at the cluster itself instead of
//! starting the pooler: a development aid to check that a test's assertions hold for plain
//! PostgreSQL (pooler-only features then fail, as they should).

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use parsnip::embedded::{Cluster, ClusterOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, NoTls, error::DbError};

/// Password of the cluster's superuser `postgres`.
pub const SUPER_PW: &str = "postgres-pw";
/// Password of role `app` (stored as SCRAM).
pub const APP_PW: &str = "app-pw";
/// Password of role `md5user` (stored as md5).
pub const MD5_PW: &str = "md5user-pw";
/// Password of role `aq` (stored as SCRAM; never listed in parsnip configs: auth_query only).
pub const AQ_PW: &str = "aq-pw";

// ---------------------------------------------------------------------------------------------
// The shared cluster
// ---------------------------------------------------------------------------------------------

static SHARED: LazyLock<Cluster> = LazyLock::new(start_shared_cluster);

/// The cluster shared by all tests of this binary (started on first use).
pub fn cluster() -> &'static Cluster {
    &SHARED
}

/// Options every cluster of the suite uses.
pub fn cluster_options(auth_method: &str, superuser_password: Option<&str>) -> ClusterOptions {
    ClusterOptions {
        auth_method: auth_method.to_string(),
        superuser_password: superuser_password.map(str::to_string),
        extra_conf: vec![
            "max_connections = 400".to_string(),
            // Fast failure instead of long waits if something goes wrong.
            "lock_timeout = '20s'".to_string(),
        ],
        max_connections: 400,
        ..ClusterOptions::default()
    }
}

fn start_shared_cluster() -> Cluster {
    let cluster = Cluster::start(cluster_options("scram-sha-256", Some(SUPER_PW)))
        .unwrap_or_else(|e| panic!("starting the shared PostgreSQL cluster: {e}"));
    register_cluster_cleanup(&cluster);
    let setup = format!(
        "CREATE ROLE app LOGIN PASSWORD '{APP_PW}';\n\
         CREATE ROLE aq LOGIN PASSWORD '{AQ_PW}';\n\
         SET password_encryption = 'md5';\n\
         CREATE ROLE md5user LOGIN PASSWORD '{MD5_PW}';\n\
         RESET password_encryption;\n\
         GRANT ALL ON SCHEMA public TO PUBLIC;\n\
         CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);\n\
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 10) g;\n\
         GRANT ALL ON items TO PUBLIC;\n\
         CREATE DATABASE other;\n"
    );
    cluster.psql("postgres", &setup).unwrap_or_else(|e| panic!("setting up the shared cluster: {e}"));
    cluster
        .psql(
            "other",
            "CREATE TABLE where_am_i (name text); INSERT INTO where_am_i VALUES ('other');\
             GRANT ALL ON SCHEMA public TO PUBLIC; GRANT ALL ON where_am_i TO PUBLIC;",
        )
        .unwrap_or_else(|e| panic!("setting up database other: {e}"));
    cluster
}

/// What the exit hook needs to stop a cluster held in a static (statics are never dropped).
struct ClusterHandle {
    pg_ctl: PathBuf,
    data_dir: PathBuf,
    root: PathBuf,
    uid: u32,
    gid: u32,
}

static CLEANUP: Mutex<Vec<ClusterHandle>> = Mutex::new(Vec::new());

fn register_cluster_cleanup(cluster: &Cluster) {
    let data_dir = cluster.data_dir().to_path_buf();
    let meta = std::fs::metadata(&data_dir).expect("cluster data dir");
    let handle = ClusterHandle {
        pg_ctl: cluster.bin_dir().join("pg_ctl"),
        root: data_dir.parent().expect("data dir has a parent").to_path_buf(),
        data_dir,
        uid: meta.uid(),
        gid: meta.gid(),
    };
    let mut list = CLEANUP.lock().unwrap_or_else(|p| p.into_inner());
    if list.is_empty() {
        // SAFETY: registering a plain extern "C" function without captured state.
        unsafe { libc::atexit(stop_clusters_at_exit) };
    }
    list.push(handle);
}

extern "C" fn stop_clusters_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let handles = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()));
        for h in handles {
            let mut cmd = Command::new(&h.pg_ctl);
            cmd.arg("-D")
                .arg(&h.data_dir)
                .args(["-w", "-t", "30", "-m", "immediate", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .current_dir(&h.root);
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                cmd.uid(h.uid).gid(h.gid);
            }
            let _ = cmd.status();
            let _ = std::fs::remove_dir_all(&h.root);
        }
    });
}

/// Runs SQL on the shared cluster as superuser; panics with psql's error.
pub fn psql(db: &str, sql: &str) -> String {
    cluster().psql(db, sql).unwrap_or_else(|e| panic!("psql on {db}: {sql}\n{e}"))
}

/// [`psql`] off the async runtime.
pub async fn psql_async(db: &str, sql: &str) -> String {
    let (db, sql) = (db.to_string(), sql.to_string());
    tokio::task::spawn_blocking(move || psql(&db, &sql)).await.expect("psql task")
}

/// Creates (or recreates) database `name` on the shared cluster, writable by everyone.
pub fn create_db(name: &str) {
    psql("postgres", &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE);\nCREATE DATABASE {name};"));
    psql(name, "GRANT ALL ON SCHEMA public TO PUBLIC;");
}

/// Client backends connected to database `db` (the querying psql excluded), by state.
pub fn backends(db: &str) -> Vec<(String, String)> {
    let out = psql(
        "postgres",
        &format!(
            "SELECT usename, coalesce(state, '') FROM pg_stat_activity \
             WHERE datname = '{db}' AND backend_type = 'client backend' \
             AND pid <> pg_backend_pid()"
        ),
    );
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (u, s) = l.split_once('|').unwrap_or((l, ""));
            (u.to_string(), s.to_string())
        })
        .collect()
}

/// Waits (bounded) until `cond` holds on the backends of `db`; returns the last view.
pub async fn wait_backends(
    db: &str,
    within: Duration,
    cond: impl Fn(&[(String, String)]) -> bool,
) -> Result<Vec<(String, String)>, Vec<(String, String)>> {
    let deadline = Instant::now() + within;
    loop {
        let db2 = db.to_string();
        let view = tokio::task::spawn_blocking(move || backends(&db2)).await.expect("backends task");
        if cond(&view) {
            return Ok(view);
        }
        if Instant::now() > deadline {
            return Err(view);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Time bounds
// ---------------------------------------------------------------------------------------------

/// Runs `f`, panicking if it takes longer than `secs` seconds.
pub async fn bounded<F: Future>(secs: u64, what: &str, f: F) -> F::Output {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {secs}s"),
    }
}

/// Runs `f`, Err if it takes longer than `dur`.
pub async fn within<F: Future>(dur: Duration, f: F) -> Result<F::Output, String> {
    tokio::time::timeout(dur, f).await.map_err(|_| format!("timed out after {dur:?}"))
}

// ---------------------------------------------------------------------------------------------
// The pooler process
// ---------------------------------------------------------------------------------------------

/// A free TCP port on 127.0.0.1 (the listener is closed again before returning).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("binding 127.0.0.1:0")
}

static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Lines logged by a pooler process, shared with its reader threads.
type Logs = Arc<Mutex<Vec<String>>>;

/// A running parsnip (or, with `PARSNIP_E2E_DIRECT=1`, the cluster itself).
pub struct Parsnip {
    child: Option<Child>,
    port: u16,
    logs: Arc<Mutex<Vec<String>>>,
    config_file: Option<PathBuf>,
    args: Vec<String>,
}

/// True when tests should talk to PostgreSQL directly (development aid).
pub fn direct_mode() -> bool {
    std::env::var_os("PARSNIP_E2E_DIRECT").is_some_and(|v| !v.is_empty() && v != "0")
}

impl Parsnip {
    /// Starts `parsnip ARGS --listen 127.0.0.1:PORT` and waits until it listens.
    pub fn start(args: &[&str]) -> Parsnip {
        Self::spawn(args.iter().map(|s| s.to_string()).collect(), None)
    }

    /// `parsnip postgres://postgres:postgres-pw@127.0.0.1:PORT/postgres ARGS` against the
    /// shared cluster.
    pub fn url_mode(args: &[&str]) -> Parsnip {
        let url = cluster().url();
        let mut all = vec![url.as_str()];
        all.extend_from_slice(args);
        Self::start(&all)
    }

    /// Writes `toml` to a temp file and starts `parsnip -c FILE --listen 127.0.0.1:PORT`.
    pub fn with_config(toml: &str) -> Parsnip {
        Self::with_config_args(toml, &[])
    }

    /// [`Parsnip::with_config`] plus extra command-line arguments.
    pub fn with_config_args(toml: &str, args: &[&str]) -> Parsnip {
        let path = std::env::temp_dir().join(format!(
            "parsnip-e2e-{}-{}.toml",
            std::process::id(),
            FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, toml).expect("writing the config file");
        let mut all = vec!["-c".to_string(), path.display().to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        Self::spawn(all, Some(path))
    }

    /// A trust-auth config for the shared cluster: `top` holds extra top-level keys.
    /// Users `postgres` and `app` are listed with their plain passwords (used for server logins).
    pub fn trust(top: &str) -> Parsnip {
        Self::with_config(&trust_config(top))
    }

    fn spawn(args: Vec<String>, config_file: Option<PathBuf>) -> Parsnip {
        if direct_mode() {
            return Parsnip {
                child: None,
                port: cluster().port(),
                logs: Arc::new(Mutex::new(vec!["(direct mode: no parsnip)".into()])),
                config_file,
                args,
            };
        }
        let mut last_error = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            match Self::try_spawn(&args, port) {
                Ok((child, logs)) => {
                    return Parsnip { child: Some(child), port, logs, config_file, args };
                }
                Err((msg, port_taken)) => {
                    last_error = msg;
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        if let Some(p) = &config_file {
            let _ = std::fs::remove_file(p);
        }
        panic!("parsnip did not start: {last_error}");
    }

    fn try_spawn(args: &[String], port: u16) -> Result<(Child, Logs), (String, bool)> {
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_parsnip"));
        cmd.args(args)
            .args(["--listen", &listen])
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; the closure touches no shared state.
        unsafe {
            cmd.pre_exec(|| {
                // Killed by the kernel if the spawning (test) thread dies without dropping us.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| (format!("spawning {}: {e}", env!("CARGO_BIN_EXE_parsnip")), false))?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<bool>();
        for stream in [
            Box::new(child.stderr.take().expect("stderr")) as Box<dyn Read + Send>,
            Box::new(child.stdout.take().expect("stdout")),
        ] {
            let logs = logs.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).split(b'\n') {
                    let Ok(line) = line else { break };
                    let line = strip_ansi(&String::from_utf8_lossy(&line));
                    let ready = line.contains("listening on");
                    logs.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                    if ready {
                        let _ = tx.send(true);
                    }
                }
                let _ = tx.send(false);
            });
        }
        drop(tx);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut eofs = 0;
        let tail = |logs: &Arc<Mutex<Vec<String>>>| log_tail(&logs.lock().unwrap(), 40);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(true) => break,
                Ok(false) => {
                    eofs += 1;
                    if eofs == 2 {
                        let status = child.wait().ok();
                        let logs_text = tail(&logs);
                        let taken = logs_text.contains("in use");
                        return Err((
                            format!("exited ({status:?}) before listening; args {args:?}; log:\n{logs_text}"),
                            taken,
                        ));
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err((
                        format!("no \"listening on\" within 30s; args {args:?}; log:\n{}", tail(&logs)),
                        false,
                    ));
                }
            }
        }
        // The log line says it listens; make sure our address accepts (bounded retry).
        let addr: SocketAddr = listen.parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err((format!("logged listening but {listen} refuses: {e}; log:\n{}", tail(&logs)), false));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        Ok((child, logs))
    }

    /// The port parsnip listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The pooler's pid (None in direct mode).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Everything logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
    }

    /// The last lines logged, for failure messages.
    pub fn log_tail(&self) -> String {
        format!(
            "--- parsnip {:?} log tail ---\n{}\n--- end of parsnip log ---",
            self.args,
            log_tail(&self.logs.lock().unwrap_or_else(|p| p.into_inner()), 40)
        )
    }

    /// The pooler's peak resident memory so far (VmHWM), in KiB; None without a process.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Sends a signal to the pooler.
    pub fn signal(&self, sig: i32) {
        let pid = self.pid().expect("signal: no parsnip process (direct mode?)");
        // SAFETY: plain kill(2) on our own child.
        let rc = unsafe { libc::kill(pid as i32, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// Waits (bounded) for the process to exit; None if it is still running after `dur`.
    pub fn wait_exit(&mut self, dur: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + dur;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }

    /// [`Parsnip::wait_exit`] off the async runtime.
    pub async fn wait_exit_async(&mut self, dur: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + dur;
        loop {
            let child = self.child.as_mut()?;
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
                _ => return None,
            }
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// A value of `/proc/PID/status` in kB (e.g. "VmPeak", "VmRSS").
    pub fn proc_status_kb(&self, key: &str) -> Option<u64> {
        let pid = self.pid()?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// A tokio-postgres connection through the pooler; panics (with the log tail) on failure.
    pub async fn connect(&self, user: &str, password: &str, db: &str) -> Pg {
        match Pg::connect(self.port, user, Some(password), db).await {
            Ok(pg) => pg,
            Err(e) => panic!("connecting to parsnip as {user}@{db}: {}\n{}", describe(&e), self.log_tail()),
        }
    }

    /// [`Parsnip::connect`] returning the error.
    pub async fn try_connect(&self, user: &str, password: Option<&str>, db: &str) -> Result<Pg, tokio_postgres::Error> {
        Pg::connect(self.port, user, password, db).await
    }

    /// A raw protocol connection to the pooler (not logged in).
    pub async fn raw(&self) -> Raw {
        Raw::tcp(self.port).await
    }

    /// A raw connection logged in as `user` on `db`.
    pub async fn raw_login(&self, user: &str, password: &str, db: &str) -> Raw {
        let mut raw = self.raw().await;
        if let Err(e) = raw.startup(&[("user", user), ("database", db)], Some(password)).await {
            panic!("raw login as {user}@{db}: {e}\n{}", self.log_tail());
        }
        raw
    }
}

impl Drop for Parsnip {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child, which has not been reaped yet.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
        if let Some(p) = self.config_file.take() {
            let _ = std::fs::remove_file(p);
        }
        // Shown by the test harness only when the test fails.
        eprintln!("{}", self.log_tail());
    }
}

/// The trust-auth configuration text used by [`Parsnip::trust`].
pub fn trust_config(top: &str) -> String {
    format!(
        "auth_type = \"trust\"\n{top}\n\n\
         [databases.\"*\"]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n\n\
         [users.app]\npassword = \"{APP_PW}\"\n",
        port = cluster().port()
    )
}

fn log_tail(lines: &[String], n: usize) -> String {
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// tokio-postgres clients
// ---------------------------------------------------------------------------------------------

/// A tokio-postgres client plus its connection task.
pub struct Pg {
    pub client: Client,
    /// NOTICEs (and other non-error async notices) received on this connection.
    pub notices: tokio::sync::mpsc::UnboundedReceiver<DbError>,
    /// How the connection ended: Ok on a clean close, Err with e.g. a FATAL from the server.
    pub task: JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl std::ops::Deref for Pg {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Pg {
    /// Connects to 127.0.0.1:`port`.
    pub async fn connect(port: u16, user: &str, password: Option<&str>, db: &str) -> Result<Pg, tokio_postgres::Error> {
        let mut cfg = pg_config(port, user, password, db);
        Self::connect_config(&mut cfg).await
    }

    /// Connects with a prepared configuration.
    pub async fn connect_config(cfg: &mut tokio_postgres::Config) -> Result<Pg, tokio_postgres::Error> {
        let (client, mut conn) = cfg.connect(NoTls).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notice(n))) => {
                        let _ = tx.send(n);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e),
                    None => return Ok(()),
                }
            }
        });
        Ok(Pg { client, notices: rx, task })
    }

    /// Closes the socket abruptly (no Terminate message), as a crashed client would.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        drop(self.client);
    }

    /// Waits (bounded) for the server side to end the connection; returns how it ended.
    pub async fn ended(self, dur: Duration) -> Result<Result<(), tokio_postgres::Error>, String> {
        let Pg { client, task, .. } = self;
        let r = within(dur, task).await;
        drop(client);
        r.map(|j| j.expect("connection task panicked"))
    }

    /// First column of the first row of a simple query, as text.
    pub async fn scalar(&self, sql: &str) -> Result<String, tokio_postgres::Error> {
        let msgs = self.client.simple_query(sql).await?;
        for m in msgs {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                return Ok(r.get(0).unwrap_or("NULL").to_string());
            }
        }
        Ok(String::new())
    }
}

/// A tokio-postgres configuration for 127.0.0.1:`port`.
pub fn pg_config(port: u16, user: &str, password: Option<&str>, db: &str) -> tokio_postgres::Config {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1").port(port).user(user).dbname(db).connect_timeout(Duration::from_secs(10));
    if let Some(pw) = password {
        cfg.password(pw);
    }
    cfg
}

/// SQLSTATE of a tokio-postgres error, if it came from the server (or pooler).
pub fn sqlstate(e: &tokio_postgres::Error) -> Option<String> {
    e.as_db_error().map(|d| d.code().code().to_string())
}

/// "CODE SEVERITY: message" or the error's Display.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} {}: {}", d.code().code(), d.severity(), d.message()),
        None => format!("{e} ({e:?})"),
    }
}

/// Asserts that `r` failed with `code`; returns the server's error.
pub fn expect_code<T: std::fmt::Debug>(r: Result<T, tokio_postgres::Error>, code: &str, context: &str) -> DbError {
    match r {
        Ok(v) => panic!("{context}: expected SQLSTATE {code}, got success {v:?}"),
        Err(e) => match e.as_db_error() {
            Some(d) if d.code().code() == code => d.clone(),
            _ => panic!("{context}: expected SQLSTATE {code}, got {}", describe(&e)),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Raw protocol client
// ---------------------------------------------------------------------------------------------

/// One backend message.
#[derive(Clone, Debug)]
pub struct Frame {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl Frame {
    /// The fields of an ErrorResponse ('E') or NoticeResponse ('N').
    pub fn fields(&self) -> Option<PgError> {
        if self.tag != b'E' && self.tag != b'N' {
            return None;
        }
        Some(PgError::parse(&self.body))
    }
}

/// A parsed ErrorResponse.
#[derive(Clone, Debug, Default)]
pub struct PgError {
    pub fields: HashMap<u8, String>,
}

impl PgError {
    fn parse(body: &[u8]) -> PgError {
        let mut fields = HashMap::new();
        let mut rest = body;
        while let Some((&t, r)) = rest.split_first() {
            if t == 0 {
                break;
            }
            let end = r.iter().position(|&b| b == 0).unwrap_or(r.len());
            fields.insert(t, String::from_utf8_lossy(&r[..end]).into_owned());
            rest = r.get(end + 1..).unwrap_or(&[]);
        }
        PgError { fields }
    }
    pub fn code(&self) -> &str {
        self.fields.get(&b'C').map(String::as_str).unwrap_or("")
    }
    pub fn severity(&self) -> &str {
        self.fields.get(&b'V').or_else(|| self.fields.get(&b'S')).map(String::as_str).unwrap_or("")
    }
    pub fn message(&self) -> &str {
        self.fields.get(&b'M').map(String::as_str).unwrap_or("")
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code(), self.severity(), self.message())
    }
}

/// How a read sequence ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// ReadyForQuery with this status byte.
    Ready(u8),
    /// The peer closed the connection (or reset it).
    Closed,
}

/// A raw v3 protocol connection.
pub struct Raw {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// ParameterStatus values received.
    pub params: HashMap<String, String>,
    /// BackendKeyData (pid, key), if received.
    pub key: Option<(i32, i32)>,
    /// Authentication request codes received (0 = ok, 3 = cleartext, 5 = md5, 10 = SASL, ...).
    pub auth_requests: Vec<i32>,
}

/// `tag + len + body`.
pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(body.len() + 5);
    m.push(tag);
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// A v3.0 StartupMessage with these parameters.
pub fn startup_packet(params: &[(&str, &str)]) -> Vec<u8> {
    startup_packet_version(196608, params)
}

/// A StartupMessage with an arbitrary protocol code.
pub fn startup_packet_version(code: u32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    m.extend_from_slice(&body);
    m
}

/// A simple Query message.
pub fn query_msg(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    msg(b'Q', &body)
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

impl Raw {
    /// Connects to 127.0.0.1:`port`.
    pub async fn tcp(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
        stream.set_nodelay(true).ok();
        Raw { stream, buf: Vec::new(), params: HashMap::new(), key: None, auth_requests: Vec::new() }
    }

    /// Writes bytes; Err if the peer is gone.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    }

    /// One byte (the answer to SSLRequest); None on EOF.
    pub async fn read_byte(&mut self) -> Option<u8> {
        if !self.fill(1).await {
            return None;
        }
        Some(self.buf.remove(0))
    }

    /// The next message; None once the peer has closed (or reset) the connection.
    pub async fn read_frame(&mut self) -> Option<Frame> {
        if !self.fill(5).await {
            return None;
        }
        let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
        assert!(
            (4..=64 << 20).contains(&len),
            "implausible backend message length {len} (tag {:?})",
            self.buf[0] as char
        );
        if !self.fill(1 + len).await {
            return None;
        }
        let body = self.buf[5..1 + len].to_vec();
        let tag = self.buf[0];
        self.buf.drain(..1 + len);
        match tag {
            b'S' => {
                let parts: Vec<&[u8]> = body.split(|&b| b == 0).collect();
                if parts.len() >= 2 {
                    self.params.insert(
                        String::from_utf8_lossy(parts[0]).into_owned(),
                        String::from_utf8_lossy(parts[1]).into_owned(),
                    );
                }
            }
            b'K' if body.len() >= 8 => {
                self.key = Some((
                    i32::from_be_bytes(body[0..4].try_into().unwrap()),
                    i32::from_be_bytes(body[4..8].try_into().unwrap()),
                ));
            }
            _ => {}
        }
        Some(Frame { tag, body })
    }

    /// Reads frames until ReadyForQuery or the end of the connection.
    pub async fn read_until_ready(&mut self) -> (Vec<Frame>, End) {
        let mut frames = Vec::new();
        loop {
            match self.read_frame().await {
                None => return (frames, End::Closed),
                Some(f) if f.tag == b'Z' => {
                    let status = f.body.first().copied().unwrap_or(0);
                    frames.push(f);
                    return (frames, End::Ready(status));
                }
                Some(f) => frames.push(f),
            }
        }
    }

    /// Reads frames until the peer closes; panics if that takes longer than `dur`.
    pub async fn read_until_closed(&mut self, dur: Duration) -> Vec<Frame> {
        let mut frames = Vec::new();
        let r = within(dur, async {
            while let Some(f) = self.read_frame().await {
                frames.push(f);
            }
        })
        .await;
        if r.is_err() {
            panic!("connection not closed within {dur:?}; frames so far: {}", summarize(&frames));
        }
        frames
    }

    /// Expects an ErrorResponse followed by the connection closing (within `dur`); returns it.
    pub async fn expect_error_and_close(&mut self, dur: Duration, context: &str) -> PgError {
        let frames = within(dur, async {
            let mut frames = Vec::new();
            while let Some(f) = self.read_frame().await {
                frames.push(f);
            }
            frames
        })
        .await
        .unwrap_or_else(|e| panic!("{context}: connection not closed: {e}"));
        frames.iter().find(|f| f.tag == b'E').and_then(Frame::fields).unwrap_or_else(|| {
            panic!("{context}: connection closed without an ErrorResponse; got {}", summarize(&frames))
        })
    }

    /// Sends a StartupMessage and authenticates (cleartext, md5 or SCRAM-SHA-256 as asked)
    /// until ReadyForQuery. Err with the server's error.
    pub async fn startup(&mut self, params: &[(&str, &str)], password: Option<&str>) -> Result<(), PgError> {
        let user = params.iter().find(|(k, _)| *k == "user").map(|(_, v)| *v).unwrap_or("");
        self.send(&startup_packet(params)).await.map_err(|e| io_err(&e.to_string()))?;
        let mut scram: Option<ScramState> = None;
        loop {
            let Some(f) = self.read_frame().await else {
                return Err(io_err("connection closed during startup"));
            };
            match f.tag {
                b'E' => return Err(f.fields().unwrap()),
                b'Z' => return Ok(()),
                b'R' => {
                    let code = i32::from_be_bytes(f.body[0..4].try_into().unwrap());
                    self.auth_requests.push(code);
                    let pw = || password.ok_or_else(|| io_err("password requested but none given"));
                    match code {
                        0 => {}
                        3 => {
                            let m = msg(b'p', &cstr(pw()?));
                            self.send(&m).await.map_err(|e| io_err(&e.to_string()))?;
                        }
                        5 => {
                            let salt = &f.body[4..8];
                            let m = msg(b'p', &cstr(&md5_response(user, pw()?, salt)));
                            self.send(&m).await.map_err(|e| io_err(&e.to_string()))?;
                        }
                        10 => {
                            let mechs = String::from_utf8_lossy(&f.body[4..]).into_owned();
                            if !mechs.split('\0').any(|m| m == "SCRAM-SHA-256") {
                                return Err(io_err(&format!("no SCRAM-SHA-256 in {mechs:?}")));
                            }
                            let state = ScramState::new(pw()?);
                            let first = state.client_first();
                            let mut body = cstr("SCRAM-SHA-256");
                            body.extend_from_slice(&(first.len() as i32).to_be_bytes());
                            body.extend_from_slice(first.as_bytes());
                            self.send(&msg(b'p', &body)).await.map_err(|e| io_err(&e.to_string()))?;
                            scram = Some(state);
                        }
                        11 => {
                            let state = scram.as_mut().ok_or_else(|| io_err("SASLContinue without SASL"))?;
                            let fin = state.client_final(&String::from_utf8_lossy(&f.body[4..]))?;
                            self.send(&msg(b'p', fin.as_bytes())).await.map_err(|e| io_err(&e.to_string()))?;
                        }
                        12 => {
                            let state = scram.as_ref().ok_or_else(|| io_err("SASLFinal without SASL"))?;
                            state.verify_server(&String::from_utf8_lossy(&f.body[4..]))?;
                        }
                        other => return Err(io_err(&format!("unsupported auth request {other}"))),
                    }
                }
                _ => {}
            }
        }
    }

    /// Runs a simple query; rows as text (NULL = None) of the last result set, or the error.
    /// Reads until ReadyForQuery (an error frame followed by close is returned as the error).
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, PgError> {
        self.send(&query_msg(sql)).await.map_err(|e| io_err(&format!("sending query: {e}")))?;
        let (frames, end) = self.read_until_ready().await;
        if let Some(e) = frames.iter().find(|f| f.tag == b'E') {
            return Err(e.fields().unwrap());
        }
        if end == End::Closed {
            return Err(io_err(&format!("connection closed before ReadyForQuery; got {}", summarize(&frames))));
        }
        let mut rows = Vec::new();
        for f in frames {
            match f.tag {
                b'T' => rows.clear(),
                b'D' => rows.push(parse_data_row(&f.body)),
                _ => {}
            }
        }
        Ok(rows)
    }

    /// First column of the first row.
    pub async fn scalar(&mut self, sql: &str) -> Result<Option<String>, PgError> {
        let rows = self.simple_query(sql).await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next()).flatten())
    }
}

fn parse_data_row(body: &[u8]) -> Vec<Option<String>> {
    let n = i16::from_be_bytes(body[0..2].try_into().unwrap()) as usize;
    let mut pos = 2;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes(body[pos..pos + 4].try_into().unwrap());
        pos += 4;
        if len < 0 {
            out.push(None);
        } else {
            let len = len as usize;
            out.push(Some(String::from_utf8_lossy(&body[pos..pos + len]).into_owned()));
            pos += len;
        }
    }
    out
}

/// A short description of frames, for failure messages.
pub fn summarize(frames: &[Frame]) -> String {
    let parts: Vec<String> = frames
        .iter()
        .map(|f| match f.fields() {
            Some(e) => format!("{}[{e}]", f.tag as char),
            None => format!("{}", f.tag as char),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn io_err(text: &str) -> PgError {
    let mut fields = HashMap::new();
    fields.insert(b'C', "(client)".to_string());
    fields.insert(b'M', text.to_string());
    PgError { fields }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest as _;
    hex(&md5::Md5::digest(data))
}

/// PostgreSQL's md5 answer: "md5" + md5(md5(password + user) + salt).
pub fn md5_response(user: &str, password: &str, salt: &[u8]) -> String {
    let inner = md5_hex(format!("{password}{user}").as_bytes());
    let mut outer = inner.into_bytes();
    outer.extend_from_slice(salt);
    format!("md5{}", md5_hex(&outer))
}

/// PostgreSQL's stored md5 secret: "md5" + md5(password + user).
pub fn md5_secret(user: &str, password: &str) -> String {
    format!("md5{}", md5_hex(format!("{password}{user}").as_bytes()))
}

struct ScramState {
    password: String,
    nonce: String,
    client_first_bare: String,
    auth_message: String,
    server_key: Vec<u8>,
}

fn hmac256(key: &[u8], data: &[u8]) -> Vec<u8> {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key).expect("hmac key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

impl ScramState {
    fn new(password: &str) -> ScramState {
        let mut raw = [0u8; 18];
        rand::fill(&mut raw[..]);
        let nonce = b64(&raw);
        ScramState {
            password: password.to_string(),
            client_first_bare: format!("n=,r={nonce}"),
            nonce,
            auth_message: String::new(),
            server_key: Vec::new(),
        }
    }

    fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    fn client_final(&mut self, server_first: &str) -> Result<String, PgError> {
        let mut nonce = None;
        let mut salt = None;
        let mut iters = None;
        for part in server_first.split(',') {
            if let Some(v) = part.strip_prefix("r=") {
                nonce = Some(v.to_string());
            } else if let Some(v) = part.strip_prefix("s=") {
                salt = Some(unb64(v)?);
            } else if let Some(v) = part.strip_prefix("i=") {
                iters = v.parse::<u32>().ok();
            }
        }
        let (Some(nonce), Some(salt), Some(iters)) = (nonce, salt, iters) else {
            return Err(io_err(&format!("bad server-first-message {server_first:?}")));
        };
        if !nonce.starts_with(&self.nonce) {
            return Err(io_err("server nonce does not extend ours"));
        }
        let salted = pbkdf2::pbkdf2_hmac_array::<sha2::Sha256, 32>(self.password.as_bytes(), &salt, iters);
        let client_key = hmac256(&salted, b"Client Key");
        let stored_key = {
            use sha2::Digest as _;
            sha2::Sha256::digest(&client_key).to_vec()
        };
        let without_proof = format!("c=biws,r={nonce}");
        self.auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac256(&stored_key, self.auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        self.server_key = hmac256(&salted, b"Server Key");
        Ok(format!("{without_proof},p={}", b64(&proof)))
    }

    fn verify_server(&self, server_final: &str) -> Result<(), PgError> {
        let v = server_final
            .strip_prefix("v=")
            .ok_or_else(|| io_err(&format!("bad server-final-message {server_final:?}")))?;
        let expected = hmac256(&self.server_key, self.auth_message.as_bytes());
        if unb64(v)? != expected {
            return Err(io_err("server signature does not verify"));
        }
        Ok(())
    }
}

fn b64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(s: &str) -> Result<Vec<u8>, PgError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| io_err(&format!("bad base64 {s:?}: {e}")))
}

/// The stored SCRAM secret of `role` on the shared cluster (from pg_authid).
pub fn stored_secret(role: &str) -> String {
    psql("postgres", &format!("SELECT rolpassword FROM pg_authid WHERE rolname = '{role}'"))
}

/// A path inside the system temp dir that does not exist yet.
pub fn temp_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "parsnip-e2e-{}-{}-{what}",
        std::process::id(),
        FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Whether a path exists.
pub fn exists(p: &Path) -> bool {
    p.exists()
}
