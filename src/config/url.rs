//! `postgres://user:password@host:port/dbname?param=value` URLs, as given on the command
//! line, parsed with the `url` crate. The query takes libpq's parameters that parsnip
//! honours (`host`, `port`, `user`, `password`, `dbname`, `sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`, `channel_binding`); any other is an error, not silently ignored.

use super::{ChannelBinding, ConfigError, ServerTlsMode};

/// The parts of a database URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DbUrl {
    /// User name.
    pub user: String,
    /// Password, if any.
    pub password: Option<String>,
    /// Host name, IP, or unix socket directory.
    pub host: String,
    /// Port (default 5432).
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
        for (k, v) in u.query_pairs() {
            let v = v.into_owned();
            match &*k {
                "host" => url.host = v,
                "port" => url.port = v.parse().map_err(|_| ConfigError(format!("bad port in URL: {v}")))?,
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
                         dbname, sslmode, sslrootcert, sslcert, sslkey, channel_binding)"
                    )));
                }
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
