//! Messages a client sends: readers for the ones the pooler inspects, and builders for the
//! ones it sends to servers on its own behalf.

use super::{put_cstr, read_cstr, tags, write_msg};
use bytes::{BufMut, BytesMut};

/// Query.
pub fn query(buf: &mut BytesMut, sql: &str) {
    write_msg(buf, tags::QUERY, |b| put_cstr(b, sql.as_bytes()));
}
/// PasswordMessage (also used for SASL responses, which carry no NUL).
pub(crate) fn password(buf: &mut BytesMut, data: &[u8], nul: bool) {
    write_msg(buf, tags::PASSWORD, |b| {
        b.put_slice(data);
        if nul {
            b.put_u8(0);
        }
    });
}
/// SASLInitialResponse.
pub(crate) fn sasl_initial_response(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    write_msg(buf, tags::PASSWORD, |b| {
        put_cstr(b, mechanism.as_bytes());
        b.put_i32(data.len() as i32);
        b.put_slice(data);
    });
}
/// Query with SQL given as bytes.
pub(crate) fn query_bytes(buf: &mut BytesMut, sql: &[u8]) {
    write_msg(buf, tags::QUERY, |b| put_cstr(b, sql));
}
/// Parse of `query` as statement `name`, with parameter type OIDs `types` (4 bytes each,
/// as they stand in a client's Parse).
pub fn parse(buf: &mut BytesMut, name: &[u8], query: &[u8], types: &[u8]) {
    write_msg(buf, tags::PARSE, |b| {
        put_cstr(b, name);
        put_cstr(b, query);
        b.put_i16((types.len() / 4) as i16);
        b.put_slice(types);
    });
}
/// Bind of `portal` to `statement`, with the rest of the message (parameter formats and
/// values, result formats) copied from a client's Bind.
pub fn bind_with_tail(buf: &mut BytesMut, portal: &[u8], statement: &[u8], tail: &[u8]) {
    write_msg(buf, tags::BIND, |b| {
        put_cstr(b, portal);
        put_cstr(b, statement);
        b.put_slice(tail);
    });
}
/// Bind of `portal` to a `statement` without parameters, results in text.
pub(crate) fn bind_no_params(buf: &mut BytesMut, portal: &[u8], statement: &[u8]) {
    bind_with_tail(buf, portal, statement, &[0, 0, 0, 0, 0, 0]);
}
/// Describe of a prepared statement.
pub(crate) fn describe_statement(buf: &mut BytesMut, name: &[u8]) {
    write_msg(buf, tags::DESCRIBE, |b| {
        b.put_u8(b'S');
        put_cstr(b, name);
    });
}
/// Describe of a portal.
pub(crate) fn describe_portal(buf: &mut BytesMut, name: &[u8]) {
    write_msg(buf, tags::DESCRIBE, |b| {
        b.put_u8(b'P');
        put_cstr(b, name);
    });
}
/// Bind of `statement` to `portal` with the `n` parameter values `values` yields, in text
/// format; results in text.
pub(crate) fn bind_text_with<'a>(
    buf: &mut BytesMut,
    portal: &[u8],
    statement: &[u8],
    n: usize,
    values: impl Iterator<Item = &'a [u8]>,
) {
    write_msg(buf, tags::BIND, |b| {
        put_cstr(b, portal);
        put_cstr(b, statement);
        b.put_i16(0);
        b.put_i16(n as i16);
        for v in values {
            b.put_i32(v.len() as i32);
            b.put_slice(v);
        }
        b.put_i16(0);
    });
}
/// Execute of `portal`, all rows.
pub fn execute(buf: &mut BytesMut, portal: &[u8]) {
    write_msg(buf, tags::EXECUTE, |b| {
        put_cstr(b, portal);
        b.put_i32(0);
    });
}
/// Close of a prepared statement.
pub(crate) fn close_statement(buf: &mut BytesMut, name: &[u8]) {
    write_msg(buf, tags::CLOSE, |b| {
        b.put_u8(b'S');
        put_cstr(b, name);
    });
}
/// Close of a portal.
pub(crate) fn close_portal(buf: &mut BytesMut, name: &[u8]) {
    write_msg(buf, tags::CLOSE, |b| {
        b.put_u8(b'P');
        put_cstr(b, name);
    });
}
/// Flush.
pub(crate) fn flush(buf: &mut BytesMut) {
    write_msg(buf, tags::FLUSH, |_| {});
}
/// Sync.
pub fn sync(buf: &mut BytesMut) {
    write_msg(buf, tags::SYNC, |_| {});
}
/// CopyFail with `message` (PostgreSQL ignores it outside COPY FROM STDIN).
pub(crate) fn copy_fail(buf: &mut BytesMut, message: &str) {
    write_msg(buf, tags::COPY_FAIL, |b| put_cstr(b, message.as_bytes()));
}
/// Terminate.
pub(crate) fn terminate(buf: &mut BytesMut) {
    write_msg(buf, tags::TERMINATE, |_| {});
}

