//! Binding the listeners: the TCP addresses of `listen`, its unix socket paths, and the
//! default unix socket in `unix_socket_dir`. A socket file is only ever removed when no live
//! process answers on it (a stale file left by a crash); one another process holds is an
//! error, except under `unix_socket_dir = "auto"`, which then tries its next directory.

use crate::config::Config;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::net::{TcpListener, TcpSocket, UnixListener};

/// One bound listening socket.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// The socket file of a unix listener.
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            Listener::Unix(_, p) => Some(p),
            Listener::Tcp(_) => None,
        }
    }
}

/// Where Debian's libpq (psql) looks for sockets; the default when writable.
const DEBIAN_SOCKET_DIR: &str = "/var/run/postgresql";

/// Binds every address of `cfg`.
pub(crate) async fn bind_all(cfg: &Config) -> io::Result<Vec<Listener>> {
    let mode = cfg.socket_mode().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.0))?;
    // TCP sockets are bound first (the unix socket's name takes the first one's port) but
    // listen last: a client that can connect over TCP finds the unix socket there too.
    let mut tcp = Vec::new();
    let mut first_port = None;
    for addr in cfg.listen.iter().filter(|a| !a.starts_with('/')) {
        let (sock, a) = bind_tcp(addr).await?;
        first_port.get_or_insert(a.port());
        tcp.push((sock, a));
    }
    let port = first_port.unwrap_or(6432);
    let socket_name = format!(".s.PGSQL.{port}");
    let mut listeners = Vec::new();
    for addr in cfg.listen.iter().filter(|a| a.starts_with('/')) {
        let p = Path::new(addr);
        let path = if p.is_dir() { p.join(&socket_name) } else { p.to_path_buf() };
        listeners.push(Listener::Unix(bind_unix(&path, mode)?, path));
    }
    let auto = cfg.unix_socket_dir == "auto";
    for dir in default_dirs(&cfg.unix_socket_dir) {
        let path = dir.join(&socket_name);
        if listeners.iter().any(|l| l.path() == Some(&path)) {
            break;
        }
        match bind_unix(&path, mode) {
            Ok(l) => {
                listeners.push(Listener::Unix(l, path));
                break;
            }
            // "auto" tries the next directory and, failing all, serves TCP only; a
            // directory the user named is theirs to fix.
            Err(e) if auto => tracing::warn!(error = %e, "no unix socket in {}", dir.display()),
            Err(e) => return Err(e),
        }
    }
    for (sock, a) in tcp {
        listeners.push(Listener::Tcp(sock.listen(1024).map_err(|e| io::Error::new(e.kind(), format!("{a}: {e}")))?));
        tracing::info!("listening on {a}");
    }
    Ok(listeners)
}

/// A TCP socket bound (not yet listening) to the first address `addr` resolves to that
/// accepts it, with SO_REUSEADDR as a listener has.
async fn bind_tcp(addr: &str) -> io::Result<(TcpSocket, SocketAddr)> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: resolves to no address"));
    for a in tokio::net::lookup_host(addr).await.map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))? {
        let sock = if a.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        sock.set_reuseaddr(true)?;
        match sock.bind(a) {
            Ok(()) => {
                let bound = sock.local_addr()?;
                return Ok((sock, bound));
            }
            Err(e) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
        }
    }
    Err(last)
}

/// The directories `unix_socket_dir` names, in the order to try them.
fn default_dirs(setting: &str) -> Vec<PathBuf> {
    match setting {
        "" => Vec::new(),
        "auto" => {
            let debian = Path::new(DEBIAN_SOCKET_DIR);
            let mut dirs = Vec::new();
            if debian.is_dir() {
                dirs.push(debian.to_path_buf());
            }
            dirs.push(PathBuf::from("/tmp"));
            dirs
        }
        dir => vec![PathBuf::from(dir)],
    }
}

/// Binds a unix socket at `path` with permissions `mode`. An existing file is replaced only
/// when nothing listens on it.
fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{}: another process is listening on this socket", path.display()),
            ));
        }
        std::fs::remove_file(path).map_err(with_path)?;
        tracing::info!("removed stale socket file {}", path.display());
    }
    let l = UnixListener::bind(path).map_err(with_path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(with_path)?;
    tracing::info!("listening on {}", path.display());
    Ok(l)
}
