//! `postgres://user:password@host:port/dbname` URLs, as given on the command line.

use super::ConfigError;

/// The parts of a database URL.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

fn decode(s: &str) -> Result<String, ConfigError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| ConfigError(format!("bad escape in URL: {s}")))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ConfigError(format!("bad escape in URL: {s}")))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConfigError("URL is not UTF-8".into()))
}

impl DbUrl {
    /// Parses `postgres://` or `postgresql://` URLs. A `host=/dir` query parameter selects a
    /// unix socket directory.
    pub(crate) fn parse(url: &str) -> Result<DbUrl, ConfigError> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| ConfigError(format!("not a postgres:// URL: {url}")))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(u) => match u.split_once(':') {
                Some((u, p)) => (decode(u)?, Some(decode(p)?)),
                None => (decode(u)?, None),
            },
            None => (std::env::var("USER").unwrap_or_else(|_| "postgres".into()), None),
        };
        let (mut host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h.split_once(']').ok_or_else(|| ConfigError("unclosed [ in URL host".into()))?;
            (h.to_owned(), p.strip_prefix(':').unwrap_or(""))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (decode(h)?, p),
                None => (decode(hostport)?, ""),
            }
        };
        let port = if port.is_empty() {
            5432
        } else {
            port.parse().map_err(|_| ConfigError(format!("bad port in URL: {port}")))?
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            if let Some(h) = kv.strip_prefix("host=") {
                host = decode(h)?;
            }
        }
        if host.is_empty() {
            host = "127.0.0.1".into();
        }
        let dbname = if path.is_empty() { user.clone() } else { decode(path)? };
        Ok(DbUrl { user, password, host, port, dbname })
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
                dbname: "app".into()
            }
        );
        let u = DbUrl::parse("postgresql://alice@[::1]/x").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.password), ("::1", 5432, None));
        let u = DbUrl::parse("postgres://a@/d?host=/tmp").unwrap();
        assert_eq!(u.host, "/tmp");
        assert!(DbUrl::parse("mysql://x").is_err());
        assert!(DbUrl::parse("postgres://a@h:notaport/d").is_err());
    }
}
