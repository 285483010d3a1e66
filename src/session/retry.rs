//! Transparent retry: the client's batch is kept while it is sent, so that when a cached
//! statement turns out stale (0A000) or lost (26000) where PostgreSQL would not have
//! failed, the statement is prepared afresh and the batch replayed, hiding the error.

use super::Session;
use super::reply_queue::{Fx, OnReply, Purpose, Req};
use super::stmts::describes_portal;
use super::stmts::guard::GuardCmd;
use crate::protocol::tags;
use crate::state::{ServerState, TxStatus};
use crate::stmt::Statement;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The client's batch as kept for a retry, and whether one is under way.
#[derive(Debug, Default)]
pub(super) struct Retry {
    /// The client's frames of the batch being sent (outside transactions), and of the last
    /// batch ended by Sync: replayed after a transparent re-prepare.
    pub(super) batch: Vec<u8>,
    pub(super) last_batch: Vec<u8>,
    /// Where the frame being handled starts in `batch`.
    pub(super) frame_at: u32,
    /// An Execute was sent since the last Sync: the batch has had effects (a BEGIN, a write
    /// in its implicit transaction) that an error rolls back or aborts, so replaying only
    /// its failed tail would be wrong. No transparent retry then.
    pub(super) batch_executed: bool,
    /// A transparent retry is in flight: never retry it again.
    pub(super) retried: bool,
    /// Client frames to feed again (a retried batch), before any newer ones.
    /// (Boxed twice: one pointer in every session.)
    #[allow(clippy::box_collection)]
    pub(super) replay: Option<Box<Vec<u8>>>,
    /// An autoprepared simple Query whose batch is being fed (`stmts::autoprepare`).
    pub(super) autoprep: Option<Box<crate::session::stmts::autoprepare::AutoPrep>>,
}

impl Retry {
    /// No batch kept or being replayed, no retry under way. What the last batch was may
    /// stay (`forget_last_batch`). Names every field, so that a new one is not forgotten.
    pub(super) fn is_blank(&self) -> bool {
        let Retry { batch, last_batch: _, frame_at: _, batch_executed, retried, replay, autoprep } = self;
        batch.is_empty() && !retried && !batch_executed && replay.is_none() && autoprep.is_none()
    }

    /// Keeps a client frame in the batch being sent.
    pub(super) fn record(&mut self, frame: &[u8]) {
        self.frame_at = self.batch.len() as u32;
        self.batch.extend_from_slice(frame);
    }

    /// A client frame with tag `tag` was handled (`recorded`: kept by `record`;
    /// `consumed`: not to be fed again). A frame fed again is recorded again then; a Sync
    /// ends the batch, which becomes the last one; an Execute makes the batch have effects.
    pub(super) fn frame_handled(&mut self, tag: u8, recorded: bool, consumed: bool) {
        if recorded && !consumed {
            self.batch.truncate(self.frame_at as usize);
        }
        if tag == tags::SYNC && recorded {
            std::mem::swap(&mut self.batch, &mut self.last_batch);
            self.batch.clear();
        }
        match tag {
            tags::EXECUTE => self.batch_executed = true,
            // These end with their own ReadyForQuery, like a Sync.
            tags::SYNC | tags::QUERY | tags::FUNCTION_CALL => self.batch_executed = false,
            _ => {}
        }
    }

    /// Starts a transparent retry: the last batch, from byte `from` on, is to be fed again
    /// (`replay`), and no retry of it will be tried again.
    pub(super) fn replay_last(&mut self, from: u32) {
        self.retried = true;
        let frames = std::mem::take(&mut self.last_batch);
        self.replay = frames.get(from as usize..).map(|f| Box::new(f.to_vec()));
    }

    /// Whether frames wait to be fed again.
    pub(super) fn has_replay(&self) -> bool {
        self.replay.is_some()
    }

    /// The frames to feed again, if any.
    pub(super) fn take_replay(&mut self) -> Option<Vec<u8>> {
        self.replay.take().map(|b| *b)
    }

    /// Forgets the last batch, kept for a retry of its failure: moot once its replies are
    /// all in.
    pub(super) fn forget_last_batch(&mut self) {
        self.last_batch.clear();
        self.frame_at = 0;
    }
}

