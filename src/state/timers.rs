//! The cancel timers a session's settings arm: `statement_timeout` and `lock_timeout`.
//! PostgreSQL (up to 18 at least) cancels a statement past its timeout by signalling its
//! own backend; when the timer fires just as the statement ends, the signal outlives it and
//! cancels the session's *next* statement ("canceling statement due to user request", or
//! "… statement timeout"). Directly, that is the same client's next statement; through a
//! transaction pooler it would be another client's. The session uses these values to tell
//! when a batch ran long enough for that to happen (`Session::note_cancel_risk`), and the
//! server's next user then has any such signal absorbed first (`ServerState::cancel_risk`).
//!
//! A timer's own signal is worse than a cancel request's: the timer marks itself fired, and
//! PostgreSQL raises "canceling statement due to statement timeout" (or lock timeout)
//! wherever it next looks at the signal — even idle, waiting for the next command, where a
//! cancel request's signal is dropped. So a timer that fired just as a statement ended
//! makes the backend send an ErrorResponse and a ReadyForQuery *of its own*, unasked, soon
//! after the statement's ReadyForQuery: nothing sent there can take it first, and whoever
//! is linked then reads a reply too many. Such a backend is closed, never handed on
//! (`Session::note_cancel_risk`), and so is one whose session arms a timer this short
//! (`TINY_TIMER_US`): the pooler's own statements for the next client would run under it.
//! Only the values are read here; what sets them is `session::settings`.

use super::settings::Settings;
use crate::stmt::sql;

/// The settings whose timers cancel a statement (rather than end the session).
const TIMERS: &[&str] = &["statement_timeout", "lock_timeout"];

/// `value` of a time setting in µs: 0 when it arms no timer (0, DEFAULT), 1 when it cannot
/// be read here (the caller then assumes the shortest timer).
fn value_us(value: &str) -> u64 {
    let v = value.trim().trim_matches(|c| c == '\'' || c == '"').trim().to_ascii_lowercase();
    if v.is_empty() || v == "default" {
        return 0;
    }
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(v.len());
    let Ok(n) = v[..split].parse::<f64>() else { return 1 };
    let ms_per_unit = match v[split..].trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return 1,
    };
    let us = n * ms_per_unit * 1_000.0;
    if us <= 0.0 { 0 } else { (us as u64).max(1) }
}

/// The value a setting statement gives: `SET [SESSION | LOCAL] name { = | TO } value`, or
/// the second argument of `set_config(name, value, …)` (startup settings are kept so).
fn statement_value(stmt: &str) -> Option<&str> {
    if let Some(i) = stmt.find("set_config(") {
        // set_config('name', 'value', false): the second quoted literal.
        let mut quoted = stmt[i..].split('\'').skip(1).step_by(2);
        quoted.next()?;
        return quoted.next();
    }
    if let Some(i) = stmt.find('=') {
        return Some(&stmt[i + 1..]);
    }
    let lower = stmt.to_ascii_lowercase();
    lower.find(" to ").map(|i| &stmt[i + 4..])
}

/// A statement or lock timer this short (µs) may fire under anything run with it, the
/// pooler's own statements included: a server whose session arms one serves no other client.
pub(crate) const TINY_TIMER_US: u64 = 100_000;

/// A timer of `us` µs (0: none) is one of those.
pub(crate) fn is_tiny(us: u64) -> bool {
    us != 0 && us <= TINY_TIMER_US
}

