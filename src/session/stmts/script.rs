//! A simple Query of several statements, some of them SQL-level `PREPARE`, `EXECUTE` or
//! `DEALLOCATE` (or `LISTEN`/`UNLISTEN`), with the cache on: a "script". PostgreSQL runs the statements in order, in
//! one implicit transaction, and stops at the first error. The server gets one Query too,
//! rewritten statement by statement:
//!
//! * a `PREPARE` the cache answers (the statement is already on this server) and a
//!   `DEALLOCATE` are taken out of the text; their CommandComplete is made here, at their
//!   place among the server's replies;
//! * a `LISTEN`/`UNLISTEN` is taken out too, answered in its place, and applied with the
//!   Query's ReadyForQuery (`notify`);
//! * a `PREPARE` the server must run is sent under the statement's server name;
//! * an `EXECUTE` (also `EXPLAIN … EXECUTE`, `CREATE TABLE … AS EXECUTE`) names the server's
//!   statement. If this server lacks it, its `PREPARE` is put in the text just before (its
//!   CommandComplete hidden, an error in it worded and placed as PostgreSQL places it in the
//!   client's own PREPARE), so that what comes before it runs first, as it would have; a
//!   statement the client made with a protocol-level Parse is prepared ahead of the Query
//!   instead (as for a lone `EXECUTE`);
//! * a statement that must fail as PostgreSQL would fail it (a name already taken, the
//!   client's limit, a stale plan, an unknown name to `DEALLOCATE`) becomes one the server
//!   fails, and the rest of the text is dropped (PostgreSQL would not run it): the client
//!   gets PostgreSQL's error in place of the server's.
//!
//! The client's names change as the server's replies show each statement done: a statement
//! after an error never ran, so neither does its change. Errors are worded with the client's
//! names and positions. What this file must not do: touch anything but the client's names,
//! the server's statement list and the reply queue entry it builds.

use super::names::NamedStmts;
use super::view::Shown;
use super::{char_len, duplicate, missing, stale_plan, too_many};
use crate::error::{Error, SqlState};
use crate::protocol::{backend, frontend};
use crate::session::Session;
use crate::session::error_text::Rename;
use crate::session::reply_queue::{ClientFx, Fx, OnReply, Pending, Purpose, Req};
use crate::state::ServerState;
use crate::stmt::Statement;
use crate::stmt::lift::Rewrite;
use crate::stmt::registry::{StmtKind, make_key};
use crate::stmt::sql::listen::ListenCmd;
use crate::stmt::sql::{SqlStmt, skip_space, words};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What a script still has to do as the server's replies come in.
#[derive(Clone, Debug, Default)]
pub(crate) struct Script {
    /// Server statements completed so far (CommandCompletes seen).
    done: u16,
    /// What happens once how many server statements completed, in statement order.
    events: Vec<(u16, Event)>,
    /// Events already done.
    next: usize,
    /// The statement made to fail on purpose (its ordinal), and the client's error for it.
    fail: Option<(u16, Box<Error>)>,
    /// Statements this script prepares on the server: (ordinal of the PREPARE, statement).
    prepared: Vec<(u16, Arc<Statement>)>,
    /// Statements EXECUTEd: (ordinal, statement), so that an error about one tells.
    uses: Vec<(u16, Arc<Statement>)>,
    /// Server statement names sent, and the client's names for them.
    names: Vec<(Box<str>, Box<str>)>,
    /// PREPAREs put in the text ahead of an EXECUTE (their ordinals): their CommandComplete
    /// is not the client's, and an error in one is worded for the client's own PREPARE.
    inserted: Vec<(u16, Rename)>,
    /// Where the texts differ, in characters: (server start, server end, client start,
    /// client end), in order.
    edits: Vec<[i64; 4]>,
}

