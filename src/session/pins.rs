//! Pinning under transaction pooling, decided here: which reasons keep a client on its
//! server connection (`stmt::pins::PinReasons`), and when they end.
//!
//! parsnip cannot count session state exactly from SQL text (a `pg_try_advisory_lock` may
//! return false, a lock may be taken twice and released once, a temporary table may be
//! `ON COMMIT DROP`, a transaction that declared a held cursor may roll back, a `DO` block
//! may do any of it). So the text only tells when to ask: a Query, Parse or Bind whose SQL
//! may begin session state (`stmt::sql::session_state`), or, while pinned, may end some,
//! makes a check due; where the server would be given back (idle, outside a transaction,
//! nothing in flight: `maybe_release`), a due check sends parsnip's own query
//! (`CHECK_SQL`, its replies never shown to the client) asking the server whether a
//! session advisory lock, a held cursor, a temporary object or a LISTEN remains. Its
//! answer is the set of reasons: none, and the server is given back as usual; else the
//! client keeps it until a later check says none. A check that fails keeps the client
//! pinned (`UNVERIFIED`) and is asked again after the client's next statement. A SQL-level
//! `PREPARE` with the statement cache off pins for good (`PREPARED`).

use super::reply_queue::{Pending, Purpose, Req};
use super::{Link, Session};
use crate::config::PoolMode;
use crate::protocol::frontend;
use crate::state::ServerState;
use crate::stmt::pins::PinReasons;
use crate::stmt::sql::Seen;

/// parsnip's question to the server: one boolean per reason the server is asked about, in
/// `ANSWER_BITS` order. Run only outside a transaction, where every advisory lock of the
/// backend is a session lock and every open cursor a held one.
pub(super) const CHECK_SQL: &str = "SELECT \
EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()), \
EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE is_holdable), \
EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()) \
OR EXISTS (SELECT FROM pg_catalog.pg_proc WHERE pronamespace = pg_catalog.pg_my_temp_schema()) \
OR EXISTS (SELECT FROM pg_catalog.pg_type WHERE typnamespace = pg_catalog.pg_my_temp_schema()), \
EXISTS (SELECT FROM pg_catalog.pg_listening_channels())";

/// The reason each column of `CHECK_SQL`'s row stands for.
const ANSWER_BITS: [u8; 4] =
    [PinReasons::ADVISORY_LOCK, PinReasons::HOLD_CURSOR, PinReasons::TEMP_TABLE, PinReasons::LISTEN];

/// A client's pins (see the module doc), kept across transactions. Three bytes: every
/// idle client's task carries them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Pins {
    /// The reasons in effect: the server's last answer, and those the client's SQL may have
    /// begun since (`PinReasons` bits).
    pub(super) reasons: u8,
    /// `Pins::*` flags.
    flags: u8,
    /// The question's answer (`ANSWERED` once its row came).
    answer: u8,
}

impl Pins {
    /// The server is to be asked before it is given back.
    const CHECK_DUE: u8 = 1;
    /// The question is in flight.
    const ASKING: u8 = 2;
    /// Its row came (`answer`).
    const ANSWERED: u8 = 4;
    /// Cache off, and the client prepared a named statement whose text may begin session
    /// state: every transaction with a Bind is checked (its texts are not known here).
    const BINDS_CHECK: u8 = 8;
    /// The question's simple Query dropped the server's unnamed statement: the linked
    /// server is told at the next frame either way.
    const UNNAMED_GONE: u8 = 16;

    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    fn set(&mut self, f: u8, on: bool) {
        if on {
            self.flags |= f;
        } else {
            self.flags &= !f;
        }
    }

    /// Pinned, or may be: the server must not be given back or lent to other clients.
    pub(super) fn holds(&self) -> bool {
        self.reasons != 0 || self.has(Self::CHECK_DUE | Self::ASKING)
    }
}

impl Session {
    /// What a client's SQL may do to session state (`stmt::sql::session_state`).
    pub(super) fn note_pins(&mut self, seen: Seen) {
        if self.kept.mode == PoolMode::Session {
            return;
        }
        let p = &mut self.kept.pins;
        p.reasons |= seen.reasons;
        if seen.check || p.reasons & PinReasons::UNVERIFIED != 0 {
            p.set(Pins::CHECK_DUE, true);
        }
    }

    /// The text a client's frame carries, looked at for pins (`note_pins`); `named_parse`:
    /// a Parse of a named statement with the cache off, whose Binds are not looked at.
    pub(super) fn look_for_pins(&mut self, text: &[u8], named_parse: bool) {
        let pinned = self.kept.pins.reasons != 0;
        let marks = self.query_marks(text);
        let seen = crate::stmt::sql::session_state_marked(text, pinned, marks);
        if named_parse && seen.check {
            self.kept.pins.set(Pins::BINDS_CHECK, true);
        }
        self.note_pins(seen);
    }

    /// A Bind with the cache off (its statement's text is not known here).
    pub(super) fn bind_for_pins(&mut self) {
        if self.kept.pins.has(Pins::BINDS_CHECK) {
            self.note_pins(Seen { reasons: 0, check: true });
        }
    }

