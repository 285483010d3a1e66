//! The per-client session after login: a sans-IO state machine. It is fed whole frames
//! from the client and from the linked server, and answers with bytes to write (in
//! `to_client` / `to_server`) and actions (acquire, release, close). It never touches a
//! socket, a clock or the pool; the driver does that and calls back.
//!
//! Owns: the reply queue of the linked server, transaction boundaries (from ReadyForQuery
//! only, never from parsing SQL), pool-mode rules, replaying session settings onto
//! whichever server the client is given, and (in `statements`) the client's view of its
//! prepared statements over the shared statement cache.

mod guard;
mod pipeline;
pub use pipeline::{Pipelinable, Timed};
pub mod reply_queue;
pub mod settings;
mod statements;
mod wire_trace;

#[cfg(test)]
mod tests;

use crate::config::PoolMode;
use crate::error::{Error, Severity, SqlState};
use crate::protocol::{backend, body, frontend, tags};
use crate::state::settings::{Settings, tracked_name};
use crate::state::{ServerState, TxStatus};
use crate::stmt::registry::StmtKind;
use crate::stmt::{Registry, Statement};
use bytes::BytesMut;
use reply_queue::{OnReply, Pending, Purpose, ReplyQueue, Req, Synth};
use settings::{SettingStmt, TxStmt};
use statements::Unnamed;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What the driver must do for the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Get a server connection from the pool, then call `handle_server_linked` and feed
    /// the client frame that was not consumed again.
    AcquireServer,
    /// Give the linked server back; `reusable: false` means close it.
    ReleaseServer {
        /// The server is idle, outside a transaction, with nothing outstanding.
        reusable: bool,
    },
    /// Write out `to_client`, then close the client connection.
    Close,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Unlinked,
    Acquiring,
    Linked,
}

/// A portal bound to a tracked statement: (portal name, statement text).
type TrackedPortal = (Box<[u8]>, Box<str>);

/// One client's conversation. See the module doc.
#[derive(Debug)]
pub struct Session {
    mode: PoolMode,
    link: Link,
    replies: ReplyQueue,
    /// Bytes to write to the client.
    pub to_client: BytesMut,
    /// Bytes to write to the linked server.
    pub to_server: BytesMut,
    actions: VecDeque<Action>,
    tx_status: TxStatus,
    copy_in: bool,
    skip_until_sync: bool,
    /// The server hit an error in an extended-protocol batch the client has not ended
    /// with Sync yet: it ignores everything until that Sync.
    server_skipping: bool,
    /// A shape check of a statement injected on this server is outstanding: client frames
    /// wait until its answer.
    hold: bool,
    /// A statement whose fresh Parse described a different row shape than the one clients
    /// were given: the next use fails with 0A000, as on the client's own backend.
    shape_mismatch: Option<Arc<Statement>>,
    /// Boxed: rare, and every idle client carries the field.
    acquire_error: Option<Box<Error>>,
    closing: bool,
    settings: Arc<Settings>,
    /// Settings made inside the open transaction: kept if it commits.
    tx_settings: Vec<SettingStmt>,
    /// Unique id of this client (for the server's unnamed-statement owner).
    uid: u64,
    /// The pool's statement cache; None: statements pass through untouched (session mode).
    registry: Option<Arc<Registry>>,
    named: HashMap<Box<[u8]>, Arc<Statement>>,
    /// For names the client gave a SQL `PREPARE`: how many characters its text had before
    /// the statement's definition ("PREPARE name "), so that errors of the server's
    /// `PREPARE pn_<k> …` point where PostgreSQL would point. Read only for names that
    /// hold a SQL-level statement (entries of names dropped since are harmless; pruned).
    sql_prefix: HashMap<Box<[u8]>, u32>,
    unnamed: Unnamed,
    unnamed_seq: u64,
    key_buf: Vec<u8>,
    /// The client's frames of the batch being sent (outside transactions), and of the last
    /// batch ended by Sync: replayed after a transparent re-prepare.
    batch: Vec<u8>,
    last_batch: Vec<u8>,
    /// Where the frame being handled starts in `batch`.
    frame_at: u32,
    /// An Execute was sent since the last Sync: the batch has had effects (a BEGIN, a write
    /// in its implicit transaction) that an error rolls back or aborts, so replaying only
    /// its failed tail would be wrong. No transparent retry then.
    batch_executed: bool,
    /// Statements this client was given a description of (Describe S).
    described: crate::stmt::idmap::IdSet,
    /// A transparent retry is in flight: never retry it again.
    retried: bool,
    /// Client frames to feed again (a retried batch), before any newer ones.
    replay: Option<Box<[u8]>>,
    /// The portal and statement of the last Bind of a cached statement.
    last_bind: Option<(Box<[u8]>, Arc<Statement>)>,
    /// The portal bound to this client's `DEALLOCATE ALL` (run on the server as a no-op).
    dealloc_portal: Option<Box<[u8]>>,
    /// The portal bound to a SET/RESET/DISCARD or transaction-control statement, and its
    /// text: its Execute is tracked like a simple Query's (see `ext_done`).
    tracked_portal: Option<Box<TrackedPortal>>,
    /// Tracked statements the server completed through the extended protocol since the last
    /// ReadyForQuery, in order; applied or dropped there, as the transaction ends.
    ext_done: Vec<Box<str>>,
    /// An extended-protocol request failed since the last ReadyForQuery.
    ext_failed: bool,
    /// ParameterDescription of a Describe S of a cached statement, held until the row
    /// description arrives (a stale statement errors in between, and is then retried).
    param_desc: Option<Box<[u8]>>,
    /// Statements the client parsed in this transaction whose Parse the cache answered:
    /// their first use runs inside a savepoint guard (`guard`). Boxed, and None when
    /// empty: every idle client carries the field.
    #[allow(clippy::box_collection)]
    fresh_in_tx: Option<Box<Vec<u64>>>,
    /// SQL-level statements the client PREPAREd (answered from the cache) and has not
    /// EXECUTEd since: a stale plan met by their first EXECUTE is retried, as PostgreSQL
    /// would have prepared them afresh. Boxed and None when empty, as above.
    #[allow(clippy::box_collection)]
    fresh_sql: Option<Box<Vec<u64>>>,
    /// A BEGIN (or START TRANSACTION) was sent since the last ReadyForQuery: what follows
    /// it runs in a transaction block although no ReadyForQuery has said so yet.
    tx_opening: bool,
    /// The client may have called `set_config(…, false)` on the linked server: a
    /// session-level change parsnip cannot replay, so that server is closed, not reused,
    /// when this client gives it back (`settings::may_set_session_config`).
    server_dirty: bool,
    /// The linked server took another client's batch behind this session's replies
    /// (`pipeline`): nothing more may be written to it.
    lent: bool,
}

