//! parsnip: a PostgreSQL connection pooler with a transparent prepared-statement cache.
//!
//! # Layout
//!
//! * `error`: the SQLSTATE table and the error type every client-visible failure becomes.
//! * `protocol`: pure framing and typed views of v3 messages, and builders for the few the
//!   pooler synthesizes. No IO.
//! * `auth`: SCRAM-SHA-256 (both sides), md5 and cleartext checks, stored secrets. No IO.
//! * `config`: the TOML file and command line, validated into one typed `Config`.
//! * `session`: the per-client sans-IO state machine and its per-server reply queue.
//! * `pool`: server connections per (database, user): checkout, wait queue, limits, lifetime.
//! * `driver`: the only code that touches sockets, timers and signals (tokio).
//! * `embedded`: a throwaway local PostgreSQL cluster, for the zero-config default and tests.

pub mod admin;
pub mod auth;
pub mod config;
pub mod driver;
pub mod embedded;
pub mod error;
pub mod pool;
pub mod protocol;
pub mod session;
pub mod state;
pub mod stmt;
