//! Honest raw-protocol clients: short transactions mixing simple queries, unnamed and named
//! extended queries, pipelined batches, COPY, expected errors and portals, each carrying a
//! token unique to the run, client and operation, and each reply compared with exactly what
//! PostgreSQL answers (ParameterStatus repeating a known value is the only thing skipped).
//! A wrong reply, an unexpected error or notice, a closed connection or a hang beyond
//! [`HONEST_TIMEOUT`] is a failure, reported with the bytes sent and received.

use std::collections::{HashMap, VecDeque};

use super::stream::{DB, USER};
use super::*;
use crate::support::startup_packet;

/// When an exchange's reading stops.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// After this many ReadyForQuery.
    Readies(usize),
    /// After the first message with this tag.
    Tag(u8),
}

/// One write and the exact replies expected for it.
struct Ex {
    send: Vec<u8>,
    desc: String,
    stop: Stop,
    expect: Vec<String>,
}

fn ex(send: Vec<u8>, desc: impl Into<String>, stop: Stop, expect: &[&str]) -> Ex {
    Ex { send, desc: desc.into(), stop, expect: expect.iter().map(|s| s.to_string()).collect() }
}

/// What an operation did to the table once it succeeded.
enum Effect {
    None,
    Commit(i64),
    Rollback(i64),
}

/// Operation kinds, by name (`PARSNIP_HOSTILE_SKIP` names the ones to leave out).
pub const OPS: &[&str] = &[
    "simple_echo",
    "simple_txn",
    "ext_unnamed",
    "ext_named",
    "ext_calc",
    "pipelined",
    "txn_roundtrips",
    "simple_error",
    "ext_error",
    "txn_error",
    "flush_then_sync",
    "copy_in_simple",
    "copy_ext",
    "copy_out",
    "portal_suspend",
    "close_named",
    "reconnect",
];

const WEIGHTS: &[u64] = &[10, 8, 10, 10, 6, 8, 8, 4, 4, 3, 4, 3, 3, 3, 3, 2, 2];

/// One honest raw client.
pub struct Honest {
    pub name: String,
    port: u16,
    phase: u64,
    client: u64,
    marker: String,
    rng: Rng,
    wire: Option<Wire>,
    params: HashMap<String, String>,
    echo_ready: bool,
    calc_ready: bool,
    history: VecDeque<String>,
    pub ledger: Ledger,
    n: u64,
    skip: Vec<String>,
    /// Bound on one request.
    pub timeout: Duration,
}

impl Honest {
    pub fn new(port: u16, run_seed: u64, phase: u64, client: u64, marker: &str, skip: &[String]) -> Honest {
        Honest {
            name: format!("honest raw client {client} (phase {phase})"),
            port,
            phase,
            client,
            marker: marker.to_string(),
            rng: Rng::new(derive(run_seed, 2, phase, client)),
            wire: None,
            params: HashMap::new(),
            echo_ready: false,
            calc_ready: false,
            history: VecDeque::new(),
            ledger: Ledger::default(),
            n: 0,
            skip: skip.to_vec(),
            timeout: HONEST_TIMEOUT,
        }
    }

    /// Runs operations until `until` or until the journal says stop; a failure is recorded in
    /// the journal.
    pub async fn run(mut self, until: Instant, journal: Arc<Journal>) -> Ledger {
        while Instant::now() < until && !journal.stopped() {
            let kind = loop {
                let k = self.rng.weighted(WEIGHTS);
                if !self.skip.iter().any(|s| s == OPS[k]) {
                    break k;
                }
            };
            if let Err(f) = self.op(kind).await {
                journal.fail(f);
                break;
            }
        }
        self.ledger
    }

    /// Runs each operation kind once, in order (a probe of a pooler after hostile traffic);
    /// Err with the kind that failed.
    pub async fn probe(&mut self, kinds: &[usize]) -> Result<(), (usize, Failure)> {
        for &k in kinds {
            if !self.skip.iter().any(|s| s == OPS[k]) {
                self.op(k).await.map_err(|f| (k, f))?;
            }
        }
        Ok(())
    }

