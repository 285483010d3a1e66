//! The console's tables against PgBouncer 1.25's: columns, order, types and values.

use super::show::show;
use super::table::Ty;
use super::view::{ConfigRow, ConnRow, DatabaseRow, PeerRow, UserRow, View};
use crate::config::PoolMode;
use crate::pool::{Figures, LastPeriod, PoolSnapshot};
use crate::pool::{PoolKey, PoolPurpose};
use crate::stmt::{Registry, StmtConfig};
use std::sync::Arc;

/// One pool (app/alice) with one client linked to one server, and one waiting client.
struct One;

fn pool() -> PoolSnapshot {
    PoolSnapshot {
        key: PoolKey { db: "app".into(), user: "alice".into(), purpose: PoolPurpose::Clients },
        mode: PoolMode::Transaction,
        size: 4,
        idle: 1,
        open: 3,
        waiting: 1,
        max_wait_us: 2_500_000,
        connects: 3,
        connect_failures: 0,
        checkouts: 10,
        waits: 1,
        wait_timeouts: 0,
        pipelined: 0,
        pipelined_cancels: 0,
        logins: 2,
        pins_begun: [1, 0, 2, 0, 0, 0],
        pinned_clients: 1,
        totals: Figures { xacts: 7, queries: 9, query_us: 900, client_parses: 2, binds: 5, ..Default::default() },
        period: LastPeriod {
            start: Figures::default(),
            end: Figures { xacts: 60, xact_us: 600, ..Default::default() },
            secs: 60.0,
        },
        stmts: Arc::new(Registry::new(StmtConfig::default())),
        paused: false,
        waited: [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        errors: vec![("22".into(), 4)],
    }
}

fn conn(id: u64, state: &'static str) -> ConnRow {
    ConnRow {
        id,
        database: "app".into(),
        user: "alice".into(),
        state,
        addr: "127.0.0.1".into(),
        port: 40000,
        local_addr: "127.0.0.1".into(),
        local_port: 6432,
        connect_us: 1_795_564_800_000_000,
        wait_us: if state == "waiting" { 1_000_250 } else { 0 },
        ..ConnRow::default()
    }
}

impl View for One {
    fn pools(&self) -> Vec<PoolSnapshot> {
        vec![pool()]
    }
    fn fences(&self) -> Vec<super::FenceRow> {
        vec![super::FenceRow {
            host: "db1".into(),
            port: 5432,
            system_identifier: "7300000000000000001".into(),
            timeline: 1,
            newer_timeline: 2,
            newer_server: "db2:5432".into(),
            refusals: 3,
        }]
    }
    fn clients(&self) -> Vec<ConnRow> {
        // Two of the pool's clients, and the console's own connection.
        vec![
            ConnRow { link: Some(ConnRow::ptr(true, 1)), ..conn(5, "active") },
            conn(6, "waiting"),
            ConnRow { database: "pgbouncer".into(), id: 1 << 32, ..conn(7, "active") },
        ]
    }
    fn servers(&self) -> Vec<ConnRow> {
        vec![ConnRow { remote_pid: 4242, ..conn(1, "active") }, conn(2, "idle")]
    }
    fn databases(&self) -> Vec<DatabaseRow> {
        vec![DatabaseRow { name: "app".into(), host: "db".into(), port: 5432, ..Default::default() }]
    }
    fn users(&self) -> Vec<UserRow> {
        vec![UserRow { name: "alice".into(), pool_size: Some(4), ..Default::default() }]
    }
    fn config(&self) -> Vec<ConfigRow> {
        vec![ConfigRow { key: "pool_size", value: "4".into(), default: "8".into(), changeable: false }]
    }
    fn paused(&self) -> bool {
        false
    }
    fn console_clients(&self) -> usize {
        1
    }
    fn peers(&self) -> Vec<PeerRow> {
        vec![PeerRow { peer_id: 2, host: "/run/parsnip-2".into(), port: 6502 }]
    }
}

fn columns(what: &str) -> Vec<&'static str> {
    show(what, &One).map(|t| t.columns.iter().map(|c| c.0).collect()).unwrap_or_default()
}

