//! The per-server reply queue: one entry per message written to the server that expects
//! a reply, in order, with what to do with that reply and what to undo if the server
//! never executes it. PostgreSQL's replies carry no names, so this queue is the only way
//! to know which request a reply answers. Entries answered by the pooler itself
//! (`OnReply::Synth`) sit in the same queue so local answers keep pipeline order.

use super::stmts::script::Script;
use crate::error::Error;
use crate::protocol::tags;
use crate::stmt::Statement;
use std::collections::VecDeque;
use std::sync::Arc;

/// A request written to the server that will be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Req {
    /// Parse → ParseComplete.
    Parse,
    /// Bind → BindComplete.
    Bind,
    /// Describe → [ParameterDescription] RowDescription | NoData.
    Describe,
    /// Execute → rows, then CommandComplete | EmptyQueryResponse | PortalSuspended.
    Execute,
    /// Close → CloseComplete.
    Close,
    /// Sync → ReadyForQuery.
    Sync,
    /// Query → anything, then ReadyForQuery.
    Query,
    /// FunctionCall → FunctionCallResponse, then ReadyForQuery.
    FunctionCall,
}

impl Req {
    /// The type byte of the client message this request is.
    pub(crate) fn tag(self) -> u8 {
        match self {
            Req::Parse => tags::PARSE,
            Req::Bind => tags::BIND,
            Req::Describe => tags::DESCRIBE,
            Req::Execute => tags::EXECUTE,
            Req::Close => tags::CLOSE,
            Req::Sync => tags::SYNC,
            Req::Query => tags::QUERY,
            Req::FunctionCall => tags::FUNCTION_CALL,
        }
    }

    /// True for requests whose error makes the server skip to the next Sync.
    pub(crate) fn is_extended(self) -> bool {
        !matches!(self, Req::Sync | Req::Query | Req::FunctionCall)
    }

    /// True when `tag` is the last reply to this request.
    #[inline]
    pub(crate) fn completed_by(self, tag: u8) -> bool {
        match self {
            Req::Parse => tag == tags::PARSE_COMPLETE,
            Req::Bind => tag == tags::BIND_COMPLETE,
            Req::Close => tag == tags::CLOSE_COMPLETE,
            Req::Describe => tag == tags::ROW_DESCRIPTION || tag == tags::NO_DATA,
            Req::Execute => {
                tag == tags::COMMAND_COMPLETE || tag == tags::EMPTY_QUERY_RESPONSE || tag == tags::PORTAL_SUSPENDED
            }
            Req::Sync | Req::Query | Req::FunctionCall => tag == tags::READY_FOR_QUERY,
        }
    }
}

/// A reply the pooler produces itself, at this position in the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Synth {
    /// ParseComplete (the statement is known; no server Parse needed).
    ParseComplete,
    /// CloseComplete (statement names are the pooler's business).
    CloseComplete,
    /// CommandComplete with this tag, alone.
    Tag(&'static str),
    /// CommandComplete with this tag, then ReadyForQuery: a whole simple Query answered.
    TagAndReady(&'static str),
    /// The description of a cached statement a server gave at the current shape epoch
    /// (ParameterDescription, then RowDescription or NoData): a Describe answered here.
    Describe(Arc<Statement>),
}

/// What happens to the replies of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OnReply {
    /// The client asked: forward the replies.
    Forward,
    /// Sent on the client's behalf (an injected Parse): forward an error, drop the rest.
    Inject,
    /// The pooler's own request: drop every reply.
    Skip,
    /// Not sent: the pooler answers at this position.
    Synth(Synth),
    /// A Describe the pooler sent after injecting a Parse, to compare the statement's row
    /// shape on this server with the one clients were given.
    ShapeCheck(Arc<Statement>),
    /// The same for the client's plain unnamed statement (its Parse sequence number), parsed
    /// again on another server after the client described it (`Unnamed::Plain`).
    PlainShapeCheck(u64),
    /// A request made to fail on purpose so the server enters the same error state as
    /// PostgreSQL would: its 26000 error is replaced by this one (other errors, such as
    /// 25P02 in an aborted transaction, pass through as PostgreSQL would give them).
    ReplaceError(Box<Error>),
    /// The client was already given this request's error: a PREPARE the pooler ran ahead of
    /// it (to re-create the statement this `EXECUTE` names) failed, and that failure is what
    /// PostgreSQL would have answered. The server's replies are dropped, but for the
    /// ReadyForQuery.
    Answered,
}

