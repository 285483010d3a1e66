//! Hostile streams: a pure function of a seed. A stream starts with a login (proper, or
//! misbehaving: garbage, SSLRequest then garbage, cancel requests with random keys,
//! truncated or odd startup packets), then rounds of messages made from valid templates
//! (Query, Parse, Bind, Describe, Execute, Close, Sync, Flush, CopyData/Done/Fail,
//! FunctionCall, Terminate, unknown types) and short coherent scenarios (an erroring
//! statement without Sync, COPY abandoned, BEGIN left open, SET / LISTEN / PREPARE then
//! leave), mutated (lengths too short, too long, negative, huge; truncated or random
//! bodies; duplicated, swapped or dropped messages), and an ending (wait for replies with a
//! bounded read, or vanish: mid-message, mid-protocol, after Execute without Sync).

use super::*;
use crate::support::startup_packet;

/// One action of a hostile client.
#[derive(Clone, Debug)]
pub enum Step {
    /// Write these pieces (messages, or parts of one) in one go; stop the stream if the
    /// peer is gone.
    Write(Vec<Piece>),
    /// Read for at most `ms`, or until `readies` ReadyForQuery (0: only the time bound).
    Read { ms: u64, readies: usize },
    /// Read the one-byte answer to an SSLRequest / GSSENCRequest.
    ReadByte,
    /// Read until ReadyForQuery (logged in) or an error; stop the stream if not logged in.
    Login,
    /// Shut down the write side, then read for at most `ms`.
    HalfClose { ms: u64 },
    /// Drop the socket.
    Close,
}

/// Bytes to send and what they are.
pub type Piece = (Vec<u8>, String);

impl Step {
    /// A write of one piece.
    pub fn write(bytes: Vec<u8>, desc: &str) -> Step {
        Step::Write(vec![(bytes, desc.to_string())])
    }

    /// The bytes a write sends (empty for other steps).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Step::Write(pieces) => pieces.iter().flat_map(|(b, _)| b.iter().copied()).collect(),
            _ => Vec::new(),
        }
    }
}

/// Splits `pieces` at the byte offsets `cuts` (ascending), a piece cut in two becoming two.
fn split_at(pieces: Vec<Piece>, cuts: &[usize]) -> Vec<Vec<Piece>> {
    let mut out = vec![Vec::new()];
    let mut at = 0;
    let mut cuts = cuts.iter().copied().peekable();
    for (mut b, mut d) in pieces {
        while let Some(&c) = cuts.peek() {
            if c >= at + b.len() {
                break;
            }
            let k = c - at;
            cuts.next();
            if k == 0 {
                out.push(Vec::new());
                continue;
            }
            let rest = b.split_off(k);
            if !b.is_empty() {
                out.last_mut().expect("one group").push((b, format!("{d} [first {k} bytes]")));
            }
            out.push(Vec::new());
            at = c;
            b = rest;
            d = format!("{d} [rest]");
        }
        at += b.len();
        out.last_mut().expect("one group").push((b, d));
    }
    out
}

/// A hostile stream.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub steps: Vec<Step>,
}

impl Plan {
    /// The plan, step by step, for the report.
    pub fn describe(&self) -> Vec<String> {
        self.steps
            .iter()
            .map(|s| match s {
                Step::Write(pieces) => {
                    let d: Vec<&str> = pieces.iter().map(|(_, d)| d.as_str()).collect();
                    format!("write {} bytes: {}", s.bytes().len(), d.join(" "))
                }
                Step::Read { ms, readies } => format!("read ≤{ms} ms / {readies} Z"),
                Step::ReadByte => "read 1 byte".into(),
                Step::Login => "read login reply".into(),
                Step::HalfClose { ms } => format!("half-close, read ≤{ms} ms"),
                Step::Close => "close".into(),
            })
            .collect()
    }
}

/// The user and database every client of the test logs in as.
pub const USER: &str = "app";
pub const DB: &str = "hostile";

