//! What a pgbouncer.ini means for parsnip: its parsed lines (`ini`) become the TOML table
//! parsnip's own file would hold, and every setting that could not be carried over is
//! named with why (`Note`). Pure: the `auth_file` is read through the caller's resolver.
//!
//! The translation is table-driven. A `[pgbouncer]` key is passed through under its own
//! name when parsnip's key table (`entries::KEYS`) has that name, and a `[databases]` or
//! `[users]` key when parsnip's `DatabaseConfig` or `UserConfig` accepts it; a PgBouncer
//! duration (seconds) goes to parsnip's `NAME_ms` when there is one. The value's TOML type
//! is whichever one parsnip's field accepts (PgBouncer's `0`/`1` become booleans for a
//! boolean field, a comma list an array for a list field). So a key parsnip learns later
//! is carried over without a change here. The tables below hold the rest: renamed keys,
//! keys ignored on purpose (with why), keys parsnip has no counterpart for (with why), and
//! PgBouncer's defaults where parsnip's differ (applied first, so the meaning is the same).

use super::entries::key as parsnip_key;
use super::ini::{self, Included, Line, Resolver};
use super::{Config, DatabaseConfig, UserConfig};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use toml::{Table, Value};

/// A setting of the ini that parsnip does not carry over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    /// "FILE:LINE".
    pub(crate) at: String,
    /// The setting, e.g. `logfile` or `databases.app.client_encoding`.
    pub(crate) setting: String,
    /// Why.
    pub(crate) why: String,
    /// Whether it changes what the configuration means (an error unless `--lenient`), as
    /// opposed to a setting parsnip ignores on purpose or one at PgBouncer's default.
    pub(crate) refused: bool,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.refused { "not supported" } else { "ignored" };
        write!(f, "{}: {} {what}: {}", self.at, self.setting, self.why)
    }
}

/// An ini translated: parsnip's configuration as a TOML table, and what was left out.
#[derive(Debug)]
pub(crate) struct Translation {
    /// What parsnip's TOML file would hold.
    pub(crate) table: Table,
    /// Settings not carried over, in file order.
    pub(crate) notes: Vec<Note>,
}

/// PgBouncer's keys that parsnip has under another name.
const RENAMED: &[(&str, &str)] = &[("default_pool_size", "pool_size"), ("max_packet_size", "max_message_size")];

/// PgBouncer's settings in seconds (parsnip's counterparts count milliseconds and end in
/// `_ms`; one without the suffix is taken to count seconds as PgBouncer's does).
const SECONDS: &[&str] = &[
    "server_lifetime",
    "server_idle_timeout",
    "server_connect_timeout",
    "server_login_retry",
    "client_login_timeout",
    "autodb_idle_timeout",
    "query_wait_timeout",
    "client_idle_timeout",
    "idle_transaction_timeout",
    "reserve_pool_timeout",
    "query_timeout",
    "transaction_timeout",
    "cancel_wait_timeout",
    "suspend_timeout",
    "server_check_delay",
    "dns_max_ttl",
    "dns_nxdomain_ttl",
    "dns_zone_check_period",
];

