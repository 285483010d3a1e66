//! LDAP authentication's options, as PostgreSQL's pg_hba.conf gives them (and PgBouncer's
//! `auth_ldap_options`): `ldapserver` (one or more, space-separated), `ldapport`,
//! `ldapscheme` (`ldap`, or `ldaps`: TLS from the start), `ldaptls` (1: StartTLS),
//! `ldapprefix`/`ldapsuffix` (simple bind: the client binds as
//! prefix + user name + suffix), `ldapbasedn`, `ldapbinddn`, `ldapbindpasswd`,
//! `ldapsearchattribute`, `ldapsearchfilter` (search+bind: parsnip binds as `ldapbinddn`,
//! or anonymously, finds the user's one entry under `ldapbasedn`, then binds as it with the
//! client's password), and `ldapurl` (RFC 4516: server, port, base, attribute, scope and
//! filter at once, `ldaps://` for TLS). Combinations PostgreSQL refuses are refused, and
//! StartTLS inside `ldaps`.
//!
//! Owns: reading the options, the DN of a simple bind and the filter of a search, and
//! which user names are refused before the server is asked. Pure: the driver
//! (`driver::ldap`) talks to the server.

use std::fmt::Write as _;

/// The scope of a search+bind search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The base entry only.
    Base,
    /// Its children.
    One,
    /// The whole subtree (the default with `ldapbasedn`).
    Sub,
}

/// How the client's password is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Bind as `prefix` + user name + `suffix`.
    Simple { prefix: String, suffix: String },
    /// Bind as `bind_dn` (None: anonymously), search `base` for the user's entry, bind as it.
    Search {
        base: String,
        scope: Scope,
        bind_dn: Option<String>,
        bind_password: String,
        /// `ldapsearchattribute` (default `uid`): the filter is `(attribute=user)`.
        attribute: String,
        /// `ldapsearchfilter`, `$username` replaced by the user name (instead of `attribute`).
        filter: Option<String>,
    },
}

/// How the connection to the server is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Security {
    /// Plaintext.
    Plain,
    /// StartTLS on an `ldap` connection (`ldaptls=1`).
    StartTls,
    /// TLS from the start (`ldaps`).
    Ldaps,
}

/// An LDAP method's options, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LdapOptions {
    /// The servers, tried in order.
    pub(crate) servers: Vec<String>,
    /// Their port (default 389, 636 for ldaps).
    pub(crate) port: u16,
    /// TLS to them.
    pub(crate) tls: Security,
    /// How the password is checked.
    pub(crate) mode: Mode,
}

/// The options as written, before they are checked together.
#[derive(Default)]
struct Raw {
    server: Option<String>,
    port: Option<u16>,
    prefix: Option<String>,
    suffix: Option<String>,
    basedn: Option<String>,
    binddn: Option<String>,
    bindpasswd: Option<String>,
    attribute: Option<String>,
    filter: Option<String>,
    scope: Option<Scope>,
    url: bool,
    ldaps: bool,
    starttls: bool,
}

impl LdapOptions {
    /// The options of `auth_ldap_options` (the options of an hba line, written as there).
    pub(crate) fn from_text(text: &str) -> Result<LdapOptions, String> {
        let opts = super::hba::option_list(text)?;
        LdapOptions::parse(opts.iter().map(String::as_str))
    }

