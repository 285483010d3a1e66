//! User name maps (`auth_ident_file`, PostgreSQL's pg_ident.conf): which operating-system
//! or certificate user names (the "system user": a `peer` client's OS user, a `cert`
//! client's certificate common name) may log in as which database user, for the hba lines
//! that name a map (`map=NAME` on a `cert` or `peer` line).
//!
//! The semantics are PostgreSQL's (its "User Name Maps" chapter), a superset of PgBouncer
//! 1.25's (which takes exact names and `all` only): each line is `MAP SYSTEM-USER DB-USER`;
//! `#` starts a comment; a field may be double-quoted (`""` is one `"`). A system user that
//! starts with `/` is a regular expression (the rest of the field; unanchored unless it says
//! `^`/`$`), and `\1` in the database user is replaced by its first capture group. A
//! database user `all` (unquoted) is any user; one that starts with `/` is a regular
//! expression the requested user must match. `+group` and `include` lines are refused (no
//! role membership here, no included files). Names compare exactly (case-sensitive).
//!
//! Owns: the file's syntax and the question "may SYSTEM log in as USER under MAP". Pure:
//! the caller reads the file.

use regex_automata::meta::Regex;

/// A system-user field.
#[derive(Clone, Debug)]
enum System {
    Exact(String),
    /// `/regex`, compiled.
    Pattern(Regex),
}

/// A database-user field.
#[derive(Clone, Debug)]
enum DbUser {
    /// Any user (`all`).
    All,
    /// A name, where `\1` stands for the system user's first capture group (with a regular
    /// expression system user).
    Name(String),
    /// `/regex` the requested user must match.
    Pattern(Regex),
}

#[derive(Clone, Debug)]
struct Line {
    map: String,
    system: System,
    user: DbUser,
}

/// A parsed ident file: its lines in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct IdentMap {
    lines: Vec<Line>,
}

/// One field: its text, and whether any of it was quoted.
struct Field {
    text: String,
    quoted: bool,
}

/// Splits a line into fields (whitespace-separated, `"…"` quoting, `#` comments).
fn fields(line: &str) -> Result<Vec<Field>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => return Ok(out),
            _ => {}
        }
        let mut f = Field { text: String::new(), quoted: false };
        let mut in_quotes = false;
        while let Some(&c) = chars.peek() {
            if !in_quotes && (c.is_whitespace() || c == '#') {
                break;
            }
            chars.next();
            match c {
                '"' if in_quotes && chars.peek() == Some(&'"') => {
                    chars.next();
                    f.text.push('"');
                }
                '"' => {
                    in_quotes = !in_quotes;
                    f.quoted = true;
                }
                c => f.text.push(c),
            }
        }
        if in_quotes {
            return Err("unterminated quoted string".into());
        }
        out.push(f);
    }
}

fn regex(src: &str) -> Result<Regex, String> {
    Regex::new(src).map_err(|e| format!("invalid regular expression \"{src}\": {e}"))
}

impl IdentMap {
    /// Parses the file `text`; any line it cannot read makes the whole file an error.
    pub(crate) fn parse(text: &str) -> Result<IdentMap, String> {
        let mut lines = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let at = |e: String| format!("line {}: {e}", i + 1);
            let f = fields(raw).map_err(at)?;
            match f.as_slice() {
                [] => {}
                [first, ..] if !first.quoted && first.text.starts_with("include") => {
                    return Err(at(format!("\"{}\" is not supported", first.text)));
                }
                [map, system, user] => lines.push(Self::line(map, system, user).map_err(at)?),
                _ => return Err(at("a line is MAP-NAME SYSTEM-USERNAME DATABASE-USERNAME".into())),
            }
        }
        Ok(IdentMap { lines })
    }

    fn line(map: &Field, system: &Field, user: &Field) -> Result<Line, String> {
        // As PostgreSQL: a leading `/` makes a regular expression, quoted or not; `all` and
        // `+` are keywords only unquoted.
        let system = match system.text.strip_prefix('/') {
            Some(re) => System::Pattern(regex(re)?),
            None => System::Exact(system.text.clone()),
        };
        let user = if let Some(re) = user.text.strip_prefix('/') {
            DbUser::Pattern(regex(re)?)
        } else if user.quoted {
            DbUser::Name(user.text.clone())
        } else if user.text == "all" {
            DbUser::All
        } else if user.text.starts_with('+') {
            return Err(format!("\"{}\": group membership (+) is not supported", user.text));
        } else {
            DbUser::Name(user.text.clone())
        };
        Ok(Line { map: map.text.clone(), system, user })
    }

    /// Whether map `map` lets system user `system` log in as database user `user`: some
    /// line of that map matches both.
    pub(crate) fn allows(&self, map: &str, system: &str, user: &str) -> bool {
        self.lines.iter().filter(|l| l.map == map).any(|l| l.allows(system, user))
    }

    /// Whether the file has any line for `map`.
    pub(crate) fn has_map(&self, map: &str) -> bool {
        self.lines.iter().any(|l| l.map == map)
    }
}

