//! The client's prepared statements over the shared cache: renaming client statement
//! names to server names, preparing statements on whichever server the client is given
//! (injecting Parse, evicting by Close), answering Parse and Close locally in pipeline
//! order, SQL-level PREPARE / EXECUTE / DEALLOCATE / DISCARD ALL, and the errors
//! PostgreSQL would give (42P05, 26000) without ever disconnecting the client.

use super::guard::GuardCmd;
use super::reply_queue::{ClientFx, Fx, OnReply, Pending, Purpose, Rename, Req, Synth};
use super::{ServerState, Session};
use crate::error::{Error, SqlState};
use crate::protocol::{body, frontend, tags};
use crate::state::TxStatus;
use crate::stmt::registry::{StmtKind, make_key};
use crate::stmt::sql::{Classified, SqlStmt, classify, is_plain_dml, prepare_body, starts_with_deallocate};
use crate::stmt::{Registry, Statement};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Reserved statement name that never exists on a server: a request naming it fails with
/// 26000, which puts the server in the same error state PostgreSQL itself would be in.
const PROBE: &[u8] = b"parsnip_probe";

/// What a statement name in Bind or Describe resolved to.
enum Resolved {
    /// An error was queued instead.
    Failed,
    /// A shape check is outstanding: feed the frame again later.
    Held,
    /// The server's own unnamed statement (passed through).
    Plain,
    /// A cached statement, prepared on the server.
    Cached(Arc<Statement>),
}

/// The client's unnamed statement.
#[derive(Debug, Default)]
pub enum Unnamed {
    /// None (never parsed, closed, or its Parse failed).
    #[default]
    None,
    /// Parsed as an unnamed server statement: the Parse to replay on another server, and
    /// the sequence number that identifies it on the server it was parsed on.
    Plain {
        /// The client's Parse frame.
        frame: Vec<u8>,
        /// This client's Parse sequence.
        seq: u64,
    },
    /// Promoted: served by a cached named server statement.
    Cached(Arc<Statement>),
}

/// What the server runs in place of a client's `DEALLOCATE ALL` sent through the extended
/// protocol: no rows, no effect, the same errors (25P02 in a failed transaction).
const DEALLOCATE_ALL_STANDIN: &[u8] = b"UNLISTEN parsnip_deallocate_all";

fn duplicate(name: &[u8]) -> Error {
    Error::new(
        SqlState::DUPLICATE_PSTATEMENT,
        format!("prepared statement \"{}\" already exists", String::from_utf8_lossy(name)),
    )
}

/// Whether two RowDescription (or NoData) frames describe the same rows for a client:
/// column names, types and type modifiers. The table OID and column number are not
/// compared (a table dropped and re-created the same way has other OIDs).
pub(super) fn same_shape(a: &[u8], b: &[u8]) -> bool {
    fn columns(f: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
        if f.first() != Some(&tags::ROW_DESCRIPTION) {
            return Some(Vec::new());
        }
        let body = f.get(5..)?;
        let n = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
        let mut rest = &body[2..];
        let mut out = Vec::new();
        for _ in 0..n {
            let (name, r) = crate::protocol::read_cstr(rest)?;
            // table oid (4), attnum (2), then type oid (4), typlen (2), typmod (4), format (2):
            // formats follow the Bind, which is the same on every server.
            let fixed = r.get(..18)?;
            out.push((name, &fixed[6..16]));
            rest = &r[18..];
        }
        Some(out)
    }
    a == b || (a.first() == b.first() && matches!((columns(a), columns(b)), (Some(x), Some(y)) if x == y))
}

/// True when the frames hold a Describe of a portal (the client learns the row shape anew).
fn describes_portal(mut frames: &[u8]) -> bool {
    while let Ok(Some(n)) = crate::protocol::split_frame(frames, usize::MAX) {
        if frames[0] == tags::DESCRIBE && frames.get(5) == Some(&b'P') {
            return true;
        }
        frames = &frames[n..];
    }
    false
}

/// Characters (as PostgreSQL counts error positions) in a UTF-8 byte string.
fn char_len(b: &[u8]) -> i64 {
    String::from_utf8_lossy(b).chars().count() as i64
}

/// PostgreSQL's 0A000 for a statement whose result shape changed, with its routine field
/// (drivers recognize the case by it).
fn stale_plan() -> Error {
    let mut e = Error::new(SqlState::FEATURE_NOT_SUPPORTED, "cached plan must not change result type");
    e.routine = Some("RevalidateCachedQuery");
    e
}

fn too_many(cap: usize) -> Error {
    Error::new(SqlState::PROGRAM_LIMIT_EXCEEDED, format!("too many prepared statements for this client (limit {cap})"))
}

fn missing(name: &[u8]) -> Error {
    if name.is_empty() {
        Error::new(SqlState::UNDEFINED_PSTATEMENT, "unnamed prepared statement does not exist")
    } else {
        Error::new(
            SqlState::UNDEFINED_PSTATEMENT,
            format!("prepared statement \"{}\" does not exist", String::from_utf8_lossy(name)),
        )
    }
}

impl Session {
    fn registry(&self) -> &Arc<Registry> {
        self.registry.as_ref().expect("statement handlers run only with a registry")
    }

    fn search_path(&self) -> &[u8] {
        self.settings.extra.iter().find(|(n, _)| n == "search_path").map_or(&[][..], |(_, s)| s.as_bytes())
    }

