//! The admin console as PgBouncer's users drive it: SHOW STATS counters move by exactly what
//! clients did, SHOW CLIENTS and SHOW SERVERS show who is linked to whom, and the commands
//! (PAUSE, RESUME, KILL_CLIENT, KILL, DISABLE, ENABLE, RECONNECT, WAIT_CLOSE, SHUTDOWN),
//! stats_users and the signals (SIGUSR1, SIGUSR2, SIGHUP) do what PgBouncer's do.

mod support;

use std::time::{Duration, Instant};
use support::*;

/// The row of `sql` whose `key` column is `value`.
async fn row(console: &Pg, sql: &str, key: &str, value: &str) -> Option<Row> {
    console_rows(console, sql).await.into_iter().find(|r| r.get(key).cloned().flatten().as_deref() == Some(value))
}

fn num(r: &Row, col: &str) -> i64 {
    r.get(col).cloned().flatten().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{col} in {r:?}"))
}

async fn stat(console: &Pg, db: &str, col: &str) -> i64 {
    let r = row(console, "SHOW STATS", "database", db).await.unwrap_or_else(|| panic!("no SHOW STATS row for {db}"));
    num(&r, col)
}

/// Polls the console (bounded) until `f` holds.
async fn until<F: AsyncFn() -> bool>(p: &Parsnip, what: &str, f: F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not reached\n{}", p.log_tail());
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn stats_count_what_clients_did_and_clients_show_their_links() {
    const DB: &str = "console_stats";
    create_db(DB);
    let p = Parsnip::trust("");
    if direct_mode() {
        return;
    }
    bounded(60, "stats_count_what_clients_did", async {
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        let mut cfg = pg_config(p.port(), "postgres", Some(SUPER_PW), DB);
        cfg.application_name("stats-app");
        let c = Pg::connect_config(&mut cfg).await.expect("client");
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        let cols = [
            "total_query_count",
            "total_xact_count",
            "total_client_parse_count",
            "total_bind_count",
            "total_received",
            "total_sent",
        ];
        let mut before = Vec::new();
        for col in cols {
            before.push(stat(&console, DB, col).await);
        }
        // 5 one-statement transactions, then one of three queries. (No numeric literal: a
        // query autoprepare runs from a cached statement counts its Parse and Bind too.)
        for _ in 0..5 {
            assert_eq!(c.scalar("select 'two'").await.unwrap(), "two");
        }
        c.simple_query("BEGIN").await.unwrap();
        // Inside the transaction the client is linked to a server: SHOW SERVERS names the
        // client and the backend's real pid.
        let backend = c.scalar("select pg_backend_pid()").await.unwrap();
        let me = row(&console, "SHOW CLIENTS", "application_name", "stats-app").await.expect("SHOW CLIENTS row");
        let server = row(&console, "SHOW SERVERS", "remote_pid", &backend).await.expect("SHOW SERVERS row");
        assert_eq!(server["state"].as_deref(), Some("active"));
        assert_eq!(server["link"], me["ptr"], "the server links to its client");
        assert_eq!(me["link"], server["ptr"], "the client links to its server");
        assert_eq!(me["database"].as_deref(), Some(DB));
        assert_eq!(me["addr"].as_deref(), Some("127.0.0.1"));
        // The console's own connection is listed too, as PgBouncer lists it (the Prometheus
        // community's pgbouncer_exporter counts clients by database and state from it).
        let own = row(&console, "SHOW CLIENTS", "database", "pgbouncer").await.expect("the console's own row");
        assert_eq!(own["state"].as_deref(), Some("active"));
        assert_eq!(own["user"].as_deref(), Some("postgres"));
        assert_eq!(own["addr"].as_deref(), Some("127.0.0.1"));
        c.simple_query("COMMIT").await.unwrap();
        // Extended protocol: one Parse, three Binds.
        let st = c.prepare("select $1::int").await.unwrap();
        for i in 0..3i32 {
            let r = c.query_one(&st, &[&i]).await.unwrap();
            assert_eq!(r.get::<_, i32>(0), i);
        }
        let mut after = Vec::new();
        for col in cols {
            after.push(stat(&console, DB, col).await);
        }
        let d: Vec<i64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        // 5 + 3 simple queries, the prepare's Sync, three executions.
        assert_eq!(d[0], 12, "total_query_count");
        assert_eq!(d[1], 10, "total_xact_count: 5 + 1 + prepare + 3");
        assert_eq!(d[2], 1, "total_client_parse_count");
        assert_eq!(d[3], 3, "total_bind_count");
        assert!(d[4] > 0 && d[5] > d[4], "bytes received {} and sent {}", d[4], d[5]);
        // The same figures per database in STATS_TOTALS, and summed in TOTALS.
        let totals = row(&console, "SHOW STATS_TOTALS", "database", DB).await.expect("STATS_TOTALS");
        assert_eq!(num(&totals, "query_count"), after[0]);
        let all = row(&console, "SHOW TOTALS", "name", "total_query_count").await.expect("TOTALS");
        assert!(num(&all, "value") >= after[0]);
        let prepared = row(&console, "SHOW PREPARED_STATEMENTS", "database", DB).await.expect("PREPARED_STATEMENTS");
        assert_eq!(num(&prepared, "client_parses"), after[2], "one counter, two commands");
    })
    .await;
}

/// A statement Describe of a cached statement whose description a server gave since the
/// last schema change is answered by parsnip (SHOW PREPARED_STATEMENTS' describes_saved
/// counts it), with what PostgreSQL would answer; DDL through parsnip sends the next
/// Describe to a server, and clients get the new shape. RECONNECT (after a migration run
/// elsewhere) also sends the next Describe to a server.
#[tokio::test]
async fn describe_answered_from_cache_until_a_schema_change() {
    const DB: &str = "console_describe";
    create_db(DB);
    let p = Parsnip::trust("describe_from_cache = true");
    if direct_mode() {
        return;
    }
    bounded(60, "describe_answered_from_cache_until_a_schema_change", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let saved = async || {
            let r = row(&console, "SHOW PREPARED_STATEMENTS", "database", DB).await.expect("PREPARED_STATEMENTS");
            num(&r, "describes_saved")
        };
        let names = |s: &tokio_postgres::Statement| s.columns().iter().map(|c| c.name().to_owned()).collect::<Vec<_>>();
        let a = p.connect("postgres", SUPER_PW, DB).await;
        a.batch_execute("DROP TABLE IF EXISTS d; CREATE TABLE d (a int, t text); INSERT INTO d VALUES (1, 'one')")
            .await
            .unwrap();
        let sql = "SELECT * FROM d WHERE a = $1";
        // Parse + Describe + Sync: the first goes to a server.
        let s1 = a.prepare(sql).await.unwrap();
        let n0 = saved().await;
        // Another client's Parse and Describe of the same text: both answered by parsnip.
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let s2 = b.prepare(sql).await.unwrap();
        assert_eq!(saved().await, n0 + 1, "the second Describe is answered from the cache");
        assert_eq!(names(&s2), ["a", "t"]);
        assert_eq!(s2.params(), [tokio_postgres::types::Type::INT4]);
        let r = b.query_one(&s2, &[&1i32]).await.unwrap();
        assert_eq!(r.get::<_, &str>(1), "one");
        // A schema change through parsnip: the next Describe goes to a server, which finds
        // the cached statement's result type changed; the client gets the new shape.
        a.batch_execute("ALTER TABLE d ADD COLUMN b int").await.unwrap();
        let c = p.connect("postgres", SUPER_PW, DB).await;
        let s3 = c.prepare(sql).await.unwrap();
        assert_eq!(names(&s3), ["a", "t", "b"]);
        assert_eq!(saved().await, n0 + 1, "no Describe answered locally across DDL");
        // That description is current again: the next client's is answered locally.
        let d = p.connect("postgres", SUPER_PW, DB).await;
        let s4 = d.prepare(sql).await.unwrap();
        assert_eq!(names(&s4), ["a", "t", "b"]);
        assert_eq!(saved().await, n0 + 2);
        let r = d.query_one(&s4, &[&1i32]).await.unwrap();
        assert_eq!(r.get::<_, Option<i32>>(2), None);
        // RECONNECT: the next Describe is confirmed by a server again, then trusted.
        console.simple_query("RECONNECT").await.expect("RECONNECT");
        let e2 = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(names(&e2.prepare(sql).await.unwrap()), ["a", "t", "b"]);
        assert_eq!(saved().await, n0 + 2, "after RECONNECT the Describe goes to a server");
        assert_eq!(names(&e2.prepare(sql).await.unwrap()), ["a", "t", "b"]);
        assert_eq!(saved().await, n0 + 3);
        // The client that holds the old statement gets PostgreSQL's 0A000, never rows of
        // the new shape.
        let e = a.query(&s1, &[&1i32]).await.expect_err("stale statement");
        assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{}", describe(&e));
    })
    .await;
}