/// One step of a script the pooler takes itself.
#[derive(Clone, Debug)]
enum Event {
    /// A statement answered here: CommandComplete with this tag.
    Tag(&'static str),
    /// The client's name now holds this statement, PREPAREd by this Query text (what
    /// `pg_prepared_statements` shows for it), with this many characters before its
    /// definition (`view::Shown::prepared`).
    Bind(Box<[u8]>, Arc<Statement>, Arc<[u8]>, i64),
    /// The client's name was deallocated.
    Unbind(Box<[u8]>),
    /// All the client's names were deallocated.
    UnbindAll,
    /// A server completed a PREPARE of this statement.
    Prepared(Arc<Statement>),
    /// A LISTEN/UNLISTEN answered here ran (`notify::listen_script_ran`).
    Listen(ListenCmd),
}

/// A change to one of the client's names: the statement it holds now, if any.
type NameChange = (Box<[u8]>, Option<Arc<Statement>>);

/// The client's names as the script goes: changes over the names held before it.
#[derive(Default)]
struct Names {
    changes: Vec<NameChange>,
    cleared: bool,
    count: usize,
}

impl Names {
    fn get(&self, held: &NamedStmts, name: &[u8]) -> Option<Arc<Statement>> {
        match self.changes.iter().rev().find(|(n, _)| **n == *name) {
            Some((_, s)) => s.clone(),
            None if self.cleared => None,
            None => held.get(name).cloned(),
        }
    }
    fn set(&mut self, name: &[u8], s: Option<Arc<Statement>>, had: bool) {
        match (had, s.is_some()) {
            (false, true) => self.count += 1,
            (true, false) => self.count -= 1,
            _ => {}
        }
        self.changes.push((name.into(), s));
    }
    fn clear(&mut self) {
        self.changes.clear();
        self.cleared = true;
        self.count = 0;
    }
}

/// Stand-in for a statement that must fail: it names a statement no server has (26000),
/// which puts the server in the error state PostgreSQL would be in.
const FAIL: &[u8] = b"DEALLOCATE parsnip_probe";

impl Session {
    /// A multi-statement Query holding SQL-level statement commands (`stmts`: its non-empty
    /// statements). False: wait for a PREPARE or Close still in flight (nothing was sent).
    pub(in crate::session) fn on_sql_script(
        &mut self,
        frame: &[u8],
        text: &[u8],
        stmts: Vec<(Range<usize>, Option<SqlStmt>)>,
        srv: &mut ServerState,
    ) -> bool {
        if let Some(why) = self.script_unsupported(text) {
            if stmts.iter().all(|(_, s)| matches!(s, None | Some(SqlStmt::Listen(_)))) {
                // Only LISTEN/UNLISTEN of ours: the server runs the text as it is.
                self.busy.tx.note_start(text);
                self.forward_query(frame);
                return true;
            }
            let e = Error::new(SqlState::FEATURE_NOT_SUPPORTED, format!("parsnip: {why}"));
            self.statement_error(e, Some(srv), true);
            return true;
        }
        for (_, s) in &stmts {
            if let Some(SqlStmt::Execute { name, .. }) = s
                && let Some(st) = self.stmts.named.get(name.as_slice())
                && self.stmt_pending_across_sync(st)
            {
                return false;
            }
        }
        let registry = self.registry().clone();
        let cap = registry.cfg.client_cap;
        let mut names = Names { count: self.stmts.named.len(), ..Names::default() };
        let mut t = Rewrite::new(text);
        let mut sc = Script::default();
        let mut ordinal: u16 = 0;
        let mut prepared_ahead = false;
        let mut shown: Option<Arc<[u8]>> = None;
        let synced = !self.busy.replies.is_unsynced();
        // EXECUTEs of setting or transaction statements, and the texts they run.
        let mut executed: Vec<(Range<usize>, Box<str>)> = Vec::new();
        for (r, s) in stmts {
            let start = r.start + skip_space(&text[r.clone()]);
            let Some(s) = s else {
                ordinal = ordinal.saturating_add(1);
                continue;
            };
            let fail = match s {
                SqlStmt::Prepare { name, rest } => {
                    let had = names.get(&self.stmts.named, &name);
                    if had.is_some() {
                        Some(duplicate(&name))
                    } else if names.count >= cap {
                        Some(too_many(cap))
                    } else {
                        let def = &text[rest..r.end];
                        let mut k = std::mem::take(&mut self.busy.key_buf);
                        make_key(&mut k, &StmtKind::Sql, self.search_path(), def, b"");
                        let stmt = registry.get_or_insert(&k, StmtKind::Sql, def, b"");
                        self.busy.key_buf = k;
                        let here = srv.stmts.has(&stmt);
                        if here {
                            srv.stmts.touch(&stmt);
                        }
                        // On this server already: answered here. Otherwise the server runs
                        // it in its place (also when another server accepted it: this one
                        // may refuse it now, and must then do so at this point of the text).
                        if here {
                            t.replace(start..r.end, b"");
                            sc.events.push((ordinal, Event::Tag("PREPARE")));
                        } else {
                            let head = self.prepare_in_script(srv, &stmt, &mut sc, &mut ordinal);
                            t.replace(start..rest, &head);
                            sc.names.push((stmt.server_name.clone(), String::from_utf8_lossy(&name).into()));
                        }
                        let whole = shown.get_or_insert_with(|| Arc::from(text)).clone();
                        // PostgreSQL's positions count from the start of the whole Query.
                        let prefix = char_len(&text[..rest]);
                        sc.events.push((ordinal, Event::Bind(name.as_slice().into(), stmt.clone(), whole, prefix)));
                        names.set(&name, Some(stmt), false);
                        None
                    }
                }
                SqlStmt::Execute { name, span } => match names.get(&self.stmts.named, &name) {
                    // Unknown here: the server says so (26000) with the client's name.
                    None => {
                        ordinal = ordinal.saturating_add(1);
                        None
                    }
                    Some(stmt) if stmt.stale.load(Ordering::Relaxed) => Some(stale_plan()),
                    Some(stmt) => {
                        if stmt.kind == StmtKind::Sql && !srv.stmts.has(&stmt) {
                            // PREPAREd in its place, just before (not when an earlier PREPARE
                            // of this script prepares it: the server has it then).
                            let prepared_at = ordinal;
                            let mut sql = self.prepare_in_script(srv, &stmt, &mut sc, &mut ordinal);
                            sql.extend_from_slice(&stmt.query);
                            // A line comment at the end of the definition ends with the line.
                            sql.extend_from_slice(b"\n;");
                            let at = t.insert(start, &sql);
                            let mut rename = self.prepare_rename(&stmt, &name);
                            rename.from += at;
                            rename.shift -= at;
                            sc.inserted.push((prepared_at, rename));
                        } else {
                            // A protocol-level statement is prepared ahead of the Query if
                            // this server lacks it.
                            prepared_ahead |= self.ensure_on_server(srv, &stmt, OnReply::Inject, ClientFx::None, &name);
                        }
                        t.replace(span, stmt.server_name.as_bytes());
                        sc.names.push((stmt.server_name.clone(), String::from_utf8_lossy(&name).into()));
                        if let Some(run) = self.note_executed(&stmt) {
                            executed.push((start..r.end, run));
                        }
                        sc.uses.push((ordinal, stmt));
                        ordinal = ordinal.saturating_add(1);
                        None
                    }
                },
                SqlStmt::Deallocate(Some(name)) => match names.get(&self.stmts.named, &name) {
                    Some(_) => {
                        t.replace(start..r.end, b"");
                        sc.events.push((ordinal, Event::Tag("DEALLOCATE")));
                        sc.events.push((ordinal, Event::Unbind(name.as_slice().into())));
                        names.set(&name, None, true);
                        None
                    }
                    None => Some(missing(&name)),
                },
                SqlStmt::Deallocate(None) => {
                    t.replace(start..r.end, b"");
                    sc.events.push((ordinal, Event::Tag("DEALLOCATE ALL")));
                    sc.events.push((ordinal, Event::UnbindAll));
                    names.clear();
                    None
                }
                // Answered here in its place, and settled with the Query's ReadyForQuery
                // (`notify::listen_batch_end`): the server never runs it.
                SqlStmt::Listen(cmd) => {
                    t.replace(start..r.end, b"");
                    let tag = if matches!(cmd, ListenCmd::Listen(_)) { "LISTEN" } else { "UNLISTEN" };
                    sc.events.push((ordinal, Event::Tag(tag)));
                    sc.events.push((ordinal, Event::Listen(cmd)));
                    None
                }
                // PostgreSQL refuses it inside the implicit transaction of a multi-statement
                // Query (25001), as the server will.
                SqlStmt::DiscardAll => {
                    ordinal = ordinal.saturating_add(1);
                    None
                }
            };
            if let Some(e) = fail {
                t.replace(start..text.len(), FAIL);
                sc.fail = Some((ordinal, Box::new(e)));
                break;
            }
        }
        if prepared_ahead && synced {
            // As for a lone EXECUTE: end the PREPARE's implicit transaction before the
            // Query, and stop there if it fails (`answer_after_prepare_sync`).
            frontend::sync(&mut self.to_server);
            self.busy.replies.push(Pending::internal(Req::Sync, Purpose::Prepare));
        }
        let (sql, edits) = t.finish();
        sc.edits = edits;
        // What the Query does to settings and transactions, read with each such EXECUTE in
        // the place of the statement it runs (`note_executed`).
        let runs = ran_text(text, &executed);
        let runs = runs.as_deref().unwrap_or(text);
        self.busy.tx.note_start(runs);
        self.send_script(runs, &sql, sc);
        true
    }

