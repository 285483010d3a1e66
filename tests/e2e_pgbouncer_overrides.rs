//! A pgbouncer.ini's per-user and per-database overrides take effect as in PgBouncer: a
//! user's `pool_mode = session` against a global transaction mode (seen in which backend
//! serves which client), a user's `pool_size` (seen in pg_stat_activity and a queued
//! client), a user's `client_idle_timeout` and `query_timeout`, a database's
//! `server_lifetime`, `timezone`, `datestyle`, `application_name`, `min_pool_size`,
//! `auth_user` and `auth_query`; RELOAD applies a changed override, and SHOW USERS / SHOW
//! DATABASES show them.

mod support;

use std::path::PathBuf;
use std::time::Duration;
use support::*;

const DB: &str = "ini_overrides";

/// Writes the ini (with `users` as its `[users]` lines) beside a userlist with the
/// cluster's passwords; returns its path.
fn write_ini(dir: &std::path::Path, users: &str) -> PathBuf {
    let port = cluster().port();
    std::fs::create_dir_all(dir).expect("temp dir");
    std::fs::write(
        dir.join("userlist.txt"),
        format!("\"postgres\" \"{SUPER_PW}\"\n\"app\" \"{APP_PW}\"\n\"idler\" \"idler-pw\"\n"),
    )
    .expect("writing the userlist");
    let ini = dir.join("pgbouncer.ini");
    std::fs::write(
        &ini,
        format!(
            "[databases]\n{DB} = host=127.0.0.1 port={port} server_lifetime=120 timezone=Asia/Tokyo \
             application_name=from_ini datestyle='SQL, DMY'\n\
             [users]\n{users}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nunix_socket_dir =\nauth_type = trust\n\
             auth_file = userlist.txt\nadmin_users = postgres\npool_mode = transaction\n\
             default_pool_size = 10\nserver_lifetime = 3600\n"
        ),
    )
    .expect("writing the ini");
    ini
}

/// A column's value; an empty one (SHOW USERS' pool_size when unset) as None.
fn field(r: &Row, c: &str) -> Option<String> {
    r.get(c).cloned().flatten().filter(|v| !v.is_empty())
}

async fn row(console: &Pg, show: &str, key: &str, value: &str) -> Row {
    let rows = console_rows(console, show).await;
    rows.into_iter().find(|r| field(r, key).as_deref() == Some(value)).unwrap_or_else(|| panic!("{show}: no {value}"))
}

fn count(view: &[(String, String)], user: &str) -> usize {
    view.iter().filter(|(u, _)| u == user).count()
}

