//! The per-pool statement registry: key → statement with a unique server name.

use crate::protocol::frontend;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The random part of every server statement name of this process.
fn name_salt() -> u32 {
    static SALT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SALT.get_or_init(rand::random)
}

/// Limits and the promotion threshold.
#[derive(Clone, Debug)]
pub struct StmtConfig {
    /// Statements kept prepared on one server connection (LRU beyond).
    pub(crate) server_cap: usize,
    /// Statements one client may hold; one more gets 54000.
    pub(crate) client_cap: usize,
    /// Statements the registry of one pool keeps; unreferenced ones are dropped beyond.
    pub(crate) registry_cap: usize,
    /// Unnamed statements seen this many times become cached named server statements (0: never).
    pub(crate) promote_unnamed_after: u32,
    /// Statement Describes may be answered from the cache (`session::stmts::portal`).
    pub(crate) describe_from_cache: bool,
    /// Simple-protocol data statements have their numeric literals lifted into parameters
    /// and run as cached statements (`session::stmts::autoprepare`).
    pub(crate) autoprepare: bool,
    /// Sightings of a lifted text before it is cached (like `promote_unnamed_after`).
    pub(crate) autoprepare_after: u32,
    /// The plan guard of promoted and autoprepared texts (`super::guard`).
    pub(crate) guard: super::guard::GuardConfig,
}

impl Default for StmtConfig {
    fn default() -> Self {
        StmtConfig {
            server_cap: 500,
            client_cap: 10_000,
            registry_cap: 100_000,
            promote_unnamed_after: 3,
            describe_from_cache: false,
            autoprepare: false,
            autoprepare_after: 3,
            // Off here (the unit tests' default: promotion stays deterministic); the
            // configuration's default turns it on (`config::Config::stmt_config`).
            guard: super::guard::GuardConfig { sample_one_in: 0, ..Default::default() },
        }
    }
}

/// How a statement is created on a server.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StmtKind {
    /// A protocol-level Parse.
    Protocol,
    /// SQL `PREPARE <server name> (types) AS …`, executed through the unnamed statement.
    Sql,
}

/// One cached statement, shared by every client that prepared the same key.
#[derive(Debug)]
pub struct Statement {
    /// Unique id.
    pub(crate) id: u64,
    /// Name on servers.
    pub(crate) server_name: Box<str>,
    /// The SQL text (for SQL-kind statements: the PREPARE statement text).
    pub(crate) query: Box<[u8]>,
    /// How it is created.
    pub(crate) kind: StmtKind,
    /// The frames that create it on a server (a Parse; or Parse/Bind/Execute of a PREPARE).
    pub(crate) create: Bytes,
    /// Some server accepted it (ParseComplete seen): a client Parse can be answered locally.
    pub(crate) validated: AtomicBool,
    /// A server said its plan changed result type: the registry no longer hands it out.
    pub(crate) stale: AtomicBool,
    /// The RowDescription (or NoData) frame a Describe of it returned: what clients that
    /// described it decode rows by.
    pub(crate) shape: std::sync::OnceLock<Box<[u8]>>,
    /// What a server answered to a Describe of it (ParameterDescription, then
    /// RowDescription or NoData), the same for every server of the pool: a later Describe
    /// is answered from it while no schema change may have happened since (`desc_epoch`).
    pub(crate) desc: std::sync::OnceLock<Box<[u8]>>,
    /// The shape epoch (`super::epoch`) at which a server last confirmed `desc`; 0: never.
    pub(crate) desc_epoch: AtomicU64,
    /// Whether its text is one plain read (`sql::is_plain_read`), worked out on first
    /// need (`session::pipeline`).
    pub(crate) plain_read: super::memo::OnceBool,
    /// What a Bind of it must watch for in its text, worked out on first need by the
    /// session (`session::stmts::bind_text`).
    pub(crate) bind_watch: super::memo::OnceBindWatch,
    /// How long batches using it recently took on a server.
    pub(crate) runs: super::RunTime,
    /// What its executions came to (`super::stats`).
    pub(crate) exec: super::stats::ExecStats,
    /// The plan guard, once it was promoted from an unnamed statement or autoprepared.
    pub(crate) guard: std::sync::OnceLock<Box<GuardCell>>,
    /// Its registry key and parameter types, to make a new generation.
    key: Box<[u8]>,
    types: Box<[u8]>,
    /// The shape epoch when it was made: a server infers the types of parameters a Parse
    /// leaves unspecified from the schema of that moment (`infers_stale_types`).
    born_epoch: u64,
}

