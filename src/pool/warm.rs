//! `min_pool_size`: connections a pool opens ahead of demand, so that load coming back
//! after a quiet spell finds servers ready (PgBouncer's `min_pool_size`), and that
//! `server_idle_timeout` leaves open (`prune`). The minimum is capped at the pool's size;
//! each new connection takes its slot in the pool's caps like any other, and none is
//! opened while the pool is paused or has clients queued (they get the next one).
//!
//! The janitor says how many a pool should keep (`min_size` while the pool is in use, else
//! 0: the pool does not know who holds it); the pool reserves the slot (`warm_slot`) and
//! the janitor, which does the IO, opens the connection (`warm`).

use super::conn::{Connector, Pooled};
use super::{Pool, PoolPurpose};
use crate::error::Error;
use std::sync::atomic::Ordering;

impl<K: Connector> Pool<K> {
    /// The minimum this pool keeps open: its database's `min_pool_size` (else the global
    /// one), at most its size; 0 for pools that serve no clients (auth_query, reads).
    pub(crate) fn min_size(&self) -> usize {
        if self.key.purpose != PoolPurpose::Clients {
            return 0;
        }
        self.cfg.load().min_pool_size_for(&self.key.db).min(self.size())
    }

    /// Reserves a slot for one more connection when fewer than `min` (at most `min_size`)
    /// are open or being opened, nobody waits, the pool is not paused and its caps have
    /// room. True: the caller opens it with `warm`.
    pub(crate) fn warm_slot(&self, min: usize) -> bool {
        let min = min.min(self.min_size());
        let mut g = self.lock();
        let ok = g.open < min && g.waiters.is_empty() && !self.is_paused() && self.take_caps(&mut g);
        if ok {
            g.open += 1;
        }
        ok
    }

    /// Opens the connection `warm_slot` reserved and puts it in the pool (to a client
    /// that queued meanwhile, else idle); on failure the slot is given back.
    pub(crate) async fn warm(&self) -> Result<(), Error> {
        match self.connector.connect(&self.stats).await {
            Ok(mut c) => {
                c.set_epoch(self.epoch.load(Ordering::Relaxed));
                self.learn_defaults(&c);
                self.release_now(c, true);
                Ok(())
            }
            Err(e) => {
                self.slot_freed();
                Err(e)
            }
        }
    }
}
