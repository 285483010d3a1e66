//! Numeric literals of a simple-protocol statement lifted into parameters, for
//! `autoprepare`: `SELECT abalance FROM pgbench_accounts WHERE aid = 4711` becomes
//! `… WHERE aid = $1` with one int4 parameter "4711", so that every such query shares one
//! cached statement (parsed and planned once per server connection).
//!
//! The prepared form must mean exactly what the literal form meant. PostgreSQL's scanner
//! types an integer literal int4 when it fits, else int8 when it fits, else numeric, and a
//! literal with a decimal point or an exponent numeric: each parameter is declared with the
//! type its literal would have had, so operator and function resolution, result types and
//! errors are the same. A literal is left in place (never wrong, only not shared) wherever
//! a parameter would mean something else or is not allowed:
//!
//! * `ORDER BY 1`, `DISTINCT ON (1)` (output column positions), up to the clause that ends
//!   them;
//! * where PostgreSQL's grammar (gram.y) takes a constant, not an expression: type
//!   modifiers and array bounds of a type name however it is written (`numeric(10, 2)`,
//!   `::"numeric"(5, 2)`, `::int[3]`, `interval second(3)`, `timestamp(3) '…'`,
//!   `mytype(3) '…'`, column definition lists), the precision of `CURRENT_TIME(3)` and its
//!   kin, the signed count of `FETCH FIRST -1 ROWS` / `OFFSET +1 ROWS`, a CTE's
//!   `CYCLE … TO 1 DEFAULT 0`; and before `[` or `.` (`$1[1]` subscripts a parameter,
//!   `1[1]` is a syntax error);
//! * an `ON CONFLICT` target (matched to an index as written: a parameter does not match
//!   under a generic plan);
//! * `-2147483648` and `-9223372036854775808`, leading zeros or not (PostgreSQL folds the
//!   minus into the literal, which then fits the smaller type);
//! * a numeric that might not convert (its error must be the parse's);
//! * anything that does not lex as a plain number (`0x1F`, `1_000`, `1e`, `12abc`).
//!
//! A statement whose `GROUP BY` holds a number, or with `DISTINCT` and a number in an
//! `ORDER BY` or `DISTINCT ON`, is not lifted: those lists are matched to other
//! expressions of the statement, and a literal lifted on one side only no longer matches.
//!
//! Only one data statement (SELECT, INSERT, UPDATE, DELETE, VALUES, WITH) is lifted, with no
//! parameter of its own, no `SELECT … INTO`, no `RETURNING` and no data-changing query
//! inside a `WITH` (see `lift`); strings are never lifted (an unknown-typed
//! parameter does not resolve as an unknown-typed literal does). Pure, no IO.

use std::ops::Range;

mod lex;
pub mod template;
mod words;

use lex::{Tok, literal_type, tokens};
use words::{AS_GROUP_OPENS, CONSTANT_GROUP_WORDS, DATA, LIST_END, NOT_ALIAS, TYPE_END};

/// int4, int8 and numeric type OIDs.
pub const INT4: u32 = 23;
pub const INT8: u32 = 20;
pub const NUMERIC: u32 = 1700;

/// A statement with its numeric literals lifted.
#[derive(Debug, PartialEq, Eq)]
pub struct Lifted {
    /// The text sent to the server: each lifted literal replaced by `$n`.
    pub text: Vec<u8>,
    /// Each parameter's type OID, in order.
    pub types: Vec<u32>,
    /// Each parameter's value: where its literal is in the client's text.
    pub values: Vec<Range<usize>>,
    /// Where the texts differ, in characters: (server start, server end, client start,
    /// client end), in order; for mapping error positions back.
    pub edits: Vec<[i64; 4]>,
}

/// A 1-based character position in the text sent to the server, in the client's text:
/// `edits` are (server start, server end, client start, client end) in characters, in
/// order, as `Lifted::edits`; a position inside a replaced span maps to the start of the
/// client's.
pub fn client_position(edits: &[[i64; 4]], p: i64) -> i64 {
    let q = p - 1;
    let mut delta = 0;
    for &[ss, se, cs, ce] in edits {
        if q < ss {
            break;
        }
        if q < se {
            return cs + 1;
        }
        delta = ce - se;
    }
    (q + delta + 1).max(1)
}

