//! What the load generator says to PostgreSQL (or a pooler) and how it reads the replies:
//! the startup message, pgbench's workloads as statements with numbered parameters, each
//! statement rendered as one round trip in pgbench's three protocol modes (simple: a Query
//! with the values spelled into the text; extended: unnamed Parse, Bind, Describe, Execute,
//! Sync; prepared: Bind of a statement named at login, Describe, Execute, Sync), and a
//! reader that skips whole messages until ReadyForQuery, keeping the first error.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

/// pgbench's protocol modes (`-M`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Simple,
    Extended,
    Prepared,
}

/// The scripts: pgbench `-S`, pgbench's default TPC-B-like script, bench/planheavy.sql.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    Select,
    Tpcb,
    Planheavy,
}

/// The variables a script draws per transaction, in pgbench's ranges.
#[derive(Clone, Copy, Debug)]
pub enum Var {
    Aid,
    Bid,
    Tid,
    Delta,
}

/// A piece of a statement's text: literal SQL, or the n-th parameter (`$n+1`).
#[derive(Clone, Debug)]
enum Part {
    Sql(String),
    Param(usize),
}

/// One statement of a script: its text split at `$n`, and which variable each `$n` takes.
#[derive(Clone, Debug)]
pub struct Statement {
    text: String,
    parts: Vec<Part>,
    vars: Vec<Var>,
}

impl Statement {
    fn new(text: &str, vars: &[Var]) -> Statement {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            let digits = rest[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                parts.push(Part::Sql(rest[..=i].to_string()));
                rest = &rest[i + 1..];
                continue;
            }
            parts.push(Part::Sql(rest[..i].to_string()));
            let n: usize = rest[i + 1..i + 1 + digits].parse().unwrap_or(1);
            parts.push(Part::Param(n.saturating_sub(1)));
            rest = &rest[i + 1 + digits..];
        }
        parts.push(Part::Sql(rest.to_string()));
        Statement { text: text.to_string(), parts, vars: vars.to_vec() }
    }
}

const PLANHEAVY: &str = include_str!("../../bench/planheavy.sql");

/// The statements of a workload, each one round trip (as pgbench runs them without
/// pipelining).
pub fn script(w: Workload) -> Vec<Statement> {
    use Var::*;
    match w {
        Workload::Select => vec![Statement::new("SELECT abalance FROM pgbench_accounts WHERE aid = $1", &[Aid])],
        Workload::Tpcb => vec![
            Statement::new("BEGIN", &[]),
            Statement::new("UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2", &[Delta, Aid]),
            Statement::new("SELECT abalance FROM pgbench_accounts WHERE aid = $1", &[Aid]),
            Statement::new("UPDATE pgbench_tellers SET tbalance = tbalance + $1 WHERE tid = $2", &[Delta, Tid]),
            Statement::new("UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2", &[Delta, Bid]),
            Statement::new(
                "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)",
                &[Tid, Bid, Aid, Delta],
            ),
            Statement::new("END", &[]),
        ],
        Workload::Planheavy => {
            // The file is a pgbench script: comments, `\set aid ...`, then the query with `:aid`.
            let sql: Vec<&str> = PLANHEAVY
                .lines()
                .filter(|l| !l.trim_start().starts_with("--") && !l.trim_start().starts_with('\\'))
                .collect();
            let sql = sql.join("\n").replace(":aid", "$1");
            let sql = sql.trim().trim_end_matches(';');
            vec![Statement::new(sql, &[Aid])]
        }
    }
}

/// A small, fast generator (splitmix64), one per client.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in lo..=hi.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo + 1).max(1) as u64;
        lo + (self.next() % span) as i64
    }

    /// One transaction's variables, pgbench's ranges for `scale`.
    pub fn draw(&mut self, scale: i64) -> [i64; 4] {
        [self.range(1, 100_000 * scale), self.range(1, scale), self.range(1, 10 * scale), self.range(-5000, 5000)]
    }
}

fn value(vars: &[i64; 4], v: Var) -> i64 {
    vars[v as usize]
}

fn frame(out: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    out.push(kind);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// The startup message (protocol 3.0).
pub fn startup(user: &str, db: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196_608u32.to_be_bytes());
    for (k, v) in [("user", user), ("database", db), ("application_name", "loadgen")] {
        cstr(&mut body, k);
        cstr(&mut body, v);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// A simple Query.
pub fn query(out: &mut Vec<u8>, sql: &str) {
    frame(out, b'Q', |b| cstr(b, sql));
}

/// Terminate.
pub fn terminate() -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, b'X', |_| {});
    out
}

