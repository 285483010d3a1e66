//! Honest tokio-postgres clients: a real driver's named statements, unnamed typed queries,
//! transactions and its pipelining (concurrent requests on one connection), each answer
//! checked against the token it carries. Any error or a hang beyond [`HONEST_TIMEOUT`] is
//! a failure.

use std::future::Future;

use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use super::stream::{DB, USER};
use super::*;
use crate::support::{Pg, describe};

const OPS: &[&str] =
    &["prepared_echo", "unnamed_echo", "transaction", "pipelined", "simple_echo", "batch", "reconnect"];
const WEIGHTS: &[u64] = &[10, 8, 10, 8, 6, 4, 2];

/// One honest tokio-postgres client.
pub struct HonestPg {
    pub name: String,
    port: u16,
    phase: u64,
    client: u64,
    marker: String,
    rng: Rng,
    pg: Option<(Pg, Statement)>,
    pub ledger: Ledger,
    n: u64,
    last: String,
}

type OpResult = Result<(), String>;

/// `f` within the per-request bound; the error says what went wrong.
async fn timed<T>(what: &str, f: impl Future<Output = Result<T, tokio_postgres::Error>>) -> Result<T, String> {
    match tokio::time::timeout(HONEST_TIMEOUT, f).await {
        Err(_) => Err(format!("{what}: no answer within {HONEST_TIMEOUT:?} (hang)")),
        Ok(Err(e)) => Err(format!("{what}: {}", describe(&e))),
        Ok(Ok(v)) => Ok(v),
    }
}

fn same(what: &str, got: &str, want: &str) -> OpResult {
    if got == want { Ok(()) } else { Err(format!("{what}: expected {want:?}, got {got:?}")) }
}

fn first_text(msgs: &[tokio_postgres::SimpleQueryMessage]) -> String {
    msgs.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
            _ => None,
        })
        .unwrap_or_else(|| "(no row)".to_string())
}

impl HonestPg {
    pub fn new(port: u16, run_seed: u64, phase: u64, client: u64, marker: &str) -> HonestPg {
        HonestPg {
            name: format!("honest tokio-postgres client {client} (phase {phase})"),
            port,
            phase,
            client,
            marker: marker.to_string(),
            rng: Rng::new(derive(run_seed, 3, phase, client)),
            pg: None,
            ledger: Ledger::default(),
            n: 0,
            last: String::new(),
        }
    }

    async fn connect(&mut self) -> OpResult {
        let f = async {
            let pg = Pg::connect(self.port, USER, None, DB).await?;
            let stmt = pg.client.prepare("SELECT $1::text || '/pg' AS v").await?;
            Ok((pg, stmt))
        };
        self.pg = Some(timed("connecting and preparing", f).await?);
        Ok(())
    }

    pub async fn run(mut self, until: Instant, journal: Arc<Journal>) -> Ledger {
        while Instant::now() < until && !journal.stopped() {
            let kind = self.rng.weighted(WEIGHTS);
            self.n += 1;
            self.ledger.ops += 1;
            let start = Instant::now();
            let id = (((self.phase + 1) << 40) | (1 << 39) | (self.client << 24) | self.n) as i64;
            let tok = format!("{}-{}-pg{}-{}", self.marker, self.phase, self.client, self.n);
            let commit = self.rng.chance(70);
            let r = self.op(kind, id, &tok, commit).await;
            if let Err(what) = r {
                if matches!(OPS[kind], "transaction" | "batch") {
                    self.ledger.unknown.extend([id, id + (1 << 38)]);
                }
                let transcript = format!(
                    "  {} op #{} {} (token {tok}, id {id})\n  previous op: {}\n",
                    self.name, self.n, OPS[kind], self.last
                );
                journal.fail(Failure {
                    who: self.name.clone(),
                    phase: self.phase,
                    start,
                    end: Instant::now(),
                    what: format!("{}: {what}", OPS[kind]),
                    transcript,
                    hostile: None,
                });
                break;
            }
            match (OPS[kind], commit) {
                ("transaction", true) => self.ledger.committed.push(id),
                ("transaction", false) => self.ledger.rolled_back.push(id),
                ("batch", _) => self.ledger.committed.extend([id, id + (1 << 38)]),
                _ => {}
            }
            self.last = format!("#{} {} ok", self.n, OPS[kind]);
        }
        self.ledger
    }

    async fn op(&mut self, kind: usize, id: i64, tok: &str, commit: bool) -> OpResult {
        if self.pg.is_none() {
            self.connect().await?;
        }
        let c = self.client as i32;
        let Some((pg, echo)) = self.pg.as_mut() else { return Err("not connected".into()) };
        let want = format!("{tok}/pg");
        match OPS[kind] {
            "prepared_echo" => {
                let row = timed("query_one(prepared echo)", pg.client.query_one(&*echo, &[&tok])).await?;
                same("prepared echo", &row.get::<_, String>(0), &want)
            }
            "unnamed_echo" => {
                let row = timed("query_one(unnamed)", pg.client.query_one("SELECT $1::text AS v", &[&tok])).await?;
                same("unnamed echo", &row.get::<_, String>(0), tok)
            }
            "transaction" => {
                let tx = timed("BEGIN", pg.client.transaction()).await?;
                let q = "INSERT INTO honest VALUES ($1, $2, $3)";
                let n = timed("INSERT", tx.execute(q, &[&id, &tok, &c])).await?;
                same("rows inserted", &n.to_string(), "1")?;
                let q = "SELECT count(*) FROM honest WHERE id = $1";
                let row = timed("SELECT count(*)", tx.query_one(q, &[&id])).await?;
                same("own row visible", &row.get::<_, i64>(0).to_string(), "1")?;
                if commit { timed("COMMIT", tx.commit()).await } else { timed("ROLLBACK", tx.rollback()).await }
            }
            "pipelined" => {
                let (t1, t2, t3) = (format!("{tok}a"), format!("{tok}b"), format!("{tok}c"));
                let sql = format!("SELECT '{t3}'");
                let (p1, p2): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 1]) = ([&t1], [&t2]);
                let (a, b, s) = tokio::join!(
                    timed("pipelined echo a", pg.client.query_one(&*echo, &p1)),
                    timed("pipelined echo b", pg.client.query_one("SELECT $1::text", &p2)),
                    timed("pipelined simple", pg.client.simple_query(&sql)),
                );
                same("pipelined a", &a?.get::<_, String>(0), &format!("{t1}/pg"))?;
                same("pipelined b", &b?.get::<_, String>(0), &t2)?;
                same("pipelined simple", &first_text(&s?), &t3)
            }
            "simple_echo" => {
                let msgs = timed("simple_query", pg.client.simple_query(&format!("SELECT '{tok}'"))).await?;
                same("simple echo", &first_text(&msgs), tok)
            }
            "batch" => {
                let sql = format!(
                    "INSERT INTO honest VALUES ({id}, '{tok}', {c}); INSERT INTO honest VALUES ({}, '{tok}', {c})",
                    id + (1 << 38)
                );
                timed("batch_execute", pg.client.batch_execute(&sql)).await
            }
            _ => {
                if let Some((pg, _)) = self.pg.take() {
                    drop(pg);
                }
                self.connect().await
            }
        }
    }
}