    /// `stmt` is PREPAREd on this server at `ordinal` of the script `sc` (which moves past
    /// it): room made for it, recorded as on the server (undone should the script stop
    /// before it), validated once it completes. Returns the head of its text, `PREPARE
    /// <server name> `, with room for the definition.
    fn prepare_in_script(
        &mut self,
        srv: &mut ServerState,
        stmt: &Arc<Statement>,
        sc: &mut Script,
        ordinal: &mut u16,
    ) -> Vec<u8> {
        let registry = self.registry().clone();
        if let Some(victim) = srv.stmts.evict_candidate(registry.cfg.server_cap) {
            self.close_on_server(srv, victim, &registry);
        }
        srv.stmts.insert(stmt);
        sc.prepared.push((*ordinal, stmt.clone()));
        *ordinal = ordinal.saturating_add(1);
        sc.events.push((*ordinal, Event::Prepared(stmt.clone())));
        let mut head = Vec::with_capacity(stmt.query.len() + stmt.server_name.len() + 16);
        head.extend_from_slice(b"PREPARE ");
        head.extend_from_slice(stmt.server_name.as_bytes());
        head.push(b' ');
        head
    }

    /// Why a script cannot be rewritten safely, if it cannot: its statements would not be
    /// split where PostgreSQL splits them.
    fn script_unsupported(&self, text: &[u8]) -> Option<&'static str> {
        let mut prev_begin = false;
        for w in words(text) {
            if prev_begin && w.eq_ignore_ascii_case(b"atomic") {
                return Some(
                    "PREPARE, EXECUTE and DEALLOCATE cannot share a query string with a BEGIN ATOMIC function body",
                );
            }
            prev_begin = w.eq_ignore_ascii_case(b"begin");
        }
        let escapes_everywhere = self.kept.settings.reported("standard_conforming_strings") == Some("off");
        (escapes_everywhere && text.contains(&b'\\')).then_some(
            "PREPARE, EXECUTE and DEALLOCATE cannot share a query string with backslashes while \
                standard_conforming_strings is off",
        )
    }

