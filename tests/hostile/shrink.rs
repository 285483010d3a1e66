//! Shrinks a hostile stream that breaks parsnip on its own to fewer steps and pieces that
//! still break it the same way (a development aid: `PARSNIP_HOSTILE_SHRINK=1` with
//! `PARSNIP_HOSTILE_REPLAY=seeds`). Greedy: drop one step or one piece at a time, keep the
//! drop when the same kind of failure still shows (twice in a row), repeat until nothing
//! more can go. Every check runs against a parsnip with one server connection, restarted
//! after each reproduction so that a broken pooler never counts for the next candidate.

use super::honest::{Honest, OPS};
use super::report::PROBE_TIMEOUT;
use super::stream::{Plan, Step};
use super::*;
use crate::support::Parsnip;

struct Checker<'a, F: Fn() -> Parsnip> {
    start: F,
    p: Parsnip,
    marker: &'a str,
    skip: &'a [String],
    checks: u64,
    /// What the probe (or the hostile client) saw the last time the failure showed.
    last: String,
}

impl<F: Fn() -> Parsnip> Checker<'_, F> {
    /// The kind of failure `plan` causes alone, if any.
    async fn outcome(&mut self, plan: &Plan) -> Option<String> {
        self.checks += 1;
        let (rec, violations) = attack::run(self.p.port(), 9, self.checks, plan, self.marker).await;
        let kinds: Vec<usize> = ["simple_echo", "ext_unnamed", "simple_txn"]
            .iter()
            .filter_map(|k| OPS.iter().position(|o| o == k))
            .collect();
        let mut honest = Honest::new(self.p.port(), plan.seed, 50 + self.checks, 0, self.marker, self.skip);
        honest.timeout = PROBE_TIMEOUT;
        let probe = honest.probe(&kinds).await;
        let blank = |what: String| Failure {
            who: String::new(),
            phase: 0,
            start: rec.start,
            end: rec.end,
            what,
            transcript: String::new(),
            hostile: None,
        };
        let class = match (violations.first(), probe) {
            (Some(v), _) => {
                self.last = format!("    the hostile client received: {}\n", hex_cut(&rec.received, 2048));
                Some(blank(format!("hostile client saw: {v}")).class())
            }
            (None, Err((_, f))) => {
                self.last = format!("    probe failure: {}\n{}\n", f.what, f.transcript);
                Some(format!("probe after it: {}", f.class()))
            }
            (None, Ok(())) => None,
        };
        if class.is_some() {
            self.p = (self.start)();
        }
        class
    }

    /// Whether `plan` causes `class` in two runs in a row.
    async fn still(&mut self, plan: &Plan, class: &str) -> bool {
        for _ in 0..2 {
            if self.outcome(plan).await.as_deref() != Some(class) {
                return false;
            }
        }
        true
    }
}

/// Sizes of the runs to drop, largest first: n/2, n/4, ..., 1.
fn run_sizes(n: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut k = n / 2;
    while k > 1 {
        sizes.push(k);
        k /= 2;
    }
    sizes.push(1);
    sizes
}

/// Smaller candidates of `plan`, bigger cuts first: runs of steps dropped, then runs of
/// pieces of one write (the login, a startup write followed by `Login`, stays).
fn candidates(plan: &Plan) -> Vec<Plan> {
    let mut out = Vec::new();
    let keep_login = matches!(plan.steps.get(1), Some(Step::Login));
    let first = if keep_login { 2 } else { 0 };
    // Two writes in a row as one; a message split over writes whole again (so that it can
    // go as one piece).
    for i in first..plan.steps.len().saturating_sub(1) {
        if let (Step::Write(a), Step::Write(b)) = (&plan.steps[i], &plan.steps[i + 1]) {
            let mut steps = plan.steps.clone();
            steps[i] = Step::Write(a.iter().chain(b).cloned().collect());
            steps.remove(i + 1);
            out.push(Plan { seed: plan.seed, steps });
        }
    }
    for i in first..plan.steps.len() {
        let Step::Write(pieces) = &plan.steps[i] else { continue };
        for j in 0..pieces.len().saturating_sub(1) {
            let (a, b) = (&pieces[j], &pieces[j + 1]);
            let Some(base) = a.1.rfind(" [first ").map(|at| &a.1[..at]) else { continue };
            if b.1.starts_with(&format!("{base} [rest]")) {
                let mut joined = pieces.clone();
                let mut bytes = a.0.clone();
                bytes.extend_from_slice(&b.0);
                joined[j] = (bytes, b.1.replacen(" [rest]", "", 1));
                joined.remove(j + 1);
                let mut steps = plan.steps.clone();
                steps[i] = Step::Write(joined);
                out.push(Plan { seed: plan.seed, steps });
            }
        }
    }
    let n = plan.steps.len() - first;
    for k in run_sizes(n) {
        for at in (first..=plan.steps.len() - k).rev() {
            let mut steps = plan.steps.clone();
            steps.drain(at..at + k);
            out.push(Plan { seed: plan.seed, steps });
        }
    }
    for i in (first..plan.steps.len()).rev() {
        let Step::Write(pieces) = &plan.steps[i] else { continue };
        if pieces.len() < 2 {
            continue;
        }
        for k in run_sizes(pieces.len()) {
            for at in (0..=pieces.len() - k).rev() {
                let mut fewer = pieces.clone();
                fewer.drain(at..at + k);
                let mut steps = plan.steps.clone();
                steps[i] = Step::Write(fewer);
                out.push(Plan { seed: plan.seed, steps });
            }
        }
    }
    out
}

/// Shrinks the stream of `seed`; a text saying what is left (or that it does not reproduce).
pub async fn shrink(start: impl Fn() -> Parsnip, seed: u64, marker: &str, skip: &[String]) -> String {
    let plan = stream::plan(seed);
    let p = start();
    let mut c = Checker { start, p, marker, skip, checks: 0, last: String::new() };
    let mut class = None;
    for _ in 0..3 {
        class = c.outcome(&plan).await;
        if class.is_some() {
            break;
        }
    }
    let Some(class) = class else {
        return format!("  seed {seed:#018x}: does not reproduce alone, nothing to shrink\n");
    };
    let mut best = plan;
    let deadline = Instant::now() + Duration::from_secs(240);
    'outer: loop {
        for cand in candidates(&best) {
            if Instant::now() > deadline {
                break 'outer;
            }
            if c.still(&cand, &class).await {
                best = cand;
                continue 'outer;
            }
        }
        break;
    }
    let bytes: Vec<u8> = best.steps.iter().flat_map(|s| s.bytes()).collect();
    let mut out = format!("  seed {seed:#018x}: {class}\n    shrunk ({} checks) to:\n", c.checks);
    for d in best.describe() {
        out.push_str(&format!("      {d}\n"));
    }
    out.push_str(&format!("    bytes after the login: {}\n", hex_cut(&bytes[plan_login_len(&best)..], 512)));
    // The shrunk stream's failure, as seen once more.
    if c.outcome(&best).await.is_some() {
        out.push_str(&c.last);
    }
    out
}

/// Bytes of the startup write when the plan logs in properly.
fn plan_login_len(plan: &Plan) -> usize {
    match (plan.steps.first(), plan.steps.get(1)) {
        (Some(s @ Step::Write(_)), Some(Step::Login)) => s.bytes().len(),
        _ => 0,
    }
}
