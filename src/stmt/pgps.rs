//! The client's own `pg_prepared_statements` under a shared statement cache. With the
//! cache on, a server connection's prepared statements are the pool's (`pn_<n>` names,
//! other clients' statements), so the catalog view would show them, not what the client
//! prepared. This module finds where a statement text reads the view (`sites`, through the
//! one lexer, `stmt::lex`) and makes the subquery that stands in for it (`subquery`): the
//! rows PostgreSQL would show a session that ran what the client ran, with the columns of
//! the server's own view whatever its version (each row is made by `jsonb_populate_record`
//! into the view's row type), joined to the server's row for the statement behind each
//! name when the server connection has it (parameter and result types, plan counts).
//!
//! The session (`session::stmts::view`) decides when to rewrite and gathers the entries;
//! this module only reads and writes SQL text.

use super::lex::{self, Kind, Token};
use std::ops::Range;

/// Beyond this many bytes of statement data the view is not rewritten (the server's view
/// is shown as it is): a text that large would cost more than the answer is worth.
pub(crate) const MAX_DATA: usize = 4 << 20;

/// The relation's name.
const VIEW: &[u8] = b"pg_prepared_statements";

/// A place in a text that reads the view: the bytes to replace (`pg_catalog.` included),
/// and whether the text gives the relation no alias of its own (the subquery then takes the
/// view's name, so that `pg_prepared_statements.name` still resolves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Site {
    pub(crate) range: Range<usize>,
    pub(crate) needs_alias: bool,
}

/// A statement the client holds, as the view shows it.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    /// The client's name.
    pub(crate) name: &'a [u8],
    /// The text PostgreSQL keeps: a Parse's query, or the whole Query text of a PREPARE.
    pub(crate) statement: &'a [u8],
    pub(crate) from_sql: bool,
    /// How long ago (µs) the client prepared it.
    pub(crate) ago_us: u64,
    /// The server-side statement behind the name.
    pub(crate) server_name: &'a str,
    /// Parameter types when the server connection lacks that statement.
    pub(crate) types: Types<'a>,
}