    /// `runs`: the Query's text as it runs (`ran_text`), for what it does to settings and
    /// transactions; `sql`: what the server gets.
    fn send_script(&mut self, runs: &[u8], sql: &[u8], sc: Script) {
        frontend::query_bytes(&mut self.to_server, sql);
        let mut p = Pending::with(Req::Query, OnReply::Forward, Fx { script: Some(Box::new(sc)), ..Fx::default() });
        if crate::session::settings::maybe_setting_stmt(runs)
            || (!self.busy.tx.settings.is_empty() && crate::session::settings::maybe_tx_end(runs))
        {
            p.tracked_sql = self.text_to_track(runs);
        }
        self.note_set_config(runs, None);
        self.busy.replies.push(p);
        self.drain_synth();
    }

    /// The script at the head of the queue: take the steps due after `done` server
    /// statements (called as each completes, and when the script reaches the head).
    pub(in crate::session) fn script_catch_up(&mut self) {
        let Some(head) = self.busy.replies.head_mut() else { return };
        if !matches!(head.on_reply, OnReply::Forward) {
            return;
        }
        let Some(sc) = head.fx.script.as_mut() else { return };
        if sc.events.get(sc.next).is_none_or(|(at, _)| *at > sc.done) {
            return;
        }
        let mut sc = std::mem::take(sc);
        while let Some((at, ev)) = sc.events.get(sc.next)
            && *at <= sc.done
        {
            match ev {
                Event::Tag(t) => backend::command_complete(&mut self.to_client, t),
                Event::Bind(name, s, text, prefix) => {
                    let shown = Shown::prepared(text.clone(), *prefix, self.busy.clock_us);
                    self.stmts.named.insert(name.clone(), s.clone(), shown);
                }
                Event::Unbind(name) => {
                    self.stmts.named.remove(name);
                }
                Event::UnbindAll => self.stmts.named.clear(),
                Event::Listen(cmd) => {
                    let cmd = cmd.clone();
                    if !self.listen_script_ran(cmd) {
                        return;
                    }
                }
                Event::Prepared(s) => {
                    s.validated.store(true, Ordering::Relaxed);
                    self.registry().stats.server_parses.fetch_add(1, Ordering::Relaxed);
                }
            }
            sc.next += 1;
        }
        if let Some(head) = self.busy.replies.head_mut() {
            head.fx.script = Some(sc);
        }
    }

    /// A reply to the script at the head of the queue (forwarded, unless it is the empty
    /// answer to a text whose statements were all taken out).
    pub(in crate::session) fn on_script_reply(&mut self, frame: &[u8]) {
        match frame[0] {
            crate::protocol::tags::EMPTY_QUERY_RESPONSE => {}
            crate::protocol::tags::COMMAND_COMPLETE => {
                let sc = self.busy.replies.head_mut().and_then(|h| h.fx.script.as_mut());
                let ours = sc.as_ref().is_some_and(|sc| sc.inserted.iter().any(|(n, _)| *n == sc.done));
                if let Some(sc) = sc {
                    sc.done = sc.done.saturating_add(1);
                }
                if !ours {
                    self.to_client.extend_from_slice(frame);
                }
                self.script_catch_up();
            }
            _ => self.to_client.extend_from_slice(frame),
        }
    }