#[tokio::test]
async fn user_and_database_overrides_take_effect_and_reload() {
    create_db(DB);
    psql(
        "postgres",
        "DO $$BEGIN CREATE ROLE idler LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END$$;\n\
         ALTER ROLE idler PASSWORD 'idler-pw';",
    );
    let dir = temp_path("ini-overrides");
    let users = "postgres = pool_mode=session\napp = pool_size=2\nidler = client_idle_timeout=0.3 query_timeout=1";
    let ini = write_ini(&dir, users);
    let p = Parsnip::start(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path")]);
    let pid = "select pg_backend_pid()";

    // The database's timezone, datestyle and application_name: a client's defaults (a
    // client's own startup value wins, as on a server PgBouncer logged in with them).
    let t = p.connect("app", APP_PW, DB).await;
    assert_eq!(t.scalar("show timezone").await.unwrap(), "Asia/Tokyo");
    assert_eq!(t.scalar("show datestyle").await.unwrap(), "SQL, DMY");
    assert_eq!(t.scalar("show application_name").await.unwrap(), "from_ini");
    let mut own = pg_config(p.port(), "app", Some(APP_PW), DB);
    own.application_name("mine").options("-c TimeZone=UTC");
    let own = Pg::connect_config(&mut own).await.expect("app with its own settings");
    assert_eq!(own.scalar("show timezone").await.unwrap(), "UTC");
    assert_eq!(own.scalar("show application_name").await.unwrap(), "mine");
    drop((t, own));

    // postgres's session mode: each client keeps its own backend, even while idle.
    let a = p.connect("postgres", SUPER_PW, DB).await;
    let b = p.connect("postgres", SUPER_PW, DB).await;
    let (a1, b1) = (a.scalar(pid).await.unwrap(), b.scalar(pid).await.unwrap());
    assert_ne!(a1, b1, "session mode: two clients, two backends");
    assert_eq!(a.scalar(pid).await.unwrap(), a1, "session mode: the same backend again");
    // app has the global transaction mode: an idle client's backend serves the next one.
    let c = p.connect("app", APP_PW, DB).await;
    let d = p.connect("app", APP_PW, DB).await;
    assert_eq!(c.scalar(pid).await.unwrap(), d.scalar(pid).await.unwrap(), "transaction mode shares a backend");

    // app's pool_size = 2: two open transactions hold both; a third client queues.
    c.simple_query("BEGIN; SELECT 1").await.expect("c's transaction");
    d.simple_query("BEGIN; SELECT 1").await.expect("d's transaction");
    let e = p.connect("app", APP_PW, DB).await;
    let console = p.connect("postgres", SUPER_PW, "pgbouncer").await;
    let queued = tokio::spawn(async move { e.scalar("select 42").await.map(|v| (v, e)) });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let pool = console_rows(&console, "SHOW POOLS")
            .await
            .into_iter()
            .find(|r| field(r, "database").as_deref() == Some(DB) && field(r, "user").as_deref() == Some("app"));
        if pool.as_ref().and_then(|r| field(r, "cl_waiting")).as_deref() == Some("1") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the third app client never queued: {pool:?}");
        tokio::task::yield_now().await;
    }
    assert_eq!(count(&backends(DB), "app"), 2, "pool_size 2: two backends for app");
    c.simple_query("COMMIT").await.expect("commit");
    let (v, _e) = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the queued client is served once a backend is free")
        .expect("task")
        .expect("select 42");
    assert_eq!(v, "42");
    assert_eq!(count(&backends(DB), "app"), 2, "still two");
    d.simple_query("COMMIT").await.expect("commit");

    // idler's client_idle_timeout (0.3 s) closes its idle client; postgres's (global 0) not.
    let idle = p.connect("idler", "idler-pw", DB).await;
    assert_eq!(idle.scalar("select current_user").await.unwrap(), "idler");
    assert!(idle.ended(Duration::from_secs(10)).await.is_ok(), "idler's idle client is closed");
    assert_eq!(a.scalar(pid).await.unwrap(), a1, "postgres's idle client stays");
    // idler's query_timeout (1 s): a query running longer ends the client, and is cancelled
    // on the server (whose connection then goes back to the pool).
    let slow = p.connect("idler", "idler-pw", DB).await;
    let e = bounded(20, "query_timeout", slow.scalar("select pg_sleep(60)")).await.expect_err("timed out");
    let db_err = e.as_db_error().unwrap_or_else(|| panic!("a server error: {e}"));
    assert_eq!((db_err.code().code(), db_err.message()), ("57014", "terminating connection due to query_timeout"));
    let ended = wait_backends(DB, Duration::from_secs(10), |v| {
        v.iter().filter(|(u, _)| u == "idler").all(|(_, state)| state != "active")
    })
    .await;
    assert!(ended.is_ok(), "the query ran on: {ended:?}");

    // The console shows the overrides.
    let u = row(&console, "SHOW USERS", "name", "postgres").await;
    assert_eq!((field(&u, "pool_mode").as_deref(), field(&u, "pool_size")), (Some("session"), None));
    let u = row(&console, "SHOW USERS", "name", "app").await;
    assert_eq!((field(&u, "pool_mode"), field(&u, "pool_size").as_deref()), (None, Some("2")));
    let d = row(&console, "SHOW DATABASES", "name", DB).await;
    assert_eq!(field(&d, "server_lifetime").as_deref(), Some("120"), "the database's server_lifetime");

    // RELOAD: app's pool_size 2 -> 3 applies to its pool.
    write_ini(&dir, &users.replace("pool_size=2", "pool_size=3"));
    console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}\n{}", describe(&e), p.log_tail()));
    let u = row(&console, "SHOW USERS", "name", "app").await;
    assert_eq!(field(&u, "pool_size").as_deref(), Some("3"));
    let held: Vec<Pg> = app_clients(&p, 3).await;
    for h in &held {
        let began = tokio::time::timeout(Duration::from_secs(10), h.simple_query("BEGIN; SELECT 1")).await;
        began.expect("a third backend for app after RELOAD").expect("a transaction");
    }
    assert_eq!(count(&backends(DB), "app"), 3, "after RELOAD, three backends for app");
    for h in &held {
        h.simple_query("COMMIT").await.expect("commit");
    }

    // RELOAD with another timezone for the database: new clients start with it, connected
    // ones keep the one they started with.
    let text = std::fs::read_to_string(&ini).expect("the ini");
    std::fs::write(&ini, text.replace("Asia/Tokyo", "Europe/Paris")).expect("rewriting the ini");
    console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}\n{}", describe(&e), p.log_tail()));
    let fresh = p.connect("app", APP_PW, DB).await;
    assert_eq!(fresh.scalar("show timezone").await.unwrap(), "Europe/Paris");
    assert_eq!(held[0].scalar("show timezone").await.unwrap(), "Asia/Tokyo", "a client from before");
}

