//! Signals: SIGTERM drains transactions and exits 0; SIGINT exits at once.

mod support;

use std::time::{Duration, Instant};

use support::*;

#[tokio::test]
async fn sigterm_lets_transactions_finish() {
    const DB: &str = "termdb";
    create_db(DB);
    psql(DB, "CREATE TABLE t (x int); GRANT ALL ON t TO PUBLIC;");
    let mut p = Parsnip::trust("shutdown_timeout_ms = 20000");
    if direct_mode() {
        return;
    }
    bounded(60, "sigterm_lets_transactions_finish", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let idle = p.connect("postgres", SUPER_PW, DB).await;
        a.batch_execute("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();

        p.signal(libc::SIGTERM);

        // New connections are refused (bounded retry: the signal is handled asynchronously).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match p.try_connect("postgres", Some(SUPER_PW), DB).await {
                Err(_) => break,
                Ok(c) => {
                    drop(c);
                    assert!(Instant::now() < deadline, "still accepting clients 5 s after SIGTERM\n{}", p.log_tail());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        assert!(p.alive(), "exited while a transaction was open\n{}", p.log_tail());

        // The open transaction goes on and commits.
        let n = a.scalar("select count(*) from t").await.unwrap_or_else(|e| {
            panic!("query in the open transaction after SIGTERM: {}\n{}", describe(&e), p.log_tail())
        });
        assert_eq!(n, "1");
        a.batch_execute("INSERT INTO t VALUES (2); COMMIT")
            .await
            .unwrap_or_else(|e| panic!("COMMIT after SIGTERM: {}\n{}", describe(&e), p.log_tail()));
        assert_eq!(psql_async(DB, "select count(*) from t").await, "2");

        // With no transaction left, it exits 0 (without waiting for idle clients to leave).
        let status = p.wait_exit_async(Duration::from_secs(10)).await;
        let status = status.unwrap_or_else(|| panic!("still running 10 s after the last COMMIT\n{}", p.log_tail()));
        assert!(status.success(), "exit status {status:?}\n{}", p.log_tail());
        drop((a, idle));
        // No server connection left behind.
        wait_backends(DB, Duration::from_secs(5), |v| v.is_empty())
            .await
            .unwrap_or_else(|v| panic!("server connections left after exit: {v:?}"));
    })
    .await;
}

#[tokio::test]
async fn sigterm_with_no_clients_exits_0() {
    let mut p = Parsnip::trust("");
    if direct_mode() {
        return;
    }
    bounded(30, "sigterm_with_no_clients_exits_0", async {
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        drop(c);
        p.signal(libc::SIGTERM);
        let status = p.wait_exit_async(Duration::from_secs(10)).await;
        let status = status.unwrap_or_else(|| panic!("no exit 10 s after SIGTERM\n{}", p.log_tail()));
        assert!(status.success(), "exit status {status:?}\n{}", p.log_tail());
    })
    .await;
}

#[tokio::test]
async fn sigint_exits_promptly() {
    let mut p = Parsnip::trust("shutdown_timeout_ms = 60000");
    if direct_mode() {
        return;
    }
    bounded(30, "sigint_exits_promptly", async {
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        a.batch_execute("BEGIN; select 1").await.unwrap();
        let sleeper = p.connect("postgres", SUPER_PW, "postgres").await;
        let running = tokio::spawn(async move { sleeper.simple_query("select pg_sleep(20)").await.map(|_| ()) });
        wait_backends("postgres", Duration::from_secs(10), |v| v.iter().any(|(_, s)| s == "active")).await.ok();
        let t0 = Instant::now();
        p.signal(libc::SIGINT);
        let status = p.wait_exit_async(Duration::from_secs(3)).await;
        assert!(status.is_some(), "still running 3 s after SIGINT despite open work\n{}", p.log_tail());
        assert!(t0.elapsed() < Duration::from_secs(3));
        // The clients see their connection end.
        let r = within(Duration::from_secs(5), running).await.expect("client not disconnected").unwrap();
        assert!(r.is_err(), "the running query cannot have completed");
        assert!(a.scalar("select 1").await.is_err());
    })
    .await;
}
