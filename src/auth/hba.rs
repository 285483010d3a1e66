//! `auth_type = "hba"`: a pg_hba.conf file (`auth_hba_file`) parsed into rules, and the rule
//! a client's connection falls under, with PgBouncer 1.25's reading of the format (its
//! doc/config.md "HBA file format"): line types `local`, `host`, `hostssl`, `hostnossl`;
//! databases `all`, `sameuser`, `replication`, names, comma lists and `@file`; users `all`,
//! names, comma lists and `@file` (no `+group`); addresses `all`, IPv4 and IPv6 as CIDR or
//! address and mask (no host names, `samehost`, `samenet`); methods `trust`, `reject`,
//! `md5`, `password`, `scram-sha-256`, `cert` and `peer`, the last two with an optional
//! `map=NAME` (a map of `auth_ident_file`, `auth::ident`), `ldap` with PostgreSQL's LDAP
//! options (`auth::ldap`) and `pam` with an optional `pamservice=NAME`. A quoted name is a
//! name, never a keyword (`"all"` is the database called all); `""` inside quotes is one
//! `"`; an option is `name=value`, any part of it quoted (`ldapsuffix=",dc=x"`), and a
//! comma outside quotes separates options as whitespace does. The first line that matches
//! decides; none is a refusal (`refusal`, PostgreSQL's words).
//!
//! Owns: the file's syntax and the matching. Pure: the file and those it includes are read
//! by the caller's `read`; the login runs the method the rule names.

use super::ldap::LdapOptions;
use crate::error::{Error, SqlState};
use std::net::IpAddr;
use std::sync::Arc;

/// What a rule asks of the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    /// Let in without a password.
    Trust,
    /// Refuse.
    Reject,
    /// An md5 challenge (SCRAM for a SCRAM secret, as `auth_type = "md5"`).
    Md5,
    /// A cleartext password.
    Password,
    /// SCRAM-SHA-256 (md5 for an md5 secret, as `auth_type = "scram-sha-256"`).
    ScramSha256,
    /// A client certificate whose common name is the user name.
    Cert,
    /// The operating-system user of a unix-socket peer is the user name.
    Peer,
    /// A cleartext password, checked by binding to an LDAP server (`Rule::ldap`).
    Ldap,
    /// A cleartext password, checked by PAM (`Rule::pam_service`).
    Pam,
}

impl Method {
    fn parse(s: &str) -> Result<Method, String> {
        Ok(match s {
            "trust" => Method::Trust,
            "reject" => Method::Reject,
            "md5" => Method::Md5,
            "password" => Method::Password,
            "scram-sha-256" => Method::ScramSha256,
            "cert" => Method::Cert,
            "peer" => Method::Peer,
            "ldap" => Method::Ldap,
            "pam" => Method::Pam,
            other => return Err(format!("authentication method \"{other}\" is not supported")),
        })
    }
}

/// Which connections a line is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnType {
    Local,
    Host,
    HostSsl,
    HostNoSsl,
}

/// One item of a database or user list.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Name {
    /// `all` (for databases: all but replication connections).
    All,
    /// `sameuser`: the database named as the user.
    SameUser,
    /// `replication`: replication connections.
    Replication,
    /// A name as written (quoted or not).
    Is(String),
}

/// The address field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Addr {
    All,
    /// The network and mask, both as IPv6 (IPv4 as IPv4-mapped), and whether IPv4.
    Net {
        v4: bool,
        net: u128,
        mask: u128,
    },
}

/// One line of the file.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    /// Its line number in its file.
    pub(crate) line: usize,
    conn: ConnType,
    dbs: Vec<Name>,
    users: Vec<Name>,
    addr: Addr,
    /// What it asks of the client.
    pub(crate) method: Method,
    /// `map=NAME` (cert and peer lines): the certificate or OS user name must map to the
    /// user through this map of `auth_ident_file`, instead of being the user name.
    pub(crate) map: Option<String>,
    /// The options of an `ldap` line.
    pub(crate) ldap: Option<Arc<LdapOptions>>,
    /// `pamservice=NAME` of a `pam` line (None: `auth_pam_service`).
    pub(crate) pam_service: Option<String>,
}

