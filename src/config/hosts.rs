//! A database's server hosts: the `host` setting as one string or a list (`"a:5432"`,
//! `"[::1]:5433"`, `"/socket/dir"`, an entry without a port taking the entry's `port`),
//! and libpq's `target_session_attrs` and `load_balance_hosts` that choose among them.
//! Parsing and naming only; choosing a host is `crate::pool::hosts` and
//! `crate::driver::hosts`.

use super::ConfigError;
use serde::{Deserialize, Serialize};

/// The `host` of a `[databases]` entry: one or several entries, in the order given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostList(Vec<String>);

impl<'de> Deserialize<'de> for HostList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => HostList::from(s.as_str()),
            OneOrMany::Many(v) => HostList(v.into_iter().map(|h| h.trim().to_owned()).collect()),
        })
    }
}

impl Serialize for HostList {
    /// One entry as a string, several as a list (what `Deserialize` reads back).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_str(one),
            many => many.serialize(s),
        }
    }
}

impl From<&str> for HostList {
    /// One host, or several separated by commas (as libpq's `host=a,b`).
    fn from(s: &str) -> HostList {
        if s.is_empty() {
            return HostList::default();
        }
        HostList(s.split(',').map(|h| h.trim().to_owned()).collect())
    }
}

impl HostList {
    /// No host given.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(String::is_empty)
    }

    /// The entries as configured, joined by commas (`SHOW DATABASES`).
    pub(crate) fn joined(&self) -> String {
        self.0.join(",")
    }

    /// Whether every entry names its own port.
    pub(crate) fn all_have_ports(&self) -> bool {
        self.0.iter().all(|h| split_port(h).is_ok_and(|(_, p)| p.is_some()))
    }

    /// Whether every entry is a server on this machine: a unix socket directory, a loopback
    /// address or `localhost` (no entry: libpq's default, the local socket). Such a server's
    /// backends share this machine's cores with parsnip (`Config::servers_on_this_machine`).
    pub(crate) fn on_this_machine(&self) -> bool {
        self.0.iter().filter(|h| !h.is_empty()).all(|h| {
            let host = split_port(h).map_or(h.as_str(), |(host, _)| host);
            host.starts_with('/')
                || host.eq_ignore_ascii_case("localhost")
                || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        })
    }

    /// (host, port) of each entry, `port` for entries without one.
    pub(crate) fn endpoints(&self, port: u16) -> Result<Vec<(String, u16)>, ConfigError> {
        self.0
            .iter()
            .map(|h| split_port(h).map(|(host, p)| (host.to_owned(), p.unwrap_or(port))))
            .collect::<Result<Vec<_>, _>>()
    }

    /// (host, port) of each entry; entries that do not parse are left out (the
    /// configuration was validated, so there are none).
    pub(crate) fn endpoints_or_skip(&self, port: u16) -> Vec<(String, u16)> {
        self.0.iter().filter_map(|h| split_port(h).ok().map(|(host, p)| (host.to_owned(), p.unwrap_or(port)))).collect()
    }
}

/// "host:port" into its parts: `[v6]:port` and `[v6]` bracketed, a bare address with
/// several colons is IPv6 without a port, a socket directory may end in `:port`.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), ConfigError> {
    let bad = || ConfigError(format!("host entry \"{entry}\": expected HOST, HOST:PORT, [IPV6]:PORT or /SOCKET/DIR"));
    if entry.is_empty() {
        return Err(bad());
    }
    if let Some(rest) = entry.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
        return match after {
            "" => Ok((addr, None)),
            p => Ok((addr, Some(parse_port(p.strip_prefix(':').ok_or_else(bad)?).ok_or_else(bad)?))),
        };
    }
    if !entry.starts_with('/') && entry.matches(':').count() > 1 {
        return Ok((entry, None));
    }
    match entry.rsplit_once(':') {
        // A socket directory may hold a colon that is no port separator.
        Some((_, p)) if entry.starts_with('/') && !p.bytes().all(|b| b.is_ascii_digit()) => Ok((entry, None)),
        Some((host, p)) if !host.is_empty() => Ok((host, Some(parse_port(p).ok_or_else(bad)?))),
        Some(_) => Err(bad()),
        None => Ok((entry, None)),
    }
}

fn parse_port(p: &str) -> Option<u16> {
    p.parse().ok().filter(|p| *p != 0)
}

/// Which servers a new connection may go to, as libpq's `target_session_attrs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetSessionAttrs {
    /// Any server that accepts the login.
    #[default]
    Any,
    /// A server whose sessions are read-write by default (not a standby, and
    /// `default_transaction_read_only` off).
    ReadWrite,
    /// A server whose sessions are read-only by default (a standby, or
    /// `default_transaction_read_only` on).
    ReadOnly,
    /// A server not in recovery.
    Primary,
    /// A server in recovery (a hot standby).
    Standby,
    /// A standby if one is up, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// The name as libpq spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// From libpq's spelling (a URL parameter).
    pub(crate) fn parse(v: &str) -> Result<TargetSessionAttrs, ConfigError> {
        use TargetSessionAttrs::*;
        [Any, ReadWrite, ReadOnly, Primary, Standby, PreferStandby].into_iter().find(|t| t.as_str() == v).ok_or_else(
            || {
                ConfigError(format!(
                    "invalid target_session_attrs value: \"{v}\" (any, read-write, read-only, primary, standby, \
                     prefer-standby)"
                ))
            },
        )
    }
}

