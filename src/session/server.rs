//! Frames from the linked server, and the link's life: linking (settings replayed),
//! replies matched to the reply queue and forwarded, skipped or synthesized, transaction
//! status from ReadyForQuery, release, failures.

use super::reply_queue::{self, OnReply, Pending, Purpose, Req, Synth};
use super::stmts::same_shape;
use super::{Action, Phase, Session, wire_trace};
use crate::config::PoolMode;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, frontend, tags};
use crate::state::settings::tracked_name;
use crate::state::{ServerState, TxStatus};
use crate::stmt::registry::StmtKind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Session {
    /// The start (`header`: tag and length) of a server frame too large to hold whole. True
    /// when it is one the session forwards untouched, a DataRow or CopyData answering a
    /// request whose replies go to the client: the header is written to `to_client`, and
    /// the driver appends the frame's body as it arrives (the session sees nothing of it,
    /// as it would do nothing with it but copy it).
    pub(crate) fn stream_server_frame(&mut self, header: &[u8]) -> bool {
        if !matches!(header.first(), Some(&tags::DATA_ROW | &tags::COPY_DATA))
            || self.busy.param_desc.is_some()
            || self.busy.held > 0
            || self.busy.replies.head_unflushed()
            || wire_trace::on()
            || self.busy.replies.head().is_none_or(|h| h.is_synth() || !matches!(h.on_reply, OnReply::Forward))
        {
            return false;
        }
        self.to_client.extend_from_slice(header);
        true
    }

    /// One whole frame from the linked server.
    pub fn handle_server(&mut self, frame: &[u8], server: &mut ServerState) {
        let unflushed = self.busy.replies.head_unflushed();
        let traced = wire_trace::on();
        if !traced && self.busy.held == 0 && !unflushed {
            // Nothing held and a reply the client asked for: it goes as it is (`flush`).
            return self.on_server_frame(frame, server);
        }
        let (to_s, to_c) = (self.to_server.len(), self.to_client.len());
        if !traced {
            self.on_server_frame(frame, server);
            return self.note_server_output(to_c, frame[0], unflushed);
        }
        wire_trace::frames(self.kept.uid, "server>", false, frame);
        self.on_server_frame(frame, server);
        self.note_server_output(to_c, frame[0], unflushed);
        self.trace_output(to_s, to_c);
    }

    pub(super) fn on_server_frame(&mut self, frame: &[u8], server: &mut ServerState) {
        let tag = frame[0];
        self.pins_server_seen(server);
        match tag {
            tags::PARAMETER_STATUS => return self.on_parameter_status(frame, server),
            tags::NOTICE_RESPONSE | tags::NOTIFICATION_RESPONSE => return self.on_notice(frame),
            _ => {}
        }
        if tag == tags::ERROR_RESPONSE && is_fatal(body(frame)) && self.busy.replies.head().is_none_or(|h| h.is_synth())
        {
            // A FATAL with no request outstanding (the backend was terminated, timed out
            // idle, or is shutting down): the client gets it as PostgreSQL sent it, and the
            // connection ends as it would have directly.
            tracing::info!(error = %backend::ErrorText(body(frame)), "server closed the connection");
            self.retire_if_going_down(body(frame));
            self.busy.replies.clear();
            self.to_client.extend_from_slice(frame);
            return self.fail_server();
        }
        let Some(head) = self.busy.replies.head() else {
            return self.desync(tag);
        };
        if tag == tags::ERROR_RESPONSE && is_fatal(body(frame)) && !head.is_synth() {
            // A FATAL answering a request (the backend was terminated mid-query, or its
            // postmaster died): it is the request's answer and the connection's end. The
            // client gets it once, as PostgreSQL sent it (worded for the client where the
            // request was rewritten), and nothing after it: the server closing is no news.
            let forwarded = matches!(head.on_reply, OnReply::Forward | OnReply::Inject | OnReply::ReplaceError(_))
                || head.purpose.told_on_error();
            tracing::info!(error = %backend::ErrorText(body(frame)), "server ended the connection");
            self.retire_if_going_down(body(frame));
            self.on_error(frame, server);
            if !forwarded {
                self.to_client.extend_from_slice(frame);
            }
            self.busy.replies.clear();
            return self.fail_server();
        }
        if head.is_synth() {
            // A local answer should have been drained already; the server is ahead of us.
            return self.desync(tag);
        }
        match tag {
            tags::READY_FOR_QUERY => self.on_ready(frame, server),
            tags::ERROR_RESPONSE => self.on_error(frame, server),
            tags::PARSE_COMPLETE | tags::BIND_COMPLETE | tags::CLOSE_COMPLETE if !head.req.completed_by(tag) => {
                self.desync(tag)
            }
            _ => self.on_reply(frame, server),
        }
    }

    /// An ErrorResponse or NoticeResponse body saying the server is going down, or that
    /// this backend was terminated (57P01 admin shutdown, 57P02 crash shutdown): its
    /// pool's other connections are retired (`Action::RetireServers`), once per link.
    fn retire_if_going_down(&mut self, body: &[u8]) {
        if backend::says_going_down(body) && !self.busy.actions.contains(&Action::RetireServers) {
            tracing::info!("server going down: the pool's connections opened before now are retired");
            self.busy.actions.push_back(Action::RetireServers);
        }
    }

    /// NoticeResponse and NotificationResponse: the client gets notifications always, and
    /// notices unless they answer a request of the pooler's own.
    fn on_notice(&mut self, frame: &[u8]) {
        if frame[0] == tags::NOTICE_RESPONSE {
            // An immediate shutdown or a crash warns each client (57P01, 57P02), then ends
            // the connection with no FATAL.
            self.retire_if_going_down(body(frame));
        }
        if frame[0] == tags::NOTIFICATION_RESPONSE
            || self.busy.replies.head().is_none_or(|h| matches!(h.on_reply, OnReply::Forward))
        {
            self.to_client.extend_from_slice(frame);
        }
    }

    /// Any other reply to the request at the head of the queue.
    fn on_reply(&mut self, frame: &[u8], server: &mut ServerState) {
        let tag = frame[0];
        let Some(head) = self.busy.replies.head() else { return };
        if head.purpose == Purpose::PinCheck {
            if tag == tags::DATA_ROW {
                self.pins_answer(body(frame));
            }
            return;
        }
        if head.purpose == Purpose::ConfigCheck {
            if tag == tags::DATA_ROW {
                self.config_row(body(frame));
            }
            return;
        }
        let req = head.req;
        let forwarded = matches!(head.on_reply, OnReply::Forward);
        if req == Req::Describe && tag == tags::PARAMETER_DESCRIPTION && head.fx.uses.is_some() {
            // Held until the row description: a stale statement errors in between.
            if forwarded {
                self.busy.param_desc = Some(frame.into());
            }
            return;
        }
        if forwarded && head.fx.script.is_some() {
            self.on_script_reply(frame);
            if req.completed_by(tag) {
                self.complete_head(frame);
            }
            return;
        }
        let param_desc = if forwarded { self.busy.param_desc.take() } else { None };
        let hidden = head.simple.is_some()
            && matches!(tag, tags::PARSE_COMPLETE | tags::BIND_COMPLETE | tags::NO_DATA | tags::PARAMETER_DESCRIPTION);
        if forwarded && !hidden {
            if let Some(pd) = &param_desc {
                self.to_client.extend_from_slice(pd);
            }
            if tag == tags::COMMAND_COMPLETE && matches!(head.fx.client, reply_queue::ClientFx::ClearedAll { .. }) {
                // The server ran the stand-in; the client ran DEALLOCATE ALL.
                backend::command_complete(&mut self.to_client, "DEALLOCATE ALL");
            } else {
                self.to_client.extend_from_slice(frame);
            }
        }
        if req == Req::Describe && (tag == tags::ROW_DESCRIPTION || tag == tags::NO_DATA) {
            self.on_row_shape(frame, param_desc.as_deref(), server);
        }
        if tag == tags::COMMAND_COMPLETE && forwarded {
            self.listen_note_complete(frame);
            let cmd = body(frame);
            if cmd.starts_with(b"DEALLOCATE ALL") || cmd.starts_with(b"DISCARD ALL") {
                // Run on the server itself (e.g. through Parse/Bind/Execute): every statement
                // there is gone, and so are the client's.
                server.stmts.clear();
                if self.stmts.registry.is_some() {
                    self.stmts.named.clear();
                }
            }
        }
        if tag == tags::COPY_IN_RESPONSE {
            // What the client sends next is COPY data (its copy messages waited for this),
            // and its Syncs get no reply until the copy ends.
            match self.busy.replies.copy_in_started() {
                Ok(dropped) => {
                    if dropped && self.may_be_cancelled() {
                        // Syncs sent ahead of the copy are taken as ignored; a timer's
                        // error raised before the server read them would make the first
                        // end the skip to Sync with a ReadyForQuery nobody counts. Not
                        // reused, then (tokio-postgres sends its COPY's Sync ahead).
                        self.dirty_server_if(true);
                    }
                    self.enter(Phase::CopyIn)
                }
                Err((req, sent)) => self.copy_violation(req.tag(), !sent),
            }
        } else if req.completed_by(tag) {
            self.complete_head(frame);
        }
    }

    /// A RowDescription or NoData answering a Describe: a shape check's answer, or what a
    /// client is told a cached statement returns.
    fn on_row_shape(&mut self, frame: &[u8], param_desc: Option<&[u8]>, server: &mut ServerState) {
        let Some(head) = self.busy.replies.head() else { return };
        if let OnReply::ShapeCheck(s) = &head.on_reply {
            let s = s.clone();
            self.on_shape_checked(&s, frame, server);
        } else if let OnReply::PlainShapeCheck(seq) = head.on_reply {
            self.on_plain_shape(seq, frame, true);
        } else if head.fx.plain_seq != 0 && matches!(head.on_reply, OnReply::Forward) {
            let seq = head.fx.plain_seq;
            self.on_plain_shape(seq, frame, false);
        } else if let Some(s) = head.fx.uses.as_ref().or(head.fx.portal_of.as_ref())
            && matches!(head.on_reply, OnReply::Forward)
        {
            // What this client is told the statement returns (an autoprepared Query's
            // client decodes nothing by it later: every Query gets its own description).
            let s = s.clone();
            let autoprepared = head.simple.is_some();
            if same_shape(s.shape.get_or_init(|| frame.into()), frame) {
                if !autoprepared {
                    self.stmts.described.insert(s.id);
                }
                if let Some(pd) = param_desc
                    && head.fx.uses.is_some()
                    && head.fx.epoch != 0
                {
                    // A statement Describe: what the next one would answer, as of when it was sent.
                    let mut desc = Vec::with_capacity(pd.len() + frame.len());
                    desc.extend_from_slice(pd);
                    desc.extend_from_slice(frame);
                    s.confirm_description(&desc, head.fx.epoch);
                }
            } else {
                self.on_new_shape(&s, frame);
            }
        }
    }

    /// The request at the head of the queue is done (`frame` completed it).
    fn complete_head(&mut self, frame: &[u8]) {
        let tag = frame[0];
        let Some(p) = self.busy.replies.pop() else { return };
        if let Some(s) = &p.timed {
            let rows = if tag == tags::COMMAND_COMPLETE { crate::stmt::stats::tag_rows(body(frame)) } else { 0 };
            self.execution_done(s, p.timed_cached, p.sent_us, p.behind, rows, false);
        }
        if p.req == Req::Execute
            && tag == tags::COMMAND_COMPLETE
            && let Some(sql) = p.tracked_sql
        {
            self.busy.tx.ext_done.push(sql);
        }
        // A SQL-level statement exists once its PREPARE has run, not when that is parsed.
        if let Some(s) = &p.fx.server_parse
            && (p.req != Req::Parse || s.kind != StmtKind::Sql)
        {
            s.validated.store(true, Ordering::Relaxed);
            // Counted when done: a Parse the server skipped after an error never ran.
            if let Some(r) = &self.stmts.registry {
                r.stats.server_parses.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.drain_synth();
    }

    pub(super) fn on_error(&mut self, frame: &[u8], server: &mut ServerState) {
        self.leave(Phase::CopyIn);
        // A ParameterDescription held back for a Describe of a cached statement: PostgreSQL
        // sent it before finding the statement stale; the client gets it too, unless the
        // Describe is retried.
        let param_desc = self.busy.param_desc.take();
        let Some(head) = self.busy.replies.head_mut() else { return self.desync(tags::ERROR_RESPONSE) };
        head.failed = true;
        if let Some(s) = head.timed.take() {
            let (cached, sent, behind) = (head.timed_cached, head.sent_us, head.behind);
            self.execution_done(&s, cached, sent, behind, 0, true);
        }
        let Some(head) = self.busy.replies.head_mut() else { return };
        let req = head.req;
        let code = statement_error_class(body(frame));
        if code == b"57014" && head.purpose == Purpose::Client {
            // Cancelled (a timeout, a cancel request): a second signal may still be pending.
            self.note_cancel_signal(server);
        }
        let Some(head) = self.busy.replies.head_mut() else { return };
        if backend::error_field(body(frame), b'C').is_some_and(|c| c.starts_with(b"XX")) {
            // An internal error: whatever state the backend is in, it is not handed to
            // another client (closed when this one gives it back).
            if let Some(l) = self.link.state_mut() {
                l.dirty = true;
            }
        }
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
        let clear_again = self.busy.replies.head().is_some_and(|h| h.purpose == Purpose::ClearTimeouts)
            && self.timeouts_clear_failed(code);
        let Some(head) = self.busy.replies.head_mut() else { return };
        if let Some(pd) = param_desc
            && matches!(head.on_reply, OnReply::Forward)
        {
            self.to_client.extend_from_slice(&pd);
        }
        if head.purpose == Purpose::Client
            && matches!(head.on_reply, OnReply::Forward | OnReply::Inject | OnReply::ReplaceError(_))
        {
            self.kept.tally.error(backend::error_field(body(frame), b'C').unwrap_or_default());
        }
        if head.fx.script.is_some() && matches!(head.on_reply, OnReply::Forward) {
            return self.on_script_error(frame, code, server);
        }
        match &head.on_reply {
            OnReply::Forward | OnReply::Inject => match (&head.fx.rename, &head.simple, &head.fx.view) {
                (Some(r), _, _) => r.rewrite_error(frame, &mut self.to_client),
                (None, Some(edits), _) | (None, None, Some(edits)) => {
                    reply_queue::map_error_position(frame, edits, &mut self.to_client)
                }
                (None, None, None) => self.to_client.extend_from_slice(frame),
            },
            OnReply::ReplaceError(e) if code == b"26000" => e.write_to(&mut self.to_client),
            OnReply::ReplaceError(_) => self.to_client.extend_from_slice(frame),
            OnReply::Skip if clear_again => {}
            OnReply::Skip if head.purpose.told_on_error() => {
                // The client's settings cannot be applied: PostgreSQL would have refused
                // them at startup.
                self.to_client.extend_from_slice(frame);
                return self.fail_server();
            }
            OnReply::Skip
            | OnReply::Synth(_)
            | OnReply::ShapeCheck(_)
            | OnReply::PlainShapeCheck(_)
            | OnReply::Answered => {}
        }
        if let Some(s) = head.fx.uses.clone() {
            self.on_statement_error(&s, code, server);
        }
        if req.is_extended() {
            self.busy.tx.ext_failed = true;
            // The server now skips to the next Sync: those requests get no reply.
            if let Some(p) = self.busy.replies.pop() {
                self.rollback(p, server);
            }
            while let Some(p) = self.busy.replies.pop_unless_sync() {
                self.rollback(p, server);
            }
            // A PREPARE run ahead of the client's EXECUTE failed: that error is the answer.
            self.busy.replies.answer_after_prepare_sync();
            // No Sync sent yet (the batch ended with Flush): the server ignores what the
            // client sends until its Sync.
            if self.busy.replies.is_empty() {
                self.enter(Phase::ServerSkipping);
            }
        }
    }

    pub(super) fn on_ready(&mut self, frame: &[u8], server: &mut ServerState) {
        let Some(p) = self.busy.replies.pop() else { return self.desync(tags::READY_FOR_QUERY) };
        if p.req.is_extended() {
            return self.desync(tags::READY_FOR_QUERY);
        }
        let status = TxStatus::from_byte(frame.get(5).copied().unwrap_or(b'I'));
        self.busy.replies.mark_synced();
        self.busy.replies.portal_ready(status);
        self.busy.tx.opening = false;
        if let Some(sc) = &p.fx.script
            && matches!(p.on_reply, OnReply::Answered)
        {
            // The PREPARE run ahead of the script failed: none of it ran.
            sc.undo_from(0, server, self.registry());
        }
        if p.purpose == Purpose::PinCheck {
            self.pins_checked(p.failed);
        }
        if p.purpose == Purpose::ConfigCheck {
            self.config_checked(p.failed, server);
        }
        if p.purpose == Purpose::ClearTimeouts {
            // The client's frames wait for it: the server is not to be given back now.
            server.tx_status = status;
            return self.timeouts_cleared(p.failed, server);
        }
        if p.purpose == Purpose::Retried {
            // The hidden end of a failed batch being retried: the client's transaction
            // status is the retried batch's.
            server.tx_status = status;
            self.busy.tx.ext_failed = false;
            return self.drain_synth();
        }
        if matches!(p.on_reply, OnReply::Forward) {
            self.busy.retry.retried = false;
        }
        if p.purpose == Purpose::Client {
            self.kept.tally.queries = self.kept.tally.queries.wrapping_add(1);
            self.kept.tally.xacts = self.kept.tally.xacts.wrapping_add(u32::from(status == TxStatus::Idle));
        }
        let before = self.busy.tx.status;
        if self.busy.tx.schema_change_ended(status) {
            // Descriptions confirmed while it ran may be stale now.
            crate::stmt::epoch::advance();
        }
        self.busy.tx.status = status;
        server.tx_status = status;
        self.listen_batch_end(before, status, self.busy.tx.ext_failed || p.failed);
        self.listen_tx_end(status);
        if status != TxStatus::InBlock {
            self.stmts.end_guards();
        }
        self.leave(Phase::CopyIn);
        if !self.busy.tx.ext_done.is_empty() {
            // SET/RESET/DISCARD and transaction control run through the extended protocol.
            let tx = &mut self.busy.tx;
            if tx.settings.is_empty() && !tx.ext_done.iter().any(|s| super::settings::may_hold_setting(s.as_bytes())) {
                // BEGIN, COMMIT and the like with no setting to keep or drop (`track_settings`).
                tx.ext_done.clear();
            } else {
                let sql = std::mem::take(&mut tx.ext_done).join(";\n");
                let failed = tx.ext_failed;
                self.track_settings(&sql, failed, before != TxStatus::Idle, status, server);
            }
        } else if let Some(sql) = &p.tracked_sql {
            self.track_settings(sql, p.failed, before != TxStatus::Idle, status, server);
        } else if status == TxStatus::Idle {
            self.busy.tx.settings.clear();
        }
        if matches!(p.purpose, Purpose::Client | Purpose::Settle) {
            // (The Sync that settles a server its client left runs under the same timers.)
            self.note_cancel_risk(server);
        }
        self.busy.tx.ext_failed = false;
        let done = self.busy.replies.is_empty();
        if status == TxStatus::Idle && done && !self.busy.replies.is_unsynced() {
            // Portals end with their transaction, and no later batch of the client's has
            // bound one yet: none is tracked any more (a tracked one kept the session from
            // ever being at rest, so a client whose last statement was a BEGIN or COMMIT
            // through the extended protocol kept its whole busy half while idle).
            self.busy.tx.tracked_portal = None;
        }
        if self.kept.mode == PoolMode::Statement && status != TxStatus::Idle && p.purpose == Purpose::Client && done {
            // A transaction block was opened: refuse it, roll it back on the server.
            Error::new(SqlState::FEATURE_NOT_SUPPORTED, "transaction blocks are not allowed in statement pooling mode")
                .write_to(&mut self.to_client);
            backend::ready_for_query(&mut self.to_client, b'I');
            self.busy.tx.status = TxStatus::Idle;
            frontend::query(&mut self.to_server, "ROLLBACK");
            self.busy.replies.push(Pending::internal(Req::Query, Purpose::Rollback));
            return;
        }
        if matches!(p.on_reply, OnReply::Forward | OnReply::ReplaceError(_) | OnReply::Answered) {
            if status == TxStatus::Idle && done {
                // PostgreSQL sends the notifications that came during a transaction or a
                // query just before its ReadyForQuery 'I'.
                self.deliver_notifications();
            }
            self.to_client.extend_from_slice(frame);
        }
        self.drain_synth();
    }

    /// Releases the server when nothing is outstanding and no transaction is open.
    pub(super) fn maybe_release(&mut self) {
        if self.link.is_linked()
            && self.busy.replies.is_empty()
            && self.busy.tx.status == TxStatus::Idle
            && !matches!(self.busy.phase, Phase::CopyIn | Phase::ServerSkipping)
            && !self.busy.replies.is_unsynced()
            && self.kept.mode != PoolMode::Session
            // The cache answered an autoprepared Query's Parse: its Bind follows at once.
            // Looked at before the checks below, which send their questions now: asked
            // between that Parse and its Bind, they would be answered before the Query ran.
            && !self.autoprep_feeding()
            && !self.config_keeps_server()
            && !self.pins_keep_server()
        {
            let reusable = self.link.unlink().is_some_and(|l| !l.dirty);
            if !reusable {
                tracing::debug!(
                    "server connection closed: its session may hold what the next client must not meet (set_config(), a cancel signal under a timeout, an internal error)"
                );
            }
            self.busy.actions.push_back(Action::ReleaseServer { reusable });
        }
    }

    pub(super) fn on_parameter_status(&mut self, frame: &[u8], server: &mut ServerState) {
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
        let changed = self.kept.settings.reported(name) != Some(value)
            && Arc::make_mut(&mut self.kept.settings).set_reported(name, value);
        if changed || self.busy.replies.head().is_none_or(|h| matches!(h.on_reply, OnReply::Forward)) {
            self.to_client.extend_from_slice(frame);
        }
    }

    /// Queues a reply the pooler makes itself, in pipeline order.
    pub(super) fn push_synth(&mut self, s: Synth, fx: reply_queue::Fx) {
        // The request kind it stands for, so that skip-to-Sync treats it like the real one.
        let req = match s {
            Synth::ParseComplete => Req::Parse,
            Synth::CloseComplete => Req::Close,
            Synth::Tag(_) => Req::Execute,
            Synth::TagAndReady(_) => Req::Query,
            Synth::Describe(_) => Req::Describe,
        };
        self.busy.replies.push(Pending::with(req, OnReply::Synth(s), fx));
        self.drain_synth();
    }

    /// Emits the synthesized replies now at the head of the queue.
    pub(super) fn drain_synth(&mut self) {
        while let Some(p) = self.busy.replies.head() {
            let OnReply::Synth(s) = &p.on_reply else { break };
            match s {
                Synth::ParseComplete if p.simple.is_some() || self.autoprep_feeding() => {}
                Synth::ParseComplete => backend::empty(&mut self.to_client, tags::PARSE_COMPLETE),
                Synth::CloseComplete => backend::empty(&mut self.to_client, tags::CLOSE_COMPLETE),
                Synth::Tag(t) => backend::command_complete(&mut self.to_client, t),
                Synth::TagAndReady(t) => {
                    backend::command_complete(&mut self.to_client, t);
                    backend::ready_for_query(&mut self.to_client, self.busy.tx.status.as_byte());
                }
                Synth::Describe(s) => {
                    if let Some(d) = s.desc.get() {
                        self.to_client.extend_from_slice(d);
                    }
                }
            }
            self.busy.replies.pop();
        }
        self.script_catch_up();
        self.maybe_release();
    }

    /// A client message of type `tag` was queued behind the Execute that turned out to
    /// start a COPY FROM STDIN, where PostgreSQL takes only copy messages, Flush and Sync:
    /// the server answers the first such message it reads with an ERROR ("unexpected
    /// message type … during COPY from stdin", its COPY context attached) and a FATAL, and
    /// ends; the client gets both, as directly. When the session answered that message
    /// itself (`tell_server`: a Parse the cache knew), an empty message of its type is sent
    /// in its place, for the server to refuse. Only the Execute's entry is kept: the
    /// server answers nothing else.
    pub(super) fn copy_violation(&mut self, tag: u8, tell_server: bool) {
        self.busy.replies.keep_head();
        if tell_server {
            self.to_server.extend_from_slice(&[tag, 0, 0, 0, 4]);
        }
        self.dirty_server_if(true);
        self.enter(Phase::CopyIn);
    }
}

/// An ErrorResponse body whose severity is FATAL or PANIC (the backend ends the connection).
fn is_fatal(body: &[u8]) -> bool {
    matches!(backend::error_severity(body), Some(b"FATAL" | b"PANIC"))
}

/// The SQLSTATE of an error, as far as a cached statement is concerned: PostgreSQL's XX000
/// "cache lookup failed for type …" (a type the statement was planned with was dropped,
/// even if created again: the statement can never run again, as 0A000's stale plan) counts
/// as 0A000, so the statement goes stale and a fresh Parse of its text gets a new one.
fn statement_error_class(body: &[u8]) -> &[u8] {
    let code = backend::error_field(body, b'C').unwrap_or_default();
    if code == b"XX000"
        && backend::error_field(body, b'M').is_some_and(|m| m.starts_with(b"cache lookup failed for type"))
    {
        return b"0A000";
    }
    code
}
