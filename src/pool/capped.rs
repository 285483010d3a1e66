//! A pool's side of the limits across pools (`limit`) and of its reserve: the lock that
//! gives cap slots back once released, taking a slot of each cap for a new connection,
//! evicting another pool's idle connection when a cap is full, opening the reserve
//! (`reserve_pool_size`) for clients that waited `reserve_pool_timeout`, and what a cap
//! asks of its pools (`limit::Member`).

use super::conn::{Connector, Pooled};
use super::queue::{Handoff, Waiter};
use super::{Inner, Pool, limit};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A pool's lock: when released, the cap slots of the connections closed under it go
/// back (`limit::Cap::give_back`, which may wake other pools' clients: never under a
/// pool's lock).
pub(super) struct Locked<'a, K: Connector> {
    pub(super) pool: &'a Pool<K>,
    pub(super) g: Option<std::sync::MutexGuard<'a, Inner<K>>>,
}

impl<K: Connector> std::ops::Deref for Locked<'_, K> {
    type Target = Inner<K>;
    fn deref(&self) -> &Inner<K> {
        self.g.as_deref().expect("held until dropped")
    }
}

impl<K: Connector> std::ops::DerefMut for Locked<'_, K> {
    fn deref_mut(&mut self) -> &mut Inner<K> {
        self.g.as_deref_mut().expect("held until dropped")
    }
}

impl<K: Connector> Drop for Locked<'_, K> {
    fn drop(&mut self) {
        let Some(mut g) = self.g.take() else { return };
        let freed = std::mem::take(&mut g.freed);
        let rewake = std::mem::take(&mut g.rewake);
        drop(g);
        if freed == 0 && !rewake {
            return;
        }
        for c in &self.pool.caps {
            if freed > 0 {
                c.give_back(freed);
            } else if rewake {
                c.rewake();
            }
        }
    }
}

impl<K: Connector> Pool<K> {
    /// Counts its server connections in `caps` (enroll it there once it is in an `Arc`:
    /// `limit::Caps::enroll`).
    pub(crate) fn with_caps(mut self, caps: Vec<Arc<limit::Cap>>) -> Pool<K> {
        self.caps = caps;
        self
    }

    /// Counts its clients in `caps` (its database's and its clients' user's: `seat_client`).
    pub(crate) fn with_client_caps(mut self, caps: Vec<Arc<limit::Cap>>) -> Pool<K> {
        self.client_caps = caps;
        self
    }

    /// Counts a client of it in its database's and its user's client counts, or names the
    /// limit that refuses it (`max_db_client_connections`, `max_user_client_connections`).
    pub(crate) fn seat_client(&self) -> Result<(), &'static str> {
        const KEYS: [&str; 2] = ["max_db_client_connections", "max_user_client_connections"];
        for (i, c) in self.client_caps.iter().enumerate() {
            if !c.try_seat() {
                self.client_caps[..i].iter().for_each(|c| c.unseat());
                return Err(KEYS.get(i).copied().unwrap_or(KEYS[0]));
            }
        }
        Ok(())
    }

    /// The caps its clients count in.
    pub(crate) fn client_caps(&self) -> &[Arc<limit::Cap>] {
        &self.client_caps
    }

    /// A client counted by `seat_client` left.
    pub(crate) fn unseat_client(&self) {
        self.client_caps.iter().for_each(|c| c.unseat());
    }

    /// The caps its connections count in.
    pub(crate) fn caps(&self) -> &[Arc<limit::Cap>] {
        &self.caps
    }

    /// Connections allowed beyond its size once a client waited `reserve_pool_timeout`.
    pub(crate) fn reserve(&self) -> usize {
        self.reserve.load(Ordering::Relaxed)
    }

    /// A new `reserve_pool_size` (at creation and on reload).
    pub(crate) fn set_reserve(&self, n: usize) {
        self.reserve.store(n, Ordering::Relaxed);
    }

    /// Whether it may open one more connection of its own (its size, or its reserve while
    /// a client has waited long enough); the caps are asked separately.
    pub(super) fn has_room(&self, g: &Inner<K>) -> bool {
        g.open < self.size() || (g.reserve_open && g.open < self.size() + self.reserve())
    }

    /// Takes a slot in each of its caps, or none (false).
    pub(super) fn take_caps(&self, g: &mut Inner<K>) -> bool {
        if !self.caps.iter().all(|c| c.has_room()) {
            return false;
        }
        for (i, c) in self.caps.iter().enumerate() {
            if !c.try_take() {
                for c in &self.caps[..i] {
                    c.untake();
                }
                g.rewake = true;
                return false;
            }
        }
        true
    }

    /// A connection went idle: if a cap of it is full and another pool under it has a
    /// client waiting with room of its own, the longest-idle connection goes to make room.
    pub(super) fn offer_idle(&self) {
        for c in &self.caps {
            if !c.has_room() {
                c.evict_if_wanted();
            }
        }
    }

    /// Its caps are full: close the longest-idle connection of another pool under each
    /// full one (never called under the pool's lock).
    pub(super) fn evict_for_room(&self) {
        for c in &self.caps {
            if !c.has_room() {
                c.evict();
            }
        }
    }

    /// See `expire_waiters`.
    pub(super) fn open_reserve(&self, g: &mut Inner<K>, now: Instant) {
        let after = self.cfg.load().reserve_pool_timeout();
        let (reserve, size) = (self.reserve(), self.size());
        let long = |w: &Waiter<K>| after.is_some_and(|a| now.duration_since(w.since) >= a);
        g.reserve_open = reserve > 0 && g.waiters.front().is_some_and(long);
        if !g.reserve_open || self.is_paused() {
            return;
        }
        let mut free = (size + reserve).saturating_sub(g.open.max(size));
        while free > 0 && g.waiters.front().is_some_and(long) {
            let Some(w) = g.waiters.pop_front() else { break };
            if w.tx.send(Handoff::SlotFreed).is_ok() {
                tracing::warn!(db = %self.key.db, user = %self.key.user, "taking connection from reserve_pool");
                free -= 1;
            }
        }
    }
}

impl<K: Connector> limit::Member for Pool<K> {
    fn cap_freed(&self) -> bool {
        let mut g = self.lock();
        if self.is_paused() || !self.has_room(&g) {
            return false;
        }
        while let Some(w) = g.waiters.pop_front() {
            if w.tx.send(Handoff::SlotFreed).is_ok() {
                return true;
            }
        }
        false
    }

    fn wants_slot(&self) -> bool {
        let g = self.lock();
        !self.is_paused() && self.has_room(&g) && g.waiters.iter().any(|w| !w.tx.is_closed())
    }

    fn oldest_idle(&self) -> Option<Instant> {
        self.lock().idle.iter().map(|c| c.last_used()).min()
    }

    fn evict_idle(&self) -> bool {
        let mut g = self.lock();
        let Some(i) = g.idle.iter().enumerate().min_by_key(|(_, c)| c.last_used()).map(|(i, _)| i) else {
            return false;
        };
        let c = g.idle.remove(i);
        g.close_slots(1);
        drop(g);
        tracing::debug!(db = %self.key.db, user = %self.key.user, "idle server connection evicted to make room");
        drop(c);
        true
    }
}
