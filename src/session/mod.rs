//! The per-client session after login: a sans-IO state machine. It is fed whole frames
//! from the client and from the linked server, and answers with bytes to write (in
//! `to_client` / `to_server`) and actions (acquire, release, close). It never touches a
//! socket, a clock or the pool; the driver does that and calls back.
//!
//! Owns: the reply queue of the linked server, transaction boundaries (from ReadyForQuery
//! only, never from parsing SQL), pool-mode rules, and replaying session settings onto
//! whichever server the client is given.

pub mod reply_queue;
pub mod settings;

#[cfg(test)]
mod tests;

use crate::config::PoolMode;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, frontend, tags};
use bytes::BytesMut;
use reply_queue::{OnReply, Pending, Purpose, ReplyQueue, Req};
use settings::{SettingStmt, Settings};
use std::collections::VecDeque;

/// What the driver must do for the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Get a server connection from the pool, then call `handle_server_linked`.
    AcquireServer,
    /// Give the linked server back; `reusable: false` means close it.
    ReleaseServer {
        /// The server is idle, outside a transaction, with nothing outstanding.
        reusable: bool,
    },
    /// Write out `to_client`, then close the client connection.
    Close,
}

/// What the session keeps about the server it is linked to; lives with the server connection.
#[derive(Clone, Debug, Default)]
pub struct ServerState {
    /// The settings currently in effect on the server.
    pub settings: Settings,
    /// Last transaction status the server reported.
    pub tx_status: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Unlinked,
    Acquiring,
    Linked,
}

/// One client's conversation. See the module doc.
#[derive(Debug)]
pub struct Session {
    mode: PoolMode,
    link: Link,
    replies: ReplyQueue,
    /// Bytes to write to the client.
    pub to_client: BytesMut,
    /// Bytes to write to the linked server (held until one is linked).
    pub to_server: BytesMut,
    actions: VecDeque<Action>,
    tx_status: u8,
    copy_in: bool,
    skip_until_sync: bool,
    closing: bool,
    settings: Settings,
}

impl Session {
    /// A session in `mode` whose client expects `settings`.
    pub fn new(mode: PoolMode, settings: Settings) -> Session {
        Session {
            mode,
            link: Link::Unlinked,
            replies: ReplyQueue::default(),
            to_client: BytesMut::new(),
            to_server: BytesMut::new(),
            actions: VecDeque::new(),
            tx_status: b'I',
            copy_in: false,
            skip_until_sync: false,
            closing: false,
            settings,
        }
    }

