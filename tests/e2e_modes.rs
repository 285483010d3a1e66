//! Pool modes, a client vanishing mid-transaction, and query cancellation.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use support::*;
use tokio_postgres::NoTls;

async fn pid(c: &Pg) -> String {
    c.scalar("select pg_backend_pid()").await.unwrap()
}

/// In session mode each client keeps its own server for its whole life.
#[tokio::test]
async fn session_mode_keeps_the_server() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"session\"");
    bounded(60, "session_mode_keeps_the_server", async {
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        let b = p.connect("postgres", SUPER_PW, "postgres").await;
        let (mut pids_a, mut pids_b) = (HashSet::new(), HashSet::new());
        for _ in 0..5 {
            // Interleaved transactions and single statements.
            let rows = a.simple_query("BEGIN; select pg_backend_pid(); COMMIT").await.unwrap();
            let pa = rows
                .iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                    _ => None,
                })
                .unwrap();
            pids_a.insert(pa);
            pids_b.insert(pid(&b).await);
            pids_a.insert(pid(&a).await);
        }
        assert_eq!(pids_a.len(), 1, "client a changed server in session mode: {pids_a:?}\n{}", p.log_tail());
        assert_eq!(pids_b.len(), 1, "client b changed server in session mode: {pids_b:?}");
        assert!(pids_a.is_disjoint(&pids_b), "two session clients shared a server: {pids_a:?}");
        // Session state (a temp table, a prepared statement by name) survives transactions.
        a.batch_execute("CREATE TEMP TABLE mine (x int); INSERT INTO mine VALUES (1)").await.unwrap();
        let st = a.prepare("select count(*) from mine").await.unwrap();
        a.batch_execute("BEGIN; INSERT INTO mine VALUES (2); COMMIT").await.unwrap();
        let n: i64 = a.query_one(&st, &[]).await.unwrap().get(0);
        assert_eq!(n, 2);
    })
    .await;
}

/// In transaction mode with one server, two clients take turns on it.
#[tokio::test]
async fn transaction_mode_shares_one_server() {
    const DB: &str = "txmode";
    let p = trust_db(
        DB,
        "CREATE TABLE log (who text, n int); GRANT ALL ON log TO PUBLIC;",
        "pool_size = 1\npool_mode = \"transaction\"",
    );
    bounded(60, "transaction_mode_shares_one_server", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let mut pids = HashSet::new();
        for n in 0..10 {
            for (who, c) in [("a", &a), ("b", &b)] {
                let rows = c
                    .simple_query(&format!(
                        "BEGIN; INSERT INTO log VALUES ('{who}', {n}); \
                         select count(*), pg_backend_pid() from log where who = '{who}'; COMMIT"
                    ))
                    .await
                    .unwrap_or_else(|e| panic!("client {who} txn {n}: {}\n{}", describe(&e), p.log_tail()));
                let row = rows
                    .iter()
                    .find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            Some((r.get(0).unwrap().to_string(), r.get(1).unwrap().to_string()))
                        }
                        _ => None,
                    })
                    .unwrap();
                assert_eq!(row.0, (n + 1).to_string(), "client {who} txn {n}");
                pids.insert(row.1);
            }
        }
        assert_eq!(pids.len(), 1, "pool_size 1 but several server pids: {pids:?}");
        assert_eq!(psql(DB, "select count(*) from log"), "20");
        let backends = backends(DB);
        assert!(backends.len() <= 1, "more than one server backend: {backends:?}");
    })
    .await;
}

#[tokio::test]
async fn statement_mode_refuses_transactions() {
    const DB: &str = "stmtdb";
    let p = trust_db(DB, "", "pool_size = 2\npool_mode = \"statement\"");
    bounded(60, "statement_mode_refuses_transactions", async {
        let c = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(c.scalar("select 40 + 2").await.unwrap(), "42");
        let e = expect_code(c.simple_query("BEGIN").await, "0A000", "BEGIN in statement mode");
        assert_eq!(e.message(), "transaction blocks are not allowed in statement pooling mode");
        assert_eq!(e.severity(), "ERROR");
        // The client connection is still usable, and not stuck in a transaction.
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        let e = expect_code(
            c.simple_query("START TRANSACTION ISOLATION LEVEL SERIALIZABLE").await,
            "0A000",
            "START TRANSACTION in statement mode",
        );
        assert_eq!(e.message(), "transaction blocks are not allowed in statement pooling mode");
        let rows = c.query_typed("select $1::int4 * 2", &[(&21i32, tokio_postgres::types::Type::INT4)]).await;
        assert_eq!(rows.unwrap()[0].get::<_, i32>(0), 42);
        let backends = backends(DB);
        assert!(
            !backends.iter().any(|(_, state)| state.starts_with("idle in transaction")),
            "a server was left in a transaction: {backends:?}"
        );
    })
    .await;
}

