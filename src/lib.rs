//! parsnip: a PostgreSQL connection pooler with a transparent prepared-statement cache.
//!
//! # Layout
//!
//! Dependencies point one way, from the top of this list down; no module imports one
//! above it, and only `driver` does IO.
//!
//! * `driver`: the only code that touches sockets, timers and signals (tokio): listeners,
//!   the per-client proxy loop, server connections, pipelining, cancel routing.
//! * `admin`: the console (`SHOW ...`): commands in, result sets out. No IO.
//! * `login`: the login phase as a sans-IO state machine: startup packet, protocol
//!   negotiation, authentication, welcome. No IO.
//! * `pool`: server connections per (database, user): checkout, wait queue, limits, lifetime.
//! * `session`: the per-client sans-IO state machine: client and server frames in, bytes
//!   and actions out; its reply queue, transaction, statements and retry state.
//! * `config`: the TOML file and command line, validated into one typed `Config`.
//! * `state`: what a connection carries that session, pool and driver all read: settings,
//!   transaction status, statements prepared on a server.
//! * `stmt`: the prepared-statement cache's books: the registry, per-server statements, and
//!   the SQL lexer that recognizes PREPARE/EXECUTE/DEALLOCATE and SET/BEGIN/COMMIT.
//! * `auth`: SCRAM-SHA-256 (both sides), md5 and cleartext checks, stored secrets. No IO.
//! * `error`: the SQLSTATE table and the error type every client-visible failure becomes.
//! * `protocol`: pure framing, typed views of v3 messages, and builders for every message
//!   the pooler writes. Imports nothing of the crate.
//! * `embedded`: a throwaway local PostgreSQL cluster, for the zero-config default and tests.

pub mod admin;
pub mod auth;
pub mod config;
pub mod driver;
pub mod embedded;
pub mod error;
pub mod login;
pub mod pool;
pub mod protocol;
pub mod session;
pub mod state;
pub mod stmt;
