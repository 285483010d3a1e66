//! Bind, Describe, Close and Execute from the client, for statements of the cache: the
//! client's names become server names, a first use inside a transaction gets its savepoint
//! guard, and portals running SET/RESET or transaction control are tracked.

use super::guard::GuardCmd;
use super::{BindText, DEALLOCATE_ALL_STANDIN, Resolved, Unnamed};
use crate::error::Error;
use crate::protocol::{body, frontend};
use crate::session::Session;
use crate::session::reply_queue::{ClientFx, Fx, OnReply, Pending, Req, Synth};
use crate::state::ServerState;
use crate::stmt::Statement;
use std::sync::Arc;

impl Session {
    pub(in crate::session) fn on_bind(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let Some((portal, stmt_name, rest)) = frontend::bind_names(body(frame)) else {
            self.fail(Error::protocol("invalid Bind message"));
            return true;
        };
        if self.stmts.fresh_in_tx.is_some() {
            let dml = self.statement_text(stmt_name).is_some_and(crate::stmt::sql::is_plain_dml);
            self.stmts.note_statement_run(dml);
        }
        let guard = self.guard_wanted(stmt_name, srv);
        let resolved = self.resolve(stmt_name, srv);
        if !matches!(resolved, Resolved::Held) {
            if self.stmts.last_bind.as_ref().is_some_and(|(p, _)| **p == *portal) {
                // The portal is re-bound: a Describe of it no longer describes that statement.
                self.stmts.last_bind = None;
            }
            if self.stmts.last_plain.as_ref().is_some_and(|(p, _)| **p == *portal) {
                self.stmts.last_plain = None;
            }
            let BindText { text, watch } = match &resolved {
                // Resolved already: no second lookup of its name.
                Resolved::Cached(s) => super::cached_bind_text(s),
                _ => self.bind_text(stmt_name),
            };
            let standin = text == Some(DEALLOCATE_ALL_STANDIN);
            // A lone LISTEN/UNLISTEN: its Execute is answered by the session (`notify`); not
            // the stand-in of a DEALLOCATE ALL, an UNLISTEN the server runs.
            let listen = text
                .filter(|t| {
                    !standin
                        && self.kept.mode != crate::config::PoolMode::Session
                        && crate::stmt::sql::listen::maybe_listen(t)
                })
                .and_then(crate::stmt::sql::listen::parse_listen);
            let session_text = text.filter(|_| watch.session_stmt);
            let tracked = session_text.and_then(|t| std::str::from_utf8(t).ok()).map(Box::<str>::from);
            // Not UTF-8: neither recorded nor replayed (`text_to_track`).
            let unreadable = session_text.is_some() && tracked.is_none();
            let bound = !matches!(resolved, Resolved::Failed);
            let sets_config = text.filter(|_| watch.sets_config).map(<[u8]>::to_vec);
            self.dirty_server_if(unreadable && bound);
            if let Some(t) = sets_config {
                self.note_set_config(&t, Some((body(frame), rest)));
            }
            if bound && listen.is_none() && (watch.pins_begin || (watch.pins_end && self.kept.pins.reasons != 0)) {
                self.note_pins(crate::stmt::sql::Seen { reasons: 0, check: true });
            }
            if bound {
                self.listen_note_bind(portal, listen);
            }
            if standin && bound {
                self.stmts.dealloc_portal = Some(portal.into());
            } else if self.stmts.dealloc_portal.as_deref() == Some(portal) {
                self.stmts.dealloc_portal = None;
            }
            match tracked {
                Some(sql) if bound => self.busy.tx.tracked_portal = Some(Box::new((portal.into(), sql))),
                _ if self.busy.tx.tracked_portal.as_deref().is_some_and(|(p, _)| **p == *portal) => {
                    self.busy.tx.tracked_portal = None
                }
                _ => {}
            }
        }
        match resolved {
            Resolved::Held => return false,
            Resolved::Failed => {}
            Resolved::Plain => {
                if stmt_name.is_empty()
                    && let super::Unnamed::Plain { measure: Some(s), .. } = &self.stmts.unnamed
                {
                    // Run as sent by the plan guard: its executions count for `s`.
                    self.stmts.last_plain = Some((portal.into(), s.clone()));
                }
                if portal.is_empty() {
                    self.close_leftover_portal();
                }
                self.forward(frame, Req::Bind)
            }
            Resolved::Cached(s) => {
                self.kept.tally.binds = self.kept.tally.binds.wrapping_add(1);
                self.stmts.last_bind = Some((portal.into(), s.clone()));
                let tail = &body(frame)[rest..];
                if portal.is_empty() {
                    self.close_leftover_portal();
                }
                self.send_use(Req::Bind, s, guard, srv, |out, server_name| {
                    frontend::bind_with_tail(out, portal, server_name, tail)
                });
            }
        }
        true
    }

    pub(in crate::session) fn on_describe(&mut self, frame: &[u8], srv: &mut ServerState) -> bool {
        let Some((kind, name)) = frontend::describe_or_close(body(frame)) else {
            self.fail(Error::protocol("invalid DESCRIBE message subtype"));
            return true;
        };
        if kind == b'P' {
            // A portal of a cached statement: its description tells the client the
            // statement's row shape as well.
            let portal_of = self.stmts.last_bind.as_ref().filter(|(p, _)| **p == *name).map(|(_, s)| s.clone());
            self.to_server.extend_from_slice(frame);
            self.busy.replies.push(Pending::with(Req::Describe, OnReply::Forward, Fx { portal_of, ..Fx::default() }));
            return true;
        }
        if self.describe_locally(name) {
            return true;
        }
        let guard = self.guard_wanted(name, srv);
        match self.resolve(name, srv) {
            Resolved::Held => return false,
            Resolved::Failed => {}
            Resolved::Plain => {
                self.forward(frame, Req::Describe);
                if let (true, Unnamed::Plain { seq, .. }) = (name.is_empty(), &self.stmts.unnamed)
                    && let Some(p) = self.busy.replies.last_mut()
                {
                    // Its answer is the shape the client will decode this statement's rows by.
                    p.fx.plain_seq = *seq;
                }
            }
            Resolved::Cached(s) => {
                self.send_use(Req::Describe, s, guard, srv, frontend::describe_statement);
            }
        }
        true
    }