/// Keys parsnip ignores on purpose, with why (named on startup, never an error).
const IGNORED: &[(&[&str], &str)] = &[
    (
        &["logfile", "syslog", "syslog_ident", "syslog_facility"],
        "parsnip logs to stderr (log_format = \"json\" for collectors); redirect it or use journald",
    ),
    (
        &["pidfile", "user", "service_name", "job_name"],
        "parsnip does not daemonize or change user: the service manager does",
    ),
    (
        &["log_connections", "log_disconnections", "log_pooler_errors", "log_stats", "verbose"],
        "log_level chooses what is logged",
    ),
    (&["pkt_buf", "sbuf_loopcnt"], "parsnip sizes its buffers itself"),
    (
        &[
            "listen_backlog",
            "tcp_defer_accept",
            "tcp_socket_buffer",
            "tcp_keepalive",
            "tcp_keepcnt",
            "tcp_keepidle",
            "tcp_keepintvl",
            "tcp_user_timeout",
        ],
        "parsnip keeps the system's TCP defaults",
    ),
    (
        &["dns_max_ttl", "dns_nxdomain_ttl", "dns_zone_check_period", "resolv_conf"],
        "host names are resolved by the system resolver at each connect",
    ),
    (
        &[
            "client_tls_protocols",
            "client_tls_ciphers",
            "client_tls13_ciphers",
            "client_tls_ecdhcurve",
            "client_tls_dheparams",
            "server_tls_protocols",
            "server_tls_ciphers",
            "server_tls13_ciphers",
        ],
        "rustls's safe defaults (TLS 1.2 and 1.3, AEAD suites only)",
    ),
    (&["track_extra_parameters"], "parsnip tracks every parameter PostgreSQL reports"),
    (
        &["ignore_startup_parameters"],
        "parsnip applies startup parameters on the server, refused only as PostgreSQL refuses them",
    ),
    (
        &["server_check_delay", "server_check_query"],
        "a pooled connection that closed is noticed when it is taken, and replaced",
    ),
    (&["server_round_robin"], "idle server connections are reused most recent first"),
    (&["server_reset_query_always"], "transaction pooling keeps each client's settings by itself"),
    (&["scram_iterations"], "parsnip never creates SCRAM secrets"),
    (&["cancel_wait_timeout"], "cancel requests are forwarded at once"),
    (&["suspend_timeout"], "parsnip has no SUSPEND (online restarts use so_reuseport)"),
    (&["conffile"], "the file given on the command line"),
    (&["peers.pool_size"], "each forwarded cancel request opens one short connection"),
];

/// Keys parsnip has no counterpart for yet, with why (an error unless `--lenient`, or
/// unless the value is PgBouncer's default, `AT_DEFAULT`). A key parsnip learns is carried
/// over before this table is looked at.
const MISSING: &[(&[&str], &str)] = &[
    (
        &[
            "reserve_pool_size",
            "reserve_pool_timeout",
            "max_db_connections",
            "max_db_client_connections",
            "max_user_connections",
            "max_user_client_connections",
            "connect_query",
            "server_fast_close",
        ],
        "parsnip has no such setting here yet",
    ),
    (&["disable_pqexec", "application_name_add_host", "query_wait_notify"], "parsnip has no such setting"),
];

/// PgBouncer's defaults of the settings in `MISSING`: a line giving one of these values
/// asks for nothing parsnip lacks.
const AT_DEFAULT: &[(&str, &str)] = &[
    ("reserve_pool_size", "0"),
    ("reserve_pool_timeout", "5"),
    ("max_db_connections", "0"),
    ("max_db_client_connections", "0"),
    ("max_user_connections", "0"),
    ("max_user_client_connections", "0"),
    ("server_fast_close", "0"),
    ("disable_pqexec", "0"),
    ("application_name_add_host", "0"),
    ("query_wait_notify", "5"),
];

/// PgBouncer's defaults where parsnip's differ, read before the file's lines.
const PGBOUNCER_DEFAULTS: &[(&str, &str)] = &[
    ("pool_mode", "session"),
    ("max_client_conn", "100"),
    ("auth_type", "md5"),
    ("server_connect_timeout", "15"),
    ("server_login_retry", "15"),
    ("max_prepared_statements", "200"),
    ("unix_socket_dir", "/tmp"),
    ("client_tls_sslmode", "disable"),
    // PgBouncer sends queries as written; parsnip's autoprepare (on by default) would
    // show the server `$1` where a literal was (pg_stat_activity, log_statement).
    ("autoprepare", "0"),
];

/// PgBouncer's `auth_query` when `auth_user` is set without one.
const PGBOUNCER_AUTH_QUERY: &str = "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END \
                                    FROM pg_authid WHERE rolname=$1 AND rolcanlogin";

/// Keys whose empty value means something (elsewhere an empty value leaves the default).
const EMPTY_MEANS_SOMETHING: &[&str] = &["server_reset_query", "unix_socket_dir", "listen_addr"];

