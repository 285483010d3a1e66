//! Limits across pools, PgBouncer's: server connections per database
//! (`max_db_connections`) and per user (`max_user_connections`), and client connections
//! per database and per user (`max_db_client_connections`, `max_user_client_connections`).
//!
//! One `Cap` per database name (the name clients use) and one per user name (the user a
//! pool's server connections log in as), shared by every pool under it (`Caps`). A pool
//! takes a slot of each of its caps for every server connection it opens and gives it back
//! when the connection closes. A pool that has room of its own but finds a cap full
//! queues its client as it would for a full pool, and closes the longest-idle connection of
//! another pool under that cap to make room (PgBouncer's eviction); a slot given back
//! wakes a waiting client of one of the cap's pools (in turn, so none starves).
//!
//! Lock order: a pool's lock, then a cap's member list; a cap never calls into a pool
//! while holding its list, and a pool gives slots back only after unlocking itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// What a cap asks of the pools under it.
pub(crate) trait Member: Send + Sync {
    /// A slot of a cap it is under was given back: wake one of its queued clients if it
    /// has room of its own for one more connection. True when one was woken.
    fn cap_freed(&self) -> bool;
    /// It has a queued client and room of its own: only a cap keeps it from connecting.
    fn wants_slot(&self) -> bool;
    /// When its longest-idle connection was last given back, if it has an idle one.
    fn oldest_idle(&self) -> Option<Instant>;
    /// Closes its longest-idle connection (to make room in a full cap). True when closed.
    fn evict_idle(&self) -> bool;
}

/// The limits of one database or one user, and its counts.
#[derive(Default)]
pub(crate) struct Cap {
    /// Server connections allowed at once (0: no limit).
    max: AtomicUsize,
    /// Server connections open or being opened.
    open: AtomicUsize,
    /// Client connections allowed at once (0: no limit).
    max_clients: AtomicUsize,
    /// Client connections logged in.
    clients: AtomicUsize,
    /// The pools under it.
    members: Mutex<Vec<Weak<dyn Member>>>,
    /// Where the next wake-up starts among the members (turns, so no pool starves).
    turn: AtomicUsize,
}

impl std::fmt::Debug for Cap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cap").field("max", &self.max()).field("open", &self.open()).finish()
    }
}

impl Cap {
    /// Server connections allowed (0: no limit).
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
    /// Server connections open or being opened.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
    /// Client connections allowed (0: no limit).
    pub(crate) fn max_clients(&self) -> usize {
        self.max_clients.load(Ordering::Relaxed)
    }
    /// Client connections counted now.
    pub(crate) fn clients(&self) -> usize {
        self.clients.load(Ordering::SeqCst)
    }

    /// New limits (a reload): a higher server limit wakes as many waiting clients as it
    /// adds slots.
    pub(crate) fn set_limits(&self, max: usize, max_clients: usize) {
        self.max_clients.store(max_clients, Ordering::Relaxed);
        let old = self.max.swap(max, Ordering::SeqCst);
        if old != 0 && (max == 0 || max > old) {
            let more = if max == 0 { usize::MAX } else { max - old };
            for _ in 0..more {
                if !self.wake() {
                    break;
                }
            }
        }
    }

    /// Whether one more server connection fits now.
    pub(crate) fn has_room(&self) -> bool {
        let max = self.max();
        max == 0 || self.open() < max
    }