/// Each command starts with PgBouncer 1.25's columns, in its order (from its admin.c
/// and stats.c), parsnip's own after them.
#[test]
fn columns_are_pgbouncers_in_its_order() {
    let pgbouncer: &[(&str, &str)] = &[
        (
            "pools",
            "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req sv_active \
             sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login maxwait maxwait_us \
             pool_mode load_balance_hosts",
        ),
        (
            "clients",
            "type user database replication state addr port local_addr local_port connect_time \
             request_time wait wait_us close_needed ptr link remote_pid tls application_name \
             prepared_statements id",
        ),
        (
            "stats",
            "database total_server_assignment_count total_xact_count total_query_count total_received \
             total_sent total_xact_time total_query_time total_wait_time total_client_parse_count \
             total_server_parse_count total_bind_count avg_server_assignment_count avg_xact_count \
             avg_query_count avg_recv avg_sent avg_xact_time avg_query_time avg_wait_time \
             avg_client_parse_count avg_server_parse_count avg_bind_count",
        ),
        (
            "stats_totals",
            "database server_assignment_count xact_count query_count bytes_received bytes_sent xact_time \
             query_time wait_time client_parse_count server_parse_count bind_count",
        ),
        (
            "stats_averages",
            "database server_assignment_count xact_count query_count bytes_received bytes_sent xact_time \
             query_time wait_time avg_client_parse_count avg_server_parse_count avg_bind_count",
        ),
        ("totals", "name value"),
        (
            "databases",
            "name host port database force_user pool_size min_pool_size reserve_pool_size server_lifetime \
             pool_mode load_balance_hosts max_connections current_connections max_client_connections \
             current_client_connections paused disabled",
        ),
        (
            "users",
            "name pool_size reserve_pool_size pool_mode max_user_connections current_connections \
             max_user_client_connections current_client_connections",
        ),
        ("lists", "list items"),
        ("config", "key value default changeable"),
        ("peers", "peer_id host port"),
        ("state", "key value"),
        ("mem", "name size used free memtotal"),
        ("version", "version"),
        (
            "fds",
            "fd task user database addr port cancel link client_encoding std_strings datestyle timezone \
             password scram_client_key scram_server_key",
        ),
    ];
    for (what, cols) in pgbouncer {
        let want: Vec<&str> = cols.split_whitespace().collect();
        let got = columns(what);
        assert!(got.len() >= want.len(), "SHOW {what}: {got:?}");
        assert_eq!(&got[..want.len()], &want[..], "SHOW {what}");
    }
    assert_eq!(columns("servers"), columns("clients"));
}

