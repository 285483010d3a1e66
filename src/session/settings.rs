//! Session settings a client expects to keep while its transactions move between server
//! connections: reported parameters (ParameterStatus: client_encoding, DateStyle, TimeZone,
//! application_name, …) and other settings made at startup or with a simple-protocol `SET`
//! outside a transaction (search_path, statement_timeout, …). On each link, the difference
//! between what the client expects and what the server has is replayed as one Query.

use std::hash::{Hash, Hasher};

/// Reported parameters a client may change and so must be carried between servers.
/// Other reported ones (server_version, is_superuser, …) are fixed per (database, user).
pub const TRACKED: &[&str] =
    &["application_name", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone", "standard_conforming_strings"];

/// The canonical name of a tracked reported parameter, matched case-insensitively.
pub fn tracked_name(name: &str) -> Option<&'static str> {
    TRACKED.iter().copied().find(|t| t.eq_ignore_ascii_case(name))
}

/// Settings as one side holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Tracked reported parameters: (canonical name, value).
    pub reported: Vec<(&'static str, String)>,
    /// Other settings: (lowercased name, SQL statement that sets it).
    pub extra: Vec<(String, String)>,
    key: u64,
}

impl Settings {
    /// Value of a tracked reported parameter.
    pub fn reported(&self, name: &str) -> Option<&str> {
        self.reported.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// Sets a tracked reported parameter; returns true if it changed.
    pub fn set_reported(&mut self, name: &'static str, value: &str) -> bool {
        match self.reported.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) if v == value => return false,
            Some((_, v)) => *v = value.to_owned(),
            None => self.reported.push((name, value.to_owned())),
        }
        self.rekey();
        true
    }

    /// Records a setting statement for `name` (replacing an earlier one).
    pub fn set_extra(&mut self, name: String, sql: String) {
        match self.extra.iter_mut().find(|(n, _)| *n == name) {
            Some((_, s)) => *s = sql,
            None => self.extra.push((name, sql)),
        }
        self.rekey();
    }

    /// Forgets the setting of `name` (RESET name).
    pub fn reset_extra(&mut self, name: &str) {
        self.extra.retain(|(n, _)| n != name);
        self.rekey();
    }

    /// Forgets all settings (RESET ALL, DISCARD ALL).
    pub fn reset_all_extra(&mut self) {
        self.extra.clear();
        self.rekey();
    }

    /// A fingerprint: equal keys mean nothing to replay.
    #[inline]
    pub fn key(&self) -> u64 {
        self.key
    }

    fn rekey(&mut self) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut r: Vec<_> = self.reported.iter().collect();
        r.sort();
        r.hash(&mut h);
        let mut e: Vec<_> = self.extra.iter().collect();
        e.sort();
        e.hash(&mut h);
        self.key = h.finish();
    }

    /// SQL that turns `server`'s settings into these; empty when nothing differs.
    pub fn diff_sql(&self, server: &Settings) -> String {
        let mut sql = String::new();
        for (name, value) in &self.reported {
            if server.reported(name) != Some(value.as_str()) {
                sql.push_str(&format!("SET {} = {};", quote_ident(name), quote_literal(value)));
            }
        }
        for (name, _) in &server.extra {
            if !self.extra.iter().any(|(n, _)| n == name) {
                sql.push_str(&reset_sql(name));
            }
        }
        for (name, stmt) in &self.extra {
            if !server.extra.iter().any(|(n, s)| n == name && s == stmt) {
                sql.push_str(stmt);
                sql.push(';');
            }
        }
        sql
    }
}

fn reset_sql(name: &str) -> String {
    match name {
        "role" => "RESET ROLE;".into(),
        "session_authorization" => "RESET SESSION AUTHORIZATION;".into(),
        "transaction_characteristics" => "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL DEFAULT;".into(),
        _ => format!("RESET {};", quote_ident(name)),
    }
}

/// Double-quotes an identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Single-quotes a literal (standard_conforming_strings assumed, as PostgreSQL ≥ 9.1).
pub fn quote_literal(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

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

/// Quick pre-check before `parse_setting_stmt`: does the text start with SET/RESET/DISCARD?
#[inline]
pub fn maybe_setting_stmt(sql: &[u8]) -> bool {
    let s = sql.trim_ascii_start();
    s.len() >= 3
        && (s[..3].eq_ignore_ascii_case(b"set")
            || (s.len() >= 5 && s[..5].eq_ignore_ascii_case(b"reset"))
            || (s.len() >= 7 && s[..7].eq_ignore_ascii_case(b"discard")))
}

/// Turns startup parameters other than user/database/options and the tracked reported ones
/// into settings statements; `options` (`-c name=value`, `--name=value`) too.
pub fn startup_extras(params: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in params {
        match k.as_str() {
            "user" | "database" | "replication" => {}
            "options" => {
                let mut it = v.split_whitespace();
                while let Some(tok) = it.next() {
                    let kv =
                        if tok == "-c" { it.next() } else { tok.strip_prefix("--").or_else(|| tok.strip_prefix("-c")) };
                    if let Some((name, value)) = kv.and_then(|kv| kv.split_once('=')) {
                        let name = name.replace('-', "_").to_ascii_lowercase();
                        if tracked_name(&name).is_none() {
                            out.push((name.clone(), format!("SET {} = {}", quote_ident(&name), quote_literal(value))));
                        }
                    }
                }
            }
            _ if k.starts_with("_pq_.") || tracked_name(k).is_some() => {}
            _ => {
                let name = k.to_ascii_lowercase();
                out.push((name.clone(), format!("SET {} = {}", quote_ident(&name), quote_literal(v))));
            }
        }
    }
    out
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
    }

    #[test]
    fn diff_replays_and_resets() {
        let mut client = Settings::default();
        client.set_reported("TimeZone", "UTC");
        client.set_extra("search_path".into(), "SET search_path TO a".into());
        let mut server = Settings::default();
        server.set_reported("TimeZone", "Europe/Paris");
        server.set_extra("work_mem".into(), "SET work_mem = '1MB'".into());
        assert_ne!(client.key(), server.key());
        let sql = client.diff_sql(&server);
        assert_eq!(sql, "SET \"TimeZone\" = 'UTC';RESET \"work_mem\";SET search_path TO a;");
        assert_eq!(client.clone().diff_sql(&client), "");
    }

    #[test]
    fn startup_options() {
        let p = vec![
            ("user".into(), "u".into()),
            ("options".into(), "-c search_path=x --work-mem=4MB".into()),
            ("TimeZone".into(), "UTC".into()),
            ("extra_float_digits".into(), "3".into()),
        ];
        let e = startup_extras(&p);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0], ("search_path".into(), "SET \"search_path\" = 'x'".into()));
        assert_eq!(e[1].0, "work_mem");
        assert_eq!(e[2].0, "extra_float_digits");
    }
}