/// The hostile clients' own table (honest clients never touch it).
const SQL: &[&str] = &[
    "SELECT 1",
    "SELECT 1/0",
    "SELECT 'hxmark'",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SELECT 1; SELECT 1/0; SELECT 2",
    "BEGIN; SELECT 1/0",
    "BEGIN; INSERT INTO hx VALUES ({n}, 'hxmark')",
    "INSERT INTO hx VALUES ({n}, 'hxmark')",
    "SELECT * FROM hx LIMIT 3",
    "COPY hx FROM STDIN",
    "COPY hx TO STDOUT",
    "COPY (SELECT generate_series(1, 3000)) TO STDOUT",
    "SET statement_timeout = 1",
    "SET search_path = hx_nowhere",
    "SET default_transaction_read_only = on",
    "SET application_name = 'hxmark'",
    "SET lock_timeout = 1",
    "SET LOCAL statement_timeout = 1",
    "SELECT set_config('statement_timeout', '1', false)",
    "RESET ALL",
    "DISCARD ALL",
    "LISTEN hxchan",
    "NOTIFY hxchan, 'hxmark'",
    "UNLISTEN *",
    "PREPARE hxp AS SELECT 'hxmark'",
    "PREPARE pn_1 AS SELECT 'hxmark'",
    "EXECUTE hxp",
    "EXECUTE pn_1",
    "EXECUTE pn_2",
    "DEALLOCATE hxp",
    "DEALLOCATE pn_1",
    "DEALLOCATE ALL",
    "SELECT pg_advisory_lock({n})",
    "SELECT pg_advisory_xact_lock({n})",
    "CREATE TEMP TABLE hxt (a int)",
    "DECLARE hxc CURSOR WITH HOLD FOR SELECT 1",
    "DECLARE hxc2 CURSOR FOR SELECT generate_series(1, 10)",
    "FETCH 2 FROM hxc2",
    "SAVEPOINT hs",
    "ROLLBACK TO hs",
    "RELEASE hs",
    "BEGIN ISOLATION LEVEL SERIALIZABLE",
    "SELECT repeat('x', 200000)",
    "SELECT repeat('x', 1000000) FROM generate_series(1, 20)",
    "SELECT generate_series(1, 5000)",
    "",
    ";",
    "SELEC 1",
    "SELECT $1",
    "SELECT $1::int",
    "SELECT $1::text, $2::int",
    "INSERT INTO hx VALUES ($1::int, 'hxmark')",
    "SELECT 1/$1::int",
];

/// Statement and portal names: unnamed, the client's own, parsnip's server names.
const NAMES: &[&str] = &["", "", "", "hs1", "hs2", "pn_1", "pn_2", "hxc2", "x\u{1}y"];

/// Function OIDs for FunctionCall: int4pl, textlen, upper, and ones that do not exist
/// (never anything with side effects).
const FUNCS: &[u32] = &[177, 1257, 871, 0, 99_999_999];

/// Parameter type OIDs: unspecified, int4, text, int8, and nonsense.
const TYPES: &[u32] = &[0, 23, 25, 20, 4_000_000_000];

fn sql(r: &mut Rng) -> String {
    (*r.pick(SQL)).replace("{n}", &r.range(1, 2_000_000_000).to_string())
}

fn name(r: &mut Rng) -> &'static str {
    r.pick::<&str>(NAMES)
}

fn param(r: &mut Rng) -> Option<Vec<u8>> {
    match r.below(6) {
        0 => None,
        1 => Some(b"0".to_vec()),
        2 => Some(r.range(1, 100_000).to_string().into_bytes()),
        3 => Some(b"hxmark".to_vec()),
        4 => Some((r.below(1000) as i32).to_be_bytes().to_vec()),
        _ => {
            let n = r.below(12) as usize;
            Some(r.bytes(n))
        }
    }
}

