//! A throwaway local PostgreSQL cluster.
//!
//! Used by the pooler binary when no database URL is given (the "embedded default": initdb into
//! a temp dir and pool in front of it) and by the test suite and benchmarks, which all talk to a
//! real server started here.
//!
//! This module owns everything about that private cluster: finding the PostgreSQL binaries
//! ([`find_bin_dir`]), `initdb`, writing `pg_hba.conf` and the extra `postgresql.conf` settings,
//! starting, restarting and stopping the server with `pg_ctl`, and removing the temp dir. When
//! run as root, all of that runs as an unprivileged user ("postgres", else "nobody"), since
//! initdb refuses to run as root.
//!
//! Every exit path of its owner removes it: `Drop` on a normal exit, and for SIGKILL, a
//! crash or an unhandled signal a reaper (a small `sh` child in its own process group,
//! ignoring terminal signals) that waits for its owner's end of a pipe to close, then stops
//! the postmaster and removes the temp dir.
//!
//! It must not touch the pooler itself: no sockets of its own beyond probing for a free port, no
//! tokio, no global state (no signal handlers, no atexit hooks). Everything is blocking
//! `std::process` code; call it from sync code, from `main` before the runtime starts, or via
//! `spawn_blocking`.

mod sys;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub use sys::find_bin_dir;
use sys::{INSTALL_HINT, REQUIRED_PROGRAMS, RunAs};

/// The bootstrap superuser every cluster is created with.
const SUPERUSER: &str = "postgres";
/// How many fresh ports [`Cluster::start`] tries when the chosen one turns out to be taken.
const PORT_ATTEMPTS: u32 = 5;
/// Lines of server log quoted in start errors.
const LOG_TAIL_LINES: usize = 30;

/// How to set up a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Directory holding initdb/pg_ctl/postgres; None = discover.
    pub bin_dir: Option<PathBuf>,
    /// pg_hba method for TCP and unix connections from non-superusers: "trust", "md5" or "scram-sha-256".
    /// The bootstrap superuser can always connect over the unix socket with trust (so the harness can administer).
    pub auth_method: String,
    /// Password set for the bootstrap superuser (also over TCP with auth_method) — None: no password.
    pub superuser_password: Option<String>,
    /// Extra postgresql.conf lines, e.g. "log_min_messages = debug1".
    /// Written after the module's own settings, so they win; do not set `port`,
    /// `listen_addresses` or `unix_socket_directories` here.
    pub extra_conf: Vec<String>,
    /// `max_connections` of the server (default 300).
    pub max_connections: u32,
    /// A certificate chain and its key (PEM): the server turns TLS on and accepts TCP
    /// connections only over it (`hostssl`).
    pub tls: Option<(String, String)>,
}

impl Default for ClusterOptions {
    /// Discovered binaries, "trust", no superuser password, no extra settings, 300 connections.
    fn default() -> Self {
        ClusterOptions {
            bin_dir: None,
            auth_method: "trust".to_string(),
            superuser_password: None,
            extra_conf: Vec::new(),
            max_connections: 300,
            tls: None,
        }
    }
}

/// A private PostgreSQL cluster in its own temp dir, listening on 127.0.0.1 and a private unix
/// socket directory.
///
/// Dropping it stops the server (`pg_ctl stop -m immediate`, then SIGKILL if needed) and removes
/// the temp dir; drop never panics.
#[derive(Debug)]
pub struct Cluster {
    opts: ClusterOptions,
    bin_dir: PathBuf,
    user: RunAs,
    /// The temp dir holding everything below.
    root: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    port: u16,
    major_version: u32,
    /// The postmaster's pid while we believe the server runs.
    postmaster_pid: Option<i32>,
    /// The reaper's pipe: closed (by the kernel, whatever way this process ends) it tells
    /// the reaper to clean up. Dropped after `Drop::drop` has cleaned up itself.
    reaper: Option<std::process::ChildStdin>,
}

/// The reaper's script: `$1` is the cluster's temp dir. It returns from `read` at end of
/// file, i.e. when the owning process is gone; after a normal exit the dir is gone already.
const REAPER_SCRIPT: &str = r#"trap '' HUP INT TERM QUIT
read _ignored
pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL "$pid" 2>/dev/null
fi
rm -rf "$1"
"#;

/// Why one `pg_ctl start` failed.
struct StartFailure {
    error: io::Error,
    port_in_use: bool,
}

impl Cluster {
    /// Creates, configures and starts a new cluster; blocks until it accepts connections.
    ///
    /// Picks a free port, retrying with a new one (up to 5 tries) if the server could not bind.
    /// Errors carry the tail of the server log, or an install hint when no binaries are found.
    pub fn start(opts: ClusterOptions) -> io::Result<Cluster> {
        Self::start_with_ports(opts, &mut sys::free_port)
    }

