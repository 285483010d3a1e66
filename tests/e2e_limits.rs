//! Limits and timeouts: max clients, pool wait timeout, idle timeouts, server restarts, and
//! the memory a large row takes in the pooler.

mod support;

use std::time::{Duration, Instant};

use parsnip::embedded::Cluster;
use support::*;

#[tokio::test]
async fn max_client_conn_rejects_the_sixth_client() {
    let p = Parsnip::with_config_args(&trust_config(""), &["--max-client-conn", "5"]);
    bounded(60, "max_client_conn_rejects_the_sixth_client", async {
        let mut clients = Vec::new();
        for i in 0..5 {
            let c = p
                .try_connect("postgres", Some(SUPER_PW), "postgres")
                .await
                .unwrap_or_else(|e| panic!("client {i} of 5: {}\n{}", describe(&e), p.log_tail()));
            clients.push(c);
        }
        let r = p.try_connect("postgres", Some(SUPER_PW), "postgres").await;
        let e = expect_code(r.map(|_| ()), "53300", "sixth client");
        assert_eq!(e.severity(), "FATAL");
        // Raw view of the same: an ErrorResponse, then the socket closes.
        let mut raw = p.raw().await;
        raw.send(&startup_packet(&[("user", "postgres"), ("database", "postgres")])).await.ok();
        let e = raw.expect_error_and_close(Duration::from_secs(5), "raw sixth client").await;
        assert_eq!(e.code(), "53300", "{e}");
        // The five still work.
        for c in &clients {
            assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        }
        // Once one leaves, a new client gets in (bounded retry: the slot frees asynchronously).
        drop(clients.pop());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match p.try_connect("postgres", Some(SUPER_PW), "postgres").await {
                Ok(c) => {
                    assert_eq!(c.scalar("select 2").await.unwrap(), "2");
                    break;
                }
                Err(e) if Instant::now() > deadline => {
                    panic!("slot never freed: {}\n{}", describe(&e), p.log_tail())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
}

/// Beyond max_client_conn a connection is refused as PostgreSQL refuses it: its SSLRequest
/// or GSSENCRequest answered first (an ErrorResponse in place of the answer makes libpq say
/// "server sent an error response during SSL exchange" instead of why), 53300 after its
/// startup packet; and a CancelRequest still reaches the query it cancels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_client_conn_the_ssl_answer_comes_first_and_cancels_still_work() {
    const SLEEP: &str = "select pg_sleep(30) -- beyond max_client_conn";
    let p = Parsnip::with_config_args(&trust_config(""), &["--max-client-conn", "1"]);
    bounded(60, "beyond_max_client_conn_the_ssl_answer_comes_first_and_cancels_still_work", async {
        // The one slot, once the start-up probe's connection has given it back.
        let deadline = Instant::now() + Duration::from_secs(5);
        let c = loop {
            match p.try_connect("postgres", Some(SUPER_PW), "postgres").await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => panic!("no slot: {}\n{}", describe(&e), p.log_tail()),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        for (request, name) in [(80877103u32, "SSLRequest"), (80877104, "GSSENCRequest")] {
            let mut raw = p.raw().await;
            let mut packet = 8u32.to_be_bytes().to_vec();
            packet.extend_from_slice(&request.to_be_bytes());
            raw.send(&packet).await.unwrap();
            assert_eq!(raw.read_byte().await, Some(b'N'), "{name} answered first\n{}", p.log_tail());
            raw.send(&startup_packet(&[("user", "postgres"), ("database", "postgres")])).await.unwrap();
            let e = raw.expect_error_and_close(Duration::from_secs(5), name).await;
            assert_eq!((e.code(), e.severity(), e.message()), ("53300", "FATAL", "sorry, too many clients already"));
        }
        // libpq (sslmode=prefer, its default) prints the reason.
        let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=prefer", p.port());
        let out = tokio::process::Command::new(cluster().bin_dir().join("psql"))
            .args(["-X", "-w", "-c", "select 1", &conninfo])
            .output()
            .await
            .expect("running psql");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("FATAL:  sorry, too many clients already"), "psql said: {err}");
        // The one client's query is cancelled through a connection beyond the limit.
        let token = c.cancel_token();
        let sleeper = tokio::spawn(async move { c.simple_query(SLEEP).await.map(|_| ()) });
        wait_query_active("-- beyond max_client_conn", Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", p.log_tail()));
        token.cancel_query(tokio_postgres::NoTls).await.unwrap_or_else(|e| panic!("cancel_query: {e}"));
        let r = within(Duration::from_secs(10), sleeper)
            .await
            .unwrap_or_else(|e| panic!("query not cancelled: {e}\n{}", p.log_tail()))
            .unwrap();
        expect_code(r, "57014", "cancelled beyond max_client_conn");
    })
    .await;
}

#[tokio::test]
async fn query_wait_timeout_errors_and_the_client_survives() {
    let p = Parsnip::trust("pool_size = 1\nquery_wait_timeout_ms = 500");
    bounded(60, "query_wait_timeout_errors_and_the_client_survives", async {
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        let b = p.connect("postgres", SUPER_PW, "postgres").await;
        a.batch_execute("BEGIN; select 1").await.unwrap();
        let t0 = Instant::now();
        let r = within(Duration::from_secs(10), b.simple_query("select 2"))
            .await
            .unwrap_or_else(|e| panic!("waiting client got no answer: {e}\n{}", p.log_tail()));
        let e = expect_code(r, "57014", "query_wait_timeout");
        assert_eq!(e.severity(), "ERROR", "the connection must stay usable: {e:?}");
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
            "answered after {waited:?} with query_wait_timeout_ms = 500"
        );
        a.batch_execute("COMMIT").await.unwrap();
        let n = within(Duration::from_secs(10), b.scalar("select 3"))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("client after a wait timeout: {}\n{}", describe(&e), p.log_tail()));
        assert_eq!(n, "3");
        assert_eq!(a.scalar("select 4").await.unwrap(), "4");
    })
    .await;
}

#[tokio::test]
async fn client_idle_timeout_closes_idle_clients() {
    let p = Parsnip::trust("client_idle_timeout_ms = 500");
    bounded(60, "client_idle_timeout_closes_idle_clients", async {
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        assert_eq!(raw.scalar("select 1").await.unwrap().as_deref(), Some("1"));
        let t0 = Instant::now();
        let e = raw.expect_error_and_close(Duration::from_secs(10), "idle client").await;
        assert_eq!(e.code(), "57P05", "{e}\n{}", p.log_tail());
        assert_eq!(e.severity(), "FATAL");
        assert!(t0.elapsed() >= Duration::from_millis(400), "closed after {:?}", t0.elapsed());
        // Others are unaffected.
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 2").await.unwrap(), "2");
    })
    .await;
}

#[tokio::test]
async fn idle_transaction_timeout_closes_and_cleans_up() {
    const DB: &str = "idletx";
    let p = trust_db(
        DB,
        "CREATE TABLE t (x int); GRANT ALL ON t TO PUBLIC;",
        "pool_size = 1\nidle_transaction_timeout_ms = 500",
    );
    bounded(60, "idle_transaction_timeout_closes_and_cleans_up", async {
        let mut raw = p.raw_login("postgres", SUPER_PW, DB).await;
        raw.simple_query("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();
        let e = raw.expect_error_and_close(Duration::from_secs(10), "idle in transaction client").await;
        assert_eq!(e.code(), "25P03", "{e}\n{}", p.log_tail());
        assert_eq!(e.severity(), "FATAL");
        wait_backends(DB, Duration::from_secs(5), |v| !v.iter().any(|(_, s)| s.starts_with("idle in transaction")))
            .await
            .unwrap_or_else(|v| panic!("server left idle in transaction: {v:?}\n{}", p.log_tail()));
        assert_eq!(psql(DB, "select count(*) from t"), "0");
        // The pool's server is usable by the next client.
        let c = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(c.scalar("select count(*) from t").await.unwrap(), "0");
        // An idle client outside a transaction is not affected by this timeout.
        let mut idle = p.raw_login("postgres", SUPER_PW, DB).await;
        let mut probe = p.raw_login("postgres", SUPER_PW, DB).await;
        probe.simple_query("select pg_sleep(1)").await.unwrap();
        assert_eq!(idle.scalar("select 5").await.unwrap().as_deref(), Some("5"));
    })
    .await;
}

/// `transaction_timeout_ms` (PgBouncer's transaction_timeout): a transaction that holds its
/// server longer is ended with FATAL 25P04, busy or idle, timed from its first request
/// (later statements do not move it); a running statement is cancelled, the transaction
/// rolled back, and the server serves the next client.
#[tokio::test]
async fn transaction_timeout_ends_long_transactions_busy_or_idle() {
    const DB: &str = "txtimeout";
    let p = trust_db(
        DB,
        "CREATE TABLE t (x int); GRANT ALL ON t TO PUBLIC;",
        "pool_size = 1\ntransaction_timeout_ms = 1500",
    );
    bounded(60, "transaction_timeout_ends_long_transactions_busy_or_idle", async {
        // Busy: statements shorter than the timeout, one after the other, in one transaction.
        let mut raw = p.raw_login("postgres", SUPER_PW, DB).await;
        raw.simple_query("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();
        let t0 = std::time::Instant::now();
        let mut err = None;
        for _ in 0..20 {
            if let Err(e) = raw.simple_query("SELECT pg_sleep(0.5)").await {
                err = Some(e);
                break;
            }
        }
        let e = err.unwrap_or_else(|| panic!("20 half-second statements ran in one transaction\n{}", p.log_tail()));
        assert!(t0.elapsed() < Duration::from_secs(5), "ended after {:?}", t0.elapsed());
        assert_eq!((e.code(), e.severity()), ("25P04", "FATAL"), "{e}\n{}", p.log_tail());
        wait_backends(DB, Duration::from_secs(5), |v| !v.iter().any(|(_, s)| s != "idle"))
            .await
            .unwrap_or_else(|v| panic!("server left busy: {v:?}\n{}", p.log_tail()));
        assert_eq!(psql(DB, "select count(*) from t"), "0", "rolled back");
        // Idle in its transaction: ended the same way.
        let mut idle = p.raw_login("postgres", SUPER_PW, DB).await;
        idle.simple_query("BEGIN; INSERT INTO t VALUES (2)").await.unwrap();
        let e = idle.expect_error_and_close(Duration::from_secs(10), "idle transaction").await;
        assert_eq!(e.code(), "25P04", "{e}");
        // The pool's one server serves the next client; statements outside a transaction
        // longer in total than the timeout are not one transaction.
        let c = p.connect("postgres", SUPER_PW, DB).await;
        for _ in 0..4 {
            c.batch_execute("SELECT pg_sleep(0.5)").await.unwrap_or_else(|e| panic!("{}", describe(&e)));
        }
        assert_eq!(c.scalar("select count(*) from t").await.unwrap(), "0");
    })
    .await;
}

/// parsnip reconnects to a restarted PostgreSQL by itself.
#[tokio::test]
async fn reconnects_after_postgres_restart() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(cluster_options("trust", None)))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("dedicated cluster: {e}"));
    let url = cluster.url();
    let p = Parsnip::start(&[&url, "--pool-size", "2"]);
    let mut cluster = Some(cluster);
    bounded(90, "reconnects_after_postgres_restart", async {
        let a = p.connect("postgres", "", "postgres").await;
        let b = p.connect("postgres", "", "postgres").await;
        // Two server connections in the pool.
        a.batch_execute("BEGIN; select 1").await.unwrap();
        b.batch_execute("BEGIN; select 1").await.unwrap();
        a.batch_execute("COMMIT").await.unwrap();
        b.batch_execute("COMMIT").await.unwrap();
        let pid_before = a.scalar("select pg_backend_pid()").await.unwrap();

        let mut c = cluster.take().unwrap();
        let c = tokio::task::spawn_blocking(move || c.restart().map(|_| c))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("restart: {e}"));
        cluster = Some(c);

        // Each existing client: the first query may fail once, the next one works.
        let mut failures = Vec::new();
        for (name, client) in [("a", a), ("b", b)] {
            let client = match within(Duration::from_secs(20), client.scalar("select 1")).await {
                Ok(Ok(v)) => {
                    assert_eq!(v, "1");
                    client
                }
                Ok(Err(e)) => {
                    failures.push(format!("{name}: {}", describe(&e)));
                    if client.is_closed() { p.connect("postgres", "", "postgres").await } else { client }
                }
                Err(e) => panic!("client {name} hangs after restart: {e}\n{}", p.log_tail()),
            };
            let v = within(Duration::from_secs(20), client.scalar("select 2"))
                .await
                .unwrap_or_else(|e| panic!("client {name}, second query: {e}\n{}", p.log_tail()))
                .unwrap_or_else(|e| {
                    panic!(
                        "client {name}: second query after restart failed: {} (first: {failures:?})\n{}",
                        describe(&e),
                        p.log_tail()
                    )
                });
            assert_eq!(v, "2");
            let pid_after = client.scalar("select pg_backend_pid()").await.unwrap();
            assert_ne!(pid_after, pid_before, "still the old backend?");
        }
        // A brand-new client works at once.
        let fresh = within(Duration::from_secs(20), p.connect("postgres", "", "postgres")).await.unwrap();
        assert_eq!(fresh.scalar("select 3").await.unwrap_or_else(|e| panic!("fresh client: {}", describe(&e))), "3");
        eprintln!("first-query failures after restart (allowed, one per client): {failures:?}");
    })
    .await;
    drop(p);
    if let Some(c) = cluster {
        tokio::task::spawn_blocking(move || drop(c)).await.unwrap();
    }
}

