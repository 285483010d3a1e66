//! PgBouncer's connection limits across pools: `max_db_connections` and
//! `max_user_connections` (server connections per database across its users, per user
//! across databases), `max_db_client_connections` and `max_user_client_connections`
//! (clients refused beyond), and the reserve pool (`reserve_pool_size`, used only once a
//! client has waited `reserve_pool_timeout_ms`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::*;

/// Server connections PostgreSQL has now for database `db` (and the users among them),
/// seen through `sampler`, a direct connection.
async fn server_count(sampler: &Pg, filter: &str) -> (usize, Vec<String>) {
    let rows = sampler
        .query(
            &format!(
                "select usename::text from pg_stat_activity where backend_type = 'client backend' \
                 and pid <> pg_backend_pid() and {filter}"
            ),
            &[],
        )
        .await
        .expect("sampling pg_stat_activity");
    (rows.len(), rows.iter().map(|r| r.get::<_, String>(0)).collect())
}

/// Runs `clients` clients through `p`, each logging in as one of `logins` (user, password,
/// database) in turn and running `rounds` short transactions, while `sampler` counts the
/// server backends matching `filter` and at work as fast as it can. Returns the highest
/// count seen and every user seen among them.
async fn run_and_sample(
    p: &Parsnip,
    logins: &[(&'static str, &'static str, &'static str)],
    clients: usize,
    rounds: usize,
    filter: &str,
) -> (usize, std::collections::BTreeSet<String>) {
    let sampler = Pg::connect(cluster().port(), "postgres", Some(SUPER_PW), "postgres").await.expect("sampler");
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (user, pw, db) = logins[i % logins.len()];
        let port = p.port();
        let (done, failed) = (done.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let r = async {
                let c = Pg::connect(port, user, Some(pw), db).await?;
                for _ in 0..rounds {
                    c.simple_query("select pg_sleep(0.002)").await?;
                }
                Ok::<_, tokio_postgres::Error>(())
            }
            .await;
            if let Err(e) = &r {
                eprintln!("client {i} ({user}@{db}): {}", describe(e));
                failed.store(true, Ordering::SeqCst);
            }
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let (mut max, mut users) = (0, std::collections::BTreeSet::new());
    // Backends at work. An idle one parsnip closed (evicted to make room, or past its
    // idle time) may still be listed for a moment after its slot went to a new connection:
    // its backend has not read the end of its socket yet, and never runs anything again.
    let filter = format!("({filter}) and state <> 'idle'");
    while done.load(Ordering::SeqCst) < clients {
        let (n, seen) = server_count(&sampler, &filter).await;
        max = max.max(n);
        users.extend(seen);
    }
    for t in tasks {
        t.await.expect("client task");
    }
    assert!(!failed.load(Ordering::SeqCst), "every client must get its queries answered\n{}", p.log_tail());
    (max, users)
}

/// The judge: 200 clients of two users against `max_db_connections = 5` with pools
/// of 20 never make PostgreSQL see a sixth connection to the database, and both users are
/// served (they wait for a server instead of failing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_db_connections_caps_a_database_across_its_users() {
    const DB: &str = "cap_db";
    create_db(DB);
    let p = Parsnip::trust("pool_size = 20\nmax_db_connections = 5\n");
    if direct_mode() {
        return;
    }
    bounded(120, "max_db_connections_caps_a_database_across_its_users", async {
        let logins = [("postgres", SUPER_PW, DB), ("app", APP_PW, DB)];
        let (max, users) = run_and_sample(&p, &logins, 200, 5, &format!("datname = '{DB}'")).await;
        assert!(max <= 5, "{max} server connections to {DB} at once, limit 5\n{}", p.log_tail());
        assert!(max >= 2, "the sampler saw the load ({max})");
        assert_eq!(users.len(), 2, "both users had servers: {users:?}");
    })
    .await;
}

/// `max_user_connections` in a `[users]` entry: one user's clients over two databases
/// never hold more server connections than the cap, together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_user_connections_caps_a_user_across_databases() {
    const DB: &str = "cap_user";
    create_db(DB);
    let mut cfg = trust_config("pool_size = 10");
    cfg = cfg.replace("[users.app]\n", "[users.app]\nmax_user_connections = 3\n");
    let p = Parsnip::with_config(&cfg);
    if direct_mode() {
        return;
    }
    bounded(120, "max_user_connections_caps_a_user_across_databases", async {
        let logins = [("app", APP_PW, DB), ("app", APP_PW, "other")];
        let (max, _) =
            run_and_sample(&p, &logins, 60, 5, &format!("usename = 'app' and datname in ('{DB}', 'other')")).await;
        assert!(max <= 3, "{max} server connections of app at once, limit 3\n{}", p.log_tail());
        assert!(max >= 2, "the sampler saw the load ({max})");
    })
    .await;
}

/// At the database's limit, an idle server connection of another user's pool is closed to
/// make room (PgBouncer's eviction), so a client of a pool with room of its own is not
/// left waiting behind a connection nobody uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_of_another_user_is_closed_to_make_room() {
    const DB: &str = "cap_evict";
    create_db(DB);
    let p = Parsnip::trust("max_db_connections = 1\nserver_idle_timeout_ms = 0\n");
    if direct_mode() {
        return;
    }
    bounded(60, "an_idle_connection_of_another_user_is_closed_to_make_room", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        assert_eq!(a.scalar("select current_user").await.unwrap(), "postgres");
        let view = wait_backends(DB, Duration::from_secs(10), |v| v.len() == 1 && v[0].0 == "postgres").await;
        view.unwrap_or_else(|v| panic!("postgres's server is open and idle: {v:?}"));
        let b = p.connect("app", APP_PW, DB).await;
        let t0 = Instant::now();
        assert_eq!(b.scalar("select current_user").await.unwrap(), "app");
        assert!(t0.elapsed() < Duration::from_secs(5), "no wait for an idle timeout: {:?}", t0.elapsed());
        let view = wait_backends(DB, Duration::from_secs(10), |v| v.len() == 1 && v[0].0 == "app").await;
        view.unwrap_or_else(|v| panic!("the idle postgres connection made room for app's: {v:?}"));
        // And back: postgres's client gets a server again the same way.
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
    })
    .await;
}

