//! Large messages from clients pass through parsnip without being held whole (a Query, a
//! Bind, COPY data), several at once; messages that must be held whole count against the
//! process-wide budget (`max_buffered_bytes`), and one over it gets 53200 while the other
//! clients go on. Each memory check takes parsnip's resident memory after a warm-up, resets
//! its peak (`/proc/PID/clear_refs`), and reads the peak once the answers are in.

mod support;

use support::*;

const MIB: usize = 1 << 20;

/// Parsnip's memory as seen from outside: the baseline after warm-up, then the peak since.
struct Rss<'a> {
    p: &'a Parsnip,
    base_kib: u64,
}

impl<'a> Rss<'a> {
    /// Takes the baseline now and resets the peak to it. None in direct mode.
    fn start(p: &'a Parsnip) -> Option<Rss<'a>> {
        let pid = p.pid()?;
        let base_kib = p.proc_status_kb("VmRSS")?;
        // "5": reset the peak resident size (VmHWM) to the current one.
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").ok()?;
        Some(Rss { p, base_kib })
    }

    /// How far the peak went above the baseline, in MiB.
    fn peak_growth_mib(&self) -> f64 {
        let peak = self.p.proc_status_kb("VmHWM").unwrap_or(0);
        peak.saturating_sub(self.base_kib) as f64 / 1024.0
    }

    fn assert_below(&self, mib: f64, what: &str) {
        let g = self.peak_growth_mib();
        eprintln!("{what}: parsnip's peak RSS rose {g:.1} MiB above {} MiB", self.base_kib / 1024);
        assert!(g < mib, "{what}: parsnip's peak RSS rose {g:.1} MiB (bound {mib} MiB)\n{}", self.p.log_tail());
    }
}

/// Connects `n` clients and runs a query on each (pools, server connections and buffers
/// exist before the baseline is taken).
async fn warm(p: &Parsnip, n: usize) -> Vec<Pg> {
    let mut v = Vec::new();
    for _ in 0..n {
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 1").await.unwrap(), "1");
        v.push(c);
    }
    // Once more each, with a statement of the kind the test then runs.
    for c in &v {
        let n: i32 = c.query_one("select length($1::text)", &[&"warm"]).await.unwrap().get(0);
        assert_eq!(n, 4);
    }
    v
}

#[tokio::test]
async fn a_200mb_query_passes_through() {
    let p = Parsnip::trust("");
    bounded(120, "a_200mb_query_passes_through", async {
        let c = warm(&p, 1).await.remove(0);
        let rss = Rss::start(&p);
        let sql = format!("select length('{}'), 'after'", "x".repeat(200 * MIB));
        let rows = c.simple_query(&sql).await.unwrap_or_else(|e| panic!("{}\n{}", describe(&e), p.log_tail()));
        drop(sql);
        let row = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .expect("a row");
        assert_eq!(row.get(0), Some("209715200"));
        assert_eq!(row.get(1), Some("after"));
        // In step afterwards, on this connection and through the pool.
        assert_eq!(c.scalar("select 'next'").await.unwrap(), "next");
        if let Some(rss) = rss {
            rss.assert_below(32.0, "a 200 MiB Query");
        }
    })
    .await;
}

#[tokio::test]
async fn a_200mb_bind_passes_through() {
    let p = Parsnip::trust("");
    bounded(120, "a_200mb_bind_passes_through", async {
        let c = warm(&p, 1).await.remove(0);
        let rss = Rss::start(&p);
        let big = "y".repeat(200 * MIB);
        // A statement of the cache (its name is rewritten in the streamed Bind).
        let row = c
            .query_one("select length($1::text), $2::text", &[&big, &"after"])
            .await
            .unwrap_or_else(|e| panic!("{}\n{}", describe(&e), p.log_tail()));
        drop(big);
        assert_eq!(row.get::<_, i32>(0), 200 * MIB as i32);
        assert_eq!(row.get::<_, String>(1), "after");
        assert_eq!(c.scalar("select 'next'").await.unwrap(), "next");
        if let Some(rss) = rss {
            rss.assert_below(32.0, "a 200 MiB Bind");
        }
    })
    .await;
}

#[tokio::test]
async fn four_concurrent_64mb_binds_stay_within_64mb() {
    // (Debug logs: each large frame's start and end, shown if the four stall.)
    let p = Parsnip::trust("log_level = \"debug\"");
    bounded(180, "four_concurrent_64mb_binds_stay_within_64mb", async {
        let clients = warm(&p, 4).await;
        let values: Vec<String> = (0..4u8).map(|i| char::from(b'a' + i).to_string().repeat(64 * MIB)).collect();
        let rss = Rss::start(&p);
        let sql = "select length($1::text), md5($1::text) = md5(repeat(left($1::text, 1), 64 * 1024 * 1024))";
        let run = |i: usize| {
            let (c, v) = (&clients[i], &values[i]);
            async move { c.query_one(sql, &[v]).await }
        };
        let all = async { tokio::join!(run(0), run(1), run(2), run(3)) };
        // (Bounded apart, with parsnip's log: a stall here was a lost wake-up.)
        let Ok((r0, r1, r2, r3)) = tokio::time::timeout(std::time::Duration::from_secs(60), all).await else {
            panic!("the four Binds did not finish\n{}", p.logs());
        };
        for (i, r) in [r0, r1, r2, r3].into_iter().enumerate() {
            let row = r.unwrap_or_else(|e| panic!("client {i}: {}\n{}", describe(&e), p.log_tail()));
            assert_eq!(row.get::<_, i32>(0), 64 * MIB as i32, "client {i}");
            assert!(row.get::<_, bool>(1), "client {i}: the value arrived damaged");
        }
        if let Some(rss) = rss {
            rss.assert_below(64.0, "four 64 MiB Binds at once");
        }
    })
    .await;
}

#[tokio::test]
async fn copy_from_stdin_with_huge_rows_passes_through() {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    use tokio_postgres::types::Type;
    let p = Parsnip::trust("");
    bounded(120, "copy_from_stdin_with_huge_rows_passes_through", async {
        let c = warm(&p, 1).await.remove(0);
        c.batch_execute("drop table if exists large_copy; create table large_copy (v text)").await.unwrap();
        let rss = Rss::start(&p);
        let sink = c.copy_in("copy large_copy from stdin (format binary)").await.unwrap();
        let writer = BinaryCopyInWriter::new(sink, &[Type::TEXT]);
        let mut writer = std::pin::pin!(writer);
        for ch in ['p', 'q', 'r'] {
            // One row per CopyData message (the writer sends what it has past 4 KiB), each
            // 40 MiB.
            let row = ch.to_string().repeat(40 * MIB);
            writer.as_mut().write(&[&row]).await.unwrap_or_else(|e| panic!("{}\n{}", describe(&e), p.log_tail()));
        }
        let n = writer.finish().await.unwrap_or_else(|e| panic!("{}\n{}", describe(&e), p.log_tail()));
        assert_eq!(n, 3);
        let row = c.query_one("select count(*)::int, sum(length(v))::bigint from large_copy", &[]).await.unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (3, 120 * MIB as i64));
        if let Some(rss) = rss {
            rss.assert_below(32.0, "COPY FROM STDIN of three 40 MiB rows");
        }
        c.batch_execute("drop table large_copy").await.unwrap();
    })
    .await;
}

