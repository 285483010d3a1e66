//! How a session fails or ends: the pool could not give a server, the server's connection
//! broke or said what the session cannot follow, or the client is to be closed with an
//! error. One FATAL per failure, and a server given up only where the server failed.
//!
//! Owns: the session's last words and its close action. Must not touch the reply queue's
//! matching of replies (`server`) beyond clearing it when the server is gone.

use super::{Action, Link, Phase, Session};
use crate::error::{Error, Severity, SqlState};

impl Session {
    /// The pool could not give a server. A FATAL error closes the client; an ERROR fails
    /// the request that needed the server as PostgreSQL would (error, then skip to Sync).
    pub(crate) fn handle_acquire_failed(&mut self, err: Error) {
        self.link = Link::Unlinked;
        if err.severity == Severity::Fatal {
            return self.fail(err);
        }
        if self.begin_deferred() {
            // Inside a block no server has seen yet (`begin`): the error fails the block,
            // as PostgreSQL's would.
            self.busy.tx.status = crate::state::TxStatus::Failed;
        }
        self.busy.acquire_error = Some(Box::new(err));
    }

    /// The linked server's connection broke.
    pub(crate) fn handle_server_lost(&mut self) {
        self.busy.replies.clear();
        if self.link.unlink().is_some() {
            self.busy.actions.push_back(Action::ReleaseServer { reusable: false });
        }
        // One FATAL per failure: a session already closing has said its last words (the
        // server's own FATAL, or an error of its own), and the driver may report the loss
        // again before the close is carried out.
        if self.busy.phase != Phase::Closing {
            self.fail(Error::fatal(SqlState::CONNECTION_FAILURE, "server closed the connection unexpectedly"));
        }
    }

    /// A server reply the session cannot match to any request: the server is given up and
    /// the client closed with 08P01.
    pub(super) fn desync(&mut self, tag: u8) {
        tracing::warn!(tag = %(tag as char), "server reply does not match any outstanding request");
        self.busy.replies.clear();
        if self.link.unlink().is_some() {
            self.busy.actions.push_back(Action::ReleaseServer { reusable: false });
        }
        self.fail(Error::protocol("server sent an unexpected message"));
    }

    /// Sends `err` and closes the client. A linked server stays linked: what the session
    /// knows of it is intact, and closing brings it back to idle (`settle`) — a client's
    /// failure (a protocol error, a timeout) never costs the connection, nor, on a shared
    /// pipelining connection, the batches of other clients on it. Where the server itself
    /// failed, the caller gives it up first (`desync`, `handle_server_lost`).
    pub(crate) fn fail(&mut self, err: Error) {
        err.write_to(&mut self.to_client);
        // PostgreSQL flushes an error at once, with everything before it (`flush`).
        self.release_held();
        self.close();
    }

    /// The server ended the connection (its FATAL is written already), or is in a state
    /// the session cannot follow: it is given back to be closed, and the client closed.
    pub(super) fn fail_server(&mut self) {
        if self.link.unlink().is_some() {
            self.busy.actions.push_back(Action::ReleaseServer { reusable: false });
        }
        self.close();
    }

    /// Closes the client (once).
    pub(super) fn close(&mut self) {
        if self.busy.phase != Phase::Closing {
            self.busy.phase = Phase::Closing;
            self.busy.actions.push_back(Action::Close);
        }
    }
}
