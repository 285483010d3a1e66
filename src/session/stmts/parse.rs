//! Parse from the client: answered from the cache (a statement this server already has,
//! or one prepared on it now), promoted (an unnamed statement seen often enough), or
//! passed through; `resolve` finds what a name in Bind or Describe refers to.

use super::view::{Shown, Viewed};
use super::{
    ClientStmts, DEALLOCATE_ALL_STANDIN, Resolved, Unnamed, char_len, duplicate, missing, stale_plan, too_many,
};
use crate::error::Error;
use crate::protocol::frontend::ParseFields;
use crate::protocol::{body, frontend};
use crate::session::reply_queue::{ClientFx, Fx, OnReply, Pending, Rename, Req, Synth};
use crate::session::{Phase, Session};
use crate::state::{ServerState, TxStatus};
use crate::stmt::registry::{StmtKind, make_key};
use crate::stmt::sql::{Classified, SqlStmt, classify, starts_with_deallocate};
use crate::stmt::{Registry, Statement};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What serves an unnamed Parse.
enum Lookup {
    /// A cached statement (promoted).
    Cached(Arc<Statement>),
    /// The server's own unnamed statement.
    Plain,
    /// Decided only with a server linked.
    NeedServer,
    /// The server's own unnamed statement, as the client sent it, its executions measured
    /// for this cached statement of the same text (the plan guard, `stmt::guard`).
    AsSent(Arc<Statement>),
}

impl Session {
    /// Client Parse. Returns false when a server is needed first (or the outcome of an
    /// earlier batch still in flight).
    pub(in crate::session) fn on_parse(&mut self, frame: &[u8], srv: Option<&mut ServerState>) -> bool {
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
        let parsing = (!p.name.is_empty()).then_some((p.name, p.param_types));
        if let Some(viewed) = self.view_rewrite(p.query, parsing) {
            // It reads pg_prepared_statements: the server parses the client's view instead.
            if self.names_in_flight() {
                return false;
            }
            let mut rewritten = bytes::BytesMut::with_capacity(viewed.sql.len() + p.name.len() + 16);
            frontend::parse(&mut rewritten, p.name, &viewed.sql, p.param_types);
            let Some(q) = frontend::parse_fields(body(&rewritten)) else {
                self.fail(Error::protocol("invalid Parse message"));
                return true;
            };
            return self.parse_frame(&rewritten, q, srv, Some(viewed));
        }
        self.parse_frame(frame, p, srv, None)
    }

