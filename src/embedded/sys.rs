//! Operating-system helpers for [`super::Cluster`]: locating the PostgreSQL binaries, choosing
//! the unprivileged user the server runs as, the private temp dir, free ports and process checks.
//! Nothing here starts or stops a server.

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Programs a usable bin dir must hold.
pub(super) const REQUIRED_PROGRAMS: [&str; 4] = ["initdb", "pg_ctl", "postgres", "psql"];

/// The hint every "PostgreSQL not found" error carries.
pub(super) const INSTALL_HINT: &str = "install the `postgresql` package (e.g. `apt-get install postgresql`) \
     or set PARSNIP_PG_BIN to the directory holding initdb, pg_ctl, postgres and psql";

/// Finds a PostgreSQL bin dir: env `PARSNIP_PG_BIN`, then `pg_config --bindir`, then the highest
/// `/usr/lib/postgresql/*/bin` containing initdb, then initdb on `PATH`. None if not found.
///
/// A non-empty `PARSNIP_PG_BIN` is returned as is (an explicit choice is never second-guessed;
/// [`super::Cluster::start`] reports what it lacks). The other candidates must hold `initdb`,
/// `pg_ctl` and `postgres`. An `initdb` found on `PATH` is resolved through symlinks first, so
/// `/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb` yields the real directory.
pub fn find_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PARSNIP_PG_BIN")
        && !dir.is_empty()
    {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = pg_config_bindir()
        && has_server_programs(&dir)
    {
        return Some(dir);
    }
    if let Some(dir) = highest_debian_bin_dir(Path::new("/usr/lib/postgresql")) {
        return Some(dir);
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("initdb");
        if candidate.is_file() {
            let real = fs::canonicalize(&candidate).unwrap_or(candidate);
            if let Some(parent) = real.parent()
                && has_server_programs(parent)
            {
                return Some(parent.to_path_buf());
            }
        }
    }
    None
}

fn has_server_programs(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"].iter().all(|p| dir.join(p).is_file())
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let text = text.trim();
    (!text.is_empty()).then(|| PathBuf::from(text))
}

/// The `<base>/<version>/bin` with the highest version (compared numerically, "9.6" < "15").
fn highest_debian_bin_dir(base: &Path) -> Option<PathBuf> {
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    for entry in fs::read_dir(base).ok()?.flatten() {
        let name = entry.file_name();
        let Some(version) = name.to_str().and_then(parse_version) else {
            continue;
        };
        let bin = entry.path().join("bin");
        if !has_server_programs(&bin) {
            continue;
        }
        if best.as_ref().is_none_or(|(v, _)| version > *v) {
            best = Some((version, bin));
        }
    }
    best.map(|(_, dir)| dir)
}

fn parse_version(s: &str) -> Option<Vec<u32>> {
    s.split('.').map(|part| part.parse().ok()).collect()
}

/// The identity the cluster's programs run as.
#[derive(Clone, Debug)]
pub(super) struct RunAs {
    /// `Some((uid, gid))` when we are root and must drop privileges; None: run as ourselves.
    pub(crate) ids: Option<(u32, u32)>,
    /// User name, for messages.
    pub(crate) name: String,
}

impl RunAs {
    /// The current user, or when root the "postgres" system user, else "nobody".
    pub(crate) fn detect() -> io::Result<RunAs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(RunAs { ids: None, name: "current user".to_string() });
        }
        for name in ["postgres", "nobody"] {
            if let Some((uid, gid)) = lookup_user(name)
                && uid != 0
            {
                return Ok(RunAs { ids: Some((uid, gid)), name: name.to_string() });
            }
        }
        Err(io::Error::other(
            "running as root and neither a `postgres` nor a `nobody` user exists; \
             initdb refuses to run as root",
        ))
    }

    /// Makes `path` owned by this identity (no-op when not root).
    pub(crate) fn chown(&self, path: &Path) -> io::Result<()> {
        match self.ids {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
            None => Ok(()),
        }
    }
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let cname = CString::new(name).ok()?;
    // SAFETY: an all-zero passwd (null pointers, zero ids) is a valid value to be overwritten.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf outlives the use of pwd's strings (unused).
    let rc = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    Some((pwd.pw_uid, pwd.pw_gid))
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Creates a fresh mode-0700 directory owned by `user`, named
/// `parsnip-pg-<pid>-<counter>-<random>`, under [`std::env::temp_dir`] (or `/tmp` when that
/// path is too long for a unix socket path inside it).
pub(super) fn make_temp_dir(user: &RunAs) -> io::Result<PathBuf> {
    let mut base = std::env::temp_dir();
    // sun_path is 108 bytes; leave room for "/parsnip-pg-…/sock/.s.PGSQL.65535.lock".
    if base.as_os_str().len() > 40 {
        base = PathBuf::from("/tmp");
    }
    let name = format!(
        "parsnip-pg-{}-{}-{:016x}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u64>()
    );
    let dir = base.join(name);
    fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let setup = (|| {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        user.chown(&dir)
    })();
    if let Err(e) = setup {
        let _ = fs::remove_dir(&dir);
        return Err(e);
    }
    Ok(dir)
}

/// A port on 127.0.0.1 that was free a moment ago.
pub(super) fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Whether `pid` is a live (non-zombie) process. A zombie counts as gone: it holds no resources,
/// and an init that does not reap orphans would otherwise make every stopped postmaster "alive".
pub(super) fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    !is_zombie(pid)
}

/// True when /proc says `pid` is a zombie (or dead); false when unknown.
pub(super) fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Format: "pid (comm) S ..."; comm may contain spaces or parens, so split at the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

/// Polls until `pid` is gone (see [`process_alive`]) or `timeout` passes; true if gone.
pub(super) fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !process_alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs `pid` if it is still alive and still a postgres process (guards against pid reuse).
pub(super) fn kill_postgres(pid: i32) {
    if !process_alive(pid) {
        return;
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if !comm.is_empty() && !comm.trim().starts_with("postgres") {
        return;
    }
    // SAFETY: plain kill(2) on a pid we just checked.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// The last `n` lines of `text`.
pub(super) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Reads `path` from byte `offset` on, lossily; empty on any error.
pub(super) fn read_from(path: &Path, offset: u64) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let start = usize::try_from(offset).unwrap_or(0).min(bytes.len());
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(parse_version("15") > parse_version("9.6"));
        assert_eq!(parse_version("abc"), None);
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail_lines("a", 5), "a");
    }
}
