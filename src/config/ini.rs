//! The text formats of a PgBouncer configuration, parsed without touching any file: the
//! ini file itself (sections, `key = value` lines, comments, `%include`), the libpq-style
//! `key=value ...` strings of its `[databases]`, `[users]` and `[peers]` lines, and the
//! `auth_file` (userlist.txt) lines `"name" "secret"`. Files named by `%include` are read
//! through a resolver the caller passes in, so everything here is a function of text.
//! What the settings mean for parsnip is `pgbouncer`.

/// One `key = value` line of the ini, with where it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Line {
    /// The section it is in, lower-cased (`pgbouncer`, `databases`, `users`, `peers`).
    pub(crate) section: String,
    /// The key: a setting's name, or a database or user name with its SQL quotes removed.
    pub(crate) key: String,
    /// The value, trimmed.
    pub(crate) value: String,
    /// "FILE:LINE", for messages.
    pub(crate) at: String,
}

/// What a resolver gives for a `%include`d file: a name identifying it (for cycles and
/// messages; e.g. its canonical path) and its text.
pub(crate) struct Included {
    /// The file's identity.
    pub(crate) name: String,
    /// Its contents.
    pub(crate) text: String,
}

/// Reads the file a `%include` names: `(path as written, name of the including file)`.
pub(crate) type Resolver<'a> = dyn FnMut(&str, &str) -> Result<Included, String> + 'a;

/// PgBouncer reads includes at most this deep.
const MAX_DEPTH: usize = 10;

/// Parses the ini text of the file named `name`, following `%include` through `resolve`.
/// Lines are returned in file order, an included file's lines where the directive was (its
/// lines continue the current section, and the section it ends in continues after it).
pub(crate) fn parse(name: &str, text: &str, resolve: &mut Resolver) -> Result<Vec<Line>, String> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut stack = vec![name.to_owned()];
    parse_into(name, text, resolve, &mut stack, &mut section, &mut out)?;
    Ok(out)
}

fn parse_into(
    name: &str,
    text: &str,
    resolve: &mut Resolver,
    stack: &mut Vec<String>,
    section: &mut String,
    out: &mut Vec<Line>,
) -> Result<(), String> {
    for (i, raw) in text.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(path) = line.strip_prefix("%include") {
            let path = path.trim();
            if path.is_empty() || !line["%include".len()..].starts_with(char::is_whitespace) {
                return Err(format!("{at}: %include needs a file name"));
            }
            if stack.len() > MAX_DEPTH {
                return Err(format!("{at}: %include nested more than {MAX_DEPTH} deep"));
            }
            let inc = resolve(path, name).map_err(|e| format!("{at}: %include {path}: {e}"))?;
            if stack.contains(&inc.name) {
                return Err(format!("{at}: %include {path}: {} includes itself (a cycle)", inc.name));
            }
            stack.push(inc.name.clone());
            parse_into(&inc.name, &inc.text, resolve, stack, section, out)?;
            stack.pop();
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(s) = rest.strip_suffix(']') else {
                return Err(format!("{at}: a section header needs its closing ']'"));
            };
            *section = s.trim().to_ascii_lowercase();
            continue;
        }
        let (key, value) = split_key(line).map_err(|e| format!("{at}: {e}"))?;
        if section.is_empty() {
            return Err(format!("{at}: \"{key}\" is outside any section"));
        }
        out.push(Line { section: section.clone(), key, value: value.trim().to_owned(), at });
    }
    Ok(())
}

/// Splits `key = value`; a key may be SQL-quoted (`"my-db" = ...`, `""` for a quote).
fn split_key(line: &str) -> Result<(String, &str), String> {
    if let Some(rest) = line.strip_prefix('"') {
        let (key, after) = unquote(rest, '"').ok_or("unterminated quoted name")?;
        let value = after.trim_start().strip_prefix('=').ok_or("expected '=' after the quoted name")?;
        return Ok((key, value));
    }
    let (key, value) = line.split_once('=').ok_or_else(|| format!("expected key = value, got \"{line}\""))?;
    let key = key.trim();
    if key.is_empty() {
        return Err("a line with no key before '='".into());
    }
    Ok((key.to_owned(), value))
}

/// The text up to the closing `q` (a doubled `q` stands for one), and what follows it.
fn unquote(s: &str, q: char) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == q {
            if chars.peek().is_some_and(|&(_, n)| n == q) {
                chars.next();
                out.push(q);
            } else {
                return Some((out, &s[i + c.len_utf8()..]));
            }
        } else {
            out.push(c);
        }
    }
    None
}

/// Parses a libpq-style connection string: `key=value` pairs separated by spaces, a value
/// optionally in single quotes (inside them, `\'` and `\\` escape). Keys are lower-cased.
pub(crate) fn connstr(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| format!("\"{rest}\": expected key=value"))?;
        let key = rest[..eq].trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(format!("\"{}\": expected key=value", rest.split_whitespace().next().unwrap_or(rest)));
        }
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(quoted) = rest.strip_prefix('\'') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, n)) => v.push(n),
                        None => break,
                    },
                    '\'' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => v.push(c),
                }
            }
            let end = end.ok_or_else(|| format!("{key}: unterminated quoted value"))?;
            value = v;
            rest = &quoted[end..];
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            value = rest[..end].to_owned();
            rest = &rest[end..];
        }
        out.push((key.to_ascii_lowercase(), value));
        rest = rest.trim_start();
    }
    Ok(out)
}

