use super::*;

fn found(sql: &str) -> Vec<(&str, bool)> {
    sites(sql.as_bytes()).into_iter().map(|s| (&sql[s.range], s.needs_alias)).collect()
}

#[test]
fn finds_the_view_where_it_is_read() {
    assert_eq!(found("select count(*) from pg_prepared_statements"), [("pg_prepared_statements", true)]);
    assert_eq!(
        found("SELECT * FROM PG_CATALOG.Pg_Prepared_Statements p"),
        [("PG_CATALOG.Pg_Prepared_Statements", false)]
    );
    assert_eq!(found("select * from \"pg_prepared_statements\" as x"), [("\"pg_prepared_statements\"", false)]);
    assert_eq!(
        found("select 1 from t join pg_prepared_statements on true, pg_prepared_statements where 1=1"),
        [("pg_prepared_statements", true), ("pg_prepared_statements", true)]
    );
    assert_eq!(
        found("with x as (select name from pg_prepared_statements order by name) select * from x"),
        [("pg_prepared_statements", true)]
    );
    assert_eq!(found("select 1; select name from pg_prepared_statements;"), [("pg_prepared_statements", true)]);
}

#[test]
fn leaves_other_mentions_alone() {
    for sql in [
        "select 'from pg_prepared_statements'",
        "select 1 -- from pg_prepared_statements",
        "select $$ from pg_prepared_statements $$",
        "select pg_prepared_statements.name from t",
        "select * from other.pg_prepared_statements",
        "select * from pg_prepared_statements2",
        "create view v as select * from pg_prepared_statements",
        "prepare p as select * from pg_prepared_statements",
        "select a, pg_prepared_statements from t",
        "select * from \"PG_PREPARED_STATEMENTS\"",
    ] {
        assert_eq!(found(sql), [], "{sql}");
    }
    assert!(!mentions(b"select 1"));
    assert!(mentions(b"x.PG_PREPARED_STATEMENTS"));
}

#[test]
fn json_escapes_and_types() {
    let e = [
        Entry {
            name: b"a\"b",
            statement: b"select '\\'\n",
            from_sql: false,
            ago_us: 5,
            server_name: "pn_1",
            types: Types::Oids(&[0, 0, 0, 23, 0, 0, 0, 0]),
        },
        Entry {
            name: b"q",
            statement: b"PREPARE q (int, numeric(10, 2)) AS select 1",
            from_sql: true,
            ago_us: 0,
            server_name: "pn_2",
            types: Types::Prepare(b" (int, numeric(10, 2)) AS select 1"),
        },
    ];
    let j = String::from_utf8(json(&e)).unwrap();
    assert_eq!(
        j,
        r#"[{"name":"a\"b","statement":"select '\\'\u000a","from_sql":false,"s":"pn_1","p":[23,"unknown"],"a":"5 microseconds"},{"name":"q","statement":"PREPARE q (int, numeric(10, 2)) AS select 1","from_sql":true,"s":"pn_2","p":["int","numeric(10, 2)"],"a":"0 microseconds"}]"#
    );
    assert_eq!(prepare_types(b"AS select 1"), Vec::<&[u8]>::new());
}

#[test]
fn dollar_tag_avoids_the_data() {
    let e = [Entry {
        name: b"x",
        statement: b"select $pn$ $pn1$",
        from_sql: false,
        ago_us: 0,
        server_name: "pn_1",
        types: Types::Oids(&[]),
    }];
    let q = String::from_utf8(subquery(&e).unwrap()).unwrap();
    assert!(q.contains("jsonb_array_elements($pn2$["), "{q}");
    let (sql, edits) = rewrite(
        b"select * from pg_prepared_statements where 1=1",
        &sites(b"select * from pg_prepared_statements where 1=1"),
        b"(X)",
    );
    assert_eq!(sql, b"select * from (X) AS pg_prepared_statements where 1=1");
    // "where" is at 45 in the text sent, at 38 in the client's.
    assert_eq!(crate::stmt::lift::client_position(&edits, 45), 38);
}
