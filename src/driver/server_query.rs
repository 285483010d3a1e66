//! The pooler's own queries on a server connection it holds (simple protocol, outside any
//! client's session): settings checks and resets (`run_internal`, `run_checked`), the empty
//! Query whose exact answer confirms a settled connection idle (`confirm_idle`), and rows
//! read as text (`query_rows`, for auth_query). Each drops the server's unnamed statement.
//!
//! Owns: reading those answers. Must not be used on a connection a client's session has
//! requests outstanding on.

use super::server_conn::{ServerConn, read_frame};
use crate::protocol::{backend, body, frontend, tags};
use crate::state::TxStatus;
use crate::state::settings::tracked_name;
use bytes::BytesMut;
use std::time::Duration;

impl ServerConn {
    /// Runs `sql` with the simple protocol and waits for ReadyForQuery, dropping all replies.
    /// True when it succeeded and left the server idle outside a transaction.
    pub(crate) async fn run_internal(&mut self, sql: &str, timeout: Duration) -> bool {
        self.run_checked(sql, timeout).await.is_ok() && self.state.tx_status == TxStatus::Idle
    }

    /// Runs `sql` (simple protocol); Err with the first ErrorResponse frame (None: the
    /// connection failed). ParameterStatus updates the tracked settings.
    pub(crate) async fn run_checked(&mut self, sql: &str, timeout: Duration) -> Result<(), Option<Vec<u8>>> {
        // A simple Query drops the server's unnamed statement: whichever client parsed it
        // there last must parse it again before using it (`ServerStmts::unnamed_owner`).
        self.state.stmts.unnamed_owner = None;
        let fut = async {
            let mut out = BytesMut::new();
            frontend::query(&mut out, sql);
            self.stream.write_all(&out).await.map_err(|_| None)?;
            let mut err = None;
            loop {
                let f = read_frame(&mut self.stream, &mut self.rbuf).await.map_err(|_| None)?;
                match f[0] {
                    tags::ERROR_RESPONSE if err.is_none() => err = Some(f.to_vec()),
                    tags::PARAMETER_STATUS => {
                        if let Some((k, v)) = backend::parameter_status_fields(body(&f))
                            && let Some(name) = tracked_name(k)
                        {
                            self.state.settings.set_reported(name, v);
                        }
                    }
                    tags::READY_FOR_QUERY => {
                        self.state.tx_status = TxStatus::from_byte(f.get(5).copied().unwrap_or(b'E'));
                        return match err {
                            Some(e) => Err(Some(e)),
                            None => Ok(()),
                        };
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.unwrap_or(Err(None))
    }

    /// After parsnip settled the connection itself (`Proxy::bring_to_idle`): an empty
    /// Query whose answer must be exactly EmptyQueryResponse then ReadyForQuery (a
    /// ParameterStatus or notice may come between; the transaction status is taken from
    /// it). Anything else first — a stray ReadyForQuery, say: PostgreSQL sends one of its
    /// own when a statement timeout set by the client that left fires while the backend
    /// waits inside an unsynced batch and parsnip's CopyFail is the next message — means
    /// replies are still on their way that nobody counted, and the connection must not be
    /// reused.
    pub(crate) async fn confirm_idle(&mut self, timeout: Duration) -> bool {
        // A simple Query drops the server's unnamed statement: whichever client parsed it
        // there last must parse it again before using it (`ServerStmts::unnamed_owner`).
        self.state.stmts.unnamed_owner = None;
        let fut = async {
            let mut out = BytesMut::new();
            frontend::query(&mut out, "");
            self.stream.write_all(&out).await.ok()?;
            let mut check = IdleCheck::default();
            loop {
                let f = read_frame(&mut self.stream, &mut self.rbuf).await.ok()?;
                if let Some(ok) = check.feed(f[0]) {
                    if ok {
                        self.state.tx_status = TxStatus::from_byte(f.get(5).copied().unwrap_or(b'E'));
                    }
                    return Some(ok);
                }
            }
        };
        let ok = tokio::time::timeout(timeout, fut).await.ok().flatten().unwrap_or(false);
        ok && self.rbuf.is_empty()
    }

    /// Runs `sql` (simple protocol) and returns its rows as text; Err with the server's
    /// message on error. Used for auth_query.
    pub(crate) async fn query_rows(
        &mut self,
        sql: &str,
        timeout: Duration,
    ) -> Result<Vec<Vec<Option<String>>>, String> {
        // A simple Query drops the server's unnamed statement: whichever client parsed it
        // there last must parse it again before using it (`ServerStmts::unnamed_owner`).
        self.state.stmts.unnamed_owner = None;
        let fut = async {
            let mut out = BytesMut::new();
            frontend::query(&mut out, sql);
            self.stream.write_all(&out).await.map_err(|e| e.to_string())?;
            let mut rows = Vec::new();
            let mut err = None;
            loop {
                let f = read_frame(&mut self.stream, &mut self.rbuf).await.map_err(|e| e.to_string())?;
                match f[0] {
                    tags::DATA_ROW => rows.push(data_row_text(body(&f)).ok_or("malformed DataRow")?),
                    tags::ERROR_RESPONSE => {
                        err = Some(
                            backend::error_field(body(&f), b'M')
                                .map(|m| String::from_utf8_lossy(m).into_owned())
                                .unwrap_or_default(),
                        )
                    }
                    tags::READY_FOR_QUERY => {
                        self.state.tx_status = TxStatus::from_byte(f.get(5).copied().unwrap_or(b'E'));
                        return match err {
                            Some(e) => Err(e),
                            None => Ok(rows),
                        };
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| "timeout".to_string())?
    }
}

fn data_row_text(b: &[u8]) -> Option<Vec<Option<String>>> {
    let n = i16::from_be_bytes(b.get(..2)?.try_into().ok()?);
    let mut rest = &b[2..];
    let mut out = Vec::new();
    for _ in 0..n {
        let len = backend::read_i32(rest)?;
        rest = &rest[4..];
        if len < 0 {
            out.push(None);
        } else {
            let v = rest.get(..len as usize)?;
            out.push(Some(String::from_utf8_lossy(v).into_owned()));
            rest = &rest[len as usize..];
        }
    }
    Some(out)
}

/// The answer `ServerConn::confirm_idle` accepts to its empty Query, frame by frame:
/// EmptyQueryResponse then ReadyForQuery, with ParameterStatus or notices between.
#[derive(Default)]
struct IdleCheck {
    empty: bool,
}

impl IdleCheck {
    /// The next frame's tag: None while the answer may still be right, then whether it was.
    fn feed(&mut self, tag: u8) -> Option<bool> {
        match tag {
            tags::PARAMETER_STATUS | tags::NOTICE_RESPONSE => None,
            tags::EMPTY_QUERY_RESPONSE if !self.empty => {
                self.empty = true;
                None
            }
            tags::READY_FOR_QUERY if self.empty => Some(true),
            _ => Some(false),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_empty_querys_own_answer_confirms_a_settled_connection() {
        let run = |tags: &[u8]| {
            let mut c = super::IdleCheck::default();
            tags.iter().find_map(|&t| c.feed(t))
        };
        assert_eq!(run(b"IZ"), Some(true));
        assert_eq!(run(b"SINZ"), Some(true), "a ParameterStatus or notice may come between");
        // A ReadyForQuery nobody counted, before the empty query's own answer.
        assert_eq!(run(b"ZIZ"), Some(false));
        assert_eq!(run(b"EZ"), Some(false));
        assert_eq!(run(b"CZ"), Some(false));
        assert_eq!(run(b"IIZ"), Some(false));
        assert_eq!(run(b"I"), None, "still waiting");
    }
}
