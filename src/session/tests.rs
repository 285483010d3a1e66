//! Conversation tests: frames in, bytes and actions out, no sockets. `H` plays the
//! driver: it links a server when asked and feeds frames again as the driver does.

use super::*;
use crate::error::SqlState;
use crate::protocol::frontend;
use crate::protocol::{tags_of, write_msg};
use crate::state::ServerState;
use crate::stmt::StmtConfig;
use bytes::BufMut;
use std::sync::atomic::Ordering;

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
fn parse(name: &str, sql: &str) -> Vec<u8> {
    msg(b'P', format!("{name}\0{sql}\0\0\0").as_bytes())
}
fn bind(stmt: &str) -> Vec<u8> {
    msg(b'B', format!("\0{stmt}\0\0\0\0\0\0\0").as_bytes())
}
fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}
fn sync() -> Vec<u8> {
    msg(b'S', b"")
}
fn close_s(name: &str) -> Vec<u8> {
    msg(b'C', format!("S{name}\0").as_bytes())
}
fn rfq(s: u8) -> Vec<u8> {
    msg(b'Z', &[s])
}
fn err(code: &str) -> Vec<u8> {
    msg(b'E', format!("SERROR\0C{code}\0Mboom\0\0").as_bytes())
}
/// A RowDescription of int4 columns, with a given table OID.
fn rowdesc(cols: &[&str], table: u32) -> Vec<u8> {
    let mut b = BytesMut::new();
    write_msg(&mut b, b'T', |b| {
        b.put_i16(cols.len() as i16);
        for (i, c) in cols.iter().enumerate() {
            b.put_slice(c.as_bytes());
            b.put_u8(0);
            b.put_u32(table);
            b.put_i16(i as i16 + 1);
            b.put_u32(23);
            b.put_i16(4);
            b.put_i32(-1);
            b.put_i16(0);
        }
    });
    b.to_vec()
}
fn frames(buf: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = buf;
    while let Ok(Some(n)) = crate::protocol::split_frame(rest, usize::MAX) {
        out.push(rest[..n].to_vec());
        rest = &rest[n..];
    }
    out
}

/// A test driver around one session and one server state.
struct H {
    s: Session,
    srv: ServerState,
    linked: bool,
    pending: Vec<Vec<u8>>,
    log: Vec<Action>,
    /// As a driver with a read/write split: a plain read is linked to a standby.
    reads: bool,
    /// Times the session was parked (`park`).
    parks: u32,
}

impl H {
    fn new(mode: PoolMode, registry: Option<Arc<Registry>>) -> H {
        H {
            s: Session::new(mode, Arc::new(Settings::default()), 7, registry),
            srv: ServerState::default(),
            linked: false,
            pending: vec![],
            log: vec![],
            reads: false,
            parks: 0,
        }
    }
    fn cached() -> H {
        H::new(
            PoolMode::Transaction,
            Some(Arc::new(Registry::new(StmtConfig { promote_unnamed_after: 2, ..Default::default() }))),
        )
    }
    fn client(&mut self, frame: Vec<u8>) {
        self.pending.push(frame);
        self.pump();
    }
    fn server(&mut self, frame: Vec<u8>) {
        self.s.handle_server(&frame, &mut self.srv);
        self.pump();
    }
    fn pump(&mut self) {
        loop {
            let mut progress = false;
            if let Some(replay) = self.s.take_replay() {
                let mut again: Vec<Vec<u8>> = frames(&replay);
                again.append(&mut self.pending);
                self.pending = again;
                progress = true;
            }
            while let Some(a) = self.s.poll_action() {
                progress = true;
                self.log.push(a.clone());
                match a {
                    Action::AcquireServer => {
                        self.s.handle_server_linked(&mut self.srv);
                        if self.reads && self.s.wants_reads() {
                            self.s.set_on_reads();
                        }
                        self.linked = true;
                    }
                    Action::ReleaseServer { .. } => self.linked = false,
                    Action::Close => {}
                }
            }
            // As the driver: a session lent for pipelining is fed nothing until released.
            while !(self.pending.is_empty() || self.linked && self.s.is_lent()) {
                let srv = if self.linked { Some(&mut self.srv) } else { None };
                if self.s.handle_client(&self.pending[0], srv) != Fed::Consumed {
                    break;
                }
                self.pending.remove(0);
                progress = true;
            }
            if !progress && self.s.actions.is_empty() {
                break;
            }
        }
        self.park();
    }
    /// As the driver: a session at rest is parked, and unparked into a blank session another
    /// one left (every conversation test runs across such swaps: nothing a client needs may
    /// stay behind in the blank half, nothing of another client may come with it).
    fn park(&mut self) {
        thread_local! {
            static BLANK: std::cell::RefCell<Option<Session>> = const { std::cell::RefCell::new(None) };
        }
        let Some(p) = self.s.park() else { return };
        assert!(self.s.at_rest());
        let blank = BLANK.with(|b| b.borrow_mut().take());
        let old = match blank {
            Some(mut b) => {
                b.unpark(p);
                std::mem::replace(&mut self.s, b)
            }
            None => std::mem::replace(&mut self.s, Session::unparked(p)),
        };
        BLANK.with(|b| *b.borrow_mut() = Some(old));
        self.parks += 1;
    }
    /// What the driver writes to the client now: not what waits for the client's Sync or
    /// Flush (`session::flush`).
    fn client_out(&mut self) -> String {
        let writable = self.s.writable_to_client();
        let out = tags_of(&self.s.to_client.split_to(writable));
        // Written out: the driver parks a session at rest before it waits.
        self.park();
        out
    }
    fn server_out(&mut self) -> Vec<Vec<u8>> {
        frames(&self.s.to_server.split())
    }
    fn actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.log)
    }
}

