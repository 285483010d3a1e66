//! Differential test harness for the prepared-statement cache.
//!
//! A scenario (written as data in `tests/diff/*.txt`, format below) is a list of steps for
//! several clients. The runner executes it twice: directly against PostgreSQL (each client
//! its own backend) and through parsnip with a pool smaller than the number of clients
//! (`pool_size = 1` unless the scenario says otherwise). Both runs produce a transcript of
//! normalized backend messages per step; the transcripts must be equal, except where a step
//! states parsnip's intended behaviour explicitly (`parsnip:` / `alt:` lines).
//!
//! # Scenario format
//!
//! ```text
//! # A comment. A scenario starts with its name (also its test's name):
//! === scenario_name
//! # Why parsnip is meant to differ from PostgreSQL here (shown on failure), if it is:
//! intentional: ...
//! # SQL run with psql before each of the two runs, and extra parsnip configuration:
//! setup: DROP TABLE IF EXISTS {T}; CREATE TABLE {T} (a int)
//! config: max_prepared_statements = 2
//! # Client A sends these messages in one write, then reads until one ReadyForQuery:
//! A: P s1 "select $1::int" int4 | B "" s1 7 | E "" | S
//! # Client B reads up to and including the RowDescription:
//! B: P "" "select 1" | D S "" | H -> until T
//! # SQL from outside (psql, both runs; `psql@parsnip:` only in the run through parsnip):
//! psql: ALTER TABLE {T} ADD COLUMN b int
//! # A pause in milliseconds:
//! sleep: 200
//! A: B "" s1 i4:7 | E "" | S
//! # What parsnip must answer to the step above instead of PostgreSQL's answer:
//!   parsnip: 2; D["7"]; C(SELECT 1); Z(I)
//! ```
//!
//! `{T}` expands to `diff_<scenario_name>`, a table name private to the scenario, so
//! scenarios run in parallel. A step line ending in `|` continues on the next line.
//!
//! Messages (letters as in the protocol):
//! * `P name "sql" [type ...]`: Parse; types are names (`int4`, `int8`, `text`, ...) or OIDs;
//! * `B portal stmt [param ...]`: Bind; a param is a word or `"text"` (text format),
//!   `NULL`, or `i2:N` / `i4:N` / `i8:N` (binary); results are always text;
//! * `D S name` / `D P name`: Describe; `C S name` / `C P name`: Close;
//! * `E portal [maxrows]`: Execute; `S`: Sync; `H`: Flush; `Q "sql"`: Query;
//! * `d "data"`: CopyData (`\n`, `\t` escapes); `c`: CopyDone; `f "message"`: CopyFail.
//!
//! `""` is the empty (unnamed) name. After sending, a step reads until as many ReadyForQuery
//! as it sent Sync + Query messages, or as `-> N` says; `-> until X` reads up to and
//! including the first message with tag X; `-> msgs N` reads N messages; `-> none` reads
//! nothing (a later step `A: -> N` with no messages reads the rest). Every read is bounded.
//!
//! Expectation lines after a step (indented): `parsnip: m1; m2; ...` replaces the
//! comparison with PostgreSQL for that step by this exact list (items may use `*` as a
//! wildcard); `alt: ...` accepts this list as well as PostgreSQL's transcript; `postgres: ...`
//! pins what PostgreSQL itself answers (a check of the scenario's own assumptions).
//!
//! Normalized messages: `1` ParseComplete, `2` BindComplete, `3` CloseComplete, `n` NoData,
//! `s` PortalSuspended, `I` EmptyQueryResponse, `t(types)` ParameterDescription,
//! `T(col:type,...)` RowDescription (table OIDs dropped), `D[...]` DataRow, `C(tag)`
//! CommandComplete, `E(SEVERITY CODE message ...)` ErrorResponse, `N(...)` Notice, `Z(I|T|E)`
//! ReadyForQuery, `G(fmt,ncols)` / `H(fmt,ncols)` CopyIn/OutResponse, `d("...")` CopyData,
//! `c` CopyDone, `A(channel,payload)` Notification (PID dropped). ParameterStatus and
//! BackendKeyData are ignored (they legitimately differ).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::support::{self, Frame, Parsnip, Raw, SUPER_PW};

