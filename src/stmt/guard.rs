//! The plan guard (issue 24): decides, for one promoted or autoprepared statement text,
//! which executions run as the client sent them (unnamed Parse/Bind/Execute, custom-planned
//! by PostgreSQL every time) rather than from the cache (a named server statement, which
//! PostgreSQL may run with a *generic* plan after five executions), and when the cache is
//! reliably slower than that baseline, so that the text is demoted: run as sent, and tried
//! from the cache again later.
//!
//! Pure and clock-free: it is told each execution's server time and whether it ran from the
//! cache (`Guard::record`) and answers how often the next executions should run as sent
//! (`Guard::one_in`). `registry::Statement` keeps one behind a mutex the session only ever
//! `try_lock`s (a sample another thread is recording meanwhile is dropped, nobody waits).
//!
//! The decision (docs/design.md, "The plan guard", gives the reasoning):
//! * Samples are drawn at random (the session hashes a per-statement counter), never by
//!   parameter value, so cached and as-sent executions are draws from the same stream of
//!   parameters, and both kinds are compared over the same executions: the newest `RECENT`
//!   and the whole window of `WINDOW`.
//! * Two tests, either may find the cache slower: per execution (logarithms of the times,
//!   so a statement whose executions take 0.1 and 100 ms is not judged by its slowest
//!   alone) by more than `ratio`, and in total (the times themselves) by more than `ratio`.
//!   Each needs `MIN_SAMPLES` of each kind, a difference of at least `MIN_GAIN_US` µs, and
//!   more than `Z` standard errors, the variance taken over both kinds together (what the
//!   difference would vary by if the cache made none: the samples' labels are random), so
//!   a mix of fast and slow parameter values has a wide spread and needs a large,
//!   consistent difference.
//! * A first finding empties the window and asks for a second one on fresh samples (a
//!   chance finding rarely repeats); only that one demotes.
//! * Sampling is cheap in the steady state (1 in `sample_one_in`, reached after
//!   8 × `sample_one_in` executions: one in executions/8 before (the caller counts those
//!   it has chosen for too, not only those recorded: `registry::GuardCell`), so a young
//!   text's first change of parameters is seen soon; both spaced further by the cache's *gain*, how
//!   many times faster than as sent it ran at the last test that found nothing, up to
//!   `MAX_GAIN`: an as-sent sample costs about that many cached executions, and a cache
//!   that wins by that much needs a larger change to lose) and denser (1 in 2)
//!   during a *probe*, until `PROBE` as-sent samples are in: when the statement is new,
//!   every `PERIOD` executions, after a first finding or a retry, while the figures lean
//!   towards the cache being slower, and when the cached times shift (`SHIFT_RUN`
//!   executions in a row far from the recent ones: a new parameter mix, or a new plan; at
//!   most once in `SHIFT_EVERY` × gain executions), which also forgets the window before
//!   the shift.
//! * A demoted text is tried from the cache again after `RETRY` executions, doubling with
//!   each demotion in a row (up to 64 times): PostgreSQL keeps a generic-plan choice for the
//!   server statement, so a retry that meets it again is demoted again at the first finding.

/// Executions the decision looks back over.
pub(crate) const WINDOW: usize = 64;
/// The newest executions it also looks at alone (a change shows there first).
const RECENT: usize = 16;
/// Samples of each kind the decision needs.
pub(crate) const MIN_SAMPLES: u32 = 4;
/// Standard errors the difference must exceed.
const Z: f64 = 3.5;
/// The least spread (as a logarithm, about 25 %) assumed of either kind: a few samples that
/// happen to agree closely do not make a difference look certain.
const MIN_SPREAD: f64 = 0.223;
/// The least difference between the two kinds' mean times worth demoting for, µs.
pub(crate) const MIN_GAIN_US: f64 = 100.0;
/// As-sent samples a probe collects (sampling one execution in two meanwhile).
pub(crate) const PROBE: u32 = 8;
/// A probe every this many executions.
pub(crate) const PERIOD: u64 = 4096;
/// Executions a demotion lasts at first.
pub(crate) const RETRY: u64 = 1000;
/// A cached execution this far (as a logarithm) from the recent ones' mean, and beyond four
/// mean absolute deviations, counts towards a shift.
const SHIFT: f64 = 1.099; // ln 3
/// Deviating cached executions in a row that make a shift.
const SHIFT_RUN: usize = 4;
/// Executions between two probes a shift starts.
const SHIFT_EVERY: u64 = 256;

