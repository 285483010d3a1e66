//! parsnip driver matrix: tokio-postgres and sqlx scenarios.
//!
//! Contract: drivers/README.md. Usage: `rust-driver MODE`, with MODE one of
//!
//! - `tp-prepare`       tokio-postgres, `client.prepare()` once per text, then `client.query(&stmt, ..)`
//! - `tp-query`         tokio-postgres, `client.query("sql", ..)`: a throw-away named statement each time
//! - `tp-pipeline`      tokio-postgres, prepared statements, every batch of queries issued as one
//!   `join_all` on one client (several Syncs in flight), transactions included
//! - `tp-copy`          tokio-postgres, prepared statements; rows written with `copy_in` and read back
//!   with `copy_out`, a COPY failing mid-stream inside a transaction
//! - `sqlx-persistent`  sqlx, `sqlx::query(..)` (persistent, the default)
//! - `sqlx-unprepared`  sqlx, `sqlx::query(..).persistent(false)`
//!
//! Each of CLIENTS connections runs ITERATIONS rounds of: statement churn (50 distinct texts), a
//! read-write transaction with read-back checks, a `SELECT *` on a table that the coordinator alters
//! twice (ADD COLUMN, then ALTER COLUMN .. TYPE) through DIRECT_URL midway, an error inside a
//! transaction (and a pipeline) followed by recovery on the same connection, and, for some clients,
//! a cancel and an abrupt disconnect mid-transaction. Everything written is verified at the end
//! (row counts, sums, checksums); one JSON line is printed last.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::{pin_mut, SinkExt, TryStreamExt};
use sqlx::{Column as _, Connection as _, Row as _, TypeInfo as _};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, Statement};

// ------------------------------------------------------------------------------ configuration

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    TpPrepare,
    TpQuery,
    TpPipeline,
    TpCopy,
    SqlxPersistent,
    SqlxUnprepared,
}

const MODES: &[(&str, Mode)] = &[
    ("tp-prepare", Mode::TpPrepare),
    ("tp-query", Mode::TpQuery),
    ("tp-pipeline", Mode::TpPipeline),
    ("tp-copy", Mode::TpCopy),
    ("sqlx-persistent", Mode::SqlxPersistent),
    ("sqlx-unprepared", Mode::SqlxUnprepared),
];

struct Cfg {
    mode: Mode,
    mode_name: &'static str,
    target_url: String,
    direct_url: String,
    via: String,
    clients: i32,
    iterations: i32,
    time_limit: Duration,
    acct: String,
    ledger: String,
    wide: String,
}

static CFG: OnceLock<Cfg> = OnceLock::new();

fn cfg() -> &'static Cfg {
    CFG.get().expect("configured")
}

const CHURN: i32 = 50; // distinct churn statements, more than parsnip's max_prepared_statements = 20
const WIDE_ROWS: i32 = 20;
const DISC_BASE: i32 = 100_000; // account / ledger ids used by the disconnecting connections

// ------------------------------------------------------------------------------ shared state

static T0: OnceLock<Instant> = OnceLock::new();
static TRANSACTIONS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);
static EXPECTED: AtomicU64 = AtomicU64::new(0); // 0A000 that PostgreSQL raises here too
static INJECTED: AtomicU64 = AtomicU64::new(0); // errors provoked on purpose, checked by SQLSTATE
static CANCELS: AtomicU64 = AtomicU64::new(0);
static DISCONNECTS: AtomicU64 = AtomicU64::new(0);
static RETRIES: AtomicU64 = AtomicU64::new(0);
static CHURNED: AtomicU64 = AtomicU64::new(0);
static WIDE_SELECTS: AtomicU64 = AtomicU64::new(0);
static COPIES: AtomicU64 = AtomicU64::new(0);
static PROGRESS: AtomicUsize = AtomicUsize::new(0);
static UNFINISHED: AtomicUsize = AtomicUsize::new(0);
// A statement prepared while DDL_DONE was d may fail with 0A000 once if a DDL started after it
// (DDL_STARTED > d): PostgreSQL raises "cached plan must not change result type" for it too.
static DDL_STARTED: AtomicUsize = AtomicUsize::new(0);
static DDL_DONE: AtomicUsize = AtomicUsize::new(0);
static SAMPLES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PHASE: Mutex<&'static str> = Mutex::new("start");
static TOTALS: Mutex<(i64, i64, i64)> = Mutex::new((0, 0, 0));

fn elapsed() -> f64 {
    T0.get().map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0)
}

fn set_phase(p: &'static str) {
    *PHASE.lock().unwrap() = p;
}

fn bad(place: &str, msg: impl std::fmt::Display) {
    let n = ERRORS.fetch_add(1, SeqCst) + 1;
    let line = format!("{place}: {msg}");
    if n <= 200 {
        eprintln!("[{:.1}s] error: {line}", elapsed());
    }
    let mut s = SAMPLES.lock().unwrap();
    if s.len() < 10 {
        s.push(line);
    }
}

fn expect_eq<A: std::fmt::Debug + PartialEq>(place: &str, got: A, want: A) -> bool {
    if got != want {
        bad(place, format!("got {got:?}, want {want:?}"));
        return false;
    }
    true
}

fn finish(ok: bool, extra: &str) -> ! {
    let c = cfg();
    let errors = ERRORS.load(SeqCst);
    let ok = ok && errors == 0;
    let samples = SAMPLES.lock().map(|s| s.clone()).unwrap_or_default();
    let mut detail = format!(
        "mode={} via_parsnip={} clients={} iterations={} churn_texts={CHURN} churn={} wide_selects={} \
         copies={} injected={} cancels={} disconnects={} tx_retries={} elapsed={:.1}s",
        c.mode_name,
        c.via,
        c.clients,
        c.iterations,
        CHURNED.load(SeqCst),
        WIDE_SELECTS.load(SeqCst),
        COPIES.load(SeqCst),
        INJECTED.load(SeqCst),
        CANCELS.load(SeqCst),
        DISCONNECTS.load(SeqCst),
        RETRIES.load(SeqCst),
        elapsed()
    );
    if !extra.is_empty() {
        detail.push_str("; ");
        detail.push_str(extra);
    }
    if !samples.is_empty() {
        detail.push_str("; errors: ");
        detail.push_str(&samples.join(" | "));
    }
    let line = serde_json::json!({
        "ok": ok,
        "transactions": TRANSACTIONS.load(SeqCst),
        "errors": errors,
        "expected_errors": EXPECTED.load(SeqCst),
        // Every error this program tolerates is a 0A000 it checked against the schema
        // changes (`expected_0a000*`): said so, so the runner compares kinds, not counts.
        "expected_kinds": { "0A000": EXPECTED.load(SeqCst) },
        "detail": detail,
    });
    println!("{line}");
    std::process::exit(if ok { 0 } else { 1 });
}

// ------------------------------------------------------------------------------ statements

struct Sql {
    upd: String,
    ins: String,
    sums: String,
    wide: String,
    wide1: String,
    div0: &'static str,
    one: &'static str,
    neg: String,
    balance: String,
    sleep: &'static str,
    churn: Vec<String>,
}

static SQL: OnceLock<Sql> = OnceLock::new();

fn sql() -> &'static Sql {
    SQL.get().expect("statements")
}

fn build_sql(c: &Cfg) -> Sql {
    let (a, l, w) = (&c.acct, &c.ledger, &c.wide);
    Sql {
        upd: format!("UPDATE {a} SET balance = balance + $1::bigint WHERE id = $2::int RETURNING balance"),
        ins: format!("INSERT INTO {l} (client, seq, amount, note) VALUES ($1::int, $2::int, $3::int, $4::text)"),
        sums: format!(
            "SELECT count(*)::bigint, coalesce(sum(amount), 0)::bigint, coalesce(sum(seq::bigint * amount), 0)::bigint \
             FROM {l} WHERE client = $1::int AND seq > 0"
        ),
        wide: format!("SELECT * FROM {w} WHERE id <= $1::int"),
        wide1: format!("SELECT * FROM {w} WHERE id = $1::int"),
        div0: "SELECT $1::int / 0 AS boom",
        one: "SELECT $1::int AS one",
        neg: format!("SELECT count(*)::bigint FROM {l} WHERE client = $1::int AND seq < 0"),
        balance: format!("SELECT balance FROM {a} WHERE id = $1::int"),
        sleep: "SELECT pg_sleep($1::float8)",
        churn: (0..CHURN).map(|k| format!("SELECT $1::int + {k} AS v{k}, $2::text AS t")).collect(),
    }
}

