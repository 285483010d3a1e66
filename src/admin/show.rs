//! The SHOW commands: one function per command over the console's `View`, each returning
//! a `Table` with PgBouncer 1.25's columns (same names, order, types and units: times in
//! µs) first and parsnip's own after them.

use super::stats::{show_stats, show_stats_averages, show_stats_totals, show_totals};
use super::table::{Table, Ty, n, t, timestamp};
use super::view::{ConnRow, View};
use crate::pool::PoolSnapshot;
use std::sync::atomic::Ordering;

type Show = fn(&dyn View) -> Table;

/// `SHOW <name>` commands, one function each.
pub(crate) const COMMANDS: &[(&str, Show)] = &[
    ("pools", show_pools),
    ("clients", show_clients),
    ("servers", show_servers),
    ("stats", show_stats),
    ("stats_totals", show_stats_totals),
    ("stats_averages", show_stats_averages),
    ("totals", show_totals),
    ("databases", show_databases),
    ("users", show_users),
    ("lists", show_lists),
    ("config", show_config),
    ("peers", show_peers),
    ("fences", show_fences),
    ("state", show_state),
    ("mem", show_mem),
    ("fds", show_fds),
    ("version", show_version),
    ("prepared_statements", show_prepared_statements),
    ("statements", show_statements),
    ("listeners", show_listeners),
    ("help", show_help),
];

/// The name PgBouncer lists its own console under (rows in POOLS, STATS, DATABASES).
pub(super) const CONSOLE_DB: &str = "pgbouncer";

use Ty::{Int4 as I, Int8 as Q, Text as S};

fn yes(b: bool) -> Option<String> {
    n(i32::from(b))
}

fn show_pools(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("database", S),
        ("user", S),
        ("cl_active", I),
        ("cl_waiting", I),
        ("cl_active_cancel_req", I),
        ("cl_waiting_cancel_req", I),
        ("sv_active", I),
        ("sv_active_cancel", I),
        ("sv_being_canceled", I),
        ("sv_idle", I),
        ("sv_used", I),
        ("sv_tested", I),
        ("sv_login", I),
        ("maxwait", I),
        ("maxwait_us", I),
        ("pool_mode", S),
        ("load_balance_hosts", S),
        // parsnip's own.
        ("pool_size", I),
        ("sv_open", I),
        ("connects", Q),
        ("connect_failures", Q),
        ("checkouts", Q),
        ("waits", Q),
        ("wait_timeouts", Q),
        ("pipelined", Q),
        ("pipelined_cancels", Q),
        ("paused", I),
    ]);
    let clients = v.clients();
    let servers = v.servers();
    let count = |rows: &[ConnRow], p: &PoolSnapshot, state: Option<&str>| {
        rows.iter()
            .filter(|r| r.database == p.key.db && r.user == p.key.user && state.is_none_or(|s| r.state == s))
            .count()
    };
    // PgBouncer's own console pool: its clients, nothing else.
    table.push_with(
        n(0),
        &[
            ("database", t(CONSOLE_DB)),
            ("user", t(CONSOLE_DB)),
            ("cl_active", n(v.console_clients())),
            ("pool_mode", t("statement")),
            ("load_balance_hosts", None),
        ],
    );
    for p in v.pools() {
        let active = count(&servers, &p, Some("active"));
        // The pool's queue says who waits; every other logged-in client is active.
        let waiting = p.waiting;
        let idle = p.idle;
        table.push(vec![
            t(&p.key.db),
            t(&p.key.user),
            n(count(&clients, &p, None).saturating_sub(waiting)),
            n(waiting),
            n(0),
            n(0),
            n(active),
            n(0),
            n(0),
            n(idle),
            n(0),
            n(0),
            n(p.open.saturating_sub(idle + active)),
            n(p.max_wait_us / 1_000_000),
            n(p.max_wait_us % 1_000_000),
            t(p.mode.as_str()),
            None,
            n(p.size),
            n(p.open),
            n(p.connects),
            n(p.connect_failures),
            n(p.checkouts),
            n(p.waits),
            n(p.wait_timeouts),
            n(p.pipelined),
            n(p.pipelined_cancels),
            yes(p.paused),
        ]);
    }
    table
}

