//! The judge of `stmt::lift` (autoprepare's literal lifting): every query runs directly
//! against PostgreSQL twice, as the literal simple Query and as its lifted form (Parse with
//! the declared parameter types, Bind with the literals as text values, Describe portal,
//! Execute, Sync), and the replies must be the same: RowDescription (names, type OIDs,
//! typmods, formats), DataRows and CommandComplete byte for byte, errors with the same
//! SQLSTATE, message and position (mapped back to the client's text, as the session maps
//! them: `Origin`). A fixed corpus of the literal forms, then random expressions over
//! literals.

#[allow(unused_imports)] // this test uses the cluster and the raw client, not the pooler helpers
mod support;

use parsnip::stmt::lift::{Origin, lift};
use support::*;

/// The replies that must match, as comparable strings.
fn normalized(frames: &[Frame], origin: Option<&Origin>) -> Vec<String> {
    frames
        .iter()
        .filter(|f| !matches!(f.tag, b'1' | b'2' | b'n' | b'Z'))
        .map(|f| match f.fields() {
            Some(e) if f.tag == b'E' => {
                let at = e.fields.get(&b'P').and_then(|p| p.parse::<i64>().ok());
                let (pos, message) = match (origin, at) {
                    (Some(o), Some(p)) => (
                        Some(o.client_position(p)),
                        String::from_utf8_lossy(&o.client_text(p, e.message().as_bytes())).into_owned(),
                    ),
                    _ => (at, e.message().to_owned()),
                };
                let context = e.fields.get(&b'W');
                format!("E {} {message} @{pos:?} {context:?}", e.code())
            }
            _ => format!("{} {}", f.tag as char, hex(&f.body)),
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn cstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.push(0);
}

async fn compare(raw: &mut Raw, sql: &str) -> bool {
    let Some(l) = lift(sql.as_bytes(), false) else { return false };
    // Each form in a transaction rolled back: writes run twice on the same rows.
    raw.simple_query("BEGIN").await.unwrap();
    raw.send(&query_msg(sql)).await.unwrap();
    let (direct, _) = raw.read_until_ready().await;
    raw.simple_query("ROLLBACK").await.unwrap();
    raw.simple_query("BEGIN").await.unwrap();
    let mut batch = Vec::new();
    let mut body = Vec::new();
    cstr(&mut body, b"");
    cstr(&mut body, &l.text);
    body.extend_from_slice(&(l.types.len() as i16).to_be_bytes());
    for t in &l.types {
        body.extend_from_slice(&t.to_be_bytes());
    }
    batch.extend(msg(b'P', &body));
    body.clear();
    cstr(&mut body, b"");
    cstr(&mut body, b"");
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&(l.values.len() as i16).to_be_bytes());
    for v in &l.values {
        let v = &sql.as_bytes()[v.clone()];
        body.extend_from_slice(&(v.len() as i32).to_be_bytes());
        body.extend_from_slice(v);
    }
    body.extend_from_slice(&0i16.to_be_bytes());
    batch.extend(msg(b'B', &body));
    batch.extend(msg(b'D', b"P\0"));
    batch.extend(msg(b'E', b"\0\0\0\0\0"));
    batch.extend(msg(b'S', b""));
    raw.send(&batch).await.unwrap();
    let (lifted, _) = raw.read_until_ready().await;
    raw.simple_query("ROLLBACK").await.unwrap();
    let origin = Origin::new(sql.as_bytes(), &l);
    let (a, b) = (normalized(&direct, None), normalized(&lifted, Some(&origin)));
    assert_eq!(a, b, "\n{sql}\nlifted: {}", String::from_utf8_lossy(&l.text));
    true
}

#[tokio::test]
async fn lifted_statements_answer_as_their_literal_forms() {
    let mut raw = Raw::tcp(cluster().port()).await;
    raw.startup(&[("user", "postgres"), ("database", "postgres")], Some(SUPER_PW)).await.unwrap();
    raw.simple_query(
        "DROP TABLE IF EXISTS lift_t; CREATE TABLE lift_t (id int PRIMARY KEY, s smallint, b bigint, n numeric(10,2), \
         t text, f float8); INSERT INTO lift_t SELECT g, g % 100, g::bigint * 1000000000, g / 7.0, 'row ' || g, \
         g / 3.0 FROM generate_series(1, 50) g",
    )
    .await
    .unwrap();
    let corpus = [
        "SELECT * FROM lift_t WHERE id = 7",
        "SELECT id, t FROM lift_t WHERE id IN (1, 2, 3) ORDER BY 1 DESC LIMIT 2",
        "SELECT count(*), max(n) FROM lift_t WHERE n > 1.5 AND b < 30000000000",
        "SELECT 1, 2147483647, 2147483648, 9223372036854775807, 9223372036854775808, 0.0, 1e3, .5, 007",
        "SELECT -1, - 2, -2147483648, -9223372036854775808, 3 - -4, 2 ^ 10, 7 / 2, 7 % 3, 7.0 / 2",
        "SELECT 1 + 1 AS two, 1::text, 2::numeric(5,1), 3::int8, 4::float4, 5::smallint",
        "SELECT abs(-5), greatest(1, 2.5, 3), coalesce(NULL, 4), round(2.567, 2), generate_series(1, 3)",
        "SELECT s FROM lift_t WHERE s = 70000",
        "INSERT INTO lift_t (id, s) VALUES (1000, 40000)",
        "INSERT INTO lift_t (id, s, n) VALUES (1001, 12, 12345678901.5)",
        "SELECT t || 5, id * 2.5, f * 2 FROM lift_t WHERE id BETWEEN 3 AND 5 ORDER BY id",
        "SELECT CASE WHEN id = 1 THEN 10 ELSE 20.5 END FROM lift_t WHERE id < 3 ORDER BY 1",
        "SELECT id FROM lift_t ORDER BY 1 LIMIT 3 OFFSET 1",
        "SELECT s, count(*) FROM lift_t GROUP BY s HAVING count(*) > 0 ORDER BY 1 LIMIT 2",
        "SELECT DISTINCT ON (s) s, id FROM lift_t WHERE id > 40 ORDER BY s, id",
        "SELECT ARRAY[1, 2, 3], (ARRAY[10, 20, 30])[2], '{1,2,3}'::int[]",
        "SELECT 1 FROM lift_t WHERE t = 5",
        "SELECT nocolumn + 1 FROM lift_t WHERE id = 12345",
        "SELECT 10 / 0",
        "SELECT 2147483647 + 1",
        "SELECT 9223372036854775807 + 1",
        "UPDATE lift_t SET b = b + 1 WHERE id = 2",
        "DELETE FROM lift_t WHERE id = 1000",
        "WITH x AS (SELECT 5 AS v) SELECT v * 2 FROM x",
        "VALUES (1, 'a'), (2, 'b')",
        "SELECT 1 UNION SELECT 2.5 ORDER BY 1",
        "SELECT now()::date - 1 > '2000-01-01', interval '1 day' * 3, 3 * interval '2 hours'",
        "SELECT substr('abcdef', 2, 3), repeat('x', 3), lpad('7', 3, '0')",
        "SELECT 1 = 1.0, 1 < 2, 2 <> 3, 5 BETWEEN 1 AND 10",
        "SELECT x FROM generate_series(1, 10) AS g(x) WHERE x % 3 = 0",
        "SELECT sum(x) OVER (ORDER BY x ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM generate_series(1, 4) x",
        "SELECT id FROM lift_t WHERE id = ANY(ARRAY[4, 5]) AND t LIKE 'row %' ORDER BY id",
        "SELECT 1.50, 1.500::numeric(6,3), 100000000000000000000000000000.1",
        "SELECT pg_typeof(1), pg_typeof(2147483648), pg_typeof(1.0), pg_typeof(-2147483648)",
        "SELECT * FROM lift_t WHERE id = 3 FOR UPDATE",
        "SELECT 1 -- trailing 2\n + /* 3 */ 4",
        "SELECT id FROM lift_t WHERE id = 5;",
        // Issue 23: numbers where the grammar wants a constant stay (each query has another
        // literal that is lifted).
        "SELECT CURRENT_TIMESTAMP(0) IS NOT NULL, LOCALTIME(2) IS NOT NULL, 1",
        "SELECT CURRENT_TIME(3) IS NOT NULL, LOCALTIMESTAMP(3) IS NOT NULL, CURRENT_TIMESTAMP(7) IS NOT NULL, 1",
        "SELECT INTERVAL '1.2345' SECOND(2), INTERVAL '1.2345' DAY TO SECOND(1), interval(3) '1.23456 s', 1",
        "SELECT timestamp(2) '2020-01-01 00:00:01.2345', time(2) with time zone '00:00:01.2345+02', 1",
        "SELECT nchar(2) 'abc', national character varying(2) 'abc', bit(3) '101', float(24) '1.5', 1",
        "SELECT \"numeric\"(5,2) '1.2345', pg_catalog.numeric(5,2) '1.2345', 1.2345::\"numeric\"(5,1), 1",
        "SELECT CAST(1.2345 AS \"numeric\"(5,2)), '{1,2}'::int ARRAY[3], 1",
        "SELECT * FROM json_to_record('{\"a\":1.2345}') t(a \"numeric\"(5,2)) WHERE 1 = 1",
        "SELECT * FROM ROWS FROM (json_to_record('{\"a\":1.2345}') AS (a \"numeric\"(5,2))) WHERE 1 = 1",
        "SELECT id, 1 FROM lift_t ORDER BY id OFFSET +1 ROWS FETCH FIRST +2 ROWS ONLY",
        "SELECT id, 1 FROM lift_t ORDER BY id OFFSET -1 ROWS",
        "SELECT id, 1 FROM lift_t ORDER BY id FETCH NEXT -1 ROWS WITH TIES",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) \
         CYCLE n SET c TO 1 DEFAULT 0 USING p SELECT n, c FROM r",
        "SELECT relname, 1 FROM pg_class ORDER BY (SELECT 1 ORDER BY 1 LIMIT 1), 2 DESC, 1 LIMIT 3",
        "SELECT pg_typeof(-02147483648), pg_typeof(-009223372036854775808), 1",
        "SELECT 1e1000000, 1",
        // A syntax error at a lifted literal quotes the client's literal, not `$2`.
        "SELECT 1 2",
        "SELECT 3 + 1.5 2.5e3",
        "SELECT id FROM lift_t WHERE id = 1 2",
        "SELECT 1 FROM 2",
        // `$1[1]` and `$1 .a` would subscript and select from a parameter.
        "SELECT 1[1], 2",
        "SELECT 1 .a, 2",
    ];
    for sql in corpus {
        assert!(compare(&mut raw, sql).await, "not lifted: {sql}");
    }
    // Not lifted at all: a literal lifted in the select list and kept in GROUP BY (or the
    // ORDER BY of a DISTINCT) no longer matches it.
    for sql in [
        "SELECT s + 1, count(*) FROM lift_t GROUP BY s + 1 ORDER BY 1",
        "SELECT s + 1, count(*) FROM lift_t GROUP BY 1 HAVING s + 1 > 2 ORDER BY 1",
        "SELECT s + 1, count(*) FROM lift_t GROUP BY 1 ORDER BY s + 1",
        "SELECT DISTINCT s + 1 FROM lift_t ORDER BY s + 1",
        "SELECT DISTINCT ON (1) s + 1, id FROM lift_t ORDER BY s + 1, id",
        "SELECT array_agg(DISTINCT s + 1 ORDER BY s + 1) FROM lift_t",
    ] {
        assert!(!compare(&mut raw, sql).await, "lifted: {sql}");
    }
}