fn amount_for(c: i32, i: i32) -> i32 {
    (c * 31 + i * 17) % 97 + 1
}

fn churn_k(c: i32, i: i32, j: i32) -> i32 {
    (c * 7 + i * 3 + j * 17) % CHURN
}

// ------------------------------------------------------------------------------ result checks

#[derive(Debug, Clone, PartialEq)]
enum Cell {
    I(i64),
    S(String),
    Null,
}

struct Wide {
    fields: Vec<String>,
    rows: Vec<Vec<Cell>>,
}

/// `SELECT * FROM wide ...`: every row as wide as the description, values where they belong, and
/// the new column in every result of a query issued after the ADD COLUMN completed.
fn check_wide(place: &str, w: &Wide, n: usize, issued_done: usize) -> bool {
    WIDE_SELECTS.fetch_add(1, SeqCst);
    let nf = w.fields.len();
    if issued_done >= 1 && nf != 4 {
        bad(place, format!("stale row description: {nf} columns ({}) after ADD COLUMN completed", w.fields.join(",")));
        return false;
    }
    if nf != 3 && nf != 4 {
        bad(place, format!("unexpected columns {}", w.fields.join(",")));
        return false;
    }
    if w.rows.len() != n {
        bad(place, format!("{} rows, want {n}", w.rows.len()));
        return false;
    }
    for r in &w.rows {
        if r.len() != nf {
            bad(place, format!("row has {} columns, description {nf}", r.len()));
            return false;
        }
        let ok = match (&r[0], &r[1], &r[2]) {
            (Cell::I(id), Cell::I(a), Cell::S(b)) => {
                *a == id * 10 && *b == format!("row{id}") && (nf == 3 || r[3] == Cell::I(7))
            }
            _ => false,
        };
        if !ok {
            bad(place, format!("misaligned row {r:?} for columns {}", w.fields.join(",")));
            return false;
        }
    }
    true
}

fn tp_wide(rows: &[Row], stmt_columns: Option<&Statement>) -> Wide {
    let fields: Vec<String> = match (rows.first(), stmt_columns) {
        (Some(r), _) => r.columns().iter().map(|c| c.name().to_string()).collect(),
        (None, Some(s)) => s.columns().iter().map(|c| c.name().to_string()).collect(),
        (None, None) => vec![],
    };
    let rows = rows
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    let t = r.columns()[i].type_();
                    if *t == Type::INT4 {
                        r.try_get::<_, Option<i32>>(i).ok().flatten().map_or(Cell::Null, |v| Cell::I(v as i64))
                    } else if *t == Type::INT8 {
                        r.try_get::<_, Option<i64>>(i).ok().flatten().map_or(Cell::Null, Cell::I)
                    } else {
                        r.try_get::<_, Option<String>>(i).ok().flatten().map_or(Cell::Null, Cell::S)
                    }
                })
                .collect()
        })
        .collect();
    Wide { fields, rows }
}

fn sqlx_wide(rows: &[sqlx::postgres::PgRow]) -> Wide {
    let fields = rows.first().map(|r| r.columns().iter().map(|c| c.name().to_string()).collect()).unwrap_or_default();
    let rows = rows
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| match r.column(i).type_info().name() {
                    "INT4" => r.try_get::<Option<i32>, _>(i).ok().flatten().map_or(Cell::Null, |v| Cell::I(v as i64)),
                    "INT8" => r.try_get::<Option<i64>, _>(i).ok().flatten().map_or(Cell::Null, Cell::I),
                    _ => r.try_get::<Option<String>, _>(i).ok().flatten().map_or(Cell::Null, Cell::S),
                })
                .collect()
        })
        .collect();
    Wide { fields, rows }
}

#[derive(Default, Clone, Copy)]
struct St {
    count: i64,
    sum: i64,
    check: i64,
    balance: i64,
}

impl St {
    fn apply(&mut self, i: i32, amt: i32) {
        self.count += 1;
        self.sum += amt as i64;
        self.check += i as i64 * amt as i64;
        self.balance += amt as i64;
    }
}

fn tp_code(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(c) => c.code().to_string(),
        None => format!("{e}"),
    }
}

fn tp_err(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("[{}] {}", d.code().code(), d.message()),
        None => format!("{e}"),
    }
}

fn sqlx_code(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.to_string()).unwrap_or_default(),
        other => format!("{other}"),
    }
}

fn sqlx_err(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => format!("[{}] {}", d.code().unwrap_or_default(), d.message()),
        other => format!("{other}"),
    }
}

async fn with_timeout<F: Future>(ms: u64, what: &str, f: F) -> Result<F::Output, String> {
    tokio::time::timeout(Duration::from_millis(ms), f)
        .await
        .map_err(|_| format!("timeout: {what} took more than {ms} ms"))
}

// ------------------------------------------------------------------------------ tokio-postgres

async fn tp_connect(url: &str) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    let h = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((client, h))
}

type P<'a> = &'a [&'a (dyn ToSql + Sync)];
type P1<'a> = [&'a (dyn ToSql + Sync); 1];

struct Res {
    rows: Vec<Row>,
    issued_done: usize,
}

#[derive(Debug)]
struct QErr {
    e: tokio_postgres::Error,
    prep_done: usize,
}

struct Tp {
    c: i32,
    client: Client,
    _conn: tokio::task::JoinHandle<()>,
    throwaway: bool,
    // text -> (statement, DDL_DONE when it was prepared)
    cache: Mutex<HashMap<String, (Statement, usize)>>,
    // text -> the last DDL (1-based) that an expected 0A000 of this text was put down to
    ddl_blamed: Mutex<HashMap<String, usize>>,
}

impl Tp {
    /// The prepared statement for `text` (prepare()d once per connection), or None in tp-query.
    async fn stmt(&self, text: &str) -> Result<Option<(Statement, usize)>, QErr> {
        if self.throwaway {
            return Ok(None);
        }
        if let Some(s) = self.cache.lock().unwrap().get(text) {
            return Ok(Some(s.clone()));
        }
        let done = DDL_DONE.load(SeqCst);
        match self.client.prepare(text).await {
            Ok(s) => {
                self.cache.lock().unwrap().insert(text.to_string(), (s.clone(), done));
                Ok(Some((s, done)))
            }
            Err(e) => Err(QErr { e, prep_done: done }),
        }
    }

    async fn exec(&self, text: &str, st: &Option<(Statement, usize)>, params: P<'_>) -> Result<Res, QErr> {
        let issued_done = DDL_DONE.load(SeqCst);
        let (r, prep_done) = match st {
            Some((s, d)) => (self.client.query(s, params).await, *d),
            // query(&str): P(sN) D S(sN) S | B E S, then C S(sN) when the statement is dropped.
            None => (self.client.query(text, params).await, issued_done),
        };
        r.map(|rows| Res { rows, issued_done }).map_err(|e| QErr { e, prep_done })
    }

    async fn q(&self, text: &str, params: P<'_>) -> Result<Res, QErr> {
        let st = self.stmt(text).await?;
        self.exec(text, &st, params).await
    }

    async fn simple(&self, s: &str) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute(s).await
    }

    /// 0A000 is PostgreSQL's own answer for a statement prepared before a DDL that changed its
    /// result; the application then prepares it again.
    fn expected_0a000(&self, text: &str, qe: &QErr) -> bool {
        self.expected_0a000_of(text, &qe.e, qe.prep_done)
    }

    /// The one rule for an expected 0A000, of a statement prepared (or, for query(&str), issued)
    /// while DDL_DONE was `prep_done`: only a statement whose result is the altered table's rows
    /// (`SELECT * FROM wide`), and only when a DDL not yet blamed for an 0A000 of this text on this
    /// connection started after it was prepared. Each 0A000 is put down to the first such DDL: a
    /// statement prepared again after an 0A000 may meet the next DDL (PostgreSQL raises 0A000 again,
    /// a legitimate second retry), never the same one, so a client sees at most one 0A000 per DDL
    /// and text. The failed statement is dropped from the cache: it is prepared again.
    fn expected_0a000_of(&self, text: &str, e: &tokio_postgres::Error, prep_done: usize) -> bool {
        if e.code().map(|c| c.code()) != Some("0A000") {
            return false;
        }
        self.cache.lock().unwrap().remove(text);
        if !text.contains(cfg().wide.as_str()) {
            return false;
        }
        let mut blamed = self.ddl_blamed.lock().unwrap();
        let last = blamed.entry(text.to_string()).or_insert(0);
        let base = prep_done.max(*last);
        if DDL_STARTED.load(SeqCst) > base {
            *last = base + 1;
            return true;
        }
        false
    }
}

