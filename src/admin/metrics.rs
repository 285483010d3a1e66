//! The Prometheus exposition (text format 0.0.4) of the same figures the console shows,
//! read through the same `View`: per pool (labels `database` and `user`, as many as there
//! are pools, which are bounded and reaped) transactions, queries, bytes, times, client and
//! server connections by state, the wait-time histogram, errors by SQLSTATE class, the
//! statement cache's and pipelining's counters. Encoded with the `prometheus-client` crate
//! at each scrape; nothing is kept between scrapes.

use super::view::{ConnRow, View};
use crate::pool::{PoolSnapshot, WAIT_BUCKETS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeCounterValue, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;

/// The body of a `/metrics` response.
pub(crate) fn render(v: &dyn View) -> String {
    let pools = v.pools();
    let (clients, servers) = (v.clients(), v.servers());
    let scrape = Scrape {
        pools: pools
            .into_iter()
            .map(|p| {
                let mine = |rows: &[ConnRow], state: &str| {
                    rows.iter().filter(|r| r.database == p.key.db && r.user == p.key.user && r.state == state).count()
                        as i64
                };
                let conns = Conns {
                    clients_active: mine(&clients, "active"),
                    clients_waiting: mine(&clients, "waiting"),
                    servers_active: mine(&servers, "active"),
                    servers_idle: mine(&servers, "idle"),
                };
                (p, conns)
            })
            .collect(),
        paused: v.paused(),
        console_clients: v.console_clients() as i64,
        top: v.top_statements(),
        fenced: v.fences().len() as i64,
    };
    let mut registry = Registry::with_prefix("parsnip");
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

/// The content type of `render`'s text.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Connection counts of one pool by state.
#[derive(Debug, Default)]
struct Conns {
    clients_active: i64,
    clients_waiting: i64,
    servers_active: i64,
    servers_idle: i64,
}

/// What one scrape reads, owned (a collector must be `'static`).
#[derive(Debug)]
struct Scrape {
    pools: Vec<(PoolSnapshot, Conns)>,
    paused: bool,
    console_clients: i64,
    /// Statements per pool listed (the top ones by total server time).
    top: usize,
    /// Servers refused as primaries now (`SHOW FENCES`).
    fenced: i64,
}

type Labels<'a> = [(&'static str, &'a str); 2];

fn labels(p: &PoolSnapshot) -> Labels<'_> {
    [("database", p.key.db.as_str()), ("user", p.key.user.as_str())]
}

/// A per-pool counter family (u64 counts, or f64 seconds).
fn counters<V: EncodeCounterValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    pools: &[(PoolSnapshot, Conns)],
    f: impl Fn(&PoolSnapshot) -> V,
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (p, _) in pools {
        ConstCounter::new(f(p)).encode(m.encode_family(&labels(p))?)?;
    }
    Ok(())
}

