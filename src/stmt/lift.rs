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
//! * `ORDER BY 1`, `GROUP BY 1`, `DISTINCT ON (1)` (output column positions), up to the
//!   clause that ends them;
//! * type modifiers and array bounds of a type name (`numeric(10, 2)`, `varchar(8)`,
//!   `::int[3]`, `interval second(3)`, after `::` or `AS`);
//! * `-2147483648` and `-9223372036854775808` (PostgreSQL folds the minus into the literal,
//!   which then fits the smaller type);
//! * anything that does not lex as a plain number (`0x1F`, `1_000`, `1e`, `12abc`).
//!
//! Only one data statement (SELECT, INSERT, UPDATE, DELETE, VALUES, WITH) is lifted, with no
//! parameter of its own, no `SELECT … INTO`, no `RETURNING` and no data-changing query
//! inside a `WITH` (see `lift`); strings are never lifted (an unknown-typed
//! parameter does not resolve as an unknown-typed literal does). Pure, no IO.

use std::ops::Range;

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
    /// The rewritten text and its edits.
    pub(crate) fn finish(mut self) -> (Vec<u8>, Vec<[i64; 4]>) {
        self.copy_to(self.client.len());
        (self.out, self.edits)
    }
}

/// At most this many literals are lifted (beyond, the statement is left as it is: a long
/// `IN (…)` list of varying length would make one statement per length anyway).
const MAX_PARAMS: usize = 64;

/// Words after which a parenthesized group holds a type modifier.
const TYPMOD_WORDS: [&[u8]; 17] = [
    b"numeric",
    b"decimal",
    b"dec",
    b"varchar",
    b"char",
    b"character",
    b"bpchar",
    b"varying",
    b"bit",
    b"varbit",
    b"float",
    b"time",
    b"timetz",
    b"timestamp",
    b"timestamptz",
    b"interval",
    b"second",
];

/// Clause keywords that end an `ORDER BY` / `GROUP BY` / `DISTINCT ON` list.
const LIST_END: [&[u8]; 12] = [
    b"limit",
    b"offset",
    b"fetch",
    b"having",
    b"window",
    b"union",
    b"intersect",
    b"except",
    b"for",
    b"returning",
    b"select",
    b"from",
];

/// Statements whose literals may be lifted.
const DATA: [&[u8]; 6] = [b"select", b"insert", b"update", b"delete", b"values", b"with"];