impl Session {
    /// A session in `mode` whose client expects `settings`. With a `registry`, prepared
    /// statements go through the shared cache; without, they pass through.
    pub fn new(mode: PoolMode, settings: Arc<Settings>, uid: u64, registry: Option<Arc<Registry>>) -> Session {
        Session {
            mode,
            link: Link::Unlinked,
            replies: ReplyQueue::default(),
            to_client: BytesMut::new(),
            to_server: BytesMut::new(),
            actions: VecDeque::new(),
            tx_status: TxStatus::Idle,
            copy_in: false,
            skip_until_sync: false,
            server_skipping: false,
            hold: false,
            shape_mismatch: None,
            acquire_error: None,
            closing: false,
            settings,
            tx_settings: Vec::new(),
            uid,
            registry,
            named: HashMap::new(),
            sql_prefix: HashMap::new(),
            unnamed: Unnamed::None,
            unnamed_seq: 0,
            key_buf: Vec::new(),
            batch: Vec::new(),
            last_batch: Vec::new(),
            frame_at: 0,
            batch_executed: false,
            described: Default::default(),
            retried: false,
            replay: None,
            param_desc: None,
            last_bind: None,
            dealloc_portal: None,
            tracked_portal: None,
            ext_done: Vec::new(),
            ext_failed: false,
            fresh_in_tx: None,
            fresh_sql: None,
            tx_opening: false,
            server_dirty: false,
            lent: false,
        }
    }

    // ---- A: getters ----

    /// The reply queue's storage when it is empty, for a client going idle (the driver
    /// recycles it with the IO buffers; an idle client keeps none).
    pub fn take_idle_storage(&mut self) -> Option<VecDeque<reply_queue::Pending>> {
        self.replies.take_storage()
    }

    /// Storage for the reply queue of a client becoming active, if it has none: `get`
    /// supplies it (called only then).
    pub fn lend_storage(&mut self, get: impl FnOnce() -> Option<VecDeque<reply_queue::Pending>>) {
        self.replies.lend_storage(get)
    }

