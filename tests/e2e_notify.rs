//! LISTEN/NOTIFY under transaction pooling: parsnip answers LISTEN/UNLISTEN itself, one
//! listening connection per pool receives the notifications, and each listener gets those
//! of its channels, in order, byte for byte, only between its own transactions — without
//! holding a server connection while idle.

mod support;

use std::time::Duration;

use support::*;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

/// A client whose notifications are collected, and how its connection ended.
struct Listener {
    client: Client,
    notes: UnboundedReceiver<Notification>,
    task: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
}

async fn listener(p: &Parsnip) -> Listener {
    let (client, mut conn) =
        pg_config(p.port(), "postgres", Some(SUPER_PW), "postgres").connect(NoTls).await.expect("connect");
    let (tx, notes) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let _ = tx.send(n);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    });
    Listener { client, notes, task }
}

impl Listener {
    async fn run(&self, sql: &str) {
        self.client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    }

    /// The next notification, as (channel, payload).
    async fn next(&mut self) -> (String, String) {
        let n = within(Duration::from_secs(10), self.notes.recv())
            .await
            .expect("no notification within 10s")
            .expect("connection ended");
        (n.channel().to_string(), n.payload().to_string())
    }

    /// The next notifications, `n` of them.
    async fn take(&mut self, n: usize) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.next().await);
        }
        out
    }

    fn nothing_yet(&mut self) -> bool {
        self.notes.try_recv().is_err()
    }
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(c, p)| (c.to_string(), p.to_string())).collect()
}

/// Several clients listen on overlapping channels (one a quoted mixed-case name) through a
/// pool of two connections; another client notifies inside and outside transactions.
/// Everyone gets exactly its channels' notifications in order, byte-exact; one inside a
/// transaction block gets them after its COMMIT; UNLISTEN stops them; listeners hold no
/// server connection while idle; the sender pid is the notifying backend's.
#[tokio::test]
async fn listeners_get_their_channels_between_transactions() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(90, "listeners_get_their_channels", async {
        let mut a = listener(&p).await;
        let mut b = listener(&p).await;
        let mut c = listener(&p).await;
        a.run("LISTEN foo").await;
        a.run("listen \"MiXed\";").await;
        b.run("LISTEN Foo").await;
        b.run("LISTEN bar").await;
        c.run("/* hi */ LISTEN BAR").await;
        let s = p.connect("postgres", SUPER_PW, "postgres").await;
        let s2 = p.connect("postgres", SUPER_PW, "postgres").await;
        // Listeners hold no server connection: both of the pool's serve others at once.
        s.simple_query("BEGIN").await.expect("begin");
        assert_eq!(within(Duration::from_secs(5), s2.scalar("select 41 + 1")).await.expect("s2 served").unwrap(), "42");
        s.simple_query("COMMIT").await.expect("commit");
        // b is inside a transaction block while everything is sent.
        b.run("BEGIN").await;
        s.batch_execute("NOTIFY foo, 'p1'").await.unwrap();
        s.batch_execute("select pg_notify('MiXed', 'p2')").await.unwrap();
        s.batch_execute("BEGIN; NOTIFY bar, 'p3'; NOTIFY foo, 'p4'; NOTIFY mixed, 'not for a'; COMMIT").await.unwrap();
        let rows =
            s.simple_query("select pg_notify('bar', E'multi\\nline ü \\\\ \"q\"'), pg_backend_pid()").await.unwrap();
        let sender: i32 = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(1).map(|v| v.parse().unwrap()),
                _ => None,
            })
            .expect("pid");
        let p5 = "multi\nline ü \\ \"q\"";
        assert_eq!(a.take(3).await, pairs(&[("foo", "p1"), ("MiXed", "p2"), ("foo", "p4")]), "{}", p.log_tail());
        let got_c = {
            let mut v = Vec::new();
            for _ in 0..2 {
                let n = within(Duration::from_secs(10), c.notes.recv()).await.expect("c").expect("c ended");
                v.push((n.channel().to_string(), n.payload().to_string(), n.process_id()));
            }
            v
        };
        assert_eq!(got_c[0].0, "bar");
        assert_eq!(got_c[0].1, "p3");
        assert_eq!((got_c[1].0.as_str(), got_c[1].1.as_str()), ("bar", p5));
        assert_eq!(got_c[1].2, sender, "the sender pid is the notifying backend's");
        // b, inside its transaction, gets nothing, not even at its statements' ends.
        b.run("select 1").await;
        assert!(b.nothing_yet(), "b got a notification inside its transaction block");
        b.run("COMMIT").await;
        assert_eq!(b.take(4).await, pairs(&[("foo", "p1"), ("bar", "p3"), ("foo", "p4"), ("bar", p5)]));
        // UNLISTEN stops delivery (order tells: the next one a gets is p7, not p6).
        a.run("UNLISTEN foo").await;
        s.batch_execute("NOTIFY foo, 'p6'; NOTIFY \"MiXed\", 'p7'").await.unwrap();
        assert_eq!(a.next().await, pairs(&[("MiXed", "p7")])[0]);
        assert_eq!(b.next().await, pairs(&[("foo", "p6")])[0]);
        a.run("UNLISTEN *").await;
        s.batch_execute("NOTIFY \"MiXed\", 'p8'; NOTIFY foo, 'p9'").await.unwrap();
        assert_eq!(b.next().await, pairs(&[("foo", "p9")])[0]);
        assert!(a.nothing_yet(), "a got a notification after UNLISTEN *");
        drop((a.client, a.task));
        drop(c.client);
        let _ = c.task.await;
    })
    .await;
}

