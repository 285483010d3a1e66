//! `postgres://user:password@host:port/dbname?param=value` URLs, as given on the command
//! line, parsed with the `url` crate. The query takes libpq's parameters that parsnip
//! honours (`host`, `port`, `user`, `password`, `dbname`, `sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`, `channel_binding`, `target_session_attrs`, `load_balance_hosts`);
//! any other is an error, not silently ignored. Several hosts are written as libpq writes
//! them: `postgres://u@h1:5432,h2:5433/db`, or `?host=h1,h2&port=5432,5433`.

use super::{ChannelBinding, ConfigError, LoadBalanceHosts, ServerTlsMode, TargetSessionAttrs};

/// The parts of a database URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DbUrl {
    /// User name.
    pub user: String,
    /// Password, if any.
    pub password: Option<String>,
    /// Host name, IP, or unix socket directory; with several hosts, `host:port` entries
    /// joined by commas (the form `[databases]`' `host` takes).
    pub host: String,
    /// Port (default 5432; with several hosts, the first one's).
    pub port: u16,
    /// Database name (default: the user name).
    pub dbname: String,
    /// `sslmode`.
    pub sslmode: Option<ServerTlsMode>,
    /// `sslrootcert`: CA certificates for verify-ca / verify-full.
    pub sslrootcert: Option<String>,
    /// `sslcert`: client certificate.
    pub sslcert: Option<String>,
    /// `sslkey`: its key.
    pub sslkey: Option<String>,
    /// `channel_binding`: SCRAM channel binding (disable, prefer, require).
    pub channel_binding: Option<ChannelBinding>,
    /// `target_session_attrs`.
    pub target_session_attrs: Option<TargetSessionAttrs>,
    /// `load_balance_hosts`.
    pub load_balance_hosts: Option<LoadBalanceHosts>,
}

/// A host of the URL and its port, if it named one.
type Entry = (String, Option<u16>);

/// "h", "h:5432", "[::1]:5432" (an entry of a multi-host authority or of `host=`).
fn entry(text: &str) -> Result<Entry, ConfigError> {
    let bad = || ConfigError(format!("bad host in URL: {text}"));
    let port = |p: &str| p.parse::<u16>().map_err(|_| ConfigError(format!("bad port in URL: {p}")));
    if let Some(rest) = text.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
        let p = match after {
            "" => None,
            p => Some(port(p.strip_prefix(':').ok_or_else(bad)?)?),
        };
        return Ok((decode(addr)?, p));
    }
    match text.rsplit_once(':') {
        Some((h, p)) if !text.starts_with('/') || p.bytes().all(|b| b.is_ascii_digit()) => {
            Ok((decode(h)?, Some(port(p)?)))
        }
        _ => Ok((decode(text)?, None)),
    }
}

/// The entry as `[databases]`' `host` writes it.
fn written(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

fn decode(s: &str) -> Result<String, ConfigError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| ConfigError(format!("URL is not UTF-8: {s}")))
}

/// Stands in for an empty host (`postgres://user@/db?host=/dir`, which libpq accepts and
/// the `url` crate does not); replaced by the `host` parameter or 127.0.0.1.
const NO_HOST: &str = "parsnip-no-host.invalid";

