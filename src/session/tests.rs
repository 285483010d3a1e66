//! Conversation tests: frames in, bytes and actions out, no sockets.

use super::*;
use crate::protocol::backend::write_msg;
use bytes::BufMut;

fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    write_msg(&mut b, tag, |b| b.put_slice(body));
    b.to_vec()
}
fn query(sql: &str) -> Vec<u8> {
    let mut b = BytesMut::new();
    frontend::query(&mut b, sql);
    b.to_vec()
}
fn rfq(s: u8) -> Vec<u8> {
    msg(b'Z', &[s])
}
fn tags_of(buf: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = buf;
    while let Ok(Some(n)) = crate::protocol::split_frame(rest, usize::MAX) {
        out.push(rest[0] as char);
        rest = &rest[n..];
    }
    out
}
fn actions(s: &mut Session) -> Vec<Action> {
    std::iter::from_fn(|| s.poll_action()).collect()
}
fn linked(mode: PoolMode) -> (Session, ServerState) {
    let mut s = Session::new(mode, Settings::default());
    let mut st = ServerState::default();
    s.handle_client(&query("select 1"));
    assert_eq!(actions(&mut s), vec![Action::AcquireServer]);
    s.handle_server_linked(&mut st);
    (s, st)
}

#[test]
fn transaction_mode_releases_at_idle_ready() {
    let (mut s, mut st) = linked(PoolMode::Transaction);
    assert_eq!(tags_of(&s.to_server), "Q");
    for m in [msg(b'T', b"\0\0"), msg(b'D', b"\0\0"), msg(b'C', b"SELECT 1\0")] {
        s.handle_server(&m, &mut st);
    }
    assert!(actions(&mut s).is_empty());
    s.handle_server(&rfq(b'I'), &mut st);
    assert_eq!(actions(&mut s), vec![Action::ReleaseServer { reusable: true }]);
    assert_eq!(tags_of(&s.to_client), "TDCZ");
}

#[test]
fn stays_linked_inside_transaction_and_in_session_mode() {
    let (mut s, mut st) = linked(PoolMode::Transaction);
    s.handle_server(&msg(b'C', b"BEGIN\0"), &mut st);
    s.handle_server(&rfq(b'T'), &mut st);
    assert!(actions(&mut s).is_empty());
    assert!(s.is_idle_in_transaction());
    let (mut s, mut st) = linked(PoolMode::Session);
    s.handle_server(&msg(b'C', b"SELECT 1\0"), &mut st);
    s.handle_server(&rfq(b'I'), &mut st);
    assert!(actions(&mut s).is_empty());
}

#[test]
fn pipelined_syncs_release_only_after_the_last() {
    let mut s = Session::new(PoolMode::Transaction, Settings::default());
    let mut st = ServerState::default();
    for m in [msg(b'P', b"\0select 1\0\0\0"), msg(b'B', b"\0\0\0\0\0\0\0\0"), msg(b'E', b"\0\0\0\0\0"), msg(b'S', b"")]
    {
        s.handle_client(&m);
    }
    s.handle_client(&msg(b'E', b"\0\0\0\0\0"));
    s.handle_client(&msg(b'S', b""));
    assert_eq!(actions(&mut s), vec![Action::AcquireServer]);
    s.handle_server_linked(&mut st);
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        s.handle_server(&m, &mut st);
    }
    assert!(actions(&mut s).is_empty(), "second Sync still outstanding");
    // The second Execute fails: the server skips to Sync.
    s.handle_server(&msg(b'E', b"SERROR\0C34000\0Mno portal\0\0"), &mut st);
    s.handle_server(&rfq(b'I'), &mut st);
    assert_eq!(actions(&mut s), vec![Action::ReleaseServer { reusable: true }]);
    assert_eq!(tags_of(&s.to_client), "12CZEZ");
}

