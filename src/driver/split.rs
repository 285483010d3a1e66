//! The read/write split (`read_write_split`): a database's clients pool gets a second
//! pool next to it (`PoolPurpose::Reads`) whose connections go to standbys
//! (target_session_attrs standby) and which shares its statement cache. The session says
//! whether the batch that needs a server is a plain autocommit read
//! (`Session::is_read_batch`); this module picks the pool that serves it: the standbys'
//! when the split is on, the client has not used the primary within `read_your_writes_ms`,
//! and the replay lag of every standby that answered the last sample is within
//! `max_replica_lag_ms`; else the primary. A read that finds the last sample missing or too
//! old waits for a new one (briefly), rather than going to a primary that may be down. The
//! lag is sampled at most every `PROBE_EVERY` while reads come, by a task of its own over
//! one connection per standby host, outside the pools' counts.

use super::server_conn::ServerConn;
use super::servers::ServerPool;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How often the standbys' lag is sampled while reads come.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// A sample older than this is not trusted: a read waits for the next one.
const FRESH_FOR: Duration = Duration::from_millis(2000);

/// How long a read waits for a lag sample when the last one is missing or too old; past
/// it, the read goes to the primary.
const SAMPLE_WAIT: Duration = Duration::from_millis(1000);

/// Where a read may go, by the last lag sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serve {
    /// The standbys.
    Standbys,
    /// The primary.
    Primary,
    /// No sample recent enough: one was started, the read waits for it.
    Unknown,
}

/// A standby's replay lag in ms: 0 when it has replayed all it received, else the age of
/// the last transaction it replayed; -1 from a server that is no standby (promoted).
const LAG_QUERY: &str = "SELECT CASE WHEN NOT pg_catalog.pg_is_in_recovery() THEN -1 \
     WHEN pg_catalog.pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_catalog.pg_last_wal_replay_lsn() THEN 0 \
     ELSE coalesce(extract(epoch FROM now() - pg_catalog.pg_last_xact_replay_timestamp()) * 1000, 0) END::bigint";

/// A sampling connection and the (host, port) it is to.
type Probe = ((String, u16), Box<ServerConn>);

static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Milliseconds since the process's first use of this clock (never 0).
pub(crate) fn now_ms() -> u64 {
    START.elapsed().as_millis() as u64 + 1
}

/// Milliseconds per `tick`.
const TICK_MS: u64 = 16;

/// The time in 16 ms ticks, wrapping at 16 bits (about 17 minutes), never 0: what a client
/// records when it last used the primary (`ClientLive::primary_at`).
pub(crate) fn tick() -> u16 {
    ((now_ms() / TICK_MS) as u16).max(1)
}

/// Whether a client that last used the primary at `tick` (0: never) did so less than
/// `window_ms` ago. A wrapped clock can only make this true, which keeps a read on the
/// primary: safe.
fn recently(at: u16, window_ms: u64) -> bool {
    at != 0 && u64::from(tick().wrapping_sub(at)) * TICK_MS < window_ms
}

/// The split of one clients pool: its read pool, the settings (a reload changes them) and
/// the last lag sample.
#[derive(Debug)]
pub(crate) struct Split {
    /// The pool of standby connections.
    pub(crate) reads: Arc<ServerPool>,
    enabled: AtomicBool,
    max_lag_ms: AtomicU64,
    ryw_ms: AtomicU64,
    /// When the last sample was taken (`now_ms`; 0: never).
    sampled_at: AtomicU64,
    /// The largest lag it found, in ms.
    lag_ms: AtomicU64,
    probing: AtomicBool,
    /// Told when a sample is taken.
    sampled: tokio::sync::Notify,
    /// A sampling connection per standby host, kept between samples.
    probes: Mutex<Vec<Probe>>,
}

impl Split {
    /// The split onto `reads`, with the database's settings.
    pub(crate) fn new(reads: Arc<ServerPool>, db: &crate::config::DatabaseConfig) -> Split {
        let s = Split {
            reads,
            enabled: AtomicBool::new(false),
            max_lag_ms: AtomicU64::new(0),
            ryw_ms: AtomicU64::new(0),
            sampled_at: AtomicU64::new(0),
            lag_ms: AtomicU64::new(u64::MAX),
            probing: AtomicBool::new(false),
            sampled: tokio::sync::Notify::new(),
            probes: Mutex::new(Vec::new()),
        };
        s.configure(db);
        s
    }

    /// A reload: the database's settings now.
    pub(crate) fn configure(&self, db: &crate::config::DatabaseConfig) {
        self.enabled.store(db.read_write_split, Ordering::Relaxed);
        self.max_lag_ms.store(db.max_replica_lag_ms(), Ordering::Relaxed);
        self.ryw_ms.store(db.read_your_writes_ms(), Ordering::Relaxed);
    }

    /// Where a read may go now, for a client that last used the primary at `primary_at`
    /// (`tick`, 0: never). Starts a lag sample when one is due.
    fn serve(self: &Arc<Self>, primary_at: u16) -> Serve {
        if !self.enabled.load(Ordering::Relaxed) || recently(primary_at, self.ryw_ms.load(Ordering::Relaxed)) {
            return Serve::Primary;
        }
        let now = now_ms();
        let sampled = self.sampled_at.load(Ordering::Relaxed);
        if now.saturating_sub(sampled) >= PROBE_EVERY.as_millis() as u64 {
            self.sample();
        }
        if sampled == 0 || now.saturating_sub(sampled) >= FRESH_FOR.as_millis() as u64 {
            return Serve::Unknown;
        }
        if self.lag_ms.load(Ordering::Relaxed) <= self.max_lag_ms.load(Ordering::Relaxed) {
            Serve::Standbys
        } else {
            Serve::Primary
        }
    }

