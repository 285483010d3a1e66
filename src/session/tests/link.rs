//! Linking and releasing a server by pool mode, errors and skipping to Sync, settings
//! replayed on a new server.

use super::*;

#[test]
fn transaction_mode_releases_at_idle_ready() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("select 1"));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert_eq!(h.server_out().len(), 1);
    for m in [msg(b'T', b"\0\0"), msg(b'D', b"\0\0"), msg(b'C', b"SELECT 1\0")] {
        h.server(m);
    }
    assert!(h.actions().is_empty());
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: true }]);
    assert_eq!(h.client_out(), "TDCZ");
}

#[test]
fn stays_linked_inside_transaction_and_in_session_mode() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert!(h.s.is_idle_in_transaction());
    let mut h = H::new(PoolMode::Session, None);
    h.client(query("select 1"));
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
}

#[test]
fn pipelined_syncs_release_only_after_the_last() {
    let mut h = H::new(PoolMode::Transaction, None);
    for m in [parse("", "select 1"), bind(""), execute(), sync(), execute(), sync()] {
        h.client(m);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert!(h.actions().is_empty(), "second Sync still outstanding");
    // The second Execute fails: the server skips to Sync.
    h.server(err("34000"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: true }]);
    assert_eq!(h.client_out(), "12CZEZ");
}

#[test]
fn error_skips_queued_requests_until_sync() {
    let mut h = H::new(PoolMode::Transaction, None);
    for m in [parse("", "bad"), bind(""), msg(b'D', b"P\0"), execute(), sync()] {
        h.client(m);
    }
    h.server(err("42601"));
    assert_eq!(h.s.outstanding(), 1);
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert_eq!(h.client_out(), "EZ");
}

#[test]
fn sync_without_server_is_answered_locally() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(sync());
    assert!(h.actions().is_empty());
    assert_eq!(h.client_out(), "Z");
}

#[test]
fn unexpected_server_reply_closes_both() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("select 1"));
    let _ = h.actions();
    h.server(msg(b'1', b""));
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: false }, Action::Close]);
    assert_eq!(h.client_out(), "E");
}

#[test]
fn fatal_from_an_idle_server_reaches_the_client_as_sent() {
    // A backend terminated under a client idle in a transaction (pg_terminate_backend):
    // the client gets PostgreSQL's own FATAL 57P01, then the connection ends.
    let fatal = msg(b'E', b"SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0");
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let mut h = H::new(mode, None);
        h.client(query("begin"));
        h.server(msg(b'C', b"BEGIN\0"));
        h.server(rfq(b'T'));
        assert_eq!(h.client_out(), "CZ");
        let _ = h.actions();
        h.server(fatal.clone());
        assert_eq!(h.actions(), vec![Action::RetireServers, Action::ReleaseServer { reusable: false }, Action::Close]);
        let out = h.s.to_client.split().to_vec();
        assert_eq!(out, fatal, "the server's own frame, not a pooler error");
    }
    // A non-FATAL error with nothing outstanding is still a desync.
    let mut h = H::new(PoolMode::Session, None);
    h.client(query("select 1"));
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    let _ = (h.client_out(), h.actions());
    h.server(err("42000"));
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: false }, Action::Close]);
    assert!(text(&h.s.to_client.split()).contains("unexpected"));
}

#[test]
fn a_server_going_down_retires_its_pools_connections_and_nothing_else_does() {
    // A fast shutdown terminates every backend: the FATAL read on one connection says the
    // pool's others are dying too, their own FATAL perhaps not read yet. So does the warning
    // of an immediate shutdown or a crash. Another FATAL (an idle-session timeout) does not.
    let say = |severity: &str, code: &str| {
        msg(
            if severity == "FATAL" { b'E' } else { b'N' },
            format!("S{severity}\0V{severity}\0C{code}\0Mgone\0\0").as_bytes(),
        )
    };
    for (severity, code, retires) in
        [("FATAL", "57P01", true), ("WARNING", "57P02", true), ("WARNING", "57P01", true), ("FATAL", "57P05", false)]
    {
        let mut h = H::new(PoolMode::Transaction, None);
        h.client(query("insert into t values (1)"));
        let _ = h.actions();
        h.server(say(severity, code));
        let mut actions = h.actions();
        if severity == "WARNING" {
            // The connection ends with no FATAL.
            h.s.handle_server_lost();
            actions.extend(std::iter::from_fn(|| h.s.poll_action()));
        }
        assert_eq!(actions.contains(&Action::RetireServers), retires, "{severity} {code}: {actions:?}");
        let release = actions.iter().position(|a| matches!(a, Action::ReleaseServer { .. }));
        assert!(release.is_some(), "{severity} {code}: {actions:?}");
        if retires {
            assert_eq!(actions.iter().filter(|a| **a == Action::RetireServers).count(), 1);
            assert!(actions.iter().position(|a| *a == Action::RetireServers) < release, "retired first: {actions:?}");
        }
    }
}

