//! Binding the listeners: the TCP addresses of `listen` (with SO_REUSEPORT under
//! `so_reuseport`), its unix socket paths, and the default unix socket in `unix_socket_dir`.
//! A socket file is only ever removed when no live process answers on it (a stale file left
//! by a crash), or, on the way out, while it is still this process's. One another process
//! holds is an error, except under `unix_socket_dir = "auto"`, which then tries its next
//! directory, and under `so_reuseport`, where the new process takes the name over (an
//! online restart: the old one keeps serving what it accepted). Also the last accepts of a
//! listener that closes (`drain`).

use super::stream::Stream;
use crate::config::Config;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::{TcpListener, TcpSocket, UnixListener};

/// One bound listening socket.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, SocketFile),
}

/// A unix socket file this process bound. Removed on the way out only while the name still
/// leads to it: under `so_reuseport` a newer process may have taken the name over.
#[derive(Clone, Debug)]
pub(crate) struct SocketFile {
    pub(crate) path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// Whether this is the socket of the instance's own `[peers]` entry.
    pub(crate) fn is_own_peer_address(&self, cfg: &Config) -> bool {
        cfg.own_peer().is_some_and(|p| {
            p.host.starts_with('/') && self.path == Path::new(&p.host).join(format!(".s.PGSQL.{}", p.port))
        })
    }
    fn of(path: &Path) -> io::Result<SocketFile> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(SocketFile { path: path.to_path_buf(), dev: m.dev(), ino: m.ino() })
    }
    /// Removes the file if it is still this process's socket.
    pub(crate) fn remove(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                let _ = std::fs::remove_file(&self.path);
            }
            Ok(_) => tracing::info!("{} now belongs to another process: left in place", self.path.display()),
            Err(_) => {}
        }
    }
}

impl Listener {
    /// The socket file of a unix listener.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.socket_file().map(|f| f.path.as_path())
    }
    /// Whether this listener serves the address of the instance's own `[peers]` entry: a
    /// stopping process keeps that one open for the cancel requests its peers forward
    /// (a TCP listener on the unspecified address serves every address of its port).
    pub(crate) async fn is_own_peer_address(&self, cfg: &Config) -> bool {
        let Some(p) = cfg.own_peer() else { return false };
        match self {
            Listener::Unix(_, f) => f.is_own_peer_address(cfg),
            Listener::Tcp(l) => {
                let Ok(local) = l.local_addr() else { return false };
                if p.host.starts_with('/') || p.port != local.port() {
                    return false;
                }
                let Ok(addrs) = tokio::net::lookup_host((p.host.as_str(), p.port)).await else { return false };
                addrs.into_iter().any(|a| local.ip().is_unspecified() || a.ip() == local.ip())
            }
        }
    }
    /// The socket file of a unix listener, with its identity.
    pub(crate) fn socket_file(&self) -> Option<&SocketFile> {
        match self {
            Listener::Unix(_, f) => Some(f),
            Listener::Tcp(_) => None,
        }
    }
}

/// Closes the listener, first accepting every connection the kernel completed on it: those
/// would otherwise be reset by the close (with SO_REUSEPORT the kernel hashes each new
/// connection to one listening socket, and a closed socket's queue is not handed to the
/// others unless `net.ipv4.tcp_migrate_req` is set). Accepted without waiting: a connection
/// that arrives between the last accept and the close is still lost (docs/scaling.md).
pub(crate) fn drain(l: Listener) -> Vec<Stream> {
    let mut out = Vec::new();
    match l {
        Listener::Tcp(l) => {
            let Ok(l) = l.into_std() else { return out };
            while let Ok((s, _)) = l.accept() {
                if s.set_nonblocking(true).is_ok()
                    && let Ok(s) = tokio::net::TcpStream::from_std(s)
                {
                    out.push(Stream::Tcp(s));
                }
            }
        }
        Listener::Unix(l, _) => {
            let Ok(l) = l.into_std() else { return out };
            while let Ok((s, _)) = l.accept() {
                if s.set_nonblocking(true).is_ok()
                    && let Ok(s) = tokio::net::UnixStream::from_std(s)
                {
                    out.push(Stream::Unix(s));
                }
            }
        }
    }
    if !out.is_empty() {
        tracing::info!(connections = out.len(), "accepted the connections queued on a closing listener");
    }
    out
}

/// Where Debian's libpq (psql) looks for sockets; the default when writable.
const DEBIAN_SOCKET_DIR: &str = "/var/run/postgresql";