/// The translation of `lines`; `read` gives the `auth_file` (path as written, ini naming it).
pub(crate) fn translate(lines: &[Line], read: &mut Resolver) -> Result<Translation, String> {
    let mut t = Tr {
        table: Table::new(),
        databases: Table::new(),
        users: BTreeMap::new(),
        peers: Table::new(),
        notes: Vec::new(),
        listen_addr: None,
        listen_port: 6432,
        socket_dir: None,
    };
    let defaults = PGBOUNCER_DEFAULTS.iter().map(|(k, v)| Line {
        section: "pgbouncer".into(),
        key: (*k).into(),
        value: (*v).into(),
        at: "PgBouncer's default".into(),
    });
    // PgBouncer's setting names are case-insensitive.
    let given = lines
        .iter()
        .filter(|l| l.section == "pgbouncer")
        .map(|l| Line { key: l.key.to_ascii_lowercase(), ..l.clone() });
    let global: Vec<Line> = defaults.chain(given).collect();
    for l in &global {
        t.global(l, read)?;
    }
    t.socket_dir = t.table.get("unix_socket_dir").and_then(Value::as_str).filter(|d| !d.is_empty()).map(str::to_owned);
    t.listen()?;
    if t.table.contains_key("auth_user") && !t.table.contains_key("auth_query") {
        t.table.insert("auth_query".into(), Value::String(PGBOUNCER_AUTH_QUERY.into()));
    }
    for l in lines {
        match l.section.as_str() {
            "pgbouncer" => {}
            "databases" => t.database(l)?,
            "users" => t.user(l)?,
            "peers" => t.peer(l)?,
            other => return Err(format!("{}: unknown section [{other}]", l.at)),
        }
    }
    // A database's auth_user runs PgBouncer's default auth_query when none is set.
    let db_auth_user = t.databases.values().any(|d| d.get("auth_user").is_some());
    if db_auth_user && !t.table.contains_key("auth_query") {
        t.table.insert("auth_query".into(), Value::String(PGBOUNCER_AUTH_QUERY.into()));
    }
    let users = t.users.into_iter().map(|(name, u)| (name, Value::Table(u))).collect::<Table>();
    for (name, sub) in [("databases", t.databases), ("users", users), ("peers", t.peers)] {
        if !sub.is_empty() {
            t.table.insert(name.into(), Value::Table(sub));
        }
    }
    Ok(Translation { table: t.table, notes: t.notes })
}

struct Tr {
    /// The top-level keys.
    table: Table,
    /// `[databases.NAME]`, `[users.NAME]` and `[peers.N]` tables, put into `table` last.
    databases: Table,
    users: BTreeMap<String, Table>,
    peers: Table,
    notes: Vec<Note>,
    listen_addr: Option<String>,
    listen_port: u16,
    /// `unix_socket_dir` as the ini sets it (None: off): where servers and peers without a
    /// `host` listen.
    socket_dir: Option<String>,
}

/// Which struct of parsnip's configuration a key is looked up in.
#[derive(Clone, Copy)]
enum Scope {
    Global,
    Database,
    User,
}

impl Tr {
    fn note(&mut self, l: &Line, setting: String, why: impl Into<String>, refused: bool) {
        self.notes.push(Note { at: l.at.clone(), setting, why: why.into(), refused });
    }

    fn global(&mut self, l: &Line, read: &mut Resolver) -> Result<(), String> {
        let v = l.value.as_str();
        match l.key.as_str() {
            "listen_addr" => self.listen_addr = Some(v.to_owned()),
            "listen_port" => {
                self.listen_port = v.parse().map_err(|_| format!("{}: listen_port: \"{v}\" is not a port", l.at))?
            }
            "auth_file" if !v.is_empty() => {
                let file = l.at.rsplit_once(':').map_or(l.at.as_str(), |(f, _)| f);
                let Included { name, text } = read(v, file).map_err(|e| format!("{}: auth_file {v}: {e}", l.at))?;
                for (user, secret) in ini::userlist(&name, &text)? {
                    self.users.entry(user).or_default().insert("password".into(), Value::String(secret));
                }
            }
            "auth_type" if v == "plain" => self.set(Scope::Global, l, "auth_type", "password", None)?,
            "max_prepared_statements" if v.trim() == "0" => {
                self.table.insert("prepared_statements".into(), Value::Boolean(false));
            }
            key => {
                let mut table = std::mem::take(&mut self.table);
                let r = self.setting(Scope::Global, l, key, v, &mut table);
                self.table = table;
                r?;
            }
        }
        Ok(())
    }