/// LISTEN inside a transaction block takes effect at COMMIT and not at all after ROLLBACK
/// (or in a failed block, where it is an error), as PostgreSQL applies it.
#[tokio::test]
async fn listen_in_a_transaction_block_takes_effect_at_commit() {
    let p = Parsnip::trust("pool_size = 1\npool_mode = \"transaction\"");
    bounded(60, "listen_at_commit", async {
        let mut a = listener(&p).await;
        let s = p.connect("postgres", SUPER_PW, "postgres").await;
        a.run("LISTEN marker").await;
        a.run("BEGIN").await;
        a.run("LISTEN rolled").await;
        a.run("ROLLBACK").await;
        a.run("BEGIN").await;
        let e = a.client.batch_execute("select 1/0").await.expect_err("division by zero");
        assert_eq!(sqlstate(&e).as_deref(), Some("22012"));
        let e = a.client.batch_execute("LISTEN failed").await.expect_err("LISTEN in a failed block");
        assert_eq!(sqlstate(&e).as_deref(), Some("25P02"), "{}", describe(&e));
        a.run("ROLLBACK").await;
        a.run("BEGIN").await;
        a.run("LISTEN committed").await;
        a.run("COMMIT").await;
        s.batch_execute("NOTIFY rolled, 'no'; NOTIFY failed, 'no'; NOTIFY committed, 'yes'; NOTIFY marker, 'end'")
            .await
            .unwrap();
        assert_eq!(a.take(2).await, pairs(&[("committed", "yes"), ("marker", "end")]));
    })
    .await;
}

/// A listener that does not read what it gets (here: it stays inside a transaction block)
/// is closed with FATAL 53400 once more than 10,000 notifications wait for it; others are
/// unaffected.
#[tokio::test]
async fn a_listener_that_never_reads_is_closed_not_grown() {
    let p = Parsnip::trust("pool_size = 2\npool_mode = \"transaction\"");
    bounded(90, "slow_listener", async {
        let slow = listener(&p).await;
        let mut ok = listener(&p).await;
        slow.run("LISTEN flood").await;
        ok.run("LISTEN flood").await;
        slow.run("BEGIN").await;
        let s = p.connect("postgres", SUPER_PW, "postgres").await;
        s.batch_execute("select pg_notify('flood', g::text) from generate_series(1, 10001) g").await.unwrap();
        let got = ok.take(10001).await;
        assert_eq!(got.last().map(|(_, p)| p.as_str()), Some("10001"));
        let r = within(Duration::from_secs(10), slow.task).await.expect("slow listener not closed").expect("join");
        let e = r.expect_err("slow listener ended without an error");
        assert_eq!(sqlstate(&e).as_deref(), Some("53400"), "{}", describe(&e));
    })
    .await;
}

/// The rows of `SHOW LISTENERS` as (channel, listeners, listening).
async fn channels(console: &Pg) -> Vec<(String, String, String)> {
    console_rows(console, "SHOW LISTENERS")
        .await
        .into_iter()
        .map(|r| {
            let g = |k: &str| r.get(k).cloned().flatten().unwrap_or_default();
            (g("channel"), g("listeners"), g("listening"))
        })
        .collect()
}