/// A parsed file: its rules in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Hba {
    rules: Vec<Rule>,
}

/// What the rules are matched against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Client<'a> {
    /// The client's address; None: a unix socket.
    pub(crate) addr: Option<IpAddr>,
    /// The connection is encrypted.
    pub(crate) tls: bool,
    /// A replication connection.
    pub(crate) replication: bool,
    /// The database asked for.
    pub(crate) db: &'a str,
    /// The user name.
    pub(crate) user: &'a str,
}

/// How deep `@file` includes may nest.
const MAX_INCLUDE_DEPTH: usize = 10;

/// One token of a field: its text, and whether any of it was quoted.
#[derive(Debug)]
struct Token {
    text: String,
    quoted: bool,
}

/// The fields of a line: each a comma list of tokens.
fn fields(line: &str) -> Result<Vec<Vec<Token>>, String> {
    let mut out: Vec<Vec<Token>> = Vec::new();
    let mut chars = line.chars().peekable();
    // The current field's items; whether a comma asks for one more.
    let mut field: Vec<Token> = Vec::new();
    let mut want_more = false;
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            Some(',') if want_more || field.is_empty() => return Err("empty item in a comma list".into()),
            Some(',') => {
                chars.next();
                want_more = true;
                continue;
            }
            Some(_) => {}
        }
        if !want_more && !field.is_empty() {
            out.push(std::mem::take(&mut field));
        }
        let mut tok = Token { text: String::new(), quoted: false };
        let mut in_quotes = false;
        while let Some(&c) = chars.peek() {
            if in_quotes {
                chars.next();
                if c == '"' {
                    if chars.peek() == Some(&'"') {
                        chars.next();
                        tok.text.push('"');
                    } else {
                        in_quotes = false;
                    }
                } else {
                    tok.text.push(c);
                }
            } else if c == '"' {
                chars.next();
                in_quotes = true;
                tok.quoted = true;
            } else if c.is_whitespace() || c == ',' || c == '#' {
                break;
            } else {
                chars.next();
                tok.text.push(c);
            }
        }
        if in_quotes {
            return Err("unterminated quoted string".into());
        }
        field.push(tok);
        want_more = false;
    }
    if want_more {
        return Err("a comma list ends with a comma".into());
    }
    if !field.is_empty() {
        out.push(field);
    }
    Ok(out)
}

/// The options of a line's end, or of `auth_ldap_options`: each `name=value` (quotes
/// removed), in order.
pub(crate) fn option_list(text: &str) -> Result<Vec<String>, String> {
    Ok(fields(text)?.into_iter().flatten().map(|t| t.text).collect())
}

/// The names of a database or user field, `@file` includes read through `read`.
fn names(
    field: Vec<Token>,
    users: bool,
    read: &mut dyn FnMut(&str) -> Result<String, String>,
    depth: usize,
) -> Result<Vec<Name>, String> {
    let mut out = Vec::new();
    for t in field {
        if t.quoted {
            out.push(Name::Is(t.text));
            continue;
        }
        match t.text.as_str() {
            "all" => out.push(Name::All),
            "sameuser" if !users => out.push(Name::SameUser),
            "replication" if !users => out.push(Name::Replication),
            "samerole" | "samegroup" if !users => return Err(format!("\"{}\" is not supported", t.text)),
            s if users && s.starts_with('+') => return Err(format!("group names (\"{s}\") are not supported")),
            s if s.len() > 1 && s.starts_with('@') => {
                if depth >= MAX_INCLUDE_DEPTH {
                    return Err(format!("{s}: includes nested too deeply"));
                }
                let text = read(&s[1..]).map_err(|e| format!("{s}: {e}"))?;
                for (i, line) in text.lines().enumerate() {
                    for f in fields(line).map_err(|e| format!("{s} line {}: {e}", i + 1))? {
                        out.extend(names(f, users, read, depth + 1)?);
                    }
                }
            }
            _ => out.push(Name::Is(t.text)),
        }
    }
    Ok(out)
}

