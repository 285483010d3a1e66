//! The clients: the state every thread shares (the run's phase, the measured window, how
//! many clients are in, the first login failure), one single-threaded event loop per thread
//! holding its share of the clients, and each client's life: connect and log in (retrying
//! refused, reset or exhausted connects until the ramp's deadline), prepare, run one warm
//! transaction, wait idle for the start, then transactions in a loop, counting only those
//! that end inside the measured window, and tracking the longest interval between the
//! starts of two of its transactions (with the window's edges), until the phase says stop.

use crate::Args;
use crate::wire::{self, Mode, Reader, Rng, Statement};
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{Semaphore, watch};

/// The run's phases, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Ramp = 0,
    Warmup = 1,
    Measure = 2,
    Stop = 3,
}

pub struct Shared {
    pub args: Args,
    pub scale: i64,
    pub script: Vec<Statement>,
    /// Clients logged in, prepared and warm.
    pub connected: AtomicUsize,
    phase: AtomicU8,
    phase_tx: watch::Sender<u8>,
    base: Instant,
    window_start_ns: AtomicU64,
    window_end_ns: AtomicU64,
    error: Mutex<Option<String>>,
}

impl Shared {
    pub fn new(args: Args, scale: i64) -> Shared {
        Shared {
            script: wire::script(args.workload),
            args,
            scale,
            connected: AtomicUsize::new(0),
            phase: AtomicU8::new(Phase::Ramp as u8),
            phase_tx: watch::Sender::new(Phase::Ramp as u8),
            base: Instant::now(),
            window_start_ns: AtomicU64::new(0),
            window_end_ns: AtomicU64::new(0),
            error: Mutex::new(None),
        }
    }

    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
        self.phase_tx.send_replace(p as u8);
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    fn since_base(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    pub fn start_window(&self) {
        self.window_start_ns.store(self.since_base(), Ordering::Release);
        self.set_phase(Phase::Measure);
    }

    /// Ends the window (every client stops after its transaction); returns its length.
    pub fn end_window(&self) -> Duration {
        let end = self.since_base();
        self.window_end_ns.store(end, Ordering::Release);
        self.set_phase(Phase::Stop);
        Duration::from_nanos(end.saturating_sub(self.window_start_ns.load(Ordering::Acquire)))
    }

    fn window_start(&self) -> Instant {
        self.base + Duration::from_nanos(self.window_start_ns.load(Ordering::Acquire))
    }

    fn window_end(&self) -> Option<Instant> {
        let ns = self.window_end_ns.load(Ordering::Acquire);
        (ns > 0).then(|| self.base + Duration::from_nanos(ns))
    }

    /// The first client that could not log in, and why.
    pub fn first_error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone())
    }

    fn fail(&self, why: String) {
        if let Ok(mut e) = self.error.lock() {
            e.get_or_insert(why);
        }
    }
}

/// One client's figures for the measured window.
#[derive(Debug, Default)]
pub struct ClientResult {
    pub txns: u64,
    pub failed: u64,
    pub max_gap: Duration,
    /// Why the client's connection ended before the run did.
    pub aborted: Option<String>,
}

/// One thread's clients and the latencies (µs) of their transactions in the window.
#[derive(Debug, Default)]
pub struct ThreadResult {
    pub clients: Vec<ClientResult>,
    pub latencies_us: Vec<u32>,
    pub first_txn_error: Option<String>,
}

/// Runs clients `ids` on a single-threaded event loop until the run stops.
pub fn run_thread(shared: std::sync::Arc<Shared>, ids: Vec<usize>, threads: usize) -> ThreadResult {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            shared.fail(format!("could not start an event loop: {e}"));
            return ThreadResult::default();
        }
    };
    let per_thread = shared.args.connect_concurrency.div_ceil(threads).max(1);
    let sem = Rc::new(Semaphore::new(per_thread));
    let acc = Rc::new(RefCell::new(ThreadResult::default()));
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let tasks: Vec<_> = ids
            .into_iter()
            .map(|id| tokio::task::spawn_local(client(id, shared.clone(), sem.clone(), acc.clone())))
            .collect();
        for t in tasks {
            match t.await {
                Ok(r) => acc.borrow_mut().clients.push(r),
                Err(e) => {
                    acc.borrow_mut().clients.push(ClientResult { aborted: Some(e.to_string()), ..Default::default() })
                }
            }
        }
    });
    std::mem::take(&mut *acc.borrow_mut())
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

async fn connect(args: &Args) -> io::Result<Conn> {
    if args.host.starts_with('/') {
        Ok(Conn::Unix(UnixStream::connect(format!("{}/.s.PGSQL.{}", args.host, args.port)).await?))
    } else {
        let s = TcpStream::connect((args.host.as_str(), args.port)).await?;
        s.set_nodelay(true)?;
        Ok(Conn::Tcp(s))
    }
}

