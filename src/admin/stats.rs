//! PgBouncer's statistics commands: `SHOW STATS`, `STATS_TOTALS`, `STATS_AVERAGES` (per
//! database) and `SHOW TOTALS`, from the pools' totals and their last averaging period.

use super::show::CONSOLE_DB;
use super::table::{Table, Ty, n, t};
use super::view::View;
use crate::pool::{Figures, LastPeriod, PoolSnapshot};
use std::collections::BTreeMap;

use Ty::{Numeric as N, Text as S};

/// Pools grouped by database name (sorted), as PgBouncer's per-database lines add them up.
fn by_database(pools: &[PoolSnapshot]) -> BTreeMap<&str, (Figures, LastPeriod)> {
    let mut m: BTreeMap<&str, (Figures, LastPeriod)> = BTreeMap::new();
    for p in pools {
        let e = m.entry(p.key.db.as_str()).or_default();
        e.0.add(&p.totals);
        e.1.add(&p.period);
    }
    m
}

fn figures(f: &Figures) -> [Option<String>; 11] {
    [
        n(f.server_assignments),
        n(f.xacts),
        n(f.queries),
        n(f.received),
        n(f.sent),
        n(f.xact_us),
        n(f.query_us),
        n(f.wait_us),
        n(f.client_parses),
        n(f.server_parses),
        n(f.binds),
    ]
}

fn per_database(
    v: &dyn View,
    columns: &[(&'static str, Ty)],
    row: fn(&Figures, &Figures) -> Vec<Option<String>>,
) -> Table {
    let pools = v.pools();
    let mut table = Table::new(columns);
    let mut dbs = by_database(&pools);
    dbs.entry(CONSOLE_DB).or_default();
    for (db, (totals, period)) in dbs {
        let mut r = vec![t(db)];
        r.extend(row(&totals, &period.averages()));
        table.push(r);
    }
    table
}

pub(super) fn show_stats(v: &dyn View) -> Table {
    const COLUMNS: [(&str, Ty); 23] = [
        ("database", S),
        ("total_server_assignment_count", N),
        ("total_xact_count", N),
        ("total_query_count", N),
        ("total_received", N),
        ("total_sent", N),
        ("total_xact_time", N),
        ("total_query_time", N),
        ("total_wait_time", N),
        ("total_client_parse_count", N),
        ("total_server_parse_count", N),
        ("total_bind_count", N),
        ("avg_server_assignment_count", N),
        ("avg_xact_count", N),
        ("avg_query_count", N),
        ("avg_recv", N),
        ("avg_sent", N),
        ("avg_xact_time", N),
        ("avg_query_time", N),
        ("avg_wait_time", N),
        ("avg_client_parse_count", N),
        ("avg_server_parse_count", N),
        ("avg_bind_count", N),
    ];
    per_database(v, &COLUMNS, |tot, avg| figures(tot).into_iter().chain(figures(avg)).collect())
}

/// STATS_TOTALS' and STATS_AVERAGES' columns: the same but for the statement cache's three
/// (`parse`: their names).
fn per_database_columns(parse: [&'static str; 3]) -> Vec<(&'static str, Ty)> {
    let mut c = vec![("database", S)];
    for name in [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "bytes_received",
        "bytes_sent",
        "xact_time",
        "query_time",
        "wait_time",
    ]
    .into_iter()
    .chain(parse)
    {
        c.push((name, N));
    }
    c
}

pub(super) fn show_stats_totals(v: &dyn View) -> Table {
    let columns = per_database_columns(["client_parse_count", "server_parse_count", "bind_count"]);
    per_database(v, &columns, |tot, _| figures(tot).to_vec())
}

pub(super) fn show_stats_averages(v: &dyn View) -> Table {
    let columns = per_database_columns(["avg_client_parse_count", "avg_server_parse_count", "avg_bind_count"]);
    per_database(v, &columns, |_, avg| figures(avg).to_vec())
}

pub(super) fn show_totals(v: &dyn View) -> Table {
    // PgBouncer names these rows after its counters' fields.
    const NAMES: [&str; 11] = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "client_bytes",
        "server_bytes",
        "xact_time",
        "query_time",
        "wait_time",
        "ps_client_parse_count",
        "ps_server_parse_count",
        "ps_bind_count",
    ];
    let (mut tot, mut period) = (Figures::default(), LastPeriod::default());
    for p in v.pools() {
        tot.add(&p.totals);
        period.add(&p.period);
    }
    let mut table = Table::new(&[("name", S), ("value", N)]);
    for (prefix, f) in [("total_", tot), ("avg_", period.averages())] {
        for (name, value) in NAMES.iter().zip(figures(&f)) {
            table.push(vec![t(format!("{prefix}{name}")), value]);
        }
    }
    table
}
