//! A pool's counters, readable without its lock; the totals and per-period averages the
//! console and the metrics read (PgBouncer's `SHOW STATS` figures); and the snapshot of a
//! pool at one moment.

use super::key::PoolKey;
use crate::config::PoolMode;
use crate::stmt::Registry;
use crate::stmt::pins::PinReasons;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Counters, readable without the lock.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Server connections opened.
    pub(crate) connects: AtomicU64,
    /// Failed connect attempts.
    pub(crate) connect_failures: AtomicU64,
    /// Checkouts served (PgBouncer's server assignments).
    pub(crate) checkouts: AtomicU64,
    /// Checkouts that had to wait.
    pub(crate) waits: AtomicU64,
    /// Checkouts that timed out.
    pub(crate) wait_timeouts: AtomicU64,
    /// Checkouts served with a ticket on a connection busy with other batches.
    pub(crate) pipelined: AtomicU64,
    /// Cancels sent with `pg_cancel_backend` because batches were queued behind the query.
    pub(crate) pipelined_cancels: AtomicU64,
    /// Transactions, queries, bytes and times, as clients' tasks report them.
    pub(crate) traffic: Traffic,
    /// Client logins to this pool.
    pub(crate) logins: AtomicU64,
    /// Pins begun, by reason (`PinReasons::NAMES` order): a reason the server confirmed
    /// for a client that did not have it.
    pub(crate) pins_begun: [AtomicU64; PinReasons::NAMES.len()],
    /// Clients pinned now (a reason confirmed).
    pub(crate) pinned_clients: AtomicI64,
    /// The totals at the start of the current period, and the averages of the last one.
    period: Mutex<Period>,
}

/// What clients' tasks add up (`driver`'s meter), per pool.
#[derive(Debug, Default)]
pub struct Traffic {
    /// Transactions ended (a ReadyForQuery saying idle).
    pub(crate) xacts: AtomicU64,
    /// Queries answered (every ReadyForQuery).
    pub(crate) queries: AtomicU64,
    /// Bytes read from clients.
    pub(crate) received: AtomicU64,
    /// Bytes written to clients.
    pub(crate) sent: AtomicU64,
    /// Microseconds in transactions.
    pub(crate) xact_us: AtomicU64,
    /// Microseconds from a query's first bytes to its ReadyForQuery.
    pub(crate) query_us: AtomicU64,
    /// Microseconds clients waited for a server.
    pub(crate) wait_us: AtomicU64,
    /// Binds of statements of the cache.
    pub(crate) binds: AtomicU64,
    /// Checkouts that waited, by how long (`WAIT_BUCKETS`; the last: longer). Checkouts
    /// served at once are the rest of `checkouts`: nothing is added for them.
    pub(crate) waited: [AtomicU64; WAIT_BUCKETS.len() + 1],
    /// Errors PostgreSQL returned to clients, by SQLSTATE class (rare: a lock is fine).
    pub(crate) errors: Mutex<Vec<([u8; 2], u64)>>,
}

/// Upper bounds (seconds) of the wait-time histogram's buckets.
pub(crate) const WAIT_BUCKETS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

impl Traffic {
    /// A checkout waited `us` microseconds.
    pub(crate) fn waited(&self, us: u64) {
        let secs = us as f64 / 1e6;
        let i = WAIT_BUCKETS.iter().position(|b| secs <= *b).unwrap_or(WAIT_BUCKETS.len());
        self.waited[i].fetch_add(1, Ordering::Relaxed);
        self.wait_us.fetch_add(us, Ordering::Relaxed);
    }

    /// `n` errors of SQLSTATE class `class` went to clients.
    pub(crate) fn errors(&self, class: [u8; 2], n: u64) {
        let mut g = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        match g.iter_mut().find(|(c, _)| *c == class) {
            Some((_, count)) => *count += n,
            None => g.push((class, n)),
        }
    }
}

/// One set of figures, as PgBouncer's `SHOW STATS` names them: totals since start, or the
/// averages of a period (counts per second; times per transaction, query or assignment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) server_assignments: u64,
    pub(crate) xacts: u64,
    pub(crate) queries: u64,
    pub(crate) received: u64,
    pub(crate) sent: u64,
    pub(crate) xact_us: u64,
    pub(crate) query_us: u64,
    pub(crate) wait_us: u64,
    pub(crate) client_parses: u64,
    pub(crate) server_parses: u64,
    pub(crate) binds: u64,
}

impl Figures {
    /// The sum of two sets of totals.
    pub(crate) fn add(&mut self, o: &Figures) {
        self.server_assignments += o.server_assignments;
        self.xacts += o.xacts;
        self.queries += o.queries;
        self.received += o.received;
        self.sent += o.sent;
        self.xact_us += o.xact_us;
        self.query_us += o.query_us;
        self.wait_us += o.wait_us;
        self.client_parses += o.client_parses;
        self.server_parses += o.server_parses;
        self.binds += o.binds;
    }