    /// Takes a server connection slot, if one is free.
    pub(crate) fn try_take(&self) -> bool {
        let max = self.max();
        self.open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (max == 0 || n < max).then_some(n + 1)).is_ok()
    }

    /// Gives back a slot just taken, waking nobody (the caller's lock is held: it calls
    /// `rewake` once it is released).
    pub(crate) fn untake(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    /// After an `untake`: wakes a waiting client of a member, which may fit now.
    pub(crate) fn rewake(&self) {
        if self.max() > 0 {
            self.wake();
        }
    }

    /// Gives `n` server connection slots back; with a limit, wakes a waiting client of a
    /// member for each.
    pub(crate) fn give_back(&self, n: usize) {
        self.open.fetch_sub(n, Ordering::SeqCst);
        if self.max() == 0 {
            return;
        }
        for _ in 0..n {
            if !self.wake() {
                break;
            }
        }
    }

    /// The live members, starting at the next one's turn.
    fn members(&self) -> Vec<Arc<dyn Member>> {
        let mut g = self.members.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|m| m.strong_count() > 0);
        let mut v: Vec<Arc<dyn Member>> = g.iter().filter_map(Weak::upgrade).collect();
        drop(g);
        if !v.is_empty() {
            let start = self.turn.fetch_add(1, Ordering::Relaxed) % v.len();
            v.rotate_left(start);
        }
        v
    }

    /// Wakes one waiting client of a member that has room of its own. True when one was.
    fn wake(&self) -> bool {
        self.members().iter().any(|m| m.cap_freed())
    }

    /// Closes the longest-idle connection among the members (PgBouncer evicts to make
    /// room in a full database or user). True when one was closed (its slot is back).
    pub(crate) fn evict(&self) -> bool {
        let oldest = self.members().into_iter().filter_map(|m| m.oldest_idle().map(|t| (t, m))).min_by_key(|(t, _)| *t);
        oldest.is_some_and(|(_, m)| m.evict_idle())
    }

    /// Full, and a member waits for a slot: evicts the longest-idle connection.
    pub(crate) fn evict_if_wanted(&self) {
        if self.max() > 0 && !self.has_room() && self.members().iter().any(|m| m.wants_slot()) {
            self.evict();
        }
    }

    /// Counts a client in, unless the client limit is reached (false).
    pub(crate) fn try_seat(&self) -> bool {
        let max = self.max_clients();
        self.clients
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (max == 0 || n < max).then_some(n + 1))
            .is_ok()
    }

    /// Counts a client out.
    pub(crate) fn unseat(&self) {
        self.clients.fetch_sub(1, Ordering::SeqCst);
    }

    fn enroll(&self, m: Weak<dyn Member>) {
        self.members.lock().unwrap_or_else(|e| e.into_inner()).push(m);
    }

    /// Nothing refers to it but the registry, and it counts nothing.
    fn unused(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1 && self.open() == 0 && self.clients() == 0
    }
}

/// Every database's and user's cap, made on first use.
#[derive(Debug, Default)]
pub(crate) struct Caps {
    dbs: Mutex<HashMap<String, Arc<Cap>>>,
    users: Mutex<HashMap<String, Arc<Cap>>>,
}

fn get(map: &Mutex<HashMap<String, Arc<Cap>>>, name: &str, limits: (usize, usize)) -> Arc<Cap> {
    let mut g = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = g.get(name) {
        return c.clone();
    }
    let c = Arc::new(Cap::default());
    c.max.store(limits.0, Ordering::Relaxed);
    c.max_clients.store(limits.1, Ordering::Relaxed);
    g.insert(name.to_owned(), c.clone());
    c
}

impl Caps {
    /// The cap of database `name` (limits used if it is new: server, client).
    pub(crate) fn db(&self, name: &str, limits: (usize, usize)) -> Arc<Cap> {
        get(&self.dbs, name, limits)
    }
    /// The cap of user `name` (limits used if it is new: server, client).
    pub(crate) fn user(&self, name: &str, limits: (usize, usize)) -> Arc<Cap> {
        get(&self.users, name, limits)
    }
    /// The cap of database `name`, if one was made.
    pub(crate) fn db_if_any(&self, name: &str) -> Option<Arc<Cap>> {
        self.dbs.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }
    /// The cap of user `name`, if one was made.
    pub(crate) fn user_if_any(&self, name: &str) -> Option<Arc<Cap>> {
        self.users.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    /// Puts `member` under `caps` (its server connections count in each).
    pub(crate) fn enroll(member: Weak<dyn Member>, caps: &[Arc<Cap>]) {
        for c in caps {
            c.enroll(member.clone());
        }
    }

    /// A reload: each cap's new limits, by database and by user name.
    pub(crate) fn set_limits(&self, db: impl Fn(&str) -> (usize, usize), user: impl Fn(&str) -> (usize, usize)) {
        let dbs: Vec<_> =
            self.dbs.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(n, c)| (n.clone(), c.clone())).collect();
        for (n, c) in dbs {
            let (m, mc) = db(&n);
            c.set_limits(m, mc);
        }
        let users: Vec<_> =
            self.users.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(n, c)| (n.clone(), c.clone())).collect();
        for (n, c) in users {
            let (m, mc) = user(&n);
            c.set_limits(m, mc);
        }
    }

    /// Forgets the caps nothing refers to and that count nothing (the janitor): names of
    /// databases and users that come and go do not grow memory.
    pub(crate) fn prune(&self) {
        self.dbs.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, c| !c.unused());
        self.users.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, c| !c.unused());
    }
}