/// Why the pooler sent a request it skips the replies of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The client's own request (possibly rewritten).
    Client,
    /// Settings replayed onto the server for this client.
    SyncSettings,
    /// The reset of timeouts another client left on the server, run before the replay
    /// (`session::linking`).
    ClearTimeouts,
    /// The BEGIN the session answered itself, sent ahead of the transaction's first
    /// statement (`session::begin`).
    Begin,
    /// The statement that fails the server's block after a deferred BEGIN whose block the
    /// client saw fail (`session::begin`): its error is expected and hidden.
    FailBlock,
    /// A ROLLBACK the pooler sent (statement mode).
    Rollback,
    /// The client's Sync ending a batch that is being retried: its ReadyForQuery is not
    /// the client's, nor is the transaction status it reports.
    Retried,
    /// A savepoint command of the pooler's sent as a simple Query (`session::stmts::guard`).
    Guard,
    /// The Sync ending a PREPARE the pooler runs ahead of the client's simple Query (an
    /// `EXECUTE` of a statement this server does not have): the request queued after it
    /// depends on that PREPARE.
    Prepare,
    /// The Sync the pooler sends to bring a server back to idle after its client left
    /// (`session::settle`).
    Settle,
    /// A `SELECT 1` sent before a client's first request on a server whose backend may
    /// hold a cancel signal from its last user (`ServerState::cancel_risk`): the signal
    /// cancels this instead of the client's statement.
    Absorb,
    /// parsnip's question of what session state remains on a pinned client's server
    /// (`session::pins`): its row is the answer, nothing of it reaches the client.
    PinCheck,
    /// parsnip's question of what the settings `set_config` may have changed are now
    /// (`session::config`): its rows are the answer, nothing of it reaches the client.
    ConfigCheck,
}

impl Purpose {
    /// The pooler's own requests that stand in for what the client is owed on a fresh link
    /// (its settings, the timeouts reset before them, its deferred BEGIN): an error
    /// answering one reaches the client, and the server is given up.
    pub(crate) fn told_on_error(self) -> bool {
        matches!(self, Purpose::SyncSettings | Purpose::ClearTimeouts | Purpose::Begin)
    }

    /// What a link sends ahead of its client's first request: those above, and a cancel
    /// signal absorbed. Simple Queries on an idle server whose replies reach nobody.
    pub(crate) fn opens_link(self) -> bool {
        self.told_on_error() || self == Purpose::Absorb
    }
}

/// A change to the client's statement names made when the request was sent, undone if the
/// server fails or skips the request.
#[derive(Clone, Debug, Default)]
pub(crate) enum ClientFx {
    /// Nothing to undo.
    #[default]
    None,
    /// A named statement was registered under a name that was free (undone by removing it).
    Named {
        /// The client's statement name.
        name: Box<[u8]>,
    },
    /// The unnamed statement was set.
    Unnamed,
    /// The server parses now a named statement the client was told it has before any server
    /// checked it (`Session::parses_ahead`): should the server refuse it, the name goes, as
    /// PostgreSQL would never have made it (kept when the Parse is only skipped).
    ParsedAhead {
        /// The client's statement name.
        name: Box<[u8]>,
    },
    /// The client's named statements were all deallocated (`DEALLOCATE ALL` through the
    /// extended protocol): what they were.
    ClearedAll {
        /// The client's statements before (boxed: rare, and every queue entry is as large
        /// as its largest variant).
        saved: Box<crate::session::stmts::names::NamedStmts>,
    },
    /// A named statement was closed.
    Closed {
        /// The client's statement name.
        name: Box<[u8]>,
        /// What it held (boxed, as above).
        named: Box<crate::session::stmts::names::Named>,
    },
}