/// Parse of every statement of a script under pgbench's names (P_0, P_1, …), then Sync.
pub fn prepare_all(script: &[Statement]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, s) in script.iter().enumerate() {
        frame(&mut out, b'P', |b| {
            cstr(b, &format!("P_{i}"));
            cstr(b, &s.text);
            b.extend_from_slice(&0u16.to_be_bytes());
        });
    }
    frame(&mut out, b'S', |_| {});
    out
}

/// Statement `i` of `script` with this transaction's variables, in `mode`: one round trip.
pub fn render(out: &mut Vec<u8>, mode: Mode, script: &[Statement], i: usize, vars: &[i64; 4]) {
    let s = &script[i];
    match mode {
        Mode::Simple => frame(out, b'Q', |b| {
            for p in &s.parts {
                match p {
                    Part::Sql(t) => b.extend_from_slice(t.as_bytes()),
                    Part::Param(n) => {
                        let v = s.vars.get(*n).map_or(0, |v| value(vars, *v));
                        b.extend_from_slice(v.to_string().as_bytes());
                    }
                }
            }
            b.push(0);
        }),
        Mode::Extended | Mode::Prepared => {
            let name = if mode == Mode::Prepared { format!("P_{i}") } else { String::new() };
            if mode == Mode::Extended {
                frame(out, b'P', |b| {
                    cstr(b, "");
                    cstr(b, &s.text);
                    b.extend_from_slice(&0u16.to_be_bytes());
                });
            }
            frame(out, b'B', |b| {
                cstr(b, "");
                cstr(b, &name);
                b.extend_from_slice(&0u16.to_be_bytes());
                b.extend_from_slice(&(s.vars.len() as u16).to_be_bytes());
                for v in &s.vars {
                    let t = value(vars, *v).to_string();
                    b.extend_from_slice(&(t.len() as u32).to_be_bytes());
                    b.extend_from_slice(t.as_bytes());
                }
                b.extend_from_slice(&0u16.to_be_bytes());
            });
            frame(out, b'D', |b| {
                b.push(b'P');
                b.push(0);
            });
            frame(out, b'E', |b| {
                b.push(0);
                b.extend_from_slice(&0u32.to_be_bytes());
            });
            frame(out, b'S', |_| {});
        }
    }
}

/// What a round trip ended with.
#[derive(Debug, Default)]
pub struct Reply {
    /// The first ErrorResponse: "SQLSTATE: message".
    pub error: Option<String>,
    /// The last authentication request's code ('R' messages), during login.
    pub auth: Option<u32>,
    /// The first column of the first DataRow, as text.
    pub first_value: Option<String>,
    /// The server closed the connection after an error instead of becoming ready.
    pub closed: bool,
}

/// Reads server messages into a reusable buffer until ReadyForQuery.
pub struct Reader {
    buf: Vec<u8>,
    start: usize,
}

impl Reader {
    pub fn new() -> Reader {
        Reader { buf: Vec::with_capacity(1024), start: 0 }
    }

