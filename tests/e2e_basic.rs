//! Queries, concurrency, COPY, notices, errors and routing through parsnip.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use support::*;
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;

#[tokio::test]
async fn simple_and_extended_queries() {
    let p = Parsnip::url_mode(&[]);
    bounded(60, "simple_and_extended_queries", async {
        let c = p.connect("postgres", SUPER_PW, "postgres").await;

        // Simple protocol, two statements in one Query.
        let msgs = c.simple_query("select 1 as one, 'a' as letter; select name from items where id = 3").await.unwrap();
        let rows: Vec<Vec<Option<String>>> = msgs
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect()),
                _ => None,
            })
            .collect();
        assert_eq!(
            rows,
            vec![vec![Some("1".to_string()), Some("a".to_string())], vec![Some("item 3".to_string())]],
            "{}",
            p.log_tail()
        );

        // Extended protocol with the unnamed statement (Parse/Bind/Execute/Sync in one go).
        for i in 0..20i32 {
            let row = c
                .query_typed_one("select $1::int4 + 1, $2::text || '!'", &[(&i, Type::INT4), (&"hi", Type::TEXT)])
                .await
                .unwrap_or_else(|e| panic!("extended query {i}: {}\n{}", describe(&e), p.log_tail()));
            assert_eq!(row.get::<_, i32>(0), i + 1);
            assert_eq!(row.get::<_, String>(1), "hi!");
        }

        // Named prepared statements inside a transaction (binary results, parameters).
        let mut c = c;
        let tx = c.client.transaction().await.unwrap();
        let st = tx.prepare("select id, name from items where id = $1").await.unwrap();
        for id in [1i32, 5, 10] {
            let row = tx.query_one(&st, &[&id]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), id);
            assert_eq!(row.get::<_, String>(1), format!("item {id}"));
        }
        let n = tx.query("select * from items where id > $1", &[&7i32]).await.unwrap().len();
        assert_eq!(n, 3);
        tx.commit().await.unwrap();

        // A result larger than any single buffer.
        let rows = c.query_typed("select g, repeat('x', 1000) from generate_series(1, 2000) g", &[]).await.unwrap();
        assert_eq!(rows.len(), 2000);
        assert_eq!(rows[1999].get::<_, i32>(0), 2000);
    })
    .await;
}