/// Whether the whole frames at the start of `buf` (what a client sent after a Parse) end
/// its extended-protocol batch with a Sync: only Parse, Bind, Describe, Execute and Close
/// come before it. False at a Flush, at any other message, and where the frames read so
/// far run out before a Sync.
pub fn syncs_before_flush(mut buf: &[u8]) -> bool {
    while let Ok(Some(n)) = super::split_frame(buf, usize::MAX) {
        match buf[0] {
            tags::SYNC => return true,
            tags::PARSE | tags::BIND | tags::DESCRIBE | tags::EXECUTE | tags::CLOSE => buf = &buf[n..],
            _ => return false,
        }
    }
    false
}

/// SQL text of a Query body (without the NUL).
pub fn query_text(body: &[u8]) -> Option<&[u8]> {
    read_cstr(body).map(|(q, _)| q)
}

/// The fields of a Parse body the pooler uses.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseFields<'a> {
    /// Statement name ("" = unnamed).
    pub(crate) name: &'a [u8],
    /// SQL text.
    pub(crate) query: &'a [u8],
    /// Parameter type OIDs, raw (count * 4 bytes).
    pub param_types: &'a [u8],
}

/// Reads a Parse body.
pub fn parse_fields(body: &[u8]) -> Option<ParseFields<'_>> {
    let (name, rest) = read_cstr(body)?;
    let (query, rest) = read_cstr(rest)?;
    let n = i16::from_be_bytes(rest.get(..2)?.try_into().ok()?);
    let types = rest.get(2..)?;
    if n < 0 || types.len() != n as usize * 4 {
        return None;
    }
    Some(ParseFields { name, query, param_types: types })
}

/// Portal and statement names of a Bind body, and the offset where the rest starts.
pub fn bind_names(body: &[u8]) -> Option<(&[u8], &[u8], usize)> {
    let (portal, rest) = read_cstr(body)?;
    let (stmt, rest) = read_cstr(rest)?;
    Some((portal, stmt, body.len() - rest.len()))
}

/// Parameter `i` (0-based) of a Bind body whose parameter format codes start at `at`
/// (`bind_names`' offset): Some(None) for a NULL, None when there is no such parameter or
/// the body is malformed.
pub(crate) fn bind_param(body: &[u8], at: usize, i: usize) -> Option<Option<&[u8]>> {
    let u16_at = |p: usize| body.get(p..p + 2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize);
    let mut p = at + 2 + 2 * u16_at(at)?;
    let n = u16_at(p)?;
    p += 2;
    if i >= n {
        return None;
    }
    for k in 0..=i {
        let len = i32::from_be_bytes(body.get(p..p + 4)?.try_into().ok()?);
        p += 4;
        if len < 0 {
            if k == i {
                return Some(None);
            }
            continue;
        }
        let v = body.get(p..p + len as usize)?;
        if k == i {
            return Some(Some(v));
        }
        p += len as usize;
    }
    None
}