    /// A server is linked.
    pub fn is_linked(&self) -> bool {
        self.link == Link::Linked
    }
    /// Waiting for the pool.
    pub fn is_acquiring(&self) -> bool {
        self.link == Link::Acquiring
    }
    /// Linked, inside a transaction, with nothing outstanding: the client is idle in a transaction.
    pub fn is_idle_in_transaction(&self) -> bool {
        self.link == Link::Linked && self.replies.is_empty() && self.tx_status != TxStatus::Idle
    }
    /// Requests outstanding on the linked server.
    pub fn outstanding(&self) -> usize {
        self.replies.len()
    }
    /// The client's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    /// The session is closing: feed nothing more.
    pub fn is_closing(&self) -> bool {
        self.closing
    }
    /// Client frames the driver must feed again before the ones it holds (a batch retried
    /// after a transparent re-prepare).
    pub fn take_replay(&mut self) -> Option<Vec<u8>> {
        self.replay.take().map(Vec::from)
    }
    /// Actions are waiting for the driver.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }
    /// Prepared statements the client holds by name.
    pub fn prepared_count(&self) -> usize {
        self.named.len()
    }

    // ---- D: outputs ----

    /// Next action for the driver; call until None after every input.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Frees the output buffers' memory when they are empty (call when the client goes idle).
    pub fn shrink_idle(&mut self) {
        if self.to_client.is_empty() && self.to_client.capacity() > 0 {
            self.to_client = BytesMut::new();
        }
        if self.to_server.is_empty() && self.to_server.capacity() > 0 && self.link != Link::Linked {
            self.to_server = BytesMut::new();
        }
    }

    // ---- B: inputs ----

    /// One whole frame from the client (length already checked by the driver), with the
    /// linked server's state if a server is linked. Returns false when the frame needs a
    /// server first: an `AcquireServer` action is queued and the driver must feed the same
    /// frame again once linked.
    pub fn handle_client(&mut self, frame: &[u8], server: Option<&mut ServerState>) -> bool {
        if !wire_trace::on() {
            return self.on_client_frame(frame, server);
        }
        let (to_s, to_c) = (self.to_server.len(), self.to_client.len());
        wire_trace::frames(self.uid, "client>", true, frame);
        let consumed = self.on_client_frame(frame, server);
        if !consumed {
            wire_trace::frames(self.uid, "  (held)", true, frame);
        }
        self.trace_output(to_s, to_c);
        consumed
    }

    /// Logs what the session wrote to either side since the buffers had these lengths.
    fn trace_output(&self, to_s: usize, to_c: usize) {
        if let Some(out) = self.to_server.get(to_s..) {
            wire_trace::frames(self.uid, "  >server", true, out);
        }
        if let Some(out) = self.to_client.get(to_c..) {
            wire_trace::frames(self.uid, "  >client", false, out);
        }
    }

    fn on_client_frame(&mut self, frame: &[u8], server: Option<&mut ServerState>) -> bool {
        if self.closing {
            return true;
        }
        let tag = frame[0];
        if let Some(err) = self.acquire_error.take() {
            // The pool could not serve this request: fail it as PostgreSQL fails a request.
            err.write_to(&mut self.to_client);
            if tag == tags::QUERY || tag == tags::SYNC {
                backend::ready_for_query(&mut self.to_client, b'I');
            } else {
                self.skip_until_sync = true;
            }
            return true;
        }
        if self.hold {
            // Waiting for a shape check on the server: feed this frame again later.
            return false;
        }
        if self.skip_until_sync {
            if tag == tags::SYNC {
                self.skip_until_sync = false;
                backend::ready_for_query(&mut self.to_client, self.tx_status.as_byte());
            } else if tag == tags::TERMINATE {
                self.close();
            }
            return true;
        }
        // A server the session has already given back (a release queued, not yet carried
        // out) must not be used.
        match server.filter(|_| self.link == Link::Linked) {
            Some(srv) => self.on_client_linked(frame, srv),
            None => self.on_client_unlinked(frame),
        }
    }

    fn on_client_unlinked(&mut self, frame: &[u8]) -> bool {
        match frame[0] {
            // Nothing outstanding and no transaction open: answer without a server.
            tags::SYNC => backend::ready_for_query(&mut self.to_client, b'I'),
            tags::FLUSH => {}
            tags::TERMINATE => self.close(),
            // PostgreSQL ignores copy messages outside COPY.
            tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL => {}
            tags::CLOSE if self.registry.is_some() => self.on_close(frame, None),
            tags::PARSE if self.registry.is_some() => return self.on_parse(frame, None),
            tags::QUERY
            | tags::PARSE
            | tags::BIND
            | tags::DESCRIBE
            | tags::EXECUTE
            | tags::CLOSE
            | tags::FUNCTION_CALL => {
                return self.need_server();
            }
            t => self.fail(Error::protocol(format!("invalid frontend message type {t}"))),
        }
        true
    }

