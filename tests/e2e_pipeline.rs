//! Pipelining (`driver::pipe`): a client waiting for a server may have its batch written
//! behind another client's autocommit batch whose replies are still coming, on the same
//! server connection.
//!
//! Each test builds the same situation with a pool of two: both server connections are
//! held by open transactions, client A queues first and client B second; then one holder
//! commits, so A gets that server with B waiting. What happens next depends on A's batch:
//!
//! * a statement known to be fast: B's batch goes behind it (the console's `pipelined`
//!   counter), and both get their own answers;
//! * a statement known to be slow: B is not queued behind it, and gets the other server
//!   as soon as it is free, long before A's statement ends;
//! * A's client leaves while its batch is in flight: its replies are read and dropped,
//!   and B behind it still gets its answer on a healthy connection.

mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use support::*;
use tokio::task::JoinHandle;
use tokio_postgres::SimpleQueryMessage;

/// Two server connections; statements count as fast up to 100 ms (a loaded test machine
/// can take a few ms for what PostgreSQL does in microseconds).
const POOL: &str = "pool_size = 2\npipeline_max_statement_ms = 100";

/// A column of this database's row in the console's SHOW POOLS.
async fn pool_stat(console: &Pg, db: &str, column: &str) -> String {
    let rows = console.simple_query("SHOW POOLS").await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("database") == Some(db) => r.get(column).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default()
}

/// Polls the console until `column` of `db` reads `want` (bounded).
async fn wait_stat(p: &Parsnip, console: &Pg, db: &str, column: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if pool_stat(console, db, column).await == want {
            return;
        }
        assert!(Instant::now() < deadline, "{column} never reached {want}\n{}", p.log_tail());
        tokio::task::yield_now().await;
    }
}

/// Both server connections of the pool held by open transactions (D and E), then A's
/// request queued first and B's second. Commit E to give A a server with B waiting.
async fn queue_a_then_b<A, B>(
    p: &Parsnip,
    console: &Pg,
    db: &str,
    a: A,
    b: B,
) -> (Pg, Pg, JoinHandle<A::Output>, JoinHandle<B::Output>)
where
    A: Future + Send + 'static,
    A::Output: Send,
    B: Future + Send + 'static,
    B::Output: Send,
{
    let d = p.connect("postgres", SUPER_PW, db).await;
    let e = p.connect("postgres", SUPER_PW, db).await;
    d.batch_execute("BEGIN; SELECT 1").await.unwrap();
    e.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let ta = tokio::spawn(a);
    wait_stat(p, console, db, "cl_waiting", "1").await;
    let tb = tokio::spawn(b);
    wait_stat(p, console, db, "cl_waiting", "2").await;
    (d, e, ta, tb)
}

#[tokio::test]
async fn a_waiting_client_is_queued_behind_a_fast_batch() {
    const DB: &str = "pipefastdb";
    let p = trust_db(DB, "", POOL);
    bounded(60, "a_waiting_client_is_queued_behind_a_fast_batch", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let sa = a.prepare("select $1::int4 + 1").await.unwrap();
        let sb = b.prepare("select $1::int4 + 1").await.unwrap();
        // Timed once: known to be fast.
        let one: i32 = a.query_one(&sa, &[&1i32]).await.unwrap().get(0);
        assert_eq!(one, 2);
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { a.query_one(&sa, &[&41i32]).await.map(|r| r.get::<_, i32>(0)) },
            async move { b.query_one(&sb, &[&99i32]).await.map(|r| r.get::<_, i32>(0)) },
        )
        .await;
        assert_eq!(pool_stat(&console, DB, "pipelined").await, "0");
        e.batch_execute("COMMIT").await.unwrap();
        // B is answered on the server A got, while D still holds the other one.
        assert_eq!(tb.await.unwrap().unwrap(), 100, "B's own answer");
        assert_eq!(ta.await.unwrap().unwrap(), 42, "A's own answer");
        assert_eq!(pool_stat(&console, DB, "pipelined").await, "1", "B was queued behind A");
        assert_eq!(d.scalar("select 'still in my transaction'").await.unwrap(), "still in my transaction");
        d.batch_execute("COMMIT").await.unwrap();
        assert_eq!(e.scalar("select 7").await.unwrap(), "7");
    })
    .await;
}

