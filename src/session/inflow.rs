//! Large client frames that pass through without being held whole: a Bind, simple Query,
//! FunctionCall or CopyData of `stream_from` bytes or more. The session decides on the
//! frame's start (its header and, for a Bind, the portal and statement names) exactly as
//! `handle_client` decides on a whole frame; the driver then appends the rest of the body
//! to `to_server` as it arrives (or drops it), and nothing else is fed meanwhile.
//!
//! How: the session is fed a *stub*, the same message with its body cut after the prefix
//! (a Query's text cut to nothing). No valid frame looks like a stub (a Bind has at least
//! three counts after its names, a FunctionCall an oid, a Query a NUL-terminated text; a
//! CopyData is never empty), so the stub's copy in `to_server`, renamed or not, is found
//! again after `handle_client`, and its length is set to the real frame's. What the session
//! wrote behind it (a savepoint guard's RELEASE) goes after the body. A session that did not
//! send the stub on (it answered, refused or skipped the message) gets none of the body.
//!
//! What is lost by not seeing the whole frame: a streamed Bind cannot be replayed by a
//! transparent retry (`retry`: a batch holding a stub is never replayed); a streamed
//! Query's text is not looked at (no autoprepare, no SQL-level PREPARE/EXECUTE translation,
//! no SET tracking or pinning): its server connection is closed instead of reused when the
//! client gives it back, and the shape epoch moves as for DDL.

use super::{Fed, Session};
use crate::protocol::{read_cstr, tags};
use crate::state::ServerState;

/// Client frames at least this large are streamed (when `stream_client_frame` takes them):
/// Bind, FunctionCall and CopyData.
pub const STREAM_FROM: usize = 64 * 1024;

/// Simple Queries are streamed from this size only: a streamed Query is not looked at, and
/// costs its server connection (closed at release), so the many statements of a few
/// hundred KiB ORMs send are held whole (counted in the driver's budget) and handled as
/// usual.
pub const STREAM_QUERY_FROM: usize = 1024 * 1024;

/// A Bind's names longer than this (PostgreSQL truncates names to 63 bytes): the frame is
/// held whole.
const MAX_PREFIX: usize = 16 * 1024;

/// The size from which a client frame of type `tag` may be streamed (None: never).
pub fn stream_from(tag: u8) -> Option<usize> {
    match tag {
        tags::BIND | tags::FUNCTION_CALL | tags::COPY_DATA => Some(STREAM_FROM),
        tags::QUERY => Some(STREAM_QUERY_FROM),
        _ => None,
    }
}

/// What became of the start of a large client frame given to
/// [`Session::stream_client_frame`].
#[derive(Debug, PartialEq, Eq)]
pub enum Streamed {
    /// Not streamed: read it whole and feed it to `handle_client`.
    Whole,
    /// More of its start is needed (a Bind's names are not all read yet).
    NeedBytes,
    /// Not consumed (as `handle_client` would answer): offer it again later.
    Later(Fed),
    /// Taken: its first `taken` bytes are handled; the next `total - taken` bytes from the
    /// client go to `to_server` as they come when `pass`, or are dropped; then `after`.
    Started {
        /// Bytes of the frame consumed (header and prefix).
        taken: usize,
        /// The rest of the frame goes to the server.
        pass: bool,
        /// Bytes the session wrote behind the frame, to follow its body.
        after: Vec<u8>,
    },
}

impl Session {
    /// The start of a client frame of `total` bytes (tag included) too large to hold whole:
    /// `head` is what has been read of it (at least its 5-byte header). See the module doc.
    pub fn stream_client_frame(&mut self, head: &[u8], total: usize, server: Option<&mut ServerState>) -> Streamed {
        let tag = head[0];
        if stream_from(tag).is_none_or(|from| total < from)
            || total < 5
            || self.busy.retry.replay.is_some()
            || self.autoprep_feeding()
        {
            return Streamed::Whole;
        }
        let taken = if tag == tags::BIND {
            let seen = &head[5..head.len().min(total)];
            match read_cstr(seen).and_then(|(_, rest)| read_cstr(rest)) {
                Some((_, rest)) => total.min(head.len()) - rest.len(),
                None if seen.len() >= MAX_PREFIX => return Streamed::Whole,
                None => return Streamed::NeedBytes,
            }
        } else {
            5
        };
        let mut stub = Vec::with_capacity(taken + 1);
        stub.push(tag);
        stub.extend_from_slice(&[0; 4]);
        stub.extend_from_slice(&head[5..taken]);
        if tag == tags::QUERY {
            stub.push(0);
        }
        let len = (stub.len() - 1) as u32;
        stub[1..5].copy_from_slice(&len.to_be_bytes());
        let before = self.to_server.len();
        let fed = self.handle_client(&stub, server);
        if fed != Fed::Consumed {
            return Streamed::Later(fed);
        }
        let Some(at) = find_stub(&self.to_server, before, tag) else {
            return Streamed::Started { taken, pass: false, after: Vec::new() };
        };
        let stub_len = 1 + u32::from_be_bytes([
            self.to_server[at + 1],
            self.to_server[at + 2],
            self.to_server[at + 3],
            self.to_server[at + 4],
        ]) as usize;
        let after = self.to_server.split_off(at + stub_len).to_vec();
        let mut kept = stub_len;
        if tag == tags::QUERY {
            // The stub's empty text goes: the client's text (and its NUL) follows.
            self.to_server.truncate(at + 5);
            kept = 5;
            self.looked_past();
        }
        let real_len = (kept - 1 + (total - taken)) as u32;
        self.to_server[at + 1..at + 5].copy_from_slice(&real_len.to_be_bytes());
        Streamed::Started { taken, pass: true, after }
    }

