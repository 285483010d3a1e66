//! Console command texts parsed into `Command`s: `SHOW x`, and PgBouncer's commands that
//! change the pooler's state (PAUSE, RESUME, RECONNECT, KILL, KILL_CLIENT, DISABLE, ENABLE,
//! RELOAD, SHUTDOWN, WAIT_CLOSE, SET, SUSPEND), and parsnip's UNFENCE. Words are case-insensitive; a database
//! name may be double-quoted.

use crate::error::{Error, SqlState};

/// How `SHUTDOWN` lets clients go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShutdownMode {
    /// `SHUTDOWN`: close everything now.
    Now,
    /// `SHUTDOWN WAIT_FOR_SERVERS`: stop accepting, let transactions finish (as SIGTERM).
    WaitForServers,
    /// `SHUTDOWN WAIT_FOR_CLIENTS`: stop accepting, let clients leave by themselves.
    WaitForClients,
}

/// A command that changes the pooler's state: the driver carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StateChange {
    /// Stop giving servers to clients (of one database, or all) and wait until every
    /// server connection is back and closed.
    Pause(Option<String>),
    /// Undo PAUSE or KILL.
    Resume(Option<String>),
    /// Close server connections as they come back (new ones are opened).
    Reconnect(Option<String>),
    /// Close the clients and server connections of a database (or all) now, and pause it.
    Kill(Option<String>),
    /// Close one client (its id in `SHOW CLIENTS`).
    KillClient(u64),
    /// Refuse new clients of a database.
    Disable(String),
    /// Undo DISABLE.
    Enable(String),
    /// Re-read the configuration file.
    Reload,
    /// Shut down.
    Shutdown(ShutdownMode),
    /// Wait until the connections RECONNECT (or a reload) marked are closed.
    WaitClose(Option<String>),
    /// Change a setting.
    Set(String, String),
    /// PgBouncer's SUSPEND (for its online restart).
    Suspend,
    /// Accept again as primaries the servers fenced among a database's hosts (or all).
    Unfence(Option<String>),
}

/// One console command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// An empty query.
    Empty,
    /// `SHOW what` (`what` lower-cased).
    Show(String),
    /// Anything else.
    Act(StateChange),
}

/// Parses one query text.
pub(crate) fn parse(sql: &str) -> Result<Command, Error> {
    let text = sql.trim().trim_end_matches(';').trim();
    if text.is_empty() {
        return Ok(Command::Empty);
    }
    let (verb, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let rest = rest.trim();
    let verb = verb.to_ascii_lowercase();
    let syntax = || {
        Error::new(SqlState::SYNTAX_ERROR, format!("invalid console command \"{text}\"; SHOW HELP lists the commands"))
    };
    let one_name = |required: bool| -> Result<Option<String>, Error> {
        match rest {
            "" if required => Err(syntax()),
            "" => Ok(None),
            r => name(r).map(Some).ok_or_else(syntax),
        }
    };
    let act = match verb.as_str() {
        "show" => {
            let what = rest.to_ascii_lowercase();
            if what.is_empty() || what.contains(char::is_whitespace) {
                return Err(syntax());
            }
            return Ok(Command::Show(what));
        }
        "pause" => StateChange::Pause(one_name(false)?),
        "resume" => StateChange::Resume(one_name(false)?),
        "reconnect" => StateChange::Reconnect(one_name(false)?),
        "kill" => StateChange::Kill(one_name(false)?),
        "wait_close" => StateChange::WaitClose(one_name(false)?),
        "unfence" => StateChange::Unfence(one_name(false)?),
        "disable" => StateChange::Disable(one_name(true)?.unwrap_or_default()),
        "enable" => StateChange::Enable(one_name(true)?.unwrap_or_default()),
        "kill_client" => StateChange::KillClient(rest.parse().map_err(|_| syntax())?),
        "reload" if rest.is_empty() => StateChange::Reload,
        "suspend" if rest.is_empty() => StateChange::Suspend,
        "shutdown" => StateChange::Shutdown(match rest.to_ascii_lowercase().as_str() {
            "" => ShutdownMode::Now,
            "wait_for_servers" => ShutdownMode::WaitForServers,
            "wait_for_clients" => ShutdownMode::WaitForClients,
            _ => return Err(syntax()),
        }),
        "set" => {
            let (key, value) = rest
                .split_once('=')
                .or_else(|| {
                    let lower = rest.to_ascii_lowercase();
                    lower.find(" to ").map(|i| (&rest[..i], &rest[i + 4..]))
                })
                .ok_or_else(syntax)?;
            let key = key.trim().to_ascii_lowercase();
            let value = value.trim();
            let value = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(value);
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(syntax());
            }
            StateChange::Set(key, value.replace("''", "'"))
        }
        _ => return Err(syntax()),
    };
    Ok(Command::Act(act))
}

/// A database name: one word, or a double-quoted identifier.
fn name(s: &str) -> Option<String> {
    if let Some(q) = s.strip_prefix('"') {
        let inner = q.strip_suffix('"')?;
        return Some(inner.replace("\"\"", "\""));
    }
    (!s.contains(char::is_whitespace)).then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(s: &str) -> StateChange {
        match parse(s) {
            Ok(Command::Act(a)) => a,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn commands_parse_as_pgbouncer_spells_them() {
        assert_eq!(parse(" show Pools ;").ok(), Some(Command::Show("pools".into())));
        assert_eq!(parse(";").ok(), Some(Command::Empty));
        assert_eq!(act("PAUSE"), StateChange::Pause(None));
        assert_eq!(act("pause mydb;"), StateChange::Pause(Some("mydb".into())));
        assert_eq!(act("RESUME \"My Db\""), StateChange::Resume(Some("My Db".into())));
        assert_eq!(act("kill_client 42"), StateChange::KillClient(42));
        assert_eq!(act("DISABLE app"), StateChange::Disable("app".into()));
        assert_eq!(act("SHUTDOWN WAIT_FOR_CLIENTS"), StateChange::Shutdown(ShutdownMode::WaitForClients));
        assert_eq!(act("shutdown"), StateChange::Shutdown(ShutdownMode::Now));
        assert_eq!(act("SET pool_size = 20"), StateChange::Set("pool_size".into(), "20".into()));
        assert_eq!(act("set log_level to 'debug'"), StateChange::Set("log_level".into(), "debug".into()));
        assert_eq!(act("WAIT_CLOSE"), StateChange::WaitClose(None));
        assert_eq!(act("unfence orders"), StateChange::Unfence(Some("orders".into())));
        for bad in ["DISABLE", "KILL_CLIENT x", "PAUSE a b", "SHUTDOWN later", "select 1", "SHOW", "SET x"] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.code, SqlState::SYNTAX_ERROR, "{bad}");
        }
    }
}