/// With `max_buffered_bytes` at its 1 MiB minimum: a Query of 512 KiB (held whole: below
/// the size from which Queries stream) fits, a 2 MiB Parse (always held whole) does not and
/// gets FATAL 53200, and so does a server ErrorResponse of 2 MiB (its server connection is
/// closed); another client of the same pool is not disturbed.
#[tokio::test]
async fn a_message_over_the_budget_gets_53200_and_others_go_on() {
    let p = Parsnip::trust("max_buffered_bytes = 1048576\npool_size = 2");
    bounded(60, "a_message_over_the_budget_gets_53200_and_others_go_on", async {
        let other = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(other.scalar("select 1").await.unwrap(), "1");

        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        let mid = format!("select length('{}')", "m".repeat(512 * 1024));
        assert_eq!(c.scalar(&mid).await.unwrap(), "524288", "a 512 KiB Query within the budget");

        let big = format!("select length('{}')", "z".repeat(2 * MIB));
        let e = expect_code(c.prepare(&big).await, "53200", "a 2 MiB Parse over the budget");
        assert_eq!(e.severity(), "FATAL");
        assert!(e.detail().is_some_and(|d| d.contains("max_buffered_bytes")), "{e:?}");
        assert_eq!(other.scalar("select 'still here'").await.unwrap(), "still here");

        // A server frame over the budget: an error message quoting a 2 MiB value.
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        let r = c.simple_query(&format!("select '{}'::int", "7".repeat(2 * MIB))).await;
        let e = expect_code(r, "53200", "a 2 MiB ErrorResponse over the budget");
        assert_eq!(e.severity(), "FATAL");
        assert_eq!(other.scalar("select 'and still'").await.unwrap(), "and still");
        // The pool serves new clients (the server connection closed is replaced).
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        assert_eq!(c.scalar("select 2").await.unwrap(), "2");
    })
    .await;
}

