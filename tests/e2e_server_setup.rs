//! PgBouncer's settings for the life of a server connection: `connect_query` (run on each
//! new server connection before any client uses it) and `server_fast_close` (in session
//! mode, a server connection marked to close is closed at the end of its client's
//! transaction, with the client, instead of at the end of the session).

mod support;

use std::time::Duration;

use support::*;

/// Every server connection runs the database's `connect_query` once, before its first
/// client: each backend finds exactly one row of its own in the log the query writes. A
/// failing `connect_query` is logged and ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_query_runs_once_on_each_new_server_connection() {
    const DB: &str = "connect_q";
    create_db(DB);
    psql(DB, "CREATE TABLE cq_log (pid int NOT NULL); GRANT ALL ON cq_log TO PUBLIC;");
    let port = cluster().port();
    let cfg = trust_config("")
        + &format!(
            "\n[databases.{DB}]\nhost = \"127.0.0.1\"\nport = {port}\n\
             connect_query = \"INSERT INTO cq_log VALUES (pg_backend_pid())\"\n\
             \n[databases.connect_q_bad]\nhost = \"127.0.0.1\"\nport = {port}\ndbname = \"{DB}\"\n\
             connect_query = \"SELECT 1/0\"\n"
        );
    let p = Parsnip::with_config(&cfg);
    if direct_mode() {
        return;
    }
    bounded(60, "connect_query_runs_once_on_each_new_server_connection", async {
        // Two transactions at once: two server connections.
        let a = p.connect("app", APP_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        a.simple_query("begin").await.unwrap();
        b.simple_query("begin").await.unwrap();
        for c in [&a, &b] {
            let mine = c.scalar("select count(*) from cq_log where pid = pg_backend_pid()").await.unwrap();
            assert_eq!(mine, "1", "the connection ran connect_query once, before the client's first query");
            c.simple_query("commit").await.unwrap();
        }
        // Every backend of the database that parsnip opened ran it, and nothing else did.
        let open = psql_async(
            "postgres",
            &format!(
                "select count(*) from pg_stat_activity where datname = '{DB}' and backend_type = 'client backend'"
            ),
        )
        .await;
        let logged = a.scalar("select count(distinct pid) from cq_log").await.unwrap();
        assert_eq!(logged, "2", "two server connections, two runs");
        assert_eq!(open.trim(), "2", "the same two backends are open");
        // A connect_query that fails: logged, and the connection serves anyway.
        let c = p.connect("postgres", SUPER_PW, "connect_q_bad").await;
        assert_eq!(c.scalar("select 3").await.unwrap(), "3");
        assert!(p.wait_for_log("connect_query failed", Duration::from_secs(5)), "{}", p.log_tail());
        assert!(p.wait_for_log("division by zero", Duration::from_secs(5)), "{}", p.log_tail());
    })
    .await;
}

/// `server_fast_close` with a session-mode database: after `RECONNECT`, an idle client is
/// closed (its server with it) with PgBouncer's FATAL "database configuration changed",
/// and a client inside a transaction finishes it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_session_clients_between_transactions() {
    const DB: &str = "fast_close";
    create_db(DB);
    let cfg = trust_config("server_fast_close = true")
        + &format!("\n[databases.{DB}]\nhost = \"127.0.0.1\"\nport = {}\npool_mode = \"session\"\n", cluster().port());
    let p = Parsnip::with_config(&cfg);
    if direct_mode() {
        return;
    }
    bounded(60, "server_fast_close_ends_session_clients_between_transactions", async {
        let idle = p.connect("postgres", SUPER_PW, DB).await;
        let idle_pid = idle.scalar("select pg_backend_pid()").await.unwrap();
        let busy = p.connect("postgres", SUPER_PW, DB).await;
        busy.simple_query("begin; create temp table t (x int)").await.unwrap();
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        console.simple_query(&format!("RECONNECT {DB}")).await.unwrap();
        // The idle client goes without doing anything.
        let ended = idle.ended(Duration::from_secs(10)).await.expect("the idle client is closed");
        let e = ended.expect_err("closed with an error");
        let db = e.as_db_error().unwrap_or_else(|| panic!("a server error: {e}"));
        assert_eq!(
            (db.severity(), db.code().code(), db.message()),
            ("FATAL", "08P01", "database configuration changed")
        );
        let gone = format!("select count(*) from pg_stat_activity where pid = {idle_pid}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while psql_async("postgres", &gone).await.trim() != "0" {
            assert!(std::time::Instant::now() < deadline, "its server connection closed too");
            tokio::task::yield_now().await;
        }
        // The one in a transaction keeps its server until the transaction ends.
        assert_eq!(busy.scalar("select count(*) from t").await.unwrap(), "0");
        busy.simple_query("commit").await.unwrap();
        let ended = busy.ended(Duration::from_secs(10)).await.expect("closed after its transaction");
        let e = ended.expect_err("closed with an error");
        assert_eq!(e.as_db_error().map(|d| d.message()), Some("database configuration changed"));
        // A new client gets a new server.
        let fresh = p.connect("postgres", SUPER_PW, DB).await;
        assert_ne!(fresh.scalar("select pg_backend_pid()").await.unwrap(), idle_pid);
    })
    .await;
}