type BoxFut<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>>;

fn simple_fut<'a>(t: &'a Tp, s: &'a str) -> BoxFut<'a> {
    Box::pin(async move { t.client.batch_execute(s).await.map(|_| vec![]) })
}

fn stmt_fut<'a>(t: &'a Tp, s: &'a Statement, params: Vec<Box<dyn ToSql + Sync + Send>>) -> BoxFut<'a> {
    Box::pin(async move {
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|b| b.as_ref() as &(dyn ToSql + Sync)).collect();
        t.client.query(s, &refs).await
    })
}

async fn tp_churn(t: &Tp, i: i32, mode: Mode) {
    let s = sql();
    if mode == Mode::TpPipeline {
        // Prepares pipelined, then executes pipelined: join_all on one client.
        let ks: Vec<i32> = (0..6).map(|j| churn_k(t.c, i, j)).collect();
        let sts = join_all(ks.iter().map(|&k| t.stmt(&s.churn[k as usize]))).await;
        let mut futs = Vec::new();
        for (j, (k, st)) in ks.iter().zip(sts).enumerate() {
            let x = t.c * 1000 + i * 10 + j as i32;
            match st {
                Ok(Some((st, _))) => {
                    let tag = format!("c{}i{i}j{j}", t.c);
                    let p: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(x), Box::new(tag.clone())];
                    futs.push(async move {
                        let r = stmt_fut(t, &st, p).await;
                        (k, x, tag, r)
                    });
                }
                Ok(None) => unreachable!(),
                Err(qe) => bad(&format!("prepare churn{k}"), tp_err(&qe.e)),
            }
        }
        for (k, x, tag, r) in join_all(futs).await {
            match r {
                Ok(rows) => {
                    CHURNED.fetch_add(1, SeqCst);
                    expect_eq(
                        &format!("churn{k}"),
                        (rows[0].get::<_, i32>(0), rows[0].get::<_, String>(1)),
                        (x + k, tag),
                    );
                }
                Err(e) => bad(&format!("churn{k}"), tp_err(&e)),
            }
        }
        return;
    }
    for j in 0..3 {
        let k = churn_k(t.c, i, j);
        let x = t.c * 1000 + i * 10 + j;
        let tag = format!("c{}i{i}j{j}", t.c);
        match t.q(&s.churn[k as usize], &[&x, &tag]).await {
            Ok(r) => {
                CHURNED.fetch_add(1, SeqCst);
                expect_eq(
                    &format!("churn{k}"),
                    (r.rows[0].get::<_, i32>(0), r.rows[0].get::<_, String>(1)),
                    (x + k, tag),
                );
            }
            Err(qe) => bad(&format!("churn{k}"), tp_err(&qe.e)),
        }
    }
}

fn sums_of(r: &Row) -> (i64, i64, i64) {
    (r.get(0), r.get(1), r.get(2))
}

/// What a transaction read back: balance, (count, sum, checksum), the wide row, DDL_DONE at issue.
type TxRead = (i64, (i64, i64, i64), Wide, usize);

enum TxOutcome {
    Done,
    Retry,
    Failed,
}

fn tp_copy_in_data(c: i32, i: i32, amt: i32) -> String {
    format!("{c}\t{i}\t{amt}\tcopy {c}/{i}\n")
}

async fn tp_copy_out(t: &Tp, client_id: i32) -> Result<(i64, i64, i64), String> {
    let l = &cfg().ledger;
    let q = format!("COPY (SELECT seq, amount FROM {l} WHERE client = {client_id} AND seq > 0 ORDER BY seq) TO STDOUT");
    let stream = t.client.copy_out(q.as_str()).await.map_err(|e| tp_err(&e))?;
    pin_mut!(stream);
    let mut buf = Vec::new();
    while let Some(chunk) = stream.try_next().await.map_err(|e| tp_err(&e))? {
        buf.extend_from_slice(&chunk);
    }
    COPIES.fetch_add(1, SeqCst);
    let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
    let (mut n, mut sum, mut check) = (0i64, 0i64, 0i64);
    for line in text.lines() {
        let mut f = line.split('\t');
        let seq: i64 = f.next().and_then(|v| v.parse().ok()).ok_or(format!("bad COPY line {line:?}"))?;
        let amt: i64 = f.next().and_then(|v| v.parse().ok()).ok_or(format!("bad COPY line {line:?}"))?;
        n += 1;
        sum += amt;
        check += seq * amt;
    }
    Ok((n, sum, check))
}