    fn fail(&self, start: Instant, what: String, transcript: String) -> Failure {
        let mut t = transcript;
        if !self.history.is_empty() {
            t.push_str("\n  the client's previous operations:\n");
            for h in &self.history {
                t.push_str(h);
            }
        }
        Failure {
            who: self.name.clone(),
            phase: self.phase,
            start,
            end: Instant::now(),
            what,
            transcript: t,
            hostile: None,
        }
    }

    async fn login(&mut self) -> Result<(), Failure> {
        let start = Instant::now();
        let app = format!("honest{}", self.client);
        let packet = startup_packet(&[("user", USER), ("database", DB), ("application_name", &app)]);
        let mut wire = Wire::connect(self.port)
            .await
            .map_err(|e| self.fail(start, format!("cannot connect: {e}"), String::new()))?;
        wire.send(&packet).await.map_err(|e| self.fail(start, format!("sending startup: {e}"), String::new()))?;
        let deadline = start + self.timeout;
        self.params.clear();
        let mut got = Vec::new();
        loop {
            match wire.read_frame(deadline).await {
                Ok(f) if f.tag == b'Z' => break,
                Ok(f) if f.tag == b'S' => {
                    let kv =
                        f.body.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect::<Vec<_>>();
                    if kv.len() >= 2 {
                        self.params.insert(kv[0].clone(), kv[1].clone());
                    }
                }
                Ok(f) if matches!(f.tag, b'R' | b'K') => {}
                Ok(f) => got.push(normalize(&f)),
                Err(e) => {
                    return Err(self.fail(start, format!("login failed: {e:?}; got {got:?}"), String::new()));
                }
            }
        }
        if !got.is_empty() {
            return Err(self.fail(start, format!("unexpected messages at login: {got:?}"), String::new()));
        }
        self.wire = Some(wire);
        self.echo_ready = false;
        self.calc_ready = false;
        Ok(())
    }

    /// Sends `e.send` and reads to its stop; Ok(normalized replies, raw reply bytes, how
    /// reading ended).
    async fn exchange(&mut self, e: &Ex) -> (Vec<String>, Vec<u8>, Option<String>) {
        let mut got = Vec::new();
        let mut raw = Vec::new();
        let Some(wire) = self.wire.as_mut() else { return (got, raw, Some("not connected".into())) };
        if let Err(err) = wire.send(&e.send).await {
            return (got, raw, Some(format!("write failed: {err}")));
        }
        let deadline = Instant::now() + self.timeout;
        let mut readies = 0;
        loop {
            let f = match wire.read_frame(deadline).await {
                Ok(f) => f,
                Err(end) => {
                    let why = match end {
                        ReadEnd::Timeout => format!("no reply within {:?} (hang)", self.timeout),
                        ReadEnd::Closed => "connection closed by parsnip".into(),
                        ReadEnd::Malformed(m) => format!("malformed reply: {m}"),
                    };
                    return (got, raw, Some(why));
                }
            };
            raw.extend(frame_bytes(&f));
            if f.tag == b'S' {
                let kv = f.body.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect::<Vec<_>>();
                if kv.len() >= 2 && self.params.get(&kv[0]) == Some(&kv[1]) {
                    continue;
                }
                got.push(format!(
                    "S({}={})",
                    kv.first().cloned().unwrap_or_default(),
                    kv.get(1).cloned().unwrap_or_default()
                ));
                continue;
            }
            got.push(normalize(&f));
            match e.stop {
                Stop::Readies(n) if f.tag == b'Z' => {
                    readies += 1;
                    if readies >= n {
                        return (got, raw, None);
                    }
                }
                Stop::Tag(t) if f.tag == t => return (got, raw, None),
                _ => {}
            }
            if got.len() > e.expect.len() + 50 {
                return (got, raw, Some("far more replies than expected".into()));
            }
        }
    }

