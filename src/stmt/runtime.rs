//! How long batches of one kind recently took on a server: what decides whether other
//! clients' batches may be queued behind one (`session::pipeline`).

use std::sync::atomic::{AtomicU32, Ordering};

/// Recent run time in µs + 1 (0: never timed). A slower run counts at once; faster ones
/// bring the figure down an eighth at a time, so one slow run keeps it high for a while.
#[derive(Debug, Default)]
pub(crate) struct RunTime(AtomicU32);

impl RunTime {
    /// A batch took `us` µs.
    pub(crate) fn note(&self, us: u64) {
        let us = us.min(u32::MAX as u64 - 2) as u32 + 1;
        let old = self.0.load(Ordering::Relaxed);
        let new = if old == 0 || us >= old { us } else { old - (old - us) / 8 };
        if new != old {
            self.0.store(new, Ordering::Relaxed);
        }
    }

    /// Timed, and recently at most `limit_us` µs.
    #[inline]
    pub(crate) fn known_fast(&self, limit_us: u32) -> bool {
        let v = self.0.load(Ordering::Relaxed);
        v != 0 && v - 1 <= limit_us
    }
}

#[cfg(test)]
mod tests {
    use super::RunTime;

    #[test]
    fn rises_at_once_and_decays_slowly() {
        let r = RunTime::default();
        assert!(!r.known_fast(u32::MAX), "never timed");
        r.note(100);
        assert!(r.known_fast(2000));
        r.note(50_000);
        assert!(!r.known_fast(2000), "one slow run counts at once");
        let mut fast_runs = 0;
        while !r.known_fast(2000) {
            r.note(100);
            fast_runs += 1;
            assert!(fast_runs < 100);
        }
        assert!(fast_runs > 10, "{fast_runs} fast runs were enough to forget a slow one");
    }
}