#[tokio::test]
async fn no_client_is_queued_behind_a_slow_statement() {
    const DB: &str = "pipeslowdb";
    let p = trust_db(DB, "", POOL);
    bounded(60, "no_client_is_queued_behind_a_slow_statement", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let sa = a.prepare("select pg_sleep($1::float8)::text").await.unwrap();
        let sb = b.prepare("select $1::int4 + 1").await.unwrap();
        // Timed once at 0.5 s: over pipeline_max_statement_ms.
        a.query_one(&sa, &[&0.5f64]).await.unwrap();
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { a.query_one(&sa, &[&3.0f64]).await.map(|_| ()) },
            async move { b.query_one(&sb, &[&99i32]).await.map(|r| r.get::<_, i32>(0)) },
        )
        .await;
        e.batch_execute("COMMIT").await.unwrap();
        // A now sleeps on E's old server; B still waits (not behind A).
        wait_stat(&p, &console, DB, "cl_waiting", "1").await;
        d.batch_execute("COMMIT").await.unwrap();
        assert_eq!(tb.await.unwrap().unwrap(), 100);
        assert!(!ta.is_finished(), "B was answered before A's 3-second statement ended");
        assert_eq!(pool_stat(&console, DB, "pipelined").await, "0", "nobody was queued behind the slow statement");
        ta.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_client_leaving_with_a_batch_in_flight_does_not_disturb_the_one_behind() {
    const DB: &str = "pipeleavedb";
    let p = trust_db(DB, "", POOL);
    bounded(60, "a_client_leaving_with_a_batch_in_flight_does_not_disturb_the_one_behind", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        // One statement, fast when timed, slow enough later for A to leave meanwhile.
        let sa = a.prepare("select pg_sleep($1::float8)::text").await.unwrap();
        let sb = b.prepare("select $1::int4 + 1").await.unwrap();
        a.query_one(&sa, &[&0.0f64]).await.unwrap();
        let Pg { client: ca, task: a_conn, .. } = a;
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { ca.query_one(&sa, &[&1.5f64]).await.map(|_| ()) },
            async move { b.query_one(&sb, &[&99i32]).await.map(|r| r.get::<_, i32>(0)) },
        )
        .await;
        e.batch_execute("COMMIT").await.unwrap();
        wait_stat(&p, &console, DB, "pipelined", "1").await;
        // A vanishes while its statement runs, with B's batch written behind it.
        a_conn.abort();
        let _ = a_conn.await;
        assert!(ta.await.unwrap().is_err(), "A's connection is gone");
        assert_eq!(tb.await.unwrap().unwrap(), 100, "B's answer, after A's dropped one");
        // The connection went back to the pool in a clean state: both servers serve again.
        d.batch_execute("COMMIT").await.unwrap();
        let f = p.connect("postgres", SUPER_PW, DB).await;
        let g = p.connect("postgres", SUPER_PW, DB).await;
        f.batch_execute("BEGIN; SELECT 1").await.unwrap();
        g.batch_execute("BEGIN; SELECT 1").await.unwrap();
        assert_eq!(f.scalar("select 5").await.unwrap(), "5");
        assert_eq!(g.scalar("select 6").await.unwrap(), "6");
        assert_eq!(pool_stat(&console, DB, "sv_open").await, "2", "no connection was closed");
    })
    .await;
}

/// A's `pg_sleep($1)`, timed fast (`pg_sleep(0)`), runs for `a_secs` with B's `b_sql`
/// (argument `b_arg`) written behind it on the server A got; D still holds the other one.
struct SleeperAhead {
    d: Pg,
    a_cancel: tokio_postgres::CancelToken,
    b_cancel: tokio_postgres::CancelToken,
    ta: JoinHandle<Result<String, tokio_postgres::Error>>,
    tb: JoinHandle<Result<String, tokio_postgres::Error>>,
}