/// A client that vanishes inside a transaction leaves nothing behind.
#[tokio::test]
async fn client_disconnect_mid_transaction_is_rolled_back() {
    const DB: &str = "dropdb";
    let p = trust_db(
        DB,
        "CREATE TABLE t (marker text); GRANT ALL ON t TO PUBLIC;",
        "pool_size = 1\nquery_wait_timeout_ms = 10000",
    );
    bounded(60, "client_disconnect_mid_transaction_is_rolled_back", async {
        for (round, graceful) in [(0, false), (1, true)] {
            let c = p.connect("postgres", SUPER_PW, DB).await;
            c.batch_execute(&format!("BEGIN; INSERT INTO t VALUES ('ghost {round}')")).await.unwrap();
            // The server really is inside the transaction now.
            let view = backends(DB);
            assert!(
                view.iter().any(|(_, s)| s == "idle in transaction"),
                "expected the pool's server idle in transaction: {view:?}"
            );
            if graceful {
                drop(c); // Terminate message, then close
            } else {
                c.kill().await; // socket closed, no Terminate
            }
            // The next client gets the (single) pool's server, clean.
            let d = p.connect("postgres", SUPER_PW, DB).await;
            let n = within(Duration::from_secs(10), d.scalar("select count(*) from t where marker like 'ghost%'"))
                .await
                .unwrap_or_else(|e| panic!("next client: {e}\n{}", p.log_tail()))
                .unwrap_or_else(|e| panic!("next client: {}\n{}", describe(&e), p.log_tail()));
            assert_eq!(n, "0", "round {round}: the vanished client's row is visible");
            assert_eq!(d.scalar("select current_setting('transaction_isolation')").await.unwrap(), "read committed");
            d.batch_execute("BEGIN; INSERT INTO t VALUES ('kept'); COMMIT").await.unwrap();
            drop(d);
            let view = wait_backends(DB, Duration::from_secs(5), |v| {
                !v.iter().any(|(_, s)| s.starts_with("idle in transaction"))
            })
            .await
            .unwrap_or_else(|v| panic!("a backend stays idle in transaction: {v:?}\n{}", p.log_tail()));
            assert!(view.len() <= 1, "pool_size 1 but {} backends: {view:?}", view.len());
        }
        assert_eq!(psql(DB, "select count(*) from t where marker like 'ghost%'"), "0");
        assert_eq!(psql(DB, "select count(*) from t where marker = 'kept'"), "2");
    })
    .await;
}

