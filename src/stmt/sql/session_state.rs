//! What a Query or Parse text may do to state in the server session that outlives its
//! transaction (LISTEN, temporary tables, cursors WITH HOLD, session advisory locks): under
//! transaction pooling the session asks the server what remains when such a transaction
//! ends (`session::pins`), and keeps the client on its server connection while any does.

use super::{Marks, split, words};
use crate::stmt::pins::PinReasons;

/// What `scan` found in a text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The reasons the text may begin (`PinReasons` bits), as far as its words tell.
    pub(crate) reasons: u8,
    /// Whether the server must be asked what remains when the transaction ends: the text
    /// may begin a reason, or (`pinned`) end one.
    pub(crate) check: bool,
}

/// What `sql` may do to session state that outlives its transaction and that parsnip does
/// not carry from one server connection to the next: `LISTEN`, a temporary table (view,
/// sequence, anything in `pg_temp`), a cursor `WITH HOLD`, a session-level advisory lock
/// (`pg_advisory_lock`, `pg_try_advisory_lock` and their `_shared` forms, found anywhere in
/// the text, so also in a `DO` block or a function body); with `pinned`, also what may end
/// one (`UNLISTEN`, `CLOSE`, `DROP`, `DISCARD`, `pg_advisory_unlock*`, anywhere). A cheap
/// scan of word starts first (`Marks`): most texts name none of these words. It errs on the
/// careful side (a word in a literal counts): a needless check costs one round trip, a
/// missed one a server handed on with a client's state.
pub(crate) fn scan(sql: &[u8], pinned: bool) -> Seen {
    scan_marked(sql, pinned, Marks::of(sql))
}

/// `scan`, with the text's marks (`Marks::of`).
pub(crate) fn scan_marked(sql: &[u8], pinned: bool, marks: Marks) -> Seen {
    let mut seen = Seen::default();
    if marks.has(Marks::ADVISORY) {
        seen.reasons |= PinReasons::ADVISORY_LOCK;
        seen.check = true;
    }
    if pinned && marks.has(Marks::ENDS_STATE) {
        seen.check = true;
    }
    if marks.has(Marks::MAYBE_STATE) {
        for r in split(sql) {
            let (reasons, check) = statement_reasons(&sql[r]);
            seen.reasons |= reasons;
            seen.check |= check || reasons != 0;
        }
    }
    seen
}

/// Whether `sql` may begin session state (`scan` of an unpinned client's text).
#[cfg(test)]
pub(crate) fn holds_session_state(sql: &[u8]) -> bool {
    scan(sql, false).check
}

/// The reasons one statement may begin, and whether it needs a check without naming one
/// (a `DO` block that names them: its body is a literal).
fn statement_reasons(stmt: &[u8]) -> (u8, bool) {
    let w: Vec<&[u8]> = words(stmt).take(64).collect();
    let is = |i: usize, kw: &str| w.get(i).is_some_and(|x| x.eq_ignore_ascii_case(kw.as_bytes()));
    if is(0, "listen") {
        return (PinReasons::LISTEN, false);
    }
    if is(0, "do") {
        return (0, true);
    }
    if is(0, "create") {
        let mut i = 1;
        if is(i, "or") && is(i + 1, "replace") {
            i += 2;
        }
        if is(i, "global") || is(i, "local") {
            i += 1;
        }
        if is(i, "temp") || is(i, "temporary") {
            return (PinReasons::TEMP_TABLE, false);
        }
    }
    if is(0, "declare") {
        // DECLARE name [BINARY] [ASENSITIVE|INSENSITIVE] [[NO] SCROLL] CURSOR WITH HOLD FOR
        let for_at = w.iter().position(|x| x.eq_ignore_ascii_case(b"for")).unwrap_or(w.len());
        if (1..for_at).any(|i| is(i, "with") && is(i + 1, "hold")) {
            return (PinReasons::HOLD_CURSOR, false);
        }
    }
    // SELECT ... INTO TEMP, and anything written into pg_temp.
    let temp = w.iter().enumerate().any(|(i, x)| {
        (x.len() >= 7 && x[..7].eq_ignore_ascii_case(b"pg_temp"))
            || (x.eq_ignore_ascii_case(b"into") && (is(i + 1, "temp") || is(i + 1, "temporary")))
    });
    (if temp { PinReasons::TEMP_TABLE } else { 0 }, false)
}

#[cfg(test)]
mod session_state_tests {
    use super::{PinReasons as R, scan};

    #[test]
    fn statements_that_leave_session_state() {
        for (s, want) in [
            ("LISTEN chan", R::LISTEN),
            ("listen \"Chan\"; select 1", R::LISTEN),
            ("create temp table t (x int)", R::TEMP_TABLE),
            ("CREATE GLOBAL TEMPORARY TABLE t (x int)", R::TEMP_TABLE),
            ("create or replace temp view v as select 1", R::TEMP_TABLE),
            ("create table pg_temp.t (x int)", R::TEMP_TABLE),
            ("DECLARE c CURSOR WITH HOLD FOR SELECT 1", R::HOLD_CURSOR),
            ("declare c no scroll cursor with hold for select 1", R::HOLD_CURSOR),
            ("select pg_advisory_lock(1)", R::ADVISORY_LOCK),
            ("SELECT pg_try_advisory_lock_shared(1, 2)", R::ADVISORY_LOCK),
            ("select * into temp t from x", R::TEMP_TABLE),
            ("do $$ begin perform pg_advisory_lock(1); end $$", R::ADVISORY_LOCK),
            ("do $$ begin create temp table t (x int); end $$", 0),
        ] {
            let seen = scan(s.as_bytes(), false);
            assert!(seen.check, "{s}");
            assert_eq!(seen.reasons, want, "{s}");
        }
        for s in [
            "select 1",
            "select pg_advisory_xact_lock(1)",
            "create table temperature (x int)",
            "select 'listen'",
            "declare c cursor for select 1",
            "select holdings from t",
            "-- listen\nselect 1",
            "notify chan",
            "unlisten *",
            "select pg_advisory_unlock(1)",
            "close c",
        ] {
            assert_eq!(scan(s.as_bytes(), false), Default::default(), "{s}");
        }
    }

    #[test]
    fn statements_that_may_end_it_while_pinned() {
        for s in [
            "select pg_advisory_unlock(1)",
            "SELECT pg_advisory_unlock_all()",
            "select pg_advisory_unlock_shared(1)",
            "close c",
            "CLOSE ALL",
            "drop table t",
            "discard temp",
            "DISCARD ALL",
            "unlisten *",
        ] {
            let seen = scan(s.as_bytes(), true);
            assert!(seen.check, "{s}");
            assert_eq!(seen.reasons, 0, "{s}");
        }
        assert!(!scan(b"select closed from t", true).check);
        assert!(!scan(b"select 1", true).check);
    }
}