/// 200 clients through 4 server connections: everyone gets their own correct results and
/// PostgreSQL never sees more than 4 backends for the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_share_a_small_pool() {
    const CLIENTS: usize = 200;
    const TXNS: i64 = 20;
    const DB: &str = "conc";
    let p = trust_db(
        DB,
        "CREATE TABLE t (client int, n int); GRANT ALL ON t TO PUBLIC;",
        "pool_size = 4\nquery_wait_timeout_ms = 60000",
    );
    bounded(120, "many_clients_share_a_small_pool", async {
        // Watch pg_stat_activity while the clients run.
        let done = Arc::new(AtomicBool::new(false));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(AtomicUsize::new(0));
        let watcher = {
            let (done, max_seen, samples) = (done.clone(), max_seen.clone(), samples.clone());
            tokio::task::spawn_blocking(move || {
                while !done.load(Ordering::Relaxed) {
                    let n = backends(DB).iter().filter(|(user, _)| user == "postgres").count();
                    max_seen.fetch_max(n, Ordering::Relaxed);
                    samples.fetch_add(1, Ordering::Relaxed);
                }
            })
        };

        let port = p.port();
        let mut tasks = Vec::new();
        for id in 0..CLIENTS as i32 {
            tasks.push(tokio::spawn(async move {
                let mut c = Pg::connect(port, "postgres", Some(SUPER_PW), DB)
                    .await
                    .map_err(|e| format!("client {id}: connect: {}", describe(&e)))?;
                for n in 0..TXNS {
                    let step = async {
                        let tx = c.client.transaction().await?;
                        tx.execute("insert into t values ($1, $2)", &[&id, &(n as i32)]).await?;
                        let row = tx
                            .query_one(
                                "select count(*), coalesce(sum(n), 0)::int8, pg_backend_pid() \
                                 from t where client = $1",
                                &[&id],
                            )
                            .await?;
                        tx.commit().await?;
                        Ok::<_, tokio_postgres::Error>((row.get::<_, i64>(0), row.get::<_, i64>(1)))
                    };
                    let (count, sum) = step.await.map_err(|e| format!("client {id} txn {n}: {}", describe(&e)))?;
                    if count != n + 1 || sum != n * (n + 1) / 2 {
                        return Err(format!(
                            "client {id} txn {n}: saw count {count} sum {sum}, expected {} {}",
                            n + 1,
                            n * (n + 1) / 2
                        ));
                    }
                }
                Ok::<_, String>(())
            }));
        }
        let mut failures = Vec::new();
        for t in tasks {
            if let Err(e) = t.await.expect("client task panicked") {
                failures.push(e);
            }
        }
        done.store(true, Ordering::Relaxed);
        watcher.await.unwrap();
        assert!(
            failures.is_empty(),
            "{} of {CLIENTS} clients failed; first: {:?}\n{}",
            failures.len(),
            &failures[..failures.len().min(5)],
            p.log_tail()
        );
        let total = psql(DB, "select count(*) from t");
        assert_eq!(total, (CLIENTS as i64 * TXNS).to_string());
        let max = max_seen.load(Ordering::Relaxed);
        assert!(samples.load(Ordering::Relaxed) > 0, "watcher took no sample");
        assert!(max <= 4, "pg_stat_activity showed {max} backends for the pool (pool_size 4)\n{}", p.log_tail());
        assert!(max >= 1, "watcher never saw a pool backend");
    })
    .await;
}

