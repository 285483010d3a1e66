//! The plan guard and per-statement statistics (issue 24) on a real PostgreSQL: a skewed
//! range query that PostgreSQL runs with a bad generic plan through the cache (a few wide
//! ranges, then a narrow one again and again, as `bench/generic_plan.sh`) is demoted and
//! runs as the client sent it, as unnamed extended statements and as autoprepared simple
//! queries; `SHOW STATEMENTS` shows the statistics and the two figures. A named statement
//! the client prepared itself is measured, never demoted.

mod support;

use support::*;

/// `k` in random order: for a third of the table (the generic plan's guess) a scan is
/// cheaper than the index, and that scan is what the narrow range then gets.
const SCHEMA: &str = "create table orders(k int, payload text); \
    insert into orders select g, repeat('x', 50) from generate_series(1, 300000) g order by random(); \
    create index on orders(k); analyze orders;";
const WIDE: i64 = 20;
const TEXT: &str = "select count(payload) from orders where k > $1";

/// The SHOW STATEMENTS row of the statement whose text starts with `text` in `db`.
async fn statement(console: &Pg, db: &str, text: &str) -> Row {
    let all = console_rows(console, "SHOW STATEMENTS").await;
    all.iter()
        .find(|r| r["database"].as_deref() == Some(db) && r["query"].as_deref().is_some_and(|q| q.starts_with(text)))
        .cloned()
        .unwrap_or_else(|| panic!("no SHOW STATEMENTS row for {text:?} in {all:#?}"))
}