async fn sleeper_ahead(p: &Parsnip, console: &Pg, db: &str, a_secs: f64, b_sql: &str, b_arg: f64) -> SleeperAhead {
    let a = p.connect("postgres", SUPER_PW, db).await;
    let b = p.connect("postgres", SUPER_PW, db).await;
    let sa = a.prepare("select pg_sleep($1::float8)::text || 'a'").await.unwrap();
    let sb = b.prepare(b_sql).await.unwrap();
    a.query_one(&sa, &[&0.0f64]).await.unwrap();
    let (a_cancel, b_cancel) = (a.cancel_token(), b.cancel_token());
    let (d, e, ta, tb) = queue_a_then_b(
        p,
        console,
        db,
        async move { a.query_one(&sa, &[&a_secs]).await.map(|r| r.get::<_, String>(0)) },
        async move { b.query_one(&sb, &[&b_arg]).await.map(|r| r.get::<_, String>(0)) },
    )
    .await;
    e.batch_execute("COMMIT").await.unwrap();
    wait_stat(p, console, db, "pipelined", "1").await;
    SleeperAhead { d, a_cancel, b_cancel, ta, tb }
}

/// Two batches queued behind a running one: A's (a read, running a second now), then
/// B's, written with `MSG_MORE` because C waits to write behind it (`cork_ahead`), then C's,
/// which sends both. Each client gets its own answer, in order, on one connection. Simple
/// Queries, so that no statement has to be prepared on the server A got first.
#[tokio::test]
async fn two_batches_behind_a_running_one_each_get_their_own_answer() {
    const DB: &str = "pipechaindb";
    let p = trust_db(DB, "", &format!("{POOL}\nautoprepare = false"));
    bounded(60, "two_batches_behind_a_running_one_each_get_their_own_answer", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let c = p.connect("postgres", SUPER_PW, DB).await;
        // The pool's simple reads timed: fast.
        assert_eq!(a.scalar("select 1").await.unwrap(), "1");
        let d = p.connect("postgres", SUPER_PW, DB).await;
        let e = p.connect("postgres", SUPER_PW, DB).await;
        d.batch_execute("BEGIN; SELECT 1").await.unwrap();
        e.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let ta = tokio::spawn(async move { a.scalar("select pg_sleep(1)::text || 'a'").await });
        wait_stat(&p, &console, DB, "cl_waiting", "1").await;
        let tb = tokio::spawn(async move { b.scalar("select 11::text || 'b'").await });
        wait_stat(&p, &console, DB, "cl_waiting", "2").await;
        let tc = tokio::spawn(async move { c.scalar("select 22::text || 'c'").await });
        wait_stat(&p, &console, DB, "cl_waiting", "3").await;
        e.batch_execute("COMMIT").await.unwrap();
        wait_stat(&p, &console, DB, "pipelined", "2").await;
        assert_eq!(tc.await.unwrap().unwrap(), "22c", "C's own answer");
        assert_eq!(tb.await.unwrap().unwrap(), "11b", "B's own answer");
        assert_eq!(ta.await.unwrap().unwrap(), "a", "A's own answer");
        d.batch_execute("COMMIT").await.unwrap();
        assert_eq!(pool_stat(&console, DB, "sv_open").await, "2", "no connection was closed");
        assert_eq!(e.scalar("select 7").await.unwrap(), "7");
    })
    .await;
}

/// B's batch waits behind A's on one connection and B cancels: the cancel must reach B's
/// query (held until B's batch runs), never A's.
#[tokio::test]
async fn a_cancel_behind_another_batch_reaches_its_own_query_only() {
    const DB: &str = "pipecanceldb";
    let p = trust_db(DB, "", POOL);
    bounded(60, "a_cancel_behind_another_batch_reaches_its_own_query_only", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        // A's real run takes a second, B's would take ten.
        let s = sleeper_ahead(&p, &console, DB, 1.0, "select pg_sleep($1::float8)::text || 'b'", 10.0).await;
        let t0 = Instant::now();
        s.b_cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
        assert_eq!(s.ta.await.unwrap().unwrap(), "a", "A's query was not the one cancelled");
        let r = within(Duration::from_secs(8), s.tb).await.expect("B's query ended long before its 10 s").unwrap();
        let err = expect_code(r, "57014", "B's own query cancelled");
        assert_eq!(err.message(), "canceling statement due to user request");
        assert!(t0.elapsed() < Duration::from_secs(8));
        s.d.batch_execute("COMMIT").await.unwrap();
        assert_eq!(pool_stat(&console, DB, "sv_open").await, "2", "no connection was closed");
        // Nothing was queued behind B when its held cancel went out: a CancelRequest.
        assert_eq!(pool_stat(&console, DB, "pipelined_cancels").await, "0");
    })
    .await;
}

