//! What one client's traffic adds to its pool's figures (PgBouncer's `SHOW STATS`: queries,
//! transactions, bytes, query, transaction and wait times): the session counts queries and
//! transactions (`Session::take_tally`), this times them. Two clock reads per query (its
//! first bytes, and each read of server frames, also the session's clock for timing
//! executions: `session::timing`) and a few relaxed atomic adds per ReadyForQuery. Small:
//! every idle client's task carries it.

use super::Proxy;
use crate::driver::census;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A client's byte counts not yet added to its pool's figures, and when its query and
/// transaction began (`census::mono_us`; 0: none running).
#[derive(Debug, Default)]
pub(super) struct Meter {
    query_start: u64,
    xact_start: u64,
    received: u32,
    sent: u32,
}

fn add(a: &AtomicU64, n: u64) {
    if n > 0 {
        a.fetch_add(n, Ordering::Relaxed);
    }
}

impl Proxy {
    /// `n` bytes came from the client.
    pub(super) fn meter_received(&mut self, n: usize) {
        match self.meter.received.checked_add(n as u32).filter(|_| n <= u32::MAX as usize) {
            Some(v) => self.meter.received = v,
            None => add(&self.pool.stats.traffic.received, n as u64),
        }
    }

    /// `n` bytes went to the client.
    pub(super) fn meter_sent(&mut self, n: usize) {
        match self.meter.sent.checked_add(n as u32).filter(|_| n <= u32::MAX as usize) {
            Some(v) => self.meter.sent = v,
            None => add(&self.pool.stats.traffic.sent, n as u64),
        }
    }

    /// The client sent bytes: with nothing outstanding on its server, a query starts now.
    pub(super) fn meter_request(&mut self) {
        if self.meter.query_start != 0 || self.session.get().outstanding() > 0 {
            return;
        }
        let now = Instant::now();
        let t = census::mono_us(now);
        // The session times executions from it (`session::timing`).
        self.session.get().set_clock(t);
        self.meter.query_start = t;
        if self.meter.xact_start == 0 {
            self.meter.xact_start = t;
        }
        self.slot.live.request_us.store(census::unix_us_at(now), Ordering::Relaxed);
    }

    /// After server frames were fed: queries or transactions that ended are timed, and the
    /// figures go to the pool.
    /// `now`: when the server frames were read (`meter_server_read`; 0: not read).
    pub(super) fn meter_replies(&mut self, now: u64) {
        self.meter_pins();
        let Some(tally) = self.session.get().take_tally() else { return };
        let now = if now != 0 { now } else { census::mono_us(Instant::now()) };
        let more = self.session.get().outstanding() > 0;
        let m = &mut self.meter;
        let t = &self.pool.stats.traffic;
        let since = |start: u64| if start == 0 { 0 } else { now.saturating_sub(start) };
        if tally.queries > 0 {
            add(&t.query_us, since(m.query_start));
            m.query_start = if more { now } else { 0 };
        }
        if tally.xacts > 0 {
            add(&t.xact_us, since(m.xact_start));
            m.xact_start = if more || self.session.get().in_transaction() { now } else { 0 };
            self.slot.live.prepared.store(self.session.get().prepared_count() as u32, Ordering::Relaxed);
        }
        add(&t.queries, u64::from(tally.queries));
        add(&t.xacts, u64::from(tally.xacts));
        add(&t.binds, u64::from(tally.binds));
        for (class, n) in tally.errors() {
            t.errors(class, u64::from(n));
        }
        self.meter_bytes();
    }

    /// The bytes counted since the last call go to the pool.
    fn meter_bytes(&mut self) {
        let t = &self.pool.stats.traffic;
        add(&t.received, u64::from(std::mem::take(&mut self.meter.received)));
        add(&t.sent, u64::from(std::mem::take(&mut self.meter.sent)));
    }

    /// The client's pin reasons, once the server confirmed them, go to its console entry
    /// and its pool's figures when they changed (one relaxed load otherwise).
    fn meter_pins(&mut self) {
        let Some(now) = self.session.get().settled_pin_reasons() else { return };
        let was = self.slot.live.pinned.load(Ordering::Relaxed);
        if now.0 != was {
            self.slot.live.pinned.store(now.0, Ordering::Relaxed);
            self.pool.stats.pins_changed(was, now.0);
        }
    }

    /// The client is leaving: what is not added yet is added now.
    pub(in crate::driver) fn meter_finish(&mut self) {
        self.meter_replies(census::mono_us(Instant::now()));
        self.meter_bytes();
        let was = self.slot.live.pinned.swap(0, Ordering::Relaxed);
        self.pool.stats.pins_changed(was, 0);
    }

    /// The client starts waiting for a server.
    pub(super) fn meter_waiting(&self) -> Instant {
        let now = Instant::now();
        self.slot.live.waiting_since_us.store(census::unix_us_at(now), Ordering::Relaxed);
        now
    }

    /// Server frames are about to be fed: when an execution is being timed, the session's
    /// clock is set for them (a clock read `meter_replies` uses too; 0: none read).
    pub(super) fn meter_server_read(&mut self) -> u64 {
        if !self.session.get().timing() {
            return 0;
        }
        let t = census::mono_us(Instant::now());
        self.session.get().set_clock(t);
        t
    }

    /// The client waited since `since` for a server: what it sends next is sent now.
    pub(super) fn meter_waited(&mut self, since: Instant) {
        let now = Instant::now();
        self.session.get().set_clock(census::mono_us(now));
        self.pool.stats.traffic.waited(now.saturating_duration_since(since).as_micros() as u64);
        self.slot.live.waiting_since_us.store(0, Ordering::Relaxed);
    }
}