/// A statement's plan guard (`super::guard`), shared by every session: the decision behind
/// a mutex that sessions only `try_lock` (a sample recorded while another thread holds it
/// is dropped), and what sessions read on every execution as atomics.
#[derive(Debug)]
pub(crate) struct GuardCell {
    pub(crate) guard: Mutex<super::guard::Guard>,
    /// `Guard::one_in` as of the last execution recorded.
    pub(crate) one_in: AtomicU32,
    /// Executions chosen for so far (the sampling hash's input).
    pub(crate) seq: AtomicU64,
    /// As-sent executions that may still be chosen for the probe running (u32::MAX: none
    /// runs, no limit). A probe samples one execution in two until its samples are
    /// recorded; with a thousand clients queued for a server, that is every other
    /// execution of all of them for as long as the queue takes to drain (as-sent ones
    /// cannot be pipelined, and plan each time): throughput fell to a third for 200 ms
    /// every second or two. Counting choices, not results, bounds a probe to what it
    /// needs.
    probe_quota: AtomicU32,
    /// `Guard::probe`'s count of arms when `probe_quota` was last set.
    probe_arms: AtomicU32,
    /// `Guard::steady_one_in` as of the last execution recorded (0: None). While the text
    /// is young, sampling thins out with executions *chosen* (`seq`), not only those
    /// recorded: with a queue of clients, recording lags choosing by the queue's length,
    /// and a rate that followed the records alone stayed at one in two for all of it.
    steady: AtomicU32,
}

impl GuardCell {
    pub(crate) fn new(g: super::guard::Guard) -> GuardCell {
        let (arms, left) = g.probe();
        GuardCell {
            one_in: AtomicU32::new(g.one_in()),
            seq: AtomicU64::new(0),
            probe_quota: AtomicU32::new(if left == 0 { u32::MAX } else { left }),
            probe_arms: AtomicU32::new(arms),
            steady: AtomicU32::new(g.steady_one_in().unwrap_or(0)),
            guard: Mutex::new(g),
        }
    }

    /// Whether the next execution runs as the client sent it.
    #[inline]
    pub(crate) fn as_sent(&self, id: u64) -> bool {
        let mut one_in = self.one_in.load(Ordering::Relaxed);
        if one_in == 1 {
            return true;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let steady = self.steady.load(Ordering::Relaxed);
        if steady > one_in {
            one_in = one_in.max(super::guard::young_one_in(seq, steady));
        }
        super::guard::sampled(id, seq, one_in)
            && self
                .probe_quota
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| match q {
                    u32::MAX => Some(q),
                    0 => None,
                    n => Some(n - 1),
                })
                .is_ok()
    }

    /// Records an execution; what it changed, if anything (None also when another thread
    /// was recording).
    pub(crate) fn record(&self, cached: bool, us: u64) -> Option<super::guard::Verdict> {
        let mut g = self.guard.try_lock().ok()?;
        let v = g.record(cached, us);
        self.one_in.store(g.one_in(), Ordering::Relaxed);
        self.steady.store(g.steady_one_in().unwrap_or(0), Ordering::Relaxed);
        self.note_probe(&g);
        v
    }

    /// Sets `probe_quota` from the guard: no limit once its probe is over, what the probe
    /// wants when it was (re)armed.
    fn note_probe(&self, g: &super::guard::Guard) {
        let (arms, left) = g.probe();
        if left == 0 {
            self.probe_quota.store(u32::MAX, Ordering::Relaxed);
        } else if arms != self.probe_arms.load(Ordering::Relaxed) {
            self.probe_arms.store(arms, Ordering::Relaxed);
            self.probe_quota.store(left, Ordering::Relaxed);
        }
    }

    /// While demoted: the (cached µs, as-sent µs) that demoted it; and the mean times over
    /// the guard's window now.
    pub(crate) fn state(&self) -> (Option<(u64, u64)>, (u64, u64)) {
        let g = self.guard.lock().unwrap_or_else(|e| e.into_inner());
        (g.demotion(), g.means())
    }
}

/// Statements are the same when they are the same server statement.
impl PartialEq for Statement {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for Statement {}

impl Statement {
    /// Whether this statement is the one `make_key` built `key` for (same text, parameter
    /// types and search_path).
    pub(crate) fn has_key(&self, key: &[u8]) -> bool {
        *self.key == *key
    }