    /// A Describe of a statement with no server linked: answered here if it can be (see
    /// `describe_locally`). False: it needs a server.
    pub(in crate::session) fn on_describe_unlinked(&mut self, frame: &[u8]) -> bool {
        matches!(frontend::describe_or_close(body(frame)), Some((b'S', name)) if self.describe_locally(name))
    }

    /// `Describe S name` of a cached statement whose description a server confirmed at
    /// the current shape epoch (`stmt::epoch`): answered from it, in pipeline order, and
    /// the client is then known to decode its rows by that shape (a server that prepares
    /// the statement for it later is checked against it, `ensure_on_server`). Not in a
    /// failed transaction (PostgreSQL answers 25P02), nor while a change to the client's
    /// names is in flight (whether the name holds this statement depends on it).
    fn describe_locally(&mut self, name: &[u8]) -> bool {
        if !self.stmts.registry.as_ref().is_some_and(|r| r.cfg.describe_from_cache)
            || self.busy.tx.status == crate::state::TxStatus::Failed
            || self.busy.replies.iter().any(|p| !matches!(p.fx.client, ClientFx::None))
        {
            return false;
        }
        let s = if name.is_empty() {
            match &self.stmts.unnamed {
                Unnamed::Cached(s) => s.clone(),
                _ => return false,
            }
        } else {
            match self.stmts.named.get(name) {
                Some(s) => s.clone(),
                None => return false,
            }
        };
        if s.known_description().is_none() {
            return false;
        }
        self.stmts.described.insert(s.id);
        self.registry().stats.describes_saved.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.push_synth(Synth::Describe(s), Fx::default());
        true
    }

    /// Sends a Bind or Describe of the cached statement `s` (`write` writes it under the
    /// server name), inside a savepoint guard when it is the first use `guard` names, and
    /// queues its reply with what a transparent retry needs.
    fn send_use(
        &mut self,
        req: Req,
        s: Arc<Statement>,
        guard: Option<u64>,
        srv: &mut ServerState,
        write: impl FnOnce(&mut bytes::BytesMut, &[u8]),
    ) {
        let guarded = guard == Some(s.id);
        if guarded {
            self.open_guard(&s, srv);
        }
        // Read before the Describe is sent: its answer confirms the description as of then
        // (0: nothing to confirm, the description is never answered locally in this pool).
        let keep = req == Req::Describe && self.registry().cfg.describe_from_cache;
        let epoch = if keep { crate::stmt::epoch::current() } else { 0 };
        write(&mut self.to_server, s.server_name.as_bytes());
        let replay_from = if guarded { Some(self.busy.retry.frame_at) } else { self.retry_point() };
        let fx = Fx { uses: Some(s), replay_from, guarded, epoch, ..Fx::default() };
        self.busy.replies.push(Pending::with(req, OnReply::Forward, fx));
        if guarded {
            self.guard_command(GuardCmd::Release, srv);
        }
    }

    /// Close: statements are answered locally (closing a name that does not exist is not
    /// an error); portals belong to the server.
    pub(in crate::session) fn on_close(&mut self, frame: &[u8], srv: Option<&mut ServerState>) {
        let Some((kind, name)) = frontend::describe_or_close(body(frame)) else {
            return self.fail(Error::protocol("invalid CLOSE message subtype"));
        };
        if kind == b'P' {
            match srv {
                Some(_) => self.forward(frame, Req::Close),
                None => self.push_synth(Synth::CloseComplete, Fx::default()),
            }
            return;
        }
        let client = if name.is_empty() {
            self.stmts.unnamed = Unnamed::None;
            ClientFx::None
        } else {
            match self.stmts.named.remove(name) {
                Some(named) => ClientFx::Closed { name: name.into(), named: Box::new(named) },
                None => ClientFx::None,
            }
        };
        self.push_synth(Synth::CloseComplete, Fx { client, ..Fx::default() });
    }

    /// An Execute just queued: if its portal runs a SET/RESET/DISCARD or a transaction
    /// control statement, its text goes with it, to be tracked once the server completes it.
    pub(in crate::session) fn track_execute(&mut self, frame: &[u8]) {
        let Some((portal, sql)) = self.busy.tx.tracked_portal.as_deref() else { return };
        if crate::protocol::read_cstr(body(frame)).map(|(p, _)| p) != Some(&portal[..]) {
            return;
        }
        let sql = sql.clone();
        self.busy.tx.note_start(sql.as_bytes());
        if let Some(p) = self.busy.replies.last_mut() {
            p.tracked_sql = Some(sql);
        }
    }

    /// An Execute just queued: if it runs the client's `DEALLOCATE ALL` stand-in, the
    /// client's statements go now (in pipeline order), and come back if the server skips it.
    pub(in crate::session) fn on_execute(&mut self, frame: &[u8]) {
        let Some(dealloc) = self.stmts.dealloc_portal.as_deref() else { return };
        if crate::protocol::read_cstr(body(frame)).map(|(portal, _)| portal) != Some(dealloc) {
            return;
        }
        let saved = std::mem::take(&mut self.stmts.named);
        if let Some(p) = self.busy.replies.last_mut() {
            p.fx.client = ClientFx::ClearedAll { saved: Box::new(saved) };
        }
    }
}