    /// Reads `name=value` options (quotes already removed).
    pub(crate) fn parse<'a>(opts: impl IntoIterator<Item = &'a str>) -> Result<LdapOptions, String> {
        let mut raw = Raw::default();
        for opt in opts {
            let Some((name, value)) = opt.split_once('=') else {
                return Err(format!("authentication option not in name=value format: {opt}"));
            };
            let v = Some(value.to_owned());
            match name {
                "ldapserver" => raw.server = v,
                "ldapport" => {
                    raw.port =
                        Some(value.parse().ok().filter(|&p| p > 0).ok_or(format!("invalid LDAP port \"{value}\""))?)
                }
                "ldapscheme" if value == "ldap" || value == "ldaps" => raw.ldaps = value == "ldaps",
                "ldapscheme" => return Err(format!("invalid ldapscheme value: \"{value}\"")),
                "ldaptls" if value == "0" || value == "1" => raw.starttls = value == "1",
                "ldaptls" => return Err(format!("invalid ldaptls value: \"{value}\"")),
                "ldapprefix" => raw.prefix = v,
                "ldapsuffix" => raw.suffix = v,
                "ldapbasedn" => raw.basedn = v,
                "ldapbinddn" => raw.binddn = v,
                "ldapbindpasswd" => raw.bindpasswd = v,
                "ldapsearchattribute" => raw.attribute = v,
                "ldapsearchfilter" => raw.filter = v,
                "ldapurl" => raw.url(value)?,
                other => return Err(format!("invalid authentication option \"{other}\" for method ldap")),
            }
        }
        raw.check()
    }

    /// The DN a simple bind uses for `user`; None when the user name holds a character
    /// that means something in a DN (`, + " \ < > ; =`, a NUL, or a leading `#` or space):
    /// refused rather than escaped, so that no name reaches another entry.
    pub(crate) fn bind_dn(prefix: &str, suffix: &str, user: &str) -> Option<String> {
        let special = |c: char| matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=' | '\0');
        if user.is_empty() || user.contains(special) || user.starts_with(['#', ' ']) || user.ends_with(' ') {
            return None;
        }
        Some(format!("{prefix}{user}{suffix}"))
    }

    /// The filter a search+bind search uses for `user`; None when the user name holds a
    /// character PostgreSQL refuses there (`* ( ) \ /`, and a NUL).
    pub(crate) fn search_filter(attribute: &str, filter: Option<&str>, user: &str) -> Option<String> {
        if user.contains(['*', '(', ')', '\\', '/', '\0']) {
            return None;
        }
        Some(match filter {
            Some(f) => f.replace("$username", user),
            None => {
                let mut f = String::with_capacity(attribute.len() + user.len() + 3);
                let _ = write!(f, "({attribute}={user})");
                f
            }
        })
    }

    /// The URLs of the servers, in order (`ldaps://` for ldaps; StartTLS is asked for on
    /// an `ldap://` one).
    pub(crate) fn urls(&self) -> Vec<String> {
        let scheme = if self.tls == Security::Ldaps { "ldaps" } else { "ldap" };
        self.servers
            .iter()
            .map(|s| {
                if s.contains(':') {
                    format!("{scheme}://[{s}]:{}", self.port)
                } else {
                    format!("{scheme}://{s}:{}", self.port)
                }
            })
            .collect()
    }
}

