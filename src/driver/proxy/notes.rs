//! A listening client's side of LISTEN/NOTIFY in the proxy loop: applying its session's
//! subscription changes to the pool's listening connection (`driver::notify`), handing the
//! notifications posted to its inbox to the session (which decides when the client gets
//! them), and leaving its channels when it goes. A client that never listened pays one
//! flag check per loop turn.

use super::Proxy;
use crate::stmt::sql::listen::ListenCmd;

impl Proxy {
    /// `Action::Subscribe`: the session's LISTEN/UNLISTEN changes go to the pool's
    /// listening connection; a LISTEN is answered once the channel is listened on there
    /// (so that a NOTIFY sent after the client's LISTEN returned reaches it).
    pub(super) async fn subscribe(&mut self) {
        let changes = self.session.get().take_subscriptions();
        if changes.is_empty() {
            return;
        }
        let notifier = self.pool.connector().notifier().clone();
        let mut wait = Vec::new();
        for c in changes {
            match c {
                ListenCmd::Listen(ch) => {
                    if notifier.subscribe(&self.pool, &ch, &self.slot) {
                        wait.push(ch);
                    }
                }
                ListenCmd::Unlisten(ch) => notifier.unsubscribe(&ch, self.slot.pid),
                ListenCmd::UnlistenAll => notifier.unsubscribe_all(self.slot.pid),
            }
        }
        let limit = self.pool.connect_timeout();
        for ch in wait {
            notifier.wait_listened(&ch, limit).await;
        }
    }

    /// Notifications posted for the client go to its session.
    pub(super) fn take_notes(&mut self) {
        let Some(n) = self.pool.connector().notifier_if_any() else {
            self.slot.notes.store(false, std::sync::atomic::Ordering::Release);
            return;
        };
        let (frames, overflowed) = n.take(&self.slot);
        self.session.get().queue_notifications(&frames, overflowed);
    }

    /// Session mode with `server_fast_close`: a server connection marked to close
    /// (`RECONNECT`, a reload that changed its database) is closed once its client is
    /// between transactions, with the client, as PgBouncer does ("database configuration
    /// changed", FATAL 08P01), rather than at the end of the session. True when it was.
    pub(super) fn fast_close(&mut self) -> bool {
        self.slot.take_recheck();
        let Some(super::Linked::Own(s)) = &self.server else { return false };
        if crate::pool::Pooled::epoch(&**s) == self.pool.epoch() || !self.shared.cfg.load().server_fast_close {
            return false;
        }
        if self.midway() || !self.cbuf.is_empty() {
            return false;
        }
        let session = self.session.get();
        if session.in_transaction() || session.outstanding() > 0 || session.is_closing() {
            return false;
        }
        tracing::info!(pid = self.slot.pid, "server_fast_close: closing the client and its server");
        session.fail(crate::error::Error::fatal(
            crate::error::SqlState::PROTOCOL_VIOLATION,
            "database configuration changed",
        ));
        true
    }

    /// The client left: it no longer counts in its database's and user's client counts
    /// (`login::Seat`; counted on the pool it logged in to, whose caps a read pool shares).
    pub(in crate::driver) fn leave_limits(&self) {
        self.pool.unseat_client();
    }

    /// The client left: it listens on nothing any more.
    pub(in crate::driver) fn leave_channels(&self) {
        // (A pool whose clients never listened has no notifier.)
        if let Some(n) = self.pool.connector().notifier_if_any() {
            n.unsubscribe_all(self.slot.pid);
        }
    }
}