/// A CancelRequest sent to parsnip cancels that client's query, not another client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_right_server() {
    const DB: &str = "canceldb";
    let p = trust_db(DB, "", "pool_size = 2");
    bounded(60, "cancel_reaches_the_right_server", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let token = a.cancel_token();
        let sleeper_a = tokio::spawn(async move {
            let t0 = Instant::now();
            let r = a.simple_query("select pg_sleep(30)").await;
            (r.map(|_| ()), t0.elapsed(), a)
        });
        // Wait until a's query runs on a server.
        wait_backends(DB, Duration::from_secs(10), |v| v.iter().filter(|(_, s)| s == "active").count() >= 1)
            .await
            .unwrap_or_else(|v| panic!("a's query never became active: {v:?}\n{}", p.log_tail()));
        let sleeper_b = tokio::spawn(async move {
            let r = b.simple_query("select pg_sleep(2)").await;
            (r.map(|_| ()), b)
        });
        wait_backends(DB, Duration::from_secs(10), |v| v.iter().filter(|(_, s)| s == "active").count() >= 2)
            .await
            .unwrap_or_else(|v| panic!("b's query never became active: {v:?}\n{}", p.log_tail()));

        let t0 = Instant::now();
        token.cancel_query(NoTls).await.unwrap_or_else(|e| panic!("cancel_query: {e}\n{}", p.log_tail()));
        let (ra, elapsed, a) = within(Duration::from_secs(10), sleeper_a)
            .await
            .unwrap_or_else(|e| panic!("a's query not cancelled: {e}\n{}", p.log_tail()))
            .unwrap();
        let e = expect_code(ra, "57014", "cancelled query");
        assert_eq!(e.message(), "canceling statement due to user request");
        assert!(t0.elapsed() < Duration::from_secs(5), "cancel took {:?}", t0.elapsed());
        assert!(elapsed < Duration::from_secs(15));
        let (rb, b) = within(Duration::from_secs(10), sleeper_b).await.unwrap().unwrap();
        rb.unwrap_or_else(|e| panic!("the other client's query was hit: {}\n{}", describe(&e), p.log_tail()));
        // Both clients go on working.
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
        assert_eq!(b.scalar("select 2").await.unwrap(), "2");
        // A cancel with a bogus key is ignored (and does not disturb anyone).
        let mut raw = p.raw().await;
        let mut cancel = vec![0, 0, 0, 16];
        cancel.extend_from_slice(&80877102u32.to_be_bytes());
        cancel.extend_from_slice(&12345i32.to_be_bytes());
        cancel.extend_from_slice(&67890i32.to_be_bytes());
        raw.send(&cancel).await.unwrap();
        let frames = raw.read_until_closed(Duration::from_secs(5)).await;
        assert!(frames.is_empty(), "a CancelRequest gets no reply: {}", summarize(&frames));
        assert_eq!(a.scalar("select 3").await.unwrap(), "3");
    })
    .await;
}

/// Issue 14: a query autoprepared from a simple Query (its literals lifted: the server runs
/// `select $1 from pg_sleep($2)`) is cancelled like any other, and its client goes on, its
/// next autoprepared queries answered as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoprepared_query_is_cancelled_like_any_other() {
    const DB: &str = "cancelautoprepdb";
    let p = trust_db(DB, "", "pool_size = 2\nautoprepare = true\nautoprepare_after = 1");
    bounded(60, "an_autoprepared_query_is_cancelled_like_any_other", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let token = a.cancel_token();
        let sleeper = tokio::spawn(async move {
            let r = a.simple_query("select 1 from pg_sleep(30)").await;
            (r.map(|_| ()), a)
        });
        wait_query_active("select $1 from pg_sleep($2)", Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("the lifted query never ran: {e}\n{}", p.log_tail()));
        let t0 = Instant::now();
        token.cancel_query(NoTls).await.unwrap_or_else(|e| panic!("cancel_query: {e}\n{}", p.log_tail()));
        let (r, a) = within(Duration::from_secs(10), sleeper)
            .await
            .unwrap_or_else(|e| panic!("the query was not cancelled: {e}\n{}", p.log_tail()))
            .unwrap();
        let e = expect_code(r, "57014", "cancelled autoprepared query");
        assert_eq!(e.message(), "canceling statement due to user request");
        assert!(t0.elapsed() < Duration::from_secs(5), "cancel took {:?}", t0.elapsed());
        assert_eq!(a.scalar("select 41 + 1").await.unwrap(), "42");
        assert_eq!(a.scalar("select 1 from pg_sleep(0)").await.unwrap(), "1");
    })
    .await;
}

/// Returns once the console shows one client of `db` waiting for the pool.
async fn until_one_waits(p: &Parsnip, db: &str) {
    let console = p.connect("postgres", SUPER_PW, "parsnip").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = console.simple_query("SHOW POOLS").await.unwrap();
        let waiting_clients = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("database") == Some(db) => {
                r.get("cl_waiting").map(str::to_owned)
            }
            _ => None,
        });
        if waiting_clients.as_deref() == Some("1") {
            return;
        }
        assert!(Instant::now() < deadline, "no client ever waited for the pool\n{}", p.log_tail());
        tokio::task::yield_now().await;
    }
}

/// A cancel for a query still waiting for a server connection cancels it (57014), as
/// PostgreSQL cancels a query that is running; the client goes on working.
#[tokio::test]
async fn cancel_reaches_a_query_waiting_for_a_server() {
    const DB: &str = "cancelqueueddb";
    let p = trust_db(DB, "", "pool_size = 1");
    bounded(60, "cancel_reaches_a_query_waiting_for_a_server", async {
        let holder = p.connect("postgres", SUPER_PW, DB).await;
        // A transaction that ran something holds the only server (a lone BEGIN would not:
        // `defer_begin`).
        holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let (a, e, took) = cancelled_while_queued(&p, DB, a, "select pg_sleep(3)").await;
        assert_eq!(e.message(), "canceling statement due to user request");
        assert!(took < Duration::from_secs(2), "cancel took {took:?}");
        holder.batch_execute("COMMIT").await.unwrap();
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
    })
    .await;
}

