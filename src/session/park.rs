//! Parking an idle session: what a client with no server, no request in flight and nothing
//! to write must keep (its settings, its prepared statements, its counts) is moved into a
//! small [`Parked`] value, and the rest of the session (reply queue, output buffers,
//! transaction and retry state: most of its size) is left blank, for the driver to reuse for
//! whichever client becomes active next. An idle client then holds only the `Parked`.
//!
//! Owns the line between the two halves: `at_rest` says when nothing of the busy half
//! would be lost. Must not touch sockets or free lists; the driver keeps the blank sessions.

use super::stmts::{ClientStmts, Unnamed};
use super::{Link, Phase, Session, Tally};
use crate::config::PoolMode;
use crate::state::TxStatus;
use crate::state::settings::Settings;
use crate::stmt::Registry;
use std::sync::Arc;

/// What an idle client keeps of its session (see the module doc).
#[derive(Debug)]
pub struct Parked {
    settings: Arc<Settings>,
    uid: u64,
    tally: Tally,
    stmts: ParkedStmts,
    mode: PoolMode,
    read_split: bool,
}

/// An idle client's prepared statements: without any (the client sends simple Queries, or
/// only unnamed statements it has closed), two words; otherwise all of them, boxed.
#[derive(Debug)]
enum ParkedStmts {
    None { registry: Option<Arc<Registry>>, unnamed_seq: u64 },
    Some(Box<ClientStmts>),
}

impl Session {
    /// Nothing of the busy half would be lost by parking: no server linked or coming, no
    /// request in flight, nothing to write, no transaction, nothing held for a retry.
    pub(crate) fn at_rest(&self) -> bool {
        let tx = &self.tx;
        let retry = &self.retry;
        self.link == Link::Unlinked
            && self.phase == Phase::Ready
            && self.replies.is_empty()
            && !self.replies.is_unsynced()
            && self.to_client.is_empty()
            && self.to_server.is_empty()
            && self.actions.is_empty()
            && self.acquire_error.is_none()
            && self.param_desc.is_none()
            && !self.pinned
            && tx.status == TxStatus::Idle
            && !tx.opening
            && tx.settings.is_empty()
            && tx.tracked_portal.is_none()
            && tx.ext_done.is_empty()
            && !tx.ext_failed
            && !tx.schema_change
            && retry.batch.is_empty()
            && !retry.retried
            && !retry.batch_executed
            && retry.replay.is_none()
            && retry.autoprep.is_none()
    }

    /// Parks an idle session (`at_rest`): what the client keeps is returned, and this
    /// session is left blank, ready for `unpark`. None (and nothing changes) when the
    /// session is not at rest.
    pub fn park(&mut self) -> Option<Parked> {
        if !self.at_rest() {
            return None;
        }
        // What the last batch was, kept for a retry of its failure, is moot once its
        // replies are all in.
        self.retry.last_batch.clear();
        self.retry.frame_at = 0;
        // Portals end with their transaction: none is left to describe.
        self.stmts.last_bind = None;
        self.stmts.last_plain = None;
        self.stmts.as_sent_next = None;
        // What the last link was (a read pool's, lent to other clients) is set afresh at
        // the next one.
        self.wants_reads = false;
        let stmts = if self.stmts.holds_nothing() {
            let registry = self.stmts.registry.take();
            let unnamed_seq = std::mem::take(&mut self.stmts.unnamed_seq);
            ParkedStmts::None { registry, unnamed_seq }
        } else {
            // The spare box (a blank set of statements) takes the place of the client's.
            let spare = self.spare_stmts.take().unwrap_or_default();
            ParkedStmts::Some(std::mem::replace(&mut self.stmts, spare))
        };
        Some(Parked {
            // The blank session keeps a reference until its next `unpark` replaces it.
            settings: self.settings.clone(),
            uid: self.uid,
            tally: std::mem::take(&mut self.tally),
            stmts,
            mode: self.mode,
            read_split: self.read_split,
        })
    }

    /// Makes this blank session (one `park` left, or `unparked` made) the session of the
    /// client that parked `p`.
    pub fn unpark(&mut self, p: Parked) {
        debug_assert!(self.at_rest() && self.stmts.holds_nothing());
        self.settings = p.settings;
        self.uid = p.uid;
        self.tally = p.tally;
        self.mode = p.mode;
        self.read_split = p.read_split;
        match p.stmts {
            ParkedStmts::None { registry, unnamed_seq } => {
                self.stmts.registry = registry;
                self.stmts.unnamed_seq = unnamed_seq;
            }
            ParkedStmts::Some(b) => {
                // The blank statements stay as the spare: the next client to park keeps
                // its own in their place.
                let blank = std::mem::replace(&mut self.stmts, b);
                if self.spare_stmts.is_none() {
                    self.spare_stmts = Some(blank);
                }
            }
        }
    }

    /// A new session for the client that parked `p` (when no blank one is at hand).
    pub fn unparked(p: Parked) -> Session {
        let mut s = Session::new(p.mode, p.settings.clone(), p.uid, None);
        s.unpark(p);
        s
    }
}

impl ClientStmts {
    /// Nothing but the registry and the Parse sequence: no named, unnamed or SQL-level
    /// statement, nothing described or remembered about one.
    pub(super) fn holds_nothing(&self) -> bool {
        self.named.is_empty()
            && self.sql_prefix.is_empty()
            && matches!(self.unnamed, Unnamed::None)
            && self.described.is_empty()
            && self.last_bind.is_none()
            && self.last_plain.is_none()
            && self.as_sent_next.is_none()
            && self.dealloc_portal.is_none()
            && self.shape_mismatch.is_none()
            && self.fresh_in_tx.is_none()
            && self.fresh_sql.is_none()
    }
}