/// One token of the statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
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
fn tokens(sql: &[u8], escapes_everywhere: bool) -> Option<Vec<(Tok, Range<usize>)>> {
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
            i = super::sql::quoted_end(sql, start, e_string)?;
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
fn literal_type(text: &[u8], integer: bool) -> u32 {
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

/// The statement `sql` with its numeric literals lifted, or None when nothing is lifted
/// (not a data statement, several statements, a parameter of its own, `SELECT … INTO`, no
/// literal that can be lifted, or text that does not lex with confidence).
pub fn lift(sql: &[u8], escapes_everywhere: bool) -> Option<Lifted> {
    let toks = tokens(sql, escapes_everywhere)?;
    let is = |k: usize, w: &[u8]| {
        toks.get(k).is_some_and(|(t, r)| *t == Tok::Word && sql[r.clone()].eq_ignore_ascii_case(w))
    };
    let first = toks.first()?;
    if first.0 != Tok::Word || !DATA.iter().any(|w| sql[first.1.clone()].eq_ignore_ascii_case(w)) {
        return None;
    }
    let insert = is(0, b"insert");
    let with = is(0, b"with");
    // One statement: a `;` only at the very end.
    if let Some(k) = toks.iter().position(|(t, _)| *t == Tok::Punct(b';'))
        && toks[k + 1..].iter().any(|(t, _)| *t != Tok::Punct(b';'))
    {
        return None;
    }
    let mut lift_at: Vec<(usize, u32)> = Vec::new();
    let mut depth: i32 = 0;
    // Paren depth at which a positional list (ORDER BY, GROUP BY, DISTINCT ON) started.
    let mut positional: Option<i32> = None;
    // Paren depths of groups that hold type modifiers or array bounds.
    let mut typmod: Vec<i32> = Vec::new();
    // After `::` or `AS`: the tokens of a type name follow.
    let mut in_type = false;
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
                if (w.eq_ignore_ascii_case(b"by")
                    && (is(k.wrapping_sub(1), b"order") || is(k.wrapping_sub(1), b"group")))
                    || (w.eq_ignore_ascii_case(b"on") && is(k.wrapping_sub(1), b"distinct"))
                {
                    positional = Some(depth);
                } else if positional.is_some() && LIST_END.iter().any(|e| w.eq_ignore_ascii_case(e)) {
                    positional = None;
                }
                if w.eq_ignore_ascii_case(b"as") {
                    in_type = true;
                    continue;
                }
                // A type name goes on word by word (`double precision`, `character varying`).
                if in_type {
                    continue;
                }
            }
            Tok::Cast => {
                in_type = true;
                continue;
            }
            Tok::Punct(b'(') | Tok::Punct(b'[') => {
                // `AS (` and `AS [NOT] MATERIALIZED (` open a query (a CTE), not a type's group.
                if in_type && k > 0 && [&b"as"[..], b"materialized"].iter().any(|w| is(k - 1, w)) {
                    in_type = false;
                }
                let prev_typmod = k > 0
                    && toks[k - 1].0 == Tok::Word
                    && TYPMOD_WORDS.iter().any(|w| sql[toks[k - 1].1.clone()].eq_ignore_ascii_case(w));
                depth += 1;
                if in_type || prev_typmod || (*t == Tok::Punct(b'[') && typmod.last() == Some(&(depth - 1))) {
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
                if positional.is_some_and(|p| depth < p) {
                    positional = None;
                }
            }
            Tok::Punct(b';') => positional = None,
            Tok::Punct(b'.') if in_type => continue,
            Tok::Number(integer) => {
                let value = &sql[r.clone()];
                let negated = k > 0 && toks[k - 1].0 == Tok::Punct(b'-');
                // Glued to a word, string or number (`t.1` lexes as `t` and `.1`): what
                // PostgreSQL makes of it is not worth guessing.
                let glued = |o: Option<&(Tok, Range<usize>)>| {
                    o.is_some_and(|(t, q)| {
                        matches!(t, Tok::Word | Tok::Quoted | Tok::Number(_) | Tok::OddNumber | Tok::Param)
                            && (q.end == r.start || q.start == r.end)
                    })
                };
                if glued(k.checked_sub(1).and_then(|j| toks.get(j))) || glued(toks.get(k + 1)) {
                    in_type = false;
                    continue;
                }
                let boundary = *integer && (value == b"2147483648" || value == b"9223372036854775808");
                let inside_typmod = typmod.last().is_some_and(|&d| d == depth);
                let keep = positional.is_some() || inside_typmod || in_type || (negated && boundary);
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
mod tests {
    use super::*;

    fn lifted(sql: &str) -> Option<(String, Vec<u32>, Vec<String>)> {
        lift(sql.as_bytes(), false).map(|l| {
            let values = l.values.iter().map(|r| sql[r.clone()].to_owned()).collect();
            (String::from_utf8(l.text).unwrap(), l.types, values)
        })
    }

    #[test]
    fn statements_that_change_rows_and_return_some_are_left_alone() {
        assert_eq!(lifted("INSERT INTO t VALUES (1) RETURNING id"), None);
        assert_eq!(lifted("UPDATE t SET a = 2 WHERE id = 1 RETURNING *"), None);
        assert_eq!(lifted("WITH d AS (DELETE FROM t WHERE id = 3) SELECT 1"), None);
        assert!(lifted("INSERT INTO t VALUES (1)").is_some());
        assert!(lifted("WITH c AS (SELECT 1 AS x) SELECT x + 2 FROM c").is_some());
        assert!(lifted("WITH c AS (SELECT 1 AS x) DELETE FROM t WHERE a IN (SELECT x FROM c)").is_some());
    }

    #[test]
    fn integers_typed_as_the_scanner_types_them() {
        assert_eq!(
            lifted("SELECT abalance FROM pgbench_accounts WHERE aid = 4711;"),
            Some(("SELECT abalance FROM pgbench_accounts WHERE aid = $1;".into(), vec![INT4], vec!["4711".into()]))
        );
        let (t, ty, v) =
            lifted("select 2147483647, 2147483648, 9223372036854775807, 9223372036854775808, 007").unwrap();
        assert_eq!(t, "select $1, $2, $3, $4, $5");
        assert_eq!(ty, [INT4, INT8, INT8, NUMERIC, INT4]);
        assert_eq!(v, ["2147483647", "2147483648", "9223372036854775807", "9223372036854775808", "007"]);
        let (t, ty, _) = lifted("select 1.5, .5, 1., 1e3, 2.5E-3").unwrap();
        assert_eq!(t, "select $1, $2, $3, $4, $5");
        assert_eq!(ty, [NUMERIC; 5]);
        // The minus stays an operator; its boundary values are folded by PostgreSQL.
        assert_eq!(lifted("select -1, - 2").unwrap().0, "select -$1, - $2");
        assert_eq!(lifted("select -2147483648, 2147483648").unwrap().0, "select -2147483648, $1");
        assert_eq!(lifted("select 1-1").unwrap().0, "select $1-$2");
    }

    #[test]
    fn positions_and_type_modifiers_are_left_alone() {
        assert_eq!(
            lifted("select a, b from t where c = 3 order by 1, 2 limit 10").unwrap().0,
            "select a, b from t where c = $1 order by 1, 2 limit $2"
        );
        assert_eq!(
            lifted("select a, count(*) from t group by 1 having count(*) > 2").unwrap().0,
            "select a, count(*) from t group by 1 having count(*) > $1"
        );
        assert_eq!(
            lifted("select distinct on (1) a from t where b = 5").unwrap().0,
            "select distinct on (1) a from t where b = $1"
        );
        assert_eq!(
            lifted("select x::numeric(10, 2), 1::int[], cast(5 as varchar(3)) from t").unwrap().0,
            "select x::numeric(10, 2), $1::int[], cast($2 as varchar(3)) from t"
        );
        assert_eq!(
            lifted("select interval '1' second(3), now()::timestamp(0), 4").unwrap().0,
            "select interval '1' second(3), now()::timestamp(0), $1"
        );
        assert_eq!(lifted("select '{1,2}'::int[2], a[1] from t").unwrap().0, "select '{1,2}'::int[2], a[$1] from t");
        assert_eq!(
            lifted("select (select 1 from t order by 1) + 2, 3").unwrap().0,
            "select (select $1 from t order by 1) + $2, $3"
        );
        assert_eq!(lifted("select 1 as one, 2 as \"two\"").unwrap().0, "select $1 as one, $2 as \"two\"");
        assert_eq!(
            lifted("with x as (select 1) select * from x where 2 = 2").unwrap().0,
            "with x as (select $1) select * from x where $2 = $3"
        );
        assert_eq!(lifted("select t.1, 2").unwrap().0, "select t.1, $1");
    }

    #[test]
    fn literals_that_are_not_plain_numbers_stay() {
        assert_eq!(lifted("select 'a 1', $$ 2 $$, E'\\' 3', \"col 4\", x5, 0x1F, 1_000, 12abc, B'101' from t"), None);
        assert_eq!(lifted("select 1 -- 2\n + /* 3 /* 4 */ */ 5").unwrap().0, "select $1 -- 2\n + /* 3 /* 4 */ */ $2");
    }

    #[test]
    fn only_one_data_statement_without_parameters() {
        for sql in [
            "select $1 + 1",
            "select 1; select 2",
            "select 1 into t",
            "create table t as select 1",
            "set x = 1",
            "explain select 1",
            "select 'unterminated",
            "copy t from stdin",
            "select a from t",
        ] {
            assert_eq!(lifted(sql), None, "{sql}");
        }
        assert!(lifted("insert into t values (1, 'x')").is_some());
        assert!(lifted("update t set a = 2 where b = 3").is_some());
        assert!(lifted("with x as (select 1) delete from t where a in (select * from x)").is_some());
        assert!(lifted("values (1), (2)").is_some());
    }

    #[test]
    fn standard_conforming_strings_off() {
        assert_eq!(lift(b"select 'a\\' 1' , 2", true), None);
        assert!(lift(b"select 'a', 2", true).is_some());
    }

    #[test]
    fn edits_map_positions() {
        let l = lift(b"select 12345 + x", false).unwrap();
        assert_eq!(l.text, b"select $1 + x");
        assert_eq!(l.edits, vec![[7, 9, 7, 12]]);
    }

    #[test]
    fn never_panics() {
        for s in ["", "$", "$$", "'", "/*", "select .", "select 1e", "select 1.", "select ::", "select (((", ")))"] {
            let _ = lift(s.as_bytes(), false);
        }
    }
}