/// A cancel request on its way to a backend keeps that server connection from the next
/// client until it has landed: PostgreSQL cancels whatever the backend runs when the signal
/// arrives, and that must not be another client's query.
#[tokio::test]
async fn server_with_cancel_in_flight_is_not_handed_on() {
    use parsnip::auth::Credentials;
    use parsnip::driver::server_conn::ServerTarget;
    use parsnip::driver::servers::{self, ServerConnector};
    use parsnip::pool::{Pool, PoolKey};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    let c = cluster();
    let target = ServerTarget::plain("127.0.0.1", c.port(), "postgres", "app");
    let key = PoolKey::clients("postgres", "app");
    let cfg = Arc::new(parsnip::config::Config::default());
    let connector = ServerConnector::new(key.clone(), target, Credentials::Password(APP_PW.into()), cfg.clone());
    let pool = Arc::new(Pool::new(key, parsnip::config::PoolMode::Transaction, 1, connector, cfg));
    let conn = pool.acquire().await.expect("a server connection");
    let cancel = conn.cancel.clone();
    cancel.in_flight.fetch_add(1, Ordering::AcqRel);
    servers::release(&pool, conn, true);
    assert!(pool.try_acquire().is_none(), "handed on while a cancel was in flight");
    let waiter = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire().await.map(|c| c.cancel.pid) }
    });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "a waiter got the connection while a cancel was in flight");
    cancel.in_flight.fetch_sub(1, Ordering::AcqRel);
    cancel.settled.notify_waiters();
    let pid = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("waiter served").expect("task");
    assert_eq!(pid.expect("connection"), cancel.pid, "the same server once the cancel landed");
}

/// A backend terminated under a client idle in a transaction: the client gets PostgreSQL's
/// own FATAL 57P01 (not a pooler 08P01), in both modes. The pid a client is given is never
/// another session's backend, so `pg_terminate_backend` with it cannot hit another session:
/// in transaction mode it is no backend's; in session mode it is the client's own backend
/// (bound at login), as directly.
#[tokio::test]
async fn terminated_backend_reaches_the_client_as_57p01() {
    for mode in ["transaction", "session"] {
        let p = Parsnip::trust(&format!("pool_size = 2\npool_mode = \"{mode}\""));
        bounded(60, "terminated_backend_reaches_the_client_as_57p01", async {
            let mut c = p.raw_login("postgres", SUPER_PW, "postgres").await;
            let (client_pid, _) = c.key.expect("BackendKeyData");
            c.simple_query("BEGIN").await.expect("begin");
            let backend = c.scalar("select pg_backend_pid()").await.expect("pid").expect("a pid");
            let live = format!("select count(*) from pg_stat_activity where pid = {client_pid}");
            if mode == "session" {
                assert_eq!(client_pid.to_string(), backend, "session mode: the client's pid is its backend's");
                assert_eq!(psql_async("postgres", &live).await.trim(), "1");
            } else {
                assert!(client_pid > 1 << 22, "{mode}: client pid {client_pid} is in the range of OS pids");
                assert_eq!(psql_async("postgres", &live).await.trim(), "0");
            }
            let killed = psql_async("postgres", &format!("select pg_terminate_backend({backend})")).await;
            assert_eq!(killed.trim(), "t");
            let e = c.expect_error_and_close(Duration::from_secs(10), mode).await;
            assert_eq!((e.severity(), e.code()), ("FATAL", "57P01"), "{mode}: {}\n{}", e.message(), p.log_tail());
        })
        .await;
    }
}