/// An address as IPv6 bits (IPv4 mapped), and whether it was IPv4.
fn bits(ip: IpAddr) -> (bool, u128) {
    match ip {
        IpAddr::V4(a) => (true, u128::from(a.to_ipv6_mapped())),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => (true, u128::from(v4.to_ipv6_mapped())),
            None => (false, u128::from(a)),
        },
    }
}

fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("invalid IP address \"{s}\" (host names, samehost and samenet are not supported)"))
}

/// The address field (and the mask field after it when the address has no `/`); the
/// number of fields used.
fn address(f: &[Vec<Token>]) -> Result<(Addr, usize), String> {
    let single = |i: usize| -> Result<&str, String> {
        match f.get(i).map(Vec::as_slice) {
            Some([t]) => Ok(t.text.as_str()),
            Some(_) => Err("an address is a single value".into()),
            None => Err("end of line before the authentication method".into()),
        }
    };
    let a = single(0)?;
    if a == "all" {
        return Ok((Addr::All, 1));
    }
    if let Some((ip, len)) = a.split_once('/') {
        let ip = parse_ip(ip)?;
        let (v4, net) = bits(ip);
        let max = if v4 { 32 } else { 128 };
        let len: u32 = len.parse().ok().filter(|&n| n <= max).ok_or_else(|| format!("invalid CIDR mask in \"{a}\""))?;
        // Mapped IPv4: the mask covers the 96 mapping bits too.
        let len = if v4 { len + 96 } else { len };
        let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
        return Ok((Addr::Net { v4, net: net & mask, mask }, 1));
    }
    let (v4, net) = bits(parse_ip(a)?);
    let m = single(1).map_err(|_| format!("\"{a}\" needs a mask: write it as CIDR or give a mask after it"))?;
    let (mv4, mut mask) = bits(parse_ip(m).map_err(|_| format!("invalid IP mask \"{m}\""))?);
    if mv4 != v4 {
        return Err(format!("IP address and mask do not match: \"{a}\" \"{m}\""));
    }
    if v4 {
        mask |= !u128::from(u32::MAX);
    }
    Ok((Addr::Net { v4, net: net & mask, mask }, 2))
}

