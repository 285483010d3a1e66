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

mod autoprepare;
mod batches;
mod begin;
mod fastbind;
mod link;
mod model;
mod notify;
mod pins;
mod pipeline;
mod plan_guard;
mod routing_and_parking;
mod statements;
mod streaming;
mod timeouts_and_counts;

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
    /// As a driver that links shared connections with another client's batch in flight
    /// first (`set_behind`).
    behind: bool,
    /// Subscription changes taken at `Action::Subscribe`, in order.
    subscribed: Vec<crate::stmt::sql::listen::ListenCmd>,
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
            behind: false,
            subscribed: vec![],
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
    /// Frames the client sent together, read by the driver in one read.
    fn client_batch(&mut self, frames: Vec<Vec<u8>>) {
        self.pending.extend(frames);
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
                        if self.behind {
                            self.s.set_behind();
                        }
                        self.linked = true;
                    }
                    Action::ReleaseServer { .. } => self.linked = false,
                    Action::Subscribe => self.subscribed.extend(self.s.take_subscriptions()),
                    Action::RetireServers => {}
                    Action::Close => {}
                }
            }
            // As the driver: a session lent for pipelining is fed nothing until released.
            while !(self.pending.is_empty() || self.linked && self.s.is_lent()) {
                if self.pending[0][0] == crate::protocol::tags::PARSE {
                    // As the driver: whether the frames read after a Parse end its batch.
                    let ahead: Vec<u8> = self.pending[1..].concat();
                    self.s.note_synced_ahead(frontend::syncs_before_flush(&ahead));
                }
                let srv = if self.linked { Some(&mut self.srv) } else { None };
                if self.s.handle_client(&self.pending[0], srv) != Fed::Consumed {
                    break;
                }
                self.pending.remove(0);
                progress = true;
            }
            if !progress && self.s.busy.actions.is_empty() {
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
        let mut old = match blank {
            Some(mut b) => {
                b.unpark(p);
                std::mem::replace(&mut self.s, b)
            }
            None => std::mem::replace(&mut self.s, Session::unparked(p)),
        };
        // Lift templates stay with a busy half, whoever it serves next (`Busy::lifts`); here
        // they follow the conversation, so that tests counting direct binds count them all
        // (`autoprepare::a_template_serves_the_next_client_of_its_busy_half` swaps them).
        self.s.busy.lifts = old.busy.lifts.take();
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
    /// The client opens a transaction block and the server says so (the server's copy of
    /// the BEGIN is left in `to_server`).
    fn begin(&mut self) {
        self.client(query("BEGIN"));
        self.server(msg(b'C', b"BEGIN\0"));
        self.server(rfq(b'T'));
    }
    fn server_out(&mut self) -> Vec<Vec<u8>> {
        frames(&self.s.to_server.split())
    }
    /// The tags of what the session wrote to the server since last asked, in order.
    fn server_tags(&mut self) -> String {
        self.server_out().iter().map(|f| f[0] as char).collect()
    }
    fn actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.log)
    }
}

/// Idle timeouts of 10 s outside a transaction and 3 s inside one, nothing else.
fn idle_timeouts() -> Timeouts {
    use std::time::Duration;
    Timeouts {
        client_idle: Some(Duration::from_secs(10)),
        idle_in_transaction: Some(Duration::from_secs(3)),
        pinned: None,
        query: None,
        transaction: None,
    }
}

fn text(f: &[u8]) -> String {
    String::from_utf8_lossy(f).into_owned()
}

/// The Query text of the frame being handled is read once and kept only for that frame
/// (`query_text_of`, `query_marks`): any other frame's or text's is read anew, and nothing
/// is kept after the frame.
#[test]
fn a_frame_query_text_is_kept_for_that_frame_only() {
    let mut s = Session::new(PoolMode::Transaction, Arc::default(), 1, None);
    let (a, b) = (query("select 1 for update"), query("listen x"));
    let a_text = frontend::query_text(crate::protocol::body(&a)).expect("text");
    s.busy.frame_marks.frame = Some((a.as_ptr() as usize, a.len()));
    s.busy.frame_marks.text = Some((a_text.as_ptr() as usize, a_text.len()));
    assert_eq!(s.query_text_of(&a), Some(&b"select 1 for update"[..]));
    assert_eq!(s.query_text_of(&b), Some(&b"listen x"[..]), "another frame");
    assert!(s.query_marks(a_text).has(crate::stmt::sql::Marks::LOCKING));
    assert!(s.busy.frame_marks.marks.is_some(), "kept for the frame's text");
    let b_text = frontend::query_text(crate::protocol::body(&b)).expect("text");
    assert!(s.query_marks(b_text).has(crate::stmt::sql::Marks::KEYWORD), "another text: its own");
    // Handled: nothing is kept.
    s.on_client_frame(&b, None);
    assert!(s.busy.frame_marks.frame.is_none() && s.busy.frame_marks.marks.is_none());
}