fn text(f: &[u8]) -> String {
    String::from_utf8_lossy(f).into_owned()
}

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
        assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: false }, Action::Close]);
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
    h.s.settings = Arc::new(client);
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

// ---- statement cache ----

#[test]
fn named_statements_are_renamed_and_parsed_once_per_server() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut a = H::new(PoolMode::Transaction, Some(reg.clone()));
    a.client(parse("s1", "select 1"));
    a.client(sync());
    let sent = a.server_out();
    assert_eq!(sent.len(), 2);
    assert!(text(&sent[0]).contains("pn_"), "renamed: {}", text(&sent[0]));
    a.server(msg(b'1', b""));
    a.server(rfq(b'I'));
    assert_eq!(a.client_out(), "1Z");
    // Another client, same text, different name, on the same server: no server Parse.
    let mut b = H::new(PoolMode::Transaction, Some(reg.clone()));
    b.srv = std::mem::take(&mut a.srv);
    b.client(parse("other", "select 1"));
    // Answered locally, and held until the client flushes, as PostgreSQL holds it.
    assert_eq!(b.client_out(), "", "held");
    b.client(msg(b'H', b""));
    assert_eq!(b.client_out(), "1", "answered locally");
    b.client(bind("other"));
    b.client(execute());
    b.client(sync());
    let sent = b.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "BES");
    assert!(text(&sent[0]).contains("pn_"));
    assert_eq!(reg.stats.server_parses.load(Ordering::Relaxed), 1);
    assert_eq!(reg.stats.hits.load(Ordering::Relaxed), 1);
}

#[test]
fn bind_on_a_new_server_injects_parse_and_hides_its_reply() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut a = H::new(PoolMode::Transaction, Some(reg.clone()));
    a.client(parse("s1", "select 1"));
    a.client(sync());
    a.server(msg(b'1', b""));
    a.server(rfq(b'I'));
    a.client_out();
    a.server_out();
    a.srv = ServerState::default(); // next checkout: a fresh server
    a.client(bind("s1"));
    a.client(execute());
    a.client(sync());
    assert_eq!(a.server_out().iter().map(|f| f[0] as char).collect::<String>(), "PBES");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        a.server(m);
    }
    assert_eq!(a.client_out(), "2CZ");
}

#[test]
fn duplicate_and_unknown_names_get_postgres_errors_without_disconnect() {
    let mut h = H::cached();
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    // Unlinked: answered locally, then skip to Sync.
    h.client(parse("s1", "select 2"));
    h.client(bind("s1"));
    h.client(sync());
    let out = h.s.to_client.split();
    assert_eq!(tags_of(&out), "EZ");
    assert!(text(&out).contains("42P05") && text(&out).contains("prepared statement \"s1\" already exists"));
    // Linked (inside a transaction): the server is made to fail so its state matches.
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    h.client_out();
    h.server_out();
    h.client(bind("nope"));
    h.client(sync());
    let sent = h.server_out();
    assert!(text(&sent[0]).contains("parsnip_probe"));
    h.server(msg(b'E', b"SERROR\0C26000\0Mprepared statement \"parsnip_probe\" does not exist\0\0"));
    h.server(rfq(b'E'));
    let out = h.s.to_client.split();
    assert_eq!(tags_of(&out), "EZ");
    assert!(text(&out).contains("prepared statement \"nope\" does not exist"));
    assert!(h.actions().iter().all(|a| *a != Action::Close));
}