/// Bound on one step's reads.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on a whole scenario (both runs).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(50);

// ---------------------------------------------------------------------------------------------
// Scenario model
// ---------------------------------------------------------------------------------------------

/// One frontend message.
#[derive(Clone, Debug)]
pub enum Msg {
    Parse { name: String, sql: String, types: Vec<u32> },
    Bind { portal: String, stmt: String, params: Vec<Param> },
    Describe { kind: u8, name: String },
    Execute { portal: String, max_rows: i32 },
    Close { kind: u8, name: String },
    Sync,
    Flush,
    Query(String),
    CopyData(Vec<u8>),
    CopyDone,
    CopyFail(String),
}

/// A Bind parameter.
#[derive(Clone, Debug)]
pub enum Param {
    Null,
    Text(String),
    Binary(Vec<u8>),
}

/// How much a step reads after sending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// Until this many ReadyForQuery.
    Ready(usize),
    /// Up to and including the first message with this tag.
    Until(u8),
    /// Exactly this many (non-ignored) messages.
    Count(usize),
    /// Nothing.
    Nothing,
}

/// A step of a scenario.
#[derive(Clone, Debug)]
pub enum Step {
    Client {
        client: String,
        /// The step as written (for transcripts).
        label: String,
        msgs: Vec<Msg>,
        read: Read,
        /// What parsnip must answer instead of PostgreSQL's transcript.
        parsnip: Option<Vec<String>>,
        /// An alternative parsnip may answer besides PostgreSQL's transcript.
        alt: Option<Vec<String>>,
        /// What PostgreSQL answers (checked on the direct run).
        postgres: Option<Vec<String>>,
    },
    /// SQL run from outside (psql as superuser), in both runs or (`pooler_only`) only in the
    /// run through parsnip (e.g. to kill its server connections).
    Psql { sql: String, label: String, pooler_only: bool },
    /// A pause (gives parsnip time to do what it would do with queued clients).
    Sleep { ms: u64, label: String },
}

/// A parsed scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// `file:line` of the `===` header.
    pub origin: String,
    pub intentional: Option<String>,
    pub setup: String,
    pub config: String,
    pub steps: Vec<Step>,
    /// Client names in order of first use.
    pub clients: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

fn type_oid(name: &str) -> Option<u32> {
    TYPES.iter().find(|(n, _)| *n == name).map(|(_, o)| *o).or_else(|| name.parse().ok())
}

fn type_name(oid: u32) -> String {
    TYPES.iter().find(|(_, o)| *o == oid).map(|(n, _)| n.to_string()).unwrap_or_else(|| oid.to_string())
}

const TYPES: &[(&str, u32)] = &[
    ("unspecified", 0),
    ("bool", 16),
    ("bytea", 17),
    ("name", 19),
    ("int8", 20),
    ("int2", 21),
    ("int4", 23),
    ("text", 25),
    ("oid", 26),
    ("json", 114),
    ("float4", 700),
    ("float8", 701),
    ("unknown", 705),
    ("int4[]", 1007),
    ("text[]", 1009),
    ("varchar", 1043),
    ("date", 1082),
    ("timestamp", 1114),
    ("timestamptz", 1184),
    ("interval", 1186),
    ("numeric", 1700),
    ("void", 2278),
    ("uuid", 2950),
    ("jsonb", 3802),
];

/// Splits `s` at `sep` outside double quotes.
fn split_outside_quotes<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_quotes => i += 1,
            b'"' => in_quotes = !in_quotes,
            _ if !in_quotes && s[i..].starts_with(sep) => {
                out.push(&s[start..i]);
                start = i + sep.len();
                i = start;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&s[start..]);
    out
}

/// A token: a bare word or a double-quoted string (escapes `\"`, `\\`, `\n`, `\t`).
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Quoted(String),
}

impl Tok {
    fn text(&self) -> &str {
        match self {
            Tok::Word(s) | Tok::Quoted(s) => s,
        }
    }
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut v = String::new();
            loop {
                match chars.next() {
                    None => return Err(format!("unterminated string in {s:?}")),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => v.push('\n'),
                        Some('t') => v.push('\t'),
                        Some(other) => v.push(other),
                        None => return Err(format!("dangling backslash in {s:?}")),
                    },
                    Some(other) => v.push(other),
                }
            }
            out.push(Tok::Quoted(v));
        } else {
            let mut v = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                v.push(c);
                chars.next();
            }
            out.push(Tok::Word(v));
        }
    }
    Ok(out)
}