    /// Fails the current request as PostgreSQL would. Linked: a request that the server
    /// rejects (so its transaction and skip-to-Sync state match), with our error in place
    /// of its. Unlinked (no transaction, nothing outstanding): answered locally.
    fn statement_error(&mut self, err: Error, srv: Option<&mut ServerState>, query: bool) {
        match srv {
            Some(_) if query => {
                frontend::query(&mut self.to_server, "DEALLOCATE parsnip_probe");
                self.replies.push(Pending::with(Req::Query, OnReply::ReplaceError(Box::new(err)), Fx::default()));
            }
            Some(srv) if self.tx_status == TxStatus::Failed => {
                // In a failed transaction PostgreSQL checks that before names: a Parse gets
                // the 25P02 it would give (a Describe would get 26000 first).
                frontend::parse(&mut self.to_server, b"", b"SELECT 1", &[]);
                srv.stmts.unnamed_owner = None;
                self.replies.push(Pending::with(Req::Parse, OnReply::ReplaceError(Box::new(err)), Fx::default()));
            }
            Some(_) => {
                frontend::describe_statement(&mut self.to_server, PROBE);
                self.replies.push(Pending::with(Req::Describe, OnReply::ReplaceError(Box::new(err)), Fx::default()));
            }
            None => {
                err.write_to(&mut self.to_client);
                if query {
                    crate::protocol::backend::ready_for_query(&mut self.to_client, b'I');
                } else {
                    self.skip_until_sync = true;
                }
            }
        }
    }

    /// True when a change to `name` (a Parse registering it, a Close removing it) waits for
    /// its reply in an earlier batch, one that ends with a Sync before now: what PostgreSQL
    /// does with this message depends on whether that change succeeds, so it must wait.
    /// (Within the same batch it need not: if the change fails, the server skips the rest.)
    fn pending_across_sync(&self, name: &[u8]) -> bool {
        let mut pending = false;
        for p in self.replies.iter() {
            match &p.fx.client {
                ClientFx::Named { name: n } | ClientFx::Closed { name: n, .. } if **n == *name => pending = true,
                ClientFx::ClearedAll { .. } => pending = true,
                _ if pending && p.req == Req::Sync && !p.is_synth() => return true,
                _ => {}
            }
        }
        false
    }

    /// True when a Parse or Close of `stmt` on this server waits for its reply in an earlier
    /// batch: whether the statement is there depends on whether that batch fails.
    fn stmt_pending_across_sync(&self, stmt: &Statement) -> bool {
        let mut pending = false;
        for p in self.replies.iter() {
            let touches = p.fx.server_parse.as_deref() == Some(stmt) || p.fx.server_close.as_deref() == Some(stmt);
            if touches {
                pending = true;
            } else if pending && p.req == Req::Sync && !p.is_synth() {
                return true;
            }
        }
        false
    }

    /// A batch ended by Sync (or a Query) is still outstanding.
    fn earlier_batch_in_flight(&self) -> bool {
        // The pooler's own queries (settings replayed at link) run outside any transaction
        // and cannot abort the client's.
        self.replies.iter().any(|p| {
            !p.is_synth() && p.purpose == super::reply_queue::Purpose::Client && matches!(p.req, Req::Sync | Req::Query)
        })
    }

    /// Points the client's names (and unnamed statement) from `old` to `new`.
    fn remap(&mut self, old: &Arc<Statement>, new: &Arc<Statement>) {
        for v in self.named.values_mut() {
            if Arc::ptr_eq(v, old) {
                *v = new.clone();
            }
        }
        if let Unnamed::Cached(u) = &self.unnamed
            && Arc::ptr_eq(u, old)
        {
            self.unnamed = Unnamed::Cached(new.clone());
        }
    }

    /// A transaction may use more statements than the cap (none of its own is evicted while
    /// it runs): bring the server back under the cap when the next client is linked.
    pub(super) fn trim_server_statements(&mut self, srv: &mut ServerState) {
        let Some(registry) = self.registry.clone() else { return };
        while srv.stmts.len() > registry.cfg.server_cap {
            let Some(victim) = srv.stmts.evict_candidate(registry.cfg.server_cap) else { break };
            self.close_on_server(srv, victim, &registry);
        }
    }

    fn close_on_server(&mut self, srv: &mut ServerState, victim: Arc<Statement>, registry: &Registry) {
        srv.stmts.remove(&victim);
        registry.stats.evictions.fetch_add(1, Ordering::Relaxed);
        self.close_quietly(&victim.server_name, Fx { server_close: Some(victim.clone()), ..Fx::default() });
    }

    /// Makes sure `stmt` is prepared on the linked server, injecting its Parse (after a
    /// Close of the least recently used statement when at the cap). `on_reply` and
    /// `client` describe the Parse entry (Forward when it answers the client's own Parse).
    /// A SQL-level statement is created by a PREPARE run through the unnamed statement
    /// and portal (Parse, Bind, Execute; `on_reply` must then be Inject): it exists, and
    /// `client` takes effect, once the Execute succeeds; errors of any of the three are
    /// the client's, worded for its own PREPARE of `name`. Returns whether it injected.
    fn ensure_on_server(
        &mut self,
        srv: &mut ServerState,
        stmt: &Arc<Statement>,
        on_reply: OnReply,
        client: ClientFx,
        name: &[u8],
    ) -> bool {
        if srv.stmts.has(stmt) {
            srv.stmts.touch(stmt);
            return false;
        }
        let registry = self.registry().clone();
        if let Some(victim) = srv.stmts.evict_candidate(registry.cfg.server_cap) {
            self.close_on_server(srv, victim, &registry);
        }
        self.to_server.extend_from_slice(&stmt.create);
        let on_reply_is_inject = matches!(on_reply, OnReply::Inject);
        if stmt.kind == StmtKind::Sql {
            debug_assert!(on_reply_is_inject);
            let rename = Some(Box::new(self.prepare_rename(stmt, name)));
            let fx = Fx { server_parse: Some(stmt.clone()), rename: rename.clone(), ..Fx::default() };
            self.replies.push(Pending::with(Req::Parse, OnReply::Inject, fx));
            let fx = Fx { rename: rename.clone(), ..Fx::default() };
            self.replies.push(Pending::with(Req::Bind, OnReply::Inject, fx));
            let fx = Fx { server_parse: Some(stmt.clone()), client, rename, ..Fx::default() };
            self.replies.push(Pending::with(Req::Execute, OnReply::Inject, fx));
            srv.stmts.unnamed_owner = Some((u64::MAX, 0));
        } else {
            let fx = Fx { server_parse: Some(stmt.clone()), client, ..Fx::default() };
            self.replies.push(Pending::with(Req::Parse, on_reply, fx));
        }
        srv.stmts.insert(stmt);
        if on_reply_is_inject && stmt.shape.get().is_some() && self.described.contains(&stmt.id) {
            // Clients decode this statement's rows by a description they already hold: make
            // sure this server's fresh parse describes the same shape before any row flows.
            frontend::describe_statement(&mut self.to_server, stmt.server_name.as_bytes());
            frontend::flush(&mut self.to_server);
            self.replies.push(Pending::with(Req::Describe, OnReply::ShapeCheck(stmt.clone()), Fx::default()));
            self.hold = true;
        }
        true
    }