fn num(r: &Row, col: &str) -> i64 {
    r.get(col).cloned().flatten().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{col} in {r:?}"))
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Parse "" / Bind (one text parameter) / Execute / Sync of `TEXT`, as psycopg's default
/// cursor sends a query: the count it returns.
async fn unnamed(raw: &mut Raw, n: i64) -> i64 {
    let mut parse = cstr("");
    parse.extend(cstr(TEXT));
    parse.extend(0i16.to_be_bytes());
    let mut bind = cstr("");
    bind.extend(cstr(""));
    bind.extend(0i16.to_be_bytes());
    bind.extend(1i16.to_be_bytes());
    let v = n.to_string();
    bind.extend((v.len() as i32).to_be_bytes());
    bind.extend(v.as_bytes());
    bind.extend(0i16.to_be_bytes());
    let mut exec = cstr("");
    exec.extend(0i32.to_be_bytes());
    let mut out = msg(b'P', &parse);
    out.extend(msg(b'B', &bind));
    out.extend(msg(b'E', &exec));
    out.extend(msg(b'S', &[]));
    raw.send(&out).await.expect("sending");
    let (frames, _) = raw.read_until_ready().await;
    if let Some(e) = frames.iter().find(|f| f.tag == b'E') {
        panic!("{:?}", e.fields());
    }
    let row = frames.iter().find(|f| f.tag == b'D').expect("a row");
    // One column: i16 count, i32 length, text.
    std::str::from_utf8(&row.body[6..]).expect("utf-8").parse().expect("a count")
}

/// Wide ranges first (PostgreSQL's plan cache then keeps a generic plan that scans: enough
/// of them that the first five executions of the server statement are wide ones even with
/// the guard's first samples run as sent), then the narrow range `executions` times; the
/// console tells the rest.
async fn skewed(mut run: impl AsyncFnMut(i64) -> i64, executions: usize) {
    for n in 1..=WIDE {
        assert_eq!(run(n).await, 300_000 - n);
    }
    for _ in 0..executions {
        assert_eq!(run(299_990).await, 10);
    }
}

#[tokio::test]
async fn a_bad_generic_plan_is_demoted_for_unnamed_statements() {
    const DB: &str = "plan_guard_unnamed";
    let p = trust_db(DB, SCHEMA, "pool_size = 1");
    if direct_mode() {
        return;
    }
    bounded(120, "a_bad_generic_plan_is_demoted_for_unnamed_statements", async {
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        let mut raw = p.raw_login("postgres", SUPER_PW, DB).await;
        skewed(async |n| unnamed(&mut raw, n).await, 50).await;
        let r = statement(&console, DB, TEXT).await;
        assert_eq!(r["plan_guard"].as_deref(), Some("demoted"), "{r:#?}\n{}", p.log_tail());
        let (cached, as_sent) = (num(&r, "cached_time"), num(&r, "as_sent_time"));
        assert!(cached > 2 * as_sent, "the figures that demoted it: cached {cached} µs, as sent {as_sent} µs");
        // Executions since promotion, each returning one row; some failed none.
        assert_eq!(num(&r, "calls"), num(&r, "cached_calls") + num(&r, "as_sent_calls"));
        assert_eq!(num(&r, "rows"), num(&r, "calls"));
        assert_eq!(num(&r, "errors"), 0);
        assert!(num(&r, "p50_time") > 0 && num(&r, "p99_time") >= num(&r, "p50_time"), "{r:?}");
        // Demoted: the next executions run as sent, every one.
        let before = num(&r, "as_sent_calls");
        for _ in 0..20 {
            assert_eq!(unnamed(&mut raw, 299_990).await, 10);
        }
        let r = statement(&console, DB, TEXT).await;
        assert_eq!(num(&r, "as_sent_calls") - before, 20, "{r:?}");
        let prepared = console_rows(&console, "SHOW PREPARED_STATEMENTS").await;
        let mine = prepared.iter().find(|r| r["database"].as_deref() == Some(DB)).expect("PREPARED_STATEMENTS");
        assert_eq!(num(mine, "demotions"), 1, "{mine:?}");
        assert!(p.wait_for_log("plan guard", std::time::Duration::from_secs(5)), "the demotion is logged");
    })
    .await;
}

#[tokio::test]
async fn a_bad_generic_plan_is_demoted_for_autoprepared_queries() {
    const DB: &str = "plan_guard_simple";
    let p = trust_db(DB, SCHEMA, "pool_size = 1\nautoprepare = true");
    if direct_mode() {
        return;
    }
    bounded(120, "a_bad_generic_plan_is_demoted_for_autoprepared_queries", async {
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        let c = p.connect("postgres", SUPER_PW, DB).await;
        skewed(
            async |n| {
                c.scalar(&format!("select count(payload) from orders where k > {n}")).await.unwrap().parse().unwrap()
            },
            50,
        )
        .await;
        let r = statement(&console, DB, "select count(payload) from orders where k > $1").await;
        assert_eq!(r["plan_guard"].as_deref(), Some("demoted"), "{r:#?}\n{}", p.log_tail());
        assert!(num(&r, "as_sent_calls") > 0 && num(&r, "cached_calls") > 0, "{r:?}");
    })
    .await;
}

#[tokio::test]
async fn client_named_statements_are_measured_not_demoted() {
    const DB: &str = "plan_guard_named";
    let p = trust_db(DB, SCHEMA, "pool_size = 1");
    if direct_mode() {
        return;
    }
    bounded(120, "client_named_statements_are_measured_not_demoted", async {
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        let c = p.connect("postgres", SUPER_PW, DB).await;
        // tokio-postgres prepares under a name of its own.
        let st = c.prepare("select count(payload) from orders where k > $1::int").await.unwrap();
        skewed(
            async |n| {
                let n = n as i32;
                c.query_one(&st, &[&n]).await.unwrap().get::<_, i64>(0)
            },
            30,
        )
        .await;
        let r = statement(&console, DB, "select count(payload) from orders where k > $1::int").await;
        assert_eq!(r["plan_guard"].as_deref(), Some(""), "{r:?}");
        assert_eq!((num(&r, "cached_calls"), num(&r, "as_sent_calls")), (50, 0), "{r:?}");
        assert_eq!(num(&r, "rows"), 50);
        assert!(num(&r, "total_time") > 0);
    })
    .await;
}
