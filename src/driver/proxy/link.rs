//! The linked server connection: getting one from the pool (or a pipelining ticket),
//! lending it to the next client's batch, giving it back, and settling it when the client
//! leaves (replies drained, transaction rolled back, reset in session mode).

use super::relay::{Pumped, large_frame, pass_streamed, pump, read_available};
use super::{Linked, Proxy, ServerWait};
use crate::config::PoolMode;
use crate::driver::pipe::Pipe;
use crate::driver::server_conn::ServerConn;
use crate::driver::servers::{self, ServerPool};
use crate::driver::split;
use crate::error::{Error, SqlState};
use crate::pool::{Checkout, Lease, PoolPurpose, home};
use crate::protocol::split_frame;
use crate::state::TxStatus;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

impl Proxy {
    pub(super) async fn acquire(&mut self) {
        // An idle connection or a place in the queue: no future beyond a oneshot receiver.
        // The slow path's future (connect, authenticate) is large, so it lives on the heap
        // only while used, not in every idle client's task.
        // The waits are boxed: their futures would otherwise be part of every client's task
        // for its whole life (idle clients' memory), and a free connection needs none.
        if self.session.get().wants_reads() {
            let primary_at = self.slot.live.primary_at.load(Ordering::Relaxed);
            let reads = match split::read_pool_for(&self.pool, primary_at) {
                split::ReadPool::Now(r) => r,
                split::ReadPool::AfterSample => Box::pin(split::read_pool_after_sample(&self.pool, primary_at)).await,
            };
            if let Some(reads) = reads {
                self.pool = reads;
            }
        }
        // Cancels from here on are for the request that wants the server.
        let mark = self.slot.queue_mark();
        loop {
            let got = match self.pool.checkout() {
                Checkout::Ready(c) if self.pool.connector().suspect() => {
                    match Box::pin(servers::checked(&self.pool, c)).await {
                        Some(c) => Ok(Lease::Own(c)),
                        None => continue,
                    }
                }
                Checkout::Ready(c) => Ok(Lease::Own(c)),
                Checkout::Queued(q) => {
                    let since = self.meter_waiting();
                    let r = Box::pin(self.wait_in_queue(q, mark)).await;
                    self.meter_waited(since);
                    r
                }
                Checkout::Slow => {
                    let since = self.meter_waiting();
                    let r = Box::pin(self.acquire_slow(false, mark)).await.map(Lease::Own);
                    self.meter_waited(since);
                    r
                }
            };
            match got {
                Ok(Lease::Own(mut s)) => {
                    // Opened on (or last moved to) another thread's event loop: it moves to
                    // this one, so its events wake this thread (`shards`). A socket that
                    // cannot be moved is broken: it is closed and the client tries again.
                    if s.home != home::here() {
                        if let Err(e) = s.stream.rehome() {
                            tracing::warn!(error = %e, "could not move a server connection to this thread");
                            servers::release(&self.pool, s, false);
                            continue;
                        }
                        s.home = home::here();
                    }
                    tracing::trace!(target: "parsnip::links", session = self.slot.pid, server = s.cancel.pid, "linked");
                    self.session.get().handle_server_linked(&mut s.state);
                    self.mark_reads();
                    self.slot.set(&s.cancel, mark);
                    self.server = Some(Linked::Own(s));
                }
                Ok(Lease::Ticket((pipe, t))) => {
                    let mut g = pipe.lock();
                    let head = g.is_head(t);
                    let dead = g.dead;
                    match g.conn.as_mut() {
                        Some(c) if !dead => {
                            let server = c.cancel.pid;
                            let session = self.slot.pid;
                            let ticket = t;
                            tracing::trace!(target: "parsnip::links", session, server, ticket, head, "shared");
                            self.session.get().handle_server_linked(&mut c.state);
                            self.mark_reads();
                            if !head {
                                self.session.get().set_behind();
                            }
                            if head {
                                self.slot.set(&c.cancel, mark);
                            } else {
                                self.slot.set_later(&c.cancel, mark);
                                g.watch_cancel(t, self.slot.clone());
                            }
                        }
                        _ => {
                            // It broke before this client wrote anything: ask again.
                            leave(&self.pool, g, t);
                            continue;
                        }
                    }
                    drop(g);
                    self.server = Some(Linked::Shared(pipe, t));
                }
                Err(e) => {
                    // No standby to be had: the read goes to the primary.
                    if e.code.0.starts_with("08")
                        && let Some(primary) = split::primary_of(&self.pool)
                    {
                        tracing::debug!(error = %e, "no standby for a read: the primary serves it");
                        self.pool = primary;
                        continue;
                    }
                    self.session.get().handle_acquire_failed(e)
                }
            }
            return;
        }
    }

