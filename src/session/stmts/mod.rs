//! The client's prepared statements over the shared cache: renaming client statement
//! names to server names, preparing statements on whichever server the client is given
//! (injecting Parse, evicting by Close), answering Parse and Close locally in pipeline
//! order, SQL-level PREPARE / EXECUTE / DEALLOCATE / DISCARD ALL, and the errors
//! PostgreSQL would give (42P05, 26000) without ever disconnecting the client.
//!
//! `ClientStmts` is what one client holds (its names in `names`, one entry per name);
//! the handlers are per message: `parse` (Parse),
//! `portal` (Bind, Describe, Close, Execute), `sql` (PREPARE, EXECUTE, DEALLOCATE in a
//! simple Query), `autoprepare` (a simple Query run as a cached statement; `fastbind` when
//! it binds that statement directly), `script`
//! (those in a multi-statement Query), `shape` (result-shape checks), `guard` (the
//! savepoint guard). Retrying a batch after a stale plan is `session::retry`.

pub(in crate::session) mod autoprepare;
mod fastbind;
pub(in crate::session) mod guard;
pub(in crate::session) mod names;
mod parse;
mod portal;
pub(in crate::session) mod script;
mod shape;
mod sql;
pub(in crate::session) mod view;

pub(in crate::session) use shape::{describes_portal, same_shape};

use super::reply_queue::{ClientFx, Fx, OnReply, Pending, Req};
use super::{Phase, Session, settings};
use crate::error::{Error, SqlState};
use crate::protocol::{body, frontend};
use crate::state::{ServerState, TxStatus};
use crate::stmt::memo::BindWatch;
use crate::stmt::registry::StmtKind;
use crate::stmt::{Registry, Statement};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The prepared statements one client holds, and what their handling needs to remember.
#[derive(Debug, Default)]
pub(in crate::session) struct ClientStmts {
    /// The pool's statement cache; None: statements pass through untouched (session mode).
    pub(in crate::session) registry: Option<Arc<Registry>>,
    /// The client's named statements, with what its own view of each says (`names`).
    pub(in crate::session) named: names::NamedStmts,
    /// The client's unnamed statement.
    pub(in crate::session) unnamed: Unnamed,
    /// This client's Parse sequence (identifies its unnamed statement on a server).
    pub(in crate::session) unnamed_seq: u64,
    /// Statements this client was given a description of (Describe S).
    pub(in crate::session) described: crate::stmt::idmap::IdSet,
    /// The portal and statement of the last Bind of a cached statement.
    pub(in crate::session) last_bind: Option<(Box<[u8]>, Arc<Statement>)>,
    /// The portal of the last Bind of an unnamed statement the plan guard ran as sent, and
    /// the cached statement its executions are measured for.
    pub(in crate::session) last_plain: Option<(Box<[u8]>, Arc<Statement>)>,
    /// The plan guard chose to run the next Parse of this statement (id) as sent, and it
    /// waits for a server: the choice stands when it is fed again.
    pub(in crate::session) as_sent_next: Option<u64>,
    /// The portal bound to this client's `DEALLOCATE ALL` (run on the server as a no-op).
    pub(in crate::session) dealloc_portal: Option<Box<[u8]>>,
    /// A statement whose fresh Parse described a different row shape than the one clients
    /// were given: the next use fails with 0A000, as on the client's own backend.
    pub(in crate::session) shape_mismatch: Option<Arc<Statement>>,
    /// Statements the client parsed in this transaction whose Parse the cache answered:
    /// their first use runs inside a savepoint guard (`guard`). Boxed, and None when
    /// empty: every idle client carries the field.
    #[allow(clippy::box_collection)]
    pub(in crate::session) fresh_in_tx: Option<Box<Vec<u64>>>,
    /// SQL-level statements the client PREPAREd (answered from the cache) and has not
    /// EXECUTEd since: a stale plan met by their first EXECUTE is retried, as PostgreSQL
    /// would have prepared them afresh. Boxed and None when empty, as above.
    #[allow(clippy::box_collection)]
    pub(in crate::session) fresh_sql: Option<Box<Vec<u64>>>,
    /// A use was sent under a savepoint guard and may still await its answer (`guard`;
    /// cleared when one is looked for and none is queued).
    pub(in crate::session) guard_in_flight: bool,
    /// This client sent a batch while a guarded one before it was unanswered (it pipelines
    /// inside transaction blocks): inside a block, its autoprepared reads go as the Queries
    /// they are from now on, so that they do not hold it back again (`guard`).
    pub(in crate::session) pipelines_in_block: bool,
    /// The client's LISTEN channels and the notifications waiting for it
    /// (`session::notify`); None for a client that never listened. Kept here, not in
    /// `Kept`, so that it costs an idle client that never listens nothing: this box is
    /// parked with the client only when it holds something (`holds_nothing`).
    pub(in crate::session) listen: Option<Box<crate::session::notify::Listening>>,
}