    /// `on_parse` of `frame` (its fields `p`); `viewed`: it is the rewrite of a client's
    /// Parse that read `pg_prepared_statements` (`view`), the client's own statement.
    fn parse_frame(
        &mut self,
        frame: &[u8],
        p: ParseFields<'_>,
        srv: Option<&mut ServerState>,
        viewed: Option<Viewed>,
    ) -> bool {
        if p.name.is_empty()
            && let Some(v) = viewed
        {
            // Never promoted: the text holds this client's statements.
            let done = self.parse_plain(frame, srv, None);
            if done {
                self.map_errors_of_last(Req::Parse, v.origin);
            }
            return done;
        }
        let registry = self.registry().clone();
        if !p.name.is_empty() {
            if self.pending_across_sync(p.name) {
                // Whether the name exists depends on an earlier batch still in flight.
                return false;
            }
            if let Some(err) = self.stmts.refuse_name(p.name, &registry) {
                if srv.is_none() && self.begin_deferred() {
                    // The error fails the block: on the server that holds it.
                    return self.need_server(&[]);
                }
                self.statement_error(err, srv, false);
                return true;
            }
        }
        let in_failed_tx = self.busy.tx.status == TxStatus::Failed;
        let key = {
            let mut k = std::mem::take(&mut self.busy.key_buf);
            make_key(&mut k, &StmtKind::Protocol, self.search_path(), p.query, p.param_types);
            k
        };
        let cached = if p.name.is_empty() {
            match self.lookup_unnamed(&key, &registry, &p, srv.is_some()) {
                Lookup::Cached(s) => Some(s),
                Lookup::Plain => None,
                Lookup::AsSent(s) if srv.is_some() => {
                    self.busy.key_buf = key;
                    registry.stats.client_parses.fetch_add(1, Ordering::Relaxed);
                    return self.parse_plain(frame, srv, Some(s));
                }
                Lookup::AsSent(s) => {
                    // The choice stands when the Parse is fed again, with a server.
                    self.stmts.as_sent_next = Some(s.id);
                    self.busy.key_buf = key;
                    return self.need_server(&[]);
                }
                Lookup::NeedServer => {
                    self.busy.key_buf = key;
                    return self.need_server(&[]);
                }
            }
        } else {
            Some(registry.for_parse(&key, StmtKind::Protocol, p.query, p.param_types))
        };
        self.busy.key_buf = key;
        if srv.is_none()
            && !self.parses_ahead(&p, in_failed_tx)
            && !cached.as_ref().is_some_and(|s| s.is_valid() && !in_failed_tx)
        {
            return self.need_server(&[]);
        }
        if srv.is_some() && cached.as_ref().is_some_and(|s| self.stmt_pending_across_sync(s)) {
            // Whether the server has it depends on an earlier batch still in flight.
            return false;
        }
        registry.stats.client_parses.fetch_add(1, Ordering::Relaxed);
        match cached {
            Some(stmt) => self.parse_cached(&p, stmt, srv, in_failed_tx, &registry, viewed),
            None => self.parse_plain(frame, srv, None),
        }
    }

    /// Whether the named Parse `p` is answered here before any server checks it: inside a
    /// block only a deferred BEGIN opened (no server linked, nothing run in it), where
    /// waiting for a server can wait for ever. pgbench `-M prepared` prepares each statement
    /// with a blocking call inside its first transaction, and the servers it would wait for
    /// may all be held by other clients of its own thread, which cannot move while it waits.
    /// The server parses the statement ahead of its first use in the block
    /// (`ensure_on_server`); should it refuse the text, that use gets the error, and the
    /// block fails there as it would have at the Parse.
    fn parses_ahead(&self, p: &ParseFields<'_>, in_failed_tx: bool) -> bool {
        !p.name.is_empty() && !in_failed_tx && self.begin_deferred()
    }

    /// What serves an unnamed Parse of the statement `key`: the client's promoted statement,
    /// a promotion now (seen often enough), or the server's own unnamed statement.
    fn lookup_unnamed(&self, key: &[u8], registry: &Registry, p: &ParseFields<'_>, linked: bool) -> Lookup {
        let settled = !self.earlier_batch_in_flight();
        let idle = self.busy.tx.status == TxStatus::Idle && settled;
        // Inside a block, what `serves_in_block` allows: a statement that returns rows (in
        // an autoprepared Query, or a batch read up to its Sync) gets its savepoint guard at
        // its first use there (`note_fresh_parse`).
        let in_block = self.busy.tx.status == TxStatus::InBlock && settled;
        let autoprepared = self.busy.retry.autoprep.is_some();
        let retryable = autoprepared || self.busy.frame_marks.synced_ahead;
        match &self.stmts.unnamed {
            Unnamed::Cached(s)
                if s.has_key(key)
                    && !s.stale.load(Ordering::Relaxed)
                    && !s.infers_stale_types()
                    && (idle || in_block && self.serves_in_block(s, retryable)) =>
            {
                return self.guarded(s.clone(), registry);
            }
            _ => {}
        }
        if !linked {
            // Decided once, with a server: sightings must not be counted twice.
            return Lookup::NeedServer;
        }
        // Promoted outside transactions, with no earlier batch in flight: a promoted
        // statement can go stale under DDL (PostgreSQL re-parses unnamed ones), and only
        // there can that be retried transparently. Inside a block, as above.
        // An autoprepared Query's statement is cached after `autoprepare_after` sightings.
        let after = if autoprepared { registry.cfg.autoprepare_after } else { registry.cfg.promote_unnamed_after };
        if (idle || in_block)
            && let Some(s) = registry.promote_unnamed(key, after, p.query, p.param_types)
            && (idle || self.serves_in_block(&s, retryable))
        {
            return self.guarded(s, registry);
        }
        Lookup::Plain
    }