    /// Linked from a read pool: the session writes only plain reads to that server.
    fn mark_reads(&mut self) {
        if self.pool.key.purpose == PoolPurpose::Reads {
            self.session.get().set_on_reads();
        }
    }

    /// The linked server went back: a client on a read pool returns to its own pool; one
    /// that ran more than plain reads on the primary of a split reads from it for
    /// `read_your_writes_ms`.
    fn after_release(&mut self) {
        let was_reads = self.pool.key.purpose == PoolPurpose::Reads;
        if was_reads && let Some(primary) = split::primary_of(&self.pool) {
            self.pool = primary;
        }
        // A reload may have given the pool a split since the client logged in.
        let has_split = self.pool.key.purpose == PoolPurpose::Reads || self.pool.connector().split().is_some();
        if !was_reads && has_split && !self.session.get().wants_reads() {
            self.slot.live.primary_at.store(split::tick(), Ordering::Relaxed);
        }
        self.session.get().set_read_split(has_split);
    }

    /// Session mode: the server bound at login (`login::bind_at_login`) is the client's from
    /// the start.
    pub(in crate::driver) fn link_at_login(&mut self, mut s: Box<ServerConn>) {
        self.session.get().handle_server_linked(&mut s.state);
        self.slot.set(&s.cancel, self.slot.queue_mark());
        self.server = Some(Linked::Own(s));
    }

    /// Waits in the pool's queue; a cancel or a `KILL` ends the wait. `mark`: the client's
    /// `CancelSlot::queue_mark` as its request began looking for a server (a cancel since
    /// then that the wait's end overtakes is armed on the link instead).
    pub(super) async fn wait_in_queue(
        &self,
        mut q: crate::pool::Queued<servers::ServerConnector>,
        mark: u32,
    ) -> Result<Lease<servers::ServerConnector>, Error> {
        let r = tokio::select! {
            biased;
            r = self.pool.wait_queued(&mut q) => r,
            _ = self.slot.cancelled_while_queued(mark) => Err(canceled_by_user()),
            _ = self.slot.killed_while_queued() => Err(killed_by_admin()),
        };
        if r.is_err() {
            servers::abandon(&self.pool, q);
        }
        match r {
            Ok(Some(c)) => Ok(c),
            Ok(None) => self.acquire_slow(true, mark).await.map(Lease::Own),
            Err(e) => Err(e),
        }
    }

    /// `woken`: the pool freed a slot for this client while it was queued. `mark`: as in
    /// `wait_in_queue`.
    pub(super) async fn acquire_slow(&self, woken: bool, mark: u32) -> Result<Box<ServerConn>, Error> {
        tokio::select! {
            r = Box::pin(async {
                if woken { self.pool.acquire_woken().await } else { self.pool.acquire().await }
            }) => r,
            _ = self.slot.cancelled_while_queued(mark) => Err(canceled_by_user()),
            _ = self.slot.killed_while_queued() => Err(killed_by_admin()),
        }
    }