/// Connects until it works (a client's count is given back as its task ends, just after
/// its socket closes), within `within`.
async fn connect_soon(p: &Parsnip, user: &str, pw: &str, db: &str, within: Duration) -> Pg {
    let deadline = Instant::now() + within;
    loop {
        match p.try_connect(user, Some(pw), db).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => {
                panic!("{user}@{db} never got in: {}\n{}", describe(&e), p.log_tail())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Beyond `max_db_client_connections` (here set on one database) and
/// `max_user_client_connections` (on one user) a client is refused with PgBouncer's FATAL,
/// 08P01 and message; other databases and users are not limited; a client that leaves
/// makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_limits_refuse_with_pgbouncers_error() {
    const DB: &str = "cap_clients";
    create_db(DB);
    let cfg = trust_config("").replace("[users.app]\n", "[users.app]\nmax_user_client_connections = 2\n")
        + &format!(
            "\n[databases.{DB}]\nhost = \"127.0.0.1\"\nport = {}\nmax_db_client_connections = 2\n",
            cluster().port()
        );
    let p = Parsnip::with_config(&cfg);
    if direct_mode() {
        return;
    }
    bounded(60, "client_limits_refuse_with_pgbouncers_error", async {
        // The database: two clients, the third refused.
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let e = expect_code(p.try_connect("postgres", Some(SUPER_PW), DB).await.map(|_| ()), "08P01", "third client");
        assert_eq!((e.severity(), e.message()), ("FATAL", "client connections exceeded (max_db_client_connections)"));
        // Another database is not limited.
        let others: Vec<Pg> = connect_n(&p, "postgres", SUPER_PW, "postgres", 3).await;
        assert_eq!(others.len(), 3);
        drop(b);
        let b = connect_soon(&p, "postgres", SUPER_PW, DB, Duration::from_secs(5)).await;
        assert_eq!(b.scalar("select 1").await.unwrap(), "1");
        assert_eq!(a.scalar("select 2").await.unwrap(), "2");
        // The user: two clients over two databases, the third refused anywhere.
        let c = p.connect("app", APP_PW, "postgres").await;
        let d = p.connect("app", APP_PW, "other").await;
        let e = expect_code(p.try_connect("app", Some(APP_PW), "other").await.map(|_| ()), "08P01", "third app client");
        assert_eq!((e.severity(), e.message()), ("FATAL", "client connections exceeded (max_user_client_connections)"));
        drop(c);
        let c = connect_soon(&p, "app", APP_PW, "postgres", Duration::from_secs(5)).await;
        assert_eq!(c.scalar("select current_user").await.unwrap(), "app");
        assert_eq!(d.scalar("select current_database()").await.unwrap(), "other");
    })
    .await;
}

async fn connect_n(p: &Parsnip, user: &str, pw: &str, db: &str, n: usize) -> Vec<Pg> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(p.connect(user, pw, db).await);
    }
    v
}

