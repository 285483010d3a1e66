//! Databases with several hosts against real streaming replication (a primary and a hot
//! standby made with pg_basebackup): target_session_attrs routes each database's server
//! connections to the right server, a write through parsnip replays on the standby, no
//! qualifying host gives a prompt 08006 naming the hosts, and after the primary is killed
//! and the standby promoted a read-write database serves writes from the promoted server
//! within seconds, with no write ever reaching a standby (no 25006).

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio_postgres::SimpleQueryMessage;

fn db(name: &str, hosts: &[u16], attrs: &str) -> String {
    let list: Vec<String> = hosts.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    format!(
        "[databases.{name}]\nhost = [{}]\ndbname = \"postgres\"\ntarget_session_attrs = \"{attrs}\"\n",
        list.join(", ")
    )
}

fn config(dbs: &[String]) -> String {
    format!(
        "auth_type = \"trust\"\nunix_socket_dir = \"\"\nserver_connect_timeout_ms = 2000\n\
         server_login_retry_ms = 100\nserver_connect_attempts = 2\n\n{}\n[users.postgres]\npassword = \"{SUPER_PW}\"\n",
        dbs.join("\n")
    )
}

/// True on success; else the error's SQLSTATE goes to `seen`.
fn succeeded<T>(r: Result<T, tokio_postgres::Error>, seen: &mut Vec<String>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) => {
            seen.push(sqlstate(&e).unwrap_or_else(|| format!("no sqlstate ({e})")));
            false
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// A primary with table `t (id int PRIMARY KEY, note text NOT NULL)` and one standby
/// streaming from it.
async fn primary_with_table_and_standby() -> (std::sync::Arc<parsnip::embedded::Cluster>, std::sync::Arc<Standby>) {
    let primary = blocking(start_primary).await;
    primary
        .psql("postgres", "CREATE TABLE t (id int PRIMARY KEY, note text NOT NULL)")
        .unwrap_or_else(|e| panic!("{e}"));
    let primary = std::sync::Arc::new(primary);
    let p = primary.clone();
    let standby = std::sync::Arc::new(blocking(move || Standby::start(&p)).await);
    (primary, standby)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_session_attrs_route_to_the_primary_or_the_standby() {
    if direct_mode() {
        return;
    }
    let (primary, standby) = primary_with_table_and_standby().await;
    let (pp, sp, dead) = (primary.port(), standby.port(), free_port());
    let p = Parsnip::with_config(&config(&[
        db("rw", &[sp, pp], "read-write"),
        db("pri", &[sp, pp], "primary"),
        db("ro", &[pp, sp], "read-only"),
        db("sb", &[pp, sp], "standby"),
        db("ps", &[pp, sp], "prefer-standby"),
        db("ps_fallback", &[dead, pp], "prefer-standby"),
        db("anyhost", &[dead, sp, pp], "any"),
        format!("{}failover_hold_ms = 500\n", db("nowhere", &[dead, sp], "read-write")),
    ]));
    bounded(120, "routing", async {
        let recovery = "select pg_is_in_recovery()";
        for (name, want) in
            [("rw", "f"), ("pri", "f"), ("ro", "t"), ("sb", "t"), ("ps", "t"), ("ps_fallback", "f"), ("anyhost", "t")]
        {
            let c = p.connect("postgres", SUPER_PW, name).await;
            let got = c.scalar(recovery).await.unwrap_or_else(|e| panic!("{name}: {}\n{}", describe(&e), p.log_tail()));
            assert_eq!(got, want, "{name}: pg_is_in_recovery()");
        }

        // A write through the read-write database lands on the primary and replays.
        let rw = p.connect("postgres", SUPER_PW, "rw").await;
        rw.simple_query("INSERT INTO t VALUES (1, 'via parsnip')").await.expect("insert through rw");
        let lsn = primary.psql("postgres", "SELECT pg_current_wal_lsn()").expect("primary LSN");
        {
            let s = standby.clone();
            blocking(move || s.wait_replayed(&lsn, Duration::from_secs(30))).await;
        }
        let sb = p.connect("postgres", SUPER_PW, "sb").await;
        assert_eq!(sb.scalar("SELECT note FROM t WHERE id = 1").await.unwrap(), "via parsnip");
        // The standby database really is on a standby: a write there fails with 25006.
        expect_code(sb.simple_query("INSERT INTO t VALUES (2, 'no')").await, "25006", "write on sb");

        // No host qualifies: clients wait failover_hold_ms (500 here) for one, then get an
        // error naming each host and why.
        let t0 = Instant::now();
        let e = p.try_connect("postgres", Some(SUPER_PW), "nowhere").await.err().expect("nowhere must fail");
        let elapsed = t0.elapsed();
        let d = e.as_db_error().unwrap_or_else(|| panic!("not a server error: {e:?}"));
        assert_eq!(d.code().code(), "08006", "{}", d.message());
        assert!(d.message().contains("target_session_attrs=read-write"), "{}", d.message());
        assert!(d.message().contains(&format!("127.0.0.1:{dead}")), "{}", d.message());
        assert!(d.message().contains(&format!("127.0.0.1:{sp}: is a standby")), "{}", d.message());
        assert!(elapsed >= Duration::from_millis(500), "error after {elapsed:?}, before failover_hold_ms");
        assert!(elapsed < Duration::from_millis(1500), "error after {elapsed:?}, long after failover_hold_ms");

        // SHOW DATABASES shows the host list.
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let rows = console.simple_query("SHOW DATABASES").await.expect("SHOW DATABASES");
        let host = rows.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("name") == Some("rw") => r.get("host").map(str::to_owned),
            _ => None,
        });
        assert_eq!(host, Some(format!("127.0.0.1:{sp},127.0.0.1:{pp}")));

        // A reload that changes target_session_attrs: rw's open connection (to the
        // primary) is closed as it comes back, the next transaction runs on the standby.
        let rw_pid = rw.scalar("select pg_backend_pid()").await.unwrap();
        p.rewrite_config(&config(&[db("rw", &[sp, pp], "standby")]));
        console.simple_query("RELOAD").await.unwrap_or_else(|e| panic!("RELOAD: {}\n{}", describe(&e), p.log_tail()));
        assert_eq!(rw.scalar(recovery).await.unwrap(), "t", "after the reload rw goes to the standby");
        assert_ne!(rw.scalar("select pg_backend_pid()").await.unwrap(), rw_pid);
    })
    .await;

    // libpq's multi-host URL, with target_session_attrs as a parameter (the standby,
    // first, is up and skipped).
    let url = format!(
        "postgres://postgres:{SUPER_PW}@127.0.0.1:{sp},127.0.0.1:{pp}/postgres?target_session_attrs=read-write"
    );
    let u = Parsnip::start(&[&url]);
    bounded(60, "url", async {
        let c = u.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select pg_is_in_recovery()").await.unwrap(), "f", "{}", u.log_tail());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_load_balancing_spreads_connections_over_standbys() {
    if direct_mode() {
        return;
    }
    let primary = std::sync::Arc::new(blocking(start_primary).await);
    let mut standbys = Vec::new();
    for _ in 0..2 {
        let p = primary.clone();
        standbys.push(blocking(move || Standby::start(&p)).await);
    }
    let ports: Vec<u16> = standbys.iter().map(Standby::port).collect();
    let spread = format!("{}load_balance_hosts = \"random\"\npool_size = 16\n", db("spread", &ports, "standby"));
    let p = Parsnip::with_config(&config(&[spread]));
    bounded(60, "spread", async {
        // 16 clients each hold a server connection (a transaction open): 16 new server
        // connections, each to a standby drawn at random (all on one: p = 2^-15).
        let mut clients = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..16 {
            let c = p.connect("postgres", SUPER_PW, "spread").await;
            c.simple_query("BEGIN").await.expect("BEGIN");
            assert_eq!(c.scalar("select pg_is_in_recovery()").await.unwrap(), "t");
            seen.insert(c.scalar("select inet_server_port()").await.unwrap());
            clients.push(c);
        }
        let want: std::collections::BTreeSet<String> = ports.iter().map(u16::to_string).collect();
        assert_eq!(seen, want, "server connections went to both standbys");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_database_follows_a_promoted_standby() {
    if direct_mode() {
        return;
    }
    let (primary, standby) = primary_with_table_and_standby().await;
    let (pp, sp) = (primary.port(), standby.port());
    // Without the hold (failover_hold_ms = 0): clients get 08006 while no primary is up.
    let rw = format!("{}failover_hold_ms = 0\n", db("rw", &[sp, pp], "read-write"));
    let p = Parsnip::with_config(&config(&[rw]));
    bounded(120, "failover", async {
        let mut w = p.connect("postgres", SUPER_PW, "rw").await;
        assert_eq!(w.scalar("select pg_is_in_recovery()").await.unwrap(), "f");
        for id in 1..=50 {
            w.simple_query(&format!("INSERT INTO t VALUES ({id}, 'before')")).await.expect("insert before the kill");
        }
        let lsn = primary.psql("postgres", "SELECT pg_current_wal_lsn()").expect("primary LSN");
        {
            let s = standby.clone();
            blocking(move || s.wait_replayed(&lsn, Duration::from_secs(30))).await;
        }
        let replayed: i64 = standby.psql("SELECT count(*) FROM t").parse().expect("count");
        assert_eq!(replayed, 50, "all 50 rows replayed before the kill");

        // The primary dies; writes fail meanwhile, and never on the standby.
        let killed = Instant::now();
        {
            let pr = primary.clone();
            blocking(move || kill_primary(&pr)).await;
        }
        let mut seen: Vec<String> = Vec::new();
        for id in 51..=53 {
            let ok = succeeded(w.simple_query(&format!("INSERT INTO t VALUES ({id}, 'no primary')")).await, &mut seen);
            assert!(!ok, "a write succeeded with no primary up");
            if w.is_closed() {
                w = p.connect("postgres", SUPER_PW, "rw").await;
            }
        }
        {
            let s = standby.clone();
            blocking(move || s.promote()).await;
        }
        let promoted = Instant::now();
        let mut id = 100;
        loop {
            id += 1;
            if succeeded(w.simple_query(&format!("INSERT INTO t VALUES ({id}, 'after')")).await, &mut seen) {
                break;
            }
            let waited = promoted.elapsed();
            assert!(waited < Duration::from_secs(10), "no write succeeded 10 s after the promotion: {seen:?}");
            if w.is_closed() {
                match p.try_connect("postgres", Some(SUPER_PW), "rw").await {
                    Ok(c) => w = c,
                    Err(e) => seen.push(sqlstate(&e).unwrap_or_else(|| "no sqlstate".into())),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (after_kill, after_promote) = (killed.elapsed(), promoted.elapsed());
        eprintln!(
            "failover: first write {} ms after the kill, {} ms after pg_ctl promote returned; errors meanwhile: \
                {seen:?}",
            after_kill.as_millis(),
            after_promote.as_millis()
        );
        assert!(!seen.iter().any(|c| c == "25006"), "a write reached a standby: {seen:?}");
        assert_eq!(w.scalar("select pg_is_in_recovery()").await.unwrap(), "f");
        let replayed = w.scalar("SELECT count(*) FROM t WHERE id <= 50").await.unwrap();
        assert_eq!(replayed, "50", "rows replayed before the kill");
        assert_eq!(w.scalar(&format!("SELECT note FROM t WHERE id = {id}")).await.unwrap(), "after");
        // A new client goes to the promoted server as well.
        let fresh = p.connect("postgres", SUPER_PW, "rw").await;
        fresh.simple_query(&format!("INSERT INTO t VALUES ({}, 'fresh')", id + 1)).await.expect("fresh client writes");
        assert_eq!(standby.psql(&format!("SELECT note FROM t WHERE id = {}", id + 1)), "fresh");
    })
    .await;
}

/// Polls `sql` through `c` until it answers `want` (bounded); panics with the last answer.
async fn until(c: &Pg, sql: &str, want: &str, within: Duration, what: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let got = c.scalar(sql).await.unwrap_or_else(|e| panic!("{what}: {}", describe(&e)));
        if got == want {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < within, "{what}: still {got:?} after {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_split_reads_from_a_fresh_standby_and_writes_on_the_primary() {
    if direct_mode() {
        return;
    }
    let (primary, standby) = primary_with_table_and_standby().await;
    let (pp, sp) = (primary.port(), standby.port());
    let split = format!(
        "{}read_write_split = true\nmax_replica_lag_ms = 300\nread_your_writes_ms = 500\n",
        db("split", &[pp, sp], "read-write")
    );
    let p = Parsnip::with_config(&format!("log_level = \"parsnip=debug\"\n{}", config(&[split])));
    let where_ = "select pg_is_in_recovery()::text || ':' || count(*) from t";
    bounded(90, "split", async {
        let r = p.connect("postgres", SUPER_PW, "split").await;
        let w = p.connect("postgres", SUPER_PW, "split").await;
        // Autocommit reads go to the standby once its lag was sampled.
        until(&r, where_, "true:0", Duration::from_secs(5), "a read on the standby").await;
        // A transaction, and the reads right after it, run on the primary.
        r.simple_query("BEGIN").await.unwrap();
        assert_eq!(r.scalar(where_).await.unwrap(), "false:0", "in a transaction");
        r.simple_query("COMMIT").await.unwrap();
        assert_eq!(r.scalar(where_).await.unwrap(), "false:0", "read_your_writes_ms after the primary");
        // A write, and the writer reads it at once (on the primary).
        w.simple_query("INSERT INTO t VALUES (1, 'one')").await.expect("write through the split");
        assert_eq!(w.scalar(where_).await.unwrap(), "false:1", "the writer reads its write");
        // The other client reads from the standby again once it replayed it.
        until(&r, where_, "true:1", Duration::from_secs(5), "the standby caught up").await;

        // Replay paused and the primary writing: the standby lags, reads go to the primary.
        standby.psql("SELECT pg_wal_replay_pause()");
        w.simple_query("INSERT INTO t VALUES (2, 'two')").await.expect("second write");
        let lagged = until(&r, where_, "false:2", Duration::from_secs(5), "a lagging standby serves no reads").await;
        // Replay resumed: back on the standby.
        standby.psql("SELECT pg_wal_replay_resume()");
        let back = until(&r, where_, "true:2", Duration::from_secs(5), "the standby serves reads again").await;
        eprintln!("split: reads left the lagging standby after {lagged:?}, came back {back:?} after resume");
        // Extended-protocol statements (not routed by the split) run on the primary.
        let stmt = r.prepare("select note from t where id = $1").await.expect("prepare");
        for _ in 0..3 {
            let row = r.query_one(&stmt, &[&1i32]).await.expect("execute");
            assert_eq!(row.get::<_, String>(0), "one");
        }
        let on = r.prepare("select pg_is_in_recovery()").await.expect("prepare");
        assert!(!r.query_one(&on, &[]).await.expect("execute").get::<_, bool>(0), "on the primary");
        // The standby promoted (no standby left): reads go to the primary's pool, even
        // though the read pool still holds connections to the promoted server.
        {
            let s = standby.clone();
            blocking(move || s.promote()).await;
        }
        let port = "select inet_server_port()::text";
        until(&r, port, &pp.to_string(), Duration::from_secs(5), "reads with no standby left").await;
        let t0 = Instant::now();
        assert_eq!(r.scalar(port).await.unwrap(), pp.to_string());
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "a read took {:?}: no failed standby connects first",
            t0.elapsed()
        );
        // The read pool is not a row of SHOW POOLS; its servers are in SHOW SERVERS.
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let pools = console.simple_query("SHOW POOLS").await.unwrap();
        let rows = pools
            .iter()
            .filter(|m| matches!(m, SimpleQueryMessage::Row(x) if x.get("database") == Some("split")))
            .count();
        assert_eq!(rows, 1, "one SHOW POOLS row per (database, user)");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_holds_waiting_clients_and_reads_stay_on_the_standby() {
    if direct_mode() {
        return;
    }
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (primary, standby) = primary_with_table_and_standby().await;
    let (pp, sp) = (primary.port(), standby.port());
    // A synchronous standby: no acknowledged commit may be lost in the failover.
    for sql in ["ALTER SYSTEM SET synchronous_standby_names = 'standby'", "SELECT pg_reload_conf()"] {
        primary.psql("postgres", sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let sync = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'";
    {
        let pr = primary.clone();
        let t0 = Instant::now();
        blocking(move || {
            while pr.psql("postgres", sync).ok().as_deref() != Some("1") {
                assert!(t0.elapsed() < Duration::from_secs(30), "the standby never became synchronous");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await;
    }
    let rw = format!("{}failover_hold_ms = 15000\npool_size = 16\n", db("rw", &[pp, sp], "read-write"));
    let split = format!("{}read_write_split = true\n", db("split", &[pp, sp], "read-write"));
    let sb = format!("{}failover_hold_ms = 0\n", db("sb", &[pp, sp], "standby"));
    let p = Arc::new(Parsnip::with_config(&config(&[rw, split, sb])));
    bounded(150, "failover with a hold", async {
        let stop = Arc::new(AtomicBool::new(false));
        // Clients that are between transactions when the primary dies: one write each now.
        let (logs, tasks, idle) = writers_and_idle(&p, "rw", 8, &stop).await;
        let reader = p.connect("postgres", SUPER_PW, "split").await;
        let on_standby = "select pg_is_in_recovery()::text";
        until(&reader, on_standby, "true", Duration::from_secs(10), "a read on the standby").await;
        // A standby database: its connection (to the standby) stays idle in its pool.
        let sbc = p.connect("postgres", SUPER_PW, "sb").await;
        assert_eq!(sbc.scalar(on_standby).await.expect("standby database"), "true");
        until_true("writers under way", Duration::from_secs(30), || {
            logs.iter().all(|l| l.lock().unwrap().acked.len() >= 5)
        })
        .await;

        {
            let pr = primary.clone();
            blocking(move || kill_primary(&pr)).await;
        }
        let killed = Instant::now();
        // The idle clients ask for a server while no primary is up: they wait, then write.
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
        // Reads go on on the standby while the primary is down, also once the lag sample
        // taken before the kill is older than it is trusted for (2 s): waiting here is the
        // scenario (the sample ages), not synchronization.
        assert_eq!(reader.scalar(on_standby).await.expect("a read with the primary down"), "true");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let t0 = Instant::now();
        assert_eq!(reader.scalar(on_standby).await.expect("a read after the sample aged"), "true");
        assert!(t0.elapsed() < Duration::from_secs(1), "the read took {:?}", t0.elapsed());

        // pg_ctl promote returns once it saw the server out of recovery (it polls), so a
        // waiting client may be through before it returns.
        let promoting = Instant::now();
        {
            let s = standby.clone();
            blocking(move || s.promote()).await;
        }
        let promoted = Instant::now();
        let mut idle_done = Vec::new();
        for t in idle_writes {
            let (r, c) = t.await.expect("idle client task");
            let at = r.unwrap_or_else(|e| panic!("a client idle when the primary died got an error: {e}"));
            idle_done.push(at);
            drop(c);
        }
        let marks: Vec<usize> = logs.iter().map(|l| l.lock().unwrap().acked.len()).collect();
        until_true("writes after the promotion", Duration::from_secs(20), || {
            logs.iter().zip(&marks).all(|(l, m)| l.lock().unwrap().acked.len() >= m + 5)
        })
        .await;
        // The promotion was seen: the standby database's connection to the promoted server
        // is closed, and with no standby left it gets 08006 (never a primary's answer
        // beyond the janitor's next pass).
        let t0 = Instant::now();
        loop {
            match sbc.scalar(on_standby).await {
                Ok(v) => assert_eq!(v, "false", "the standby database's connection"),
                Err(e) => {
                    assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{}", describe(&e));
                    break;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "a standby pool kept its connection to the promoted server");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("writer task");
        }

        let mut errors = Vec::new();
        let mut first_after: Option<Instant> = None;
        let mut acked = Vec::new();
        for l in &logs {
            let l = l.lock().unwrap();
            // One error at most per writer: the transaction in flight when the primary died.
            assert!(l.errors.len() <= 1, "a writer saw more than one error: {:?}", l.errors);
            errors.extend(l.errors.iter().cloned());
            for &(id, sent, at) in &l.acked {
                acked.push(id);
                if sent > killed {
                    assert!(at > promoting, "a write sent with no primary up was acknowledged before the promotion");
                }
                // Writes sent before the kill returned may have waited for the new primary.
                if at > promoting {
                    first_after = Some(first_after.map_or(at, |f| f.min(at)));
                }
            }
        }
        let first_after = idle_done.iter().fold(first_after.expect("writes after the kill"), |f, &t| f.min(t));
        assert!(first_after > promoting, "an idle client's write was acknowledged before the promotion");
        // Signed: negative when a client was through before pg_ctl promote returned.
        let ms_after = |t: Instant| {
            if t >= promoted { (t - promoted).as_millis() as i64 } else { -((promoted - t).as_millis() as i64) }
        };
        eprintln!(
            "failover with hold: writers' errors {errors:?}; first write {} ms after pg_ctl promote returned \
             (which took {} ms), {} ms after the kill; idle clients' writes {:?} ms after the promote",
            ms_after(first_after),
            (promoted - promoting).as_millis(),
            (first_after - killed).as_millis(),
            idle_done.iter().map(|&t| ms_after(t)).collect::<Vec<_>>()
        );
        assert!(!errors.iter().any(|c| c.contains("25006")), "a write reached a standby: {errors:?}");
        assert!(ms_after(first_after) < 1000, "first write {} ms after the promote", ms_after(first_after));
        // No acknowledged commit lost: every one is on the promoted server.
        let direct = Pg::connect(sp, "postgres", Some(SUPER_PW), "postgres").await.expect("the promoted server");
        let row =
            direct.query_one("SELECT count(*) FROM t WHERE id = ANY($1::int8[])", &[&acked]).await.expect("count");
        let count = row.get::<_, i64>(0) as usize;
        assert_eq!(count, acked.len(), "acknowledged writes missing on the promoted server");

        // The old primary comes back as it was (read-write, on the old timeline) and is
        // first in the host list: new connections must not go to it.
        {
            let pr = primary.clone();
            blocking(move || start_again(&pr)).await;
        }
        assert_eq!(primary.psql("postgres", "SELECT pg_is_in_recovery()").expect("old primary up"), "f");
        // New server connections (RECONNECT closes the open ones) try it again once the
        // memory of it being down has passed (10 s): polled, every write checked.
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let t0 = Instant::now();
        let mut id = 300;
        while console_rows(&console, "SHOW FENCES").await.is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(30), "the old primary was never tried");
            console.simple_query("RECONNECT rw").await.expect("RECONNECT");
            let c = p.connect("postgres", SUPER_PW, "rw").await;
            id += 1;
            c.simple_query(&format!("INSERT INTO t VALUES ({id}, 'after the return')")).await.expect("write");
            assert_eq!(c.scalar("select inet_server_port()").await.unwrap(), sp.to_string(), "on the old primary");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Once fenced, tried first and refused each time: writes still go to the new primary.
        for _ in 0..3 {
            console.simple_query("RECONNECT rw").await.expect("RECONNECT");
            let c = p.connect("postgres", SUPER_PW, "rw").await;
            id += 1;
            c.simple_query(&format!("INSERT INTO t VALUES ({id}, 'after the return')")).await.expect("write");
            assert_eq!(c.scalar("select inet_server_port()").await.unwrap(), sp.to_string(), "on the old primary");
        }
        let on_old = primary
            .psql("postgres", "SELECT count(*) FROM t WHERE id BETWEEN 300 AND 399")
            .expect("count on the old primary");
        assert_eq!(on_old, "0", "writes reached the old primary");
        // The console shows the fenced server; UNFENCE clears it.
        let rows = console_rows(&console, "SHOW FENCES").await;
        let fenced: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| {
                let get = |k: &str| r.get(k).cloned().flatten().unwrap_or_default();
                (get("port"), get("timeline"), get("newer_timeline"))
            })
            .collect();
        assert_eq!(fenced, [(pp.to_string(), "1".to_owned(), "2".to_owned())], "SHOW FENCES");
        console.simple_query("UNFENCE rw").await.expect("UNFENCE");
        assert!(console_rows(&console, "SHOW FENCES").await.is_empty(), "UNFENCE cleared it");
    })
    .await;
}

/// Issue 28: a parsnip started after a failover, with the old primary restarted as it was
/// (read-write on timeline 1) listed first and the promoted standby (timeline 2) after a
/// host that never answers: its first server connection asks every host before choosing,
/// so writes go to the promoted server, none to the old primary, which `SHOW FENCES`
/// lists; the host that hangs delays the choice by one connect timeout at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_parsnip_after_a_failover_writes_on_the_newest_timeline() {
    if direct_mode() {
        return;
    }
    let (primary, standby) = primary_with_table_and_standby().await;
    let (pp, sp) = (primary.port(), standby.port());
    primary.psql("postgres", "INSERT INTO t VALUES (1, 'before')").expect("a row before the failover");
    let lsn = primary.psql("postgres", "SELECT pg_current_wal_lsn()").expect("primary LSN");
    {
        let s = standby.clone();
        blocking(move || s.wait_replayed(&lsn, Duration::from_secs(30))).await;
    }
    // The failover, then the old primary back as it was: two read-write servers.
    {
        let pr = primary.clone();
        blocking(move || kill_primary(&pr)).await;
        let s = standby.clone();
        blocking(move || s.promote()).await;
        let pr = primary.clone();
        blocking(move || start_again(&pr)).await;
    }
    assert_eq!(primary.psql("postgres", "SELECT pg_is_in_recovery()").expect("old primary up"), "f");
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "f", "the standby was promoted");
    // A host that accepts TCP connections and never answers (its backlog is never read).
    let hang = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let hp = hang.local_addr().expect("its address").port();
    let timeout = Duration::from_millis(2000);
    let p = Parsnip::with_config(&config(&[db("rw", &[pp, hp, sp], "read-write")]));
    bounded(120, "a fresh parsnip after a failover", async {
        let t0 = Instant::now();
        let c = p.connect("postgres", SUPER_PW, "rw").await;
        c.simple_query("INSERT INTO t VALUES (2, 'fresh parsnip')").await.expect("the first write");
        let first = t0.elapsed();
        eprintln!("first write through a fresh parsnip: {} ms (one host hangs)", first.as_millis());
        assert!(first < timeout + Duration::from_millis(1500), "the host that hangs delayed the choice: {first:?}");
        assert_eq!(c.scalar("select inet_server_port()").await.unwrap(), sp.to_string(), "not on the promoted server");
        // Later connections use what was learnt (RECONNECT closes the open ones).
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        for id in 3..=5 {
            console.simple_query("RECONNECT rw").await.expect("RECONNECT");
            let c = p.connect("postgres", SUPER_PW, "rw").await;
            c.simple_query(&format!("INSERT INTO t VALUES ({id}, 'fresh parsnip')")).await.expect("a write");
            assert_eq!(c.scalar("select inet_server_port()").await.unwrap(), sp.to_string(), "on the old primary");
        }
        let fenced = |rows: Vec<Row>| -> Vec<(String, String, String)> {
            rows.iter()
                .map(|r| {
                    let get = |k: &str| r.get(k).cloned().flatten().unwrap_or_default();
                    (get("port"), get("timeline"), get("newer_timeline"))
                })
                .collect()
        };
        let want = [(pp.to_string(), "1".to_owned(), "2".to_owned())];
        assert_eq!(fenced(console_rows(&console, "SHOW FENCES").await), want, "SHOW FENCES");
        // UNFENCE: the hosts are asked again, and the old primary is refused again while
        // the promoted server is up.
        console.simple_query("UNFENCE rw").await.expect("UNFENCE");
        assert!(console_rows(&console, "SHOW FENCES").await.is_empty(), "UNFENCE cleared it");
        console.simple_query("RECONNECT rw").await.expect("RECONNECT");
        let c = p.connect("postgres", SUPER_PW, "rw").await;
        c.simple_query("INSERT INTO t VALUES (6, 'after UNFENCE')").await.expect("a write after UNFENCE");
        assert_eq!(c.scalar("select inet_server_port()").await.unwrap(), sp.to_string(), "on the old primary");
        assert_eq!(fenced(console_rows(&console, "SHOW FENCES").await), want, "fenced again");
        // Checked on each server directly: both read-write, the writes on the promoted one.
        assert_eq!(primary.psql("postgres", "SELECT pg_is_in_recovery()").expect("old primary"), "f");
        assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "f");
        let on_old = primary.psql("postgres", "SELECT count(*) FROM t WHERE id > 1").expect("count on the old primary");
        assert_eq!(on_old, "0", "writes reached the old primary");
        assert_eq!(standby.psql("SELECT count(*) FROM t WHERE id > 1"), "5", "writes on the promoted server");
    })
    .await;
    drop(hang);
}