/// The listening connection broken under its listeners (its backend terminated, as at a
/// server restart) is opened again and listens on their channels again: they keep their
/// subscriptions. A listener leaving drops its channel once nobody else listens on it
/// (SHOW LISTENERS, and the listening backend's last statement, say so).
#[tokio::test]
async fn the_listening_connection_comes_back_and_drops_channels_nobody_needs() {
    let p = Parsnip::trust("pool_size = 1\npool_mode = \"transaction\"");
    bounded(90, "listening_connection_comes_back", async {
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let mut a = listener(&p).await;
        let b = listener(&p).await;
        a.run("LISTEN back_keep").await;
        b.run("LISTEN \"Back_Gone\"").await;
        b.run("LISTEN back_keep").await;
        assert_eq!(
            channels(&console).await,
            vec![("Back_Gone".into(), "1".into(), "1".into()), ("back_keep".into(), "2".into(), "1".into())]
        );
        let s = p.connect("postgres", SUPER_PW, "postgres").await;
        // The listening backend: the one whose last statement listened.
        let listening = || async {
            psql_async(
                "postgres",
                // This test's channels only: other tests' poolers listen on the same cluster.
                "select pid from pg_stat_activity where (query like 'LISTEN %' or query like 'UNLISTEN %') \
                 and (query like '%back_keep%' or query like '%Back_Gone%')",
            )
            .await
            .trim()
            .to_string()
        };
        let old = listening().await;
        assert!(!old.is_empty(), "no listening backend");
        psql_async("postgres", &format!("select pg_terminate_backend({old})")).await;
        // Notifications sent while it is away are lost (see docs); once it is back, they
        // arrive again. Each round waits for a notification or gives up after a bound.
        let mut n = 0;
        loop {
            n += 1;
            s.batch_execute(&format!("NOTIFY back_keep, 'r{n}'")).await.unwrap();
            if let Ok(Some(got)) = within(Duration::from_millis(500), a.notes.recv()).await {
                assert_eq!(got.channel(), "back_keep");
                break;
            }
            assert!(n < 40, "no notification after the listening connection was terminated\n{}", p.log_tail());
        }
        let new = listening().await;
        assert_ne!(new, old, "the same listening backend");
        // b leaves: "Gone" has nobody left and is unlistened; "keep" stays for a.
        drop(b.client);
        let _ = b.task.await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let rows = channels(&console).await;
            if rows == vec![("back_keep".to_string(), "1".to_string(), "1".to_string())] {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "channels left: {rows:?}");
            tokio::task::yield_now().await;
        }
        let last = psql_async("postgres", &format!("select query from pg_stat_activity where pid = {new}")).await;
        assert!(last.contains("UNLISTEN \"Back_Gone\""), "the listening backend's last statement: {last}");
        // a's subscription survived the reconnect, and it is the only one.
        s.batch_execute("NOTIFY \"Back_Gone\", 'x'; NOTIFY back_keep, 'last'").await.unwrap();
        loop {
            let (ch, payload) = a.next().await;
            assert_eq!(ch, "back_keep");
            if payload == "last" {
                break;
            }
        }
    })
    .await;
}

/// A LISTEN through the extended protocol (tokio-postgres prepares and executes it), or
/// among other statements of one simple Query, is answered by parsnip as the lone
/// simple-Query one is: the listener holds no server connection (a pool of one still
/// serves the notifier), gets its notifications, and UNLISTEN through the extended
/// protocol ends them.
#[tokio::test]
async fn an_extended_protocol_listen_is_answered_without_pinning() {
    let p = Parsnip::trust("pool_size = 1\npool_mode = \"transaction\"");
    bounded(60, "an_extended_protocol_listen_is_answered_without_pinning", async {
        let mut l = listener(&p).await;
        l.client.execute("LISTEN ext_ch", &[]).await.expect("extended LISTEN");
        let n = p.connect("postgres", SUPER_PW, "postgres").await;
        n.batch_execute("NOTIFY ext_ch, 'one'").await.expect("notify");
        assert_eq!(l.next().await, ("ext_ch".into(), "one".into()));
        // In a transaction block that commits, through the extended protocol too.
        l.run("BEGIN").await;
        l.client.execute("LISTEN ext_two", &[]).await.expect("LISTEN in a block");
        l.run("COMMIT").await;
        n.batch_execute("NOTIFY ext_two, 'two'").await.expect("notify");
        assert_eq!(l.next().await, ("ext_two".into(), "two".into()));
        l.client.execute("UNLISTEN ext_ch", &[]).await.expect("extended UNLISTEN");
        n.batch_execute("NOTIFY ext_ch, 'gone'; NOTIFY ext_two, 'three'").await.expect("notify");
        assert_eq!(l.next().await, ("ext_two".into(), "three".into()), "ext_ch's came after UNLISTEN");
        // Among other statements of one simple Query: answered in its place too.
        l.run("SELECT 1; LISTEN multi_ch; SELECT 2").await;
        n.batch_execute("NOTIFY multi_ch, 'four'").await.expect("notify");
        assert_eq!(l.next().await, ("multi_ch".into(), "four".into()));
        let console = p.connect("postgres", SUPER_PW, "parsnip").await;
        let pinned: Vec<_> = console_rows(&console, "SHOW CLIENTS")
            .await
            .into_iter()
            .filter_map(|r| r.get("pinned").cloned().flatten().filter(|p| !p.is_empty()))
            .collect();
        assert!(pinned.is_empty(), "pinned: {pinned:?}");
        drop(l.client);
        let _ = l.task.await;
    })
    .await;
}