    pub(super) fn release(&mut self, reusable: bool) {
        tracing::trace!(target: "parsnip::links", session = self.slot.pid, reusable, "release");
        self.slot.clear();
        match self.server.take() {
            Some(Linked::Own(mut s)) => {
                if let Some((t0, stmt)) = s.timing.take() {
                    // Until its replies were read (`ServerConn::read_at`), not until its
                    // session got to them.
                    let end = if s.read_at >= t0 { s.read_at } else { std::time::Instant::now() };
                    stmt.note(end.saturating_duration_since(t0).as_micros() as u64);
                }
                // Bytes left unread would belong to nobody: never reuse such a connection.
                // Bytes the session queued for it and never wrote were written against what
                // is recorded of it (`drop_unsent`): it is closed, and they go nowhere else.
                let unsent = self.drop_unsent();
                let clean = reusable && s.rbuf.is_empty() && s.streaming == 0 && !unsent;
                servers::release(&self.pool, s, clean);
            }
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                if !g.dead && !g.is_head(t) && g.wrote_as(t) && self.session.get().is_closing() {
                    // Given up before its turn (its client failed): its replies are still to
                    // come, and the tickets around it must not suffer. Settled on close.
                    drop(g);
                    self.server = Some(Linked::Shared(pipe, t));
                    return;
                }
                if !reusable || self.drop_unsent() {
                    // Its state is unknown from this ticket's batch on: the tickets ahead
                    // still get their replies, nobody behind can use it.
                    g.doom(t);
                }
                leave(&self.pool, g, t);
            }
            None => {}
        }
        self.after_release();
    }

    /// Drops what the session queued for the server being given back and never wrote;
    /// true when there was something. Those bytes were made for that server (statement
    /// names it was recorded to hold, settings replayed against its recorded ones): they
    /// must never reach the next server the client gets, and the one they were made for
    /// no longer matches its record.
    fn drop_unsent(&mut self) -> bool {
        let to_server = &mut self.session.get().to_server;
        if to_server.is_empty() {
            return false;
        }
        tracing::debug!(bytes = to_server.len(), "server given back with bytes queued for it: closed");
        to_server.clear();
        true
    }

    /// Lets the first queued client write its batch behind this one's on the linked
    /// server (the session has found the batch qualifies, and it is written out): this
    /// client goes on reading its replies, and writes nothing more there. True when a
    /// client took it.
    pub(super) fn lend(&mut self) -> bool {
        let depth = self.shared.cfg.load().pipeline_depth;
        let (pipe, t) = match self.server.take() {
            Some(Linked::Own(s)) => (Pipe::new(s), 0),
            Some(Linked::Shared(pipe, t)) => (pipe, t),
            None => return false,
        };
        // (`Pool::lend` refuses while a cancel is on its way: it could land on the batch
        // written behind this one.)
        let lent = servers::lend(&self.pool, &pipe, t, depth);
        if lent {
            tracing::trace!(target: "parsnip::links", session = self.slot.pid, ticket = t, "lent");
            self.session.get().set_lent();
        }
        self.server = Some(Linked::Shared(pipe, t));
        lent
    }

    /// The session ended normally: send what is left, settle the server, close.
    pub(super) async fn close(&mut self) {
        let out = std::mem::take(&mut self.session.get().to_client);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.write_all(&out)).await;
        self.settle_server().await;
    }

    /// `KILL`ed from the console: the client gets PostgreSQL's error for a terminated
    /// backend and is closed; its server (whatever it is doing) is closed too.
    pub(super) async fn killed(&mut self) {
        let e = killed_by_admin();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.client.write_all(&e.to_bytes())).await;
        self.slot.clear();
        match self.server.take() {
            Some(Linked::Own(s)) => servers::release(&self.pool, s, false),
            Some(Linked::Shared(pipe, t)) => {
                let mut g = pipe.lock();
                g.doom(t);
                leave(&self.pool, g, t);
            }
            None => {}
        }
    }

    /// The client vanished: settle the server.
    pub(super) async fn client_gone(&mut self) {
        self.settle_server().await;
    }

    /// Gives the linked server back in a clean state, or closes it.
    pub(super) async fn settle_server(&mut self) {
        tracing::trace!(target: "parsnip::links", session = self.slot.pid, "settle");
        self.slot.clear();
        if matches!(self.server, Some(Linked::Shared(..))) && !Box::pin(self.settle_shared()).await {
            return;
        }
        let Some(Linked::Own(mut s)) = self.server.take() else {
            return;
        };
        let cfg = self.shared.cfg.load_full();
        let t = cfg.server_connect_timeout();
        let mut ok = self.bring_to_idle(&mut s, &cfg).await;
        let mut ran = false;
        if ok && s.state.tx_status != TxStatus::Idle {
            ok = s.run_internal("ROLLBACK", t).await;
            ran = true;
        }
        if ok && self.pool.mode == PoolMode::Session && !cfg.server_reset_query.is_empty() {
            ok = s.run_internal(&cfg.server_reset_query, t).await;
            ran = true;
            if ok {
                s.state.settings.reset_all_extra();
            }
        }
        if ok && ran {
            // Under the client's timers: the session says whether they may have left a signal.
            ok = self.session.get().ran_at_release();
        }
        // A pinned client's session state (temporary tables, LISTEN, advisory locks, held
        // cursors) must not reach the next client; the connection's server statements are
        // the cache's, so DISCARD ALL is no answer: it is closed.
        if self.session.get().is_pinned() {
            ok = false;
        }
        servers::release(&self.pool, s, ok);
    }

    /// The client left: brings its server back to idle (`session::settle`) — what the
    /// session still had for it written out, then, unless the session saw it settled, a
    /// CopyFail and a Sync of parsnip's own and every reply up to that Sync's
    /// ReadyForQuery read through the session and dropped — within `server_connect_timeout`
    /// of `cfg` (the one the caller loaded). False when the
    /// connection cannot be reused (the bound passed, it broke, or the session gave it up).
    async fn bring_to_idle(&mut self, s: &mut ServerConn, cfg: &crate::config::Config) -> bool {
        let limit = cfg.server_connect_timeout();
        let session = self.session.get();
        session.drop_client_output();
        if session.server_settled() && session.to_server.is_empty() && s.rbuf.is_empty() && s.streaming == 0 {
            return session.settled_reusable();
        }
        session.settle_server();
        let out = std::mem::take(&mut session.to_server);
        let budget = (&self.shared.budget, cfg.max_buffered_bytes);
        let drained = tokio::time::timeout(limit, async {
            if s.stream.write_all(&out).await.is_err() {
                return false;
            }
            loop {
                // A frame held whole is dropped once handled: its reservation goes with it.
                let pumped = pump(session, s, budget, &mut None);
                session.drop_client_output();
                if session.outstanding() == 0 {
                    return s.streaming == 0;
                }
                if !matches!(pumped, Pumped::Read) || !session.to_server.is_empty() {
                    return false;
                }
                let ready = std::future::poll_fn(|cx| s.stream.poll_read_ready(cx)).await;
                if ready.is_err() {
                    return false;
                }
            }
        })
        .await
        .unwrap_or(false);
        if !drained {
            tracing::debug!("server connection closed: it did not come back to idle after its client left");
        }
        if !(drained && s.rbuf.is_empty() && session.settled_reusable()) {
            return false;
        }
        // What the session counted is in; nothing else may be on its way (`confirm_idle`).
        let idle = s.confirm_idle(limit).await;
        if !idle {
            tracing::debug!("server connection closed: replies nobody counted came after it was settled");
        }
        idle
    }

    /// The client left with a ticket on a shared connection. With tickets behind it (its
    /// batch was a plain one, lent), its replies are read and dropped, up to the
    /// ReadyForQuery messages it is owed, so the next ticket gets its own. Otherwise it
    /// waits for its turn and takes the connection back (true: settle it as an own one).
    pub(super) async fn settle_shared(&mut self) -> bool {
        let Some(Linked::Shared(pipe, t)) = self.server.take() else { return false };
        let limit = self.shared.cfg.load().server_connect_timeout();
        let mut owed = self.session.get().owed_ready();
        {
            let mut g = pipe.lock();
            // A writer that leaves with part of what the session wrote still unsent (the
            // server may hold half a message) waits for its turn like any ticket: the rest
            // is whole messages, and bringing the connection back to idle writes it first
            // (`bring_to_idle`). Killing the pipe now would fail the tickets ahead of it.
            // So does a writer that wrote nothing yet but has bytes queued for this server:
            // the session wrote them against what it knows of the server (the settings it
            // replays, the statements it prepares are recorded as done), so they must reach
            // it — taking the ticket back would leave that record wrong for every later user.
            if !g.dead && !g.wrote_as(t) && !self.session.get().to_server.is_empty() {
                // (Nothing is written until its turn: what waited for its write goes now.)
                g.push();
                g.note_write(t, false);
            }
            if g.dead || !g.wrote_as(t) {
                // Broken, or a ticket that never wrote: it leaves at once.
                leave(&self.pool, g, t);
                return false;
            }
        }
        let done = tokio::time::timeout(limit, async {
            loop {
                {
                    // Its turn, nobody behind and nothing owed: nothing to wait for (a
                    // client that left idle in a transaction has no reply coming).
                    let g = pipe.lock();
                    if g.dead {
                        return false;
                    }
                    if g.is_head(t) && (g.is_alone(t) || g.is_writer(t) || owed == 0) {
                        return true;
                    }
                }
                std::future::poll_fn(|cx| {
                    if ServerWait::Shared(&pipe, t).poll_read(cx) { Poll::Ready(()) } else { Poll::Pending }
                })
                .await;
                let mut g = pipe.lock();
                if g.dead {
                    return false;
                }
                let last = g.is_alone(t) || g.is_writer(t);
                let Some(c) = g.conn.as_mut() else { return false };
                if last {
                    return true;
                }
                if drop_replies(c, &mut owed) {
                    return false;
                }
                if owed == 0 {
                    return true;
                }
            }
        })
        .await
        .unwrap_or(false);
        let mut g = pipe.lock();
        if !done {
            // Given up: the tickets ahead keep what they have read (`Pipe::doom`).
            g.doom(t);
        }
        if !g.dead && g.is_head(t) && g.is_writer(t) && g.is_alone(t) {
            // Nobody else holds a ticket or can get one (only the writer lends).
            if let Some(c) = g.conn.take() {
                drop(g);
                self.server = Some(Linked::Own(c));
                return true;
            }
        }
        leave(&self.pool, g, t);
        false
    }
}