/// How a lifted text maps back to the client's, for what PostgreSQL says about it: error
/// positions, and the literals its placeholders stand for.
#[derive(Debug, Default)]
pub struct Origin {
    /// As `Lifted::edits`: one per lifted literal, in order.
    pub edits: Vec<[i64; 4]>,
    /// The lifted literals' texts one after another (the i-th is `edits[i][3] - edits[i][2]`
    /// bytes long: a plain number is ASCII, one byte a character).
    pub literals: Vec<u8>,
}

impl Origin {
    /// The origin of `l`, lifted from the client's text `client`.
    pub fn new(client: &[u8], l: &Lifted) -> Origin {
        let mut o = Origin::default();
        o.fill(client, &l.values, &l.edits);
        o
    }

    /// The origin of a lift of `client` whose literals are at `values` (`Lifted::values`,
    /// `Lifted::edits`), written over this one (its storage reused).
    pub fn fill(&mut self, client: &[u8], values: &[Range<usize>], edits: &[[i64; 4]]) {
        self.edits.clear();
        self.edits.extend_from_slice(edits);
        self.literals.clear();
        for r in values {
            self.literals.extend_from_slice(&client[r.clone()]);
        }
    }

    /// The client's position for the server's position `p` (see `client_position`).
    pub fn client_position(&self, p: i64) -> i64 {
        client_position(&self.edits, p)
    }

    /// A field of an error at the server's position `p` (message, detail, hint) as it reads
    /// for the client's text. PostgreSQL quotes the token at an error's position (`syntax
    /// error at or near "$2"`); where that token is the placeholder of a lifted literal, the
    /// client's query had the literal (`… near "2"`), which takes the placeholder's place.
    ///
    /// Rewritten rather than answered by replaying the client's Query unlifted after the
    /// failed Parse: inside a transaction block that Parse has already aborted the block, so
    /// the replay would get 25P02, not the error (and outside one it would cost a round trip
    /// for nothing). The rewrite is exact because a placeholder is one token wherever a
    /// lifted literal was one (where the grammar wants a constant, the literal stays), so
    /// PostgreSQL's error for the client's text is the same error at the same token.
    pub fn client_text<'a>(&self, p: i64, text: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        use std::borrow::Cow;
        let q = p - 1;
        let Some(i) = self.edits.iter().position(|&[ss, se, _, _]| ss <= q && q < se) else {
            return Cow::Borrowed(text);
        };
        let start: i64 = self.edits[..i].iter().map(|e| e[3] - e[2]).sum();
        let len = self.edits[i][3] - self.edits[i][2];
        let Some(literal) = usize::try_from(start)
            .ok()
            .zip(usize::try_from(start + len).ok())
            .and_then(|(a, b)| self.literals.get(a..b))
        else {
            return Cow::Borrowed(text);
        };
        let placeholder = format!("${}", i + 1).into_bytes();
        let mut out = Vec::with_capacity(text.len() + literal.len());
        let mut at = 0;
        let mut found = false;
        while let Some(j) = text[at..].windows(placeholder.len()).position(|w| w == placeholder.as_slice()) {
            let end = at + j + placeholder.len();
            out.extend_from_slice(&text[at..at + j]);
            // `$2` is not the start of `$21`.
            if text.get(end).is_some_and(u8::is_ascii_digit) {
                out.extend_from_slice(&placeholder);
            } else {
                out.extend_from_slice(literal);
                found = true;
            }
            at = end;
        }
        if !found {
            return Cow::Borrowed(text);
        }
        out.extend_from_slice(&text[at..]);
        Cow::Owned(out)
    }
}

/// A text rewritten from the client's by replacing byte ranges, in order, keeping the
/// character edits `client_position` maps error positions through. The one builder of
/// rewritten texts: lifted literals here, renamed and removed statements in
/// `session::stmts::script`.
pub(crate) struct Rewrite<'a> {
    client: &'a [u8],
    out: Vec<u8>,
    /// Client bytes consumed so far.
    copied: usize,
    client_chars: i64,
    server_chars: i64,
    edits: Vec<[i64; 4]>,
}

/// Characters (as PostgreSQL counts error positions) in a UTF-8 byte string: the bytes
/// that start one (not continuation bytes). No validation or copy on the per-query path;
/// text that is not UTF-8 never gets as far as an error position (the server refuses it).
fn char_len(b: &[u8]) -> i64 {
    b.iter().filter(|&&c| c & 0xC0 != 0x80).count() as i64
}