/// In which order a database's hosts are tried, as libpq's `load_balance_hosts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadBalanceHosts {
    /// In the order configured.
    #[default]
    Disable,
    /// In a random order, drawn for each new server connection.
    Random,
}

impl LoadBalanceHosts {
    /// The name as libpq spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LoadBalanceHosts::Disable => "disable",
            LoadBalanceHosts::Random => "random",
        }
    }

    /// From libpq's spelling (a URL parameter).
    pub(crate) fn parse(v: &str) -> Result<LoadBalanceHosts, ConfigError> {
        match v {
            "disable" => Ok(LoadBalanceHosts::Disable),
            "random" => Ok(LoadBalanceHosts::Random),
            _ => Err(ConfigError(format!("invalid load_balance_hosts value: \"{v}\" (disable, random)"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_entries_with_and_without_ports() {
        let l = HostList(vec!["a".into(), "b:5433".into(), "[::1]:7".into(), "[fe80::1]".into(), "::1".into()]);
        assert_eq!(
            l.endpoints(5432).unwrap(),
            vec![
                ("a".into(), 5432),
                ("b".into(), 5433),
                ("::1".into(), 7),
                ("fe80::1".into(), 5432),
                ("::1".into(), 5432)
            ]
        );
        assert!(!l.all_have_ports());
        assert_eq!(HostList::from("/run/pg:6000").endpoints(1).unwrap(), vec![("/run/pg".into(), 6000)]);
        assert_eq!(HostList::from("/run/a:b").endpoints(1).unwrap(), vec![("/run/a:b".into(), 1)]);
        assert_eq!(HostList::from("h1:1, h2:2").joined(), "h1:1,h2:2");
        assert!(HostList::from("h1:1,h2:2").all_have_ports());
        for bad in ["h:x", "h:0", ":5", "[::1", "[::1]x", "h:70000"] {
            assert!(HostList::from(bad).endpoints(1).is_err(), "{bad}");
        }
        assert!(HostList::from("").is_empty());
    }

    #[test]
    fn servers_on_this_machine_are_sockets_loopback_and_localhost() {
        for local in
            ["", "/run/postgresql", "/tmp:6000", "127.0.0.1", "127.0.0.2:5433", "[::1]:7", "::1", "LocalHost:5432"]
        {
            assert!(HostList::from(local).on_this_machine(), "{local}");
        }
        for remote in ["db.example", "10.0.0.5:5432", "[fe80::1]", "127.0.0.1,10.0.0.5", "localhost.example"] {
            assert!(!HostList::from(remote).on_this_machine(), "{remote}");
        }
    }

    #[test]
    fn libpq_spellings() {
        assert_eq!(TargetSessionAttrs::parse("prefer-standby").unwrap(), TargetSessionAttrs::PreferStandby);
        assert_eq!(TargetSessionAttrs::parse("read-write").unwrap().as_str(), "read-write");
        assert!(TargetSessionAttrs::parse("master").is_err());
        assert_eq!(LoadBalanceHosts::parse("random").unwrap(), LoadBalanceHosts::Random);
        assert!(LoadBalanceHosts::parse("round-robin").is_err());
    }

    #[test]
    fn several_hosts_and_how_to_choose_among_them() {
        let cfg = crate::config::Config::from_toml(
            "[databases.x]\nhost=['a:1','b']\nport=5\ntarget_session_attrs='read-write'\nload_balance_hosts='random'\n\
             [databases.y]\nhost='a:1,b:2'\n",
        )
        .unwrap();
        let (x, _) = cfg.database("x").unwrap();
        assert_eq!(x.host.endpoints(x.port).unwrap(), vec![("a".into(), 1), ("b".into(), 5)]);
        assert_eq!(
            (x.target_session_attrs, x.load_balance_hosts),
            (TargetSessionAttrs::ReadWrite, LoadBalanceHosts::Random)
        );
        let (y, _) = cfg.database("y").unwrap();
        assert_eq!(y.host.joined(), "a:1,b:2");
        assert_eq!(y.target_session_attrs, TargetSessionAttrs::Any, "libpq's default");
        let bad = [
            ("host=['a:1','b']", "port is required"),
            ("host=['a:x']\nport=1", "host entry"),
            ("host='a'\nport=1\ntarget_session_attrs='master'", "unknown variant"),
            ("host='a'\nport=1\nload_balance_hosts='round-robin'", "unknown variant"),
            ("host='a'\nport=1\nread_write_split=true", "read_write_split needs"),
            ("host='a'\nport=1\nread_your_writes_ms=600001", "at most 600000"),
        ];
        for (body, want) in bad {
            let e = crate::config::Config::from_toml(&format!("[databases.x]\n{body}\n")).unwrap_err();
            assert!(e.0.contains(want), "{body}: {e}");
        }
    }
}
