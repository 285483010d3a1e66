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

/// The embedded PostgreSQL's temp dir, from parsnip's "embedded PostgreSQL N running in
/// DIR/data (port P)" line.
fn embedded_root(p: &Parsnip) -> std::path::PathBuf {
    let logs = p.logs();
    let line = logs.lines().find(|l| l.contains("running in")).unwrap_or_else(|| panic!("no embedded line\n{logs}"));
    let data = line.split("running in ").nth(1).and_then(|r| r.split(" (port").next()).expect("data dir");
    std::path::Path::new(data).parent().expect("root").to_path_buf()
}

/// PgBouncer's signals that parsnip does not act on yet (SIGHUP, SIGUSR1, SIGUSR2) never
/// end the process; and the embedded PostgreSQL goes with parsnip on every exit path, even
/// SIGKILL (nothing of parsnip runs then: its reaper does the work).
#[tokio::test]
async fn stray_signals_are_harmless_and_sigkill_takes_the_embedded_cluster_along() {
    if direct_mode() {
        return;
    }
    let mut p = Parsnip::start(&["--embedded"]);
    let root = embedded_root(&p);
    let pid_file = root.join("data").join("postmaster.pid");
    let postmaster: i32 = std::fs::read_to_string(&pid_file)
        .expect("postmaster.pid")
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("postmaster pid");
    bounded(60, "stray signals", async {
        // SIGHUP reloads (nothing changed), SIGUSR1 pauses, SIGUSR2 resumes: none ends it.
        let console = p.connect("postgres", "unused", "parsnip").await;
        let paused = async || {
            let rows = console.simple_query("SHOW STATE").await.expect("SHOW STATE");
            rows.iter().any(|m| {
                matches!(m, tokio_postgres::SimpleQueryMessage::Row(r)
                    if r.get("key") == Some("paused") && r.get("value") == Some("yes"))
            })
        };
        p.signal(libc::SIGHUP);
        p.signal(libc::SIGUSR1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !paused().await {
            assert!(Instant::now() < deadline, "SIGUSR1 did not pause\n{}", p.log_tail());
            tokio::task::yield_now().await;
        }
        p.signal(libc::SIGUSR2);
        while paused().await {
            assert!(Instant::now() < deadline, "SIGUSR2 did not resume\n{}", p.log_tail());
            tokio::task::yield_now().await;
        }
        let c = p.connect("postgres", "unused", "postgres").await;
        assert_eq!(c.scalar("select 1").await.expect("query after the signals"), "1");
    })
    .await;
    assert!(p.alive(), "a signal ended parsnip\n{}", p.log_tail());
    assert!(p.wait_for_log("SIGHUP", Duration::from_secs(5)), "SIGHUP not logged\n{}", p.log_tail());
    assert!(
        p.wait_for_log("configuration reloaded", Duration::from_secs(5)),
        "the embedded mode's reload failed\n{}",
        p.log_tail()
    );

    p.signal(libc::SIGKILL);
    assert!(p.wait_exit(Duration::from_secs(10)).is_some(), "SIGKILL");
    // The reaper stops the postmaster and removes the dir; wait for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    // SAFETY: kill(pid, 0) only checks whether the process exists.
    while root.exists() || unsafe { libc::kill(postmaster, 0) } == 0 {
        assert!(
            Instant::now() < deadline,
            "embedded cluster left behind: {} (postmaster {postmaster})",
            root.display()
        );
        std::thread::yield_now();
    }
}
