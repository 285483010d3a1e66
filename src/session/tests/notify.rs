//! LISTEN/UNLISTEN answered by the session, applied at COMMIT, and notifications held
//! until the client is between transactions (`session::notify`).

use super::*;
use crate::stmt::sql::listen::ListenCmd;

fn notification(pid: i32, ch: &str, payload: &str) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    body.extend_from_slice(format!("{ch}\0{payload}\0").as_bytes());
    msg(b'A', &body)
}

fn listen(ch: &str) -> ListenCmd {
    ListenCmd::Listen(ch.as_bytes().into())
}

#[test]
fn listen_alone_is_answered_without_a_server() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("LISTEN Foo"));
    assert_eq!(h.client_out(), "CZ");
    assert!(!h.actions().contains(&Action::AcquireServer));
    assert_eq!(h.subscribed, vec![listen("foo")]);
    assert!(!h.s.is_pinned());
    // Delivered at once to an idle client; another channel's is not.
    h.s.queue_notifications(&[notification(9, "foo", "x"), notification(9, "bar", "y")].concat(), false);
    assert_eq!(h.client_out(), "A");
    // An UNLISTEN of a channel never listened on changes nothing; UNLISTEN * does.
    h.client(query("unlisten nope"));
    assert_eq!(h.client_out(), "CZ");
    h.client(query("UNLISTEN *"));
    assert_eq!(h.client_out(), "CZ");
    assert_eq!(h.subscribed, vec![listen("foo"), ListenCmd::UnlistenAll]);
    h.s.queue_notifications(&notification(9, "foo", "z"), false);
    assert_eq!(h.client_out(), "");
}

/// A client listening on `a` that has just begun a transaction block (BEGIN's replies not
/// read yet).
fn listening_in_a_block() -> H {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("LISTEN a"));
    h.client_out();
    h.begin();
    h
}

#[test]
fn listen_in_a_block_applies_at_commit_and_notifications_wait_for_its_end() {
    let mut h = listening_in_a_block();
    assert_eq!(h.client_out(), "CZ");
    h.server_out();
    h.client(query("LISTEN b"));
    assert_eq!(h.client_out(), "CZ");
    assert!(h.s.to_server.is_empty(), "LISTEN reached the server");
    // Subscribed ahead of the COMMIT (`Listening::early`), not yet listened on.
    assert_eq!(h.subscribed, vec![listen("a"), listen("b")]);
    // Inside the block: held, even for the pending channel b.
    h.s.queue_notifications(&[notification(9, "a", "1"), notification(9, "b", "2")].concat(), false);
    assert_eq!(h.client_out(), "");
    h.client(query("COMMIT"));
    h.server_out();
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.subscribed, vec![listen("a"), listen("b"), listen("b")]);
    // Just before ReadyForQuery 'I', as PostgreSQL sends them (it failed before: "CZAA").
    assert_eq!(h.client_out(), "CAAZ", "the notifications before ReadyForQuery 'I'");
    // Rolled back: dropped.
    h.begin();
    h.client(query("UNLISTEN a"));
    h.client(query("ROLLBACK"));
    h.server(msg(b'C', b"ROLLBACK\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.subscribed.len(), 3, "a rolled back UNLISTEN was applied");
}

/// PostgreSQL checks a notification against the channels a listening session has when it
/// reads it, at its block's end: a block's UNLISTEN drops that channel's notifications
/// sent during the block, its LISTEN gets the new channel's; a LISTEN rolled back gives its
/// early subscription up; a session that listened on nothing before its block gets none
/// sent before its COMMIT. (Parsnip checked them on arrival, against the channels before
/// the block: it sent a's and not b's.)
#[test]
fn the_end_of_a_block_decides_which_notifications_it_gets() {
    let mut h = listening_in_a_block();
    h.client_out();
    h.server_out();
    h.client(query("LISTEN b"));
    h.client(query("UNLISTEN a"));
    h.client_out();
    let sent = [notification(9, "a", "from a"), notification(9, "b", "from b"), notification(9, "c", "x")].concat();
    h.s.queue_notifications(&sent, false);
    assert_eq!(h.client_out(), "");
    h.client(query("COMMIT"));
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    let out = text(&h.s.to_client);
    assert_eq!(h.client_out(), "CAZ");
    assert!(out.contains("from b") && !out.contains("from a"), "{out:?}");
    // A LISTEN rolled back: its early subscription is given up.
    h.begin();
    h.client(query("LISTEN d"));
    h.s.queue_notifications(&notification(9, "d", "no"), false);
    h.client(query("ROLLBACK"));
    h.server(msg(b'C', b"ROLLBACK\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZCZCZ");
    assert_eq!(h.subscribed.last(), Some(&ListenCmd::Unlisten(b"d".as_slice().into())));
    // Listening on nothing before the block: nothing sent before its COMMIT.
    let mut h = H::new(PoolMode::Transaction, None);
    h.begin();
    h.client(query("LISTEN e"));
    h.s.queue_notifications(&notification(9, "e", "before"), false);
    h.client(query("COMMIT"));
    h.server(msg(b'C', b"COMMIT\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZCZCZ");
}

#[test]
fn listen_in_a_failed_block_is_an_error() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.begin();
    h.client(query("select 1/0"));
    h.server(err("22012"));
    h.server(rfq(b'E'));
    h.client_out();
    h.client(query("LISTEN a"));
    let out = h.s.to_client.to_vec();
    assert_eq!(h.client_out(), "EZ");
    assert!(text(&out).contains("25P02"));
    assert!(h.subscribed.is_empty());
}

#[test]
fn too_many_waiting_closes_the_client() {
    let mut h = listening_in_a_block();
    h.client_out();
    let one = notification(9, "a", "x");
    let many: Vec<u8> = one.iter().copied().cycle().take(one.len() * MAX_QUEUED).collect();
    h.s.queue_notifications(&many, false);
    assert!(!h.s.is_closing());
    h.s.queue_notifications(&one, false);
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("53400"));
}

#[test]
fn a_multi_statement_or_session_mode_listen_goes_to_the_server() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("LISTEN a; select 1"));
    assert!(h.actions().contains(&Action::AcquireServer));
    assert!(h.s.is_pinned());
    let mut h = H::new(PoolMode::Session, None);
    h.client(query("LISTEN a"));
    assert!(h.actions().contains(&Action::AcquireServer));
}