    /// A server frame too large for the driver's budget of buffered bytes to hold whole
    /// (and not one that streams): the stream cannot be followed past it, so the server
    /// connection is closed and the client gets `err` (53200), as when a server is lost.
    pub fn handle_server_over_budget(&mut self, err: crate::error::Error) {
        self.busy.replies.clear();
        err.write_to(&mut self.to_client);
        self.release_held();
        self.fail_server();
    }

    /// A Query went to the server unread: whatever it did to the server session (settings,
    /// `set_config`, temporary objects, prepared statements) is not known, so the server is
    /// closed rather than reused when the client gives it back; it may have changed the
    /// schema, so the shape epoch moves now and when its transaction ends.
    fn looked_past(&mut self) {
        self.dirty_server_if(true);
        crate::stmt::epoch::advance();
        self.busy.tx.schema_change = true;
    }
}

/// Whether `frame` (whole) is the stub of a streamed frame: no valid message has its shape.
pub(super) fn is_stub(frame: &[u8]) -> bool {
    let Some(&tag) = frame.first() else { return false };
    let body = frame.get(5..).unwrap_or_default();
    match tag {
        tags::BIND => read_cstr(body).and_then(|(_, rest)| read_cstr(rest)).is_some_and(|(_, rest)| rest.is_empty()),
        tags::QUERY => body == [0],
        tags::FUNCTION_CALL | tags::COPY_DATA => body.is_empty(),
        _ => false,
    }
}

/// Whether the whole frames in `frames` hold a stub (a batch a retry must not replay).
pub(super) fn holds_stub(mut frames: &[u8]) -> bool {
    while let Ok(Some(n)) = crate::protocol::split_frame(frames, usize::MAX) {
        if is_stub(&frames[..n]) {
            return true;
        }
        frames = &frames[n..];
    }
    false
}