    fn on_client_linked(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let tag = frame[0];
        if self.server_skipping {
            // The server discards everything up to Sync, as PostgreSQL does after an error:
            // pass it along untouched, expect no reply, and register nothing.
            self.to_server.extend_from_slice(frame);
            match tag {
                tags::SYNC => {
                    self.server_skipping = false;
                    self.replies.push(Pending::client(Req::Sync));
                }
                tags::TERMINATE => self.close(),
                _ => {}
            }
            return true;
        }
        let unnamed_owner = srv.stmts.unnamed_owner;
        if tag == tags::QUERY {
            // PostgreSQL drops the unnamed statement at every simple Query.
            srv.stmts.unnamed_owner = None;
            self.unnamed = Unnamed::None;
        }
        if self.registry.is_some() {
            // Keep the batch for a transparent retry: outside transactions, and inside one
            // from where a savepoint guard may be needed (`guard`).
            let record = (self.tx_status == TxStatus::Idle
                || (self.tx_status == TxStatus::InBlock && (self.fresh_in_tx.is_some() || !self.batch.is_empty())))
                && matches!(tag, tags::PARSE | tags::BIND | tags::DESCRIBE | tags::EXECUTE | tags::CLOSE | tags::SYNC);
            if record {
                self.frame_at = self.batch.len() as u32;
                self.batch.extend_from_slice(frame);
            }
            let consumed = match tag {
                tags::PARSE => self.on_parse(frame, Some(srv)),
                tags::BIND => self.on_bind(frame, srv),
                tags::DESCRIBE => self.on_describe(frame, srv),
                _ => true,
            };
            if record && !consumed {
                self.batch.truncate(self.frame_at as usize);
            }
            if tag == tags::SYNC && record {
                std::mem::swap(&mut self.batch, &mut self.last_batch);
                self.batch.clear();
            }
            match tag {
                tags::EXECUTE => self.batch_executed = true,
                // These end with their own ReadyForQuery, like a Sync.
                tags::SYNC | tags::QUERY | tags::FUNCTION_CALL => self.batch_executed = false,
                _ => {}
            }
            if matches!(tag, tags::PARSE | tags::BIND | tags::DESCRIBE) {
                return consumed;
            }
            match tag {
                tags::CLOSE => {
                    self.on_close(frame, Some(srv));
                    return true;
                }
                tags::QUERY => {
                    let sent = self.to_server.len();
                    if !self.on_query_cached(frame, srv) {
                        // Fed again once the replies it waits for are in (nothing was sent).
                        srv.stmts.unnamed_owner = unnamed_owner;
                        return false;
                    }
                    if self.to_server.len() == sent {
                        // Answered here: the server's unnamed statement is untouched (and no
                        // longer the client's).
                        srv.stmts.unnamed_owner = unnamed_owner;
                    }
                    return true;
                }
                _ => {}
            }
        }
        if matches!(tag, tags::QUERY | tags::FUNCTION_CALL) {
            self.batch.clear();
        }
        match tag {
            tags::QUERY => self.forward_query(frame),
            tags::PARSE => self.forward(frame, Req::Parse),
            tags::BIND => self.forward(frame, Req::Bind),
            tags::DESCRIBE => self.forward(frame, Req::Describe),
            tags::EXECUTE => {
                self.forward(frame, Req::Execute);
                if self.registry.is_some() {
                    self.on_execute(frame);
                    self.track_execute(frame);
                }
            }
            tags::CLOSE => self.forward(frame, Req::Close),
            tags::FUNCTION_CALL => self.forward(frame, Req::FunctionCall),
            tags::SYNC => {
                self.to_server.extend_from_slice(frame);
                // Ignored by the server in COPY FROM STDIN: no reply to wait for.
                if !self.copy_in {
                    self.replies.push(Pending::client(Req::Sync));
                }
            }
            tags::FLUSH => self.to_server.extend_from_slice(frame),
            tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL => {
                self.to_server.extend_from_slice(frame);
                if tag != tags::COPY_DATA {
                    self.copy_in = false;
                }
            }
            tags::TERMINATE => self.close(),
            t => self.fail(Error::protocol(format!("invalid frontend message type {t}"))),
        }
        true
    }