/// The guard's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuardConfig {
    /// One execution in this many runs as sent in the steady state (0: no guard).
    pub sample_one_in: u32,
    /// The cached time must exceed the baseline by this factor.
    pub ratio: f64,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig { sample_one_in: 256, ratio: 1.5 }
    }
}

/// What one execution changed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// The text is demoted: cached executions took `cached_us`, as-sent ones `as_sent_us`
    /// (geometric means over the window).
    Demoted { cached_us: u64, as_sent_us: u64 },
    /// A demotion ended: the cache is tried again.
    Retried,
}

/// The window: the last `WINDOW` executions' log-times, with a count per kind.
#[derive(Clone, Debug)]
struct Window {
    /// Log-times.
    x: [f32; WINDOW],
    /// Times, µs.
    t: [f32; WINDOW],
    /// Bit i: entry i ran from the cache.
    cached: u64,
    len: usize,
    head: usize,
    /// Entries [as sent, cached].
    n: [u32; 2],
}

impl Default for Window {
    fn default() -> Self {
        Window { x: [0.0; WINDOW], t: [0.0; WINDOW], cached: 0, len: 0, head: 0, n: [0; 2] }
    }
}

/// Mean and variance of some log-times, per kind.
#[derive(Clone, Copy, Debug, Default)]
struct Moments {
    n: [u32; 2],
    s: [f64; 2],
    s2: [f64; 2],
}

impl Moments {
    fn add(&mut self, k: usize, x: f64) {
        self.n[k] += 1;
        self.s[k] += x;
        self.s2[k] += x * x;
    }

    /// Mean and variance of kind `k`.
    fn of(&self, k: usize) -> (f64, f64) {
        let n = f64::from(self.n[k].max(1));
        let mean = self.s[k] / n;
        let var = if self.n[k] > 1 { ((self.s2[k] - n * mean * mean) / (n - 1.0)).max(0.0) } else { 0.0 };
        (mean, var)
    }

    /// How far the cached mean exceeds `factor` times the as-sent one (plus `shift`), in
    /// standard errors of the difference. The variance is that of both kinds taken
    /// together, at least `floor`²: which executions run as sent is drawn at random, so
    /// if the cache made no difference the labels would be exchangeable, and this is the
    /// spread the difference would then have (a permutation test's). Unlike the variance
    /// within each kind, it cannot come out tiny because a few samples of a mix of fast
    /// and slow parameter values happen to fall all on one side.
    fn excess(&self, factor: f64, shift: f64, floor: f64) -> f64 {
        let (np, nc) = (f64::from(self.n[0]), f64::from(self.n[1]));
        let (mp, mc) = (self.s[0] / np, self.s[1] / nc);
        let n = np + nc;
        let mean = (self.s[0] + self.s[1]) / n;
        let var = ((self.s2[0] + self.s2[1] - n * mean * mean) / (n - 1.0)).max(floor * floor);
        let se = (var * (1.0 / nc + 1.0 / np)).sqrt();
        (mc - mp * factor - shift) / se
    }
}

impl Window {
    fn kind(&self, j: usize) -> usize {
        usize::from(self.cached >> j & 1 == 1)
    }

    fn push(&mut self, cached: bool, us: f64) {
        if self.len == WINDOW {
            let k = self.kind(self.head);
            self.n[k] -= 1;
        } else {
            self.len += 1;
        }
        self.x[self.head] = us.max(1.0).ln() as f32;
        self.t[self.head] = us as f32;
        self.cached = (self.cached & !(1 << self.head)) | (u64::from(cached) << self.head);
        self.n[usize::from(cached)] += 1;
        self.head = (self.head + 1) % WINDOW;
    }