impl DbUrl {
    /// Parses `postgres://` or `postgresql://` URLs. A `host=/dir` query parameter selects a
    /// unix socket directory.
    pub(crate) fn parse(text: &str) -> Result<DbUrl, ConfigError> {
        if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            return Err(ConfigError(format!("not a postgres:// URL: {text}")));
        }
        let bad = |e: url::ParseError| ConfigError(format!("invalid URL {text}: {e}"));
        // Several hosts: the url crate takes one, so the list is cut out here.
        let mut hosts: Vec<Entry> = Vec::new();
        let owned;
        let mut text = text;
        {
            let (scheme, rest) = text.split_once("://").unwrap_or((text, ""));
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let at = rest[..end].rfind('@').map_or(0, |i| i + 1);
            let list = &rest[at..end];
            if list.contains(',') {
                hosts = list.split(',').map(entry).collect::<Result<_, _>>()?;
                owned = format!("{scheme}://{}{NO_HOST}{}", &rest[..at], &rest[end..]);
                text = &owned;
            }
        }
        let u = match url::Url::parse(text) {
            Err(url::ParseError::EmptyHost) => {
                let (scheme, rest) = text.split_once("://").unwrap_or((text, ""));
                let at = rest.find(['/', '?']).unwrap_or(rest.len());
                // The host goes after the user (`user@`) and before the port (`:5432`).
                let (auth, tail) = rest.split_at(at);
                let host_at = auth.rfind('@').map_or(0, |i| i + 1);
                let (user, port) = auth.split_at(host_at);
                url::Url::parse(&format!("{scheme}://{user}{NO_HOST}{port}{tail}")).map_err(bad)?
            }
            r => r.map_err(bad)?,
        };
        let mut url = DbUrl {
            user: decode(u.username())?,
            password: u.password().map(decode).transpose()?,
            host: match u.host_str() {
                None | Some(NO_HOST) => String::new(),
                Some(h) => decode(h.trim_start_matches('[').trim_end_matches(']'))?,
            },
            port: u.port().unwrap_or(5432),
            dbname: decode(u.path().trim_start_matches('/'))?,
            ..DbUrl::default()
        };
        let mut ports: Vec<u16> = Vec::new();
        if hosts.is_empty() && !url.host.is_empty() {
            hosts.push((url.host.clone(), u.port()));
        }
        for (k, v) in u.query_pairs() {
            let v = v.into_owned();
            match &*k {
                "host" => {
                    hosts = v.split(',').map(|h| (h.to_owned(), None)).collect();
                }
                "port" => {
                    ports = v
                        .split(',')
                        .map(|p| p.parse().map_err(|_| ConfigError(format!("bad port in URL: {p}"))))
                        .collect::<Result<_, _>>()?;
                }
                "target_session_attrs" => url.target_session_attrs = Some(TargetSessionAttrs::parse(&v)?),
                "load_balance_hosts" => url.load_balance_hosts = Some(LoadBalanceHosts::parse(&v)?),
                "user" => url.user = v,
                "password" => url.password = Some(v),
                "dbname" => url.dbname = v,
                "sslmode" => url.sslmode = Some(ServerTlsMode::parse(&v)?),
                "sslrootcert" => url.sslrootcert = Some(v),
                "sslcert" => url.sslcert = Some(v),
                "sslkey" => url.sslkey = Some(v),
                "channel_binding" => url.channel_binding = Some(ChannelBinding::parse(&v)?),
                other => {
                    return Err(ConfigError(format!(
                        "URL parameter \"{other}\" is not one parsnip honours (host, port, user, password, \
                         dbname, sslmode, sslrootcert, sslcert, sslkey, channel_binding, target_session_attrs, \
                         load_balance_hosts)"
                    )));
                }
            }
        }
        if ports.len() > 1 && ports.len() != hosts.len().max(1) {
            return Err(ConfigError(format!("URL names {} ports for {} hosts", ports.len(), hosts.len().max(1))));
        }
        // A `port=` parameter wins over the authority's ports, as libpq's later settings do.
        // `postgres://u@:6000/db?host=/dir`: the authority's port goes with `host=`'s host.
        let authority_port = u.port();
        let port_of = |i: usize, own: Option<u16>| {
            let listed = if ports.len() == 1 { ports.first() } else { ports.get(i) };
            listed.copied().or(own).or(authority_port).unwrap_or(5432)
        };
        match hosts.as_slice() {
            [] => url.port = port_of(0, None),
            [(h, p)] => (url.host, url.port) = (h.clone(), port_of(0, *p)),
            many => {
                url.port = port_of(0, many[0].1);
                url.host =
                    many.iter().enumerate().map(|(i, (h, p))| written(h, port_of(i, *p))).collect::<Vec<_>>().join(",");
            }
        }
        if url.user.is_empty() {
            url.user = std::env::var("USER").unwrap_or_else(|_| "postgres".into());
        }
        if url.host.is_empty() {
            url.host = "127.0.0.1".into();
        }
        if url.dbname.is_empty() {
            url.dbname = url.user.clone();
        }
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = DbUrl::parse("postgres://bob:s%40cret@db.example:6000/app").unwrap();
        assert_eq!(
            u,
            DbUrl {
                user: "bob".into(),
                password: Some("s@cret".into()),
                host: "db.example".into(),
                port: 6000,
                dbname: "app".into(),
                ..DbUrl::default()
            }
        );
        let u = DbUrl::parse("postgresql://alice@[::1]/x").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.password), ("::1", 5432, None));
        let u = DbUrl::parse("postgres://a@/d?host=/tmp").unwrap();
        assert_eq!((u.user.as_str(), u.host.as_str(), u.dbname.as_str()), ("a", "/tmp", "d"));
        // An empty host with a port (the unix socket `.s.PGSQL.6000` in `host`'s directory).
        let u = DbUrl::parse("postgres://a@:6000/d?host=/tmp").unwrap();
        assert_eq!((u.user.as_str(), u.host.as_str(), u.port, u.dbname.as_str()), ("a", "/tmp", 6000, "d"));
        let u = DbUrl::parse("postgres://:6001/d?host=/tmp").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("/tmp", 6001));
        let u = DbUrl::parse("postgres://a@h/my%20db").unwrap();
        assert_eq!(u.dbname, "my db");
        assert!(DbUrl::parse("mysql://x").is_err());
        assert!(DbUrl::parse("postgres://a@h:notaport/d").is_err());
        let u = DbUrl::parse("postgres://a@h/d?port=6000").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("h", 6000));
    }

    #[test]
    fn several_hosts_as_libpq_writes_them() {
        let u = DbUrl::parse("postgres://u:p@h1:5433,h2,[::1]:7/db?target_session_attrs=read-write").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("h1:5433,h2:5432,[::1]:7", 5433));
        assert_eq!((u.user.as_str(), u.password.as_deref(), u.dbname.as_str()), ("u", Some("p"), "db"));
        assert_eq!(u.target_session_attrs, Some(TargetSessionAttrs::ReadWrite));
        let u = DbUrl::parse("postgres://u@/db?host=a,b&port=1,2&load_balance_hosts=random").unwrap();
        assert_eq!(u.host, "a:1,b:2");
        assert_eq!(u.load_balance_hosts, Some(LoadBalanceHosts::Random));
        let u = DbUrl::parse("postgres://u@/db?host=a,b&port=9").unwrap();
        assert_eq!(u.host, "a:9,b:9");
        assert!(DbUrl::parse("postgres://u@/db?host=a,b&port=1,2,3").is_err());
        assert!(DbUrl::parse("postgres://u@a:x,b/db").is_err());
        let e = DbUrl::parse("postgres://u@a/db?target_session_attrs=master").unwrap_err();
        assert!(e.0.contains("target_session_attrs"), "{e}");
        let cfg = {
            let mut c = crate::config::Config::default();
            crate::config::cli::apply_url(&mut c, &DbUrl::parse("postgres://u@h1:1,h2:2/d").unwrap(), true);
            c
        };
        let (db, _) = cfg.database("d").unwrap();
        assert_eq!(db.host.endpoints(db.port).unwrap(), vec![("h1".into(), 1), ("h2".into(), 2)]);
    }

    #[test]
    fn tls_parameters_are_read_and_unknown_ones_refused() {
        let u = DbUrl::parse("postgres://a@h/d?sslmode=verify-full&sslrootcert=/ca%20dir/ca.pem&sslcert=/c&sslkey=/k")
            .unwrap();
        assert_eq!(u.sslmode, Some(ServerTlsMode::VerifyFull));
        assert_eq!(u.sslrootcert.as_deref(), Some("/ca dir/ca.pem"));
        assert_eq!((u.sslcert.as_deref(), u.sslkey.as_deref()), (Some("/c"), Some("/k")));
        let e = DbUrl::parse("postgres://a@h/d?sslmode=required").unwrap_err();
        assert!(e.0.contains("invalid sslmode value"), "{e}");
        let u = DbUrl::parse("postgres://a@h/d?channel_binding=require").unwrap();
        assert_eq!(u.channel_binding, Some(ChannelBinding::Require));
        assert_eq!(DbUrl::parse("postgres://a@h/d").unwrap().channel_binding, None);
        let e = DbUrl::parse("postgres://a@h/d?channel_binding=on").unwrap_err();
        assert!(e.0.contains("invalid channel_binding value"), "{e}");
        let e = DbUrl::parse("postgres://a@h/d?connect_timeuot=3").unwrap_err();
        assert!(e.0.contains("connect_timeuot"), "{e}");
    }
}
