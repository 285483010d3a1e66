//! SQL-level statements in a simple Query with the cache on: PREPARE answered from the
//! cache, EXECUTE renamed to the server's statement (preparing it there first), and
//! DEALLOCATE / DISCARD ALL applied to the client's names.

use super::guard::GuardCmd;
use super::view::Shown;
use super::{Unnamed, char_len, duplicate, missing, stale_plan, too_many};
use crate::protocol::frontend;
use crate::session::Session;
use crate::session::reply_queue::{ClientFx, Fx, OnReply, Pending, Purpose, Rename, Req, Synth};
use crate::state::{ServerState, TxStatus};
use crate::stmt::registry::{StmtKind, make_key};
use crate::stmt::sql::{Classified, SqlStmt, classify_marked, is_plain_dml, prepare_body};
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Session {
    /// A simple Query with the cache on: SQL-level statement commands are handled here,
    /// one handler each. Returns false when the Query must wait for replies to what was
    /// sent before it.
    pub(in crate::session) fn on_query_cached(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let text = self.query_text_of(frame).unwrap_or_default();
        let class = classify_marked(text, self.query_marks(text));
        if self.stmts.fresh_in_tx.is_some() {
            let dml = self.may_write(&class, text);
            self.stmts.note_statement_run(dml);
        }
        // In a failed transaction PostgreSQL rejects every command with 25P02: let it.
        if self.busy.tx.status == TxStatus::Failed {
            self.forward_query(frame);
            return true;
        }
        match class {
            Classified::Plain => {
                if let Some(done) = self.query_reading_view(text) {
                    return done;
                }
                if self.try_autoprepare(text, srv) {
                    return true;
                }
                self.busy.tx.note_start(text);
                self.forward_query(frame)
            }
            // A lone LISTEN the session did not answer (`notify`): the server runs it.
            Classified::Single(SqlStmt::Listen(_)) => {
                self.busy.tx.note_start(text);
                self.forward_query(frame)
            }
            Classified::Multi(stmts) => return self.on_sql_script(frame, text, stmts, srv),
            Classified::Single(SqlStmt::Deallocate(name)) => self.on_sql_deallocate(name, srv),
            Classified::Single(SqlStmt::DiscardAll) => self.on_sql_discard_all(frame, srv),
            Classified::Single(SqlStmt::Prepare { name, rest }) => self.on_sql_prepare(text, &name, rest, srv),
            Classified::Single(SqlStmt::Execute { name, span }) => {
                return self.on_sql_execute(frame, text, &name, span, srv);
            }
        }
        true
    }

    /// Whether a Query may change a table under statements parsed in the transaction (plain
    /// DML, a PREPARE, or the EXECUTE of a PREPAREd DML statement).
    fn may_write(&self, class: &Classified, text: &[u8]) -> bool {
        match class {
            Classified::Plain => is_plain_dml(text),
            Classified::Single(SqlStmt::Prepare { .. }) => true,
            Classified::Single(SqlStmt::Execute { name, .. }) => self
                .stmts
                .named
                .get(name.as_slice())
                .is_some_and(|s| s.kind == StmtKind::Sql && prepare_body(&s.query).is_some_and(is_plain_dml)),
            _ => false,
        }
    }

    /// `DEALLOCATE name` or `DEALLOCATE ALL` (None): the client's names only; the server's
    /// statements stay for others.
    fn on_sql_deallocate(&mut self, name: Option<Vec<u8>>, srv: &mut ServerState) {
        match name {
            None => {
                self.stmts.named.clear();
                self.push_synth(Synth::TagAndReady("DEALLOCATE ALL"), Fx::default());
            }
            Some(name) => match self.stmts.named.remove(name.as_slice()) {
                Some(_) => self.push_synth(Synth::TagAndReady("DEALLOCATE"), Fx::default()),
                None => self.statement_error(missing(&name), Some(srv), true),
            },
        }
    }

    /// `DISCARD ALL`: everything it does except dropping the server's (shared) statements.
    fn on_sql_discard_all(&mut self, frame: &[u8], srv: &mut ServerState) {
        if self.busy.tx.status != TxStatus::Idle {
            // PostgreSQL: DISCARD ALL cannot run inside a transaction block.
            return self.forward_query(frame);
        }
        self.stmts.named.clear();
        self.stmts.unnamed = Unnamed::None;
        Arc::make_mut(&mut self.kept.settings).reset_all_extra();
        srv.settings.reset_all_extra();
        frontend::query(
            &mut self.to_server,
            "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; \
             SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES",
        );
        self.busy.replies.push(Pending::with(Req::Query, OnReply::Skip, Fx::default()));
        self.busy.replies.push(Pending::with(
            Req::Query,
            OnReply::Synth(Synth::TagAndReady("DISCARD ALL")),
            Fx::default(),
        ));
    }

    /// `PREPARE name [(types)] AS statement` (the definition starts at `rest`): answered
    /// from the cache when the statement is known, else prepared on the server under its
    /// server name.
    fn on_sql_prepare(&mut self, text: &[u8], name: &[u8], rest: usize, srv: &mut ServerState) {
        if self.stmts.named.contains_key(name) {
            return self.statement_error(duplicate(name), Some(srv), true);
        }
        let cap = self.registry().cfg.client_cap;
        if self.stmts.named.len() >= cap {
            return self.statement_error(too_many(cap), Some(srv), true);
        }
        let registry = self.registry().clone();
        let def = &text[rest..];
        let mut k = std::mem::take(&mut self.busy.key_buf);
        make_key(&mut k, &StmtKind::Sql, self.search_path(), def, b"");
        let stmt = registry.get_or_insert(&k, StmtKind::Sql, def, b"");
        self.busy.key_buf = k;
        // PostgreSQL's view shows the whole Query text of a PREPARE.
        let shown = Shown::prepared(text.into(), char_len(&text[..rest]), self.busy.clock_us);
        self.stmts.named.insert(name.into(), stmt.clone(), shown);
        let client = ClientFx::Named { name: name.into() };
        if stmt.is_valid() || srv.stmts.has(&stmt) {
            self.note_fresh_parse(&stmt);
            self.stmts.note_fresh_sql(&stmt);
            self.push_synth(Synth::TagAndReady("PREPARE"), Fx { client, ..Fx::default() });
        } else {
            self.ensure_on_server(srv, &stmt, OnReply::Inject, client, name);
            self.busy.replies.push(Pending::with(Req::Execute, OnReply::Synth(Synth::Tag("PREPARE")), Fx::default()));
            frontend::sync(&mut self.to_server);
            self.busy.replies.push(Pending::client(Req::Sync));
        }
    }

    /// `EXECUTE name(...)` (the name at `span`): renamed to the server's statement, which is
    /// prepared there first if missing; retried after a stale plan where PostgreSQL would
    /// have prepared afresh. False: wait for a PREPARE or Close still in flight.
    fn on_sql_execute(
        &mut self,
        frame: &[u8],
        text: &[u8],
        name: &[u8],
        span: std::ops::Range<usize>,
        srv: &mut ServerState,
    ) -> bool {
        let Some(stmt) = self.stmts.named.get(name).cloned() else {
            self.forward_query(frame);
            return true;
        };
        if self.stmt_pending_across_sync(&stmt) {
            // Whether the server has it depends on a PREPARE (or Close) still in flight.
            return false;
        }
        let fresh = self.stmts.take_fresh_sql(&stmt);
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
        let alone = !self.busy.retry.retried && !self.busy.replies.is_unsynced() && !self.earlier_batch_in_flight();
        let guarded = alone && srv.stmts.has(&stmt) && self.guard_wanted(name, srv) == Some(stmt.id);
        let retry = alone && ((fresh && self.busy.tx.status == TxStatus::Idle) || guarded);
        if guarded {
            self.guarding(&stmt);
            self.guard_query(GuardCmd::Savepoint, Purpose::Guard);
        }
        if retry {
            self.busy.retry.last_batch.clear();
            self.busy.retry.last_batch.extend_from_slice(frame);
        }
        let synced = !self.busy.replies.is_unsynced();
        if self.ensure_on_server(srv, &stmt, OnReply::Inject, ClientFx::None, name) && synced {
            // The PREPARE ran through the extended protocol: end its implicit
            // transaction before the client's Query (PostgreSQL 18 keeps it open
            // across a simple Query, whose ReadyForQuery would then say T), and stop
            // there if it fails (`answer_after_prepare_sync`).
            frontend::sync(&mut self.to_server);
            self.busy.replies.push(Pending::internal(Req::Sync, Purpose::Prepare));
        }
        let mut sql = Vec::with_capacity(text.len() + 16);
        sql.extend_from_slice(&text[..span.start]);
        sql.extend_from_slice(stmt.server_name.as_bytes());
        sql.extend_from_slice(&text[span.end..]);
        frontend::query_bytes(&mut self.to_server, &sql);
        let rename = Rename {
            server_name: stmt.server_name.clone(),
            client_name: String::from_utf8_lossy(name).into(),
            from: char_len(&text[..span.start]) + stmt.server_name.len() as i64 + 1,
            shift: char_len(&text[span.clone()]) - stmt.server_name.len() as i64,
        };
        let replay_from = retry.then_some(0);
        let tracked = self.note_executed(&stmt);
        let fx = Fx { uses: Some(stmt), rename: Some(Box::new(rename)), replay_from, guarded, ..Fx::default() };
        let mut p = Pending::with(Req::Query, OnReply::Forward, fx);
        p.tracked_sql = tracked;
        self.busy.replies.push(p);
        if guarded {
            self.guard_query(GuardCmd::Release, Purpose::Guard);
        }
        true
    }

    /// `stmt`, run by name by a SQL `EXECUTE` (alone or in a script, also under `EXPLAIN` or
    /// `CREATE TABLE … AS`), runs its own text, not the Query's: what the session learns
    /// from a text it learns from that one, as a Bind of the statement does (`portal`) —
    /// its `set_config` calls, the session state it may begin or end (pins), a `SET LOCAL`
    /// timer, a transaction it opens. Returns its text when it is a setting or transaction
    /// statement, to be tracked with the Query's completion (`track_settings`). (The
    /// concurrent hostile-client test found an `EXECUTE` of a statement parsed as `SET
    /// search_path = …` leaving that setting, unrecorded, on a connection the next client
    /// got.)
    pub(in crate::session) fn note_executed(&mut self, stmt: &crate::stmt::Statement) -> Option<Box<str>> {
        let super::BindText { text, watch } = super::cached_bind_text(stmt);
        let text = text?;
        if watch.sets_config {
            self.note_set_config(text, None);
        }
        if watch.pins_begin || (watch.pins_end && self.kept.pins.reasons != 0) {
            self.note_pins(crate::stmt::sql::Seen { reasons: 0, check: true });
        }
        if !watch.session_stmt {
            return None;
        }
        self.busy.tx.note_start(text);
        self.shorten_timer(crate::state::timers::local_timer_us(text));
        self.text_to_track(text)
    }
}
