//! Per-statement execution statistics (issue 24): calls, rows, errors and server time of
//! one cached statement over every client and server connection of its pool, with a
//! compact log-scale histogram of the time per execution for its percentiles. Owned by the
//! statement (`registry::Statement::exec`), so it is bounded and evicted with the registry.
//!
//! Everything is a relaxed atomic: a session records an execution without a lock, and a
//! reader (the console, a scrape) sees figures that may be a few executions apart from each
//! other, never torn ones.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Buckets per power of two (relative width at most 1/4).
const SUB: u32 = 4;
/// Buckets: 0–3 µs one each, then `SUB` per octave up to 2^30 µs (about 18 minutes); longer
/// executions count in the last.
pub(crate) const BUCKETS: usize = 4 + 28 * SUB as usize;

/// The bucket of an execution of `us` µs.
#[inline]
pub(crate) fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros(); // floor(log2), >= 2
    let sub = ((us >> (e - 2)) & 3) as usize;
    (4 + (e as usize - 2) * SUB as usize + sub).min(BUCKETS - 1)
}

/// The µs range `[lo, hi)` bucket `i` counts.
pub(crate) fn bucket_range(i: usize) -> (u64, u64) {
    if i < 4 {
        return (i as u64, i as u64 + 1);
    }
    let e = (i - 4) / SUB as usize + 2;
    let sub = ((i - 4) % SUB as usize) as u64;
    ((4 + sub) << (e - 2), (5 + sub) << (e - 2))
}

/// A fixed log-scale histogram of µs values (480 bytes).
#[derive(Debug)]
pub(crate) struct Hist([AtomicU32; BUCKETS]);

impl Default for Hist {
    fn default() -> Self {
        Hist(std::array::from_fn(|_| AtomicU32::new(0)))
    }
}

impl Hist {
    /// Counts one value.
    #[inline]
    pub(crate) fn record(&self, us: u64) {
        self.0[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts, as one snapshot.
    pub(crate) fn counts(&self) -> [u32; BUCKETS] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// The `q` quantile (0..=1) of the values `counts` holds, as the middle of its bucket (within
/// an eighth of the true value above 4 µs); 0 when empty.
pub(crate) fn quantile(counts: &[u32; BUCKETS], q: f64) -> u64 {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if total == 0 {
        return 0;
    }
    // The rank of the value asked for, 1-based (nearest rank).
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += u64::from(c);
        if seen >= rank {
            let (lo, hi) = bucket_range(i);
            return if i < 4 { lo } else { (lo + hi) / 2 };
        }
    }
    bucket_range(BUCKETS - 1).0
}

/// What one statement's executions came to.
#[derive(Debug, Default)]
pub struct ExecStats {
    /// Executions (Execute messages completed or failed) that ran from the cache.
    pub(crate) cached: AtomicU64,
    /// Executions that ran as the client sent them (the plan guard's baseline samples, or
    /// all of them while demoted).
    pub(crate) as_sent: AtomicU64,
    /// Rows they returned or affected (from CommandComplete).
    pub(crate) rows: AtomicU64,
    /// Executions that failed (ErrorResponse).
    pub(crate) errors: AtomicU64,
    /// Server time of all of them, µs.
    pub(crate) total_us: AtomicU64,
    /// Server time per execution; made at the first execution.
    hist: OnceLock<Box<Hist>>,
}

/// A snapshot of `ExecStats`, for the console and the metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ExecFigures {
    pub(crate) cached: u64,
    pub(crate) as_sent: u64,
    pub(crate) rows: u64,
    pub(crate) errors: u64,
    pub(crate) total_us: u64,
    pub(crate) p50_us: u64,
    pub(crate) p95_us: u64,
    pub(crate) p99_us: u64,
}

impl ExecFigures {
    /// Executions, cached or not.
    pub(crate) fn calls(&self) -> u64 {
        self.cached + self.as_sent
    }
}

impl ExecStats {
    /// One execution ended after `us` µs on the server: `cached` if it ran from the cache,
    /// `rows` returned or affected, `failed` with an error.
    #[inline]
    pub(crate) fn record(&self, cached: bool, us: u64, rows: u64, failed: bool) {
        self.count(cached, rows, failed);
        self.total_us.fetch_add(us, Ordering::Relaxed);
        self.hist.get_or_init(Default::default).record(us);
    }

