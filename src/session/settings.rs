//! Recognizes, in client SQL, the statements that change session settings or transaction
//! boundaries (SET, RESET, DISCARD ALL, BEGIN, COMMIT, ROLLBACK, `set_config`), so the
//! session can keep `state::Settings` in step. What the settings are is `state::settings`;
//! the words are read with the statement lexer (`stmt::sql`).

use crate::stmt::sql;

/// A session-state statement seen in a simple Query.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SettingStmt {
    /// `SET [SESSION] name …`: (lowercased name, statement text).
    Set(String, String),
    /// `RESET name`.
    Reset(String),
    /// `RESET ALL`, `DISCARD ALL`.
    ResetAll,
}

/// Recognizes one SET/RESET/DISCARD ALL statement. Returns None for anything else, for
/// `SET LOCAL`, and for strings holding more than one statement. Comments are read past
/// (ORMs and tracing libraries tag statements with them); a SET's text is replayed as
/// written, so one holding `--` is kept with a line break after it, lest that comment
/// swallow the `;` the replay writes next.
pub(crate) fn parse_setting_stmt(sql: &[u8]) -> Option<SettingStmt> {
    let text = std::str::from_utf8(sql).ok()?.trim();
    let text = text.trim_end_matches(|c: char| c == ';' || c.is_whitespace());
    if sql::split(text.as_bytes()).len() > 1 {
        return None;
    }
    let mut words = sql::words(text.as_bytes()).map(|w| String::from_utf8_lossy(w).to_ascii_lowercase());
    let first = words.next()?;
    match first.as_str() {
        "set" => {
            let mut name = words.next()?;
            if name == "local" {
                return None;
            }
            if name == "session" {
                name = words.next()?;
                match name.as_str() {
                    "authorization" => {
                        return Some(SettingStmt::Set("session_authorization".into(), text.into()));
                    }
                    "characteristics" => {
                        return Some(SettingStmt::Set("transaction_characteristics".into(), text.into()));
                    }
                    _ => {}
                }
            }
            if name == "transaction" || name == "constraints" {
                // Transaction-level: ends with the transaction.
                return None;
            }
            // SQL's own spellings of some settings (`SET TIME ZONE`, `SET NAMES`, `SET
            // SCHEMA`, `SET XML OPTION`) name the setting they change differently.
            let second = words.next();
            let name = match (name.as_str(), second.as_deref()) {
                ("time", Some("zone")) => "timezone".to_owned(),
                ("names", _) => "client_encoding".to_owned(),
                ("schema", _) => "search_path".to_owned(),
                ("xml", Some("option")) => "xmloption".to_owned(),
                _ => name.trim_matches('"').to_owned(),
            };
            if name.is_empty() || name == "=" {
                return None;
            }
            let kept = if text.contains("--") { format!("{text}\n") } else { text.into() };
            Some(SettingStmt::Set(name, kept))
        }
        "reset" => {
            let name = words.next()?;
            if name == "all" {
                return Some(SettingStmt::ResetAll);
            }
            if name == "session" {
                return Some(SettingStmt::Reset("session_authorization".into()));
            }
            match (name.as_str(), words.next().as_deref()) {
                ("time", Some("zone")) => Some(SettingStmt::Reset("timezone".into())),
                // RESET TRANSACTION ISOLATION LEVEL: transaction-level.
                ("transaction", _) => None,
                _ => Some(SettingStmt::Reset(name.trim_matches('"').to_owned())),
            }
        }
        "discard" => (words.next()? == "all").then_some(SettingStmt::ResetAll),
        _ => None,
    }
}

/// Whether the text may hold a setting statement (`parse_setting_stmt`: SET, RESET,
/// DISCARD ALL): false when neither word is in it, whatever the case (a transaction
/// control statement alone, BEGIN or COMMIT, is settled without lexing it).
pub(crate) fn may_hold_setting(sql: &[u8]) -> bool {
    sql.windows(3).any(|w| w.eq_ignore_ascii_case(b"set")) || sql.windows(7).any(|w| w.eq_ignore_ascii_case(b"discard"))
}