/// `auth_ldap_options` as shown (`SHOW CONFIG`): the value of `ldapbindpasswd`, quoted or
/// not, replaced by `********`.
pub(crate) fn redacted(text: &str) -> String {
    const KEY: &str = "ldapbindpasswd=";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(KEY) {
        out.push_str(&rest[..at + KEY.len()]);
        out.push_str("********");
        // Skip the value: up to whitespace or a comma outside quotes.
        let mut quoted = false;
        let value = &rest[at + KEY.len()..];
        let end = value
            .char_indices()
            .find(|&(_, c)| {
                if c == '"' {
                    quoted = !quoted;
                }
                !quoted && (c.is_whitespace() || c == ',')
            })
            .map_or(value.len(), |(i, _)| i);
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

impl Raw {
    /// `ldapurl`: `ldap://host[:port]/basedn[?attribute[?scope[?filter]]]`.
    fn url(&mut self, url: &str) -> Result<(), String> {
        let bad = |why: &str| format!("invalid LDAP URL \"{url}\": {why}");
        let rest = match url.split_once("://") {
            Some(("ldap", rest)) => rest,
            Some(("ldaps", rest)) => {
                self.ldaps = true;
                rest
            }
            _ => return Err(bad("unsupported LDAP URL scheme")),
        };
        let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unterminated IPv6 address"))?;
            (h, after.strip_prefix(':'))
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        self.server = Some(decode(host));
        if let Some(p) = port {
            self.port = Some(p.parse().ok().filter(|&p| p > 0).ok_or_else(|| bad("invalid port"))?);
        }
        let mut parts = path.splitn(4, '?');
        let base = parts.next().unwrap_or_default();
        if !base.is_empty() {
            self.basedn = Some(decode(base));
        }
        if let Some(attrs) = parts.next().filter(|a| !a.is_empty()) {
            if attrs.contains(',') {
                return Err(bad("more than one attribute"));
            }
            self.attribute = Some(decode(attrs));
        }
        self.scope = match parts.next().unwrap_or_default() {
            "" | "base" => Some(Scope::Base),
            "one" => Some(Scope::One),
            "sub" => Some(Scope::Sub),
            other => return Err(bad(&format!("invalid scope \"{other}\""))),
        };
        if let Some(filter) = parts.next().filter(|f| !f.is_empty()) {
            if filter.contains('?') {
                return Err(bad("extensions are not supported"));
            }
            self.filter = Some(decode(filter));
        }
        self.url = true;
        Ok(())
    }

    /// PostgreSQL's rules on which options go together.
    fn check(self) -> Result<LdapOptions, String> {
        let search = self.basedn.is_some()
            || self.binddn.is_some()
            || self.bindpasswd.is_some()
            || self.attribute.is_some()
            || self.filter.is_some()
            || self.url;
        if (self.prefix.is_some() || self.suffix.is_some()) && search {
            return Err("cannot use ldapbasedn, ldapbinddn, ldapbindpasswd, ldapsearchattribute, \
                        ldapsearchfilter, or ldapurl together with ldapprefix or ldapsuffix"
                .into());
        }
        if self.attribute.is_some() && self.filter.is_some() {
            return Err("cannot use ldapsearchattribute together with ldapsearchfilter".into());
        }
        let servers: Vec<String> =
            self.server.as_deref().unwrap_or_default().split_whitespace().map(str::to_owned).collect();
        if servers.is_empty() {
            return Err("authentication method \"ldap\" requires argument \"ldapserver\" to be set".into());
        }
        let mode = if let Some(base) = self.basedn {
            Mode::Search {
                base,
                scope: self.scope.unwrap_or(Scope::Sub),
                bind_dn: self.binddn,
                bind_password: self.bindpasswd.unwrap_or_default(),
                attribute: self.attribute.unwrap_or_else(|| "uid".into()),
                filter: self.filter,
            }
        } else if search {
            return Err("authentication method \"ldap\" requires argument \"ldapbasedn\" to be set \
                        for search+bind (ldapbinddn, ldapsearchattribute, ldapsearchfilter, ldapurl)"
                .into());
        } else if self.prefix.is_some() || self.suffix.is_some() {
            Mode::Simple { prefix: self.prefix.unwrap_or_default(), suffix: self.suffix.unwrap_or_default() }
        } else {
            return Err(
                "authentication method \"ldap\" requires argument \"ldapbasedn\", \"ldapprefix\", or \"ldapsuffix\" \
                 to be set"
                    .into(),
            );
        };
        let tls = match (self.ldaps, self.starttls) {
            (true, true) => return Err("cannot use ldaptls=1 together with ldaps (TLS already)".into()),
            (true, false) => Security::Ldaps,
            (false, true) => Security::StartTls,
            (false, false) => Security::Plain,
        };
        let port = self.port.unwrap_or(if tls == Security::Ldaps { 636 } else { 389 });
        Ok(LdapOptions { servers, port, tls, mode })
    }
}

/// A URL part, percent-decoded.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests;