    /// How many times faster cached executions ran than as-sent ones over the window (the
    /// ratio of their geometric means, within 1..=`MAX_GAIN`), if it holds enough of each.
    fn gain(&self) -> Option<f64> {
        let (logs, _) = self.moments(WINDOW);
        if logs.n[0] < MIN_SAMPLES || logs.n[1] < MIN_SAMPLES {
            return None;
        }
        Some((logs.of(0).0 - logs.of(1).0).exp().clamp(1.0, MAX_GAIN))
    }

    /// Keeps only the newest `keep` entries.
    fn keep_last(&mut self, keep: usize) {
        let keep = keep.min(self.len);
        let mut kept = Window::default();
        for i in (0..keep).rev() {
            let j = (self.head + WINDOW - 1 - i) % WINDOW;
            kept.push(self.kind(j) == 1, f64::from(self.t[j]));
        }
        *self = kept;
    }

    /// The moments of the newest `last` entries: of their log-times, and of their times.
    fn moments(&self, last: usize) -> (Moments, Moments) {
        let (mut m, mut r) = (Moments::default(), Moments::default());
        for i in 0..last.min(self.len) {
            let j = (self.head + WINDOW - 1 - i) % WINDOW;
            let k = self.kind(j);
            m.add(k, f64::from(self.x[j]));
            r.add(k, f64::from(self.t[j]));
        }
        (m, r)
    }
}

/// The guard of one statement text. See the module doc.
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    cfg: GuardConfig,
    w: Window,
    /// Executions recorded.
    execs: u64,
    /// As-sent samples the current probe still wants.
    probe_left: u32,
    /// Times a probe was started or asked for more (`arm`): what tells `GuardCell` to
    /// allow `probe_left` choices again.
    arms: u32,
    /// When the next periodic probe starts (in executions).
    next_probe: u64,
    /// Recent cached log-times: a moving mean and mean absolute deviation, updated with
    /// deviations clipped to the shift threshold (shift detection).
    recent: Option<(f64, f64)>,
    /// The last cached executions deviated this way (+1 slower, -1 faster, 0 not), this
    /// many in a row.
    deviated: (i8, u8),
    /// When the last shift started a probe (in executions).
    shifted_at: Option<u64>,
    /// A first test found the cache slower at this execution: the window was emptied and
    /// a second test on fresh samples must confirm it.
    suspect: Option<u64>,
    /// While demoted: until which execution, and the two figures that demoted it.
    demoted: Option<(u64, u64, u64)>,
    /// Demotions in a row (a retry that ends in another demotion).
    streak: u32,
    /// When the last retry began: a retry that lasts `RETRY` executions ends the streak.
    retried_at: Option<u64>,
    /// Cached executions since the tests last ran (they run at each as-sent sample, and
    /// every `EVAL_EVERY` cached ones: a cached sample moves the figures little).
    since_eval: u32,
    /// How many times faster the cache ran than the as-sent samples, per execution, at the
    /// last test that found nothing (1 while unknown, leaning or suspect; at most
    /// `MAX_GAIN`): sampling and shift probes are spaced by it (module doc).
    gain: f64,
}

/// The most the spacing of samples and shift probes grows by for a cache that wins.
const MAX_GAIN: f64 = 16.0;

/// Cached executions between two runs of the tests, when nothing else prompts one.
const EVAL_EVERY: u32 = 8;

impl Guard {
    /// A guard for a text just promoted: it starts with a probe (no baseline yet).
    pub(crate) fn new(cfg: GuardConfig) -> Guard {
        Guard {
            cfg,
            w: Window::default(),
            execs: 0,
            probe_left: PROBE,
            arms: 0,
            next_probe: PERIOD,
            recent: None,
            deviated: (0, 0),
            shifted_at: None,
            suspect: None,
            demoted: None,
            streak: 0,
            retried_at: None,
            since_eval: 0,
            gain: 1.0,
        }
    }

    /// How often the next executions should run as sent: 1 every time (demoted), else one
    /// in this many (chosen at random by the caller).
    pub(crate) fn one_in(&self) -> u32 {
        if self.demoted.is_some() {
            1
        } else if self.probe_left > 0 {
            2
        } else {
            // Denser while the text is young (one in execs/8): a change of parameters soon
            // after it was promoted, which the cached times may not show (a generic plan
            // as slow for the new values as a custom one was for the old), is seen within
            // a few dozen executions; then 1 in `sample_one_in`.
            // A cache that wins by `gain` spaces them by it too: each as-sent sample costs
            // about `gain` cached executions.
            young_one_in(self.execs, self.steady())
        }
    }