    /// Runs one operation of kind `kind`.
    async fn op(&mut self, kind: usize) -> Result<(), Failure> {
        if self.wire.is_none() {
            self.login().await?;
        }
        self.n += 1;
        self.ledger.ops += 1;
        let start = Instant::now();
        let (exs, effect) = self.build(kind);
        let mut transcript = format!("  {} op #{} {}:\n", self.name, self.n, OPS[kind]);
        for e in &exs {
            let (got, raw, end) = self.exchange(e).await;
            transcript.push_str(&format!(
                "    > {} ({} bytes): {}\n      expected {:?}\n      got      {:?}\n      got hex {}\n",
                e.desc,
                e.send.len(),
                hex_cut(&e.send, 600),
                e.expect,
                got,
                hex_cut(&raw, 1200)
            ));
            if end.is_some() || got != e.expect {
                if let Effect::Commit(id) | Effect::Rollback(id) = effect {
                    self.ledger.unknown.push(id);
                }
                let what = match end {
                    Some(why) => format!("{}: {why}", OPS[kind]),
                    None => format!("{}: wrong reply", OPS[kind]),
                };
                return Err(self.fail(start, what, transcript));
            }
        }
        match effect {
            Effect::None => {}
            Effect::Commit(id) => self.ledger.committed.push(id),
            Effect::Rollback(id) => self.ledger.rolled_back.push(id),
        }
        self.history.push_back(transcript);
        if self.history.len() > 2 {
            self.history.pop_front();
        }
        if OPS[kind] == "reconnect" {
            if let Some(mut w) = self.wire.take() {
                let _ = w.send(&terminate()).await;
            }
            self.login().await?;
        }
        Ok(())
    }