/// Binds every address of `cfg`.
pub(crate) async fn bind_all(cfg: &Config) -> io::Result<Vec<Listener>> {
    let mode = cfg.socket_mode().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.0))?;
    let group = cfg.socket_group().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.0))?;
    let mode = SocketPerms { mode, group };
    // TCP sockets are bound first (the unix socket's name takes the first one's port) but
    // listen last: a client that can connect over TCP finds the unix socket there too.
    let mut tcp = Vec::new();
    let mut first_port = None;
    for addr in cfg.listen.iter().filter(|a| !a.starts_with('/')) {
        let (sock, a) = bind_tcp(addr, cfg.so_reuseport).await?;
        first_port.get_or_insert(a.port());
        tcp.push((sock, a));
    }
    let port = first_port.unwrap_or(6432);
    let socket_name = format!(".s.PGSQL.{port}");
    let mut listeners = Vec::new();
    for addr in cfg.listen.iter().filter(|a| a.starts_with('/')) {
        let p = Path::new(addr);
        let path = if p.is_dir() { p.join(&socket_name) } else { p.to_path_buf() };
        listeners.push(bind_unix(&path, mode, cfg.so_reuseport)?);
    }
    let auto = cfg.unix_socket_dir == "auto";
    for dir in default_dirs(&cfg.unix_socket_dir) {
        let path = dir.join(&socket_name);
        if listeners.iter().any(|l| l.path() == Some(&path)) {
            break;
        }
        match bind_unix(&path, mode, cfg.so_reuseport) {
            Ok(l) => {
                listeners.push(l);
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
/// accepts it, with SO_REUSEADDR as a listener has, and SO_REUSEPORT when `reuseport`.
async fn bind_tcp(addr: &str, reuseport: bool) -> io::Result<(TcpSocket, SocketAddr)> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: resolves to no address"));
    for a in tokio::net::lookup_host(addr).await.map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))? {
        let sock = if a.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        sock.set_reuseaddr(true)?;
        if reuseport {
            sock.set_reuseport(true)?;
        }
        match sock.bind(a) {
            Ok(()) => {
                let bound = sock.local_addr()?;
                return Ok((sock, bound));
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                let hint = if reuseport {
                    "the process holding it must have so_reuseport = true too (and run as the same user)"
                } else {
                    "another process listens there; several parsnip processes share a port only with so_reuseport = \
                        true in each"
                };
                last = io::Error::new(e.kind(), format!("{addr}: {e} ({hint})"));
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
/// when nothing listens on it, or, with `take_over` (`so_reuseport`), atomically (a socket
/// bound beside it, then renamed over it: a client finds one of the two processes there at
/// every moment, and the other process keeps what it accepted).
/// The permissions and group a unix socket file gets.
#[derive(Clone, Copy)]
struct SocketPerms {
    mode: u32,
    /// None: the process's own group.
    group: Option<u32>,
}

fn bind_unix(path: &Path, file: SocketPerms, take_over: bool) -> io::Result<Listener> {
    let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut bind_at = path.to_path_buf();
    if path.exists() {
        if let Ok(live) = std::os::unix::net::UnixStream::connect(path) {
            // Only a process of this user is replaced (as SO_REUSEPORT shares a port only
            // between one user's sockets): never, say, a PostgreSQL's socket.
            if !take_over || !same_user(&live) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another process is listening on this socket", path.display()),
                ));
            }
            let mut name = path.file_name().unwrap_or_default().to_os_string();
            name.push(format!(".{}.new", std::process::id()));
            bind_at = path.with_file_name(name);
            let _ = std::fs::remove_file(&bind_at);
        } else {
            std::fs::remove_file(path).map_err(with_path)?;
            tracing::info!("removed stale socket file {}", path.display());
        }
    }
    let l = UnixListener::bind(&bind_at).map_err(with_path)?;
    let placed = std::fs::set_permissions(&bind_at, std::fs::Permissions::from_mode(file.mode))
        .and_then(|()| file.group.map_or(Ok(()), |g| std::os::unix::fs::chown(&bind_at, None, Some(g))))
        .and_then(|()| if bind_at != path { std::fs::rename(&bind_at, path) } else { Ok(()) });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&bind_at);
        return Err(with_path(e));
    }
    if bind_at != path {
        tracing::info!("took over {} from the process listening there (so_reuseport)", path.display());
    }
    let file = SocketFile::of(path).map_err(with_path)?;
    tracing::info!("listening on {}", path.display());
    Ok(Listener::Unix(l, file))
}

/// Whether the process at the other end of `s` runs as this process's effective user.
fn same_user(s: &std::os::unix::net::UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, on a descriptor `s` owns.
    let r = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len)
    };
    // SAFETY: geteuid has no preconditions.
    r == 0 && cred.uid == unsafe { libc::geteuid() }
}