    /// How an error of the server's `PREPARE pn_<k> …` for `stmt` reads as PostgreSQL
    /// would word it for the client's own PREPARE of `name`: the client's name, and
    /// positions in the client's text (PostgreSQL points into the PREPARE text also when
    /// the error comes later, from re-planning it for an EXECUTE).
    fn prepare_rename(&self, stmt: &Statement, name: &[u8]) -> Rename {
        let ours = ("PREPARE ".len() + stmt.server_name.len() + 1) as i64;
        let theirs =
            self.sql_prefix.get(name).map_or_else(|| char_len(b"PREPARE ") + char_len(name) + 1, |&n| i64::from(n));
        Rename {
            server_name: stmt.server_name.clone(),
            client_name: String::from_utf8_lossy(name).into(),
            from: ours + 1,
            shift: theirs - ours,
        }
    }

    /// Remembers where the definition starts in the client's `PREPARE name …` text.
    fn note_sql_prefix(&mut self, name: &[u8], prefix: &[u8]) {
        if self.sql_prefix.len() > 2 * self.named.len() + 16 {
            let named = &self.named;
            self.sql_prefix.retain(|n, _| named.contains_key(n));
        }
        let chars = u32::try_from(char_len(prefix)).unwrap_or(u32::MAX);
        self.sql_prefix.insert(name.into(), chars);
    }

    /// The answer to a shape check: a different shape means the statement changed under
    /// its clients; PostgreSQL would answer their next use with 0A000.
    pub(super) fn on_shape_checked(&mut self, stmt: &Arc<Statement>, frame: &[u8], srv: &mut ServerState) {
        self.hold = false;
        if stmt.shape.get().is_some_and(|s| same_shape(s, frame)) {
            return;
        }
        tracing::debug!(statement = %stmt.server_name, "row shape changed since clients described it");
        self.registry().mark_stale(stmt);
        srv.stmts.remove(stmt);
        self.close_quietly(&stmt.server_name, Fx::default());
        self.shape_mismatch = Some(stmt.clone());
    }

    /// A server described a cached statement with rows of another shape than clients were
    /// told: it parsed the text after a schema change (a fresh client Parse, or a server
    /// that had evicted it). Clients told the old shape must get 0A000 from now on, as from
    /// their own backends: the statement goes stale. The client reading this description
    /// moves to a new generation that carries it. The server's copy stays until evicted
    /// (closing it now would also close portals of it still in use).
    pub(super) fn on_new_shape(&mut self, stmt: &Arc<Statement>, frame: &[u8]) {
        tracing::debug!(statement = %stmt.server_name, "a server described another row shape: new generation");
        let registry = self.registry().clone();
        registry.mark_stale(stmt);
        let fresh = registry.current(stmt);
        let _ = fresh.shape.get_or_init(|| frame.into());
        self.remap(stmt, &fresh);
        self.described.insert(fresh.id);
    }

