//! The session's timeouts: which one applies in the state the session is in, when it is
//! due, and the error PostgreSQL gives when it expires. The session holds no clock: the
//! driver reports the time (`now`, and when the client last sent something) and keeps the
//! one timer.

use super::Session;
use crate::error::{Error, SqlState};
use std::time::{Duration, Instant};

/// The timeouts a session enforces (from the configuration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// `client_idle_timeout_ms`: a client with no server, nothing in flight and nothing
    /// unread is closed once it has been silent this long.
    pub(crate) client_idle: Option<Duration>,
    /// `idle_transaction_timeout_ms`: a client idle inside a transaction (its server held)
    /// is closed once it has been silent this long.
    pub(crate) idle_in_transaction: Option<Duration>,
    /// `pinned_timeout_ms`: a client pinned to its server connection (`pins`), idle outside
    /// a transaction, is closed once it has been silent this long.
    pub(crate) pinned: Option<Duration>,
    /// `query_timeout_ms`: a client waiting for its server's replies is closed (its server
    /// connection with it) once it has been silent this long: PgBouncer's query_timeout,
    /// timed from the client's last message.
    pub(crate) query: Option<Duration>,
    /// `transaction_timeout_ms`: a client whose transaction (or statement outside one) has
    /// held its server this long is closed, whatever it is doing: PgBouncer's
    /// transaction_timeout, timed from the transaction's first request.
    pub(crate) transaction: Option<Duration>,
}

impl Timeouts {
    /// Whether any timeout is set (else the driver need not read the clock at all).
    pub(crate) fn any(&self) -> bool {
        self.client_idle.is_some()
            || self.idle_in_transaction.is_some()
            || self.pinned.is_some()
            || self.query.is_some()
            || self.transaction.is_some()
    }
}

/// Which timeout applies now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Idle {
    /// No server, nothing in flight, nothing unread.
    Session,
    /// Inside a transaction with nothing outstanding.
    InTransaction,
    /// Pinned to its server connection, outside a transaction, nothing outstanding.
    Pinned,
    /// Linked, waiting for the server's replies to what it sent.
    Running,
}

impl Session {
    /// Which timeout applies in the session's state; `client_buffered`: the driver holds
    /// client bytes not fed yet.
    fn idle_kind(&self, client_buffered: bool) -> Option<Idle> {
        if !self.is_linked() && !self.is_acquiring() && !client_buffered {
            // Inside a transaction block no server has seen yet (`begin`), or not.
            Some(if self.begin_deferred() { Idle::InTransaction } else { Idle::Session })
        } else if self.is_idle_in_transaction() && self.to_server.is_empty() {
            Some(Idle::InTransaction)
        } else if self.kept.pins.reasons != 0
            && self.is_linked()
            && self.busy.replies.is_empty()
            && !self.busy.replies.is_unsynced()
            && !self.in_transaction()
            && self.to_server.is_empty()
            && !client_buffered
        {
            Some(Idle::Pinned)
        } else if self.is_linked() && (!self.busy.replies.is_empty() || self.busy.replies.is_unsynced()) {
            Some(Idle::Running)
        } else {
            None
        }
    }

    /// When [`Session::handle_timeout`] is due, given when the client last sent something
    /// (`idle_since`); None when no timeout applies in the session's state. Notes when a
    /// transaction started (the client's last message when a poll first sees it linked
    /// with a transaction or request open), for `transaction_timeout`.
    #[must_use]
    pub(crate) fn poll_timeout(&mut self, t: &Timeouts, idle_since: Instant, client_buffered: bool) -> Option<Instant> {
        let tx_due = t.transaction.and_then(|limit| {
            if !self.holds_transaction() {
                self.busy.tx_since = None;
                return None;
            }
            Some(*self.busy.tx_since.get_or_insert(idle_since) + limit)
        });
        let due = self.idle_kind(client_buffered).and_then(|kind| {
            let limit = match kind {
                Idle::Session => t.client_idle?,
                Idle::InTransaction => t.idle_in_transaction?,
                Idle::Pinned => t.pinned?,
                Idle::Running => t.query?,
            };
            Some(idle_since + limit)
        });
        match (due, tx_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The linked server is in a transaction, or runs a request, for this client: what
    /// `transaction_timeout` times.
    fn holds_transaction(&self) -> bool {
        self.is_linked() && (self.in_transaction() || !self.busy.replies.is_empty() || self.busy.replies.is_unsynced())
    }

    /// The time is `now`: if the timeout that applies has expired, the session ends with
    /// PostgreSQL's error for it (57P05 idle session, 25P03 idle in transaction). Does
    /// nothing otherwise. A pinned client's is 57P05 too, its message naming
    /// `pinned_timeout` and the reasons; a running query's (`query_timeout`) 57014; a
    /// transaction past `transaction_timeout` 25P04 (PostgreSQL 17's code for its own).
    ///
    /// True when the expired one is `query_timeout` (or `transaction_timeout` with a
    /// request running): the driver then cancels the query on
    /// the server (the connection then settles as for any client that left mid-query).
    pub(crate) fn handle_timeout(
        &mut self,
        t: &Timeouts,
        idle_since: Instant,
        client_buffered: bool,
        now: Instant,
    ) -> bool {
        if self.poll_timeout(t, idle_since, client_buffered).is_none_or(|due| now < due) {
            return false;
        }
        if let (Some(limit), Some(since)) = (t.transaction, self.busy.tx_since)
            && now >= since + limit
        {
            let running = self.idle_kind(client_buffered) == Some(Idle::Running);
            self.fail(Error::fatal(SqlState::TRANSACTION_TIMEOUT, "terminating connection due to transaction_timeout"));
            // A request still running is cancelled on the server, as for query_timeout.
            return running;
        }
        match self.idle_kind(client_buffered) {
            Some(Idle::InTransaction) => self.fail(Error::fatal(
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                "terminating connection due to idle-in-transaction timeout",
            )),
            Some(Idle::Session) => self.fail(Error::fatal(
                SqlState::IDLE_SESSION_TIMEOUT,
                "terminating connection due to idle-session timeout",
            )),
            Some(Idle::Pinned) => {
                let why = crate::stmt::pins::PinReasons(self.kept.pins.reasons).names();
                self.fail(
                    Error::fatal(
                        SqlState::IDLE_SESSION_TIMEOUT,
                        format!("terminating connection due to pinned_timeout (pinned by {why})"),
                    )
                    .with_detail(format!(
                        "The client held its server connection ({why}) while idle outside a transaction for longer than pinned_timeout_ms; its session state is gone with the connection."
                    )),
                );
            }
            Some(Idle::Running) => {
                self.fail(Error::fatal(SqlState::QUERY_CANCELED, "terminating connection due to query_timeout"));
                return true;
            }
            None => {}
        }
        false
    }
}
