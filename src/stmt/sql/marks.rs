//! One pass over a Query text's bytes for what the per-Query classifiers look for at word
//! starts (`Marks`): the statement-command keywords of `classify`, the words of
//! `session_state::scan` that may begin or end session state, and the locking clauses
//! `is_plain_read` refuses. Each of them scanned the whole text on its own (three passes per
//! simple Query); they now read these marks, computed once per client frame
//! (`Session::query_marks`), and give the answers they gave before. Each keeps its own idea
//! of a word, as before: `classify`'s words also hold `$` and non-ASCII bytes,
//! `session_state`'s hold ASCII letters, digits and `_`, and a locking clause's words are
//! runs of ASCII letters.

/// What one pass found at the word starts of a text (bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Marks(u8);

impl Marks {
    /// A word (`classify`'s kind) starts with PREPARE, EXECUTE, DEALLOCATE, DISCARD, LISTEN
    /// or UNLISTEN: the text may hold a statement command.
    pub(crate) const KEYWORD: u8 = 1;
    /// A word starts with pg_advisory_lock or pg_try_advisory_lock.
    pub(crate) const ADVISORY: u8 = 2;
    /// A word starts with listen, temp, hold or pg_temp: its statements are read.
    pub(crate) const MAYBE_STATE: u8 = 4;
    /// The word unlisten, close, drop or discard, or one starting with pg_advisory_unlock:
    /// may end session state.
    pub(crate) const ENDS_STATE: u8 = 8;
    /// The word FOR followed by UPDATE, SHARE, NO or KEY: a locking clause.
    pub(crate) const LOCKING: u8 = 16;

    /// Whether any of `bits` was found.
    #[inline]
    pub(crate) fn has(self, bits: u8) -> bool {
        self.0 & bits != 0
    }

    /// The marks of `sql`.
    pub(crate) fn of(sql: &[u8]) -> Marks {
        // Per byte, a table lookup and a test: its entry holds the kinds of word it may
        // start (`START`) and those the next byte may start after it (`NEXT`); the keywords
        // are compared only where a word of the right kind starts with one of their first
        // letters.
        let mut marks = 0u8;
        let mut allow = START;
        for (i, &b) in sql.iter().enumerate() {
            let entry = TABLE[b as usize];
            let start = entry & allow;
            if start != 0 {
                marks |= at_start(sql, i, start);
            }
            allow = entry >> NEXT;
        }
        Marks(marks)
    }
}

/// Kinds of word start (`TABLE`'s low bits): one of `classify`'s keywords (p, e, d, l, u
/// in either case, where a word of `classify` starts: not after ASCII alphanumerics, `_`,
/// `$` or non-ASCII bytes);
const KW_START: u8 = 1;
/// one of `session_state`'s words (l, t, h, p, u, c, d, not after ASCII alphanumerics or
/// `_`);
const STATE_START: u8 = 2;
/// FOR (f, not after an ASCII letter).
const FOR_START: u8 = 4;
const START: u8 = KW_START | STATE_START | FOR_START;
/// The starts the next byte may be, shifted this far up.
const NEXT: u32 = 3;

const TABLE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        let l = b.to_ascii_lowercase();
        let mut k = 0;
        if matches!(l, b'p' | b'e' | b'd' | b'l' | b'u') {
            k |= KW_START;
        }
        if matches!(l, b'l' | b't' | b'h' | b'p' | b'u' | b'c' | b'd') {
            k |= STATE_START;
        }
        if l == b'f' {
            k |= FOR_START;
        }
        let mut next = START;
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80 {
            next &= !KW_START;
        }
        if b.is_ascii_alphanumeric() || b == b'_' {
            next &= !STATE_START;
        }
        if b.is_ascii_alphabetic() {
            next &= !FOR_START;
        }
        t[c] = k | next << NEXT;
        c += 1;
    }
    t
};

/// Whether `c` continues a word of `session_state`'s kind.
fn state_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The marks of the word starts at `i` (`start`: which kinds of word start there).
#[inline(never)]
fn at_start(sql: &[u8], i: usize, start: u8) -> u8 {
    let rest = &sql[i..];
    // The keyword's letters after the first (the table matched that one).
    let hit = |kw: &[u8]| rest.len() >= kw.len() && rest[1..kw.len()].eq_ignore_ascii_case(&kw[1..]);
    // The keyword as a whole word (of `session_state`'s kind).
    let word = |kw: &[u8]| hit(kw) && rest.get(kw.len()).is_none_or(|&c| !state_word(c));
    let (kw, state) = (start & KW_START != 0, start & STATE_START != 0);
    let mut marks = 0;
    let mut mark = |yes: bool, m: u8| {
        if yes {
            marks |= m;
        }
    };
    match rest[0].to_ascii_lowercase() {
        b'p' => {
            mark(kw && hit(b"prepare"), Marks::KEYWORD);
            if state && rest.get(1).is_some_and(|c| c.eq_ignore_ascii_case(&b'g')) {
                let lock = hit(b"pg_advisory_lock") || hit(b"pg_try_advisory_lock");
                mark(lock, Marks::ADVISORY);
                mark(!lock && hit(b"pg_temp"), Marks::MAYBE_STATE);
                mark(hit(b"pg_advisory_unlock"), Marks::ENDS_STATE);
            }
        }
        b'e' => mark(kw && hit(b"execute"), Marks::KEYWORD),
        b'd' => {
            mark(kw && (hit(b"deallocate") || hit(b"discard")), Marks::KEYWORD);
            mark(state && (word(b"drop") || word(b"discard")), Marks::ENDS_STATE);
        }
        b'l' => {
            mark(kw && hit(b"listen"), Marks::KEYWORD);
            mark(state && hit(b"listen"), Marks::MAYBE_STATE);
        }
        b'u' => {
            mark(kw && hit(b"unlisten"), Marks::KEYWORD);
            mark(state && word(b"unlisten"), Marks::ENDS_STATE);
        }
        b't' => mark(state && hit(b"temp"), Marks::MAYBE_STATE),
        b'h' => mark(state && hit(b"hold"), Marks::MAYBE_STATE),
        b'c' => mark(state && word(b"close"), Marks::ENDS_STATE),
        b'f' => mark(start & FOR_START != 0 && locks_after_for(sql, i), Marks::LOCKING),
        _ => {}
    }
    marks
}

/// Whether the run of ASCII letters at `i` (an f that starts one) is FOR and the next run of
/// letters after it is UPDATE, SHARE, NO or KEY.
fn locks_after_for(sql: &[u8], i: usize) -> bool {
    let alpha = |j: usize| sql.get(j).is_some_and(u8::is_ascii_alphabetic);
    if !sql[i..].get(..3).is_some_and(|w| w.eq_ignore_ascii_case(b"for")) || alpha(i + 3) {
        return false;
    }
    let Some(start) = sql[i + 3..].iter().position(u8::is_ascii_alphabetic).map(|p| i + 3 + p) else { return false };
    let end = sql[start..].iter().position(|c| !c.is_ascii_alphabetic()).map_or(sql.len(), |p| start + p);
    let w = &sql[start..end];
    [&b"update"[..], b"share", b"no", b"key"].iter().any(|k| w.eq_ignore_ascii_case(k))
}

#[cfg(test)]
#[path = "marks_tests.rs"]
mod tests;