#[tokio::test]
async fn pause_resume_kill_client_disable_enable() {
    const DB: &str = "console_pause";
    create_db(DB);
    let p = Parsnip::trust("");
    if direct_mode() {
        return;
    }
    bounded(60, "pause_resume_kill_client_disable_enable", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
        // PAUSE returns once the database's server connections are closed.
        console.simple_query(&format!("PAUSE {DB}")).await.expect("PAUSE");
        let pool = row(&console, "SHOW POOLS", "database", DB).await.expect("pool");
        assert_eq!((num(&pool, "sv_idle"), num(&pool, "sv_active"), num(&pool, "sv_open")), (0, 0, 0));
        let db = row(&console, "SHOW DATABASES", "name", DB).await.expect("database row");
        assert_eq!(num(&db, "paused"), 1);
        // A query waits while paused, and runs after RESUME.
        let a = std::sync::Arc::new(a);
        let q = tokio::spawn({
            let a = a.clone();
            async move { a.scalar("select 42").await }
        });
        until(&p, "the query waits", async || {
            row(&console, "SHOW POOLS", "database", DB).await.is_some_and(|r| num(&r, "cl_waiting") == 1)
        })
        .await;
        assert!(!q.is_finished(), "ran while paused");
        let w = row(&console, "SHOW CLIENTS", "state", "waiting").await.expect("a waiting client");
        assert_eq!(w["database"].as_deref(), Some(DB));
        console.simple_query(&format!("RESUME {DB}")).await.expect("RESUME");
        assert_eq!(q.await.unwrap().unwrap(), "42");
        let e = console.simple_query(&format!("RESUME {DB}")).await.expect_err("not paused");
        assert_eq!(sqlstate(&e).as_deref(), Some("55000"));

        // KILL_CLIENT closes that client with PostgreSQL's FATAL 57P01.
        let me = row(&console, "SHOW CLIENTS", "database", DB).await.expect("client row");
        let id = me["id"].clone().expect("id");
        console.simple_query(&format!("KILL_CLIENT {id}")).await.expect("KILL_CLIENT");
        let a = std::sync::Arc::into_inner(a).expect("one owner");
        let end = a.ended(Duration::from_secs(10)).await.expect("the client was not closed");
        let err = end.expect_err("closed without an error");
        assert_eq!(sqlstate(&err).as_deref(), Some("57P01"), "{}", describe(&err));
        let e = console.simple_query("KILL_CLIENT 1").await.expect_err("no such client");
        assert_eq!(sqlstate(&e).as_deref(), Some("42704"));

        // DISABLE refuses new clients with PostgreSQL's wording; ENABLE lets them in again.
        console.simple_query(&format!("DISABLE {DB}")).await.expect("DISABLE");
        let e = p.try_connect("postgres", Some(SUPER_PW), DB).await.err().expect("a disabled database let a client in");
        assert_eq!(sqlstate(&e).as_deref(), Some("55000"), "{}", describe(&e));
        let db = row(&console, "SHOW DATABASES", "name", DB).await.expect("database row");
        assert_eq!(num(&db, "disabled"), 1);
        console.simple_query(&format!("ENABLE {DB}")).await.expect("ENABLE");
        let b = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(b.scalar("select 1").await.unwrap(), "1");

        // KILL closes a client waiting for a server too (here: held by PAUSE).
        console.simple_query(&format!("PAUSE {DB}")).await.expect("PAUSE");
        let waiter = p.connect("postgres", SUPER_PW, DB).await;
        let waiter = std::sync::Arc::new(waiter);
        let q = tokio::spawn({
            let w = waiter.clone();
            async move { w.scalar("select 1").await }
        });
        until(&p, "the query waits", async || {
            row(&console, "SHOW POOLS", "database", DB).await.is_some_and(|r| num(&r, "cl_waiting") == 1)
        })
        .await;
        console.simple_query(&format!("KILL {DB}")).await.expect("KILL");
        let e = q.await.expect("task").expect_err("a waiting client survived KILL");
        assert_eq!(sqlstate(&e).as_deref(), Some("57P01"), "{}", describe(&e));
        console.simple_query("RESUME").await.expect("RESUME after KILL");
        drop(waiter);
        let b = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(b.scalar("select 1").await.unwrap(), "1");

        // KILL closes every client of the database and pauses it until RESUME.
        console.simple_query(&format!("KILL {DB}")).await.expect("KILL");
        let end = b.ended(Duration::from_secs(10)).await.expect("KILL left a client open");
        assert_eq!(end.err().and_then(|e| sqlstate(&e)).as_deref(), Some("57P01"));
        assert_eq!(num(&row(&console, "SHOW DATABASES", "name", DB).await.expect("row"), "paused"), 1);
        console.simple_query("RESUME").await.expect("RESUME after KILL");
        let c = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        // Unknown names are errors, not silent no-ops.
        let e = console.simple_query("PAUSE no_such_db").await.expect_err("unknown database");
        assert_eq!(sqlstate(&e).as_deref(), Some("3D000"));
        // SET changes what can change at run time, at once.
        console.simple_query("SET pool_size = 3").await.expect("SET pool_size");
        let db = row(&console, "SHOW DATABASES", "name", DB).await.expect("database row");
        assert_eq!(num(&db, "pool_size"), 3);
        let cfg = row(&console, "SHOW CONFIG", "key", "pool_size").await.expect("config row");
        assert_eq!((cfg["value"].as_deref(), cfg["changeable"].as_deref()), (Some("3"), Some("yes")));
        let e = console.simple_query("SET listen = '0.0.0.0:1'").await.expect_err("SET listen");
        assert_eq!(sqlstate(&e).as_deref(), Some("55P02"));
        let e = console.simple_query("SET pool_size = many").await.expect_err("SET pool_size = many");
        assert_eq!(sqlstate(&e).as_deref(), Some("22023"));
    })
    .await;
}