/// `reserve_pool_size = 1`, `reserve_pool_timeout_ms = 1500` on a pool of one: while a
/// client holds the one server in a transaction, a second client waits, with still one
/// server connection open, until it has waited the timeout; then it gets a connection
/// from the reserve (PgBouncer's "taking connection from reserve_pool") while the first
/// still holds its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserve_is_used_only_after_reserve_pool_timeout() {
    const DB: &str = "cap_reserve";
    create_db(DB);
    let p = Parsnip::trust("pool_size = 1\nreserve_pool_size = 1\nreserve_pool_timeout_ms = 1500\n");
    if direct_mode() {
        return;
    }
    bounded(60, "the_reserve_is_used_only_after_reserve_pool_timeout", async {
        let sampler = Pg::connect(cluster().port(), "postgres", Some(SUPER_PW), "postgres").await.expect("sampler");
        let filter = format!("datname = '{DB}'");
        let a = p.connect("postgres", SUPER_PW, DB).await;
        a.simple_query("begin; select 1").await.unwrap();
        assert_eq!(server_count(&sampler, &filter).await.0, 1);
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let t0 = Instant::now();
        let waiting = tokio::spawn(async move { b.scalar("select 'b'").await.map(|v| (v, t0.elapsed())) });
        // Until b is answered: one server connection while b has waited less than the
        // timeout (sampled, minus the sample's own time), at most two after.
        let mut early_max = 0;
        while !waiting.is_finished() {
            let sampled_at = t0.elapsed();
            let (n, _) = server_count(&sampler, &filter).await;
            if t0.elapsed() < Duration::from_millis(1500) {
                early_max = early_max.max(n);
            }
            assert!(n <= 2, "{n} server connections for a pool of 1 + 1 at {sampled_at:?}");
        }
        let (v, waited) = waiting.await.expect("task").expect("b is served from the reserve");
        assert_eq!(v, "b");
        assert_eq!(early_max, 1, "the reserve was not used before the timeout");
        assert!(waited >= Duration::from_millis(1500), "b was served after {waited:?}, before the timeout");
        assert_eq!(server_count(&sampler, &filter).await.0, 2, "a still holds its server: b's came from the reserve");
        assert!(p.wait_for_log("taking connection from reserve_pool", Duration::from_secs(5)), "{}", p.log_tail());
        a.simple_query("commit").await.unwrap();
    })
    .await;
}