    /// The rate sampling grows to once the text is no longer young (`one_in`); None while
    /// demoted or probing, when the rate does not depend on the executions so far.
    pub(crate) fn steady_one_in(&self) -> Option<u32> {
        (self.demoted.is_none() && self.probe_left == 0).then(|| self.steady())
    }

    /// One in `sample_one_in`, spaced by the cache's gain.
    fn steady(&self) -> u32 {
        ((f64::from(self.cfg.sample_one_in) * self.gain) as u32).max(2)
    }

    /// A probe wants at least `n` more as-sent samples.
    fn arm(&mut self, n: u32) {
        self.probe_left = self.probe_left.max(n);
        self.arms = self.arms.wrapping_add(1);
    }

    /// The probe: (times armed, as-sent samples it still wants; 0: none running). Samples
    /// are chosen long before they are recorded when clients queue for a server: the
    /// caller lets no more be chosen than the probe wants until it is armed again
    /// (`registry::GuardCell`).
    pub(crate) fn probe(&self) -> (u32, u32) {
        (self.arms, self.probe_left)
    }

    /// While demoted: (cached µs, as-sent µs) that demoted it.
    pub(crate) fn demotion(&self) -> Option<(u64, u64)> {
        self.demoted.map(|(_, c, p)| (c, p))
    }

    /// The mean times over the window now: (cached µs, as-sent µs), 0 for a kind with no
    /// sample.
    pub(crate) fn means(&self) -> (u64, u64) {
        let (_, r) = self.w.moments(WINDOW);
        let g = |k: usize| if r.n[k] == 0 { 0 } else { r.of(k).0.round() as u64 };
        (g(1), g(0))
    }

    /// One execution took `us` µs on the server, from the cache or as sent.
    pub(crate) fn record(&mut self, cached: bool, us: u64) -> Option<Verdict> {
        self.execs += 1;
        if !cached {
            self.probe_left = self.probe_left.saturating_sub(1);
        }
        let us = us as f64;
        if let Some((until, _, _)) = self.demoted {
            self.w.push(cached, us);
            if self.execs < until {
                return None;
            }
            self.demoted = None;
            self.retried_at = Some(self.execs);
            // Found slower before: one test on the samples to come is enough to demote again.
            self.suspect = Some(self.execs);
            // (No probe runs while demoted: `demote` ended it.)
            self.arm(PROBE);
            self.next_probe = self.execs + PERIOD;
            self.recent = None;
            return Some(Verdict::Retried);
        }
        if self.retried_at.is_some_and(|at| self.execs >= at + RETRY) {
            self.retried_at = None;
            self.streak = 0;
        }
        self.w.push(cached, us);
        if cached {
            self.note_shift(us.max(1.0).ln());
        }
        if self.execs >= self.next_probe {
            self.next_probe = self.execs + PERIOD;
            self.arm(PROBE);
        }
        self.since_eval += 1;
        if cached && self.suspect.is_none() && self.since_eval < EVAL_EVERY {
            return None;
        }
        self.since_eval = 0;
        self.decide()
    }

    /// Cached executions far from the recent ones (beyond four mean absolute deviations
    /// and a factor of 3), `SHIFT_RUN` in a row in the same direction: the parameters or the
    /// plan changed. The window before them is forgotten and a probe samples the new state,
    /// at most once in `SHIFT_EVERY` executions: on a busy machine, stalls come in runs too,
    /// and probing each would spend on planning what the cache saves.
    fn note_shift(&mut self, x: f64) {
        let Some((mean, dev)) = self.recent else {
            self.recent = Some((x, 0.0));
            return;
        };
        let limit = (4.0 * dev).max(SHIFT);
        let d = x - mean;
        let dir = if d.abs() > limit { d.signum() as i8 } else { 0 };
        let run = if dir != 0 && dir == self.deviated.0 { self.deviated.1.saturating_add(1) } else { 1 };
        self.deviated = (dir, run);
        if dir != 0 && usize::from(run) >= SHIFT_RUN {
            self.w.keep_last(SHIFT_RUN);
            self.deviated = (0, 0);
            self.recent = Some((x, 0.0));
            let every = (SHIFT_EVERY as f64 * self.gain) as u64;
            if self.shifted_at.is_none_or(|at| self.execs >= at + every) {
                self.shifted_at = Some(self.execs);
                self.arm(PROBE);
            }
            return;
        }
        if dir == 0 {
            // An eighth at a time; a deviating execution leaves the reference as it is (a
            // stall does not widen it, and the next execution is compared with the same).
            self.recent = Some((mean + d / 8.0, dev + (d.abs() - dev) / 8.0));
        }
    }