    /// `listen` from `listen_addr` and `listen_port`: without an address, the unix socket
    /// only (as PgBouncer).
    fn listen(&mut self) -> Result<(), String> {
        let port = self.listen_port;
        let addrs: Vec<String> = match self.listen_addr.as_deref().map(str::trim).filter(|a| !a.is_empty()) {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .map(|a| match a {
                    "*" => format!("0.0.0.0:{port}"),
                    a if a.contains(':') => format!("[{a}]:{port}"),
                    a => format!("{a}:{port}"),
                })
                .collect(),
            None => {
                let dir = self.table.get("unix_socket_dir").and_then(Value::as_str).unwrap_or("").to_owned();
                if dir.is_empty() {
                    return Err("neither listen_addr nor unix_socket_dir is set: nothing to listen on".into());
                }
                self.table.insert("unix_socket_dir".into(), Value::String(String::new()));
                vec![format!("{}/.s.PGSQL.{port}", dir.trim_end_matches('/'))]
            }
        };
        self.table.insert("listen".into(), Value::Array(addrs.into_iter().map(Value::String).collect()));
        Ok(())
    }

    fn database(&mut self, l: &Line) -> Result<(), String> {
        let pairs = ini::connstr(&l.value).map_err(|e| format!("{}: database {}: {e}", l.at, l.key))?;
        let mut db = Table::new();
        for (k, v) in &pairs {
            let v = match (k.as_str(), v.as_str()) {
                ("load_balance_hosts", "round-robin") => "random",
                (_, v) => v,
            };
            self.setting(Scope::Database, l, k, v, &mut db)?;
        }
        // PgBouncer's defaults: the unix socket in unix_socket_dir, port 5432, and several
        // hosts taken in turn.
        if !db.contains_key("host") {
            let dir = self.socket_dir.clone().unwrap_or_else(|| "/tmp".into());
            db.insert("host".into(), Value::String(dir));
        }
        db.entry("port").or_insert(Value::Integer(5432));
        let several = db.get("host").and_then(Value::as_str).is_some_and(|h| h.contains(','));
        if several && !pairs.iter().any(|(k, _)| k == "load_balance_hosts") {
            db.insert("load_balance_hosts".into(), Value::String("random".into()));
        }
        self.databases.insert(l.key.clone(), Value::Table(db));
        Ok(())
    }

    fn user(&mut self, l: &Line) -> Result<(), String> {
        let pairs = ini::connstr(&l.value).map_err(|e| format!("{}: user {}: {e}", l.at, l.key))?;
        let mut user = self.users.remove(&l.key).unwrap_or_default();
        let mut r = Ok(());
        for (k, v) in &pairs {
            r = r.and_then(|_| self.setting(Scope::User, l, k, v, &mut user));
        }
        self.users.insert(l.key.clone(), user);
        r
    }

    fn peer(&mut self, l: &Line) -> Result<(), String> {
        let pairs = ini::connstr(&l.value).map_err(|e| format!("{}: peer {}: {e}", l.at, l.key))?;
        let mut host = self.socket_dir.clone().unwrap_or_else(|| "/tmp".into());
        let mut port = 6432;
        for (k, v) in pairs {
            match k.as_str() {
                "host" => host = v,
                "port" => port = v.parse().map_err(|_| format!("{}: peer {}: port \"{v}\"", l.at, l.key))?,
                "pool_size" => {
                    self.note(l, "peers.pool_size".into(), why_ignored("peers.pool_size").unwrap_or(""), false)
                }
                other => self.note(l, format!("peers.{}.{other}", l.key), "unknown peer setting", true),
            }
        }
        let mut p = Table::new();
        p.insert("host".into(), Value::String(host));
        p.insert("port".into(), Value::Integer(port));
        self.peers.insert(l.key.clone(), Value::Table(p));
        Ok(())
    }

