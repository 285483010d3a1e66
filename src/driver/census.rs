//! Who is connected, as the console's `SHOW CLIENTS` and `SHOW SERVERS` list them: what a
//! client's cancel slot (`cancel::CancelSlot`) and a server connection's cancel target
//! (`server_conn::CancelTarget`) carry besides their cancel duties, and the list of live
//! server connections. Nothing here is on a per-message path: a client's entry is written
//! at login and on its request times, a server's at connect, link and release.

use super::server_conn::CancelTarget;
use crate::pool::PoolKey;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, now.
pub(crate) fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

static BASE: OnceLock<(Instant, u64)> = OnceLock::new();

/// The monotonic clock and the wall clock, read together once.
fn base() -> (Instant, u64) {
    *BASE.get_or_init(|| (Instant::now(), unix_us()))
}

/// Microseconds since the Unix epoch at `t`, from the monotonic clock (no second clock read
/// on a client's path): the wall clock is read once, at the first call.
pub(crate) fn unix_us_at(t: Instant) -> u64 {
    let (i0, u0) = base();
    match t.checked_duration_since(i0) {
        Some(d) => u0 + d.as_micros() as u64,
        None => u0.saturating_sub(i0.duration_since(t).as_micros() as u64),
    }
}

/// `t` as microseconds on a monotonic scale that starts at 1 (0 can mean "none").
pub(crate) fn mono_us(t: Instant) -> u64 {
    1 + t.saturating_duration_since(base().0).as_micros() as u64
}

/// Where a connection comes from or goes to: its socket, asked for its addresses only when
/// the console lists it (an idle client keeps 4 bytes, not two addresses), and its TLS.
#[derive(Debug, Clone)]
pub(crate) struct Endpoints {
    /// The socket's descriptor (-1: none). Read while the connection is registered; a
    /// console listing that races its close may read a reused descriptor's addresses.
    fd: i32,
    /// The negotiated TLS, if any.
    pub(crate) tls: Option<Box<str>>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints { fd: -1, tls: None }
    }
}

impl Endpoints {
    /// `stream`'s ends.
    pub(crate) fn of(stream: &super::stream::Stream) -> Endpoints {
        Endpoints { fd: stream.raw_fd().unwrap_or(-1), tls: stream.tls_description().map(String::into_boxed_str) }
    }

    /// Peer and local TCP addresses; None over a unix socket.
    pub(crate) fn tcp(&self) -> Option<(SocketAddr, SocketAddr)> {
        if self.fd < 0 {
            return None;
        }
        // SAFETY: the descriptor is borrowed for two getsockname-style calls and never
        // closed here (ManuallyDrop); a descriptor that is not a TCP socket gives errors.
        let s = std::mem::ManuallyDrop::new(unsafe {
            <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(self.fd)
        });
        Some((s.peer_addr().ok()?, s.local_addr().ok()?))
    }

    /// The peer's process id over a unix socket, as the kernel names it.
    pub(crate) fn peer_pid(&self) -> Option<i32> {
        if self.fd < 0 {
            return None;
        }
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cred`.
        let r =
            unsafe { libc::getsockopt(self.fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len) };
        (r == 0 && cred.pid > 0).then_some(cred.pid)
    }
}

/// A logged-in client, for `SHOW CLIENTS` (its database and user are its pool's, in its
/// cancel slot).
#[derive(Debug)]
pub(crate) struct ClientInfo {
    /// Its ends.
    pub(crate) ends: Endpoints,
    /// When it connected (µs since the epoch).
    pub(crate) connected_us: u64,
    /// Its settings as its session holds them (shared: no copy), for application_name.
    pub(crate) settings: Arc<crate::state::Settings>,
}

/// A console connection, as `SHOW CLIENTS` lists it: PgBouncer lists its console's clients
/// too (under the database they asked for, `pgbouncer`), so a monitoring tool that counts
/// clients by database and state (the Prometheus community's pgbouncer_exporter) always
/// finds at least itself.
#[derive(Debug)]
pub(crate) struct ConsoleClient {
    /// Unique among console connections (shown as its `id`, above every client pid).
    pub(crate) id: u64,
    pub(crate) user: String,
    /// The console database name it asked for (`pgbouncer` or `parsnip`).
    pub(crate) db: String,
    pub(crate) application_name: String,
    pub(crate) ends: Endpoints,
    pub(crate) connected_us: u64,
}

/// What a client's task reports about itself as it goes (all relaxed: a console reading it
/// a moment late is fine).
#[derive(Debug, Default)]
pub(crate) struct ClientLive {
    /// Its latest request (µs since the epoch).
    pub(crate) request_us: AtomicU64,
    /// When it started waiting for a server (µs since the epoch), 0 when not waiting.
    pub(crate) waiting_since_us: AtomicU64,
    /// Prepared statements it holds.
    pub(crate) prepared: AtomicU32,
    /// Why it is pinned to its server connection (`PinReasons` bits, as the server last
    /// confirmed them: `Session::settled_pin_reasons`); 0: not pinned.
    pub(crate) pinned: std::sync::atomic::AtomicU8,
    /// When it last gave back a connection of a pool with a read/write split, in
    /// `split::tick`s (0: never): its reads stay on the primary for a while after. 16 bits
    /// fit where the struct had padding; a wrapped value can only keep a read on the
    /// primary, never send one to a standby early.
    pub(crate) primary_at: std::sync::atomic::AtomicU16,
}

/// A server connection, for `SHOW SERVERS` (part of its `CancelTarget`).
#[derive(Debug, Default)]
pub(crate) struct ServerInfo {
    /// Unique id.
    pub(crate) id: u64,
    /// Its ends.
    pub(crate) ends: Endpoints,
    /// When it connected (µs since the epoch).
    pub(crate) connected_us: u64,
    /// The pool's epoch it belongs to (`RECONNECT` closes older ones).
    pub(crate) epoch: AtomicU64,
    /// The client it serves (that client's pid), 0 when idle.
    pub(crate) client: AtomicI32,
    /// When it was last given back (µs since the epoch).
    pub(crate) released_us: AtomicU64,
    /// Statements prepared on it.
    pub(crate) prepared: AtomicU32,
}

static NEXT_SERVER_ID: AtomicU64 = AtomicU64::new(1);

impl ServerInfo {
    /// A new connection's entry.
    pub(crate) fn new(ends: Endpoints) -> ServerInfo {
        let now = unix_us();
        ServerInfo {
            id: NEXT_SERVER_ID.fetch_add(1, Ordering::Relaxed),
            ends,
            connected_us: now,
            released_us: AtomicU64::new(now),
            ..ServerInfo::default()
        }
    }
}

/// The live server connections of every pool.
#[derive(Debug, Default)]
pub(crate) struct Census {
    servers: Mutex<Vec<(PoolKey, Weak<CancelTarget>)>>,
}

impl Census {
    /// A connection of pool `key` was opened.
    pub(crate) fn add_server(&self, key: &PoolKey, t: &Arc<CancelTarget>) {
        let mut g = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= 64 && g.len().is_power_of_two() {
            g.retain(|(_, w)| w.strong_count() > 0);
        }
        g.push((key.clone(), Arc::downgrade(t)));
    }

    /// The connections open now, with their pools' keys, in order of opening.
    pub(crate) fn servers(&self) -> Vec<(PoolKey, Arc<CancelTarget>)> {
        let mut g = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|(_, w)| w.strong_count() > 0);
        g.iter().filter_map(|(k, w)| Some((k.clone(), w.upgrade()?))).collect()
    }
}
