//! The console's conversation: frames from the client in, replies out. Simple Query only;
//! anything else gets 0A000, Terminate ends it.

use super::show::respond;
use crate::error::{Error, SqlState};
use crate::pool::PoolSnapshot;
use crate::protocol::{backend, body, frontend, split_frame, tags};
use bytes::BytesMut;

/// The largest frame the console reads.
const MAX_FRAME: usize = 1 << 20;

/// What the driver does next for the console.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConsoleStep {
    /// Write `to_client`, then read more and call `handle_bytes` again.
    NeedBytes,
    /// Write `to_client`, then close the connection.
    Close,
}

/// One console connection after login. See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Console {
    /// Bytes to write to the client.
    pub(crate) to_client: BytesMut,
}

impl Console {
    /// Answers the whole frames in `buf` (consumed). `pools` gives a snapshot of the
    /// pools, sorted by key, when a command reads them.
    pub(crate) fn handle_bytes(&mut self, buf: &mut BytesMut, pools: impl Fn() -> Vec<PoolSnapshot>) -> ConsoleStep {
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
                    respond(&String::from_utf8_lossy(sql), &pools(), &mut self.to_client);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tags_of;

    #[test]
    fn queries_are_answered_and_terminate_closes() {
        let mut c = Console::default();
        let mut buf = BytesMut::new();
        frontend::query(&mut buf, "SHOW VERSION");
        frontend::sync(&mut buf);
        assert_eq!(c.handle_bytes(&mut buf, Vec::new), ConsoleStep::NeedBytes);
        assert_eq!(tags_of(&c.to_client), "TDCZEZ", "the result, then 0A000 for the Sync");
        c.to_client.clear();
        frontend::terminate(&mut buf);
        assert_eq!(c.handle_bytes(&mut buf, Vec::new), ConsoleStep::Close);
        assert!(c.to_client.is_empty());
        let mut bad = BytesMut::from(&b"Q\0\0\0\x01"[..]);
        assert_eq!(c.handle_bytes(&mut bad, Vec::new), ConsoleStep::Close);
        assert!(String::from_utf8_lossy(&c.to_client).contains("08P01"));
    }
}