const CONN_COLUMNS: [(&str, Ty); 23] = [
    ("type", S),
    ("user", S),
    ("database", S),
    ("replication", S),
    ("state", S),
    ("addr", S),
    ("port", I),
    ("local_addr", S),
    ("local_port", I),
    ("connect_time", S),
    ("request_time", S),
    ("wait", I),
    ("wait_us", I),
    ("close_needed", I),
    ("ptr", S),
    ("link", S),
    ("remote_pid", I),
    ("tls", S),
    ("application_name", S),
    ("prepared_statements", I),
    ("id", Q),
    // parsnip's own: the pid a client was given (its cancel key); the session state that
    // pins it to its server connection under transaction pooling, by reason
    // (`PinReasons::names`: advisory_lock, cursor_with_hold, temp_table, listen,
    // prepared_statement, unverified; empty: not pinned).
    ("pid", I),
    ("pinned", S),
];

fn conn_table(rows: Vec<ConnRow>, server: bool) -> Table {
    let mut table = Table::new(&CONN_COLUMNS);
    for r in rows {
        table.push(vec![
            t(if server { "S" } else { "C" }),
            t(r.user),
            t(r.database),
            t("none"),
            t(r.state),
            t(r.addr),
            n(r.port),
            t(r.local_addr),
            n(r.local_port),
            timestamp(r.connect_us),
            if r.request_us == 0 { timestamp(r.connect_us) } else { timestamp(r.request_us) },
            n(r.wait_us / 1_000_000),
            n(r.wait_us % 1_000_000),
            yes(r.close_needed),
            t(ConnRow::ptr(server, r.id)),
            r.link,
            n(r.remote_pid),
            t(r.tls),
            t(r.application_name),
            n(r.prepared),
            n(r.id),
            n(r.client_pid),
            t(r.pinned),
        ]);
    }
    table
}

fn show_clients(v: &dyn View) -> Table {
    conn_table(v.clients(), false)
}

fn show_servers(v: &dyn View) -> Table {
    conn_table(v.servers(), true)
}

fn show_databases(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("name", S),
        ("host", S),
        ("port", I),
        ("database", S),
        ("force_user", S),
        ("pool_size", I),
        ("min_pool_size", I),
        ("reserve_pool_size", I),
        ("server_lifetime", I),
        ("pool_mode", S),
        ("load_balance_hosts", S),
        ("max_connections", I),
        ("current_connections", I),
        ("max_client_connections", I),
        ("current_client_connections", I),
        ("paused", I),
        ("disabled", I),
    ]);
    let mut rows: Vec<Vec<Option<String>>> = v
        .databases()
        .into_iter()
        .map(|d| {
            vec![
                t(d.name),
                t(d.host),
                n(d.port),
                t(d.database),
                (!d.force_user.is_empty()).then_some(d.force_user),
                n(d.pool_size),
                n(d.min_pool_size),
                n(d.reserve_pool_size),
                n(d.server_lifetime_s),
                t(d.pool_mode),
                t(d.load_balance_hosts),
                n(d.max_connections),
                n(d.current_connections),
                n(d.max_client_connections),
                n(d.current_client_connections),
                yes(d.paused),
                yes(d.disabled),
            ]
        })
        .collect();
    rows.push(table.row_with(
        n(0),
        &[
            ("name", t(CONSOLE_DB)),
            ("host", None),
            ("database", t(CONSOLE_DB)),
            ("force_user", t(CONSOLE_DB)),
            ("pool_size", n(2)),
            ("pool_mode", t("statement")),
            ("load_balance_hosts", None),
            ("current_client_connections", n(v.console_clients())),
        ],
    ));
    rows.sort_by(|a, b| a[0].cmp(&b[0]));
    for r in rows {
        table.push(r);
    }
    table
}

fn show_users(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("name", S),
        ("pool_size", S),
        ("reserve_pool_size", S),
        ("pool_mode", S),
        ("max_user_connections", I),
        ("current_connections", I),
        ("max_user_client_connections", I),
        ("current_client_connections", I),
    ]);
    for u in v.users() {
        table.push(vec![
            t(u.name),
            t(u.pool_size.map(|s| s.to_string()).unwrap_or_default()),
            t(u.reserve_pool_size.map(|s| s.to_string()).unwrap_or_default()),
            u.pool_mode,
            n(u.max_user_connections),
            n(u.current_connections),
            n(u.max_user_client_connections),
            n(u.current_client_connections),
        ]);
    }
    table
}

