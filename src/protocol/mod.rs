//! The PostgreSQL v3 wire protocol, with no IO: splitting a byte stream into frames,
//! reading the few fields the pooler inspects, and building the messages it synthesizes.
//!
//! `frontend` means messages a client sends, `backend` messages a server sends. Frames are
//! never copied to be inspected: readers take `&[u8]` of one whole frame. Lengths are
//! checked against a caller-given maximum before anything is buffered for them.
//! This module must not know about sessions, pools or sockets.

pub mod backend;
pub mod frame;
pub mod frontend;
pub mod startup;

pub use frame::{FrameError, put_cstr, split_frame, write_msg};

/// Message tags (first byte of a frame), named as in PostgreSQL's protocol docs.
pub mod tags {
    // Frontend.
    pub const QUERY: u8 = b'Q';
    pub const PARSE: u8 = b'P';
    pub const BIND: u8 = b'B';
    pub const DESCRIBE: u8 = b'D';
    pub const EXECUTE: u8 = b'E';
    pub const CLOSE: u8 = b'C';
    pub const SYNC: u8 = b'S';
    pub const FLUSH: u8 = b'H';
    pub const FUNCTION_CALL: u8 = b'F';
    pub const TERMINATE: u8 = b'X';
    pub const PASSWORD: u8 = b'p';
    // Both directions.
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    // Backend.
    pub const AUTHENTICATION: u8 = b'R';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    pub const PARSE_COMPLETE: u8 = b'1';
    pub const BIND_COMPLETE: u8 = b'2';
    pub const CLOSE_COMPLETE: u8 = b'3';
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    pub const ROW_DESCRIPTION: u8 = b'T';
    pub const NO_DATA: u8 = b'n';
    pub const DATA_ROW: u8 = b'D';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const PORTAL_SUSPENDED: u8 = b's';
    pub const COPY_IN_RESPONSE: u8 = b'G';
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const FUNCTION_CALL_RESPONSE: u8 = b'V';
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
}

/// Reads a NUL-terminated string at the start of `buf`: (string, rest after the NUL).
pub fn read_cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = buf.iter().position(|&b| b == 0)?;
    Some((&buf[..nul], &buf[nul + 1..]))
}

/// Body of a whole frame (after tag and length).
#[inline]
pub fn body(frame: &[u8]) -> &[u8] {
    &frame[5..]
}
