//! Bad input on raw sockets: each case gets PostgreSQL's answer (an error, or nothing at all
//! for a startup packet of an impossible length) and a closed socket, and the pooler goes on
//! serving everyone else.

mod support;

use std::time::Duration;

use support::*;

const CLOSE: Duration = Duration::from_secs(5);

fn config() -> String {
    trust_config("max_message_size = 1048576\nclient_login_timeout_ms = 500")
}

/// Reads until the pooler closes the connection, which it must do without a word.
async fn closed_without_a_word(raw: &mut Raw, context: &str) {
    let frames = raw.read_until_closed(CLOSE).await;
    assert!(frames.is_empty(), "{context}: PostgreSQL closes without a word; got {}", summarize(&frames));
}

/// A normal client still works.
async fn still_serves(p: &Parsnip) {
    let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
    assert_eq!(
        raw.scalar("select 'still here'").await.unwrap_or_else(|e| panic!("{e}\n{}", p.log_tail())).as_deref(),
        Some("still here")
    );
}

#[tokio::test]
async fn garbage_startup_is_refused() {
    let p = Parsnip::with_config(&config());
    bounded(60, "garbage_startup_is_refused", async {
        // An HTTP request: its first four bytes read as an absurd length, which PostgreSQL
        // only logs ("invalid length of startup packet").
        let mut raw = p.raw().await;
        raw.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await.ok();
        closed_without_a_word(&mut raw, "HTTP request as startup").await;
        still_serves(&p).await;

        // A length too short to hold a protocol version.
        let mut raw = p.raw().await;
        raw.send(&[0, 0, 0, 2, 0xde, 0xad]).await.ok();
        closed_without_a_word(&mut raw, "startup length 2").await;

        // Right length and version, but the parameter list is not terminated.
        let mut body = 196608u32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0postgres\0database\0post");
        let mut packet = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        let mut raw = p.raw().await;
        raw.send(&packet).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "unterminated startup parameters").await;
        assert_eq!(e.code(), "08P01", "{e}");
        assert_eq!(e.message(), "invalid startup packet layout: expected terminator as last byte");

        // Random bytes.
        let mut junk = vec![0u8; 512];
        rand::fill(&mut junk[..]);
        junk[0] = 0; // keep the length field below the maximum startup size...
        junk[1] = 0;
        junk[2] = 1; // ... 256 + x bytes
        let mut raw = p.raw().await;
        raw.send(&junk).await.ok();
        let frames = raw.read_until_closed(CLOSE).await;
        assert!(
            frames.iter().all(|f| f.tag == b'E'),
            "random startup must get only an error before close: {}",
            summarize(&frames)
        );
        still_serves(&p).await;
    })
    .await;
}

/// node-postgres's `client.end()` right after `connect()` sends Terminate before any
/// startup packet: PostgreSQL (and PgBouncer) close without a word, so must parsnip; also
/// after an SSLRequest was answered.
#[tokio::test]
async fn terminate_before_the_startup_packet_closes_without_a_word() {
    let p = Parsnip::with_config(&config());
    bounded(60, "terminate_before_the_startup_packet_closes_without_a_word", async {
        let mut raw = p.raw().await;
        raw.send(&[b'X', 0, 0, 0, 4]).await.unwrap();
        closed_without_a_word(&mut raw, "Terminate as the first message").await;
        let mut raw = p.raw().await;
        raw.send(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await.unwrap();
        assert_eq!(raw.read_byte().await, Some(b'N'));
        raw.send(&[b'X', 0, 0, 0, 4]).await.unwrap();
        closed_without_a_word(&mut raw, "Terminate after an SSLRequest").await;
        still_serves(&p).await;
    })
    .await;
}

#[tokio::test]
async fn protocol_version_2_is_refused() {
    let p = Parsnip::with_config(&config());
    bounded(60, "protocol_version_2_is_refused", async {
        let mut raw = p.raw().await;
        // v2 StartupPacket: length 296, version 2.0, then fixed-size fields.
        let mut packet = vec![0u8; 296];
        packet[0..4].copy_from_slice(&296u32.to_be_bytes());
        packet[4..8].copy_from_slice(&0x0002_0000u32.to_be_bytes());
        packet[8..16].copy_from_slice(b"postgres");
        packet[72..80].copy_from_slice(b"postgres");
        raw.send(&packet).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "protocol 2.0").await;
        assert!(!e.code().is_empty(), "{e}");
        assert_eq!(e.severity(), "FATAL", "{e}");
        assert!(e.message().contains("protocol"), "message should name the protocol: {e}");
        still_serves(&p).await;
    })
    .await;
}

#[tokio::test]
async fn huge_startup_length_is_refused_without_allocating() {
    let p = Parsnip::with_config(&config());
    bounded(60, "huge_startup_length_is_refused_without_allocating", async {
        let peak_before = p.proc_status_kb("VmPeak");
        for _ in 0..3 {
            let mut raw = p.raw().await;
            raw.send(&[0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0]).await.ok();
            closed_without_a_word(&mut raw, "startup length 0x7fffffff").await;
        }
        let peak_after = p.proc_status_kb("VmPeak");
        if let (Some(before), Some(after)) = (peak_before, peak_after) {
            assert!(
                after.saturating_sub(before) < 1024 * 1024,
                "VmPeak grew from {before} kB to {after} kB: the 2 GB length was allocated"
            );
        }
        still_serves(&p).await;
    })
    .await;
}