/// One message from the templates: (bytes, description).
fn template(r: &mut Rng) -> (Vec<u8>, String) {
    let w = [18, 12, 12, 5, 10, 4, 10, 4, 5, 3, 2, 2, 1, 2, 1];
    match r.weighted(&w) {
        0 => {
            let s = sql(r);
            (query(&s), format!("Q({s:?})"))
        }
        1 => {
            let (n, s) = (name(r), sql(r));
            let types: Vec<u32> = (0..r.below(3)).map(|_| *r.pick(TYPES)).collect();
            (parse(n, &s, &types), format!("P({n:?}, {s:?}, {types:?})"))
        }
        2 => {
            let (portal, stmt) = (name(r), name(r));
            let params: Vec<Option<Vec<u8>>> = (0..r.below(3)).map(|_| param(r)).collect();
            let refs: Vec<Option<&[u8]>> = params.iter().map(|p| p.as_deref()).collect();
            let pf: Vec<i16> = (0..r.below(2)).map(|_| r.below(3) as i16).collect();
            let rf: Vec<i16> = (0..r.below(2)).map(|_| r.below(3) as i16).collect();
            let mut b = bind_fmt(portal, stmt, &pf, &refs, &rf);
            if r.chance(10) {
                // The parameter count lies about the values that follow.
                let at = 5 + portal.len() + 1 + stmt.len() + 1 + 2 + 2 * pf.len();
                let lie = *r.pick(&[1i16, 7, 1000, -1, i16::MAX]);
                b[at..at + 2].copy_from_slice(&lie.to_be_bytes());
                return (b, format!("B({portal:?}, {stmt:?}, {params:?} declared as {lie} params)"));
            }
            (b, format!("B({portal:?}, {stmt:?}, {params:?}, {pf:?}, {rf:?})"))
        }
        3 => {
            let kind = *r.pick(b"SSPPx");
            let n = name(r);
            (describe(kind, n), format!("D({}, {n:?})", kind as char))
        }
        4 => {
            let n = name(r);
            let max = *r.pick(&[0, 0, 1, 2, -1]);
            (execute(n, max), format!("E({n:?}, {max})"))
        }
        5 => {
            let kind = *r.pick(b"SSPPx");
            let n = name(r);
            (close(kind, n), format!("C({}, {n:?})", kind as char))
        }
        6 => (sync(), "S".into()),
        7 => (flush(), "H".into()),
        8 => {
            let data =
                if r.chance(50) { format!("{}\thxmark\n", r.range(1, 1_000_000)).into_bytes() } else { r.bytes(20) };
            (copy_data(&data), format!("d({})", hex(&data)))
        }
        9 => (copy_done(), "c".into()),
        10 => (copy_fail("hx gave up"), "f".into()),
        11 => {
            let oid = *r.pick(FUNCS);
            let mut b = oid.to_be_bytes().to_vec();
            b.extend(0i16.to_be_bytes());
            let nargs = r.below(3) as i16;
            b.extend(nargs.to_be_bytes());
            for _ in 0..nargs {
                let v = r.range(0, 99).to_string();
                b.extend((v.len() as i32).to_be_bytes());
                b.extend(v.as_bytes());
            }
            b.extend(0i16.to_be_bytes());
            (msg(b'F', &b), format!("F({oid}, {nargs} args)"))
        }
        12 => (terminate(), "X".into()),
        13 => {
            let tag = *r.pick(&[b'z', 0, 0xff, b'p', b'A', b'Z', b'T', b'V']);
            let n = r.below(16) as usize;
            let body = r.bytes(n);
            (msg(tag, &body), format!("unknown type {tag:#04x}"))
        }
        _ => {
            // A big but well-formed Query, under max_message_size.
            let pad = r.range(64 << 10, 900 << 10) as usize;
            let s = format!("SELECT 'hxbig' -- {}", "x".repeat(pad));
            (query(&s), format!("Q(big, {} bytes)", s.len()))
        }
    }
}