    /// The cached statement `s` serves an unnamed Parse, unless its plan guard runs this
    /// execution as the client sent it (a baseline sample, or the text is demoted).
    fn guarded(&self, s: Arc<Statement>, registry: &Registry) -> Lookup {
        match s.guard(&registry.cfg) {
            Some(g) if self.stmts.as_sent_next == Some(s.id) || g.as_sent(s.id) => Lookup::AsSent(s),
            _ => Lookup::Cached(s),
        }
    }

    /// A plain unnamed statement: the server parses it; it is remembered for replay.
    fn parse_plain(&mut self, frame: &[u8], srv: Option<&mut ServerState>, measure: Option<Arc<Statement>>) -> bool {
        let Some(srv) = srv else { return self.need_server(&[]) };
        self.stmts.as_sent_next = None;
        self.stmts.unnamed_seq += 1;
        let seq = self.stmts.unnamed_seq;
        self.stmts.unnamed = Unnamed::Plain { frame: frame.to_vec(), seq, measure, shape: None, stale: false };
        srv.stmts.unnamed_owner = Some((self.kept.uid, self.stmts.unnamed_seq));
        self.to_server.extend_from_slice(frame);
        let fx = Fx { client: ClientFx::Unnamed, ..Fx::default() };
        self.busy.replies.push(Pending::with(Req::Parse, OnReply::Forward, fx));
        true
    }

    /// A Parse served by the cached statement `stmt`: answered here when the server has it
    /// (or any server has run it), otherwise prepared on the server.
    fn parse_cached(
        &mut self,
        p: &ParseFields<'_>,
        stmt: Arc<Statement>,
        srv: Option<&mut ServerState>,
        in_failed_tx: bool,
        registry: &Registry,
        viewed: Option<Viewed>,
    ) -> bool {
        let on_server = srv.as_ref().is_some_and(|s| s.stmts.has(&stmt));
        let ahead = srv.is_none() && self.parses_ahead(p, in_failed_tx);
        let local = !in_failed_tx && (on_server || stmt.is_valid()) || ahead;
        if !local && srv.is_none() {
            return self.need_server(&[]);
        }
        if local && self.earlier_batch_in_flight() {
            // An earlier batch may still fail and abort the transaction, and then PostgreSQL
            // answers this Parse with 25P02: wait for it before answering here.
            return false;
        }
        // A fresh Parse is a new statement for the client: any description it had of an
        // earlier one no longer applies.
        self.stmts.described.remove(&stmt.id);
        let client_fx = if p.name.is_empty() {
            self.stmts.unnamed = Unnamed::Cached(stmt.clone());
            ClientFx::Unnamed
        } else {
            let text = viewed.as_ref().map(|v| v.client_text.clone());
            self.stmts.named.insert(p.name.into(), stmt.clone(), Shown::parsed(text, self.busy.clock_us));
            ClientFx::Named { name: p.name.into() }
        };
        if local {
            if !ahead {
                registry.stats.hits.fetch_add(1, Ordering::Relaxed);
            }
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
            self.busy.replies.push(Pending::with(Req::Parse, OnReply::Forward, fx));
        }
        if let Some(v) = viewed
            && !local
        {
            self.map_errors_of_last(Req::Parse, v.origin);
        }
        true
    }

