//! Recognizing PREPARE / EXECUTE / DEALLOCATE / DISCARD ALL in one statement of a Query
//! text (`classify` in `stmt::sql` splits the text): what each is, the statement name and
//! where it is written. Reads the text through `stmt::lex` (via `skip_ws`).

use super::{SqlStmt, skip_ws};
use crate::stmt::lex::{self, Kind};
use std::ops::Range;

/// Reads an identifier at `i`: (name as PostgreSQL sees it, end offset).
fn ident(sql: &[u8], i: usize, end: usize) -> Option<(Vec<u8>, usize)> {
    if i >= end {
        return None;
    }
    if sql[i] == b'"' {
        let mut name = Vec::new();
        let mut j = i + 1;
        while j < end {
            if sql[j] == b'"' {
                if j + 1 < end && sql[j + 1] == b'"' {
                    name.push(b'"');
                    j += 2;
                    continue;
                }
                return (!name.is_empty()).then_some((name, j + 1));
            }
            name.push(sql[j]);
            j += 1;
        }
        return None;
    }
    let c = sql[i];
    if !(c.is_ascii_alphabetic() || c == b'_' || c >= 0x80) {
        return None;
    }
    let mut j = i;
    while j < end && (sql[j].is_ascii_alphanumeric() || sql[j] == b'_' || sql[j] == b'$' || sql[j] >= 0x80) {
        j += 1;
    }
    Some((sql[i..j].to_ascii_lowercase(), j))
}

fn keyword_at(sql: &[u8], i: usize, end: usize, kw: &[u8]) -> Option<usize> {
    let j = i + kw.len();
    (j <= end
        && sql[i..j].eq_ignore_ascii_case(kw)
        && sql.get(j).is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'_') || j == end))
    .then_some(j)
}

pub(super) fn parse_one(sql: &[u8], r: Range<usize>) -> Option<SqlStmt> {
    let end = r.end;
    let i = skip_ws(sql, r.start, end);
    if matches!(sql.get(i), Some(b'l' | b'L' | b'u' | b'U')) {
        return super::listen::parse_listen(&sql[i..end]).map(SqlStmt::Listen);
    }
    if let Some(j) = keyword_at(sql, i, end, b"deallocate") {
        let mut k = skip_ws(sql, j, end);
        if let Some(j2) = keyword_at(sql, k, end, b"prepare") {
            k = skip_ws(sql, j2, end);
        }
        if let Some(j3) = keyword_at(sql, k, end, b"all") {
            return (skip_ws(sql, j3, end) == end).then_some(SqlStmt::Deallocate(None));
        }
        let (name, j4) = ident(sql, k, end)?;
        return (skip_ws(sql, j4, end) == end).then_some(SqlStmt::Deallocate(Some(name)));
    }
    if let Some(j) = keyword_at(sql, i, end, b"discard") {
        let k = skip_ws(sql, j, end);
        let j2 = keyword_at(sql, k, end, b"all")?;
        return (skip_ws(sql, j2, end) == end).then_some(SqlStmt::DiscardAll);
    }
    if let Some(j) = keyword_at(sql, i, end, b"prepare") {
        let k = skip_ws(sql, j, end);
        // PREPARE TRANSACTION is two-phase commit, not ours.
        if keyword_at(sql, k, end, b"transaction").is_some() {
            return None;
        }
        let (name, j2) = ident(sql, k, end)?;
        let rest = skip_ws(sql, j2, end);
        if rest < end && (sql[rest] == b'(' || keyword_at(sql, rest, end, b"as").is_some()) {
            return Some(SqlStmt::Prepare { name, rest });
        }
        return None;
    }
    if let Some(j) = keyword_at(sql, i, end, b"execute") {
        return execute_at(sql, j, end);
    }
    if let Some(j) = keyword_at(sql, i, end, b"explain") {
        return execute_at(sql, explain_options_end(sql, j, end)?, end);
    }
    if let Some(j) = keyword_at(sql, i, end, b"create") {
        return execute_at(sql, table_as_execute(sql, j, end)?, end);
    }
    None
}

/// The name after `EXECUTE` (whose keyword ends at `j`).
fn execute_at(sql: &[u8], j: usize, end: usize) -> Option<SqlStmt> {
    let k = skip_ws(sql, j, end);
    let (name, j2) = ident(sql, k, end)?;
    Some(SqlStmt::Execute { name, span: k..j2 })
}

/// `EXPLAIN [(options)] [ANALYZE] [VERBOSE] EXECUTE`: where `EXECUTE` ends (after `explain`
/// at `j`), if that is what follows.
fn explain_options_end(sql: &[u8], j: usize, end: usize) -> Option<usize> {
    let mut k = skip_ws(sql, j, end);
    if sql.get(k) == Some(&b'(') {
        k = skip_ws(sql, paren_end(sql, k, end)?, end);
    }
    while let Some(j2) = [&b"analyze"[..], b"analyse", b"verbose"].iter().find_map(|w| keyword_at(sql, k, end, w)) {
        k = skip_ws(sql, j2, end);
    }
    keyword_at(sql, k, end, b"execute")
}

/// `CREATE [GLOBAL | LOCAL] [TEMP | TEMPORARY | UNLOGGED] TABLE … AS EXECUTE` (after
/// `create` at `j`): where `EXECUTE` ends. Scans to the first top-level `AS` only (what
/// follows one that is not `EXECUTE` is a query, not ours).
fn table_as_execute(sql: &[u8], j: usize, end: usize) -> Option<usize> {
    let mut k = skip_ws(sql, j, end);
    for w in [&b"global"[..], b"local", b"temporary", b"temp", b"unlogged"] {
        if let Some(j2) = keyword_at(sql, k, end, w) {
            k = skip_ws(sql, j2, end);
        }
    }
    k = keyword_at(sql, k, end, b"table")?;
    while k < end {
        k = skip_ws(sql, k, end);
        match sql.get(k)? {
            b'(' => k = paren_end(sql, k, end)?,
            b'"' => k = ident(sql, k, end)?.1,
            b'\'' | b'$' => return None,
            c if c.is_ascii_alphabetic() || *c == b'_' || *c >= 0x80 => {
                if let Some(j2) = keyword_at(sql, k, end, b"as") {
                    return keyword_at(sql, skip_ws(sql, j2, end), end, b"execute");
                }
                k = ident(sql, k, end)?.1;
            }
            _ => k += 1,
        }
    }
    None
}

/// Just past the `)` closing the `(` at `i` (nested parentheses, and any in quotes or
/// comments, skipped).
pub(super) fn paren_end(sql: &[u8], i: usize, end: usize) -> Option<usize> {
    let mut depth = 0usize;
    for t in lex::tokens(&sql[i..end]) {
        match t.kind {
            Kind::Punct(b'(') => depth += 1,
            Kind::Punct(b')') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + t.range.end);
                }
            }
            _ => {}
        }
    }
    None
}
