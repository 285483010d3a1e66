//! Frames from the client: what each message does to the session, which of them the
//! session answers itself, and which go to the linked server (asking for one first).
//! Statement messages with the cache on go through `stmts`.

use super::reply_queue::{OnReply, Pending, Req};
use super::settings;
use super::stmts::Unnamed;
use super::{Action, Fed, Link, Phase, Session, wire_trace};
use crate::config::PoolMode;
use crate::error::Error;
use crate::protocol::{backend, body, frontend, tags};
use crate::state::{ServerState, TxStatus};
use crate::stmt::sql::Marks;

impl Session {
    /// One whole frame from the client (length already checked by the driver), with the
    /// linked server's state if a server is linked. Every message is translated knowing
    /// which server it goes to, so a frame that needs a server, or replies still on their
    /// way, is not consumed: see [`Fed`] for when to feed it again.
    pub fn handle_client(&mut self, frame: &[u8], server: Option<&mut ServerState>) -> Fed {
        let traced = wire_trace::on();
        let (to_s, to_c) = (self.to_server.len(), self.to_client.len());
        if traced {
            wire_trace::frames(self.kept.uid, "client>", true, frame);
        }
        self.autoprep_before_frame();
        let consumed = self.on_client_frame(frame, server);
        self.autoprep_after_frame(consumed);
        self.note_client_output(to_c, frame[0], consumed);
        let fed = if consumed {
            Fed::Consumed
        } else if self.link.is_linked() {
            Fed::AwaitsReplies
        } else {
            Fed::NeedsServer
        };
        if traced {
            if fed != Fed::Consumed {
                wire_trace::frames(self.kept.uid, "  (held)", true, frame);
            }
            self.trace_output(to_s, to_c);
        }
        fed
    }

    /// The driver's word on the client frame it feeds next (a Parse): the frames it has
    /// already read after it end the batch with a Sync before any Flush
    /// (`frontend::syncs_before_flush`). Inside a transaction block the cache serves an
    /// unnamed read only in such a batch (`stmts::guard`'s `serves_in_block`): a guarded
    /// use's 0A000 is retried at the batch's Sync, and a batch a Flush ends (node-postgres'
    /// pg-cursor reads a portal in chunks so) has none to retry at. Holds for that one
    /// frame.
    pub fn note_synced_ahead(&mut self, synced: bool) {
        self.busy.frame_marks.synced_ahead = synced;
    }

    pub(super) fn on_client_frame(&mut self, frame: &[u8], server: Option<&mut ServerState>) -> bool {
        if frame[0] == tags::QUERY
            && let Some(text) = frontend::query_text(body(frame))
        {
            self.busy.frame_marks.frame = Some((frame.as_ptr() as usize, frame.len()));
            self.busy.frame_marks.text = Some((text.as_ptr() as usize, text.len()));
        }
        let consumed = self.on_client_frame_marked(frame, server);
        self.busy.frame_marks = Default::default();
        consumed
    }

