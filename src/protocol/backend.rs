//! Messages a server sends: builders for the ones the pooler synthesizes towards clients,
//! and readers for the ones it inspects on server connections.

use super::{put_cstr, read_cstr, tags, write_msg};
use bytes::{BufMut, BytesMut};
use std::borrow::Cow;

/// AuthenticationOk.
pub(crate) fn auth_ok(buf: &mut BytesMut) {
    write_msg(buf, tags::AUTHENTICATION, |b| b.put_i32(0));
}
/// AuthenticationCleartextPassword.
pub(crate) fn auth_cleartext(buf: &mut BytesMut) {
    write_msg(buf, tags::AUTHENTICATION, |b| b.put_i32(3));
}
/// AuthenticationMD5Password.
pub(crate) fn auth_md5(buf: &mut BytesMut, salt: [u8; 4]) {
    write_msg(buf, tags::AUTHENTICATION, |b| {
        b.put_i32(5);
        b.put_slice(&salt);
    });
}
/// AuthenticationSASL with one mechanism.
pub(crate) fn auth_sasl(buf: &mut BytesMut, mechanisms: &[&str]) {
    write_msg(buf, tags::AUTHENTICATION, |b| {
        b.put_i32(10);
        for m in mechanisms {
            put_cstr(b, m.as_bytes());
        }
        b.put_u8(0);
    });
}
/// AuthenticationSASLContinue.
pub(crate) fn auth_sasl_continue(buf: &mut BytesMut, data: &[u8]) {
    write_msg(buf, tags::AUTHENTICATION, |b| {
        b.put_i32(11);
        b.put_slice(data);
    });
}
/// AuthenticationSASLFinal.
pub(crate) fn auth_sasl_final(buf: &mut BytesMut, data: &[u8]) {
    write_msg(buf, tags::AUTHENTICATION, |b| {
        b.put_i32(12);
        b.put_slice(data);
    });
}
/// ParameterStatus.
pub(crate) fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    write_msg(buf, tags::PARAMETER_STATUS, |b| {
        put_cstr(b, name.as_bytes());
        put_cstr(b, value.as_bytes());
    });
}
/// BackendKeyData.
pub(crate) fn backend_key_data(buf: &mut BytesMut, pid: i32, key: i32) {
    write_msg(buf, tags::BACKEND_KEY_DATA, |b| {
        b.put_i32(pid);
        b.put_i32(key);
    });
}
/// ReadyForQuery with a transaction status byte (`I`, `T` or `E`).
pub fn ready_for_query(buf: &mut BytesMut, status: u8) {
    write_msg(buf, tags::READY_FOR_QUERY, |b| b.put_u8(status));
}
/// NegotiateProtocolVersion: newest minor supported and the unrecognized options.
pub(crate) fn negotiate_protocol_version(buf: &mut BytesMut, minor: i32, unknown: &[&str]) {
    write_msg(buf, tags::NEGOTIATE_PROTOCOL_VERSION, |b| {
        b.put_i32(minor);
        b.put_i32(unknown.len() as i32);
        for o in unknown {
            put_cstr(b, o.as_bytes());
        }
    });
}
/// ErrorResponse with an optional routine field.
pub(crate) fn error_response_routine(
    buf: &mut BytesMut,
    severity: &str,
    code: &str,
    message: &str,
    routine: Option<&str>,
) {
    notice_like(buf, tags::ERROR_RESPONSE, severity, code, message, routine);
}
/// ErrorResponse made of `fields` (type byte, value), e.g. a server's error rewritten.
pub(crate) fn error_response_fields<'a>(buf: &mut BytesMut, fields: impl IntoIterator<Item = (u8, Cow<'a, [u8]>)>) {
    write_msg(buf, tags::ERROR_RESPONSE, |b| {
        for (field, value) in fields {
            b.put_u8(field);
            put_cstr(b, &value);
        }
        b.put_u8(0);
    });
}
fn notice_like(buf: &mut BytesMut, tag: u8, severity: &str, code: &str, message: &str, routine: Option<&str>) {
    write_msg(buf, tag, |b| {
        for (field, value) in [(b'S', severity), (b'V', severity), (b'C', code), (b'M', message)] {
            b.put_u8(field);
            put_cstr(b, value.as_bytes());
        }
        if let Some(r) = routine {
            b.put_u8(b'R');
            put_cstr(b, r.as_bytes());
        }
        b.put_u8(0);
    });
}
/// CommandComplete.
pub fn command_complete(buf: &mut BytesMut, tag: &str) {
    write_msg(buf, tags::COMMAND_COMPLETE, |b| put_cstr(b, tag.as_bytes()));
}
/// EmptyQueryResponse.
pub(crate) fn empty_query_response(buf: &mut BytesMut) {
    write_msg(buf, tags::EMPTY_QUERY_RESPONSE, |_| {});
}
/// A body-less message such as ParseComplete, BindComplete, CloseComplete, NoData.
pub fn empty(buf: &mut BytesMut, tag: u8) {
    write_msg(buf, tag, |_| {});
}
/// RowDescription of text-format columns of the given (name, type oid, type length).
pub(crate) fn row_description_typed(buf: &mut BytesMut, columns: &[(&str, u32, i16)]) {
    write_msg(buf, tags::ROW_DESCRIPTION, |b| {
        b.put_i16(columns.len() as i16);
        for (name, oid, len) in columns {
            put_cstr(b, name.as_bytes());
            b.put_i32(0);
            b.put_i16(0);
            b.put_u32(*oid);
            b.put_i16(*len);
            b.put_i32(-1);
            b.put_i16(0);
        }
    });
}
/// DataRow of text values (None is NULL).
pub fn data_row_text(buf: &mut BytesMut, values: &[Option<&str>]) {
    write_msg(buf, tags::DATA_ROW, |b| {
        b.put_i16(values.len() as i16);
        for v in values {
            match v {
                Some(s) => {
                    b.put_i32(s.len() as i32);
                    b.put_slice(s.as_bytes());
                }
                None => b.put_i32(-1),
            }
        }
    });
}

