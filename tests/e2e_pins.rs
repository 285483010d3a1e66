//! Pinning that ends, under transaction pooling: a session advisory lock, a WITH HOLD
//! cursor or a temporary table keeps the client on its server connection while it lasts,
//! and the connection is shared again once the server says nothing is left; SHOW CLIENTS
//! says why a client is pinned; `pinned_timeout_ms` closes a pinned idle client with an
//! error naming the reason.

mod support;

use std::time::{Duration, Instant};

use support::*;

async fn pid(c: &Pg) -> String {
    c.scalar("select pg_backend_pid()").await.unwrap_or_else(|e| panic!("pid: {}", describe(&e)))
}

async fn run(c: &Pg, sql: &str) {
    c.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
}

/// The `pinned` column of SHOW CLIENTS for the client whose backend is `pid` (its pid is
/// parsnip's, so the row is found by the server it is linked to).
async fn pinned_of(console: &Pg, client_pid: &str) -> String {
    let servers = console_rows(console, "SHOW SERVERS").await;
    let ptr = servers
        .iter()
        .find(|r| r.get("remote_pid").cloned().flatten().as_deref() == Some(client_pid))
        .and_then(|r| r.get("ptr").cloned().flatten());
    let clients = console_rows(console, "SHOW CLIENTS").await;
    clients
        .iter()
        .find(|r| ptr.is_some() && r.get("link").cloned().flatten() == ptr)
        .and_then(|r| r.get("pinned").cloned().flatten())
        .unwrap_or_default()
}

/// Waits (bounded) until SHOW CLIENTS lists exactly these `pinned` values (non-empty ones,
/// sorted): the reasons are shown once the server confirmed them.
async fn wait_pinned(p: &Parsnip, console: &Pg, want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut got: Vec<String> = console_rows(console, "SHOW CLIENTS")
            .await
            .into_iter()
            .filter_map(|r| r.get("pinned").cloned().flatten().filter(|p| !p.is_empty()))
            .collect();
        got.sort();
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "SHOW CLIENTS pinned {got:?}, want {want:?}\n{}", p.log_tail());
        tokio::task::yield_now().await;
    }
}

/// Both other clients in a transaction at once hold both connections of a pool of two: one
/// of them is `pid_a`'s, which is therefore shared again.
async fn shared_again(b: &Pg, c: &Pg, pid_a: &str) {
    run(b, "BEGIN").await;
    let pb = pid(b).await;
    run(c, "BEGIN").await;
    let pc = pid(c).await;
    run(b, "COMMIT").await;
    run(c, "COMMIT").await;
    assert!(pb == pid_a || pc == pid_a, "a's connection {pid_a} not shared again (b {pb}, c {pc})");
}

/// a, b and c through a pool of two, and a console.
async fn three(p: &Parsnip) -> (Pg, Pg, Pg, Pg) {
    let console = p.connect("postgres", SUPER_PW, "parsnip").await;
    let a = p.connect("postgres", SUPER_PW, "postgres").await;
    let b = p.connect("postgres", SUPER_PW, "postgres").await;
    let c = p.connect("postgres", SUPER_PW, "postgres").await;
    (console, a, b, c)
}

/// While a holds `pid_a` for its session state, b and c share the other connection.
async fn others_never_get(a: &Pg, b: &Pg, c: &Pg, pid_a: &str) {
    for _ in 0..5 {
        assert_eq!(pid(a).await, pid_a, "a changed server connection while pinned");
        assert_ne!(pid(b).await, pid_a, "b got a's pinned connection");
        assert_ne!(pid(c).await, pid_a, "c got a's pinned connection");
    }
}

/// A session advisory lock pins a until its last one is released (taken twice, released
/// twice; then a try-lock through the extended protocol and `pg_advisory_unlock_all`);
/// meanwhile b and c share the other connection; after, a's connection is shared again
/// and no lock is left on the server.
#[tokio::test]
async fn advisory_locks_pin_until_the_last_is_released() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(90, "advisory_locks_pin_until_the_last_is_released", async {
        let (console, a, b, c) = three(&p).await;
        run(&a, "select pg_advisory_lock(7)").await;
        let pid_a = pid(&a).await;
        wait_pinned(&p, &console, &["advisory_lock"]).await;
        assert_eq!(pinned_of(&console, &pid_a).await, "advisory_lock");
        others_never_get(&a, &b, &c, &pid_a).await;
        // Taken again: two holds; one unlock leaves one.
        run(&a, "select pg_advisory_lock(7)").await;
        run(&a, "select pg_advisory_unlock(7)").await;
        others_never_get(&a, &b, &c, &pid_a).await;
        wait_pinned(&p, &console, &["advisory_lock"]).await;
        run(&a, "select pg_advisory_unlock(7)").await;
        wait_pinned(&p, &console, &[]).await;
        shared_again(&b, &c, &pid_a).await;
        // A try-lock through the extended protocol, a shared one, then unlock_all.
        let got: bool = a.query_one("select pg_try_advisory_lock($1)", &[&8i64]).await.expect("try").get(0);
        assert!(got);
        run(&a, "select pg_advisory_lock_shared(9)").await;
        let pid_a = pid(&a).await;
        wait_pinned(&p, &console, &["advisory_lock"]).await;
        others_never_get(&a, &b, &c, &pid_a).await;
        a.query("select pg_advisory_unlock_all()", &[]).await.expect("unlock_all");
        wait_pinned(&p, &console, &[]).await;
        shared_again(&b, &c, &pid_a).await;
        // (Only this test's keys: the other tests of this file share the cluster.)
        let left = psql_async(
            "postgres",
            "select count(*) from pg_locks where locktype = 'advisory' and classid = 0 and objid in (7, 8, 9)",
        )
        .await;
        assert_eq!(left.trim(), "0");
    })
    .await;
}