    /// Client Parse. Returns false when a server is needed first.
    pub(super) fn on_parse(&mut self, frame: &[u8], srv: Option<&mut ServerState>) -> bool {
        let Some(p) = frontend::parse_fields(body(frame)) else {
            self.fail(Error::protocol("invalid Parse message"));
            return true;
        };
        if starts_with_deallocate(p.query) && classify(p.query) == Classified::Single(SqlStmt::Deallocate(None)) {
            // DEALLOCATE ALL would drop every statement of the shared server: the server
            // runs a no-op stand-in with the same replies and errors, and the client's own
            // statements are dropped here when it executes (`on_execute`).
            let mut standin = bytes::BytesMut::new();
            frontend::parse(&mut standin, p.name, DEALLOCATE_ALL_STANDIN, &[]);
            return self.on_parse(&standin, srv);
        }
        let registry = self.registry().clone();
        if !p.name.is_empty() && self.pending_across_sync(p.name) {
            // Whether the name exists depends on an earlier batch still in flight.
            return false;
        }
        if !p.name.is_empty() {
            if self.named.contains_key(p.name) {
                registry.stats.client_parses.fetch_add(1, Ordering::Relaxed);
                self.statement_error(duplicate(p.name), srv, false);
                return true;
            }
            if self.named.len() >= registry.cfg.client_cap {
                self.statement_error(too_many(registry.cfg.client_cap), srv, false);
                return true;
            }
        }
        let in_failed_tx = self.tx_status == TxStatus::Failed;
        let key = {
            let mut k = std::mem::take(&mut self.key_buf);
            make_key(&mut k, &StmtKind::Protocol, self.search_path(), p.query, p.param_types);
            k
        };
        let cached = if p.name.is_empty() {
            // Unnamed: promoted to a cached statement once seen often enough.
            let reuse = match &self.unnamed {
                Unnamed::Cached(s)
                    if s.has_key(&key)
                        && !s.stale.load(Ordering::Relaxed)
                        && self.tx_status == TxStatus::Idle
                        && !self.earlier_batch_in_flight() =>
                {
                    Some(s.clone())
                }
                _ => None,
            };
            match reuse {
                Some(s) => Some(s),
                // Decided once, with a server: sightings must not be counted twice.
                None if srv.is_none() => {
                    self.key_buf = key;
                    return self.need_server();
                }
                // Promoted only outside transactions, with no earlier batch in flight: a promoted
                // statement can go stale under DDL (PostgreSQL re-parses unnamed ones), and
                // only there can that be retried transparently.
                None if self.tx_status == TxStatus::Idle
                    && !self.earlier_batch_in_flight()
                    && registry.see_unnamed(&key) =>
                {
                    Some(registry.get_or_insert(&key, StmtKind::Protocol, p.query, p.param_types))
                }
                None => None,
            }
        } else {
            Some(registry.get_or_insert(&key, StmtKind::Protocol, p.query, p.param_types))
        };
        self.key_buf = key;
        if srv.is_none() && !cached.as_ref().is_some_and(|s| s.is_valid() && !in_failed_tx) {
            return self.need_server();
        }
        if srv.is_some() && cached.as_ref().is_some_and(|s| self.stmt_pending_across_sync(s)) {
            // Whether the server has it depends on an earlier batch still in flight.
            return false;
        }
        registry.stats.client_parses.fetch_add(1, Ordering::Relaxed);
        let Some(stmt) = cached else {
            // A plain unnamed statement: the server parses it; remember it for replay.
            let Some(srv) = srv else { return self.need_server() };
            self.unnamed_seq += 1;
            self.unnamed = Unnamed::Plain { frame: frame.to_vec(), seq: self.unnamed_seq };
            srv.stmts.unnamed_owner = Some((self.uid, self.unnamed_seq));
            self.to_server.extend_from_slice(frame);
            let fx = Fx { client: ClientFx::Unnamed, ..Fx::default() };
            self.replies.push(Pending::with(Req::Parse, OnReply::Forward, fx));
            return true;
        };
        let on_server = srv.as_ref().is_some_and(|s| s.stmts.has(&stmt));
        let local = !in_failed_tx && (on_server || stmt.is_valid());
        if !local && srv.is_none() {
            return self.need_server();
        }
        if local && self.earlier_batch_in_flight() {
            // An earlier batch may still fail and abort the transaction, and then PostgreSQL
            // answers this Parse with 25P02: wait for it before answering here.
            return false;
        }
        // A fresh Parse is a new statement for the client: any description it had of an
        // earlier one no longer applies.
        self.described.remove(&stmt.id);
        let client_fx = if p.name.is_empty() {
            self.unnamed = Unnamed::Cached(stmt.clone());
            ClientFx::Unnamed
        } else {
            self.named.insert(p.name.into(), stmt.clone());
            ClientFx::Named { name: p.name.into() }
        };
        if local {
            registry.stats.hits.fetch_add(1, Ordering::Relaxed);
            self.note_fresh_parse(&stmt);
            self.push_synth(Synth::ParseComplete, Fx { client: client_fx, ..Fx::default() });
        } else if let Some(srv) = srv
            && !self.ensure_on_server(srv, &stmt, OnReply::Forward, client_fx.clone(), p.name)
        {
            // Prepared here already (in a failed transaction): let the server answer as
            // PostgreSQL answers this Parse in that state, 25P02, or ParseComplete for a
            // transaction-ending statement (ROLLBACK, COMMIT...). Under the unnamed name:
            // the client's own name must never reach the server (it would stay there).
            frontend::parse(&mut self.to_server, b"", p.query, p.param_types);
            srv.stmts.unnamed_owner = None;
            let fx = Fx { client: client_fx, ..Fx::default() };
            self.replies.push(Pending::with(Req::Parse, OnReply::Forward, fx));
        }
        true
    }

    /// The statement a client name refers to, prepared on `srv`.
    fn resolve(&mut self, name: &[u8], srv: &mut ServerState) -> Resolved {
        let cached = if name.is_empty() {
            match &self.unnamed {
                Unnamed::Cached(s) => s.clone(),
                Unnamed::Plain { frame, seq } => {
                    if srv.stmts.unnamed_owner != Some((self.uid, *seq)) {
                        // Parsed on another server (or replaced since): parse it again here.
                        self.to_server.extend_from_slice(frame);
                        srv.stmts.unnamed_owner = Some((self.uid, *seq));
                        self.replies.push(Pending::with(Req::Parse, OnReply::Inject, Fx::default()));
                    }
                    return Resolved::Plain;
                }
                Unnamed::None if srv.stmts.unnamed_owner.is_some() => {
                    // The server's unnamed statement is somebody else's.
                    self.statement_error(missing(b""), Some(srv), false);
                    return Resolved::Failed;
                }
                Unnamed::None => return Resolved::Plain,
            }
        } else {
            if self.pending_across_sync(name) {
                return Resolved::Held;
            }
            match self.named.get(name) {
                Some(s) => s.clone(),
                None => {
                    self.statement_error(missing(name), Some(srv), false);
                    return Resolved::Failed;
                }
            }
        };
        if self.stmt_pending_across_sync(&cached) {
            return Resolved::Held;
        }
        let cached = if cached.stale.load(Ordering::Relaxed) && self.shape_mismatch.is_none() {
            if self.described.contains(&cached.id) {
                // Known stale and the client holds its old description: PostgreSQL's answer,
                // without parsing it again anywhere.
                self.statement_error(stale_plan(), Some(srv), false);
                return Resolved::Failed;
            }
            // The client never saw the old shape: use the current generation.
            let fresh = self.registry().current(&cached);
            self.remap(&cached, &fresh);
            fresh
        } else {
            cached
        };
        if self.shape_mismatch.as_ref().is_some_and(|m| Arc::ptr_eq(m, &cached)) {
            self.shape_mismatch = None;
            self.statement_error(stale_plan(), Some(srv), false);
            return Resolved::Failed;
        }
        self.ensure_on_server(srv, &cached, OnReply::Inject, ClientFx::None, name);
        if self.hold {
            return Resolved::Held;
        }
        Resolved::Cached(cached)
    }

