//! `set_config(name, value, false)` under transaction pooling: a session-level setting made
//! by a function call, which parsnip cannot read from the SQL text as it reads `SET` (the
//! call may not run, its transaction may roll back, its value may be a parameter). The
//! names it may change are known when its first argument is a string literal or a bare
//! parameter whose value comes with the Bind (`settings::session_config_names`); they are
//! noted, and where the server would be given back (`maybe_release`) parsnip asks the
//! server (`probe_sql`, its replies never shown to the client) what each of them is now and
//! whether it is set for the session. Each one that is becomes one of the client's settings,
//! replayed on its next server connection as `set_config` (`state::Settings`); one that is
//! not is forgotten. The server's own record is updated the same way, so the connection is
//! reused. A name that cannot be known, `session_authorization` and `seed` (which a replay
//! cannot restore), a timeout (which would act on the next client's replay itself), a failed
//! question, or session pooling keep the old rule: the server connection is closed when
//! given back.

use super::Session;
use super::reply_queue::{Pending, Purpose, Req};
use super::settings::{ConfigName, session_config_names};
use crate::config::PoolMode;
use crate::protocol::frontend;
use crate::state::ServerState;
use crate::state::settings::{quote_literal, tracked_name};

/// Names noted for the question, and its answer.
#[derive(Debug, Default)]
pub(super) struct ConfigCheck {
    /// Lowercased setting names, each once.
    names: Vec<Box<str>>,
    /// The question is in flight, about the first `asked` names (the client may have sent
    /// more behind it).
    asking: bool,
    asked: usize,
    /// Its rows: (name, value now, whether set for the session).
    rows: Vec<Row>,
}

/// One row of the answer: (name, value now, whether set for the session; None for a
/// custom setting).
type Row = (Box<str>, Option<Box<str>>, Option<bool>);

/// Settings a replay cannot restore: the connection is closed instead.
const NOT_REPLAYED: [&str; 2] = ["session_authorization", "seed"];

/// parsnip's question about `names`: per name, its value now (`current_setting`, NULL for a
/// custom setting that does not exist) and whether it is set for the session (pg_settings'
/// source; custom settings are not listed there: NULL).
fn probe_sql(names: &[Box<str>]) -> String {
    let values: Vec<String> = names.iter().map(|n| format!("({})", quote_literal(n))).collect();
    format!(
        "SELECT v.n, pg_catalog.current_setting(v.n, true), \
         (SELECT s.source = 'session' FROM pg_catalog.pg_settings s WHERE pg_catalog.lower(s.name) = v.n) \
         FROM (VALUES {}) v(n)",
        values.join(", ")
    )
}

impl Session {
    /// The client sent `text` (a simple Query, or the statement of a Bind whose body is
    /// `bind`, parameters at `bind_at`): its session-level `set_config` calls, if any, are
    /// followed (see the module doc), or the server is marked not to be reused.
    pub(super) fn note_set_config(&mut self, text: &[u8], bind: Option<(&[u8], usize)>) {
        if !super::settings::may_set_session_config(text) {
            return;
        }
        let names = (self.kept.mode != PoolMode::Session)
            .then(|| session_config_names(text))
            .flatten()
            .and_then(|names| names.into_iter().map(|n| resolve(n, bind)).collect::<Option<Vec<_>>>());
        // A timeout set for the session would act on the next client's settings replay
        // itself (a 1 ms statement_timeout can cancel the SET that replays its own
        // application_name): such a server is closed when given back, as before.
        let names = names.filter(|names| !names.iter().any(|n| n.ends_with("timeout")));
        match names {
            Some(names) if self.link.is_linked() => {
                let c = self.busy.tx.config.get_or_insert_default();
                for n in names {
                    if !c.names.contains(&n) {
                        c.names.push(n);
                    }
                }
            }
            _ => self.dirty_server_if(true),
        }
    }

