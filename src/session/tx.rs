//! The client's transaction as the session follows it: the status ReadyForQuery reports,
//! and the settings made inside it, applied when it commits and dropped when it rolls back.

use super::Session;
use super::settings::{self, SettingStmt, TxStmt};
use crate::state::settings::{Settings, tracked_name};
use crate::state::{ServerState, TxStatus};
use std::sync::Arc;

/// A portal bound to a tracked statement: (portal name, statement text).
pub(super) type TrackedPortal = (Box<[u8]>, Box<str>);

/// What the session knows of the client's transaction.
#[derive(Debug, Default)]
pub(super) struct TxState {
    /// The status the last ReadyForQuery reported to the client.
    pub(super) status: TxStatus,
    /// A BEGIN (or START TRANSACTION) was sent since the last ReadyForQuery: what follows
    /// it runs in a transaction block although no ReadyForQuery has said so yet.
    pub(super) opening: bool,
    /// A BEGIN was answered here and no server has seen it yet (`begin`): it goes to the
    /// next server linked, ahead of the client's frames.
    pub(super) begin_deferred: bool,
    /// The unnamed portal bound here to the client's statement `BEGIN`, not yet executed
    /// (`begin`).
    pub(super) begin_bind: Option<super::begin::BeginBind>,
    /// Settings made inside the open transaction: kept if it commits.
    pub(super) settings: Vec<SettingStmt>,
    /// The portal bound to a SET/RESET/DISCARD or transaction-control statement, and its
    /// text: its Execute is tracked like a simple Query's (see `ext_done`).
    pub(super) tracked_portal: Option<Box<TrackedPortal>>,
    /// Tracked statements the server completed through the extended protocol since the last
    /// ReadyForQuery, in order; applied or dropped there, as the transaction ends.
    pub(super) ext_done: Vec<Box<str>>,
    /// An extended-protocol request failed since the last ReadyForQuery.
    pub(super) ext_failed: bool,
    /// A statement that may change the schema was sent (`stmt::sql::may_change_schema`):
    /// the shape epoch moves again when the transaction it ran in ends.
    pub(super) schema_change: bool,
    /// Settings `set_config` may have changed, to ask the server about before it is given
    /// back (`config`).
    pub(super) config: Option<Box<super::config::ConfigCheck>>,
}

impl TxState {
    /// ReadyForQuery reported `status`: whether a transaction that may have changed the
    /// schema (`schema_change`) ended with it, committed or not.
    pub(super) fn schema_change_ended(&mut self, status: TxStatus) -> bool {
        status == TxStatus::Idle && std::mem::take(&mut self.schema_change)
    }

    /// Inside a transaction block, as far as the requests sent so far tell.
    pub(super) fn in_block(&self) -> bool {
        self.status == TxStatus::InBlock || (self.status == TxStatus::Idle && self.opening)
    }

    /// The client sent `sql` (a simple Query, or the statement of a portal it executes):
    /// a transaction block starts there if it succeeds (pgjdbc sends its BEGIN in the same
    /// batch as the transaction's first statements).
    pub(super) fn note_start(&mut self, sql: &[u8]) {
        if self.status == TxStatus::Idle && crate::session::settings::maybe_tx_start(sql) {
            self.opening = true;
        }
    }

    /// Nothing of a transaction: idle, none opening, nothing tracked or pending for its end.
    /// Names every field, so that a new one is not forgotten.
    pub(super) fn is_blank(&self) -> bool {
        let TxState {
            status,
            opening,
            begin_deferred,
            begin_bind,
            settings,
            tracked_portal,
            ext_done,
            ext_failed,
            schema_change,
            config,
        } = self;
        *status == TxStatus::Idle
            && !opening
            && !begin_deferred
            && begin_bind.is_none()
            && settings.is_empty()
            && tracked_portal.is_none()
            && ext_done.is_empty()
            && !ext_failed
            && !schema_change
            && config.is_none()
    }
}

impl Session {
    /// The text of a setting or transaction statement, to be tracked when it completes
    /// (`track_settings`). One that is not UTF-8 can be neither recorded nor replayed: the
    /// server it runs on is not given to anyone else.
    pub(super) fn text_to_track(&mut self, text: &[u8]) -> Option<Box<str>> {
        let t = std::str::from_utf8(text).ok().map(Into::into);
        self.dirty_server_if(t.is_none());
        t
    }

    /// A Query with SET/RESET/transaction statements finished: keep the settings that
    /// persist as PostgreSQL would (outside a transaction, or in one that committed).
    pub(super) fn track_settings(
        &mut self,
        sql: &str,
        failed: bool,
        was_in_tx: bool,
        status: TxStatus,
        server: &mut ServerState,
    ) {
        if self.busy.tx.settings.is_empty() && !settings::may_hold_setting(sql.as_bytes()) {
            // Transaction control alone, and no setting made in the transaction: nothing to
            // keep or drop.
            return;
        }
        let mut in_tx = was_in_tx;
        let mut apply = Vec::new();
        for t in settings::session_stmts(sql.as_bytes()) {
            match t {
                TxStmt::Begin => in_tx = true,
                TxStmt::Commit => {
                    apply.append(&mut self.busy.tx.settings);
                    in_tx = false;
                }
                TxStmt::Rollback => {
                    self.busy.tx.settings.clear();
                    in_tx = false;
                }
                TxStmt::Setting(s) if in_tx => self.busy.tx.settings.push(s),
                TxStmt::Setting(s) => apply.push(s),
                // Unknown change: that server is not given to anyone else.
                TxStmt::Unreadable => self.dirty_server_if(true),
            }
        }
        if failed && status == TxStatus::Idle {
            // The implicit transaction of this Query failed: nothing of it persists.
            apply.clear();
            self.busy.tx.settings.clear();
        }
        if status == TxStatus::Idle {
            // Ended by something not seen here (e.g. an extended-protocol COMMIT): unknown.
            self.busy.tx.settings.clear();
        }
        if !apply.is_empty() {
            for s in apply {
                apply_setting(Arc::make_mut(&mut self.kept.settings), &mut server.settings, s);
            }
            let t = self.kept.settings.cancel_timer_us();
            self.shorten_timer(t);
        }
    }
}

fn apply_setting(client: &mut Settings, server: &mut Settings, stmt: SettingStmt) {
    match stmt {
        SettingStmt::Set(name, stmt) if tracked_name(&name).is_none() => {
            client.set_extra(name.clone(), stmt.clone());
            server.set_extra(name, stmt);
        }
        SettingStmt::Reset(name) => {
            client.reset_extra(&name);
            server.reset_extra(&name);
        }
        SettingStmt::ResetAll => {
            client.reset_all_extra();
            server.reset_all_extra();
        }
        _ => {}
    }
}