    pub(super) fn on_bind(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let Some((portal, stmt_name, rest)) = frontend::bind_names(body(frame)) else {
            self.fail(Error::protocol("invalid Bind message"));
            return true;
        };
        if self.fresh_in_tx.is_some() {
            let dml = self.statement_text(stmt_name).is_some_and(crate::stmt::sql::is_plain_dml);
            self.note_statement_run(dml);
        }
        let guard = self.guard_wanted(stmt_name, srv);
        let resolved = self.resolve(stmt_name, srv);
        if !matches!(resolved, Resolved::Held) {
            if self.last_bind.as_ref().is_some_and(|(p, _)| **p == *portal) {
                // The portal is re-bound: a Describe of it no longer describes that statement.
                self.last_bind = None;
            }
            let text = self.statement_text(stmt_name);
            let sets_config = text.is_some_and(super::settings::may_set_session_config);
            let standin = text == Some(DEALLOCATE_ALL_STANDIN);
            let tracked = text
                .filter(|t| super::settings::maybe_session_stmt(t))
                .and_then(|t| std::str::from_utf8(t).ok())
                .map(Box::<str>::from);
            let bound = !matches!(resolved, Resolved::Failed);
            self.server_dirty |= sets_config;
            if standin && bound {
                self.dealloc_portal = Some(portal.into());
            } else if self.dealloc_portal.as_deref() == Some(portal) {
                self.dealloc_portal = None;
            }
            match tracked {
                Some(sql) if bound => self.tracked_portal = Some(Box::new((portal.into(), sql))),
                _ if self.tracked_portal.as_deref().is_some_and(|(p, _)| **p == *portal) => self.tracked_portal = None,
                _ => {}
            }
        }
        match resolved {
            Resolved::Held => return false,
            Resolved::Failed => {}
            Resolved::Plain => self.forward(frame, Req::Bind),
            Resolved::Cached(s) => {
                self.last_bind = Some((portal.into(), s.clone()));
                let tail = &body(frame)[rest..];
                self.send_use(Req::Bind, s, guard, srv, |out, server_name| {
                    frontend::bind_with_tail(out, portal, server_name, tail)
                });
            }
        }
        true
    }

    pub(super) fn on_describe(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let Some((kind, name)) = frontend::describe_or_close(body(frame)) else {
            self.fail(Error::protocol("invalid DESCRIBE message subtype"));
            return true;
        };
        if kind == b'P' {
            // A portal of a cached statement: its description tells the client the
            // statement's row shape as well.
            let portal_of = self.last_bind.as_ref().filter(|(p, _)| **p == *name).map(|(_, s)| s.clone());
            self.to_server.extend_from_slice(frame);
            self.replies.push(Pending::with(Req::Describe, OnReply::Forward, Fx { portal_of, ..Fx::default() }));
            return true;
        }
        let guard = self.guard_wanted(name, srv);
        match self.resolve(name, srv) {
            Resolved::Held => return false,
            Resolved::Failed => {}
            Resolved::Plain => self.forward(frame, Req::Describe),
            Resolved::Cached(s) => {
                self.send_use(Req::Describe, s, guard, srv, frontend::describe_statement);
            }
        }
        true
    }

    /// Sends a Bind or Describe of the cached statement `s` (`write` writes it under the
    /// server name), inside a savepoint guard when it is the first use `guard` names, and
    /// queues its reply with what a transparent retry needs.
    fn send_use(
        &mut self,
        req: Req,
        s: Arc<Statement>,
        guard: Option<u64>,
        srv: &mut ServerState,
        write: impl FnOnce(&mut bytes::BytesMut, &[u8]),
    ) {
        let guarded = guard == Some(s.id);
        if guarded {
            self.open_guard(&s, srv);
        }
        write(&mut self.to_server, s.server_name.as_bytes());
        let replay_from = if guarded { Some(self.frame_at) } else { self.retry_point() };
        let fx = Fx { uses: Some(s), replay_from, guarded, ..Fx::default() };
        self.replies.push(Pending::with(req, OnReply::Forward, fx));
        if guarded {
            self.guard_command(GuardCmd::Release, srv);
        }
    }

    /// Close: statements are answered locally (closing a name that does not exist is not
    /// an error); portals belong to the server.
    pub(super) fn on_close(&mut self, frame: &[u8], srv: Option<&mut ServerState>) {
        let Some((kind, name)) = frontend::describe_or_close(body(frame)) else {
            return self.fail(Error::protocol("invalid CLOSE message subtype"));
        };
        if kind == b'P' {
            match srv {
                Some(_) => self.forward(frame, Req::Close),
                None => self.push_synth(Synth::CloseComplete, Fx::default()),
            }
            return;
        }
        let client = if name.is_empty() {
            self.unnamed = Unnamed::None;
            ClientFx::None
        } else {
            match self.named.remove(name) {
                Some(stmt) => ClientFx::Closed { name: name.into(), stmt },
                None => ClientFx::None,
            }
        };
        self.push_synth(Synth::CloseComplete, Fx { client, ..Fx::default() });
    }

