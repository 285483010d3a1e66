//! A server's error as the client would have had it from its own text: a statement name
//! the pooler renamed put back, and an error position mapped back through a rename or
//! through autoprepare's lifted literals (the literal quoted where PostgreSQL would quote
//! it, not its placeholder).
//!
//! Owns: rewording ErrorResponse frames. Must not decide which errors reach the client.

use crate::protocol::backend;

/// How the text sent to the server differs from the client's.
#[derive(Clone, Debug)]
pub(crate) struct Rename {
    /// The server-side statement name used.
    pub(crate) server_name: Box<str>,
    /// The name as PostgreSQL would print it for the client.
    pub(crate) client_name: Box<str>,
    /// 1-based character position in the server text from which positions are shifted.
    pub(crate) from: i64,
    /// Client position = server position + shift, for positions at or after `from`.
    pub(crate) shift: i64,
}

impl Rename {
    /// The ErrorResponse `frame` as the client would have received it.
    pub(crate) fn rewrite_error(&self, frame: &[u8], out: &mut bytes::BytesMut) {
        use std::borrow::Cow;
        let body = frame.get(5..).unwrap_or_default();
        let fields = backend::error_fields(body).map(|(t, v)| {
            let text = String::from_utf8_lossy(v);
            let value = match t {
                b'M' | b'D' | b'H' => {
                    let quoted = format!("\"{}\"", self.server_name);
                    Cow::Owned(text.replace(&quoted, &format!("\"{}\"", self.client_name)).into_bytes())
                }
                b'P' => match text.parse::<i64>() {
                    Ok(p) if p >= self.from => Cow::Owned((p + self.shift).max(1).to_string().into_bytes()),
                    _ => Cow::Borrowed(v),
                },
                _ => Cow::Borrowed(v),
            };
            (t, value)
        });
        backend::error_response_fields(out, fields);
    }
}

pub(crate) use crate::stmt::lift::client_position;

/// The ErrorResponse `frame` of an autoprepared Query as its own text would have had it:
/// the position mapped back through the lift's edits, and a lifted literal's placeholder
/// quoted at that position replaced by the literal (`crate::stmt::lift::Origin`).
pub(crate) fn map_error_position(frame: &[u8], origin: &crate::stmt::lift::Origin, out: &mut bytes::BytesMut) {
    use std::borrow::Cow;
    let body = frame.get(5..).unwrap_or_default();
    let pos = backend::error_field(body, b'P').and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
    let fields = backend::error_fields(body).map(|(t, v)| {
        let value = match (t, pos) {
            (b'P', Some(p)) => Cow::Owned(origin.client_position(p).to_string().into_bytes()),
            (b'M' | b'D' | b'H', Some(p)) => origin.client_text(p, v),
            _ => Cow::Borrowed(v),
        };
        (t, value)
    });
    backend::error_response_fields(out, fields);
}