/// Ticket `t` leaves the pipe whose lock `g` is; the connection goes back to the pool (or
/// is closed, if broken or left with unread bytes) when no ticket is left.
fn leave(pool: &Arc<ServerPool>, mut g: std::sync::MutexGuard<'_, crate::driver::pipe::PipeInner>, t: u32) {
    if let Some(c) = g.finish(t) {
        // Read after `finish`, which may break it (`Pipe::doom`).
        let dead = g.dead;
        drop(g);
        servers::release_from_pipe(pool, c, dead);
    }
}

/// Reads what the server sent and drops whole frames up to the `owed`-th ReadyForQuery
/// (counted down), leaving what follows for the next ticket. True at end of stream.
fn drop_replies(c: &mut ServerConn, owed: &mut usize) -> bool {
    let eof = read_available(c);
    let mut at = 0;
    while *owed > 0 {
        if c.streaming > 0 {
            at = pass_streamed(c, at, None);
            if c.streaming > 0 {
                break;
            }
        }
        match split_frame(&c.rbuf[at..], 1 << 30) {
            Ok(Some(n)) => {
                if c.rbuf[at] == crate::protocol::tags::READY_FOR_QUERY {
                    *owed -= 1;
                }
                at += n;
            }
            Ok(None) => match large_frame(&c.rbuf[at..]) {
                // Not a ReadyForQuery (that is small): dropped as it comes.
                Some(total) => {
                    c.streaming = total - 5;
                    at += 5;
                }
                None => break,
            },
            Err(_) => break,
        }
    }
    c.consume(at);
    eof && *owed > 0
}

/// `KILL` or `KILL_CLIENT` while the client waited for a server: PostgreSQL's error for a
/// terminated backend.
fn killed_by_admin() -> Error {
    Error::fatal(SqlState::ADMIN_SHUTDOWN, "terminating connection due to administrator command")
}

fn canceled_by_user() -> Error {
    Error::new(SqlState::QUERY_CANCELED, "canceling statement due to user request")
}
