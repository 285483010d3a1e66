//! The pooler binary on a free port, its output collected, killed on drop.

#![allow(dead_code)]

use super::*;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// How many event loops a test pooler runs. The suite's default is two, whatever the
/// machine: clients and server connections then cross loops (a connection moved to its
/// client's loop) as they do wherever parsnip has cores to spare, although the binary's own
/// default on a 2-core machine with its server on it is one loop. The driver matrix runs
/// that default. `PARSNIP_WORKERS` in the test's environment wins.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loops {
    Two,
    /// What the binary chooses (`driver::default_loops`).
    Default,
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
        Self::with_config_loops(toml, args, Loops::Two)
    }

    /// A trust-auth config for the shared cluster: `top` holds extra top-level keys.
    /// Users `postgres` and `app` are listed with their plain passwords (used for server logins).
    pub fn trust(top: &str) -> Parsnip {
        Self::with_config(&trust_config(top))
    }

    /// [`Parsnip::with_config`], with the number of event loops the binary chooses by
    /// itself, `PARSNIP_WORKERS` removed (the suite's other poolers run two).
    pub fn with_config_default_loops(toml: &str) -> Parsnip {
        Self::with_config_loops(toml, &[], Loops::Default)
    }

    fn with_config_loops(toml: &str, args: &[&str], loops: Loops) -> Parsnip {
        let path = std::env::temp_dir().join(format!(
            "parsnip-e2e-{}-{}.toml",
            std::process::id(),
            FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, toml).expect("writing the config file");
        let mut all = vec!["-c".to_string(), path.display().to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        Self::spawn_with(all, Some(path), loops)
    }

    fn spawn(args: Vec<String>, config_file: Option<PathBuf>) -> Parsnip {
        Self::spawn_with(args, config_file, Loops::Two)
    }

    fn spawn_with(args: Vec<String>, config_file: Option<PathBuf>, loops: Loops) -> Parsnip {
        if direct_mode() {
            return Parsnip {
                child: None,
                port: cluster().port(),
                logs: Arc::new(Mutex::new(vec!["(direct mode: no parsnip)".into()])),
                config_file,
                args,
            };
        }
        // No unix socket in the system's directories unless the test asks for one: a
        // killed test parsnip would leave its socket file behind there.
        let mut args = args;
        let config_names_dir = config_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .is_some_and(|t| t.contains("unix_socket_dir"));
        if !config_names_dir && !args.iter().any(|a| a == "--unix-socket-dir") {
            args.extend(["--unix-socket-dir".to_string(), String::new()]);
        }
        let mut last_error = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            match Self::try_spawn(&args, port, loops) {
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

    fn try_spawn(args: &[String], port: u16, loops: Loops) -> Result<(Child, Logs), (String, bool)> {
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_parsnip"));
        cmd.args(args).args(["--listen", &listen]);
        // A debugging aid: PARSNIP_TEST_LOG=debug,parsnip::session::wire_trace=trace logs
        // every frame of every pooler a test starts (shown with the log tail on failure).
        if let Ok(level) = std::env::var("PARSNIP_TEST_LOG") {
            cmd.args(["--log-level", &level]);
        }
        match loops {
            Loops::Two if std::env::var_os("PARSNIP_WORKERS").is_none() => {
                cmd.env("PARSNIP_WORKERS", "2");
            }
            Loops::Two => {}
            Loops::Default => {
                cmd.env_remove("PARSNIP_WORKERS");
            }
        }
        cmd.env("NO_COLOR", "1")
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

    /// Replaces the config file's contents (then SIGHUP or the console's RELOAD).
    pub fn rewrite_config(&self, toml: &str) {
        let p = self.config_file.as_ref().expect("started with a config file");
        std::fs::write(p, toml).expect("rewriting the config file");
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

    /// Whether a line containing `needle` is logged within `within`: a line the pooler
    /// writes as (or just after) it answers a client may reach the reader thread after the
    /// client has its answer.
    pub fn wait_for_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.logs.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|l| l.contains(needle)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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
        // A debugging aid: PARSNIP_TEST_LOG_DIR=<dir> keeps each pooler's whole log there.
        if let Ok(dir) = std::env::var("PARSNIP_TEST_LOG_DIR") {
            let path = std::path::Path::new(&dir).join(format!("parsnip-{}.log", self.port));
            let _ = std::fs::write(path, self.logs());
        }
        // Shown by the test harness only when the test fails.
        eprintln!("{}", self.log_tail());
    }
}

/// The usual setup of an end-to-end test: a fresh database `db` on the shared cluster with
/// `schema` run in it as superuser (nothing when empty), and a parsnip with trust auth and
/// the extra top-level config keys `top` ([`Parsnip::trust`]).
pub fn trust_db(db: &str, schema: &str, top: &str) -> Parsnip {
    create_db(db);
    if !schema.is_empty() {
        psql(db, schema);
    }
    Parsnip::trust(top)
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
