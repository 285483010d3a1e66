//! Recognizing the SQL-level prepared-statement commands in a simple Query: `PREPARE`,
//! `EXECUTE` (also inside `EXPLAIN … EXECUTE` and `CREATE TABLE … AS EXECUTE`),
//! `DEALLOCATE [PREPARE] name|ALL` and `DISCARD ALL`. A small lexer splits the
//! text into statements (respecting quotes, dollar quotes and comments) so that these
//! commands are found even inside multi-statement strings.

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

/// Byte classes for `contains_keyword`: 0 ends a word, 1 continues one, 2 continues one
/// and may start a keyword (p, e, d in either case).
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80 {
            t[b] = 1;
        }
        b += 1;
    }
    t[b'p' as usize] = 2;
    t[b'P' as usize] = 2;
    t[b'e' as usize] = 2;
    t[b'E' as usize] = 2;
    t[b'd' as usize] = 2;
    t[b'D' as usize] = 2;
    t
};

fn contains_keyword(sql: &[u8]) -> bool {
    // Runs on every Query with the cache on: a table lookup per byte; a keyword is compared
    // only where a word starts with one of their first letters.
    let mut prev = 0u8;
    for (i, &b) in sql.iter().enumerate() {
        let class = CLASS[b as usize];
        if class == 2 && prev == 0 {
            let rest = &sql[i..];
            let hit = |kw: &[u8]| rest.len() >= kw.len() && rest[..kw.len()].eq_ignore_ascii_case(kw);
            if hit(b"prepare") || hit(b"execute") || hit(b"deallocate") || hit(b"discard") {
                return true;
            }
        }
        prev = class;
    }
    false
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
    match sql.iter().position(|&b| b == b';') {
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
    const SAFE: [&[u8]; 37] = [
        b"select",
        b"insert",
        b"update",
        b"delete",
        b"merge",
        b"with",
        b"values",
        b"table",
        b"set",
        b"reset",
        b"show",
        b"begin",
        b"start",
        b"commit",
        b"end",
        b"rollback",
        b"abort",
        b"savepoint",
        b"release",
        b"prepare",
        b"execute",
        b"deallocate",
        b"listen",
        b"notify",
        b"unlisten",
        b"discard",
        b"fetch",
        b"move",
        b"close",
        b"declare",
        b"copy",
        b"explain",
        b"lock",
        b"checkpoint",
        b"vacuum",
        b"analyze",
        b"analyse",
    ];
    let one = |stmt: &[u8]| match first_word(stmt) {
        Some(w) => !SAFE.iter().any(|k| w.eq_ignore_ascii_case(k)),
        // Empty, or starting with '(' (a parenthesized SELECT): no DDL.
        None => false,
    };
    if one_statement(sql) { one(sql) } else { split(sql).into_iter().any(|r| one(&sql[r])) }
}

/// Whether the text is surely one plain read (SELECT, VALUES, TABLE) that takes no row
/// locks: it waits on no other transaction's row lock, so a batch of it ends in the time it
/// needs to run (`session::pipeline`). Conservative: a locking clause anywhere in the text
/// (`FOR UPDATE`, `FOR NO KEY UPDATE`, `FOR SHARE`, `FOR KEY SHARE`), even in a literal,
/// makes it not one.
pub(crate) fn is_plain_read(sql: &[u8]) -> bool {
    const READ: [&[u8]; 3] = [b"select", b"values", b"table"];
    let Some(w) = first_word(sql) else { return false };
    if !READ.iter().any(|k| w.eq_ignore_ascii_case(k)) || !is_plain_dml(sql) {
        return false;
    }
    // Runs on every simple Query outside a transaction: no allocation.
    let mut after_for = false;
    for w in sql.split(|c| !c.is_ascii_alphabetic()).filter(|w| !w.is_empty()) {
        if after_for && [&b"update"[..], b"share", b"no", b"key"].iter().any(|k| w.eq_ignore_ascii_case(k)) {
            return false;
        }
        after_for = w.eq_ignore_ascii_case(b"for");
    }
    true
}

/// The statement of a `PREPARE` definition ("(types) AS statement" or "AS statement").
pub(crate) fn prepare_body(def: &[u8]) -> Option<&[u8]> {
    let mut i = skip_ws(def, 0, def.len());
    if def.get(i) == Some(&b'(') {
        // Type names may hold parentheses of their own: numeric(10, 2).
        let mut depth = 0usize;
        while i < def.len() {
            match def[i] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i = skip_ws(def, i + 1, def.len());
    }
    let rest = def.get(i..)?;
    let w = first_word(rest)?;
    w.eq_ignore_ascii_case(b"as").then(|| &rest[2..])
}

/// Classifies a Query text.
pub(crate) fn classify(sql: &[u8]) -> Classified {
    if !contains_keyword(sql) {
        return Classified::Plain;
    }
    let mut stmts: Vec<(Range<usize>, Option<SqlStmt>)> = split(sql)
        .into_iter()
        .filter(|r| skip_ws(sql, r.start, r.end) < r.end)
        .map(|r| {
            let ours = parse_one(sql, r.clone());
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

/// Byte ranges of the statements in `sql` (split at top-level semicolons).
pub(crate) fn split(sql: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    let n = sql.len();
    while i < n {
        match sql[i] {
            b'\'' | b'"' => {
                let q = sql[i];
                // E'…' (not the end of a longer word): a backslash escapes the next byte.
                let escapes = q == b'\''
                    && i > 0
                    && sql[i - 1].eq_ignore_ascii_case(&b'e')
                    && (i < 2 || !is_word_byte(sql[i - 2]));
                i = quoted_end(sql, i, escapes).unwrap_or(n);
            }
            b'-' if i + 1 < n && sql[i + 1] == b'-' => {
                while i < n && sql[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if i + 1 < n && sql[i + 1] == b'*' => {
                let mut depth = 0;
                while i < n {
                    if i + 1 < n && sql[i] == b'/' && sql[i + 1] == b'*' {
                        depth += 1;
                        i += 2;
                    } else if i + 1 < n && sql[i] == b'*' && sql[i + 1] == b'/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'$' => {
                // A dollar quote: $tag$ … $tag$ (tag may be empty). $1 is a parameter.
                let tag_end = sql[i + 1..].iter().position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80));
                match tag_end {
                    Some(t) if sql[i + 1 + t] == b'$' && !sql.get(i + 1).is_some_and(|c| c.is_ascii_digit()) => {
                        let tag = &sql[i..i + t + 2];
                        let body = i + t + 2;
                        match sql[body..].windows(tag.len()).position(|w| w == tag) {
                            Some(p) => i = body + p + tag.len(),
                            None => i = n,
                        }
                    }
                    _ => i += 1,
                }
            }
            b';' => {
                out.push(start..i);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < n {
        out.push(start..n);
    }
    out
}

/// Where the first token of `sql` starts: whitespace and comments skipped.
pub(crate) fn skip_space(sql: &[u8]) -> usize {
    skip_ws(sql, 0, sql.len())
}

/// The tokens of one statement, as written: whitespace and comments are skipped; a word
/// (letters, digits, `_`, `$`, `.` and non-ASCII bytes: keywords, names, dotted setting
/// names, numbers), a quoted identifier or a string literal (quotes included) is one
/// token, and any other byte is a token of its own. Keywords compare with
/// `eq_ignore_ascii_case`. The one lexer for what the pooler reads of SQL: the session's
/// SET/BEGIN/COMMIT recognizer uses it too.
pub(crate) fn words(stmt: &[u8]) -> impl Iterator<Item = &[u8]> {
    let end = stmt.len();
    let mut i = 0;
    std::iter::from_fn(move || {
        i = skip_ws(stmt, i, end);
        if i >= end {
            return None;
        }
        let start = i;
        let c = stmt[i];
        if c == b'"' || c == b'\'' {
            i = quoted_end(stmt, i, false).unwrap_or(end);
        } else if is_word_byte(c) {
            while i < end && is_word_byte(stmt[i]) {
                i += 1;
            }
        } else {
            i += 1;
        }
        Some(&stmt[start..i])
    })
}

/// Just past the quote that closes the quoted string or identifier opening at `open` (its
/// quote character, `'` or `"`): a doubled quote stands for one, and with `escapes` (an
/// `E'…'` string) a backslash escapes the byte after it. None: no closing quote.
pub(crate) fn quoted_end(sql: &[u8], open: usize, escapes: bool) -> Option<usize> {
    let q = sql[open];
    let mut i = open + 1;
    while i < sql.len() {
        if escapes && sql[i] == b'\\' {
            i += 2;
            continue;
        }
        if sql[i] == q {
            if sql.get(i + 1) == Some(&q) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.') || c >= 0x80
}

fn skip_ws(sql: &[u8], mut i: usize, end: usize) -> usize {
    loop {
        while i < end && sql[i].is_ascii_whitespace() {
            i += 1;
        }
        if i + 1 < end && sql[i] == b'-' && sql[i + 1] == b'-' {
            while i < end && sql[i] != b'\n' {
                i += 1;
            }
        } else if i + 1 < end && sql[i] == b'/' && sql[i + 1] == b'*' {
            match sql[i + 2..end].windows(2).position(|w| w == b"*/") {
                Some(p) => i = i + 2 + p + 2,
                None => return end,
            }
        } else {
            return i;
        }
    }
}

fn first_word(s: &[u8]) -> Option<&[u8]> {
    let i = skip_ws(s, 0, s.len());
    let j = s[i..].iter().position(|c| !c.is_ascii_alphabetic()).map_or(s.len(), |p| i + p);
    (j > i).then(|| &s[i..j])
}

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

fn parse_one(sql: &[u8], r: Range<usize>) -> Option<SqlStmt> {
    let end = r.end;
    let i = skip_ws(sql, r.start, end);
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

/// Just past the `)` closing the `(` at `i` (nested parentheses and quotes skipped).
fn paren_end(sql: &[u8], i: usize, end: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut k = i;
    while k < end {
        match sql[k] {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k + 1);
                }
            }
            q @ (b'\'' | b'"') => {
                k += 1;
                while k < end && sql[k] != q {
                    k += 1;
                }
            }
            _ => {}
        }
        k += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_bodies() {
        assert_eq!(prepare_body(b"AS SELECT 1"), Some(&b" SELECT 1"[..]));
        assert_eq!(
            prepare_body(b"(int, numeric(10, 2)) as  insert into t values ($1)"),
            Some(&b"  insert into t values ($1)"[..])
        );
        assert_eq!(prepare_body(b"(int SELECT 1"), None);
        assert_eq!(prepare_body(b"ASSELECT"), None);
    }

    #[test]
    fn plain_dml() {
        for sql in [
            "SELECT 1",
            " /* c */ select * from t;",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "insert into t values (1);\n",
        ] {
            assert!(is_plain_dml(sql.as_bytes()), "{sql}");
        }
        for sql in ["ALTER TABLE t ADD c int", "select 1; drop table t", "SET x = 1", "", "CALL p()", "EXECUTE q"] {
            assert!(!is_plain_dml(sql.as_bytes()), "{sql}");
        }
    }

    #[test]
    fn plain_read() {
        for sql in [
            "SELECT 1",
            "select abalance from pgbench_accounts where aid = $1",
            "VALUES (1)",
            "table t",
            "select 1 as forx",
        ] {
            assert!(is_plain_read(sql.as_bytes()), "{sql}");
        }
        for sql in [
            "insert into t values (1)",
            "UPDATE t SET a = 1",
            "select * from t for update",
            "SELECT * FROM t FOR NO KEY UPDATE SKIP LOCKED",
            "select * from t for share",
            "select * from t FOR KEY SHARE",
            "WITH x AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM x",
            "select 1; select 2",
        ] {
            assert!(!is_plain_read(sql.as_bytes()), "{sql}");
        }
    }

    #[test]
    fn recognizes_commands() {
        assert_eq!(classify(b"select 1"), Classified::Plain);
        assert_eq!(classify(b"DEALLOCATE ALL"), Classified::Single(SqlStmt::Deallocate(None)));
        assert_eq!(classify(b" deallocate prepare all ;"), Classified::Single(SqlStmt::Deallocate(None)));
        assert_eq!(classify(b"DEALLOCATE Foo"), Classified::Single(SqlStmt::Deallocate(Some(b"foo".to_vec()))));
        assert_eq!(classify(b"DEALLOCATE \"Foo\""), Classified::Single(SqlStmt::Deallocate(Some(b"Foo".to_vec()))));
        assert_eq!(classify(b"discard all"), Classified::Single(SqlStmt::DiscardAll));
        assert_eq!(classify(b"discard plans"), Classified::Plain);
        assert_eq!(
            classify(b"PREPARE q1 (int) AS SELECT $1"),
            Classified::Single(SqlStmt::Prepare { name: b"q1".to_vec(), rest: 11 })
        );
        assert_eq!(
            classify(b"EXECUTE q1(5)"),
            Classified::Single(SqlStmt::Execute { name: b"q1".to_vec(), span: 8..10 })
        );
        assert_eq!(classify(b"PREPARE TRANSACTION 'x'"), Classified::Plain);
        let multi = |sql: &[u8]| match classify(sql) {
            Classified::Multi(v) => v.iter().map(|(r, s)| (sql[r.clone()].to_vec(), s.is_some())).collect(),
            _ => Vec::new(),
        };
        assert_eq!(
            multi(b"select 1; deallocate all"),
            [(b"select 1".to_vec(), false), (b" deallocate all".to_vec(), true)]
        );
        assert_eq!(multi(b"select 1;Deallocate all;;").len(), 2);
        assert_eq!(multi(b"select 1;/**/EXECUTE q; -- c\n").len(), 2);
        // A statement that starts with a parenthesis counts; comments alone do not.
        assert_eq!(multi(b"(select 1); deallocate all").len(), 2);
        assert_eq!(multi(b"/* a */; deallocate all; -- b"), Vec::new());
        // E'…' strings: an escaped quote does not end them.
        assert_eq!(multi(b"select E'it\\'s; x'; execute q").len(), 2);
        assert_eq!(multi(b"select 'a\\'; execute q").len(), 2);
        let exec = |sql: &[u8], name: &[u8]| {
            let Classified::Single(SqlStmt::Execute { name: n, span }) = classify(sql) else {
                panic!("{} is not an EXECUTE", String::from_utf8_lossy(sql))
            };
            assert_eq!(n, name);
            assert_eq!(sql[span].to_ascii_lowercase(), name, "{}", String::from_utf8_lossy(sql));
        };
        exec(b"EXPLAIN EXECUTE q1(5)", b"q1");
        exec(b"explain analyze verbose execute Q2", b"q2");
        exec(b"EXPLAIN (ANALYZE, COSTS off, FORMAT 'json') EXECUTE q3 (1, 'a')", b"q3");
        exec(b"CREATE TABLE t AS EXECUTE q4(1)", b"q4");
        exec(b"create temp table if not exists \"T x\" (a, b) as execute q5 with no data", b"q5");
        exec(b"CREATE UNLOGGED TABLE s.t WITH (fillfactor = 70) AS EXECUTE q6", b"q6");
        for plain in [
            &b"EXPLAIN SELECT 1"[..],
            b"EXPLAIN (ANALYZE) SELECT 'execute q'",
            b"CREATE TABLE t AS SELECT 1 AS execute",
            b"CREATE FUNCTION f() RETURNS int AS $$ execute q $$ LANGUAGE sql",
            b"CREATE INDEX ON t (a)",
        ] {
            assert_eq!(classify(plain), Classified::Plain, "{}", String::from_utf8_lossy(plain));
        }
        assert_eq!(classify(b"(execute q)"), Classified::Plain);
        assert_eq!(classify(b"select predeallocate, x_execute from t"), Classified::Plain);
        assert_eq!(classify(b"DISCARD ALL;"), Classified::Single(SqlStmt::DiscardAll));
        assert!(starts_with_deallocate(b" /* c */ deallocate x") && !starts_with_deallocate(b"select 1"));
        assert_eq!(classify(b"select 'deallocate all; x'"), Classified::Plain);
        assert_eq!(classify(b"do $$ begin execute 'select 1'; end $$"), Classified::Plain);
        assert_eq!(classify(b"-- execute x\nselect 1"), Classified::Plain);
        assert_eq!(classify(b"select $1::int; -- discard all"), Classified::Plain);
    }

    #[test]
    fn schema_changes_recognized() {
        for ddl in [
            &b"ALTER TABLE t ADD COLUMN b int"[..],
            b" /* c */ drop table t",
            b"CREATE OR REPLACE VIEW v AS SELECT 1",
            b"select 1; alter table t drop column b",
            b"DO $$ BEGIN EXECUTE 'drop table t'; END $$",
            b"CALL migrate()",
            b"COMMENT ON TABLE t IS 'x'",
        ] {
            assert!(may_change_schema(ddl), "{}", String::from_utf8_lossy(ddl));
        }
        for plain in [
            &b"SELECT * FROM t"[..],
            b"insert into t values (1);",
            b"BEGIN; UPDATE t SET a = 1; COMMIT",
            b"SET search_path = x",
            b"(select 1)",
            b"select 'alter table t; drop table t'",
            b"",
        ] {
            assert!(!may_change_schema(plain), "{}", String::from_utf8_lossy(plain));
        }
    }

    #[test]
    fn never_panics_on_odd_input() {
        for s in
            [&b"$"[..], b"$$", b"'", b"\"", b"/*", b"--", b"prepare", b"execute \"", b"deallocate", b"$a$ discard all"]
        {
            let _ = classify(s);
        }
    }
}

/// Whether `sql` may leave state in the server session that outlives its transaction and
/// that parsnip does not carry from one server connection to the next: `LISTEN`, a
/// temporary table (view, sequence), a cursor `WITH HOLD`, a session-level advisory lock
/// (`pg_advisory_lock`, `pg_try_advisory_lock` and their `_shared` forms). Under
/// transaction pooling such a client is pinned to its server connection. A cheap scan of
/// word starts first: most texts name none of these words.
pub(crate) fn holds_session_state(sql: &[u8]) -> bool {
    // Per byte: is it a word character (bit 0), and can a word starting with it be one of
    // the keywords below (bit 1: l, t, h, p in either case). Runs on every Query and Parse.
    const CLASS: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut c = 0;
        while c < 256 {
            let b = c as u8;
            if b.is_ascii_alphanumeric() || b == b'_' {
                t[c] = 1;
                if matches!(b | 0x20, b'l' | b't' | b'h' | b'p') {
                    t[c] |= 2;
                }
            }
            c += 1;
        }
        t
    };
    let mut prev_word = false;
    let mut maybe = false;
    for (i, &b) in sql.iter().enumerate() {
        let class = CLASS[b as usize];
        if class == 3 && !prev_word {
            let rest = &sql[i..];
            let hit = |kw: &[u8]| rest.len() >= kw.len() && rest[..kw.len()].eq_ignore_ascii_case(kw);
            if hit(b"listen")
                || hit(b"temp")
                || hit(b"hold")
                || hit(b"pg_advisory_lock")
                || hit(b"pg_try_advisory_lock")
            {
                maybe = true;
                break;
            }
        }
        prev_word = class & 1 != 0;
    }
    maybe && split(sql).into_iter().any(|r| statement_holds_state(&sql[r]))
}

fn statement_holds_state(stmt: &[u8]) -> bool {
    let w: Vec<&[u8]> = words(stmt).take(64).collect();
    let is = |i: usize, kw: &str| w.get(i).is_some_and(|x| x.eq_ignore_ascii_case(kw.as_bytes()));
    if is(0, "listen") {
        return true;
    }
    if is(0, "create") {
        let mut i = 1;
        if is(i, "or") && is(i + 1, "replace") {
            i += 2;
        }
        if is(i, "global") || is(i, "local") {
            i += 1;
        }
        if is(i, "temp") || is(i, "temporary") {
            return true;
        }
    }
    if is(0, "declare") {
        // DECLARE name [BINARY] [ASENSITIVE|INSENSITIVE] [[NO] SCROLL] CURSOR WITH HOLD FOR
        let for_at = w.iter().position(|x| x.eq_ignore_ascii_case(b"for")).unwrap_or(w.len());
        if (1..for_at).any(|i| is(i, "with") && is(i + 1, "hold")) {
            return true;
        }
    }
    // SELECT ... INTO TEMP, and session advisory locks anywhere in the statement.
    w.iter().enumerate().any(|(i, x)| {
        let lower = x.to_ascii_lowercase();
        (lower.starts_with(b"pg_advisory_lock") || lower.starts_with(b"pg_try_advisory_lock"))
            || (x.eq_ignore_ascii_case(b"into") && (is(i + 1, "temp") || is(i + 1, "temporary")))
    })
}

#[cfg(test)]
mod session_state_tests {
    use super::holds_session_state as h;

    #[test]
    fn statements_that_leave_session_state() {
        for s in [
            "LISTEN chan",
            "listen \"Chan\"; select 1",
            "create temp table t (x int)",
            "CREATE GLOBAL TEMPORARY TABLE t (x int)",
            "create or replace temp view v as select 1",
            "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
            "declare c no scroll cursor with hold for select 1",
            "select pg_advisory_lock(1)",
            "SELECT pg_try_advisory_lock_shared(1, 2)",
            "select * into temp t from x",
        ] {
            assert!(h(s.as_bytes()), "{s}");
        }
        for s in [
            "select 1",
            "select pg_advisory_xact_lock(1)",
            "create table temperature (x int)",
            "select 'listen'",
            "declare c cursor for select 1",
            "select holdings from t",
            "-- listen\nselect 1",
            "notify chan",
            "unlisten *",
        ] {
            assert!(!h(s.as_bytes()), "{s}");
        }
    }
}