#[tokio::test]
async fn reconnect_closes_servers_as_they_come_back_and_wait_close_waits() {
    const DB: &str = "console_reconnect";
    create_db(DB);
    let p = Parsnip::trust("");
    if direct_mode() {
        return;
    }
    bounded(60, "reconnect_and_wait_close", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let other = p.connect("postgres", SUPER_PW, "parsnip").await;
        let c = p.connect("postgres", SUPER_PW, DB).await;
        c.simple_query("BEGIN").await.unwrap();
        let old = c.scalar("select pg_backend_pid()").await.unwrap();
        console.simple_query(&format!("RECONNECT {DB}")).await.expect("RECONNECT");
        let s = row(&console, "SHOW SERVERS", "remote_pid", &old).await.expect("the server in use stays");
        assert_eq!(num(&s, "close_needed"), 1);
        let wait = tokio::spawn(async move { other.simple_query(&format!("WAIT_CLOSE {DB}")).await.map(|_| ()) });
        // The transaction goes on undisturbed on its server.
        assert_eq!(c.scalar("select pg_backend_pid()").await.unwrap(), old);
        assert!(!wait.is_finished(), "WAIT_CLOSE returned while the old server was open");
        c.simple_query("COMMIT").await.unwrap();
        wait.await.unwrap().expect("WAIT_CLOSE");
        assert!(row(&console, "SHOW SERVERS", "remote_pid", &old).await.is_none(), "the old server is still open");
        let new = c.scalar("select pg_backend_pid()").await.unwrap();
        assert_ne!(new, old, "the next transaction runs on a new connection");
    })
    .await;
}

