//! What the pooler reads of a Query's SQL, through the one lexer (`stmt::lex`): the
//! statement splitter (`split`), the statement reader of the session's settings recognizer
//! (`words`), the classifiers (`is_plain_dml`, `is_plain_read`, `may_change_schema`,
//! `session_state`, what a text may do to state that outlives its transaction), and the SQL-level prepared-statement commands
//! in a simple Query (`classify`: `PREPARE`, `EXECUTE` (also inside `EXPLAIN … EXECUTE` and
//! `CREATE TABLE … AS EXECUTE`), `DEALLOCATE [PREPARE] name|ALL`, `DISCARD ALL`, read in
//! `commands`), found even inside multi-statement strings. The per-Query prefilters (the
//! keyword, locking-clause and session-state words at word starts: one byte pass,
//! `marks`) err on the careful side (a word in a literal counts); the lexer reads the text
//! only where they cannot decide.

use super::lex::{self, Kind};
use std::ops::Range;

/// A recognized command.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SqlStmt {
    /// `PREPARE name [(types)] AS statement`: the name (case-folded) and where the part after
    /// the name starts.
    Prepare {
        /// Statement name.
        name: Vec<u8>,
        /// Offset of "(types) AS …" / "AS …" in the text.
        rest: usize,
    },
    /// `EXECUTE name [(params)]`: the name and its byte range in the text.
    Execute {
        /// Statement name.
        name: Vec<u8>,
        /// Where the name is written.
        span: Range<usize>,
    },
    /// `DEALLOCATE [PREPARE] name` (Some) or `ALL` (None).
    Deallocate(Option<Vec<u8>>),
    /// `DISCARD ALL`.
    DiscardAll,
    /// `LISTEN`/`UNLISTEN` as the session answers them (`listen::parse_listen`): taken out
    /// of a multi-statement Query and answered in its place (`session::stmts::script`).
    Listen(listen::ListenCmd),
}

/// What a Query text holds, as far as the statement cache is concerned.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Classified {
    /// Nothing the cache must see.
    Plain,
    /// Exactly one statement, and it is one of ours.
    Single(SqlStmt),
    /// Several statements, at least one of ours: each non-empty statement (as PostgreSQL's
    /// parser counts them: whitespace and comments alone are none) with its byte range, and
    /// what it is if ours (`session::stmts::script`).
    Multi(Vec<(Range<usize>, Option<SqlStmt>)>),
}

/// Whether the (single-statement) text starts with DEALLOCATE: a Parse can hold only one
/// statement, so its first word decides.
pub(crate) fn starts_with_deallocate(sql: &[u8]) -> bool {
    first_word(sql).is_some_and(|w| w.eq_ignore_ascii_case(b"deallocate"))
}

/// Whether the text is surely one plain data statement (SELECT, INSERT, UPDATE, DELETE,
/// MERGE, WITH, VALUES, TABLE): nothing that can change a table's definition.
pub(crate) fn is_plain_dml(sql: &[u8]) -> bool {
    const DML: [&[u8]; 8] = [b"select", b"insert", b"update", b"delete", b"merge", b"with", b"values", b"table"];
    let Some(w) = first_word(sql) else { return false };
    if !DML.iter().any(|k| w.eq_ignore_ascii_case(k)) {
        return false;
    }
    one_statement(sql)
}

/// Whether the text has no `;` but trailing ones (a `;` inside a literal makes it seem not:
/// callers that must be exact split the text instead).
fn one_statement(sql: &[u8]) -> bool {
    match memchr::memchr(b';', sql) {
        Some(i) => sql[i..].iter().all(|&b| b == b';' || b.is_ascii_whitespace()),
        None => true,
    }
}

/// Whether running the text may change the schema under cached statements (DDL): any
/// statement whose first word is not one of those that cannot (data statements, settings,
/// transaction control, cursors, statement commands, COPY, EXPLAIN, LOCK, maintenance).
/// Cheap for the usual one-statement text; a multi-statement text is checked statement by
/// statement.
pub(crate) fn may_change_schema(sql: &[u8]) -> bool {
    let one = |stmt: &[u8]| match first_word(stmt) {
        Some(w) => !cannot_change_schema(w),
        // Empty, or starting with '(' (a parenthesized SELECT): no DDL.
        None => false,
    };
    if one_statement(sql) { one(sql) } else { split(sql).into_iter().any(|r| one(&sql[r])) }
}

/// Whether a statement starting with the word `w` cannot change the schema: data
/// statements, settings, transaction control, cursors, statement commands, COPY, EXPLAIN,
/// LOCK, maintenance. Lower-cased into a buffer and matched at once (every Query and Parse
/// asks: a comparison with each word in turn cost more than the rest of the check).
fn cannot_change_schema(w: &[u8]) -> bool {
    let mut buf = [0u8; 10];
    let Some(lower) = buf.get_mut(..w.len()) else { return false };
    for (d, s) in lower.iter_mut().zip(w) {
        *d = s.to_ascii_lowercase();
    }
    matches!(
        &*lower,
        b"select"
            | b"insert"
            | b"update"
            | b"delete"
            | b"merge"
            | b"with"
            | b"values"
            | b"table"
            | b"set"
            | b"reset"
            | b"show"
            | b"begin"
            | b"start"
            | b"commit"
            | b"end"
            | b"rollback"
            | b"abort"
            | b"savepoint"
            | b"release"
            | b"prepare"
            | b"execute"
            | b"deallocate"
            | b"listen"
            | b"notify"
            | b"unlisten"
            | b"discard"
            | b"fetch"
            | b"move"
            | b"close"
            | b"declare"
            | b"copy"
            | b"explain"
            | b"lock"
            | b"checkpoint"
            | b"vacuum"
            | b"analyze"
            | b"analyse"
    )
}

