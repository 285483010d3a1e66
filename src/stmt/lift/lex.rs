//! The lifter's view of a statement's tokens (read from `stmt::lex`, the one SQL lexer),
//! as far as finding its numeric literals (and what they are glued to) needs, and the type
//! the scanner gives a numeric literal.

use super::{INT4, INT8, NUMERIC};
use crate::stmt::lex::{self, Kind};
use std::ops::Range;

/// One token of the statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    /// A keyword or unquoted identifier (lower-case comparison by the caller).
    Word,
    /// A string (with its prefix: `E'…'`, `B'…'`, `X'…'`, `U&'…'`) or dollar-quoted string.
    Str,
    /// A quoted identifier (`"…"`, `U&"…"`).
    Name,
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
/// comment, a `$` that is neither a parameter nor a dollar quote, or backslashes in a
/// string under `escapes_everywhere`: standard_conforming_strings off).
pub(super) fn tokens(sql: &[u8], escapes_everywhere: bool) -> Option<Vec<(Tok, Range<usize>)>> {
    // About one token in four bytes of the usual query: one allocation.
    let mut out = Vec::with_capacity((sql.len() / 4 + 4).min(256));
    let mut lexer = lex::tokens(sql);
    while let Some(t) = lexer.next_solid() {
        if !t.closed {
            return None;
        }
        let tok = match t.kind {
            Kind::Space | Kind::Comment => continue,
            Kind::Word => Tok::Word,
            Kind::Str => {
                // A plain string whose backslashes are escapes here: not worth the risk.
                if escapes_everywhere
                    && !sql[t.range.start].eq_ignore_ascii_case(&b'e')
                    && sql[t.range.clone()].contains(&b'\\')
                {
                    return None;
                }
                Tok::Str
            }
            Kind::Dollar => Tok::Str,
            Kind::Ident => Tok::Name,
            Kind::Number(integer) => Tok::Number(integer),
            Kind::OddNumber => Tok::OddNumber,
            Kind::Param => Tok::Param,
            Kind::Cast => Tok::Cast,
            Kind::Punct(b'$') => return None,
            Kind::Punct(c) => Tok::Punct(c),
        };
        out.push((tok, t.range));
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