/// Every setting statement in a (possibly multi-statement) Query text.
#[cfg(test)]
pub(crate) fn setting_stmts(sql: &[u8]) -> Vec<SettingStmt> {
    session_stmts(sql).into_iter().filter_map(|t| if let TxStmt::Setting(s) = t { Some(s) } else { None }).collect()
}

/// A statement that matters for which settings persist.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TxStmt {
    /// BEGIN / START TRANSACTION.
    Begin,
    /// COMMIT / END.
    Commit,
    /// ROLLBACK / ABORT (not ROLLBACK TO SAVEPOINT).
    Rollback,
    /// SET / RESET / DISCARD ALL.
    Setting(SettingStmt),
    /// A SET or RESET `parse_setting_stmt` cannot read (`unreadable_setting`), or a `DO`
    /// block that may set something (`do_may_set`): what it changes is unknown.
    Unreadable,
}

/// The transaction-control and setting statements of a Query text, in order.
pub(crate) fn session_stmts(sql: &[u8]) -> Vec<TxStmt> {
    let mut out = Vec::new();
    for r in sql::split(sql) {
        let stmt = &sql[r];
        if let Some(s) = parse_setting_stmt(stmt) {
            out.push(TxStmt::Setting(s));
            continue;
        }
        if unreadable_setting(stmt) || do_may_set(stmt) {
            out.push(TxStmt::Unreadable);
            continue;
        }
        out.extend(tx_control(stmt));
    }
    out
}

/// A SET or RESET (one statement) that `parse_setting_stmt` could not read, other than
/// the transaction-level ones (`SET LOCAL`, `SET TRANSACTION`, `SET CONSTRAINTS`, `RESET
/// TRANSACTION …`): its text is not UTF-8, say, so it can be neither recorded nor replayed.
fn unreadable_setting(stmt: &[u8]) -> bool {
    let mut words = sql::words(stmt);
    let Some(first) = words.next() else { return false };
    if !(first.eq_ignore_ascii_case(b"set") || first.eq_ignore_ascii_case(b"reset")) {
        return false;
    }
    !words
        .next()
        .is_some_and(|w| [&b"local"[..], b"transaction", b"constraints"].iter().any(|k| w.eq_ignore_ascii_case(k)))
}

/// The transaction-control statement `stmt` (one statement) is, if any: BEGIN, COMMIT or
/// ROLLBACK (not COMMIT/ROLLBACK PREPARED, not ROLLBACK TO SAVEPOINT).
fn tx_control(stmt: &[u8]) -> Option<TxStmt> {
    let mut words = sql::words(stmt);
    let is = |w: Option<&[u8]>, k: &str| w.is_some_and(|w| w.eq_ignore_ascii_case(k.as_bytes()));
    let (first, second) = (words.next(), words.next());
    if is(first, "begin") || (is(first, "start") && is(second, "transaction")) {
        Some(TxStmt::Begin)
    } else if (is(first, "commit") || is(first, "end")) && !is(second, "prepared") {
        Some(TxStmt::Commit)
    } else if (is(first, "rollback") || is(first, "abort"))
        && !is(second, "prepared")
        && !is(second, "to")
        && !words.any(|w| w.eq_ignore_ascii_case(b"to"))
    {
        Some(TxStmt::Rollback)
    } else {
        None
    }
}

/// A Query text that is one transaction-control statement written bare (`tx_control`): its
/// keyword, at most WORK or TRANSACTION after it, then nothing but a ';' (no transaction
/// modes, no AND CHAIN): what the session answers itself around a deferred BEGIN
/// (`session::begin`).
pub(crate) fn bare_tx_stmt(sql: &[u8]) -> Option<TxStmt> {
    let mut w = sql::words(sql);
    w.next()?;
    let mut next = w.next();
    if next.is_some_and(|n| n.eq_ignore_ascii_case(b"work") || n.eq_ignore_ascii_case(b"transaction")) {
        next = w.next();
    }
    if next == Some(&b";"[..]) {
        next = w.next();
    }
    next.is_none().then(|| tx_control(sql)).flatten()
}