impl Session {
    /// 0A000 or 26000 answered a Bind or Describe of a cached statement outside a
    /// transaction, or inside one under a savepoint guard (`guard`): when PostgreSQL would
    /// not have failed (the client was never told the old row shape, or its batch describes
    /// the portal; or the server merely lost the statement), prepare the statement afresh
    /// and replay the client's batch from that request, hiding the error (under a guard,
    /// after rolling back to the savepoint). Only when that batch is the last thing sent,
    /// so nothing is reordered.
    pub(super) fn try_retry(&mut self, stmt: &Arc<Statement>, code: &[u8], from: u32, srv: &mut ServerState) -> bool {
        if self.busy.replies.head().is_some_and(|p| p.req == Req::Query) {
            return self.retry_sql_execute(stmt, code, srv);
        }
        let guarded = self.busy.replies.head().is_some_and(|p| p.fx.guarded);
        if self.busy.retry.retried
            || !(self.busy.tx.status == TxStatus::Idle || guarded)
            || !self.busy.retry.batch.is_empty()
        {
            return false;
        }
        let last_sync = self.busy.replies.iter().position(|p| p.req == Req::Sync && !p.is_synth());
        if last_sync != Some(self.busy.replies.len() - 1) {
            return false;
        }
        let Some(tail) = self.busy.retry.last_batch.get(from as usize..) else { return false };
        // A frame of it was streamed (`inflow`): its body was never kept.
        if super::inflow::holds_stub(tail) {
            return false;
        }
        if code == b"0A000" && self.stmts.described.contains(&stmt.id) && !describes_portal(tail) {
            return false;
        }
        // An autoprepared Query's batch: its replay is fed as one again.
        let simple = self.busy.replies.head().and_then(|p| p.simple.clone());
        // The failed Bind and what the server skips after it.
        if let Some(p) = self.busy.replies.pop() {
            self.rollback(p, srv);
        }
        while let Some(p) = self.busy.replies.pop_unless_sync() {
            self.rollback(p, srv);
        }
        // The Sync already sent: its ReadyForQuery is not the client's any more.
        if let Some(p) = self.busy.replies.head_mut() {
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
            if !self.link.state().is_some_and(|l| l.lent) {
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
        self.stmts.remap(stmt, &fresh);
        registry.stats.retries.fetch_add(1, Ordering::Relaxed);
        let code = String::from_utf8_lossy(code);
        tracing::debug!(statement = %stmt.server_name, code = %code, "re-prepared and retried transparently");
        // The driver feeds these frames again before anything else the client sent, through
        // the normal path (so a frame that must wait, waits).
        // An autoprepared Query's batch is replayed whole: its unnamed statement is gone
        // once its Sync was fed.
        self.busy.retry.replay_last(if simple.is_some() { 0 } else { from });
        if let (Some(edits), Some(replay)) = (simple, self.busy.retry.replay.as_deref()) {
            let mut n = 0u8;
            let mut rest: &[u8] = replay;
            while let Ok(Some(len)) = crate::protocol::split_frame(rest, usize::MAX) {
                n = n.saturating_add(1);
                rest = &rest[len..];
            }
            self.autoprep_replay(edits, n);
        }
        true
    }

    /// 0A000 answered a client's first SQL `EXECUTE` (a simple Query, sent alone) after a
    /// PREPARE the cache answered with an older plan: PostgreSQL would have prepared afresh
    /// and answered rows of the new shape (each EXECUTE result carries its own row
    /// description). The error and its ReadyForQuery are hidden (under a guard,
    /// the transaction is rolled back to the savepoint), the statement goes stale, and the
    /// client's Query is fed again against the current generation.
    pub(super) fn retry_sql_execute(&mut self, stmt: &Arc<Statement>, code: &[u8], srv: &mut ServerState) -> bool {
        let Some(head) = self.busy.replies.head() else { return false };
        let guarded = head.fx.guarded;
        // Nothing was sent after it but its guard's RELEASE.
        if code != b"0A000" || self.busy.retry.retried || self.busy.replies.len() != 1 + usize::from(guarded) {
            return false;
        }
        for p in self.busy.replies.iter_mut() {
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
        self.stmts.remap(stmt, &fresh);
        registry.stats.retries.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(statement = %stmt.server_name, "SQL EXECUTE re-prepared and retried transparently");
        self.busy.retry.replay_last(0);
        true
    }

    /// Where a transparent retry of the frame being handled would start, if one is allowed:
    /// outside a transaction, not twice, and only while nothing in this batch has executed
    /// (an earlier BEGIN or write would be aborted or rolled back by the error).
    pub(super) fn retry_point(&self) -> Option<u32> {
        (self.busy.tx.status == TxStatus::Idle && !self.busy.retry.retried && !self.busy.retry.batch_executed)
            .then_some(self.busy.retry.frame_at)
    }
}