/// Under a generic plan (what PostgreSQL may choose for a statement the cache keeps), an
/// `ON CONFLICT` target is matched to the index by its expressions and predicate as they
/// are written: a parameter there matches nothing.
#[tokio::test]
async fn on_conflict_targets_keep_their_literals() {
    let mut raw = Raw::tcp(cluster().port()).await;
    raw.startup(&[("user", "postgres"), ("database", "postgres")], Some(SUPER_PW)).await.unwrap();
    raw.simple_query(
        "DROP TABLE IF EXISTS lift_oc; CREATE TABLE lift_oc (id int, a int); \
         CREATE UNIQUE INDEX ON lift_oc (id) WHERE id > 5; CREATE UNIQUE INDEX ON lift_oc ((a + 100)); \
         SET plan_cache_mode = force_generic_plan",
    )
    .await
    .unwrap();
    for sql in [
        "INSERT INTO lift_oc VALUES (7, 1) ON CONFLICT (id) WHERE id > 5 DO NOTHING",
        "INSERT INTO lift_oc VALUES (8, 2) ON CONFLICT ((a + 100)) DO UPDATE SET a = 3",
    ] {
        assert!(compare(&mut raw, sql).await, "not lifted: {sql}");
    }
}

#[tokio::test]
async fn random_expressions_answer_alike() {
    let mut raw = Raw::tcp(cluster().port()).await;
    raw.startup(&[("user", "postgres"), ("database", "postgres")], Some(SUPER_PW)).await.unwrap();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    fn literal(r: &mut dyn FnMut(u64) -> u64) -> String {
        match r(8) {
            0 => r(10).to_string(),
            1 => (2147483640 + r(20)).to_string(),
            2 => (9223372036854775800u64 + r(15)).to_string(),
            3 => format!("{}.{}", r(1000), r(100)),
            4 => format!("{}e{}", r(9) + 1, r(5)),
            5 => format!("-{}", r(3000000000)),
            6 => format!("{}::numeric(8, 2)", r(1000)),
            _ => format!(".{}", r(999) + 1),
        }
    }
    fn expr(r: &mut dyn FnMut(u64) -> u64, depth: u32) -> String {
        if depth == 0 || r(3) == 0 {
            return literal(r);
        }
        let (a, b) = (expr(r, depth - 1), expr(r, depth - 1));
        match r(9) {
            0 => format!("({a} + {b})"),
            1 => format!("({a} - {b})"),
            2 => format!("({a} * {b})"),
            3 => format!("({a} / nullif({b}, 0))"),
            4 => format!("greatest({a}, {b})"),
            5 => format!("({a} < {b})::int"),
            6 => format!("abs({a})"),
            7 => format!("coalesce({a}, {b})"),
            _ => format!("({a} % nullif({b}, 0))"),
        }
    }
    let mut lifted = 0;
    for _ in 0..300 {
        let sql = format!("SELECT {}, {}", expr(&mut next, 3), expr(&mut next, 2));
        lifted += usize::from(compare(&mut raw, &sql).await);
    }
    assert!(lifted > 250, "only {lifted} of 300 lifted");
}