impl<'a> Rewrite<'a> {
    pub(crate) fn new(client: &'a [u8]) -> Rewrite<'a> {
        Rewrite {
            client,
            out: Vec::with_capacity(client.len() + 32),
            copied: 0,
            client_chars: 0,
            server_chars: 0,
            edits: Vec::new(),
        }
    }
    fn copy_to(&mut self, at: usize) {
        let chunk = &self.client[self.copied..at];
        let n = char_len(chunk);
        self.out.extend_from_slice(chunk);
        self.client_chars += n;
        self.server_chars += n;
        self.copied = at;
    }
    /// The client's bytes `range` (at or after what was consumed) are sent as `with`.
    pub(crate) fn replace(&mut self, range: Range<usize>, with: &[u8]) {
        self.copy_to(range.start);
        let (cs, ss) = (self.client_chars, self.server_chars);
        self.client_chars += char_len(&self.client[range.clone()]);
        self.server_chars += char_len(with);
        self.out.extend_from_slice(with);
        self.copied = range.end;
        self.edits.push([ss, self.server_chars, cs, self.client_chars]);
    }
    /// `with` is sent before the client's byte `at` (at or after what was consumed); returns
    /// the 0-based character position in the sent text where it starts.
    pub(crate) fn insert(&mut self, at: usize, with: &[u8]) -> i64 {
        self.copy_to(at);
        let starts = self.server_chars;
        self.replace(at..at, with);
        starts
    }
    /// The rewritten text and its edits.
    pub(crate) fn finish(mut self) -> (Vec<u8>, Vec<[i64; 4]>) {
        self.copy_to(self.client.len());
        (self.out, self.edits)
    }
}

/// At most this many literals are lifted (beyond, the statement is left as it is: a long
/// `IN (…)` list of varying length would make one statement per length anyway).
const MAX_PARAMS: usize = 64;

/// A list whose integer constants are output column positions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum List {
    Order,
    Group,
    DistinctOn,
}

/// Longest literal lifted, and largest exponent (`1e1000`): a literal beyond either might
/// not fit a numeric, and PostgreSQL's error for it then would come from the Bind (with a
/// context naming the parameter) instead of from the parse (with a position).
const MAX_LITERAL: usize = 1000;

/// Whether numeric_in surely takes `value` (a plain number) as it is.
fn fits_numeric(value: &[u8]) -> bool {
    if value.len() > MAX_LITERAL {
        return false;
    }
    match value.iter().position(|&c| c == b'e' || c == b'E') {
        None => true,
        Some(e) => {
            let exp = std::str::from_utf8(&value[e + 1..]).ok().and_then(|s| s.parse::<i64>().ok());
            exp.is_some_and(|x| x.abs() <= MAX_LITERAL as i64)
        }
    }
}

/// For each opening `(` or `[` token, the index of its closing token (usize::MAX if none).
fn closing(toks: &[(Tok, Range<usize>)]) -> Vec<usize> {
    let mut out = vec![usize::MAX; toks.len()];
    let mut open = Vec::new();
    for (k, (t, _)) in toks.iter().enumerate() {
        match t {
            Tok::Punct(b'(' | b'[') => open.push(k),
            Tok::Punct(b')' | b']') => {
                if let Some(o) = open.pop() {
                    out[o] = k;
                }
            }
            _ => {}
        }
    }
    out
}