#[test]
fn failed_parse_leaves_no_mapping() {
    let mut h = H::cached();
    h.client(parse("s1", "selec 1"));
    h.client(sync());
    h.server(err("42601"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ");
    assert_eq!(h.s.prepared_count(), 0);
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
    assert_eq!(h.s.prepared_count(), 1);
}

#[test]
fn skipped_messages_roll_back_their_effects() {
    let mut h = H::cached();
    // s1 is known and valid: a second client's Parse would be answered locally.
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    // An error before a locally answered Parse: that Parse never happened.
    h.client(parse("bad", "selec"));
    h.client(parse("s2", "select 1"));
    h.client(close_s("s1"));
    h.client(sync());
    h.server(err("42601"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ");
    assert_eq!(h.s.prepared_count(), 1, "s2 rolled back, s1's close rolled back");
    assert!(h.s.stmts.named.contains_key(&b"s1"[..]));
}

#[test]
fn close_is_local_and_in_order() {
    let mut h = H::cached();
    h.client(query("select 1"));
    h.client(close_s("whatever"));
    h.client(sync());
    // The Query's replies come first, then the local CloseComplete, then Sync's Z.
    h.server(msg(b'C', b"SELECT 1\0"));
    assert_eq!(h.client_out(), "C");
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "Z3");
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "Z");
}

#[test]
fn unnamed_parse_and_bind_across_syncs_and_servers() {
    let mut h = H::new(
        PoolMode::Transaction,
        Some(Arc::new(Registry::new(StmtConfig { promote_unnamed_after: 0, ..Default::default() }))),
    );
    h.client(parse("", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.server_out();
    h.srv = ServerState::default(); // another server
    h.client(bind(""));
    h.client(execute());
    h.client(sync());
    let sent = h.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBES", "unnamed Parse replayed");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ");
}

#[test]
fn repeated_unnamed_statements_are_promoted() {
    let reg = Arc::new(Registry::new(StmtConfig { promote_unnamed_after: 2, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let round = |h: &mut H| {
        h.client(parse("", "select 1"));
        h.client(bind(""));
        h.client(execute());
        h.client(sync());
        let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
        for f in sent.chars() {
            match f {
                'P' => h.server(msg(b'1', b"")),
                'B' => h.server(msg(b'2', b"")),
                'E' => h.server(msg(b'C', b"SELECT 1\0")),
                'S' => h.server(rfq(b'I')),
                _ => {}
            }
        }
        assert_eq!(h.client_out(), "12CZ");
        sent
    };
    assert_eq!(round(&mut h), "PBES");
    assert_eq!(round(&mut h), "PBES", "promoted: Parse of the named server statement");
    assert_eq!(round(&mut h), "BES", "no Parse at all any more");
    assert_eq!(reg.stats.promotions.load(Ordering::Relaxed), 1);
}

#[test]
fn sql_deallocate_all_is_answered_locally_and_clears_the_namespace() {
    let mut h = H::cached();
    h.client(parse("s1", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.client(query("DEALLOCATE ALL"));
    assert_eq!(h.client_out(), "CZ");
    assert_eq!(h.s.prepared_count(), 0);
    // Pipelined after it: Parse/Bind of the same name works.
    h.client(parse("s1", "select 1"));
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    assert_eq!(h.client_out(), "1", "statement known and valid: Parse answered locally");
}

#[test]
fn sql_prepare_execute_deallocate_across_checkouts() {
    let mut h = H::cached();
    h.client(query("PREPARE q (int) AS SELECT $1"));
    let sent = h.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBES");
    assert!(text(&sent[0]).contains("PREPARE pn_"));
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "CZ");
    h.srv = ServerState::default(); // another server
    h.client(query("EXECUTE q(5)"));
    let sent = h.server_out();
    // The PREPARE ends with a Sync of its own, so no implicit transaction of it is left
    // open when the Query runs.
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBESQ");
    assert!(text(&sent[4]).contains("EXECUTE pn_"));
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(b'I'), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "CZ");
    h.client(query("DEALLOCATE q"));
    assert_eq!(h.client_out(), "CZ");
    h.client(query("DEALLOCATE q"));
    let sent = h.server_out();
    assert!(text(&sent[0]).contains("parsnip_probe"));
}

#[test]
fn failed_prepare_ahead_of_execute_answers_it() {
    let mut h = H::cached();
    let client_text = "PREPARE q AS SELECT a FROM gone";
    h.client(query(client_text));
    h.server_out();
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "CZ");
    for in_tx in [false, true] {
        h.srv = ServerState::default(); // another server, which lacks the statement
        let status = if in_tx { b'T' } else { b'I' };
        h.s.tx.status = TxStatus::from_byte(status);
        h.client(query("EXECUTE q"));
        let sent = h.server_out();
        assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "PBESQ");
        // The table went away: the PREPARE fails when executed, and the EXECUTE after it
        // for want of the statement (or of a live transaction).
        let server_text = text(&sent[0]);
        let at = |t: &str| t.find("gone").expect("table name") - t.find("PREPARE").expect("PREPARE") + 1;
        let e = format!("SERROR\0C42P01\0Mrelation \"gone\" does not exist\0P{}\0\0", at(&server_text));
        let failed = if in_tx { b'E' } else { b'I' };
        let second = if in_tx { err("25P02") } else { err("26000") };
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b'E', e.as_bytes()), rfq(failed), second, rfq(failed)] {
            h.server(m);
        }
        let out = h.s.to_client.split();
        assert_eq!(tags_of(&out), "EZ", "in a transaction: {in_tx}");
        let reply = frames(&out);
        assert!(text(&reply[0]).contains("C42P01"), "{}", text(&reply[0]));
        assert!(text(&reply[0]).contains(&format!("P{}\0", at(client_text))), "{}", text(&reply[0]));
        assert_eq!(reply[1][5], failed);
        // Not prepared there: the next EXECUTE prepares it again.
        h.s.tx.status = TxStatus::from_byte(status);
        h.client(query("EXECUTE q"));
        assert_eq!(h.server_out().iter().map(|f| f[0] as char).collect::<String>(), "PBESQ");
        for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"PREPARE\0"), rfq(status), msg(b'C', b"SELECT 1\0")] {
            h.server(m);
        }
        h.server(rfq(status));
        assert_eq!(h.client_out(), "CZ");
    }
}

