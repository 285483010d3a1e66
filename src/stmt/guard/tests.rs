//! The guard against a model server: each parameter class has a custom-plan time (what an
//! execution as sent takes, planning included) and a generic-plan time, and the model's
//! cached statement switches to its generic plan after five cached executions, as
//! PostgreSQL's plan cache may. Times carry noise (lognormal, 15 %) and rare stalls (30×).

use super::*;

/// One parameter class: µs with a custom plan, µs with the generic plan.
#[derive(Clone, Copy)]
struct Class(f64, f64);

struct Model {
    rng: u64,
    cached_runs: u64,
    /// Lognormal noise (σ of the logarithm), and stalls: how often, and how much longer.
    noise: f64,
    stalls: (f64, f64),
    /// Mean of an exponential wait added to every execution, µs (a saturated machine's run
    /// queue: as long for a cheap execution as for a dear one).
    wait_us: f64,
}

impl Model {
    fn new(seed: u64) -> Model {
        Model { rng: seed | 1, cached_runs: 0, noise: 0.15, stalls: (0.002, 30.0), wait_us: 0.0 }
    }

    /// A busy machine: wide noise, and one execution in five stalled 2 to 8 times longer
    /// (descheduled, queued behind others).
    fn loaded(seed: u64) -> Model {
        Model { noise: 0.5, stalls: (0.2, 0.0), ..Model::new(seed) }
    }

    /// A saturated machine: every execution also waits its turn for a CPU, on average
    /// `wait_us`, which hides most of what the cache saves from the times.
    fn saturated(seed: u64, wait_us: f64) -> Model {
        Model { noise: 0.3, wait_us, ..Model::new(seed) }
    }

    fn next(&mut self) -> f64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn run(&mut self, c: Class, cached: bool) -> u64 {
        let base = if cached && self.cached_runs >= 5 { c.1 } else { c.0 };
        if cached {
            self.cached_runs += 1;
        }
        // Box-Muller for the noise.
        let (u, v) = (self.next().max(1e-12), self.next());
        let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
        let (p, x) = self.stalls;
        let stall = match self.next() < p {
            false => 1.0,
            true if x > 0.0 => x,
            true => 2.0 + 6.0 * self.next(),
        };
        let wait = -self.wait_us * (1.0 - self.next()).ln();
        (base * (self.noise * z).exp() * stall + wait).max(1.0) as u64
    }
}

/// What a run of `n` executions came to.
struct Run {
    /// Execution numbers at which the guard demoted the text.
    demoted_at: Vec<usize>,
    /// Execution numbers at which it retried the cache.
    retried_at: Vec<usize>,
    /// Each execution's time.
    times: Vec<u64>,
    /// Executions run as sent.
    as_sent: usize,
}

fn simulate(seed: u64, n: usize, class_of: impl FnMut(usize, f64) -> Class) -> Run {
    simulate_on(Model::new(seed), seed, n, class_of)
}

fn simulate_on(mut m: Model, seed: u64, n: usize, mut class_of: impl FnMut(usize, f64) -> Class) -> Run {
    let mut g = Guard::new(GuardConfig::default());
    let mut run = Run { demoted_at: vec![], retried_at: vec![], times: vec![], as_sent: 0 };
    for i in 0..n {
        let r = m.next();
        let c = class_of(i, r);
        let plain = sampled(seed, i as u64, g.one_in());
        let us = m.run(c, !plain);
        run.times.push(us);
        run.as_sent += usize::from(plain);
        match g.record(!plain, us) {
            Some(Verdict::Demoted { .. }) => run.demoted_at.push(i),
            Some(Verdict::Retried) => run.retried_at.push(i),
            None => {}
        }
    }
    run
}

const WIDE: Class = Class(150_000.0, 40_000.0);
const NARROW: Class = Class(120.0, 6_000.0);

fn mean(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len() as f64
}

#[test]
fn a_generic_plan_slow_for_the_new_range_is_demoted_within_fifty_executions() {
    // bench/generic_plan.sh's shape: a few wide ranges, then the narrow one again and again.
    for seed in 1..=20 {
        let run = simulate(seed, 4000, |i, _| if i < 6 { WIDE } else { NARROW });
        let first = *run.demoted_at.first().unwrap_or_else(|| panic!("seed {seed}: never demoted"));
        assert!(first < 6 + 50, "seed {seed}: demoted only at execution {first}");
        // And it stays there: retries meet the generic plan again and are demoted again.
        let after = mean(&run.times[56..]);
        assert!(after < 1.5 * NARROW.0, "seed {seed}: narrow executions averaged {after:.0} µs");
        assert!(run.retried_at.len() >= 2, "seed {seed}: retried {:?}", run.retried_at);
        assert!(run.demoted_at.len() > run.retried_at.len().saturating_sub(1));
    }
}

#[test]
fn a_shift_after_a_long_history_is_demoted_within_fifty_executions() {
    for seed in 1..=20 {
        let run = simulate(seed, 8000, |i, _| if i < 5000 { WIDE } else { NARROW });
        assert!(run.demoted_at.iter().all(|&i| i >= 5000), "seed {seed}: demoted while the generic plan was faster");
        let first = run.demoted_at.first().copied().unwrap_or(usize::MAX);
        assert!(first < 5050, "seed {seed}: demoted only at execution {first}");
    }
}