/// One client cannot make the pool's listening connection listen on an unbounded number of
/// channels: past `MAX_CHANNELS` it is closed with FATAL 54000. A channel it already
/// listens on is still answered.
#[test]
fn a_client_listening_on_too_many_channels_is_closed() {
    let mut h = H::new(PoolMode::Transaction, None);
    for i in 0..crate::session::notify::MAX_CHANNELS {
        h.client(query(&format!("LISTEN c{i}")));
    }
    h.client_out();
    h.client(query("LISTEN c0"));
    assert_eq!(h.client_out(), "CZ", "already listened on");
    assert!(!h.s.is_closing());
    h.client(query("LISTEN one_too_many"));
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("C54000"), "{}", text(&h.s.to_client));
}

/// A lone LISTEN through the extended protocol (cache on) is parsed and bound on the server
/// as any statement; its Execute is answered by the session, in its place, and applied at
/// the batch's ReadyForQuery: the client is not pinned. In a block that rolls back, it is
/// dropped.
#[test]
fn an_extended_protocol_listen_is_answered_at_its_execute() {
    let mut h = H::cached();
    for f in [parse("", "LISTEN foo"), bind(""), execute(), sync()] {
        h.client(f);
    }
    let sent: Vec<u8> = h.server_out().iter().map(|f| f[0]).collect();
    assert!(!sent.contains(&b'E'), "the Execute reached the server: {:?}", String::from_utf8_lossy(&sent));
    assert!(h.subscribed.is_empty(), "applied before the batch ended");
    h.server(msg(b'1', b""));
    h.server(msg(b'2', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "12CZ");
    assert_eq!(h.subscribed, vec![listen("foo")]);
    assert!(!h.s.is_pinned());
    assert!(!h.linked, "the server was given back");
    // In a block: applied at its COMMIT, dropped at its ROLLBACK.
    for (ch, end) in [("bar", "ROLLBACK"), ("baz", "COMMIT")] {
        h.begin();
        for f in [parse("", &format!("LISTEN {ch}")), bind(""), execute(), sync()] {
            h.client(f);
        }
        h.server_out();
        h.server(msg(b'1', b""));
        h.server(msg(b'2', b""));
        h.server(rfq(b'T'));
        assert_eq!(h.client_out(), "CZ12CZ");
        // Subscribed ahead of the block's end (`Listening::early`), not yet listened on.
        assert_eq!(h.subscribed.last(), Some(&listen(ch)));
        h.client(query(end));
        h.server(msg(b'C', format!("{end}\0").as_bytes()));
        h.server(rfq(b'I'));
        h.client_out();
    }
    let bar = ListenCmd::Unlisten(b"bar".as_slice().into());
    assert_eq!(h.subscribed, vec![listen("foo"), listen("bar"), bar, listen("baz"), listen("baz")]);
    // Listened on: foo and baz, not bar.
    h.s.queue_notifications(&[notification(9, "bar", "x"), notification(9, "baz", "y")].concat(), false);
    assert_eq!(h.client_out(), "A");
}

/// LISTEN among other statements of one Query (cache on) is taken out of the text sent to
/// the server and answered in its place; it takes effect when the Query succeeded.
#[test]
fn a_listen_among_other_statements_is_answered_in_its_place() {
    let mut h = H::cached();
    h.client(query("LISTEN a; SELECT 1"));
    let out = h.server_out();
    let sent = String::from_utf8_lossy(frontend::query_text(&out[0][5..]).unwrap_or_default()).into_owned();
    assert!(!sent.to_ascii_lowercase().contains("listen"), "{sent}");
    h.server(rowdesc(&["x"], 0));
    h.server(msg(b'D', b"\0\x01\0\0\0\x011"));
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CTDCZ");
    assert_eq!(h.subscribed, vec![listen("a")]);
    // A Query that fails after its LISTEN: not applied.
    if !h.s.to_server.is_empty() {
        // The pin check of the first Query (its text named LISTEN): nothing remains.
        h.server_out();
        h.server(msg(b'T', b"\0\x04"));
        let mut row = 4u16.to_be_bytes().to_vec();
        for _ in 0..4 {
            row.extend_from_slice(&1i32.to_be_bytes());
            row.push(b'f');
        }
        h.server(msg(b'D', &row));
        h.server(msg(b'C', b"SELECT 1\0"));
        h.server(rfq(b'I'));
    }
    assert!(!h.s.is_pinned());
    h.client(query("LISTEN b; SELECT 1/0"));
    h.server_out();
    h.server(err("22012"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CEZ");
    assert_eq!(h.subscribed, vec![listen("a")], "a failed Query's LISTEN was applied");
}
