//! Shared harness of the end-to-end tests.
//!
//! * [`cluster`]: one throwaway PostgreSQL per test binary (SCRAM auth, roles `app`,
//!   `md5user`, `aq`, database `other`), stopped by an `atexit` hook when the binary exits.
//!   Its binaries are found as the embedded module finds them: `PARSNIP_PG_BIN` first
//!   (scripts/test.sh's second pass, PostgreSQL 18), else Debian's PostgreSQL 15.
//! * [`Parsnip`]: the pooler binary on a free port, its stderr/stdout collected, killed on
//!   drop (and by the kernel if the test thread dies first).
//! * [`Pg`]: a tokio-postgres client whose connection task forwards NOTICEs and reports how
//!   the connection ended.
//! * [`Raw`]: a hand-rolled v3 protocol client for protocol-level tests (own SCRAM/md5/cleartext).
//! * [`Certs`]: a CA and a certificate it signed, made in the test (rcgen).
//! * [`start_primary`] and [`Standby`]: streaming replication (a primary and hot standbys
//!   made with `pg_basebackup -R`), with kill, promote and wait-for-replay helpers.
//!
//! Setting `PARSNIP_E2E_DIRECT=1` makes [`Parsnip`] point at the cluster itself instead of
//! starting the pooler: a development aid to check that a test's assertions hold for plain
//! PostgreSQL (pooler-only features then fail, as they should).

#![allow(dead_code)]

mod cluster;
mod pg;
mod pooler;
mod raw;
mod raw_auth;
mod replica;
mod tls;
mod util;

pub use cluster::*;
pub use pg::*;
pub use pooler::*;
pub use raw::*;
pub use raw_auth::*;
#[allow(unused_imports)] // Only the replica tests use it.
pub use replica::*;
#[allow(unused_imports)] // Only the TLS tests use it.
pub use tls::*;
pub use util::*;