#[tokio::test]
async fn copy_in_and_copy_out() {
    const DB: &str = "copydb";
    let p = trust_db(DB, "CREATE TABLE c (id int4, body text); GRANT ALL ON c TO PUBLIC;", "");
    bounded(60, "copy_in_and_copy_out", async {
        let c = p.connect("postgres", SUPER_PW, DB).await;
        // COPY IN through tokio-postgres (binary format).
        let sink = c
            .copy_in("COPY c (id, body) FROM STDIN (FORMAT binary)")
            .await
            .unwrap_or_else(|e| panic!("copy_in: {}\n{}", describe(&e), p.log_tail()));
        let writer = BinaryCopyInWriter::new(sink, &[Type::INT4, Type::TEXT]);
        let mut writer = std::pin::pin!(writer);
        for i in 0..5000i32 {
            let body = format!("row {i} {}", "y".repeat((i % 50) as usize));
            writer.as_mut().write(&[&i, &body]).await.unwrap();
        }
        let n = writer.finish().await.unwrap();
        assert_eq!(n, 5000);
        assert_eq!(psql(DB, "select count(*), sum(id) from c"), "5000|12497500");

        // The connection still works after COPY.
        assert_eq!(c.scalar("select count(*) from c").await.unwrap(), "5000");

        // COPY OUT (text) over the raw protocol.
        let mut raw = p.raw_login("postgres", SUPER_PW, DB).await;
        raw.send(&query_msg("COPY (select id, body from c order by id) TO STDOUT")).await.unwrap();
        let (frames, end) = raw.read_until_ready().await;
        assert_eq!(end, End::Ready(b'I'), "{}", summarize(&frames));
        assert!(frames.iter().any(|f| f.tag == b'H'), "no CopyOutResponse: {}", summarize(&frames));
        let data: Vec<u8> = frames.iter().filter(|f| f.tag == b'd').flat_map(|f| f.body.clone()).collect();
        let text = String::from_utf8(data).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5000);
        assert_eq!(lines[0], "0\trow 0 ");
        assert_eq!(lines[4999], format!("4999\trow 4999 {}", "y".repeat(49)));
        let done = frames.iter().find(|f| f.tag == b'C').expect("CommandComplete");
        assert_eq!(&done.body[..], b"COPY 5000\0");

        // COPY IN (text) over the raw protocol, then read it back through tokio-postgres.
        raw.send(&query_msg("COPY c (id, body) FROM STDIN")).await.unwrap();
        let f = raw.read_frame().await.expect("CopyInResponse");
        assert_eq!(f.tag, b'G', "expected CopyInResponse, got {:?}", f.fields());
        let mut batch = Vec::new();
        for i in 0..100 {
            batch.extend(msg(b'd', format!("{}\traw {i}\n", 10_000 + i).as_bytes()));
        }
        batch.extend(msg(b'c', b""));
        raw.send(&batch).await.unwrap();
        let (frames, end) = raw.read_until_ready().await;
        assert_eq!(end, End::Ready(b'I'), "{}", summarize(&frames));
        assert!(frames.iter().any(|f| f.tag == b'C' && f.body.starts_with(b"COPY 100")));
        assert_eq!(c.scalar("select count(*) from c where id >= 10000").await.unwrap(), "100");

        // A failed COPY reaches the client as PostgreSQL's error and the connection goes on.
        let e = raw.simple_query("COPY nosuchtable FROM STDIN").await.unwrap_err();
        assert_eq!(e.code(), "42P01", "{e}");
        assert_eq!(e.message(), "relation \"nosuchtable\" does not exist");
        assert_eq!(raw.scalar("select 7").await.unwrap().as_deref(), Some("7"));
        // COPY IN aborted by the client with CopyFail.
        raw.send(&query_msg("COPY c (id, body) FROM STDIN")).await.unwrap();
        let f = raw.read_frame().await.expect("CopyInResponse");
        assert_eq!(f.tag, b'G');
        let mut batch = msg(b'd', b"99999\tnever\n");
        batch.extend(msg(b'f', b"client gave up\0"));
        raw.send(&batch).await.unwrap();
        let (frames, end) = raw.read_until_ready().await;
        assert_eq!(end, End::Ready(b'I'), "{}", summarize(&frames));
        let e = frames.iter().find_map(Frame::fields).expect("error after CopyFail");
        assert_eq!(e.code(), "57014", "{e}");
        assert_eq!(c.scalar("select count(*) from c where id = 99999").await.unwrap(), "0");
    })
    .await;
}

#[tokio::test]
async fn notices_reach_the_client() {
    let p = Parsnip::trust("");
    bounded(60, "notices_reach_the_client", async {
        let mut c = p.connect("postgres", SUPER_PW, "postgres").await;
        c.batch_execute("DO $$ BEGIN RAISE NOTICE 'hello from plpgsql %', 42; END $$").await.unwrap();
        let n = within(Duration::from_secs(5), c.notices.recv())
            .await
            .unwrap_or_else(|e| panic!("no NOTICE: {e}\n{}", p.log_tail()))
            .expect("notice channel closed");
        assert_eq!(n.message(), "hello from plpgsql 42");
        assert_eq!(n.severity(), "NOTICE");
        assert_eq!(n.code().code(), "00000");
        // A notice inside a transaction, then a warning.
        c.batch_execute("BEGIN; DO $$ BEGIN RAISE WARNING 'careful' USING DETAIL = 'some detail'; END $$; COMMIT")
            .await
            .unwrap();
        let w = within(Duration::from_secs(5), c.notices.recv()).await.unwrap().expect("warning");
        assert_eq!(w.severity(), "WARNING");
        assert_eq!(w.message(), "careful");
        assert_eq!(w.detail(), Some("some detail"));
    })
    .await;
}

