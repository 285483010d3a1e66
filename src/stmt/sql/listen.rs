//! Recognizing `LISTEN channel`, `UNLISTEN channel` and `UNLISTEN *` as the whole of a
//! simple Query's text (trailing semicolons, whitespace and comments allowed), with the
//! channel name as PostgreSQL's parser makes it: an unquoted name folded to lower case
//! (ASCII letters only, as PostgreSQL folds in a multibyte encoding), a quoted one kept
//! byte for byte (`""` read as `"`). Anything PostgreSQL would answer otherwise (an error:
//! a reserved keyword, an empty quoted name; a NOTICE: a name truncated to 63 bytes) and
//! any form this does not read (`U&"…"`) is not recognized: the caller sends it to the
//! server as before.

use crate::stmt::lex::{self, Kind};

/// A LISTEN or UNLISTEN the pooler answers itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListenCmd {
    /// `LISTEN channel`.
    Listen(Box<[u8]>),
    /// `UNLISTEN channel`.
    Unlisten(Box<[u8]>),
    /// `UNLISTEN *`.
    UnlistenAll,
}

/// The longest channel name PostgreSQL keeps (NAMEDATALEN - 1).
const MAX_NAME: usize = 63;

/// Keywords PostgreSQL's grammar does not take as a channel name (`ColId` is an identifier,
/// an unreserved keyword or a column-name keyword): the reserved and type/function-name
/// keywords.
const NOT_COL_ID: [&[u8]; 101] = [
    b"all",
    b"analyse",
    b"analyze",
    b"and",
    b"any",
    b"array",
    b"as",
    b"asc",
    b"asymmetric",
    b"both",
    b"case",
    b"cast",
    b"check",
    b"collate",
    b"column",
    b"constraint",
    b"create",
    b"current_catalog",
    b"current_date",
    b"current_role",
    b"current_time",
    b"current_timestamp",
    b"current_user",
    b"default",
    b"deferrable",
    b"desc",
    b"distinct",
    b"do",
    b"else",
    b"end",
    b"except",
    b"false",
    b"fetch",
    b"for",
    b"foreign",
    b"from",
    b"grant",
    b"group",
    b"having",
    b"in",
    b"initially",
    b"intersect",
    b"into",
    b"lateral",
    b"leading",
    b"limit",
    b"localtime",
    b"localtimestamp",
    b"not",
    b"null",
    b"offset",
    b"on",
    b"only",
    b"or",
    b"order",
    b"placing",
    b"primary",
    b"references",
    b"returning",
    b"select",
    b"session_user",
    b"some",
    b"symmetric",
    b"system_user",
    b"table",
    b"then",
    b"to",
    b"trailing",
    b"true",
    b"union",
    b"unique",
    b"user",
    b"using",
    b"variadic",
    b"when",
    b"where",
    b"window",
    b"with",
    b"authorization",
    b"binary",
    b"collation",
    b"concurrently",
    b"cross",
    b"current_schema",
    b"freeze",
    b"full",
    b"ilike",
    b"inner",
    b"is",
    b"isnull",
    b"join",
    b"left",
    b"like",
    b"natural",
    b"notnull",
    b"outer",
    b"overlaps",
    b"right",
    b"similar",
    b"tablesample",
    b"verbose",
];

/// Whether the text may be a LISTEN or UNLISTEN: its first byte after blanks starts one (or
/// a comment). Cheap, for every Query.
#[inline]
pub(crate) fn maybe_listen(sql: &[u8]) -> bool {
    matches!(sql.iter().find(|b| !b.is_ascii_whitespace()), Some(b'l' | b'L' | b'u' | b'U' | b'-' | b'/'))
}

/// The text as one LISTEN/UNLISTEN command (see the module doc), or None.
pub(crate) fn parse_listen(sql: &[u8]) -> Option<ListenCmd> {
    let mut toks = lex::solid(sql);
    let first = toks.next()?;
    if first.kind != Kind::Word {
        return None;
    }
    let verb = &sql[first.range.clone()];
    let listen = if verb.eq_ignore_ascii_case(b"listen") {
        true
    } else if verb.eq_ignore_ascii_case(b"unlisten") {
        false
    } else {
        return None;
    };
    let name = toks.next()?;
    let text = &sql[name.range.clone()];
    let cmd = match name.kind {
        Kind::Punct(b'*') if !listen => ListenCmd::UnlistenAll,
        Kind::Word => {
            let folded = text.to_ascii_lowercase();
            if NOT_COL_ID.contains(&folded.as_slice()) || folded.len() > MAX_NAME {
                return None;
            }
            channel(listen, folded)
        }
        Kind::Ident if name.closed && text.first() == Some(&b'"') && text.len() > 2 => {
            let inner = &text[1..text.len() - 1];
            let mut out = Vec::with_capacity(inner.len());
            let mut i = 0;
            while i < inner.len() {
                out.push(inner[i]);
                // `""` inside stands for one `"` (the lexer guarantees they come in pairs).
                i += if inner[i] == b'"' { 2 } else { 1 };
            }
            if out.len() > MAX_NAME {
                return None;
            }
            channel(listen, out)
        }
        _ => return None,
    };
    // Only semicolons may follow: a second statement is not answered here.
    toks.all(|t| t.kind == Kind::Punct(b';')).then_some(cmd)
}

fn channel(listen: bool, name: Vec<u8>) -> ListenCmd {
    if listen { ListenCmd::Listen(name.into()) } else { ListenCmd::Unlisten(name.into()) }
}

#[cfg(test)]
mod tests {
    use super::{ListenCmd, parse_listen};

    fn l(s: &str) -> Option<ListenCmd> {
        parse_listen(s.as_bytes())
    }

    #[test]
    fn reads_listen_and_unlisten() {
        assert_eq!(l("LISTEN Foo"), Some(ListenCmd::Listen((*b"foo").into())));
        assert_eq!(l("  listen \"MiXed\" ;; "), Some(ListenCmd::Listen((*b"MiXed").into())));
        assert_eq!(l("listen \"a\"\"b\""), Some(ListenCmd::Listen((*b"a\"b").into())));
        assert_eq!(l("/* hi */ UNLISTEN x -- bye"), Some(ListenCmd::Unlisten((*b"x").into())));
        assert_eq!(l("unlisten *;"), Some(ListenCmd::UnlistenAll));
        assert_eq!(l("listen name"), Some(ListenCmd::Listen((*b"name").into())));
        assert_eq!(l("listen \"ü Ω\""), Some(ListenCmd::Listen("ü Ω".as_bytes().into())));
    }

    #[test]
    fn leaves_everything_else_to_the_server() {
        for s in [
            "listen",
            "listen *",
            "listen select",
            "listen \"\"",
            "listen a b",
            "listen a; select 1",
            "select 1; listen a",
            "listen U&\"a\"",
            "listen 'a'",
            "notify a",
            "listen \"unterminated",
            &format!("listen {}", "a".repeat(64)),
        ] {
            assert_eq!(l(s), None, "{s}");
        }
    }
}
