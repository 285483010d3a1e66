//! Shared pieces of the hostile-client test (`tests/e2e_hostile.rs`): the seeded PRNG every
//! stream comes from, frontend message builders, a socket with a bounded frame reader, the
//! normalized form honest clients compare replies in, and the journal of what every client
//! did (for the failure report).
//!
//! * [`stream`]: hostile streams (login misbehaviour, message templates, mutations, endings).
//! * [`attack`]: plays one hostile stream and checks what parsnip sent back.
//! * [`honest`]: honest raw-protocol clients with exact expected replies.
//! * [`honest_pg`]: honest tokio-postgres clients (a real driver's pipelining).
//! * [`report`]: the failure report, the solo replay of suspect streams, the survey.
//! * [`shrink`]: shrinks a stream that breaks parsnip alone to what it takes.

#![allow(dead_code)]

pub mod attack;
pub mod honest;
pub mod honest_pg;
pub mod report;
pub mod shrink;
pub mod stream;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Frame, msg};

/// splitmix64: small, fast, and every stream is a pure function of its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

/// One splitmix64 output step, also used to derive seeds.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of stream `idx` of kind `kind` (hostile, honest ...) in `phase` of a run.
pub fn derive(run_seed: u64, kind: u64, phase: u64, idx: u64) -> u64 {
    mix(mix(mix(run_seed ^ kind.wrapping_mul(0x1000_0000_01b3)) ^ phase) ^ idx)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    /// An index chosen by weight.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let mut x = self.below(weights.iter().sum());
        for (i, &w) in weights.iter().enumerate() {
            if x < w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Frontend messages
// ---------------------------------------------------------------------------------------------

pub fn cstr(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.push(0);
    v
}

pub fn query(sql: &str) -> Vec<u8> {
    msg(b'Q', &cstr(sql.as_bytes()))
}

pub fn parse(name: &str, sql: &str, types: &[u32]) -> Vec<u8> {
    let mut b = cstr(name.as_bytes());
    b.extend(cstr(sql.as_bytes()));
    b.extend((types.len() as i16).to_be_bytes());
    for t in types {
        b.extend(t.to_be_bytes());
    }
    msg(b'P', &b)
}

/// Bind with text parameters (None = NULL) and text results.
pub fn bind(portal: &str, stmt: &str, params: &[Option<&[u8]>]) -> Vec<u8> {
    bind_fmt(portal, stmt, &[], params, &[])
}

pub fn bind_fmt(portal: &str, stmt: &str, pfmt: &[i16], params: &[Option<&[u8]>], rfmt: &[i16]) -> Vec<u8> {
    let mut b = cstr(portal.as_bytes());
    b.extend(cstr(stmt.as_bytes()));
    b.extend((pfmt.len() as i16).to_be_bytes());
    for f in pfmt {
        b.extend(f.to_be_bytes());
    }
    b.extend((params.len() as i16).to_be_bytes());
    for p in params {
        match p {
            None => b.extend((-1i32).to_be_bytes()),
            Some(v) => {
                b.extend((v.len() as i32).to_be_bytes());
                b.extend_from_slice(v);
            }
        }
    }
    b.extend((rfmt.len() as i16).to_be_bytes());
    for f in rfmt {
        b.extend(f.to_be_bytes());
    }
    msg(b'B', &b)
}

pub fn describe(kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend(cstr(name.as_bytes()));
    msg(b'D', &b)
}

pub fn execute(portal: &str, max_rows: i32) -> Vec<u8> {
    let mut b = cstr(portal.as_bytes());
    b.extend(max_rows.to_be_bytes());
    msg(b'E', &b)
}

pub fn close(kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend(cstr(name.as_bytes()));
    msg(b'C', &b)
}

pub fn sync() -> Vec<u8> {
    msg(b'S', &[])
}

pub fn flush() -> Vec<u8> {
    msg(b'H', &[])
}

pub fn copy_data(data: &[u8]) -> Vec<u8> {
    msg(b'd', data)
}

pub fn copy_done() -> Vec<u8> {
    msg(b'c', &[])
}

pub fn copy_fail(why: &str) -> Vec<u8> {
    msg(b'f', &cstr(why.as_bytes()))
}

pub fn terminate() -> Vec<u8> {
    msg(b'X', &[])
}

// ---------------------------------------------------------------------------------------------
// A socket with a bounded frame reader
// ---------------------------------------------------------------------------------------------

/// Why a read ended without a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadEnd {
    Closed,
    Timeout,
    /// The bytes do not form a backend message (a length below 4 or absurdly large).
    Malformed(String),
}

/// A client socket that keeps every byte it received (up to a cap) for the report.
pub struct Wire {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    pub async fn connect(port: u16) -> std::io::Result<Wire> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true).ok();
        Ok(Wire { stream, buf: Vec::new() })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Reads more bytes into the buffer before `deadline`; false when closed or timed out.
    async fn more(&mut self, deadline: Instant) -> Result<(), ReadEnd> {
        let mut chunk = [0u8; 16384];
        match tokio::time::timeout_at(deadline.into(), self.stream.read(&mut chunk)).await {
            Err(_) => Err(ReadEnd::Timeout),
            Ok(Ok(0)) | Ok(Err(_)) => Err(ReadEnd::Closed),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
        }
    }

    /// Raw bytes as they come (at most `max`), for streams that need not be frames.
    pub async fn read_some(&mut self, deadline: Instant, max: usize) -> Result<Vec<u8>, ReadEnd> {
        if self.buf.is_empty() {
            self.more(deadline).await?;
        }
        let n = self.buf.len().min(max);
        Ok(self.buf.drain(..n).collect())
    }

    /// The next backend message, before `deadline`.
    pub async fn read_frame(&mut self, deadline: Instant) -> Result<Frame, ReadEnd> {
        while self.buf.len() < 5 {
            self.more(deadline).await?;
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if !(4..=64 << 20).contains(&len) {
            return Err(ReadEnd::Malformed(format!(
                "message tag {:?} with length {len}; next bytes {}",
                self.buf[0] as char,
                hex_cut(&self.buf, 64)
            )));
        }
        while self.buf.len() < 1 + len {
            self.more(deadline).await?;
        }
        let frame = Frame { tag: self.buf[0], body: self.buf[5..1 + len].to_vec() };
        self.buf.drain(..1 + len);
        Ok(frame)
    }
}

/// The frame's bytes as they were on the wire.
pub fn frame_bytes(f: &Frame) -> Vec<u8> {
    msg(f.tag, &f.body)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex of at most `max` bytes, noting what was cut.
pub fn hex_cut(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max { hex(bytes) } else { format!("{}… ({} bytes in all)", hex(&bytes[..max]), bytes.len()) }
}

// ---------------------------------------------------------------------------------------------
// Normalized backend messages (what honest clients compare)
// ---------------------------------------------------------------------------------------------

fn cstrs(body: &[u8]) -> Vec<String> {
    body.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

/// `1`, `2`, `3`, `n`, `s`, `I`, `t`, `T(v:25)`, `D[a,NULL]`, `C(SELECT 1)`, `E(22012)`,
/// `Z(I)`, `G`, `H`, `d(text)`, `c`; anything else as `?x(hex)`.
pub fn normalize(f: &Frame) -> String {
    let b = &f.body;
    match f.tag {
        b'1' | b'2' | b'3' | b'n' | b's' | b'I' | b't' | b'G' | b'H' | b'c' => (f.tag as char).to_string(),
        b'Z' => format!("Z({})", b.first().map(|&c| c as char).unwrap_or('?')),
        b'R' => format!("R({})", be_i32(b, 0).unwrap_or(-1)),
        b'K' => "K".to_string(),
        b'S' | b'A' => {
            let s = cstrs(b);
            let from = if f.tag == b'A' { format!("{},", be_i32(b, 0).unwrap_or(0)) } else { String::new() };
            let s = if f.tag == b'A' { cstrs(b.get(4..).unwrap_or(&[])) } else { s };
            format!(
                "{}({from}{}={})",
                f.tag as char,
                s.first().cloned().unwrap_or_default(),
                s.get(1).cloned().unwrap_or_default()
            )
        }
        b'C' => format!("C({})", cstrs(b).first().cloned().unwrap_or_default()),
        b'E' | b'N' => {
            let e = f.fields().unwrap_or_default();
            format!("{}({} {})", f.tag as char, e.code(), e.message())
        }
        b'd' => format!("d({})", String::from_utf8_lossy(b).escape_debug()),
        b'D' => match data_row(b) {
            Some(cols) => format!("D[{}]", cols.join(",")),
            None => format!("D?({})", hex_cut(b, 64)),
        },
        b'T' => match row_description(b) {
            Some(cols) => format!("T({})", cols.join(",")),
            None => format!("T?({})", hex_cut(b, 64)),
        },
        t => format!("?{}({})", t as char, hex_cut(b, 64)),
    }
}

fn be_i16(b: &[u8], at: usize) -> Option<i16> {
    Some(i16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn data_row(b: &[u8]) -> Option<Vec<String>> {
    let n = be_i16(b, 0)?;
    let mut at = 2;
    let mut out = Vec::new();
    for _ in 0..n {
        let len = be_i32(b, at)?;
        at += 4;
        if len < 0 {
            out.push("NULL".to_string());
        } else {
            let v = b.get(at..at + len as usize)?;
            out.push(String::from_utf8_lossy(v).into_owned());
            at += len as usize;
        }
    }
    (at == b.len()).then_some(out)
}

fn row_description(b: &[u8]) -> Option<Vec<String>> {
    let n = be_i16(b, 0)?;
    let mut at = 2;
    let mut out = Vec::new();
    for _ in 0..n {
        let end = at + b.get(at..)?.iter().position(|&c| c == 0)?;
        let name = String::from_utf8_lossy(&b[at..end]).into_owned();
        let ty = be_i32(b, end + 7)?;
        out.push(format!("{name}:{ty}"));
        at = end + 19;
    }
    (at == b.len()).then_some(out)
}

// ---------------------------------------------------------------------------------------------
// The journal
// ---------------------------------------------------------------------------------------------

/// What one hostile connection did.
#[derive(Clone, Debug)]
pub struct HostileRecord {
    pub phase: u64,
    pub idx: u64,
    pub seed: u64,
    pub start: Instant,
    pub end: Instant,
    /// What the plan is, message by message.
    pub desc: Vec<String>,
    /// What it managed to write (the first 64 KiB: the stream can be made again from the
    /// seed), and how much in all.
    pub sent: Vec<u8>,
    pub sent_total: usize,
    /// What it read (capped).
    pub received: Vec<u8>,
    pub outcome: String,
}

/// A failure: an honest client's wrong reply, error or hang, or a protocol violation seen by
/// a hostile client.
#[derive(Clone, Debug)]
pub struct Failure {
    pub who: String,
    pub phase: u64,
    pub start: Instant,
    pub end: Instant,
    pub what: String,
    /// The request and reply bytes around the failure.
    pub transcript: String,
    /// The hostile connection (index) that saw it, for protocol violations.
    pub hostile: Option<u64>,
}

impl Failure {
    /// What kind of failure this is, for grouping: the description with numbers blanked.
    pub fn class(&self) -> String {
        let mut out = String::new();
        for c in self.what.chars().take(90) {
            if c.is_ascii_digit() {
                if !out.ends_with('#') {
                    out.push('#');
                }
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// Shared by all tasks of a run.
pub struct Journal {
    pub t0: Instant,
    pub stop: AtomicBool,
    pub hostile: Mutex<Vec<HostileRecord>>,
    pub failures: Mutex<Vec<Failure>>,
    /// Hostile streams in flight: (phase, idx, seed, start).
    pub active: Mutex<Vec<(u64, u64, u64, Instant)>>,
}

impl Journal {
    pub fn new() -> Arc<Journal> {
        Arc::new(Journal {
            t0: Instant::now(),
            stop: AtomicBool::new(false),
            hostile: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
            active: Mutex::new(Vec::new()),
        })
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Records an honest client's failure and stops the run (the report is about the first
    /// failures).
    pub fn fail(&self, f: Failure) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).push(f);
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Records a protocol violation a hostile client saw; the run goes on (so that one run
    /// finds more than one kind of failure), at most a few of each kind are kept.
    pub fn violation(&self, f: Failure) {
        let mut all = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let class = f.class();
        if all.iter().filter(|g| g.class() == class).count() < 3 && all.len() < 100 {
            all.push(f);
        }
    }

    pub fn failures(&self) -> Vec<Failure> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64()
    }
}

/// The ids an honest client inserted, by outcome.
#[derive(Default, Debug, Clone)]
pub struct Ledger {
    pub committed: Vec<i64>,
    pub rolled_back: Vec<i64>,
    /// Outcome unknown (the client failed in the middle of the transaction).
    pub unknown: Vec<i64>,
    pub ops: u64,
}

impl Ledger {
    pub fn merge(&mut self, o: Ledger) {
        self.committed.extend(o.committed);
        self.rolled_back.extend(o.rolled_back);
        self.unknown.extend(o.unknown);
        self.ops += o.ops;
    }
}

/// Bound on one honest request (a hang beyond it is a failure). Generous: on a machine
/// busy with other work, a debug build behind hostile clients' 20 MB replies once took 6 s
/// to answer an honest request that came right; the hangs this test is for never end.
pub const HONEST_TIMEOUT: Duration = Duration::from_secs(20);
