//! What a connection carries that the session, the pool and the driver all read: the
//! settings in effect on it (`settings`, and the cancel timers they arm: `timers`), and what
//! is known about a server connection (`server`: its transaction status, the statements
//! prepared on it, whether a cancel signal may be left on its backend).
//!
//! Pure data with no IO and no protocol decisions: it must not import `session`, `pool` or
//! `driver`, which all build on it.

pub(crate) mod server;
pub(crate) mod settings;
pub(crate) mod timers;

pub use server::{ServerState, TxStatus};
pub use settings::Settings;