async fn tp_txn(t: &Tp, st: &mut St, i: i32, mode: Mode) -> TxOutcome {
    let s = sql();
    let c = t.c;
    let amt = amount_for(c, i);
    let w1 = 1 + i % WIDE_ROWS;
    let mut want = *st;
    want.apply(i, amt);
    if mode == Mode::TpPipeline {
        let texts = [&s.upd, &s.ins, &s.sums, &s.wide1];
        let sts = join_all(texts.iter().map(|x| t.stmt(x))).await;
        let mut stmts = Vec::new();
        for (x, r) in texts.iter().zip(sts) {
            match r {
                Ok(Some(v)) => stmts.push(v),
                Ok(None) => unreachable!(),
                Err(qe) => {
                    bad("prepare", format!("{}: {}", &x[..20], tp_err(&qe.e)));
                    return TxOutcome::Failed;
                }
            }
        }
        let issued_done = DDL_DONE.load(SeqCst);
        let note = format!("tx {c}/{i}");
        let futs: Vec<BoxFut> = vec![
            simple_fut(t, "BEGIN"),
            stmt_fut(t, &stmts[0].0, vec![Box::new(amt as i64), Box::new(c)]),
            stmt_fut(t, &stmts[1].0, vec![Box::new(c), Box::new(i), Box::new(amt), Box::new(note)]),
            stmt_fut(t, &stmts[2].0, vec![Box::new(c)]),
            stmt_fut(t, &stmts[3].0, vec![Box::new(w1)]),
            simple_fut(t, "COMMIT"),
        ];
        let rs = join_all(futs).await;
        if rs.iter().any(|r| r.is_err()) {
            // The one expected failure: 0A000 from one of the statements (steps 1..=4; the rule
            // in expected_0a000_of admits only the `wide` one), everything else Ok. Each
            // statement runs once in this pipeline and an 0A000 aborts the transaction (later
            // steps would fail with 25P02, the COMMIT answers ROLLBACK), so there is at most one
            // 0A000 here; any other error, or a second one, is the pooler's. That the
            // transaction was rolled back is checked by the final ledger totals.
            let mut unexpected = false;
            let mut expected = 0;
            for (idx, r) in rs.iter().enumerate() {
                let Err(e) = r else { continue };
                let ok =
                    expected == 0 && (1..=4).contains(&idx) && t.expected_0a000_of(texts[idx - 1], e, stmts[idx - 1].1);
                if ok {
                    expected += 1;
                    EXPECTED.fetch_add(1, SeqCst);
                } else {
                    unexpected = true;
                    bad(&format!("pipelined tx step {idx}"), tp_err(e));
                }
            }
            return if unexpected { TxOutcome::Failed } else { TxOutcome::Retry };
        }
        let rs: Vec<Vec<Row>> = rs.into_iter().map(|r| r.unwrap()).collect();
        *st = want;
        TRANSACTIONS.fetch_add(1, SeqCst);
        expect_eq("tx balance", rs[1][0].get::<_, i64>(0), st.balance);
        expect_eq("tx sums", sums_of(&rs[3][0]), (st.count, st.sum, st.check));
        check_wide("tx wide1", &tp_wide(&rs[4], Some(&stmts[3].0)), 1, issued_done);
        return TxOutcome::Done;
    }

    if let Err(e) = t.simple("BEGIN").await {
        bad("BEGIN", tp_err(&e));
        return TxOutcome::Failed;
    }
    let mut step = "";
    let r: Result<TxRead, QErr> = async {
        step = &s.upd;
        let u = t.q(&s.upd, &[&(amt as i64), &c]).await?;
        if mode == Mode::TpCopy {
            step = "copy_in";
            let l = &cfg().ledger;
            let sink = t
                .client
                .copy_in(format!("COPY {l} (client, seq, amount, note) FROM STDIN").as_str())
                .await
                .map_err(|e| QErr { e, prep_done: 0 })?;
            pin_mut!(sink);
            sink.send(Bytes::from(tp_copy_in_data(c, i, amt))).await.map_err(|e| QErr { e, prep_done: 0 })?;
            let n = sink.finish().await.map_err(|e| QErr { e, prep_done: 0 })?;
            COPIES.fetch_add(1, SeqCst);
            if n != 1 {
                bad("copy_in", format!("{n} rows copied, want 1"));
            }
        } else {
            step = &s.ins;
            t.q(&s.ins, &[&c, &i, &amt, &format!("tx {c}/{i}")]).await?;
        }
        step = &s.sums;
        let sm = t.q(&s.sums, &[&c]).await?;
        step = &s.wide1;
        let st1 = t.stmt(&s.wide1).await?;
        let wd = t.exec(&s.wide1, &st1, &[&w1]).await?;
        let wide = tp_wide(&wd.rows, st1.as_ref().map(|x| &x.0));
        step = "";
        Ok((u.rows[0].get::<_, i64>(0), sums_of(&sm.rows[0]), wide, wd.issued_done))
    }
    .await;
    match r {
        Ok((bal, sums, wide, issued_done)) => {
            if mode == Mode::TpCopy && i % 3 == 0 {
                // COPY OUT inside the transaction sees the row COPY IN just wrote.
                match tp_copy_out(t, c).await {
                    Ok(v) => {
                        expect_eq("copy_out in tx", v, (want.count, want.sum, want.check));
                    }
                    Err(e) => bad("copy_out in tx", e),
                }
            }
            if let Err(e) = t.simple("COMMIT").await {
                bad("COMMIT", tp_err(&e));
                return TxOutcome::Failed;
            }
            *st = want;
            TRANSACTIONS.fetch_add(1, SeqCst);
            expect_eq("tx balance", bal, st.balance);
            expect_eq("tx sums", sums, (st.count, st.sum, st.check));
            check_wide("tx wide1", &wide, 1, issued_done);
            TxOutcome::Done
        }
        Err(qe) => {
            if let Err(e) = t.simple("ROLLBACK").await {
                bad("ROLLBACK", tp_err(&e));
            }
            if !step.is_empty() && t.expected_0a000(step, &qe) {
                EXPECTED.fetch_add(1, SeqCst);
                return TxOutcome::Retry;
            }
            if stray_cancel(t, &qe.e) {
                return TxOutcome::Retry;
            }
            bad(&format!("tx {}", &step[..step.len().min(24)]), tp_err(&qe.e));
            TxOutcome::Failed
        }
    }
}

async fn tp_wide_select(t: &Tp, i: i32) {
    let s = sql();
    let n = 1 + (t.c * 3 + i) % WIDE_ROWS;
    // One more attempt than there are DDLs: each retry follows an 0A000 blamed on another DDL.
    for _attempt in 0..=DDLS.len() {
        let st = match t.stmt(&s.wide).await {
            Ok(v) => v,
            Err(qe) => {
                bad("prepare wide", tp_err(&qe.e));
                return;
            }
        };
        match t.exec(&s.wide, &st, &[&n]).await {
            Ok(r) => {
                check_wide("wide", &tp_wide(&r.rows, st.as_ref().map(|x| &x.0)), n as usize, r.issued_done);
                return;
            }
            Err(qe) => {
                if t.expected_0a000(&s.wide, &qe) {
                    EXPECTED.fetch_add(1, SeqCst);
                    continue;
                }
                bad("wide", tp_err(&qe.e));
                return;
            }
        }
    }
    bad("wide", format!("client {}: 0A000 more than once per DDL", t.c));
}

fn want_codes(place: &str, got: &[String], want: &[&str]) -> bool {
    if got.iter().map(|s| s.as_str()).collect::<Vec<_>>() != want {
        bad(place, format!("results {}, want {}", got.join(","), want.join(",")));
        return false;
    }
    true
}

async fn tp_error_in_tx(t: &Tp, i: i32, mode: Mode) {
    let s = sql();
    let c = t.c;
    let neg_i = -i;
    if mode == Mode::TpPipeline {
        let texts = [&s.ins, &s.div0.to_string(), &s.one.to_string(), &s.neg];
        let mut stmts = Vec::new();
        for r in join_all(texts.iter().map(|x| t.stmt(x))).await {
            match r {
                Ok(Some(v)) => stmts.push(v.0),
                _ => {
                    bad("pipeline error: prepare", "failed");
                    return;
                }
            }
        }
        let futs: Vec<BoxFut> = vec![
            simple_fut(t, "BEGIN"),
            stmt_fut(
                t,
                &stmts[0],
                vec![Box::new(c), Box::new(neg_i), Box::new(5i32), Box::new("rolled back".to_string())],
            ),
            stmt_fut(t, &stmts[1], vec![Box::new(i)]),
            stmt_fut(t, &stmts[2], vec![Box::new(1i32)]),
            simple_fut(t, "COMMIT"),
            stmt_fut(t, &stmts[3], vec![Box::new(c)]),
        ];
        let rs = join_all(futs).await;
        let codes: Vec<String> = rs.iter().map(|r| r.as_ref().map_or_else(tp_code, |_| "ok".into())).collect();
        if want_codes("pipeline error", &codes, &["ok", "ok", "22012", "25P02", "ok", "ok"]) {
            INJECTED.fetch_add(2, SeqCst);
            let neg: i64 = rs[5].as_ref().unwrap()[0].get(0);
            expect_eq("pipeline error: rolled-back rows", neg, 0);
        }
        return;
    }
    if let Err(e) = t.simple("BEGIN").await {
        bad("BEGIN", tp_err(&e));
        return;
    }
    if mode == Mode::TpCopy {
        // COPY IN failing mid-stream (a bad row after a good one) inside the transaction.
        let l = &cfg().ledger;
        let r: Result<u64, tokio_postgres::Error> = async {
            let sink = t.client.copy_in(format!("COPY {l} (client, seq, amount, note) FROM STDIN").as_str()).await?;
            pin_mut!(sink);
            sink.send(Bytes::from(format!("{c}\t{neg_i}\t5\tgood\n"))).await?;
            sink.send(Bytes::from(format!("{c}\tnot-a-number\t5\tbad\n"))).await?;
            sink.finish().await
        }
        .await;
        match r {
            Ok(_) => bad("copy error", "a bad COPY row was accepted"),
            Err(e) if tp_code(&e) == "22P02" => {
                INJECTED.fetch_add(1, SeqCst);
            }
            Err(e) => bad("copy error", tp_err(&e)),
        }
    } else {
        if let Err(qe) = t.q(&s.ins, &[&c, &neg_i, &5i32, &"rolled back"]).await {
            bad("error in tx: insert", tp_err(&qe.e));
        }
        match t.q(s.div0, &[&i]).await {
            Ok(_) => bad("error in tx", "division by zero succeeded"),
            Err(qe) if tp_code(&qe.e) == "22012" => {
                INJECTED.fetch_add(1, SeqCst);
            }
            Err(qe) => bad("error in tx", tp_err(&qe.e)),
        }
    }
    match t.q(s.one, &[&1i32]).await {
        Ok(_) => bad("error in tx", "a statement after an error succeeded"),
        Err(qe) if tp_code(&qe.e) == "25P02" => {
            INJECTED.fetch_add(1, SeqCst);
        }
        Err(qe) => bad("error in tx (25P02)", tp_err(&qe.e)),
    }
    if let Err(e) = t.simple("ROLLBACK").await {
        bad("ROLLBACK", tp_err(&e));
    }
    match t.q(&s.neg, &[&c]).await {
        Ok(r) => {
            expect_eq("error in tx: rolled-back rows", r.rows[0].get::<_, i64>(0), 0);
        }
        Err(qe) => bad("after error in tx", tp_err(&qe.e)),
    }
    // Pipelined outside a transaction: a good query, a failing one, a good one (three Syncs).
    let x = c * 100 + i;
    let x1 = x + 1;
    let (p1, p2, p3): (P1, P1, P1) = ([&x], [&i], [&x1]);
    let (a, b, d) = tokio::join!(t.q(s.one, &p1), t.q(s.div0, &p2), t.q(s.one, &p3));
    let codes: Vec<String> =
        [&a, &b, &d].iter().map(|r| r.as_ref().map_or_else(|qe| tp_code(&qe.e), |_| "ok".into())).collect();
    if want_codes("pipelined error", &codes, &["ok", "22012", "ok"]) {
        INJECTED.fetch_add(1, SeqCst);
        expect_eq(
            "pipelined error: results",
            (a.unwrap().rows[0].get::<_, i32>(0), d.unwrap().rows[0].get::<_, i32>(0)),
            (x, x + 1),
        );
    }
}