/// Microseconds as seconds.
fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// A per-pool gauge family with a `state` label.
fn by_state(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    pools: &[(PoolSnapshot, Conns)],
    f: impl Fn(&PoolSnapshot, &Conns) -> Vec<(&'static str, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (p, c) in pools {
        for (state, n) in f(p, c) {
            let l = [("database", p.key.db.as_str()), ("user", p.key.user.as_str()), ("state", state)];
            ConstGauge::new(n).encode(m.encode_family(&l)?)?;
        }
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pools = &self.pools[..];
        let e = &mut e;
        counters(e, "transactions", "Transactions ended (PgBouncer's total_xact_count).", pools, |p| p.totals.xacts)?;
        counters(
            e,
            "queries",
            "Queries answered: ReadyForQuery messages sent (PgBouncer's total_query_count).",
            pools,
            |p| p.totals.queries,
        )?;
        counters(e, "received_bytes", "Bytes received from clients.", pools, |p| p.totals.received)?;
        counters(e, "sent_bytes", "Bytes sent to clients.", pools, |p| p.totals.sent)?;
        counters(e, "transaction_time_seconds", "Time spent in transactions.", pools, |p| secs(p.totals.xact_us))?;
        counters(e, "query_time_seconds", "Time from a query's first bytes to its ReadyForQuery.", pools, |p| {
            secs(p.totals.query_us)
        })?;
        counters(e, "server_assignments", "Server connections given to clients (checkouts).", pools, |p| p.checkouts)?;
        by_state(e, "client_connections", "Logged-in clients by state.", pools, |_, c| {
            vec![("active", c.clients_active), ("waiting", c.clients_waiting)]
        })?;
        by_state(e, "server_connections", "Server connections by state (opening: being connected).", pools, |p, c| {
            let opening = (p.open as i64 - c.servers_active - c.servers_idle).max(0);
            vec![("active", c.servers_active), ("idle", c.servers_idle), ("opening", opening)]
        })?;
        {
            let mut m = e.encode_descriptor(
                "wait_seconds",
                "How long checkouts waited for a server connection.",
                None,
                MetricType::Histogram,
            )?;
            for (p, _) in pools {
                let waited: u64 = p.waited.iter().sum();
                let count = p.checkouts.max(waited);
                let mut buckets: Vec<(f64, u64)> = WAIT_BUCKETS.iter().copied().zip(p.waited).collect();
                // Checkouts served at once waited 0 s: the first bucket.
                if let Some(first) = buckets.first_mut() {
                    first.1 += count - waited;
                }
                m.encode_family(&labels(p))?.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    secs(p.totals.wait_us),
                    count,
                    &buckets,
                    None,
                )?;
            }
        }
        {
            let mut m = e.encode_descriptor(
                "errors",
                "Errors PostgreSQL returned to clients, by SQLSTATE class (its first two characters).",
                None,
                MetricType::Counter,
            )?;
            for (p, _) in pools {
                for (class, n) in &p.errors {
                    let l = [("database", p.key.db.as_str()), ("user", p.key.user.as_str()), ("class", class.as_str())];
                    ConstCounter::new(*n).encode(m.encode_family(&l)?)?;
                }
            }
        }
        let stmt = |f: fn(&crate::stmt::StmtStats) -> &std::sync::atomic::AtomicU64| {
            move |p: &PoolSnapshot| f(&p.stmts.stats).load(Ordering::Relaxed)
        };
        counters(e, "client_parses", "Parse and PREPARE messages from clients.", pools, stmt(|s| &s.client_parses))?;
        counters(e, "server_parses", "Parses sent to servers.", pools, stmt(|s| &s.server_parses))?;
        counters(
            e,
            "describes_saved",
            "Statement Describes answered from the cache without a server.",
            pools,
            stmt(|s| &s.describes_saved),
        )?;
        counters(
            e,
            "cache_hits",
            "Client Parses served by a statement already on the server.",
            pools,
            stmt(|s| &s.hits),
        )?;
        counters(
            e,
            "cache_evictions",
            "Server statements closed to stay within max_prepared_statements.",
            pools,
            stmt(|s| &s.evictions),
        )?;
        counters(
            e,
            "cache_promotions",
            "Unnamed statements promoted to cached named ones.",
            pools,
            stmt(|s| &s.promotions),
        )?;
        counters(
            e,
            "cache_invalidations",
            "Cached statements invalidated (DDL, stale plans).",
            pools,
            stmt(|s| &s.invalidations),
        )?;
        counters(
            e,
            "cache_retries",
            "Statements re-prepared and retried after a stale plan.",
            pools,
            stmt(|s| &s.retries),
        )?;
        counters(e, "binds", "Binds of cached statements.", pools, |p| p.totals.binds)?;
        counters(e, "plan_guard_demotions", "Statement texts the plan guard demoted.", pools, stmt(|s| &s.demotions))?;
        statements(e, pools, self.top)?;
        counters(e, "pipelined", "Checkouts served on a connection busy with other clients' batches.", pools, |p| {
            p.pipelined
        })?;
        counters(e, "pipelined_cancels", "Cancels sent with pg_cancel_backend for pipelined batches.", pools, |p| {
            p.pipelined_cancels
        })?;
        {
            let mut m = e.encode_descriptor(
                "pins",
                "Clients pinned to their server connection under transaction pooling, by reason, counted when the server confirmed the reason.",
                None,
                MetricType::Counter,
            )?;
            for (p, _) in pools {
                for (i, (_, reason)) in crate::stmt::pins::PinReasons::NAMES.iter().enumerate() {
                    let l = [("database", p.key.db.as_str()), ("user", p.key.user.as_str()), ("reason", reason)];
                    ConstCounter::new(p.pins_begun[i]).encode(m.encode_family(&l)?)?;
                }
            }
        }
        {
            let mut m = e.encode_descriptor(
                "pinned_clients",
                "Clients pinned to their server connection now (SHOW CLIENTS' pinned column not empty).",
                None,
                MetricType::Gauge,
            )?;
            for (p, _) in pools {
                ConstGauge::new(p.pinned_clients).encode(m.encode_family(&labels(p))?)?;
            }
        }
        counters(e, "server_connects", "Server connections opened.", pools, |p| p.connects)?;
        counters(e, "server_connect_failures", "Failed server connection attempts.", pools, |p| p.connect_failures)?;
        counters(e, "wait_timeouts", "Checkouts that timed out (query_wait_timeout_ms).", pools, |p| p.wait_timeouts)?;
        {
            let mut m =
                e.encode_descriptor("cached_statements", "Statements in the pool's cache.", None, MetricType::Gauge)?;
            for (p, _) in pools {
                ConstGauge::new(p.stmts.len() as i64).encode(m.encode_family(&labels(p))?)?;
            }
        }
        {
            let m =
                e.encode_descriptor("paused", "1 while PAUSE (or SIGUSR1) holds every pool.", None, MetricType::Gauge)?;
            ConstGauge::new(i64::from(self.paused)).encode(m)?;
        }
        let m = e.encode_descriptor("console_connections", "Admin console connections.", None, MetricType::Gauge)?;
        ConstGauge::new(self.console_clients).encode(m)?;
        let m = e.encode_descriptor(
            "fenced_servers",
            "Servers refused as primaries: read-write on an older timeline than one seen (SHOW FENCES).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.fenced).encode(m)?;
        Ok(())
    }
}

