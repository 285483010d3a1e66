//! The process-wide budget for bytes of large messages held whole (`max_buffered_bytes`):
//! a client frame or server frame larger than what every connection may buffer anyway (the
//! proxy's 256 KiB) that cannot be streamed reserves its size here before it is read
//! whole, and gives it back once it has been handled and the copies made of it written
//! out. A message the budget cannot take is refused (SQLSTATE 53200) instead of the process
//! growing: see docs/design.md "Memory".

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes reserved by every connection together.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    used: AtomicUsize,
}

impl Budget {
    /// Reserves `n` bytes if they fit under `limit` with what is already reserved.
    pub(crate) fn reserve(self: &Arc<Budget>, n: usize, limit: usize) -> Option<Reservation> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let after = used.checked_add(n).filter(|&a| a <= limit)?;
            match self.used.compare_exchange_weak(used, after, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(Reservation { budget: self.clone(), n }),
                Err(now) => used = now,
            }
        }
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// Bytes taken from the budget, given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    n: usize,
}

impl Reservation {
    /// The bytes reserved.
    pub(crate) fn size(&self) -> usize {
        self.n
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// The error a client gets for a message the budget cannot take now.
pub(crate) fn exhausted(n: usize, limit: usize) -> crate::error::Error {
    crate::error::Error::fatal(crate::error::SqlState::OUT_OF_MEMORY, "out of memory").with_detail(format!(
        "The pooler cannot buffer a message of {n} bytes now: its budget for buffered messages \
         (max_buffered_bytes = {limit}) is in use by other connections."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_under_the_limit_and_come_back() {
        let b = Arc::new(Budget::default());
        let r1 = b.reserve(600, 1000).expect("fits");
        assert!(b.reserve(500, 1000).is_none(), "over the limit");
        let r2 = b.reserve(400, 1000).expect("fits exactly");
        assert_eq!(b.used(), 1000);
        assert_eq!(r1.size() + r2.size(), 1000);
        drop(r1);
        assert_eq!(b.used(), 400);
        assert!(b.reserve(usize::MAX, usize::MAX).is_none(), "no overflow");
        drop(r2);
        assert_eq!(b.used(), 0);
    }
}
