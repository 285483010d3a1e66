//! LISTEN/NOTIFY fan-out, the driver's side: per pool, one listening server connection
//! (`Notifier`, opened on the first LISTEN with the pool's connector, outside the pool's
//! size) holds `LISTEN` on the union of the channels its clients listen on and `UNLISTEN`s
//! a channel when its last listener leaves. Every NotificationResponse it receives is
//! posted, frame as received (the notifying backend's pid included), to the inbox of each
//! client listening on that channel (`Inbox`, kept here by the client's pid; its
//! `CancelSlot` carries only a flag), and that client's task is kicked; the session decides when the client gets it
//! (`session::notify`). A broken listening connection is opened again with backoff and
//! its channels listened on again; clients keep their subscriptions. With no channel left,
//! the connection is closed and its task ends.

use super::cancel::CancelSlot;
use super::server_conn::{ServerConn, read_frame};
use super::servers::ServerPool;
use crate::protocol::{backend, body, tags};
use bytes::{BufMut, BytesMut};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Notifications posted to one client, waiting for its task (see the module doc).
#[derive(Debug, Default)]
struct Inbox {
    frames: BytesMut,
    count: usize,
    /// Some were dropped: more than the session's cap were waiting.
    overflowed: bool,
}

impl Inbox {
    /// Posts one NotificationResponse frame (dropped, and the client told at its next turn,
    /// if it has too many waiting already).
    fn post(&mut self, frame: &[u8]) {
        if self.count < crate::session::MAX_QUEUED && self.frames.len() < crate::session::MAX_QUEUED_BYTES {
            self.frames.extend_from_slice(frame);
            self.count += 1;
        } else {
            self.overflowed = true;
        }
    }
}

/// One pool's listening connection and who listens on what (see the module doc).
#[derive(Debug)]
pub(crate) struct Notifier {
    state: Mutex<State>,
    /// The set of channels changed: the listening task syncs the server with it.
    wake: tokio::sync::Notify,
    /// Bumped each time the server's channels were brought in line (`wait_listened`).
    synced: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    chans: HashMap<Box<[u8]>, Chan>,
    /// What waits for each listening client (by pid) until its task takes it.
    inboxes: HashMap<i32, Inbox>,
    /// The listening task runs.
    running: bool,
}

#[derive(Debug, Default)]
struct Chan {
    subs: Vec<Arc<CancelSlot>>,
    /// The listening connection has run LISTEN on it (and not UNLISTEN since).
    on_server: bool,
    /// Notifications received on it, for the console.
    received: u64,
}

/// One channel as the console shows it.
pub(crate) struct ChannelRow {
    pub(crate) channel: String,
    pub(crate) listeners: usize,
    pub(crate) listened: bool,
    pub(crate) received: u64,
}

impl Default for Notifier {
    fn default() -> Notifier {
        Notifier { state: Mutex::default(), wake: tokio::sync::Notify::new(), synced: tokio::sync::watch::channel(0).0 }
    }
}

impl Notifier {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `slot`'s client listens on `ch` from now on. True when the listening connection has
    /// not run LISTEN on it yet (`wait_listened` waits for it).
    pub(crate) fn subscribe(self: &Arc<Self>, pool: &Arc<ServerPool>, ch: &[u8], slot: &Arc<CancelSlot>) -> bool {
        let mut g = self.state();
        let c = g.chans.entry(ch.into()).or_default();
        if !c.subs.iter().any(|s| s.pid == slot.pid) {
            c.subs.push(slot.clone());
        }
        let pending = !c.on_server;
        if pending {
            if !g.running {
                g.running = true;
                let (me, pool) = (self.clone(), Arc::downgrade(pool));
                tokio::spawn(async move { me.run(pool).await });
            }
            self.wake.notify_one();
        }
        pending
    }

    /// Client `pid` no longer listens on `ch`.
    pub(crate) fn unsubscribe(&self, ch: &[u8], pid: i32) {
        let mut g = self.state();
        if let Some(c) = g.chans.get_mut(ch) {
            c.subs.retain(|s| s.pid != pid);
            if c.subs.is_empty() {
                self.wake.notify_one();
            }
        }
    }

    /// What waits for client `pid`: the frames, and whether some were dropped.
    pub(crate) fn take(&self, slot: &CancelSlot) -> (BytesMut, bool) {
        let mut g = self.state();
        slot.notes.store(false, Ordering::Release);
        match g.inboxes.get_mut(&slot.pid) {
            Some(i) => {
                i.count = 0;
                (std::mem::take(&mut i.frames), std::mem::take(&mut i.overflowed))
            }
            None => (BytesMut::new(), false),
        }
    }

    /// Client `pid` listens on nothing any more (UNLISTEN *, or it left).
    pub(crate) fn unsubscribe_all(&self, pid: i32) {
        let mut g = self.state();
        g.inboxes.remove(&pid);
        let mut emptied = false;
        for c in g.chans.values_mut() {
            let before = c.subs.len();
            c.subs.retain(|s| s.pid != pid);
            emptied |= before > 0 && c.subs.is_empty();
        }
        if emptied {
            self.wake.notify_one();
        }
    }