#[tokio::test]
async fn stats_users_may_look_but_not_act() {
    let p = Parsnip::trust("admin_users = [\"postgres\"]\nstats_users = [\"app\"]");
    if direct_mode() {
        return;
    }
    bounded(30, "stats_users_may_look_but_not_act", async {
        let viewer = p.connect("app", APP_PW, "pgbouncer").await;
        assert!(!console_rows(&viewer, "SHOW POOLS").await.is_empty());
        let e = viewer.simple_query("PAUSE").await.expect_err("a stats user paused the pooler");
        assert_eq!(sqlstate(&e).as_deref(), Some("42501"));
        assert!(describe(&e).contains("admin access needed"), "{}", describe(&e));
        let admin = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        let state = console_rows(&admin, "SHOW STATE").await;
        assert_eq!(state[1]["value"].as_deref(), Some("no"), "not paused: {state:?}");
    })
    .await;
}

/// The HTTP status line's code of `GET path` on 127.0.0.1:`port`.
async fn http_status(port: u16, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("metrics port");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut reply = String::new();
    s.read_to_string(&mut reply).await.expect("read");
    reply.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status: {reply}"))
}

#[tokio::test]
async fn signals_pause_and_resume_and_shutdown_ends_the_process() {
    let metrics = free_port();
    let mut p = Parsnip::trust(&format!("metrics_listen = \"127.0.0.1:{metrics}\""));
    if direct_mode() {
        return;
    }
    bounded(60, "signals", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let paused = async || console_rows(&console, "SHOW STATE").await[1]["value"].as_deref() == Some("yes");
        assert_eq!(http_status(metrics, "/ready").await, 200);
        p.signal(libc::SIGUSR1);
        until(&p, "SIGUSR1 pauses", async || paused().await).await;
        // A paused pooler is not ready for new work: a load balancer should look elsewhere.
        assert_eq!(http_status(metrics, "/ready").await, 503);
        assert_eq!(http_status(metrics, "/live").await, 200);
        p.signal(libc::SIGUSR2);
        until(&p, "SIGUSR2 resumes", async || !paused().await).await;
        assert_eq!(http_status(metrics, "/ready").await, 200);
        // SIGHUP is not fatal.
        p.signal(libc::SIGHUP);
        assert_eq!(console_rows(&console, "SHOW VERSION").await.len(), 1, "alive after SIGHUP");
        // SHUTDOWN ends the process.
        let _ = console.simple_query("SHUTDOWN").await;
    })
    .await;
    assert!(p.wait_exit_async(Duration::from_secs(10)).await.is_some(), "SHUTDOWN: still running\n{}", p.log_tail());
}