/// A's statement, known to be fast, runs long with B's batch queued behind it, and A
/// cancels. PostgreSQL up to 17 signals the backend twice for a CancelRequest; the second
/// signal can arrive after the first has ended A's query, and would cancel B's. So there
/// the cancel goes out as one `pg_cancel_backend` (the console's `pipelined_cancels`); 18
/// signals once and gets the CancelRequest. Either way B gets its own answer.
#[tokio::test]
async fn a_cancel_with_a_batch_behind_signals_once_and_spares_it() {
    const DB: &str = "pipecancelheaddb";
    let p = trust_db(DB, "", POOL);
    bounded(60, "a_cancel_with_a_batch_behind_signals_once_and_spares_it", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let version = p.connect("postgres", SUPER_PW, DB).await.scalar("show server_version_num").await.unwrap();
        let sql_cancels = if version.parse::<u32>().unwrap() < 180000 { "1" } else { "0" };
        let s = sleeper_ahead(&p, &console, DB, 10.0, "select ($1::float8 + 1)::text", 99.0).await;
        let t0 = Instant::now();
        s.a_cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
        let r = within(Duration::from_secs(8), s.ta).await.expect("A's query ended long before its 10 s").unwrap();
        expect_code(r, "57014", "A's query cancelled");
        assert_eq!(s.tb.await.unwrap().unwrap(), "100", "B's own answer, not a cancel");
        assert!(t0.elapsed() < Duration::from_secs(8));
        // Counted once PostgreSQL has answered the pg_cancel_backend (A may hear first).
        wait_stat(&p, &console, DB, "pipelined_cancels", sql_cancels).await;
        s.d.batch_execute("COMMIT").await.unwrap();
        assert_eq!(pool_stat(&console, DB, "sv_open").await, "2", "no connection was closed");
    })
    .await;
}

/// Simple-protocol queries: one plain read has the next client's batch queued behind it; a
/// write never does.
#[tokio::test]
async fn a_simple_read_is_pipelined_and_a_simple_write_is_not() {
    const DB: &str = "pipesimpledb";
    // About simple Queries reaching the server as such: with autoprepare (on by default)
    // a read seen for the first time becomes a Parse/Bind/Execute batch, which is never
    // written behind another.
    let top = format!("{POOL}\nautoprepare = false");
    let p = trust_db(DB, "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10);", &top);
    bounded(60, "a_simple_read_is_pipelined_and_a_simple_write_is_not", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        // The pool's simple reads timed once: fast.
        assert_eq!(a.scalar("select v from t where id = 1").await.unwrap(), "10");
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { (a.scalar("select v + 1 from t where id = 1").await, a) },
            async move { (b.scalar("select v + 2 from t where id = 1").await, b) },
        )
        .await;
        e.batch_execute("COMMIT").await.unwrap();
        let (rb, b) = tb.await.unwrap();
        let (ra, a) = ta.await.unwrap();
        assert_eq!((ra.unwrap(), rb.unwrap()), ("11".to_string(), "12".to_string()));
        assert_eq!(pool_stat(&console, DB, "pipelined").await, "1", "B was queued behind A's read");
        d.batch_execute("COMMIT").await.unwrap();

        // The same with A writing: B waits for a free server instead.
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { a.batch_execute("update t set v = v + 100 where id = 1").await },
            async move { b.scalar("select v from t where id = 1").await },
        )
        .await;
        e.batch_execute("COMMIT").await.unwrap();
        ta.await.unwrap().unwrap();
        assert_eq!(tb.await.unwrap().unwrap(), "110");
        assert_eq!(pool_stat(&console, DB, "pipelined").await, "1", "nobody was queued behind the write");
        d.batch_execute("COMMIT").await.unwrap();
    })
    .await;
}