    fn new(key: &[u8], kind: StmtKind, query: &[u8], types: &[u8]) -> Statement {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // A process-random part: a client cannot guess the names of the cache's statements
        // and PREPARE or DEALLOCATE one of them behind parsnip's back (issue 23).
        let server_name: Box<str> = format!("pn_{:08x}_{id}", name_salt()).into();
        let mut create = BytesMut::with_capacity(query.len() + types.len() + 32);
        match kind {
            StmtKind::Protocol => frontend::parse(&mut create, server_name.as_bytes(), query, types),
            StmtKind::Sql => {
                // `query` is "(types) AS statement" or "AS statement": PREPARE it under our name.
                let mut sql = Vec::with_capacity(query.len() + 32);
                sql.extend_from_slice(b"PREPARE ");
                sql.extend_from_slice(server_name.as_bytes());
                sql.push(b' ');
                sql.extend_from_slice(query);
                frontend::parse(&mut create, b"", &sql, &[]);
                frontend::bind_no_params(&mut create, b"", b"");
                frontend::execute(&mut create, b"");
            }
        }
        Statement {
            id,
            server_name,
            query: query.into(),
            kind,
            create: create.freeze(),
            validated: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            shape: std::sync::OnceLock::new(),
            desc: std::sync::OnceLock::new(),
            desc_epoch: AtomicU64::new(0),
            plain_read: Default::default(),
            bind_watch: Default::default(),
            runs: Default::default(),
            exec: Default::default(),
            guard: std::sync::OnceLock::new(),
            key: key.into(),
            types: types.into(),
            born_epoch: super::epoch::current(),
        }
    }

    /// The parameter type OIDs its Parse declared (4 bytes each, big-endian).
    pub(crate) fn param_types(&self) -> &[u8] {
        &self.types
    }

    /// A client's fresh Parse must not be answered by it: some parameter type was left to
    /// the server to infer (none given, or 0), and the schema may have changed since it was
    /// made. PostgreSQL keeps a statement's inferred types through later DDL (it re-plans,
    /// but does not re-infer), so a statement parsed before `DROP TABLE t; CREATE TABLE t`
    /// with other column types would take the old types where a fresh Parse gets the new.
    pub(crate) fn infers_stale_types(&self) -> bool {
        let inferred = self.kind == StmtKind::Protocol
            && self.query.contains(&b'$')
            && (self.types.is_empty() || self.types.chunks(4).any(|t| t == [0, 0, 0, 0]));
        inferred && self.born_epoch != super::epoch::current()
    }

    /// Its description, if a server confirmed it since the last possible schema change
    /// (`super::epoch`) and it is not stale: what a Describe of it would answer now.
    pub(crate) fn known_description(&self) -> Option<&[u8]> {
        let desc = self.desc.get()?;
        let current = self.desc_epoch.load(Ordering::Acquire) == super::epoch::current();
        (current && !self.stale.load(Ordering::Relaxed)).then_some(&**desc)
    }

    /// A server answered a Describe of it sent at shape epoch `epoch` with `desc`.
    pub(crate) fn confirm_description(&self, desc: &[u8], epoch: u64) {
        if **self.desc.get_or_init(|| desc.into()) == *desc {
            self.desc_epoch.fetch_max(epoch, Ordering::AcqRel);
        }
    }

    /// Its plan guard, made now if it has none (it was just promoted or autoprepared), if
    /// the pool guards plans and its text has parameters: without any, PostgreSQL has one
    /// plan for it, cached or not (and BEGIN, SET and the like are not planned at all).
    pub(crate) fn guard(&self, cfg: &StmtConfig) -> Option<&GuardCell> {
        if cfg.guard.sample_one_in == 0 || (self.guard.get().is_none() && !self.query.contains(&b'$')) {
            return None;
        }
        Some(self.guard.get_or_init(|| Box::new(GuardCell::new(super::guard::Guard::new(cfg.guard)))))
    }