// ---------------------------------------------------------------- differential: ordering

/// A frame of a listener's transcript: notifications as channel and payload (bytes
/// escaped, so the comparison is byte for byte), CommandComplete tags, ReadyForQuery
/// statuses, other frames by tag.
fn line(f: &Frame) -> String {
    match f.tag {
        b'A' => {
            let mut parts = f.body.get(4..).unwrap_or_default().split(|&b| b == 0);
            let ch = parts.next().unwrap_or_default();
            let payload = parts.next().unwrap_or_default();
            format!("A {} '{}'", ch.escape_ascii(), payload.escape_ascii())
        }
        b'C' => format!("C {}", String::from_utf8_lossy(f.body.strip_suffix(b"\0").unwrap_or(&f.body))),
        b'Z' => format!("Z {}", f.body.first().map_or('?', |&b| b as char)),
        t => (t as char).to_string(),
    }
}

/// A raw client at `port`, logged in as the superuser.
async fn raw_at(port: u16) -> Raw {
    let mut r = Raw::tcp(port).await;
    r.startup(&[("user", "postgres"), ("database", "postgres")], Some(SUPER_PW)).await.expect("login");
    r
}

/// Sends `sql` as one simple Query; its frames up to ReadyForQuery, as transcript lines.
async fn say(r: &mut Raw, sql: &str) -> Vec<String> {
    r.send(&query_msg(sql)).await.expect("send");
    let (frames, end) = within(Duration::from_secs(10), r.read_until_ready()).await.expect("no ReadyForQuery in 10s");
    assert!(matches!(end, End::Ready(_)), "{sql}: connection closed: {}", summarize(&frames));
    frames.iter().map(line).collect()
}

/// Reads frames into `out` until both `stop` and (if `ready`) a ReadyForQuery were seen.
async fn read_until(r: &mut Raw, out: &mut Vec<String>, stop: &str, ready: bool) {
    let (mut seen_stop, mut seen_ready) = (false, !ready);
    while !(seen_stop && seen_ready) {
        let f = within(Duration::from_secs(10), r.read_frame())
            .await
            .unwrap_or_else(|_| panic!("no {stop:?} within 10s; so far {out:?}"))
            .expect("connection closed");
        let l = line(&f);
        seen_stop |= l == stop;
        seen_ready |= f.tag == b'Z';
        out.push(l);
    }
}

/// Runs `sql` on a sender.
async fn run(s: &Pg, sql: &str) {
    s.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
}