/// Whether the text may call `set_config(name, value, is_local)` with `is_local` not a
/// literal true: a session-level change that would stay on the server connection for the
/// next client unless followed (`session::config`). Looks only where a '_' is (rare in
/// queries); false positives (the word in a string or a function body) are harmless.
pub(crate) fn may_set_session_config(sql: &[u8]) -> bool {
    !session_config_calls(sql).is_empty()
}

/// The first argument of a `set_config` call: the name of the setting it changes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConfigName {
    /// A plain string literal: the name itself.
    Literal(String),
    /// A bare parameter `$n` (1-based): the name comes with the Bind.
    Param(usize),
}

/// The names of the settings the text's session-level `set_config` calls (those
/// `may_set_session_config` finds) change, in order; None when one of them is neither a
/// plain string literal nor a bare parameter (an expression, an unclosed call).
pub(crate) fn session_config_names(sql: &[u8]) -> Option<Vec<ConfigName>> {
    session_config_calls(sql).into_iter().map(|arg| arg.and_then(config_name)).collect()
}

fn config_name(arg: &[u8]) -> Option<ConfigName> {
    if let Some(n) = arg.strip_prefix(b"$") {
        let n: usize = std::str::from_utf8(n).ok()?.parse().ok()?;
        return (n >= 1).then_some(ConfigName::Param(n));
    }
    // '…' with '' for a quote; a backslash reads differently without standard_conforming_strings.
    let inner = arg.strip_prefix(b"'")?.strip_suffix(b"'")?;
    if inner.contains(&b'\\') {
        return None;
    }
    let text = std::str::from_utf8(inner).ok()?;
    let name = text.replace("''", "'");
    (name.len() + name.matches('\'').count() == text.len() && !name.contains('\0')).then_some(ConfigName::Literal(name))
}

/// The first argument (trimmed) of each `set_config` call of the text whose last argument
/// is not a literal true; None for a call whose arguments do not close.
fn session_config_calls(sql: &[u8]) -> Vec<Option<&[u8]>> {
    let mut calls = Vec::new();
    let mut from = 0;
    while let Some(p) = memchr::memchr(b'_', &sql[from..]) {
        let at = from + p;
        from = at + 1;
        if at < 3 || !sql[at - 3..at].eq_ignore_ascii_case(b"set") {
            continue;
        }
        let rest = &sql[at + 1..];
        if rest.len() < 6 || !rest[..6].eq_ignore_ascii_case(b"config") {
            continue;
        }
        let args = rest[6..].trim_ascii_start();
        if args.first() != Some(&b'(') {
            continue;
        }
        // The first and the last top-level argument, up to the closing parenthesis.
        let (mut depth, mut first_end, mut last, mut end) = (0usize, None, 1, None);
        let mut quoted = false;
        for (i, &b) in args.iter().enumerate() {
            match b {
                b'\'' => quoted = !quoted,
                _ if quoted => {}
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(i);
                        break;
                    }
                }
                b',' if depth == 1 => {
                    first_end.get_or_insert(i);
                    last = i + 1;
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            calls.push(None);
            continue;
        };
        let arg = args[last..end].trim_ascii();
        let local = [&b"true"[..], b"'true'", b"'t'", b"'on'", b"on"].iter().any(|k| arg.eq_ignore_ascii_case(k));
        if !local {
            calls.push(Some(args[1..first_end.unwrap_or(end)].trim_ascii()));
        }
    }
    calls
}

/// Whether the text (after leading whitespace and comments) starts with one of `keywords`
/// (lower case).
fn starts_with_any(sql: &[u8], keywords: &[&[u8]]) -> bool {
    let s = &sql[sql::skip_space(sql)..];
    keywords.iter().any(|k| s.len() >= k.len() && s[..k.len()].eq_ignore_ascii_case(k))
}