#[test]
fn server_cap_evicts_least_recently_used_with_close() {
    let reg = Arc::new(Registry::new(StmtConfig { server_cap: 2, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    for (i, q) in ["select 1", "select 2", "select 3"].iter().enumerate() {
        h.client(parse(&format!("s{i}"), q));
        h.client(sync());
        let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
        for c in sent.chars() {
            match c {
                'C' => h.server(msg(b'3', b"")),
                'P' => h.server(msg(b'1', b"")),
                'S' => h.server(rfq(b'I')),
                _ => {}
            }
        }
        assert_eq!(h.client_out(), "1Z");
        assert_eq!(sent, if i < 2 { "PS" } else { "CPS" });
    }
    assert_eq!(h.srv.stmts.len(), 2);
    assert_eq!(reg.stats.evictions.load(Ordering::Relaxed), 1);
}

#[test]
fn stale_plan_starts_a_new_generation() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    h.client(parse("s1", "select * from t"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), msg(b'T', b"\0\x01old"), rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    let old = h.server_out();
    // The client was told the old shape: PostgreSQL's 0A000 reaches it.
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    h.server_out();
    h.server(msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ");
    // The client re-prepares the same text under a new name: a fresh server statement.
    h.client(parse("s2", "select * from t"));
    h.client(sync());
    let sent = h.server_out();
    assert_eq!(sent[0][0], b'P');
    assert_ne!(text(&sent[0]), text(&old[0]), "new generation, new server name");
}

#[test]
fn stale_plan_is_retried_when_the_client_never_saw_the_old_shape() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    h.client(parse("s1", "select * from t"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.server_out();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    h.server_out();
    h.server(msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"));
    // Close of the stale statement, then the batch again on a new generation.
    let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
    assert_eq!(sent, "CPBES");
    h.server(rfq(b'I')); // the first Sync's answer: hidden
    for m in [msg(b'3', b""), msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ", "no error, one ReadyForQuery");
    assert_eq!(reg.stats.retries.load(Ordering::Relaxed), 1);
}

#[test]
fn a_released_server_is_never_used_for_the_next_frame() {
    let mut h = H::cached();
    h.client(parse("", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    h.server_out();
    // The driver still holds the server state when it feeds the next frame: the session
    // must ask for a server again rather than write to the one it gave back.
    assert_eq!(h.s.handle_client(&bind(""), Some(&mut h.srv)), Fed::NeedsServer);
    assert!(h.s.to_server.is_empty());
    assert_eq!(h.s.poll_action(), Some(Action::AcquireServer));
}

#[test]
fn error_before_the_client_sent_sync_skips_what_follows() {
    // P D H, error; then B E S: the server ignores B and E, answers only the Sync.
    let mut h = H::cached();
    h.client(parse("s1", "selec 1"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(msg(b'H', b""));
    h.server(err("42601"));
    assert_eq!(h.client_out(), "E");
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    assert_eq!(h.s.outstanding(), 1, "only the Sync expects a reply");
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "Z");
    assert_eq!(h.s.prepared_count(), 0);
}

#[test]
fn fresh_parse_with_a_different_row_shape_never_sends_rows() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let rowdesc3 = rowdesc(&["a", "b", "c"], 1);
    let rowdesc4 = rowdesc(&["a", "b", "c", "d"], 1);
    h.client(parse("s1", "select * from t"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), rowdesc3.clone(), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "1tTZ");
    h.server_out();
    // ALTER TABLE happened; the next checkout is a server without the statement.
    h.srv = ServerState::default();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    // Parse, a Describe to check the shape, and Flush: the client's Bind waits.
    assert_eq!(h.server_out().iter().map(|f| f[0] as char).collect::<String>(), "PDH");
    assert_eq!(h.pending.len(), 3, "Bind, Execute, Sync held");
    h.server(msg(b'1', b""));
    h.server(msg(b't', b"\0\0"));
    h.server(rowdesc4);
    // Shape differs: the stale statement is closed there, and the Bind fails with 0A000
    // (through a probe so the server skips to Sync as PostgreSQL would).
    let sent = h.server_out();
    assert_eq!(sent.iter().map(|f| f[0] as char).collect::<String>(), "CDES");
    assert!(text(&sent[1]).contains("parsnip_probe"));
    h.server(msg(b'3', b""));
    h.server(msg(b'E', b"SERROR\0C26000\0Mprepared statement \"parsnip_probe\" does not exist\0\0"));
    h.server(rfq(b'I'));
    let out = h.s.to_client.split();
    assert_eq!(tags_of(&out), "EZ");
    assert!(text(&out).contains("0A000") && text(&out).contains("cached plan must not change result type"));
    // Re-preparing the same text gets a new generation.
    h.client(parse("s2", "select * from t"));
    h.client(sync());
    let sent = h.server_out();
    assert!(!text(&sent[0]).contains("pn_1\0"), "{}", text(&sent[0]));
}

#[test]
fn same_shape_on_a_fresh_server_goes_on() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg));
    // The same columns, from a table re-created since (another table OID).
    let (before, after) = (rowdesc(&["one"], 1), rowdesc(&["one"], 2));
    h.client(parse("s1", "select 1"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), before, rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    h.server_out();
    h.srv = ServerState::default();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    h.server_out();
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), after] {
        h.server(m);
    }
    assert_eq!(h.server_out().iter().map(|f| f[0] as char).collect::<String>(), "BES");
    for m in [msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ");
}

/// A shape check asks the server to flush (issue 23 item 6): the replies that flush
/// brings for the client's own requests, which PostgreSQL would have kept until the
/// client's Sync, are held until that Sync; an error is not (PostgreSQL flushes errors).
#[test]
fn replies_flushed_for_the_pooler_wait_for_the_clients_sync() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg));
    h.client(parse("s1", "select 1"));
    h.client(msg(b'D', b"Ss1\0"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b't', b"\0\0"), rowdesc(&["one"], 1), rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    h.server_out();
    // Another server: the client's own Parse goes first, then s1 is injected and checked.
    h.srv = ServerState::default();
    h.client(parse("s2", "select 2"));
    h.client(bind("s1"));
    h.client(execute());
    assert_eq!(h.server_out().iter().map(|f| f[0] as char).collect::<String>(), "PPDH");
    for m in [msg(b'1', b""), msg(b'1', b""), msg(b't', b"\0\0"), rowdesc(&["one"], 1)] {
        h.server(m);
    }
    assert_eq!(h.server_out().iter().map(|f| f[0] as char).collect::<String>(), "BE");
    assert_eq!(h.client_out(), "", "the client's ParseComplete came only because of the pooler's Flush");
    h.client(sync());
    for m in [msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "12CZ");
    // An error goes at once, with what was held before it.
    h.srv = ServerState::default();
    h.client(parse("s3", "select 3"));
    h.client(bind("s1"));
    h.client(execute());
    h.server_out();
    for m in [msg(b'1', b""), msg(b'1', b""), msg(b't', b"\0\0"), rowdesc(&["one"], 1)] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "");
    h.server(err("22012"));
    assert_eq!(h.client_out(), "1E");
}

#[test]
fn a_batch_ended_by_flush_keeps_the_server() {
    // pg-cursor: Bind/Execute(max rows)/Flush outside a transaction; the portal lives in
    // the implicit transaction until Sync, so the server must stay linked.
    let mut h = H::cached();
    h.client(parse("s", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.actions();
    h.client(msg(b'B', b"c\0s\0\0\0\0\0\0\0"));
    h.client(msg(b'E', b"c\0\0\0\0\x02"));
    h.client(msg(b'H', b""));
    for m in [msg(b'2', b""), msg(b'D', b"\0\0"), msg(b's', b"")] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer], "not released before Sync");
    h.client(msg(b'E', b"c\0\0\0\0\x02"));
    h.client(sync());
    for m in [msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::ReleaseServer { reusable: true }]);
}

#[test]
fn a_batch_behind_a_failing_parse_waits_for_its_outcome() {
    let mut h = H::cached();
    h.client(parse("s", "selec"));
    h.client(sync());
    h.client(parse("s", "select 1"));
    h.client(sync());
    assert_eq!(h.pending.len(), 2, "second Parse waits: does \"s\" exist?");
    h.server(err("42601"));
    h.server(rfq(b'I'));
    // Now it is known that "s" does not exist: the second Parse goes through.
    assert!(h.pending.is_empty());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "EZ1Z");
}
#[test]
fn a_batch_behind_a_skipped_injected_parse_waits_for_its_outcome() {
    let reg = Arc::new(Registry::new(StmtConfig { server_cap: 1, ..Default::default() }));
    let mut h = H::new(PoolMode::Transaction, Some(reg));
    h.client(parse("a", "select 'a'"));
    h.client(parse("b", "select 'b'"));
    h.client(sync());
    for m in [msg(b'1', b""), msg(b'1', b""), rfq(b'I')] {
        h.server(m);
    }
    h.client_out();
    h.server_out();
    for m in
        [bind("a"), execute(), bind("unknown"), execute(), bind("b"), execute(), sync(), bind("b"), execute(), sync()]
    {
        h.client(m);
    }
    assert_eq!(h.pending.len(), 3, "the second batch waits: is b prepared there or was its Parse skipped?");
    let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
    assert_eq!(sent, "CCPBEDEPBES");
    for m in [msg(b'3', b""), msg(b'3', b""), msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0")] {
        h.server(m);
    }
    h.server(msg(b'E', b"SERROR\0C26000\0Mprepared statement \"parsnip_probe\" does not exist\0\0"));
    h.server(rfq(b'I'));
    // b's Parse was skipped: the held batch now prepares it again.
    let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
    assert_eq!(sent, "PBES");
}

#[test]
fn a_local_parse_waits_for_an_earlier_batch_that_may_abort_the_transaction() {
    let mut h = H::cached();
    h.client(parse("s", "select 1"));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    // In a transaction: a failing batch, then a Parse of a known statement.
    h.client(query("begin"));
    h.client(parse("bad", "selec"));
    h.client(sync());
    h.client(parse("t", "select 1"));
    h.client(sync());
    assert_eq!(h.pending.len(), 2, "the Parse waits for the earlier batches");
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T'), err("42601"), rfq(b'E')] {
        h.server(m);
    }
    // The transaction is aborted: the Parse goes to the server, which answers 25P02.
    let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
    assert!(sent.ends_with("PS"), "{sent}");
    assert!(h.pending.is_empty());
}