impl Line {
    fn allows(&self, system: &str, user: &str) -> bool {
        let group1 = match &self.system {
            System::Exact(s) if s == system => None,
            System::Exact(_) => return false,
            System::Pattern(re) => {
                let mut caps = re.create_captures();
                re.captures(system, &mut caps);
                if !caps.is_match() {
                    return false;
                }
                caps.get_group(1).map(|span| &system[span.range()])
            }
        };
        match &self.user {
            DbUser::All => true,
            DbUser::Pattern(re) => re.is_match(user),
            DbUser::Name(name) => match (group1, name.contains("\\1")) {
                (Some(g), true) => name.replacen("\\1", g, 1) == user,
                _ => name == user,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(text: &str) -> IdentMap {
        IdentMap::parse(text).expect("parses")
    }

    #[test]
    fn exact_lines_and_all() {
        let m = map("# comment\n\nomicron  bryanh  bryanh\nomicron ann ann # trailing\n\
                     omicron robert bob\nomicron bryanh guest1\nany  \"root\" all\n");
        assert!(m.allows("omicron", "bryanh", "bryanh"));
        assert!(m.allows("omicron", "bryanh", "guest1"), "one system user, several database users");
        assert!(m.allows("omicron", "robert", "bob"));
        assert!(!m.allows("omicron", "robert", "robert"), "a map is not the identity");
        assert!(!m.allows("omicron", "bob", "bob"));
        assert!(!m.allows("other", "bryanh", "bryanh"), "another map");
        assert!(m.allows("any", "root", "anyone"), "all: any database user");
        assert!(!m.allows("omicron", "Bryanh", "bryanh"), "names are case-sensitive");
        assert!(m.has_map("any") && !m.has_map("none"));
    }

    #[test]
    fn regular_expressions_and_substitution() {
        // PostgreSQL's doc: map SYSTEM-USERNAME starting with "/", \1 in PG-USERNAME.
        let m = map("mymap   /^(.*)@mydomain\\.com$      \\1\n\
                     mymap   /^(.*)@otherdomain\\.com$   guest\n\
                     loose   /adm                       admin\n\
                     users   cert-user                  /^app_\n");
        assert!(m.allows("mymap", "alice@mydomain.com", "alice"));
        assert!(!m.allows("mymap", "alice@mydomain.com", "bob"));
        assert!(!m.allows("mymap", "alice@mydomainXcom", "alice"), "the dot is escaped");
        assert!(m.allows("mymap", "bob@otherdomain.com", "guest"));
        assert!(!m.allows("mymap", "bob@otherdomain.com", "bob"));
        assert!(m.allows("loose", "sysadmin", "admin"), "unanchored: a match anywhere");
        assert!(m.allows("users", "cert-user", "app_reports"), "a database-user regex");
        assert!(!m.allows("users", "cert-user", "reports"));
    }

    #[test]
    fn quoting_and_refusals() {
        let m = map("q \"with space\" \"all\"\nq \"say \"\"hi\"\"\" x\n");
        assert!(m.allows("q", "with space", "all"), "a quoted all is a user called all");
        assert!(!m.allows("q", "with space", "bob"));
        assert!(m.allows("q", "say \"hi\"", "x"));
        for (text, why) in [
            ("m a\n", "MAP-NAME SYSTEM-USERNAME"),
            ("m a b c\n", "MAP-NAME SYSTEM-USERNAME"),
            ("m a +group\n", "group membership"),
            ("include other.conf\n", "not supported"),
            ("m /(unclosed b\n", "invalid regular expression"),
            ("m \"open b\n", "unterminated"),
        ] {
            let e = IdentMap::parse(&format!("ok x y\n{text}")).expect_err(text);
            assert!(e.starts_with("line 2: ") && e.contains(why), "{text}: {e}");
        }
    }
}
