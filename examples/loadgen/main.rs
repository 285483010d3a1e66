//! A load generator that holds thousands of PostgreSQL clients on a small machine (issue 26),
//! where pgbench's one connection-and-poll loop per thread and its reporting fall short: it
//! owns the run's phases (ramp every client in with retries, let them idle, warm up, measure,
//! stop), the clients' loops on a few single-threaded event loops, and the report: one JSON
//! line on stdout with TPS, latency percentiles, fairness (the longest wait of any client
//! between the starts of its transactions, the fewest transactions any client completed),
//! its own CPU time, and optionally the RSS of a process it watches (a pooler) while every
//! client sat idle. The protocol it speaks is in `wire.rs`. `bench/run.py --client loadgen`
//! runs it; docs/benchmarks.md has the commands.
//!
//! `cargo run --release --example loadgen -- --port 6432 --dbname bench -c 1000 -T 10 -M prepared`

mod client;
mod wire;

use clap::Parser;
use client::{ClientResult, Phase, Shared};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use wire::{Mode, Workload};

#[derive(Parser, Debug, Clone)]
#[command(about = "Holds N PostgreSQL clients running pgbench-like transactions; prints one JSON line")]
pub struct Args {
    /// Host: an address, or a directory holding the server's unix socket (starts with '/').
    #[arg(long, short = 'H', default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, short = 'p', default_value_t = 5432)]
    pub port: u16,
    #[arg(long, short = 'U', default_value = "postgres")]
    pub user: String,
    #[arg(long, short = 'd', default_value = "postgres")]
    pub dbname: String,
    /// Clients (connections) to hold.
    #[arg(long, short = 'c', default_value_t = 10)]
    pub clients: usize,
    /// Event-loop threads; clients are dealt round-robin (as pgbench -j).
    #[arg(long, short = 'j', default_value_t = 2)]
    pub threads: usize,
    #[arg(long, value_enum, default_value = "select")]
    pub workload: Workload,
    /// Protocol mode, as pgbench -M.
    #[arg(long, short = 'M', value_enum, default_value = "simple")]
    pub mode: Mode,
    /// Seconds measured, after every client has connected (and after --warmup).
    #[arg(long, short = 'T', default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of transactions before the measurement starts (not counted).
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Milliseconds each client waits between its transactions.
    #[arg(long, default_value_t = 0.0)]
    pub think_ms: f64,
    /// pgbench's scale (aid in 1..=100000*scale); default: count(*) of pgbench_branches.
    #[arg(long, short = 's')]
    pub scale: Option<i64>,
    /// Logins in flight at once, all threads together.
    #[arg(long, default_value_t = 64)]
    pub connect_concurrency: usize,
    /// Seconds the whole ramp (every client logged in) may take before the run fails.
    #[arg(long, default_value_t = 120.0)]
    pub connect_timeout: f64,
    /// A process (a pooler) whose RSS is read before the ramp and once every client is idle.
    #[arg(long)]
    pub watch_pid: Option<u32>,
    /// Seconds to wait with every client idle before reading --watch-pid's RSS.
    #[arg(long, default_value_t = 2.0)]
    pub idle_settle: f64,
    /// Print every measured transaction slower than this many milliseconds on stderr (when
    /// it started, from the window's start; its client; its thread): where a tail comes from.
    #[arg(long)]
    pub slow_ms: Option<f64>,
}

