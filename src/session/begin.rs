//! A lone BEGIN answered here (`defer_begin`, transaction pooling): a client with no server
//! that sends a simple Query holding only BEGIN (or START TRANSACTION) gets PostgreSQL's
//! answer at once, and the BEGIN goes to the server the transaction's first statement is
//! linked to, in the same write, ahead of it (after the client's settings: `linking`). The
//! transaction then costs one server round trip less, and holds no server while the
//! client has not sent anything else. PostgreSQL takes a transaction's snapshot at its
//! first statement, not at BEGIN, so nothing the transaction reads changes; only its start
//! timestamp (`now()`, `xact_start`) is taken when the BEGIN reaches the server.
//!
//! A block ended before anything ran in it (BEGIN, then COMMIT or ROLLBACK) needs no
//! server at all: its end is answered here too.
//!
//! Owns: the deferred BEGIN, from the answer to the link that sends it (or the answer to
//! the block's end). Must not touch what a linked session does with a BEGIN (it goes to
//! its server as written).

use super::reply_queue::Purpose;
use super::settings::{TxStmt, bare_tx_stmt, maybe_tx_end, maybe_tx_start};
use super::{Link, Phase, Session};
use crate::config::PoolMode;
use crate::state::{ServerState, TxStatus};

/// Fails the server's block for a deferred block the client saw fail; its error is hidden.
const FAIL_BLOCK: &str =
    "DO $$BEGIN RAISE EXCEPTION 'parsnip: this client''s wait for a server failed in this transaction'; END$$";

impl Session {
    /// A simple Query from a client with no server: if it is a lone BEGIN the session may
    /// answer (see the module), it is answered; true then.
    pub(super) fn on_lone_begin(&mut self, frame: &[u8]) -> bool {
        if !self.kept.defer_begin
            || self.kept.mode != PoolMode::Transaction
            || self.link != Link::Unlinked
            || self.busy.phase != Phase::Ready
            || self.busy.tx.status != TxStatus::Idle
            || self.busy.tx.opening
            || !self.busy.replies.is_empty()
            || self.busy.replies.is_unsynced()
            || self.autoprep_feeding()
        {
            return false;
        }
        let begin = self.query_text_of(frame).filter(|t| maybe_tx_start(t)).and_then(bare_tx_stmt);
        if begin != Some(TxStmt::Begin) {
            return false;
        }
        self.answered_here(Some("BEGIN"), TxStatus::InBlock);
        self.busy.tx.begin_deferred = true;
        true
    }

    /// A simple Query that only ends a block nothing ran in yet (a deferred BEGIN, then
    /// COMMIT, END, ROLLBACK or ABORT): answered here as PostgreSQL answers it, with no
    /// server. True then.
    pub(super) fn on_deferred_end(&mut self, frame: &[u8]) -> bool {
        if !self.busy.tx.begin_deferred
            || self.link != Link::Unlinked
            || self.busy.phase != Phase::Ready
            || self.busy.tx.status == TxStatus::Idle
            || !self.busy.replies.is_empty()
            || self.listen_pending_in_tx()
        {
            return false;
        }
        let tag = match self.query_text_of(frame).filter(|t| maybe_tx_end(t)).and_then(bare_tx_stmt) {
            Some(TxStmt::Commit) => "COMMIT",
            Some(TxStmt::Rollback) => "ROLLBACK",
            _ => return false,
        };
        // PostgreSQL answers a COMMIT of a failed block with ROLLBACK.
        let tag = if self.busy.tx.status == TxStatus::Failed { "ROLLBACK" } else { tag };
        self.busy.tx.begin_deferred = false;
        self.answered_here(Some(tag), TxStatus::Idle);
        true
    }

    /// A server was linked, and the client's settings are on it (or on their way, ahead):
    /// the BEGIN answered here goes now, its replies hidden.
    pub(super) fn send_deferred_begin(&mut self, server: &mut ServerState) {
        if std::mem::take(&mut self.busy.tx.begin_deferred) {
            self.own_query("BEGIN", Purpose::Begin, server);
            if self.busy.tx.status == TxStatus::Failed {
                // The client's wait for a server failed inside the block (`failure`): the
                // server's block fails too, so that what the client sends next is refused
                // (25P02) and its end rolls back, as PostgreSQL would have had it.
                self.own_query(FAIL_BLOCK, Purpose::FailBlock, server);
            }
        }
    }

    /// Whether the client is in a transaction block no server has seen yet.
    pub(crate) fn begin_deferred(&self) -> bool {
        self.busy.tx.begin_deferred
    }
}