/// statement_timeout: 57014 inside a transaction, ROLLBACK, the connection works.
async fn tp_timeout(t: &Tp) -> Result<(), String> {
    t.simple("BEGIN").await.map_err(|e| tp_err(&e))?;
    t.simple("SET LOCAL statement_timeout = '100ms'").await.map_err(|e| tp_err(&e))?;
    match with_timeout(6000, "pg_sleep under statement_timeout", t.q(sql().sleep, &[&3.0f64])).await? {
        Ok(_) => bad("statement_timeout", "pg_sleep(3) was not cancelled"),
        Err(qe) if tp_code(&qe.e) == "57014" => {
            INJECTED.fetch_add(1, SeqCst);
            CANCELS.fetch_add(1, SeqCst);
        }
        Err(qe) => bad("statement_timeout", tp_err(&qe.e)),
    }
    t.simple("ROLLBACK").await.map_err(|e| tp_err(&e))?;
    let r = t.q(sql().one, &[&42i32]).await.map_err(|qe| tp_err(&qe.e))?;
    expect_eq("after statement_timeout", r.rows[0].get::<_, i32>(0), 42);
    Ok(())
}

/// Directly against PostgreSQL up to 17, a CancelRequest signals the backend twice
/// (`kill(pid)`, then its process group): under load the second signal can arrive after the
/// cancelled query ended and cancel this client's next statement. That is PostgreSQL's, not
/// the pooler's (parsnip delivers a cancel once): in the direct run, a "user request"
/// cancel after this client's own cancel test is retried like a transaction hit by DDL.
fn stray_cancel(t: &Tp, e: &tokio_postgres::Error) -> bool {
    cfg().via == "0"
        && t.c % 10 == 2
        && tp_code(e) == "57014"
        && e.as_db_error().is_some_and(|d| d.message().contains("user request"))
}

/// tokio-postgres's cancel API: CancelToken::cancel_query while pg_sleep runs in a transaction.
async fn tp_cancel(t: &Tp) -> Result<(), String> {
    t.simple("BEGIN").await.map_err(|e| tp_err(&e))?;
    let token = t.client.cancel_token();
    let sleeper = t.q(sql().sleep, &[&5.0f64]);
    let canceller = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        token.cancel_query(NoTls).await
    };
    let (r, cr) = with_timeout(8000, "cancelled pg_sleep", async { tokio::join!(sleeper, canceller) }).await?;
    if let Err(e) = cr {
        bad("cancel_query", tp_err(&e));
    }
    match r {
        Ok(_) => bad("cancel", "pg_sleep(5) completed despite cancel_query"),
        Err(qe) if tp_code(&qe.e) == "57014" => {
            INJECTED.fetch_add(1, SeqCst);
            CANCELS.fetch_add(1, SeqCst);
        }
        Err(qe) => bad("cancel", tp_err(&qe.e)),
    }
    t.simple("ROLLBACK").await.map_err(|e| tp_err(&e))?;
    let r = t.q(sql().one, &[&7i32]).await.map_err(|qe| tp_err(&qe.e))?;
    expect_eq("after cancel", r.rows[0].get::<_, i32>(0), 7);
    Ok(())
}

/// A second connection updates a row and inserts in a transaction, then its connection task is
/// aborted (the socket closes without Terminate); the main connection must then lock the same row
/// (lock_timeout 5 s) and must not see the dead transaction's writes.
async fn tp_disconnect(t: &Tp) -> Result<(), String> {
    let s = sql();
    let id = DISC_BASE + t.c;
    let (c2, h) = tp_connect(&cfg().target_url).await.map_err(|e| tp_err(&e))?;
    c2.batch_execute("BEGIN").await.map_err(|e| tp_err(&e))?;
    c2.query(s.upd.as_str(), &[&1_000_000i64, &id]).await.map_err(|e| tp_err(&e))?;
    c2.query(s.ins.as_str(), &[&id, &1i32, &1i32, &"never committed"]).await.map_err(|e| tp_err(&e))?;
    h.abort();
    let _ = h.await;
    drop(c2);
    DISCONNECTS.fetch_add(1, SeqCst);
    t.simple("BEGIN").await.map_err(|e| tp_err(&e))?;
    let r: Result<(i64, i64), QErr> = async {
        t.simple("SET LOCAL lock_timeout = '5s'").await.map_err(|e| QErr { e, prep_done: 0 })?;
        let u = t.q(&s.upd, &[&1i64, &id]).await?;
        let n = t.q(&s.sums, &[&id]).await?;
        Ok((u.rows[0].get(0), n.rows[0].get(0)))
    }
    .await;
    match r {
        Ok((bal, n)) => {
            t.simple("COMMIT").await.map_err(|e| tp_err(&e))?;
            expect_eq("after disconnect: balance", bal, 1);
            expect_eq("after disconnect: rows", n, 0);
        }
        Err(qe) => {
            let _ = t.simple("ROLLBACK").await;
            bad("after disconnect", tp_err(&qe.e));
        }
    }
    Ok(())
}

async fn tp_client(c: i32) -> Result<(), String> {
    let cf = cfg();
    let mode = cf.mode;
    let s = sql();
    let (client, h) = tp_connect(&cf.target_url).await.map_err(|e| tp_err(&e))?;
    let t = Tp {
        c,
        client,
        _conn: h,
        throwaway: mode == Mode::TpQuery,
        cache: Mutex::new(HashMap::new()),
        ddl_blamed: Mutex::new(HashMap::new()),
    };
    let mut st = St::default();
    for i in 1..=cf.iterations {
        tp_churn(&t, i, mode).await;
        let mut outcome = TxOutcome::Retry;
        // Each retry follows an 0A000 blamed on another DDL: at most DDLS.len() of them.
        for attempt in 0..=DDLS.len() {
            if attempt > 0 {
                RETRIES.fetch_add(1, SeqCst);
            }
            outcome = tp_txn(&t, &mut st, i, mode).await;
            if !matches!(outcome, TxOutcome::Retry) {
                break;
            }
        }
        if matches!(outcome, TxOutcome::Retry) {
            bad("tx", format!("client {c} iteration {i}: 0A000 more than once per DDL"));
        }
        tp_wide_select(&t, i).await;
        if i % 4 == 2 {
            tp_error_in_tx(&t, i, mode).await;
        }
        if i == 2 + c % 3 {
            let r = match c % 10 {
                1 => tp_timeout(&t).await,
                2 => tp_cancel(&t).await,
                3 => tp_disconnect(&t).await,
                _ => Ok(()),
            };
            if let Err(e) = r {
                bad(&format!("special test {}", c % 10), e);
            }
        }
        PROGRESS.fetch_add(1, SeqCst);
    }
    // After both DDLs: this connection works again, without reconnecting.
    while DDL_DONE.load(SeqCst) < DDLS.len() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tp_wide_select(&t, 0).await;
    let r = t.q(&s.sums, &[&c]).await.map_err(|qe| tp_err(&qe.e))?;
    expect_eq(&format!("readback client {c}"), sums_of(&r.rows[0]), (st.count, st.sum, st.check));
    if mode == Mode::TpCopy {
        match tp_copy_out(&t, c).await {
            Ok(v) => {
                expect_eq(&format!("copy_out readback client {c}"), v, (st.count, st.sum, st.check));
            }
            Err(e) => bad("copy_out readback", e),
        }
    }
    let b = t.q(&s.balance, &[&c]).await.map_err(|qe| tp_err(&qe.e))?;
    expect_eq(&format!("readback balance {c}"), b.rows[0].get::<_, i64>(0), st.balance);
    let mut tot = TOTALS.lock().unwrap();
    tot.0 += st.count;
    tot.1 += st.sum;
    tot.2 += st.check;
    Ok(())
}