    /// An error ended the script at the head of the queue: the client's error, and the
    /// statements it never prepared forgotten.
    pub(in crate::session) fn on_script_error(&mut self, frame: &[u8], code: &[u8], srv: &mut ServerState) {
        let Some(sc) = self.busy.replies.head_mut().and_then(|h| h.fx.script.take()) else { return };
        let at = sc.done;
        match (&sc.fail, sc.inserted.iter().find(|(n, _)| *n == at)) {
            (Some((n, e)), _) if *n == at && code == b"26000" => e.write_to(&mut self.to_client),
            (_, Some((_, rename))) => rename.rewrite_error(frame, &mut self.to_client),
            _ => sc.rewrite_error(frame, &mut self.to_client),
        }
        sc.undo_from(at, srv, self.registry());
        if let Some((_, s)) = sc.uses.iter().find(|(n, _)| *n == at) {
            let s = s.clone();
            self.on_statement_error(&s, code, srv);
        }
    }
}

impl Script {
    /// Statements this script prepared at or after ordinal `at` never were (the server
    /// stopped at `at`, or never ran the script).
    pub(in crate::session) fn undo_from(&self, at: u16, srv: &mut ServerState, registry: &crate::stmt::Registry) {
        for (n, s) in &self.prepared {
            if *n >= at {
                srv.stmts.remove(s);
                if *n == at {
                    registry.forget_invalid(s);
                }
            }
        }
    }

    /// The ErrorResponse `frame` as the client would have received it for its own text.
    fn rewrite_error(&self, frame: &[u8], out: &mut bytes::BytesMut) {
        use std::borrow::Cow;
        let body = frame.get(5..).unwrap_or_default();
        let fields = backend::error_fields(body).map(|(t, v)| {
            let value = match t {
                b'M' | b'D' | b'H' if !self.names.is_empty() => {
                    let mut text = String::from_utf8_lossy(v).into_owned();
                    for (server, client) in &self.names {
                        text = text.replace(&format!("\"{server}\""), &format!("\"{client}\""));
                    }
                    Cow::Owned(text.into_bytes())
                }
                b'P' => match std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()) {
                    Some(p) => Cow::Owned(self.client_position(p).to_string().into_bytes()),
                    None => Cow::Borrowed(v),
                },
                _ => Cow::Borrowed(v),
            };
            (t, value)
        });
        backend::error_response_fields(out, fields);
    }

    /// A 1-based character position in the server's text, in the client's.
    fn client_position(&self, p: i64) -> i64 {
        crate::session::reply_queue::client_position(&self.edits, p)
    }
}

/// The Query's text with each statement in `executed` (its range, and the text of the
/// statement its EXECUTE runs) in the place of that EXECUTE; None when there is none.
fn ran_text(text: &[u8], executed: &[(Range<usize>, Box<str>)]) -> Option<Vec<u8>> {
    if executed.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() + executed.iter().map(|(_, t)| t.len()).sum::<usize>());
    let mut at = 0;
    for (r, run) in executed {
        out.extend_from_slice(&text[at..r.start]);
        out.extend_from_slice(run.as_bytes());
        at = r.end;
    }
    out.extend_from_slice(&text[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_map_back_across_edits() {
        // client: "PREPARE a AS SELECT 1; EXECUTE a; SELECT x"
        // server: "; EXECUTE pn_1; SELECT x"
        let client = b"PREPARE a AS SELECT 1; EXECUTE a; SELECT x";
        let mut t = Rewrite::new(client);
        t.replace(0..21, b"");
        t.replace(31..32, b"pn_1");
        let (sql, edits) = t.finish();
        assert_eq!(sql, b"; EXECUTE pn_1; SELECT x");
        let sc = Script { edits, ..Script::default() };
        let server_x = sql.iter().position(|&c| c == b'x').unwrap() as i64 + 1;
        let client_x = client.iter().position(|&c| c == b'x').unwrap() as i64 + 1;
        assert_eq!(sc.client_position(server_x), client_x);
        // Inside a replaced name: the start of the client's name.
        assert_eq!(sc.client_position(12), 32);
        // Before any edit.
        assert_eq!(sc.client_position(1), 22);
    }
}