/// Fields of an ErrorResponse or NoticeResponse body: (field type, value).
pub(crate) fn error_fields(body: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut rest = body;
    std::iter::from_fn(move || {
        let (&t, r) = rest.split_first()?;
        if t == 0 {
            return None;
        }
        let (v, r) = read_cstr(r)?;
        rest = r;
        Some((t, v))
    })
}

/// A field of an ErrorResponse body, e.g. `b'C'` for the SQLSTATE.
pub(crate) fn error_field(body: &[u8], field: u8) -> Option<&[u8]> {
    error_fields(body).find(|(t, _)| *t == field).map(|(_, v)| v)
}

/// The severity of an ErrorResponse or NoticeResponse body: the untranslated `V` field,
/// else the localized `S` (servers before 9.6 send only that).
pub(crate) fn error_severity(body: &[u8]) -> Option<&[u8]> {
    error_field(body, b'V').or_else(|| error_field(body, b'S'))
}

/// An ErrorResponse or NoticeResponse body saying the server is going down or this backend
/// was terminated: 57P01 (admin shutdown: a fast or immediate shutdown, or
/// `pg_terminate_backend`) or 57P02 (crash shutdown). The server's other backends are
/// likely ending too.
pub(crate) fn says_going_down(body: &[u8]) -> bool {
    matches!(error_field(body, b'C'), Some(b"57P01" | b"57P02"))
}

/// An ErrorResponse or NoticeResponse body shown for logs: "FATAL 57P01: message" (never
/// raw bytes).
pub(crate) struct ErrorText<'a>(pub(crate) &'a [u8]);

impl std::fmt::Display for ErrorText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let field = |t| String::from_utf8_lossy(error_field(self.0, t).unwrap_or(b"?"));
        let sev = error_severity(self.0).unwrap_or(b"ERROR");
        write!(f, "{} {}: {}", String::from_utf8_lossy(sev), field(b'C'), field(b'M'))
    }
}

/// Name and value of a ParameterStatus body.
pub(crate) fn parameter_status_fields(body: &[u8]) -> Option<(&str, &str)> {
    let (k, rest) = read_cstr(body)?;
    let (v, _) = read_cstr(rest)?;
    Some((std::str::from_utf8(k).ok()?, std::str::from_utf8(v).ok()?))
}

/// Reads an i32 at the start of a slice.
pub(crate) fn read_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_round_trip() {
        let mut b = BytesMut::new();
        error_response_routine(&mut b, "FATAL", "28P01", "password authentication failed for user \"x\"", None);
        assert_eq!(b[0], b'E');
        let body = &b[5..];
        assert_eq!(error_field(body, b'C'), Some(&b"28P01"[..]));
        assert_eq!(error_field(body, b'S'), Some(&b"FATAL"[..]));
        assert_eq!(error_fields(b"Cx").count(), 0);
    }
}