/// B's batch went behind A's; B then opens a transaction on that shared connection, takes
/// a row lock and vanishes without a Terminate. The connection must be rolled back and
/// pooled at once: another client gets the lock (a 10-second lock_timeout, while settling
/// is allowed 30 seconds) and no connection is closed.
#[tokio::test]
async fn a_client_leaving_in_a_transaction_on_a_shared_connection_releases_it_at_once() {
    const DB: &str = "pipetxleavedb";
    let p = trust_db(
        DB,
        "CREATE TABLE locked (id int PRIMARY KEY); INSERT INTO locked VALUES (1);",
        &format!("{POOL}\nserver_connect_timeout_ms = 30000"),
    );
    bounded(60, "a_client_leaving_in_a_transaction_on_a_shared_connection_releases_it_at_once", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let sa = a.prepare("select $1::int4 + 1").await.unwrap();
        assert_eq!(a.query_one(&sa, &[&1i32]).await.unwrap().get::<_, i32>(0), 2);
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { a.query_one(&sa, &[&41i32]).await.map(|r| r.get::<_, i32>(0)) },
            async move {
                let r = b.batch_execute("BEGIN; UPDATE locked SET id = id WHERE id = 1").await;
                (b, r)
            },
        )
        .await;
        e.batch_execute("COMMIT").await.unwrap();
        let (b, r) = tb.await.unwrap();
        r.unwrap();
        assert_eq!(ta.await.unwrap().unwrap(), 42);
        assert_eq!(pool_stat(&console, DB, "pipelined").await, "1", "B was queued behind A");
        // B leaves in its transaction, holding the row lock.
        let Pg { client, task, .. } = b;
        task.abort();
        let _ = task.await;
        drop(client);
        d.batch_execute("COMMIT").await.unwrap();
        let c = p.connect("postgres", SUPER_PW, DB).await;
        c.batch_execute("SET lock_timeout = '10s'; UPDATE locked SET id = id WHERE id = 1")
            .await
            .expect("the row lock of the client that left was released");
        assert_eq!(pool_stat(&console, DB, "sv_open").await, "2", "no connection was closed");
    })
    .await;
}

/// B is queued behind A's batch on a shared connection and fed there: its settings
/// (a `search_path` of its own) are queued for that server, and so is its query — then the
/// rest of what B sent is malformed and B is closed before any of it was written. What
/// parsnip records of that server must stay what the server has: a later client with B's
/// `search_path` must still get it set (issue 23's hostile-client test found the
/// connection's record changed by bytes that never reached it).
#[tokio::test]
async fn a_client_closed_before_writing_behind_another_leaves_the_servers_record_as_it_was() {
    const DB: &str = "pipeunwrittendb";
    let p = trust_db(DB, "CREATE SCHEMA tschema; GRANT ALL ON SCHEMA tschema TO PUBLIC;", POOL);
    bounded(60, "a_client_closed_before_writing_behind_another_leaves_the_servers_record_as_it_was", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let sa = a.prepare("select pg_sleep($1::float8)::text").await.unwrap();
        a.query_one(&sa, &[&0.0f64]).await.unwrap();
        let params = [("user", "postgres"), ("database", DB), ("search_path", "tschema")];
        let mut b = Raw::tcp(p.port()).await;
        b.startup(&params, Some(SUPER_PW)).await.unwrap();
        let (d, e, ta, tb) = queue_a_then_b(
            &p,
            &console,
            DB,
            async move { a.query_one(&sa, &[&1.0f64]).await.map(|_| ()) },
            async move {
                // A query, then a frame whose length is impossible: both in one write.
                let mut bytes = query_msg("SELECT current_setting('search_path')");
                bytes.extend_from_slice(&[b'Q', 0, 0, 0, 2]);
                b.send(&bytes).await.unwrap();
                b.read_until_closed(Duration::from_secs(10)).await
            },
        )
        .await;
        e.batch_execute("COMMIT").await.unwrap();
        let got = tb.await.unwrap();
        assert!(got.iter().any(|f| f.tag == b'E'), "B gets a protocol error: {}", summarize(&got));
        ta.await.unwrap().unwrap();
        // A's server is free again (D still holds the other one): C, with B's search_path,
        // gets it.
        let mut c = Raw::tcp(p.port()).await;
        c.startup(&params, Some(SUPER_PW)).await.unwrap();
        let path = c.scalar("SELECT current_setting('search_path')").await.unwrap();
        assert_eq!(path.as_deref(), Some("tschema"), "C's own search_path");
        d.batch_execute("COMMIT").await.unwrap();
    })
    .await;
}