    /// PgBouncer's averages over a period of `secs` seconds from totals `old` to `new`:
    /// counts and bytes per second; transaction and query times per transaction and query;
    /// wait time per server assignment.
    pub(crate) fn averages(old: &Figures, new: &Figures, secs: f64) -> Figures {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        let rate = |a, b| if secs > 0.0 { (d(a, b) as f64 / secs) as u64 } else { 0 };
        let per = |ta, tb, na, nb| d(ta, tb).checked_div(d(na, nb)).unwrap_or(0);
        Figures {
            server_assignments: rate(old.server_assignments, new.server_assignments),
            xacts: rate(old.xacts, new.xacts),
            queries: rate(old.queries, new.queries),
            received: rate(old.received, new.received),
            sent: rate(old.sent, new.sent),
            xact_us: per(old.xact_us, new.xact_us, old.xacts, new.xacts),
            query_us: per(old.query_us, new.query_us, old.queries, new.queries),
            wait_us: per(old.wait_us, new.wait_us, old.server_assignments, new.server_assignments),
            client_parses: rate(old.client_parses, new.client_parses),
            server_parses: rate(old.server_parses, new.server_parses),
            binds: rate(old.binds, new.binds),
        }
    }
}

/// The averaging periods: the one under way, and the last complete one.
#[derive(Debug)]
struct Period {
    started: Instant,
    totals: Figures,
    last: LastPeriod,
}

/// The last complete averaging period: the totals at its start and end, and its length.
/// Averages over several pools (`SHOW STATS` per database) are taken from the sums of these.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LastPeriod {
    pub(crate) start: Figures,
    pub(crate) end: Figures,
    pub(crate) secs: f64,
}

impl LastPeriod {
    /// Adds another pool's period (taken at the same moments).
    pub(crate) fn add(&mut self, o: &LastPeriod) {
        self.start.add(&o.start);
        self.end.add(&o.end);
        self.secs = self.secs.max(o.secs);
    }
    /// The period's averages.
    pub(crate) fn averages(&self) -> Figures {
        Figures::averages(&self.start, &self.end, self.secs)
    }
}

impl Default for Period {
    fn default() -> Self {
        Period { started: Instant::now(), totals: Figures::default(), last: LastPeriod::default() }
    }
}

/// A pool as the console shows it, read at one moment.
#[derive(Clone, Debug)]
pub(crate) struct PoolSnapshot {
    /// The pool's key.
    pub(crate) key: PoolKey,
    /// Pool mode of its clients.
    pub(crate) mode: PoolMode,
    /// Maximum open connections.
    pub(crate) size: usize,
    /// Idle connections.
    pub(crate) idle: usize,
    /// Open connections (idle, in use, being opened).
    pub(crate) open: usize,
    /// Queued checkouts.
    pub(crate) waiting: usize,
    /// How long the first queued checkout has waited, in microseconds.
    pub(crate) max_wait_us: u64,
    /// See [`PoolStats::connects`].
    pub(crate) connects: u64,
    /// See [`PoolStats::connect_failures`].
    pub(crate) connect_failures: u64,
    /// See [`PoolStats::checkouts`].
    pub(crate) checkouts: u64,
    /// See [`PoolStats::waits`].
    pub(crate) waits: u64,
    /// See [`PoolStats::wait_timeouts`].
    pub(crate) wait_timeouts: u64,
    /// See [`PoolStats::pipelined`].
    pub(crate) pipelined: u64,
    /// See [`PoolStats::pipelined_cancels`].
    pub(crate) pipelined_cancels: u64,
    /// See [`PoolStats::logins`].
    pub(crate) logins: u64,
    /// See [`PoolStats::pins_begun`].
    pub(crate) pins_begun: [u64; PinReasons::NAMES.len()],
    /// See [`PoolStats::pinned_clients`].
    pub(crate) pinned_clients: i64,
    /// Totals since start.
    pub(crate) totals: Figures,
    /// The last complete averaging period (`stats_period`).
    pub(crate) period: LastPeriod,
    /// The pool's statement cache (its counters and statements).
    pub(crate) stmts: Arc<Registry>,
    /// PAUSE (or KILL) holds its checkouts.
    pub(crate) paused: bool,
    /// Checkouts that waited, per `WAIT_BUCKETS` bucket (the last: longer).
    pub(crate) waited: [u64; WAIT_BUCKETS.len() + 1],
    /// Errors returned to clients by SQLSTATE class, sorted.
    pub(crate) errors: Vec<(String, u64)>,
}

