//! Session settings a client expects to keep while its transactions move between server
//! connections: reported parameters (ParameterStatus: client_encoding, DateStyle, TimeZone,
//! application_name, …) and other settings made at startup or with a simple-protocol `SET`
//! outside a transaction (search_path, statement_timeout, …). On each link, the difference
//! between what the client expects and what the server has is replayed as one Query.
//! Recognizing the SQL that changes them is the session's (`session::settings`).

use std::hash::{Hash, Hasher};

/// Reported parameters a client may change and so must be carried between servers.
/// Other reported ones (server_version, is_superuser, …) are fixed per (database, user).
pub(crate) const TRACKED: &[&str] =
    &["application_name", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone", "standard_conforming_strings"];

/// The canonical name of a tracked reported parameter, matched case-insensitively.
pub(crate) fn tracked_name(name: &str) -> Option<&'static str> {
    TRACKED.iter().copied().find(|t| t.eq_ignore_ascii_case(name))
}

/// Settings as one side holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Tracked reported parameters: (canonical name, value).
    pub(crate) reported: Vec<(&'static str, String)>,
    /// Other settings: (lowercased name, SQL statement that sets it).
    pub(crate) extra: Vec<(String, String)>,
    key: u64,
}

impl Settings {
    /// Value of a tracked reported parameter.
    pub(crate) fn reported(&self, name: &str) -> Option<&str> {
        self.reported.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// Sets a tracked reported parameter; returns true if it changed.
    pub(crate) fn set_reported(&mut self, name: &'static str, value: &str) -> bool {
        match self.reported.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) if v == value => return false,
            Some((_, v)) => *v = value.to_owned(),
            None => self.reported.push((name, value.to_owned())),
        }
        self.rekey();
        true
    }

    /// Records a setting statement for `name` (replacing an earlier one).
    pub(crate) fn set_extra(&mut self, name: String, sql: String) {
        match self.extra.iter_mut().find(|(n, _)| *n == name) {
            Some((_, s)) => *s = sql,
            None => self.extra.push((name, sql)),
        }
        self.rekey();
    }

    /// Takes over `other`'s non-reported settings (they were just replayed).
    pub(crate) fn copy_extra_from(&mut self, other: &Settings) {
        if self.extra != other.extra {
            self.extra = other.extra.clone();
            self.rekey();
        }
    }

    /// Forgets the setting of `name` (RESET name).
    pub(crate) fn reset_extra(&mut self, name: &str) {
        self.extra.retain(|(n, _)| n != name);
        self.rekey();
    }

    /// One of the settings beyond the reported ones is a timeout (`statement_timeout`,
    /// `lock_timeout`, `idle_session_timeout`, …): it acts on whatever the server runs
    /// next, not only on this client's statements.
    pub(crate) fn sets_a_timeout(&self) -> bool {
        self.extra.iter().any(|(n, _)| is_timeout(n))
    }

    /// `RESET` of each timeout `server` has that these settings do not have alike; empty
    /// when there is none. It runs on its own, before the rest of the replay: a short timeout
    /// another client left there would otherwise act on the replay itself (PostgreSQL times
    /// each statement of a multi-statement Query on its own, so once the first statement
    /// has reset it, nothing after it is timed by it).
    pub(crate) fn timeouts_to_clear(&self, server: &Settings) -> String {
        let mut sql = String::new();
        for (name, stmt) in server.extra.iter().filter(|(n, _)| is_timeout(n)) {
            if !self.extra.iter().any(|(n, s)| n == name && s == stmt) {
                sql.push_str(&reset_sql(name));
            }
        }
        sql
    }

    /// Forgets the timeouts `client.timeouts_to_clear(self)` resets.
    pub(crate) fn forget_timeouts_unlike(&mut self, client: &Settings) {
        self.extra.retain(|(name, stmt)| !is_timeout(name) || client.extra.iter().any(|(n, s)| n == name && s == stmt));
        self.rekey();
    }

    /// Forgets all settings (RESET ALL, DISCARD ALL).
    pub(crate) fn reset_all_extra(&mut self) {
        self.extra.clear();
        self.rekey();
    }

    /// A fingerprint: equal keys mean nothing to replay.
    #[inline]
    pub(crate) fn key(&self) -> u64 {
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
    pub(crate) fn diff_sql(&self, server: &Settings) -> String {
        let mut sql = self.reported_diff_sql(server);
        for (name, _) in &server.extra {
            if !self.extra.iter().any(|(n, _)| n == name) {
                sql.push_str(&reset_sql(name));
            }
        }
        // The client's own timeouts last: they act on the statements after them.
        let (timeouts, others): (Vec<_>, Vec<_>) = self.extra.iter().partition(|(n, _)| is_timeout(n));
        for (name, stmt) in others.into_iter().chain(timeouts) {
            if !server.extra.iter().any(|(n, s)| n == name && s == stmt) {
                sql.push_str(stmt);
                sql.push(';');
            }
        }
        sql
    }
}

