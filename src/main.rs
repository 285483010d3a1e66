//! The `parsnip` binary: parse the command line, load the configuration, start the
//! embedded PostgreSQL when no server is given, run the pooler until a signal.

use clap::Parser;
use parsnip::config::{Cli, Config, DbUrl, LogFormat, cli::apply_url};
use parsnip::driver::reload::Reloader;
use parsnip::driver::{Stop, Threads, default_loops};
use parsnip::embedded::{Cluster, ClusterOptions};
use std::process::ExitCode;
use std::sync::Arc;

type LogFilter = tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// The log subscriber; the handle changes its filter on reload (`log_level`), unless
/// RUST_LOG sets it.
fn init_logging(cfg: &Config) -> Option<LogFilter> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let fixed = from_env.is_some();
    let filter = from_env
        .or_else(|| tracing_subscriber::EnvFilter::try_new(&cfg.log_level).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    // Colours only for a person at a terminal: never in a file, a pipe or a journal, and
    // never with NO_COLOR set (https://no-color.org).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(filter);
    match cfg.log_format {
        LogFormat::Json => registry.with(layer.json()).init(),
        LogFormat::Text => registry.with(layer).init(),
    }
    (!fixed).then_some(handle)
}

/// How RELOAD and SIGHUP re-read the configuration: as at start (the file, the URL, the
/// flags; in embedded mode, the embedded cluster as the database).
fn reloader(cli: Cli, embedded_url: Option<DbUrl>, log: Option<LogFilter>) -> Reloader {
    let load = move || -> Result<Config, String> {
        match &embedded_url {
            Some(url) => {
                let mut cfg = cli.to_config_without_databases().map_err(|e| e.to_string())?;
                apply_url(&mut cfg, url, true);
                cfg.validate().map_err(|e| e.to_string())?;
                Ok(cfg)
            }
            None => cli.to_config().map_err(|e| e.to_string()),
        }
        .inspect(log_load_notes)
    };
    let applied = move |cfg: &Config| {
        if let Some(h) = &log {
            match tracing_subscriber::EnvFilter::try_new(&cfg.log_level) {
                Ok(f) => {
                    let _ = h.reload(f);
                }
                Err(e) => tracing::warn!("log_level {:?} is not a valid filter: {e}", cfg.log_level),
            }
        }
    };
    Reloader { load: Box::new(load), applied: Box::new(applied) }
}

