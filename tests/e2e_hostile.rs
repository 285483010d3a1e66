//! Hostile clients next to honest ones (issue 23, "keep it that way"): many hostile
//! connections send fuzzed protocol streams (wrong lengths, types, counts, truncation,
//! reordering, vanishing mid-message and mid-protocol, with and without Sync, misbehaving
//! logins) through parsnip to a real PostgreSQL, while honest clients on the same small
//! pool (transaction mode, pool_size 3, so every server connection is shared all the time)
//! run transactions and check that every reply is exactly theirs, and at the end that every
//! row they committed is there and none they rolled back. parsnip must stay up, log no
//! panic, keep its memory bounded, and serve a fresh client correctly afterwards.
//!
//! Every hostile stream is a pure function of (run seed, phase, connection index), and so is
//! every honest client's sequence of operations; only timing varies between runs.
//!
//! * `PARSNIP_HOSTILE_SECS=N`: fuzz for N seconds in all (default 60: two thirds with the
//!   statement cache only, one third with `autoprepare` on as well).
//! * `PARSNIP_HOSTILE_SEED=S` (hex with 0x, or decimal): replay the run of seed S.
//! * `PARSNIP_HOSTILE_REPLAY=S1,S2,...`: instead of a run, play each of these hostile
//!   stream seeds (printed in a failure report) alone against a parsnip with one server
//!   connection, each followed by an honest probe; with `PARSNIP_HOSTILE_SHRINK=1`, shrink
//!   each to the fewest steps and messages that still break parsnip the same way.
//! * `PARSNIP_HOSTILE_SURVEY=N`: instead of a run, play hostile streams 0..N of the run
//!   seed's first phase one at a time, each alone followed by an honest probe, and list what
//!   broke by kind with example seeds.
//! * `PARSNIP_HOSTILE_PHASE=0|1`: only that phase (1: `autoprepare` on), for all the
//!   seconds; the replay, shrink and survey modes use its configuration and seeds.
//! * `PARSNIP_HOSTILE_SKIP=op1,op2`: leave these honest raw-client operations out
//!   (names in `hostile/honest.rs` `OPS`), e.g. to look past a known failure.
//!
//! * On a failure, parsnip's whole log is kept in the temp directory (the report names
//!   it); `PARSNIP_HOSTILE_KEEPLOG=1` keeps it after a passing run too, and
//!   `PARSNIP_TEST_LOG=info,parsnip::links=trace,parsnip::session::wire_trace=trace` makes
//!   it show every link and every frame (the post-mortem of the 2026-11-28 fixes).
//!
//! With `PARSNIP_E2E_DIRECT=1` everything talks to PostgreSQL itself (pg_hba trusts the
//! test's database first): the honest clients' expectations must hold there, which is how
//! the test shows its failures are parsnip's and not its own.

mod hostile;
mod support;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hostile::honest::{Honest, OPS};
use hostile::honest_pg::HonestPg;
use hostile::*;
use support::*;

const HONEST_RAW: u64 = 3;
const HONEST_PG: u64 = 2;
const HOSTILE_AT_ONCE: u64 = 6;
const POOL_SIZE: u32 = 3;
/// Hostile records kept for the report (the run stops at the first failure).
const KEEP_RECORDS: usize = 600;
const RSS_LIMIT_KB: u64 = 300 * 1024;

