//! The `tag + u32 length + body` frame: splitting a byte stream into frames, and writing one.

use bytes::{BufMut, BytesMut};
use std::fmt;

/// Why a frame header is unacceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Length field below 4 (it counts itself).
    BadLength(i32),
    /// Length above the configured maximum.
    TooLarge(usize),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadLength(n) => write!(f, "invalid message length {n}"),
            FrameError::TooLarge(n) => {
                write!(f, "message of {n} bytes exceeds the maximum message size")
            }
        }
    }
}

/// The tags of the whole frames in `buf`, as a string ("TDCZ"): what tests assert on.
#[cfg(test)]
pub(crate) fn tags_of(buf: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = buf;
    while let Ok(Some(n)) = split_frame(rest, usize::MAX) {
        out.push(rest[0] as char);
        rest = &rest[n..];
    }
    out
}

/// Looks at the start of `buf`: `Ok(Some(total_len))` when a whole frame (tag included) is
/// there, `Ok(None)` when more bytes are needed, `Err` when the header is impossible.
/// The length is checked before the caller buffers the body.
#[inline]
pub fn split_frame(buf: &[u8], max_len: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(FrameError::BadLength(len));
    }
    let total = len as usize + 1;
    if total > max_len {
        return Err(FrameError::TooLarge(total));
    }
    if buf.len() < total { Ok(None) } else { Ok(Some(total)) }
}

/// Bytes still missing for the frame that starts `buf` (0 if unknown or complete).
pub(crate) fn missing(buf: &[u8]) -> usize {
    if buf.len() < 5 {
        return 5 - buf.len();
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]).max(4) as usize + 1;
    len.saturating_sub(buf.len())
}

/// Writes `tag`, a length placeholder, the body written by `f`, then fixes the length.
#[inline]
pub fn write_msg(buf: &mut BytesMut, tag: u8, f: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_i32(0);
    f(buf);
    let len = (buf.len() - at) as i32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Writes a NUL-terminated string.
#[inline]
pub fn put_cstr(buf: &mut BytesMut, s: &[u8]) {
    buf.put_slice(s);
    buf.put_u8(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn whole_partial_and_bad() {
        assert_eq!(split_frame(b"S\0\0\0\x04", 100), Ok(Some(5)));
        assert_eq!(split_frame(b"S\0\0\0", 100), Ok(None));
        assert_eq!(split_frame(b"Q\0\0\0\x09SEL", 100), Ok(None));
        assert_eq!(split_frame(b"Q\0\0\0\x03", 100), Err(FrameError::BadLength(3)));
        assert_eq!(split_frame(b"Q\xff\xff\xff\xff", 100), Err(FrameError::BadLength(-1)));
        assert_eq!(split_frame(b"Q\0\0\x10\0", 100), Err(FrameError::TooLarge(4097)));
    }

    proptest! {
        #[test]
        fn never_panics_and_bounds_hold(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 5usize..100) {
            match split_frame(&bytes, max) {
                Ok(Some(n)) => prop_assert!(n >= 5 && n <= bytes.len() && n <= max),
                Ok(None) => prop_assert!(missing(&bytes) > 0),
                Err(_) => {}
            }
        }
    }
}
