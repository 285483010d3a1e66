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

use crate::protocol::frontend;
use crate::session::Session;
use crate::session::reply_queue::{ClientFx, Req};
use crate::stmt::lift::Origin;
use crate::stmt::pgps::{self, Entry, Types};
use crate::stmt::registry::StmtKind;
use std::sync::Arc;

/// What the view says of one of the client's names beyond its shared statement, and where
/// a `PREPARE`'s definition started (kept with the name: `names`).
#[derive(Clone, Debug)]
pub(in crate::session) struct Shown {
    /// The text PostgreSQL keeps for it when it is not the statement's query: a PREPARE's
    /// whole Query text, or a Parse's own text when the server got a rewrite of it.
    text: Option<Arc<[u8]>>,
    /// The session's clock when the client prepared it (0: unknown).
    at_us: u64,
    /// For a SQL `PREPARE`: how many characters its text had before the statement's
    /// definition ("PREPARE name "), so that errors of the server's `PREPARE pn_<k> …`
    /// point where PostgreSQL would point (`Session::prepare_rename`). 0: a Parse. (Whether
    /// a `PREPARE` defined the name is its statement's kind, `StmtKind::Sql`.)
    sql_prefix: u32,
}

impl Shown {
    /// A name a Parse defined: `text` when the server got a rewrite of the client's.
    pub(in crate::session) fn parsed(text: Option<Arc<[u8]>>, at_us: u64) -> Shown {
        Shown { text, at_us, sql_prefix: 0 }
    }

    /// A name a SQL `PREPARE` defined: its whole Query `text`, and the characters before
    /// the definition.
    pub(in crate::session) fn prepared(text: Arc<[u8]>, prefix_chars: i64, at_us: u64) -> Shown {
        let sql_prefix = u32::try_from(prefix_chars).unwrap_or(u32::MAX);
        Shown { text: Some(text), at_us, sql_prefix }
    }

    /// The characters before a `PREPARE`'s definition, if a `PREPARE` defined the name.
    pub(in crate::session) fn sql_prefix(&self) -> Option<u32> {
        (self.sql_prefix != 0).then_some(self.sql_prefix)
    }
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
        for (name, n) in self.stmts.named.iter() {
            let (s, shown) = (&n.stmt, &n.shown);
            let from_sql = s.kind == StmtKind::Sql;
            entries.push(Entry {
                name,
                statement: shown.text.as_deref().unwrap_or(&s.query),
                from_sql,
                ago_us: ago(shown.at_us),
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
                ClientFx::Named { .. }
                | ClientFx::Closed { .. }
                | ClientFx::ClearedAll { .. }
                | ClientFx::ParsedAhead { .. } => pending = true,
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
