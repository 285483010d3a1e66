//! The admin console: a client connecting to the database `parsnip` (or PgBouncer's
//! `pgbouncer`) gets PgBouncer's console commands answered by the pooler itself (simple
//! protocol). Pure: `Console` takes the client's frames and reads the running pooler
//! through the `View` trait (`view`); SHOW commands (`show`, over `table`) are answered at
//! once, and commands that change state (`command`) are handed to the driver to carry
//! out. Must not touch sockets or pools: the driver owns both and implements `View`.

mod command;
mod console;
mod metrics;
mod show;
mod stats;
mod table;
#[cfg(test)]
mod tests;
mod view;

pub(crate) use command::{ShutdownMode, StateChange};
pub(crate) use console::{Console, ConsoleStep};
pub(crate) use metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, render as render_metrics};
pub(crate) use view::{ConfigRow, ConnRow, DatabaseRow, FenceRow, ListenerRow, PeerRow, UserRow, View};
