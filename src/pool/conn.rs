//! What the pool needs of the connections it holds, and of whoever opens them: the two
//! traits the driver implements for its server connections, and whether a connection is
//! past its lifetime or from before a `reconnect`. The pool knows nothing else about them
//! (no sockets, no protocol).

use super::stats::PoolStats;
use crate::error::Error;
use crate::state::Settings;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A connection as the pool sees it.
pub trait Pooled: Send + 'static {
    /// Still usable: not broken, nothing unread.
    fn is_healthy(&mut self) -> bool;
    /// Found not healthy (`is_healthy`), what it had sent says its server is going down:
    /// the pool's other connections are likely ending too, and are retired.
    fn says_going_down(&self) -> bool {
        false
    }
    /// When it was opened (`server_lifetime`).
    fn created(&self) -> Instant;
    /// When it was last given back (`server_idle_timeout`).
    fn last_used(&self) -> Instant;
    /// Records that it was given back now.
    fn touch(&mut self, now: Instant);
    /// The parameters the server reported at startup (ParameterStatus), for new clients.
    fn startup_params(&self) -> &[(String, String)];
    /// The settings in effect on it.
    fn settings(&self) -> &Settings;
    /// The pool's epoch when it was opened: one opened before a `RECONNECT` is closed
    /// instead of reused.
    fn epoch(&self) -> u64;
    /// Stamps it with the pool's epoch (when it enters the pool).
    fn set_epoch(&mut self, epoch: u64);
    /// The worker thread whose event loop watches its socket (`home::here` when it was
    /// opened): a checkout prefers the idle connections of its own thread.
    fn home(&self) -> u16 {
        0
    }
}

/// A future a connector returns (boxed: connecting is the rare, slow path).
pub type Connecting<'a, C> = Pin<Box<dyn Future<Output = Result<Box<C>, Error>> + Send + 'a>>;

/// Opens the connections of one pool, and names what a queued client may be handed
/// besides a connection of its own.
pub trait Connector: Send + Sync + 'static {
    /// The connection.
    type Conn: Pooled;
    /// A share of a connection busy with other clients' batches (the driver's pipelining
    /// ticket); the pool only passes it on.
    type Ticket: Send + 'static;
    /// Opens a connection, with the retries the configuration asks for, counting
    /// connects and failures in `stats`.
    fn connect<'a>(&'a self, stats: &'a PoolStats) -> Connecting<'a, Self::Conn>;
}

impl<K: Connector> super::Pool<K> {
    /// Whether `c` is past `server_lifetime`.
    pub(crate) fn expired(&self, c: &K::Conn) -> bool {
        self.expired_at(c, Instant::now())
    }

    /// Whether `c` is past `server_lifetime` at `now` (a clock read shared with the caller).
    pub(super) fn expired_at(&self, c: &K::Conn, now: Instant) -> bool {
        let ms = self.lifetime_ms.get(&self.cfg, |c| c.server_lifetime_ms_for(&self.key.db));
        ms > 0 && now.saturating_duration_since(c.created()) >= Duration::from_millis(ms)
    }

    /// Whether `c` was opened before the last `reconnect`.
    pub(super) fn outdated(&self, c: &K::Conn) -> bool {
        c.epoch() != self.epoch.load(Ordering::Relaxed)
    }
}