/// Quick check: may this text end a transaction (COMMIT, END, ROLLBACK, ABORT)?
pub(crate) fn maybe_tx_end(sql: &[u8]) -> bool {
    starts_with_any(sql, &[b"commit", b"end", b"rollback", b"abort"]) || may_hold_several(sql.trim_ascii_start())
}

/// Quick check: may this text open a transaction block (BEGIN, START TRANSACTION)?
pub(crate) fn maybe_tx_start(sql: &[u8]) -> bool {
    starts_with_any(sql, &[b"begin", b"start"])
}

/// False when the text is surely one statement: no ';', or only whitespace after the
/// first one (pgbench and many drivers end every query with ';'). True may be wrong
/// (a ';' in a literal): callers then split the text properly.
#[inline]
pub(crate) fn may_hold_several(sql: &[u8]) -> bool {
    match memchr::memchr(b';', sql) {
        Some(i) => !sql[i + 1..].iter().all(u8::is_ascii_whitespace),
        None => false,
    }
}

/// Quick pre-check for a statement that `session_stmts` may find something in: SET, RESET,
/// DISCARD, or transaction control (BEGIN, START, COMMIT, END, ROLLBACK, ABORT).
pub(crate) fn maybe_session_stmt(sql: &[u8]) -> bool {
    maybe_setting_stmt(sql) || maybe_tx_start(sql) || starts_with_any(sql, &[b"commit", b"end", b"rollback", b"abort"])
}

/// Quick pre-check before `parse_setting_stmt`: does the text start with SET/RESET/DISCARD?
#[inline]
pub(crate) fn maybe_setting_stmt(sql: &[u8]) -> bool {
    starts_like_setting(sql)
        || (may_hold_several(sql)
            && session_stmts(sql).iter().any(|t| matches!(t, TxStmt::Setting(_) | TxStmt::Unreadable)))
}

fn starts_like_setting(sql: &[u8]) -> bool {
    starts_with_any(sql, &[b"set", b"reset", b"discard"]) || (starts_with_any(sql, &[b"do"]) && do_may_set(sql))
}