/// Where parameter types come from when the server has no row for a statement.
#[derive(Debug)]
pub(crate) enum Types<'a> {
    /// A Parse's type OIDs (4 bytes each, big-endian; 0 = left to the server).
    Oids(&'a [u8]),
    /// A PREPARE's definition ("(type, …) AS …" or "AS …"): the type names as written.
    Prepare(&'a [u8]),
}

/// Cheap test on every Parse and Query with the cache on: may the text name the view?
pub(crate) fn mentions(sql: &[u8]) -> bool {
    let mut from = 0;
    while let Some(p) = memchr::memchr(b'_', &sql[from..]) {
        let i = from + p;
        if i >= 2 && sql.get(i - 2..i - 2 + VIEW.len()).is_some_and(|w| w.eq_ignore_ascii_case(VIEW)) {
            return true;
        }
        from = i + 1;
    }
    false
}

/// First words of statements whose reads of the view run when the statement runs (data
/// statements, EXPLAIN, COPY, DECLARE): a definition (CREATE VIEW, a function body) would
/// keep a copy of the rows instead of reading the view when used, so it is left alone.
const RUNS_NOW: [&[u8]; 10] =
    [b"select", b"with", b"values", b"insert", b"update", b"delete", b"merge", b"explain", b"copy", b"declare"];

/// Words that may follow a relation in FROM and are not an alias of it.
const NOT_ALIAS: [&[u8]; 23] = [
    b"where",
    b"join",
    b"inner",
    b"left",
    b"right",
    b"full",
    b"cross",
    b"natural",
    b"on",
    b"using",
    b"group",
    b"order",
    b"having",
    b"limit",
    b"offset",
    b"fetch",
    b"for",
    b"union",
    b"intersect",
    b"except",
    b"window",
    b"returning",
    b"tablesample",
];

/// Words after which a comma continues a FROM list, and words that start another clause.
fn clause_word(w: &[u8]) -> Option<bool> {
    // Not ON or USING: a comma after a join's condition continues the FROM list.
    const OTHER: [&[u8]; 12] = [
        b"select",
        b"where",
        b"group",
        b"order",
        b"having",
        b"limit",
        b"returning",
        b"set",
        b"values",
        b"window",
        b"into",
        b"by",
    ];
    if w.eq_ignore_ascii_case(b"from") || w.eq_ignore_ascii_case(b"join") {
        Some(true)
    } else if OTHER.iter().any(|k| w.eq_ignore_ascii_case(k)) {
        Some(false)
    } else {
        None
    }
}

fn is_word(sql: &[u8], t: &Token, w: &[u8]) -> bool {
    (t.kind == Kind::Word && sql[t.range.clone()].eq_ignore_ascii_case(w))
        || (t.kind == Kind::Ident && t.range.len() == w.len() + 2 && sql[t.range.start + 1..t.range.end - 1] == *w)
}

/// Where `sql` reads the view as a relation: `pg_prepared_statements` (or
/// `pg_catalog.pg_prepared_statements`, any case, or quoted) after FROM, JOIN or a comma
/// of a FROM list, in statements that run now (`RUNS_NOW`). Not inside literals or
/// comments, not as a column's qualifier, not in another schema.
pub(crate) fn sites(sql: &[u8]) -> Vec<Site> {
    let mut out = Vec::new();
    if !mentions(sql) {
        return out;
    }
    let toks: Vec<Token> = lex::solid(sql).collect();
    let mut i = 0;
    while i < toks.len() {
        let end = toks[i..].iter().position(|t| t.kind == Kind::Punct(b';')).map_or(toks.len(), |p| i + p);
        let stmt = &toks[i..end];
        let runs_now = match stmt.first() {
            Some(t) if t.kind == Kind::Punct(b'(') => true,
            Some(t) => RUNS_NOW.iter().any(|w| is_word(sql, t, w)),
            None => false,
        };
        if runs_now {
            sites_in(sql, stmt, &mut out);
        }
        i = end + 1;
    }
    out
}

fn sites_in(sql: &[u8], toks: &[Token], out: &mut Vec<Site>) {
    // Per parenthesis depth: whether the clause being read is a FROM list.
    let mut in_from: Vec<bool> = vec![false];
    for (k, t) in toks.iter().enumerate() {
        match t.kind {
            Kind::Punct(b'(') => in_from.push(false),
            Kind::Punct(b')') if in_from.len() > 1 => {
                in_from.pop();
            }
            Kind::Word => {
                if let (Some(f), Some(top)) = (clause_word(&sql[t.range.clone()]), in_from.last_mut()) {
                    *top = f;
                }
            }
            _ => {}
        }
        if !is_word(sql, t, VIEW) {
            continue;
        }
        let prev = |n: usize| k.checked_sub(n).map(|j| &toks[j]);
        let (start, before) = match (prev(1), prev(2)) {
            (Some(dot), Some(schema)) if dot.kind == Kind::Punct(b'.') => {
                if !is_word(sql, schema, b"pg_catalog") {
                    continue;
                }
                (schema.range.start, prev(3))
            }
            _ => (t.range.start, prev(1)),
        };
        let after_from = match before {
            Some(b) if b.kind == Kind::Word => {
                let w = &sql[b.range.clone()];
                w.eq_ignore_ascii_case(b"from") || w.eq_ignore_ascii_case(b"join")
            }
            Some(b) if b.kind == Kind::Punct(b',') => in_from.last() == Some(&true),
            _ => false,
        };
        let next = toks.get(k + 1);
        if !after_from || next.is_some_and(|n| matches!(n.kind, Kind::Punct(b'.' | b'('))) {
            continue;
        }
        let aliased = next.is_some_and(|n| match n.kind {
            Kind::Ident => true,
            Kind::Word => !NOT_ALIAS.iter().any(|w| sql[n.range.clone()].eq_ignore_ascii_case(w)),
            _ => false,
        });
        out.push(Site { range: start..t.range.end, needs_alias: !aliased });
    }
}

/// `s` as the inside of a JSON string: `"` and `\` escaped, control bytes as `\u00XX`,
/// other bytes as they are (the server reads the whole text in the client's encoding).
fn json_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &b in s {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0..0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// The type names of a PREPARE definition "(t1, t2) AS …", split at top-level commas.
fn prepare_types(def: &[u8]) -> Vec<&[u8]> {
    let mut toks = lex::solid(def);
    let mut names = Vec::new();
    if toks.next().is_none_or(|t| t.kind != Kind::Punct(b'(')) {
        return names;
    }
    let (mut depth, mut from) = (0usize, None::<usize>);
    let mut last_end = 0;
    for t in toks {
        match t.kind {
            Kind::Punct(b'(') => depth += 1,
            Kind::Punct(b')') if depth > 0 => depth -= 1,
            Kind::Punct(b',' | b')') if depth == 0 => {
                if let Some(f) = from.take() {
                    names.push(&def[f..last_end]);
                }
                if t.kind == Kind::Punct(b')') {
                    break;
                }
                continue;
            }
            _ => {}
        }
        from.get_or_insert(t.range.start);
        last_end = t.range.end;
    }
    names
}

/// The rows of `entries` as a JSON array: name, statement, from_sql as the view's columns;
/// `s` the server-side name to join on, `p` fallback parameter types, `a` the age.
fn json(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut j = Vec::with_capacity(64 + entries.iter().map(|e| e.statement.len() + e.name.len() + 96).sum::<usize>());
    j.push(b'[');
    for (n, e) in entries.iter().enumerate() {
        if n > 0 {
            j.push(b',');
        }
        j.extend_from_slice(b"{\"name\":");
        json_str(&mut j, e.name);
        j.extend_from_slice(b",\"statement\":");
        json_str(&mut j, e.statement);
        j.extend_from_slice(if e.from_sql { b",\"from_sql\":true,\"s\":" } else { b",\"from_sql\":false,\"s\":" });
        json_str(&mut j, e.server_name.as_bytes());
        j.extend_from_slice(b",\"p\":[");
        match e.types {
            Types::Oids(raw) => {
                for (k, c) in raw.chunks_exact(4).enumerate() {
                    if k > 0 {
                        j.push(b',');
                    }
                    let oid = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
                    // Left to the server, which would show the type it inferred: unknown
                    // here (the server connection has no row to tell).
                    if oid == 0 {
                        j.extend_from_slice(b"\"unknown\"");
                    } else {
                        j.extend_from_slice(oid.to_string().as_bytes());
                    }
                }
            }
            Types::Prepare(def) => {
                for (k, t) in prepare_types(def).into_iter().enumerate() {
                    if k > 0 {
                        j.push(b',');
                    }
                    json_str(&mut j, t);
                }
            }
        }
        j.extend_from_slice(format!("],\"a\":\"{} microseconds\"}}", e.ago_us).as_bytes());
    }
    j.push(b']');
    j
}

/// The subquery standing for the view: the rows of `entries`, in the server's view's row
/// type. None when its data would exceed `MAX_DATA`.
pub(crate) fn subquery(entries: &[Entry<'_>]) -> Option<Vec<u8>> {
    let data = json(entries);
    if data.len() > MAX_DATA {
        return None;
    }
    // A dollar quote whose tag the data does not contain.
    let mut tag = b"$pn$".to_vec();
    let mut k = 0u32;
    while data.windows(tag.len()).any(|w| w == tag.as_slice()) {
        k += 1;
        tag = format!("$pn{k}$").into_bytes();
    }
    let mut q = Vec::with_capacity(data.len() + 1024);
    q.extend_from_slice(b"(SELECT r.* FROM pg_catalog.jsonb_array_elements(");
    q.extend_from_slice(&tag);
    q.extend_from_slice(&data);
    q.extend_from_slice(&tag);
    q.extend_from_slice(
        b"::pg_catalog.jsonb) AS c(j) \
          LEFT JOIN pg_catalog.pg_prepared_statements AS s \
          ON s.name OPERATOR(pg_catalog.=) (c.j OPERATOR(pg_catalog.->>) 's'), \
          LATERAL pg_catalog.jsonb_populate_record(NULL::pg_catalog.pg_prepared_statements, \
          pg_catalog.jsonb_build_object('parameter_types', c.j OPERATOR(pg_catalog.->) 'p', \
          'generic_plans', 0, 'custom_plans', 0) \
          OPERATOR(pg_catalog.||) COALESCE(pg_catalog.to_jsonb(s), '{}') \
          OPERATOR(pg_catalog.||) c.j \
          OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('prepare_time', \
          pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-) \
          (c.j OPERATOR(pg_catalog.->>) 'a')::pg_catalog.interval)) AS r)",
    );
    Some(q)
}

/// `sql` with each of `sites` replaced by `sub`, and where the texts differ, in characters
/// (as `lift::Lifted::edits`, for error positions).
pub(crate) fn rewrite(sql: &[u8], sites: &[Site], sub: &[u8]) -> (Vec<u8>, Vec<[i64; 4]>) {
    let mut t = super::lift::Rewrite::new(sql);
    let mut aliased = sub.to_vec();
    aliased.extend_from_slice(b" AS pg_prepared_statements");
    for s in sites {
        t.replace(s.range.clone(), if s.needs_alias { &aliased } else { sub });
    }
    t.finish()
}

#[cfg(test)]
mod tests;