    /// A simple Query with the cache on: SQL-level statement commands are handled here.
    /// Returns false when the Query must wait for replies to what was sent before it.
    pub(super) fn on_query_cached(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let text = frontend::query_text(body(frame)).unwrap_or_default();
        let class = classify(text);
        if self.fresh_in_tx.is_some() {
            // Whether this may change a table under statements parsed in the transaction.
            let dml = match &class {
                Classified::Plain => is_plain_dml(text),
                Classified::Single(SqlStmt::Prepare { .. }) => true,
                Classified::Single(SqlStmt::Execute { name, .. }) => self
                    .named
                    .get(name.as_slice())
                    .is_some_and(|s| s.kind == StmtKind::Sql && prepare_body(&s.query).is_some_and(is_plain_dml)),
                _ => false,
            };
            self.note_statement_run(dml);
        }
        // In a failed transaction PostgreSQL rejects every command with 25P02: let it.
        if self.tx_status == TxStatus::Failed {
            self.forward_query(frame);
            return true;
        }
        match class {
            Classified::Plain => {
                self.note_tx_start(text);
                self.forward_query(frame)
            }
            Classified::Multi => {
                let e = Error::new(
                    SqlState::FEATURE_NOT_SUPPORTED,
                    "parsnip: PREPARE, EXECUTE, DEALLOCATE and DISCARD ALL must be sent alone, not in a multi-statement query string",
                );
                self.statement_error(e, Some(srv), true);
            }
            Classified::Single(SqlStmt::Deallocate(None)) => {
                self.named.clear();
                self.push_synth(Synth::TagAndReady("DEALLOCATE ALL"), Fx::default());
            }
            Classified::Single(SqlStmt::Deallocate(Some(name))) => match self.named.remove(name.as_slice()) {
                Some(_) => self.push_synth(Synth::TagAndReady("DEALLOCATE"), Fx::default()),
                None => self.statement_error(missing(&name), Some(srv), true),
            },
            Classified::Single(SqlStmt::DiscardAll) => {
                if self.tx_status != TxStatus::Idle {
                    // PostgreSQL: DISCARD ALL cannot run inside a transaction block.
                    self.forward_query(frame);
                    return true;
                }
                self.named.clear();
                self.unnamed = Unnamed::None;
                Arc::make_mut(&mut self.settings).reset_all_extra();
                srv.settings.reset_all_extra();
                // Everything DISCARD ALL does except dropping the server's (shared) statements.
                frontend::query(
                    &mut self.to_server,
                    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; \
                     SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES",
                );
                self.replies.push(Pending::with(Req::Query, OnReply::Skip, Fx::default()));
                self.replies.push(Pending::with(
                    Req::Query,
                    OnReply::Synth(Synth::TagAndReady("DISCARD ALL")),
                    Fx::default(),
                ));
            }
            Classified::Single(SqlStmt::Prepare { name, rest }) => {
                if self.named.contains_key(name.as_slice()) {
                    self.statement_error(duplicate(&name), Some(srv), true);
                    return true;
                }
                let cap = self.registry().cfg.client_cap;
                if self.named.len() >= cap {
                    self.statement_error(too_many(cap), Some(srv), true);
                    return true;
                }
                let registry = self.registry().clone();
                let def = &text[rest..];
                let mut k = std::mem::take(&mut self.key_buf);
                make_key(&mut k, &StmtKind::Sql, self.search_path(), def, b"");
                let stmt = registry.get_or_insert(&k, StmtKind::Sql, def, b"");
                self.key_buf = k;
                self.named.insert(name.clone().into(), stmt.clone());
                self.note_sql_prefix(&name, &text[..rest]);
                let client = ClientFx::Named { name: name.clone().into() };
                if stmt.is_valid() || srv.stmts.has(&stmt) {
                    self.note_fresh_parse(&stmt);
                    self.note_fresh_sql(&stmt);
                    self.push_synth(Synth::TagAndReady("PREPARE"), Fx { client, ..Fx::default() });
                } else {
                    self.ensure_on_server(srv, &stmt, OnReply::Inject, client, &name);
                    self.replies.push(Pending::with(
                        Req::Execute,
                        OnReply::Synth(Synth::Tag("PREPARE")),
                        Fx::default(),
                    ));
                    frontend::sync(&mut self.to_server);
                    self.replies.push(Pending::client(Req::Sync));
                }
            }
            Classified::Single(SqlStmt::Execute { name, span }) => {
                let Some(stmt) = self.named.get(name.as_slice()).cloned() else {
                    self.forward_query(frame);
                    return true;
                };
                if self.stmt_pending_across_sync(&stmt) {
                    // Whether the server has it depends on a PREPARE (or Close) still in flight.
                    return false;
                }
                let fresh = self.take_fresh_sql(&stmt);
                if stmt.stale.load(Ordering::Relaxed) {
                    // Its plan changed result type, found after this client PREPAREd it
                    // (a PREPARE since gets the current generation): PostgreSQL's 0A000,
                    // without a trip to the server.
                    self.statement_error(stale_plan(), Some(srv), true);
                    return true;
                }
                // A stale plan met by the first EXECUTE after a PREPARE the cache answered
                // can be retried: outside a transaction, or inside one from a savepoint (a
                // statement PREPAREd in it, `guard`).
                let alone = !self.retried && !self.replies.is_unsynced() && !self.earlier_batch_in_flight();
                let guarded = alone && srv.stmts.has(&stmt) && self.guard_wanted(&name, srv) == Some(stmt.id);
                let retry = alone && ((fresh && self.tx_status == TxStatus::Idle) || guarded);
                if guarded {
                    self.forget_fresh(&stmt);
                    self.guard_query(GuardCmd::Savepoint, Purpose::Guard);
                }
                if retry {
                    self.last_batch.clear();
                    self.last_batch.extend_from_slice(frame);
                }
                let synced = !self.replies.is_unsynced();
                if self.ensure_on_server(srv, &stmt, OnReply::Inject, ClientFx::None, &name) && synced {
                    // The PREPARE ran through the extended protocol: end its implicit
                    // transaction before the client's Query (PostgreSQL 18 keeps it open
                    // across a simple Query, whose ReadyForQuery would then say T), and stop
                    // there if it fails (`answer_after_prepare_sync`).
                    frontend::sync(&mut self.to_server);
                    self.replies.push(Pending::internal(Req::Sync, Purpose::Prepare));
                }
                let mut sql = Vec::with_capacity(text.len() + 16);
                sql.extend_from_slice(&text[..span.start]);
                sql.extend_from_slice(stmt.server_name.as_bytes());
                sql.extend_from_slice(&text[span.end..]);
                frontend::query_bytes(&mut self.to_server, &sql);
                let rename = Rename {
                    server_name: stmt.server_name.clone(),
                    client_name: String::from_utf8_lossy(&name).into(),
                    from: char_len(&text[..span.start]) + stmt.server_name.len() as i64 + 1,
                    shift: char_len(&text[span.clone()]) - stmt.server_name.len() as i64,
                };
                let replay_from = retry.then_some(0);
                let fx = Fx { uses: Some(stmt), rename: Some(Box::new(rename)), replay_from, guarded, ..Fx::default() };
                self.replies.push(Pending::with(Req::Query, OnReply::Forward, fx));
                if guarded {
                    self.guard_query(GuardCmd::Release, Purpose::Guard);
                }
            }
        }
        true
    }