#[test]
fn unknown_client_message_is_08p01() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(msg(b'!', b""));
    assert_eq!(h.actions(), vec![Action::Close]);
    assert!(h.s.to_client.windows(5).any(|w| w == b"08P01"));
}

#[test]
fn statement_mode_refuses_transaction_blocks() {
    let mut h = H::new(PoolMode::Statement, None);
    h.client(query("begin"));
    let _ = h.server_out();
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    assert_eq!(h.client_out(), "CEZ");
    assert_eq!(h.server_out().len(), 1, "ROLLBACK sent");
    h.server(msg(b'C', b"ROLLBACK\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert_eq!(h.client_out(), "", "rollback replies hidden");
}

#[test]
fn settings_replayed_on_link_and_tracked_after_set() {
    let mut client = Settings::default();
    client.set_reported("application_name", "app");
    let mut h = H::new(PoolMode::Transaction, None);
    h.s.kept.settings = Arc::new(client);
    h.srv.settings.set_reported("application_name", "");
    h.client(query("SET search_path TO x"));
    assert_eq!(h.server_out().len(), 2, "settings replay, then the client's query");
    h.server(msg(b'S', b"application_name\0app\0"));
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "");
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZ");
    assert_eq!(h.s.settings().key(), h.srv.settings.key());
    assert_eq!(h.s.settings().extra[0].0, "search_path");
}

#[test]
fn acquire_failure_fails_the_request() {
    let mut h = H::new(PoolMode::Transaction, None);
    h.s.handle_acquire_failed(Error::new(SqlState::QUERY_CANCELED, "timeout"));
    h.client(query("select 1"));
    assert_eq!(h.client_out(), "EZ");
    h.s.handle_acquire_failed(Error::new(SqlState::QUERY_CANCELED, "timeout"));
    h.client(parse("", "select 1"));
    h.client(bind(""));
    h.client(sync());
    assert_eq!(h.client_out(), "EZ");
}

#[test]
fn a_server_lost_twice_gives_its_client_one_fatal() {
    // The driver reports a broken connection each time it looks at it (a shared one is
    // seen dead by every read until the close is carried out): one FATAL for one failure.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("select 1"));
    let _ = h.actions();
    h.s.handle_server_lost();
    h.s.handle_server_lost();
    let out = h.s.to_client.split().to_vec();
    assert_eq!(tags_of(&out), "E", "one error: {}", text(&out));
    assert_eq!(h.s.poll_action(), Some(Action::ReleaseServer { reusable: false }));
    assert_eq!(h.s.poll_action(), Some(Action::Close));
    assert_eq!(h.s.poll_action(), None);
}

/// A server another client left with `statement_timeout = 1` (as its settings say).
fn with_foreign_timeout() -> H {
    let mut h = H::new(PoolMode::Transaction, None);
    let mut client = Settings::default();
    client.set_extra("search_path".into(), "SET search_path TO a".into());
    h.s.kept.settings = Arc::new(client);
    h.srv.settings.set_extra("statement_timeout".into(), "SET statement_timeout = 1".into());
    h
}

#[test]
fn another_clients_timeout_is_reset_alone_before_the_replay_and_the_clients_query() {
    let mut h = with_foreign_timeout();
    h.client(query("select 1"));
    let out = h.server_out();
    assert_eq!(out.len(), 1, "only the reset: the client's query waits for it");
    assert!(text(&out[0]).contains("RESET \"statement_timeout\";"), "{}", text(&out[0]));
    assert!(!text(&out[0]).contains("search_path"));
    h.server(msg(b'C', b"RESET\0"));
    h.server(rfq(b'I'));
    let out = h.server_out();
    assert_eq!(out.len(), 2, "the replay, then the client's query");
    assert!(text(&out[0]).contains("SET search_path TO a;"), "{}", text(&out[0]));
    assert!(text(&out[1]).contains("select 1"));
    assert_eq!(h.client_out(), "", "the reset's replies are hidden");
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    h.server(msg(b'C', b"SELECT 1\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "CZ");
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert_eq!(h.srv.settings.key(), h.s.settings().key());
}

#[test]
fn a_reset_the_old_timeout_cancels_is_tried_again_then_the_client_is_told() {
    let mut h = with_foreign_timeout();
    h.client(query("select 1"));
    let _ = h.server_out();
    h.server(err("57014"));
    h.server(rfq(b'I'));
    let out = h.server_out();
    assert_eq!(out.len(), 1, "the reset again, alone");
    assert!(text(&out[0]).contains("RESET \"statement_timeout\";"));
    assert_eq!(h.client_out(), "", "a cancelled reset is no news to the client");
    h.server(msg(b'C', b"RESET\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.server_out().len(), 2, "the replay and the client's query");

    // Cancelled every time: after the last try the client gets the error, as of a replay
    // that failed, and the server is not reused.
    let mut h = with_foreign_timeout();
    h.client(query("select 1"));
    for _ in 0..super::super::linking::CLEAR_TRIES - 1 {
        assert_eq!(h.server_out().len(), 1);
        h.server(err("57014"));
        h.server(rfq(b'I'));
        assert_eq!(h.client_out(), "", "tried again");
    }
    assert_eq!(h.server_out().len(), 1);
    h.server(err("57014"));
    assert_eq!(h.client_out(), "E");
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: false }, Action::Close]);
}

#[test]
fn a_set_tagged_with_comments_is_tracked_and_replayed_whole() {
    // ORMs and tracing libraries tag statements with comments: such a SET changes the
    // setting all the same, and the next server must get it.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("/* app='web' */ SET search_path = x -- traced"));
    let _ = h.server_out();
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert_eq!(h.s.settings().extra[0].0, "search_path");
    h.srv = ServerState::default(); // another server
    h.client(query("SELECT 1"));
    let out = h.server_out();
    // The line comment ends before the replay's `;`, or it would swallow it.
    assert!(text(&out[0]).contains("SET search_path = x -- traced\n;"), "{}", text(&out[0]));
}

#[test]
fn a_set_that_cannot_be_read_costs_its_server() {
    // Not UTF-8 (a client_encoding of LATIN1, say): neither recorded nor replayable.
    let mut h = H::new(PoolMode::Transaction, None);
    let mut q = b"Q\0\0\0\0SET search_path = '\xe9t\xe9'\0".to_vec();
    let n = (q.len() - 1) as u32;
    q[1..5].copy_from_slice(&n.to_be_bytes());
    h.client(q);
    let _ = h.server_out();
    h.server(msg(b'C', b"SET\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: false }]);
}

#[test]
fn a_do_block_that_may_set_something_costs_its_server() {
    // PL/pgSQL's SET is session-level and outlives the block; what it sets is not read.
    for (sql, reusable) in [
        ("DO $$ BEGIN SET search_path = elsewhere; END $$", false),
        ("do $x$ begin execute 'RESET ALL'; end $x$", false),
        ("SELECT 1; DO $$ BEGIN PERFORM set_config('a.b', 'c', false); END $$", false),
        ("DO $$ BEGIN PERFORM 1; END $$", true),
    ] {
        let mut h = H::new(PoolMode::Transaction, None);
        h.client(query(sql));
        let _ = h.server_out();
        if sql.starts_with("SELECT") {
            h.server(msg(b'C', b"SELECT 1\0"));
        }
        h.server(msg(b'C', b"DO\0"));
        h.server(rfq(b'I'));
        assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable }], "{sql}");
    }
}