// ---- property test: random clients against a model server ----

/// A tiny model of a PostgreSQL backend: answers each frame the session sends the way
/// PostgreSQL would, including skip-to-Sync after an error and named/unnamed statements.
#[derive(Default)]
struct ModelServer {
    stmts: std::collections::HashSet<Vec<u8>>,
    unnamed: bool,
    skipping: bool,
}

impl ModelServer {
    fn answer(&mut self, f: &[u8]) -> Vec<Vec<u8>> {
        let b = &f[5..];
        let name = |b: &[u8]| b.split(|&c| c == 0).next().unwrap_or_default().to_vec();
        if self.skipping && f[0] != b'S' {
            return vec![];
        }
        let fail = |s: &mut Self| {
            s.skipping = true;
            vec![err("42000")]
        };
        match f[0] {
            b'P' => {
                let n = name(b);
                let q = b.split(|&c| c == 0).nth(1).unwrap_or_default();
                if q.starts_with(b"bad") {
                    if n.is_empty() {
                        self.unnamed = false;
                    }
                    return fail(self);
                }
                if n.is_empty() {
                    self.unnamed = true;
                } else if !self.stmts.insert(n) {
                    return fail(self);
                }
                vec![msg(b'1', b"")]
            }
            b'B' => {
                let stmt = b.split(|&c| c == 0).nth(1).unwrap_or_default().to_vec();
                let ok = if stmt.is_empty() { self.unnamed } else { self.stmts.contains(&stmt) };
                if ok { vec![msg(b'2', b"")] } else { fail(self) }
            }
            b'D' => {
                let n = name(&b[1..]);
                let ok = b[0] == b'P' || if n.is_empty() { self.unnamed } else { self.stmts.contains(&n) };
                if !ok {
                    return fail(self);
                }
                if b[0] == b'S' { vec![msg(b't', b"\0\0"), msg(b'n', b"")] } else { vec![msg(b'n', b"")] }
            }
            b'E' => vec![msg(b'C', b"SELECT 1\0")],
            b'C' => {
                if b[0] == b'S' {
                    let n = name(&b[1..]);
                    if n.is_empty() {
                        self.unnamed = false;
                    } else {
                        self.stmts.remove(&n);
                    }
                }
                vec![msg(b'3', b"")]
            }
            b'S' => {
                self.skipping = false;
                vec![rfq(b'I')]
            }
            b'Q' => {
                self.unnamed = false;
                vec![msg(b'C', b"SELECT 1\0"), rfq(b'I')]
            }
            _ => vec![],
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
    /// Whatever a client sends, with a server that answers as PostgreSQL does, the reply
    /// queue never desyncs: the client sees the same reply types as it would talking to
    /// that server directly (statements renamed, injected, evicted, answered locally),
    /// no protocol error or close, and nothing stays outstanding.
    #[test]
    fn reply_queue_never_desyncs(ops in proptest::collection::vec((0u8..10, 0u8..3, proptest::bool::ANY), 1..40), cap in 1usize..4) {
        let reg = Arc::new(Registry::new(StmtConfig { server_cap: cap, promote_unnamed_after: 2, ..Default::default() }));
        let mut h = H::new(PoolMode::Transaction, Some(reg));
        let mut server = ModelServer::default();
        // The same client frames sent straight to the model give the expected transcript.
        let mut direct = ModelServer::default();
        let mut expected = String::new();
        let names = ["", "a", "b"];
        let mut frames: Vec<Vec<u8>> = ops
            .into_iter()
            .map(|(op, n, bad)| {
                let name = names[n as usize];
                match op {
                    0 | 1 => parse(name, if bad { "bad" } else if n == 2 { "select 2" } else { "select 1" }),
                    2 | 3 => bind(name),
                    4 => execute(),
                    5 => msg(b'D', format!("S{name}\0").as_bytes()),
                    6 => close_s(name),
                    7 => msg(b'H', b""),
                    8 => query("select 1"),
                    _ => sync(),
                }
            })
            .collect();
        frames.push(sync());
        for frame in frames {
            for r in direct.answer(&frame) {
                expected.push(r[0] as char);
            }
            h.client(frame);
            // The server answers everything sent so far.
            for _ in 0..8 {
                let sent = h.server_out();
                if sent.is_empty() { break; }
                for f in sent {
                    for r in server.answer(&f) {
                        h.server(r);
                    }
                }
            }
        }
        let out = h.s.to_client.split();
        proptest::prop_assert!(!h.actions().contains(&Action::Close), "closed: {}", tags_of(&out));
        proptest::prop_assert!(!out.windows(5).any(|w| w == b"08P01"), "protocol error: {}", tags_of(&out));
        proptest::prop_assert_eq!(tags_of(&out), expected);
        proptest::prop_assert_eq!(h.s.outstanding(), 0);
        proptest::prop_assert!(h.pending.is_empty());
    }
}

// ---- Pipelining (`pipeline`): which batches may have others queued behind them ----

/// A session with statement `s1` (`sql`) prepared on its server and idle.
fn with_prepared(sql: &str) -> H {
    prepared_in(H::cached(), sql)
}

fn prepared_in(mut h: H, sql: &str) -> H {
    h.client(parse("s1", sql));
    h.client(sync());
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    h.client_out();
    h.server_out();
    h.actions();
    h
}

#[test]
fn autocommit_batch_of_a_prepared_statement_is_pipelinable_once_timed_fast() {
    let mut h = with_prepared("select 1");
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert_eq!(h.server_out().len(), 3, "Bind, Execute, Sync sent");
    let p = h.s.pipelinable(2000).expect("a plain autocommit batch");
    assert!(matches!(p.timed, Timed::Stmt(_)));
    assert!(!p.fast, "never timed: nothing may queue behind it yet");
    p.timed.note(150);
    assert!(h.s.pipelinable(2000).expect("still").fast);
    assert!(!h.s.pipelinable(100).expect("still").fast, "over the limit");
    // One slow run counts at once.
    p.timed.note(50_000);
    assert!(!h.s.pipelinable(2000).expect("still").fast);
    for m in [msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.actions(), vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }]);
    assert!(h.s.pipelinable(2000).is_none(), "released: nothing in flight");
}