// ------------------------------------------------------------------------------ sqlx

type SxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'a>>;
type SxQuery<'a> = sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments>;

// Boxed at a function boundary with concrete lifetimes: calling sqlx's executor methods directly
// inside the spawned client futures trips rustc's "Executor is not general enough" (HRTB) error.
fn sx_fetch<'a>(conn: &'a mut sqlx::PgConnection, q: SxQuery<'a>) -> SxFut<'a, Vec<sqlx::postgres::PgRow>> {
    Box::pin(q.fetch_all(conn))
}

fn sx_raw<'a>(conn: &'a mut sqlx::PgConnection, s: &'a str) -> SxFut<'a, ()> {
    // A &str without arguments goes out as a simple Query ('Q').
    let f = sqlx::Executor::execute(conn, s);
    Box::pin(async move { f.await.map(|_| ()) })
}

struct Sx {
    c: i32,
    conn: sqlx::PgConnection,
    persistent: bool,
    // text -> DDL_DONE when this connection first prepared it (persistent only)
    prep: HashMap<String, usize>,
}

type SxRes = (Vec<sqlx::postgres::PgRow>, usize);

enum Arg {
    I4(i32),
    I8(i64),
    F8(f64),
    T(String),
}

impl Sx {
    async fn q(&mut self, text: &str, args: Vec<Arg>) -> Result<SxRes, (sqlx::Error, usize)> {
        let issued_done = DDL_DONE.load(SeqCst);
        let prep_done =
            if self.persistent { *self.prep.entry(text.to_string()).or_insert(issued_done) } else { issued_done };
        let mut q = sqlx::query(text).persistent(self.persistent);
        for a in args {
            q = match a {
                Arg::I4(v) => q.bind(v),
                Arg::I8(v) => q.bind(v),
                Arg::F8(v) => q.bind(v),
                Arg::T(v) => q.bind(v),
            };
        }
        match sx_fetch(&mut self.conn, q).await {
            Ok(rows) => Ok((rows, issued_done)),
            Err(e) => Err((e, prep_done)),
        }
    }

    async fn raw(&mut self, s: &str) -> Result<(), sqlx::Error> {
        sx_raw(&mut self.conn, s).await
    }

    /// sqlx never re-prepares a cached statement on its own: after an expected 0A000 the application
    /// clears the connection's statement cache (the documented workaround).
    async fn expected_0a000(&mut self, e: &sqlx::Error, prep_done: usize) -> bool {
        if sqlx_code(e) != "0A000" {
            return false;
        }
        if self.persistent {
            if let Err(e2) = self.conn.clear_cached_statements().await {
                bad("clear_cached_statements", sqlx_err(&e2));
            }
            self.prep.clear();
        }
        DDL_STARTED.load(SeqCst) > prep_done
    }
}

fn sx_sums(r: &sqlx::postgres::PgRow) -> (i64, i64, i64) {
    (r.get(0), r.get(1), r.get(2))
}

async fn sx_txn_body(
    conn: &mut sqlx::PgConnection,
    persistent: bool,
    c: i32,
    i: i32,
    amt: i32,
    step: &mut &'static str,
) -> Result<(i64, (i64, i64, i64), Wide), sqlx::Error> {
    let s = sql();
    *step = &s.upd;
    let u = sx_fetch(conn, sqlx::query(&s.upd).persistent(persistent).bind(amt as i64).bind(c)).await?;
    *step = &s.ins;
    let q = sqlx::query(&s.ins).persistent(persistent).bind(c).bind(i).bind(amt).bind(format!("tx {c}/{i}"));
    sx_fetch(conn, q).await?;
    *step = &s.sums;
    let sm = sx_fetch(conn, sqlx::query(&s.sums).persistent(persistent).bind(c)).await?;
    *step = &s.wide1;
    let wd = sx_fetch(conn, sqlx::query(&s.wide1).persistent(persistent).bind(1 + i % WIDE_ROWS)).await?;
    *step = "";
    Ok((u[0].get::<i64, _>(0), sx_sums(&sm[0]), sqlx_wide(&wd)))
}

async fn sx_txn(x: &mut Sx, st: &mut St, i: i32) -> TxOutcome {
    let s = sql();
    let c = x.c;
    let amt = amount_for(c, i);
    let mut want = *st;
    want.apply(i, amt);
    let mut tx = match x.conn.begin().await {
        Ok(tx) => tx,
        Err(e) => {
            bad("begin", sqlx_err(&e));
            return TxOutcome::Failed;
        }
    };
    let persistent = x.persistent;
    let issued_done = DDL_DONE.load(SeqCst);
    let mut step: &'static str = "";
    let r = sx_txn_body(&mut tx, persistent, c, i, amt, &mut step).await;
    match r {
        Ok((bal, sums, wide)) => {
            if let Err(e) = tx.commit().await {
                bad("commit", sqlx_err(&e));
                return TxOutcome::Failed;
            }
            for t in [&s.upd, &s.ins, &s.sums, &s.wide1] {
                x.prep.entry(t.to_string()).or_insert(issued_done);
            }
            *st = want;
            TRANSACTIONS.fetch_add(1, SeqCst);
            expect_eq("tx balance", bal, st.balance);
            expect_eq("tx sums", sums, (st.count, st.sum, st.check));
            check_wide("tx wide1", &wide, 1, issued_done);
            TxOutcome::Done
        }
        Err(e) => {
            if let Err(e2) = tx.rollback().await {
                bad("rollback", sqlx_err(&e2));
            }
            let prep_done = if persistent { x.prep.get(step).copied().unwrap_or(issued_done) } else { issued_done };
            if !step.is_empty() && x.expected_0a000(&e, prep_done).await {
                EXPECTED.fetch_add(1, SeqCst);
                return TxOutcome::Retry;
            }
            bad(&format!("tx {}", &step[..step.len().min(24)]), sqlx_err(&e));
            TxOutcome::Failed
        }
    }
}

async fn sx_wide_select(x: &mut Sx, i: i32) {
    let s = sql();
    let n = 1 + (x.c * 3 + i) % WIDE_ROWS;
    for attempt in 0..2 {
        match x.q(&s.wide, vec![Arg::I4(n)]).await {
            Ok((rows, issued_done)) => {
                check_wide("wide", &sqlx_wide(&rows), n as usize, issued_done);
                return;
            }
            Err((e, prep_done)) => {
                if attempt == 0 && x.expected_0a000(&e, prep_done).await {
                    EXPECTED.fetch_add(1, SeqCst);
                    continue;
                }
                bad("wide", sqlx_err(&e));
                return;
            }
        }
    }
}

