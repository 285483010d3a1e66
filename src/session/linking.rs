//! Linking a server to the session: what runs on it for this client before the client's
//! own requests. A cancel signal its last user may have left is absorbed; timeouts another
//! client left there are reset on their own first, with the client's frames held until
//! that is done (a 1 ms `statement_timeout` would otherwise cancel the replay itself, and
//! close a client that did nothing wrong); then the client's settings are replayed. (A
//! timeout that short never gets here: its server is closed when given back,
//! `state::timers`.)
//!
//! Owns: the requests of a fresh link. Must not touch what the client's frames do.

use super::reply_queue::{Pending, Purpose, Req};
use super::{Link, LinkState, Phase, Session};
use crate::protocol::frontend;
use crate::state::{ServerState, TxStatus};

/// How many times a reset of another client's timeouts is tried when the timeout cancels
/// it (57014) before the client is told. A 1 ms `statement_timeout` cancels the reset
/// whenever the backend is descheduled for a millisecond while it runs, as on a loaded
/// machine (the concurrent hostile-client test saw three in a row fail on 2 busy CPUs);
/// a try costs one round trip, only on that path.
pub(super) const CLEAR_TRIES: u8 = 10;

impl Session {
    /// The pool gave us `server`: replay settings if they differ.
    pub fn handle_server_linked(&mut self, server: &mut ServerState) {
        // A fresh state: nothing of the last server (lent, a standby's, dirty, when its
        // last execution ended) carries over.
        self.link = Link::Linked(LinkState {
            timer_us: self.kept.settings.cancel_timer_us(),
            busy_since_us: self.busy.clock_us,
            ..LinkState::default()
        });
        server.tx_status = TxStatus::Idle;
        server.stmts.begin_link();
        self.trim_server_statements(server);
        if std::mem::take(&mut server.cancel_risk) {
            // A cancel signal its last user's statement may have left on the backend cancels
            // this instead of the client's first statement (`state::timers`).
            self.own_query("SELECT 1", Purpose::Absorb, server);
        }
        if self.kept.settings.key() != server.settings.key() {
            if self.send_timeouts_clear(server) {
                // The client's frames wait (`Phase::Held`); the rest follows the reset.
                return self.enter(Phase::Held);
            }
            self.replay_settings(server);
        }
        // After the settings: a BEGIN before them would take them back on a ROLLBACK.
        self.send_deferred_begin(server);
    }

    /// Sends the reset of the timeouts `server` has and the client does not have alike,
    /// if there are any.
    fn send_timeouts_clear(&mut self, server: &mut ServerState) -> bool {
        let sql = self.kept.settings.timeouts_to_clear(&server.settings);
        if sql.is_empty() {
            return false;
        }
        self.own_query(&sql, Purpose::ClearTimeouts, server);
        true
    }

    /// Replays the client's settings that `server` does not have.
    fn replay_settings(&mut self, server: &mut ServerState) {
        if self.kept.settings.key() == server.settings.key() {
            return;
        }
        let sql = self.kept.settings.diff_sql(&server.settings);
        server.settings.copy_extra_from(&self.kept.settings);
        if !sql.is_empty() {
            self.own_query(&sql, Purpose::SyncSettings, server);
        }
    }

    /// Sends a simple Query of the pooler's own, its replies hidden. It drops the server's
    /// unnamed statement: a client's plain one is parsed again before its next Bind.
    pub(super) fn own_query(&mut self, sql: &str, purpose: Purpose, server: &mut ServerState) {
        frontend::query(&mut self.to_server, sql);
        self.busy.replies.push(Pending::internal(Req::Query, purpose));
        server.stmts.unnamed_owner = None;
    }

    /// An error answered the reset of another client's timeouts: true when it is to be
    /// tried again (the timeout being reset cancelled it), false when the client is to be
    /// told, as of a replay that failed.
    pub(super) fn timeouts_clear_failed(&mut self, code: &[u8]) -> bool {
        let Some(l) = self.link.state_mut() else { return false };
        l.clear_tries += 1;
        code == b"57014" && l.clear_tries < CLEAR_TRIES
    }

    /// The ReadyForQuery ending the reset of another client's timeouts: on success the rest
    /// of the settings are replayed and the client's frames go on; a cancelled reset is
    /// sent again (`timeouts_clear_failed` said so, else the session is closing).
    pub(super) fn timeouts_cleared(&mut self, failed: bool, server: &mut ServerState) {
        if self.busy.phase == Phase::Closing {
            return;
        }
        if failed {
            self.send_timeouts_clear(server);
            return;
        }
        server.settings.forget_timeouts_unlike(&self.kept.settings);
        self.replay_settings(server);
        self.send_deferred_begin(server);
        self.leave(Phase::Held);
    }
}
