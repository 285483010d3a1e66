//! The pool's bookkeeping with a connection type of the tests' own: no sockets, no server.

use super::*;
use crate::config::Config;
use crate::error::SqlState;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// A connection that is healthy unless told otherwise.
struct Dummy {
    id: usize,
    healthy: bool,
    /// Unhealthy for having said its server is going down.
    going_down: bool,
    created: Instant,
    last_used: Instant,
    settings: Settings,
    epoch: u64,
    home: u16,
}

impl Pooled for Dummy {
    fn is_healthy(&mut self) -> bool {
        self.healthy
    }
    fn says_going_down(&self) -> bool {
        self.going_down
    }
    fn created(&self) -> Instant {
        self.created
    }
    fn last_used(&self) -> Instant {
        self.last_used
    }
    fn touch(&mut self, now: Instant) {
        self.last_used = now;
    }
    fn startup_params(&self) -> &[(String, String)] {
        &[]
    }
    fn settings(&self) -> &Settings {
        &self.settings
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    fn home(&self) -> u16 {
        self.home
    }
}

/// Opens numbered connections; fails while `fail` is set; `age` makes them look old.
#[derive(Default)]
struct Opener {
    opened: AtomicUsize,
    fail: std::sync::atomic::AtomicBool,
    age: Duration,
}

impl Connector for Opener {
    type Conn = Dummy;
    type Ticket = u32;
    fn connect<'a>(&'a self, stats: &'a PoolStats) -> Connecting<'a, Dummy> {
        Box::pin(async move {
            if self.fail.load(Ordering::Relaxed) {
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                return Err(Error::fatal(SqlState::CONNECTION_FAILURE, "no server"));
            }
            stats.connects.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            let created = now.checked_sub(self.age).unwrap_or(now);
            let id = self.opened.fetch_add(1, Ordering::Relaxed);
            let home = super::home::here();
            Ok(Box::new(Dummy {
                id,
                healthy: true,
                going_down: false,
                created,
                last_used: now,
                settings: Settings::default(),
                epoch: 0,
                home,
            }))
        })
    }
}

fn pool_with(size: usize, opener: Opener, cfg: Config) -> Arc<Pool<Opener>> {
    Arc::new(Pool::new(PoolKey::clients("db", "u"), PoolMode::Transaction, size, opener, Arc::new(cfg)))
}

fn pool(size: usize) -> Arc<Pool<Opener>> {
    pool_with(size, Opener::default(), Config::default())
}

#[tokio::test]
async fn a_returned_connection_is_reused_and_the_size_is_a_limit() {
    let p = pool(2);
    assert!(matches!(p.checkout(), Checkout::Slow));
    let a = p.acquire().await.expect("first");
    let b = p.acquire().await.expect("second");
    assert_eq!(p.counts(), (0, 2, 0));
    // Full: the next checkout queues.
    let Checkout::Queued(mut q) = p.checkout() else { panic!("a full pool queues") };
    assert_eq!(p.counts(), (0, 2, 1));
    // A connection given back goes straight to the waiter, not to the idle list.
    let a_id = a.id;
    p.release(a, true);
    match p.wait_queued(&mut q).await {
        Ok(Some(Lease::Own(c))) => assert_eq!(c.id, a_id),
        _ => panic!("the waiter gets the returned connection"),
    }
    assert_eq!(p.counts(), (0, 2, 0));
    p.release(b, true);
    assert_eq!(p.counts(), (1, 2, 0));
    let Checkout::Ready(c) = p.checkout() else { panic!("an idle connection is ready") };
    assert_eq!(p.connector().opened.load(Ordering::Relaxed), 2, "no third connection opened");
    p.release(c, false);
    assert_eq!(p.counts(), (0, 1, 0), "not reusable: closed");
}

#[tokio::test]
async fn waiters_are_served_first_come_first_served() {
    let p = pool(1);
    let c = p.acquire().await.expect("one");
    let Checkout::Queued(mut first) = p.checkout() else { panic!("queued") };
    let Checkout::Queued(mut second) = p.checkout() else { panic!("queued") };
    p.release(c, true);
    let Ok(Some(Lease::Own(c))) = p.wait_queued(&mut first).await else { panic!("first waiter served") };
    assert_eq!(p.counts(), (0, 1, 1), "the second still waits");
    p.release(c, true);
    assert!(matches!(p.wait_queued(&mut second).await, Ok(Some(Lease::Own(_)))));
}

#[tokio::test]
async fn a_reloaded_lifetime_applies_at_once() {
    // The pool keeps the lifetime it looked up per configuration generation.
    let live = crate::config::LiveConfig::new(Arc::new(Config { server_lifetime_ms: 0, ..Config::default() }));
    let opener = Opener { age: Duration::from_secs(3600), ..Opener::default() };
    let p = Arc::new(Pool::new(PoolKey::clients("db", "u"), PoolMode::Transaction, 2, opener, live.clone()));
    let c = p.acquire().await.expect("an old one");
    assert!(!p.expired(&c), "no lifetime");
    assert!(!p.expired(&c), "no lifetime, as kept");
    live.store(Arc::new(Config { server_lifetime_ms: 60_000, ..Config::default() }));
    assert!(p.expired(&c), "the reloaded lifetime");
    live.store(Arc::new(Config { server_lifetime_ms: 0, ..Config::default() }));
    assert!(!p.expired(&c), "off again");
    p.release(c, true);
    assert_eq!(p.counts(), (1, 1, 0), "kept at release");
}

#[tokio::test]
async fn broken_and_old_connections_are_closed_not_handed_out() {
    let p = pool(2);
    let mut c = p.acquire().await.expect("one");
    c.healthy = false;
    p.release(c, true);
    assert_eq!(p.counts(), (1, 1, 0));
    // The checkout finds it broken, closes it and asks for a new one.
    assert!(matches!(p.checkout(), Checkout::Slow));
    assert_eq!(p.counts(), (0, 0, 0));

    let cfg = Config { server_lifetime_ms: 60_000, ..Config::default() };
    let p = pool_with(2, Opener { age: Duration::from_secs(3600), ..Opener::default() }, cfg);
    let c = p.acquire().await.expect("an old one");
    assert!(p.expired(&c));
    p.release(c, true);
    assert_eq!(p.counts(), (0, 0, 0), "past its lifetime: closed at release");
    let c = p.acquire().await.expect("another old one");
    p.release_now(c, true);
    assert_eq!(p.counts(), (1, 1, 0));
    p.prune(0);
    assert_eq!(p.counts(), (0, 0, 0), "pruned");
}

#[tokio::test]
async fn an_idle_connection_saying_its_server_goes_down_retires_its_generation() {
    // Three connections; one idle says its server is going down (a fast shutdown's FATAL
    // read at checkout): the other idle one and the busy one are of the same server, and
    // are closed, not handed out, even though they look healthy.
    let p = pool(3);
    let (mut a, b, c) = (p.acquire().await.expect("a"), p.acquire().await.expect("b"), p.acquire().await.expect("c"));
    a.healthy = false;
    a.going_down = true;
    p.release(a, true);
    p.release(b, true);
    assert_eq!(p.counts(), (2, 3, 0));
    // b is taken first (the most recent), and is fine: a stays idle.
    let Checkout::Ready(b) = p.checkout() else { panic!("b is ready") };
    p.release(b, true);
    let mut g = p.lock();
    let a_first = g.idle.iter().position(|d| d.going_down).expect("a idle");
    let last = g.idle.len() - 1;
    g.idle.swap(a_first, last);
    drop(g);
    // Now a is met first: it says the server is going down, so b is not handed out.
    assert!(matches!(p.checkout(), Checkout::Slow), "a new connection, not b");
    assert_eq!(p.counts(), (0, 1, 0), "a and b closed; c still out");
    p.release(c, true);
    assert_eq!(p.counts(), (0, 0, 0), "c, of the old server, is closed when it comes back");
    // A broken connection that says nothing of its server retires nobody.
    let p = pool(2);
    let (mut a, b) = (p.acquire().await.expect("a"), p.acquire().await.expect("b"));
    a.healthy = false;
    p.release(b, true);
    p.release(a, true);
    let Checkout::Ready(_b) = p.checkout() else { panic!("b is still handed out") };
}

#[tokio::test]
async fn a_failed_connect_gives_its_slot_to_a_waiter() {
    let p = pool(1);
    p.connector().fail.store(true, Ordering::Relaxed);
    assert!(p.acquire().await.is_err());
    assert_eq!(p.counts(), (0, 0, 0), "the slot was given back");
    assert_eq!(p.stats.connect_failures.load(Ordering::Relaxed), 1);
    p.connector().fail.store(false, Ordering::Relaxed);
    // A waiter told a slot is free opens a connection in it.
    let c = p.acquire().await.expect("connects now");
    let Checkout::Queued(mut q) = p.checkout() else { panic!("queued") };
    p.release(c, false);
    assert!(matches!(p.wait_queued(&mut q).await, Ok(None)), "told to try again");
    assert!(p.acquire_woken().await.is_ok());
}

#[tokio::test]
async fn tickets_go_to_client_waiters_and_come_back_when_they_left() {
    let p = pool(1);
    let c = p.acquire().await.expect("one");
    assert_eq!(p.lend(|| Some(7)), Ok(false), "nobody waits");
    let Checkout::Queued(mut q) = p.checkout() else { panic!("queued") };
    assert!(p.ticket_waiter());
    assert_eq!(p.lend(|| None), Ok(false), "declined by the maker");
    assert_eq!(p.lend(|| Some(7)), Ok(true));
    assert!(matches!(p.wait_queued(&mut q).await, Ok(Some(Lease::Ticket(7)))));
    assert_eq!(p.stats.pipelined.load(Ordering::Relaxed), 1);
    // A waiter that left: its ticket comes back to the lender.
    let Checkout::Queued(q) = p.checkout() else { panic!("queued") };
    assert_eq!(p.abandon(q), None);
    assert_eq!(p.lend(|| Some(8)), Ok(false), "a closed waiter is skipped");
    let Checkout::Queued(q) = p.checkout() else { panic!("queued") };
    assert_eq!(p.lend(|| Some(9)), Ok(true));
    assert_eq!(p.abandon(q), Some(9), "handed over, then abandoned: given back");
    p.release(c, true);
}

/// Issue 26 (the longest wait of any client): returned connections and pipelining tickets
/// both go to the longest-waiting client, so they are served in arrival order whichever
/// comes first; the janitor's sweep (`expire_waiters`) keeps that order, and a checkout
/// made while others wait queues behind them instead of taking what comes back.
#[tokio::test]
async fn connections_and_tickets_serve_waiters_in_arrival_order() {
    let p = pool(1);
    let c = p.acquire().await.expect("one");
    let mut q: Vec<_> = (0..4)
        .map(|_| match p.checkout() {
            Checkout::Queued(q) => q,
            _ => panic!("a full pool queues"),
        })
        .collect();
    p.expire_waiters();
    assert_eq!(p.lend(|| Some(1)), Ok(true));
    p.release(c, true);
    assert_eq!(p.lend(|| Some(3)), Ok(true));
    let Checkout::Queued(mut late) = p.checkout() else { panic!("queues behind the others") };
    assert!(matches!(p.wait_queued(&mut q[0]).await, Ok(Some(Lease::Ticket(1)))), "first: the first ticket");
    let Ok(Some(Lease::Own(c))) = p.wait_queued(&mut q[1]).await else { panic!("second: the connection") };
    assert!(matches!(p.wait_queued(&mut q[2]).await, Ok(Some(Lease::Ticket(3)))), "third: the next ticket");
    assert_eq!(p.counts(), (0, 1, 2));
    p.release(c, true);
    let Ok(Some(Lease::Own(c))) = p.wait_queued(&mut q[3]).await else { panic!("fourth: the connection again") };
    p.release(c, true);
    assert!(matches!(p.wait_queued(&mut late).await, Ok(Some(Lease::Own(_)))), "the late one last");
    assert_eq!(p.counts(), (0, 1, 0));
}

#[test]
fn a_waiter_whose_client_left_is_forgotten() {
    let p = pool(0);
    let Checkout::Queued(q) = p.checkout() else { panic!("a pool of size 0 queues") };
    assert_eq!(p.counts(), (0, 0, 1));
    drop(q);
    p.expire_waiters();
    assert_eq!(p.counts(), (0, 0, 0));
}

/// Issue 26: with thousands queued the janitor does not read every waiter's channel each
/// tick (a cache miss each: 3 % of the CPU at 10,000 clients). Clients gone from the front
/// of a long queue are forgotten at once, those deeper in it at the next sweep (every
/// `SWEEP_EVERY` ticks), and none is served meanwhile: a connection given back skips them.
#[tokio::test]
async fn clients_that_left_a_long_queue_are_forgotten_in_sweeps() {
    let p = pool(1);
    let c = p.acquire().await.expect("one");
    let n = 2 * queue::SWEEP_FROM;
    let mut q: Vec<Option<Queued<Opener>>> = (0..n)
        .map(|_| match p.checkout() {
            Checkout::Queued(q) => Some(q),
            _ => panic!("a full pool queues"),
        })
        .collect();
    // The first two and every other one after them leave.
    for (i, w) in q.iter_mut().enumerate() {
        if i < 2 || i % 2 == 1 {
            drop(w.take());
        }
    }
    let left = 2 + (n - 2) / 2;
    p.expire_waiters();
    assert_eq!(p.counts().2, n - 2, "the two at the front are forgotten at once");
    for _ in 2..SWEEP_EVERY {
        p.expire_waiters();
    }
    assert_eq!(p.counts().2, n - 2, "the others wait for the sweep");
    p.release(c, true);
    let Ok(Some(Lease::Own(c))) = p.wait_queued(q[2].as_mut().expect("stayed")).await else {
        panic!("the first that stayed is served, past the ones that left")
    };
    p.expire_waiters();
    assert_eq!(p.counts().2, n - left - 1, "swept");
    p.release(c, true);
}

/// Thread per core: a checkout takes the idle connection opened on its own thread, even
/// when another thread's was given back later; with none of its own it takes another's.
#[tokio::test]
async fn a_checkout_prefers_a_connection_of_its_own_thread() {
    let p = pool(3);
    super::home::enter(1);
    let mine = p.acquire().await.unwrap();
    super::home::enter(2);
    let theirs = p.acquire().await.unwrap();
    let (mine_id, theirs_id) = (mine.id, theirs.id);
    p.release(mine, true);
    p.release(theirs, true);
    super::home::enter(1);
    let c = p.acquire().await.unwrap();
    assert_eq!(c.id, mine_id, "thread 1 must get its own connection back, not the one released last");
    super::home::enter(3);
    let other = p.acquire().await.unwrap();
    assert_eq!(other.id, theirs_id, "a thread with none of its own takes an idle one rather than opening one");
    assert_eq!(p.stats.connects.load(Ordering::Relaxed), 2);
    super::home::enter(0);
}

/// `autoprepare` per database and per user: the user's key, then the database's, then the
/// global one decide the pool's statement cache.
#[test]
fn autoprepare_is_chosen_per_database_and_user() {
    let cfg = Config::from_toml(
        "autoprepare = false\n[databases.db]\nhost = \"h\"\nport = 5432\nautoprepare = true\n\
         [databases.other]\nhost = \"h\"\nport = 5432\n[users.u]\nautoprepare = false\n",
    )
    .expect("valid");
    let cfg = Arc::new(cfg);
    let on = |db: &str, user: &str| {
        Pool::new(PoolKey::clients(db, user), PoolMode::Transaction, 1, Opener::default(), cfg.clone())
            .stmts
            .cfg
            .autoprepare
    };
    assert!(on("db", "someone"), "the database's key");
    assert!(!on("db", "u"), "the user's key wins over the database's");
    assert!(!on("other", "someone"), "the global key");
}

/// Two pools of one database under `max_db_connections = 1` (`limit`).
fn capped_pair() -> (Arc<Pool<Opener>>, Arc<Pool<Opener>>, Arc<limit::Cap>) {
    let caps = limit::Caps::default();
    let cap = caps.db("db", (1, 0));
    let make = |user: &str| {
        let p = Pool::new(
            PoolKey::clients("db", user),
            PoolMode::Transaction,
            5,
            Opener::default(),
            Arc::new(Config::default()),
        )
        .with_caps(vec![cap.clone()]);
        let p = Arc::new(p);
        let member: std::sync::Weak<dyn limit::Member> = Arc::downgrade(&p) as _;
        limit::Caps::enroll(member, p.caps());
        p
    };
    (make("a"), make("b"), cap)
}

/// Spawns `p.acquire()` and yields until it is queued.
async fn queued_acquire(p: &Arc<Pool<Opener>>) -> tokio::task::JoinHandle<Result<Box<Dummy>, Error>> {
    let q = p.clone();
    let h = tokio::spawn(async move { q.acquire().await });
    for _ in 0..1000 {
        if p.counts().2 == 1 {
            return h;
        }
        tokio::task::yield_now().await;
    }
    panic!("the acquire never queued: {:?}", p.counts());
}

#[tokio::test]
async fn a_full_database_queues_a_pool_with_room_until_another_pool_closes_one() {
    let (a, b, cap) = capped_pair();
    let held = a.acquire().await.expect("a's connection");
    assert_eq!(cap.open(), 1);
    let waiting = queued_acquire(&b).await;
    assert_eq!(b.counts(), (0, 0, 1), "room of its own, but the database is full");
    a.release(held, false);
    let c = waiting.await.expect("task").expect("b connects once a's connection closed");
    assert_eq!((a.counts(), b.counts(), cap.open()), ((0, 0, 0), (0, 1, 0), 1));
    b.release(c, false);
    assert_eq!(cap.open(), 0);
}

#[tokio::test]
async fn an_idle_connection_of_another_pool_is_evicted_to_make_room() {
    let (a, b, cap) = capped_pair();
    // Idle in a's pool before b asks.
    let c = a.acquire().await.expect("a's connection");
    a.release(c, true);
    assert_eq!(a.counts(), (1, 1, 0));
    let c = b.acquire().await.expect("a's idle connection is closed for b");
    assert_eq!((a.counts(), cap.open()), ((0, 0, 0), 1));
    // Given back while a waits: not kept idle in b's pool, but closed for a at once.
    let waiting = queued_acquire(&a).await;
    b.release(c, true);
    let theirs = waiting.await.expect("task").expect("a connects once b's connection went idle");
    assert_eq!((a.counts(), b.counts(), cap.open()), ((0, 1, 0), (0, 0, 0), 1));
    a.release(theirs, true);
}

#[tokio::test]
async fn min_pool_size_is_opened_ahead_and_outlives_the_idle_timeout() {
    let cfg = Config { min_pool_size: 2, server_idle_timeout_ms: 60_000, ..Config::default() };
    let p = pool_with(3, Opener::default(), cfg);
    // Two slots reserved, then none: the minimum is reached (counting those being opened).
    assert!(!p.warm_slot(0), "a pool not in use is not warmed");
    assert!(p.warm_slot(5) && p.warm_slot(5));
    assert!(!p.warm_slot(5), "at most min_pool_size");
    p.warm().await.expect("opened");
    p.warm().await.expect("opened");
    assert_eq!(p.counts(), (2, 2, 0), "two idle connections nobody asked for");
    // A third, idle past the idle timeout like the others: closed down to the minimum only.
    let c = p.acquire().await.expect("a third");
    p.release_now(c, true);
    let long_ago = Instant::now().checked_sub(Duration::from_secs(3600)).expect("an hour ago");
    p.lock().idle.iter_mut().for_each(|c| c.last_used = long_ago);
    p.prune(p.min_size());
    assert_eq!(p.counts(), (2, 2, 0), "server_idle_timeout keeps min_pool_size open");
    // A failed connect gives its slot back.
    let c = p.acquire().await.expect("taken");
    drop(c);
    p.slot_freed();
    p.connector().fail.store(true, Ordering::Relaxed);
    assert!(p.warm_slot(2));
    assert!(p.warm().await.is_err());
    assert_eq!(p.counts(), (1, 1, 0));
    // Once the pool is not in use, the idle timeout closes them all.
    p.prune(0);
    assert_eq!(p.counts(), (0, 0, 0));
    // The minimum is capped at the pool's size, and pools serving no client keep none.
    let cfg = Config { min_pool_size: 5, ..Config::default() };
    assert_eq!(pool_with(3, Opener::default(), cfg.clone()).min_size(), 3);
    let key = PoolKey { purpose: PoolPurpose::AuthQuery, ..PoolKey::clients("db", "u") };
    let aq = Pool::new(key, PoolMode::Transaction, 3, Opener::default(), Arc::new(cfg));
    assert_eq!(aq.min_size(), 0);
}

/// A connection given back to a long queue goes to a waiter of its own thread among the
/// first few (no cross-thread wake-up, no move of its socket), and no waiter is passed
/// over more than `MAX_PASSED_OVER` times: then it is served first. A short queue is
/// served first come, first served.
#[test]
fn a_connection_goes_to_a_waiter_of_its_own_thread_within_a_bound() {
    let base = Instant::now();
    let queue = |homes: &[u16]| -> VecDeque<Waiter<Opener>> {
        homes
            .iter()
            .enumerate()
            .map(|(i, &home)| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                std::mem::forget(rx);
                let mut w = Waiter::new(tx, None, base + Duration::from_millis(i as u64), true);
                w.home = home;
                w
            })
            .collect()
    };
    let order = |mut q: VecDeque<Waiter<Opener>>, home: u16| -> Vec<u128> {
        std::iter::from_fn(|| queue::pick(&mut q, home)).map(|w| (w.since - base).as_millis()).collect()
    };
    // 2 and 4 (thread 2) pass 0 and 1 twice, and 3 once; then 0 goes first, and the queue
    // is short from there on.
    assert_eq!(order(queue(&[1, 1, 2, 1, 2, 2, 1, 1, 1, 1]), 2), [2, 4, 0, 1, 3, 5, 6, 7, 8, 9]);
    assert_eq!(order(queue(&[1; 10]), 7), (0..10).collect::<Vec<_>>(), "none of its thread: in order");
    assert_eq!(order(queue(&[1, 2, 2]), 2), [0, 1, 2], "a short queue: in order");
}