async fn sx_error_in_tx(x: &mut Sx, i: i32) {
    let s = sql();
    let c = x.c;
    if let Err(e) = x.raw("BEGIN").await {
        bad("BEGIN", sqlx_err(&e));
        return;
    }
    if let Err((e, _)) = x.q(&s.ins, vec![Arg::I4(c), Arg::I4(-i), Arg::I4(5), Arg::T("rolled back".into())]).await {
        bad("error in tx: insert", sqlx_err(&e));
    }
    match x.q(s.div0, vec![Arg::I4(i)]).await {
        Ok(_) => bad("error in tx", "division by zero succeeded"),
        Err((e, _)) if sqlx_code(&e) == "22012" => {
            INJECTED.fetch_add(1, SeqCst);
        }
        Err((e, _)) => bad("error in tx", sqlx_err(&e)),
    }
    match x.q(s.one, vec![Arg::I4(1)]).await {
        Ok(_) => bad("error in tx", "a statement after an error succeeded"),
        Err((e, _)) if sqlx_code(&e) == "25P02" => {
            INJECTED.fetch_add(1, SeqCst);
        }
        Err((e, _)) => bad("error in tx (25P02)", sqlx_err(&e)),
    }
    if let Err(e) = x.raw("ROLLBACK").await {
        bad("ROLLBACK", sqlx_err(&e));
    }
    match x.q(&s.neg, vec![Arg::I4(c)]).await {
        Ok((rows, _)) => {
            expect_eq("error in tx: rolled-back rows", rows[0].get::<i64, _>(0), 0);
        }
        Err((e, _)) => bad("after error in tx", sqlx_err(&e)),
    }
    // And through sqlx's transaction API: the failing statement, then the Transaction is dropped
    // (sqlx queues the ROLLBACK), and the connection goes on.
    {
        let mut tx = match x.conn.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                bad("begin", sqlx_err(&e));
                return;
            }
        };
        match sx_fetch(&mut tx, sqlx::query(s.div0).persistent(x.persistent).bind(i)).await {
            Ok(_) => bad("error in tx", "division by zero succeeded"),
            Err(e) if sqlx_code(&e) == "22012" => {
                INJECTED.fetch_add(1, SeqCst);
            }
            Err(e) => bad("error in tx", sqlx_err(&e)),
        }
    }
    match x.q(s.one, vec![Arg::I4(i)]).await {
        Ok((rows, _)) => {
            expect_eq("after dropped transaction", rows[0].get::<i32, _>(0), i);
        }
        Err((e, _)) => bad("after dropped transaction", sqlx_err(&e)),
    }
}

async fn sx_timeout(x: &mut Sx) -> Result<(), String> {
    // sqlx has no cancel API: statement_timeout is how an application bounds a query.
    x.raw("BEGIN").await.map_err(|e| sqlx_err(&e))?;
    x.raw("SET LOCAL statement_timeout = '100ms'").await.map_err(|e| sqlx_err(&e))?;
    match with_timeout(6000, "pg_sleep under statement_timeout", x.q(sql().sleep, vec![Arg::F8(3.0)])).await? {
        Ok(_) => bad("statement_timeout", "pg_sleep(3) was not cancelled"),
        Err((e, _)) if sqlx_code(&e) == "57014" => {
            INJECTED.fetch_add(1, SeqCst);
            CANCELS.fetch_add(1, SeqCst);
        }
        Err((e, _)) => bad("statement_timeout", sqlx_err(&e)),
    }
    x.raw("ROLLBACK").await.map_err(|e| sqlx_err(&e))?;
    let (rows, _) = x.q(sql().one, vec![Arg::I4(42)]).await.map_err(|(e, _)| sqlx_err(&e))?;
    expect_eq("after statement_timeout", rows[0].get::<i32, _>(0), 42);
    Ok(())
}

async fn sx_after_disconnect(x: &mut Sx, id: i32) -> Result<(i64, i64), sqlx::Error> {
    let s = sql();
    x.raw("SET LOCAL lock_timeout = '5s'").await?;
    let u = x.q(&s.upd, vec![Arg::I8(1), Arg::I4(id)]).await.map_err(|(e, _)| e)?;
    let n = x.q(&s.sums, vec![Arg::I4(id)]).await.map_err(|(e, _)| e)?;
    Ok((u.0[0].get(0), n.0[0].get(0)))
}

/// A second connection updates and inserts in a transaction, then `close_hard()` shuts its socket
/// down without Terminate; the main connection must lock the row and see none of it.
async fn sx_disconnect(x: &mut Sx) -> Result<(), String> {
    let s = sql();
    let id = DISC_BASE + x.c;
    let mut c2 = sqlx::PgConnection::connect(&cfg().target_url).await.map_err(|e| sqlx_err(&e))?;
    sx_raw(&mut c2, "BEGIN").await.map_err(|e| sqlx_err(&e))?;
    sx_fetch(&mut c2, sqlx::query(&s.upd).bind(1_000_000i64).bind(id)).await.map_err(|e| sqlx_err(&e))?;
    let q = sqlx::query(&s.ins).bind(id).bind(1i32).bind(1i32).bind("never committed");
    sx_fetch(&mut c2, q).await.map_err(|e| sqlx_err(&e))?;
    let _ = c2.close_hard().await;
    DISCONNECTS.fetch_add(1, SeqCst);
    x.raw("BEGIN").await.map_err(|e| sqlx_err(&e))?;
    let r = sx_after_disconnect(x, id).await;
    match r {
        Ok((bal, n)) => {
            x.raw("COMMIT").await.map_err(|e| sqlx_err(&e))?;
            expect_eq("after disconnect: balance", bal, 1);
            expect_eq("after disconnect: rows", n, 0);
        }
        Err(e) => {
            let _ = x.raw("ROLLBACK").await;
            bad("after disconnect", sqlx_err(&e));
        }
    }
    Ok(())
}

async fn sx_client(c: i32) -> Result<(), String> {
    let cf = cfg();
    let s = sql();
    let conn = sqlx::PgConnection::connect(&cf.target_url).await.map_err(|e| sqlx_err(&e))?;
    let mut x = Sx { c, conn, persistent: cf.mode == Mode::SqlxPersistent, prep: HashMap::new() };
    let mut st = St::default();
    for i in 1..=cf.iterations {
        for j in 0..3 {
            let k = churn_k(c, i, j);
            let v = c * 1000 + i * 10 + j;
            let tag = format!("c{c}i{i}j{j}");
            match x.q(&s.churn[k as usize], vec![Arg::I4(v), Arg::T(tag.clone())]).await {
                Ok((rows, _)) => {
                    CHURNED.fetch_add(1, SeqCst);
                    expect_eq(
                        &format!("churn{k}"),
                        (rows[0].get::<i32, _>(0), rows[0].get::<String, _>(1)),
                        (v + k, tag),
                    );
                }
                Err((e, _)) => bad(&format!("churn{k}"), sqlx_err(&e)),
            }
        }
        let mut outcome = TxOutcome::Retry;
        for attempt in 0..3 {
            if attempt > 0 {
                RETRIES.fetch_add(1, SeqCst);
            }
            outcome = sx_txn(&mut x, &mut st, i).await;
            if !matches!(outcome, TxOutcome::Retry) {
                break;
            }
        }
        if matches!(outcome, TxOutcome::Retry) {
            bad("tx", format!("client {c} iteration {i}: 0A000 three times in a row"));
        }
        sx_wide_select(&mut x, i).await;
        if i % 4 == 2 {
            sx_error_in_tx(&mut x, i).await;
        }
        if i == 2 + c % 3 {
            let r = match c % 10 {
                1 | 2 => sx_timeout(&mut x).await,
                3 => sx_disconnect(&mut x).await,
                _ => Ok(()),
            };
            if let Err(e) = r {
                bad(&format!("special test {}", c % 10), e);
            }
        }
        PROGRESS.fetch_add(1, SeqCst);
    }
    while DDL_DONE.load(SeqCst) < DDLS.len() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sx_wide_select(&mut x, 0).await;
    let (rows, _) = x.q(&s.sums, vec![Arg::I4(c)]).await.map_err(|(e, _)| sqlx_err(&e))?;
    expect_eq(&format!("readback client {c}"), sx_sums(&rows[0]), (st.count, st.sum, st.check));
    let (rows, _) = x.q(&s.balance, vec![Arg::I4(c)]).await.map_err(|(e, _)| sqlx_err(&e))?;
    expect_eq(&format!("readback balance {c}"), rows[0].get::<i64, _>(0), st.balance);
    {
        let mut tot = TOTALS.lock().unwrap();
        tot.0 += st.count;
        tot.1 += st.sum;
        tot.2 += st.check;
    }
    let _ = x.conn.close().await;
    Ok(())
}

// ------------------------------------------------------------------------------ coordinator, setup, checks

struct Ddl {
    at: f64,
    sql: fn(&Cfg) -> String,
}

