//! Looking for a server while none of a pool's hosts suits (a failover under way, with
//! `failover_hold_ms`): the clients that wait for one share the search. One try at a time
//! per pool, spaced by a back-off that starts at `FIRST` and doubles up to `CAP`, so a
//! promoted standby is found within about `CAP` without every waiting client logging in
//! to every host on its own clock; and the first success wakes every waiting client to
//! connect at once (the host that answered is then remembered first in the order tried).

use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The first pause between tries.
pub(crate) const FIRST: Duration = Duration::from_millis(10);

/// The longest pause between tries: how long after a promotion the waiting clients may
/// still be waiting (plus one connect). Each try costs a login on each host that is up.
pub(crate) const CAP: Duration = Duration::from_millis(100);

/// The shared search of one pool.
#[derive(Debug)]
pub(crate) struct Hunt {
    /// Held by the client whose turn it is to try (over its pause and its try).
    turn: tokio::sync::Mutex<()>,
    /// Bumped at each connection opened: the waiting clients try at once.
    found: watch::Sender<u64>,
    /// The next pause.
    pause: Mutex<Duration>,
}

impl Default for Hunt {
    fn default() -> Hunt {
        Hunt { turn: tokio::sync::Mutex::new(()), found: watch::Sender::new(0), pause: Mutex::new(FIRST) }
    }
}

/// What a waiting client does next.
pub(crate) enum Next<'a> {
    /// A connection was opened meanwhile: try now, alongside the others.
    Now,
    /// Its turn: try, holding the turn until done.
    Try(#[allow(dead_code)] tokio::sync::MutexGuard<'a, ()>),
    /// The hold ran out.
    Expired,
}

impl Hunt {
    /// Subscribes to successes before a client's first try, so one that comes during it
    /// is not missed.
    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.found.subscribe()
    }

    /// A connection was opened: the pauses start again from `FIRST`, and every waiting
    /// client tries at once.
    pub(crate) fn found(&self) {
        *self.pause.lock().unwrap_or_else(|e| e.into_inner()) = FIRST;
        self.found.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The pause before the next try, doubling the one after it up to `CAP`.
    fn next_pause(&self) -> Duration {
        let mut p = self.pause.lock().unwrap_or_else(|e| e.into_inner());
        let now = *p;
        *p = (now * 2).min(CAP);
        now
    }

    /// Waits for this client's next try after a failed one: until a success elsewhere
    /// (`Now`), or its turn and the pause after it (`Try`), or `end` (`Expired`).
    pub(crate) async fn next(&self, rx: &mut watch::Receiver<u64>, end: Instant) -> Next<'_> {
        let expiry = tokio::time::sleep_until(end.into());
        tokio::pin!(expiry);
        let turn = tokio::select! {
            biased;
            _ = rx.changed() => return Next::Now,
            g = self.turn.lock() => g,
            _ = &mut expiry => return Next::Expired,
        };
        let pause = self.next_pause();
        tokio::select! {
            biased;
            _ = rx.changed() => Next::Now,
            _ = &mut expiry => Next::Expired,
            _ = tokio::time::sleep(pause) => Next::Try(turn),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tries_back_off_and_a_success_wakes_every_waiter() {
        let hunt = std::sync::Arc::new(Hunt::default());
        let end = Instant::now() + Duration::from_secs(10);
        // One client alone: pauses 10, 20, 40, 80, 100, 100 ms.
        let mut rx = hunt.watch();
        let mut gaps = Vec::new();
        for _ in 0..6 {
            let t = Instant::now();
            assert!(matches!(hunt.next(&mut rx, end).await, Next::Try(_)));
            gaps.push(t.elapsed());
        }
        for (gap, want) in gaps.iter().zip([10, 20, 40, 80, 100, 100]) {
            assert!(*gap >= Duration::from_millis(want), "{gaps:?}");
        }
        // Waiters, one of them holding the turn (a 100 ms pause): a success wakes them
        // all at once.
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let h = hunt.clone();
            let mut rx = h.watch();
            waiters.push(tokio::spawn(async move {
                let t = Instant::now();
                let woke = matches!(h.next(&mut rx, end).await, Next::Now);
                (woke, t.elapsed())
            }));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        hunt.found();
        for w in waiters {
            let (woke, after) = w.await.expect("waiter");
            assert!(woke && after < CAP, "{woke} {after:?}");
        }
        // The pauses start again from the first.
        let mut rx = hunt.watch();
        let t = Instant::now();
        assert!(matches!(hunt.next(&mut rx, end).await, Next::Try(_)));
        assert!(t.elapsed() >= FIRST && t.elapsed() < FIRST * 2 + Duration::from_millis(40), "{:?}", t.elapsed());
        // The hold runs out.
        let soon = Instant::now() + Duration::from_millis(3);
        assert!(matches!(hunt.next(&mut rx, soon).await, Next::Expired));
    }
}