/// Why a login attempt failed: worth another try (the listener's queue was full, the
/// connection was reset) or not (the server said no).
enum LoginError {
    Retry(io::Error),
    Fatal(String),
}

impl From<io::Error> for LoginError {
    fn from(e: io::Error) -> Self {
        LoginError::Retry(e)
    }
}

/// Startup and authentication (trust only) up to the first ReadyForQuery.
async fn login<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, rd: &mut Reader, args: &Args) -> Result<(), LoginError> {
    s.write_all(&wire::startup(&args.user, &args.dbname)).await?;
    let r = rd.until_ready(s).await?;
    if let Some(e) = r.error {
        return Err(LoginError::Fatal(e));
    }
    match r.auth {
        Some(0) | None => Ok(()),
        Some(code) => Err(LoginError::Fatal(format!("authentication request {code}: loadgen speaks trust only"))),
    }
}

/// Login, the prepared mode's statements, and one warm transaction.
async fn setup<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    rd: &mut Reader,
    shared: &Shared,
    rng: &mut Rng,
) -> Result<(), LoginError> {
    login(s, rd, &shared.args).await?;
    if shared.args.mode == Mode::Prepared {
        s.write_all(&wire::prepare_all(&shared.script)).await?;
        if let Some(e) = rd.until_ready(s).await?.error {
            return Err(LoginError::Fatal(format!("prepare: {e}")));
        }
    }
    let mut out = Vec::with_capacity(256);
    transaction(s, rd, &mut out, shared, &rng.draw(shared.scale)).await.map_err(LoginError::Fatal)?;
    Ok(())
}