/// A client that leaves halfway through a large Query: the server connection has half a
/// message on it and is closed, not given to the next client (with one server connection,
/// the next client's query would otherwise be read as the rest of that message).
#[tokio::test]
async fn a_client_leaving_midway_through_a_large_message_does_not_poison_the_pool() {
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "a_client_leaving_midway_through_a_large_message_does_not_poison_the_pool", async {
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        assert_eq!(raw.scalar("select 1").await.unwrap().as_deref(), Some("1"));
        // A Query announcing 8 MiB, of which 3 MiB are sent.
        let total = 8 * MIB;
        let mut part = vec![b'Q'];
        part.extend_from_slice(&(total as u32 - 1).to_be_bytes());
        part.extend_from_slice(b"select length('");
        part.resize(3 * MIB, b'h');
        raw.send(&part).await.unwrap();
        // It reached the server (the statement is running or waiting for the rest).
        let c = p.connect("postgres", SUPER_PW, "postgres").await;
        drop(raw);
        for i in 0..3 {
            assert_eq!(c.scalar(&format!("select {i}")).await.unwrap(), i.to_string(), "{}", p.log_tail());
        }
    })
    .await;
}

/// A large Bind of a statement parsed inside a transaction (the cache answered the Parse):
/// its first use runs inside a savepoint guard, whose RELEASE the session writes behind the
/// Bind, so it must follow the Bind's streamed body.
#[tokio::test]
async fn a_large_bind_inside_a_transaction_keeps_its_guard_in_order() {
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "a_large_bind_inside_a_transaction_keeps_its_guard_in_order", async {
        // The statement is prepared on the pool's one server connection first.
        drop(warm(&p, 1).await);
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        assert_eq!(raw.scalar("begin").await.unwrap(), None);
        let n = 3 * MIB;
        let mut batch = msg(b'P', b"s9\0select length($1::text)\0\0\0");
        let mut bind = b"\0s9\0\0\0\0\x01".to_vec();
        bind.extend_from_slice(&(n as i32).to_be_bytes());
        bind.resize(bind.len() + n, b'g');
        bind.extend_from_slice(b"\0\0");
        batch.extend(msg(b'B', &bind));
        batch.extend(msg(b'E', b"\0\0\0\0\0"));
        batch.extend(msg(b'S', b""));
        raw.send(&batch).await.unwrap();
        let (frames, end) = raw.read_until_ready().await;
        assert_eq!(end, End::Ready(b'T'), "{}\n{}", summarize(&frames), p.log_tail());
        let tags: String = frames.iter().map(|f| f.tag as char).collect();
        assert_eq!(tags, "12DCZ", "{}", summarize(&frames));
        let row = frames.iter().find(|f| f.tag == b'D').expect("a row");
        assert_eq!(&row.body[6..], n.to_string().as_bytes());
        assert_eq!(raw.scalar("select 'in step'").await.unwrap().as_deref(), Some("in step"));
        assert_eq!(raw.scalar("commit").await.unwrap(), None);
    })
    .await;
}