/// How many event loops, and of which kind: `PARSNIP_WORKERS` threads (default:
/// `driver::default_loops`, one per core, or one per two cores when every server runs on
/// this machine), each a single-threaded event loop with its own clients and server
/// connections (`driver::shards`); 1 runs everything on the main thread.
/// `PARSNIP_SCHEDULER=stealing` runs tokio's work-stealing runtime with that many workers
/// instead (for comparison: it moves tasks between threads, which costs a one-client
/// transaction a cross-thread wake). Fixed for the life of the process.
fn runtime(cfg: &Config) -> std::io::Result<(tokio::runtime::Runtime, Threads)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = std::env::var("PARSNIP_WORKERS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|n| *n > 0);
    let local = cfg.servers_on_this_machine();
    let n = workers.unwrap_or_else(|| default_loops(cores, local));
    let why = match (workers, local) {
        (Some(_), _) => "PARSNIP_WORKERS",
        (None, true) => "every server is on this machine: half the cores are left to it",
        (None, false) => "one per core",
    };
    tracing::info!("{n} event loop(s) on {cores} core(s) ({why})");
    let stealing = std::env::var("PARSNIP_SCHEDULER").is_ok_and(|v| v == "stealing");
    if stealing && n > 1 {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?;
        return Ok((rt, Threads::One));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok((rt, if n > 1 { Threads::PerCore(n) } else { Threads::One }))
}

/// `--print-config`: the configuration as parsnip's TOML (databases from the file or the
/// URL; without either, none: no embedded PostgreSQL is started for it).
fn print_config(cli: &Cli) -> ExitCode {
    let printed = if cli.wants_embedded() { cli.to_config_without_databases() } else { cli.to_config() };
    match printed.and_then(|c| c.to_toml()) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("parsnip: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Names what reading the configuration file left out.
fn log_load_notes(cfg: &Config) {
    for n in &cfg.load_notes {
        tracing::warn!("configuration: {n}");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_config {
        return print_config(&cli);
    }
    let mut embedded = None;
    let mut embedded_url = None;
    let cfg = if cli.wants_embedded() {
        let cluster = match Cluster::start(ClusterOptions::default()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("parsnip: could not start the embedded PostgreSQL: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut cfg = match cli.to_config_without_databases() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("parsnip: {e}");
                return ExitCode::FAILURE;
            }
        };
        let url = DbUrl {
            user: cluster.superuser().to_owned(),
            password: None,
            host: cluster.socket_dir().display().to_string(),
            port: cluster.port(),
            dbname: "postgres".into(),
            ..DbUrl::default()
        };
        apply_url(&mut cfg, &url, true);
        embedded_url = Some(url);
        eprintln!(
            "parsnip: embedded PostgreSQL {} running in {} (port {}); connect with: psql -h 127.0.0.1 -p {} -U \
                postgres postgres",
            cluster.major_version(),
            cluster.data_dir().display(),
            cluster.port(),
            cfg.listen
                .iter()
                .find_map(|l| l.rsplit_once(':').map(|(_, p)| p.to_owned()))
                .unwrap_or_else(|| "6432".into())
        );
        embedded = Some(cluster);
        cfg
    } else {
        match cli.to_config() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("parsnip: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let log = init_logging(&cfg);
    log_load_notes(&cfg);
    let reload = reloader(cli, embedded_url, log);
    let (rt, threads) = match runtime(&cfg) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("parsnip: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(run(Arc::new(cfg), reload, threads));
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(embedded);
    code
}

async fn run(cfg: Arc<Config>, reload: Reloader, threads: Threads) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    );
    let (Ok(mut term), Ok(mut int), Ok(mut hup), Ok(mut usr1), Ok(mut usr2)) = signals else {
        tracing::error!("cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    let handle = match parsnip::driver::start(cfg, threads).await {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    handle.set_reloader(reload);
    // PgBouncer's signals: SIGHUP reloads, SIGUSR1 pauses, SIGUSR2 resumes. None of them
    // ends the process: no signal sent by habit or by accident (a closed terminal) does.
    let mut stops = handle.stop_requests();
    let stop = loop {
        tokio::select! {
            // In this order when several are pending at once (a pause and a resume sent
            // together end resumed).
            biased;
            _ = term.recv() => {
                tracing::info!("SIGTERM: graceful shutdown, waiting for transactions to finish");
                break Stop::Graceful;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: immediate shutdown");
                break Stop::Now;
            }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading the configuration");
                handle.reload();
            }
            _ = usr1.recv() => {
                tracing::info!("SIGUSR1: pausing every pool");
                handle.pause_all();
            }
            _ = usr2.recv() => {
                tracing::info!("SIGUSR2: resuming");
                handle.resume_all();
            }
            s = stops.next() => {
                tracing::info!(?s, "SHUTDOWN from the console");
                break s;
            }
        }
    };
    match stop {
        Stop::Now => {}
        Stop::Graceful => tokio::select! {
            _ = handle.shutdown() => tracing::info!("all clients gone, exiting"),
            _ = int.recv() => tracing::info!("SIGINT: immediate shutdown"),
        },
        Stop::WaitForClients => tokio::select! {
            _ = handle.shutdown_waiting_for_clients() => tracing::info!("all clients gone, exiting"),
            _ = int.recv() => tracing::info!("SIGINT: immediate shutdown"),
        },
    }
    ExitCode::SUCCESS
}