    /// The exchanges of an operation and its effect.
    fn build(&mut self, kind: usize) -> (Vec<Ex>, Effect) {
        let (c, n) = (self.client, self.n);
        let tok = format!("{}-{}-{c}-{n}", self.marker, self.phase);
        let tok2 = format!("{tok}b");
        let id = (((self.phase + 1) << 40) | (c << 24) | n) as i64;
        let z = Stop::Readies(1);
        let d = |s: &str| format!("D[{s}]");
        let echo_sql = format!("SELECT $1::text || '/{c}' AS v");
        let insert = "INSERT INTO honest VALUES ($1, $2, $3)";
        let (ids, cs) = (id.to_string(), c.to_string());
        let ins_params: [Option<&[u8]>; 3] = [Some(ids.as_bytes()), Some(tok.as_bytes()), Some(cs.as_bytes())];
        let prep_echo = |this: &mut Honest, out: &mut Vec<u8>, exp: &mut Vec<String>| {
            if !this.echo_ready {
                out.extend(parse("echo", &echo_sql, &[]));
                exp.push("1".into());
                this.echo_ready = true;
            }
        };
        match OPS[kind] {
            "simple_echo" => {
                let dr = d(&tok);
                (
                    vec![ex(
                        query(&format!("SELECT '{tok}' AS v")),
                        "Q(echo)",
                        z,
                        &["T(v:25)", &dr, "C(SELECT 1)", "Z(I)"],
                    )],
                    Effect::None,
                )
            }
            "simple_txn" => {
                let sql = format!("BEGIN; INSERT INTO honest VALUES ({id}, '{tok}', {c}); SELECT '{tok}' AS v; COMMIT");
                let dr = d(&tok);
                let exp = ["C(BEGIN)", "C(INSERT 0 1)", "T(v:25)", &dr, "C(SELECT 1)", "C(COMMIT)", "Z(I)"];
                (vec![ex(query(&sql), "Q(BEGIN; INSERT; SELECT; COMMIT)", z, &exp)], Effect::Commit(id))
            }
            "ext_unnamed" => {
                let mut b = parse("", "SELECT $1::text AS v", &[]);
                b.extend(bind("", "", &[Some(tok.as_bytes())]));
                b.extend(describe(b'P', ""));
                b.extend(execute("", 0));
                b.extend(sync());
                let dr = d(&tok);
                (vec![ex(b, "P B D E S", z, &["1", "2", "T(v:25)", &dr, "C(SELECT 1)", "Z(I)"])], Effect::None)
            }
            "ext_named" => {
                let (mut b, mut exp) = (Vec::new(), Vec::new());
                prep_echo(self, &mut b, &mut exp);
                b.extend(bind("", "echo", &[Some(tok.as_bytes())]));
                b.extend(execute("", 0));
                b.extend(sync());
                exp.extend(["2".to_string(), d(&format!("{tok}/{c}")), "C(SELECT 1)".into(), "Z(I)".into()]);
                (vec![Ex { send: b, desc: "[P echo] B(echo) E S".into(), stop: z, expect: exp }], Effect::None)
            }
            "ext_calc" => {
                let (mut b, mut exp) = (Vec::new(), Vec::new());
                if !self.calc_ready {
                    b.extend(parse("calc", &format!("SELECT $1::int8 * 2 + {c} AS r"), &[20]));
                    b.extend(describe(b'S', "calc"));
                    exp.extend(["1".to_string(), "t".into(), "T(r:20)".into()]);
                    self.calc_ready = true;
                }
                let x = self.rng.range(1, 1 << 40);
                b.extend(bind("", "calc", &[Some(x.to_string().as_bytes())]));
                b.extend(execute("", 0));
                b.extend(sync());
                exp.extend(["2".to_string(), d(&(x * 2 + c).to_string()), "C(SELECT 1)".into(), "Z(I)".into()]);
                (vec![Ex { send: b, desc: "[P D calc] B(calc) E S".into(), stop: z, expect: exp }], Effect::None)
            }
            "pipelined" => {
                let mut b = parse("", insert, &[]);
                b.extend(bind("", "", &ins_params));
                b.extend(execute("", 0));
                b.extend(sync());
                let mut exp: Vec<String> = ["1", "2", "C(INSERT 0 1)", "Z(I)"].map(String::from).to_vec();
                prep_echo(self, &mut b, &mut exp);
                b.extend(bind("", "echo", &[Some(tok2.as_bytes())]));
                b.extend(execute("", 0));
                b.extend(sync());
                exp.extend(["2".to_string(), d(&format!("{tok2}/{c}")), "C(SELECT 1)".into(), "Z(I)".into()]);
                b.extend(query(&format!("SELECT '{tok}c' AS v")));
                exp.extend(["T(v:25)".to_string(), d(&format!("{tok}c")), "C(SELECT 1)".into(), "Z(I)".into()]);
                (
                    vec![Ex {
                        send: b,
                        desc: "P B E S | [P] B(echo) E S | Q".into(),
                        stop: Stop::Readies(3),
                        expect: exp,
                    }],
                    Effect::Commit(id),
                )
            }
            "txn_roundtrips" => {
                let mut b = parse("", insert, &[]);
                b.extend(bind("", "", &ins_params));
                b.extend(execute("", 0));
                b.extend(sync());
                let commit = self.rng.chance(70);
                let end = if commit { "COMMIT" } else { "ROLLBACK" };
                let cc = format!("C({end})");
                let exs = vec![
                    ex(query("BEGIN"), "Q(BEGIN)", z, &["C(BEGIN)", "Z(T)"]),
                    ex(b, "P(insert) B E S", z, &["1", "2", "C(INSERT 0 1)", "Z(T)"]),
                    ex(
                        query(&format!("SELECT count(*) AS n FROM honest WHERE id = {id}")),
                        "Q(count own row)",
                        z,
                        &["T(n:20)", "D[1]", "C(SELECT 1)", "Z(T)"],
                    ),
                    ex(query(end), format!("Q({end})"), z, &[&cc, "Z(I)"]),
                ];
                (exs, if commit { Effect::Commit(id) } else { Effect::Rollback(id) })
            }
            "simple_error" => {
                let mut b = query("SELECT 1/0");
                b.extend(query(&format!("SELECT '{tok}' AS v")));
                let dr = d(&tok);
                let exp = ["E(22012 division by zero)", "Z(I)", "T(v:25)", &dr, "C(SELECT 1)", "Z(I)"];
                (vec![ex(b, "Q(1/0) Q(echo)", Stop::Readies(2), &exp)], Effect::None)
            }
            "ext_error" => {
                // Not foldable at Bind: the error comes from Execute, however the statement is planned.
                let mut b = parse("", "SELECT 1/($1::int + g) FROM generate_series(0, 0) g", &[]);
                b.extend(bind("", "", &[Some(b"0")]));
                b.extend(execute("", 0));
                b.extend(sync());
                b.extend(parse("", "SELECT $1::text AS v", &[]));
                b.extend(bind("", "", &[Some(tok.as_bytes())]));
                b.extend(execute("", 0));
                b.extend(sync());
                let dr = d(&tok);
                let exp = ["1", "2", "E(22012 division by zero)", "Z(I)", "1", "2", &dr, "C(SELECT 1)", "Z(I)"];
                (vec![ex(b, "P(1/$1) B(0) E S P B E S", Stop::Readies(2), &exp)], Effect::None)
            }
            "txn_error" => (
                vec![
                    ex(
                        query("BEGIN; SELECT 1/0"),
                        "Q(BEGIN; 1/0)",
                        z,
                        &["C(BEGIN)", "E(22012 division by zero)", "Z(E)"],
                    ),
                    ex(query("ROLLBACK"), "Q(ROLLBACK)", z, &["C(ROLLBACK)", "Z(I)"]),
                ],
                Effect::None,
            ),
            "flush_then_sync" => {
                let mut b = parse("", "SELECT $1::text AS v", &[]);
                b.extend(bind("", "", &[Some(tok.as_bytes())]));
                b.extend(execute("", 0));
                b.extend(flush());
                let dr = d(&tok);
                (
                    vec![
                        ex(b, "P B E H", Stop::Tag(b'C'), &["1", "2", &dr, "C(SELECT 1)"]),
                        ex(sync(), "S", z, &["Z(I)"]),
                    ],
                    Effect::None,
                )
            }
            "copy_in_simple" => {
                let mut b = copy_data(format!("{id}\t{tok}\t{c}\n").as_bytes());
                b.extend(copy_done());
                (
                    vec![
                        ex(query("COPY honest FROM STDIN"), "Q(COPY FROM STDIN)", Stop::Tag(b'G'), &["G"]),
                        ex(b, "d c", z, &["C(COPY 1)", "Z(I)"]),
                    ],
                    Effect::Commit(id),
                )
            }
            "copy_ext" => {
                let mut b = parse("", "COPY honest FROM STDIN", &[]);
                b.extend(bind("", "", &[]));
                b.extend(execute("", 0));
                b.extend(copy_data(format!("{id}\t{tok}\t{c}\n").as_bytes()));
                b.extend(copy_done());
                b.extend(sync());
                (
                    vec![ex(b, "P(COPY FROM STDIN) B E d c S", z, &["1", "2", "G", "C(COPY 1)", "Z(I)"])],
                    Effect::Commit(id),
                )
            }
            "copy_out" => {
                let dd = format!("d({tok}\\n)");
                let exp = ["H", &dd, "c", "C(COPY 1)", "Z(I)"];
                (
                    vec![ex(query(&format!("COPY (SELECT '{tok}') TO STDOUT")), "Q(COPY TO STDOUT)", z, &exp)],
                    Effect::None,
                )
            }
            "portal_suspend" => {
                let mut b = parse("", "SELECT $1::text || g AS v FROM generate_series(1, 3) g", &[]);
                b.extend(bind("", "", &[Some(tok.as_bytes())]));
                b.extend(execute("", 2));
                b.extend(execute("", 0));
                b.extend(sync());
                let r: Vec<String> = (1..=3).map(|g| d(&format!("{tok}{g}"))).collect();
                let exp = ["1", "2", &r[0], &r[1], "s", &r[2], "C(SELECT 1)", "Z(I)"];
                (vec![ex(b, "P B E(2) E S", z, &exp)], Effect::None)
            }
            "close_named" => {
                let mut b = close(b'S', "echo");
                b.extend(sync());
                self.echo_ready = false;
                (vec![ex(b, "C(S echo) S", z, &["3", "Z(I)"])], Effect::None)
            }
            _ => {
                let dr = d(&tok);
                (
                    vec![ex(
                        query(&format!("SELECT '{tok}' AS v")),
                        "Q(echo) before reconnecting",
                        z,
                        &["T(v:25)", &dr, "C(SELECT 1)", "Z(I)"],
                    )],
                    Effect::None,
                )
            }
        }
    }
}