fn show_lists(v: &dyn View) -> Table {
    let mut table = Table::new(&[("list", S), ("items", I)]);
    let (clients, servers) = (v.clients().len(), v.servers().len());
    let users: std::collections::BTreeSet<String> = v.pools().into_iter().map(|p| p.key.user).collect();
    let items = [
        ("databases", v.databases().len() + 1),
        ("users", users.len()),
        ("peers", v.peers().len()),
        ("pools", v.pools().len() + 1),
        ("peer_pools", 0),
        ("free_clients", 0),
        // Console connections are among the clients (`View::clients`), as in PgBouncer.
        ("used_clients", clients),
        ("login_clients", 0),
        ("free_servers", 0),
        ("used_servers", servers),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ];
    for (name, count) in items {
        table.push(vec![t(name), n(count)]);
    }
    table
}

fn show_config(v: &dyn View) -> Table {
    let mut table = Table::new(&[("key", S), ("value", S), ("default", S), ("changeable", S)]);
    for c in v.config() {
        table.push(vec![t(c.key), t(c.value), t(c.default), t(if c.changeable { "yes" } else { "no" })]);
    }
    table
}

/// PgBouncer's columns but its `pool_size`: parsnip keeps no connections to its peers
/// (each forwarded cancel opens one of its own).
fn show_peers(v: &dyn View) -> Table {
    let mut table = Table::new(&[("peer_id", I), ("host", S), ("port", I)]);
    for p in v.peers() {
        table.push(vec![n(p.peer_id), t(p.host), n(p.port)]);
    }
    table
}

fn show_fences(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("host", S),
        ("port", I),
        ("system_identifier", S),
        ("timeline", I),
        ("newer_timeline", I),
        ("newer_server", S),
        ("refusals", Q),
    ]);
    for f in v.fences() {
        table.push(vec![
            t(f.host),
            n(f.port),
            t(f.system_identifier),
            n(f.timeline),
            n(f.newer_timeline),
            t(f.newer_server),
            n(f.refusals),
        ]);
    }
    table
}

fn show_state(v: &dyn View) -> Table {
    let mut table = Table::new(&[("key", S), ("value", S)]);
    let paused = v.paused();
    for (k, on) in [("active", !paused), ("paused", paused), ("suspended", false)] {
        table.push(vec![t(k), t(if on { "yes" } else { "no" })]);
    }
    table
}

/// PgBouncer's slab caches have no counterpart: parsnip lists what it holds per kind of
/// object (bytes per object where fixed, count in use).
fn show_mem(v: &dyn View) -> Table {
    let mut table = Table::new(&[("name", S), ("size", I), ("used", I), ("free", I), ("memtotal", I)]);
    let pools = v.pools();
    let statements: usize = pools.iter().map(|p| p.stmts.len()).sum();
    for (name, used) in [
        ("pools", pools.len()),
        ("clients", v.clients().len()),
        ("servers", v.servers().len()),
        ("cached_statements", statements),
    ] {
        table.push(vec![t(name), n(0), n(used), n(0), n(0)]);
    }
    table
}

/// PgBouncer lists its sockets for its online restart (`-R`), which parsnip does not do:
/// the columns, no rows.
fn show_fds(_: &dyn View) -> Table {
    Table::new(&[
        ("fd", I),
        ("task", S),
        ("user", S),
        ("database", S),
        ("addr", S),
        ("port", I),
        ("cancel", Q),
        ("link", I),
        ("client_encoding", S),
        ("std_strings", S),
        ("datestyle", S),
        ("timezone", S),
        ("password", S),
        ("scram_client_key", S),
        ("scram_server_key", S),
    ])
}

fn show_version(_: &dyn View) -> Table {
    let mut table = Table::new(&[("version", S)]);
    table.push(vec![t(format!("parsnip {}", env!("CARGO_PKG_VERSION")))]);
    table
}