impl ClientStmts {
    /// Statements for a client; with a `registry`, through the shared cache.
    pub(super) fn new(registry: Option<Arc<Registry>>) -> ClientStmts {
        ClientStmts { registry, ..ClientStmts::default() }
    }

    /// Points the client's names (and unnamed statement) from `old` to `new`.
    pub(super) fn remap(&mut self, old: &Arc<Statement>, new: &Arc<Statement>) {
        self.named.for_each_statement(|v| {
            if Arc::ptr_eq(v, old) {
                *v = new.clone();
            }
        });
        if let Unnamed::Cached(u) = &self.unnamed
            && Arc::ptr_eq(u, old)
        {
            self.unnamed = Unnamed::Cached(new.clone());
        }
    }

    /// The client's statement `name` ("" = unnamed): a cached one, or the text of its plain
    /// unnamed statement.
    fn client_statement(&self, name: &[u8]) -> Option<Result<&Arc<Statement>, &[u8]>> {
        if name.is_empty() {
            match &self.unnamed {
                Unnamed::Plain { frame, .. } => frontend::parse_fields(body(frame)).map(|f| Err(f.query)),
                Unnamed::Cached(s) => Some(Ok(s)),
                Unnamed::None => None,
            }
        } else {
            self.named.get(name).map(Ok)
        }
    }
}

/// The text of a statement as a Bind needs it (`Session::bind_text`).
pub(in crate::session) struct BindText<'a> {
    /// The text, if the statement is known.
    pub(in crate::session) text: Option<&'a [u8]>,
    /// What to watch for in it.
    pub(in crate::session) watch: BindWatch,
}

/// What a Bind of `text` must watch for.
fn bind_watch(text: &[u8]) -> BindWatch {
    BindWatch {
        sets_config: settings::may_set_session_config(text),
        session_stmt: settings::maybe_session_stmt(text),
        pins_begin: crate::stmt::sql::session_state(text, false).check,
        pins_end: crate::stmt::sql::session_state(text, true).check,
    }
}

/// `Session::bind_text` of a cached statement: what to watch for is worked out once.
pub(in crate::session) fn cached_bind_text(s: &Statement) -> BindText<'_> {
    BindText { text: Some(&s.query), watch: s.bind_watch.get_or_init(|| bind_watch(&s.query)) }
}

/// Reserved statement name that never exists on a server: a request naming it fails with
/// 26000, which puts the server in the same error state PostgreSQL itself would be in.
const PROBE: &[u8] = b"parsnip_probe";

/// What a statement name in Bind or Describe resolved to.
pub(in crate::session) enum Resolved {
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
pub(crate) enum Unnamed {
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
        /// The cached statement of the same text, when the plan guard runs it as sent
        /// (`stmt::guard`): its executions count for that statement.
        measure: Option<Arc<Statement>>,
        /// The row description the client was given for it (its Describe), checked
        /// against what another server's parse of it describes (`Session::resolve`).
        shape: Option<Box<[u8]>>,
        /// Another server's parse of it described other rows: as PostgreSQL's statement
        /// would, it answers 0A000 until the client parses it again.
        stale: bool,
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
    pub(super) fn registry(&self) -> &Arc<Registry> {
        self.stmts.registry.as_ref().expect("statement handlers run only with a registry")
    }