    /// True once a server accepted it and it is not stale.
    #[inline]
    pub(crate) fn is_valid(&self) -> bool {
        self.validated.load(Ordering::Relaxed) && !self.stale.load(Ordering::Relaxed)
    }
}

/// Cache counters (per pool), readable without locks.
#[derive(Debug, Default)]
pub struct StmtStats {
    /// Parse messages from clients.
    pub(crate) client_parses: AtomicU64,
    /// Parses of cached statements that servers completed (one skipped after an earlier
    /// error in its batch never ran, and is not counted).
    pub(crate) server_parses: AtomicU64,
    /// Client Parses answered without a server Parse.
    pub(crate) hits: AtomicU64,
    /// Statements closed on a server to respect its cap.
    pub(crate) evictions: AtomicU64,
    /// Unnamed statements promoted to cached named statements.
    pub(crate) promotions: AtomicU64,
    /// Statements found stale (0A000) or lost by a server (26000) and repaired.
    pub(crate) invalidations: AtomicU64,
    /// Batches re-prepared and retried transparently after 0A000 or 26000.
    pub(crate) retries: AtomicU64,
    /// Describe messages of cached statements answered without a server.
    pub(crate) describes_saved: AtomicU64,
    /// Texts the plan guard demoted (`super::guard`).
    pub(crate) demotions: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Box<[u8]>, Arc<Statement>>,
    unnamed_seen: HashMap<Box<[u8]>, u32>,
}

/// The statements of one pool.
#[derive(Debug)]
pub struct Registry {
    inner: Mutex<Inner>,
    /// How long simple-protocol plain reads of this pool recently took (one figure for all:
    /// their texts differ with every literal).
    pub(crate) simple_reads: super::RunTime,
    /// Limits.
    pub(crate) cfg: StmtConfig,
    /// Counters.
    pub(crate) stats: StmtStats,
    /// Bumped whenever a statement leaves the map or is replaced in it: while it has not
    /// moved, a statement found for a key is still the one the key finds
    /// (`session::stmts::fastbind`).
    changes: AtomicU64,
}

/// Builds a registry key into `out`: kind, search_path context, text and type OIDs.
pub(crate) fn make_key(out: &mut Vec<u8>, kind: &StmtKind, search_path: &[u8], query: &[u8], types: &[u8]) {
    out.clear();
    out.push(if *kind == StmtKind::Protocol { b'P' } else { b'S' });
    out.extend_from_slice(&(search_path.len() as u32).to_le_bytes());
    out.extend_from_slice(search_path);
    out.extend_from_slice(&(types.len() as u32).to_le_bytes());
    out.extend_from_slice(types);
    out.extend_from_slice(query);
}

impl Registry {
    /// An empty registry.
    pub fn new(cfg: StmtConfig) -> Registry {
        Registry {
            inner: Mutex::new(Inner::default()),
            simple_reads: Default::default(),
            cfg,
            stats: StmtStats::default(),
            changes: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The statement for `key`, created if new (or if the known one went stale).
    pub(crate) fn get_or_insert(&self, key: &[u8], kind: StmtKind, query: &[u8], types: &[u8]) -> Arc<Statement> {
        self.lookup(key, kind, query, types, false)
    }

    /// The statement that answers a client's Parse of `key`: as `get_or_insert`, but a new
    /// generation when the known one's inferred parameter types may be out of date
    /// (`Statement::infers_stale_types`). Clients holding the old one keep it.
    pub(crate) fn for_parse(&self, key: &[u8], kind: StmtKind, query: &[u8], types: &[u8]) -> Arc<Statement> {
        self.lookup(key, kind, query, types, true)
    }

    fn lookup(&self, key: &[u8], kind: StmtKind, query: &[u8], types: &[u8], parse: bool) -> Arc<Statement> {
        let mut g = self.lock();
        if let Some(s) = g.map.get(key)
            && !s.stale.load(Ordering::Relaxed)
            && !(parse && s.infers_stale_types())
        {
            return s.clone();
        }
        self.insert_locked(&mut g, key, kind, query, types)
    }

    /// A new statement for `key` in the map whose lock `g` is (a new generation if one was
    /// there).
    fn insert_locked(&self, g: &mut Inner, key: &[u8], kind: StmtKind, query: &[u8], types: &[u8]) -> Arc<Statement> {
        if g.map.len() >= self.cfg.registry_cap {
            g.map.retain(|_, s| Arc::strong_count(s) > 1);
            self.changes.fetch_add(1, Ordering::Release);
        }
        let s = Arc::new(Statement::new(key, kind, query, types));
        if g.map.insert(key.into(), s.clone()).is_some() {
            self.changes.fetch_add(1, Ordering::Release);
        }
        s
    }

    /// The statement an unnamed Parse of `key` is served by now, when the registry holds
    /// one (what `promote_unnamed` hands out, without counting a sighting): None when it
    /// holds none, or only a stale one, or one whose inferred parameter types may be out of
    /// date (`for_parse` would make a new generation).
    /// Also the value of `changes` it was found at.
    pub(crate) fn cached_for_parse(&self, key: &[u8]) -> Option<(Arc<Statement>, u64)> {
        let g = self.lock();
        let s = g.map.get(key)?;
        (!s.stale.load(Ordering::Relaxed) && !s.infers_stale_types()).then(|| (s.clone(), self.changes()))
    }

    /// The current generation of `s`'s key (a new statement if `s` went stale).
    pub(crate) fn current(&self, s: &Statement) -> Arc<Statement> {
        let kind = if s.kind == StmtKind::Protocol { StmtKind::Protocol } else { StmtKind::Sql };
        self.get_or_insert(&s.key, kind, &s.query, &s.types)
    }

    /// Counts a sighting of the unnamed statement `key` against the threshold `n`
    /// (`promote_unnamed_after`, or `autoprepare_after` for an autoprepared Query's) and
    /// returns the statement that serves it from now: the one known (a new generation where
    /// `for_parse` would make one), or a new one once seen `n` times. None before that, and
    /// always with `n` = 0. One lock and one lookup: it runs for every unnamed Parse of a
    /// client whose last one differs.
    pub(crate) fn promote_unnamed(&self, key: &[u8], n: u32, query: &[u8], types: &[u8]) -> Option<Arc<Statement>> {
        if n == 0 {
            return None;
        }
        let mut g = self.lock();
        match g.map.get(key).filter(|s| !s.stale.load(Ordering::Relaxed)) {
            Some(s) if !s.infers_stale_types() => return Some(s.clone()),
            Some(_) => {}
            None => {
                if g.unnamed_seen.len() >= self.cfg.registry_cap {
                    g.unnamed_seen.clear();
                }
                let c = g.unnamed_seen.entry(key.into()).or_insert(0);
                *c += 1;
                if *c < n {
                    return None;
                }
                g.unnamed_seen.remove(key);
                self.stats.promotions.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(self.insert_locked(&mut g, key, StmtKind::Protocol, query, types))
    }

    /// A statement failed to parse: forget it so a later Parse starts afresh.
    pub(crate) fn forget_invalid(&self, s: &Arc<Statement>) {
        if s.validated.load(Ordering::Relaxed) {
            return;
        }
        self.lock().map.retain(|_, v| !Arc::ptr_eq(v, s));
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// A server reported that `s`'s plan changed result type: new Parses get a new statement.
    pub(crate) fn mark_stale(&self, s: &Arc<Statement>) {
        if !s.stale.swap(true, Ordering::Relaxed) {
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
            self.lock().map.retain(|_, v| !Arc::ptr_eq(v, s));
            self.changes.fetch_add(1, Ordering::Release);
        }
    }

    /// See the field `changes`.
    #[inline]
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Number of statements known.
    pub(crate) fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// The statements, for the console and the metrics.
    pub(crate) fn statements(&self) -> Vec<Arc<Statement>> {
        self.lock().map.values().cloned().collect()
    }

    /// A snapshot of the statements: (server name, query text, clients+servers holding it).
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Vec<(String, String, usize)> {
        let g = self.lock();
        let mut v: Vec<_> = g
            .map
            .values()
            .map(|s| {
                (s.server_name.to_string(), String::from_utf8_lossy(&s.query).into_owned(), Arc::strong_count(s) - 1)
            })
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_statement_and_types_matter() {
        let r = Registry::new(StmtConfig::default());
        let mut k1 = Vec::new();
        let mut k2 = Vec::new();
        make_key(&mut k1, &StmtKind::Protocol, b"", b"select $1", &[0, 0, 0, 23]);
        make_key(&mut k2, &StmtKind::Protocol, b"", b"select $1", &[0, 0, 0, 20]);
        let a = r.get_or_insert(&k1, StmtKind::Protocol, b"select $1", &[0, 0, 0, 23]);
        let b = r.get_or_insert(&k1, StmtKind::Protocol, b"select $1", &[0, 0, 0, 23]);
        let c = r.get_or_insert(&k2, StmtKind::Protocol, b"select $1", &[0, 0, 0, 20]);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_ne!(a.server_name, c.server_name);
        r.mark_stale(&a);
        let d = r.get_or_insert(&k1, StmtKind::Protocol, b"select $1", &[0, 0, 0, 23]);
        assert!(!Arc::ptr_eq(&a, &d), "a stale statement is replaced by a new generation");
    }

    #[test]
    fn promotion_after_n_sightings() {
        let r = Registry::new(StmtConfig::default());
        let see = |r: &Registry, n| r.promote_unnamed(b"k", n, b"select 1", b"");
        assert!(see(&r, 3).is_none());
        assert!(see(&r, 3).is_none());
        let a = see(&r, 3).expect("promoted at the third sighting");
        assert_eq!(r.stats.promotions.load(Ordering::Relaxed), 1);
        let b = see(&r, 3).expect("known from now");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(r.stats.promotions.load(Ordering::Relaxed), 1, "counted once");
        // Gone stale: counted anew, then a new generation.
        r.mark_stale(&a);
        assert!(see(&r, 2).is_none());
        let c = see(&r, 2).expect("promoted again");
        assert!(!Arc::ptr_eq(&a, &c));
        // Never with a threshold of 0.
        assert!(see(&r, 0).is_none());
        assert!(r.promote_unnamed(b"other", 0, b"x", b"").is_none());
    }

    #[test]
    fn unreferenced_statements_dropped_at_cap() {
        let r = Registry::new(StmtConfig { registry_cap: 2, ..Default::default() });
        let held = r.get_or_insert(b"a", StmtKind::Protocol, b"a", b"");
        drop(r.get_or_insert(b"b", StmtKind::Protocol, b"b", b""));
        drop(r.get_or_insert(b"c", StmtKind::Protocol, b"c", b""));
        assert_eq!(r.len(), 2);
        assert!(r.snapshot().iter().any(|(n, _, _)| *n == *held.server_name));
    }

    /// A probe wants 8 as-sent samples and samples one execution in two until they are
    /// recorded. With clients queued for a server, many executions are chosen before the
    /// first sample comes back: no more than the probe wants may be chosen meanwhile.
    #[test]
    fn a_probe_chooses_no_more_as_sent_executions_than_it_wants() {
        let cell = GuardCell::new(super::super::guard::Guard::new(super::super::guard::GuardConfig::default()));
        let (_, wanted) = cell.guard.lock().unwrap().probe();
        assert_eq!(wanted, super::super::guard::PROBE, "a new text starts with a probe");
        // 1,000 queued executions chosen before any has run.
        let chosen = (0..1000).filter(|_| cell.as_sent(7)).count();
        assert_eq!(chosen, wanted as usize, "only what the probe wants");
        // They run: the probe is over, and sampling goes on at the young text's rate.
        for _ in 0..chosen {
            cell.record(false, 500);
        }
        assert_eq!(cell.guard.lock().unwrap().probe().1, 0);
        assert_eq!(cell.probe_quota.load(Ordering::Relaxed), u32::MAX, "no limit between probes");
        assert!((0..1000).any(|_| cell.as_sent(7)), "sampling goes on");
        // A new probe (a shift, a lean, the periodic one) allows its own samples again.
        let mut g = cell.guard.lock().unwrap();
        let arms = g.probe().0;
        while g.probe().0 == arms {
            g.record(true, 400);
        }
        drop(g);
        cell.record(true, 400);
        let left = cell.guard.lock().unwrap().probe().1;
        assert!(left > 0);
        assert_eq!((0..1000).filter(|_| cell.as_sent(7)).count(), left as usize);
    }

    /// After its first probe a text is sampled densely while young: one execution in
    /// executions/8. With clients queued, those executions are chosen long before they are
    /// recorded; the rate thins out with the choices, not only with the records.
    #[test]
    fn a_young_text_thins_its_samples_with_executions_chosen() {
        let cell = GuardCell::new(super::super::guard::Guard::new(super::super::guard::GuardConfig::default()));
        let wanted = cell.guard.lock().unwrap().probe().1 as usize;
        let chosen = (0..wanted * 4).filter(|_| cell.as_sent(7)).count();
        assert_eq!(chosen, wanted);
        // The probe's samples and as many cached executions come back.
        for i in 0..wanted * 4 {
            cell.record(i >= wanted, 500);
        }
        let recorded = cell.guard.lock().unwrap().one_in();
        assert_eq!(recorded, super::super::guard::young_one_in(wanted as u64 * 4, 256), "young, by the records");
        // 1,000 queued executions chosen before any of them has run: by the records alone
        // one in `recorded` (about 250 of them); thinned by the choices, about
        // 8 × ln(1032/32), under 30 (the hash makes it vary a little).
        let as_sent = (0..1000).filter(|_| cell.as_sent(7)).count();
        assert!(as_sent < 60, "{as_sent} of 1,000 queued executions run as sent; one in {recorded} by the records");
        assert!(as_sent > 0, "a young text is still sampled");
    }
}
