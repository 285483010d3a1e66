//! When output may reach the client. PostgreSQL sends what it has buffered only at a
//! Sync (with ReadyForQuery), a Flush, the end of a simple Query or function call, and
//! with every ErrorResponse, NoticeResponse and NotificationResponse (which it flushes at
//! once); a pipelining client (libpq's pipeline mode, psycopg's `pipeline()`) learns
//! about an error when it arrives, so an answer that arrives earlier than PostgreSQL would
//! have sent it changes where the client raises it. The pooler answers some requests
//! itself (a Parse of a known statement, a Close) and asks the server to flush to check a
//! statement's shape: output of either kind is held at the end of `to_client` until the
//! client's own Sync or Flush (or an error or notice) lets it go, and the driver writes
//! only what comes before it (`writable_to_client`). A Sync whose batch the server still
//! has to answer lets it go with the server's first answer instead: PostgreSQL would have
//! sent it with its replies to the same batch, in one write, and the client, which reads
//! to the batch's ReadyForQuery, gets one wake-up instead of two.

use super::Session;
use crate::protocol::{split_frame, tags};

impl Session {
    /// How many bytes at the start of `to_client` may be written now; the rest waits for
    /// the client's next Sync or Flush.
    #[inline]
    pub(crate) fn writable_to_client(&self) -> usize {
        self.to_client.len().saturating_sub(self.busy.held)
    }

    /// Drops everything meant for the client (it is gone).
    pub(crate) fn drop_client_output(&mut self) {
        self.to_client.clear();
        self.release_held();
    }

    /// Lets everything held go.
    #[inline]
    pub(super) fn release_held(&mut self) {
        self.busy.held = 0;
        self.busy.held_for_server = false;
    }

    /// After a client frame (`consumed`, with tag `tag`) whose handling found `to_client`
    /// at length `before`.
    #[inline]
    pub(super) fn note_client_output(&mut self, before: usize, tag: u8, consumed: bool) {
        if consumed && matches!(tag, tags::SYNC | tags::FLUSH | tags::QUERY | tags::FUNCTION_CALL) {
            self.busy.replies.client_flushed();
            if tag == tags::SYNC && self.busy.held > 0 && self.busy.replies.iter().any(|p| !p.is_synth()) {
                // Goes with the server's first answer (`note_server_output`).
                self.busy.held_for_server = true;
            } else {
                self.release_held();
            }
        } else if self.to_client.len() > before {
            // The pooler's own answer to a request the client has not flushed yet.
            self.hold_new(before, true);
        }
    }

    /// After a server frame with tag `tag`, which answered a request queued after the
    /// client's last flush if `unflushed`, whose handling found `to_client` at `before`.
    #[inline]
    pub(super) fn note_server_output(&mut self, before: usize, tag: u8, unflushed: bool) {
        if self.busy.held_for_server
            || matches!(tag, tags::ERROR_RESPONSE | tags::NOTICE_RESPONSE | tags::NOTIFICATION_RESPONSE)
        {
            self.release_held();
        } else if self.to_client.len() > before && (unflushed || self.busy.held > 0) {
            self.hold_new(before, false);
        }
    }

    /// Holds what was written to `to_client` from `before` on (order is kept: what comes
    /// after held bytes is held too), unless it carries an error or a notice, which
    /// PostgreSQL flushes at once, and so lets everything before it go too.
    fn hold_new(&mut self, before: usize, scan: bool) {
        let new = &self.to_client[before..];
        if scan && flushes_at_once(new) {
            self.release_held();
        } else {
            self.busy.held += new.len();
        }
    }
}

/// The whole frames of `out` include an error, a notice or a notification.
fn flushes_at_once(out: &[u8]) -> bool {
    let mut at = 0;
    while let Ok(Some(n)) = split_frame(&out[at..], usize::MAX) {
        if matches!(out[at], tags::ERROR_RESPONSE | tags::NOTICE_RESPONSE | tags::NOTIFICATION_RESPONSE) {
            return true;
        }
        at += n;
    }
    false
}