    fn search_path(&self) -> &[u8] {
        self.kept.settings.extra.iter().find(|(n, _)| n == "search_path").map_or(&[][..], |(_, s)| s.as_bytes())
    }

    /// Fails the current request as PostgreSQL would. Linked: a request that the server
    /// rejects (so its transaction and skip-to-Sync state match), with our error in place
    /// of its. Unlinked (no transaction, nothing outstanding): answered locally.
    fn statement_error(&mut self, err: Error, srv: Option<&mut ServerState>, query: bool) {
        match srv {
            Some(_) if query => {
                frontend::query(&mut self.to_server, "DEALLOCATE parsnip_probe");
                self.busy.replies.push(Pending::with(Req::Query, OnReply::ReplaceError(Box::new(err)), Fx::default()));
            }
            Some(srv) if self.busy.tx.status == TxStatus::Failed => {
                // In a failed transaction PostgreSQL checks that before names: a Parse gets
                // the 25P02 it would give (a Describe would get 26000 first).
                frontend::parse(&mut self.to_server, b"", b"SELECT 1", &[]);
                srv.stmts.unnamed_owner = None;
                self.busy.replies.push(Pending::with(Req::Parse, OnReply::ReplaceError(Box::new(err)), Fx::default()));
            }
            Some(_) => {
                frontend::describe_statement(&mut self.to_server, PROBE);
                self.busy.replies.push(Pending::with(
                    Req::Describe,
                    OnReply::ReplaceError(Box::new(err)),
                    Fx::default(),
                ));
            }
            None => {
                err.write_to(&mut self.to_client);
                if query {
                    crate::protocol::backend::ready_for_query(&mut self.to_client, b'I');
                } else {
                    self.enter(Phase::ClientSkipping);
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
        for p in self.busy.replies.iter() {
            match &p.fx.client {
                ClientFx::Named { name: n } | ClientFx::Closed { name: n, .. } | ClientFx::ParsedAhead { name: n }
                    if **n == *name =>
                {
                    pending = true
                }
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
        for p in self.busy.replies.iter() {
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
        self.busy.replies.iter().any(|p| {
            !p.is_synth() && p.purpose == super::reply_queue::Purpose::Client && matches!(p.req, Req::Sync | Req::Query)
        })
    }

    /// A transaction may use more statements than the cap (none of its own is evicted while
    /// it runs): bring the server back under the cap when the next client is linked.
    pub(super) fn trim_server_statements(&mut self, srv: &mut ServerState) {
        let Some(registry) = self.stmts.registry.clone() else { return };
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
            self.busy.replies.push(Pending::with(Req::Parse, OnReply::Inject, fx));
            let fx = Fx { rename: rename.clone(), ..Fx::default() };
            self.busy.replies.push(Pending::with(Req::Bind, OnReply::Inject, fx));
            let fx = Fx { server_parse: Some(stmt.clone()), client, rename, ..Fx::default() };
            self.busy.replies.push(Pending::with(Req::Execute, OnReply::Inject, fx));
            srv.stmts.unnamed_owner = Some((u64::MAX, 0));
        } else {
            let fx = Fx { server_parse: Some(stmt.clone()), client, ..Fx::default() };
            self.busy.replies.push(Pending::with(Req::Parse, on_reply, fx));
        }
        srv.stmts.insert(stmt);
        if on_reply_is_inject && stmt.shape.get().is_some() && self.stmts.described.contains(&stmt.id) {
            // Clients decode this statement's rows by a description they already hold: make
            // sure this server's fresh parse describes the same shape before any row flows.
            frontend::describe_statement(&mut self.to_server, stmt.server_name.as_bytes());
            frontend::flush(&mut self.to_server);
            self.busy.replies.push(Pending::with(Req::Describe, OnReply::ShapeCheck(stmt.clone()), Fx::default()));
            self.enter(Phase::Held);
        }
        true
    }

    /// Closes a server statement on the pooler's behalf (its CloseComplete is hidden);
    /// `fx` says what to undo if the server skips the Close.
    pub(super) fn close_quietly(&mut self, server_name: &str, fx: Fx) {
        frontend::close_statement(&mut self.to_server, server_name.as_bytes());
        self.busy.replies.push(Pending::with(Req::Close, OnReply::Skip, fx));
    }

    /// The SQL text of the client's statement `name` ("" = unnamed), if known.
    fn statement_text(&self, name: &[u8]) -> Option<&[u8]> {
        self.stmts.client_statement(name).map(|s| s.map_or_else(|text| text, |s| &*s.query))
    }

    /// The text of statement `name` as a Bind needs it: the text, whether it may call
    /// `set_config` for the session (`settings::may_set_session_config`) and whether it may
    /// be a tracked session statement (`settings::maybe_session_stmt`). A cached statement's
    /// text never changes: both are worked out once and kept in it.
    pub(super) fn bind_text(&self, name: &[u8]) -> BindText<'_> {
        match self.stmts.client_statement(name) {
            Some(Ok(s)) => cached_bind_text(s),
            Some(Err(text)) => BindText { text: Some(text), watch: bind_watch(text) },
            None => BindText { text: None, watch: BindWatch::default() },
        }
    }

    /// An error answered a request that used a cached statement.
    pub(super) fn on_statement_error(&mut self, s: &Arc<Statement>, code: &[u8], srv: &mut ServerState) {
        match code {
            // cached plan must not change result type: new Parses of this text get a new
            // statement (a new generation) everywhere; clients holding this one keep
            // getting 0A000, as their own backend would give them, until they re-prepare.
            b"0A000" => {
                self.registry().mark_stale(s);
                // The schema changed where the pooler did not see it: other descriptions
                // may be stale too.
                crate::stmt::epoch::advance();
            }
            // The server lost its statements (DISCARD ALL or DEALLOCATE ALL from elsewhere):
            // forget what we believed prepared there, so the next use prepares again.
            b"26000" => {
                self.registry().stats.invalidations.fetch_add(1, Ordering::Relaxed);
                srv.stmts.clear();
            }
            _ => {}
        }
    }

    /// Undoes what a request the server failed or skipped would have done.
    pub(super) fn rollback(&mut self, p: Pending, srv: &mut ServerState) {
        if matches!(p.on_reply, OnReply::ShapeCheck(_) | OnReply::PlainShapeCheck(_)) {
            self.leave(Phase::Held);
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
        if p.fx.closes_leftover {
            // The hostile-client test crashed PostgreSQL 15 so: the Close skipped behind a
            // failed Bind, then an Execute of the portal it was to close.
            self.busy.replies.portal_close_skipped();
        }
        match p.fx.client {
            ClientFx::None => {}
            ClientFx::Named { name } => {
                self.stmts.named.remove(&name);
            }
            ClientFx::ParsedAhead { name } => {
                if p.failed {
                    self.stmts.named.remove(&name);
                }
            }
            ClientFx::Unnamed => {
                self.stmts.unnamed = Unnamed::None;
                if srv.stmts.unnamed_owner.is_some_and(|(u, _)| u == self.kept.uid) {
                    // A failed plain Parse "" dropped the server's unnamed statement; a failed
                    // promoted one (a named server Parse) left it there, but it is no longer
                    // this client's: a later Bind "" must get 26000, as from PostgreSQL.
                    srv.stmts.unnamed_owner = if p.fx.server_parse.is_some() { Some((u64::MAX, 0)) } else { None };
                }
            }
            ClientFx::Closed { name, named } => {
                self.stmts.named.restore(name, *named);
            }
            ClientFx::ClearedAll { saved } => self.stmts.named.restore_all(*saved),
        }
    }
}