fn parse_param(t: &Tok) -> Result<Param, String> {
    match t {
        Tok::Quoted(s) => Ok(Param::Text(s.clone())),
        Tok::Word(w) if w == "NULL" => Ok(Param::Null),
        Tok::Word(w) => {
            if let Some((kind, v)) = w.split_once(':') {
                let bytes = match kind {
                    "i2" => v.parse::<i16>().map(|n| n.to_be_bytes().to_vec()).map_err(|e| e.to_string())?,
                    "i4" => v.parse::<i32>().map(|n| n.to_be_bytes().to_vec()).map_err(|e| e.to_string())?,
                    "i8" => v.parse::<i64>().map(|n| n.to_be_bytes().to_vec()).map_err(|e| e.to_string())?,
                    _ => return Ok(Param::Text(w.clone())),
                };
                return Ok(Param::Binary(bytes));
            }
            Ok(Param::Text(w.clone()))
        }
    }
}

fn parse_msg(s: &str) -> Result<Msg, String> {
    let toks = tokenize(s)?;
    let Some(first) = toks.first() else { return Err("empty message".into()) };
    let args = &toks[1..];
    let arg = |i: usize, what: &str| -> Result<String, String> {
        args.get(i).map(|t| t.text().to_string()).ok_or_else(|| format!("{s:?}: missing {what}"))
    };
    let kind = |i: usize| -> Result<u8, String> {
        match arg(i, "kind S or P")?.as_str() {
            "S" => Ok(b'S'),
            "P" => Ok(b'P'),
            k => Err(format!("{s:?}: kind must be S or P, not {k:?}")),
        }
    };
    let exact = |n: usize| -> Result<(), String> {
        if args.len() == n { Ok(()) } else { Err(format!("{s:?}: expected {n} arguments")) }
    };
    Ok(match first.text() {
        "P" => {
            let types = args
                .iter()
                .skip(2)
                .map(|t| type_oid(t.text()).ok_or_else(|| format!("{s:?}: unknown type {:?}", t.text())))
                .collect::<Result<_, _>>()?;
            Msg::Parse { name: arg(0, "name")?, sql: arg(1, "sql")?, types }
        }
        "B" => Msg::Bind {
            portal: arg(0, "portal")?,
            stmt: arg(1, "statement")?,
            params: args.iter().skip(2).map(parse_param).collect::<Result<_, _>>()?,
        },
        "D" => {
            exact(2)?;
            Msg::Describe { kind: kind(0)?, name: arg(1, "name")? }
        }
        "C" => {
            exact(2)?;
            Msg::Close { kind: kind(0)?, name: arg(1, "name")? }
        }
        "E" => {
            let max_rows = match args.get(1) {
                Some(t) => t.text().parse().map_err(|e| format!("{s:?}: max rows: {e}"))?,
                None => 0,
            };
            Msg::Execute { portal: arg(0, "portal")?, max_rows }
        }
        "S" => {
            exact(0)?;
            Msg::Sync
        }
        "H" => {
            exact(0)?;
            Msg::Flush
        }
        "Q" => {
            exact(1)?;
            Msg::Query(arg(0, "sql")?)
        }
        "d" => {
            exact(1)?;
            Msg::CopyData(arg(0, "data")?.into_bytes())
        }
        "c" => {
            exact(0)?;
            Msg::CopyDone
        }
        "f" => {
            exact(1)?;
            Msg::CopyFail(arg(0, "message")?)
        }
        other => return Err(format!("unknown message {other:?} in {s:?}")),
    })
}

fn parse_read(spec: &str) -> Result<Read, String> {
    let toks: Vec<&str> = spec.split_whitespace().collect();
    match toks.as_slice() {
        ["none"] => Ok(Read::Nothing),
        [n] => n.parse().map(Read::Ready).map_err(|e| format!("read spec {spec:?}: {e}")),
        ["until", t] if t.len() == 1 => Ok(Read::Until(t.as_bytes()[0])),
        ["msgs", n] => n.parse().map(Read::Count).map_err(|e| format!("read spec {spec:?}: {e}")),
        _ => Err(format!("bad read spec {spec:?} (N | until X | msgs N | none)")),
    }
}