    /// Whether a read may go to the standbys: by the last sample when it is recent, else
    /// by the one it starts, waited for at most `SAMPLE_WAIT` (the primary may be down:
    /// a read after a quiet spell must not go there because the sample aged).
    async fn standbys_serve(self: &Arc<Self>, primary_at: u16) -> bool {
        let deadline = tokio::time::Instant::now() + SAMPLE_WAIT;
        loop {
            let woken = self.sampled.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // A sample taken since the last look counts (it may have ended before `enable`).
            match self.serve(primary_at) {
                Serve::Standbys => return true,
                Serve::Primary => return false,
                Serve::Unknown => {}
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return false;
            }
        }
    }

    /// Samples every standby host's lag in a task of its own (one at a time).
    fn sample(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.probing.store(false, Ordering::Release);
            return;
        };
        let s = self.clone();
        rt.spawn(async move {
            let lag = s.probe_all().await;
            tracing::debug!(db = %s.reads.key.db, lag_ms = lag, "replica lag sampled");
            s.lag_ms.store(lag, Ordering::Relaxed);
            s.sampled_at.store(now_ms(), Ordering::Relaxed);
            s.probing.store(false, Ordering::Release);
            s.sampled.notify_waiters();
        });
    }

    /// The largest lag among the standbys that answered (u64::MAX when none did: with no
    /// standby up, reads go straight to the primary instead of failing to connect first).
    async fn probe_all(&self) -> u64 {
        let connector = self.reads.connector();
        let timeout = self.reads.connect_timeout();
        let mut worst: Option<u64> = None;
        for (host, port) in connector.hosts().iter() {
            let kept = {
                let mut p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
                p.iter().position(|(k, _)| k.0 == *host && k.1 == *port).map(|i| p.swap_remove(i).1)
            };
            let kept = kept.and_then(|mut c| c.is_healthy().then_some(c));
            let mut conn = match kept {
                Some(c) => c,
                None => match connector.connect_to(host, *port).await {
                    Ok(c) => Box::new(c),
                    // Down: it serves no reads either.
                    Err(e) => {
                        tracing::debug!(host = %host, port, error = %e, "replica lag: host not reached");
                        continue;
                    }
                },
            };
            match conn.query_rows(LAG_QUERY, timeout).await {
                Ok(rows) => {
                    let lag = rows.first().and_then(|r| r.first()).and_then(|v| v.as_deref()?.parse::<i64>().ok());
                    // A primary serves no reads of the read pool: not counted.
                    if lag == Some(-1) {
                        self.probes.lock().unwrap_or_else(|e| e.into_inner()).push(((host.clone(), *port), conn));
                        continue;
                    }
                    let lag = lag.map_or(u64::MAX, |l| l.max(0) as u64);
                    worst = Some(worst.map_or(lag, |w| w.max(lag)));
                    self.probes.lock().unwrap_or_else(|e| e.into_inner()).push(((host.clone(), *port), conn));
                }
                Err(e) => {
                    tracing::warn!(host = %host, port, error = %e, "replica lag query failed");
                    worst = Some(u64::MAX);
                }
            }
        }
        worst.unwrap_or(u64::MAX)
    }
}

/// Where a read goes, as `read_pool_for` finds it.
pub(crate) enum ReadPool {
    /// Decided now: the read pool, or None (the client's own pool).
    Now(Option<Arc<ServerPool>>),
    /// The lag sample is missing or too old: `read_pool_after_sample` decides.
    AfterSample,
}

/// For a batch the session says is a plain read: `pool`'s read pool when the standbys may
/// serve it (see the module doc), else None (the client's own pool), without waiting when
/// the last lag sample decides it (a read per transaction allocates nothing here).
pub(crate) fn read_pool_for(pool: &Arc<ServerPool>, primary_at: u16) -> ReadPool {
    let Some(split) = pool.connector().split() else { return ReadPool::Now(None) };
    match split.serve(primary_at) {
        Serve::Standbys => ReadPool::Now(Some(split.reads.clone())),
        Serve::Primary => ReadPool::Now(None),
        Serve::Unknown => ReadPool::AfterSample,
    }
}

/// `read_pool_for` once a new lag sample is in (waited for at most `SAMPLE_WAIT`).
pub(crate) async fn read_pool_after_sample(pool: &Arc<ServerPool>, primary_at: u16) -> Option<Arc<ServerPool>> {
    let split = pool.connector().split()?;
    split.standbys_serve(primary_at).await.then(|| split.reads.clone())
}

/// The clients pool a read pool belongs to (None for any other pool).
pub(crate) fn primary_of(pool: &Arc<ServerPool>) -> Option<Arc<ServerPool>> {
    pool.connector().primary()
}

/// Drops the sampling connections (the database went, or its hosts changed).
pub(crate) fn forget_probes(split: &Split) {
    split.probes.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_client_that_used_the_primary_reads_from_it_for_a_while() {
        assert!(!super::recently(0, 60_000), "never used the primary");
        let now = super::tick();
        assert!(super::recently(now, 1000));
        assert!(!super::recently(now.wrapping_sub(100), 1000), "1.6 s ago");
        assert!(super::recently(now.wrapping_sub(100), 2000));
        assert!(!super::recently(now, 0), "no window");
    }
}
