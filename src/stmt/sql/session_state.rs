//! Whether a Query text leaves state in the server session that outlives its
//! transaction (LISTEN, temporary tables, cursors WITH HOLD, session advisory locks):
//! such a client is pinned to its server connection under transaction pooling.

use super::{split, words};

/// Whether `sql` may leave state in the server session that outlives its transaction and
/// that parsnip does not carry from one server connection to the next: `LISTEN`, a
/// temporary table (view, sequence), a cursor `WITH HOLD`, a session-level advisory lock
/// (`pg_advisory_lock`, `pg_try_advisory_lock` and their `_shared` forms). Under
/// transaction pooling such a client is pinned to its server connection. A cheap scan of
/// word starts first: most texts name none of these words.
pub(crate) fn holds_session_state(sql: &[u8]) -> bool {
    // Per byte: is it a word character (bit 0), and can a word starting with it be one of
    // the keywords below (bit 1: l, t, h, p in either case). Runs on every Query and Parse.
    const CLASS: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut c = 0;
        while c < 256 {
            let b = c as u8;
            if b.is_ascii_alphanumeric() || b == b'_' {
                t[c] = 1;
                if matches!(b | 0x20, b'l' | b't' | b'h' | b'p') {
                    t[c] |= 2;
                }
            }
            c += 1;
        }
        t
    };
    let mut prev_word = false;
    let mut maybe = false;
    for (i, &b) in sql.iter().enumerate() {
        let class = CLASS[b as usize];
        if class == 3 && !prev_word {
            let rest = &sql[i..];
            let hit = |kw: &[u8]| rest.len() >= kw.len() && rest[..kw.len()].eq_ignore_ascii_case(kw);
            if hit(b"listen")
                || hit(b"temp")
                || hit(b"hold")
                || hit(b"pg_advisory_lock")
                || hit(b"pg_try_advisory_lock")
            {
                maybe = true;
                break;
            }
        }
        prev_word = class & 1 != 0;
    }
    maybe && split(sql).into_iter().any(|r| statement_holds_state(&sql[r]))
}

fn statement_holds_state(stmt: &[u8]) -> bool {
    let w: Vec<&[u8]> = words(stmt).take(64).collect();
    let is = |i: usize, kw: &str| w.get(i).is_some_and(|x| x.eq_ignore_ascii_case(kw.as_bytes()));
    if is(0, "listen") {
        return true;
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
            return true;
        }
    }
    if is(0, "declare") {
        // DECLARE name [BINARY] [ASENSITIVE|INSENSITIVE] [[NO] SCROLL] CURSOR WITH HOLD FOR
        let for_at = w.iter().position(|x| x.eq_ignore_ascii_case(b"for")).unwrap_or(w.len());
        if (1..for_at).any(|i| is(i, "with") && is(i + 1, "hold")) {
            return true;
        }
    }
    // SELECT ... INTO TEMP, and session advisory locks anywhere in the statement.
    w.iter().enumerate().any(|(i, x)| {
        let lower = x.to_ascii_lowercase();
        (lower.starts_with(b"pg_advisory_lock") || lower.starts_with(b"pg_try_advisory_lock"))
            || (x.eq_ignore_ascii_case(b"into") && (is(i + 1, "temp") || is(i + 1, "temporary")))
    })
}

#[cfg(test)]
mod session_state_tests {
    use super::holds_session_state as h;

    #[test]
    fn statements_that_leave_session_state() {
        for s in [
            "LISTEN chan",
            "listen \"Chan\"; select 1",
            "create temp table t (x int)",
            "CREATE GLOBAL TEMPORARY TABLE t (x int)",
            "create or replace temp view v as select 1",
            "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
            "declare c no scroll cursor with hold for select 1",
            "select pg_advisory_lock(1)",
            "SELECT pg_try_advisory_lock_shared(1, 2)",
            "select * into temp t from x",
        ] {
            assert!(h(s.as_bytes()), "{s}");
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
        ] {
            assert!(!h(s.as_bytes()), "{s}");
        }
    }
}
