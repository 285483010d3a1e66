//! Cancel keys: each client gets a (pid, key) of parsnip's own; a CancelRequest carrying
//! them is forwarded to the server connection that client is linked to, once the client's
//! request runs there (`BackendPhase`), and repeated while it still does (`send_for`).

use super::census::{ClientInfo, ClientLive};
use super::server_conn::CancelTarget;
use super::servers::ServerPool;
use super::stream::Stream;
use crate::protocol::startup;
use crate::session::BackendPhase;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Where one client's queries currently run; and what `SHOW CLIENTS` shows of it.
#[derive(Debug, Default)]
pub(crate) struct CancelSlot {
    /// The client's pid (its cancel key's first half).
    pub(crate) pid: i32,
    /// Who it is (set once, at the end of its login).
    pub(crate) info: OnceLock<ClientInfo>,
    /// What it is doing.
    pub(crate) live: ClientLive,
    /// `KILL` or `KILL_CLIENT`: its task closes it at its next turn (woken by `kick`).
    killed: AtomicBool,
    /// The target is `Target::Armed`: the client's task sends the cancel once its request
    /// runs (`fire_armed`; a flag so that the task's check costs no lock).
    armed: AtomicBool,
    /// What the linked backend is doing for the client, as its task last saw it
    /// (`set_phase`; a `BackendPhase` in the low two bits): a cancel arriving while the client's
    /// request is not running yet is armed, not forwarded. Above them, how many requests the
    /// session had sent to the server then: a cancel is sent again only while no request
    /// was sent after the one it was sent for (`send_for`). Written by the client's task only.
    phase: AtomicU32,
    /// The client's task, woken for `killed` and for a shutdown (`kick`). Registered once
    /// (`watch`): a task's waker stays valid for its life, so an idle client carries no
    /// wait of its own for these.
    task: Mutex<Option<std::task::Waker>>,
    target: Mutex<Target>,
    /// Cancels that arrived while the client had no server (each kicks its task): one
    /// that arrives while it waits for a server ends that wait.
    queued_cancels: AtomicU32,
    /// The client's pool: the way to cancel with a single signal (`send`).
    pool: OnceLock<Weak<ServerPool>>,
    /// Notifications wait for the client in its pool's `notify::Notifier` (a flag, so that
    /// the task's check costs no lock; set by the notifier, cleared when they are taken).
    pub(crate) notes: AtomicBool,
    /// Its pool's connections were marked to close (`RECONNECT`, a reload) under
    /// `server_fast_close`: its task looks at its session-mode server (`Proxy::fast_close`).
    recheck: AtomicBool,
}

/// Where a cancel request of one client goes.
#[derive(Debug, Default)]
enum Target {
    /// No server: its request (if any) is waiting for one.
    #[default]
    None,
    /// The backend runs this client's query (or will next).
    Now(Arc<CancelTarget>),
    /// The client's batch is queued behind other clients' batches on that connection
    /// (`pipe`): a cancel now would reach their queries. One that arrives is held
    /// (`requested`) and sent when the batch reaches the head.
    Later { target: Arc<CancelTarget>, requested: bool },
    /// A cancel is held, counted in flight on the target, for a request that does not run
    /// yet (`BackendPhase::Holding`): one held while the batch waited behind others and it reached
    /// the head, one that came as the client's wait for a server ended (`set`), or one that
    /// came while the batch was unwritten, held or behind the link's preamble. Sent once the
    /// request runs (`fire_armed`): a cancel that reaches a backend waiting for its next
    /// message is dropped by PostgreSQL.
    Armed(Arc<CancelTarget>),
}

