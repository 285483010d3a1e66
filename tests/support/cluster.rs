//! The shared cluster: one throwaway PostgreSQL per test binary (SCRAM auth, roles `app`,
//! `md5user`, `aq`, database `other`), stopped by an `atexit` hook, and psql helpers.

#![allow(dead_code)]

use parsnip::embedded::{Cluster, ClusterOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Password of the cluster's superuser `postgres`.
pub const SUPER_PW: &str = "postgres-pw";

/// Password of role `app` (stored as SCRAM).
pub const APP_PW: &str = "app-pw";

/// Password of role `md5user` (stored as md5).
pub const MD5_PW: &str = "md5user-pw";

/// Password of role `aq` (stored as SCRAM; never listed in parsnip configs: auth_query only).
pub const AQ_PW: &str = "aq-pw";

static SHARED: LazyLock<Cluster> = LazyLock::new(start_shared_cluster);

/// The cluster shared by all tests of this binary (started on first use).
pub fn cluster() -> &'static Cluster {
    &SHARED
}

/// Options every cluster of the suite uses.
pub fn cluster_options(auth_method: &str, superuser_password: Option<&str>) -> ClusterOptions {
    ClusterOptions {
        auth_method: auth_method.to_string(),
        superuser_password: superuser_password.map(str::to_string),
        extra_conf: vec![
            "max_connections = 400".to_string(),
            // Fast failure instead of long waits if something goes wrong.
            "lock_timeout = '20s'".to_string(),
        ],
        max_connections: 400,
        ..ClusterOptions::default()
    }
}

fn start_shared_cluster() -> Cluster {
    let cluster = Cluster::start(cluster_options("scram-sha-256", Some(SUPER_PW)))
        .unwrap_or_else(|e| panic!("starting the shared PostgreSQL cluster: {e}"));
    register_cluster_cleanup(&cluster);
    let setup = format!(
        "CREATE ROLE app LOGIN PASSWORD '{APP_PW}';\n\
         CREATE ROLE aq LOGIN PASSWORD '{AQ_PW}';\n\
         SET password_encryption = 'md5';\n\
         CREATE ROLE md5user LOGIN PASSWORD '{MD5_PW}';\n\
         RESET password_encryption;\n\
         GRANT ALL ON SCHEMA public TO PUBLIC;\n\
         CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);\n\
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 10) g;\n\
         GRANT ALL ON items TO PUBLIC;\n\
         CREATE DATABASE other;\n"
    );
    cluster.psql("postgres", &setup).unwrap_or_else(|e| panic!("setting up the shared cluster: {e}"));
    cluster
        .psql(
            "other",
            "CREATE TABLE where_am_i (name text); INSERT INTO where_am_i VALUES ('other');\
             GRANT ALL ON SCHEMA public TO PUBLIC; GRANT ALL ON where_am_i TO PUBLIC;",
        )
        .unwrap_or_else(|e| panic!("setting up database other: {e}"));
    cluster
}

/// What the exit hook needs to stop a cluster held in a static (statics are never dropped).
struct ClusterHandle {
    pg_ctl: PathBuf,
    data_dir: PathBuf,
    root: PathBuf,
    uid: u32,
    gid: u32,
}

static CLEANUP: Mutex<Vec<ClusterHandle>> = Mutex::new(Vec::new());

/// Stops `cluster` when the test binary exits (a cluster kept in a static is never dropped).
pub fn register_cluster_cleanup(cluster: &Cluster) {
    let data_dir = cluster.data_dir().to_path_buf();
    let meta = std::fs::metadata(&data_dir).expect("cluster data dir");
    let handle = ClusterHandle {
        pg_ctl: cluster.bin_dir().join("pg_ctl"),
        root: data_dir.parent().expect("data dir has a parent").to_path_buf(),
        data_dir,
        uid: meta.uid(),
        gid: meta.gid(),
    };
    let mut list = CLEANUP.lock().unwrap_or_else(|p| p.into_inner());
    if list.is_empty() {
        // SAFETY: registering a plain extern "C" function without captured state.
        unsafe { libc::atexit(stop_clusters_at_exit) };
    }
    list.push(handle);
}

/// Runs SQL on the shared cluster as superuser; panics with psql's error.
pub fn psql(db: &str, sql: &str) -> String {
    cluster().psql(db, sql).unwrap_or_else(|e| panic!("psql on {db}: {sql}\n{e}"))
}

/// [`psql`] off the async runtime.
pub async fn psql_async(db: &str, sql: &str) -> String {
    let (db, sql) = (db.to_string(), sql.to_string());
    tokio::task::spawn_blocking(move || psql(&db, &sql)).await.expect("psql task")
}

/// Creates (or recreates) database `name` on the shared cluster, writable by everyone.
pub fn create_db(name: &str) {
    psql("postgres", &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE);\nCREATE DATABASE {name};"));
    psql(name, "GRANT ALL ON SCHEMA public TO PUBLIC;");
}

/// Client backends connected to database `db` (the querying psql excluded), by state.
pub fn backends(db: &str) -> Vec<(String, String)> {
    let out = psql(
        "postgres",
        &format!(
            "SELECT usename, coalesce(state, '') FROM pg_stat_activity \
             WHERE datname = '{db}' AND backend_type = 'client backend' \
             AND pid <> pg_backend_pid()"
        ),
    );
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (u, s) = l.split_once('|').unwrap_or((l, ""));
            (u.to_string(), s.to_string())
        })
        .collect()
}

/// Waits (bounded) until `cond` holds on the backends of `db`; returns the last view.
pub async fn wait_backends(
    db: &str,
    within: Duration,
    cond: impl Fn(&[(String, String)]) -> bool,
) -> Result<Vec<(String, String)>, Vec<(String, String)>> {
    let deadline = Instant::now() + within;
    loop {
        let db2 = db.to_string();
        let view = tokio::task::spawn_blocking(move || backends(&db2)).await.expect("backends task");
        if cond(&view) {
            return Ok(view);
        }
        if Instant::now() > deadline {
            return Err(view);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until the shared cluster runs exactly one backend (other than the one
/// asking) whose active query contains `marker` (a query sent through the pooler has
/// reached a server), e.g. before a cancel. The marker is a part of the query that
/// autoprepare leaves in place (a comment, a name, a string): a server sees the numbers of
/// an autoprepared simple Query as `$1`, `$2`.
pub async fn wait_query_active(marker: &str, within: Duration) -> Result<(), String> {
    let check = format!(
        "select count(*) from pg_stat_activity where strpos(query, '{}') > 0 and state = 'active' \
         and pid <> pg_backend_pid()",
        marker.replace('\'', "''")
    );
    let deadline = Instant::now() + within;
    while psql_async("postgres", &check).await.trim() != "1" {
        if Instant::now() > deadline {
            return Err(format!("no query with {marker:?} active after {within:?}"));
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}

extern "C" fn stop_clusters_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let handles = std::mem::take(&mut *CLEANUP.lock().unwrap_or_else(|p| p.into_inner()));
        for h in handles {
            let mut cmd = Command::new(&h.pg_ctl);
            cmd.arg("-D")
                .arg(&h.data_dir)
                .args(["-w", "-t", "30", "-m", "immediate", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .current_dir(&h.root);
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                cmd.uid(h.uid).gid(h.gid);
            }
            let _ = cmd.status();
            let _ = std::fs::remove_dir_all(&h.root);
        }
    });
}