/// A setting named `…timeout` (`statement_timeout`, `lock_timeout`,
/// `idle_in_transaction_session_timeout`, `transaction_timeout`, …).
fn is_timeout(name: &str) -> bool {
    name.len() >= 7 && name[name.len() - 7..].eq_ignore_ascii_case("timeout")
}

impl Settings {
    /// SQL that sets the reported parameters that differ on `server`.
    pub(crate) fn reported_diff_sql(&self, server: &Settings) -> String {
        let mut sql = String::new();
        for (name, value) in &self.reported {
            if server.reported(name) != Some(value.as_str()) {
                sql.push_str(&format!("SET {} = {};", quote_ident(name), quote_literal(value)));
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
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Single-quotes a literal (standard_conforming_strings assumed, as PostgreSQL ≥ 9.1).
pub(crate) fn quote_literal(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// Tracked reported parameters: (canonical name, value).
pub(crate) type Reported = Vec<(&'static str, String)>;

/// Startup parameters as settings: tracked reported ones as (canonical name, value), and
/// every other GUC (including `options`' `-c name=value` and `--name=value`) as a
/// statement that applies it the way startup would (`set_config`, so list values such as
/// search_path parse as they do at startup). user/database/replication are not settings.
pub(crate) fn startup_settings(params: &[(String, String)]) -> (Reported, Vec<(String, String)>) {
    let mut reported = Vec::new();
    let mut extra = Vec::new();
    let mut add = |name: &str, value: &str| {
        if let Some(t) = tracked_name(name) {
            reported.push((t, value.to_owned()));
        } else {
            let name = name.to_ascii_lowercase();
            let sql =
                format!("SELECT pg_catalog.set_config({}, {}, false)", quote_literal(&name), quote_literal(value));
            extra.push((name, sql));
        }
    };
    for (k, v) in params {
        match k.as_str() {
            "user" | "database" | "replication" => {}
            "options" => {
                let mut it = v.split_whitespace();
                while let Some(tok) = it.next() {
                    let kv =
                        if tok == "-c" { it.next() } else { tok.strip_prefix("--").or_else(|| tok.strip_prefix("-c")) };
                    if let Some((name, value)) = kv.and_then(|kv| kv.split_once('=')) {
                        add(&name.replace('-', "_"), value);
                    }
                }
            }
            _ if k.starts_with("_pq_.") => {}
            _ => add(k, v),
        }
    }
    (reported, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_foreign_timeout_is_cleared_first_and_the_clients_own_set_last() {
        let mut client = Settings::default();
        client.set_extra("lock_timeout".into(), "SET lock_timeout = 5".into());
        client.set_extra("search_path".into(), "SET search_path TO a".into());
        client.set_extra("idle_session_timeout".into(), "SET idle_session_timeout = 9".into());
        let mut server = Settings::default();
        server.set_extra("statement_timeout".into(), "SET statement_timeout = 1".into());
        server.set_extra("lock_timeout".into(), "SET lock_timeout = 1".into());
        server.set_extra("idle_session_timeout".into(), "SET idle_session_timeout = 9".into());
        server.set_extra("work_mem".into(), "SET work_mem = '1MB'".into());
        assert_eq!(client.timeouts_to_clear(&server), "RESET \"statement_timeout\";RESET \"lock_timeout\";");
        server.forget_timeouts_unlike(&client);
        assert_eq!(client.timeouts_to_clear(&server), "");
        assert_eq!(
            server.extra.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["idle_session_timeout", "work_mem"]
        );
        assert_eq!(client.diff_sql(&server), "RESET \"work_mem\";SET search_path TO a;SET lock_timeout = 5;");
        assert_eq!(Settings::default().timeouts_to_clear(&Settings::default()), "");
    }

    #[test]
    fn startup_options() {
        let p = vec![
            ("user".into(), "u".into()),
            ("options".into(), "-c search_path=x,y --work-mem=4MB -c TimeZone=UTC".into()),
            ("DateStyle".into(), "ISO".into()),
            ("extra_float_digits".into(), "3".into()),
        ];
        let (r, e) = startup_settings(&p);
        assert_eq!(r, vec![("TimeZone", "UTC".to_string()), ("DateStyle", "ISO".to_string())]);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0], ("search_path".into(), "SELECT pg_catalog.set_config('search_path', 'x,y', false)".into()));
        assert_eq!(e[1].0, "work_mem");
        assert_eq!(e[2].0, "extra_float_digits");
    }
}
