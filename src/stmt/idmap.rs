//! Maps keyed by the statement ids the registry hands out (a counter, never chosen by a
//! client): a multiply is hash enough, where SipHash cost more than the lookup itself on
//! the per-transaction path.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes one `u64` id by a multiply (Fibonacci hashing).
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Not used for u64 keys; kept correct for any other key anyway.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by statement id.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
/// A set of statement ids.
pub(crate) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_buckets() {
        let mut m = IdMap::default();
        for i in 0..10_000u64 {
            m.insert(i, i * 2);
        }
        assert!((0..10_000u64).all(|i| m[&i] == i * 2));
        let low: HashSet<u64> = (0..64u64)
            .map(|i| {
                let mut h = IdHasher::default();
                h.write_u64(i);
                h.finish() >> 57
            })
            .collect();
        assert!(low.len() > 32, "top bits (hashbrown's tag) must vary: {}", low.len());
    }
}
