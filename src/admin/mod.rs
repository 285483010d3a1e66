//! The admin console: a client connecting to the database `parsnip` gets SHOW commands
//! answered by the pooler itself (simple protocol), in the spirit of PgBouncer's console.
//! Pure: `Console` takes the client's frames and a snapshot of the pools
//! (`pool::PoolSnapshot`, taken by the driver when a command needs one) and writes the
//! replies; `show` holds the commands. The driver owns the connection. Must not touch
//! sockets or pools.

mod console;
mod show;

pub(crate) use console::{Console, ConsoleStep};
