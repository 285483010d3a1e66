//! A lift reused: the result of `lift` for one text, applied to another that differs from
//! it only in the values of its lifted integer literals (`… WHERE aid = 4711` and
//! `… WHERE aid = 815`), without lexing the new text. Autoprepare keeps a few per client
//! (`session::stmts::autoprepare`): a client repeating a query with other numbers pays a
//! few comparisons instead of a lift.
//!
//! Why the result is then exactly `lift`'s: every byte of the new text but the literals is
//! the old text's, so the lexer reaches each literal in the same state; a literal is taken
//! only as a run of ASCII digits (as the old one was) followed by the byte that ended the
//! old one, which ends a run of digits the same way (a `.`, `e`, `_` or letter there would
//! have made the old literal something other than a lifted plain integer). The lifter's
//! choices depend on the tokens around a literal, which are the same, and on the literal's
//! own value only through its type and the two minimum integers PostgreSQL folds a minus
//! into: a new literal of another type, or with those digits, is not matched.

use super::{INT4, INT8, Lifted, Origin};
use std::ops::Range;

/// A lifted text whose lifted literals are all plain integers (int4 or int8).
#[derive(Debug)]
pub struct Template {
    /// `prefix_key` of the client's text of the lift: a text this template takes has the
    /// same (its first literal is where the lift's was, and nothing before it is a digit
    /// that is not in both).
    pub key: u64,
    /// The client's text of the lift, less its literals: `values.len() + 1` pieces.
    pieces: Vec<Range<usize>>,
    client: Box<[u8]>,
    /// Each literal's type.
    types: Vec<u32>,
    /// Whether standard_conforming_strings was off for the lift.
    escapes_everywhere: bool,
    /// The text sent to the server, and its parameter types as a Parse carries them.
    pub text: Box<[u8]>,
    pub type_bytes: Box<[u8]>,
    /// `Lifted::edits` of the lift.
    edits: Vec<[i64; 4]>,
}

/// A template applied to a text: what `lift` would have returned, less the text and types
/// (the template's). Reused from one text to the next (`Template::apply_into`): its
/// storage stays, so that a client repeating its queries allocates nothing for them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// As `Lifted::values` and `Lifted::edits`.
    pub values: Vec<Range<usize>>,
    pub edits: Vec<[i64; 4]>,
}

impl Applied {
    /// The origin of the client's `text` (as `Origin::new` for the lift), written into `o`
    /// (its storage reused).
    pub fn origin_into(&self, text: &[u8], o: &mut Origin) {
        o.fill(text, &self.values, &self.edits);
    }
}

/// Where the first ASCII digit of `text` is, and the (up to) eight bytes before it: what a
/// client's text is told from most kept templates by, before any is tried
/// (`Template::key`). Cheaper than hashing what precedes the digit, and as telling for
/// the texts of one application (another text with the same key costs one failed try).
pub fn prefix_key(text: &[u8]) -> u64 {
    let at = first_digit(text);
    let mut tail = [0u8; 8];
    let before = &text[at.saturating_sub(8)..at];
    tail[8 - before.len()..].copy_from_slice(before);
    u64::from_le_bytes(tail) ^ (at as u64).rotate_left(48)
}