fn parse_expectation(s: &str) -> Vec<String> {
    s.split(';').map(|i| i.trim().to_string()).filter(|i| !i.is_empty()).collect()
}

fn is_client_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Parses a scenario file.
pub fn parse_file(file: &str, text: &str) -> Vec<Scenario> {
    let mut out: Vec<Scenario> = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((no, raw)) = lines.next() {
        let at = format!("{file}:{}", no + 1);
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix("===") {
            let name = name.trim().to_string();
            assert!(!name.is_empty(), "{at}: scenario without a name");
            assert!(out.iter().all(|s| s.name != name), "{at}: duplicate scenario {name}");
            out.push(Scenario {
                name,
                origin: at,
                intentional: None,
                setup: String::new(),
                config: String::new(),
                steps: Vec::new(),
                clients: Vec::new(),
            });
            continue;
        }
        let sc = out.last_mut().unwrap_or_else(|| panic!("{at}: text before the first === header"));
        let table = format!("diff_{}", sc.name);
        let expand = |s: &str| s.replace("{T}", &table);
        let (key, rest) = trimmed.split_once(':').unwrap_or_else(|| panic!("{at}: expected `key: ...`"));
        let rest = rest.trim();
        match key {
            "intentional" => {
                sc.intentional = Some(match sc.intentional.take() {
                    Some(prev) => format!("{prev} {rest}"),
                    None => rest.to_string(),
                })
            }
            "setup" => {
                sc.setup.push_str(&expand(rest));
                sc.setup.push('\n');
            }
            "config" => {
                sc.config.push_str(rest);
                sc.config.push('\n');
            }
            "psql" | "psql@parsnip" => sc.steps.push(Step::Psql {
                sql: expand(rest),
                label: format!("{key}: {rest}"),
                pooler_only: key != "psql",
            }),
            "sleep" => {
                let ms = rest.parse().unwrap_or_else(|e| panic!("{at}: sleep: milliseconds: {e}"));
                sc.steps.push(Step::Sleep { ms, label: format!("sleep: {ms} ms") });
            }
            "parsnip" | "alt" | "postgres" => {
                let Some(Step::Client { parsnip, alt, postgres, .. }) = sc.steps.last_mut() else {
                    panic!("{at}: {key}: must follow a client step");
                };
                let slot = match key {
                    "parsnip" => parsnip,
                    "alt" => alt,
                    _ => postgres,
                };
                assert!(slot.is_none(), "{at}: second {key}: line for one step");
                *slot = Some(parse_expectation(&expand(rest)));
            }
            client if is_client_name(client) => {
                let mut body = rest.to_string();
                while body.trim_end().ends_with('|') {
                    let (_, next) = lines.next().unwrap_or_else(|| panic!("{at}: step continues past the end"));
                    body.push(' ');
                    body.push_str(next.trim());
                }
                let label = format!("{client}: {body}");
                let parts = split_outside_quotes(&body, "->");
                assert!(parts.len() <= 2, "{at}: more than one `->`");
                let msgs_text = parts[0].trim();
                let msgs: Vec<Msg> = if msgs_text.is_empty() {
                    Vec::new()
                } else {
                    split_outside_quotes(msgs_text, "|")
                        .into_iter()
                        .map(|m| parse_msg(&expand(m.trim())))
                        .collect::<Result<_, _>>()
                        .unwrap_or_else(|e| panic!("{at}: {e}"))
                };
                let read = match parts.get(1) {
                    Some(spec) => parse_read(spec.trim()).unwrap_or_else(|e| panic!("{at}: {e}")),
                    None => {
                        let n = msgs.iter().filter(|m| matches!(m, Msg::Sync | Msg::Query(_))).count();
                        assert!(n > 0, "{at}: no Sync or Query sent: say what to read with `-> ...`");
                        Read::Ready(n)
                    }
                };
                if !sc.clients.iter().any(|c| c == client) {
                    sc.clients.push(client.to_string());
                }
                sc.steps.push(Step::Client {
                    client: client.to_string(),
                    label,
                    msgs,
                    read,
                    parsnip: None,
                    alt: None,
                    postgres: None,
                });
            }
            other => panic!("{at}: unknown line kind {other:?}"),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn encode(m: &Msg, out: &mut Vec<u8>) {
    let mut b = Vec::new();
    let tag = match m {
        Msg::Parse { name, sql, types } => {
            cstr(&mut b, name);
            cstr(&mut b, sql);
            b.extend_from_slice(&(types.len() as i16).to_be_bytes());
            for t in types {
                b.extend_from_slice(&t.to_be_bytes());
            }
            b'P'
        }
        Msg::Bind { portal, stmt, params } => {
            cstr(&mut b, portal);
            cstr(&mut b, stmt);
            b.extend_from_slice(&(params.len() as i16).to_be_bytes());
            for p in params {
                let fmt: i16 = if matches!(p, Param::Binary(_)) { 1 } else { 0 };
                b.extend_from_slice(&fmt.to_be_bytes());
            }
            b.extend_from_slice(&(params.len() as i16).to_be_bytes());
            for p in params {
                match p {
                    Param::Null => b.extend_from_slice(&(-1i32).to_be_bytes()),
                    Param::Text(s) => {
                        b.extend_from_slice(&(s.len() as i32).to_be_bytes());
                        b.extend_from_slice(s.as_bytes());
                    }
                    Param::Binary(v) => {
                        b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                        b.extend_from_slice(v);
                    }
                }
            }
            b.extend_from_slice(&0i16.to_be_bytes());
            b'B'
        }
        Msg::Describe { kind, name } => {
            b.push(*kind);
            cstr(&mut b, name);
            b'D'
        }
        Msg::Execute { portal, max_rows } => {
            cstr(&mut b, portal);
            b.extend_from_slice(&max_rows.to_be_bytes());
            b'E'
        }
        Msg::Close { kind, name } => {
            b.push(*kind);
            cstr(&mut b, name);
            b'C'
        }
        Msg::Sync => b'S',
        Msg::Flush => b'H',
        Msg::Query(sql) => {
            cstr(&mut b, sql);
            b'Q'
        }
        Msg::CopyData(d) => {
            b.extend_from_slice(d);
            b'd'
        }
        Msg::CopyDone => b'c',
        Msg::CopyFail(m) => {
            cstr(&mut b, m);
            b'f'
        }
    };
    out.extend_from_slice(&support::msg(tag, &b));
}

// ---------------------------------------------------------------------------------------------
// Normalizing backend messages
// ---------------------------------------------------------------------------------------------

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn i16(&mut self) -> i16 {
        let v = self.b.get(self.pos..self.pos + 2).map_or(0, |s| i16::from_be_bytes([s[0], s[1]]));
        self.pos += 2;
        v
    }
    fn i32(&mut self) -> i32 {
        let v = self.b.get(self.pos..self.pos + 4).map_or(0, |s| i32::from_be_bytes([s[0], s[1], s[2], s[3]]));
        self.pos += 4;
        v
    }
    fn cstr(&mut self) -> String {
        let rest = self.b.get(self.pos..).unwrap_or(&[]);
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        self.pos += end + 1;
        String::from_utf8_lossy(&rest[..end]).into_owned()
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let s = self.b.get(self.pos..self.pos + n).unwrap_or(&[]);
        self.pos += n;
        s
    }
}

fn text_or_hex(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("x{}", b.iter().map(|c| format!("{c:02x}")).collect::<String>()),
    }
}

fn fields(body: &[u8]) -> HashMap<u8, String> {
    let mut out = HashMap::new();
    let mut c = Cursor { b: body, pos: 0 };
    while c.pos < body.len() && body[c.pos] != 0 {
        let t = body[c.pos];
        c.pos += 1;
        out.insert(t, c.cstr());
    }
    out
}

fn error_text(body: &[u8]) -> String {
    let f = fields(body);
    let get = |t: u8| f.get(&t).cloned().unwrap_or_default();
    let severity = f.get(&b'V').or_else(|| f.get(&b'S')).cloned().unwrap_or_default();
    let mut s = format!("{severity} {} {}", get(b'C'), get(b'M'));
    for (t, name) in [(b'D', "detail"), (b'H', "hint"), (b'P', "position"), (b'W', "where")] {
        if let Some(v) = f.get(&t) {
            let _ = write!(s, " [{name}: {v}]");
        }
    }
    // Drivers recognize "cached plan must not change result type" by the routine.
    if get(b'C') == "0A000"
        && let Some(r) = f.get(&b'R')
    {
        let _ = write!(s, " [routine: {r}]");
    }
    s
}

/// The normalized text of a backend message; None for messages ignored in comparisons.
pub fn normalize(f: &Frame) -> Option<String> {
    let mut c = Cursor { b: &f.body, pos: 0 };
    Some(match f.tag {
        b'S' | b'K' => return None,
        b'1' | b'2' | b'3' | b'n' | b's' | b'I' | b'c' => (f.tag as char).to_string(),
        b'Z' => format!("Z({})", f.body.first().map_or('?', |&b| b as char)),
        b'C' => format!("C({})", c.cstr()),
        b'E' => format!("E({})", error_text(&f.body)),
        b'N' => format!("N({})", error_text(&f.body)),
        b't' => {
            let n = c.i16();
            let types: Vec<String> = (0..n).map(|_| type_name(c.i32() as u32)).collect();
            format!("t({})", types.join(","))
        }
        b'T' => {
            let n = c.i16();
            let mut cols = Vec::new();
            for _ in 0..n {
                let name = c.cstr();
                let _table = c.i32();
                let _attnum = c.i16();
                let ty = c.i32() as u32;
                let _len = c.i16();
                let typmod = c.i32();
                let fmt = c.i16();
                let mut col = format!("{name}:{}", type_name(ty));
                if typmod != -1 {
                    let _ = write!(col, "/mod{typmod}");
                }
                if fmt != 0 {
                    let _ = write!(col, "/fmt{fmt}");
                }
                cols.push(col);
            }
            format!("T({})", cols.join(","))
        }
        b'D' => {
            let n = c.i16();
            let mut vals = Vec::new();
            for _ in 0..n {
                let len = c.i32();
                if len < 0 {
                    vals.push("NULL".to_string());
                } else {
                    vals.push(text_or_hex(c.bytes(len as usize)));
                }
            }
            format!("D[{}]", vals.join(", "))
        }
        b'G' | b'H' | b'W' => {
            let overall = c.bytes(1).first().copied().unwrap_or(0);
            let n = c.i16();
            format!("{}({},{n})", f.tag as char, if overall == 0 { "text" } else { "binary" })
        }
        b'd' => format!("d({})", text_or_hex(&f.body)),
        b'A' => {
            let _pid = c.i32();
            let channel = c.cstr();
            let payload = c.cstr();
            format!("A({channel},{payload})")
        }
        other => format!("?{}({})", other as char, text_or_hex(&f.body)),
    })
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

/// The normalized replies of one step.
#[derive(Clone, Debug)]
pub struct StepOut {
    pub label: String,
    pub lines: Vec<String>,
}

/// Where the clients connect.
enum Target<'a> {
    Direct,
    Pooler(&'a Parsnip),
}

/// Clients log in with `application_name = diff_<scenario>` (psql steps can find parsnip's
/// server connections by it).
async fn connect(target: &Target<'_>, app: &str) -> Raw {
    let port = match target {
        Target::Direct => support::cluster().port(),
        Target::Pooler(p) => p.port(),
    };
    let mut raw = Raw::tcp(port).await;
    let params = [("user", "postgres"), ("database", "postgres"), ("application_name", app)];
    if let Err(e) = raw.startup(&params, Some(SUPER_PW)).await {
        match target {
            Target::Direct => panic!("direct login: {e}"),
            Target::Pooler(p) => panic!("login through parsnip: {e}\n{}", p.log_tail()),
        }
    }
    raw
}

/// Reads what `read` asks; Err(reason) when the connection ended or the read timed out.
async fn read_replies(raw: &mut Raw, read: &Read, lines: &mut Vec<String>) -> Result<(), String> {
    if *read == Read::Nothing {
        return Ok(());
    }
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut readies = 0;
    let mut count = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = match tokio::time::timeout(left, raw.read_frame()).await {
            Err(_) => return Err(format!("<timeout after {STEP_TIMEOUT:?}>")),
            Ok(None) => return Err("<connection closed>".to_string()),
            Ok(Some(f)) => f,
        };
        let Some(line) = normalize(&frame) else { continue };
        lines.push(line);
        count += 1;
        let done = match read {
            Read::Ready(n) => {
                if frame.tag == b'Z' {
                    readies += 1;
                }
                readies >= *n
            }
            Read::Until(t) => frame.tag == *t,
            Read::Count(n) => count >= *n,
            Read::Nothing => true,
        };
        if done {
            return Ok(());
        }
    }
}

async fn run_once(sc: &Scenario, target: &Target<'_>) -> Vec<StepOut> {
    let mut clients: HashMap<String, Raw> = HashMap::new();
    for name in &sc.clients {
        clients.insert(name.clone(), connect(target, &format!("diff_{}", sc.name)).await);
    }
    let mut out = Vec::new();
    let mut aborted: Option<String> = None;
    let final_steps: Vec<Step> = sc
        .clients
        .iter()
        .map(|c| Step::Client {
            client: c.clone(),
            label: format!("{c}: S   (end of scenario: nothing left unread)"),
            msgs: vec![Msg::Sync],
            read: Read::Ready(1),
            parsnip: None,
            alt: None,
            postgres: None,
        })
        .collect();
    for step in sc.steps.iter().chain(&final_steps) {
        if let Some(reason) = &aborted {
            let label = match step {
                Step::Client { label, .. } | Step::Psql { label, .. } | Step::Sleep { label, .. } => label.clone(),
            };
            out.push(StepOut { label, lines: vec![format!("<not run: {reason}>")] });
            continue;
        }
        match step {
            Step::Sleep { ms, label } => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                out.push(StepOut { label: label.clone(), lines: vec!["ok".to_string()] });
            }
            Step::Psql { label, pooler_only: true, .. } if matches!(target, Target::Direct) => {
                out.push(StepOut { label: label.clone(), lines: vec!["(not run directly)".to_string()] });
            }
            Step::Psql { sql, label, .. } => {
                let (sql2, db) = (sql.clone(), "postgres");
                let r =
                    tokio::task::spawn_blocking(move || support::cluster().psql(db, &sql2)).await.expect("psql task");
                let lines = match r {
                    Ok(_) => vec!["ok".to_string()],
                    Err(e) => vec![format!("psql error: {e}")],
                };
                out.push(StepOut { label: label.clone(), lines });
            }
            Step::Client { client, label, msgs, read, .. } => {
                let raw = clients.get_mut(client).expect("client connected");
                let mut bytes = Vec::new();
                for m in msgs {
                    encode(m, &mut bytes);
                }
                let mut lines = Vec::new();
                if !bytes.is_empty()
                    && let Err(e) = raw.send(&bytes).await
                {
                    lines.push(format!("<send failed: {e}>"));
                    aborted = Some(format!("{client}'s send failed"));
                }
                if aborted.is_none()
                    && let Err(reason) = read_replies(raw, read, &mut lines).await
                {
                    aborted = Some(format!("{client}: {reason}"));
                    lines.push(reason);
                }
                out.push(StepOut { label: label.clone(), lines });
            }
        }
    }
    for (_, mut raw) in clients {
        let _ = raw.send(&support::msg(b'X', &[])).await;
    }
    out
}

fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(p) else { return false };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(p);
        } else {
            let Some(at) = rest.find(p) else { return false };
            rest = &rest[at + p.len()..];
        }
    }
    true
}

fn matches(expected: &[String], got: &[String]) -> bool {
    expected.len() == got.len() && expected.iter().zip(got).all(|(e, g)| glob(e, g))
}

/// Side-by-side rendering of both transcripts; marks differing steps.
fn side_by_side(sc: &Scenario, pg: &[StepOut], px: &[StepOut], bad: &[(usize, String)]) -> String {
    let width = pg.iter().flat_map(|s| s.lines.iter()).map(|l| l.chars().count()).max().unwrap_or(10).clamp(20, 70);
    let mut s = String::new();
    let _ = writeln!(s, "scenario {} ({})", sc.name, sc.origin);
    if let Some(why) = &sc.intentional {
        let _ = writeln!(s, "intentional difference: {why}");
    }
    let _ = writeln!(s, "    {:<width$} | parsnip", "postgres");
    for (i, (a, b)) in pg.iter().zip(px).enumerate() {
        let problem = bad.iter().find(|(j, _)| *j == i);
        let _ = writeln!(s, "{} #{i} {}", if problem.is_some() { "!!" } else { "--" }, a.label);
        let n = a.lines.len().max(b.lines.len());
        for k in 0..n {
            let l = a.lines.get(k).map(String::as_str).unwrap_or("");
            let r = b.lines.get(k).map(String::as_str).unwrap_or("");
            let mark = if l == r { ' ' } else { '≠' };
            let _ = writeln!(s, "  {mark} {l:<width$} | {r}");
        }
        if let Some((_, why)) = problem {
            let _ = writeln!(s, "     ^ {why}");
        }
    }
    s
}