#[tokio::test]
async fn a_databases_min_pool_size_is_opened_once_a_client_uses_its_pool() {
    const WARM: &str = "ini_warm";
    create_db(WARM);
    let dir = temp_path("ini-warm");
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("userlist.txt"), format!("\"app\" \"{APP_PW}\"\n")).expect("userlist");
    let ini = dir.join("pgbouncer.ini");
    let port = cluster().port();
    std::fs::write(
        &ini,
        format!(
            "[databases]\n{WARM} = host=127.0.0.1 port={port} min_pool_size=3\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nunix_socket_dir =\nauth_type = trust\n\
             auth_file = userlist.txt\npool_mode = transaction\ndefault_pool_size = 5\n"
        ),
    )
    .expect("writing the ini");
    let p = Parsnip::start(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path")]);
    let c = p.connect("app", APP_PW, WARM).await;
    assert_eq!(c.scalar("select 1").await.unwrap(), "1");
    // One client, one query at a time: only min_pool_size explains three backends.
    let seen = wait_backends(WARM, Duration::from_secs(15), |v| count(v, "app") >= 3).await;
    let view = seen.unwrap_or_else(|v| panic!("min_pool_size 3 not reached: {v:?}\n{}", p.log_tail()));
    assert_eq!(count(&view, "app"), 3, "no more than the minimum");
    let console = p.connect("app", APP_PW, "pgbouncer").await;
    let d = row(&console, "SHOW DATABASES", "name", WARM).await;
    assert_eq!(field(&d, "min_pool_size").as_deref(), Some("3"));
}

#[tokio::test]
async fn a_databases_auth_user_and_auth_query_look_up_its_clients() {
    let dir = temp_path("ini-db-auth");
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("userlist.txt"), format!("\"postgres\" \"{SUPER_PW}\"\n")).expect("userlist");
    let ini = dir.join("pgbouncer.ini");
    let port = cluster().port();
    std::fs::write(
        &ini,
        format!(
            "[databases]\n\
             looked = host=127.0.0.1 port={port} dbname=postgres auth_user=postgres \
             auth_query='SELECT usename, passwd FROM pg_shadow WHERE usename=$1'\n\
             plain = host=127.0.0.1 port={port} dbname=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nunix_socket_dir =\nauth_type = scram-sha-256\n\
             auth_file = userlist.txt\npool_mode = transaction\n"
        ),
    )
    .expect("writing the ini");
    let p = Parsnip::start(&["--pgbouncer-ini", ini.to_str().expect("utf-8 path")]);
    // aq is in no file: the database `looked` finds its secret through its own auth_user.
    let c = p.connect("aq", AQ_PW, "looked").await;
    assert_eq!(c.scalar("select current_user").await.unwrap(), "aq");
    let wrong = p.try_connect("aq", Some("wrong"), "looked").await.map(|_| ());
    expect_code(wrong, "28P01", "a wrong password");
    // `plain` has no auth_user (nor is there a global one): aq is unknown there.
    let unknown = p.try_connect("aq", Some(AQ_PW), "plain").await.map(|_| ());
    expect_code(unknown, "28P01", "no lookup for plain");
}

/// `n` clients as app.
async fn app_clients(p: &Parsnip, n: usize) -> Vec<Pg> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(p.connect("app", APP_PW, DB).await);
    }
    v
}