    // ---- A: getters ----

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
        self.link == Link::Linked && self.replies.is_empty() && self.tx_status != b'I'
    }
    /// Linked with nothing outstanding and outside a transaction (session mode, between queries).
    pub fn is_server_idle(&self) -> bool {
        self.replies.is_empty() && self.tx_status == b'I' && !self.copy_in
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

    /// One whole frame from the client (length already checked by the driver).
    pub fn handle_client(&mut self, frame: &[u8]) {
        if self.closing {
            return;
        }
        let tag = frame[0];
        if self.skip_until_sync {
            if tag == tags::SYNC {
                self.skip_until_sync = false;
                backend::ready_for_query(&mut self.to_client, b'I');
            } else if tag == tags::TERMINATE {
                self.close();
            }
            return;
        }
        match tag {
            tags::QUERY => self.on_query(frame),
            tags::PARSE => self.forward(frame, Req::Parse),
            tags::BIND => self.forward(frame, Req::Bind),
            tags::DESCRIBE => self.forward(frame, Req::Describe),
            tags::EXECUTE => self.forward(frame, Req::Execute),
            tags::CLOSE => self.forward(frame, Req::Close),
            tags::FUNCTION_CALL => self.forward(frame, Req::FunctionCall),
            tags::SYNC => self.on_sync(frame),
            tags::FLUSH => {
                if self.link != Link::Unlinked {
                    self.to_server.extend_from_slice(frame);
                }
            }
            tags::COPY_DATA | tags::COPY_DONE | tags::COPY_FAIL => {
                // PostgreSQL ignores copy messages outside COPY; so do we when unlinked.
                if self.link != Link::Unlinked {
                    self.to_server.extend_from_slice(frame);
                    if tag != tags::COPY_DATA {
                        self.copy_in = false;
                    }
                }
            }
            tags::TERMINATE => self.close(),
            t => self.fail(Error::protocol(format!("invalid frontend message type {t}"))),
        }
    }

    fn on_query(&mut self, frame: &[u8]) {
        let mut p = Pending::client(Req::Query);
        if let Some(text) = frontend::query_text(body(frame))
            && settings::maybe_setting_stmt(text)
        {
            p.tracked_sql = std::str::from_utf8(text).ok().map(Into::into);
        }
        self.to_server.extend_from_slice(frame);
        self.replies.push(p);
        self.ensure_server();
    }

    fn on_sync(&mut self, frame: &[u8]) {
        if self.copy_in {
            // Ignored by the server in COPY FROM STDIN; no reply to wait for.
            self.to_server.extend_from_slice(frame);
        } else if self.link == Link::Unlinked && self.replies.is_empty() {
            // Nothing outstanding and no transaction open: answer without a server.
            backend::ready_for_query(&mut self.to_client, b'I');
        } else {
            self.forward(frame, Req::Sync);
        }
    }

    #[inline]
    fn forward(&mut self, frame: &[u8], req: Req) {
        self.to_server.extend_from_slice(frame);
        self.replies.push(Pending::client(req));
        self.ensure_server();
    }

    #[inline]
    fn ensure_server(&mut self) {
        if self.link == Link::Unlinked {
            self.link = Link::Acquiring;
            self.actions.push_back(Action::AcquireServer);
        }
    }

    /// The pool gave us `server`: replay settings if they differ, then the held bytes flow.
    pub fn handle_server_linked(&mut self, server: &mut ServerState) {
        self.link = Link::Linked;
        server.tx_status = b'I';
        if self.settings.key() != server.settings.key() {
            let sql = self.settings.diff_sql(&server.settings);
            server.settings.extra = self.settings.extra.clone();
            if !sql.is_empty() {
                let mut buf = BytesMut::with_capacity(sql.len() + 6 + self.to_server.len());
                frontend::query(&mut buf, &sql);
                buf.extend_from_slice(&self.to_server);
                self.to_server = buf;
                self.replies.push_front(Pending::internal(Req::Query, Purpose::SyncSettings));
            }
        }
    }

    /// The pool could not give a server. A FATAL error closes the client; an ERROR fails
    /// every outstanding request as PostgreSQL would (error, then skip to Sync).
    pub fn handle_acquire_failed(&mut self, err: Error) {
        self.link = Link::Unlinked;
        self.to_server.clear();
        if err.severity == crate::error::Severity::Fatal {
            self.replies.clear();
            return self.fail(err);
        }
        let mut batch_failed = false;
        while let Some(p) = self.replies.pop() {
            if !batch_failed {
                err.write_to(&mut self.to_client);
                batch_failed = true;
            }
            if !p.req.is_extended() {
                backend::ready_for_query(&mut self.to_client, b'I');
                batch_failed = false;
            }
        }
        self.skip_until_sync = batch_failed;
    }

    /// The linked server's connection broke.
    pub fn handle_server_lost(&mut self) {
        self.replies.clear();
        self.link = Link::Unlinked;
        self.actions.push_back(Action::ReleaseServer { reusable: false });
        self.fail(Error::fatal(SqlState::CONNECTION_FAILURE, "server closed the connection unexpectedly"));
    }

    /// One whole frame from the linked server.
    pub fn handle_server(&mut self, frame: &[u8], server: &mut ServerState) {
        let tag = frame[0];
        match tag {
            tags::PARAMETER_STATUS => return self.on_parameter_status(frame, server),
            tags::NOTICE_RESPONSE | tags::NOTIFICATION_RESPONSE => {
                if tag == tags::NOTIFICATION_RESPONSE
                    || self.replies.head().is_none_or(|h| h.on_reply == OnReply::Forward)
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
        let (req, purpose) = (head.req, head.purpose);
        if tag == tags::READY_FOR_QUERY {
            return self.on_ready(frame, server);
        }
        if matches!(tag, tags::PARSE_COMPLETE | tags::BIND_COMPLETE | tags::CLOSE_COMPLETE) && !req.completed_by(tag) {
            return self.desync(tag);
        }
        if head.on_reply == OnReply::Forward {
            self.to_client.extend_from_slice(frame);
        }
        match tag {
            tags::ERROR_RESPONSE => {
                head.failed = true;
                self.copy_in = false;
                if purpose == Purpose::SyncSettings {
                    self.to_client.extend_from_slice(frame);
                    return self.fail_quiet();
                }
                if req.is_extended() {
                    self.replies.pop();
                    self.replies.skip_to_sync();
                }
            }
            tags::COPY_IN_RESPONSE => {
                self.copy_in = true;
                if req == Req::Execute {
                    self.replies.drop_syncs_after_head();
                }
            }
            t if req.completed_by(t) => {
                self.replies.pop();
            }
            _ => {}
        }
    }

    fn on_ready(&mut self, frame: &[u8], server: &mut ServerState) {
        let Some(p) = self.replies.pop() else {
            return self.desync(tags::READY_FOR_QUERY);
        };
        if p.req.is_extended() {
            return self.desync(tags::READY_FOR_QUERY);
        }
        let status = frame.get(5).copied().unwrap_or(b'I');
        self.tx_status = status;
        server.tx_status = status;
        self.copy_in = false;
        if let Some(sql) = &p.tracked_sql
            && !p.failed
            && status == b'I'
        {
            apply_setting(&mut self.settings, &mut server.settings, sql);
        }
        let done = self.replies.is_empty();
        if self.mode == PoolMode::Statement && status != b'I' && p.purpose == Purpose::Client && done {
            // A transaction block was opened: refuse it, roll it back on the server.
            Error::new(SqlState::FEATURE_NOT_SUPPORTED, "transaction blocks are not allowed in statement pooling mode")
                .write_to(&mut self.to_client);
            backend::ready_for_query(&mut self.to_client, b'I');
            frontend::query(&mut self.to_server, "ROLLBACK");
            self.replies.push(Pending::internal(Req::Query, Purpose::Rollback));
            return;
        }
        if p.on_reply == OnReply::Forward {
            self.to_client.extend_from_slice(frame);
        }
        if done && status == b'I' && self.mode != PoolMode::Session {
            self.link = Link::Unlinked;
            self.actions.push_back(Action::ReleaseServer { reusable: true });
        }
    }

    fn on_parameter_status(&mut self, frame: &[u8], server: &mut ServerState) {
        let Some((name, value)) = backend::parameter_status_fields(body(frame)) else {
            return self.desync(tags::PARAMETER_STATUS);
        };
        let Some(name) = settings::tracked_name(name) else {
            self.to_client.extend_from_slice(frame);
            return;
        };
        server.settings.set_reported(name, value);
        // Forward when the client asked for the change, or when it changes what the client
        // believes (a replayed setting normalized by the server, e.g. DateStyle).
        let changed = self.settings.set_reported(name, value);
        if changed || self.replies.head().is_none_or(|h| h.on_reply == OnReply::Forward) {
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

fn apply_setting(client: &mut Settings, server: &mut Settings, sql: &str) {
    match settings::parse_setting_stmt(sql.as_bytes()) {
        Some(SettingStmt::Set(name, stmt)) if settings::tracked_name(&name).is_none() => {
            client.set_extra(name.clone(), stmt.clone());
            server.set_extra(name, stmt);
        }
        Some(SettingStmt::Reset(name)) => {
            client.reset_extra(&name);
            server.reset_extra(&name);
        }
        Some(SettingStmt::ResetAll) => {
            client.reset_all_extra();
            server.reset_all_extra();
        }
        _ => {}
    }
}