    /// The statement a client name refers to, prepared on `srv`.
    pub(super) fn resolve(&mut self, name: &[u8], srv: &mut ServerState) -> Resolved {
        let cached = if name.is_empty() {
            match &self.stmts.unnamed {
                Unnamed::Cached(s) => s.clone(),
                Unnamed::Plain { frame, seq, shape, stale, .. } => {
                    let (seq, stale) = (*seq, *stale);
                    if srv.stmts.unnamed_owner != Some((self.kept.uid, seq)) {
                        // Parsed on another server (or replaced since): parse it again here.
                        self.to_server.extend_from_slice(frame);
                        srv.stmts.unnamed_owner = Some((self.kept.uid, seq));
                        self.busy.replies.push(Pending::with(Req::Parse, OnReply::Inject, Fx::default()));
                        if shape.is_some() {
                            // The client decodes its rows by the description it was given;
                            // PostgreSQL's statement would keep that shape or answer 0A000.
                            // This parse must describe the same before any row flows.
                            frontend::describe_statement(&mut self.to_server, b"");
                            frontend::flush(&mut self.to_server);
                            let check = OnReply::PlainShapeCheck(seq);
                            self.busy.replies.push(Pending::with(Req::Describe, check, Fx::default()));
                            self.enter(Phase::Held);
                            return Resolved::Held;
                        }
                    }
                    if stale {
                        self.statement_error(stale_plan(), Some(srv), false);
                        return Resolved::Failed;
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
            match self.stmts.named.get(name) {
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
        // A name given before any server checked its statement (`parses_ahead`): this is
        // where a server does.
        let ahead = !name.is_empty() && !cached.validated.load(Ordering::Relaxed);
        let cached = if cached.stale.load(Ordering::Relaxed) && self.stmts.shape_mismatch.is_none() {
            if self.stmts.described.contains(&cached.id) {
                // Known stale and the client holds its old description: PostgreSQL's answer,
                // without parsing it again anywhere.
                self.statement_error(stale_plan(), Some(srv), false);
                return Resolved::Failed;
            }
            // The client never saw the old shape: use the current generation.
            let fresh = self.registry().current(&cached);
            self.stmts.remap(&cached, &fresh);
            fresh
        } else {
            cached
        };
        if self.stmts.shape_mismatch.as_ref().is_some_and(|m| Arc::ptr_eq(m, &cached)) {
            self.stmts.shape_mismatch = None;
            self.statement_error(stale_plan(), Some(srv), false);
            return Resolved::Failed;
        }
        let client = if ahead { ClientFx::ParsedAhead { name: name.into() } } else { ClientFx::None };
        self.ensure_on_server(srv, &cached, OnReply::Inject, client, name);
        if self.busy.phase == Phase::Held {
            return Resolved::Held;
        }
        Resolved::Cached(cached)
    }

    /// How an error of the server's `PREPARE pn_<k> …` for `stmt` reads as PostgreSQL
    /// would word it for the client's own PREPARE of `name`: the client's name, and
    /// positions in the client's text (PostgreSQL points into the PREPARE text also when
    /// the error comes later, from re-planning it for an EXECUTE).
    pub(super) fn prepare_rename(&self, stmt: &Statement, name: &[u8]) -> Rename {
        let ours = ("PREPARE ".len() + stmt.server_name.len() + 1) as i64;
        let theirs = self
            .stmts
            .named
            .entry(name)
            .and_then(|n| n.shown.sql_prefix())
            .map_or_else(|| char_len(b"PREPARE ") + char_len(name) + 1, i64::from);
        Rename {
            server_name: stmt.server_name.clone(),
            client_name: String::from_utf8_lossy(name).into(),
            from: ours + 1,
            shift: theirs - ours,
        }
    }
}

impl ClientStmts {
    /// Why a Parse may not define the name `name`, if it may not: 42P05 for a name in use,
    /// 54000 past the per-client cap.
    fn refuse_name(&self, name: &[u8], registry: &Registry) -> Option<Error> {
        if self.named.contains_key(name) {
            registry.stats.client_parses.fetch_add(1, Ordering::Relaxed);
            return Some(duplicate(name));
        }
        let cap = registry.cfg.client_cap;
        (self.named.len() >= cap).then(|| too_many(cap))
    }
}