/// The ordering scenario against `port`: four listeners on overlapping channels (one a
/// quoted mixed-case name), two senders notifying inside and outside transaction blocks
/// (committed, rolled back, interleaved, a duplicate, an empty and a non-ASCII payload),
/// one listener that UNLISTENs midway and one inside a transaction block while everything
/// is sent, with a LISTEN and an UNLISTEN pending in it: PostgreSQL checks what it queued
/// for a session against the channels the session has when it reads it, at the block's
/// end. Each listener's transcript after its setup.
async fn ordering_run(port: u16) -> Vec<Vec<String>> {
    let mut l = Vec::new();
    for chans in [
        ["dn_a", "\"Dn_Mixed\"", "dn_end"],
        ["dn_a", "dn_b", "dn_end"],
        ["dn_b", "\"Dn_Mixed\"", "dn_end"],
        ["dn_b", "dn_a", "dn_end"],
    ] {
        let mut r = raw_at(port).await;
        for ch in chans {
            assert_eq!(say(&mut r, &format!("LISTEN {ch}")).await, ["C LISTEN", "Z I"]);
        }
        l.push(r);
    }
    let mut out: Vec<Vec<String>> = vec![Vec::new(); 4];
    // Listener 2 sits in a transaction block, with a LISTEN and an UNLISTEN pending in it.
    for sql in ["BEGIN", "LISTEN dn_c", "UNLISTEN \"Dn_Mixed\"", "select 1"] {
        out[2].extend(say(&mut l[2], sql).await);
    }
    let connect = || async move { Pg::connect(port, "postgres", Some(SUPER_PW), "postgres").await.expect("sender") };
    let (s1, s2) = (connect().await, connect().await);
    run(&s1, "NOTIFY dn_a, 'one'").await;
    run(&s2, "BEGIN; NOTIFY dn_b, 'two'").await;
    run(&s1, "NOTIFY \"Dn_Mixed\", 'drei ü ✓ \\ \"q\"'").await;
    run(&s2, "NOTIFY dn_a, 'four'; NOTIFY dn_a, 'four'; NOTIFY \"Dn_Mixed\", 'five'; COMMIT").await;
    run(&s1, "BEGIN; NOTIFY dn_a, 'rolled back'; NOTIFY dn_b, 'rolled back'; ROLLBACK").await;
    run(&s2, "select pg_notify('dn_b', ''), pg_notify('Dn_Mixed', E'tab\\there')").await;
    run(&s1, "NOTIFY dn_c, 'before the LISTEN committed'").await;
    run(&s2, "NOTIFY dn_b, 'mark'").await;
    // Listener 3 has got everything up to the mark, then leaves dn_a.
    read_until(&mut l[3], &mut out[3], "A dn_b 'mark'", false).await;
    out[3].extend(say(&mut l[3], "UNLISTEN dn_a").await);
    run(&s1, "NOTIFY dn_a, 'after the UNLISTEN'; NOTIFY dn_b, 'six'").await;
    run(&s2, "BEGIN; NOTIFY dn_b, 'rolled back too'; ROLLBACK; NOTIFY dn_end, 'end'").await;
    for i in [0, 1, 3] {
        let (r, o) = (&mut l[i], &mut out[i]);
        read_until(r, o, "A dn_end 'end'", false).await;
    }
    // Inside its block listener 2 gets nothing, not even at its statements' ends; at
    // COMMIT, just before its ReadyForQuery, everything of the channels it then listens on
    // (dn_c's too, none of "Dn_Mixed").
    out[2].extend(say(&mut l[2], "select 2").await);
    l[2].send(&query_msg("COMMIT")).await.expect("send");
    read_until(&mut l[2], &mut out[2], "A dn_end 'end'", true).await;
    run(&s1, "NOTIFY dn_c, 'after the COMMIT'; NOTIFY dn_end, 'end 2'").await;
    read_until(&mut l[2], &mut out[2], "A dn_end 'end 2'", false).await;
    out
}

/// The ordering scenario directly against PostgreSQL and through parsnip (transaction
/// mode): every listener's transcript — which notifications, in which order, byte for
/// byte, and where among its own replies — must be the same. (Before parsnip matched them:
/// it sent a block's notifications after the COMMIT's ReadyForQuery, not before it, and
/// checked them against the channels at arrival, not at the block's end.)
#[tokio::test]
async fn notification_order_matches_postgresql() {
    let p = Parsnip::trust("pool_size = 4\npool_mode = \"transaction\"");
    bounded(90, "notification_order_matches_postgresql", async {
        let direct = ordering_run(cluster().port()).await;
        // Sanity of the scenario itself: PostgreSQL's own answers.
        assert_eq!(
            direct[1],
            [
                "A dn_a 'one'",
                "A dn_b 'two'",
                "A dn_a 'four'",
                "A dn_b ''",
                "A dn_b 'mark'",
                "A dn_a 'after the UNLISTEN'",
                "A dn_b 'six'",
                "A dn_end 'end'"
            ]
        );
        let via = ordering_run(p.port()).await;
        for (i, (d, v)) in direct.iter().zip(&via).enumerate() {
            assert_eq!(v, d, "listener {i}: through parsnip (left) vs directly (right)\n{}", p.log_tail());
        }
    })
    .await;
}
