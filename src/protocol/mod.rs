//! The PostgreSQL v3 wire protocol, with no IO: splitting a byte stream into frames,
//! reading the few fields the pooler inspects, and building the messages it synthesizes.
//!
//! `frontend` means messages a client sends, `backend` messages a server sends. Frames are
//! never copied to be inspected: readers take `&[u8]` of one whole frame. Lengths are
//! checked against a caller-given maximum before anything is buffered for them.
//! This module must not know about sessions, pools or sockets.

pub mod backend;
pub(crate) mod frame;
pub mod frontend;
pub(crate) mod startup;

#[cfg(test)]
pub(crate) use frame::tags_of;
pub use frame::{FrameError, put_cstr, split_frame, write_msg};

/// Message tags (first byte of a frame), named as in PostgreSQL's protocol docs.
pub(crate) mod tags {
    // Frontend.
    pub(crate) const QUERY: u8 = b'Q';
    pub(crate) const PARSE: u8 = b'P';
    pub(crate) const BIND: u8 = b'B';
    pub(crate) const DESCRIBE: u8 = b'D';
    pub(crate) const EXECUTE: u8 = b'E';
    pub(crate) const CLOSE: u8 = b'C';
    pub(crate) const SYNC: u8 = b'S';
    pub(crate) const FLUSH: u8 = b'H';
    pub(crate) const FUNCTION_CALL: u8 = b'F';
    pub(crate) const TERMINATE: u8 = b'X';
    pub(crate) const PASSWORD: u8 = b'p';
    // Both directions.
    pub(crate) const COPY_DATA: u8 = b'd';
    pub(crate) const COPY_DONE: u8 = b'c';
    pub(crate) const COPY_FAIL: u8 = b'f';
    // Backend.
    pub(crate) const AUTHENTICATION: u8 = b'R';
    pub(crate) const PARAMETER_STATUS: u8 = b'S';
    pub(crate) const BACKEND_KEY_DATA: u8 = b'K';
    pub(crate) const READY_FOR_QUERY: u8 = b'Z';
    pub(crate) const ERROR_RESPONSE: u8 = b'E';
    pub(crate) const NOTICE_RESPONSE: u8 = b'N';
    pub(crate) const NOTIFICATION_RESPONSE: u8 = b'A';
    pub(crate) const PARSE_COMPLETE: u8 = b'1';
    pub(crate) const BIND_COMPLETE: u8 = b'2';
    pub(crate) const CLOSE_COMPLETE: u8 = b'3';
    pub(crate) const PARAMETER_DESCRIPTION: u8 = b't';
    pub(crate) const ROW_DESCRIPTION: u8 = b'T';
    pub(crate) const NO_DATA: u8 = b'n';
    pub(crate) const DATA_ROW: u8 = b'D';
    pub(crate) const COMMAND_COMPLETE: u8 = b'C';
    pub(crate) const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub(crate) const PORTAL_SUSPENDED: u8 = b's';
    pub(crate) const COPY_IN_RESPONSE: u8 = b'G';
    pub(crate) const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
}

/// Reads a NUL-terminated string at the start of `buf`: (string, rest after the NUL).
pub(crate) fn read_cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    // memchr: a Query's text is read this way several times per message.
    let nul = memchr::memchr(0, buf)?;
    Some((&buf[..nul], &buf[nul + 1..]))
}

/// Body of a whole frame (after tag and length).
#[inline]
pub fn body(frame: &[u8]) -> &[u8] {
    &frame[5..]
}