    /// Undoes what a request the server failed or skipped would have done.
    pub(super) fn rollback(&mut self, p: Pending, srv: &mut ServerState) {
        if matches!(p.on_reply, OnReply::ShapeCheck(_)) {
            self.hold = false;
        }
        if let Some(s) = &p.fx.server_parse {
            srv.stmts.remove(s);
            if p.failed {
                self.registry().forget_invalid(s);
            }
        }
        if let Some(s) = &p.fx.server_close {
            // The Close was skipped: the statement is still prepared there.
            srv.stmts.insert(s);
        }
        srv.stmts.guard &= !p.fx.guard_parse;
        match p.fx.client {
            ClientFx::None => {}
            ClientFx::Named { name } => {
                self.named.remove(&name);
            }
            ClientFx::Unnamed => {
                self.unnamed = Unnamed::None;
                if srv.stmts.unnamed_owner.is_some_and(|(u, _)| u == self.uid) {
                    // A failed plain Parse "" dropped the server's unnamed statement; a failed
                    // promoted one (a named server Parse) left it there, but it is no longer
                    // this client's: a later Bind "" must get 26000, as from PostgreSQL.
                    srv.stmts.unnamed_owner = if p.fx.server_parse.is_some() { Some((u64::MAX, 0)) } else { None };
                }
            }
            ClientFx::Closed { name, stmt } => {
                self.named.insert(name, stmt);
            }
            ClientFx::ClearedAll { saved } => self.named.extend(saved),
        }
    }

    /// 0A000 or 26000 answered a Bind or Describe of a cached statement outside a
    /// transaction, or inside one under a savepoint guard (`guard`): when PostgreSQL would
    /// not have failed (the client was never told the old row shape, or its batch describes
    /// the portal; or the server merely lost the statement), prepare the statement afresh
    /// and replay the client's batch from that request, hiding the error (under a guard,
    /// after rolling back to the savepoint). Only when that batch is the last thing sent,
    /// so nothing is reordered.
    pub(super) fn try_retry(&mut self, stmt: &Arc<Statement>, code: &[u8], from: u32, srv: &mut ServerState) -> bool {
        if self.replies.head().is_some_and(|p| p.req == Req::Query) {
            return self.retry_sql_execute(stmt, code, srv);
        }
        let guarded = self.replies.head().is_some_and(|p| p.fx.guarded);
        if self.retried || !(self.tx_status == TxStatus::Idle || guarded) || !self.batch.is_empty() {
            return false;
        }
        let last_sync = self.replies.iter().position(|p| p.req == Req::Sync && !p.is_synth());
        if last_sync != Some(self.replies.len() - 1) {
            return false;
        }
        let Some(tail) = self.last_batch.get(from as usize..) else { return false };
        if code == b"0A000" && self.described.contains(&stmt.id) && !describes_portal(tail) {
            return false;
        }
        // The failed Bind and what the server skips after it.
        if let Some(p) = self.replies.pop() {
            self.rollback(p, srv);
        }
        while let Some(p) = self.replies.pop_unless_sync() {
            self.rollback(p, srv);
        }
        // The Sync already sent: its ReadyForQuery is not the client's any more.
        if let Some(p) = self.replies.head_mut() {
            p.on_reply = OnReply::Skip;
            p.purpose = super::reply_queue::Purpose::Retried;
        }
        if guarded {
            // Back to before the failed use: the transaction goes on as if it never ran.
            self.guard_command(GuardCmd::RollbackTo, srv);
            self.guard_command(GuardCmd::Release, srv);
        }
        let registry = self.registry().clone();
        let fresh = if code == b"0A000" {
            registry.mark_stale(stmt);
            if !self.lent {
                srv.stmts.remove(stmt);
                self.close_quietly(&stmt.server_name, Fx::default());
            }
            // Lent (`pipeline`): another client's batch is behind this one on the server, so
            // nothing may be written here; the stale statement stays listed there and is
            // the first to be evicted, and the replay re-prepares on the next server.
            registry.current(stmt)
        } else {
            registry.stats.invalidations.fetch_add(1, Ordering::Relaxed);
            srv.stmts.clear();
            stmt.clone()
        };
        self.remap(stmt, &fresh);
        registry.stats.retries.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(statement = %stmt.server_name, code = %String::from_utf8_lossy(code), "re-prepared and retried transparently");
        self.retried = true;
        // The driver feeds these frames again before anything else the client sent, through
        // the normal path (so a frame that must wait, waits).
        let frames = std::mem::take(&mut self.last_batch);
        self.replay = frames.get(from as usize..).map(Box::from);
        true
    }