#[test]
fn batches_that_change_the_server_are_not_pipelinable() {
    // A Parse the server must run.
    let mut h = H::cached();
    for m in [parse("s1", "select 1"), bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "Parse in the batch");

    // A statement that is not plain DML.
    let mut h = with_prepared("begin");
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "BEGIN");

    // No Sync yet (Flush): the server is not idle after it.
    let mut h = with_prepared("select 1");
    for m in [bind("s1"), execute(), msg(b'H', b"")] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "Flush without Sync");

    // Inside a transaction block.
    let mut h = with_prepared("select 1");
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    assert!(h.s.pipelinable(u32::MAX).is_none(), "in a transaction");

    // Simple Queries that are not one plain read.
    for sql in ["update t set a = 1", "select 1; select 2", "select * from t for update", "begin"] {
        let mut h = with_prepared("select 1");
        h.client(query(sql));
        h.server_out();
        assert!(h.s.pipelinable(u32::MAX).is_none(), "{sql}");
    }
}

#[test]
fn a_simple_query_of_one_plain_read_is_pipelinable_once_reads_are_timed_fast() {
    let mut h = H::cached();
    h.client(query("select abalance from pgbench_accounts where aid = 1"));
    assert!(h.s.pipelinable(2000).is_none(), "not written out yet");
    h.server_out();
    let p = h.s.pipelinable(2000).expect("one plain read");
    assert!(matches!(p.timed, Timed::SimpleReads(_)));
    assert!(!p.fast, "never timed");
    p.timed.note(300);
    assert!(h.s.pipelinable(2000).expect("still").fast, "the pool's simple reads are fast now");
    // Inside a transaction block it is not.
    let mut h = H::cached();
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    h.client(query("select 1"));
    h.server_out();
    assert!(h.s.pipelinable(u32::MAX).is_none(), "in a transaction");
}