#[test]
fn error_skips_queued_requests_until_sync() {
    let (mut s, mut st) = linked(PoolMode::Transaction);
    s.handle_server(&msg(b'C', b"SELECT 1\0"), &mut st);
    s.handle_server(&rfq(b'I'), &mut st);
    let _ = actions(&mut s);
    for m in [
        msg(b'P', b"\0bad\0\0\0"),
        msg(b'B', b"\0\0\0\0\0\0\0\0"),
        msg(b'D', b"P\0"),
        msg(b'E', b"\0\0\0\0\0"),
        msg(b'S', b""),
    ] {
        s.handle_client(&m);
    }
    s.handle_server_linked(&mut st);
    s.handle_server(&msg(b'E', b"SERROR\0C42601\0Msyntax\0\0"), &mut st);
    assert_eq!(s.outstanding(), 1);
    s.handle_server(&rfq(b'I'), &mut st);
    assert_eq!(actions(&mut s), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
}

#[test]
fn sync_without_server_is_answered_locally() {
    let mut s = Session::new(PoolMode::Transaction, Settings::default());
    s.handle_client(&msg(b'S', b""));
    assert!(actions(&mut s).is_empty());
    assert_eq!(tags_of(&s.to_client), "Z");
}

#[test]
fn unexpected_server_reply_closes_both() {
    let mut s = Session::new(PoolMode::Transaction, Settings::default());
    let mut st = ServerState::default();
    s.handle_client(&query("select 1"));
    s.handle_server_linked(&mut st);
    let _ = actions(&mut s);
    s.handle_server(&msg(b'1', b""), &mut st);
    assert_eq!(actions(&mut s), vec![Action::ReleaseServer { reusable: false }, Action::Close]);
    assert_eq!(tags_of(&s.to_client), "E");
}

#[test]
fn unknown_client_message_is_08p01() {
    let mut s = Session::new(PoolMode::Transaction, Settings::default());
    s.handle_client(&msg(b'!', b""));
    assert_eq!(actions(&mut s), vec![Action::Close]);
    assert!(s.to_client.windows(5).any(|w| w == b"08P01"));
}

#[test]
fn statement_mode_refuses_transaction_blocks() {
    let mut s = Session::new(PoolMode::Statement, Settings::default());
    let mut st = ServerState::default();
    s.handle_client(&query("begin"));
    let _ = actions(&mut s);
    s.handle_server_linked(&mut st);
    s.to_server.clear();
    s.handle_server(&msg(b'C', b"BEGIN\0"), &mut st);
    s.handle_server(&rfq(b'T'), &mut st);
    assert_eq!(tags_of(&s.to_client), "CEZ");
    assert_eq!(tags_of(&s.to_server), "Q", "ROLLBACK sent");
    s.handle_server(&msg(b'C', b"ROLLBACK\0"), &mut st);
    s.handle_server(&rfq(b'I'), &mut st);
    assert_eq!(actions(&mut s), vec![Action::ReleaseServer { reusable: true }]);
    assert_eq!(tags_of(&s.to_client), "CEZ", "rollback replies hidden");
}

#[test]
fn settings_replayed_on_link_and_tracked_after_set() {
    let mut client = Settings::default();
    client.set_reported("application_name", "app");
    let mut s = Session::new(PoolMode::Transaction, client);
    let mut st = ServerState::default();
    st.settings.set_reported("application_name", "");
    s.handle_client(&query("SET search_path TO x"));
    let _ = actions(&mut s);
    s.handle_server_linked(&mut st);
    assert_eq!(tags_of(&s.to_server), "QQ");
    // Replies to the replayed SET are hidden; its ParameterStatus updates the server view.
    s.handle_server(&msg(b'S', b"application_name\0app\0"), &mut st);
    s.handle_server(&msg(b'C', b"SET\0"), &mut st);
    s.handle_server(&rfq(b'I'), &mut st);
    assert_eq!(tags_of(&s.to_client), "");
    s.handle_server(&msg(b'C', b"SET\0"), &mut st);
    s.handle_server(&rfq(b'I'), &mut st);
    assert_eq!(tags_of(&s.to_client), "CZ");
    assert_eq!(s.settings().key(), st.settings.key());
    assert_eq!(s.settings().extra[0].0, "search_path");
}

#[test]
fn acquire_failure_fails_each_batch() {
    let mut s = Session::new(PoolMode::Transaction, Settings::default());
    s.handle_client(&query("select 1"));
    s.handle_client(&msg(b'P', b"\0select 1\0\0\0"));
    let _ = actions(&mut s);
    s.handle_acquire_failed(Error::new(SqlState::QUERY_CANCELED, "timeout"));
    assert_eq!(tags_of(&s.to_client), "EZE");
    s.handle_client(&msg(b'B', b"\0\0\0\0\0\0\0\0"));
    s.handle_client(&msg(b'S', b""));
    assert_eq!(tags_of(&s.to_client), "EZEZ");
}
