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

/// A Sync the client sends inside COPY FROM STDIN is not sent on: PostgreSQL ignores it
/// while the copy runs, but answers it when the copy failed before the server read it, and
/// which of the two happened is not known here. After the copy, the client's next Sync is
/// the batch's.
#[test]
fn a_sync_inside_copy_is_not_sent_on() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("COPY t FROM STDIN"));
    h.server(msg(b'G', &[0, 0, 1, 0, 0]));
    h.server_out();
    for f in [msg(b'd', b"1\n"), sync(), msg(b'd', b"2\n"), sync()] {
        h.client(f);
    }
    assert_eq!(h.server_tags(), "dd");
    h.client(msg(b'c', b""));
    h.server(msg(b'C', b"COPY 2\0"));
    h.server(rfq(b'I'));
    assert!(!h.linked);
    assert_eq!(h.client_out(), "GCZ");
}

/// Syncs sent ahead of a COPY's CopyInResponse (tokio-postgres sends Bind, Execute and Sync
/// at once) are taken as ignored; with a timeout that may end the copy before the server
/// read them, that is not sure, and the connection is not reused.
#[test]
fn syncs_ahead_of_a_copy_under_a_timeout_cost_the_connection() {
    for timeout in [false, true] {
        let mut h = H::new(PoolMode::Transaction, None);
        if timeout {
            h.client(query("SET statement_timeout = 50"));
            h.server(msg(b'C', b"SET\0"));
            h.server(rfq(b'I'));
        }
        for f in [parse("", "COPY t FROM STDIN"), bind(""), execute(), sync()] {
            h.client(f);
        }
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b'G', &[0, 0, 1, 0, 0])] {
            h.server(m);
        }
        h.client(msg(b'c', b""));
        h.client(sync());
        h.server(msg(b'C', b"COPY 0\0"));
        h.server(rfq(b'I'));
        assert!(!h.linked);
        let released: Vec<_> = h.log.iter().filter(|a| matches!(a, Action::ReleaseServer { .. })).collect();
        let last = released.last().expect("released");
        assert_eq!(**last, Action::ReleaseServer { reusable: !timeout }, "timeout {timeout}");
    }
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