impl CancelSlot {
    /// The pool whose servers this client's queries run on.
    pub(crate) fn bind_pool(&self, pool: &Arc<ServerPool>) {
        let _ = self.pool.set(Arc::downgrade(pool));
    }
    /// Its pool (None before login, or once the pool is gone).
    pub(crate) fn pool(&self) -> Option<Arc<ServerPool>> {
        self.pool.get().and_then(Weak::upgrade)
    }
    /// Where the count of cancels that found the client with no server stands: read as its
    /// request starts looking for one, and handed to `set` or `set_later` once it has one.
    pub(crate) fn queue_mark(&self) -> u32 {
        self.queued_cancels.load(Ordering::Acquire)
    }
    /// The client was linked to a server (its batch is the one the backend runs next). A
    /// cancel that came since `mark` (while its request looked for a server, its wait ending
    /// as the cancel arrived) is armed: sent once the batch is written (`fire_armed`).
    pub(crate) fn set(&self, t: &Arc<CancelTarget>, mark: u32) {
        t.info.client.store(self.pid, Ordering::Relaxed);
        let mut g = self.target.lock().unwrap_or_else(|e| e.into_inner());
        // Nothing of the client's is on the server yet.
        self.set_phase_only(BackendPhase::Holding);
        if self.queued_cancels.load(Ordering::Acquire) != mark {
            t.in_flight.fetch_add(1, Ordering::SeqCst);
            *g = Target::Armed(t.clone());
            self.armed.store(true, Ordering::Release);
        } else {
            *g = Target::Now(t.clone());
        }
    }
    /// The client's batch waits behind others on `t` (see `Target::Later`); a cancel that
    /// came since `mark` is held for it.
    pub(crate) fn set_later(&self, t: &Arc<CancelTarget>, mark: u32) {
        let mut g = self.target.lock().unwrap_or_else(|e| e.into_inner());
        let requested = self.queued_cancels.load(Ordering::Acquire) != mark;
        *g = Target::Later { target: t.clone(), requested };
    }
    /// The backend pid of the server it is linked to (`SHOW CLIENTS`'s link), if any.
    pub(crate) fn linked_server(&self) -> Option<u64> {
        match &*self.target.lock().unwrap_or_else(|e| e.into_inner()) {
            Target::Now(t) | Target::Later { target: t, .. } | Target::Armed(t) => Some(t.info.id),
            Target::None => None,
        }
    }
    /// Notifications wait for the client's task (`notify::Notifier::take`).
    #[inline]
    pub(crate) fn has_notes(&self) -> bool {
        self.notes.load(Ordering::Acquire)
    }
    /// `server_fast_close`: its task checks its server at its next turn.
    pub(crate) fn recheck(&self) {
        self.recheck.store(true, Ordering::Release);
        self.kick();
    }
    /// Whether `recheck` asked for a look (a flag, so that the task's check costs no lock).
    #[inline]
    pub(crate) fn has_recheck(&self) -> bool {
        self.recheck.load(Ordering::Acquire)
    }
    /// Takes `recheck`'s request.
    pub(crate) fn take_recheck(&self) -> bool {
        self.recheck.swap(false, Ordering::AcqRel)
    }
    /// `KILL`: its task closes the client at its next turn.
    pub(crate) fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        self.kick();
    }
    /// Wakes the client's task (it then looks at `is_killed` and at the shutdown flag).
    pub(crate) fn kick(&self) {
        if let Some(w) = &*self.task.lock().unwrap_or_else(|e| e.into_inner()) {
            w.wake_by_ref();
        }
    }
    /// Registers the task that `kick` wakes (done once, then only if the task changed).
    /// Flags set before it are seen by the caller's check after it.
    pub(crate) fn watch(&self, w: &std::task::Waker) {
        let mut g = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if !g.as_ref().is_some_and(|t| t.will_wake(w)) {
            *g = Some(w.clone());
        }
    }
    /// Returns once `kill` was called (a client waiting for a server is closed too).
    pub(crate) async fn killed_while_queued(&self) {
        self.kicked_until(|| self.is_killed()).await
    }
    /// Completes once `done` holds, looked at each time the task is kicked (`watch`).
    async fn kicked_until(&self, done: impl Fn() -> bool) {
        std::future::poll_fn(|cx| {
            self.watch(cx.waker());
            if done() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
        })
        .await
    }
    /// Whether `kill` was called.
    pub(crate) fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }
    /// The client's batch reached the head of its connection: cancels go straight there
    /// from now on, and one held meanwhile is sent now.
    pub(crate) fn reached_head(&self) {
        let mut g = self.target.lock().unwrap_or_else(|e| e.into_inner());
        if let Target::Later { target, requested } = &*g {
            let (t, fire) = (target.clone(), *requested);
            if fire {
                t.in_flight.fetch_add(1, Ordering::SeqCst);
            }
            t.info.client.store(self.pid, Ordering::Relaxed);
            if fire {
                // The client's task sends it once its batch is written out.
                *g = Target::Armed(t);
                self.armed.store(true, Ordering::Release);
                drop(g);
                self.kick();
            } else {
                *g = Target::Now(t);
            }
        }
    }
    /// The client's task says what its linked backend is doing for it (`BackendPhase`), and how
    /// many requests its session has sent there (`Session::requests_sent`): cancels are
    /// forwarded at once only while it is not holding.
    #[inline]
    pub(crate) fn set_phase(&self, phase: BackendPhase, sent: u32) {
        let v = sent << 2 | phase as u32;
        if self.phase.load(Ordering::Relaxed) != v {
            self.phase.store(v, Ordering::Release);
        }
    }
    /// `set_phase` keeping the count of requests sent (a link made, a link ended).
    fn set_phase_only(&self, phase: BackendPhase) {
        self.set_phase(phase, self.phase.load(Ordering::Relaxed) >> 2);
    }
    /// `phase`'s two halves: the requests sent, and whether the client's request runs.
    fn batch_running(&self) -> (u32, bool) {
        let v = self.phase.load(Ordering::Acquire);
        (v >> 2, v & 3 == BackendPhase::Running as u32)
    }
    /// A cancel is armed (`Target::Armed`): the client's task calls `fire_armed` once its
    /// request runs.
    #[inline]
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }
    /// Sends the cancel held for the client's batch, now running (`Target::Armed`).
    pub(crate) fn fire_armed(self: &Arc<Self>) {
        let mut g = self.target.lock().unwrap_or_else(|e| e.into_inner());
        self.armed.store(false, Ordering::Release);
        let Target::Armed(t) = &*g else { return };
        let t = t.clone();
        *g = Target::Now(t.clone());
        drop(g);
        tracing::debug!(server_pid = t.pid, "held cancel request forwarded: the client's request runs");
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(send_for(self.clone(), t));
        } else {
            settle(&t);
        }
    }
    /// The client was unlinked.
    pub(crate) fn clear(&self) {
        let old = std::mem::take(&mut *self.target.lock().unwrap_or_else(|e| e.into_inner()));
        self.armed.store(false, Ordering::Release);
        self.set_phase_only(BackendPhase::Idle);
        match old {
            Target::Now(t) => {
                let _ = t.info.client.compare_exchange(self.pid, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
            // Its batch ended before it was all written: the held cancel has nothing to
            // cancel any more.
            Target::Armed(t) => {
                let _ = t.info.client.compare_exchange(self.pid, 0, Ordering::Relaxed, Ordering::Relaxed);
                settle(&t);
            }
            Target::Later { .. } | Target::None => {}
        }
    }
    /// Completes when a cancel has arrived for this client, with no server, since `mark`
    /// (`queue_mark`, read as its request started looking for a server).
    pub(crate) async fn cancelled_while_queued(&self, mark: u32) {
        self.kicked_until(|| self.queued_cancels.load(Ordering::Acquire) != mark).await
    }
    /// `query_timeout`: cancels what the client's server runs, as a CancelRequest of the
    /// client's own would (held, if its batch is queued behind others' on a shared one).
    pub(crate) fn cancel_own(self: &Arc<Self>) {
        let Begun::Send(t) = self.begin_cancel() else { return };
        tracing::debug!(server_pid = t.pid, "query_timeout: the running query is cancelled");
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(send_for(self.clone(), t));
        } else {
            settle(&t);
        }
    }

    /// Whether a cancel sent to `t` when the session had sent `sent` requests goes again
    /// (counted in flight if so): the client is still linked to `t`, its requests still
    /// run there and it sent none since, and no other client's batch waits behind it (a
    /// late signal would cancel that one).
    fn begin_refire(&self, t: &Arc<CancelTarget>, sent: u32) -> bool {
        let g = self.target.lock().unwrap_or_else(|e| e.into_inner());
        let again = matches!(&*g, Target::Now(cur) if Arc::ptr_eq(cur, t))
            && self.batch_running() == (sent, true)
            && !t.behind.load(Ordering::SeqCst);
        if again {
            t.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        again
    }

    /// What becomes of a cancel for this client (see `Begun`). Under the slot's lock, so a
    /// release (which clears the slot first) sees a count in flight, and `set` sees a
    /// cancel that found no server.
    fn begin_cancel(&self) -> Begun {
        let mut g = self.target.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *g {
            Target::Now(t) => {
                t.in_flight.fetch_add(1, Ordering::SeqCst);
                if self.phase.load(Ordering::Acquire) & 3 == BackendPhase::Holding as u32 {
                    *g = Target::Armed(t.clone());
                    self.armed.store(true, Ordering::Release);
                    return Begun::Armed;
                }
                Begun::Send(t.clone())
            }
            Target::Later { requested, .. } => {
                *requested = true;
                Begun::Held
            }
            // One is on its way already.
            Target::Armed(_) => Begun::Held,
            Target::None => {
                self.queued_cancels.fetch_add(1, Ordering::AcqRel);
                Begun::NoServer
            }
        }
    }
}

/// What `CancelSlot::begin_cancel` made of a cancel.
#[derive(Debug)]
enum Begun {
    /// Forward it to this server now (counted in flight on it).
    Send(Arc<CancelTarget>),
    /// Held for the client's batch queued behind others, or one is on its way already.
    Held,
    /// Counted in flight and armed: the client's task (kicked) sends it once the backend
    /// runs the client's request (`BackendPhase`).
    Armed,
    /// The client has no server: a wait for one ends (kicked), and a link that its wait's
    /// end made meanwhile arms it (`set`).
    NoServer,
}

/// Waits before a cancel goes again while the batch it was sent for still runs (`send_for`).
const REFIRE_MS: [u64; 3] = [10, 40, 160];

/// Forwards a cancel counted in flight on `t` for `slot`'s client (`send`), and again, a few
/// times, while the requests it was sent for still run and no other was sent. PostgreSQL
/// drops a signal that reaches the backend between two messages of a batch (before its
/// Execute has begun), and a cancel that waited for the request to start (held behind a
/// preamble, a shape check or other clients' batches, or for a server) is sent just as it
/// begins. A client of PostgreSQL itself would have sent it while its query ran.
async fn send_for(slot: Arc<CancelSlot>, t: Arc<CancelTarget>) {
    let (sent, _) = slot.batch_running();
    send(&t, slot.pool()).await;
    for ms in REFIRE_MS {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if !slot.begin_refire(&t, sent) {
            return;
        }
        tracing::debug!(server_pid = t.pid, "cancel request sent again: the batch it was sent for still runs");
        send(&t, slot.pool()).await;
    }
}

/// The lowest pid parsnip hands out: above every process id an operating system can give a
/// PostgreSQL backend (Linux's PID_MAX_LIMIT is 2^22; the BSDs and macOS stop at 99,999), so
/// `pg_terminate_backend(pid)` or a `pg_stat_activity` lookup with a client's pid can never
/// hit some other session's backend.
pub(crate) const FIRST_CLIENT_PID: i32 = (1 << 22) + 1;

/// All clients' cancel keys.
#[derive(Debug, Default)]
pub(crate) struct CancelRegistry {
    next_pid: AtomicI32,
    map: Mutex<HashMap<i32, (i32, Arc<CancelSlot>)>>,
    /// This instance's `peer_id` as it started (0: none), written into every key
    /// (`peers::stamp`).
    peer_id: u16,
}

impl CancelRegistry {
    /// A registry whose keys carry `peer_id` (0: all random).
    pub(crate) fn new(peer_id: u16) -> CancelRegistry {
        CancelRegistry { peer_id, ..CancelRegistry::default() }
    }
    /// The peer id its keys carry.
    pub(crate) fn peer_id(&self) -> u16 {
        self.peer_id
    }
    /// A fresh secret key.
    fn new_key(&self) -> i32 {
        super::peers::stamp(rand::random(), self.peer_id)
    }
    /// A new key pair for a client; `slot` is filled in by `attach`.
    /// The pid is in `FIRST_CLIENT_PID..=i32::MAX` and not held by a connected client; the
    /// key carries the instance's peer id (`peers::stamp`).
    pub(crate) fn register(&self) -> (i32, i32) {
        let key = self.new_key();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = self.next_pid.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
            let pid = FIRST_CLIENT_PID + n % (i32::MAX - FIRST_CLIENT_PID + 1);
            if let std::collections::hash_map::Entry::Vacant(e) = map.entry(pid) {
                e.insert((key, Arc::new(CancelSlot { pid, ..CancelSlot::default() })));
                return (pid, key);
            }
        }
    }
    /// A key pair whose pid is `real` (a session-mode client's backend pid), unless a
    /// connected client holds it; else as `register`.
    pub(crate) fn register_as(&self, real: Option<i32>) -> (i32, i32) {
        if let Some(pid) = real.filter(|p| *p > 0) {
            let key = self.new_key();
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if let std::collections::hash_map::Entry::Vacant(e) = map.entry(pid) {
                e.insert((key, Arc::new(CancelSlot { pid, ..CancelSlot::default() })));
                return (pid, key);
            }
        }
        self.register()
    }
    /// The slot of a registered pid.
    pub(crate) fn slot(&self, pid: i32) -> Arc<CancelSlot> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&pid).map(|(_, s)| s.clone()).unwrap_or_default()
    }
    /// Wakes every client's task (a shutdown has begun: each looks at `stopping`).
    pub(crate) fn kick_all(&self) {
        for (_, s) in self.map.lock().unwrap_or_else(|e| e.into_inner()).values() {
            s.kick();
        }
    }
    /// Every logged-in client's slot, by pid.
    pub(crate) fn clients(&self) -> Vec<Arc<CancelSlot>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = map.values().filter(|(_, s)| s.info.get().is_some()).map(|(_, s)| s.clone()).collect();
        v.sort_by_key(|s| s.pid);
        v
    }
    /// The client is gone.
    pub(crate) fn unregister(&self, pid: i32) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
    }
    /// Handles a CancelRequest: if the key matches, forward it to the client's server.
    pub(crate) async fn cancel(&self, pid: i32, key: &[u8]) {
        let slot = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&pid) {
                Some((k, slot)) if key == k.to_be_bytes() => slot.clone(),
                _ => {
                    tracing::debug!(pid, "cancel request with unknown key ignored");
                    return;
                }
            }
        };
        let t = match slot.begin_cancel() {
            Begun::Send(t) => t,
            other => {
                tracing::debug!(pid, outcome = ?other, "cancel request held for later, or answered in the queue");
                if matches!(other, Begun::Armed | Begun::NoServer) {
                    slot.kick();
                }
                return;
            }
        };
        tracing::debug!(pid, server_pid = t.pid, "cancel request forwarded");
        send_for(slot, t).await;
    }
}