/// Side effects of one request, for commit (on success) or rollback.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fx {
    /// A Parse of this cached statement was sent to the server.
    pub(crate) server_parse: Option<Arc<Statement>>,
    /// This statement was closed on the server to make room.
    pub(crate) server_close: Option<Arc<Statement>>,
    /// The request uses this cached statement (Bind, Describe, EXECUTE): an error about it
    /// tells whether it went stale.
    pub(crate) uses: Option<Arc<Statement>>,
    /// The client-side change.
    pub(crate) client: ClientFx,
    /// A Describe of a portal bound from this cached statement.
    pub(crate) portal_of: Option<Arc<Statement>>,
    /// For a client Bind of a cached statement outside a transaction: where the Bind starts
    /// in the client's batch, so the batch can be replayed after a re-prepare.
    pub(crate) replay_from: Option<u32>,
    /// The request runs inside the pooler's savepoint guard (`session::stmts::guard`): a retry
    /// is possible inside a transaction.
    pub(crate) guarded: bool,
    /// A Parse of these savepoint-guard statements was sent (bits of `GuardCmd`): they are
    /// not prepared there if the server skips or fails it.
    pub(crate) guard_parse: u8,
    /// The Close of a portal a failed simple Query left (`Session::close_leftover_portal`):
    /// skipped by the server (an error earlier in its batch), that portal is still there.
    pub(crate) closes_leftover: bool,
    /// The SQL sent differs from the client's (a statement name rewritten): how to word
    /// an error so the client sees its own name and positions.
    pub(crate) rename: Option<Box<Rename>>,
    /// A multi-statement Query rewritten for the cache (`stmts::script`): what the pooler
    /// does as its statements complete.
    pub(crate) script: Option<Box<Script>>,
    /// For a Describe of a cached statement: the shape epoch when it was sent (a reply
    /// confirms the statement's description as of then).
    pub(crate) epoch: u64,
    /// For a Describe of the client's plain unnamed statement: its Parse sequence number
    /// (0: none); the reply is the shape the client holds for it.
    pub(crate) plain_seq: u64,
    /// The client's text read `pg_prepared_statements` and the server got it rewritten
    /// (`stmts::view`): error positions map back through this.
    pub(crate) view: Option<Arc<crate::stmt::lift::Origin>>,
}

pub(crate) use super::error_text::{Rename, client_position, map_error_position};

/// One queue entry.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    /// The request.
    pub(crate) req: Req,
    /// What to do with its replies.
    pub(crate) on_reply: OnReply,
    /// Why it was sent.
    pub(crate) purpose: Purpose,
    /// For a client Query that changes session state (SET, RESET, DISCARD): its text, so
    /// the change can be replayed on other server connections once it succeeded.
    pub(crate) tracked_sql: Option<Box<str>>,
    /// An ErrorResponse answered this request.
    pub(crate) failed: bool,
    /// A simple Query of one plain read (`stmt::sql::is_plain_read`): others may be queued
    /// behind it (`session::pipeline`).
    pub(crate) plain_read: bool,
    /// Side effects.
    pub(crate) fx: Fx,
    /// Part of a client's simple Query run as an autoprepared statement
    /// (`stmts::autoprepare`): its ParseComplete, BindComplete and NoData are not the
    /// client's, and its errors map back to the client's text through this.
    pub(crate) simple: Option<Arc<crate::stmt::lift::Origin>>,
    /// An Execute of a portal of this cached statement (or of the unnamed statement run as
    /// sent in its place, `timed_cached` false): its server time, rows and error count for
    /// the statement (`stmt::stats`, `stmt::guard`), from `sent_us`.
    pub(crate) timed: Option<Arc<Statement>>,
    /// See `timed`.
    pub(crate) timed_cached: bool,
    /// The session's clock when it was queued (`Session::set_clock`).
    pub(crate) sent_us: u64,
    /// Written behind another client's batch on a shared connection: the execution is
    /// counted for `timed` but not timed (from `sent_us` its time would include the wait).
    pub(crate) behind: bool,
}

