//! The savepoint guard: a client that parses a statement inside its transaction gets a
//! fresh parse from its own backend, but parsnip answers that Parse from the cache, with
//! a server statement parsed earlier. If a schema change made that plan's result type
//! stale, PostgreSQL answers its first use with 0A000, which would abort the client's
//! transaction where its own backend would have gone on.
//!
//! So the first use (Bind or Describe) of such a statement in the transaction runs between
//! `SAVEPOINT` and `RELEASE`, which the pooler sends itself and hides. On 0A000 (or 26000:
//! the server lost the statement) the pooler rolls back to its savepoint, which leaves the
//! transaction as it was before the use, prepares the statement afresh and replays the
//! client's batch from that use (`Session::try_retry`). Parse-time locks are taken by that
//! first use, so no later use in the transaction needs a guard (as on the client's own
//! backend, where they were taken by its Parse).
//!
//! The commands run through statements and a portal of the pooler's own (never the
//! unnamed ones, which may hold the client's): the statements stay prepared on the server
//! connection (one Parse each per connection), the portal is closed after each use.
//!
//! Owns: which statements await a guard in this transaction. Must not decide retries: that
//! is `statements`.

use super::{ClientStmts, Unnamed};
use crate::protocol::frontend;
use crate::session::Session;
use crate::session::reply_queue::{Fx, OnReply, Pending, Req};
use crate::state::ServerState;
use crate::stmt::Statement;

/// The pooler's portal for its savepoint commands (closed after each).
const PORTAL: &[u8] = b"parsnip_guard";

/// One savepoint command; its statement stays prepared on the server once parsed there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::session) enum GuardCmd {
    Savepoint = 1,
    Release = 2,
    RollbackTo = 4,
}

impl GuardCmd {
    fn statement(self) -> &'static [u8] {
        match self {
            GuardCmd::Savepoint => b"parsnip_guard_savepoint",
            GuardCmd::Release => b"parsnip_guard_release",
            GuardCmd::RollbackTo => b"parsnip_guard_rollback",
        }
    }
    fn sql(self) -> &'static str {
        match self {
            GuardCmd::Savepoint => "SAVEPOINT parsnip_guard",
            GuardCmd::Release => "RELEASE SAVEPOINT parsnip_guard",
            GuardCmd::RollbackTo => "ROLLBACK TO SAVEPOINT parsnip_guard",
        }
    }
}

impl ClientStmts {
    /// A SQL `PREPARE` was answered from the cache with `stmt` (kept for the first
    /// EXECUTE; at most a few dozen, the oldest forgotten).
    pub(super) fn note_fresh_sql(&mut self, stmt: &Statement) {
        let ids = self.fresh_sql.get_or_insert_with(Default::default);
        if !ids.contains(&stmt.id) {
            if ids.len() >= 64 {
                ids.remove(0);
            }
            ids.push(stmt.id);
        }
    }

    /// The client EXECUTEs `stmt`: whether it is its first EXECUTE since a PREPARE the
    /// cache answered.
    pub(super) fn take_fresh_sql(&mut self, stmt: &Statement) -> bool {
        let Some(ids) = self.fresh_sql.as_mut() else { return false };
        let Some(i) = ids.iter().position(|&id| id == stmt.id) else { return false };
        ids.remove(i);
        if ids.is_empty() {
            self.fresh_sql = None;
        }
        true
    }

    /// The client runs a statement in its transaction: unless it is plain data
    /// manipulation, it may change a table under the statements it parsed, and then its own
    /// backend would answer their next use with 0A000 too: no guard for them.
    pub(super) fn note_statement_run(&mut self, plain_dml: bool) {
        if !plain_dml {
            self.fresh_in_tx = None;
        }
    }

    /// The transaction ended (or never began): nothing awaits a guard.
    pub(in crate::session) fn end_guards(&mut self) {
        self.fresh_in_tx = None;
    }

    /// `stmt` is used now: no later use in this transaction needs a guard.
    pub(super) fn forget_fresh(&mut self, stmt: &Statement) {
        if let Some(ids) = self.fresh_in_tx.as_mut() {
            ids.retain(|&id| id != stmt.id);
            if ids.is_empty() {
                self.fresh_in_tx = None;
            }
        }
    }
}

/// `stmt` was described as returning no rows (NoData).
pub(super) fn returns_nothing(stmt: &Statement) -> bool {
    stmt.shape.get().is_some_and(|f| f.first() == Some(&crate::protocol::tags::NO_DATA))
}

/// Whether the cache may serve `stmt` inside a transaction block with no guard: it returns
/// nothing (its replan cannot fail with 0A000), or no server has run it yet (it is prepared
/// afresh where it is used).
pub(super) fn needs_no_guard(stmt: &Statement) -> bool {
    returns_nothing(stmt) || !stmt.is_valid()
}

impl Session {
    /// Whether the cache serves `stmt` to this client inside a transaction block: what
    /// needs no guard, always; a statement that returns rows, under a savepoint guard at its
    /// first use there (which costs PostgreSQL less than parsing and planning it again),
    /// only where a 0A000 can be retried (`retryable`): an autoprepared Query, whose batch
    /// parsnip ends with a Sync itself, or a client's extended batch whose Sync the driver
    /// has already read (`Session::note_synced_ahead`); and not for a client that
    /// pipelines inside blocks (`hold_behind_guard`). A client's own extended batch may
    /// end with Flush instead (node-postgres' pg-cursor reads a portal in chunks so),
    /// where no retry is possible and PostgreSQL, parsing afresh, would not have failed.
    pub(super) fn serves_in_block(&self, stmt: &Statement, retryable: bool) -> bool {
        needs_no_guard(stmt) || retryable && !self.stmts.pipelines_in_block
    }