/// The statement `sql` with its numeric literals lifted, or None when nothing is lifted
/// (not a data statement, several statements, a parameter of its own, `SELECT … INTO`, no
/// literal that can be lifted, or text that does not lex with confidence).
///
/// Which literals stay, and which statements are not lifted, is the module's doc.
pub fn lift(sql: &[u8], escapes_everywhere: bool) -> Option<Lifted> {
    // A data statement's first word, and a digit to lift: most texts that do not lift
    // (`END`, `SET …`) are told by these before the whole text is lexed into a list.
    let data = |t: crate::stmt::lex::Token| {
        t.closed
            && t.kind == crate::stmt::lex::Kind::Word
            && DATA.iter().any(|w| sql[t.range.clone()].eq_ignore_ascii_case(w))
    };
    if !crate::stmt::lex::solid(sql).next().is_some_and(data) || !sql.iter().any(u8::is_ascii_digit) {
        return None;
    }
    let toks = tokens(sql, escapes_everywhere)?;
    let is = |k: usize, w: &[u8]| {
        toks.get(k).is_some_and(|(t, r)| *t == Tok::Word && sql[r.clone()].eq_ignore_ascii_case(w))
    };
    let is_any = |k: usize, ws: &[&[u8]]| ws.iter().any(|w| is(k, w));
    let insert = is(0, b"insert");
    let with = is(0, b"with");
    // One statement: a `;` only at the very end.
    if let Some(k) = toks.iter().position(|(t, _)| *t == Tok::Punct(b';'))
        && toks[k + 1..].iter().any(|(t, _)| *t != Tok::Punct(b';'))
    {
        return None;
    }
    // XMLTABLE's COLUMNS name types without `::` or `AS` (`a mytype(3)`): not worth the risk.
    if (0..toks.len()).any(|k| is(k, b"xmltable")) {
        return None;
    }
    // `DISTINCT` (not `IS [NOT] DISTINCT FROM`): its select list is matched to ORDER BY.
    let distinct = (0..toks.len()).any(|k| {
        is(k, b"distinct")
            && !is(k.wrapping_sub(1), b"is")
            && !(is(k.wrapping_sub(1), b"not") && is(k.wrapping_sub(2), b"is"))
    });
    let closes = closing(&toks);
    let string_at = |k: usize| toks.get(k).is_some_and(|(t, _)| *t == Tok::Str);
    let quoted_name_at = |k: usize| toks.get(k).is_some_and(|(t, _)| *t == Tok::Name);
    let mut lift_at: Vec<(usize, u32)> = Vec::new();
    let mut depth: i32 = 0;
    // Lists of output column positions (ORDER BY, GROUP BY, DISTINCT ON) open, innermost
    // last, with the paren depth they end below.
    let mut lists: Vec<(i32, List)> = Vec::new();
    // Paren depths of groups that hold constants (type modifiers, array bounds, column
    // definition lists).
    let mut typmod: Vec<i32> = Vec::new();
    // After `::` or `AS`: the tokens of a type name (or an alias) follow.
    let mut in_type = false;
    // Between `ON CONFLICT` and `DO`: the arbiter's inference clause.
    let mut conflict = false;
    for (k, (t, r)) in toks.iter().enumerate() {
        match t {
            Tok::Param => return None,
            Tok::Word => {
                let w = &sql[r.clone()];
                if !insert && w.eq_ignore_ascii_case(b"into") {
                    return None;
                }
                // A statement that changes rows and returns some (`… RETURNING`, or a `WITH`
                // holding a data-changing query) runs to its end before PostgreSQL describes
                // its rows for a simple Query: one that fails sends no RowDescription, where
                // the prepared form's Describe has sent one already.
                if w.eq_ignore_ascii_case(b"returning")
                    || (with
                        && depth > 0
                        && [&b"insert"[..], b"update", b"delete", b"merge"].iter().any(|d| w.eq_ignore_ascii_case(d)))
                {
                    return None;
                }
                if in_type && TYPE_END.iter().any(|e| w.eq_ignore_ascii_case(e)) {
                    in_type = false;
                }
                // A type name goes on word by word (`double precision`, `character varying`).
                if in_type {
                    continue;
                }
                if w.eq_ignore_ascii_case(b"by") && (is(k.wrapping_sub(1), b"order") || is(k.wrapping_sub(1), b"group"))
                {
                    let list = if is(k - 1, b"order") { List::Order } else { List::Group };
                    lists.retain(|&(p, _)| p < depth);
                    lists.push((depth, list));
                } else if w.eq_ignore_ascii_case(b"on") && is(k.wrapping_sub(1), b"distinct") {
                    // Its list is the parenthesized group that follows.
                    lists.push((depth + 1, List::DistinctOn));
                } else if LIST_END.iter().any(|e| w.eq_ignore_ascii_case(e)) {
                    lists.retain(|&(p, _)| p < depth);
                }
                if w.eq_ignore_ascii_case(b"conflict") {
                    conflict = true;
                } else if w.eq_ignore_ascii_case(b"do") {
                    conflict = false;
                }
                if w.eq_ignore_ascii_case(b"as") {
                    in_type = true;
                    continue;
                }
            }
            // `::"numeric"(10, 2)`: a quoted type name.
            Tok::Name if in_type => continue,
            Tok::Cast => {
                in_type = true;
                continue;
            }
            Tok::Punct(b'(') | Tok::Punct(b'[') => {
                let paren = *t == Tok::Punct(b'(');
                let constants = if in_type && k > 0 && is_any(k - 1, &[b"as", b"materialized"]) {
                    // `AS (` opens a CTE's query or a window definition, or else a column
                    // definition list.
                    !(toks.get(k + 1).is_some_and(|(t, _)| *t == Tok::Punct(b'(')) || is_any(k + 1, &AS_GROUP_OPENS))
                } else {
                    in_type
                        || (k > 0 && is_any(k - 1, &CONSTANT_GROUP_WORDS))
                        // `"numeric"(10, 2)`: a quoted type name (or function name).
                        || (paren && quoted_name_at(k.wrapping_sub(1)))
                        // `f(…) t(a mytype(3))`: a column definition list.
                        || (paren
                            && k >= 2
                            && toks[k - 2].0 == Tok::Punct(b')')
                            && toks[k - 1].0 == Tok::Word
                            && !is_any(k - 1, &NOT_ALIAS))
                        // `mytype(3) 'value'`: a typed literal's type modifiers.
                        || (paren && closes[k].checked_add(1).is_some_and(string_at))
                };
                depth += 1;
                if constants {
                    typmod.push(depth);
                }
                in_type = false;
                continue;
            }
            Tok::Punct(b')') | Tok::Punct(b']') => {
                if typmod.last() == Some(&depth) {
                    typmod.pop();
                    // `::numeric(10, 2)[]`: what follows may still be the type's.
                    in_type = toks.get(k + 1).is_some_and(|(t, _)| *t == Tok::Punct(b'['));
                    if in_type {
                        depth -= 1;
                        continue;
                    }
                }
                depth -= 1;
                lists.retain(|&(p, _)| p <= depth);
            }
            Tok::Punct(b';') => lists.clear(),
            Tok::Punct(b'.') if in_type => continue,
            Tok::Number(integer) => {
                let value = &sql[r.clone()];
                // Glued to a word, string or number (`t.1` lexes as `t` and `.1`): what
                // PostgreSQL makes of it is not worth guessing.
                let glued = |o: Option<&(Tok, Range<usize>)>| {
                    o.is_some_and(|(t, q)| {
                        matches!(t, Tok::Word | Tok::Str | Tok::Name | Tok::Number(_) | Tok::OddNumber | Tok::Param)
                            && (q.end == r.start || q.start == r.end)
                    })
                };
                if glued(k.checked_sub(1).and_then(|j| toks.get(j))) || glued(toks.get(k + 1)) {
                    in_type = false;
                    continue;
                }
                if !lists.is_empty() {
                    // A position, or a number in an expression PostgreSQL may match to the
                    // select list's (see above).
                    if distinct || lists.iter().any(|&(_, l)| l == List::Group) {
                        return None;
                    }
                    in_type = false;
                    continue;
                }
                let prev = k.checked_sub(1).map(|j| toks[j].0);
                let signed = matches!(prev, Some(Tok::Punct(b'-' | b'+')));
                let negated = prev == Some(Tok::Punct(b'-'));
                // PostgreSQL folds a minus into the literal, which then fits the smaller type.
                let digits = &value[value.iter().take_while(|&&d| d == b'0').count()..];
                let boundary = *integer && (digits == b"2147483648" || digits == b"9223372036854775808");
                let keep = !typmod.is_empty()
                    || in_type
                    || conflict
                    || (negated && boundary)
                    // `FETCH FIRST -1 ROWS`, `OFFSET +1 ROWS`: a signed constant of the grammar.
                    || (signed && is_any(k.wrapping_sub(2), &[b"first", b"next", b"offset"]))
                    // A CTE's `CYCLE … SET c TO 1 DEFAULT 0`: constants only.
                    || is_any(k.wrapping_sub(1), &[b"to", b"default"])
                    // `$1[1]` and `$1.a` subscript and select from the parameter; `1[1]` and
                    // `1 .a` are syntax errors.
                    || toks.get(k + 1).is_some_and(|(t, _)| matches!(t, Tok::Punct(b'[' | b'.')))
                    || !fits_numeric(value);
                if !keep {
                    lift_at.push((k, literal_type(value, *integer)));
                }
            }
            _ => {}
        }
        in_type = false;
    }
    if lift_at.is_empty() || lift_at.len() > MAX_PARAMS {
        return None;
    }
    let mut rw = Rewrite::new(sql);
    let mut types = Vec::with_capacity(lift_at.len());
    let mut values = Vec::with_capacity(lift_at.len());
    for (n, (k, ty)) in lift_at.iter().enumerate() {
        let r = toks[*k].1.clone();
        rw.replace(r.clone(), format!("${}", n + 1).as_bytes());
        types.push(*ty);
        values.push(r);
    }
    let (text, edits) = rw.finish();
    Some(Lifted { text, types, values, edits })
}

#[cfg(test)]
mod tests;
