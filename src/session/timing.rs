//! Timing executions of cached statements for their statistics and plan guard (issue 24,
//! `stmt::stats`, `stmt::guard`). The session has no clock: the driver tells it the time
//! (`set_clock`) when it reads one anyway — when a client's request starts, after a wait for
//! a server, before server frames are fed. An Execute of a portal bound from a cached
//! statement (or from the unnamed statement the guard ran as sent in its place) is stamped
//! when queued; its CommandComplete, PortalSuspended or ErrorResponse ends it. Its server
//! time runs from the later of its stamp and the end of the previous execution on that
//! server (the server runs one at a time), to the feed that brought its end.
//!
//! The same clock times a client's batches while a statement or lock timeout is in effect
//! (`note_cancel_risk`, `state::timers`): one that ran about as long may have left a cancel
//! signal on the backend, which the server's next user absorbs first.

use super::Session;
use crate::protocol::{body, read_cstr};
use crate::state::ServerState;
use crate::stmt::Statement;
use crate::stmt::guard::Verdict;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Session {
    /// The driver's clock, µs on a monotonic scale: what the next frames fed happen at.
    #[inline]
    pub(crate) fn set_clock(&mut self, us: u64) {
        self.busy.clock_us = us;
    }

    /// Whether an execution being timed waits for its reply, or a statement or lock timeout
    /// is in effect on the link (`note_cancel_risk` times batches against it): the driver
    /// reads the clock before feeding server frames only then, or when it needs the time
    /// itself.
    #[inline]
    pub(crate) fn timing(&self) -> bool {
        self.link.state().is_some_and(|l| l.timer_us != 0) || self.busy.replies.iter().any(|p| p.timed.is_some())
    }

    /// Whether a statement or lock timeout the session knows of may raise its error on the
    /// linked server at any moment (set for this client, or armed on this link).
    pub(super) fn may_be_cancelled(&self) -> bool {
        self.link.state().is_some_and(|l| l.timer_us != 0) || self.kept.settings.sets_a_timeout()
    }

    /// An Execute was just queued: if its portal was bound from a cached statement (or run
    /// as sent for one), its reply entry is stamped to be timed.
    pub(super) fn time_execute(&mut self, frame: &[u8]) {
        let Some((portal, _)) = read_cstr(body(frame)) else { return };
        let target = match (&self.stmts.last_bind, &self.stmts.last_plain) {
            (Some((p, s)), _) if **p == *portal => (s.clone(), true),
            (_, Some((p, s))) if **p == *portal => (s.clone(), false),
            _ => return,
        };
        let behind = self.link.state().is_some_and(|l| l.behind);
        if let Some(p) = self.busy.replies.last_mut() {
            p.timed = Some(target.0);
            p.timed_cached = target.1;
            p.sent_us = self.busy.clock_us;
            p.behind = behind;
        }
    }

    /// A statement or lock timeout of `us` µs (0: none) is in effect on this link from now.
    pub(super) fn shorten_timer(&mut self, us: u64) {
        if let Some(l) = self.link.state_mut() {
            l.timer_us = crate::state::timers::shorter(l.timer_us, us);
        }
    }

    /// A client's batch (or the Sync that settled its server) got its ReadyForQuery: if the
    /// server was busy with it at least half as long as a statement or lock timeout in
    /// effect on this link, that timer may have fired as a statement ended, and the backend
    /// may send an error and a ReadyForQuery of its own any moment now (`state::timers`):
    /// the server is closed when given back. So it is when its session still arms a timer
    /// so short that the settings replayed for the next client would run under it.
    pub(super) fn note_cancel_risk(&mut self, server: &mut ServerState) {
        let now = self.busy.clock_us;
        let Some(l) = self.link.state() else { return };
        if l.timer_us == 0 {
            return;
        }
        let fired = now.saturating_sub(l.busy_since_us).saturating_mul(2) >= l.timer_us;
        self.dirty_server_if(fired || server.settings.arm_a_tiny_timer());
    }

    /// The driver ran statements of its own on the linked server after its client left (the
    /// ROLLBACK of a block left open, the session-mode reset query). A statement or lock
    /// timer this short still in effect as they ran (a `SET LOCAL` one ends with that
    /// ROLLBACK) may have fired as they ended (`note_cancel_risk`). False when the server
    /// is not to be reused.
    pub(crate) fn ran_at_release(&mut self) -> bool {
        let tiny = self.link.state().is_some_and(|l| crate::state::timers::is_tiny(l.timer_us));
        self.dirty_server_if(tiny);
        !self.link.state().is_some_and(|l| l.dirty)
    }

    /// A cancel signal may be pending on the linked server's backend. Its next user absorbs
    /// it with a statement of the pooler's (`ServerState::cancel_risk`), unless the server's
    /// session still arms a statement or lock timer: that statement, and the settings
    /// replayed for the next client, would run under it and could leave a signal of their
    /// own, so the connection is closed when given back instead.
    pub(super) fn note_cancel_signal(&mut self, server: &mut ServerState) {
        server.cancel_risk = true;
        self.dirty_server_if(server.settings.cancel_timer_us() != 0);
    }

    /// A timed execution of `s` ended (`failed`: with an error) after returning `rows`;
    /// `behind`: it waited behind another client's batch, so it is counted, not timed.
    pub(super) fn execution_done(
        &mut self,
        s: &Arc<Statement>,
        cached: bool,
        sent_us: u64,
        behind: bool,
        rows: u64,
        failed: bool,
    ) {
        let last_done_us = self.link.state().map_or(0, |l| l.last_done_us);
        let us = self.busy.clock_us.saturating_sub(sent_us.max(last_done_us));
        if let Some(l) = self.link.state_mut() {
            l.last_done_us = self.busy.clock_us;
        }
        if behind {
            s.exec.count(cached, rows, failed);
            return;
        }
        s.exec.record(cached, us, rows, failed);
        if failed {
            return;
        }
        let Some(g) = s.guard.get() else { return };
        match g.record(cached, us) {
            Some(Verdict::Demoted { cached_us, as_sent_us }) => {
                if let Some(r) = &self.stmts.registry {
                    r.stats.demotions.fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!(
                    statement = %s.server_name,
                    cached_us,
                    as_sent_us,
                    query = %String::from_utf8_lossy(&s.query[..s.query.len().min(200)]),
                    "plan guard: the cached statement is slower than the query as sent; running it as sent for a while"
                );
            }
            Some(Verdict::Retried) => {
                tracing::debug!(statement = %s.server_name, "plan guard: trying the cached statement again");
            }
            None => {}
        }
    }
}