/// A 48 MiB value fetched through parsnip, with the extended and the simple protocol: the
/// client gets it intact, and its bytes pass through as they arrive, so parsnip's peak memory
/// grows by far less than the row (held whole, it would grow by twice the row: read, then
/// copied for the client).
#[tokio::test]
async fn a_large_row_passes_through_without_being_held_whole() {
    const MIB: usize = 1 << 20;
    let p = Parsnip::trust("");
    bounded(120, "a_large_row_passes_through_without_being_held_whole", async {
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        let before = p.peak_rss_kib();
        let v: String = c.query_one("select repeat('x', $1)", &[&(48 * MIB as i32)]).await.unwrap().get(0);
        assert!(v.len() == 48 * MIB && v.bytes().all(|b| b == b'x'), "the value arrived damaged");
        let rows = c.simple_query("select repeat('y', 48 * 1024 * 1024), 'after'").await.unwrap();
        let row = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        });
        let row = row.expect("a row");
        assert_eq!(row.get(0).map(str::len), Some(48 * MIB));
        assert_eq!(row.get(1), Some("after"), "the column after the large one");
        // The connection is in step after both.
        assert_eq!(c.scalar("select 'next'").await.unwrap(), "next");
        if let (Some(b), Some(a)) = (before, p.peak_rss_kib()) {
            eprintln!("parsnip's peak RSS: {b} KiB before, {a} KiB after");
            assert!(a - b < 16 * 1024, "parsnip's peak RSS grew by {} KiB for a 48 MiB row\n{}", a - b, p.log_tail());
        }
    })
    .await;
}