    /// Waits (at most `limit`) until the listening connection listens on `ch`.
    pub(crate) async fn wait_listened(&self, ch: &[u8], limit: Duration) {
        let mut rx = self.synced.subscribe();
        let wait = async {
            loop {
                if self.state().chans.get(ch).is_none_or(|c| c.on_server) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(limit, wait).await.is_err() {
            tracing::warn!(channel = %String::from_utf8_lossy(ch), "LISTEN answered before the listening connection confirmed it");
        }
    }

    /// The channels, for `SHOW LISTENERS`.
    pub(crate) fn rows(&self) -> Vec<ChannelRow> {
        let g = self.state();
        let mut rows: Vec<ChannelRow> = g
            .chans
            .iter()
            .map(|(ch, c)| ChannelRow {
                channel: String::from_utf8_lossy(ch).into_owned(),
                listeners: c.subs.len(),
                listened: c.on_server,
                received: c.received,
            })
            .collect();
        rows.sort_by(|a, b| a.channel.cmp(&b.channel));
        rows
    }

    /// The listening task: connects, syncs, receives; reconnects with backoff.
    async fn run(self: Arc<Self>, pool: Weak<ServerPool>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            if self.stop_if_unused() {
                return;
            }
            let Some(p) = pool.upgrade() else {
                self.state().running = false;
                return;
            };
            let conn = crate::pool::Connector::connect(p.connector(), &p.stats).await;
            drop(p);
            let mut conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e.message, "listening connection: connect failed, retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            tracing::debug!(server_pid = conn.cancel.pid, "listening connection opened");
            if self.serve(&mut conn).await {
                conn.terminate().await;
                return;
            }
            tracing::warn!("listening connection lost: reconnecting and listening again");
            for c in self.state().chans.values_mut() {
                c.on_server = false;
            }
        }
    }

    /// Ends the task if no client listens on anything (under the lock a subscriber takes
    /// to start one). True: ended.
    fn stop_if_unused(&self) -> bool {
        let mut g = self.state();
        g.chans.retain(|_, c| !c.subs.is_empty());
        if g.chans.is_empty() {
            g.running = false;
            return true;
        }
        false
    }

    /// Serves one connection: true when no channel is left (close it), false when it
    /// broke.
    async fn serve(&self, conn: &mut ServerConn) -> bool {
        loop {
            let (sql, listen, unlisten) = {
                let mut g = self.state();
                // Channels nobody listens on and the server does not either are gone.
                g.chans.retain(|_, c| !c.subs.is_empty() || c.on_server);
                if g.chans.is_empty() {
                    g.running = false;
                    return true;
                }
                let mut sql = Vec::new();
                let (mut listen, mut unlisten) = (Vec::new(), Vec::new());
                for (ch, c) in &g.chans {
                    if !c.subs.is_empty() && !c.on_server {
                        statement(&mut sql, b"LISTEN ", ch);
                        listen.push(ch.clone());
                    } else if c.subs.is_empty() && c.on_server {
                        statement(&mut sql, b"UNLISTEN ", ch);
                        unlisten.push(ch.clone());
                    }
                }
                (sql, listen, unlisten)
            };
            if !sql.is_empty() {
                let mut out = BytesMut::with_capacity(sql.len() + 6);
                out.put_u8(tags::QUERY);
                out.put_u32((sql.len() + 5) as u32);
                out.put_slice(&sql);
                out.put_u8(0);
                if conn.stream.write_all(&out).await.is_err() || !self.until_ready(conn).await {
                    return false;
                }
                let mut g = self.state();
                for ch in &listen {
                    if let Some(c) = g.chans.get_mut(ch) {
                        c.on_server = true;
                    }
                }
                for ch in &unlisten {
                    if let Some(c) = g.chans.get_mut(ch) {
                        c.on_server = false;
                    }
                }
                drop(g);
                self.synced.send_modify(|n| *n += 1);
                continue;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                f = read_frame(&mut conn.stream, &mut conn.rbuf) => {
                    match f {
                        Ok(f) if self.on_frame(&f) => {}
                        _ => return false,
                    }
                }
            }
        }
    }

    /// Reads replies up to ReadyForQuery, posting notifications meanwhile. False: broken or
    /// the LISTEN/UNLISTEN failed (the connection is opened again).
    async fn until_ready(&self, conn: &mut ServerConn) -> bool {
        let mut ok = true;
        loop {
            let Ok(f) = read_frame(&mut conn.stream, &mut conn.rbuf).await else { return false };
            match f[0] {
                tags::READY_FOR_QUERY => return ok,
                tags::ERROR_RESPONSE => {
                    tracing::warn!(error = %backend::ErrorText(body(&f)), "listening connection: LISTEN failed");
                    ok = false;
                }
                _ => {
                    if !self.on_frame(&f) {
                        return false;
                    }
                }
            }
        }
    }

    /// A frame the listening connection received unasked: a notification is posted to its
    /// channel's listeners. False: the connection ends (an error: FATAL at a shutdown).
    fn on_frame(&self, f: &[u8]) -> bool {
        match f[0] {
            tags::NOTIFICATION_RESPONSE => {
                let b = body(f);
                let Some(ch) = b.get(4..).and_then(|r| r.split(|&c| c == 0).next()) else { return true };
                let mut g = self.state();
                let State { chans, inboxes, .. } = &mut *g;
                if let Some(c) = chans.get_mut(ch) {
                    c.received += 1;
                    for s in &c.subs {
                        inboxes.entry(s.pid).or_default().post(f);
                        s.notes.store(true, Ordering::Release);
                        s.kick();
                    }
                }
                true
            }
            tags::ERROR_RESPONSE => {
                tracing::info!(error = %backend::ErrorText(body(f)), "listening connection: server error");
                false
            }
            _ => true,
        }
    }
}

/// Appends `verb "channel";` (the name quoted, `"` doubled).
fn statement(sql: &mut Vec<u8>, verb: &[u8], ch: &[u8]) {
    sql.extend_from_slice(verb);
    sql.push(b'"');
    for &b in ch {
        if b == b'"' {
            sql.push(b'"');
        }
        sql.push(b);
    }
    sql.extend_from_slice(b"\";");
}
