//! The client's own `pg_prepared_statements` with the statement cache on (transaction and
//! statement pooling; issue 27). The server connection's view lists the pool's shared
//! statements under parsnip's names, so a Query or a Parse whose text reads the view gets
//! it rewritten (`stmt::pgps`) into a subquery of the client's named statements as
//! PostgreSQL would list them for a session that ran what the client ran: its names, the
//! text it sent (a PREPARE's whole Query text), `from_sql`, when it prepared them; types
//! and plan counts come from the server's row for the statement behind a name when that
//! server connection has it.
//!
//! What this owns: `Shown` (what the view says of a name that the shared statement does
//! not), and when to rewrite. A rewritten text is the client's alone: an unnamed Parse of
//! it is never promoted or cached, a simple Query of it never autoprepared; a named Parse
//! of it is a statement of its own text, which holds the rows as of its Parse (PostgreSQL
//! would read the view at each execution). Not rewritten: texts that define something that
//! reads the view later (CREATE VIEW, PREPARE), multi-statement Queries holding PREPARE,
//! EXECUTE or DEALLOCATE, and texts the lexer cannot read as the server will
//! (backslashes with `standard_conforming_strings` off, client encodings whose multibyte
//! characters may hold a `\` or `"` byte).

use super::ClientStmts;
use crate::protocol::frontend;
use crate::session::Session;
use crate::session::reply_queue::{ClientFx, Req};
use crate::stmt::lift::Origin;
use crate::stmt::pgps::{self, Entry, Types};
use crate::stmt::registry::StmtKind;
use std::sync::Arc;

/// What the view says of one of the client's names beyond its shared statement.
#[derive(Debug)]
pub(in crate::session) struct Shown {
    /// The text PostgreSQL keeps for it when it is not the statement's query: a PREPARE's
    /// whole Query text, or a Parse's own text when the server got a rewrite of it.
    text: Option<Arc<[u8]>>,
    from_sql: bool,
    /// The session's clock when the client prepared it (0: unknown).
    at_us: u64,
}

/// A text rewritten for the view: the client's text, and how positions map back.
pub(in crate::session) struct Viewed {
    pub(in crate::session) sql: Vec<u8>,
    pub(in crate::session) client_text: Arc<[u8]>,
    pub(in crate::session) origin: Arc<Origin>,
}

/// Client encodings in which a multibyte character may hold an ASCII byte (`\`, `"`):
/// the statement texts the view quotes could not be escaped byte by byte.
const UNSAFE_ENCODINGS: [&str; 7] = ["BIG5", "GB18030", "GBK", "JOHAB", "SJIS", "SHIFT_JIS_2004", "UHC"];

impl ClientStmts {
    /// Remembers how the view shows `name` from now on.
    pub(in crate::session) fn note_shown(&mut self, name: &[u8], text: Option<Arc<[u8]>>, from_sql: bool, at_us: u64) {
        if self.shown.len() > 2 * self.named.len() + 16 {
            let named = &self.named;
            self.shown.retain(|n, _| named.contains_key(n));
        }
        self.shown.insert(name.into(), Shown { text, from_sql, at_us });
    }
}

impl Session {
    /// If `text` reads `pg_prepared_statements`: the text to send in its place. `parsing`:
    /// the name of the statement a Parse of it defines, which the view lists when it runs.
    pub(in crate::session) fn view_rewrite(&self, text: &[u8], parsing: Option<(&[u8], &[u8])>) -> Option<Viewed> {
        if !pgps::mentions(text) {
            return None;
        }
        let settings = &self.kept.settings;
        if settings.reported("standard_conforming_strings") == Some("off") && text.contains(&b'\\') {
            return None;
        }
        if settings
            .reported("client_encoding")
            .is_some_and(|e| UNSAFE_ENCODINGS.iter().any(|u| u.eq_ignore_ascii_case(e)))
        {
            return None;
        }
        let sites = pgps::sites(text);
        if sites.is_empty() {
            return None;
        }
        let now = self.busy.clock_us;
        let ago = |at: u64| if at == 0 { 0 } else { now.saturating_sub(at) };
        let mut entries: Vec<Entry<'_>> = Vec::with_capacity(self.stmts.named.len() + 1);
        for (name, s) in &self.stmts.named {
            let shown = self.stmts.shown.get(name);
            let from_sql = s.kind == StmtKind::Sql;
            entries.push(Entry {
                name,
                statement: shown.and_then(|v| v.text.as_deref()).unwrap_or(&s.query),
                from_sql: shown.map_or(from_sql, |v| v.from_sql),
                ago_us: shown.map_or(0, |v| ago(v.at_us)),
                server_name: &s.server_name,
                types: if from_sql { Types::Prepare(&s.query) } else { Types::Oids(s.param_types()) },
            });
        }
        if let Some((name, types)) = parsing {
            entries.push(Entry {
                name,
                statement: text,
                from_sql: false,
                ago_us: 0,
                server_name: "",
                types: Types::Oids(types),
            });
        }
        let Some(sub) = pgps::subquery(&entries) else {
            tracing::debug!(
                statements = entries.len(),
                "pg_prepared_statements left as the server shows it: too large"
            );
            return None;
        };
        let (sql, edits) = pgps::rewrite(text, &sites, &sub);
        Some(Viewed { sql, client_text: text.into(), origin: Arc::new(Origin { edits, literals: Vec::new() }) })
    }

    /// A change to the client's names waits for its reply in an earlier batch (or a
    /// script's statements will make one as they complete): what the view lists depends on
    /// whether it succeeds.
    pub(in crate::session) fn names_in_flight(&self) -> bool {
        let mut pending = false;
        for p in self.busy.replies.iter() {
            if p.fx.script.is_some() {
                return true;
            }
            match &p.fx.client {
                ClientFx::Named { .. } | ClientFx::Closed { .. } | ClientFx::ClearedAll { .. } => pending = true,
                _ if pending && p.req == Req::Sync && !p.is_synth() => return true,
                _ => {}
            }
        }
        false
    }

    /// A simple Query whose text reads the view: sent rewritten (never autoprepared).
    /// None: not one. Some(false): wait for replies to earlier batches.
    pub(in crate::session) fn query_reading_view(&mut self, text: &[u8]) -> Option<bool> {
        let viewed = self.view_rewrite(text, None)?;
        if self.names_in_flight() {
            return Some(false);
        }
        self.busy.tx.note_start(text);
        let mut frame = bytes::BytesMut::with_capacity(viewed.sql.len() + 6);
        frontend::query_bytes(&mut frame, &viewed.sql);
        self.forward_query(&frame);
        self.map_errors_of_last(Req::Query, viewed.origin);
        Some(true)
    }

    /// The last request of kind `req` queued: its errors' positions map back through
    /// `origin` to the client's text.
    pub(in crate::session) fn map_errors_of_last(&mut self, req: Req, origin: Arc<Origin>) {
        if let Some(p) = self.busy.replies.iter_mut().filter(|p| p.req == req && !p.is_synth()).last() {
            p.fx.view = Some(origin);
        }
    }
}
