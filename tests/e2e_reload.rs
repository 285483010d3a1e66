//! Online reload (the console's RELOAD, SIGHUP): databases changed, added and removed,
//! pool sizes, an invalid file keeping the old configuration; no client dropped, a client
//! in a transaction finishing it on its server.

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio_postgres::SimpleQueryMessage;

fn config(body: &str) -> String {
    format!("auth_type = \"trust\"\nunix_socket_dir = \"\"\n\n{body}\n\n[users.postgres]\npassword = \"{SUPER_PW}\"\n")
}

fn database(name: &str, dbname: &str, pool_size: usize) -> String {
    format!(
        "[databases.{name}]\nhost = \"127.0.0.1\"\nport = {}\ndbname = \"{dbname}\"\npool_size = {pool_size}\n",
        cluster().port()
    )
}

async fn pool_size(console: &Pg, db: &str) -> Option<String> {
    let msgs = console.simple_query("SHOW DATABASES").await.expect("SHOW DATABASES");
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) if r.get("name") == Some(db) => r.get("pool_size").map(str::to_owned),
        _ => None,
    })
}

#[tokio::test]
async fn reload_changes_adds_and_removes_databases_without_dropping_clients() {
    create_db("reload_a");
    create_db("reload_b");
    let p = Parsnip::with_config(&config(&database("rl", "reload_a", 1)));
    if direct_mode() {
        return;
    }
    bounded(60, "reload", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, "rl").await;
        a.simple_query("BEGIN").await.unwrap();
        assert_eq!(a.scalar("select current_database()").await.unwrap(), "reload_a");
        let old_pid = a.scalar("select pg_backend_pid()").await.unwrap();

        // rl now points at another database with a bigger pool; a database is added.
        p.rewrite_config(&config(&format!("{}\n{}", database("rl", "reload_b", 2), database("added", "reload_a", 1))));
        console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}\n{}", describe(&e), p.log_tail()));
        assert_eq!(pool_size(&console, "rl").await.as_deref(), Some("2"));
        // The transaction under way finishes on its server, undisturbed.
        assert_eq!(a.scalar("select current_database()").await.unwrap(), "reload_a");
        assert_eq!(a.scalar("select pg_backend_pid()").await.unwrap(), old_pid);
        a.simple_query("COMMIT").await.unwrap();
        // Its next transaction runs on the new target: the old connection was closed as it
        // came back.
        assert_eq!(a.scalar("select current_database()").await.unwrap(), "reload_b");
        let b = p.connect("postgres", SUPER_PW, "added").await;
        assert_eq!(b.scalar("select current_database()").await.unwrap(), "reload_a");

        // An invalid file changes nothing, and RELOAD says so.
        p.rewrite_config("pool_size = \"many\"\n");
        let e = console.simple_query("RELOAD").await.expect_err("an invalid file was accepted");
        assert_eq!(sqlstate(&e).as_deref(), Some("F0000"), "{}", describe(&e));
        assert_eq!(pool_size(&console, "rl").await.as_deref(), Some("2"));
        let c = p.connect("postgres", SUPER_PW, "added").await;
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");

        // SIGHUP: "added" removed. New clients are refused; connected ones stay.
        p.rewrite_config(&config(&database("rl", "reload_b", 2)));
        p.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match p.try_connect("postgres", Some(SUPER_PW), "added").await {
                Err(e) => {
                    assert_eq!(sqlstate(&e).as_deref(), Some("3D000"), "{}", describe(&e));
                    break;
                }
                Ok(_) => assert!(Instant::now() < deadline, "SIGHUP did not remove the database\n{}", p.log_tail()),
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(b.scalar("select current_database()").await.unwrap(), "reload_a", "a connected client was dropped");
        assert_eq!(a.scalar("select current_database()").await.unwrap(), "reload_b");
    })
    .await;
}

/// A client idle timeout added by a reload counts a connected client's idleness from its
/// last request (or from the reload), not from when it connected: a client older than the
/// timeout keeps working, and is closed once idle that long.
#[tokio::test]
async fn a_reloaded_idle_timeout_counts_from_the_last_request() {
    let p = Parsnip::with_config(&config(&database("rlidle", "postgres", 1)));
    if direct_mode() {
        return;
    }
    bounded(60, "a_reloaded_idle_timeout_counts_from_the_last_request", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let mut raw = p.raw_login("postgres", SUPER_PW, "rlidle").await;
        assert_eq!(raw.scalar("select 1").await.unwrap().as_deref(), Some("1"));
        // The client is now older than the timeout the reload brings.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        p.rewrite_config(&config(&format!("client_idle_timeout_ms = 1000\n{}", database("rlidle", "postgres", 1))));
        console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}\n{}", describe(&e), p.log_tail()));
        for i in 2..5 {
            let got = raw.scalar(&format!("select {i}")).await;
            assert_eq!(got.unwrap().as_deref(), Some(&*i.to_string()), "request {i}\n{}", p.log_tail());
        }
        let t0 = Instant::now();
        let e = raw.expect_error_and_close(Duration::from_secs(10), "idle client").await;
        assert_eq!(e.code(), "57P05", "{e}\n{}", p.log_tail());
        assert!(t0.elapsed() >= Duration::from_millis(800), "closed after {:?}", t0.elapsed());
    })
    .await;
}
