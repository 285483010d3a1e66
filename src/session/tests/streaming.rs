//! What the driver passes through as it arrives: large rows, and COPY FROM STDIN.

use super::*;

/// A large DataRow the driver passes through as it arrives: only when its reply goes to
/// the client; the session's bookkeeping is as if it had copied the row itself.
#[test]
fn large_rows_stream_only_when_forwarded() {
    let header = |tag: u8| {
        let mut h = vec![tag];
        h.extend_from_slice(&(1_000_000i32).to_be_bytes());
        h
    };
    let mut h = H::new(PoolMode::Transaction, None);
    assert!(!h.s.stream_server_frame(&header(b'D')), "no request waits for a reply");
    h.client(query("select big"));
    h.server(msg(b'T', b"\0\0"));
    assert!(!h.s.stream_server_frame(&header(b'T')), "only DataRow and CopyData stream");
    assert!(h.s.stream_server_frame(&header(b'D')));
    // The driver appended the body; the row's end arrives as whole frames.
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert!(h.client_out().starts_with('T'));
    // Replies the client never sees (the settings replayed at link) are not streamed.
    let mut client = Settings::default();
    client.set_reported("application_name", "app");
    let mut h = H::new(PoolMode::Transaction, None);
    h.s.kept.settings = Arc::new(client);
    h.srv.settings.set_reported("application_name", "");
    h.client(query("select 1"));
    assert_eq!(h.server_out().len(), 2, "settings replay, then the client's query");
    assert!(!h.s.stream_server_frame(&header(b'D')), "the settings' reply is the pooler's");
}

/// A Sync sent during COPY FROM STDIN is ignored by PostgreSQL: after the CopyDone the
/// extended batch is still open, and the server must not go back to the pool until the
/// client's next Sync is answered (PostgreSQL 18 fails the next transaction start of a
/// backend given a simple Query in that state).
#[test]
fn a_sync_sent_during_copy_does_not_end_the_batch() {
    let mut h = H::new(PoolMode::Transaction, None);
    for f in [parse("", "COPY t FROM STDIN"), bind(""), execute(), sync(), msg(b'd', b"1\n"), msg(b'c', b"")] {
        h.client(f);
    }
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'G', &[0, 0, 1, 0, 0]), msg(b'C', b"COPY 1\0")] {
        h.server(m);
    }
    assert!(h.linked, "released while the server waits for a Sync: {:?}", h.actions());
    h.client(sync());
    h.server(rfq(b'I'));
    assert!(!h.linked);
}