/// Forwards a cancel counted in flight on `t`, then counts it done. Bounded: a cancel that
/// cannot reach the server must not keep the connection out of the pool for long.
///
/// With other clients' batches queued behind the query (`CancelTarget::behind`, read after
/// the cancel was counted in flight: a batch queued later is refused by `servers::lend`), a
/// server before PostgreSQL 18 is signalled through `pg_cancel_backend` (once) instead of a
/// CancelRequest (twice: the second signal may cancel the next batch).
async fn send(t: &CancelTarget, pool: Option<Arc<ServerPool>>) {
    t.signalled.store(true, Ordering::Release);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        if t.behind.load(Ordering::SeqCst)
            && !t.signals_once
            && let Some(pool) = pool
            && cancel_backend(&pool, t).await
        {
            return;
        }
        forward(t).await
    })
    .await;
    settle(t);
}

fn settle(t: &CancelTarget) {
    if t.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
        t.settled.notify_waiters();
    }
}

/// Sends one CancelRequest and waits until PostgreSQL closes that connection (it has
/// signalled the backend by then).
async fn forward(t: &CancelTarget) {
    let conn = if t.host.starts_with('/') {
        tokio::net::UnixStream::connect(format!("{}/.s.PGSQL.{}", t.host, t.port)).await.map(Stream::Unix)
    } else {
        tokio::net::TcpStream::connect((t.host.as_str(), t.port)).await.map(Stream::Tcp)
    };
    match conn {
        Ok(mut s) => {
            let _ = s.write_all(&startup::cancel_request(t.pid, &t.key)).await;
            let mut b = bytes::BytesMut::with_capacity(16);
            let _ = s.read_buf(&mut b).await;
        }
        Err(e) => tracing::warn!(error = %e, "could not forward cancel request"),
    }
}