/// Where the first ASCII digit of `text` is (its length if none), eight bytes at a time: a
/// byte is a digit when it differs from `0` by less than 10 in its low seven bits with its
/// high bit clear. The subtraction's borrows only ever mark bytes above the first one that
/// is marked rightly, and only the lowest mark is read.
fn first_digit(text: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    let mut chunks = text.chunks_exact(8);
    let mut at = 0;
    for c in chunks.by_ref() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let x = u64::from_le_bytes(w) ^ (ONES * 0x30);
        let m = x.wrapping_sub(ONES * 0x0a) & !x & (ONES * 0x80);
        if m != 0 {
            return at + (m.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + chunks.remainder().iter().position(u8::is_ascii_digit).unwrap_or(chunks.remainder().len())
}

/// A literal a template may take: the integer type of its ASCII digits, unless it is one of the
/// minimum integers' magnitudes (`lift` treats those by what precedes them).
fn integer_type(digits: &[u8]) -> Option<u32> {
    let significant = &digits[digits.iter().take_while(|&&d| d == b'0').count()..];
    if digits.is_empty()
        || !digits.iter().all(u8::is_ascii_digit)
        || significant == b"2147483648"
        || significant == b"9223372036854775808"
    {
        return None;
    }
    match super::lex::literal_type(digits, true) {
        t @ (INT4 | INT8) => Some(t),
        _ => None,
    }
}

impl Template {
    /// The template of `l`, lifted from `client`; None when a lifted literal is not a
    /// plain integer (such lifts are not reused).
    pub fn new(client: &[u8], l: &Lifted, escapes_everywhere: bool) -> Option<Template> {
        let mut pieces = Vec::with_capacity(l.values.len() + 1);
        let mut at = 0;
        for (r, &ty) in l.values.iter().zip(&l.types) {
            if integer_type(&client[r.clone()]) != Some(ty) {
                return None;
            }
            pieces.push(at..r.start);
            at = r.end;
        }
        pieces.push(at..client.len());
        let mut type_bytes = Vec::with_capacity(4 * l.types.len());
        for t in &l.types {
            type_bytes.extend_from_slice(&t.to_be_bytes());
        }
        Some(Template {
            key: prefix_key(client),
            pieces,
            client: client.into(),
            types: l.types.clone(),
            escapes_everywhere,
            text: l.text.clone().into(),
            type_bytes: type_bytes.into(),
            edits: l.edits.clone(),
        })
    }

    /// What `lift(text, escapes_everywhere)` returns, if `text` is this template's text with
    /// other integers of the same types in place of its literals; None otherwise (it may
    /// still lift: ask `lift`).
    #[cfg(test)]
    pub fn apply(&self, text: &[u8], escapes_everywhere: bool) -> Option<Applied> {
        let mut a = Applied::default();
        self.apply_into(text, escapes_everywhere, &mut a).then_some(a)
    }

    /// `apply`, into `out` (its storage reused): false (and `out` anything) where `apply`
    /// is None.
    pub fn apply_into(&self, text: &[u8], escapes_everywhere: bool, out: &mut Applied) -> bool {
        // A client's texts are tried against every kept template, and most differ from the
        // first piece on: that is checked before anything is written.
        let first = self.pieces.first().map_or(&[][..], |p| &self.client[p.clone()]);
        if escapes_everywhere != self.escapes_everywhere || !text.starts_with(first) {
            return false;
        }
        let values = &mut out.values;
        values.clear();
        if !self.literals(text, |r| values.push(r)) {
            return false;
        }
        out.edits.clear();
        out.edits.extend_from_slice(&self.edits);
        // Client characters (= bytes: digits) the new literals add, so far.
        let mut shift = 0i64;
        for (e, r) in out.edits.iter_mut().zip(&out.values) {
            let old = e[3] - e[2];
            e[2] += shift;
            shift += r.len() as i64 - old;
            e[3] = e[2] + r.len() as i64;
        }
        true
    }

    /// Whether `text` is this template's text with other integers of the same types in
    /// place of its literals; `each(range)` is told where each literal is, in order, as far
    /// as it matched.
    #[inline]
    fn literals(&self, text: &[u8], mut each: impl FnMut(Range<usize>)) -> bool {
        let mut at = 0;
        for (k, piece) in self.pieces.iter().enumerate() {
            let piece = &self.client[piece.clone()];
            if !text[at..].starts_with(piece) {
                return false;
            }
            at += piece.len();
            let Some(&ty) = self.types.get(k) else { break };
            let n = text[at..].iter().take_while(|d| d.is_ascii_digit()).count();
            if integer_type(&text[at..at + n]) != Some(ty) {
                return false;
            }
            each(at..at + n);
            at += n;
        }
        at == text.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::lift;
    use super::*;

    /// `b` through the template of `a`, checked against lifting `b`.
    fn via(a: &str, b: &str) -> Option<Applied> {
        let l = lift(a.as_bytes(), false).expect("a lifts");
        let t = Template::new(a.as_bytes(), &l, false)?;
        let got = t.apply(b.as_bytes(), false);
        if let Some(got) = &got {
            assert_eq!(t.key, prefix_key(b.as_bytes()), "what a template takes has its key: {b}");
            let want = lift(b.as_bytes(), false).expect("what the template takes lifts");
            assert_eq!(&*t.text, &want.text[..], "{b}");
            assert_eq!(t.types, want.types, "{b}");
            assert_eq!(got.values, want.values, "{b}");
            assert_eq!(got.edits, want.edits, "{b}");
        }
        got
    }

    #[test]
    fn other_integers_of_the_same_types_reuse_the_lift() {
        let q = "SELECT abalance FROM pgbench_accounts WHERE aid = 4711;";
        assert!(via(q, "SELECT abalance FROM pgbench_accounts WHERE aid = 7;").is_some());
        assert!(via(q, "SELECT abalance FROM pgbench_accounts WHERE aid = 0004711;").is_some());
        let q = "select * from t where a = 1 and b in (22, 333) order by 1 limit 10";
        assert!(via(q, "select * from t where a = 12345 and b in (2, 3) order by 1 limit 1").is_some());
        assert!(via("select 'é', 1 + x from t where y = -5", "select 'é', 77 + x from t where y = -123456").is_some());
        assert!(via("select 1::int8, 5000000000", "select 123::int8, 6000000000").is_some());
    }

    #[test]
    fn anything_else_is_lifted_afresh() {
        let q = "select * from t where a = 1 order by 1";
        // Another type, another number kind, a folded minimum, other text.
        assert!(via(q, "select * from t where a = 5000000000 order by 1").is_none());
        assert!(via(q, "select * from t where a = 1.5 order by 1").is_none());
        assert!(via(q, "select * from t where a = 1e5 order by 1").is_none());
        assert!(via(q, "select * from t where a = 0x1F order by 1").is_none());
        assert!(via(q, "select * from t where a = 1_000 order by 1").is_none());
        assert!(via(q, "select * from t where a = order by 1").is_none());
        assert!(via(q, "select * from t where a = 1 order by 2").is_none());
        assert!(via(q, "select * from t where a = 1 order by 1 ").is_none());
        assert!(via("select -1", "select -2147483648").is_none());
        assert!(via("select -1", "select -0002147483648").is_none());
        assert!(via("select -1::int8", "select -9223372036854775808::int8").is_none());
        // Not a plain integer in the lift: no template.
        let l = lift(b"select 1.5", false).expect("lifts");
        assert!(Template::new(b"select 1.5", &l, false).is_none());
        // Lexed under other string rules.
        let l = lift(b"select 1", false).expect("lifts");
        let t = Template::new(b"select 1", &l, false).expect("a template");
        assert!(t.apply(b"select 2", true).is_none());
    }

    #[test]
    fn the_first_digit_is_found_eight_bytes_at_a_time_as_one_at_a_time() {
        let naive = |t: &[u8]| t.iter().position(u8::is_ascii_digit).unwrap_or(t.len());
        let mut texts: Vec<Vec<u8>> = vec![b"".to_vec(), b"abc".to_vec(), "é9".as_bytes().to_vec()];
        // Every byte value at every place of a 19-byte text, a digit or none after it.
        for b in 0..=255u8 {
            for at in 0..19 {
                for tail in [None, Some(b'0'), Some(b'9')] {
                    let mut t = vec![b'x'; 19];
                    t[at] = b;
                    if let Some(d) = tail {
                        t[18] = d;
                    }
                    texts.push(t);
                }
            }
        }
        // Bytes next to the digits, and borrows across a byte: `/`, `:`, 0x00, 0xb0..0xb9.
        texts.push(b"ab/:\x00\xb0\xb9c:/1".to_vec());
        for t in texts {
            assert_eq!(first_digit(&t), naive(&t), "{t:?}");
        }
    }

    #[test]
    fn origins_map_as_the_lifts_do() {
        let a = "select x from t where a = 1 and b = 22 and c = 'ü'";
        let b = "select x from t where a = 1234 and b = 2 and c = 'ü'";
        let got = via(a, b).expect("reused");
        let want = lift(b.as_bytes(), false).expect("lifts");
        // Storage reused from an earlier origin is cleared first.
        let mut o1 = Origin { edits: vec![[9; 4]; 3], literals: b"junk".to_vec() };
        got.origin_into(b.as_bytes(), &mut o1);
        let o2 = Origin::new(b.as_bytes(), &want);
        assert_eq!((o1.edits, o1.literals), (o2.edits, o2.literals));
    }

    /// Every digit run of `sql` replaced by `with`.
    fn renumber(sql: &str, with: &str) -> String {
        let mut out = String::new();
        let mut in_digits = false;
        for c in sql.chars() {
            if c.is_ascii_digit() {
                if !in_digits {
                    out.push_str(with);
                }
                in_digits = true;
            } else {
                in_digits = false;
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn whatever_a_template_takes_lifts_the_same() {
        let queries = [
            "select * from t where a = 1 and b = 2 order by 1, 2 limit 3 offset 4",
            "select a::numeric(10, 2), b::int[3] from t where c = 5 fetch first 6 rows only",
            "insert into t values (1, 2, 'x') on conflict (a) where b = 3 do update set c = 4",
            "update t set a = a + 1, b = -2 where c in (3, 4, 5)",
            "delete from t where a = 1 and b <> - 2147483647",
            "with x as (select 1 as n) select n + 2 from x where n = 3",
            "select t.a, x[1], f(2)[3] from t, lateral g(4) as q(z numeric(5))",
            "values (1, 2), (3, 4)",
            "select $$ 1 $$, e'\\ 2', \"c 3\", 4 /* 5 */ -- 6\n + 7",
            "select 1 from t where a between 2 and 3 group by 1",
            "select distinct a from t where b = 1 order by 1",
            "select interval '1' second(3), current_time(2), 5",
        ];
        let mut reused = 0;
        for q in queries {
            let Some(l) = lift(q.as_bytes(), false) else { continue };
            assert!(Template::new(q.as_bytes(), &l, false).is_some(), "{q}");
            for with in ["0", "7", "00012", "2147483647", "2147483648", "5000000000", "9223372036854775808", "1"] {
                reused += usize::from(via(q, &renumber(q, with)).is_some());
            }
        }
        assert!(reused >= 10, "{reused}");
    }
}