/// The smaller of two timers (0: none).
pub(crate) fn shorter(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

impl Settings {
    /// These settings arm a statement or lock timer of `TINY_TIMER_US` or less.
    pub(crate) fn arm_a_tiny_timer(&self) -> bool {
        is_tiny(self.cancel_timer_us())
    }

    /// The shortest cancel timer these settings arm, µs (0: none).
    pub(crate) fn cancel_timer_us(&self) -> u64 {
        self.extra
            .iter()
            .filter(|(n, _)| TIMERS.contains(&n.as_str()))
            .map(|(_, stmt)| statement_value(stmt).map_or(1, value_us))
            .fold(0, shorter)
    }
}

/// The shortest cancel timer a `SET LOCAL` in the Query text `text` arms, µs (0: none).
/// Session-level SETs are tracked as settings (`Settings::cancel_timer_us`).
pub(crate) fn local_timer_us(text: &[u8]) -> u64 {
    let mut t = 0;
    for r in sql::split(text) {
        let stmt = &text[r];
        let mut words = sql::words(stmt);
        let is = |w: Option<&[u8]>, k: &str| w.is_some_and(|w| w.eq_ignore_ascii_case(k.as_bytes()));
        if !(is(words.next(), "set") && is(words.next(), "local")) {
            continue;
        }
        let Some(name) = words.next() else { continue };
        let name = String::from_utf8_lossy(name).trim_matches('"').to_ascii_lowercase();
        if TIMERS.contains(&name.as_str()) {
            let stmt = String::from_utf8_lossy(stmt);
            t = shorter(t, statement_value(&stmt).map_or(1, value_us));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_postgresql_reads_them() {
        assert_eq!(value_us("1"), 1_000);
        assert_eq!(value_us("'250ms'"), 250_000);
        assert_eq!(value_us(" '5s' "), 5_000_000);
        assert_eq!(value_us("1.5min"), 90_000_000);
        assert_eq!(value_us("0"), 0);
        assert_eq!(value_us("DEFAULT"), 0);
        assert_eq!(value_us("'2 h'"), 7_200_000_000);
        assert_eq!(value_us("500us"), 500);
        // Not readable here: assume the shortest.
        assert_eq!(value_us("'forty'"), 1);
        assert_eq!(value_us("3 fortnights"), 1);
    }

    #[test]
    fn settings_give_the_shortest_timer() {
        let mut s = Settings::default();
        assert_eq!(s.cancel_timer_us(), 0);
        s.set_extra("work_mem".into(), "SET work_mem = '1MB'".into());
        assert_eq!(s.cancel_timer_us(), 0);
        s.set_extra("statement_timeout".into(), "SET statement_timeout TO '30s'".into());
        assert_eq!(s.cancel_timer_us(), 30_000_000);
        s.set_extra("lock_timeout".into(), "SELECT pg_catalog.set_config('lock_timeout', '2s', false)".into());
        assert_eq!(s.cancel_timer_us(), 2_000_000);
        s.set_extra("lock_timeout".into(), "SET lock_timeout = 0".into());
        assert_eq!(s.cancel_timer_us(), 30_000_000);
    }

    #[test]
    fn a_timer_of_100_ms_or_less_is_tiny() {
        let mut s = Settings::default();
        assert!(!s.arm_a_tiny_timer());
        s.set_extra("statement_timeout".into(), "SET statement_timeout = '100ms'".into());
        assert!(s.arm_a_tiny_timer());
        s.set_extra("statement_timeout".into(), "SET statement_timeout = '101ms'".into());
        assert!(!s.arm_a_tiny_timer());
        s.set_extra("lock_timeout".into(), "SELECT pg_catalog.set_config('lock_timeout', '1', false)".into());
        assert!(s.arm_a_tiny_timer());
    }

    #[test]
    fn set_local_in_a_query() {
        assert_eq!(local_timer_us(b"BEGIN; SET LOCAL statement_timeout = 1; SELECT 1"), 1_000);
        assert_eq!(local_timer_us(b"set local \"lock_timeout\" to '10ms'"), 10_000);
        assert_eq!(local_timer_us(b"SET LOCAL work_mem = '1MB'"), 0);
        assert_eq!(local_timer_us(b"SET statement_timeout = 1"), 0, "session-level: a tracked setting");
        assert_eq!(local_timer_us(b"SELECT 'SET LOCAL statement_timeout = 1'"), 0);
    }
}
