//! PgBouncer's per-database and per-user overrides, table-driven: each row an ini (global,
//! `[databases]` and `[users]` lines) and the settings a (database, user) pool of the
//! resulting configuration runs with, so the precedence PgBouncer's doc gives (user, then
//! database, then global; a limit's 0 leaving the global value) is checked setting by
//! setting through the same translation `--pgbouncer-ini` uses.

use super::*;
use crate::config::PoolMode;
use std::time::Duration;

/// What a (database, user) pool runs with.
#[derive(Debug, PartialEq)]
struct Effective {
    mode: PoolMode,
    size: usize,
    min: usize,
    reserve: usize,
    db_limits: (usize, usize),
    user_limits: (usize, usize),
    client_idle: Option<Duration>,
    idle_in_transaction: Option<Duration>,
    query: Option<Duration>,
    transaction: Option<Duration>,
    server_lifetime: Option<Duration>,
    auth: Option<(String, String, Option<String>)>,
}

fn effective(ini: &str, db: &str, user: &str) -> Effective {
    let mut none = |_: &str, _: &str| -> Result<Included, String> { Err("no files".into()) };
    let lines = ini::parse("p.ini", ini, &mut none).expect("parses");
    let t = translate(&lines, &mut none).expect("translates");
    let refused: Vec<_> = t.notes.iter().filter(|n| n.refused).collect();
    assert!(refused.is_empty(), "{refused:?}");
    let cfg: Config = Value::Table(t.table).try_into().expect("parsnip's configuration");
    cfg.validate().expect("valid");
    let (d, _) = cfg.database(db).expect("the database");
    Effective {
        mode: cfg.pool_mode_for(d, user),
        size: cfg.pool_size_for(d, user),
        min: cfg.min_pool_size_for(db),
        reserve: cfg.reserve_pool_size_for(d, user),
        db_limits: cfg.db_limits(db),
        user_limits: cfg.user_limits(user),
        client_idle: cfg.client_idle_timeout(user),
        idle_in_transaction: cfg.idle_transaction_timeout(user),
        query: cfg.query_timeout(user),
        transaction: cfg.transaction_timeout(user),
        server_lifetime: cfg.server_lifetime(db),
        auth: cfg.auth_lookup(d).map(|(q, u, n)| (q.to_owned(), u.to_owned(), n.map(str::to_owned))),
    }
}

const GLOBAL: &str = "[pgbouncer]\nlisten_addr = 127.0.0.1\npool_mode = transaction\ndefault_pool_size = 20\n\
                      reserve_pool_size = 1\nmax_db_connections = 50\nmax_user_connections = 40\nmin_pool_size = 1\n\
                      max_db_client_connections = 30\nmax_user_client_connections = 25\n\
                      client_idle_timeout = 100\nidle_transaction_timeout = 10\nquery_timeout = 30\ntransaction_timeout = 60\n\
                      server_lifetime = 3600\n";

/// The global settings alone.
fn base() -> Effective {
    Effective {
        mode: PoolMode::Transaction,
        size: 20,
        min: 1,
        reserve: 1,
        db_limits: (50, 30),
        user_limits: (40, 25),
        client_idle: Some(Duration::from_secs(100)),
        idle_in_transaction: Some(Duration::from_secs(10)),
        query: Some(Duration::from_secs(30)),
        transaction: Some(Duration::from_secs(60)),
        server_lifetime: Some(Duration::from_secs(3600)),
        auth: None,
    }
}