    /// Where the server would be given back: true if it is kept because the question is
    /// sent now or is in flight.
    pub(super) fn config_keeps_server(&mut self) -> bool {
        let Some(c) = self.busy.tx.config.as_mut() else { return false };
        if self.link.state().is_none_or(|l| l.dirty) {
            // Closed when given back: nothing to ask.
            self.busy.tx.config = None;
            return false;
        }
        if !c.asking {
            c.asking = true;
            c.asked = c.names.len();
            frontend::query(&mut self.to_server, &probe_sql(&c.names));
            self.busy.replies.push(Pending::internal(Req::Query, Purpose::ConfigCheck));
            self.pins_note_unnamed_gone();
        }
        true
    }

    /// A DataRow answering the question.
    pub(super) fn config_row(&mut self, row: &[u8]) {
        let Some(c) = self.busy.tx.config.as_mut() else { return };
        match parse_row(row) {
            Some(r) => c.rows.push(r),
            None => c.rows.clear(),
        }
    }

    /// The question's ReadyForQuery (`failed`: it got an error): the answer becomes the
    /// client's settings and the server's record of them.
    pub(super) fn config_checked(&mut self, failed: bool, server: &mut ServerState) {
        let Some(mut c) = self.busy.tx.config.take() else { return };
        let rows = std::mem::take(&mut c.rows);
        let asked: Vec<_> = c.names.drain(..c.asked).collect();
        if !c.names.is_empty() {
            // Noted behind the question: asked about at the next release.
            c.asking = false;
            self.busy.tx.config = Some(c);
        }
        if failed || rows.len() != asked.len() || rows.iter().zip(&asked).any(|(r, n)| r.0 != *n) {
            tracing::warn!(
                session = self.kept.uid,
                "could not read back what set_config changed: the server is closed"
            );
            return self.dirty_server_if(true);
        }
        let client = std::sync::Arc::make_mut(&mut self.kept.settings);
        for (name, value, session) in rows {
            if tracked_name(&name).is_some() {
                continue; // Reported by ParameterStatus, followed from there.
            }
            // A custom setting (not in pg_settings) is kept when it exists; `role` when set.
            let set = match (value, session) {
                (Some(v), Some(true)) => Some(v),
                (Some(v), None) if !(&*name == "role" && &*v == "none") => Some(v),
                _ => None,
            };
            match set {
                Some(v) => {
                    let sql =
                        format!("SELECT pg_catalog.set_config({}, {}, false)", quote_literal(&name), quote_literal(&v));
                    client.set_extra(name.to_string(), sql.clone());
                    server.settings.set_extra(name.into(), sql);
                }
                None => {
                    client.reset_extra(&name);
                    server.settings.reset_extra(&name);
                }
            }
        }
        let t = self.kept.settings.cancel_timer_us();
        self.shorten_timer(t);
    }
}

/// A name as the server will be asked about it: lowercased, and known (a parameter's value
/// is its Bind's).
fn resolve(name: ConfigName, bind: Option<(&[u8], usize)>) -> Option<Box<str>> {
    let name = match name {
        ConfigName::Literal(n) => n,
        ConfigName::Param(i) => {
            let (body, at) = bind?;
            let v = frontend::bind_param(body, at, i - 1)??;
            std::str::from_utf8(v).ok().filter(|v| !v.contains('\0'))?.to_owned()
        }
    };
    let name = name.to_ascii_lowercase();
    (!name.is_empty() && !NOT_REPLAYED.contains(&name.as_str())).then(|| name.into())
}

/// (name, value, set for the session) from a DataRow body of the question's answer.
fn parse_row(row: &[u8]) -> Option<Row> {
    let n = u16::from_be_bytes([*row.first()?, *row.get(1)?]);
    if n != 3 {
        return None;
    }
    let mut at = 2;
    let mut col = || -> Option<Option<&[u8]>> {
        let len = i32::from_be_bytes(row.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        if len < 0 {
            return Some(None);
        }
        let v = row.get(at..at + len as usize)?;
        at += len as usize;
        Some(Some(v))
    };
    let name = std::str::from_utf8(col()??).ok()?.into();
    let value = match col()? {
        Some(v) => Some(std::str::from_utf8(v).ok()?.into()),
        None => None,
    };
    let session = match col()? {
        Some(b"t") => Some(true),
        Some(b"f") => Some(false),
        None => None,
        Some(_) => return None,
    };
    Some((name, value, session))
}