impl Pending {
    /// A client request whose replies are forwarded.
    #[inline]
    pub(crate) fn client(req: Req) -> Pending {
        Pending::with(req, OnReply::Forward, Fx::default())
    }
    /// A request with explicit reply handling and effects.
    #[inline]
    pub(crate) fn with(req: Req, on_reply: OnReply, fx: Fx) -> Pending {
        Pending {
            req,
            on_reply,
            purpose: Purpose::Client,
            tracked_sql: None,
            failed: false,
            plain_read: false,
            fx,
            simple: None,
            timed: None,
            timed_cached: false,
            sent_us: 0,
            behind: false,
        }
    }
    /// A request of the pooler's own.
    /// A simple Query that may run inside a transaction block, and so, failing there, leave
    /// its unnamed portal behind (`ReplyQueue::portal_leftover`): the client's, a guard's, a
    /// probe's; not the pooler's own that run outside any block or end it (a deferred
    /// BEGIN goes only to an idle server, and PostgreSQL drops the transaction of a BEGIN
    /// that fails before completing).
    fn may_leave_portal(&self) -> bool {
        self.req == Req::Query
            && !self.purpose.opens_link()
            && !matches!(self.purpose, Purpose::PinCheck | Purpose::ConfigCheck | Purpose::Rollback)
    }

    pub(crate) fn internal(req: Req, purpose: Purpose) -> Pending {
        Pending {
            req,
            on_reply: OnReply::Skip,
            purpose,
            tracked_sql: None,
            failed: false,
            plain_read: false,
            fx: Fx::default(),
            simple: None,
            timed: None,
            timed_cached: false,
            sent_us: 0,
            behind: false,
        }
    }
    /// True for an entry the pooler answers itself.
    #[inline]
    pub(crate) fn is_synth(&self) -> bool {
        matches!(self.on_reply, OnReply::Synth(_))
    }
    /// True when sending this leaves the server with something only a Sync ends: an
    /// implicit transaction, portals, the client's batch. Not the pooler's own Close of a
    /// statement (an eviction): PostgreSQL runs a Close outside any transaction, and it
    /// cannot fail.
    #[inline]
    fn opens_batch(&self) -> bool {
        self.req.is_extended() && !self.is_synth() && !(self.req == Req::Close && self.on_reply == OnReply::Skip)
    }
}

/// The FIFO of outstanding requests on the linked server.
#[derive(Debug, Default)]
pub(crate) struct ReplyQueue {
    q: VecDeque<Pending>,
    /// Extended-protocol requests were sent since the last ReadyForQuery: the server has
    /// an implicit transaction (and maybe portals) open until the next Sync, even when
    /// every reply has arrived (a batch ended with Flush).
    unsynced: bool,
    /// The server may hold an unnamed portal left by a simple Query that failed inside a
    /// transaction block: PostgreSQL keeps that portal with its statements already freed,
    /// and an Execute of it reads the freed memory (PostgreSQL 15.18 crashes, and the
    /// postmaster ends every backend with it). Set when a Query that may run inside a
    /// block is sent; cleared by a ReadyForQuery other than 'E' with no such Query still
    /// outstanding, and by the session's Close of that portal before it sends a Bind or
    /// Execute of it (`Session::close_leftover_portal`).
    portal_leftover: bool,
    /// Requests pushed so far (wrapping): how many a client frame added.
    pub(crate) pushes: u32,
    /// `pushes` when the client last sent a Sync, Flush, Query or FunctionCall: the
    /// requests pushed after that are ones whose replies PostgreSQL would not have sent
    /// the client yet (`session::flush`).
    flushed_at: u32,
    /// `pushes` when the session last asked the server to flush for an answer it waits
    /// for (`ask_flush`).
    asked_flush_at: u32,
}