/// Whether the text is surely one plain read (SELECT, VALUES, TABLE) that takes no row
/// locks: it waits on no other transaction's row lock, so a batch of it ends in the time it
/// needs to run (`session::pipeline`). Conservative: a locking clause anywhere in the text
/// (`FOR UPDATE`, `FOR NO KEY UPDATE`, `FOR SHARE`, `FOR KEY SHARE`), even in a literal,
/// makes it not one.
pub(crate) fn is_plain_read(sql: &[u8]) -> bool {
    is_plain_read_marked(sql, || Marks::of(sql))
}

/// `is_plain_read`, with the text's marks (`Marks::of`) asked for only when its first word
/// and statement count leave the question open.
pub(crate) fn is_plain_read_marked(sql: &[u8], marks: impl FnOnce() -> Marks) -> bool {
    const READ: [&[u8]; 3] = [b"select", b"values", b"table"];
    let Some(w) = first_word(sql) else { return false };
    // (Each of these is one of `is_plain_dml`'s words.)
    READ.iter().any(|k| w.eq_ignore_ascii_case(k)) && one_statement(sql) && !marks().has(Marks::LOCKING)
}

/// The statement of a `PREPARE` definition ("(types) AS statement" or "AS statement").
pub(crate) fn prepare_body(def: &[u8]) -> Option<&[u8]> {
    let mut i = skip_ws(def, 0, def.len());
    if def.get(i) == Some(&b'(') {
        // Type names may hold parentheses of their own: numeric(10, 2).
        i = skip_ws(def, commands::paren_end(def, i, def.len())?, def.len());
    }
    let rest = def.get(i..)?;
    let w = first_word(rest)?;
    w.eq_ignore_ascii_case(b"as").then(|| &rest[2..])
}

/// Classifies a Query text.
pub(crate) fn classify(sql: &[u8]) -> Classified {
    classify_marked(sql, Marks::of(sql))
}

/// `classify`, with the text's marks (`Marks::of`).
pub(crate) fn classify_marked(sql: &[u8], marks: Marks) -> Classified {
    // Only a text with a word starting with one of the commands' keywords is split.
    if !marks.has(Marks::KEYWORD) {
        return Classified::Plain;
    }
    let mut stmts: Vec<(Range<usize>, Option<SqlStmt>)> = split(sql)
        .into_iter()
        .filter(|r| skip_ws(sql, r.start, r.end) < r.end)
        .map(|r| {
            let ours = commands::parse_one(sql, r.clone());
            (r, ours)
        })
        .collect();
    match (stmts.len(), stmts.iter().filter(|(_, s)| s.is_some()).count()) {
        (_, 0) => Classified::Plain,
        (1, 1) => match stmts.pop() {
            Some((_, Some(s))) => Classified::Single(s),
            _ => Classified::Plain,
        },
        _ => Classified::Multi(stmts),
    }
}

/// Byte ranges of the statements in `sql` (split at top-level semicolons, as the lexer
/// finds them: not inside quotes, dollar quotes or comments).
pub(crate) fn split(sql: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for t in lex::tokens(sql) {
        if t.kind == Kind::Punct(b';') {
            out.push(start..t.range.start);
            start = t.range.end;
        }
    }
    if start < sql.len() {
        out.push(start..sql.len());
    }
    out
}

/// Where the first token of `sql` starts: whitespace and comments skipped.
pub(crate) fn skip_space(sql: &[u8]) -> usize {
    skip_ws(sql, 0, sql.len())
}

/// The tokens of one statement, as written: whitespace and comments are skipped; a word
/// (keywords, names, dotted setting names, numbers, parameters: lexer tokens of those
/// kinds and `.` and `$` written together) is one token, a quoted identifier, string
/// literal or dollar-quoted string (prefix and quotes included) is one, and so is `::`;
/// any other byte is a token of its own. Keywords compare with `eq_ignore_ascii_case`.
/// The session's SET/BEGIN/COMMIT recognizer reads statements with it.
pub(crate) fn words(stmt: &[u8]) -> impl Iterator<Item = &[u8]> {
    fn glues(k: Kind) -> bool {
        matches!(k, Kind::Word | Kind::Number(_) | Kind::OddNumber | Kind::Param | Kind::Punct(b'.' | b'$'))
    }
    let mut toks = lex::solid(stmt).peekable();
    std::iter::from_fn(move || {
        let t = toks.next()?;
        let mut end = t.range.end;
        if glues(t.kind) {
            while let Some(n) = toks.next_if(|n| n.range.start == end && glues(n.kind)) {
                end = n.range.end;
            }
        }
        Some(&stmt[t.range.start..end])
    })
}

/// Where the first token at or after `i` starts (whitespace and comments skipped), or
/// `end`.
fn skip_ws(sql: &[u8], i: usize, end: usize) -> usize {
    if i >= end {
        return i;
    }
    i + lex::blank_len(&sql[i..end])
}

fn first_word(s: &[u8]) -> Option<&[u8]> {
    let i = skip_ws(s, 0, s.len());
    let j = s[i..].iter().position(|c| !c.is_ascii_alphabetic()).map_or(s.len(), |p| i + p);
    (j > i).then(|| &s[i..j])
}

mod commands;
pub(crate) mod listen;
mod marks;
mod session_state;
#[cfg(test)]
mod tests;

pub(crate) use marks::Marks;
#[cfg(test)]
pub(crate) use session_state::holds_session_state;
pub(crate) use session_state::{Seen, scan as session_state, scan_marked as session_state_marked};
