//! The lexer of `stmt::lift`: a statement's tokens as PostgreSQL's scanner reads them,
//! as far as finding its numeric literals (and what they are glued to) needs, and the type
//! the scanner gives a numeric literal.

use super::{INT4, INT8, NUMERIC};
use std::ops::Range;

/// One token of the statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    /// A keyword or unquoted identifier (lower-case comparison by the caller).
    Word,
    /// A quoted identifier, string, dollar-quoted string, or bit/hex string.
    Quoted,
    /// A number as PostgreSQL's scanner reads one: integer (true) or not.
    Number(bool),
    /// Something that looks like a number but is not a plain one (`0x1F`, `1_000`, `1e`).
    OddNumber,
    /// `$1`: a parameter of the client's own.
    Param,
    /// `::`.
    Cast,
    /// Any other byte: an operator or punctuation character.
    Punct(u8),
}

/// Lexes `sql`; None when it cannot be lexed with confidence (an unterminated quote or
/// comment, or backslashes under `escapes_everywhere`: standard_conforming_strings off).
pub(super) fn tokens(sql: &[u8], escapes_everywhere: bool) -> Option<Vec<(Tok, Range<usize>)>> {
    let n = sql.len();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
    while i < n {
        let c = sql[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'-' && sql.get(i + 1) == Some(&b'-') {
            while i < n && sql[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && sql.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            loop {
                if i + 1 >= n {
                    return None;
                }
                if sql[i] == b'/' && sql[i + 1] == b'*' {
                    depth += 1;
                    i += 2;
                } else if sql[i] == b'*' && sql[i + 1] == b'/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            continue;
        }
        if c == b'\'' || c == b'"' {
            // E'…' (the E is the previous Word token, of one letter): backslash escapes.
            let e_string = c == b'\''
                && out.last().is_some_and(|(t, r): &(Tok, Range<usize>)| {
                    *t == Tok::Word && r.end == i && r.len() == 1 && sql[r.start].eq_ignore_ascii_case(&b'e')
                });
            i = crate::stmt::sql::quoted_end(sql, start, e_string)?;
            if escapes_everywhere && c == b'\'' && !e_string && sql[start..i].contains(&b'\\') {
                // A plain string whose backslashes are escapes here: not worth the risk.
                return None;
            }
            if e_string || matches!(out.last(), Some((Tok::Word, r)) if r.end == start) {
                // The prefix (E, B, X, U&, N) belongs to the literal.
                out.pop();
            }
            out.push((Tok::Quoted, start..i));
            continue;
        }
        if c == b'$' {
            if sql.get(i + 1).is_some_and(u8::is_ascii_digit) {
                i += 1;
                while i < n && sql[i].is_ascii_digit() {
                    i += 1;
                }
                out.push((Tok::Param, start..i));
                continue;
            }
            // A dollar quote: $tag$ … $tag$.
            let tag_end = sql[i + 1..].iter().position(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80));
            let t = tag_end?;
            if sql[i + 1 + t] != b'$' {
                return None;
            }
            let tag = &sql[i..i + t + 2];
            let body = i + t + 2;
            let p = sql[body..].windows(tag.len()).position(|w| w == tag)?;
            i = body + p + tag.len();
            out.push((Tok::Quoted, start..i));
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && sql.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let mut integer = true;
            while i < n && sql[i].is_ascii_digit() {
                i += 1;
            }
            if i < n && sql[i] == b'.' && sql.get(i + 1) != Some(&b'.') {
                integer = false;
                i += 1;
                while i < n && sql[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let mut odd = false;
            if i < n && (sql[i] == b'e' || sql[i] == b'E') {
                integer = false;
                let mut j = i + 1;
                if j < n && (sql[j] == b'+' || sql[j] == b'-') {
                    j += 1;
                }
                if j < n && sql[j].is_ascii_digit() {
                    while j < n && sql[j].is_ascii_digit() {
                        j += 1;
                    }
                    i = j;
                } else {
                    odd = true;
                }
            }
            // Letters, `_` or another `.` right after: not a plain number (0x1F, 1_000, 12abc).
            while i < n && (word(sql[i]) || sql[i] == b'.') {
                odd = true;
                i += 1;
            }
            out.push((if odd { Tok::OddNumber } else { Tok::Number(integer) }, start..i));
            continue;
        }
        if word(c) {
            while i < n && word(sql[i]) {
                i += 1;
            }
            out.push((Tok::Word, start..i));
            continue;
        }
        if c == b':' && sql.get(i + 1) == Some(&b':') {
            out.push((Tok::Cast, i..i + 2));
            i += 2;
            continue;
        }
        out.push((Tok::Punct(c), i..i + 1));
        i += 1;
    }
    Some(out)
}

/// The type PostgreSQL's scanner gives the literal `digits` (an integer, or not).
pub(super) fn literal_type(text: &[u8], integer: bool) -> u32 {
    if !integer {
        return NUMERIC;
    }
    let digits = text.iter().skip_while(|&&d| d == b'0').count();
    if digits > 19 {
        return NUMERIC;
    }
    let v: u128 = text.iter().fold(0u128, |a, &d| a * 10 + u128::from(d - b'0'));
    if v <= i32::MAX as u128 {
        INT4
    } else if v <= i64::MAX as u128 {
        INT8
    } else {
        NUMERIC
    }
}