#[tokio::test]
async fn server_errors_reach_the_client_unchanged() {
    let p = Parsnip::trust("");
    bounded(60, "server_errors_reach_the_client_unchanged", async {
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        let e = expect_code(c.simple_query("select 1/0").await, "22012", "simple 1/0");
        assert_eq!(e.message(), "division by zero");
        assert_eq!(e.severity(), "ERROR");
        let e =
            expect_code(c.query_typed("select 10 / $1::int4", &[(&0i32, Type::INT4)]).await, "22012", "extended 1/0");
        assert_eq!(e.message(), "division by zero");
        let e = expect_code(c.simple_query("select * from no_such_table").await, "42P01", "missing table");
        assert_eq!(e.message(), "relation \"no_such_table\" does not exist");
        assert!(e.position().is_some(), "error position missing");
        let e = expect_code(c.simple_query("selec 1").await, "42601", "syntax error");
        assert_eq!(e.message(), "syntax error at or near \"selec\"");
        let e = expect_code(c.simple_query("insert into items values (1, 'dup')").await, "23505", "duplicate key");
        assert_eq!(e.constraint(), Some("items_pkey"));
        assert_eq!(e.detail(), Some("Key (id)=(1) already exists."));
        // Errors inside a transaction: the transaction is aborted, then rolled back cleanly.
        c.batch_execute("BEGIN").await.unwrap();
        expect_code(c.simple_query("select 1/0").await, "22012", "in txn");
        expect_code(c.simple_query("select 1").await, "25P02", "aborted txn");
        c.batch_execute("ROLLBACK").await.unwrap();
        // The connection is fine afterwards.
        assert_eq!(c.scalar("select 2").await.unwrap(), "2");
    })
    .await;
}

#[tokio::test]
async fn routes_to_other_database_in_url_mode() {
    cluster(); // database `other` is created with the cluster
    let p = Parsnip::url_mode(&[]);
    bounded(60, "routes_to_other_database_in_url_mode", async {
        let c = p.connect("postgres", SUPER_PW, "other").await;
        assert_eq!(c.scalar("select current_database()").await.unwrap(), "other");
        assert_eq!(c.scalar("select name from where_am_i").await.unwrap(), "other");
        let d = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(d.scalar("select current_database()").await.unwrap(), "postgres");
        // Back and forth: each client keeps its own database.
        for _ in 0..3 {
            assert_eq!(c.scalar("select current_database()").await.unwrap(), "other");
            assert_eq!(d.scalar("select current_database()").await.unwrap(), "postgres");
        }
    })
    .await;
}

/// The process's event-loop threads (`parsnip-N`; one loop runs on the main thread, which
/// has none).
fn loop_threads(p: &Parsnip) -> usize {
    let pid = p.pid().expect("a parsnip process");
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("its threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("parsnip-"))
        .count()
}

/// The event loops parsnip runs when `PARSNIP_WORKERS` does not say: one per two cores when
/// every server is on this machine (its backends need the others), one per core when one is
/// elsewhere.
#[tokio::test]
async fn event_loops_leave_a_server_on_this_machine_half_the_cores() {
    if direct_mode() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads_for = |loops: usize| if loops > 1 { loops } else { 0 };
    let local = Parsnip::with_config_default_loops(&trust_config(""));
    let loops = (cores / 2).max(1);
    assert!(
        local.wait_for_log(&format!("{loops} event loop(s) on {cores} core(s)"), Duration::from_secs(10)),
        "{}",
        local.log_tail()
    );
    assert_eq!(loop_threads(&local), threads_for(loops), "{}", local.log_tail());
    bounded(30, "event_loops_leave_a_server_on_this_machine_half_the_cores", async {
        let c = local.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 1").await.expect("select 1"), "1");
    })
    .await;
    // A second database on another machine (TEST-NET: never connected to here).
    let remote = Parsnip::with_config_default_loops(&format!(
        "{}\n[databases.elsewhere]\nhost = \"192.0.2.1\"\nport = 5432\n",
        trust_config("")
    ));
    assert!(
        remote.wait_for_log(&format!("{cores} event loop(s) on {cores} core(s)"), Duration::from_secs(10)),
        "{}",
        remote.log_tail()
    );
    assert_eq!(loop_threads(&remote), threads_for(cores), "{}", remote.log_tail());
}