/// A try-lock that took nothing (another session holds the lock) does not pin.
#[tokio::test]
async fn a_try_lock_that_failed_does_not_pin() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(60, "a_try_lock_that_failed_does_not_pin", async {
        let (console, a, b, c) = three(&p).await;
        run(&a, "select pg_advisory_lock(11)").await;
        let pid_a = pid(&a).await;
        let got = b.scalar("select pg_try_advisory_lock(11)").await.expect("try");
        assert_eq!(got, "f");
        wait_pinned(&p, &console, &["advisory_lock"]).await;
        run(&a, "select pg_advisory_unlock(11)").await;
        wait_pinned(&p, &console, &[]).await;
        shared_again(&b, &c, &pid_a).await;
    })
    .await;
}

/// A cursor WITH HOLD pins until it is closed (CLOSE name, CLOSE ALL, DISCARD ALL); one
/// declared in a transaction that rolled back does not pin.
#[tokio::test]
async fn held_cursors_pin_until_closed() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(90, "held_cursors_pin_until_closed", async {
        let (console, a, b, c) = three(&p).await;
        for close in ["CLOSE cur", "CLOSE ALL", "DISCARD ALL"] {
            run(&a, "DECLARE cur CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 10) g").await;
            let pid_a = pid(&a).await;
            wait_pinned(&p, &console, &["cursor_with_hold"]).await;
            others_never_get(&a, &b, &c, &pid_a).await;
            // Read across transactions, on its own connection.
            assert_eq!(a.scalar("FETCH 1 FROM cur").await.expect("fetch"), "1");
            assert_eq!(a.scalar("FETCH 1 FROM cur").await.expect("fetch"), "2");
            run(&a, close).await;
            wait_pinned(&p, &console, &[]).await;
            shared_again(&b, &c, &pid_a).await;
        }
        run(&a, "BEGIN; DECLARE cur CURSOR WITH HOLD FOR SELECT 1; ROLLBACK").await;
        // The question was asked and answered (the first client query after it shows
        // nothing pinned), and a's connection is shared.
        let pid_a = pid(&a).await;
        wait_pinned(&p, &console, &[]).await;
        shared_again(&b, &c, &pid_a).await;
    })
    .await;
}

/// A temporary table pins until dropped or DISCARD TEMP / DISCARD ALL; one made ON COMMIT
/// DROP, or anything in pg_temp, the same way.
#[tokio::test]
async fn temp_tables_pin_until_dropped_or_discarded() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(90, "temp_tables_pin_until_dropped_or_discarded", async {
        let (console, a, b, c) = three(&p).await;
        for (create, end) in [
            ("CREATE TEMP TABLE tt (x int)", "DROP TABLE tt"),
            ("CREATE TEMPORARY TABLE tt (x int)", "DISCARD TEMP"),
            ("CREATE TABLE pg_temp.tt (x int)", "DISCARD ALL"),
        ] {
            run(&a, create).await;
            let pid_a = pid(&a).await;
            wait_pinned(&p, &console, &["temp_table"]).await;
            run(&a, "INSERT INTO tt VALUES (1), (2)").await;
            others_never_get(&a, &b, &c, &pid_a).await;
            assert_eq!(a.scalar("SELECT count(*) FROM tt").await.expect("count"), "2");
            let e = b.simple_query("SELECT count(*) FROM tt").await.expect_err("b saw a's temp table");
            assert_eq!(sqlstate(&e).as_deref(), Some("42P01"));
            run(&a, end).await;
            wait_pinned(&p, &console, &[]).await;
            shared_again(&b, &c, &pid_a).await;
        }
        run(&a, "BEGIN; CREATE TEMP TABLE gone (x int) ON COMMIT DROP; COMMIT").await;
        let pid_a = pid(&a).await;
        wait_pinned(&p, &console, &[]).await;
        shared_again(&b, &c, &pid_a).await;
    })
    .await;
}

/// A pinned client idle outside a transaction past `pinned_timeout_ms` (here set for the
/// database) is closed with FATAL 57P05 naming the reason; its lock goes with its server
/// connection, and the pool serves others. An unpinned idle client is not affected.
#[tokio::test]
async fn pinned_timeout_closes_the_client_with_the_reason() {
    let toml = trust_config("pool_size = 1\npool_mode = \"transaction\"")
        .replace("[databases.\"*\"]\n", "[databases.\"*\"]\npinned_timeout_ms = 300\n");
    let p = Parsnip::with_config(&toml);
    bounded(60, "pinned_timeout_closes_the_client_with_the_reason", async {
        let idle = p.connect("postgres", SUPER_PW, "postgres").await;
        run(&idle, "select 1").await;
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        run(&a, "select pg_advisory_lock(21)").await;
        let pid_a = pid(&a).await;
        let ended = a.ended(Duration::from_secs(10)).await.expect("a was not closed");
        let e = ended.expect_err("a's connection ended without an error");
        let db = e.as_db_error().unwrap_or_else(|| panic!("not a server error: {e:?}"));
        assert_eq!(db.code().code(), "57P05", "{}", describe(&e));
        assert_eq!(db.severity(), "FATAL");
        assert_eq!(db.message(), "terminating connection due to pinned_timeout (pinned by advisory_lock)");
        // The pool's one connection went with a's lock; the idle unpinned client is served.
        let got = idle.scalar("select pg_try_advisory_lock(21)").await.expect("served");
        assert_eq!(got, "t", "a's lock outlived it");
        assert_ne!(pid(&idle).await, pid_a, "a's connection was reused");
        run(&idle, "select pg_advisory_unlock_all()").await;
    })
    .await;
}
