//! Tests of `stmt::sql`: the statement commands, plain reads and schema changes.

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
    for sql in
        ["SELECT 1", " /* c */ select * from t;", "WITH x AS (SELECT 1) SELECT * FROM x", "insert into t values (1);\n"]
    {
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
    assert_eq!(classify(b"EXECUTE q1(5)"), Classified::Single(SqlStmt::Execute { name: b"q1".to_vec(), span: 8..10 }));
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
        // Longer than any word that cannot, or one of them with more letters.
        b"REFRESH MATERIALIZED VIEW m",
        b"checkpoints",
        b"selec 1",
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
        // The longest such words, in any case.
        b"DeAllocate ALL",
        b"CHECKPOINT",
        b"analyse t",
    ] {
        assert!(!may_change_schema(plain), "{}", String::from_utf8_lossy(plain));
    }
}

#[test]
fn never_panics_on_odd_input() {
    for s in [&b"$"[..], b"$$", b"'", b"\"", b"/*", b"--", b"prepare", b"execute \"", b"deallocate", b"$a$ discard all"]
    {
        let _ = classify(s);
    }
}

/// Where the scanners this module and `stmt::lift` had before `stmt::lex` disagreed with
/// each other or with PostgreSQL's scanner: each now reads as PostgreSQL does.
#[test]
fn reads_as_postgresqls_scanner() {
    let multi = |sql: &[u8]| match classify(sql) {
        Classified::Multi(v) => v.iter().map(|(r, s)| (sql[r.clone()].to_vec(), s.is_some())).collect(),
        _ => Vec::new(),
    };
    // A `$` inside a word is the word's, not a dollar quote's (the splitter took `$b$` for
    // one, and the EXECUTE after it for quoted text).
    assert_eq!(multi(b"select a$b$; execute q"), [(b"select a$b$".to_vec(), false), (b" execute q".to_vec(), true)]);
    assert_eq!(multi(b"select a$$; execute q").len(), 2);
    // `e'` after a `.` opens an E'…' string (the splitter read a plain one, ending at `\'`).
    assert_eq!(multi(b"select t.e'a\\'; b'; execute q").len(), 2);
    // Comments nest wherever they are skipped (the statement's first token was read from
    // after the first `*/`).
    assert_eq!(classify(b"/* /* */ execute q */ select 1"), Classified::Plain);
    assert!(!starts_with_deallocate(b"/* /* */ deallocate */ select 1"));
    // A `--` comment ends at a carriage return too.
    assert_eq!(
        classify(b"-- c\rexecute q"),
        Classified::Single(SqlStmt::Execute { name: b"q".to_vec(), span: 13..14 })
    );
    // Parentheses in quotes and comments do not count.
    let sql = b"EXPLAIN (FORMAT 'a)b', /* ) */ ANALYZE) EXECUTE q";
    assert_eq!(classify(sql), Classified::Single(SqlStmt::Execute { name: b"q".to_vec(), span: 48..49 }));
    assert_eq!(prepare_body(b"(\"t)\"(1)) AS SELECT 1"), Some(&b" SELECT 1"[..]));
    // An E'…' string's escaped quote does not end it for `words` either: the advisory lock
    // after it is seen.
    assert!(holds_session_state(b"select E'\\'', pg_advisory_lock(1)"));
}

/// `is_plain_read`'s locking-clause check (only where an f is) answers as reading every
/// run of letters in turn did.
#[test]
fn locking_clause_found_where_an_f_is() {
    fn by_words(sql: &[u8]) -> bool {
        let mut after_for = false;
        for w in sql.split(|c| !c.is_ascii_alphabetic()).filter(|w| !w.is_empty()) {
            if after_for && [&b"update"[..], b"share", b"no", b"key"].iter().any(|k| w.eq_ignore_ascii_case(k)) {
                return true;
            }
            after_for = w.eq_ignore_ascii_case(b"for");
        }
        false
    }
    for sql in [
        "select 1 for\nupdate",
        "select 1 FOR/**/SHARE",
        "select * from t for",
        "select * from t for ",
        "select for1update",
        "select forupdate",
        "select xfor update",
        "select ffor update",
        "select * from forks for key share",
        "select 'for' || 'no'",
        "select f",
        "select fo",
        "SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
        "select * from t FoR nO KEY UPDATE",
        "select * from t for for update",
        "select * from t for ; update",
        "select * from t for 12 updates",
    ] {
        let b = sql.as_bytes();
        assert_eq!(is_plain_read(b), is_plain_dml(b) && !by_words(b), "{sql}");
    }
    assert!(!is_plain_read(b"select 1 for\nupdate") && is_plain_read(b"select * from forks"));
}