/// Logins to databases that do not exist (through `[databases."*"]`) leave no pool behind:
/// a stream of bad logins cannot grow parsnip's memory. A pool in use stays.
#[tokio::test]
async fn bad_database_names_leave_no_pools() {
    let p = Parsnip::trust("");
    bounded(60, "bad_database_names_leave_no_pools", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let used = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(used.scalar("select 1").await.unwrap(), "1");
        for i in 0..30 {
            let r = p.try_connect("postgres", Some(SUPER_PW), &format!("no_such_db_{i}")).await;
            let e = r.err().unwrap_or_else(|| panic!("no_such_db_{i} accepted"));
            assert_eq!(sqlstate(&e).as_deref(), Some("3D000"), "{}", describe(&e));
        }
        let pool_dbs = || async {
            let rows = console.simple_query("SHOW POOLS").await.unwrap();
            rows.iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get("database").map(str::to_owned),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        // The janitor (once a second) drops them; wait for it, bounded.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let dbs = pool_dbs().await;
            if !dbs.iter().any(|d| d.starts_with("no_such_db")) {
                assert!(dbs.iter().any(|d| d == "postgres"), "the pool in use was dropped: {dbs:?}");
                break;
            }
            assert!(Instant::now() < deadline, "pools of bad logins remain: {dbs:?}\n{}", p.log_tail());
            tokio::task::yield_now().await;
        }
        drop(used);
    })
    .await;
}

/// A pool for a database reached through `[databases."*"]` that has served clients goes
/// once it has had no client and no server connection for `autodb_idle_timeout_ms`.
#[tokio::test]
async fn unused_autodb_pools_are_dropped_after_their_timeout() {
    let p = Parsnip::trust("autodb_idle_timeout_ms = 1\nserver_idle_timeout_ms = 1");
    bounded(60, "unused_autodb_pools_are_dropped_after_their_timeout", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        drop(c);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let rows = console.simple_query("SHOW POOLS").await.unwrap();
            let listed = rows.iter().any(
                |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get("database") == Some("postgres")),
            );
            if !listed {
                break;
            }
            assert!(Instant::now() < deadline, "the unused pool stayed\n{}", p.log_tail());
            tokio::task::yield_now().await;
        }
    })
    .await;
}