/// A `DO` block (one statement) that may change settings: PL/pgSQL's own `SET` (or a
/// dynamic one) is session-level, and lasts past the block. What it sets is not read.
fn do_may_set(stmt: &[u8]) -> bool {
    sql::words(stmt).next().is_some_and(|w| w.eq_ignore_ascii_case(b"do")) && may_hold_setting(stmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_spellings_name_the_setting_they_change() {
        let set = |sql: &str| match parse_setting_stmt(sql.as_bytes()) {
            Some(SettingStmt::Set(name, _)) => name,
            other => panic!("{sql}: {other:?}"),
        };
        assert_eq!(set("SET NAMES 'LATIN1'"), "client_encoding");
        assert_eq!(set("SET TIME ZONE 'Europe/Paris'"), "timezone");
        assert_eq!(set("SET SESSION TIME ZONE LOCAL"), "timezone");
        assert_eq!(set("SET SCHEMA 'pg_catalog'"), "search_path");
        assert_eq!(set("SET XML OPTION CONTENT"), "xmloption");
        assert_eq!(parse_setting_stmt(b"RESET TIME ZONE"), Some(SettingStmt::Reset("timezone".into())));
        assert_eq!(parse_setting_stmt(b"SET CONSTRAINTS ALL DEFERRED"), None);
        assert_eq!(parse_setting_stmt(b"RESET TRANSACTION ISOLATION LEVEL"), None);
    }

    #[test]
    fn recognizes_setting_statements() {
        assert_eq!(
            parse_setting_stmt(b"  SET search_path TO a, b;"),
            Some(SettingStmt::Set("search_path".into(), "SET search_path TO a, b".into()))
        );
        assert_eq!(
            parse_setting_stmt(b"set statement_timeout=5"),
            Some(SettingStmt::Set("statement_timeout".into(), "set statement_timeout=5".into()))
        );
        assert_eq!(parse_setting_stmt(b"SET LOCAL x = 1"), None);
        assert_eq!(parse_setting_stmt(b"SET x = 1; SELECT 1"), None);
        assert_eq!(parse_setting_stmt(b"RESET ALL"), Some(SettingStmt::ResetAll));
        assert_eq!(parse_setting_stmt(b"discard all"), Some(SettingStmt::ResetAll));
        assert_eq!(parse_setting_stmt(b"RESET work_mem"), Some(SettingStmt::Reset("work_mem".into())));
        assert!(maybe_setting_stmt(b" set x=1") && !maybe_setting_stmt(b"select 1"));
        assert!(maybe_setting_stmt(b"select 1; set x=1") && maybe_setting_stmt(b"select ';';reset x"));
        assert!(!maybe_setting_stmt(b"select 1; \n") && !maybe_setting_stmt(b"select 1;select 2"));
        assert!(maybe_tx_end(b"select 1; commit") && !maybe_tx_end(b"select 1;") && maybe_tx_end(b"END;"));
        // Every text that holds a setting statement may hold one; transaction control alone not.
        for t in
            ["SET x = 1", "reset all", "RESET work_mem", "Discard ALL", "begin; set x=1", "SET SESSION AUTHORIZATION u"]
        {
            assert!(may_hold_setting(t.as_bytes()), "{t}");
        }
        for t in ["BEGIN", "END", "commit", "ROLLBACK", "START TRANSACTION ISOLATION LEVEL SERIALIZABLE", "abort"] {
            assert!(!may_hold_setting(t.as_bytes()), "{t}");
            assert!(session_stmts(t.as_bytes()).iter().all(|s| !matches!(s, TxStmt::Setting(_))), "{t}");
        }
    }

    #[test]
    fn session_level_set_config() {
        for sql in [
            "SELECT set_config('work_mem', '8MB', false)",
            "select pg_catalog.SET_CONFIG ( 'a.b', f(1, 2), $3 )",
            "SELECT set_config('x', 'y', true), set_config('z', 'w', false)",
            "SELECT set_config('x', 'y'",
        ] {
            assert!(may_set_session_config(sql.as_bytes()), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "SELECT set_config('request.jwt', $1, true)",
            "select set_config('a', 'it''s, (odd)', TRUE)",
            "SELECT my_set_configuration()",
            "SELECT reset_config",
        ] {
            assert!(!may_set_session_config(sql.as_bytes()), "{sql}");
        }
    }

    #[test]
    fn names_of_session_level_set_config_calls() {
        use ConfigName::{Literal, Param};
        let names = |sql: &str| session_config_names(sql.as_bytes());
        assert_eq!(names("select set_config($1, $2, false)"), Some(vec![Param(1)]));
        assert_eq!(
            names("SELECT pg_catalog.set_config( 'Work_Mem' , '8MB', false)"),
            Some(vec![Literal("Work_Mem".into())])
        );
        assert_eq!(
            names("SELECT set_config('x', 'y', true), set_config('it''s', $1, $2), set_config($3, 'v', false)"),
            Some(vec![Literal("it's".into()), Param(3)])
        );
        assert_eq!(names("SELECT 1"), Some(vec![]));
        // Not a literal or a bare parameter: the name cannot be known.
        for sql in [
            "SELECT set_config(name, 'v', false) FROM t",
            "SELECT set_config($1::text, 'v', false)",
            "SELECT set_config('a' || 'b', 'v', false)",
            "SELECT set_config(E'a', 'v', false)",
            "SELECT set_config('a\\b', 'v', false)",
            "SELECT set_config('x', 'y'",
            "SELECT set_config($0, 'v', false)",
        ] {
            assert_eq!(names(sql), None, "{sql}");
        }
    }

    #[test]
    fn words_are_read_with_the_statement_lexer() {
        // A ';' inside a literal is not a second statement.
        assert_eq!(
            parse_setting_stmt(b"SET search_path = 'a;b'"),
            Some(SettingStmt::Set("search_path".into(), "SET search_path = 'a;b'".into()))
        );
        assert_eq!(
            parse_setting_stmt(b"set myapp.user_id=42"),
            Some(SettingStmt::Set("myapp.user_id".into(), "set myapp.user_id=42".into()))
        );
        // Comments are read past; a `--` one is kept ended, for the replay's `;`.
        assert_eq!(
            parse_setting_stmt(b"SET x = 1 -- note"),
            Some(SettingStmt::Set("x".into(), "SET x = 1 -- note\n".into()))
        );
        assert_eq!(
            parse_setting_stmt(b"/* app='web' */ SET /* c */ search_path = a /* d */;"),
            Some(SettingStmt::Set("search_path".into(), "/* app='web' */ SET /* c */ search_path = a /* d */".into()))
        );
        assert_eq!(parse_setting_stmt(b"RESET\n\"Work_Mem\""), Some(SettingStmt::Reset("work_mem".into())));
        // Keywords behind comments and line breaks.
        assert_eq!(session_stmts(b"/* tx */ BEGIN"), vec![TxStmt::Begin]);
        assert_eq!(session_stmts(b"ROLLBACK\tTO SAVEPOINT a"), vec![]);
        assert_eq!(session_stmts(b"rollback work to\nsp"), vec![]);
        assert_eq!(session_stmts(b"ROLLBACK; COMMIT PREPARED 'x'"), vec![TxStmt::Rollback]);
        assert!(maybe_tx_start(b"-- c\nbegin") && maybe_setting_stmt(b"/* a */ SET x = 1"));
    }

    #[test]
    fn multi_statement_sets_are_all_tracked() {
        let v = setting_stmts(b"SET statement_timeout = '300ms'; SET search_path = s_a");
        assert_eq!(v.len(), 2);
        assert_eq!(setting_stmts(b"SET x = 1; SELECT 1").len(), 1);
    }

    #[test]
    fn bare_begins() {
        let begin = |sql: &[u8]| bare_tx_stmt(sql) == Some(TxStmt::Begin);
        for yes in [
            &b"BEGIN"[..],
            b"begin;",
            b"  Begin ;  ",
            b"BEGIN WORK",
            b"begin transaction;",
            b"START TRANSACTION",
            b"/* app */ BEGIN",
            b"BEGIN -- open\n",
        ] {
            assert!(begin(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b""[..],
            b";",
            b"BEGIN ISOLATION LEVEL SERIALIZABLE",
            b"BEGIN READ ONLY",
            b"START TRANSACTION READ WRITE",
            b"START",
            b"BEGIN; SELECT 1",
            b"BEGIN;;",
            b"BEGINNING",
            b"begin_x",
            b"COMMIT",
            b"SELECT 'BEGIN'",
            b"BEGIN WORK TRANSACTION",
            b"BEGIN TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ] {
            assert!(!begin(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn bare_transaction_ends() {
        for (sql, stmt) in [
            ("COMMIT", Some(TxStmt::Commit)),
            ("end;", Some(TxStmt::Commit)),
            ("commit work", Some(TxStmt::Commit)),
            (" END TRANSACTION ; ", Some(TxStmt::Commit)),
            ("ROLLBACK", Some(TxStmt::Rollback)),
            ("abort;", Some(TxStmt::Rollback)),
            ("rollback transaction", Some(TxStmt::Rollback)),
            ("COMMIT AND CHAIN", None),
            ("ROLLBACK TO SAVEPOINT a", None),
            ("COMMIT PREPARED 'x'", None),
            ("commit; select 1", None),
            ("ENDING", None),
            ("", None),
        ] {
            assert_eq!(bare_tx_stmt(sql.as_bytes()), stmt, "{sql}");
        }
        assert_eq!(bare_tx_stmt(b"BEGIN"), Some(TxStmt::Begin), "not an end");
    }
}