#[test]
fn values_and_types_are_pgbouncers() {
    let pools = show("pools", &One).expect("pools");
    assert_eq!(pools.get(0, "database"), Some("pgbouncer"), "the console's own row first");
    assert_eq!(pools.get(1, "cl_active"), Some("1"));
    assert_eq!(pools.get(1, "cl_waiting"), Some("1"));
    assert_eq!(pools.get(1, "sv_active"), Some("1"));
    assert_eq!(pools.get(1, "sv_idle"), Some("1"));
    assert_eq!(pools.get(1, "sv_login"), Some("1"), "open, neither idle nor active: opening");
    assert_eq!((pools.get(1, "maxwait"), pools.get(1, "maxwait_us")), (Some("2"), Some("500000")));
    assert_eq!(pools.get(1, "pool_mode"), Some("transaction"));
    assert!(pools.columns.iter().any(|&(n, t)| n == "cl_active" && t == Ty::Int4));

    let stats = show("stats", &One).expect("stats");
    assert_eq!(stats.get(0, "database"), Some("app"));
    assert_eq!(stats.get(0, "total_xact_count"), Some("7"));
    assert_eq!(stats.get(0, "total_query_time"), Some("900"), "µs");
    assert_eq!(stats.get(0, "total_client_parse_count"), Some("2"));
    assert_eq!(stats.get(0, "total_bind_count"), Some("5"));
    assert_eq!(stats.get(0, "avg_xact_count"), Some("1"), "60 in 60 s");
    assert_eq!(stats.get(0, "avg_xact_time"), Some("10"), "600 µs over 60");
    assert_eq!(stats.get(1, "database"), Some("pgbouncer"));
    assert!(stats.columns.iter().skip(1).all(|&(_, t)| t == Ty::Numeric));

    let totals = show("totals", &One).expect("totals");
    assert_eq!(totals.get(1, "name"), Some("total_xact_count"));
    assert_eq!(totals.get(1, "value"), Some("7"));

    let clients = show("clients", &One).expect("clients");
    assert_eq!(clients.get(0, "type"), Some("C"));
    assert_eq!(clients.get(0, "link"), Some(ConnRow::ptr(true, 1).as_str()));
    assert_eq!(clients.get(0, "connect_time"), Some("2026-11-25 00:00:00 UTC"));
    assert_eq!((clients.get(1, "wait"), clients.get(1, "wait_us")), (Some("1"), Some("250")));
    assert_eq!(clients.get(1, "id"), Some("6"));
    let servers = show("servers", &One).expect("servers");
    assert_eq!((servers.get(0, "type"), servers.get(0, "remote_pid")), (Some("S"), Some("4242")));

    let dbs = show("databases", &One).expect("databases");
    assert_eq!((dbs.get(0, "name"), dbs.get(1, "name")), (Some("app"), Some("pgbouncer")));
    assert_eq!(dbs.get(0, "port"), Some("5432"));
    let users = show("users", &One).expect("users");
    assert_eq!((users.get(0, "name"), users.get(0, "pool_size")), (Some("alice"), Some("4")));
    let cfg = show("config", &One).expect("config");
    assert_eq!(
        (cfg.get(0, "value"), cfg.get(0, "default"), cfg.get(0, "changeable")),
        (Some("4"), Some("8"), Some("no"))
    );
    let lists = show("lists", &One).expect("lists");
    assert_eq!((lists.get(6, "list"), lists.get(6, "items")), (Some("used_clients"), Some("3")));
    let peers = show("peers", &One).expect("peers");
    assert_eq!(
        (peers.get(0, "peer_id"), peers.get(0, "host"), peers.get(0, "port")),
        (Some("2"), Some("/run/parsnip-2"), Some("6502"))
    );
    assert_eq!((lists.get(2, "list"), lists.get(2, "items")), (Some("peers"), Some("1")));
    assert!(show("nonsense", &One).is_none());
}

/// `/metrics` carries the same figures, in the Prometheus text format.
#[test]
fn metrics_are_the_consoles_figures() {
    let text = super::metrics::render(&One);
    let line = |prefix: &str| {
        text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in\n{text}")).to_owned()
    };
    assert!(line("parsnip_transactions_total{").ends_with(" 7"));
    assert!(line("parsnip_queries_total{").ends_with(" 9"));
    assert!(line("parsnip_errors_total{").contains("class=\"22\"} 4"));
    assert!(line("parsnip_client_connections{database=\"app\",user=\"alice\",state=\"waiting\"}").ends_with(" 1"));
    assert!(line("parsnip_server_connections{database=\"app\",user=\"alice\",state=\"active\"}").ends_with(" 1"));
    // 10 checkouts, one of which waited (0.1 s < w <= 0.5 s): nine in the first bucket.
    assert!(line("parsnip_wait_seconds_bucket{database=\"app\",user=\"alice\",le=\"0.0001\"}").ends_with(" 9"));
    assert!(line("parsnip_wait_seconds_bucket{database=\"app\",user=\"alice\",le=\"0.5\"}").ends_with(" 10"));
    assert!(line("parsnip_wait_seconds_count{").ends_with(" 10"));
    assert!(text.contains("# TYPE parsnip_wait_seconds histogram"));
    assert_eq!(line("parsnip_fenced_servers"), "parsnip_fenced_servers 1");
    assert!(line("parsnip_pins_total{database=\"app\",user=\"alice\",reason=\"temp_table\"}").ends_with(" 2"));
    assert!(line("parsnip_pins_total{database=\"app\",user=\"alice\",reason=\"advisory_lock\"}").ends_with(" 1"));
    assert!(line("parsnip_pinned_clients{").ends_with(" 1"));
    let fences = show("fences", &One).expect("fences");
    assert_eq!((fences.get(0, "port"), fences.get(0, "newer_server")), (Some("5432"), Some("db2:5432")));
}
