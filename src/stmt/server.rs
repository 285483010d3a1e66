//! Which statements are prepared on one server connection, in LRU order.

use super::Statement;
use super::idmap::IdMap;
use std::sync::Arc;

/// The statements prepared (or being prepared) on one server connection.
#[derive(Debug, Default)]
pub(crate) struct ServerStmts {
    map: IdMap<(Arc<Statement>, u64)>,
    tick: u64,
    /// Tick at which the current client's link began: statements used since then are not
    /// evicted (a Close would also close portals built from them).
    pinned_from: u64,
    /// Who owns the server's unnamed statement: (client id, that client's Parse sequence).
    pub(crate) unnamed_owner: Option<(u64, u64)>,
    /// Which of the pooler's savepoint-guard statements are prepared here (bits of
    /// `session::stmts::guard::GuardCmd`).
    pub(crate) guard: u8,
}

impl ServerStmts {
    /// True if `s` is prepared here (or its Parse is on the way).
    #[inline]
    pub(crate) fn has(&self, s: &Statement) -> bool {
        self.map.contains_key(&s.id)
    }
    /// Marks `s` used now.
    #[inline]
    pub(crate) fn touch(&mut self, s: &Statement) {
        self.tick += 1;
        if let Some(e) = self.map.get_mut(&s.id) {
            e.1 = self.tick;
        }
    }
    /// Records `s` as prepared here.
    pub(crate) fn insert(&mut self, s: &Arc<Statement>) {
        self.tick += 1;
        self.map.insert(s.id, (s.clone(), self.tick));
    }
    /// Forgets `s` (its Parse failed or was skipped, or it was closed).
    pub(crate) fn remove(&mut self, s: &Statement) {
        self.map.remove(&s.id);
    }
    /// Forgets everything (the server lost its statements).
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.unnamed_owner = None;
        self.guard = 0;
    }
    /// A new client is linked: nothing it uses from now on may be evicted.
    pub(crate) fn begin_link(&mut self) {
        self.tick += 1;
        self.pinned_from = self.tick;
    }
    /// Number prepared.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
    /// The statement to close to make room, when at `cap`: stale ones first, then the least
    /// recently used one not used by the current client. None when under cap or all pinned.
    pub(crate) fn evict_candidate(&self, cap: usize) -> Option<Arc<Statement>> {
        if self.map.len() < cap {
            return None;
        }
        if let Some((s, _)) =
            self.map.values().find(|(s, t)| *t < self.pinned_from && s.stale.load(std::sync::atomic::Ordering::Relaxed))
        {
            return Some(s.clone());
        }
        self.map.values().filter(|(_, t)| *t < self.pinned_from).min_by_key(|(_, t)| *t).map(|(s, _)| s.clone())
    }
}