/// Session mode binds the server at login: the client's pid is its backend's, a cancel
/// with it reaches its query, and a client that logs in while the pool is full still gets
/// in (a pid of parsnip's own) and is served once a server is free.
#[tokio::test]
async fn session_mode_gives_the_real_pid_and_cancel_works() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"session\"");
    bounded(60, "session_mode_gives_the_real_pid_and_cancel_works", async {
        let mut first = p.raw_login("postgres", SUPER_PW, "postgres").await;
        let (first_pid, _) = first.key.expect("BackendKeyData");
        assert_eq!(first.scalar("select pg_backend_pid()").await.expect("pid"), Some(first_pid.to_string()));
        // The second server: `a`'s cancel key carries its real backend pid.
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        assert!(pid(&a).await.parse::<i32>().expect("pid") < 1 << 22);
        let token = a.cancel_token();
        let sleeper = tokio::spawn(async move {
            let r = a.simple_query("select pg_sleep(30)").await;
            (a, r)
        });
        wait_query_active("select pg_sleep(30)", std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", p.log_tail()));
        token.cancel_query(tokio_postgres::NoTls).await.expect("cancel request");
        let (a, r) = sleeper.await.expect("task");
        let e = r.expect_err("the sleep was not cancelled");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{}", describe(&e));
        // The pool (size 2) is held by `first` and `a`: a new client still logs in, with a
        // pid of parsnip's own, and is served once `a` leaves.
        let mut late = p.raw_login("postgres", SUPER_PW, "postgres").await;
        let (late_pid, _) = late.key.expect("BackendKeyData");
        assert!(late_pid > 1 << 22, "pid {late_pid} while the pool was full");
        drop(a);
        assert_eq!(late.scalar("select 7").await.expect("served"), Some("7".into()));
    })
    .await;
}

/// Under transaction pooling, a client that creates session state (here a temporary table
/// and a session advisory lock) keeps its server connection while the state lasts: it stays
/// its own across transactions and never reaches another client; SHOW CLIENTS says why.
#[tokio::test]
async fn session_state_pins_the_client_under_transaction_pooling() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(60, "session_state_pins_the_client", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        let b = p.connect("postgres", SUPER_PW, "postgres").await;
        // Before: a is not pinned and shares the pool with b.
        a.simple_query("create temp table pinned_t (x int)").await.expect("create temp");
        let pid_a = pid(&a).await;
        for i in 0..5 {
            a.simple_query(&format!("insert into pinned_t values ({i})")).await.expect("insert");
            // b runs between a's transactions: never on a's connection, never sees its table.
            assert_ne!(pid(&b).await, pid_a, "b got the pinned connection");
            let e = b.simple_query("select count(*) from pinned_t").await.expect_err("b saw a's temp table");
            assert_eq!(sqlstate(&e).as_deref(), Some("42P01"));
        }
        assert_eq!(a.scalar("select count(*) from pinned_t").await.unwrap(), "5");
        assert_eq!(pid(&a).await, pid_a, "a changed server connection");
        // Extended protocol: a session advisory lock pins b too (the pool has two).
        let got: bool = b.query_one("select pg_try_advisory_lock($1)", &[&42i64]).await.expect("lock").get(0);
        assert!(got);
        let pid_b = pid(&b).await;
        assert_eq!(pid(&b).await, pid_b);
        let msgs = console.simple_query("SHOW CLIENTS").await.expect("SHOW CLIENTS");
        let mut pinned: Vec<&str> = msgs
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get("pinned").filter(|p| !p.is_empty()),
                _ => None,
            })
            .collect();
        pinned.sort();
        assert_eq!(pinned, ["advisory_lock", "temp_table"], "SHOW CLIENTS: a and b pinned, and why");
        // When a leaves, its connection (and its temporary table) goes with it.
        drop(a);
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while psql_async("postgres", &format!("select count(*) from pg_stat_activity where pid = {pid_a}")).await.trim()
            != "0"
        {
            assert!(Instant::now() < deadline, "a's pinned connection stayed open\n{}", p.log_tail());
            tokio::task::yield_now().await;
        }
        let e = c.simple_query("select count(*) from pinned_t").await.expect_err("c saw a's temp table");
        assert_eq!(sqlstate(&e).as_deref(), Some("42P01"));
    })
    .await;
}

