//! The one-pass marks against the scans they replaced (kept here as the reference): the
//! same answers on a corpus of texts and on random ones.

use super::Marks;
use crate::stmt::pins::PinReasons;
use crate::stmt::sql::{Classified, Seen, classify, is_plain_read, session_state, split};
use proptest::prelude::*;

// The code the marks replaced, as it was (commit 2d65bc2).

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
    t[b'l' as usize] = 2;
    t[b'L' as usize] = 2;
    t[b'u' as usize] = 2;
    t[b'U' as usize] = 2;
    t
};

fn old_contains_keyword(sql: &[u8]) -> bool {
    // Runs on every Query with the cache on: a table lookup per byte; a keyword is compared
    // only where a word starts with one of their first letters.
    let mut prev = 0u8;
    for (i, &b) in sql.iter().enumerate() {
        let class = CLASS[b as usize];
        if class == 2 && prev == 0 {
            let rest = &sql[i..];
            let hit = |kw: &[u8]| rest.len() >= kw.len() && rest[..kw.len()].eq_ignore_ascii_case(kw);
            if hit(b"prepare")
                || hit(b"execute")
                || hit(b"deallocate")
                || hit(b"discard")
                || hit(b"listen")
                || hit(b"unlisten")
            {
                return true;
            }
        }
        prev = class;
    }
    false
}

/// The old `classify`, from that prefilter.
fn old_classify(sql: &[u8]) -> Classified {
    if !old_contains_keyword(sql) {
        return Classified::Plain;
    }
    super::super::classify_marked(sql, Marks(Marks::KEYWORD))
}

/// Per byte: is it a word character (bit 0); can a word starting with it begin session
/// state (bit 1: l, t, h, p in either case); can one end it (bit 2: u, c, d, p).
const SCAN_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphanumeric() || b == b'_' {
            t[c] = 1;
            if matches!(b | 0x20, b'l' | b't' | b'h' | b'p') {
                t[c] |= 2;
            }
            if matches!(b | 0x20, b'u' | b'c' | b'd' | b'p') {
                t[c] |= 4;
            }
        }
        c += 1;
    }
    t
};

/// What `sql` may do to session state that outlives its transaction and that parsnip does
/// not carry from one server connection to the next: `LISTEN`, a temporary table (view,
/// sequence, anything in `pg_temp`), a cursor `WITH HOLD`, a session-level advisory lock
/// (`pg_advisory_lock`, `pg_try_advisory_lock` and their `_shared` forms, found anywhere in
/// the text, so also in a `DO` block or a function body); with `pinned`, also what may end
/// one (`UNLISTEN`, `CLOSE`, `DROP`, `DISCARD`, `pg_advisory_unlock*`, anywhere). A cheap
/// scan of word starts first: most texts name none of these words. It errs on the careful
/// side (a word in a literal counts): a needless check costs one round trip, a missed one
/// a server handed on with a client's state.
fn old_scan(sql: &[u8], pinned: bool) -> Seen {
    let mut seen = Seen::default();
    let mut prev_word = false;
    let mut maybe = false;
    for (i, &b) in sql.iter().enumerate() {
        let class = SCAN_CLASS[b as usize];
        if class > 1 && !prev_word {
            let rest = &sql[i..];
            let hit = |kw: &[u8]| rest.len() >= kw.len() && rest[..kw.len()].eq_ignore_ascii_case(kw);
            // The keyword as a whole word.
            let word = |kw: &[u8]| hit(kw) && rest.get(kw.len()).is_none_or(|&c| SCAN_CLASS[c as usize] & 1 == 0);
            if class & 2 != 0 {
                if hit(b"pg_advisory_lock") || hit(b"pg_try_advisory_lock") {
                    seen.reasons |= PinReasons::ADVISORY_LOCK;
                    seen.check = true;
                } else if hit(b"listen") || hit(b"temp") || hit(b"hold") || hit(b"pg_temp") {
                    maybe = true;
                }
            }
            if pinned
                && class & 4 != 0
                && (word(b"unlisten")
                    || word(b"close")
                    || word(b"drop")
                    || word(b"discard")
                    || hit(b"pg_advisory_unlock"))
            {
                seen.check = true;
            }
        }
        prev_word = class & 1 != 0;
    }
    if maybe {
        // What the old scan did next, unchanged: `scan_marked` with the maybe bit alone.
        let more = super::super::session_state_marked(sql, false, Marks(Marks::MAYBE_STATE));
        seen.reasons |= more.reasons;
        seen.check |= more.check;
    }
    seen
}

/// Whether the text is one plain read, as before.
fn old_is_plain_read(sql: &[u8]) -> bool {
    const READ: [&[u8]; 3] = [b"select", b"values", b"table"];
    let Some(w) = super::super::first_word(sql) else { return false };
    if !READ.iter().any(|k| w.eq_ignore_ascii_case(k)) || !super::super::is_plain_dml(sql) {
        return false;
    }
    // Runs on every simple Query outside a transaction: no allocation, and only where an
    // f is (words are runs of ASCII letters).
    !memchr::memchr2_iter(b'f', b'F', sql).any(|i| locks_after_for(sql, i))
}

