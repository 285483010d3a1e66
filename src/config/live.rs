//! The configuration in force: one handle (`LiveConfig`) shared by every layer that reads
//! the configuration while running (the driver's `Shared`, each pool, each pool's
//! connector). A reload swaps it once and every holder sees the new one from then on.

use super::Config;
use arc_swap::{ArcSwap, Guard};
use std::sync::Arc;

/// A shared, swappable `Arc<Config>`; clones share the same configuration.
#[derive(Clone, Debug)]
pub struct LiveConfig(Arc<ArcSwap<Config>>);

impl LiveConfig {
    /// A handle holding `cfg` (shared by its clones only).
    pub fn new(cfg: Arc<Config>) -> LiveConfig {
        LiveConfig(Arc::new(ArcSwap::new(cfg)))
    }

    /// The configuration now, for a short look.
    pub fn load(&self) -> Guard<Arc<Config>> {
        self.0.load()
    }

    /// The configuration now, to keep.
    pub fn load_full(&self) -> Arc<Config> {
        self.0.load_full()
    }

    /// A reload (or the console's `SET`): every holder sees `cfg` from now on.
    pub(crate) fn store(&self, cfg: Arc<Config>) {
        self.0.store(cfg);
    }
}

impl From<Arc<Config>> for LiveConfig {
    fn from(cfg: Arc<Config>) -> LiveConfig {
        LiveConfig::new(cfg)
    }
}