    fn need_server(&mut self) -> bool {
        if self.link == Link::Unlinked {
            self.link = Link::Acquiring;
            self.actions.push_back(Action::AcquireServer);
        }
        false
    }

    fn forward_query(&mut self, frame: &[u8]) {
        let mut p = Pending::client(Req::Query);
        if let Some(text) = frontend::query_text(body(frame)) {
            if settings::maybe_setting_stmt(text) || (!self.tx_settings.is_empty() && settings::maybe_tx_end(text)) {
                p.tracked_sql = std::str::from_utf8(text).ok().map(Into::into);
            }
            self.server_dirty |= settings::may_set_session_config(text);
            // Outside transactions, with the cache on: may others be queued behind it?
            p.plain_read = self.tx_status == TxStatus::Idle
                && self.registry.is_some()
                && p.tracked_sql.is_none()
                && crate::stmt::sql::is_plain_read(text);
        }
        self.to_server.extend_from_slice(frame);
        self.replies.push(p);
    }

    #[inline]
    fn forward(&mut self, frame: &[u8], req: Req) {
        self.to_server.extend_from_slice(frame);
        self.replies.push(Pending::client(req));
    }

    /// Queues a reply the pooler makes itself, in pipeline order.
    fn push_synth(&mut self, s: Synth, fx: reply_queue::Fx) {
        // The request kind it stands for, so that skip-to-Sync treats it like the real one.
        let req = match s {
            Synth::ParseComplete => Req::Parse,
            Synth::CloseComplete => Req::Close,
            Synth::Tag(_) => Req::Execute,
            Synth::TagAndReady(_) => Req::Query,
        };
        self.replies.push(Pending::with(req, OnReply::Synth(s), fx));
        self.drain_synth();
    }

    /// Emits the synthesized replies now at the head of the queue.
    fn drain_synth(&mut self) {
        while let Some(p) = self.replies.head() {
            let OnReply::Synth(s) = &p.on_reply else { break };
            match s {
                Synth::ParseComplete => backend::empty(&mut self.to_client, tags::PARSE_COMPLETE),
                Synth::CloseComplete => backend::empty(&mut self.to_client, tags::CLOSE_COMPLETE),
                Synth::Tag(t) => backend::command_complete(&mut self.to_client, t),
                Synth::TagAndReady(t) => {
                    backend::command_complete(&mut self.to_client, t);
                    backend::ready_for_query(&mut self.to_client, self.tx_status.as_byte());
                }
            }
            self.replies.pop();
        }
        self.maybe_release();
    }

    /// The pool gave us `server`: replay settings if they differ.
    pub fn handle_server_linked(&mut self, server: &mut ServerState) {
        self.link = Link::Linked;
        self.lent = false;
        server.tx_status = TxStatus::Idle;
        server.stmts.begin_link();
        self.trim_server_statements(server);
        if self.settings.key() != server.settings.key() {
            let sql = self.settings.diff_sql(&server.settings);
            server.settings.copy_extra_from(&self.settings);
            if !sql.is_empty() {
                frontend::query(&mut self.to_server, &sql);
                self.replies.push(Pending::internal(Req::Query, Purpose::SyncSettings));
            }
        }
    }

    /// The pool could not give a server. A FATAL error closes the client; an ERROR fails
    /// the request that needed the server as PostgreSQL would (error, then skip to Sync).
    pub fn handle_acquire_failed(&mut self, err: Error) {
        self.link = Link::Unlinked;
        if err.severity == Severity::Fatal {
            return self.fail(err);
        }
        self.acquire_error = Some(Box::new(err));
    }

    /// The linked server's connection broke.
    pub fn handle_server_lost(&mut self) {
        self.replies.clear();
        if self.link == Link::Linked {
            self.link = Link::Unlinked;
            self.actions.push_back(Action::ReleaseServer { reusable: false });
        }
        self.fail(Error::fatal(SqlState::CONNECTION_FAILURE, "server closed the connection unexpectedly"));
    }

