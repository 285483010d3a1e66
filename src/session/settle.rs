//! The rule that keeps one client from disturbing another: a server connection goes back
//! to the pool only in a state the session has seen — every request answered, the last
//! batch ended by a Sync the server answered, no COPY and no skip-to-Sync in progress.
//! When a client leaves (or is closed) with its server in any other state, the session
//! ends what the client left open itself and reads the replies still to come through the
//! same reply queue as always, dropping them; the driver waits for that within a bound,
//! and closes the connection when the bound passes or anything does not add up.

use super::reply_queue::{Pending, Purpose, Req};
use super::{Action, Link, LinkState, Phase, Session};
use crate::protocol::frontend;

impl Session {
    /// The linked server is idle for all the session knows: nothing outstanding, no
    /// extended-protocol batch open without its Sync, not in COPY FROM STDIN nor skipping
    /// to a Sync after an error.
    pub(crate) fn server_settled(&self) -> bool {
        self.busy.replies.is_empty() && !self.busy.replies.is_unsynced() && self.busy.phase == Phase::Ready
    }

    /// The client is gone while a server is linked that is not settled (`server_settled`):
    /// writes to `to_server` what ends whatever it left open — a CopyFail if a COPY FROM
    /// STDIN runs or may be starting (it ends one with an error; elsewhere PostgreSQL
    /// ignores it, but a timer's error raised as it is read would bring a ReadyForQuery
    /// of its own: `Session::forward_client`) and a Sync (which ends a batch, a skip to
    /// Sync after an error, and the implicit transaction) — and queues the Sync's
    /// ReadyForQuery as the pooler's own. The driver then writes `to_server` and feeds the
    /// server's frames until nothing is outstanding (`outstanding() == 0`); what they write
    /// to `to_client` is nobody's and is dropped.
    /// The session is closing from here on.
    pub(crate) fn settle_server(&mut self) {
        let copy = self.busy.phase == Phase::CopyIn || self.copy_may_start();
        self.busy.phase = Phase::Closing;
        if !self.link.is_linked() {
            self.link = Link::Linked(LinkState::default());
        }
        self.drop_client_output();
        self.busy.actions.clear();
        if copy {
            frontend::copy_fail(&mut self.to_server, "the client disconnected");
        }
        frontend::sync(&mut self.to_server);
        self.busy.replies.push(Pending::internal(Req::Sync, Purpose::Settle));
    }

    /// After a settle: whether the server may be reused — false when the session gave it
    /// up meanwhile (a FATAL, a reply that matched nothing) or it ran something parsnip
    /// cannot undo (`LinkState::dirty`). Takes the actions queued meanwhile.
    pub(crate) fn settled_reusable(&mut self) -> bool {
        let mut reusable = !self.link.state().is_some_and(|l| l.dirty);
        while let Some(a) = self.busy.actions.pop_front() {
            if a == (Action::ReleaseServer { reusable: false }) {
                reusable = false;
            }
        }
        reusable
    }
}