/// Connects and sets up, retrying what is worth retrying until the ramp's deadline.
async fn open(shared: &Shared, rng: &mut Rng) -> Result<(Conn, Reader), String> {
    let deadline = shared.base + Duration::from_secs_f64(shared.args.connect_timeout);
    let mut backoff = Duration::from_millis(5);
    loop {
        if shared.phase() >= Phase::Stop as u8 {
            return Err("stopped".into());
        }
        let mut rd = Reader::new();
        let attempt = async {
            let mut conn = connect(&shared.args).await?;
            match &mut conn {
                Conn::Tcp(s) => setup(s, &mut rd, shared, rng).await?,
                Conn::Unix(s) => setup(s, &mut rd, shared, rng).await?,
            }
            Ok::<_, LoginError>(conn)
        }
        .await;
        match attempt {
            Ok(conn) => return Ok((conn, rd)),
            Err(LoginError::Fatal(e)) => return Err(e),
            Err(LoginError::Retry(e)) if Instant::now() + backoff > deadline => {
                return Err(format!("{e} (retried until the ramp's deadline)"));
            }
            Err(LoginError::Retry(_)) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// One transaction: each statement a round trip. Ok(Some(error)) if the server refused a
/// statement; Err if the connection is gone.
async fn transaction<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    rd: &mut Reader,
    out: &mut Vec<u8>,
    shared: &Shared,
    vars: &[i64; 4],
) -> Result<Option<String>, String> {
    let mut first = None;
    for i in 0..shared.script.len() {
        out.clear();
        wire::render(out, shared.args.mode, &shared.script, i, vars);
        s.write_all(out).await.map_err(|e| e.to_string())?;
        let r = rd.until_ready(s).await.map_err(|e| e.to_string())?;
        if r.closed {
            return Err(r.error.unwrap_or_else(|| "connection closed".into()));
        }
        if first.is_none() {
            first = r.error;
        }
    }
    Ok(first)
}

async fn client(
    id: usize,
    shared: std::sync::Arc<Shared>,
    sem: Rc<Semaphore>,
    acc: Rc<RefCell<ThreadResult>>,
) -> ClientResult {
    let mut rng =
        Rng::new((id as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ shared.base.elapsed().as_nanos() as u64);
    let opened = match sem.acquire().await {
        Ok(_permit) => open(&shared, &mut rng).await,
        Err(e) => Err(e.to_string()),
    };
    match opened {
        Ok((Conn::Tcp(s), rd)) => run(id, s, rd, &shared, rng, &acc).await,
        Ok((Conn::Unix(s), rd)) => run(id, s, rd, &shared, rng, &acc).await,
        Err(e) => {
            if shared.phase() < Phase::Stop as u8 {
                shared.fail(e.clone());
            }
            ClientResult { aborted: Some(e), ..Default::default() }
        }
    }
}

/// A logged-in client's life: idle until the start, transactions until the stop, goodbye.
async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    id: usize,
    mut s: S,
    mut rd: Reader,
    shared: &Shared,
    mut rng: Rng,
    acc: &RefCell<ThreadResult>,
) -> ClientResult {
    let mut res = ClientResult::default();
    let mut rx = shared.phase_tx.subscribe();
    shared.connected.fetch_add(1, Ordering::AcqRel);
    let _ = rx.wait_for(|p| *p >= Phase::Warmup as u8).await;
    let think = Duration::from_secs_f64(shared.args.think_ms.max(0.0) / 1000.0);
    let mut out = Vec::with_capacity(256);
    let mut last_start: Option<Instant> = None;
    loop {
        let phase = shared.phase();
        if phase >= Phase::Stop as u8 {
            break;
        }
        let start = Instant::now();
        if phase == Phase::Measure as u8 {
            let from = last_start.map_or(shared.window_start(), |l| l.max(shared.window_start()));
            res.max_gap = res.max_gap.max(start.saturating_duration_since(from));
        }
        last_start = Some(start);
        let vars = rng.draw(shared.scale);
        let outcome = transaction(&mut s, &mut rd, &mut out, shared, &vars).await;
        let end = Instant::now();
        let counted = shared.phase() == Phase::Measure as u8;
        match outcome {
            Err(e) => {
                res.aborted = Some(e);
                break;
            }
            Ok(Some(e)) if counted => {
                res.failed += 1;
                acc.borrow_mut().first_txn_error.get_or_insert(e);
            }
            Ok(None) if counted => {
                res.txns += 1;
                let us = end.duration_since(start).as_micros().min(u32::MAX as u128) as u32;
                acc.borrow_mut().latencies_us.push(us);
                if shared.args.slow_ms.is_some_and(|ms| f64::from(us) > ms * 1000.0) {
                    let at = start.saturating_duration_since(shared.window_start());
                    eprintln!(
                        "loadgen: slow: client {id} thread {:?} started {:.1} ms into the window (unix {:.3} s), took {:.1} ms",
                        std::thread::current().name().unwrap_or("?"),
                        at.as_secs_f64() * 1000.0,
                        unix_s(start),
                        f64::from(us) / 1000.0
                    );
                }
            }
            Ok(_) => {}
        }
        if !think.is_zero() {
            tokio::time::sleep(think).await;
        }
    }
    // The wait still open when the window closed counts too.
    if let (Some(end), true) = (shared.window_end(), shared.window_start_ns.load(Ordering::Acquire) > 0) {
        let ws = shared.window_start();
        let from = last_start.map_or(ws, |l| l.max(ws));
        res.max_gap = res.max_gap.max(end.saturating_duration_since(from));
    }
    if res.aborted.is_none() {
        // Terminate, then wait for the server to close first (its side keeps the TIME_WAIT,
        // not this side's ephemeral ports, which 10,000 clients run after run would exhaust).
        let _ = s.write_all(&wire::terminate()).await;
        let mut sink = [0u8; 256];
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(n) = s.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }
    res
}

/// `at` as seconds since the Unix epoch (to line a slow transaction up with a server's log).
fn unix_s(at: Instant) -> f64 {
    let now = std::time::SystemTime::now();
    let back = Instant::now().saturating_duration_since(at);
    now.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().saturating_sub(back).as_secs_f64()
}

/// pgbench's scale: the number of rows of pgbench_branches, read over one connection.
pub fn detect_scale(args: &Args) -> Result<i64, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut rd = Reader::new();
        match connect(args).await.map_err(|e| e.to_string())? {
            Conn::Tcp(mut s) => count_branches(&mut s, &mut rd, args).await,
            Conn::Unix(mut s) => count_branches(&mut s, &mut rd, args).await,
        }
    })
}

async fn count_branches<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    rd: &mut Reader,
    args: &Args,
) -> Result<i64, String> {
    match login(s, rd, args).await {
        Ok(()) => {}
        Err(LoginError::Retry(e)) => return Err(e.to_string()),
        Err(LoginError::Fatal(e)) => return Err(e),
    }
    let mut out = Vec::new();
    wire::query(&mut out, "SELECT count(*) FROM pgbench_branches");
    s.write_all(&out).await.map_err(|e| e.to_string())?;
    let r = rd.until_ready(s).await.map_err(|e| e.to_string())?;
    if let Some(e) = r.error {
        return Err(e);
    }
    let _ = s.write_all(&wire::terminate()).await;
    r.first_value
        .and_then(|v| v.parse().ok())
        .filter(|n: &i64| *n > 0)
        .ok_or_else(|| "pgbench_branches is empty".into())
}
