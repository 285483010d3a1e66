//! The one SQL lexer of the pooler: a statement text cut into tokens as PostgreSQL's
//! scanner (scan.l) cuts it, as far as the pooler reads SQL. It owns what comments
//! (`--` to the end of the line, nested `/* */`), quoted identifiers (`"…"`, `U&"…"`),
//! string literals (`'…'` with standard_conforming_strings on, `E'…'` with backslash
//! escapes, `B'…'`, `X'…'`, `N'…'`, `U&'…'`), dollar quotes (`$tag$…$tag$`, where `$1` is a
//! parameter, not a quote, and a `$` inside a word is part of the word), numbers,
//! parameters, `::` and other punctuation are. The statement splitter and the classifiers
//! (`stmt::sql`) and the literal lifter (`stmt::lift`) all read their tokens from here.
//!
//! Every byte of the input is in exactly one token, whitespace and comments included, in
//! order; an unterminated quote or comment is one token running to the end, marked not
//! `closed`. The lexer is an iterator over byte ranges: it allocates nothing.

use std::ops::Range;

/// What a token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Whitespace (as PostgreSQL's `space`: ` `, `\t`, `\n`, `\r`, `\f`).
    Space,
    /// A `--` comment (to the end of the line, the newline excluded) or a `/* */` one.
    Comment,
    /// A keyword or unquoted identifier (letters, digits, `_`, `$`, non-ASCII bytes; not
    /// starting with a digit or `$`). Compare with `eq_ignore_ascii_case`.
    Word,
    /// A quoted identifier `"…"` or `U&"…"`.
    Ident,
    /// A string literal `'…'`, with its prefix if any (`E`, `B`, `X`, `N`, `U&`).
    Str,
    /// A dollar-quoted string `$tag$…$tag$`.
    Dollar,
    /// A number as PostgreSQL's scanner reads one: integer (true) or not.
    Number(bool),
    /// Something that looks like a number but is not a plain one (`0x1F`, `1_000`, `1e`,
    /// `12abc`).
    OddNumber,
    /// `$1`: a parameter.
    Param,
    /// `::`.
    Cast,
    /// Any other byte: an operator or punctuation character (`;`, `(`, a lone `$`, …).
    Punct(u8),
}

/// One token: what it is and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) kind: Kind,
    pub(crate) range: Range<usize>,
    /// False for a quote or `/*` comment the input ends inside of.
    pub(crate) closed: bool,
}

impl Token {
    /// Whitespace or a comment: what PostgreSQL's grammar never sees.
    pub(crate) fn is_blank(&self) -> bool {
        matches!(self.kind, Kind::Space | Kind::Comment)
    }
}

/// The tokens of `sql`, whitespace and comments included.
pub(crate) fn tokens(sql: &[u8]) -> Lexer<'_> {
    Lexer { sql, i: 0 }
}

/// The tokens of `sql` the grammar sees: whitespace and comments left out.
pub(crate) fn solid(sql: &[u8]) -> impl Iterator<Item = Token> + '_ {
    let mut lexer = tokens(sql);
    std::iter::from_fn(move || lexer.next_solid()).filter(|t| !t.is_blank())
}

/// The iterator of `tokens`.
#[derive(Clone)]
pub(crate) struct Lexer<'a> {
    sql: &'a [u8],
    i: usize,
}

/// Byte classes: bit 0 continues a word, bit 1 starts one, bit 2 is whitespace.
const WORD_CONT: u8 = 1;
const WORD_START: u8 = 2;
const SPACE: u8 = 4;
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            t[b] = WORD_CONT | WORD_START;
        } else if c.is_ascii_digit() || c == b'$' {
            t[b] = WORD_CONT;
        } else if c.is_ascii_whitespace() {
            t[b] = SPACE;
        }
        b += 1;
    }
    t
};

fn class(c: u8) -> u8 {
    CLASS[c as usize]
}

/// A byte of a dollar quote's tag (a word byte but `$`).
fn tag_byte(c: u8) -> bool {
    c != b'$' && class(c) & WORD_CONT != 0
}

/// If a comment starts at `start`: where it ends, and whether it is closed. `--` runs to
/// the end of the line (`\n` or `\r`, not included); `/* */` nest.
fn comment_end(sql: &[u8], start: usize) -> Option<(usize, bool)> {
    let n = sql.len();
    match (sql[start], sql.get(start + 1)) {
        (b'-', Some(b'-')) => {
            let i = sql[start..].iter().position(|&b| b == b'\n' || b == b'\r').map_or(n, |p| start + p);
            Some((i, true))
        }
        (b'/', Some(b'*')) => {
            let mut depth = 1usize;
            let mut i = start + 2;
            loop {
                if i + 1 >= n {
                    return Some((n, false));
                }
                if sql[i] == b'/' && sql[i + 1] == b'*' {
                    depth += 1;
                    i += 2;
                } else if sql[i] == b'*' && sql[i + 1] == b'/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        return Some((i, true));
                    }
                } else {
                    i += 1;
                }
            }
        }
        _ => None,
    }
}

/// How many bytes of whitespace and comments `sql` starts with (all of it when it ends
/// inside a comment): where its first token the grammar sees starts. Cheaper than
/// `solid(sql).next()`, which would scan that token too.
#[inline]
pub(crate) fn blank_len(sql: &[u8]) -> usize {
    let mut i = 0;
    while let Some(&c) = sql.get(i) {
        if class(c) & SPACE != 0 {
            i += 1;
        } else if (c == b'-' || c == b'/')
            && let Some((end, _)) = comment_end(sql, i)
        {
            i = end;
        } else {
            break;
        }
    }
    i
}

