//! A small timing loop for the micro-benchmarks (no benchmark framework needed): warm up,
//! then several timed runs, and the median time per iteration printed.

use std::time::{Duration, Instant};

/// Runs `f` repeatedly and prints the median of 7 runs of `iters` iterations, in ns per
/// iteration, under `name`.
pub fn bench(name: &str, iters: u32, mut f: impl FnMut()) {
    for _ in 0..iters / 10 + 1 {
        f();
    }
    let mut runs: Vec<Duration> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed()
        })
        .collect();
    runs.sort();
    let median = runs[runs.len() / 2];
    let ns = median.as_nanos() as f64 / f64::from(iters);
    println!("{name:<48} {ns:>10.1} ns/iter   (median of 7 x {iters})");
}