    /// 0A000 answered a client's first SQL `EXECUTE` (a simple Query, sent alone) after a
    /// PREPARE the cache answered with an older plan: PostgreSQL would have prepared afresh
    /// and answered rows of the new shape (each EXECUTE result carries its own row
    /// description). The error and its ReadyForQuery are hidden (under a guard,
    /// the transaction is rolled back to the savepoint), the statement goes stale, and the
    /// client's Query is fed again against the current generation.
    fn retry_sql_execute(&mut self, stmt: &Arc<Statement>, code: &[u8], srv: &mut ServerState) -> bool {
        let Some(head) = self.replies.head() else { return false };
        let guarded = head.fx.guarded;
        // Nothing was sent after it but its guard's RELEASE.
        if code != b"0A000" || self.retried || self.replies.len() != 1 + usize::from(guarded) {
            return false;
        }
        for p in self.replies.iter_mut() {
            p.on_reply = OnReply::Skip;
            p.purpose = Purpose::Retried;
        }
        if guarded {
            self.guard_query(GuardCmd::RollbackTo, Purpose::Retried);
            self.guard_query(GuardCmd::Release, Purpose::Retried);
        }
        let registry = self.registry().clone();
        registry.mark_stale(stmt);
        srv.stmts.remove(stmt);
        self.close_quietly(&stmt.server_name, Fx::default());
        let fresh = registry.current(stmt);
        self.remap(stmt, &fresh);
        registry.stats.retries.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(statement = %stmt.server_name, "SQL EXECUTE re-prepared and retried transparently");
        self.retried = true;
        self.replay = Some(std::mem::take(&mut self.last_batch).into_boxed_slice());
        true
    }

    /// The SQL text of the client's statement `name` ("" = unnamed), if known.
    fn statement_text(&self, name: &[u8]) -> Option<&[u8]> {
        if name.is_empty() {
            match &self.unnamed {
                Unnamed::Plain { frame, .. } => frontend::parse_fields(body(frame)).map(|f| f.query),
                Unnamed::Cached(s) => Some(&s.query),
                Unnamed::None => None,
            }
        } else {
            self.named.get(name).map(|s| &*s.query)
        }
    }

    /// An Execute just queued: if its portal runs a SET/RESET/DISCARD or a transaction
    /// control statement, its text goes with it, to be tracked once the server completes it.
    pub(super) fn track_execute(&mut self, frame: &[u8]) {
        let Some((portal, sql)) = self.tracked_portal.as_deref() else { return };
        if crate::protocol::read_cstr(body(frame)).map(|(p, _)| p) != Some(&portal[..]) {
            return;
        }
        let sql = sql.clone();
        self.note_tx_start(sql.as_bytes());
        if let Some(p) = self.replies.last_mut() {
            p.tracked_sql = Some(sql);
        }
    }

    /// An Execute just queued: if it runs the client's `DEALLOCATE ALL` stand-in, the
    /// client's statements go now (in pipeline order), and come back if the server skips it.
    pub(super) fn on_execute(&mut self, frame: &[u8]) {
        let Some(dealloc) = self.dealloc_portal.as_deref() else { return };
        if crate::protocol::read_cstr(body(frame)).map(|(portal, _)| portal) != Some(dealloc) {
            return;
        }
        let saved = std::mem::take(&mut self.named);
        if let Some(p) = self.replies.last_mut() {
            p.fx.client = ClientFx::ClearedAll { saved };
        }
    }

    /// Where a transparent retry of the frame being handled would start, if one is allowed:
    /// outside a transaction, not twice, and only while nothing in this batch has executed
    /// (an earlier BEGIN or write would be aborted or rolled back by the error).
    fn retry_point(&self) -> Option<u32> {
        (self.tx_status == TxStatus::Idle && !self.retried && !self.batch_executed).then_some(self.frame_at)
    }

    /// Closes a server statement on the pooler's behalf (its CloseComplete is hidden);
    /// `fx` says what to undo if the server skips the Close.
    fn close_quietly(&mut self, server_name: &str, fx: Fx) {
        frontend::close_statement(&mut self.to_server, server_name.as_bytes());
        self.replies.push(Pending::with(Req::Close, OnReply::Skip, fx));
    }

    /// An error answered a request that used a cached statement.
    pub(super) fn on_statement_error(&mut self, s: &Arc<Statement>, code: &[u8], srv: &mut ServerState) {
        match code {
            // cached plan must not change result type: new Parses of this text get a new
            // statement (a new generation) everywhere; clients holding this one keep
            // getting 0A000, as their own backend would give them, until they re-prepare.
            b"0A000" => self.registry().mark_stale(s),
            // The server lost its statements (DISCARD ALL or DEALLOCATE ALL from elsewhere):
            // forget what we believed prepared there, so the next use prepares again.
            b"26000" => {
                self.registry().stats.invalidations.fetch_add(1, Ordering::Relaxed);
                srv.stmts.clear();
            }
            _ => {}
        }
    }
}