    /// The text of a Query frame (`frontend::query_text`): that of the client frame being
    /// handled was found once (`on_client_frame`); any other frame's is read anew.
    pub(super) fn query_text_of<'a>(&self, frame: &'a [u8]) -> Option<&'a [u8]> {
        let fm = &self.busy.frame_marks;
        match (fm.frame, fm.text) {
            (Some(f), Some((_, len))) if f == (frame.as_ptr() as usize, frame.len()) => body(frame).get(..len),
            _ => frontend::query_text(body(frame)),
        }
    }

    /// The marks of a Query text (`stmt::sql::Marks`): those of the client frame being
    /// handled are worked out once, whichever classifier asks first; any other text's
    /// (a rewritten Query) anew.
    pub(super) fn query_marks(&mut self, text: &[u8]) -> Marks {
        let fm = &mut self.busy.frame_marks;
        if fm.text != Some((text.as_ptr() as usize, text.len())) {
            return Marks::of(text);
        }
        *fm.marks.get_or_insert_with(|| Marks::of(text))
    }

    fn on_client_frame_marked(&mut self, frame: &[u8], mut server: Option<&mut ServerState>) -> bool {
        if self.busy.phase == Phase::Closing {
            return true;
        }
        if self.busy.replies.is_empty()
            && let Some(l) = self.link.state_mut()
        {
            l.busy_since_us = self.busy.clock_us;
        }
        let tag = frame[0];
        if let Some(err) = self.busy.acquire_error.take() {
            // The pool could not serve this request: fail it as PostgreSQL fails a request.
            err.write_to(&mut self.to_client);
            if tag == tags::QUERY || tag == tags::SYNC {
                // Idle, or a block only a deferred BEGIN opened, failed now (`begin`).
                backend::ready_for_query(&mut self.to_client, self.busy.tx.status.as_byte());
            } else {
                self.enter(Phase::ClientSkipping);
            }
            return true;
        }
        if self.busy.phase == Phase::Held {
            // Waiting for a shape check on the server: feed this frame again later.
            return false;
        }
        if self.busy.phase == Phase::CopyIn
            && !matches!(
                tag,
                tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL | tags::FLUSH | tags::SYNC | tags::TERMINATE
            )
        {
            // PostgreSQL refuses it (an ERROR, then a FATAL, and the backend ends): it goes
            // to the server as it is, with no reply to wait for, never to the cache.
            if matches!(tag, tags::BIND | tags::EXECUTE)
                && body(frame).first() == Some(&0)
                && self.busy.replies.portal_leftover()
            {
                // Should the copy have ended first (a timeout, a bad row in a block), the
                // server runs it, and a failed COPY leaves its portal as any failed Query
                // does (`close_leftover_portal`): closed first. Read during the copy, the
                // Close is refused as this message would be.
                frontend::close_portal(&mut self.to_server, b"");
            }
            self.to_server.extend_from_slice(frame);
            self.dirty_server_if(true);
            return true;
        }
        if self.busy.phase == Phase::ClientSkipping {
            if tag == tags::SYNC {
                self.busy.phase = Phase::Ready;
                backend::ready_for_query(&mut self.to_client, self.busy.tx.status.as_byte());
            } else if tag == tags::TERMINATE {
                self.close();
            }
            return true;
        }
        if tag == tags::QUERY
            && let Some(consumed) = self.on_listen_query(frame)
        {
            return consumed;
        }
        if tag == tags::QUERY && (self.on_lone_begin(frame) || self.on_deferred_end(frame)) {
            return true;
        }
        if (tag == tags::BIND || self.busy.tx.begin_bind.is_some())
            && let Some(consumed) = self.on_begin_portal(frame, server.as_deref_mut())
        {
            return consumed;
        }
        if tag == tags::PARSE && self.parse_begin_here(frame) {
            return true;
        }
        // The SQL is looked at once per frame: a frame that waits for a server is fed
        // again once linked and looked at then (a Parse the cache may answer without a
        // server is looked at now); the Parse an autoprepared Query becomes is not looked
        // at again.
        let sql = matches!(tag, tags::QUERY | tags::PARSE) && !self.autoprep_feeding();
        // A server the session has already given back (a release queued, not yet carried
        // out) must not be used.
        match server.filter(|_| self.link.is_linked()) {
            Some(srv) => {
                if sql {
                    self.look_at_sql(frame);
                }
                self.on_client_linked(frame, srv)
            }
            None => {
                if sql && tag == tags::PARSE && self.parses_unlinked() {
                    self.look_at_sql(frame);
                }
                self.on_client_unlinked(frame)
            }
        }
    }

    pub(super) fn on_client_unlinked(&mut self, frame: &[u8]) -> bool {
        match frame[0] {
            // Nothing outstanding and no transaction open on a server: answer without one
            // (in a block only a deferred BEGIN opened: `begin`).
            tags::SYNC => backend::ready_for_query(&mut self.to_client, self.busy.tx.status.as_byte()),
            tags::FLUSH if frame.len() > 5 => self.bad_flush(),
            tags::FLUSH => {}
            tags::TERMINATE => self.close(),
            // PostgreSQL ignores copy messages outside COPY.
            tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL => {}
            tags::CLOSE if self.answers_unlinked() => self.on_close(frame, None),
            tags::PARSE if self.parses_unlinked() => return self.on_parse(frame, None),
            tags::DESCRIBE if self.answers_unlinked() && self.on_describe_unlinked(frame) => {}
            tags::QUERY
            | tags::PARSE
            | tags::BIND
            | tags::DESCRIBE
            | tags::EXECUTE
            | tags::CLOSE
            | tags::FUNCTION_CALL => {
                return self.need_server(frame);
            }
            t => self.fail(Error::protocol(format!("invalid frontend message type {t}"))),
        }
        true
    }

    pub(super) fn on_client_linked(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        if self.hold_behind_guard() {
            return false;
        }
        // The frames an autoprepared plain read becomes are that read's.
        if self.busy.wants_reads && !self.autoprep_feeding() && !self.is_read_batch(frame) {
            if self.link.state().is_some_and(|l| l.on_reads) {
                // Not for a standby: it waits for this server to be given back.
                return false;
            }
            // On the primary, this link now runs more than plain reads.
            self.busy.wants_reads = false;
        }
        let tag = frame[0];
        if self.busy.phase == Phase::ServerSkipping {
            self.pass_while_server_skips(frame);
            return true;
        }
        self.pins_server_seen(srv);
        if tag == tags::BIND && self.stmts.registry.is_none() {
            self.bind_for_pins();
        }
        let unnamed_owner = srv.stmts.unnamed_owner;
        if matches!(tag, tags::QUERY | tags::FUNCTION_CALL) && self.busy.replies.is_unsynced() {
            // A simple Query (or a FunctionCall, which PostgreSQL runs the same way) inside
            // an extended-protocol batch not ended by Sync (a portal suspended, say):
            // PostgreSQL 18 answers it inside the implicit transaction and then fails the
            // backend's next transaction start with XX000 "unexpected state STARTED" — the
            // next client's, through a pool. That backend is not reused.
            self.dirty_server_if(true);
        }
        if tag == tags::QUERY {
            // PostgreSQL drops the unnamed statement at every simple Query.
            srv.stmts.unnamed_owner = None;
            self.stmts.unnamed = Unnamed::None;
        }
        if tag == tags::EXECUTE && self.on_listen_execute(frame) {
            return true;
        }
        if self.stmts.registry.is_some()
            && let Some(consumed) = self.on_client_cached(frame, srv, unnamed_owner)
        {
            return consumed;
        }
        if matches!(tag, tags::QUERY | tags::FUNCTION_CALL) {
            self.busy.retry.batch.clear();
        }
        self.forward_client(frame)
    }

    /// The SQL of a Query or Parse, read once for what it tells before it is handled: SQL
    /// that may begin or end session state makes the server be asked what remains before it
    /// is given back (`pins`, transaction pooling), and SQL that may change the schema moves
    /// the shape epoch now and when its transaction ends (`stmt::epoch`: no description
    /// confirmed before is answered locally after; watched whether or not this pool answers
    /// Describe from the cache, as the epoch is the whole process's and another pool's may,
    /// after a reload turned it on).
    fn look_at_sql(&mut self, frame: &[u8]) {
        let pin = self.kept.mode != PoolMode::Session;
        let watch = self.stmts.registry.is_some();
        if !pin && !watch {
            return;
        }
        let (text, named) = match frame[0] {
            tags::QUERY => (self.query_text_of(frame), false),
            _ => match frontend::parse_fields(body(frame)) {
                Some(p) => (Some(p.query), !p.name.is_empty()),
                None => (None, false),
            },
        };
        let Some(text) = text else { return };
        // A lone LISTEN/UNLISTEN parsed with the cache on is answered at its Execute
        // (`notify`): it never runs on the server.
        let answered_listen = frame[0] == tags::PARSE
            && watch
            && crate::stmt::sql::listen::maybe_listen(text)
            && crate::stmt::sql::listen::parse_listen(text).is_some();
        if pin && !answered_listen {
            self.look_for_pins(text, named && !watch);
            if (frame[0] == tags::PARSE || !watch) && names_a_prepared_statement(text) {
                self.pin_for_prepared();
            }
        }
        if watch && crate::stmt::sql::may_change_schema(text) {
            crate::stmt::epoch::advance();
            self.busy.tx.schema_change = true;
        }
    }

    /// The server discards everything up to Sync, as PostgreSQL does after an error: pass
    /// it along untouched, expect no reply, and register nothing.
    fn pass_while_server_skips(&mut self, frame: &[u8]) {
        if !is_frontend_message(frame[0]) {
            // PostgreSQL ends the connection for it even while skipping; the client gets
            // the error, the server never sees it (another client may be queued on it).
            return self.fail(Error::protocol(format!("invalid frontend message type {}", frame[0])));
        }
        self.to_server.extend_from_slice(frame);
        match frame[0] {
            tags::SYNC => {
                self.busy.phase = Phase::Ready;
                self.busy.replies.push(Pending::client(Req::Sync));
            }
            tags::TERMINATE => self.close(),
            _ => {}
        }
    }

    /// A frame on a linked server with the statement cache on: kept for a transparent retry,
    /// and statement messages handled by `stmts`. None: forward it as without the cache.
    fn on_client_cached(
        &mut self,
        frame: &[u8],
        srv: &mut ServerState,
        unnamed_owner: Option<(u64, u64)>,
    ) -> Option<bool> {
        let tag = frame[0];
        let record = self.record_for_retry(frame);
        let consumed = match tag {
            tags::PARSE => self.on_parse(frame, Some(srv)),
            tags::BIND => self.on_bind(frame, srv),
            tags::DESCRIBE => self.on_describe(frame, srv),
            _ => true,
        };
        self.busy.retry.frame_handled(tag, record, consumed);
        match tag {
            tags::PARSE | tags::BIND | tags::DESCRIBE => Some(consumed),
            tags::CLOSE => {
                self.on_close(frame, Some(srv));
                Some(true)
            }
            tags::QUERY => {
                let sent = self.to_server.len();
                if !self.on_query_cached(frame, srv) {
                    // Fed again once the replies it waits for are in (nothing was sent).
                    srv.stmts.unnamed_owner = unnamed_owner;
                    return Some(false);
                }
                if self.to_server.len() == sent || self.busy.lifts.as_mut().is_some_and(|m| m.take_bound()) {
                    // Answered here, or bound directly as the cached statement an
                    // autoprepared Query runs as (`stmts::fastbind`): the server's unnamed
                    // statement is untouched (and no longer the client's).
                    srv.stmts.unnamed_owner = unnamed_owner;
                }
                Some(true)
            }
            _ => None,
        }
    }

    /// Keeps the frame in the batch a transparent retry replays: outside transactions, and
    /// inside one from where a savepoint guard may be needed (`stmts::guard`), or from the
    /// Parse of an autoprepared Query there (its replay starts at its Parse: the unnamed
    /// statement it made is gone after its Sync). True if kept.
    fn record_for_retry(&mut self, frame: &[u8]) -> bool {
        let record = (self.busy.tx.status == TxStatus::Idle
            || (self.busy.tx.status == TxStatus::InBlock
                && (self.stmts.fresh_in_tx.is_some()
                    || !self.busy.retry.batch.is_empty()
                    || self.busy.retry.autoprep.is_some())))
            && matches!(frame[0], tags::PARSE | tags::BIND | tags::DESCRIBE | tags::EXECUTE | tags::CLOSE | tags::SYNC);
        if record {
            self.busy.retry.record(frame);
        }
        record
    }

    /// Sends the frame to the linked server as it is, expecting its reply. False when it
    /// is to be fed again later (a copy message waiting to learn whether a COPY started).
    fn forward_client(&mut self, frame: &[u8]) -> bool {
        let tag = frame[0];
        match tag {
            tags::QUERY => self.forward_query(frame),
            tags::PARSE => self.forward(frame, Req::Parse),
            tags::BIND => {
                if body(frame).first() == Some(&0) {
                    self.close_leftover_portal();
                }
                self.forward(frame, Req::Bind)
            }
            tags::DESCRIBE => self.forward(frame, Req::Describe),
            tags::EXECUTE => {
                if body(frame).first() == Some(&0) {
                    self.close_leftover_portal();
                }
                self.forward(frame, Req::Execute);
                if self.stmts.registry.is_some() {
                    self.on_execute(frame);
                    self.track_execute(frame);
                    self.time_execute(frame);
                }
            }
            tags::CLOSE => self.forward(frame, Req::Close),
            tags::FUNCTION_CALL => self.forward(frame, Req::FunctionCall),
            tags::SYNC => {
                if self.busy.phase == Phase::CopyIn {
                    // PostgreSQL ignores a Sync in COPY FROM STDIN — unless the copy failed
                    // before the server read it (a bad row, a timeout): then it ends the
                    // skip to Sync and gets a ReadyForQuery. Which of the two happens is
                    // not known here, so it is not sent: the server skips, after such a
                    // failure, to the client's next Sync.
                    return true;
                }
                self.to_server.extend_from_slice(frame);
                self.busy.replies.push(Pending::client(Req::Sync));
            }
            tags::FLUSH if frame.len() > 5 => self.bad_flush(),
            tags::FLUSH => self.to_server.extend_from_slice(frame),
            tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL => {
                // A copy message reaches the server only inside COPY FROM STDIN. Outside
                // one PostgreSQL ignores it, but not quite: a timer's error (a
                // statement_timeout armed by the batch) raised as the server reads it is
                // followed by a ReadyForQuery and no skip to Sync, as after a simple Query,
                // which ends an extended batch early and gives the server one
                // ReadyForQuery more than the batch's Syncs (the concurrent hostile-client
                // test found both a copy message with nothing outstanding and one behind an
                // Execute of a plain SELECT). Behind a request that may start a COPY (an
                // Execute or Query not answered yet) it waits for that answer: the
                // CopyInResponse lets it go, anything else means it is dropped.
                if self.busy.phase != Phase::CopyIn {
                    if self.copy_may_start() {
                        if self.busy.replies.ask_flush() {
                            // An Execute's answer is sent only at a Sync or Flush, and the
                            // client's come after this message.
                            frontend::flush(&mut self.to_server);
                        }
                        return false;
                    }
                    return true;
                }
                self.to_server.extend_from_slice(frame);
                if tag != tags::COPY_DATA {
                    self.leave(Phase::CopyIn);
                }
            }
            tags::TERMINATE => self.close(),
            t => self.fail(Error::protocol(format!("invalid frontend message type {t}"))),
        }
        true
    }

    /// Whether a request the server has not answered yet may start a COPY FROM STDIN (an
    /// Execute or a Query of the client's).
    pub(super) fn copy_may_start(&self) -> bool {
        self.busy.replies.iter().any(|p| matches!(p.req, Req::Execute | Req::Query) && !p.is_synth())
    }

    /// A Flush with a body. PostgreSQL answers it with an ERROR, and no other message that
    /// gets no reply of its own can make it answer: were it sent on, that error would be
    /// taken for the reply of whatever request comes next (another client's, on a shared
    /// connection; the concurrent hostile-client test found it). The client is closed
    /// instead, with PostgreSQL's words.
    fn bad_flush(&mut self) {
        self.fail(Error::protocol("invalid message format"));
    }

    /// A simple Query answered by the session (`notify`, `begin`): its CommandComplete `tag`
    /// (None: an error was written instead), the notifications due if `status` is idle (as
    /// PostgreSQL sends them before ReadyForQuery 'I'), then ReadyForQuery with `status`,
    /// which is the client's from now. Counted as a query, and as a transaction when it
    /// leaves the client idle.
    pub(super) fn answered_here(&mut self, tag: Option<&str>, status: TxStatus) {
        // PostgreSQL drops the unnamed statement at every simple Query.
        self.stmts.unnamed = super::stmts::Unnamed::None;
        if let Some(tag) = tag {
            backend::command_complete(&mut self.to_client, tag);
        }
        self.busy.tx.status = status;
        if status == TxStatus::Idle {
            self.deliver_notifications();
        }
        backend::ready_for_query(&mut self.to_client, status.as_byte());
        self.kept.tally.queries = self.kept.tally.queries.wrapping_add(1);
        self.kept.tally.xacts = self.kept.tally.xacts.wrapping_add(u32::from(status == TxStatus::Idle));
    }

    /// Whether the cache answers statement messages with no server linked: not inside a
    /// block only a deferred BEGIN opened (`begin`), where an error must fail the
    /// transaction on the server that holds it.
    fn answers_unlinked(&self) -> bool {
        self.stmts.registry.is_some() && !self.begin_deferred()
    }

    /// Whether a Parse may be answered with no server linked: as `answers_unlinked`, and
    /// inside a deferred block too, where a named Parse is answered before any server checks
    /// it (`parses_ahead`) and one under a name the client already uses takes a server, whose
    /// block its error fails (`parse_frame`).
    fn parses_unlinked(&self) -> bool {
        self.stmts.registry.is_some()
    }

    pub(super) fn need_server(&mut self, frame: &[u8]) -> bool {
        if self.link == Link::Unlinked {
            self.link = Link::Acquiring;
            self.busy.wants_reads = self.kept.read_split && self.is_read_batch(frame);
            self.busy.actions.push_back(Action::AcquireServer);
        }
        false
    }

    pub(super) fn forward_query(&mut self, frame: &[u8]) {
        let mut p = Pending::client(Req::Query);
        if let Some(text) = self.query_text_of(frame) {
            if settings::maybe_setting_stmt(text) || (!self.busy.tx.settings.is_empty() && settings::maybe_tx_end(text))
            {
                p.tracked_sql = self.text_to_track(text);
            }
            self.note_set_config(text, None);
            if p.tracked_sql.is_some() || settings::may_hold_several(text) {
                // SET LOCAL of a statement or lock timeout arms its timer for this link too.
                let local = crate::state::timers::local_timer_us(text);
                self.shorten_timer(local);
            }
            // Outside transactions, with the cache on: may others be queued behind it?
            p.plain_read = self.busy.tx.status == TxStatus::Idle
                && self.stmts.registry.is_some()
                && p.tracked_sql.is_none()
                && crate::stmt::sql::is_plain_read_marked(text, || self.query_marks(text));
        }
        self.to_server.extend_from_slice(frame);
        self.busy.replies.push(p);
    }

    /// Before a Bind or Execute of the unnamed portal: if the server may still hold one
    /// left by a simple Query that failed inside a transaction block, it is closed first.
    /// PostgreSQL keeps such a portal with its statements freed, and an Execute of it reads
    /// that memory: PostgreSQL 15.18 crashes, and every backend with it (other clients'
    /// transactions fail, and with `synchronous_commit = off` commits already acknowledged
    /// are lost). Closed, an Execute gets the 34000 PostgreSQL gives when the Query failed
    /// before making its portal (while planning); a Bind fails or replaces it as before.
    /// The CloseComplete is not forwarded.
    pub(super) fn close_leftover_portal(&mut self) {
        if self.busy.replies.portal_leftover() {
            frontend::close_portal(&mut self.to_server, b"");
            let fx = super::reply_queue::Fx { closes_leftover: true, ..Default::default() };
            self.busy.replies.push(Pending::with(Req::Close, OnReply::Inject, fx));
            // Gone for the rest of this batch, which the server skips too if it skips the
            // Close; after that batch the portal is back (`ReplyQueue::portal_close_skipped`).
            self.busy.replies.portal_closed();
        }
    }

    #[inline]
    pub(super) fn forward(&mut self, frame: &[u8], req: Req) {
        self.to_server.extend_from_slice(frame);
        self.busy.replies.push(Pending::client(req));
    }
}