/// A lone BEGIN (transaction pooling, `defer_begin` on by default) holds no server until the
/// transaction runs something, and still opens the block on the server that runs it: with
/// one server, another client runs while the first sits after its BEGIN, and the first's
/// INSERT is rolled back by its ROLLBACK.
#[tokio::test]
async fn a_lone_begin_holds_no_server_until_its_transaction_runs_something() {
    const DB: &str = "deferbegin";
    let p = trust_db(
        DB,
        "CREATE TABLE t (x int); GRANT ALL ON t TO PUBLIC;",
        "pool_size = 1\npool_mode = \"transaction\"\nquery_wait_timeout_ms = 3000",
    );
    bounded(60, "a_lone_begin_holds_no_server_until_its_transaction_runs_something", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        a.batch_execute("SET application_name = 'deferred'").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        // The only server is free: b runs (it would wait 3 s and fail if a's BEGIN held it).
        let n = b
            .scalar("SELECT count(*) FROM t")
            .await
            .unwrap_or_else(|e| panic!("b: {}\n{}", describe(&e), p.log_tail()));
        assert_eq!(n, "0");
        a.batch_execute("INSERT INTO t VALUES (1)").await.unwrap();
        // Inside a block on the server: the setting made before it is there, and the
        // transaction is open.
        assert_eq!(a.scalar("SELECT current_setting('application_name')").await.unwrap(), "deferred");
        let open = a.scalar("SELECT now() <> statement_timestamp()").await.unwrap();
        assert_eq!(open, "t", "the INSERT and this SELECT run in one transaction");
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(b.scalar("SELECT count(*) FROM t").await.unwrap(), "0", "the INSERT was rolled back");
        assert_eq!(a.scalar("SELECT current_setting('application_name')").await.unwrap(), "deferred");
        // BEGIN then COMMIT with nothing between needs no server: b holds the only one.
        b.batch_execute("BEGIN; SELECT 1").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        a.batch_execute("COMMIT").await.unwrap_or_else(|e| panic!("empty block: {}\n{}", describe(&e), p.log_tail()));
        b.batch_execute("COMMIT").await.unwrap();
        // A transaction through the driver's API.
        let mut a = a;
        let tx = a.client.transaction().await.unwrap();
        tx.batch_execute("INSERT INTO t VALUES (2)").await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(b.scalar("SELECT count(*) FROM t").await.unwrap(), "1");
    })
    .await;
}

/// Sends `sql` from `a` while no server is free, cancels it once it waits, and checks that it
/// failed with 57014: the client, the error, and how long the answer took after the cancel.
async fn cancelled_while_queued(
    p: &Parsnip,
    db: &str,
    a: Pg,
    sql: &'static str,
) -> (Pg, tokio_postgres::error::DbError, Duration) {
    let token = a.cancel_token();
    let waiting = tokio::spawn(async move {
        let r = a.simple_query(sql).await;
        (r.map(|_| ()), a)
    });
    until_one_waits(p, db).await;
    let t0 = Instant::now();
    token.cancel_query(NoTls).await.unwrap();
    let (r, a) = within(Duration::from_secs(5), waiting).await.expect("cancelled in time").unwrap();
    let e = expect_code(r, "57014", sql);
    (a, e, t0.elapsed())
}

/// A cancel of the first statement after a lone BEGIN, while it waits for a server, fails
/// the block as PostgreSQL would (57014, then the block refuses statements until its
/// ROLLBACK); the client is not closed (postgres.js crashed on that close).
#[tokio::test]
async fn a_cancel_while_a_deferred_block_waits_for_a_server_fails_the_block() {
    const DB: &str = "deferbegincancel";
    let p = trust_db(DB, "", "pool_size = 1");
    bounded(60, "a_cancel_while_a_deferred_block_waits_for_a_server_fails_the_block", async {
        let holder = p.connect("postgres", SUPER_PW, DB).await;
        holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let a = p.connect("postgres", SUPER_PW, DB).await;
        a.batch_execute("BEGIN").await.unwrap();
        let (a, ..) = cancelled_while_queued(&p, DB, a, "select pg_sleep(3)").await;
        // The block is failed: a statement is refused once a server is free, ROLLBACK ends it.
        holder.batch_execute("COMMIT").await.unwrap();
        expect_code(a.simple_query("select 1").await, "25P02", "statement in the failed block");
        a.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
        // And a failed block ended at once: ROLLBACK with no server free.
        holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        let (a, ..) = cancelled_while_queued(&p, DB, a, "select 2").await;
        a.batch_execute("ROLLBACK").await.unwrap();
        holder.batch_execute("COMMIT").await.unwrap();
        assert_eq!(a.scalar("select 3").await.unwrap(), "3");
    })
    .await;
}
