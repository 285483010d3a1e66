//! Tests of the SQL lexer: tokens as PostgreSQL's scanner cuts them, and that they cover
//! any input exactly.

use super::*;
use proptest::prelude::*;

fn kinds(sql: &str) -> Vec<(Kind, &str, bool)> {
    tokens(sql.as_bytes()).map(|t| (t.kind, &sql[t.range], t.closed)).collect()
}

fn solid_texts(sql: &str) -> Vec<&str> {
    solid(sql.as_bytes()).map(|t| &sql[t.range]).collect()
}

#[test]
fn cuts_as_postgresql_does() {
    assert_eq!(
        solid_texts("select a.b, $1::int, 'it''s', \"X\"\"y\", 1.5e3 from t;"),
        [
            "select",
            "a",
            ".",
            "b",
            ",",
            "$1",
            "::",
            "int",
            ",",
            "'it''s'",
            ",",
            "\"X\"\"y\"",
            ",",
            "1.5e3",
            "from",
            "t",
            ";"
        ]
    );
    assert_eq!(
        kinds("-- c\r/* a /* b */ c */x"),
        [
            (Kind::Comment, "-- c", true),
            (Kind::Space, "\r", true),
            (Kind::Comment, "/* a /* b */ c */", true),
            (Kind::Word, "x", true)
        ]
    );
    // Prefixes belong to the literal; E'…' takes backslash escapes, others do not.
    assert_eq!(
        solid_texts(r"E'a\'b' e'\\' 'c\' B'01' x'1F' N'n' U&'d' U&'e'"),
        [r"E'a\'b'", r"e'\\'", r"'c\'", "B'01'", "x'1F'", "N'n'", "U&'d'", "U&'e'"]
    );
    assert_eq!(kinds("u&\"i\"")[0].0, Kind::Ident);
    // A word ending in a prefix letter is a word: `tee'x'` is tee and 'x'.
    assert_eq!(solid_texts(r"tee'\' x"), ["tee", r"'\'", "x"]);
    // Dollar quotes; $1 is a parameter; a `$` inside a word is the word's.
    assert_eq!(solid_texts("$$a;b$$ $x$ $$ $x$ $1 a$b$ c"), ["$$a;b$$", "$x$ $$ $x$", "$1", "a$b$", "c"]);
    assert_eq!(solid_texts("$ $a b"), ["$", "$", "a", "b"]);
    assert_eq!(kinds("$q$ x")[0], (Kind::Dollar, "$q$ x", false));
    // Numbers.
    assert_eq!(
        solid(b"1 1.5 .5 1e3 1..2 0x1F 1_000 1e 12abc").map(|t| t.kind).collect::<Vec<_>>(),
        [
            Kind::Number(true),
            Kind::Number(false),
            Kind::Number(false),
            Kind::Number(false),
            // `1..2` (a range, in PL/pgSQL): not a plain number, as the lifter has it.
            Kind::OddNumber,
            Kind::OddNumber,
            Kind::OddNumber,
            Kind::OddNumber,
            Kind::OddNumber
        ]
    );
}

#[test]
fn unterminated() {
    for (sql, kind) in [
        ("'abc", Kind::Str),
        ("E'abc\\", Kind::Str),
        ("\"abc", Kind::Ident),
        ("/* /* */", Kind::Comment),
        ("/*", Kind::Comment),
        ("$a$ b $a", Kind::Dollar),
    ] {
        let t: Vec<Token> = tokens(sql.as_bytes()).collect();
        assert_eq!(t.len(), 1, "{sql}");
        assert_eq!((t[0].kind, t[0].range.clone(), t[0].closed), (kind, 0..sql.len(), false), "{sql}");
    }
}

proptest! {
    #[test]
    fn tokens_cover_the_input_exactly(
        sql in proptest::collection::vec(
            prop_oneof![
                any::<u8>(),
                proptest::sample::select(b"'\"$-/*eEuU&\\;:.01 \n\r".to_vec()),
            ],
            0..96,
        )
    ) {
        let mut at = 0;
        for t in tokens(&sql) {
            prop_assert_eq!(t.range.start, at);
            prop_assert!(t.range.end > t.range.start);
            at = t.range.end;
        }
        prop_assert_eq!(at, sql.len());
    }
}

#[test]
fn parameter_then_e_string() {
    // PostgreSQL 15 reads `$1e'…'` as a parameter and an E'…' string.
    assert_eq!(solid_texts(r"$1e'\'' x"), ["$1", r"e'\''", "x"]);
}

/// Texts of SQL fragments the readers look for, glued together in any order.
fn fragments() -> impl Strategy<Value = Vec<u8>> {
    const PARTS: [&str; 24] = [
        "execute ",
        "prepare ",
        "deallocate ",
        "discard all",
        "explain (",
        "create temp table t as ",
        "q",
        " as ",
        "select ",
        "listen ",
        "pg_advisory_lock(",
        "declare c cursor with hold for ",
        "1",
        "1.5e",
        "'",
        "E'\\",
        "\"",
        "$$",
        "$a$",
        "$1",
        "/*",
        "*/",
        "--",
        ";",
    ];
    proptest::collection::vec(proptest::sample::select(PARTS.to_vec()), 0..24).prop_map(|v| v.concat().into_bytes())
}

proptest! {
    /// Whatever the text, what reads it through the lexer does not panic.
    #[test]
    fn readers_never_panic(
        sql in proptest::collection::vec(
            prop_oneof![
                any::<u8>(),
                proptest::sample::select(b"'\"$-/*eEuU&\\;:.01() \n\r".to_vec()),
                Just(b'x'),
            ],
            0..96,
        ).boxed().prop_union(fragments().boxed())
    ) {
        use crate::stmt::sql;
        let _ = sql::classify(&sql);
        let _ = sql::split(&sql);
        let _ = sql::words(&sql).count();
        let _ = sql::prepare_body(&sql);
        let _ = (sql::is_plain_read(&sql), sql::may_change_schema(&sql), sql::holds_session_state(&sql));
        let _ = crate::stmt::lift::lift(&sql, false);
        let _ = crate::stmt::lift::lift(&sql, true);
    }
}