/// The statement cache's counters per pool (also in `SHOW STATS` as PgBouncer's
/// client/server parse counts).
fn show_prepared_statements(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("database", S),
        ("user", S),
        ("cached", Q),
        ("client_parses", Q),
        ("server_parses", Q),
        ("hits", Q),
        ("evictions", Q),
        ("promotions", Q),
        ("invalidations", Q),
        ("retries", Q),
        ("describes_saved", Q),
        ("demotions", Q),
    ]);
    for p in v.pools() {
        let s = &p.stmts.stats;
        let c = |a: &std::sync::atomic::AtomicU64| n(a.load(Ordering::Relaxed));
        table.push(vec![
            t(&p.key.db),
            t(&p.key.user),
            n(p.stmts.len()),
            c(&s.client_parses),
            c(&s.server_parses),
            c(&s.hits),
            c(&s.evictions),
            c(&s.promotions),
            c(&s.invalidations),
            c(&s.retries),
            c(&s.describes_saved),
            c(&s.demotions),
        ]);
    }
    table
}

/// The cached statements with their statistics (`stmt::stats`: executions from the cache
/// and as sent, rows, errors, server time in µs, its percentiles) and plan guard
/// (`stmt::guard`: "watched" or "demoted", with the mean cached and as-sent times that
/// demoted it, or over its window now).
fn show_statements(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("database", S),
        ("user", S),
        ("server_name", S),
        ("refs", Q),
        ("query", S),
        ("calls", Q),
        ("cached_calls", Q),
        ("as_sent_calls", Q),
        ("rows", Q),
        ("errors", Q),
        ("total_time", Q),
        ("p50_time", Q),
        ("p95_time", Q),
        ("p99_time", Q),
        ("plan_guard", S),
        ("cached_time", Q),
        ("as_sent_time", Q),
    ]);
    for p in v.pools() {
        let mut stmts = p.stmts.statements();
        stmts.sort_by(|a, b| a.server_name.cmp(&b.server_name));
        for s in stmts {
            let f = s.exec.figures();
            let (guard, (cached_us, as_sent_us)) = match s.guard.get().map(|g| g.state()) {
                None => ("", (0, 0)),
                Some((Some(figures), _)) => ("demoted", figures),
                Some((None, means)) => ("watched", means),
            };
            table.push(vec![
                t(&p.key.db),
                t(&p.key.user),
                t(&*s.server_name),
                n(std::sync::Arc::strong_count(&s) - 2),
                t(String::from_utf8_lossy(&s.query)),
                n(f.calls()),
                n(f.cached),
                n(f.as_sent),
                n(f.rows),
                n(f.errors),
                n(f.total_us),
                n(f.p50_us),
                n(f.p95_us),
                n(f.p99_us),
                t(guard),
                n(cached_us),
                n(as_sent_us),
            ]);
        }
    }
    table
}

/// parsnip's own: the LISTEN channels of each pool's listening connection.
fn show_listeners(v: &dyn View) -> Table {
    let mut table = Table::new(&[
        ("database", S),
        ("user", S),
        ("channel", S),
        ("listeners", I),
        ("listening", I),
        ("notifications", Q),
    ]);
    for r in v.listeners() {
        table.push(vec![t(r.database), t(r.user), t(r.channel), n(r.listeners), yes(r.listened), n(r.received)]);
    }
    table
}

fn show_help(_: &dyn View) -> Table {
    let mut table = Table::new(&[("command", S)]);
    for (name, _) in COMMANDS {
        table.push(vec![t(format!("SHOW {}", name.to_uppercase()))]);
    }
    for c in [
        "PAUSE [db]",
        "RESUME [db]",
        "RECONNECT [db]",
        "KILL [db]",
        "KILL_CLIENT id",
        "DISABLE db",
        "ENABLE db",
        "WAIT_CLOSE [db]",
        "UNFENCE [db]",
        "RELOAD",
        "SET key = value",
        "SHUTDOWN [WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS]",
    ] {
        table.push(vec![t(c)]);
    }
    table
}

/// The table for `SHOW what`, None for an unknown name.
pub(crate) fn show(what: &str, v: &dyn View) -> Option<Table> {
    COMMANDS.iter().find(|(n, _)| *n == what).map(|(_, f)| f(v))
}