    /// [`Cluster::start`] with the port candidates coming from `next_port` (tests force a clash).
    fn start_with_ports(opts: ClusterOptions, next_port: &mut dyn FnMut() -> io::Result<u16>) -> io::Result<Cluster> {
        if !["trust", "md5", "scram-sha-256", "password"].contains(&opts.auth_method.as_str()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unsupported auth_method {:?} (use trust, md5 or scram-sha-256)", opts.auth_method),
            ));
        }
        let bin_dir = match opts.bin_dir.clone().or_else(find_bin_dir) {
            Some(dir) => dir,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no PostgreSQL server binaries found (looked at PARSNIP_PG_BIN, \
                         `pg_config --bindir`, /usr/lib/postgresql/*/bin and initdb on PATH); \
                         {INSTALL_HINT}"
                    ),
                ));
            }
        };
        if let Some(missing) = REQUIRED_PROGRAMS.iter().find(|p| !bin_dir.join(p).is_file()) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("PostgreSQL bin dir {} has no `{missing}`; {INSTALL_HINT}", bin_dir.display()),
            ));
        }
        let user = RunAs::detect()?;
        let root = sys::make_temp_dir(&user)?;
        // From here on, Drop cleans up whatever exists if a step fails.
        let mut cluster = Cluster {
            data_dir: root.join("data"),
            socket_dir: root.join("sock"),
            log_file: root.join("server.log"),
            root,
            opts,
            bin_dir,
            user,
            port: 0,
            major_version: 0,
            postmaster_pid: None,
            reaper: None,
        };
        cluster.reaper = Some(cluster.spawn_reaper()?);
        cluster.init()?;
        cluster.launch_on_free_port(next_port)?;
        if let Some(password) = cluster.opts.superuser_password.clone() {
            let sql = format!("ALTER ROLE {SUPERUSER} PASSWORD {}", quote_literal(&password));
            cluster.psql("postgres", &sql)?;
        }
        tracing::info!(
            port = cluster.port,
            data_dir = %cluster.data_dir.display(),
            run_as = %cluster.user.name,
            "embedded PostgreSQL {} started",
            cluster.major_version
        );
        Ok(cluster)
    }

    /// Starts the reaper for `root` (see the module doc); returns the pipe it waits on.
    fn spawn_reaper(&self) -> io::Result<std::process::ChildStdin> {
        let mut child = Command::new("/bin/sh")
            .args(["-c", REAPER_SCRIPT, "parsnip-pg-reaper"])
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting the cleanup watcher (/bin/sh): {e}")))?;
        child.stdin.take().ok_or_else(|| io::Error::other("cleanup watcher without stdin"))
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's `unix_socket_directories` (a private directory inside the temp dir).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory the PostgreSQL programs are run from.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The bootstrap superuser name, always "postgres".
    pub fn superuser(&self) -> &str {
        SUPERUSER
    }

    /// The server log (logging_collector off, written through `pg_ctl -l`).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// `postgres://postgres[:password]@127.0.0.1:PORT/postgres` (password percent-encoded).
    pub fn url(&self) -> String {
        let password = match &self.opts.superuser_password {
            Some(p) => format!(":{}", percent_encode(p)),
            None => String::new(),
        };
        format!("postgres://{SUPERUSER}{password}@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs SQL via the cluster's own psql as the superuser over the unix socket
    /// (`-X -q -A -t -v ON_ERROR_STOP=1`, script on stdin), returns stdout without trailing
    /// newlines (so `select 1` gives "1"); Err with stderr text on failure.
    pub fn psql(&self, dbname: &str, sql: &str) -> io::Result<String> {
        let mut cmd = self.command("psql");
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", SUPERUSER, "-d", dbname, "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| spawn_error("psql", &cmd, e))?;
        let stdin = child.stdin.take();
        let script = sql.to_string();
        // Feed stdin from a thread so a large script cannot deadlock against a large result.
        let writer = std::thread::spawn(move || {
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(script.as_bytes());
                let _ = stdin.write_all(b"\n");
            }
        });
        let out = child.wait_with_output()?;
        let _ = writer.join();
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "psql ({}) failed on {dbname:?}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        Ok(stdout.trim_end_matches(['\n', '\r']).to_string())
    }

    /// Restart (pg_ctl restart -m fast), same port and data; used by reconnect tests.
    pub fn restart(&mut self) -> io::Result<()> {
        let offset = self.log_len();
        let mut cmd = self.pg_ctl();
        cmd.arg("-l").arg(&self.log_file).args(["-w", "-t", "60", "-m", "fast", "restart"]);
        let result = run(cmd, "pg_ctl restart");
        self.postmaster_pid = self.read_pid_file();
        result.map(drop).map_err(|e| self.with_log_tail(e, offset))
    }

    /// Stop now (pg_ctl stop -m immediate); start() again later with `start_again`.
    #[cfg(test)]
    pub(crate) fn stop(&mut self) -> io::Result<()> {
        self.stop_server()
    }

    /// Starts the server stopped by [`Cluster::stop`] again, on the same port and data
    /// (no-op if it is running).
    #[cfg(test)]
    pub(crate) fn start_again(&mut self) -> io::Result<()> {
        if self.postmaster_pid.is_some_and(sys::process_alive) {
            return Ok(());
        }
        self.pg_ctl_start().map_err(|f| f.error)
    }

    /// Server major version, e.g. 15.
    pub fn major_version(&self) -> u32 {
        self.major_version
    }

    /// A command for one of the cluster's programs: run as the cluster's user, PG* variables
    /// removed, C locale, HOME and working directory in the temp dir, stdin from /dev/null.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        for (key, _) in std::env::vars_os() {
            if key.as_encoded_bytes().starts_with(b"PG") {
                cmd.env_remove(key);
            }
        }
        cmd.env("LC_ALL", "C").env("LANG", "C").env("HOME", &self.root).current_dir(&self.root).stdin(Stdio::null());
        if let Some((uid, gid)) = self.user.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir);
        cmd
    }

    /// initdb, pg_hba.conf, our postgresql.conf include, the version.
    fn init(&mut self) -> io::Result<()> {
        let help = run(self.command_with_arg("initdb", "--help"), "initdb --help")?;
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let mut cmd = self.command("initdb");
        cmd.arg("-D").arg(&self.data_dir).args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"]);
        if help.contains("--no-sync") {
            cmd.arg("--no-sync");
        } else if help.contains("--nosync") {
            cmd.arg("--nosync");
        }
        if help.contains("--no-instructions") {
            cmd.arg("--no-instructions");
        }
        run(cmd, "initdb")?;

        fs::create_dir(&self.socket_dir)?;
        self.user.chown(&self.socket_dir)?;
        let method = self.opts.auth_method.as_str();
        let super_tcp = if self.opts.superuser_password.is_some() { method } else { "trust" };
        let mut hba = String::from("# written by parsnip::embedded\n");
        hba.push_str(&format!("local all {SUPERUSER} trust\n"));
        hba.push_str(&format!("local all all {method}\n"));
        let host = if self.opts.tls.is_some() { "hostssl" } else { "host" };
        for net in ["127.0.0.1/32", "::1/128"] {
            hba.push_str(&format!("{host} all {SUPERUSER} {net} {super_tcp}\n"));
            hba.push_str(&format!("{host} all all {net} {method}\n"));
        }
        if let Some((cert, key)) = &self.opts.tls {
            self.write_owned(&self.data_dir.join("server.crt"), cert)?;
            let key_path = self.data_dir.join("server.key");
            self.write_owned(&key_path, key)?;
            fs::set_permissions(&key_path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        }
        self.write_owned(&self.data_dir.join("pg_hba.conf"), &hba)?;

        let main_conf = self.data_dir.join("postgresql.conf");
        let mut conf = fs::read_to_string(&main_conf)?;
        conf.push_str("\n# parsnip::embedded settings\ninclude 'parsnip.conf'\n");
        self.write_owned(&main_conf, &conf)?;

        let version = fs::read_to_string(self.data_dir.join("PG_VERSION"))?;
        self.major_version = version
            .trim()
            .split('.')
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("unreadable PG_VERSION {version:?}")))?;
        Ok(())
    }

    fn command_with_arg(&self, program: &str, arg: &str) -> Command {
        let mut cmd = self.command(program);
        cmd.arg(arg);
        cmd
    }

    /// Picks free ports and starts until the server binds one (up to [`PORT_ATTEMPTS`]).
    fn launch_on_free_port(&mut self, next_port: &mut dyn FnMut() -> io::Result<u16>) -> io::Result<()> {
        let mut attempt = 1;
        loop {
            self.port = next_port()?;
            self.write_settings()?;
            match self.pg_ctl_start() {
                Ok(()) => return Ok(()),
                Err(f) if f.port_in_use && attempt < PORT_ATTEMPTS => {
                    tracing::warn!(port = self.port, attempt, "port taken, retrying");
                    attempt += 1;
                }
                Err(f) => return Err(f.error),
            }
        }
    }

    /// Writes `parsnip.conf` (included from postgresql.conf) for the current port.
    fn write_settings(&self) -> io::Result<()> {
        let encryption = if self.opts.auth_method == "md5" { "md5" } else { "scram-sha-256" };
        let socket_dir = self.socket_dir.to_string_lossy().replace('\'', "''");
        let mut conf = String::from("# written by parsnip::embedded\n");
        let _ = write!(
            conf,
            "listen_addresses = '127.0.0.1'\n\
             port = {}\n\
             unix_socket_directories = '{socket_dir}'\n\
             max_connections = {}\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             shared_buffers = 128MB\n\
             password_encryption = '{encryption}'\n\
             logging_collector = off\n",
            self.port, self.opts.max_connections
        );
        if self.opts.tls.is_some() {
            conf.push_str("ssl = on\n");
        }
        for line in &self.opts.extra_conf {
            conf.push_str(line);
            conf.push('\n');
        }
        self.write_owned(&self.data_dir.join("parsnip.conf"), &conf)
    }

    /// Writes `contents` to `path` and gives it to the cluster's user.
    fn write_owned(&self, path: &Path, contents: &str) -> io::Result<()> {
        fs::write(path, contents)?;
        self.user.chown(path)
    }

    /// One `pg_ctl start`; on failure makes sure no half-started server is left running.
    fn pg_ctl_start(&mut self) -> Result<(), StartFailure> {
        let offset = self.log_len();
        let mut cmd = self.pg_ctl();
        cmd.arg("-l").arg(&self.log_file).args(["-w", "-t", "60", "start"]);
        match run(cmd, "pg_ctl start") {
            Ok(_) => {
                self.postmaster_pid = self.read_pid_file();
                Ok(())
            }
            Err(e) => {
                let log = sys::read_from(&self.log_file, offset);
                let port_in_use =
                    log.contains("Address already in use") || log.contains("could not create any TCP/IP sockets");
                // A timed-out start may leave a server running; stop it.
                self.postmaster_pid = self.read_pid_file();
                if let Err(stop_err) = self.stop_server() {
                    tracing::warn!("after failed start: {stop_err}");
                }
                Err(StartFailure { error: self.with_log_tail(e, offset), port_in_use })
            }
        }
    }

    /// `pg_ctl stop -m immediate`, then SIGKILL if the postmaster lingers. Ok once it is gone.
    fn stop_server(&mut self) -> io::Result<()> {
        let pid = self.postmaster_pid.take().or_else(|| self.read_pid_file());
        let mut cmd = self.pg_ctl();
        cmd.args(["-w", "-t", "30", "-m", "immediate", "stop"]);
        let result = run(cmd, "pg_ctl stop");
        let Some(pid) = pid else {
            // Never started (or pid file unreadable): nothing left to kill.
            if let Err(e) = result {
                tracing::debug!("pg_ctl stop without a known postmaster: {e}");
            }
            return Ok(());
        };
        if !sys::wait_gone(pid, Duration::from_secs(10)) {
            tracing::warn!(pid, "postmaster survived pg_ctl stop; killing it");
            sys::kill_postgres(pid);
            if !sys::wait_gone(pid, Duration::from_secs(5)) {
                self.postmaster_pid = Some(pid);
                return Err(io::Error::other(format!(
                    "postmaster {pid} did not exit ({})",
                    result.err().map(|e| e.to_string()).unwrap_or_default()
                )));
            }
        }
        if let Err(e) = result {
            tracing::debug!("pg_ctl stop reported {e}, but the postmaster is gone");
        }
        Ok(())
    }

    /// The postmaster pid from `postmaster.pid`, if present.
    fn read_pid_file(&self) -> Option<i32> {
        let text = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    fn log_len(&self) -> u64 {
        fs::metadata(&self.log_file).map(|m| m.len()).unwrap_or(0)
    }

    /// `error` plus the server log written since byte `offset`.
    fn with_log_tail(&self, error: io::Error, offset: u64) -> io::Error {
        let log = sys::read_from(&self.log_file, offset);
        io::Error::new(
            error.kind(),
            format!(
                "{error}\nserver log {} (tail):\n{}",
                self.log_file.display(),
                sys::tail_lines(&log, LOG_TAIL_LINES)
            ),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if (self.postmaster_pid.is_some() || self.data_dir.join("postmaster.pid").exists())
            && let Err(e) = self.stop_server()
        {
            tracing::warn!("stopping embedded PostgreSQL: {e}");
        }
        if let Err(e) = fs::remove_dir_all(&self.root)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!("removing {}: {e}", self.root.display());
        }
    }
}

/// Runs `cmd` to completion; Err (with its output) unless it exits successfully.
fn run(mut cmd: Command, what: &str) -> io::Result<Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = cmd.output().map_err(|e| spawn_error(what, &cmd, e))?;
    if out.status.success() {
        return Ok(out);
    }
    Err(io::Error::other(format!(
        "{what} failed ({}): {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

fn spawn_error(what: &str, cmd: &Command, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: cannot run {}: {e}", Path::new(cmd.get_program()).display()))
}

/// A SQL string literal.
fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