impl Lexer<'_> {
    /// The next token the grammar sees, skipping whitespace and comments without making
    /// tokens of them; but a comment the input ends inside of is returned (not `closed`),
    /// for callers that must know.
    #[inline]
    pub(crate) fn next_solid(&mut self) -> Option<Token> {
        let sql = self.sql;
        loop {
            while self.i < sql.len() && class(sql[self.i]) & SPACE != 0 {
                self.i += 1;
            }
            let &c = sql.get(self.i)?;
            if (c == b'-' || c == b'/')
                && let Some((end, closed)) = comment_end(sql, self.i)
            {
                let start = self.i;
                self.i = end;
                if !closed {
                    return Some(Token { kind: Kind::Comment, range: start..end, closed });
                }
                continue;
            }
            return self.next();
        }
    }

    /// Where the quoted text whose opening quote (`'` or `"`) is at `open` ends, and
    /// whether it is closed: a doubled quote stands for one; with `escapes` a backslash
    /// escapes the byte after it.
    fn quoted(&self, open: usize, escapes: bool) -> (usize, bool) {
        let sql = self.sql;
        let q = sql[open];
        let mut i = open + 1;
        while i < sql.len() {
            let c = sql[i];
            if escapes && c == b'\\' {
                i += 2;
                continue;
            }
            if c == q {
                if sql.get(i + 1) == Some(&q) {
                    i += 2;
                    continue;
                }
                return (i + 1, true);
            }
            i += 1;
        }
        (sql.len(), false)
    }

    fn number(&self, start: usize) -> (Kind, usize) {
        let sql = self.sql;
        let n = sql.len();
        let mut i = start;
        let mut integer = true;
        while i < n && sql[i].is_ascii_digit() {
            i += 1;
        }
        // `1..10`: an integer before `..`.
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
        // Word bytes or another `.` right after: not a plain number.
        while i < n && (class(sql[i]) & WORD_CONT != 0 || sql[i] == b'.') {
            odd = true;
            i += 1;
        }
        (if odd { Kind::OddNumber } else { Kind::Number(integer) }, i)
    }
}

impl Iterator for Lexer<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        let sql = self.sql;
        let n = sql.len();
        let start = self.i;
        let &c = sql.get(start)?;
        let next = sql.get(start + 1).copied();
        let mut closed = true;
        let (kind, end) = match c {
            _ if class(c) & SPACE != 0 => {
                let mut i = start + 1;
                while i < n && class(sql[i]) & SPACE != 0 {
                    i += 1;
                }
                (Kind::Space, i)
            }
            b'-' | b'/' if let Some((i, ok)) = comment_end(sql, start) => {
                closed = ok;
                (Kind::Comment, i)
            }
            b'\'' | b'"' => {
                let (i, ok) = self.quoted(start, false);
                closed = ok;
                (if c == b'"' { Kind::Ident } else { Kind::Str }, i)
            }
            b'$' => match next {
                Some(d) if d.is_ascii_digit() => {
                    let i = sql[start + 1..].iter().position(|b| !b.is_ascii_digit()).map_or(n, |p| start + 1 + p);
                    (Kind::Param, i)
                }
                _ => {
                    let t = sql[start + 1..].iter().position(|&b| !tag_byte(b)).map_or(n, |p| start + 1 + p);
                    if t < n && sql[t] == b'$' {
                        let tag = &sql[start..=t];
                        match sql[t + 1..].windows(tag.len()).position(|w| w == tag) {
                            Some(p) => (Kind::Dollar, t + 1 + p + tag.len()),
                            None => {
                                closed = false;
                                (Kind::Dollar, n)
                            }
                        }
                    } else {
                        (Kind::Punct(b'$'), start + 1)
                    }
                }
            },
            b'0'..=b'9' => self.number(start),
            b'.' if next.is_some_and(|d| d.is_ascii_digit()) => self.number(start),
            b':' if next == Some(b':') => (Kind::Cast, start + 2),
            _ if class(c) & WORD_START != 0 => {
                // A string's prefix: E'…' (backslash escapes), B'…', X'…', N'…', U&'…',
                // and U&"…" for an identifier.
                let lower = c | 0x20;
                if next == Some(b'\'') && matches!(lower, b'e' | b'b' | b'x' | b'n') {
                    let (i, ok) = self.quoted(start + 1, lower == b'e');
                    closed = ok;
                    (Kind::Str, i)
                } else if lower == b'u' && next == Some(b'&') && matches!(sql.get(start + 2), Some(b'\'' | b'"')) {
                    let (i, ok) = self.quoted(start + 2, false);
                    closed = ok;
                    (if sql[start + 2] == b'"' { Kind::Ident } else { Kind::Str }, i)
                } else {
                    let i =
                        sql[start + 1..].iter().position(|&b| class(b) & WORD_CONT == 0).map_or(n, |p| start + 1 + p);
                    (Kind::Word, i)
                }
            }
            _ => (Kind::Punct(c), start + 1),
        };
        // An escape at the very end (`E'\`) would point past it.
        let end = end.min(n);
        self.i = end;
        Some(Token { kind, range: start..end, closed })
    }
}

#[cfg(test)]
mod tests;
