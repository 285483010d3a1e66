//! Frame decoding: splitting a buffer of realistic client and server traffic into frames,
//! and reading the fields the pooler inspects. `cargo bench --bench frames`.

mod support;

use bytes::BytesMut;
use parsnip::protocol::{backend, body, frontend, split_frame};
use std::hint::black_box;

/// A client's extended-protocol transaction: Bind (one text parameter), Execute, Sync.
fn client_batch(buf: &mut BytesMut) {
    let mut tail = Vec::new();
    tail.extend_from_slice(&0i16.to_be_bytes()); // parameter formats
    tail.extend_from_slice(&1i16.to_be_bytes()); // one parameter
    tail.extend_from_slice(&5i32.to_be_bytes());
    tail.extend_from_slice(b"12345");
    tail.extend_from_slice(&0i16.to_be_bytes()); // result formats
    frontend::bind_with_tail(buf, b"", b"pn_1", &tail);
    frontend::execute(buf, b"");
    frontend::sync(buf);
}

/// A server's answer: BindComplete, 10 DataRows of 4 columns, CommandComplete, ReadyForQuery.
fn server_reply(buf: &mut BytesMut) {
    backend::empty(buf, b'2');
    for _ in 0..10 {
        backend::data_row_text(buf, &[Some("42"), Some("a value of some length"), None, Some("2026-11-24")]);
    }
    backend::command_complete(buf, "SELECT 10");
    backend::ready_for_query(buf, b'I');
}

fn count_frames(mut buf: &[u8]) -> usize {
    let mut n = 0;
    while let Ok(Some(len)) = split_frame(buf, 1 << 30) {
        n += 1;
        buf = &buf[len..];
    }
    n
}

fn main() {
    let mut client = BytesMut::new();
    for _ in 0..100 {
        client_batch(&mut client);
    }
    let mut server = BytesMut::new();
    for _ in 0..100 {
        server_reply(&mut server);
    }
    support::bench("split 100 client batches (300 frames)", 2_000, || {
        black_box(count_frames(black_box(&client)));
    });
    support::bench("split 100 server replies (1300 frames)", 2_000, || {
        black_box(count_frames(black_box(&server)));
    });
    let mut parse = BytesMut::new();
    frontend::parse(&mut parse, b"s1", b"SELECT abalance FROM pgbench_accounts WHERE aid = $1", &[0, 0, 0, 23]);
    support::bench("read a Parse's fields", 1_000_000, || {
        black_box(frontend::parse_fields(body(black_box(&parse))));
    });
    let mut bind = BytesMut::new();
    client_batch(&mut bind);
    support::bench("read a Bind's names", 1_000_000, || {
        black_box(frontend::bind_names(body(black_box(&bind))));
    });
    let mut q = BytesMut::new();
    frontend::query(&mut q, "SELECT abalance FROM pgbench_accounts WHERE aid = 42");
    support::bench("read a Query's text", 1_000_000, || {
        black_box(frontend::query_text(body(black_box(&q))));
    });
}