    /// Messages up to and including the next ReadyForQuery. An authentication request
    /// other than AuthenticationOk ends the read too (the caller cannot answer it).
    pub async fn until_ready<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> io::Result<Reply> {
        let mut reply = Reply::default();
        loop {
            while self.buf.len() - self.start >= 5 {
                let h = &self.buf[self.start..];
                let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
                if len < 4 {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "bad message length"));
                }
                if self.buf.len() - self.start < 1 + len {
                    break;
                }
                let kind = h[0];
                let body = &self.buf[self.start + 5..self.start + 1 + len];
                self.start += 1 + len;
                match kind {
                    b'Z' => return Ok(reply),
                    b'E' if reply.error.is_none() => reply.error = Some(error_text(body)),
                    b'R' if body.len() >= 4 => {
                        let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                        reply.auth = Some(code);
                        if code != 0 {
                            return Ok(reply);
                        }
                    }
                    b'D' if reply.first_value.is_none() && body.len() >= 6 => {
                        let n = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                        let v = usize::try_from(n).ok().and_then(|n| body.get(6..6 + n));
                        reply.first_value = v.map(|v| String::from_utf8_lossy(v).into_owned());
                    }
                    _ => {}
                }
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            self.buf.reserve(4096);
            let n = s.read_buf(&mut self.buf).await?;
            if n == 0 {
                // A FATAL error (at login, or a pooler giving up on a client) is followed
                // by the server closing the connection, not by ReadyForQuery.
                if reply.error.is_some() {
                    reply.closed = true;
                    return Ok(reply);
                }
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

fn error_text(body: &[u8]) -> String {
    let (mut code, mut msg) = ("", "");
    for f in body.split(|b| *b == 0) {
        match f.first() {
            Some(b'C') => code = std::str::from_utf8(&f[1..]).unwrap_or(""),
            Some(b'M') => msg = std::str::from_utf8(&f[1..]).unwrap_or(""),
            _ => {}
        }
    }
    format!("{code}: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simple_text(w: Workload, i: usize, vars: &[i64; 4]) -> String {
        let mut out = Vec::new();
        render(&mut out, Mode::Simple, &script(w), i, vars);
        assert_eq!(out[0], b'Q');
        assert_eq!(u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize, out.len() - 1);
        String::from_utf8(out[5..out.len() - 1].to_vec()).unwrap()
    }

    #[test]
    fn simple_mode_spells_the_values_into_the_text() {
        let vars = [123, 4, 35, -17];
        assert_eq!(simple_text(Workload::Select, 0, &vars), "SELECT abalance FROM pgbench_accounts WHERE aid = 123");
        assert_eq!(
            simple_text(Workload::Tpcb, 5, &vars),
            "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (35, 4, 123, -17, CURRENT_TIMESTAMP)"
        );
        assert_eq!(simple_text(Workload::Tpcb, 6, &vars), "END");
    }

    #[test]
    fn planheavy_is_the_bench_file_query_with_one_parameter() {
        let s = script(Workload::Planheavy);
        assert_eq!(s.len(), 1);
        assert!(s[0].text.starts_with("SELECT a.aid"), "{}", s[0].text);
        assert!(s[0].text.contains("WHERE a.aid = $1"));
        assert!(!s[0].text.contains(':') && !s[0].text.contains("\\set") && !s[0].text.ends_with(';'));
        assert!(simple_text(Workload::Planheavy, 0, &[77, 1, 1, 0]).contains("WHERE a.aid = 77\n"));
    }

    #[test]
    fn extended_mode_is_parse_bind_describe_execute_sync() {
        let mut out = Vec::new();
        render(&mut out, Mode::Extended, &script(Workload::Select), 0, &[9, 1, 1, 0]);
        let mut kinds = Vec::new();
        let mut at = 0;
        while at < out.len() {
            kinds.push(out[at]);
            at += 1 + u32::from_be_bytes([out[at + 1], out[at + 2], out[at + 3], out[at + 4]]) as usize;
        }
        assert_eq!(at, out.len());
        assert_eq!(kinds, b"PBDES");
        let mut prepared = Vec::new();
        render(&mut prepared, Mode::Prepared, &script(Workload::Select), 0, &[9, 1, 1, 0]);
        assert_eq!(prepared[0], b'B');
        assert!(prepared.windows(4).any(|w| w == b"P_0\0"));
    }

    #[test]
    fn draws_stay_in_pgbench_ranges() {
        let mut r = Rng::new(7);
        for _ in 0..10_000 {
            let [aid, bid, tid, delta] = r.draw(3);
            assert!((1..=300_000).contains(&aid) && (1..=3).contains(&bid) && (1..=30).contains(&tid));
            assert!((-5000..=5000).contains(&delta));
        }
    }

    #[tokio::test]
    async fn reader_keeps_the_first_error_and_value_and_stops_at_ready() {
        let mut bytes = Vec::new();
        frame(&mut bytes, b'D', |b| {
            b.extend_from_slice(&1u16.to_be_bytes());
            b.extend_from_slice(&2u32.to_be_bytes());
            b.extend_from_slice(b"10");
        });
        frame(&mut bytes, b'E', |b| b.extend_from_slice(b"SERROR\0C42P01\0Mno such table\0\0"));
        frame(&mut bytes, b'E', |b| b.extend_from_slice(b"C99999\0Mlater\0\0"));
        frame(&mut bytes, b'Z', |b| b.push(b'I'));
        frame(&mut bytes, b'Z', |b| b.push(b'I'));
        let mut src = &bytes[..];
        let mut rd = Reader::new();
        let r = rd.until_ready(&mut src).await.unwrap();
        assert_eq!(r.first_value.as_deref(), Some("10"));
        assert_eq!(r.error.as_deref(), Some("42P01: no such table"));
        assert!(!r.closed);
        // The second ReadyForQuery is left for the next read; then EOF with no error is an error.
        let r = rd.until_ready(&mut src).await.unwrap();
        assert!(r.error.is_none());
        assert!(rd.until_ready(&mut src).await.is_err());
    }
}
