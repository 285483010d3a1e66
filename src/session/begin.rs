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
//! The extended protocol's BEGIN (a Bind of the unnamed portal to the client's named
//! statement `BEGIN`, as pgbench `-M prepared` sends it, or to its unnamed statement just
//! parsed as one, whose ParseComplete comes from here too, as pgbench `-M extended` sends
//! it; maybe a Describe of the portal, its Execute, then Sync or the transaction's first
//! statement) is answered the same way:
//! BindComplete, NoData and `BEGIN` from here, as PostgreSQL answers them. Until its Execute
//! the bound portal is kept as what binding it again needs (`BeginBind`): should any other
//! message come first that needs a server (a Parse, a Describe of a statement, a Close), the
//! Bind is sent to the linked server ahead of it, its BindComplete hidden, and the portal
//! from then on is the server's, as it would have been.
//!
//! Inside a block a deferred BEGIN opened, a named Parse is answered without a server too
//! (`stmts::parse`, `parses_ahead`): pgbench `-M prepared` prepares each statement with a
//! blocking call inside its first transaction, and the servers that call would wait for may
//! all be held by clients of its own thread. The server parses the statement ahead of its
//! first use; a text it refuses fails that use, and the block, and the name goes.
//!
//! Owns: the deferred BEGIN, from the answer to the link that sends it (or the answer to
//! the block's end). Must not touch what a linked session does with a BEGIN (it goes to
//! its server as written).

use super::reply_queue::{OnReply, Purpose, Req};
use super::settings::{TxStmt, bare_tx_stmt, maybe_tx_end, maybe_tx_start};
use super::stmts::Unnamed;
use super::{Link, Phase, Session};
use crate::config::PoolMode;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, frontend, tags};
use crate::state::{ServerState, TxStatus};
use crate::stmt::Statement;
use std::sync::Arc;

/// The longest Bind tail (format codes, parameter count, result format codes) of a BEGIN
/// portal answered here: one parameter format code, no parameter, up to four result format
/// codes. Any other Bind of it goes to a server.
const BEGIN_TAIL_MAX: usize = 16;

/// The unnamed portal bound here to the client's statement `BEGIN`, not yet executed: what
/// binding it on a server needs (`Session::bind_begin_on_server`).
#[derive(Debug)]
pub(super) struct BeginBind {
    /// The named statement it was bound to (its name is looked up again when it is
    /// needed); None: the client's unnamed statement, a `BEGIN` answered here
    /// (`parse_begin_here`).
    stmt: Option<Arc<Statement>>,
    /// The Bind's body after the portal and statement names.
    tail: [u8; BEGIN_TAIL_MAX],
    tail_len: u8,
}

/// A statement text that is a bare `BEGIN` (no transaction modes).
fn is_bare_begin(sql: &[u8]) -> bool {
    bare_tx_stmt(sql) == Some(TxStmt::Begin) && maybe_tx_start(sql)
}

/// A Parse frame of the unnamed statement as a bare `BEGIN`, with no parameter types.
fn parse_of_bare_begin(frame: &[u8]) -> bool {
    frontend::parse_fields(body(frame))
        .is_some_and(|p| p.name.is_empty() && p.param_types.is_empty() && is_bare_begin(p.query))
}

/// Fails the server's block for a deferred block the client saw fail; its error is hidden.
const FAIL_BLOCK: &str =
    "DO $$BEGIN RAISE EXCEPTION 'parsnip: this client''s wait for a server failed in this transaction'; END$$";