fn main() {
    let args = Args::parse();
    let (fd_soft, fd_hard) = raise_nofile();
    let need = args.clients as u64 + 64;
    if fd_soft < need {
        fail(&format!("RLIMIT_NOFILE is {fd_soft} (hard {fd_hard}); {need} file descriptors needed"));
    }
    let scale = match args.scale {
        Some(s) => s,
        None => match client::detect_scale(&args) {
            Ok(s) => s,
            Err(e) => fail(&format!("could not read pgbench's scale: {e}")),
        },
    };
    let shared = Arc::new(Shared::new(args.clone(), scale));
    let threads = args.threads.clamp(1, args.clients.max(1));
    let rss_before = args.watch_pid.and_then(rss_kib);
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..threads {
        let shared = shared.clone();
        let tx = tx.clone();
        let ids: Vec<usize> = (t..args.clients).step_by(threads).collect();
        let spawned = std::thread::Builder::new().name(format!("loadgen-{t}")).spawn(move || {
            let out = client::run_thread(shared, ids, threads);
            let _ = tx.send(out);
        });
        if let Err(e) = spawned {
            fail(&format!("could not start a thread: {e}"));
        }
    }
    drop(tx);

    // Ramp: wait until every client is in, or one has given up.
    let deadline = t0 + Duration::from_secs_f64(args.connect_timeout);
    loop {
        if let Some(e) = shared.first_error() {
            shared.set_phase(Phase::Stop);
            fail(&format!("a client could not log in: {e}"));
        }
        if shared.connected.load(Ordering::Acquire) >= args.clients {
            break;
        }
        if Instant::now() > deadline {
            let n = shared.connected.load(Ordering::Acquire);
            shared.set_phase(Phase::Stop);
            fail(&format!("only {n} of {} clients logged in within {}s", args.clients, args.connect_timeout));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ramp_s = t0.elapsed().as_secs_f64();
    eprintln!("loadgen: {} clients in after {ramp_s:.1}s", args.clients);
    let (rss_idle, self_rss_idle) = if args.watch_pid.is_some() {
        std::thread::sleep(Duration::from_secs_f64(args.idle_settle));
        (args.watch_pid.and_then(rss_kib), rss_kib(std::process::id()))
    } else {
        (None, rss_kib(std::process::id()))
    };

    shared.set_phase(Phase::Warmup);
    std::thread::sleep(Duration::from_secs_f64(args.warmup));
    let cpu0 = cpu_s();
    shared.start_window();
    std::thread::sleep(Duration::from_secs_f64(args.duration));
    let window = shared.end_window();
    let cpu1 = cpu_s();
    let rss_end = args.watch_pid.and_then(rss_kib);

    // Every client finishes the transaction it is in, then says goodbye.
    let grace = Duration::from_secs(15) + Duration::from_millis(args.clients as u64);
    let until = Instant::now() + grace;
    let mut results: Vec<client::ThreadResult> = Vec::new();
    while results.len() < threads {
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(r) => results.push(r),
            Err(_) => fail(&format!("clients still busy {}s after the end of the run (hung)", grace.as_secs())),
        }
    }
    report(&args, scale, ramp_s, window, cpu1 - cpu0, &results, [rss_before, rss_idle, rss_end, self_rss_idle]);
}

/// Prints the run's JSON line.
fn report(
    args: &Args,
    scale: i64,
    ramp_s: f64,
    window: Duration,
    cpu: f64,
    results: &[client::ThreadResult],
    [rss_before, rss_idle, rss_end, self_rss]: [Option<u64>; 4],
) {
    let mut lat: Vec<u32> = results.iter().flat_map(|r| r.latencies_us.iter().copied()).collect();
    lat.sort_unstable();
    let clients: Vec<&ClientResult> = results.iter().flat_map(|r| r.clients.iter()).collect();
    let txns: u64 = clients.iter().map(|c| c.txns).sum();
    let failed: u64 = clients.iter().map(|c| c.failed).sum();
    let aborted: Vec<&str> = clients.iter().filter_map(|c| c.aborted.as_deref()).collect();
    let secs = window.as_secs_f64().max(1e-9);
    let pick = |q: f64| lat.get(((q * lat.len() as f64) as usize).min(lat.len().saturating_sub(1)));
    let ms = |v: Option<&u32>| v.map_or("null".to_string(), |v| format!("{:.3}", *v as f64 / 1000.0));
    let avg = if lat.is_empty() { 0.0 } else { lat.iter().map(|&v| v as f64).sum::<f64>() / lat.len() as f64 };
    let fewest = clients.iter().map(|c| c.txns).min().unwrap_or(0);
    let most = clients.iter().map(|c| c.txns).max().unwrap_or(0);
    let gap = clients.iter().map(|c| c.max_gap).max().unwrap_or_default();
    let opt = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
    let per_idle = match (rss_before, rss_idle) {
        (Some(b), Some(i)) => format!("{:.3}", (i as f64 - b as f64) / args.clients.max(1) as f64),
        _ => "null".to_string(),
    };
    let first_error = results.iter().find_map(|r| r.first_txn_error.clone());
    let ok = aborted.is_empty() && txns > 0;
    let fields: Vec<(&str, String)> = vec![
        ("ok", ok.to_string()),
        ("clients", args.clients.to_string()),
        ("threads", args.threads.to_string()),
        ("workload", json_str(&format!("{:?}", args.workload).to_lowercase())),
        ("mode", json_str(&format!("{:?}", args.mode).to_lowercase())),
        ("scale", scale.to_string()),
        ("think_ms", args.think_ms.to_string()),
        ("ramp_s", format!("{ramp_s:.3}")),
        ("duration_s", format!("{secs:.3}")),
        ("processed", txns.to_string()),
        ("failed_txns", failed.to_string()),
        ("aborted_clients", aborted.len().to_string()),
        ("tps", format!("{:.1}", txns as f64 / secs)),
        ("latency_ms", format!("{:.3}", avg / 1000.0)),
        ("p50_ms", ms(pick(0.50))),
        ("p95_ms", ms(pick(0.95))),
        ("p99_ms", ms(pick(0.99))),
        ("max_ms", ms(lat.last())),
        ("max_gap_ms", format!("{:.3}", gap.as_secs_f64() * 1000.0)),
        ("min_client_txns", fewest.to_string()),
        ("max_client_txns", most.to_string()),
        ("cpu_s", format!("{cpu:.3}")),
        ("cpu_us_per_txn", if txns > 0 { format!("{:.2}", cpu / txns as f64 * 1e6) } else { "null".into() }),
        ("self_rss_kib", opt(self_rss)),
        ("watch_rss_before_kib", opt(rss_before)),
        ("watch_rss_idle_kib", opt(rss_idle)),
        ("watch_rss_end_kib", opt(rss_end)),
        ("watch_idle_kib_per_client", per_idle),
        ("first_txn_error", first_error.map_or("null".into(), |e| json_str(&e))),
        ("error", aborted.first().map_or("null".into(), |e| json_str(&format!("client aborted: {e}")))),
    ];
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
    println!("{{{}}}", body.join(", "));
}

/// Prints a failed run's JSON line and exits 1.
fn fail(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    println!("{{\"ok\": false, \"error\": {}}}", json_str(msg));
    std::process::exit(1);
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) after.
fn raise_nofile() -> (u64, u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return (0, 0);
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim = want;
            }
        }
    }
    (lim.rlim_cur, lim.rlim_max)
}

/// This process's CPU time (user + system, all threads), seconds.
fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// VmRSS of a process, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
