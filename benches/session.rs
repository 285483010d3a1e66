//! The session's per-transaction path with no IO: one cached prepared statement's
//! transaction (Bind, Execute, Sync in; BindComplete, DataRow, CommandComplete,
//! ReadyForQuery back), in transaction mode, the server linked and given back each time.
//! `cargo bench --bench session`.

mod support;

use bytes::BytesMut;
use parsnip::config::PoolMode;
use parsnip::protocol::{backend, frontend, split_frame};
use parsnip::session::{Action, Fed, Session};
use parsnip::state::{ServerState, Settings};
use parsnip::stmt::{Registry, StmtConfig};
use std::sync::Arc;

/// Plays the driver: feeds client frames (linking the server when asked) and server frames.
struct Driver {
    s: Session,
    srv: ServerState,
    linked: bool,
}

impl Driver {
    fn actions(&mut self) {
        while let Some(a) = self.s.poll_action() {
            match a {
                Action::AcquireServer => {
                    self.s.handle_server_linked(&mut self.srv);
                    self.linked = true;
                }
                Action::ReleaseServer { .. } => self.linked = false,
                Action::Subscribe | Action::RetireServers => {}
                Action::Close => panic!("the session closed"),
            }
        }
    }

    fn client(&mut self, mut bytes: &[u8]) {
        while let Ok(Some(n)) = split_frame(bytes, usize::MAX) {
            loop {
                let srv = if self.linked { Some(&mut self.srv) } else { None };
                let fed = self.s.handle_client(&bytes[..n], srv);
                self.actions();
                if fed == Fed::Consumed {
                    break;
                }
            }
            bytes = &bytes[n..];
        }
    }

    fn server(&mut self, mut bytes: &[u8]) {
        while let Ok(Some(n)) = split_frame(bytes, usize::MAX) {
            self.s.handle_server(&bytes[..n], &mut self.srv);
            self.actions();
            bytes = &bytes[n..];
        }
    }
}

fn main() {
    let registry = Arc::new(Registry::new(StmtConfig::default()));
    let mut d = Driver {
        s: Session::new(PoolMode::Transaction, Arc::new(Settings::default()), 1, Some(registry)),
        srv: ServerState::default(),
        linked: false,
    };
    // The client prepares its statement once; the server parses it once.
    let mut prepare = BytesMut::new();
    frontend::parse(&mut prepare, b"s1", b"SELECT abalance FROM pgbench_accounts WHERE aid = $1", &[0, 0, 0, 23]);
    frontend::sync(&mut prepare);
    d.client(&prepare);
    let mut parsed = BytesMut::new();
    backend::empty(&mut parsed, b'1');
    backend::ready_for_query(&mut parsed, b'I');
    d.server(&parsed);

    let mut tx = BytesMut::new();
    let mut tail = Vec::new();
    tail.extend_from_slice(&0i16.to_be_bytes());
    tail.extend_from_slice(&1i16.to_be_bytes());
    tail.extend_from_slice(&5i32.to_be_bytes());
    tail.extend_from_slice(b"12345");
    tail.extend_from_slice(&0i16.to_be_bytes());
    frontend::bind_with_tail(&mut tx, b"", b"s1", &tail);
    frontend::execute(&mut tx, b"");
    frontend::sync(&mut tx);
    let mut reply = BytesMut::new();
    backend::empty(&mut reply, b'2');
    backend::data_row_text(&mut reply, &[Some("4242")]);
    backend::command_complete(&mut reply, "SELECT 1");
    backend::ready_for_query(&mut reply, b'I');

    support::bench("prepared-statement transaction through the session", 200_000, || {
        d.client(&tx);
        d.s.to_server.clear();
        d.server(&reply);
        d.s.to_client.clear();
    });
    assert!(!d.linked, "the server goes back after each transaction");
}
