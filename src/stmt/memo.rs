//! Facts about a cached statement's text that the session works out on first need and
//! keeps in the statement (its text never changes), each in one atomic byte: whether it is
//! one plain read (`OnceBool`), and what a Bind of it must watch for (`OnceBindWatch`).

use std::sync::atomic::{AtomicU8, Ordering};

/// What a `OnceBool`'s byte holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Known {
    /// Not worked out yet.
    Unknown = 0,
    Yes = 1,
    No = 2,
}

impl From<u8> for Known {
    fn from(b: u8) -> Known {
        match b {
            1 => Known::Yes,
            2 => Known::No,
            _ => Known::Unknown,
        }
    }
}

impl From<Known> for u8 {
    fn from(k: Known) -> u8 {
        k as u8
    }
}

/// A yes or no worked out on first need, then kept.
#[derive(Debug, Default)]
pub(crate) struct OnceBool(AtomicU8);

impl OnceBool {
    /// The answer, worked out by `f` the first time (two threads may both run it: it
    /// answers the same).
    pub(crate) fn get_or_init(&self, f: impl FnOnce() -> bool) -> bool {
        match Known::from(self.0.load(Ordering::Relaxed)) {
            Known::Yes => true,
            Known::No => false,
            Known::Unknown => {
                let yes = f();
                self.0.store(u8::from(if yes { Known::Yes } else { Known::No }), Ordering::Relaxed);
                yes
            }
        }
    }
}

/// What a Bind of a statement must watch for in its text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BindWatch {
    /// It may call `set_config` for the session (`session::settings::may_set_session_config`):
    /// the server's settings may change unseen.
    pub(crate) sets_config: bool,
    /// It may be a SET/RESET/DISCARD or a transaction statement the session tracks
    /// (`session::settings::maybe_session_stmt`).
    pub(crate) session_stmt: bool,
    /// It may begin session state that outlives its transaction
    /// (`stmt::sql::session_state`): the server is asked what remains (`session::pins`).
    pub(crate) pins_begin: bool,
    /// It may end such state (asked about while the client is pinned).
    pub(crate) pins_end: bool,
}

/// The bits of a `OnceBindWatch`'s byte: `KNOWN` once worked out.
const KNOWN: u8 = 1;
const SETS_CONFIG: u8 = 2;
const SESSION_STMT: u8 = 4;
const PINS_BEGIN: u8 = 8;
const PINS_END: u8 = 16;

impl From<BindWatch> for u8 {
    fn from(w: BindWatch) -> u8 {
        KNOWN
            | if w.sets_config { SETS_CONFIG } else { 0 }
            | if w.session_stmt { SESSION_STMT } else { 0 }
            | if w.pins_begin { PINS_BEGIN } else { 0 }
            | if w.pins_end { PINS_END } else { 0 }
    }
}

impl BindWatch {
    /// The watch a byte of `OnceBindWatch` holds; None: not worked out yet.
    fn from_byte(b: u8) -> Option<BindWatch> {
        (b & KNOWN != 0).then_some(BindWatch {
            sets_config: b & SETS_CONFIG != 0,
            session_stmt: b & SESSION_STMT != 0,
            pins_begin: b & PINS_BEGIN != 0,
            pins_end: b & PINS_END != 0,
        })
    }
}

/// A `BindWatch` worked out on first need, then kept.
#[derive(Debug, Default)]
pub(crate) struct OnceBindWatch(AtomicU8);

impl OnceBindWatch {
    /// The watch, worked out by `f` the first time.
    pub(crate) fn get_or_init(&self, f: impl FnOnce() -> BindWatch) -> BindWatch {
        if let Some(w) = BindWatch::from_byte(self.0.load(Ordering::Relaxed)) {
            return w;
        }
        let w = f();
        self.0.store(u8::from(w), Ordering::Relaxed);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_out_once_and_kept() {
        let b = OnceBool::default();
        assert!(!b.get_or_init(|| false));
        assert!(!b.get_or_init(|| true), "kept, not worked out again");
        let w = OnceBindWatch::default();
        for sets_config in [false, true] {
            for session_stmt in [false, true] {
                for pins_begin in [false, true] {
                    for pins_end in [false, true] {
                        let want = BindWatch { sets_config, session_stmt, pins_begin, pins_end };
                        assert_eq!(BindWatch::from_byte(u8::from(want)), Some(want));
                    }
                }
            }
        }
        let first = BindWatch { session_stmt: true, ..BindWatch::default() };
        assert_eq!(w.get_or_init(|| first), first);
        assert_eq!(w.get_or_init(BindWatch::default), first);
    }
}
