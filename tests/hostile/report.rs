//! The failure report (the run seed, each failure's request and reply bytes, the hostile
//! streams active around it with their seeds and bytes) and the solo replay that tells which
//! of those streams breaks the pooler on its own.

use super::honest::{Honest, OPS};
use super::stream;
use super::*;

/// How long before an honest request a hostile connection may have ended and still be a
/// suspect (its server connection may have been handed on dirty).
const SUSPECT_WINDOW: Duration = Duration::from_secs(3);

/// At most this many suspects are listed and replayed.
const MAX_SUSPECTS: usize = 8;

/// Bound on a probe request after a stream played alone (it has ended by then, and the
/// probe's server connection is the only one).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on the solo replay of a failed run's suspects.
const SOLO_BUDGET: Duration = Duration::from_secs(90);

/// The hostile streams that may have caused `f`: the one that saw it, for a protocol
/// violation; else those in `f`'s phase overlapping `[f.start - SUSPECT_WINDOW, f.end]`,
/// latest first.
pub fn suspects(f: &Failure, records: &[HostileRecord]) -> Vec<HostileRecord> {
    if let Some(idx) = f.hostile {
        return records.iter().filter(|r| r.phase == f.phase && r.idx == idx).cloned().collect();
    }
    let from = f.start.checked_sub(SUSPECT_WINDOW).unwrap_or(f.start);
    let mut s: Vec<HostileRecord> =
        records.iter().filter(|r| r.phase == f.phase && r.end >= from && r.start <= f.end).cloned().collect();
    // Most suspect: those running when the request was sent, then those that ended just
    // before it (their server connection may have been handed on), then later ones.
    let score = |r: &HostileRecord| -> Duration {
        if r.start <= f.start && r.end >= f.start {
            Duration::ZERO
        } else if r.end < f.start {
            f.start - r.end
        } else {
            r.start - f.start + SUSPECT_WINDOW
        }
    };
    s.sort_by_key(score);
    s.truncate(MAX_SUSPECTS);
    s
}

/// The first failure of each class, with how many of that class were recorded.
pub fn classes(failures: &[Failure]) -> Vec<(Failure, usize)> {
    let mut out: Vec<(Failure, usize)> = Vec::new();
    for f in failures {
        match out.iter_mut().find(|(g, _)| g.class() == f.class()) {
            Some((_, n)) => *n += 1,
            None => out.push((f.clone(), 1)),
        }
    }
    out
}

/// The received bytes as normalized frames (as far as they parse).
fn frames_of(bytes: &[u8]) -> String {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes([bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4]]) as usize;
        if len < 4 || at + 1 + len > bytes.len() {
            break;
        }
        let f = Frame { tag: bytes[at], body: bytes[at + 5..at + 1 + len].to_vec() };
        out.push(normalize(&f));
        at += 1 + len;
    }
    if at < bytes.len() {
        out.push(format!("(+{} bytes: {})", bytes.len() - at, hex_cut(&bytes[at..], 32)));
    }
    out.join(" ")
}

pub fn describe_record(j: &Journal, r: &HostileRecord) -> String {
    let mut s = format!(
        "  hostile connection #{} (phase {}) seed {:#018x}, {:.3}s..{:.3}s, ended: {}\n",
        r.idx,
        r.phase,
        r.seed,
        j.at(r.start),
        j.at(r.end),
        r.outcome
    );
    for d in &r.desc {
        s.push_str(&format!("      {d}\n"));
    }
    s.push_str(&format!("    sent ({} bytes): {}\n", r.sent_total, hex_cut(&r.sent, 4096)));
    s.push_str(&format!("    received: {}\n", frames_of(&r.received)));
    s
}

/// The report of a failed run: the first failure of each class, and its suspects.
pub fn report(j: &Journal, run_seed: u64, failures: &[Failure], records: &[HostileRecord]) -> String {
    let mut s = format!(
        "hostile-client test FAILED, run seed {run_seed:#x}\n\
         replay the run: PARSNIP_HOSTILE_SEED={run_seed:#x} cargo test --test e2e_hostile -- --nocapture\n\
         replay streams alone: PARSNIP_HOSTILE_REPLAY=<seed>[,<seed>...] cargo test --test e2e_hostile -- --nocapture\n"
    );
    let classes = classes(failures);
    s.push_str(&format!("{} kinds of failure:\n", classes.len()));
    for (f, n) in &classes {
        s.push_str(&format!("  {n}× {}\n", f.class()));
    }
    for (i, (f, _)) in classes.iter().take(6).enumerate() {
        s.push_str(&format!(
            "\n=== failure {}: {} at {:.3}s..{:.3}s (phase {}): {}\n{}\n",
            i + 1,
            f.who,
            j.at(f.start),
            j.at(f.end),
            f.phase,
            f.what,
            f.transcript
        ));
        let sus = suspects(f, records);
        match f.hostile {
            Some(_) => s.push_str("  the hostile stream:\n"),
            None => s.push_str(&format!(
                "  hostile connections active from {SUSPECT_WINDOW:?} before it to its end ({}):\n",
                sus.len()
            )),
        }
        for r in &sus {
            s.push_str(&describe_record(j, r));
        }
    }
    s
}