    /// Carries `key = value` (PgBouncer's name and value) into `into`, the table of
    /// `scope`, or names it.
    fn setting(&mut self, scope: Scope, l: &Line, key: &str, value: &str, into: &mut Table) -> Result<(), String> {
        let shown = match scope {
            Scope::Global => key.to_owned(),
            Scope::Database => format!("databases.{}.{key}", l.key),
            Scope::User => format!("users.{}.{key}", l.key),
        };
        if value.is_empty() && !EMPTY_MEANS_SOMETHING.contains(&key) {
            return Ok(());
        }
        let renamed = RENAMED.iter().find(|(k, _)| *k == key).map_or(key, |(_, n)| n);
        // A duration goes to parsnip's `_ms` key if it has one.
        let ms_name = format!("{renamed}_ms");
        let (name, value) = if SECONDS.contains(&key) && knows(scope, &ms_name) {
            let secs: f64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{}: {shown}: \"{value}\" is not a number of seconds", l.at))?;
            (ms_name.as_str(), format!("{}", (secs * 1000.0).round() as i64))
        } else {
            (renamed, value.to_owned())
        };
        if knows(scope, name) {
            return self.set(scope, l, name, &value, Some(into));
        }
        if let Some(why) = why_ignored(key) {
            self.note(l, shown, why, false);
        } else if at_default(key, value.as_str()) {
            self.note(l, shown, "parsnip has no such setting; the value is PgBouncer's default", false);
        } else {
            let why = MISSING.iter().find(|(ks, _)| ks.contains(&key)).map_or("unknown to parsnip", |(_, w)| w);
            self.note(l, shown, why, true);
        }
        Ok(())
    }

    /// Sets parsnip's `name` (a key `scope` has) to `value` as the TOML type its field
    /// accepts, in `into` (None: the global table); a value none fits is named.
    fn set(&mut self, scope: Scope, l: &Line, name: &str, value: &str, into: Option<&mut Table>) -> Result<(), String> {
        let fits = |v: &Value| match scope {
            Scope::Global => accepts::<Config>(name, v),
            Scope::Database => accepts::<DatabaseConfig>(name, v),
            Scope::User => accepts::<UserConfig>(name, v),
        };
        match candidates(value).into_iter().find(fits) {
            Some(v) => {
                into.unwrap_or(&mut self.table).insert(name.to_owned(), v);
            }
            None => self.note(l, format!("{} = {value}", l.key), format!("parsnip's {name} takes no such value"), true),
        }
        Ok(())
    }
}

/// Whether parsnip's configuration knows `name` in `scope`: the key table for global
/// keys, the struct's fields for databases and users.
fn knows(scope: Scope, name: &str) -> bool {
    match scope {
        Scope::Global => parsnip_key(name).is_some(),
        Scope::Database => db_accepts(name),
        Scope::User => field_exists::<UserConfig>(name),
    }
}

fn db_accepts(name: &str) -> bool {
    field_exists::<DatabaseConfig>(name)
}

/// Whether `T` has a field `name` (any value it refuses for another reason than an
/// unknown field says so).
fn field_exists<T: DeserializeOwned>(name: &str) -> bool {
    let mut t = Table::new();
    t.insert(name.to_owned(), Value::Table(Table::new()));
    match Value::Table(t).try_into::<T>() {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown field"),
    }
}

fn accepts<T: DeserializeOwned>(name: &str, v: &Value) -> bool {
    let mut t = Table::new();
    t.insert(name.to_owned(), v.clone());
    Value::Table(t).try_into::<T>().is_ok()
}

/// The TOML values PgBouncer's `v` may stand for, tried in this order against the field.
fn candidates(v: &str) -> Vec<Value> {
    let t = v.trim();
    let mut c = Vec::new();
    match t.to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => c.push(Value::Boolean(true)),
        "0" | "no" | "off" | "false" => c.push(Value::Boolean(false)),
        _ => {}
    }
    if let Ok(i) = t.parse::<i64>() {
        c.push(Value::Integer(i));
    }
    if let Ok(f) = t.parse::<f64>()
        && f.is_finite()
    {
        c.push(Value::Float(f));
    }
    c.push(Value::String(v.to_owned()));
    c.push(Value::Array(
        t.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| Value::String(s.into())).collect(),
    ));
    c
}

fn why_ignored(key: &str) -> Option<&'static str> {
    IGNORED.iter().find(|(ks, _)| ks.contains(&key)).map(|(_, w)| *w)
}

fn at_default(key: &str, value: &str) -> bool {
    AT_DEFAULT.iter().any(|(k, d)| {
        *k == key
            && (value.trim() == *d
                || value.trim().parse::<f64>().ok().zip(d.parse::<f64>().ok()).is_some_and(|(a, b)| a == b))
    })
}

#[cfg(test)]
mod override_tests;
#[cfg(test)]
mod tests;