/// Where the last stub of type `tag` in `out[from..]` starts.
fn find_stub(out: &[u8], from: usize, tag: u8) -> Option<usize> {
    let mut at = from;
    let mut found = None;
    while let Ok(Some(n)) = crate::protocol::split_frame(&out[at..], usize::MAX) {
        if out[at] == tag && is_stub(&out[at..at + n]) {
            found = Some(at);
        }
        at += n;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolMode;
    use crate::protocol::{split_frame, write_msg};
    use crate::session::Action;
    use crate::stmt::{Registry, StmtConfig};
    use bytes::{BufMut, BytesMut};
    use std::sync::Arc;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        write_msg(&mut b, tag, |b| b.put_slice(body));
        b.to_vec()
    }

    fn cached() -> Session {
        let reg = Arc::new(Registry::new(StmtConfig::default()));
        Session::new(PoolMode::Transaction, Arc::default(), 1, Some(reg))
    }

    /// Offers `frame`'s first `seen` bytes as the driver does, linking a server when asked.
    fn start(s: &mut Session, srv: &mut ServerState, frame: &[u8], seen: usize) -> Streamed {
        let head = &frame[..seen];
        match s.stream_client_frame(head, frame.len(), None) {
            Streamed::Later(Fed::NeedsServer) => {
                assert_eq!(s.poll_action(), Some(Action::AcquireServer));
                s.handle_server_linked(srv);
                s.stream_client_frame(head, frame.len(), Some(srv))
            }
            other => other,
        }
    }

    /// A Bind of statement `stmt` with one text parameter of `n` bytes.
    fn big_bind(stmt: &str, n: usize) -> Vec<u8> {
        let mut body = format!("\0{stmt}\0").into_bytes();
        body.extend_from_slice(&[0, 0, 0, 1]);
        body.extend_from_slice(&(n as i32).to_be_bytes());
        body.extend(std::iter::repeat_n(b'v', n));
        body.extend_from_slice(&[0, 0]);
        msg(b'B', &body)
    }

    #[test]
    fn a_streamed_bind_of_a_cached_statement_is_renamed_and_keeps_its_body() {
        let mut s = cached();
        let mut srv = ServerState::default();
        let parse = msg(b'P', b"s1\0select $1::text\0\0\0");
        assert_eq!(s.handle_client(&parse, None), Fed::NeedsServer);
        assert_eq!(s.poll_action(), Some(Action::AcquireServer));
        s.handle_server_linked(&mut srv);
        assert_eq!(s.handle_client(&parse, Some(&mut srv)), Fed::Consumed);
        assert_eq!(s.handle_client(&msg(b'S', b""), Some(&mut srv)), Fed::Consumed);
        s.handle_server(&msg(b'1', b""), &mut srv);
        s.handle_server(&msg(b'Z', b"I"), &mut srv);
        assert_eq!(s.poll_action(), Some(Action::ReleaseServer { reusable: true }));
        s.to_server.clear();
        s.to_client.clear();

        let frame = big_bind("s1", 100_000);
        // Not all of its names read yet.
        assert_eq!(s.stream_client_frame(&frame[..7], frame.len(), None), Streamed::NeedBytes);
        let Streamed::Started { taken, pass: true, after } = start(&mut s, &mut srv, &frame, 4096) else {
            panic!("not streamed")
        };
        assert_eq!(taken, 5 + 4, "header, portal and statement name");
        assert!(after.is_empty());
        // The driver appends the rest: the server gets one whole, renamed Bind.
        s.to_server.extend_from_slice(&frame[taken..]);
        let out = s.to_server.split().to_vec();
        let mut rest = &out[..];
        let mut last = None;
        while let Ok(Some(n)) = split_frame(rest, usize::MAX) {
            last = Some(&rest[..n]);
            rest = &rest[n..];
        }
        assert!(rest.is_empty(), "a frame's length does not match its bytes");
        let bind = last.expect("a frame");
        let (portal, stmt, at) = crate::protocol::frontend::bind_names(&bind[5..]).expect("a Bind");
        assert_eq!(portal, b"");
        assert!(stmt.starts_with(b"pn_"), "renamed: {}", String::from_utf8_lossy(stmt));
        assert_eq!(&bind[5 + at..], &frame[taken..], "the parameters as sent");
        // Replies come as for any Bind; a stale plan is not retried (the Bind's body was
        // never kept): the client gets PostgreSQL's error.
        assert_eq!(s.outstanding(), 1);
        assert_eq!(s.handle_client(&msg(b'E', b"\0\0\0\0\0"), Some(&mut srv)), Fed::Consumed);
        assert_eq!(s.handle_client(&msg(b'S', b""), Some(&mut srv)), Fed::Consumed);
        s.to_server.clear();
        s.handle_server(&msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"), &mut srv);
        s.handle_server(&msg(b'Z', b"I"), &mut srv);
        assert!(!s.has_replay() && s.to_server.is_empty(), "no retry");
        assert_eq!(crate::protocol::tags_of(&s.to_client), "EZ");
    }

    #[test]
    fn a_streamed_query_goes_unread_and_its_server_is_not_reused() {
        let mut s = Session::new(PoolMode::Transaction, Arc::default(), 1, None);
        let mut srv = ServerState::default();
        let mut frame = BytesMut::new();
        crate::protocol::frontend::query(&mut frame, &format!("select '{}'", "q".repeat(STREAM_QUERY_FROM)));
        let Streamed::Started { taken: 5, pass: true, after } = start(&mut s, &mut srv, &frame, 5) else {
            panic!("not streamed")
        };
        assert!(after.is_empty());
        assert_eq!(&s.to_server[..], &frame[..5], "the header as the client sent it");
        s.to_server.clear();
        for m in [msg(b'T', b"\0\0"), msg(b'D', b"\0\0"), msg(b'C', b"SELECT 1\0"), msg(b'Z', b"I")] {
            s.handle_server(&m, &mut srv);
        }
        assert_eq!(s.poll_action(), Some(Action::ReleaseServer { reusable: false }));
        // Below the Query threshold: read whole.
        assert_eq!(s.stream_client_frame(&frame[..5], STREAM_QUERY_FROM - 1, None), Streamed::Whole);
    }

    #[test]
    fn a_frame_the_session_answers_itself_is_dropped() {
        let mut s = cached();
        s.handle_acquire_failed(crate::error::Error::new(crate::error::SqlState::QUERY_CANCELED, "timeout"));
        let frame = big_bind("s1", STREAM_FROM);
        match s.stream_client_frame(&frame[..64], frame.len(), None) {
            Streamed::Started { pass, .. } => assert!(!pass, "the body goes nowhere"),
            other => panic!("{other:?}"),
        }
        assert!(s.to_server.is_empty());
        assert!(!s.to_client.is_empty(), "the error");
        let copy = msg(b'd', &vec![b'x'; STREAM_FROM]);
        assert!(matches!(s.stream_client_frame(&copy[..5], copy.len(), None), Streamed::Started { pass: false, .. }));
    }

    #[test]
    fn stubs_are_told_from_valid_messages() {
        assert!(is_stub(&msg(b'B', b"p\0s\0")));
        assert!(!is_stub(&msg(b'B', b"p\0s\0\0\0\0\0\0\0")));
        assert!(is_stub(&msg(b'Q', b"\0")));
        assert!(!is_stub(&msg(b'Q', b"select 1\0")));
        assert!(is_stub(&msg(b'd', b"")));
        assert!(!is_stub(&msg(b'd', b"x")));
        assert!(!is_stub(&msg(b'E', b"")));
        let mut batch = msg(b'P', b"\0select 1\0\0\0");
        assert!(!holds_stub(&batch));
        batch.extend(msg(b'B', b"\0\0"));
        assert!(holds_stub(&batch));
    }
}