/// Kind byte (`S` or `P`) and name of a Describe or Close body.
pub(crate) fn describe_or_close(body: &[u8]) -> Option<(u8, &[u8])> {
    let (&kind, rest) = body.split_first()?;
    let (name, tail) = read_cstr(rest)?;
    if !tail.is_empty() || (kind != b'S' && kind != b'P') {
        return None;
    }
    Some((kind, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_synced_ahead_only_up_to_its_first_flush() {
        let mut batch = BytesMut::new();
        bind_no_params(&mut batch, b"", b"");
        describe_portal(&mut batch, b"");
        execute(&mut batch, b"");
        let mut synced = batch.clone();
        sync(&mut synced);
        assert!(syncs_before_flush(&synced));
        assert!(!syncs_before_flush(&batch), "no Sync read yet");
        assert!(!syncs_before_flush(&synced[..synced.len() - 1]), "the Sync not whole yet");
        // pg-cursor: Execute with a row limit, then Flush; the Sync comes later.
        let mut cursor = batch.clone();
        flush(&mut cursor);
        sync(&mut cursor);
        assert!(!syncs_before_flush(&cursor));
        let mut query_first = BytesMut::new();
        query(&mut query_first, "SELECT 1");
        sync(&mut query_first);
        assert!(!syncs_before_flush(&query_first), "a Query is no part of the batch");
        assert!(!syncs_before_flush(b"B\0\0\0\x03S\0\0\0\x04"), "an impossible length");
        assert!(!syncs_before_flush(b""));
    }

    #[test]
    fn parse_reader() {
        let mut b = BytesMut::new();
        write_msg(&mut b, tags::PARSE, |b| {
            put_cstr(b, b"s1");
            put_cstr(b, b"select $1");
            b.put_i16(1);
            b.put_i32(23);
        });
        let p = parse_fields(&b[5..]).unwrap();
        assert_eq!(p.name, b"s1");
        assert_eq!(p.query, b"select $1");
        assert_eq!(p.param_types, &[0, 0, 0, 23]);
        assert!(parse_fields(&b[5..b.len() - 1]).is_none());
        assert_eq!(describe_or_close(b"Sabc\0"), Some((b'S', &b"abc"[..])));
        assert_eq!(describe_or_close(b"Xabc\0"), None);
    }

    #[test]
    fn bind_param_reader() {
        let mut b = BytesMut::new();
        let values: [&[u8]; 3] = [b"work_mem", b"", b"8MB"];
        bind_text_with(&mut b, b"p", b"s", values.len(), values.into_iter());
        let (_, _, at) = bind_names(&b[5..]).unwrap();
        assert_eq!(bind_param(&b[5..], at, 0), Some(Some(&b"work_mem"[..])));
        assert_eq!(bind_param(&b[5..], at, 1), Some(Some(&b""[..])));
        assert_eq!(bind_param(&b[5..], at, 2), Some(Some(&b"8MB"[..])));
        assert_eq!(bind_param(&b[5..], at, 3), None);
        assert_eq!(bind_param(&b[5..b.len() - 4], at, 2), None);
        let mut n = BytesMut::new();
        write_msg(&mut n, tags::BIND, |b| {
            put_cstr(b, b"");
            put_cstr(b, b"");
            b.put_i16(1);
            b.put_i16(1);
            b.put_i16(2);
            b.put_i32(-1);
            b.put_i32(2);
            b.put_slice(b"ab");
            b.put_i16(0);
        });
        let (_, _, at) = bind_names(&n[5..]).unwrap();
        assert_eq!(bind_param(&n[5..], at, 0), Some(None));
        assert_eq!(bind_param(&n[5..], at, 1), Some(Some(&b"ab"[..])));
    }
}