/// A message type PostgreSQL's backend reads after login (any other ends its connection
/// with FATAL 08P01).
fn is_frontend_message(tag: u8) -> bool {
    matches!(
        tag,
        tags::QUERY
            | tags::PARSE
            | tags::BIND
            | tags::DESCRIBE
            | tags::EXECUTE
            | tags::CLOSE
            | tags::SYNC
            | tags::FLUSH
            | tags::FUNCTION_CALL
            | tags::TERMINATE
            | tags::COPY_DATA
            | tags::COPY_DONE
            | tags::COPY_FAIL
    )
}

/// SQL-level `PREPARE name` or `DEALLOCATE name` that reaches the server as
/// written (through the extended protocol, or with the statement cache off): a statement of
/// the server session's own, under a name parsnip does not manage — session state, like
/// `LISTEN`. (`DEALLOCATE ALL` is followed from its CommandComplete.)
fn names_a_prepared_statement(sql: &[u8]) -> bool {
    // Runs on every Parse: a text whose first non-blank byte cannot start PREPARE or
    // DEALLOCATE (nor a comment before them) is answered at once.
    match sql.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'p' | b'P' | b'd' | b'D' | b'/' | b'-') => {}
        _ => return false,
    }
    let mut w = crate::stmt::sql::words(sql);
    let is = |w: Option<&[u8]>, kw: &[u8]| w.is_some_and(|w| w.eq_ignore_ascii_case(kw));
    match w.next() {
        Some(first) if is(Some(first), b"prepare") => true,
        Some(first) if is(Some(first), b"deallocate") => {
            let next = w.next();
            let next = if is(next, b"prepare") { w.next() } else { next };
            !is(next, b"all")
        }
        _ => false,
    }
}