struct Settings {
    secs: u64,
    seed: u64,
    skip: Vec<String>,
    replay: Vec<u64>,
    shrink: bool,
    survey: u64,
    /// Only this phase (0: statement cache, 1: autoprepare too), if set.
    phase: Option<u64>,
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn settings() -> Settings {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let secs = var("PARSNIP_HOSTILE_SECS").and_then(|v| parse_u64(&v)).unwrap_or(60).max(3);
    let seed = var("PARSNIP_HOSTILE_SEED")
        .map(|v| parse_u64(&v).expect("PARSNIP_HOSTILE_SEED: a number"))
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64);
            mix(t.unwrap_or(0) ^ (std::process::id() as u64) << 32)
        });
    let list = |k: &str| -> Vec<String> {
        var(k)
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    };
    let skip = list("PARSNIP_HOSTILE_SKIP");
    for s in &skip {
        assert!(OPS.contains(&s.as_str()), "PARSNIP_HOSTILE_SKIP: no operation {s:?} (known: {OPS:?})");
    }
    let replay =
        list("PARSNIP_HOSTILE_REPLAY").iter().map(|s| parse_u64(s).expect("PARSNIP_HOSTILE_REPLAY: numbers")).collect();
    let survey = var("PARSNIP_HOSTILE_SURVEY").and_then(|v| parse_u64(&v)).unwrap_or(0);
    let shrink = var("PARSNIP_HOSTILE_SHRINK").is_some_and(|v| v != "0");
    let phase =
        var("PARSNIP_HOSTILE_PHASE").map(|v| parse_u64(&v).filter(|&p| p <= 1).expect("PARSNIP_HOSTILE_PHASE: 0 or 1"));
    Settings { secs, seed, skip, replay, shrink, survey, phase }
}

fn config(phase: u64, pool_size: u32) -> String {
    let auto = if phase == 1 { "autoprepare = true\nautoprepare_after = 1\n" } else { "autoprepare = false\n" };
    trust_config(&format!(
        "pool_mode = \"transaction\"\npool_size = {pool_size}\nmax_message_size = 1048576\n\
         client_login_timeout_ms = 1000\nquery_wait_timeout_ms = 30000\n{auto}"
    ))
}

/// The test's database and tables; in direct mode, pg_hba trusts it first.
fn setup() {
    create_db(stream::DB);
    psql(
        stream::DB,
        "CREATE TABLE honest (id bigint PRIMARY KEY, tok text NOT NULL, client int NOT NULL);\n\
         CREATE TABLE hx (a bigint, b text);\n\
         GRANT ALL ON honest, hx TO PUBLIC;",
    );
    if direct_mode() {
        let hba = cluster().data_dir().join("pg_hba.conf");
        let old = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
        let line = format!("host {} {} 127.0.0.1/32 trust\n", stream::DB, stream::USER);
        if !old.starts_with(&line) {
            std::fs::write(&hba, format!("{line}{old}")).expect("writing pg_hba.conf");
        }
        psql("postgres", "SELECT pg_reload_conf()");
    }
}

/// What a phase measured.
struct PhaseResult {
    ledger: Ledger,
    hostile_conns: u64,
    max_rss_kb: u64,
}