/// A FunctionCall with a 1 MiB argument passes through too (`md5(text)`, oid 2311).
#[tokio::test]
async fn a_large_function_call_passes_through() {
    let p = Parsnip::trust("");
    bounded(60, "a_large_function_call_passes_through", async {
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        let n = MIB;
        let mut body = 2311u32.to_be_bytes().to_vec();
        body.extend_from_slice(&[0, 1, 0, 0, 0, 1]);
        body.extend_from_slice(&(n as i32).to_be_bytes());
        body.resize(body.len() + n, b'f');
        body.extend_from_slice(&[0, 0]);
        raw.send(&msg(b'F', &body)).await.unwrap();
        let (frames, end) = raw.read_until_ready().await;
        assert_eq!(end, End::Ready(b'I'), "{}\n{}", summarize(&frames), p.log_tail());
        let v = frames.iter().find(|f| f.tag == b'V').unwrap_or_else(|| panic!("{}", summarize(&frames)));
        let want = raw.scalar(&format!("select md5(repeat('f', {n}))")).await.unwrap().expect("md5");
        assert_eq!(&v.body[4..], want.as_bytes());
    })
    .await;
}

/// A column of database `postgres`'s row in the console's SHOW POOLS.
async fn pool_stat(console: &Pg, column: &str) -> String {
    let rows = console.simple_query("SHOW POOLS").await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("database") == Some("postgres") => {
                r.get(column).map(str::to_owned)
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// Polls the console until `column` reads `want` (bounded).
async fn wait_stat(p: &Parsnip, console: &Pg, column: &str, want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while pool_stat(console, column).await != want {
        assert!(std::time::Instant::now() < deadline, "{column} never reached {want}\n{}", p.log_tail());
        tokio::task::yield_now().await;
    }
}

/// A large Bind written behind another client's batch on a shared connection (a
/// pipelining ticket, `driver::pipe`): it passes through the pipe like any other write, and
/// both clients get their own answers. (As in e2e_pipeline: a pool of two, both held by
/// open transactions, A queued first with a statement known to be fast, B second.)
#[tokio::test]
async fn a_large_bind_passes_through_on_a_pipelining_ticket() {
    let p = Parsnip::trust("pool_size = 2\npipeline_max_statement_ms = 100");
    bounded(60, "a_large_bind_passes_through_on_a_pipelining_ticket", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        let b = p.connect("postgres", SUPER_PW, "postgres").await;
        let sa = a.prepare("select $1::int4 + 1").await.unwrap();
        let sb = b.prepare("select length($1::text)").await.unwrap();
        assert_eq!(a.query_one(&sa, &[&1i32]).await.unwrap().get::<_, i32>(0), 2);
        let d = p.connect("postgres", SUPER_PW, "postgres").await;
        let e = p.connect("postgres", SUPER_PW, "postgres").await;
        d.batch_execute("BEGIN; SELECT 1").await.unwrap();
        e.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let ta = tokio::spawn(async move { a.query_one(&sa, &[&41i32]).await.map(|r| r.get::<_, i32>(0)) });
        wait_stat(&p, &console, "cl_waiting", "1").await;
        let big = "b".repeat(3 * MIB);
        let tb = tokio::spawn(async move { b.query_one(&sb, &[&big]).await.map(|r| r.get::<_, i32>(0)) });
        wait_stat(&p, &console, "cl_waiting", "2").await;
        e.batch_execute("COMMIT").await.unwrap();
        let got_b = tb.await.unwrap().unwrap_or_else(|e| panic!("{}\n{}", describe(&e), p.log_tail()));
        assert_eq!(got_b, 3 * MIB as i32, "B's own answer");
        assert_eq!(ta.await.unwrap().unwrap(), 42, "A's own answer");
        assert_eq!(pool_stat(&console, "pipelined").await, "1", "B was queued behind A");
        d.batch_execute("COMMIT").await.unwrap();
        assert_eq!(e.scalar("select 7").await.unwrap(), "7");
    })
    .await;
}