    /// Tests the newest `RECENT` executions and the whole window: demotes when a test finds
    /// the cache reliably slower a second time on fresh samples; keeps probing while the
    /// figures say slower but not reliably.
    fn decide(&mut self) -> Option<Verdict> {
        if self.w.n[0] < MIN_SAMPLES || self.w.n[1] < MIN_SAMPLES {
            return self.unsuspect();
        }
        let ratio = self.cfg.ratio.max(1.0);
        let mut leaning = false;
        let mut slower = None;
        for last in [RECENT, WINDOW] {
            let (logs, times) = self.w.moments(last);
            if logs.n[0] < MIN_SAMPLES || logs.n[1] < MIN_SAMPLES {
                continue;
            }
            let (cached_us, as_sent_us) = (times.of(1).0, times.of(0).0);
            if cached_us - as_sent_us < MIN_GAIN_US {
                continue;
            }
            // Per execution (logarithms), and in total (times, whose spread is taken to
            // be at least a quarter of the as-sent mean).
            let per_execution = logs.excess(1.0, ratio.ln(), MIN_SPREAD);
            let in_total = times.excess(ratio, 0.0, as_sent_us / 4.0);
            if per_execution > Z || in_total > Z {
                slower = Some((cached_us.round() as u64, as_sent_us.round() as u64));
                break;
            }
            leaning |= per_execution > 0.0 || in_total > 0.0;
        }
        self.gain = match (slower, leaning) {
            (None, false) => self.w.gain().unwrap_or(self.gain),
            _ => 1.0,
        };
        match slower {
            Some((c, p)) if self.suspect.is_some() => Some(self.demote(c, p)),
            Some(_) => {
                self.suspect = Some(self.execs);
                self.w.keep_last(0);
                self.arm(PROBE);
                None
            }
            None => {
                if leaning {
                    self.arm(MIN_SAMPLES);
                }
                self.unsuspect()
            }
        }
    }

    /// A suspicion no test confirmed within a window's executions is dropped.
    fn unsuspect(&mut self) -> Option<Verdict> {
        if self.suspect.is_some_and(|at| self.execs > at + WINDOW as u64) {
            self.suspect = None;
        }
        None
    }

    fn demote(&mut self, cached_us: u64, as_sent_us: u64) -> Verdict {
        let lasts = RETRY << self.streak.min(6);
        self.streak += 1;
        self.retried_at = None;
        self.suspect = None;
        self.demoted = Some((self.execs + lasts, cached_us, as_sent_us));
        self.gain = 1.0;
        self.probe_left = 0;
        Verdict::Demoted { cached_us, as_sent_us }
    }
}

/// One in `execs`/8, from 2 up to `steady` (`Guard::one_in` while the text is young).
pub(crate) fn young_one_in(execs: u64, steady: u32) -> u32 {
    u32::try_from(execs / 8).unwrap_or(u32::MAX).clamp(2, steady.max(2))
}

/// Whether execution number `seq` of the statement with id `id` runs as sent when one in
/// `one_in` should: a hash of the two, so the choice follows no pattern in the parameters.
#[inline]
pub(crate) fn sampled(id: u64, seq: u64, one_in: u32) -> bool {
    match one_in {
        0 => false,
        1 => true,
        n => {
            // splitmix64's finalizer.
            let mut z = seq.wrapping_add(id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            z.is_multiple_of(u64::from(n))
        }
    }
}

#[cfg(test)]
mod tests;