/// A short coherent scenario (reaches deeper states than a soup of templates).
fn scenario(r: &mut Rng) -> Vec<(Vec<u8>, String)> {
    let m = |b: Vec<u8>, d: &str| (b, d.to_string());
    let insert = format!("INSERT INTO hx VALUES ({}, 'hxmark')", r.range(1, 2_000_000_000));
    match r.below(12) {
        // The known case: an erroring statement executed, no Sync.
        0 => vec![
            m(parse("", "SELECT 1/0", &[]), "P(\"\", \"SELECT 1/0\")"),
            m(bind("", "", &[]), "B"),
            m(execute("", 0), "E"),
        ],
        1 => vec![m(query("COPY hx FROM STDIN"), "Q(COPY hx FROM STDIN)"), m(copy_data(b"1\thxmark\n"), "d")],
        2 => vec![
            m(parse("", "COPY hx FROM STDIN", &[]), "P(COPY hx FROM STDIN)"),
            m(bind("", "", &[]), "B"),
            m(execute("", 0), "E"),
            m(copy_data(b"2\thxmark\n"), "d"),
        ],
        3 => vec![m(query("BEGIN"), "Q(BEGIN)"), m(query(&insert), "Q(insert)")],
        4 => vec![m(query("SET statement_timeout = 1"), "Q(SET statement_timeout = 1)")],
        5 => vec![m(query("LISTEN hxchan"), "Q(LISTEN hxchan)")],
        6 => vec![
            m(parse("hs1", "SELECT 'hxmark'", &[]), "P(hs1)"),
            m(sync(), "S"),
            m(query("PREPARE hxp AS SELECT 1"), "Q(PREPARE hxp)"),
        ],
        7 => vec![
            m(parse("hs2", "SELECT generate_series(1, 10)", &[]), "P(hs2, series)"),
            m(bind("hp", "hs2", &[]), "B(hp, hs2)"),
            m(execute("hp", 2), "E(hp, 2)"),
        ],
        8 => vec![
            m(parse("", &insert, &[]), "P(insert)"),
            m(bind("", "", &[]), "B"),
            m(execute("", 0), "E"),
            m(flush(), "H"),
        ],
        9 => vec![
            m(query("BEGIN"), "Q(BEGIN)"),
            m(parse("", "SELECT 1/0", &[]), "P(1/0)"),
            m(bind("", "", &[]), "B"),
            m(execute("", 0), "E"),
            m(sync(), "S"),
        ],
        10 => vec![m(query("COPY (SELECT generate_series(1, 20000)) TO STDOUT"), "Q(COPY big TO STDOUT)")],
        _ => vec![
            m(parse("", "SELECT repeat('x', 1000000) FROM generate_series(1, 20)", &[]), "P(20 MB reply)"),
            m(bind("", "", &[]), "B"),
            m(execute("", 0), "E"),
            m(sync(), "S"),
        ],
    }
}

/// Mutates one serialized message; returns the new bytes and what was done.
fn mutate(r: &mut Rng, mut b: Vec<u8>) -> (Vec<u8>, String) {
    let body_len = b.len().saturating_sub(5);
    let set_len = |b: &mut Vec<u8>, v: u32| {
        if b.len() >= 5 {
            b[1..5].copy_from_slice(&v.to_be_bytes());
        }
    };
    let real = (body_len + 4) as u32;
    match r.below(10) {
        0 => {
            let k = r.range(1, 8) as u32;
            set_len(&mut b, real + k);
            (b, format!("len+{k}"))
        }
        1 => {
            let k = (r.range(1, 8) as u32).min(real);
            set_len(&mut b, real - k);
            (b, format!("len-{k}"))
        }
        2 => {
            let v = *r.pick(&[0u32, 1, 3, 0xffff_ffff, 0x8000_0000, 0x7fff_ffff, 2 << 20]);
            set_len(&mut b, v);
            (b, format!("len={v:#x}"))
        }
        3 => {
            // Declared big but bounded; the body never comes (the rest of the stream is
            // swallowed as its body).
            let v = r.range(100 << 10, 900 << 10) as u32;
            set_len(&mut b, v);
            (b, format!("len={v} (body missing)"))
        }
        4 => {
            let cut = 5 + r.below(body_len as u64 + 1) as usize;
            b.truncate(cut.min(b.len()));
            let d = format!("truncated to {} bytes", b.len());
            (b, d)
        }
        5 => {
            let cut = 5 + r.below(body_len as u64 + 1) as usize;
            b.truncate(cut.min(b.len()));
            let n = (b.len() - 1) as u32;
            set_len(&mut b, n);
            (b, format!("body cut to {} bytes, length fixed", n.saturating_sub(4)))
        }
        6 => {
            for _ in 0..r.range(1, 3) {
                if b.len() > 5 {
                    let i = 5 + r.below((b.len() - 5) as u64) as usize;
                    b[i] = r.next() as u8;
                }
            }
            (b, "bytes flipped".into())
        }
        7 => {
            let n = r.below(40) as usize;
            let body = r.bytes(n);
            (msg(b[0], &body), format!("random body of {} bytes", body.len()))
        }
        8 => {
            b[0] = *r.pick(b"QPBDECSHdcfFX");
            let d = format!("tag changed to {:?}", b[0] as char);
            (b, d)
        }
        _ => {
            let n = r.range(1, 64) as usize;
            let junk = r.bytes(n);
            (junk, "replaced by random bytes".into())
        }
    }
}