/// Cancels what backend `pid` of `pool` runs, with `pg_cancel_backend` over a short-lived
/// connection of its own (outside the pool's count). Used when other clients' batches are
/// queued behind that query on its connection: for a CancelRequest, PostgreSQL up to
/// version 17 signals the backend twice (the process and its group), and the second signal
/// can land on the next batch once the first has ended the query. `pg_cancel_backend`
/// signals once. False when it could not be sent this way (the caller falls back to a
/// CancelRequest). The connection goes to the backend's own server (`t`'s host and port),
/// not to whichever host of a multi-host database the pool would choose: a pid means
/// nothing on another server.
pub(crate) async fn cancel_backend(pool: &ServerPool, t: &CancelTarget) -> bool {
    let Ok(c) = pool.connector().connect_to(&t.host, t.port).await else { return false };
    let mut c = Box::new(c);
    let pid = t.pid;
    let sent = c.run_checked(&format!("SELECT pg_cancel_backend({pid})"), pool.connect_timeout()).await.is_ok();
    if sent {
        pool.stats.pipelined_cancels.fetch_add(1, Ordering::Relaxed);
    }
    c.terminate().await;
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_pids_are_never_os_pids_and_never_shared() {
        let r = CancelRegistry::default();
        let (a, _) = r.register();
        assert_eq!(a, FIRST_CLIENT_PID);
        // Near the end of the range the counter wraps back above the OS range, skipping a
        // pid a connected client still holds.
        r.next_pid.store(i32::MAX - FIRST_CLIENT_PID, Ordering::Relaxed);
        assert_eq!(r.register().0, i32::MAX);
        let (c, _) = r.register();
        assert_eq!(c, FIRST_CLIENT_PID + 1, "wrapped, skipping {a} (still registered)");
        r.unregister(a);
        for _ in 0..1000 {
            let (p, _) = r.register();
            assert!(p >= FIRST_CLIENT_PID && p != a && p != c);
        }
    }

    fn target() -> Arc<CancelTarget> {
        Arc::new(CancelTarget {
            host: "/nowhere".into(),
            port: 1,
            pid: 7,
            key: vec![0; 4],
            in_flight: Default::default(),
            settled: Default::default(),
            signalled: Default::default(),
            behind: Default::default(),
            signals_once: true,
            info: Default::default(),
        })
    }

    #[test]
    fn a_cancel_overtaken_by_the_end_of_the_wait_for_a_server_is_armed_on_the_link() {
        // The client's request starts looking for a server; a cancel finds it with none; the
        // pool hands it a server before its wait saw the cancel.
        let slot = Arc::new(CancelSlot::default());
        let mark = slot.queue_mark();
        assert!(matches!(slot.begin_cancel(), Begun::NoServer));
        let t = target();
        slot.set(&t, mark);
        assert!(slot.is_armed(), "the cancel is kept for the batch, not lost");
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 1, "the server is not reused while it is owed");
        // A second cancel meanwhile adds nothing: one is on its way.
        assert!(matches!(slot.begin_cancel(), Begun::Held));
        // The batch ends before it was all written: nothing left to cancel.
        slot.clear();
        assert!(!slot.is_armed());
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 0);

        // A cancel from before the request (the client was idle) is not carried into it.
        assert!(matches!(slot.begin_cancel(), Begun::NoServer));
        let mark = slot.queue_mark();
        slot.set(&t, mark);
        assert!(!slot.is_armed());
        slot.clear();
    }

    #[test]
    fn a_cancel_waits_for_the_clients_request_to_run_and_is_repeated_only_into_it() {
        // A link with no cancel since its request began: one arriving before the backend runs
        // the client's request (its batch not all written, or the link's preamble ahead of
        // it) is armed; one arriving while it runs is forwarded at once.
        let slot = Arc::new(CancelSlot::default());
        let t = target();
        let mark = slot.queue_mark();
        slot.set(&t, mark);
        assert!(!slot.is_armed());
        assert!(matches!(slot.begin_cancel(), Begun::Armed));
        assert!(slot.is_armed());
        slot.fire_armed();
        assert!(!slot.is_armed());
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 0, "no runtime here: fired and settled");
        slot.set_phase(BackendPhase::Running, 3);
        let (sent, _) = slot.batch_running();
        assert!(matches!(slot.begin_cancel(), Begun::Send(_)));
        settle(&t);
        // Sent again while that batch runs; not into the next one.
        assert!(slot.begin_refire(&t, sent));
        settle(&t);
        slot.set_phase(BackendPhase::Idle, 3);
        assert!(!slot.begin_refire(&t, sent), "its replies are in");
        slot.set_phase(BackendPhase::Running, 5);
        assert!(!slot.begin_refire(&t, sent), "the client sent more since");
        slot.set_phase(BackendPhase::Holding, 5);
        assert!(matches!(slot.begin_cancel(), Begun::Armed), "the client's next batch, not yet written");
        slot.clear();
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 0);
        assert!(!slot.begin_refire(&t, 5), "unlinked");
    }

    #[test]
    fn a_cancel_overtaken_by_the_wait_is_held_for_a_batch_queued_behind_others() {
        let slot = Arc::new(CancelSlot::default());
        let mark = slot.queue_mark();
        assert!(matches!(slot.begin_cancel(), Begun::NoServer));
        let t = target();
        slot.set_later(&t, mark);
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 0, "nothing is sent while others' batches run");
        slot.reached_head();
        assert!(slot.is_armed());
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 1);
        slot.clear();
        assert_eq!(t.in_flight.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn keys_carry_the_peer_id_for_both_kinds_of_pid() {
        let r = CancelRegistry::new(5);
        let (pid, key) = r.register();
        assert!(pid >= FIRST_CLIENT_PID);
        assert_eq!((key as u32) >> 22, 5);
        // A session-mode client keeps its backend's real pid; the key still names the peer.
        let (pid, key) = r.register_as(Some(4242));
        assert_eq!(pid, 4242);
        assert_eq!((key as u32) >> 22, 5);
        let keys: std::collections::HashSet<i32> = (0..100).map(|_| r.register().1).collect();
        assert!(keys.len() > 90, "the low 22 bits are random");
    }
}
#[cfg(test)]
mod size {
    /// Every connected client holds one slot: what the console needs of it (its socket's
    /// descriptor, not its addresses; its session's shared settings, not a copy of its
    /// application_name; its pool's key through the pool) keeps it small.
    #[test]
    fn a_client_slot_stays_small() {
        let slot = std::mem::size_of::<super::CancelSlot>();
        // 152: the task's waker (kicked for KILL, shutdown and a cancel in the queue)
        // replaced two `Notify`s (184 B with them).
        assert!(slot <= 152, "CancelSlot is {slot} B");
    }
}
