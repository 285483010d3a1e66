//! Which batches may share their server connection with the next client's batch before
//! their replies are in (pipelining, driven by `driver::pipe`), and what a session must
//! not do once it has let its server go that way.
//!
//! A batch qualifies only when it is sure to leave the server idle, outside a transaction
//! and unchanged for whoever writes behind it: an autocommit batch ended by Sync, made of
//! Bind/Describe/Execute/Close-portal of statements already prepared on that server, or a
//! simple Query, each of them one plain read that takes no row locks
//! (`stmt::sql::is_plain_read`). An error inside such a batch ends at its own Sync and
//! leaves the server idle too, so it cannot leak into the next batch. Everything else keeps
//! the server to itself, as without pipelining.

use super::reply_queue::{ClientFx, OnReply, Purpose, Req};
use super::{Phase, Session};
use crate::config::PoolMode;
use crate::state::TxStatus;
use crate::stmt::registry::StmtKind;
use crate::stmt::{Registry, Statement};
use std::sync::Arc;

/// What `Session::pipelinable` found.
#[derive(Debug)]
pub(crate) struct Pipelinable {
    /// What the batch's run time is recorded on.
    pub(crate) timed: Timed,
    /// Everything it runs recently ran fast enough to have batches queued behind it.
    pub(crate) fast: bool,
}

/// What a batch's run time is recorded on.
#[derive(Debug, Clone)]
pub(crate) enum Timed {
    /// The first statement it binds.
    Stmt(Arc<Statement>),
    /// The pool's simple-protocol plain reads (one figure for all of them).
    SimpleReads(Arc<Registry>),
}

impl Timed {
    /// The batch took `us` µs on the server.
    pub(crate) fn note(&self, us: u64) {
        match self {
            Timed::Stmt(s) => s.runs.note(us),
            Timed::SimpleReads(r) => r.simple_reads.note(us),
        }
    }
}

impl Session {
    /// When everything written to the server is one or more whole batches of the kind
    /// described in the module doc (and the statement cache is on): what the driver times
    /// them for, and whether everything they run recently ran within `limit_us` (a batch
    /// behind a slow one would wait for it). Call only once `to_server` has been written
    /// out. A session whose settings include a timeout (`statement_timeout = 1`, say) is
    /// never lent: the batches written behind it would run, or wait to be read, under that
    /// timeout until their own settings are replayed — and a timeout that fires while the
    /// backend reads a message ends the connection for every batch on it (issue 23's
    /// hostile-client test found it). Nor is one that armed such a timer on this link with
    /// `SET LOCAL`: its signal may outlive the statement (`state::timers`).
    pub(crate) fn pipelinable(&self, limit_us: u32) -> Option<Pipelinable> {
        if !self.to_server.is_empty() {
            return None;
        }
        self.pipelinable_unwritten(limit_us)
    }

    /// `pipelinable` for the batch `to_server` holds, before it is written (the driver
    /// decides from it how to write it).
    pub(crate) fn pipelinable_unwritten(&self, limit_us: u32) -> Option<Pipelinable> {
        let link = self.link.state()?;
        if self.kept.mode == PoolMode::Session
            || self.kept.pins.holds()
            || self.busy.tx.status != TxStatus::Idle
            || self.busy.tx.opening
            || matches!(self.busy.phase, Phase::CopyIn | Phase::Held | Phase::ServerSkipping)
            || link.dirty
            || link.lent
            || self.busy.replies.is_unsynced()
            || self.stmts.dealloc_portal.is_some()
            || self.busy.tx.tracked_portal.is_some()
            || self.stmts.fresh_in_tx.is_some()
            || self.may_be_cancelled()
        {
            return None;
        }
        let registry = self.stmts.registry.as_ref()?;
        let mut ends_batch = false;
        let mut first: Option<Timed> = None;
        let mut fast = true;
        for p in self.busy.replies.iter() {
            ends_batch = matches!(p.req, Req::Sync | Req::Query);
            if p.purpose != Purpose::Client
                || p.tracked_sql.is_some()
                || p.fx.server_parse.is_some()
                || p.fx.server_close.is_some()
                || p.fx.guarded
                || p.fx.guard_parse != 0
                || matches!(p.fx.client, ClientFx::ClearedAll { .. })
            {
                return None;
            }
            match (&p.on_reply, p.req) {
                (OnReply::Synth(_), _) => {}
                (OnReply::Forward, Req::Bind) => match &p.fx.uses {
                    Some(s) if s.kind == StmtKind::Protocol && plain(s) => {
                        fast &= s.runs.known_fast(limit_us);
                        first.get_or_insert_with(|| Timed::Stmt(s.clone()));
                    }
                    _ => return None,
                },
                // A simple Query of one plain read (`forward_query` marks it).
                (OnReply::Forward, Req::Query) if p.plain_read => {
                    fast &= registry.simple_reads.known_fast(limit_us);
                    first.get_or_insert_with(|| Timed::SimpleReads(registry.clone()));
                }
                (OnReply::Forward, Req::Describe | Req::Execute | Req::Close | Req::Sync) => {}
                _ => return None,
            }
        }
        match first {
            Some(timed) if ends_batch => Some(Pipelinable { timed, fast }),
            _ => None,
        }
    }