/// One phase: honest and hostile clients against `p` for `secs` seconds.
async fn run_phase(
    p: &mut Parsnip,
    set: &Settings,
    phase: u64,
    secs: u64,
    journal: &Arc<Journal>,
    records: &Arc<Mutex<VecDeque<HostileRecord>>>,
    marker: &str,
) -> PhaseResult {
    let until = Instant::now() + Duration::from_secs(secs);
    let port = p.port();
    let mut honest = Vec::new();
    for c in 0..HONEST_RAW {
        let h = Honest::new(port, set.seed, phase, c, marker, &set.skip);
        honest.push(tokio::spawn(h.run(until, journal.clone())));
    }
    for c in 0..HONEST_PG {
        let h = HonestPg::new(port, set.seed, phase, c, marker);
        honest.push(tokio::spawn(h.run(until, journal.clone())));
    }
    let next = Arc::new(AtomicU64::new(0));
    let mut hostile = Vec::new();
    for _ in 0..HOSTILE_AT_ONCE {
        let (journal, records, next, marker) = (journal.clone(), records.clone(), next.clone(), marker.to_string());
        let seed = set.seed;
        hostile.push(tokio::spawn(async move {
            while Instant::now() < until && !journal.stopped() {
                let idx = next.fetch_add(1, Ordering::Relaxed);
                let plan = stream::plan(derive(seed, 1, phase, idx));
                let (rec, violations) = attack::run(port, phase, idx, &plan, &marker).await;
                if !violations.is_empty() {
                    journal.violation(Failure {
                        who: format!("hostile connection #{idx} seed {:#018x}", plan.seed),
                        phase,
                        start: rec.start,
                        end: rec.end,
                        what: format!("parsnip answered a hostile client wrongly: {violations:?}"),
                        transcript: String::new(),
                        hostile: Some(idx),
                    });
                }
                let mut r = records.lock().unwrap_or_else(|p| p.into_inner());
                r.push_back(rec);
                if r.len() > KEEP_RECORDS {
                    r.pop_front();
                }
            }
        }));
    }
    // Watch parsnip's memory while the clients run.
    let mut max_rss_kb = 0;
    let hard_end = until + Duration::from_secs(45);
    while !(honest.iter().all(|h| h.is_finished()) && hostile.iter().all(|h| h.is_finished())) {
        if !direct_mode() {
            match p.proc_status_kb("VmRSS") {
                Some(kb) => max_rss_kb = max_rss_kb.max(kb),
                None => journal.fail(Failure {
                    who: "parsnip".into(),
                    phase,
                    start: Instant::now(),
                    end: Instant::now(),
                    what: "parsnip's process is gone".into(),
                    transcript: p.log_tail(),
                    hostile: None,
                }),
            }
        }
        if Instant::now() > hard_end {
            panic!("phase {phase}: clients still running 45 s after the end (a client task hangs)\n{}", p.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ledger = Ledger::default();
    for h in honest {
        match h.await {
            Ok(l) => ledger.merge(l),
            Err(e) => panic!("an honest client task panicked: {e}"),
        }
    }
    for h in hostile {
        if let Err(e) = h.await {
            panic!("a hostile client task panicked: {e}");
        }
    }
    // After the storm: parsnip alive, no panic logged, a fresh client served correctly.
    if !direct_mode() {
        assert!(p.alive(), "phase {phase}: parsnip died\n{}", p.log_tail());
        assert!(!p.logs().contains("panicked"), "phase {phase}: parsnip logged a panic:\n{}", p.logs());
    }
    if !journal.stopped() {
        let kinds: Vec<usize> = (0..OPS.len()).collect();
        let mut fresh = Honest::new(port, set.seed, phase + 20, 0, marker, &set.skip);
        if let Err((_, f)) = fresh.probe(&kinds).await {
            journal.fail(Failure { what: format!("fresh client after the run: {}", f.what), ..f });
        }
        ledger.merge(fresh.ledger.clone());
    }
    // The kernel's high-water mark also covers peaks between the samples.
    let max_rss_kb = max_rss_kb.max(p.proc_status_kb("VmHWM").unwrap_or(0));
    PhaseResult { ledger, hostile_conns: next.load(Ordering::Relaxed), max_rss_kb }
}

/// Lines of the server log written since byte `from` that say a backend crashed and the
/// postmaster reinitialised: with `synchronous_commit = off` (the throwaway cluster's
/// setting) that restart loses the last acknowledged commits, so missing rows after one are
/// the crash's doing, and the crash is the finding.
fn server_crashes(from: u64) -> Vec<String> {
    let log = std::fs::read(cluster().log_file()).unwrap_or_default();
    let tail = String::from_utf8_lossy(log.get(from as usize..).unwrap_or_default()).into_owned();
    let signs = ["terminated by signal", "terminated by exception", "reinitializing", "was interrupted"];
    let lines: Vec<&str> = tail.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if signs.iter().any(|s| l.contains(s)) {
            out.push(l.to_string());
            // PostgreSQL names what the crashed process was running on the next line.
            if let Some(next) = lines.get(i + 1).filter(|n| n.contains("DETAIL")) {
                out.push(next.to_string());
            }
        }
    }
    out
}

fn server_log_len() -> u64 {
    std::fs::metadata(cluster().log_file()).map(|m| m.len()).unwrap_or(0)
}

/// Every committed row present, no rolled-back one, nothing from nowhere.
fn check_rows(ledger: &Ledger) -> Result<(), String> {
    let out = psql(stream::DB, "SELECT id FROM honest");
    let present: HashSet<i64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    let committed: HashSet<i64> = ledger.committed.iter().copied().collect();
    let unknown: HashSet<i64> = ledger.unknown.iter().copied().collect();
    let missing: Vec<&i64> = committed.iter().filter(|id| !present.contains(id)).take(20).collect();
    let resurrected: Vec<&i64> = ledger.rolled_back.iter().filter(|id| present.contains(id)).take(20).collect();
    let foreign: Vec<&i64> =
        present.iter().filter(|id| !committed.contains(id) && !unknown.contains(id)).take(20).collect();
    if missing.is_empty() && resurrected.is_empty() && foreign.is_empty() {
        return Ok(());
    }
    Err(format!(
        "rows: committed but missing {missing:?}; rolled back but present {resurrected:?}; \
         present but never committed {foreign:?} ({} committed, {} present)",
        committed.len(),
        present.len()
    ))
}

/// In CI: seeded hostile streams, each played alone against a pool of one server
/// connection and followed by an honest client on that same connection, which must get
/// exactly its own answers (the survey mode below, with fixed seeds: deterministic, so a
/// failure names the stream that breaks isolation). 350 streams, both configurations,
/// about 50 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_streams_one_at_a_time_leave_nothing_behind() {
    setup();
    let marker = "honsurvey";
    for (seed, phase, n) in [(0x1u64, 0u64, 200u64), (0x2, 1, 150)] {
        // The honest probes' row ids repeat from one survey to the next.
        psql(stream::DB, "TRUNCATE honest");
        let (text, kinds) =
            report::survey(|| Parsnip::with_config(&config(phase, 1)), seed, phase, n, marker, &[]).await;
        assert_eq!(kinds, 0, "{text}");
    }
}

/// Hostile and honest clients at once on a small pool (the module doc), for 60 seconds
/// (`PARSNIP_HOSTILE_SECS`): two thirds with the statement cache only, one third with
/// autoprepare too. Ignored in the main pass because it loads both cores: scripts/test.sh
/// runs it alone, half a minute against each major version. Its earlier failures
/// (acknowledged rows missing) were PostgreSQL crashing on a hostile stream, which parsnip
/// now prevents (docs/design.md "Isolation"); a server crash now fails it by name.
/// `cargo test --test e2e_hostile -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "loads both cores: scripts/test.sh runs it alone after the other tests (cargo test --test e2e_hostile -- --ignored)"]
async fn hostile_clients_do_not_disturb_honest_ones() {
    let set = settings();
    setup();
    let marker = format!("hon{:08x}", set.seed as u32);
    let one = set.phase.unwrap_or(0);
    if set.shrink {
        assert!(!set.replay.is_empty(), "PARSNIP_HOSTILE_SHRINK needs PARSNIP_HOSTILE_REPLAY=seeds");
        let mut text = String::from("shrunk streams (each alone against one server connection):\n");
        for &seed in &set.replay {
            text.push_str(&shrink::shrink(|| Parsnip::with_config(&config(one, 1)), seed, &marker, &set.skip).await);
        }
        assert!(!text.contains("shrunk ("), "{text}");
        println!("{text}");
        return;
    }
    if !set.replay.is_empty() {
        let text = report::solo(|| Parsnip::with_config(&config(one, 1)), &set.replay, &marker, &set.skip).await;
        assert!(!text.contains("REPRODUCES") && !text.contains("WITHOUT ANY HOSTILE"), "{text}");
        println!("{text}");
        return;
    }
    if set.survey > 0 {
        let (text, kinds) =
            report::survey(|| Parsnip::with_config(&config(one, 1)), set.seed, one, set.survey, &marker, &set.skip)
                .await;
        assert_eq!(kinds, 0, "{text}");
        println!("{text}");
        return;
    }
    println!("hostile-client test: run seed {:#x}, {} s", set.seed, set.secs);
    if std::env::var_os("PARSNIP_HOSTILE_PGLOG").is_some() {
        psql("postgres", "ALTER SYSTEM SET log_statement = 'all'; ALTER SYSTEM SET log_connections = on");
        psql("postgres", "SELECT pg_reload_conf()");
    }
    let log_from = server_log_len();
    let journal = Journal::new();
    let records = Arc::new(Mutex::new(VecDeque::new()));
    let mut ledger = Ledger::default();
    let mut hostile_conns = 0;
    let shares = [(0u64, set.secs * 2 / 3), (1, set.secs - set.secs * 2 / 3)];
    for (phase, secs) in shares {
        let secs = match set.phase {
            Some(only) if only != phase => continue,
            Some(_) => set.secs,
            None => secs,
        };
        if journal.stopped() {
            break;
        }
        let mut p = Parsnip::with_config(&config(phase, POOL_SIZE));
        let r = run_phase(&mut p, &set, phase, secs, &journal, &records, &marker).await;
        if std::env::var_os("PARSNIP_HOSTILE_KEEPLOG").is_some() || !journal.failures().is_empty() {
            // What parsnip itself said of trouble, for the post-mortem (its whole log kept
            // in a file: `PARSNIP_TEST_LOG` raises its level).
            let logs = p.logs();
            let kept = std::env::temp_dir().join(format!("parsnip-hostile-{:x}-phase{phase}.log", set.seed));
            let _ = std::fs::write(&kept, &logs);
            let said: Vec<&str> = logs.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
            println!(
                "phase {phase}: parsnip's warnings ({} lines, the last 40; whole log in {}):",
                said.len(),
                kept.display()
            );
            for l in &said[said.len().saturating_sub(40)..] {
                println!("  {l}");
            }
        }
        println!(
            "phase {phase}: {} honest operations, {} hostile connections, parsnip peak RSS {} kB",
            r.ledger.ops, r.hostile_conns, r.max_rss_kb
        );
        assert!(
            r.max_rss_kb < RSS_LIMIT_KB,
            "phase {phase}: parsnip's RSS reached {} kB (limit {RSS_LIMIT_KB} kB); run seed {:#x}",
            r.max_rss_kb,
            set.seed
        );
        ledger.merge(r.ledger);
        hostile_conns += r.hostile_conns;
    }
    let crashes = server_crashes(log_from);
    if !crashes.is_empty() {
        // The cluster's directory goes at exit: keep its log for the post-mortem.
        let kept = std::env::temp_dir().join(format!("parsnip-hostile-{:x}-server.log", set.seed));
        let _ = std::fs::copy(cluster().log_file(), &kept);
        panic!(
            "run seed {:#x}: a PostgreSQL backend crashed (log kept in {}):\n{}",
            set.seed,
            kept.display(),
            crashes.join("\n")
        );
    }
    let failures = journal.failures();
    if failures.is_empty() {
        if let Err(e) = check_rows(&ledger) {
            panic!("run seed {:#x}: {e}", set.seed);
        }
        assert!(ledger.ops > 50, "only {} honest operations ran: the test did not exercise anything", ledger.ops);
        assert!(hostile_conns > 50, "only {hostile_conns} hostile connections ran");
        return;
    }
    let recs: Vec<HostileRecord> = records.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
    let mut text = report::report(&journal, set.seed, &failures, &recs);
    if let Err(e) = check_rows(&ledger) {
        text.push_str(&format!("\nalso: {e}\n"));
    }
    // Which suspects break parsnip on their own?
    let mut seeds: Vec<u64> = Vec::new();
    for (f, _) in report::classes(&failures).iter().take(6) {
        for r in report::suspects(f, &recs).iter().take(4) {
            if !seeds.contains(&r.seed) {
                seeds.push(r.seed);
            }
        }
    }
    let phase = failures[0].phase;
    text.push('\n');
    text.push_str(&report::solo(|| Parsnip::with_config(&config(phase, 1)), &seeds, &marker, &set.skip).await);
    panic!("{text}");
}