/// First an honest probe alone (a failure there needs no hostile client at all; that
/// operation is left out of the probes that follow), then each stream alone against a fresh
/// parsnip with one server connection, followed by the probe; says what happened per seed.
pub async fn solo(start: impl Fn() -> crate::support::Parsnip, seeds: &[u64], marker: &str, skip: &[String]) -> String {
    let mut out = String::from("solo replay (pool_size = 1; each stream alone, then an honest probe; 3 tries):\n");
    let probe_kinds: Vec<usize> = (0..OPS.len()).filter(|&k| OPS[k] != "reconnect").collect();
    let mut skip = skip.to_vec();
    {
        let p = start();
        for attempt in 0..OPS.len() as u64 {
            let mut honest = Honest::new(p.port(), 0, 30 + attempt, 99, marker, &skip);
            match honest.probe(&probe_kinds).await {
                Ok(()) => break,
                Err((k, f)) => {
                    out.push_str(&format!(
                        "  WITHOUT ANY HOSTILE CLIENT the honest operation {} fails: {}\n{}\n",
                        OPS[k], f.what, f.transcript
                    ));
                    skip.push(OPS[k].to_string());
                }
            }
        }
        if !skip.is_empty() {
            out.push_str(&format!("  (left out of the probes below: {skip:?})\n"));
        }
    }
    let deadline = Instant::now() + SOLO_BUDGET;
    for (k, &seed) in seeds.iter().enumerate() {
        if Instant::now() > deadline {
            out.push_str(&format!("  (stopped after {SOLO_BUDGET:?}; not replayed: {:x?})\n", &seeds[k..]));
            break;
        }
        let plan = stream::plan(seed);
        let mut verdict = "does not reproduce alone".to_string();
        let p = start();
        for attempt in 0..3u64 {
            let (rec, violations) = attack::run(p.port(), 9, k as u64, &plan, marker).await;
            let mut honest = Honest::new(p.port(), seed, 10 + attempt, 100 + k as u64, marker, &skip);
            honest.timeout = PROBE_TIMEOUT;
            let r = honest.probe(&probe_kinds).await;
            if !violations.is_empty() || r.is_err() {
                verdict = format!("REPRODUCES alone (try {}): hostile ended: {}\n", attempt + 1, rec.outcome);
                for d in &rec.desc {
                    verdict.push_str(&format!("      {d}\n"));
                }
                verdict.push_str(&format!("    sent ({} bytes): {}\n", rec.sent_total, hex_cut(&rec.sent, 4096)));
                verdict.push_str(&format!("    received: {}\n", frames_of(&rec.received)));
                if !violations.is_empty() {
                    verdict.push_str(&format!("    violations seen by the hostile client: {violations:?}\n"));
                }
                if let Err((_, f)) = r {
                    verdict.push_str(&format!("    probe failure: {}\n{}\n", f.what, f.transcript));
                }
                verdict.push_str(&format!("{}\n", p.log_tail()));
                break;
            }
        }
        out.push_str(&format!("  seed {seed:#018x}: {verdict}\n"));
    }
    out
}

/// Plays hostile streams `0..n` of phase `phase` of a run one at a time against a parsnip
/// with one server connection, each followed by a short honest probe, and groups what breaks
/// by kind, with the first seeds of each (a development aid: `PARSNIP_HOSTILE_SURVEY=N`).
pub async fn survey(
    start: impl Fn() -> crate::support::Parsnip,
    run_seed: u64,
    phase: u64,
    n: u64,
    marker: &str,
    skip: &[String],
) -> (String, usize) {
    let kinds: Vec<usize> = ["simple_echo", "ext_unnamed", "ext_named", "simple_txn", "pipelined", "txn_roundtrips"]
        .iter()
        .filter_map(|k| OPS.iter().position(|o| o == k))
        .collect();
    // (kind, how many, example seeds, what the first one looked like)
    let mut found: Vec<(String, usize, Vec<u64>, String)> = Vec::new();
    let mut p = start();
    for idx in 0..n {
        let plan = stream::plan(derive(run_seed, 1, phase, idx));
        let (rec, violations) = attack::run(p.port(), phase, idx, &plan, marker).await;
        let mut honest = Honest::new(p.port(), run_seed, 40 + idx, 0, marker, skip);
        honest.timeout = PROBE_TIMEOUT;
        let mut classes: Vec<(String, String)> = violations
            .iter()
            .map(|v| (Failure { what: format!("hostile client saw: {v}"), ..blank(&rec) }.class(), v.clone()))
            .collect();
        if let Err((_, f)) = honest.probe(&kinds).await {
            let mut detail = format!("  the hostile stream before it ({:#x}), ended: {}\n", plan.seed, rec.outcome);
            for d in &rec.desc {
                detail.push_str(&format!("      {d}\n"));
            }
            detail.push_str(&format!("    sent ({} bytes): {}\n", rec.sent_total, hex_cut(&rec.sent, 4096)));
            detail.push_str(&f.transcript);
            classes.push((format!("probe after it: {}", f.class()), detail));
        }
        classes.dedup_by(|a, b| a.0 == b.0);
        for (c, detail) in &classes {
            match found.iter_mut().find(|(k, _, _, _)| k == c) {
                Some((_, count, seeds, _)) => {
                    *count += 1;
                    if seeds.len() < 5 {
                        seeds.push(plan.seed);
                    }
                }
                None => found.push((c.clone(), 1, vec![plan.seed], detail.clone())),
            }
        }
        if !classes.is_empty() {
            p = start();
        }
    }
    let mut out = format!("survey of {n} hostile streams of run seed {run_seed:#x}, phase {phase}, each alone:\n");
    for (class, count, seeds, detail) in &found {
        let seeds: Vec<String> = seeds.iter().map(|s| format!("{s:#x}")).collect();
        out.push_str(&format!("  {count}× {class}\n      e.g. PARSNIP_HOSTILE_REPLAY={}\n", seeds.join(",")));
        out.push_str(&format!("      the first one:\n{detail}\n"));
    }
    (out, found.len())
}

fn blank(rec: &HostileRecord) -> Failure {
    Failure {
        who: String::new(),
        phase: rec.phase,
        start: rec.start,
        end: rec.end,
        what: String::new(),
        transcript: String::new(),
        hostile: Some(rec.idx),
    }
}