    /// Whether the client frame that needs a server (`Fed::NeedsServer`) starts a batch
    /// that may run on a standby (`read_write_split`, `driver::split`): a simple Query of
    /// one plain read (`stmt::sql::is_plain_read`: one SELECT, VALUES or TABLE, no locking
    /// clause) outside any transaction, that sets nothing, from a session in transaction or
    /// statement mode and not pinned to its server. Everything else goes to the primary.
    pub(crate) fn is_read_batch(&self, frame: &[u8]) -> bool {
        frame.first() == Some(&crate::protocol::tags::QUERY)
            && self.kept.mode != PoolMode::Session
            && !self.kept.pins.holds()
            && self.busy.tx.status == TxStatus::Idle
            && !self.busy.tx.opening
            && crate::protocol::frontend::query_text(crate::protocol::body(frame)).is_some_and(|text| {
                !super::settings::maybe_setting_stmt(text)
                    && !super::settings::may_set_session_config(text)
                    && crate::stmt::sql::is_plain_read(text)
            })
    }

    /// Whether the batch that asked for a server last is a plain read (`is_read_batch`),
    /// and everything written to that server since too (false once anything else was: a
    /// client that wrote on the primary reads from it for a while, `driver::split`).
    pub(crate) fn wants_reads(&self) -> bool {
        self.busy.wants_reads
    }

    /// Whether the client's pool has a read/write split (`read_write_split`): without one,
    /// no batch is looked at for being a plain read.
    pub(crate) fn set_read_split(&mut self, on: bool) {
        self.kept.read_split = on;
    }

    /// Whether a lone BEGIN with no server linked is answered here (`defer_begin`).
    pub(crate) fn set_defer_begin(&mut self, on: bool) {
        self.kept.defer_begin = on;
    }

    /// The driver linked a standby's connection (after `handle_server_linked`) for the
    /// plain read that asked for a server: until it is given back, only plain reads go to
    /// it.
    pub(crate) fn set_on_reads(&mut self) {
        if let Some(l) = self.link.state_mut() {
            l.on_reads = true;
        }
    }

    /// The driver linked a shared connection with another client's batch still in flight
    /// before this session's (after `handle_server_linked`): the executions of this batch
    /// wait for that one, so their times are not server times (`timing`).
    pub(crate) fn set_behind(&mut self) {
        if let Some(l) = self.link.state_mut() {
            l.behind = true;
        }
    }

    /// The driver let the server take another client's batch behind this session's: from
    /// now until the server is released, nothing more may be written to it (the bytes
    /// would land behind the other batch). A transparent retry then re-prepares on the
    /// next server the client gets instead of closing the stale statement here.
    pub(crate) fn set_lent(&mut self) {
        if let Some(l) = self.link.state_mut() {
            l.lent = true;
        }
    }

    /// ReadyForQuery messages the server still owes this session (one per Sync, Query or
    /// FunctionCall sent and not yet answered): where its replies end on a shared
    /// connection when nobody reads them for it any more.
    pub(crate) fn owed_ready(&self) -> usize {
        self.busy
            .replies
            .iter()
            .filter(|p| matches!(p.req, Req::Sync | Req::Query | Req::FunctionCall) && !p.is_synth())
            .count()
    }

    /// Everything the client sent for its current batch is written out: nothing left for the
    /// server, and no frame held for a statement's shape check.
    pub(crate) fn batch_written(&self) -> bool {
        self.to_server.is_empty() && self.busy.phase != super::Phase::Held
    }

    /// The backend runs the client's own request now: its batch is written out
    /// (`batch_written`) and no request of the link's own (settings replayed, a cancel
    /// absorbed, the deferred BEGIN) is ahead of it. A cancel sent before would reach the
    /// pooler's request, or a backend waiting for its next message, which drops it.
    pub(crate) fn request_running(&self) -> bool {
        self.batch_written() && !self.busy.replies.head().is_some_and(|p| p.purpose.opens_link())
    }

    /// How many requests the session has queued for its servers (wrapping): a new one
    /// changes it.
    pub(crate) fn requests_sent(&self) -> u32 {
        self.busy.replies.pushes
    }

    /// What the linked backend is doing for the client (`driver::cancel` forwards a cancel
    /// at once only while it runs the client's request).
    pub(crate) fn backend_phase(&self) -> BackendPhase {
        if !self.request_running() {
            BackendPhase::Holding
        } else if self.busy.replies.is_empty() {
            BackendPhase::Idle
        } else {
            BackendPhase::Running
        }
    }

    /// Whether `set_lent` was called since the server was linked.
    #[cfg(test)]
    pub(crate) fn is_lent(&self) -> bool {
        self.link.state().is_some_and(|l| l.lent)
    }
}

/// One plain read taking no row locks (`stmt::sql::is_plain_read`): never a write, which
/// may wait for another transaction's row lock while the batches behind it wait too.
fn plain(s: &crate::stmt::Statement) -> bool {
    // The text never changes: classified once, remembered in the statement.
    s.plain_read.get_or_init(|| crate::stmt::sql::is_plain_read(&s.query))
}

/// What a client's linked backend is doing for it (`Session::backend_phase`; the driver
/// keeps it with the client's cancel slot, `CancelSlot::set_phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum BackendPhase {
    /// Nothing: no server, or the client's requests are all answered. A cancel now is
    /// forwarded, and the backend drops it, as PostgreSQL does for an idle session.
    Idle = 0,
    /// The client's request is not running yet: part of its batch is unwritten or held (a
    /// statement's shape check), or the link's own preamble runs ahead of it. A cancel now
    /// would reach the pooler's request, or a backend between two messages, which drops
    /// it: it is armed, and sent when the request runs.
    Holding = 1,
    /// The client's batch is written and its replies are outstanding.
    Running = 2,
}
