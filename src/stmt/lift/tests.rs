//! The lexer decisions of `stmt::lift`: what is lifted, what stays, and why.

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
    let (t, ty, v) = lifted("select 2147483647, 2147483648, 9223372036854775807, 9223372036854775808, 007").unwrap();
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
        lifted("select a, count(*) from t group by a having count(*) > 2 order by 2").unwrap().0,
        "select a, count(*) from t group by a having count(*) > $1 order by 2"
    );
    assert_eq!(
        lifted("select distinct on (a) a, b from t where c = 5 order by a, b").unwrap().0,
        "select distinct on (a) a, b from t where c = $1 order by a, b"
    );
    // A list inside another does not end it: `2` is still a position.
    assert_eq!(
        lifted("select a, b from t order by (select 1 from u order by 1 limit 1), 2 limit 3").unwrap().0,
        "select a, b from t order by (select 1 from u order by 1 limit 1), 2 limit $1"
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

#[test]
fn matched_lists_with_numbers_are_not_lifted() {
    // PostgreSQL matches GROUP BY expressions to the select list, HAVING and ORDER BY, and
    // with DISTINCT the ORDER BY (or DISTINCT ON) expressions to the select list: a literal
    // lifted on one side only no longer matches.
    for sql in [
        "select x + 1, count(*) from t group by x + 1",
        "select x + 1, count(*) from t group by 1 having x + 1 > 2",
        "select x + 1 from t group by 1 order by x + 1",
        "select a from t where b = 2 group by rollup (1)",
        "select distinct x + 1 from t order by x + 1",
        "select distinct on (1) x + 1, y from t order by x + 1, y",
        "select array_agg(distinct x + 1 order by x + 1) from t",
    ] {
        assert_eq!(lifted(sql), None, "{sql}");
    }
    // Without numbers in them, those lists match as before.
    assert_eq!(lifted("select x + 1 from t group by x").unwrap().0, "select x + $1 from t group by x");
    assert_eq!(
        lifted("select distinct x + 1 from t order by x").unwrap().0,
        "select distinct x + $1 from t order by x"
    );
    // `IS DISTINCT FROM` is no DISTINCT clause.
    assert_eq!(
        lifted("select a from t where b is distinct from 2 order by 1").unwrap().0,
        "select a from t where b is distinct from $1 order by 1"
    );
}

#[test]
fn constants_of_the_grammar_stay() {
    for (sql, text) in [
        // The precision of CURRENT_TIME and its kin: an Iconst.
        ("select current_timestamp(0), localtime(2), 1", "select current_timestamp(0), localtime(2), $1"),
        ("select CURRENT_TIME(3), LOCALTIMESTAMP(3), 1", "select CURRENT_TIME(3), LOCALTIMESTAMP(3), $1"),
        // Type modifiers of every spelling of a type name.
        ("select nchar(2) 'abc', 1", "select nchar(2) 'abc', $1"),
        (
            "select interval(3) '1 s', time(2) with time zone '00:00', 1",
            "select interval(3) '1 s', time(2) with time zone '00:00', $1",
        ),
        ("select \"numeric\"(5,2) '1.2', 1", "select \"numeric\"(5,2) '1.2', $1"),
        (
            "select x::\"numeric\"(5,2), cast(x as \"numeric\"(5, 2)), 1",
            "select x::\"numeric\"(5,2), cast(x as \"numeric\"(5, 2)), $1",
        ),
        ("select mytype(3) 'v', f(3) + 1", "select mytype(3) 'v', f($1) + $2"),
        ("select mytype(3) $$v$$, 1", "select mytype(3) $$v$$, $1"),
        ("select x::int array[3], 1", "select x::int array[3], $1"),
        // Column definition lists: after AS, after an alias, after AS alone.
        ("select * from f(1) as t(a mytype(3)) where 2 = 2", "select * from f($1) as t(a mytype(3)) where $2 = $3"),
        (
            "select * from f(1) t(a mytype(3), b int[2]) where 2 = 2",
            "select * from f($1) t(a mytype(3), b int[2]) where $2 = $3",
        ),
        (
            "select * from rows from (f(1) as (a mytype(3))) where 2 = 2",
            "select * from rows from (f($1) as (a mytype(3))) where $2 = $3",
        ),
        // FETCH FIRST / OFFSET … ROWS take a signed constant, not an expression.
        ("select x from t fetch first -1 rows only", "select x from t fetch first -1 rows only"),
        (
            "select x from t offset +1 rows fetch next +2 rows with ties",
            "select x from t offset +1 rows fetch next +2 rows with ties",
        ),
        (
            "select x from t offset 1 rows fetch first 2 rows only",
            "select x from t offset $1 rows fetch first $2 rows only",
        ),
        // A CTE's CYCLE clause: TO and DEFAULT take constants.
        (
            "with recursive r(n) as (select 1 union all select n + 1 from r) cycle n set c to 1 default 0 using p \
                select * from r",
            "with recursive r(n) as (select $1 union all select n + $2 from r) cycle n set c to 1 default 0 using p \
                select * from r",
        ),
        // `$1[1]` and `$1.a` would subscript and select from the parameter.
        ("select 1[1], 2 .a, 3", "select 1[$1], 2 .a, $2"),
        // The ON CONFLICT target is matched to an index's expressions and predicate.
        (
            "insert into t values (1) on conflict ((a + 1)) where a > 5 do update set b = 2",
            "insert into t values ($1) on conflict ((a + 1)) where a > 5 do update set b = $2",
        ),
        // Leading zeros: PostgreSQL folds the minus into `-02147483648` too (an int4).
        ("select -02147483648, -009223372036854775808, 1", "select -02147483648, -009223372036854775808, $1"),
        // A numeric that might not convert stays, so its error is the parse's.
        ("select 1e1000000, 1e-1001, 1e1000, 1", "select 1e1000000, 1e-1001, $1, $2"),
    ] {
        assert_eq!(lifted(sql).map(|l| l.0), (text.contains('$')).then(|| text.to_owned()), "{sql}");
    }
    let long = format!("select {}, 1", "9".repeat(1001));
    assert_eq!(lifted(&long).unwrap().0, format!("select {}, $1", "9".repeat(1001)));
    // XMLTABLE names column types without `::` or AS: left alone.
    assert_eq!(lifted("select * from xmltable('/a' passing x columns a mytype(3) path 'b') where 1 = 1"), None);
}

#[test]
fn aliases_end_where_the_type_name_would() {
    // After `AS alias`, a reserved word ends the alias: the groups that follow are not type
    // modifiers.
    assert_eq!(
        lifted("select count(*) as n from t where x in (1, 2) and y = f(3)").unwrap().0,
        "select count(*) as n from t where x in ($1, $2) and y = f($3)"
    );
    assert_eq!(
        lifted("with c as materialized (select 1) select * from c, (select 2) as d(x) where x = 3").unwrap().0,
        "with c as materialized (select $1) select * from c, (select $2) as d(x) where x = $3"
    );
    assert_eq!(
        lifted("select sum(x) over w from t window w as (rows between 1 preceding and 1 following)").unwrap().0,
        "select sum(x) over w from t window w as (rows between $1 preceding and $2 following)"
    );
    assert_eq!(lifted("insert into t (a) values (1)").unwrap().0, "insert into t (a) values ($1)");
    assert_eq!(lifted("(select 1) union (select 2)"), None);
    assert_eq!(
        lifted("select 1 from t tablesample system (10) repeatable (2)").unwrap().0,
        "select $1 from t tablesample system ($2) repeatable ($3)"
    );
}

#[test]
fn error_texts_name_the_clients_literal() {
    let sql = b"select 1 2, 34";
    let l = lift(sql, false).unwrap();
    assert_eq!(l.text, b"select $1 $2, $3");
    let o = Origin::new(sql, &l);
    // PostgreSQL: `syntax error at or near "$2"` at position 11 of the lifted text.
    assert_eq!(o.client_position(11), 10);
    assert_eq!(&*o.client_text(11, b"syntax error at or near \"$2\""), b"syntax error at or near \"2\"");
    // Another token at the position: the text stays.
    assert_eq!(&*o.client_text(13, b"syntax error at or near \",\""), b"syntax error at or near \",\"");
    assert_eq!(&*o.client_text(15, b"near \"$3\""), b"near \"34\"");
    // `$2` is not the start of `$21`; other languages quote otherwise.
    assert_eq!(&*o.client_text(11, "$21 \u{bb}$2\u{ab}".as_bytes()), "$21 \u{bb}2\u{ab}".as_bytes());
}

/// Where the lifter's own scanner (before `stmt::lex`) read otherwise than PostgreSQL: a
/// word written against a quote was dropped, and a `--` comment ran past a carriage return.
/// Both hid a RETURNING.
#[test]
fn reads_as_postgresqls_scanner() {
    assert_eq!(lifted("insert into t values (1) returning\"id\""), None);
    assert_eq!(lifted("insert into t values (1) --x\rreturning id"), None);
    assert!(lifted("insert into t values (1) --x\nreturning id").is_none());
    // A prefixed string is one string token: the number after it is lifted.
    assert_eq!(lifted("select U&'x', E'\\'', 2").unwrap().0, "select U&'x', E'\\'', $1");
}
