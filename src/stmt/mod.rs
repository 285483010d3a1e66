//! The prepared-statement cache. Pure data structures, no IO:
//!
//! * `registry`: per pool, the statements known by key (search_path, SQL text, parameter
//!   type OIDs), each with a unique server-side name (`pn_<n>`) and a ready-to-send Parse.
//!   Also counts unnamed-statement sightings for promotion, and the cache counters.
//! * `server`: per server connection, which statements are prepared on it, with LRU order.
//! * `epoch`: the shape epoch, which says when a description a server gave is still current.
//! * `lex`: the one SQL lexer (comments, quotes, dollar quotes, numbers, parameters).
//! * `pgps`: the client's own `pg_prepared_statements`: where a text reads the view, and
//!   the subquery that stands in for it.
//! * `sql`: splitting and classifying Query texts, and recognizing SQL-level PREPARE /
//!   EXECUTE / DEALLOCATE / DISCARD in simple queries.
//! * `lift`: lifting a simple Query's numeric literals into parameters (autoprepare).
//! * `runtime`: how long batches of one kind recently took on a server (pipelining).
//! * `idmap`: maps keyed by the statement ids the registry hands out.
//! * `memo`: facts about a statement's text worked out on first need and kept in it.
//! * `stats`: per-statement execution statistics (calls, rows, errors, a time histogram).
//! * `guard`: the plan guard's decision, per promoted or autoprepared text: which
//!   executions run as the client sent them, and when the text is demoted.
//!
//! The session (`crate::session`) decides when to register, inject, rewrite and evict; this
//! module only keeps the books. It must not know about sockets, pools or the reply queue.

pub(crate) mod epoch;
pub mod guard;
pub(crate) mod idmap;
pub(crate) mod lex;
pub mod lift;
pub(crate) mod memo;
pub(crate) mod pgps;
pub(crate) mod pins;
pub(crate) mod registry;
pub(crate) mod runtime;
pub(crate) mod server;
pub(crate) mod sql;
pub mod stats;

pub use registry::{Registry, Statement, StmtConfig, StmtStats};
pub(crate) use runtime::RunTime;
pub(crate) use server::ServerStmts;
