//! Recognizes, in client SQL, the statements that change session settings or transaction
//! boundaries (SET, RESET, DISCARD ALL, BEGIN, COMMIT, ROLLBACK, `set_config`), so the
//! session can keep `state::Settings` in step. What the settings are is `state::settings`.

/// A session-state statement seen in a simple Query.
#[derive(Debug, PartialEq, Eq)]
pub enum SettingStmt {
    /// `SET [SESSION] name …`: (lowercased name, statement text).
    Set(String, String),
    /// `RESET name`.
    Reset(String),
    /// `RESET ALL`, `DISCARD ALL`.
    ResetAll,
}

/// Recognizes one SET/RESET/DISCARD ALL statement. Returns None for anything else, for
/// `SET LOCAL`, and for strings holding more than one statement.
pub fn parse_setting_stmt(sql: &[u8]) -> Option<SettingStmt> {
    let text = std::str::from_utf8(sql).ok()?.trim();
    let text = text.trim_end_matches(|c: char| c == ';' || c.is_whitespace());
    if text.contains(';') || text.contains("--") || text.contains("/*") {
        return None;
    }
    let mut words = text.split_whitespace();
    let first = words.next()?.to_ascii_lowercase();
    match first.as_str() {
        "set" => {
            let mut name = words.next()?.to_ascii_lowercase();
            if name == "local" {
                return None;
            }
            if name == "session" {
                name = words.next()?.to_ascii_lowercase();
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
            if name == "transaction" {
                return None;
            }
            let name = name.split('=').next()?.trim_matches('"').to_owned();
            if name.is_empty() {
                return None;
            }
            Some(SettingStmt::Set(name, text.into()))
        }
        "reset" => {
            let name = words.next()?.to_ascii_lowercase();
            if name == "all" {
                return Some(SettingStmt::ResetAll);
            }
            if name == "session" {
                return Some(SettingStmt::Reset("session_authorization".into()));
            }
            Some(SettingStmt::Reset(name.trim_matches('"').to_owned()))
        }
        "discard" => {
            let what = words.next()?.to_ascii_lowercase();
            (what == "all").then_some(SettingStmt::ResetAll)
        }
        _ => None,
    }
}

/// Every setting statement in a (possibly multi-statement) Query text.
pub fn setting_stmts(sql: &[u8]) -> Vec<SettingStmt> {
    session_stmts(sql).into_iter().filter_map(|t| if let TxStmt::Setting(s) = t { Some(s) } else { None }).collect()
}

/// A statement that matters for which settings persist.
#[derive(Debug, PartialEq, Eq)]
pub enum TxStmt {
    /// BEGIN / START TRANSACTION.
    Begin,
    /// COMMIT / END.
    Commit,
    /// ROLLBACK / ABORT (not ROLLBACK TO SAVEPOINT).
    Rollback,
    /// SET / RESET / DISCARD ALL.
    Setting(SettingStmt),
}

/// The transaction-control and setting statements of a Query text, in order.
pub fn session_stmts(sql: &[u8]) -> Vec<TxStmt> {
    let mut out = Vec::new();
    for r in crate::stmt::sql::split(sql) {
        let stmt = &sql[r];
        if let Some(s) = parse_setting_stmt(stmt) {
            out.push(TxStmt::Setting(s));
            continue;
        }
        let text = String::from_utf8_lossy(stmt).to_ascii_lowercase();
        let mut words = text.split_whitespace();
        match (words.next(), words.next()) {
            (Some("begin"), _) | (Some("start"), Some("transaction")) => out.push(TxStmt::Begin),
            (Some("commit" | "end"), w) if w != Some("prepared") => out.push(TxStmt::Commit),
            (Some("rollback" | "abort"), w) if !matches!(w, Some("to" | "prepared")) && !text.contains(" to ") => {
                out.push(TxStmt::Rollback)
            }
            _ => {}
        }
    }
    out
}

/// Whether the text may call `set_config(name, value, is_local)` with `is_local` not a
/// literal true: a session-level change parsnip does not track, which would stay on the
/// server connection for the next client. Looks only where a '_' is (rare in queries);
/// false positives (the word in a string or a function body) are harmless.
pub fn may_set_session_config(sql: &[u8]) -> bool {
    let mut from = 0;
    while let Some(p) = sql[from..].iter().position(|&b| b == b'_') {
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
        // The last top-level argument, up to the closing parenthesis.
        let (mut depth, mut last, mut end) = (0usize, 1, None);
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
                b',' if depth == 1 => last = i + 1,
                _ => {}
            }
        }
        let Some(end) = end else { return true };
        let arg = args[last..end].trim_ascii();
        let local = [&b"true"[..], b"'true'", b"'t'", b"'on'", b"on"].iter().any(|k| arg.eq_ignore_ascii_case(k));
        if !local {
            return true;
        }
    }
    false
}

/// Whether the text (after leading whitespace) starts with one of `keywords` (lower case).
fn starts_with_any(sql: &[u8], keywords: &[&[u8]]) -> bool {
    let s = sql.trim_ascii_start();
    keywords.iter().any(|k| s.len() >= k.len() && s[..k.len()].eq_ignore_ascii_case(k))
}

/// Quick check: may this text end a transaction (COMMIT, END, ROLLBACK, ABORT)?
pub fn maybe_tx_end(sql: &[u8]) -> bool {
    starts_with_any(sql, &[b"commit", b"end", b"rollback", b"abort"]) || may_hold_several(sql.trim_ascii_start())
}

/// Quick check: may this text open a transaction block (BEGIN, START TRANSACTION)?
pub fn maybe_tx_start(sql: &[u8]) -> bool {
    starts_with_any(sql, &[b"begin", b"start"])
}

/// False when the text is surely one statement: no ';', or only whitespace after the
/// first one (pgbench and many drivers end every query with ';'). True may be wrong
/// (a ';' in a literal): callers then split the text properly.
#[inline]
fn may_hold_several(sql: &[u8]) -> bool {
    match sql.iter().position(|&b| b == b';') {
        Some(i) => !sql[i + 1..].iter().all(u8::is_ascii_whitespace),
        None => false,
    }
}

/// Quick pre-check for a statement that `session_stmts` may find something in: SET, RESET,
/// DISCARD, or transaction control (BEGIN, START, COMMIT, END, ROLLBACK, ABORT).
pub fn maybe_session_stmt(sql: &[u8]) -> bool {
    maybe_setting_stmt(sql) || maybe_tx_start(sql) || starts_with_any(sql, &[b"commit", b"end", b"rollback", b"abort"])
}

/// Quick pre-check before `parse_setting_stmt`: does the text start with SET/RESET/DISCARD?
#[inline]
pub fn maybe_setting_stmt(sql: &[u8]) -> bool {
    starts_like_setting(sql) || (may_hold_several(sql) && !setting_stmts(sql).is_empty())
}

fn starts_like_setting(sql: &[u8]) -> bool {
    starts_with_any(sql, &[b"set", b"reset", b"discard"])
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn multi_statement_sets_are_all_tracked() {
        let v = setting_stmts(b"SET statement_timeout = '300ms'; SET search_path = s_a");
        assert_eq!(v.len(), 2);
        assert_eq!(setting_stmts(b"SET x = 1; SELECT 1").len(), 1);
    }
}