/// Parses an `auth_file`: one `"name" "secret"` pair a line (a doubled `"` inside stands
/// for one; anything after the second field is ignored, as are lines not starting with a
/// quote). The secret is kept as written: plain, `md5…` or `SCRAM-SHA-256$…`.
pub(crate) fn userlist(name: &str, text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix('"') else { continue };
        let bad = || format!("{name}:{}: expected \"name\" \"secret\"", i + 1);
        let (user, after) = unquote(rest, '"').ok_or_else(bad)?;
        let after = after.trim_start().strip_prefix('"').ok_or_else(bad)?;
        let (secret, _) = unquote(after, '"').ok_or_else(bad)?;
        out.push((user, secret));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn files(map: &[(&str, &str)]) -> impl FnMut(&str, &str) -> Result<Included, String> {
        let map: HashMap<String, String> = map.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |path: &str, _from: &str| {
            map.get(path)
                .map(|t| Included { name: path.to_owned(), text: t.clone() })
                .ok_or_else(|| "no such file".to_owned())
        }
    }

    fn keys(lines: &[Line]) -> Vec<(String, String, String)> {
        lines.iter().map(|l| (l.section.clone(), l.key.clone(), l.value.clone())).collect()
    }

    #[test]
    fn sections_comments_and_values() {
        let text = "; comment\n# another\n[databases]\nfoo = host=h port=1\n\"my-\"\"db\" = host=x\n\
                    [PgBouncer]\n  listen_port =  6432  \nauth_query = SELECT a ; not a comment\nempty =\n";
        let lines = parse("main.ini", text, &mut files(&[])).unwrap();
        let t = |s: &str, k: &str, v: &str| (s.to_string(), k.to_string(), v.to_string());
        assert_eq!(
            keys(&lines),
            vec![
                t("databases", "foo", "host=h port=1"),
                t("databases", "my-\"db", "host=x"),
                t("pgbouncer", "listen_port", "6432"),
                t("pgbouncer", "auth_query", "SELECT a ; not a comment"),
                t("pgbouncer", "empty", ""),
            ]
        );
        assert_eq!(lines[2].at, "main.ini:7");
    }

    #[test]
    fn includes_nest_and_carry_the_section() {
        let mut r = files(&[("a.ini", "x = host=a\n%include b.ini\ny = 2\n"), ("b.ini", "z = host=b\n[pgbouncer]\n")]);
        let lines = parse("main.ini", "[databases]\n%include a.ini\nw = 1\n", &mut r).unwrap();
        let got: Vec<_> = lines.iter().map(|l| format!("{}.{}@{}", l.section, l.key, l.at)).collect();
        assert_eq!(
            got,
            ["databases.x@a.ini:1", "databases.z@b.ini:1", "pgbouncer.y@a.ini:3", "pgbouncer.w@main.ini:3"]
        );
    }

    #[test]
    fn include_errors() {
        let mut cyc = files(&[("a.ini", "%include b.ini\n"), ("b.ini", "%include a.ini\n")]);
        let e = parse("main.ini", "[pgbouncer]\n%include a.ini\n", &mut cyc).unwrap_err();
        assert!(e.contains("cycle") && e.contains("b.ini:1"), "{e}");
        let e = parse("main.ini", "%include main.ini\n", &mut files(&[("main.ini", "")])).unwrap_err();
        assert!(e.contains("cycle"), "{e}");
        let e = parse("main.ini", "[x]\n%include gone.ini\n", &mut files(&[])).unwrap_err();
        assert!(e.contains("main.ini:2") && e.contains("gone.ini") && e.contains("no such file"), "{e}");
        let e = parse("m", "%includex\n", &mut files(&[])).unwrap_err();
        assert!(e.contains("file name"), "{e}");
        let e = parse("m", "a = 1\n", &mut files(&[])).unwrap_err();
        assert!(e.contains("outside any section"), "{e}");
        let e = parse("m", "[a\n", &mut files(&[])).unwrap_err();
        assert!(e.contains("']'"), "{e}");
        let e = parse("m", "[a]\njunk\n", &mut files(&[])).unwrap_err();
        assert!(e.contains("m:2"), "{e}");
    }

    #[test]
    fn connection_strings() {
        let v = connstr("host=h1,h2 port = 5433  dbname=x connect_query='set a=1; select \\'q\\''  USER=u").unwrap();
        let want = [
            ("host", "h1,h2"),
            ("port", "5433"),
            ("dbname", "x"),
            ("connect_query", "set a=1; select 'q'"),
            ("user", "u"),
        ];
        assert_eq!(v, want.map(|(k, v)| (k.to_string(), v.to_string())));
        assert_eq!(connstr("").unwrap(), vec![]);
        assert_eq!(connstr("password=''").unwrap(), vec![("password".into(), String::new())]);
        assert!(connstr("host").is_err());
        assert!(connstr("a=1 b").is_err());
        assert!(connstr("a='open").is_err());
    }

    #[test]
    fn userlist_lines() {
        let text = "\"alice\" \"plain pw\"\n;\"commented\" \"x\"\n\n\"bo\"\"b\" \"md5abc\" extra\n\
                    \"c\" \"SCRAM-SHA-256$4096:c2FsdA==$a:b\"\n";
        let v = userlist("u.txt", text).unwrap();
        let want = [("alice", "plain pw"), ("bo\"b", "md5abc"), ("c", "SCRAM-SHA-256$4096:c2FsdA==$a:b")];
        assert_eq!(v, want.map(|(a, b)| (a.to_string(), b.to_string())));
        let e = userlist("u.txt", "\"a\" \"b\"\n\"onlyname\"\n").unwrap_err();
        assert!(e.contains("u.txt:2"), "{e}");
    }
}