impl Session {
    /// A simple Query from a client with no server: if it is a lone BEGIN the session may
    /// answer (see the module), it is answered; true then.
    pub(super) fn on_lone_begin(&mut self, frame: &[u8]) -> bool {
        if !self.may_defer_begin() || !self.query_text_of(frame).is_some_and(is_bare_begin) {
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

    /// Whether the session may answer a BEGIN here now: transaction pooling with
    /// `defer_begin`, no server, nothing outstanding, no transaction open or opening.
    fn may_defer_begin(&self) -> bool {
        self.kept.defer_begin
            && self.kept.mode == PoolMode::Transaction
            && self.link == Link::Unlinked
            && self.busy.phase == Phase::Ready
            && self.busy.tx.status == TxStatus::Idle
            && !self.busy.tx.opening
            && !self.busy.tx.begin_deferred
            && self.busy.replies.is_empty()
            && !self.busy.replies.is_unsynced()
            && !self.autoprep_feeding()
    }

    /// An extended-protocol frame looked at for a BEGIN answered here (see the module): a
    /// Bind of the unnamed portal to the client's statement `BEGIN`, and while that portal
    /// is bound here, whatever comes after it. Some(consumed) when handled here (a frame
    /// that needs a server first is not consumed); None: handle it as usual.
    pub(super) fn on_begin_portal(&mut self, frame: &[u8], server: Option<&mut ServerState>) -> Option<bool> {
        let tag = frame[0];
        if self.busy.tx.begin_bind.is_none() {
            return (tag == tags::BIND && self.bind_begin_here(frame)).then_some(true);
        }
        let here = self.link == Link::Unlinked && self.busy.replies.is_empty();
        match tag {
            // The portal ends with the batch, or another Bind replaces it.
            tags::SYNC => {
                self.busy.tx.begin_bind = None;
                None
            }
            tags::BIND if frontend::bind_names(body(frame)).is_some_and(|(portal, _, _)| portal.is_empty()) => {
                self.busy.tx.begin_bind = None;
                (self.bind_begin_here(frame)).then_some(true)
            }
            tags::FLUSH | tags::TERMINATE | tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL => None,
            tags::DESCRIBE if here && frontend::describe_or_close(body(frame)) == Some((b'P', b"")) => {
                backend::empty(&mut self.to_client, tags::NO_DATA);
                Some(true)
            }
            tags::EXECUTE if here && crate::protocol::read_cstr(body(frame)).is_some_and(|(p, _)| p.is_empty()) => {
                // PostgreSQL's answer to the BEGIN; the ReadyForQuery at Sync reports the
                // block (`on_client_unlinked`), and the next server linked gets the BEGIN.
                self.busy.tx.begin_bind = None;
                backend::command_complete(&mut self.to_client, "BEGIN");
                self.busy.tx.status = TxStatus::InBlock;
                self.busy.tx.begin_deferred = true;
                self.kept.tally.queries = self.kept.tally.queries.wrapping_add(1);
                Some(true)
            }
            // Anything else uses a server: the portal goes there first.
            _ => match server.filter(|_| self.link.is_linked()) {
                None => Some(self.need_server(frame)),
                Some(srv) => {
                    if self.bind_begin_on_server(srv) {
                        None
                    } else {
                        Some(false)
                    }
                }
            },
        }
    }

    /// A Parse of the unnamed statement as a bare `BEGIN`, no parameter types, with no server
    /// and nothing open (pgbench `-M extended`): answered here (ParseComplete) and kept as
    /// the client's unnamed statement, which a server parses again when anything needs it
    /// there (`resolve`); a Bind and Execute of it that follow are answered here too. True
    /// then.
    pub(super) fn parse_begin_here(&mut self, frame: &[u8]) -> bool {
        if !self.may_defer_begin() || self.stmts.registry.is_none() || !parse_of_bare_begin(frame) {
            return false;
        }
        match &self.stmts.unnamed {
            // The same text as before: a server that still holds it as this client's
            // unnamed statement holds what PostgreSQL would have parsed now.
            Unnamed::Plain { frame: f, .. } if f.as_slice() == frame => {}
            _ => {
                self.stmts.unnamed_seq += 1;
                let seq = self.stmts.unnamed_seq;
                self.stmts.unnamed =
                    Unnamed::Plain { frame: frame.to_vec(), seq, measure: None, shape: None, stale: false };
            }
        }
        self.stmts.as_sent_next = None;
        backend::empty(&mut self.to_client, tags::PARSE_COMPLETE);
        true
    }

    /// A Bind of the unnamed portal to the client's statement `BEGIN`, no parameters, with
    /// no server and nothing open: answered here (BindComplete), the portal kept. True then.
    fn bind_begin_here(&mut self, frame: &[u8]) -> bool {
        if !self.may_defer_begin() || self.stmts.registry.is_none() {
            return false;
        }
        let b = body(frame);
        let Some((portal, name, at)) = frontend::bind_names(b) else { return false };
        if !portal.is_empty() {
            return false;
        }
        let tail = &b[at..];
        // No parameter, at most one parameter format code: what PostgreSQL accepts for a
        // statement without parameters (result format codes of a statement that returns no
        // rows are not looked at).
        let u16_at = |p: usize| tail.get(p..p + 2).map(|x| u16::from_be_bytes([x[0], x[1]]) as usize);
        let Some(formats) = u16_at(0).filter(|n| *n <= 1) else { return false };
        if u16_at(2 + 2 * formats) != Some(0) || tail.len() > BEGIN_TAIL_MAX {
            return false;
        }
        let stmt = if name.is_empty() {
            match &self.stmts.unnamed {
                Unnamed::Plain { frame, .. } if parse_of_bare_begin(frame) => None,
                _ => return false,
            }
        } else {
            let Some(stmt) = self.stmts.named.get(name) else { return false };
            if !is_bare_begin(&stmt.query) {
                return false;
            }
            Some(stmt.clone())
        };
        let mut kept = [0u8; BEGIN_TAIL_MAX];
        kept[..tail.len()].copy_from_slice(tail);
        self.busy.tx.begin_bind = Some(BeginBind { stmt, tail: kept, tail_len: tail.len() as u8 });
        backend::empty(&mut self.to_client, tags::BIND_COMPLETE);
        true
    }

    /// The portal bound here goes to the linked server, ahead of the frame that needs it
    /// there: the client's Bind as it was, through the cache, its BindComplete (given
    /// already) hidden and an error forwarded. False when the Bind waits (a shape check):
    /// the frame is fed again, and this with it.
    fn bind_begin_on_server(&mut self, srv: &mut ServerState) -> bool {
        let Some(b) = self.busy.tx.begin_bind.take() else { return true };
        let name = match &b.stmt {
            None => Some(Vec::new()),
            Some(stmt) => self.stmts.named.iter().find(|(_, n)| Arc::ptr_eq(&n.stmt, stmt)).map(|(n, _)| n.to_vec()),
        };
        let Some(name) = name else {
            // Every message that could have closed or replaced it came through here first.
            self.fail(Error::fatal(SqlState::INTERNAL_ERROR, "parsnip lost the statement of a BEGIN portal"));
            return true;
        };
        let mut frame = bytes::BytesMut::new();
        frontend::bind_with_tail(&mut frame, b"", &name, &b.tail[..b.tail_len as usize]);
        // The batch has had an effect a retry must not repeat.
        self.busy.retry.batch_executed = true;
        let before = self.busy.replies.len();
        if !self.on_client_linked(&frame, srv) {
            self.busy.tx.begin_bind = Some(b);
            return false;
        }
        if let Some(p) = self
            .busy
            .replies
            .iter_mut()
            .skip(before)
            .filter(|p| p.req == Req::Bind && p.on_reply == OnReply::Forward)
            .last()
        {
            p.on_reply = OnReply::Inject;
        }
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