#[test]
fn a_lent_session_retries_a_stale_plan_on_its_next_server_and_writes_nothing_here() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = prepared_in(H::new(PoolMode::Transaction, Some(reg.clone())), "select * from t");
    for m in [bind("s1"), execute(), sync()] {
        h.client(m);
    }
    h.server_out();
    assert_eq!(h.actions(), vec![Action::AcquireServer]);
    assert!(h.s.pipelinable(u32::MAX).is_some());
    h.s.set_lent();
    h.server(msg(b'E', b"SERROR\0C0A000\0Mcached plan must not change result type\0\0"));
    assert!(h.server_out().is_empty(), "another client's batch is behind: nothing written here");
    h.server(rfq(b'I')); // hidden: the batch is retried
    assert_eq!(h.client_out(), "", "the error and its ReadyForQuery are hidden");
    // Released, then linked again for the replay, which prepares the new generation.
    assert_eq!(
        h.actions(),
        vec![Action::ReleaseServer { reusable: true }, Action::AcquireServer],
        "the replay goes to the next server the client gets"
    );
    let sent: String = h.server_out().iter().map(|f| f[0] as char).collect();
    assert_eq!(sent, "PBES");
    for m in [msg(b'1', b""), msg(b'2', b""), msg(b'C', b"SELECT 1\0"), rfq(b'I')] {
        h.server(m);
    }
    assert_eq!(h.client_out(), "2CZ", "no error, one ReadyForQuery");
    assert_eq!(reg.stats.retries.load(Ordering::Relaxed), 1);
}

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
    h.s.settings = Arc::new(client);
    h.srv.settings.set_reported("application_name", "");
    h.client(query("select 1"));
    assert_eq!(h.server_out().len(), 2, "settings replay, then the client's query");
    assert!(!h.s.stream_server_frame(&header(b'D')), "the settings' reply is the pooler's");
}

#[test]
fn timeouts_are_decided_by_the_session_from_the_time_the_driver_reports() {
    use std::time::{Duration, Instant};
    let t = Timeouts { client_idle: Some(Duration::from_secs(10)), idle_in_transaction: Some(Duration::from_secs(3)) };
    let t0 = Instant::now();
    // Idle without a server: the idle-session timeout applies, not before it is due.
    let mut h = H::new(PoolMode::Transaction, None);
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(10)));
    assert_eq!(h.s.poll_timeout(&t, t0, true), None, "unread client bytes: not idle");
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(9));
    assert!(!h.s.is_closing() && h.s.to_client.is_empty());
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(10));
    assert!(h.s.is_closing());
    assert!(text(&h.s.to_client).contains("C57P05"), "{}", text(&h.s.to_client));
    // Idle inside a transaction: the idle-in-transaction timeout applies.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("BEGIN"));
    for m in [msg(b'C', b"BEGIN\0"), rfq(b'T')] {
        h.server(m);
    }
    h.client_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), None, "BEGIN not written to the server yet");
    h.server_out();
    assert_eq!(h.s.poll_timeout(&t, t0, false), Some(t0 + Duration::from_secs(3)));
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(2));
    assert!(!h.s.is_closing());
    h.s.handle_timeout(&t, t0, false, t0 + Duration::from_secs(3));
    assert!(text(&h.s.to_client).contains("C25P03"), "{}", text(&h.s.to_client));
    let actions: Vec<_> = std::iter::from_fn(|| h.s.poll_action()).collect();
    // The server stays linked: closing rolls its transaction back and gives it back
    // (`settle`), instead of throwing the connection away.
    assert_eq!(actions, vec![Action::Close]);
    assert!(h.s.is_linked());
    // A request in flight: no timeout applies.
    let mut h = H::new(PoolMode::Transaction, None);
    h.client(query("SELECT pg_sleep(60)"));
    assert_eq!(h.s.poll_timeout(&t, t0, false), None);
}

#[test]
fn tally_counts_errors_by_class() {
    let mut t = super::Tally::default();
    assert!(!t.has_errors());
    for c in [&b"22012"[..], b"42P01", b"22003", b"23505", b"40001", b""] {
        t.error(c);
    }
    let v: Vec<_> = t.errors().collect();
    // Three classes apart; a fourth and fifth class, rare in one tally, count under the last.
    assert_eq!(v, vec![(*b"22", 2), (*b"42", 1), (*b"23", 3)]);
}