impl Hba {
    /// Parses the file `text`; `read` gives an `@file` (name as written, without the `@`).
    /// Any line it cannot read makes the whole file an error, as PostgreSQL's reload.
    pub(crate) fn parse(text: &str, read: &mut dyn FnMut(&str) -> Result<String, String>) -> Result<Hba, String> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let at = |e: String| format!("line {line_no}: {e}");
            let f = fields(line).map_err(at)?;
            if f.is_empty() {
                continue;
            }
            rules.push(Self::rule(f, line_no, read).map_err(at)?);
        }
        Ok(Hba { rules })
    }

    fn rule(
        mut f: Vec<Vec<Token>>,
        line: usize,
        read: &mut dyn FnMut(&str) -> Result<String, String>,
    ) -> Result<Rule, String> {
        let kind = match f[0].as_slice() {
            [t] if !t.quoted => t.text.as_str(),
            _ => return Err("a line starts with local, host, hostssl or hostnossl".into()),
        };
        let conn = match kind {
            "local" => ConnType::Local,
            "host" => ConnType::Host,
            "hostssl" => ConnType::HostSsl,
            "hostnossl" => ConnType::HostNoSsl,
            "hostgssenc" | "hostnogssenc" => return Err(format!("\"{kind}\" (GSSAPI) is not supported")),
            other => return Err(format!("invalid connection type \"{other}\"")),
        };
        if f.len() < 3 {
            return Err("end of line before the user field".into());
        }
        let rest = f.split_off(3);
        let users = names(f.pop().unwrap_or_default(), true, read, 0)?;
        let dbs = names(f.pop().unwrap_or_default(), false, read, 0)?;
        let (addr, used) = if conn == ConnType::Local { (Addr::All, 0) } else { address(&rest)? };
        let rest = &rest[used..];
        let method = match rest.first().map(Vec::as_slice) {
            Some([t]) => Method::parse(&t.text)?,
            Some(_) => return Err("the authentication method is a single value".into()),
            None => return Err("end of line before the authentication method".into()),
        };
        let (mut map, mut ldap, mut pam_service) = (None, None, None);
        let opts = rest[1..].iter().flatten().map(|t| t.text.as_str());
        match method {
            Method::Ldap => ldap = Some(Arc::new(LdapOptions::parse(opts)?)),
            _ => {
                // `map=NAME` on cert and peer lines (PgBouncer's), naming a map of
                // `auth_ident_file`; `pamservice=NAME` on pam lines.
                for opt in opts {
                    match (method, opt.split_once('=')) {
                        (Method::Cert | Method::Peer, Some(("map", name))) if !name.is_empty() => {
                            map = Some(name.to_owned())
                        }
                        (_, Some(("map", _))) => return Err("map= is only supported on cert and peer lines".into()),
                        (Method::Pam, Some(("pamservice", name))) if !name.is_empty() => {
                            pam_service = Some(name.to_owned())
                        }
                        _ => {
                            return Err(format!(
                                "option \"{opt}\" is not supported (map= on cert and peer lines, pamservice= on pam \
                                 lines, PostgreSQL's ldap options on ldap lines)"
                            ));
                        }
                    }
                }
            }
        }
        if method == Method::Peer && conn != ConnType::Local {
            return Err("peer authentication is only supported on local sockets".into());
        }
        Ok(Rule { line, conn, dbs, users, addr, method, map, ldap, pam_service })
    }

    /// The maps the rules name (`map=`), with their line numbers.
    pub(crate) fn maps(&self) -> impl Iterator<Item = (usize, &str)> {
        self.rules.iter().filter_map(|r| r.map.as_deref().map(|m| (r.line, m)))
    }

    /// The first rule `client` falls under; None: no rule (refused).
    pub(crate) fn find(&self, client: &Client) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(client))
    }
}

impl Rule {
    fn matches(&self, c: &Client) -> bool {
        let conn = match (self.conn, c.addr) {
            (ConnType::Local, None) => true,
            (ConnType::Host, Some(_)) => true,
            (ConnType::HostSsl, Some(_)) => c.tls,
            (ConnType::HostNoSsl, Some(_)) => !c.tls,
            _ => false,
        };
        let addr = match (self.addr, c.addr) {
            (Addr::All, _) | (_, None) => true,
            (Addr::Net { v4, net, mask }, Some(ip)) => {
                let (cv4, bits) = bits(ip);
                cv4 == v4 && bits & mask == net
            }
        };
        conn && addr && self.db_matches(c) && self.user_matches(c.user)
    }

    fn user_matches(&self, user: &str) -> bool {
        self.users.iter().any(|u| match u {
            Name::All => true,
            Name::Is(n) => n == user,
            Name::SameUser | Name::Replication => false,
        })
    }

    fn db_matches(&self, c: &Client) -> bool {
        self.dbs.iter().any(|d| match d {
            Name::Replication => c.replication,
            _ if c.replication => false,
            Name::All => true,
            Name::SameUser => c.db == c.user,
            Name::Is(n) => n == c.db,
        })
    }
}

/// PostgreSQL's refusal of `client` with no rule (`reject`: false) or by a `reject` rule.
pub(crate) fn refusal(client: &Client, reject: bool) -> Error {
    let host = client.addr.map_or_else(|| "[local]".to_owned(), |a| a.to_canonical().to_string());
    let enc = if client.tls { "SSL encryption" } else { "no encryption" };
    let (user, db) = (client.user, client.db);
    let what = if reject { "pg_hba.conf rejects connection" } else { "no pg_hba.conf entry" };
    Error::fatal(
        SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        format!("{what} for host \"{host}\", user \"{user}\", database \"{db}\", {enc}"),
    )
}

#[cfg(test)]
mod tests;
