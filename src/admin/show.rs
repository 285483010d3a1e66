//! The SHOW commands: one function per command over pool snapshots, each returning a
//! result set, and `respond`, which answers one query text.

use crate::error::{Error, SqlState};
use crate::pool::PoolSnapshot;
use crate::protocol::backend;
use bytes::BytesMut;
use std::sync::atomic::Ordering;

/// One result set: column names and text rows.
struct Table {
    columns: &'static [&'static str],
    rows: Vec<Vec<String>>,
}

impl Table {
    fn write(&self, out: &mut BytesMut) {
        backend::row_description_text(out, self.columns);
        for r in &self.rows {
            let vals: Vec<Option<&str>> = r.iter().map(|v| Some(v.as_str())).collect();
            backend::data_row_text(out, &vals);
        }
        backend::command_complete(out, &format!("SHOW {}", self.rows.len()));
    }
}

type Show = fn(&[PoolSnapshot]) -> Table;

/// `SHOW <name>` commands, one function each.
const COMMANDS: &[(&str, Show)] = &[
    ("pools", show_pools),
    ("stats", show_prepared_statements),
    ("prepared_statements", show_prepared_statements),
    ("statements", show_statements),
    ("version", show_version),
    ("help", show_help),
];

fn show_pools(pools: &[PoolSnapshot]) -> Table {
    let rows = pools
        .iter()
        .map(|p| {
            let (idle, open) = (p.idle, p.open);
            vec![
                p.key.db.clone(),
                p.key.user.clone(),
                format!("{:?}", p.mode).to_lowercase(),
                p.size.to_string(),
                open.to_string(),
                idle.to_string(),
                (open - idle.min(open)).to_string(),
                p.waiting.to_string(),
                p.connects.to_string(),
                p.connect_failures.to_string(),
                p.checkouts.to_string(),
                p.waits.to_string(),
                p.wait_timeouts.to_string(),
                p.pipelined.to_string(),
                p.pipelined_cancels.to_string(),
            ]
        })
        .collect();
    Table {
        columns: &[
            "database",
            "user",
            "pool_mode",
            "pool_size",
            "sv_open",
            "sv_idle",
            "sv_active",
            "cl_waiting",
            "connects",
            "connect_failures",
            "checkouts",
            "waits",
            "wait_timeouts",
            "pipelined",
            "pipelined_cancels",
        ],
        rows,
    }
}

fn show_prepared_statements(pools: &[PoolSnapshot]) -> Table {
    let rows = pools
        .iter()
        .map(|p| {
            let s = &p.stmts.stats;
            let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed).to_string();
            vec![
                p.key.db.clone(),
                p.key.user.clone(),
                p.stmts.len().to_string(),
                n(&s.client_parses),
                n(&s.server_parses),
                n(&s.hits),
                n(&s.evictions),
                n(&s.promotions),
                n(&s.invalidations),
                n(&s.retries),
            ]
        })
        .collect();
    Table {
        columns: &[
            "database",
            "user",
            "cached",
            "client_parses",
            "server_parses",
            "hits",
            "evictions",
            "promotions",
            "invalidations",
            "retries",
        ],
        rows,
    }
}

fn show_statements(pools: &[PoolSnapshot]) -> Table {
    let mut rows = Vec::new();
    for p in pools {
        for (name, query, refs) in p.stmts.snapshot() {
            rows.push(vec![p.key.db.clone(), p.key.user.clone(), name, refs.to_string(), query]);
        }
    }
    Table { columns: &["database", "user", "server_name", "refs", "query"], rows }
}

fn show_version(_: &[PoolSnapshot]) -> Table {
    Table { columns: &["version"], rows: vec![vec![format!("parsnip {}", env!("CARGO_PKG_VERSION"))]] }
}

fn show_help(_: &[PoolSnapshot]) -> Table {
    let rows = COMMANDS.iter().map(|(n, _)| vec![format!("SHOW {}", n.to_uppercase())]).collect();
    Table { columns: &["command"], rows }
}

/// Answers one console query (without the ReadyForQuery).
pub(crate) fn respond(sql: &str, pools: &[PoolSnapshot], out: &mut BytesMut) {
    let words: Vec<String> =
        sql.trim().trim_end_matches(';').split_whitespace().map(|w| w.to_ascii_lowercase()).collect();
    match words.as_slice() {
        [] => backend::empty_query_response(out),
        [show, what] if show == "show" => match COMMANDS.iter().find(|(n, _)| n == what) {
            Some((_, f)) => f(pools).write(out),
            None => Error::new(SqlState::SYNTAX_ERROR, format!("unknown SHOW command \"{what}\"; try SHOW HELP"))
                .write_to(out),
        },
        _ => Error::new(SqlState::SYNTAX_ERROR, "the parsnip console only answers SHOW commands; try SHOW HELP")
            .write_to(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tags_of as tags;

    #[test]
    fn show_commands() {
        let mut out = BytesMut::new();
        respond("SHOW VERSION;", &[], &mut out);
        assert_eq!(tags(&out), "TDC");
        let mut out = BytesMut::new();
        respond("show prepared_statements", &[], &mut out);
        assert_eq!(tags(&out), "TC");
        let mut out = BytesMut::new();
        respond("SHOW nonsense", &[], &mut out);
        assert_eq!(tags(&out), "E");
        let mut out = BytesMut::new();
        respond("select 1", &[], &mut out);
        assert!(out.windows(5).any(|w| w == b"42601"));
    }
}