/// Runs scenario `name` of a scenario file directly and through parsnip, and compares.
pub async fn run(file: &str, text: &str, name: &str) {
    let scenarios = parse_file(file, text);
    let sc = scenarios.into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no scenario {name} in {file}"));
    match tokio::time::timeout(SCENARIO_TIMEOUT, run_scenario(&sc)).await {
        Ok(()) => {}
        Err(_) => panic!("scenario {name} did not finish within {SCENARIO_TIMEOUT:?}"),
    }
}

async fn setup(sc: &Scenario) {
    if !sc.setup.is_empty() {
        support::psql_async("postgres", &sc.setup).await;
    }
}

async fn run_scenario(sc: &Scenario) {
    setup(sc).await;
    let pg = run_once(sc, &Target::Direct).await;
    setup(sc).await;
    let mut config = String::new();
    if !sc.config.contains("pool_size") {
        config.push_str("pool_size = 1\n");
    }
    config.push_str(&sc.config);
    let parsnip = Parsnip::trust(&config);
    let px = run_once(sc, &Target::Pooler(&parsnip)).await;

    let mut bad = Vec::new();
    let mut wrong_assumption = Vec::new();
    for (i, (step, (a, b))) in sc.steps.iter().zip(pg.iter().zip(&px)).enumerate() {
        let Step::Client { parsnip: want, alt, postgres, .. } = step else {
            if b.lines != ["ok"] || !(a.lines == ["ok"] || a.lines == ["(not run directly)"]) {
                bad.push((i, "psql or sleep step failed".to_string()));
            }
            continue;
        };
        if let Some(p) = postgres
            && !matches(p, &a.lines)
        {
            wrong_assumption.push(format!("step #{i}: PostgreSQL answered {:?}, scenario says {p:?}", a.lines));
        }
        match want {
            Some(w) => {
                if !matches(w, &b.lines) {
                    bad.push((i, format!("parsnip must answer (intended): {}", w.join("; "))));
                }
            }
            None => {
                let alt_ok = alt.as_ref().is_some_and(|w| matches(w, &b.lines));
                if a.lines != b.lines && !alt_ok {
                    let also = alt.as_ref().map(|w| format!(" or (intended) {}", w.join("; "))).unwrap_or_default();
                    bad.push((i, format!("differs from PostgreSQL{also}")));
                }
            }
        }
    }
    for i in sc.steps.len()..pg.len() {
        if pg[i].lines != px[i].lines {
            bad.push((i, "differs from PostgreSQL".to_string()));
        }
    }
    if std::env::var_os("DIFF_SHOW").is_some() {
        eprintln!("{}", side_by_side(sc, &pg, &px, &bad));
    }
    if !wrong_assumption.is_empty() {
        panic!(
            "scenario {} is wrong about PostgreSQL:\n{}\n\n{}",
            sc.name,
            wrong_assumption.join("\n"),
            side_by_side(sc, &pg, &px, &bad)
        );
    }
    if !bad.is_empty() {
        panic!("parsnip differs from its spec\n\n{}", side_by_side(sc, &pg, &px, &bad));
    }
}

/// Names of all scenarios in a file (for the completeness check).
pub fn names(file: &str, text: &str) -> Vec<String> {
    parse_file(file, text).into_iter().map(|s| s.name).collect()
}
