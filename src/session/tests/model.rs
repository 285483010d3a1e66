//! Property test: random clients against a model server.

use super::*;

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
    fn reply_queue_never_desyncs(
        ops in proptest::collection::vec((0u8..10, 0u8..3, proptest::bool::ANY), 1..40),
        cap in 1usize..4,
    ) {
        let stmt_config = StmtConfig { server_cap: cap, promote_unnamed_after: 2, ..Default::default() };
        let reg = Arc::new(Registry::new(stmt_config));
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