impl PoolStats {
    /// The totals now, with the statement cache's parse counts from `stmts`.
    pub(crate) fn totals(&self, stmts: &Registry) -> Figures {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let t = &self.traffic;
        Figures {
            server_assignments: n(&self.checkouts),
            xacts: n(&t.xacts),
            queries: n(&t.queries),
            received: n(&t.received),
            sent: n(&t.sent),
            xact_us: n(&t.xact_us),
            query_us: n(&t.query_us),
            wait_us: n(&t.wait_us),
            client_parses: n(&stmts.stats.client_parses),
            server_parses: n(&stmts.stats.server_parses),
            binds: n(&t.binds),
        }
    }

    /// A client's confirmed pin reasons went from `was` to `now` (`PinReasons` bits).
    pub(crate) fn pins_changed(&self, was: u8, now: u8) {
        for (i, (bit, _)) in PinReasons::NAMES.iter().enumerate() {
            if now & bit != 0 && was & bit == 0 {
                self.pins_begun[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        match (was != 0, now != 0) {
            (false, true) => self.pinned_clients.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.pinned_clients.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    /// Ends the current averaging period at `now` (the janitor's, every `stats_period`).
    pub(crate) fn roll_period(&self, stmts: &Registry, now: Instant) {
        let totals = self.totals(stmts);
        let mut p = self.period.lock().unwrap_or_else(|e| e.into_inner());
        let secs = now.saturating_duration_since(p.started).as_secs_f64();
        p.last = LastPeriod { start: p.totals, end: totals, secs };
        p.totals = totals;
        p.started = now;
    }

    /// The counters into `s`.
    pub(super) fn fill(&self, s: &mut PoolSnapshot) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.connects = n(&self.connects);
        s.connect_failures = n(&self.connect_failures);
        s.checkouts = n(&self.checkouts);
        s.waits = n(&self.waits);
        s.wait_timeouts = n(&self.wait_timeouts);
        s.pipelined = n(&self.pipelined);
        s.pipelined_cancels = n(&self.pipelined_cancels);
        s.logins = n(&self.logins);
        s.pins_begun = std::array::from_fn(|i| n(&self.pins_begun[i]));
        s.pinned_clients = self.pinned_clients.load(Ordering::Relaxed).max(0);
        s.totals = self.totals(&s.stmts);
        s.period = self.period.lock().unwrap_or_else(|e| e.into_inner()).last;
        s.waited = std::array::from_fn(|i| n(&self.traffic.waited[i]));
        let errors = self.traffic.errors.lock().unwrap_or_else(|e| e.into_inner());
        s.errors = errors.iter().map(|(c, n)| (String::from_utf8_lossy(c).into_owned(), *n)).collect();
        s.errors.sort();
    }
}

impl<K: super::Connector> super::Pool<K> {
    /// The pool as the console shows it, now.
    pub(crate) fn snapshot(&self) -> PoolSnapshot {
        let (idle, open, waiting, max_wait_us) = {
            let g = self.lock();
            let first = g.waiters.iter().find(|w| !w.tx.is_closed());
            let max_wait = first.map_or(0, |w| w.since.elapsed().as_micros() as u64);
            (g.idle.len(), g.open, g.waiters.iter().filter(|w| !w.tx.is_closed()).count(), max_wait)
        };
        let mut s = PoolSnapshot {
            key: self.key.clone(),
            mode: self.mode,
            size: self.size(),
            idle,
            open,
            waiting,
            max_wait_us,
            logins: 0,
            pins_begun: Default::default(),
            pinned_clients: 0,
            totals: Default::default(),
            period: Default::default(),
            connects: 0,
            connect_failures: 0,
            checkouts: 0,
            waits: 0,
            wait_timeouts: 0,
            pipelined: 0,
            pipelined_cancels: 0,
            stmts: self.stmts.clone(),
            paused: self.is_paused(),
            waited: Default::default(),
            errors: Vec::new(),
        };
        self.stats.fill(&mut s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_are_rates_and_times_per_event() {
        let old = Figures { xacts: 10, queries: 20, xact_us: 1000, query_us: 400, ..Default::default() };
        let new = Figures {
            xacts: 30,
            queries: 60,
            xact_us: 5000,
            query_us: 2400,
            server_assignments: 8,
            wait_us: 80,
            received: 1000,
            ..Default::default()
        };
        let a = Figures::averages(&old, &new, 2.0);
        assert_eq!((a.xacts, a.queries, a.received), (10, 20, 500), "per second");
        assert_eq!((a.xact_us, a.query_us, a.wait_us), (200, 50, 10), "per transaction, query, assignment");
        assert_eq!(Figures::averages(&new, &new, 0.0), Figures::default(), "an empty period averages nothing");
    }
}