#[test]
fn a_generic_plan_faster_for_the_mix_is_never_demoted() {
    for seed in 1..=10 {
        let run = simulate(seed, 20_000, |_, _| Class(1_000.0, 300.0));
        assert_eq!(run.demoted_at, Vec::<usize>::new(), "seed {seed}");
        // The baseline costs little: about one execution in fifty runs as sent.
        assert!(run.as_sent < 20_000 / 30, "seed {seed}: {} executions ran as sent", run.as_sent);
    }
}

#[test]
fn a_generic_plan_faster_for_most_and_a_little_slower_for_some_is_kept() {
    for seed in 1..=10 {
        let run = simulate(seed, 20_000, |_, r| if r < 0.9 { Class(1_000.0, 400.0) } else { Class(2_000.0, 2_600.0) });
        assert_eq!(run.demoted_at, Vec::<usize>::new(), "seed {seed}");
    }
}

#[test]
fn a_skewed_mix_with_no_difference_is_never_demoted() {
    // Fast and slow parameter values at random, the cache as good as a fresh plan: the
    // spread of the mix must not look like a regression.
    for seed in 1..=10 {
        for share in [0.5, 0.9, 0.98] {
            let run =
                simulate(seed, 30_000, |_, r| if r < share { Class(150.0, 110.0) } else { Class(100_000.0, 98_000.0) });
            assert_eq!(run.demoted_at, Vec::<usize>::new(), "seed {seed}, share {share}");
        }
    }
}

#[test]
fn a_generic_plan_much_slower_for_half_the_values_is_demoted() {
    for seed in 1..=10 {
        let run = simulate(seed, 6_000, |_, r| if r < 0.5 { Class(200.0, 150.0) } else { Class(300.0, 8_000.0) });
        // A mix's spread makes the test need more samples than a clear shift does.
        let first = run.demoted_at.first().copied().unwrap_or(usize::MAX);
        assert!(first < 5_000, "seed {seed}: demoted at {first}");
    }
}

#[test]
fn demotions_in_a_row_last_longer() {
    let run = simulate(7, 20_000, |_, _| Class(100.0, 5_000.0));
    let d = &run.demoted_at;
    let r = &run.retried_at;
    assert!(d.len() >= 3 && r.len() >= 2, "{d:?} {r:?}");
    assert!(r[0] - d[0] >= RETRY as usize && r[1] - d[1] >= 2 * RETRY as usize, "{d:?} {r:?}");
}

#[test]
fn sampling_follows_no_pattern_of_the_execution_numbers() {
    // An application alternating two kinds of values: both get sampled about equally.
    let (mut even, mut odd) = (0, 0);
    for seq in 0..64_000u64 {
        if sampled(42, seq, 64) {
            if seq % 2 == 0 { even += 1 } else { odd += 1 }
        }
    }
    assert!((400..600).contains(&even) && (400..600).contains(&odd), "{even} {odd}");
    assert!(sampled(1, 5, 1) && !sampled(1, 5, 0));
}

#[test]
fn a_shift_the_cached_times_do_not_show_is_caught_while_the_text_is_young() {
    // The generic plan scans: as slow for the narrow range as a custom plan was for the
    // wide ones, so only as-sent samples of the narrow range can show it.
    for seed in 1..=20 {
        let run = simulate(seed, 600, |i, _| if i < 20 { Class(38_000.0, 34_000.0) } else { Class(120.0, 34_000.0) });
        let first = run.demoted_at.first().copied().unwrap_or(usize::MAX);
        assert!((20..20 + 50).contains(&first), "seed {seed}: demoted at {first}");
    }
}

#[test]
fn on_a_loaded_machine_sampling_stays_cheap() {
    // A plan-heavy query (planning 3 times its execution, which the cache saves) on a busy
    // machine: the noise must not keep the guard probing, which would spend on planning
    // what the cache saves.
    for seed in 1..=10 {
        let run = simulate_on(Model::loaded(seed), seed, 20_000, |_, _| Class(1_000.0, 250.0));
        assert!(run.demoted_at.is_empty(), "seed {seed}: demoted at {:?}", run.demoted_at);
        let share = run.as_sent as f64 / 20_000.0;
        assert!(share < 0.012, "seed {seed}: {:.1} % of executions ran as sent", share * 100.0);
    }
}

#[test]
fn on_a_saturated_machine_sampling_stays_cheap() {
    // The same query where every execution also waits for a CPU (1.5 ms on average): the
    // times barely show the cache's gain, and the waits come in every length.
    for seed in 1..=10 {
        let run = simulate_on(Model::saturated(seed, 1_500.0), seed, 20_000, |_, _| Class(1_000.0, 250.0));
        assert!(run.demoted_at.is_empty(), "seed {seed}: demoted at {:?}", run.demoted_at);
        let share = run.as_sent as f64 / 20_000.0;
        assert!(share < 0.012, "seed {seed}: {:.1} % of executions ran as sent", share * 100.0);
    }
}