/// Whether the run of ASCII letters at `i` is FOR and the next run of letters after it is
/// UPDATE, SHARE, NO or KEY (what `is_plain_read` refuses).
fn locks_after_for(sql: &[u8], i: usize) -> bool {
    let alpha = |j: usize| sql.get(j).is_some_and(u8::is_ascii_alphabetic);
    if (i > 0 && alpha(i - 1)) || !sql[i..].get(..3).is_some_and(|w| w.eq_ignore_ascii_case(b"for")) || alpha(i + 3) {
        return false;
    }
    let Some(start) = sql[i + 3..].iter().position(u8::is_ascii_alphabetic).map(|p| i + 3 + p) else { return false };
    let end = sql[start..].iter().position(|c| !c.is_ascii_alphabetic()).map_or(sql.len(), |p| start + p);
    let w = &sql[start..end];
    [&b"update"[..], b"share", b"no", b"key"].iter().any(|k| w.eq_ignore_ascii_case(k))
}

fn same(sql: &[u8]) {
    let shown = String::from_utf8_lossy(sql);
    assert_eq!(classify(sql), old_classify(sql), "classify {shown:?}");
    assert_eq!(Marks::of(sql).has(Marks::KEYWORD), old_contains_keyword(sql), "keyword {shown:?}");
    for pinned in [false, true] {
        assert_eq!(session_state(sql, pinned), old_scan(sql, pinned), "scan {shown:?} pinned {pinned}");
    }
    assert_eq!(is_plain_read(sql), old_is_plain_read(sql), "is_plain_read {shown:?}");
}

const CORPUS: &[&str] = &[
    "",
    ";",
    "SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
    "select 1",
    "  select * from t for update",
    "SELECT * FROM t FOR NO KEY UPDATE",
    "select * from t for share",
    "select * from t for key share",
    "select * from t for\nupdate",
    "select * from t for(update)",
    "select before from t",
    "select x.for from t, update",
    "select 'for update' from t",
    "select * from formula for updates",
    "select * from t FOR update; select 2",
    "select 1;  ;\n",
    "values (1), (2)",
    "table t",
    "with x as (select 1) select * from x",
    "(select 1)",
    "insert into t values (1)",
    "PREPARE p AS SELECT 1",
    "execute p(1)",
    "EXPLAIN EXECUTE p",
    "deallocate all",
    "DEALLOCATE PREPARE p",
    "discard all",
    "DISCARD TEMP",
    "listen chan",
    "unlisten *",
    "select $prepare",
    "select éprepare",
    "select _prepare, x_execute, 9listen",
    "select 1; prepare q as select 2",
    "select prepared from t",
    "LISTEN chan; select 1",
    "create temp table t (x int)",
    "CREATE GLOBAL TEMPORARY TABLE t (x int)",
    "create table pg_temp.t (x int)",
    "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    "declare c cursor for select 1 for update",
    "select pg_advisory_lock(1)",
    "SELECT pg_try_advisory_lock_shared(1, 2)",
    "select pg_advisory_xact_lock(1)",
    "select pg_advisory_unlock(1)",
    "SELECT pg_advisory_unlock_all()",
    "select * into temp t from x",
    "do $$ begin perform pg_advisory_lock(1); end $$",
    "select holdings, temperature from t",
    "select $listen, $temp, x_hold",
    "close c",
    "CLOSE ALL",
    "select closed, dropped, discarded from t",
    "drop table t",
    "select 1 -- listen\n",
    "/* prepare */ select 1",
    "select 'unlisten'",
    "select u&\"drop\" from t",
    "fo",
    "f",
    "for",
    "for update",
    "p",
    "pg_advisory_loc",
    "select\u{a0}prepare",
];

#[test]
fn marks_answer_as_the_old_scans_on_a_corpus() {
    for s in CORPUS {
        same(s.as_bytes());
    }
}

#[test]
fn marks_of_a_plain_read() {
    let m = Marks::of(b"SELECT abalance FROM pgbench_accounts WHERE aid = 12345;");
    assert_eq!(m, Marks::default());
    assert!(Marks::of(b"select 1 for update").has(Marks::LOCKING));
    assert!(Marks::of(b"select pg_advisory_lock(1)").has(Marks::ADVISORY));
    assert!(Marks::of(b"drop table t").has(Marks::ENDS_STATE));
    assert!(Marks::of(b"create temp table t ()").has(Marks::MAYBE_STATE));
    assert!(Marks::of(b"x; prepare p as select 1").has(Marks::KEYWORD));
    // Split statements are read by the lexer where the marks cannot decide.
    assert_eq!(split(b"select 1; prepare p as select 1").len(), 2);
}

fn texts() -> impl Strategy<Value = Vec<u8>> {
    const PARTS: &[&str] = &[
        " ",
        "\n",
        "select ",
        "SELECT",
        "from",
        "for",
        "FOR ",
        "update",
        "share",
        "no",
        "key",
        "prepare",
        "execute",
        "deallocate",
        "discard",
        "listen",
        "unlisten",
        "temp",
        "hold",
        "pg_temp",
        "pg_advisory_lock",
        "pg_try_advisory_lock",
        "pg_advisory_unlock",
        "close",
        "drop",
        "create",
        "declare",
        "with",
        "into",
        "do",
        "values",
        "table",
        "(",
        ")",
        ";",
        "'",
        "$",
        "$$",
        "_",
        "x",
        "1",
        ".",
        "é",
        "--",
        "/*",
        "*/",
        "\"",
    ];
    prop_oneof![
        proptest::collection::vec(proptest::sample::select(PARTS.to_vec()), 0..16)
            .prop_map(|v| v.concat().into_bytes()),
        proptest::collection::vec(
            prop_oneof![any::<u8>(), proptest::sample::select(b"fFoOrRpPlLtTdDuU_$ ;\xc3".to_vec())],
            0..48
        ),
    ]
}

proptest! {
    #[test]
    fn marks_answer_as_the_old_scans(sql in texts()) {
        same(&sql);
    }
}