/// Per statement, for the `top` statements of each pool by total server time (bounded:
/// at most `top` × pools series per family): executions by kind, rows, errors, server time,
/// and whether the plan guard has it demoted. Labelled with the server name and the first
/// 100 characters of its text.
fn statements(e: &mut DescriptorEncoder, pools: &[(PoolSnapshot, Conns)], top: usize) -> Result<(), std::fmt::Error> {
    let mut rows = Vec::new();
    for (p, _) in pools {
        let mut stmts: Vec<_> = p.stmts.statements().into_iter().map(|s| (s.exec.figures(), s)).collect();
        stmts.sort_by(|a, b| b.0.total_us.cmp(&a.0.total_us).then_with(|| a.1.server_name.cmp(&b.1.server_name)));
        for (f, s) in stmts.into_iter().take(top).filter(|(f, _)| f.calls() > 0) {
            let query: String = String::from_utf8_lossy(&s.query).chars().take(100).collect();
            let demoted = s.guard.get().is_some_and(|g| g.state().0.is_some());
            rows.push((p, s.server_name.to_string(), query, f, demoted));
        }
    }
    let l = |p: &PoolSnapshot, name: &str, query: &str, kind: Option<&'static str>| {
        let mut v = vec![
            ("database", p.key.db.clone()),
            ("user", p.key.user.clone()),
            ("statement", name.to_owned()),
            ("query", query.to_owned()),
        ];
        if let Some(k) = kind {
            v.push(("kind", k.to_owned()));
        }
        v
    };
    {
        let mut m = e.encode_descriptor(
            "statement_calls",
            "Executions of a cached statement, from the cache or as the client sent them (plan guard).",
            None,
            MetricType::Counter,
        )?;
        for (p, name, query, f, _) in &rows {
            for (kind, n) in [("cached", f.cached), ("as_sent", f.as_sent)] {
                ConstCounter::new(n).encode(m.encode_family(&l(p, name, query, Some(kind)))?)?;
            }
        }
    }
    type Get = fn(&crate::stmt::stats::ExecFigures) -> u64;
    let families: [(&str, &str, Get); 2] = [
        ("statement_rows", "Rows a cached statement's executions returned or affected.", |f| f.rows),
        ("statement_errors", "Executions of a cached statement that failed.", |f| f.errors),
    ];
    for (name_, help, get) in families {
        let mut m = e.encode_descriptor(name_, help, None, MetricType::Counter)?;
        for (p, name, query, f, _) in &rows {
            ConstCounter::new(get(f)).encode(m.encode_family(&l(p, name, query, None))?)?;
        }
    }
    {
        let mut m = e.encode_descriptor(
            "statement_seconds",
            "Server time of a cached statement's executions (sent to completed).",
            None,
            MetricType::Counter,
        )?;
        for (p, name, query, f, _) in &rows {
            ConstCounter::new(secs(f.total_us)).encode(m.encode_family(&l(p, name, query, None))?)?;
        }
    }
    let mut m = e.encode_descriptor(
        "statement_demoted",
        "1 while the plan guard runs the statement as sent.",
        None,
        MetricType::Gauge,
    )?;
    for (p, name, query, _, demoted) in &rows {
        ConstGauge::new(i64::from(*demoted)).encode(m.encode_family(&l(p, name, query, None))?)?;
    }
    Ok(())
}