    /// The start (`header`: tag and length) of a server frame too large to hold whole. True
    /// when it is one the session forwards untouched, a DataRow or CopyData answering a
    /// request whose replies go to the client: the header is written to `to_client`, and
    /// the driver appends the frame's body as it arrives (the session sees nothing of it,
    /// as it would do nothing with it but copy it).
    pub fn stream_server_frame(&mut self, header: &[u8]) -> bool {
        if !matches!(header.first(), Some(&tags::DATA_ROW | &tags::COPY_DATA))
            || self.param_desc.is_some()
            || wire_trace::on()
            || self.replies.head().is_none_or(|h| h.is_synth() || !matches!(h.on_reply, OnReply::Forward))
        {
            return false;
        }
        self.to_client.extend_from_slice(header);
        true
    }

    /// One whole frame from the linked server.
    pub fn handle_server(&mut self, frame: &[u8], server: &mut ServerState) {
        if !wire_trace::on() {
            return self.on_server_frame(frame, server);
        }
        let (to_s, to_c) = (self.to_server.len(), self.to_client.len());
        wire_trace::frames(self.uid, "server>", false, frame);
        self.on_server_frame(frame, server);
        self.trace_output(to_s, to_c);
    }

    fn on_server_frame(&mut self, frame: &[u8], server: &mut ServerState) {
        let tag = frame[0];
        match tag {
            tags::PARAMETER_STATUS => return self.on_parameter_status(frame, server),
            tags::NOTICE_RESPONSE | tags::NOTIFICATION_RESPONSE => {
                if tag == tags::NOTIFICATION_RESPONSE
                    || self.replies.head().is_none_or(|h| matches!(h.on_reply, OnReply::Forward))
                {
                    self.to_client.extend_from_slice(frame);
                }
                return;
            }
            _ => {}
        }
        let Some(head) = self.replies.head_mut() else {
            return self.desync(tag);
        };
        if head.is_synth() {
            // A local answer should have been drained already; the server is ahead of us.
            return self.desync(tag);
        }
        let req = head.req;
        if tag == tags::READY_FOR_QUERY {
            return self.on_ready(frame, server);
        }
        if tag == tags::ERROR_RESPONSE {
            return self.on_error(frame, server);
        }
        if matches!(tag, tags::PARSE_COMPLETE | tags::BIND_COMPLETE | tags::CLOSE_COMPLETE) && !req.completed_by(tag) {
            return self.desync(tag);
        }
        let forwarded = matches!(head.on_reply, OnReply::Forward);
        if req == Req::Describe && tag == tags::PARAMETER_DESCRIPTION && head.fx.uses.is_some() {
            if matches!(head.on_reply, OnReply::Forward) {
                self.param_desc = Some(frame.into());
            }
            return;
        }
        if matches!(head.on_reply, OnReply::Forward) {
            if let Some(pd) = self.param_desc.take() {
                self.to_client.extend_from_slice(&pd);
            }
            if tag == tags::COMMAND_COMPLETE && matches!(head.fx.client, reply_queue::ClientFx::ClearedAll { .. }) {
                // The server ran the stand-in; the client ran DEALLOCATE ALL.
                backend::command_complete(&mut self.to_client, "DEALLOCATE ALL");
            } else {
                self.to_client.extend_from_slice(frame);
            }
        }
        if req == Req::Describe && (tag == tags::ROW_DESCRIPTION || tag == tags::NO_DATA) {
            if let OnReply::ShapeCheck(s) = &head.on_reply {
                let s = s.clone();
                self.on_shape_checked(&s, frame, server);
            } else if let Some(s) = head.fx.uses.as_ref().or(head.fx.portal_of.as_ref())
                && matches!(head.on_reply, OnReply::Forward)
            {
                // What this client is told the statement returns.
                let s = s.clone();
                if statements::same_shape(s.shape.get_or_init(|| frame.into()), frame) {
                    self.described.insert(s.id);
                } else {
                    self.on_new_shape(&s, frame);
                }
            }
        }
        if tag == tags::COMMAND_COMPLETE && forwarded {
            let cmd = body(frame);
            if cmd.starts_with(b"DEALLOCATE ALL") || cmd.starts_with(b"DISCARD ALL") {
                // Run on the server itself (e.g. through Parse/Bind/Execute): every statement
                // there is gone, and so are the client's.
                server.stmts.clear();
                if self.registry.is_some() {
                    self.named.clear();
                }
            }
        }
        if tag == tags::COPY_IN_RESPONSE {
            self.copy_in = true;
            if req == Req::Execute {
                self.replies.drop_syncs_after_head();
            }
        } else if req.completed_by(tag)
            && let Some(p) = self.replies.pop()
        {
            if p.req == Req::Execute
                && tag == tags::COMMAND_COMPLETE
                && let Some(sql) = p.tracked_sql
            {
                self.ext_done.push(sql);
            }
            // A SQL-level statement exists once its PREPARE has run, not when that is parsed.
            if let Some(s) = &p.fx.server_parse
                && (p.req != Req::Parse || s.kind != StmtKind::Sql)
            {
                s.validated.store(true, Ordering::Relaxed);
                // Counted when done: a Parse the server skipped after an error never ran.
                if let Some(r) = &self.registry {
                    r.stats.server_parses.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.drain_synth();
        }
    }

    fn on_error(&mut self, frame: &[u8], server: &mut ServerState) {
        self.copy_in = false;
        self.param_desc = None;
        let Some(head) = self.replies.head_mut() else { return self.desync(tags::ERROR_RESPONSE) };
        head.failed = true;
        let req = head.req;
        let code = backend::error_field(body(frame), b'C').unwrap_or_default();
        let retry_from = head.fx.replay_from;
        match &head.fx.uses {
            Some(s) if retry_from.is_some() && (code == b"0A000" || code == b"26000") => {
                let s = s.clone();
                if self.try_retry(&s, code, retry_from.unwrap_or(0), server) {
                    return;
                }
            }
            _ => {}
        }
        let Some(head) = self.replies.head_mut() else { return };
        match &head.on_reply {
            OnReply::Forward | OnReply::Inject => match &head.fx.rename {
                Some(r) => r.rewrite_error(frame, &mut self.to_client),
                None => self.to_client.extend_from_slice(frame),
            },
            OnReply::ReplaceError(e) if code == b"26000" => e.write_to(&mut self.to_client),
            OnReply::ReplaceError(_) => self.to_client.extend_from_slice(frame),
            OnReply::Skip if head.purpose == Purpose::SyncSettings => {
                // The client's settings cannot be applied: PostgreSQL would have refused
                // them at startup.
                self.to_client.extend_from_slice(frame);
                return self.fail_quiet();
            }
            OnReply::Skip | OnReply::Synth(_) | OnReply::ShapeCheck(_) | OnReply::Answered => {}
        }
        if let Some(s) = head.fx.uses.clone() {
            self.on_statement_error(&s, code, server);
        }
        if req.is_extended() {
            self.ext_failed = true;
            // The server now skips to the next Sync: those requests get no reply.
            if let Some(p) = self.replies.pop() {
                self.rollback(p, server);
            }
            while let Some(p) = self.replies.pop_unless_sync() {
                self.rollback(p, server);
            }
            // A PREPARE run ahead of the client's EXECUTE failed: that error is the answer.
            self.replies.answer_after_prepare_sync();
            // No Sync sent yet (the batch ended with Flush): the server ignores what the
            // client sends until its Sync.
            self.server_skipping = self.replies.is_empty();
        }
    }

    fn on_ready(&mut self, frame: &[u8], server: &mut ServerState) {
        let Some(p) = self.replies.pop() else { return self.desync(tags::READY_FOR_QUERY) };
        if p.req.is_extended() {
            return self.desync(tags::READY_FOR_QUERY);
        }
        let status = TxStatus::from_byte(frame.get(5).copied().unwrap_or(b'I'));
        self.replies.mark_synced();
        self.tx_opening = false;
        if p.purpose == Purpose::Retried {
            // The hidden end of a failed batch being retried: the client's transaction
            // status is the retried batch's.
            server.tx_status = status;
            self.ext_failed = false;
            return self.drain_synth();
        }
        if matches!(p.on_reply, OnReply::Forward) {
            self.retried = false;
        }
        let before = self.tx_status;
        self.tx_status = status;
        server.tx_status = status;
        if status != TxStatus::InBlock {
            self.end_guards();
        }
        self.copy_in = false;
        if !self.ext_done.is_empty() {
            // SET/RESET/DISCARD and transaction control run through the extended protocol.
            let sql = std::mem::take(&mut self.ext_done).join(";\n");
            let failed = self.ext_failed;
            self.track_settings(&sql, failed, before != TxStatus::Idle, status, server);
        } else if let Some(sql) = &p.tracked_sql {
            self.track_settings(sql, p.failed, before != TxStatus::Idle, status, server);
        } else if status == TxStatus::Idle {
            self.tx_settings.clear();
        }
        self.ext_failed = false;
        let done = self.replies.is_empty();
        if self.mode == PoolMode::Statement && status != TxStatus::Idle && p.purpose == Purpose::Client && done {
            // A transaction block was opened: refuse it, roll it back on the server.
            Error::new(SqlState::FEATURE_NOT_SUPPORTED, "transaction blocks are not allowed in statement pooling mode")
                .write_to(&mut self.to_client);
            backend::ready_for_query(&mut self.to_client, b'I');
            self.tx_status = TxStatus::Idle;
            frontend::query(&mut self.to_server, "ROLLBACK");
            self.replies.push(Pending::internal(Req::Query, Purpose::Rollback));
            return;
        }
        if matches!(p.on_reply, OnReply::Forward | OnReply::ReplaceError(_) | OnReply::Answered) {
            self.to_client.extend_from_slice(frame);
        }
        self.drain_synth();
    }

    /// Releases the server when nothing is outstanding and no transaction is open.
    fn maybe_release(&mut self) {
        if self.link == Link::Linked
            && self.replies.is_empty()
            && self.tx_status == TxStatus::Idle
            && !self.copy_in
            && !self.server_skipping
            && !self.replies.is_unsynced()
            && self.mode != PoolMode::Session
        {
            self.link = Link::Unlinked;
            let reusable = !std::mem::take(&mut self.server_dirty);
            if !reusable {
                tracing::debug!("server connection closed: set_config() may have changed its session settings");
            }
            self.actions.push_back(Action::ReleaseServer { reusable });
        }
    }

    fn on_parameter_status(&mut self, frame: &[u8], server: &mut ServerState) {
        let Some((name, value)) = backend::parameter_status_fields(body(frame)) else {
            return self.desync(tags::PARAMETER_STATUS);
        };
        let Some(name) = tracked_name(name) else {
            self.to_client.extend_from_slice(frame);
            return;
        };
        server.settings.set_reported(name, value);
        // Forward when the client asked for the change, or when it changes what the client
        // believes (a replayed setting normalized by the server, e.g. DateStyle).
        let changed =
            self.settings.reported(name) != Some(value) && Arc::make_mut(&mut self.settings).set_reported(name, value);
        if changed || self.replies.head().is_none_or(|h| matches!(h.on_reply, OnReply::Forward)) {
            self.to_client.extend_from_slice(frame);
        }
    }

    fn desync(&mut self, tag: u8) {
        tracing::warn!(tag = %(tag as char), "server reply does not match any outstanding request");
        self.replies.clear();
        if self.link == Link::Linked {
            self.link = Link::Unlinked;
            self.actions.push_back(Action::ReleaseServer { reusable: false });
        }
        self.fail(Error::protocol("server sent an unexpected message"));
    }

    /// Sends `err` and closes the client (and the server, if it is in an unknown state).
    pub fn fail(&mut self, err: Error) {
        err.write_to(&mut self.to_client);
        self.fail_quiet();
    }

    fn fail_quiet(&mut self) {
        if self.link == Link::Linked {
            self.link = Link::Unlinked;
            self.actions.push_back(Action::ReleaseServer { reusable: false });
        }
        self.close();
    }

    fn close(&mut self) {
        if !self.closing {
            self.closing = true;
            self.actions.push_back(Action::Close);
        }
    }
}

impl Session {
    /// A Query with SET/RESET/transaction statements finished: keep the settings that
    /// persist as PostgreSQL would (outside a transaction, or in one that committed).
    fn track_settings(&mut self, sql: &str, failed: bool, was_in_tx: bool, status: TxStatus, server: &mut ServerState) {
        let mut in_tx = was_in_tx;
        let mut apply = Vec::new();
        for t in settings::session_stmts(sql.as_bytes()) {
            match t {
                TxStmt::Begin => in_tx = true,
                TxStmt::Commit => {
                    apply.append(&mut self.tx_settings);
                    in_tx = false;
                }
                TxStmt::Rollback => {
                    self.tx_settings.clear();
                    in_tx = false;
                }
                TxStmt::Setting(s) if in_tx => self.tx_settings.push(s),
                TxStmt::Setting(s) => apply.push(s),
            }
        }
        if failed && status == TxStatus::Idle {
            // The implicit transaction of this Query failed: nothing of it persists.
            apply.clear();
            self.tx_settings.clear();
        }
        if status == TxStatus::Idle {
            // Ended by something not seen here (e.g. an extended-protocol COMMIT): unknown.
            self.tx_settings.clear();
        }
        for s in apply {
            apply_setting(Arc::make_mut(&mut self.settings), &mut server.settings, s);
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
