//! Trace-level wire log of one session (`RUST_LOG=parsnip::session::wire_trace=trace`):
//! every frame the client sent, what the session wrote to the server and to the client
//! for it, and every server frame, one line each with the session's id. A debugging aid
//! for driver interleavings; costs one level check per frame when off.

use crate::protocol::{backend, body, frontend, split_frame, tags};

/// Whether frames are being traced (checked once per handled frame).
pub(super) fn on() -> bool {
    tracing::enabled!(target: "parsnip::session::wire_trace", tracing::Level::TRACE)
}

/// Logs the whole frames in `bytes` (a slice of an output buffer or one input frame).
/// `client_side`: the bytes are client messages (to or from the client's side of the protocol).
pub(super) fn frames(uid: u64, dir: &'static str, client_side: bool, bytes: &[u8]) {
    let mut at = 0;
    while let Ok(Some(n)) = split_frame(&bytes[at..], u32::MAX as usize) {
        let f = &bytes[at..at + n];
        tracing::trace!(target: "parsnip::session::wire_trace", session = uid, "{dir} {}", summary(f, client_side));
        at += n;
    }
}

/// The frame's tag and, for the messages a cache bug hides in, its names and text.
fn summary(f: &[u8], client_side: bool) -> String {
    let tag = f[0] as char;
    let b = body(f);
    let cstrs = |k: usize| -> String {
        b.split(|&c| c == 0)
            .take(k)
            .map(|s| {
                let s = String::from_utf8_lossy(s);
                if s.len() > 60 { format!("{:?}…", &s[..s.floor_char_boundary(60)]) } else { format!("{s:?}") }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if client_side {
        return match f[0] {
            tags::PARSE | tags::BIND => format!("{tag} {}", cstrs(2)),
            tags::QUERY => format!("{tag} {}", cstrs(1)),
            tags::DESCRIBE | tags::CLOSE => match frontend::describe_or_close(b) {
                Some((kind, name)) => format!("{tag} {} {:?}", kind as char, String::from_utf8_lossy(name)),
                None => tag.to_string(),
            },
            _ => tag.to_string(),
        };
    }
    match f[0] {
        tags::ERROR_RESPONSE => {
            let field = |code| String::from_utf8_lossy(backend::error_field(b, code).unwrap_or_default()).into_owned();
            format!("{tag} {} {}", field(b'C'), field(b'M'))
        }
        tags::READY_FOR_QUERY if !b.is_empty() => format!("{tag} {}", b[0] as char),
        _ => tag.to_string(),
    }
}