#[test]
fn each_override_and_which_wins() {
    #[allow(clippy::type_complexity)]
    let rows: &[(&str, &str, &str, fn(&mut Effective))] = &[
        ("what the globals give", "", "", |_| {}),
        ("database pool_mode", "pool_mode=session", "", |e| e.mode = PoolMode::Session),
        ("user pool_mode", "", "pool_mode=statement", |e| e.mode = PoolMode::Statement),
        ("user pool_mode wins", "pool_mode=session", "pool_mode=statement", |e| e.mode = PoolMode::Statement),
        ("database pool_size", "pool_size=5", "", |e| e.size = 5),
        ("user pool_size wins", "pool_size=5", "pool_size=3", |e| e.size = 3),
        ("database min_pool_size", "min_pool_size=4", "", |e| e.min = 4),
        ("database min_pool_size 0 is 0", "min_pool_size=0", "", |e| e.min = 0),
        ("database reserve_pool_size", "reserve_pool_size=4", "", |e| e.reserve = 4),
        ("reserve_pool, its old name", "reserve_pool=6", "", |e| e.reserve = 6),
        ("user reserve_pool_size wins", "reserve_pool=6", "reserve_pool_size=2", |e| e.reserve = 2),
        ("a reserve of 0 on an entry is 0", "reserve_pool_size=0", "", |e| e.reserve = 0),
        ("database max_db_connections", "max_db_connections=7", "", |e| e.db_limits.0 = 7),
        ("max_db_connections 0 leaves the global", "max_db_connections=0", "", |_| {}),
        ("database max_db_client_connections", "max_db_client_connections=8", "", |e| e.db_limits.1 = 8),
        ("user max_user_connections", "", "max_user_connections=9", |e| e.user_limits.0 = 9),
        ("user max_user_client_connections", "", "max_user_client_connections=4", |e| e.user_limits.1 = 4),
        ("user client_idle_timeout", "", "client_idle_timeout=5", |e| e.client_idle = Some(Duration::from_secs(5))),
        ("user client_idle_timeout 0 is off", "", "client_idle_timeout=0", |e| e.client_idle = None),
        ("user idle_transaction_timeout", "", "idle_transaction_timeout=2.5", |e| {
            e.idle_in_transaction = Some(Duration::from_millis(2500))
        }),
        ("user query_timeout", "", "query_timeout=1.5", |e| e.query = Some(Duration::from_millis(1500))),
        ("user query_timeout 0 is off", "", "query_timeout=0", |e| e.query = None),
        ("user transaction_timeout", "", "transaction_timeout=2", |e| e.transaction = Some(Duration::from_secs(2))),
        ("user transaction_timeout 0 is off", "", "transaction_timeout=0", |e| e.transaction = None),
        ("database server_lifetime", "server_lifetime=60", "", |e| e.server_lifetime = Some(Duration::from_secs(60))),
        ("database server_lifetime 0 leaves the global", "server_lifetime=0", "", |_| {}),
        ("database auth_user runs PgBouncer's default query", "auth_user=lookup", "", |e| {
            e.auth = Some((PGBOUNCER_AUTH_QUERY.into(), "lookup".into(), None))
        }),
        (
            "database auth_user, auth_query and auth_dbname",
            "auth_user=lookup auth_query='SELECT u, p FROM f($1)' auth_dbname=authdb",
            "",
            |e| e.auth = Some(("SELECT u, p FROM f($1)".into(), "lookup".into(), Some("authdb".into()))),
        ),
    ];
    for (what, db, user, change) in rows {
        let ini = format!("{GLOBAL}[databases]\nd = host=h port=5 {db}\n[users]\nu = {user}\n");
        let mut want = base();
        change(&mut want);
        assert_eq!(effective(&ini, "d", "u"), want, "{what}: d = {db}; u = {user}");
        // Another user of the database gets the database's and global settings only.
        if !user.is_empty() {
            let mut other = effective(&format!("{GLOBAL}[databases]\nd = host=h port=5 {db}\n"), "d", "u");
            other.user_limits = want.user_limits;
            other.client_idle = want.client_idle;
            other.idle_in_transaction = want.idle_in_transaction;
            other.query = want.query;
            let mut theirs = effective(&ini, "d", "v");
            (theirs.user_limits, theirs.client_idle, theirs.idle_in_transaction, theirs.query) =
                (want.user_limits, want.client_idle, want.idle_in_transaction, want.query);
            assert_eq!(theirs, other, "{what}: user v");
        }
    }
}

#[test]
fn a_global_auth_user_and_a_database_override() {
    let ini =
        format!("{GLOBAL}auth_user = global_lookup\n[databases]\nd = host=h port=5 auth_user=own\ne = host=h port=5\n");
    let d = effective(&ini, "d", "u").auth.expect("a lookup");
    let e = effective(&ini, "e", "u").auth.expect("a lookup");
    assert_eq!((d.1.as_str(), e.1.as_str()), ("own", "global_lookup"));
    assert_eq!(d.0, PGBOUNCER_AUTH_QUERY, "PgBouncer's default query for both");
}