    /// A SQL-level prepared statement on the server with the cache off: pinned for good.
    pub(super) fn pin_for_prepared(&mut self) {
        if self.kept.mode != PoolMode::Session && self.kept.pins.reasons & PinReasons::PREPARED == 0 {
            tracing::debug!(session = self.kept.uid, "pinned to its server connection: a SQL-level prepared statement");
            self.kept.pins.reasons |= PinReasons::PREPARED;
        }
    }

    /// Where the server would be given back: true if it is kept instead, because the client
    /// is pinned or the question is sent now.
    pub(super) fn pins_keep_server(&mut self) -> bool {
        let p = &mut self.kept.pins;
        if p.has(Pins::CHECK_DUE) && !p.has(Pins::ASKING) && matches!(self.link, Link::Linked(_)) {
            p.set(Pins::CHECK_DUE | Pins::ANSWERED, false);
            p.set(Pins::ASKING | Pins::UNNAMED_GONE, true);
            frontend::query(&mut self.to_server, CHECK_SQL);
            self.busy.replies.push(Pending::internal(Req::Query, Purpose::PinCheck));
        }
        self.kept.pins.holds()
    }

    /// parsnip sent a simple Query of its own (`config`): the server's unnamed statement is
    /// nobody's after it.
    pub(super) fn pins_note_unnamed_gone(&mut self) {
        self.kept.pins.set(Pins::UNNAMED_GONE, true);
    }

    /// A frame of the linked server's or for it: the server's unnamed statement is nobody's
    /// after the question's simple Query.
    #[inline]
    pub(super) fn pins_server_seen(&mut self, server: &mut ServerState) {
        if self.kept.pins.has(Pins::UNNAMED_GONE) {
            self.kept.pins.set(Pins::UNNAMED_GONE, false);
            server.stmts.unnamed_owner = None;
        }
    }

    /// The DataRow answering the question.
    pub(super) fn pins_answer(&mut self, row: &[u8]) {
        if let Some(bits) = parse_answer(row) {
            self.kept.pins.answer = bits;
            self.kept.pins.set(Pins::ANSWERED, true);
        }
    }

    /// The question's ReadyForQuery (`failed`: it got an error): its answer is the
    /// client's reasons now.
    pub(super) fn pins_checked(&mut self, failed: bool) {
        let p = &mut self.kept.pins;
        let answered = p.has(Pins::ANSWERED) && !failed;
        p.set(Pins::ASKING | Pins::ANSWERED, false);
        let before = p.reasons;
        match answered {
            true => p.reasons = p.answer | (p.reasons & PinReasons::PREPARED),
            false => {
                tracing::warn!(
                    session = self.kept.uid,
                    "could not ask the server what session state remains: the client stays pinned"
                );
                p.reasons |= PinReasons::UNVERIFIED;
            }
        }
        if p.reasons != before {
            tracing::debug!(
                session = self.kept.uid,
                pinned = %PinReasons(p.reasons).names(),
                "session state on its server connection checked"
            );
        }
    }

    /// Why the client is pinned now (with what its SQL may have begun since the server
    /// was last asked).
    #[cfg(test)]
    pub(crate) fn pin_reasons(&self) -> PinReasons {
        PinReasons(self.kept.pins.reasons)
    }

    /// Why the client is pinned, as the server last confirmed it; None while the question
    /// is due or in flight.
    pub(crate) fn settled_pin_reasons(&self) -> Option<PinReasons> {
        let p = &self.kept.pins;
        (!p.has(Pins::CHECK_DUE | Pins::ASKING)).then_some(PinReasons(p.reasons))
    }
}

/// The reasons in a DataRow body of `CHECK_SQL`'s answer; None if it is not one.
fn parse_answer(row: &[u8]) -> Option<u8> {
    let n = u16::from_be_bytes([*row.first()?, *row.get(1)?]) as usize;
    if n != ANSWER_BITS.len() {
        return None;
    }
    let mut at = 2;
    let mut bits = 0;
    for bit in ANSWER_BITS {
        let len = i32::from_be_bytes(row.get(at..at + 4)?.try_into().ok()?);
        at += 4;
        if len != 1 {
            return None;
        }
        match row.get(at)? {
            b't' => bits |= bit,
            b'f' => {}
            _ => return None,
        }
        at += 1;
    }
    Some(bits)
}

#[cfg(test)]
mod tests {
    use super::parse_answer;

    fn row(cols: &[&[u8]]) -> Vec<u8> {
        let mut r = (cols.len() as u16).to_be_bytes().to_vec();
        for c in cols {
            r.extend_from_slice(&(c.len() as i32).to_be_bytes());
            r.extend_from_slice(c);
        }
        r
    }

    #[test]
    fn answers_are_read_strictly() {
        assert_eq!(parse_answer(&row(&[b"f", b"f", b"f", b"f"])), Some(0));
        assert_eq!(parse_answer(&row(&[b"t", b"f", b"t", b"f"])), Some(1 | 4));
        assert_eq!(parse_answer(&row(&[b"t", b"f", b"t"])), None);
        assert_eq!(parse_answer(&row(&[b"t", b"x", b"t", b"f"])), None);
        assert_eq!(parse_answer(&[0, 4, 0, 0]), None);
    }
}