const DDLS: &[Ddl] = &[
    Ddl { at: 0.3, sql: |c| format!("ALTER TABLE {} ADD COLUMN c int NOT NULL DEFAULT 7", c.wide) },
    Ddl { at: 0.6, sql: |c| format!("ALTER TABLE {} ALTER COLUMN a TYPE bigint", c.wide) },
];

async fn coordinator(direct: &Client) {
    let c = cfg();
    let total = (c.clients * c.iterations) as f64;
    for d in DDLS {
        while (PROGRESS.load(SeqCst) as f64) < d.at * total && UNFINISHED.load(SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        set_phase("ddl");
        DDL_STARTED.fetch_add(1, SeqCst);
        let text = (d.sql)(c);
        eprintln!("[{:.1}s] ddl start: {text}", elapsed());
        if let Err(e) = direct.batch_execute(&text).await {
            bad("ddl", tp_err(&e));
        }
        DDL_DONE.fetch_add(1, SeqCst);
        eprintln!("[{:.1}s] ddl done", elapsed());
        set_phase("load");
    }
}

async fn setup(direct: &Client) -> Result<(), tokio_postgres::Error> {
    let c = cfg();
    let (a, l, w, n) = (&c.acct, &c.ledger, &c.wide, c.clients);
    direct
        .batch_execute(&format!(
            "SET lock_timeout = '15s';
             DROP TABLE IF EXISTS {a}, {l}, {w};
             CREATE TABLE {a} (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
             INSERT INTO {a} SELECT g, 0 FROM generate_series(1, {n}) g
               UNION ALL SELECT {DISC_BASE} + g, 0 FROM generate_series(1, {n}) g;
             CREATE TABLE {l} (client int NOT NULL, seq int NOT NULL, amount int NOT NULL, note text);
             CREATE INDEX ON {l} (client);
             CREATE TABLE {w} (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
             INSERT INTO {w} SELECT g, g * 10, 'row' || g FROM generate_series(1, {WIDE_ROWS}) g;"
        ))
        .await
}

async fn final_checks(direct: &Client) -> Result<(), tokio_postgres::Error> {
    let c = cfg();
    let (a, l, w, n) = (&c.acct, &c.ledger, &c.wide, c.clients);
    let tot = *TOTALS.lock().unwrap();
    let g = direct
        .query_one(
            &format!(
                "SELECT count(*)::bigint, coalesce(sum(amount), 0)::bigint, coalesce(sum(seq::bigint * amount), 0)::bigint \
                 FROM {l} WHERE client <= {n} AND seq > 0"
            ),
            &[],
        )
        .await?;
    expect_eq("global ledger", sums_of(&g), tot);
    expect_eq("global ledger rows", tot.0, (c.clients * c.iterations) as i64);
    let b: i64 = direct
        .query_one(&format!("SELECT coalesce(sum(balance), 0)::bigint FROM {a} WHERE id <= {n}"), &[])
        .await?
        .get(0);
    expect_eq("global balance", b, tot.1);
    let dirty: i64 =
        direct.query_one(&format!("SELECT count(*) FROM {l} WHERE seq < 0 OR client > {DISC_BASE}"), &[]).await?.get(0);
    expect_eq("rows of rolled-back or dead transactions", dirty, 0);
    let dead: i64 = direct
        .query_one(&format!("SELECT count(*) FROM {a} WHERE id > {DISC_BASE} AND balance >= 1000000"), &[])
        .await?
        .get(0);
    expect_eq("updates of dead transactions", dead, 0);
    let cols: String = direct
        .query_one(
            &format!(
                "SELECT string_agg(attname || ':' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) \
                 FROM pg_attribute WHERE attrelid = '{w}'::regclass AND attnum > 0 AND NOT attisdropped"
            ),
            &[],
        )
        .await?
        .get(0);
    expect_eq("schema after DDL", cols.as_str(), "id:integer,a:bigint,b:text,c:integer");
    // No server connection of this database left inside a transaction (waits for the disconnects).
    let mut idle = -1i64;
    for _ in 0..50 {
        idle = direct
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
                &[],
            )
            .await?
            .get(0);
        if idle == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    expect_eq("server connections idle in transaction", idle, 0);
    Ok(())
}

async fn run() -> Result<(), String> {
    let c = cfg();
    let (direct, _h) = tp_connect(&c.direct_url).await.map_err(|e| format!("direct connect: {}", tp_err(&e)))?;
    set_phase("setup");
    setup(&direct).await.map_err(|e| format!("setup: {}", tp_err(&e)))?;
    set_phase("load");
    UNFINISHED.store(c.clients as usize, SeqCst);
    let mut set = tokio::task::JoinSet::new();
    for id in 1..=c.clients {
        set.spawn(async move {
            let r = match cfg().mode {
                Mode::SqlxPersistent | Mode::SqlxUnprepared => sx_client(id).await,
                _ => tp_client(id).await,
            };
            if let Err(e) = r {
                bad(&format!("client {id}"), e);
            }
            UNFINISHED.fetch_sub(1, SeqCst);
        });
    }
    coordinator(&direct).await;
    while let Some(r) = set.join_next().await {
        if let Err(e) = r {
            bad("client task", e);
        }
    }
    set_phase("final checks");
    final_checks(&direct).await.map_err(|e| format!("final checks: {}", tp_err(&e)))?;
    Ok(())
}

/// `--version tp|sqlx`: the resolved crate versions, from this project's Cargo.lock.
fn print_versions(which: &str) {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .or_else(|_| std::fs::read_to_string("Cargo.lock"))
        .unwrap_or_default();
    let version = |krate: &str| {
        let head = format!("name = \"{krate}\"\nversion = \"");
        lock.find(&head)
            .and_then(|i| lock[i + head.len()..].split('"').next().map(str::to_string))
            .unwrap_or_else(|| "?".into())
    };
    match which {
        "sqlx" => println!("sqlx {}", version("sqlx")),
        _ => println!("tokio-postgres {}", version("tokio-postgres")),
    }
}

fn main() {
    let _ = T0.set(Instant::now());
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg == "--version" {
        print_versions(std::env::args().nth(2).as_deref().unwrap_or("tp"));
        return;
    }
    let Some(&(mode_name, mode)) = MODES.iter().find(|(n, _)| *n == arg) else {
        eprintln!("usage: rust-driver {}", MODES.iter().map(|m| m.0).collect::<Vec<_>>().join("|"));
        std::process::exit(2);
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(target_url), Some(direct_url)) = (env("TARGET_URL"), env("DIRECT_URL")) else {
        eprintln!("TARGET_URL and DIRECT_URL must be set (see drivers/README.md)");
        std::process::exit(2);
    };
    let tag = mode_name.replace('-', "_");
    let c = Cfg {
        mode,
        mode_name,
        target_url,
        direct_url,
        via: env("VIA_PARSNIP").unwrap_or_else(|| "?".into()),
        clients: env("CLIENTS").and_then(|v| v.parse().ok()).unwrap_or(100),
        iterations: env("ITERATIONS").and_then(|v| v.parse().ok()).unwrap_or(12),
        // The hang watchdog fires a little before the runner's own kill (SCENARIO_TIMEOUT_S).
        time_limit: Duration::from_secs_f64(
            (env("SCENARIO_TIMEOUT_S").and_then(|v| v.parse::<f64>().ok()).unwrap_or(60.0) - 5.0).max(10.0),
        ),
        acct: format!("{tag}_acct"),
        ledger: format!("{tag}_ledger"),
        wide: format!("{tag}_wide"),
    };
    let _ = SQL.set(build_sql(&c));
    let _ = CFG.set(c);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let limit = cfg().time_limit;
    let r = rt.block_on(async { tokio::time::timeout(limit, run()).await });
    match r {
        Ok(Ok(())) => finish(true, ""),
        Ok(Err(e)) => {
            bad("run", e);
            finish(false, "")
        }
        Err(_) => {
            let phase = *PHASE.lock().unwrap();
            bad(
                "watchdog",
                format!(
                    "no completion after {:.0}s in phase '{phase}' ({} clients unfinished)",
                    limit.as_secs_f64(),
                    UNFINISHED.load(SeqCst)
                ),
            );
            finish(false, "hang")
        }
    }
}