    /// One execution ended whose server time is not known (it waited behind another
    /// client's batch): counted, not timed.
    #[inline]
    pub(crate) fn count(&self, cached: bool, rows: u64, failed: bool) {
        let calls = if cached { &self.cached } else { &self.as_sent };
        calls.fetch_add(1, Ordering::Relaxed);
        if rows > 0 {
            self.rows.fetch_add(rows, Ordering::Relaxed);
        }
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The figures now.
    pub(crate) fn figures(&self) -> ExecFigures {
        let counts = self.hist.get().map(|h| h.counts());
        let q = |q| counts.as_ref().map_or(0, |c| quantile(c, q));
        ExecFigures {
            cached: self.cached.load(Ordering::Relaxed),
            as_sent: self.as_sent.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            total_us: self.total_us.load(Ordering::Relaxed),
            p50_us: q(0.50),
            p95_us: q(0.95),
            p99_us: q(0.99),
        }
    }
}

/// The row count of a CommandComplete tag (`SELECT 5`, `INSERT 0 5`, `UPDATE 5`): its last
/// word when that is a number, else 0.
pub(crate) fn tag_rows(tag: &[u8]) -> u64 {
    let tag = tag.strip_suffix(&[0]).unwrap_or(tag);
    let digits = tag.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 || digits == tag.len() {
        return 0;
    }
    tag[tag.len() - digits..].iter().fold(0u64, |n, b| n.wrapping_mul(10).wrapping_add(u64::from(b - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_cover_the_range_in_order() {
        let mut prev_hi = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_range(i);
            assert_eq!(lo, prev_hi, "bucket {i} starts where {} ends", i.saturating_sub(1));
            assert!(hi > lo);
            assert_eq!(bucket(lo), i);
            assert_eq!(bucket(hi - 1), i);
            prev_hi = hi;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn row_counts_from_tags() {
        assert_eq!(tag_rows(b"SELECT 5\0"), 5);
        assert_eq!(tag_rows(b"INSERT 0 12"), 12);
        assert_eq!(tag_rows(b"UPDATE 0"), 0);
        assert_eq!(tag_rows(b"CREATE TABLE"), 0);
        assert_eq!(tag_rows(b"123"), 0);
    }

    #[test]
    fn figures_of_recorded_executions() {
        let s = ExecStats::default();
        assert_eq!(s.figures(), ExecFigures::default());
        for i in 0..100 {
            s.record(i % 4 != 0, 1000 + i, 2, i == 7);
        }
        let f = s.figures();
        assert_eq!((f.cached, f.as_sent, f.rows, f.errors), (75, 25, 200, 1));
        assert_eq!(f.total_us, (1000..1100).sum::<u64>());
        assert!((900..=1200).contains(&f.p50_us), "{f:?}");
    }

    proptest! {
        /// Every quantile the histogram gives is within its bucket's resolution of the
        /// exact quantile of the values recorded (nearest rank).
        #[test]
        fn quantiles_within_a_bucket(values in prop::collection::vec(0u64..5_000_000_000, 1..400), q in 0.0f64..=1.0) {
            let h = Hist::default();
            for &v in &values {
                h.record(v);
            }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
            let exact = sorted[rank - 1];
            let got = quantile(&h.counts(), q);
            let (lo, hi) = bucket_range(bucket(exact));
            if bucket(exact) == BUCKETS - 1 {
                prop_assert_eq!(got, (lo + hi) / 2);
            } else {
                prop_assert!(got >= lo && got < hi.max(lo + 1), "q {} exact {} got {}", q, exact, got);
                // Relative error at most an eighth of the value above 4 µs.
                if exact >= 4 {
                    let err = got.abs_diff(exact) as f64 / exact as f64;
                    prop_assert!(err <= 0.125 + 1e-9, "error {}", err);
                }
            }
        }

        /// Counts are never lost: the histogram holds as many values as were recorded, and
        /// quantiles do not decrease with q.
        #[test]
        fn quantiles_are_monotonic(values in prop::collection::vec(0u64..100_000_000, 1..300)) {
            let h = Hist::default();
            for &v in &values {
                h.record(v);
            }
            let c = h.counts();
            prop_assert_eq!(c.iter().map(|&n| n as usize).sum::<usize>(), values.len());
            let mut prev = 0;
            for i in 0..=20 {
                let v = quantile(&c, f64::from(i) / 20.0);
                prop_assert!(v >= prev);
                prev = v;
            }
        }
    }
}
