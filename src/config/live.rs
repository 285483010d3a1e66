//! The configuration in force: one handle (`LiveConfig`) shared by every layer that reads
//! the configuration while running (the driver's `Shared`, each pool, each pool's
//! connector). A reload swaps it once and every holder sees the new one from then on.

use super::Config;
use arc_swap::{ArcSwap, Guard};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared, swappable `Arc<Config>`; clones share the same configuration.
#[derive(Clone, Debug)]
pub struct LiveConfig(Arc<Live>);

#[derive(Debug)]
struct Live {
    cfg: ArcSwap<Config>,
    /// How many times `cfg` was swapped (`generation`).
    generation: AtomicU64,
}

impl LiveConfig {
    /// A handle holding `cfg` (shared by its clones only).
    pub fn new(cfg: Arc<Config>) -> LiveConfig {
        LiveConfig(Arc::new(Live { cfg: ArcSwap::new(cfg), generation: AtomicU64::new(0) }))
    }

    /// The configuration now, for a short look.
    pub fn load(&self) -> Guard<Arc<Config>> {
        self.0.cfg.load()
    }

    /// The configuration now, to keep.
    pub fn load_full(&self) -> Arc<Config> {
        self.0.cfg.load_full()
    }

    /// How many times the configuration was swapped: what is worked out from it may be
    /// kept while this stays the same. Read it before `load`ing what is worked out (a
    /// swap in between then makes the next read differ).
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// A reload (or the console's `SET`): every holder sees `cfg` from now on.
    pub(crate) fn store(&self, cfg: Arc<Config>) {
        self.0.cfg.store(cfg);
        self.0.generation.fetch_add(1, Ordering::Release);
    }
}

/// A number worked out from the configuration in force (a setting in milliseconds, say),
/// kept until the configuration is swapped: where it is read at every transaction, one
/// relaxed load and a compare instead of a `load` and a lookup. The generation (plus one,
/// the high `64 - VALUE_BITS` bits; 0: nothing kept) and the number share one word, so a
/// number is never read with another generation's tag.
#[derive(Debug, Default)]
pub(crate) struct PerGeneration(AtomicU64);

const VALUE_BITS: u32 = 40;

impl PerGeneration {
    /// The number `f` works out from `live`'s configuration: the kept one if it was worked
    /// out in the generation in force. (Past 2^24 generations, or for a number of 2^40 or
    /// more, it is worked out every time.)
    #[inline]
    pub(crate) fn get(&self, live: &LiveConfig, f: impl FnOnce(&Config) -> u64) -> u64 {
        let tag = live.generation().wrapping_add(1);
        let kept = self.0.load(Ordering::Relaxed);
        if kept >> VALUE_BITS == tag {
            return kept & ((1 << VALUE_BITS) - 1);
        }
        self.work_out(live, tag, f)
    }

    #[cold]
    fn work_out(&self, live: &LiveConfig, tag: u64, f: impl FnOnce(&Config) -> u64) -> u64 {
        // Worked out from this generation's configuration or a later one: a reader that
        // sees the later generation works it out again.
        let v = f(&live.load());
        if tag < 1 << (64 - VALUE_BITS) && v < 1 << VALUE_BITS {
            self.0.store(tag << VALUE_BITS | v, Ordering::Relaxed);
        }
        v
    }
}

impl From<Arc<Config>> for LiveConfig {
    fn from(cfg: Arc<Config>) -> LiveConfig {
        LiveConfig::new(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::{Config, LiveConfig, PerGeneration};
    use std::sync::Arc;

    #[test]
    fn a_kept_number_follows_the_configuration() {
        let live = LiveConfig::new(Arc::new(Config { server_lifetime_ms: 5, ..Config::default() }));
        let kept = PerGeneration::default();
        let mut asked = 0;
        let get = |asked: &mut u32| {
            kept.get(&live, |c| {
                *asked += 1;
                c.server_lifetime_ms
            })
        };
        assert_eq!((get(&mut asked), get(&mut asked)), (5, 5));
        assert_eq!(asked, 1, "worked out once per generation");
        live.store(Arc::new(Config { server_lifetime_ms: 7, ..Config::default() }));
        assert_eq!((get(&mut asked), get(&mut asked)), (7, 7));
        assert_eq!(asked, 2);
        // Too large to keep: worked out every time.
        live.store(Arc::new(Config { server_lifetime_ms: 1 << 41, ..Config::default() }));
        assert_eq!((get(&mut asked), get(&mut asked)), (1 << 41, 1 << 41));
        assert_eq!(asked, 4);
    }
}