/// The login part of a stream; false when the stream ends there.
fn login(r: &mut Rng, steps: &mut Vec<Step>) -> bool {
    let w = Step::write;
    let ssl = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f].to_vec();
    let gss = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30].to_vec();
    let proper = |r: &mut Rng| {
        let mut params = vec![("user", USER), ("database", DB)];
        match r.below(4) {
            0 => params.push(("application_name", "hxmark")),
            1 => params.push(("options", "-c statement_timeout=1")),
            _ => {}
        }
        startup_packet(&params)
    };
    match r.weighted(&[80, 3, 3, 3, 2, 2, 3, 2, 2]) {
        0 => {
            steps.push(w(proper(r), "startup"));
            steps.push(Step::Login);
            return true;
        }
        1 => {
            let n = r.range(1, 300) as usize;
            steps.push(w(r.bytes(n), "random bytes as startup"));
        }
        2 => {
            let len = *r.pick(&[0u32, 2, 7, 0x7fff_ffff, 20_000, 1 << 20]);
            let mut b = len.to_be_bytes().to_vec();
            b.extend(196608u32.to_be_bytes());
            steps.push(w(b, &format!("startup length {len}")));
        }
        3 => {
            steps.push(w(ssl, "SSLRequest"));
            steps.push(Step::ReadByte);
            let n = r.range(1, 100) as usize;
            steps.push(w(r.bytes(n), "random bytes after SSLRequest"));
        }
        4 => {
            steps.push(w(if r.chance(50) { ssl } else { gss }, "SSL/GSSENC request"));
            steps.push(Step::ReadByte);
            steps.push(w(proper(r), "startup"));
            steps.push(Step::Login);
            return true;
        }
        5 => {
            let mut b = 16u32.to_be_bytes().to_vec();
            b.extend(80877102u32.to_be_bytes());
            b.extend(r.bytes(8));
            if r.chance(30) {
                b[3] = *r.pick(&[12u8, 20, 255]);
            }
            steps.push(w(b, "CancelRequest with random keys"));
        }
        6 => {
            let p = proper(r);
            let cut = r.range(1, p.len() as u64 - 1) as usize;
            steps.push(w(p[..cut].to_vec(), "truncated startup"));
        }
        7 => {
            let p = startup_packet_version(*r.pick(&[0x0003_0063u32, 0x0004_0000, 0x0002_0000]), &[("user", USER)]);
            steps.push(w(p, "startup with an odd protocol version"));
        }
        _ => {
            let p = startup_packet(&[("database", DB)]);
            steps.push(w(p, "startup without user"));
        }
    }
    steps.push(Step::Read { ms: r.range(0, 600), readies: 0 });
    if r.chance(50) {
        steps.push(Step::Close);
    }
    false
}