/// The console shows the limits in PgBouncer's columns (`SHOW DATABASES`'s
/// max_connections, reserve_pool_size, max_client_connections; `SHOW USERS`'s
/// max_user_connections, max_user_client_connections and the counts; `SHOW CONFIG`'s keys,
/// which the Prometheus exporter turns into pgbouncer_config_* gauges), and a reload
/// changes them at once, as in PgBouncer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_show_on_the_console_and_change_on_reload() {
    const DB: &str = "cap_show";
    create_db(DB);
    let config = |user_clients: u32| {
        trust_config("max_db_connections = 4\nmax_user_connections = 6\nreserve_pool_size = 1")
            .replace("[users.app]\n", &format!("[users.app]\nmax_user_client_connections = {user_clients}\n"))
            + &format!(
                "\n[databases.{DB}]\nhost = \"127.0.0.1\"\nport = {}\nmax_db_client_connections = 5\n\
                 reserve_pool_size = 2\n",
                cluster().port()
            )
    };
    let p = Parsnip::with_config(&config(2));
    if direct_mode() {
        return;
    }
    bounded(60, "limits_show_on_the_console_and_change_on_reload", async {
        let a = p.connect("app", APP_PW, DB).await;
        let b = p.connect("app", APP_PW, DB).await;
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        let get = |r: &Row, k: &str| r.get(k).cloned().flatten().unwrap_or_else(|| panic!("no {k} in {r:?}"));
        let dbs = console_rows(&console, "SHOW DATABASES").await;
        let d = dbs.iter().find(|r| get(r, "name") == DB).expect("the database's row");
        for (k, v) in [
            ("max_connections", "4"),
            ("current_connections", "1"),
            ("reserve_pool_size", "2"),
            ("max_client_connections", "5"),
            ("current_client_connections", "2"),
        ] {
            assert_eq!(get(d, k), v, "SHOW DATABASES {k}: {d:?}");
        }
        let users = console_rows(&console, "SHOW USERS").await;
        let u = users.iter().find(|r| get(r, "name") == "app").expect("app's row");
        for (k, v) in [
            ("max_user_connections", "6"),
            ("current_connections", "1"),
            ("max_user_client_connections", "2"),
            ("current_client_connections", "2"),
        ] {
            assert_eq!(get(u, k), v, "SHOW USERS {k}: {u:?}");
        }
        let config_rows = console_rows(&console, "SHOW CONFIG").await;
        let key = |k: &str| config_rows.iter().find(|r| get(r, "key") == k).map(|r| get(r, "value"));
        assert_eq!(key("max_user_connections").as_deref(), Some("6"));
        assert_eq!(key("max_db_connections").as_deref(), Some("4"));
        assert_eq!(key("reserve_pool_size").as_deref(), Some("1"));
        assert_eq!(key("max_user_client_connections").as_deref(), Some("0"));
        // Full for app; a reload raises its limit and a third client gets in.
        let e = expect_code(p.try_connect("app", Some(APP_PW), DB).await.map(|_| ()), "08P01", "third app client");
        assert!(e.message().contains("max_user_client_connections"), "{e}");
        p.rewrite_config(&config(3));
        console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}", describe(&e)));
        let c = p.connect("app", APP_PW, DB).await;
        assert_eq!(c.scalar("select 3").await.unwrap(), "3");
        let users = console_rows(&console, "SHOW USERS").await;
        let u = users.iter().find(|r| get(r, "name") == "app").expect("app's row");
        assert_eq!(
            (get(u, "max_user_client_connections"), get(u, "current_client_connections")),
            ("3".into(), "3".into())
        );
        drop((a, b));
    })
    .await;
}

/// A reload lowering `max_db_connections` applies to the next server connections: with
/// one held in a transaction at the new limit of 1, another client waits rather than
/// opening a second, and gets the server once the first commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_max_db_connections() {
    const DB: &str = "cap_reload";
    create_db(DB);
    let p = Parsnip::trust("max_db_connections = 5");
    if direct_mode() {
        return;
    }
    bounded(60, "a_reload_changes_max_db_connections", async {
        let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
        p.rewrite_config(&trust_config("max_db_connections = 1"));
        console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}", describe(&e)));
        // Both log in first (a pool's first login takes a server connection to learn the
        // server's parameters, as in PgBouncer).
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("app", APP_PW, DB).await;
        a.simple_query("begin; select 1").await.unwrap();
        let waiting = tokio::spawn(async move { b.scalar("select current_user").await });
        // b waits: it is queued in its pool (SHOW POOLS' cl_waiting) and PostgreSQL still
        // has one backend for the database.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pools = console_rows(&console, "SHOW POOLS").await;
            let waiting_app = pools.iter().any(|r| {
                r.get("database").cloned().flatten().as_deref() == Some(DB)
                    && r.get("user").cloned().flatten().as_deref() == Some("app")
                    && r.get("cl_waiting").cloned().flatten().as_deref() == Some("1")
            });
            if waiting_app {
                break;
            }
            assert!(Instant::now() < deadline, "app's client never queued: {pools:?}");
            tokio::task::yield_now().await;
        }
        // (An evicted connection's backend may take a moment to leave pg_stat_activity.)
        let one = wait_backends(DB, Duration::from_secs(10), |v| v.len() == 1).await;
        one.unwrap_or_else(|v| panic!("still one server connection: {v:?}"));
        assert!(!waiting.is_finished());
        a.simple_query("commit").await.unwrap();
        let who = waiting.await.expect("task").expect("b gets the database's one server once a commits");
        assert_eq!(who, "app");
    })
    .await;
}