impl ReplyQueue {
    /// The queue's storage when nothing is pending, leaving the queue without any (an idle
    /// client keeps none; the driver recycles it).
    pub(crate) fn take_storage(&mut self) -> Option<VecDeque<Pending>> {
        (self.q.is_empty() && self.q.capacity() > 0).then(|| std::mem::take(&mut self.q))
    }

    /// Gives a queue without storage the (empty) storage `get` returns, if any.
    pub(crate) fn lend_storage(&mut self, get: impl FnOnce() -> Option<VecDeque<Pending>>) {
        if self.q.capacity() == 0
            && let Some(q) = get()
        {
            debug_assert!(q.is_empty() && self.q.is_empty());
            if self.q.is_empty() {
                self.q = q;
            }
        }
    }

    /// Appends a request written to the server.
    #[inline]
    pub(crate) fn push(&mut self, p: Pending) {
        self.pushes = self.pushes.wrapping_add(1);
        if p.may_leave_portal() {
            self.portal_leftover = true;
        }
        if p.opens_batch() {
            self.unsynced = true;
        } else if p.req == Req::Sync {
            self.unsynced = false;
        }
        self.q.push_back(p);
    }
    /// A ReadyForQuery arrived: what was sent before it is settled; a batch is still open
    /// only if extended requests were queued after the last Sync still outstanding.
    pub(crate) fn mark_synced(&mut self) {
        let mut open = false;
        for p in &self.q {
            if p.req == Req::Sync && !p.is_synth() {
                open = false;
            } else if p.opens_batch() {
                open = true;
            }
        }
        self.unsynced = open;
    }
    /// See the field.
    pub(crate) fn is_unsynced(&self) -> bool {
        self.unsynced
    }
    /// Requests pushed since the client's last Sync, Flush, Query or FunctionCall.
    #[cfg(test)]
    pub(crate) fn pushed_since_flush(&self) -> u32 {
        self.pushes.wrapping_sub(self.flushed_at)
    }
    /// See the field.
    pub(crate) fn portal_leftover(&self) -> bool {
        self.portal_leftover
    }
    /// The session closed the server's unnamed portal (see `portal_leftover`).
    pub(crate) fn portal_closed(&mut self) {
        self.portal_leftover = false;
    }
    /// The server skipped the session's Close of a leftover portal (`Fx::closes_leftover`):
    /// the portal is still there, and the next Bind or Execute of it must close it first.
    pub(crate) fn portal_close_skipped(&mut self) {
        self.portal_leftover = true;
    }
    /// A ReadyForQuery with this status arrived (its request popped): with no Query still
    /// outstanding that may leave a portal, one left earlier is gone unless the
    /// transaction is still failed (a ROLLBACK, or one to a savepoint, drops it).
    pub(crate) fn portal_ready(&mut self, status: crate::state::TxStatus) {
        if self.portal_leftover
            && status != crate::state::TxStatus::Failed
            && !self.q.iter().any(Pending::may_leave_portal)
        {
            self.portal_leftover = false;
        }
    }
    /// The request the next reply answers.
    #[inline]
    pub(crate) fn head(&self) -> Option<&Pending> {
        self.q.front()
    }
    /// The request queued last.
    pub(crate) fn last_mut(&mut self) -> Option<&mut Pending> {
        self.q.back_mut()
    }
    /// Mutable head.
    pub(crate) fn head_mut(&mut self) -> Option<&mut Pending> {
        self.q.front_mut()
    }
    /// Removes the head.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Pending> {
        self.q.pop_front()
    }
    /// Removes the head unless it is a Sync (the server skips everything up to a Sync
    /// after an error in the extended protocol; skipped requests get no reply).
    pub(crate) fn pop_unless_sync(&mut self) -> Option<Pending> {
        match self.q.front() {
            Some(p) if p.req != Req::Sync => self.q.pop_front(),
            _ => None,
        }
    }
    /// After an error the server skips to the Sync at the head: when that Sync ends a
    /// PREPARE the pooler ran ahead of a client's Query (`Purpose::Prepare`), the Query
    /// after it fails for want of the statement, and the error already forwarded is the
    /// answer PostgreSQL would have given it.
    pub(crate) fn answer_after_prepare_sync(&mut self) {
        if self.q.front().is_some_and(|p| p.req == Req::Sync && p.purpose == Purpose::Prepare)
            && let Some(next) = self.q.get_mut(1)
        {
            next.on_reply = OnReply::Answered;
            // A script's statements never ran: what it would have prepared is undone when
            // its ReadyForQuery comes.
            next.fx = Fx { script: next.fx.script.take(), ..Fx::default() };
        }
    }
    /// The head (an Execute or Query) started COPY FROM STDIN. In COPY FROM STDIN mode the
    /// server ignores Sync and Flush: the Syncs queued right behind the head get no reply
    /// and are dropped. (The client's copy messages never precede the server's
    /// CopyInResponse: they wait for it, `Session::forward_client`.)
    ///
    /// `Err((req, sent))`: a client request other than Sync was queued behind the head — a
    /// message the server reads during the copy and refuses (PostgreSQL: "unexpected
    /// message type during COPY from stdin", then FATAL), or, not `sent`, one the session
    /// answered itself, which PostgreSQL would have refused so. Nothing is dropped then.
    /// `Ok(true)` when Syncs were dropped.
    pub(crate) fn copy_in_started(&mut self) -> Result<bool, (Req, bool)> {
        // Until the copy's end: client Syncs (ignored), nothing else of the client's.
        if let Some(p) = self.q.iter().skip(1).find(|p| p.purpose == Purpose::Client && p.req != Req::Sync) {
            return Err((p.req, !p.is_synth()));
        }
        let mut dropped = false;
        while self.q.len() > 1 && self.q[1].req == Req::Sync && self.q[1].purpose == Purpose::Client {
            self.q.remove(1);
            dropped = true;
        }
        if dropped {
            // A Sync the server ignores does not end the batch: it stays open (the server
            // waits for a Sync after the copy) unless a later Sync is queued.
            self.mark_synced();
        }
        Ok(dropped)
    }
    /// Drops every request but the head.
    pub(crate) fn keep_head(&mut self) {
        self.q.truncate(1);
    }
    /// Nothing outstanding.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
    /// Nothing outstanding but what a link sends ahead of its client's first request
    /// (`Purpose::opens_link`): its replies come first and reach nobody.
    pub(crate) fn only_link_preamble(&self) -> bool {
        self.q.iter().all(|p| p.purpose.opens_link())
    }
    /// Number of outstanding requests.
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }
    /// Forgets everything (the server connection is gone).
    pub(crate) fn clear(&mut self) {
        self.q.clear();
        self.unsynced = false;
        self.portal_leftover = false;
        self.flushed_at = self.pushes;
    }
    /// The client sent a Sync, Flush, Query or FunctionCall: every request queued so far
    /// is one whose replies PostgreSQL sends as they come.
    #[inline]
    pub(crate) fn client_flushed(&mut self) {
        self.flushed_at = self.pushes;
    }
    /// The session is to wait for the answer to what is outstanding: true when it must ask
    /// the server to flush (a Flush of its own) for that answer to come — something was
    /// queued since the client's last Sync, Flush, Query or FunctionCall and since the
    /// session last asked — noting that it asks now. The answers that come are held from
    /// the client as ever (`head_unflushed`).
    pub(crate) fn ask_flush(&mut self) -> bool {
        let asked = self.pushes != self.flushed_at && self.pushes != self.asked_flush_at;
        self.asked_flush_at = self.pushes;
        asked
    }
    /// The head was queued after the client's last Sync, Flush, Query or FunctionCall:
    /// its replies are on their way only because the pooler asked the server to flush.
    #[inline]
    pub(crate) fn head_unflushed(&self) -> bool {
        !self.q.is_empty() && self.q.len() <= self.pushes.wrapping_sub(self.flushed_at) as usize
    }
    /// Iterates outstanding requests, head first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.q.iter()
    }
    /// The same, mutably.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Pending> {
        self.q.iter_mut()
    }
}
