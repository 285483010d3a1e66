//! The untagged packets a client may open a connection with: StartupMessage, SSLRequest,
//! GSSENCRequest and CancelRequest.

use super::read_cstr;
use bytes::{BufMut, BytesMut};

/// Protocol 3.0.
pub(crate) const PROTOCOL_3_0: i32 = 196_608;
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;

/// A decoded startup-phase packet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StartupPacket {
    /// StartupMessage: protocol minor version and parameters in order.
    Startup { minor: u16, params: Vec<(String, String)> },
    /// SSLRequest.
    Ssl,
    /// GSSENCRequest.
    GssEnc,
    /// CancelRequest with the pid and secret key the client was given.
    Cancel { pid: i32, key: Vec<u8> },
}

/// Why a startup packet is refused; each maps to an 08P01 (or 0A000 for old protocols),
/// except `BadLength`, which PostgreSQL only logs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StartupError {
    /// Length field impossible or above the maximum, or a CancelRequest of a length no key
    /// has.
    BadLength(i32),
    /// A protocol major version we do not speak (e.g. 2.0).
    UnsupportedProtocol(i32),
    /// Parameters not NUL-terminated pairs, or not UTF-8.
    Malformed(&'static str),
}

/// Maximum startup packet length PostgreSQL accepts (10000 bytes).
pub(crate) const MAX_STARTUP_LEN: usize = 10_000;

/// `Ok(Some((packet, consumed)))`, `Ok(None)` when more bytes are needed, or an error.
pub(crate) fn parse_startup(buf: &[u8]) -> Result<Option<(StartupPacket, usize)>, StartupError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if !(8..=MAX_STARTUP_LEN as i32).contains(&len) {
        return Err(StartupError::BadLength(len));
    }
    let len = len as usize;
    if buf.len() < len {
        return Ok(None);
    }
    let code = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let body = &buf[8..len];
    let packet = match code {
        // As PostgreSQL: the request code alone counts, whatever follows it.
        SSL_REQUEST => StartupPacket::Ssl,
        GSSENC_REQUEST => StartupPacket::GssEnc,
        CANCEL_REQUEST if body.len() >= 4 && body.len() <= 256 => StartupPacket::Cancel {
            pid: i32::from_be_bytes([body[0], body[1], body[2], body[3]]),
            key: body[4..].to_vec(),
        },
        CANCEL_REQUEST => return Err(StartupError::BadLength(len as i32)),
        c if (c >> 16) == 3 => StartupPacket::Startup { minor: (c & 0xffff) as u16, params: parse_params(body)? },
        c => return Err(StartupError::UnsupportedProtocol(c)),
    };
    Ok(Some((packet, len)))
}

/// PostgreSQL's one complaint about the parameters of a startup packet.
const BAD_LAYOUT: StartupError =
    StartupError::Malformed("invalid startup packet layout: expected terminator as last byte");

fn parse_params(mut body: &[u8]) -> Result<Vec<(String, String)>, StartupError> {
    let mut params = Vec::new();
    loop {
        match body {
            [0] => return Ok(params),
            [] => return Err(BAD_LAYOUT),
            _ => {}
        }
        let (k, rest) = read_cstr(body).ok_or(BAD_LAYOUT)?;
        let (v, rest) = read_cstr(rest).ok_or(BAD_LAYOUT)?;
        let k = std::str::from_utf8(k).map_err(|_| StartupError::Malformed("startup parameter not UTF-8"))?;
        let v = std::str::from_utf8(v).map_err(|_| StartupError::Malformed("startup parameter not UTF-8"))?;
        if params.len() >= 64 {
            return Err(StartupError::Malformed("too many startup parameters"));
        }
        params.push((k.to_owned(), v.to_owned()));
        body = rest;
    }
}

/// Builds a StartupMessage (3.0) for a server connection.
pub(crate) fn startup_message(buf: &mut BytesMut, params: &[(&str, &str)]) {
    let start = buf.len();
    buf.put_i32(0);
    buf.put_i32(PROTOCOL_3_0);
    for (k, v) in params {
        super::put_cstr(buf, k.as_bytes());
        super::put_cstr(buf, v.as_bytes());
    }
    buf.put_u8(0);
    let len = (buf.len() - start) as i32;
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// PostgreSQL's ALPN protocol name (17 on; required on a direct TLS connection).
pub(crate) const ALPN: &[u8] = b"postgresql";

/// An SSLRequest.
pub(crate) const SSL_REQUEST_BYTES: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Builds a CancelRequest.
pub(crate) fn cancel_request(pid: i32, key: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(12 + key.len());
    buf.put_i32(12 + key.len() as i32 - 4);
    buf.put_i32(CANCEL_REQUEST);
    buf.put_i32(pid);
    buf.put_slice(key);
    let len = buf.len() as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ssl_request_bytes_parse_as_one() {
        assert_eq!(parse_startup(&SSL_REQUEST_BYTES).unwrap(), Some((StartupPacket::Ssl, 8)));
    }

    #[test]
    fn startup_round_trip() {
        let mut b = BytesMut::new();
        startup_message(&mut b, &[("user", "bob"), ("database", "db")]);
        let (p, n) = parse_startup(&b).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(
            p,
            StartupPacket::Startup {
                minor: 0,
                params: vec![("user".into(), "bob".into()), ("database".into(), "db".into())]
            }
        );
        assert_eq!(parse_startup(&b[..b.len() - 1]), Ok(None));
    }

    #[test]
    fn special_packets() {
        assert_eq!(parse_startup(&[0, 0, 0, 8, 4, 210, 22, 47]).unwrap().unwrap().0, StartupPacket::Ssl);
        let c = cancel_request(42, &[1, 2, 3, 4]);
        assert_eq!(parse_startup(&c).unwrap().unwrap().0, StartupPacket::Cancel { pid: 42, key: vec![1, 2, 3, 4] });
        assert_eq!(parse_startup(&[0, 0, 0, 8, 0, 2, 0, 0]), Err(StartupError::UnsupportedProtocol(131072)));
        assert_eq!(parse_startup(&[0xff, 0, 0, 8]), Err(StartupError::BadLength(-16777208)));
        assert_eq!(parse_startup(&[0, 1, 0, 0]), Err(StartupError::BadLength(65536)));
        // What follows a request code does not matter (PostgreSQL reads the code alone),
        // but a CancelRequest of a length no key has is a bad length.
        assert_eq!(
            parse_startup(&[0, 0, 0, 12, 4, 210, 22, 47, 0, 0, 0, 0]).unwrap().unwrap(),
            (StartupPacket::Ssl, 12)
        );
        assert_eq!(parse_startup(&[0, 0, 0, 8, 4, 210, 22, 46]), Err(StartupError::BadLength(8)));
        let mut b = BytesMut::new();
        b.put_i32(13);
        b.put_i32(PROTOCOL_3_0);
        b.put_slice(b"user\0");
        assert_eq!(parse_startup(&b), Err(BAD_LAYOUT), "a name without a value");
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = parse_startup(&bytes);
        }
    }
}