#[tokio::test]
async fn bad_message_lengths_after_login() {
    let p = Parsnip::with_config(&config());
    bounded(60, "bad_message_lengths_after_login", async {
        // Length -1.
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        raw.send(&[b'Q', 0xff, 0xff, 0xff, 0xff]).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "message length -1").await;
        assert_eq!(e.code(), "08P01", "{e}\n{}", p.log_tail());

        // Length 3 (smaller than the length field itself).
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        raw.send(&[b'Q', 0, 0, 0, 3]).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "message length 3").await;
        assert_eq!(e.code(), "08P01", "{e}");

        // A header claiming 100 MB with max_message_size = 1 MB: refused before the body.
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        let mut header = vec![b'Q'];
        header.extend_from_slice(&(100u32 << 20).to_be_bytes());
        header.extend_from_slice(b"select 1");
        raw.send(&header).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "100 MB message").await;
        assert_eq!(e.code(), "08P01", "{e}");

        // Just under the limit is fine.
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        let sql = format!("select length('{}')", "x".repeat(1_000_000));
        assert_eq!(raw.scalar(&sql).await.unwrap().as_deref(), Some("1000000"));
        still_serves(&p).await;
    })
    .await;
}

#[tokio::test]
async fn unknown_message_type_is_refused() {
    let p = Parsnip::with_config(&config());
    bounded(60, "unknown_message_type_is_refused", async {
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        raw.send(&msg(0x01, b"hello")).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "message type 0x01").await;
        assert_eq!(e.code(), "08P01", "{e}\n{}", p.log_tail());
        // Also inside a transaction: the server must not be left dirty.
        let mut raw = p.raw_login("postgres", SUPER_PW, "postgres").await;
        raw.simple_query("BEGIN; CREATE TEMP TABLE x (y int)").await.unwrap();
        raw.send(&msg(0x01, b"")).await.ok();
        let e = raw.expect_error_and_close(CLOSE, "message type 0x01 in a transaction").await;
        assert_eq!(e.code(), "08P01", "{e}");
        still_serves(&p).await;
    })
    .await;
}

#[tokio::test]
async fn unfinished_startup_times_out() {
    let p = Parsnip::with_config(&config());
    bounded(60, "unfinished_startup_times_out", async {
        let mut raw = p.raw().await;
        raw.send(&[0, 0]).await.unwrap();
        let t0 = std::time::Instant::now();
        // client_login_timeout_ms = 500: closed well before 5 s (an error frame is optional).
        let frames = raw.read_until_closed(CLOSE).await;
        assert!(frames.iter().all(|f| f.tag == b'E'), "{}", summarize(&frames));
        assert!(t0.elapsed() >= Duration::from_millis(300), "closed after only {:?}", t0.elapsed());
        // Same for a client that sent its startup but never answers the password request.
        let p2 = Parsnip::with_config(&format!(
            "auth_type = \"password\"\nclient_login_timeout_ms = 500\n\n\
             [databases.\"*\"]\nhost = \"127.0.0.1\"\nport = {}\n\n[users.postgres]\npassword = \"{SUPER_PW}\"\n",
            cluster().port()
        ));
        let mut raw = p2.raw().await;
        raw.send(&startup_packet(&[("user", "postgres"), ("database", "postgres")])).await.unwrap();
        let first = raw.read_frame().await.expect("auth request");
        assert_eq!(first.tag, b'R', "expected an authentication request");
        raw.read_until_closed(CLOSE).await;
        still_serves(&p).await;
    })
    .await;
}

#[tokio::test]
async fn ssl_request_gets_n_then_plain_startup_works() {
    let p = Parsnip::with_config(&config());
    bounded(60, "ssl_request_gets_n_then_plain_startup_works", async {
        let mut raw = p.raw().await;
        raw.send(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await.unwrap();
        let answer = raw.read_byte().await;
        assert_eq!(answer, Some(b'N'), "{}", p.log_tail());
        raw.startup(&[("user", "postgres"), ("database", "postgres")], Some(SUPER_PW))
            .await
            .unwrap_or_else(|e| panic!("startup after SSLRequest: {e}\n{}", p.log_tail()));
        assert_eq!(raw.scalar("select 'plain'").await.unwrap().as_deref(), Some("plain"));
        // GSSENCRequest is declined the same way.
        let mut raw = p.raw().await;
        raw.send(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30]).await.unwrap();
        assert_eq!(raw.read_byte().await, Some(b'N'));
        raw.startup(&[("user", "postgres"), ("database", "postgres")], Some(SUPER_PW)).await.unwrap();
        assert_eq!(raw.scalar("select 1").await.unwrap().as_deref(), Some("1"));
    })
    .await;
}

#[tokio::test]
async fn abandoned_startups_do_not_block_others() {
    let p = Parsnip::with_config(&trust_config("max_message_size = 1048576\nclient_login_timeout_ms = 30000"));
    bounded(60, "abandoned_startups_do_not_block_others", async {
        let mut abandoned = Vec::new();
        for i in 0..300 {
            let mut raw = p.raw().await;
            // Various points of an unfinished startup.
            let packet = startup_packet(&[("user", "postgres"), ("database", "postgres")]);
            let cut = [2, 4, 6, packet.len() - 1][i % 4];
            raw.send(&packet[..cut]).await.unwrap();
            abandoned.push(raw);
        }
        // A normal client is served promptly while all of those hang.
        let t0 = std::time::Instant::now();
        let c = within(Duration::from_secs(10), p.connect("postgres", SUPER_PW, "postgres"))
            .await
            .unwrap_or_else(|e| panic!("normal client blocked: {e}\n{}", p.log_tail()));
        assert_eq!(c.scalar("select 'ok'").await.unwrap(), "ok");
        assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
        drop(abandoned);
        still_serves(&p).await;
    })
    .await;
}
