//! The console's conversation: frames from the client in, replies out. Simple Query only;
//! anything else gets 0A000, Terminate ends it. SHOW commands are answered at once from
//! the `View`; commands that change the pooler's state are handed to the driver
//! (`ConsoleStep::Run`), which reports back with `finished`.

use super::command::{self, Command, StateChange};
use super::show::show;
use super::view::View;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, frontend, split_frame, tags};
use bytes::BytesMut;

/// The largest frame the console reads.
const MAX_FRAME: usize = 1 << 20;

/// What the driver does next for the console.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConsoleStep {
    /// Write `to_client`, then read more and call `handle_bytes` again.
    NeedBytes,
    /// Write `to_client`, carry the action out, then call `finished` (and `handle_bytes`
    /// again: the rest of the buffer waits).
    Run(StateChange),
    /// Write `to_client`, then close the connection.
    Close,
}

/// One console connection after login. See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Console {
    /// Bytes to write to the client.
    pub(crate) to_client: BytesMut,
    /// A stats user (`stats_users`): SHOW only.
    pub(crate) read_only: bool,
}

impl Console {
    /// A console for an admin (`read_only` false) or a stats user.
    pub(crate) fn new(read_only: bool) -> Console {
        Console { to_client: BytesMut::new(), read_only }
    }

    /// Answers the whole frames in `buf` (consumed), up to the first command the driver
    /// must carry out.
    pub(crate) fn handle_bytes(&mut self, buf: &mut BytesMut, view: &dyn View) -> ConsoleStep {
        loop {
            let frame = match split_frame(buf, MAX_FRAME) {
                Ok(Some(n)) => buf.split_to(n),
                Ok(None) => return ConsoleStep::NeedBytes,
                Err(e) => {
                    Error::protocol(e.to_string()).write_to(&mut self.to_client);
                    return ConsoleStep::Close;
                }
            };
            match frame[0] {
                tags::QUERY => {
                    let sql = frontend::query_text(body(&frame)).unwrap_or_default();
                    match command::parse(&String::from_utf8_lossy(sql)) {
                        Ok(Command::Empty) => backend::empty_query_response(&mut self.to_client),
                        Ok(Command::Show(what)) => match show(&what, view) {
                            Some(table) => table.write(&mut self.to_client),
                            None => Error::new(
                                SqlState::SYNTAX_ERROR,
                                format!("unknown SHOW command \"{what}\"; try SHOW HELP"),
                            )
                            .write_to(&mut self.to_client),
                        },
                        Ok(Command::Act(_)) if self.read_only => {
                            Error::new(SqlState::INSUFFICIENT_PRIVILEGE, "admin access needed")
                                .write_to(&mut self.to_client)
                        }
                        Ok(Command::Act(a)) => return ConsoleStep::Run(a),
                        Err(e) => e.write_to(&mut self.to_client),
                    }
                }
                tags::TERMINATE => return ConsoleStep::Close,
                t => Error::new(
                    SqlState::FEATURE_NOT_SUPPORTED,
                    format!("the parsnip console accepts simple queries only (got message type {t})"),
                )
                .write_to(&mut self.to_client),
            }
            backend::ready_for_query(&mut self.to_client, b'I');
        }
    }

    /// The driver carried out the last `Run`: its command tag (PgBouncer's: the command's
    /// name) or its error.
    pub(crate) fn finished(&mut self, result: Result<&str, Error>) {
        match result {
            Ok(tag) => backend::command_complete(&mut self.to_client, tag),
            Err(e) => e.write_to(&mut self.to_client),
        }
        backend::ready_for_query(&mut self.to_client, b'I');
    }
}

#[cfg(test)]
mod tests {
    use super::super::view::{ConfigRow, ConnRow, DatabaseRow, UserRow};
    use super::*;
    use crate::pool::PoolSnapshot;
    use crate::protocol::tags_of;

    /// A pooler with nothing in it.
    struct Empty;
    impl View for Empty {
        fn pools(&self) -> Vec<PoolSnapshot> {
            Vec::new()
        }
        fn clients(&self) -> Vec<ConnRow> {
            Vec::new()
        }
        fn servers(&self) -> Vec<ConnRow> {
            Vec::new()
        }
        fn databases(&self) -> Vec<DatabaseRow> {
            Vec::new()
        }
        fn users(&self) -> Vec<UserRow> {
            Vec::new()
        }
        fn config(&self) -> Vec<ConfigRow> {
            Vec::new()
        }
        fn paused(&self) -> bool {
            false
        }
        fn console_clients(&self) -> usize {
            1
        }
    }

    #[test]
    fn queries_are_answered_and_terminate_closes() {
        let mut c = Console::default();
        let mut buf = BytesMut::new();
        frontend::query(&mut buf, "SHOW VERSION");
        frontend::sync(&mut buf);
        assert_eq!(c.handle_bytes(&mut buf, &Empty), ConsoleStep::NeedBytes);
        assert_eq!(tags_of(&c.to_client), "TDCZEZ", "the result, then 0A000 for the Sync");
        c.to_client.clear();
        frontend::terminate(&mut buf);
        assert_eq!(c.handle_bytes(&mut buf, &Empty), ConsoleStep::Close);
        assert!(c.to_client.is_empty());
        let mut bad = BytesMut::from(&b"Q\0\0\0\x01"[..]);
        assert_eq!(c.handle_bytes(&mut bad, &Empty), ConsoleStep::Close);
        assert!(String::from_utf8_lossy(&c.to_client).contains("08P01"));
    }

    #[test]
    fn commands_go_to_the_driver_and_stats_users_may_only_look() {
        let mut c = Console::new(false);
        let mut buf = BytesMut::new();
        frontend::query(&mut buf, "PAUSE app");
        frontend::query(&mut buf, "SHOW STATE");
        assert_eq!(c.handle_bytes(&mut buf, &Empty), ConsoleStep::Run(StateChange::Pause(Some("app".into()))));
        assert!(c.to_client.is_empty());
        c.finished(Ok("PAUSE"));
        assert_eq!(tags_of(&c.to_client), "CZ");
        c.to_client.clear();
        assert_eq!(c.handle_bytes(&mut buf, &Empty), ConsoleStep::NeedBytes, "the SHOW waited its turn");
        assert_eq!(tags_of(&c.to_client), "TDDDCZ");

        let mut c = Console::new(true);
        frontend::query(&mut buf, "RESUME");
        frontend::query(&mut buf, "SHOW nonsense");
        frontend::query(&mut buf, "select 1");
        assert_eq!(c.handle_bytes(&mut buf, &Empty), ConsoleStep::NeedBytes);
        let text = String::from_utf8_lossy(&c.to_client);
        assert!(text.contains("42501") && text.contains("admin access needed"), "{text}");
        assert_eq!(tags_of(&c.to_client), "EZEZEZ");
    }
}
