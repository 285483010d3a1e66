//! Failovers under load through a `read-write` database with `failover_hold_ms`: a
//! primary with a synchronous standby, 16 clients writing one-statement transactions back
//! to back and 4 clients idle between transactions; the primary stopped (SIGKILL of its
//! postmaster, or the fast shutdown of a planned switchover) and the standby promoted at
//! once or 3 s later. Clients idle when it went get no error, each writer at most one (its transaction
//! in flight), no acknowledged commit is lost, and writes resume on the promoted server.
//! (`e2e_replicas` has the immediate stop with the promotion 2.6 s later, the reads of a
//! split meanwhile and fencing.)

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::*;

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// How the primary goes.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGKILL of the postmaster.
    SigKill,
    /// `pg_ctl stop -m fast` (a planned switchover).
    Fast,
}

/// A failover under load: the primary stopped as `stop` says, the standby promoted after
/// `promote_after`.
async fn failover(stop: Stop, promote_after: Duration) {
    let primary = Arc::new(blocking(start_primary).await);
    primary
        .psql("postgres", "CREATE TABLE t (id int8 PRIMARY KEY, note text NOT NULL)")
        .unwrap_or_else(|e| panic!("{e}"));
    let p = primary.clone();
    let standby = Arc::new(blocking(move || Standby::start(&p)).await);
    let (pp, sp) = (primary.port(), standby.port());
    for sql in ["ALTER SYSTEM SET synchronous_standby_names = 'standby'", "SELECT pg_reload_conf()"] {
        primary.psql("postgres", sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    {
        let pr = primary.clone();
        let t0 = Instant::now();
        blocking(move || {
            let sync = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'";
            while pr.psql("postgres", sync).ok().as_deref() != Some("1") {
                assert!(t0.elapsed() < Duration::from_secs(30), "the standby never became synchronous");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await;
    }
    let p = Arc::new(Parsnip::with_config(&format!(
        "auth_type = \"trust\"\nunix_socket_dir = \"\"\nserver_connect_timeout_ms = 2000\n\n\
         [databases.rw]\nhost = [\"127.0.0.1:{pp}\", \"127.0.0.1:{sp}\"]\ndbname = \"postgres\"\n\
         target_session_attrs = \"read-write\"\nfailover_hold_ms = 15000\npool_size = 24\n\n\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n"
    )));
    bounded(150, "failover", async {
        let halt = Arc::new(AtomicBool::new(false));
        let (logs, tasks, idle) = writers_and_idle(&p, "rw", 16, &halt).await;
        until_true("writers under way", Duration::from_secs(30), || {
            logs.iter().all(|l| l.lock().unwrap().acked.len() >= 5)
        })
        .await;

        let pr = primary.clone();
        blocking(move || match stop {
            Stop::SigKill => sigkill_postmaster(&pr),
            Stop::Fast => stop_primary(&pr, "fast"),
        })
        .await;
        let stopped = Instant::now();
        let idle_writes: Vec<_> = idle
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                tokio::spawn(async move {
                    let r = c.simple_query(&format!("INSERT INTO t VALUES ({}, 'held')", 200 + i)).await;
                    (r.map(|_| Instant::now()).map_err(|e| describe(&e)), c)
                })
            })
            .collect();
        // The scenario's own delay (a standby promoted by hand, or by a slow failover
        // manager), not a wait for anything.
        tokio::time::sleep(promote_after).await;
        let promoting = Instant::now();
        {
            let s = standby.clone();
            blocking(move || s.promote()).await;
        }
        let promoted = Instant::now();
        let mut firsts = Vec::new();
        for t in idle_writes {
            let (r, _c) = t.await.expect("idle client task");
            firsts
                .push(r.unwrap_or_else(|e| panic!("{stop:?}: a client idle when the primary went got an error: {e}")));
        }
        let marks: Vec<usize> = logs.iter().map(|l| l.lock().unwrap().acked.len()).collect();
        until_true("writes after the promotion", Duration::from_secs(20), || {
            logs.iter().zip(&marks).all(|(l, m)| l.lock().unwrap().acked.len() >= m + 5)
        })
        .await;
        halt.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("writer task");
        }

        let mut errors = Vec::new();
        let mut acked = Vec::new();
        for l in &logs {
            let l = l.lock().unwrap();
            assert!(l.errors.len() <= 1, "{stop:?}: a writer saw more than one error: {:?}", l.errors);
            errors.extend(l.errors.iter().cloned());
            for &(id, sent, at) in &l.acked {
                acked.push(id);
                if sent > stopped {
                    assert!(at > promoting, "{stop:?}: a write was acknowledged with no primary up");
                }
                // Writes sent before the stop returned may have waited for the new primary.
                if at > promoting {
                    firsts.push(at);
                }
            }
        }
        let first = firsts.iter().min().copied().expect("writes after the stop");
        let ms = |t: Instant| {
            if t >= promoted { (t - promoted).as_millis() as i64 } else { -((promoted - t).as_millis() as i64) }
        };
        eprintln!(
            "{stop:?}: writers' errors {errors:?}; first write {} ms after pg_ctl promote returned (which took {} ms)",
            ms(first),
            (promoted - promoting).as_millis()
        );
        assert!(!errors.iter().any(|c| c.contains("25006")), "a write reached a standby: {errors:?}");
        assert!(ms(first) < 1000, "{stop:?}: first write {} ms after the promote", ms(first));
        let direct = Pg::connect(sp, "postgres", Some(SUPER_PW), "postgres").await.expect("the promoted server");
        let row =
            direct.query_one("SELECT count(*) FROM t WHERE id = ANY($1::int8[])", &[&acked]).await.expect("count");
        assert_eq!(row.get::<_, i64>(0) as usize, acked.len(), "{stop:?}: acknowledged writes lost");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_primary_then_promotion() {
    if direct_mode() {
        return;
    }
    failover(Stop::SigKill, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_primary_then_promotion_3_s_later() {
    if direct_mode() {
        return;
    }
    failover(Stop::SigKill, Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_switchover_fast_shutdown_then_promotion() {
    if direct_mode() {
        return;
    }
    failover(Stop::Fast, Duration::ZERO).await;
}