    /// Whether a client frame must wait because a use sent under a savepoint guard, in a
    /// batch the client already ended, is still unanswered. Should that use fail with
    /// 0A000, the pooler rolls back to the savepoint and replays the batch (`try_retry`),
    /// which it can do only while nothing the client sent after the batch has reached the
    /// server: a later COMMIT would otherwise end the failed transaction. The client is
    /// then known to pipeline inside blocks and its autoprepared reads there go as the
    /// Queries they are (`serves_in_block`), so they hold it at most once; a named
    /// statement it parses inside a transaction is still guarded at its first use, and
    /// each such use holds what follows it.
    pub(in crate::session) fn hold_behind_guard(&mut self) -> bool {
        if !self.stmts.guard_in_flight {
            return false;
        }
        // A guarded use queued, and after it the end of its batch: its Sync (or the guarded
        // request is a simple Query, a batch of its own).
        let (mut guarded, mut ended) = (false, false);
        for p in self.busy.replies.iter() {
            if p.fx.guarded {
                guarded = true;
                ended = p.req == Req::Query;
            } else if guarded && p.req == Req::Sync && !p.is_synth() {
                ended = true;
            }
            if ended {
                break;
            }
        }
        if !guarded {
            self.stmts.guard_in_flight = false;
        }
        if ended {
            self.stmts.pipelines_in_block = true;
        }
        ended
    }

    /// A Parse inside a transaction block was answered from the cache with `stmt`: its
    /// first use is guarded, unless it is known to return no rows (its shape is NoData: an
    /// INSERT, UPDATE or DELETE without RETURNING). PostgreSQL raises 0A000 only when a
    /// replanned statement's result type differs from the one it was prepared with, and a
    /// statement that returns nothing has none to differ (its replan is silent, as the
    /// client's own fresh Parse would be). A rule created meanwhile that makes such a
    /// statement return rows is the exception this leaves out.
    pub(super) fn note_fresh_parse(&mut self, stmt: &Statement) {
        if self.busy.tx.in_block() && !returns_nothing(stmt) {
            let ids = self.stmts.fresh_in_tx.get_or_insert_with(Default::default);
            if !ids.contains(&stmt.id) {
                ids.push(stmt.id);
            }
        }
    }

    /// If a Bind or Describe of the client's statement `name` is the first use of a
    /// statement it parsed in this transaction, already prepared on the server (one the
    /// server has to parse now is fresh anyway): that statement's id.
    pub(super) fn guard_wanted(&self, name: &[u8], srv: &ServerState) -> Option<u64> {
        let ids = self.stmts.fresh_in_tx.as_ref().filter(|_| self.busy.tx.in_block() && !self.busy.retry.retried)?;
        let stmt = if name.is_empty() {
            match &self.stmts.unnamed {
                Unnamed::Cached(s) => s,
                _ => return None,
            }
        } else {
            self.stmts.named.get(name)?
        };
        (ids.contains(&stmt.id) && srv.stmts.has(stmt)).then_some(stmt.id)
    }

    /// Opens the guard before the first use of `stmt`.
    pub(super) fn open_guard(&mut self, stmt: &Statement, srv: &mut ServerState) {
        self.guarding(stmt);
        self.guard_command(GuardCmd::Savepoint, srv);
    }

    /// The first use of `stmt` in this transaction is being sent under a guard (its
    /// SAVEPOINT next): no later use needs one, and what the client sends behind it may
    /// have to wait for its answer (`hold_behind_guard`).
    pub(super) fn guarding(&mut self, stmt: &Statement) {
        self.stmts.forget_fresh(stmt);
        self.stmts.guard_in_flight = true;
    }

    /// Runs a savepoint command as a simple Query of the pooler's (around a client's SQL
    /// `EXECUTE`, itself a simple Query: no unnamed statement or portal of the client's is
    /// lost that its own Query would not drop anyway). Every reply is hidden.
    pub(in crate::session) fn guard_query(&mut self, cmd: GuardCmd, purpose: crate::session::reply_queue::Purpose) {
        crate::protocol::frontend::query(&mut self.to_server, cmd.sql());
        self.busy.replies.push(Pending::internal(Req::Query, purpose));
    }

    /// Runs one savepoint command on the server on the pooler's behalf (parsing its
    /// statement there first if needed); an error in it is forwarded (the server then
    /// skips the client's requests up to its Sync), every other reply is dropped.
    pub(in crate::session) fn guard_command(&mut self, cmd: GuardCmd, srv: &mut ServerState) {
        let name = cmd.statement();
        if srv.stmts.guard & cmd as u8 == 0 {
            srv.stmts.guard |= cmd as u8;
            frontend::parse(&mut self.to_server, name, cmd.sql().as_bytes(), &[]);
            let fx = Fx { guard_parse: cmd as u8, ..Fx::default() };
            self.busy.replies.push(Pending::with(Req::Parse, OnReply::Inject, fx));
        }
        frontend::bind_no_params(&mut self.to_server, PORTAL, name);
        frontend::execute(&mut self.to_server, PORTAL);
        frontend::close_portal(&mut self.to_server, PORTAL);
        for req in [Req::Bind, Req::Execute, Req::Close] {
            self.busy.replies.push(Pending::with(req, OnReply::Inject, Fx::default()));
        }
    }
}