#[test]
fn a_plain_autocommit_read_asks_for_a_standby_and_anything_else_waits_for_the_primary() {
    // Without a split in the pool, no batch is looked at.
    let mut h = H::cached();
    h.client(query("select abalance from pgbench_accounts where aid = 1"));
    assert!(!h.s.wants_reads(), "no read/write split");
    let mut h = H::cached();
    h.reads = true;
    h.s.set_read_split(true);
    h.client(query("select abalance from pgbench_accounts where aid = 1"));
    assert!(h.s.wants_reads(), "one plain read outside a transaction");
    // Sent before the read's replies: another read goes to the same standby, a write waits.
    h.client(query("select 2"));
    h.client(query("update pgbench_accounts set abalance = 0"));
    assert_eq!(h.server_out().len(), 2, "the two reads are written, the update is held");
    for _ in 0..2 {
        h.server(msg(b'C', b"SELECT 1\0"));
        h.server(rfq(b'I'));
    }
    // Given back, then the update asks for a server of its own: the primary.
    assert_eq!(
        h.actions(),
        vec![Action::AcquireServer, Action::ReleaseServer { reusable: true }, Action::AcquireServer]
    );
    assert!(!h.s.wants_reads());
    assert_eq!(h.server_out().len(), 1, "the update, on its new server");
    // Not reads: locking clauses, several statements, set_config, transactions, writes.
    for sql in [
        "select * from t for update",
        "select 1; select 2",
        "select set_config('a.b', '1', false)",
        "insert into t values (1)",
        "begin",
    ] {
        let mut h = H::cached();
        h.s.set_read_split(true);
        h.client(query(sql));
        assert!(!h.s.wants_reads(), "{sql}");
    }
    let mut h = H::cached();
    h.client(query("begin"));
    h.server(msg(b'C', b"BEGIN\0"));
    h.server(rfq(b'T'));
    assert!(!h.s.is_read_batch(&query("select 1")), "inside a transaction block");
    let h = H::new(PoolMode::Session, None);
    assert!(!h.s.is_read_batch(&query("select 1")), "session mode");
}

#[test]
fn an_idle_session_is_parked_and_comes_back_whole() {
    let reg = Arc::new(Registry::new(StmtConfig::default()));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    // Logged in, nothing sent: at rest.
    h.pump();
    assert_eq!(h.parks, 1);
    h.client(parse("s1", "select 1"));
    h.client(sync());
    assert_eq!(h.parks, 1, "not parked while a request is in flight");
    h.server_out();
    h.server(msg(b'1', b""));
    h.server(rfq(b'I'));
    assert_eq!(h.client_out(), "1Z");
    assert_eq!(h.parks, 2, "parked once idle, with a statement");
    // In a transaction block: never parked.
    // One statement sent, completed by `tag`, ending with status `status`, written out.
    let round_trip = |h: &mut H, sql: &str, tag: &[u8], status: u8| {
        h.client(query(sql));
        h.server_out();
        h.server(msg(b'C', tag));
        h.server(rfq(status));
        assert_eq!(h.client_out(), "CZ");
    };
    round_trip(&mut h, "begin", b"BEGIN\0", b'T');
    assert_eq!(h.parks, 2);
    assert!(h.s.park().is_none(), "a session in a transaction is not at rest");
    round_trip(&mut h, "commit", b"COMMIT\0", b'I');
    assert_eq!(h.parks, 3);
    // The statement came through the swaps: its Bind on a fresh server re-parses it.
    h.srv = ServerState::default();
    h.client(bind("s1"));
    h.client(execute());
    h.client(sync());
    assert_eq!(h.server_out().iter().map(|f| f[0] as char).collect::<String>(), "PBES");
    assert_eq!(h.s.prepared_count(), 1);
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

/// The plan guard in the session: a promoted unnamed statement whose cached executions are
/// slow (a bad generic plan) is sampled as sent, demoted, and then runs as the client sent
/// it; its executions are counted for the cached statement, by kind.
#[test]
fn the_plan_guard_demotes_a_slow_promoted_statement() {
    let cfg = StmtConfig {
        promote_unnamed_after: 2,
        guard: crate::stmt::guard::GuardConfig { sample_one_in: 64, ratio: 1.5 },
        ..Default::default()
    };
    let reg = Arc::new(Registry::new(cfg));
    let mut h = H::new(PoolMode::Transaction, Some(reg.clone()));
    let mut clock = 1_000u64;
    // (ran as sent, demoted after it)
    let mut round = |h: &mut H| {
        h.s.set_clock(clock);
        h.client(parse("", "select 1 where $1"));
        h.client(bind(""));
        h.client(execute());
        h.client(sync());
        let out = h.server_out();
        // As sent: the client's own unnamed Parse (its name is empty).
        let as_sent = out.iter().any(|f| f[0] == b'P' && f.get(5) == Some(&0));
        let cached = out.iter().any(|f| f[0] == b'B' && f.get(6) != Some(&0));
        clock += if as_sent || !cached { 100 } else { 5_000 };
        h.s.set_clock(clock);
        for f in out {
            match f[0] {
                b'P' => h.server(msg(b'1', b"")),
                b'B' => h.server(msg(b'2', b"")),
                b'E' => h.server(msg(b'C', b"SELECT 1\0")),
                b'S' => h.server(rfq(b'I')),
                _ => {}
            }
        }
        assert_eq!(h.client_out(), "12CZ");
        (as_sent, cached)
    };
    let mut demoted_at = None;
    let mut runs = vec![];
    for i in 0..120 {
        let r = round(&mut h);
        runs.push(r);
        if demoted_at.is_none() && reg.stats.demotions.load(Ordering::Relaxed) == 1 {
            demoted_at = Some(i);
        }
    }
    let at = demoted_at.unwrap_or_else(|| panic!("never demoted: {runs:?}"));
    assert!(at < 60, "demoted at round {at}");
    assert!(runs[at + 1..].iter().all(|&(as_sent, _)| as_sent), "demoted: every execution runs as sent");
    assert!(runs[..at].iter().any(|&(_, cached)| cached), "it ran from the cache before");
    let stmts = reg.statements();
    let f = stmts[0].exec.figures();
    assert!(f.cached > 0 && f.as_sent > 60, "{f:?}");
    assert_eq!(f.rows, f.cached + f.as_sent, "one row per execution");
    assert!((4_375..=5_625).contains(&f.p99_us), "the cached executions' time, within 12.5 %: {f:?}");
}