fn startup_packet_version(code: u32, params: &[(&str, &str)]) -> Vec<u8> {
    crate::support::startup_packet_version(code, params)
}

/// The whole stream of seed `seed`.
pub fn plan(seed: u64) -> Plan {
    let mut r = Rng::new(seed);
    let mut steps = Vec::new();
    if !login(&mut r, &mut steps) {
        return Plan { seed, steps };
    }
    // How hostile: some connections are mostly valid (deep states), others mostly junk.
    let mutation_pct = *r.pick(&[0, 0, 3, 10, 30]);
    let rounds = r.range(1, 4);
    for round in 0..rounds {
        let last = round + 1 == rounds;
        let mut msgs: Vec<(Vec<u8>, String)> = Vec::new();
        for _ in 0..r.range(1, 3) {
            if r.chance(40) {
                msgs.extend(scenario(&mut r));
            } else {
                for _ in 0..r.range(1, 6) {
                    msgs.push(template(&mut r));
                }
            }
        }
        if r.chance(65) {
            msgs.push((sync(), "S".into()));
        }
        // Mutations, duplicates, swaps, drops.
        let mut out: Vec<(Vec<u8>, String)> = Vec::new();
        let mut i = 0;
        while i < msgs.len() {
            let (b, d) = msgs[i].clone();
            if r.chance(mutation_pct) {
                match r.below(5) {
                    0 => {
                        out.push((b.clone(), d.clone()));
                        out.push((b, format!("{d} [dup]")));
                    }
                    1 if i + 1 < msgs.len() => {
                        out.push(msgs[i + 1].clone());
                        out.push((b, format!("{d} [swapped]")));
                        i += 1;
                    }
                    2 => out.push((Vec::new(), format!("{d} [dropped]"))),
                    _ => {
                        let (b, how) = mutate(&mut r, b);
                        out.push((b, format!("{d} [{how}]")));
                    }
                }
            } else {
                out.push((b, d));
            }
            i += 1;
        }
        let readies = out.iter().filter(|(b, _)| matches!(b.first(), Some(b'S' | b'Q'))).count();
        let total: usize = out.iter().map(|(b, _)| b.len()).sum();
        // The ending of the stream.
        let ending = if last { r.weighted(&[40, 20, 15, 10, 10, 5]) } else { 0 };
        if ending == 2 && total > 1 {
            let cut = r.range(1, total as u64 - 1) as usize;
            let mut groups = split_at(out, &[cut]);
            groups.truncate(1);
            if let Some((_, d)) = groups[0].last_mut() {
                d.push_str(" [then vanish]");
            }
            steps.push(Step::Write(groups.remove(0)));
            steps.push(Step::Close);
            break;
        }
        // One write, or a few (a message split over writes, a read in between).
        let parts = if total > 2 && r.chance(40) { r.range(2, 3) } else { 1 };
        let mut cuts: Vec<usize> = (1..parts).map(|_| r.range(1, total as u64 - 1) as usize).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let groups = split_at(out, &cuts);
        let n = groups.len();
        for (k, g) in groups.into_iter().enumerate() {
            steps.push(Step::Write(g));
            if k + 1 < n && r.chance(50) {
                steps.push(Step::Read { ms: r.range(0, 60), readies: 0 });
            }
        }
        match ending {
            0 => steps.push(Step::Read { ms: r.range(0, 400), readies }),
            1 => steps.push(Step::Close),
            3 => {
                steps.push(Step::write(terminate(), "X"));
                steps.push(Step::Close);
            }
            4 => steps.push(Step::HalfClose { ms: r.range(0, 400) }),
            _ => steps.push(Step::Read { ms: r.range(0, 400), readies: 0 }),
        }
    }
    if !matches!(steps.last(), Some(Step::Close)) {
        if r.chance(30) {
            steps.push(Step::write(terminate(), "X"));
        }
        steps.push(Step::Close);
    }
    Plan { seed, steps }
}
