//! Result shapes: what a client was told a statement returns, checked against what a
//! server describes now (a schema change under a cached statement), and the 0A000
//! PostgreSQL gives when they differ.

use super::Unnamed;
use crate::protocol::tags;
use crate::session::reply_queue::Fx;
use crate::session::{Phase, Session};
use crate::state::ServerState;
use crate::stmt::Statement;
use std::sync::Arc;

/// Whether two RowDescription (or NoData) frames describe the same rows for a client:
/// column names, types and type modifiers. The table OID and column number are not
/// compared (a table dropped and re-created the same way has other OIDs).
pub(in crate::session) fn same_shape(a: &[u8], b: &[u8]) -> bool {
    fn columns(f: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
        if f.first() != Some(&tags::ROW_DESCRIPTION) {
            return Some(Vec::new());
        }
        let body = f.get(5..)?;
        let n = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
        let mut rest = &body[2..];
        let mut out = Vec::new();
        for _ in 0..n {
            let (name, r) = crate::protocol::read_cstr(rest)?;
            // table oid (4), attnum (2), then type oid (4), typlen (2), typmod (4), format (2):
            // formats follow the Bind, which is the same on every server.
            let fixed = r.get(..18)?;
            out.push((name, &fixed[6..16]));
            rest = &r[18..];
        }
        Some(out)
    }
    a == b || (a.first() == b.first() && matches!((columns(a), columns(b)), (Some(x), Some(y)) if x == y))
}

/// True when the frames hold a Describe of a portal (the client learns the row shape anew).
pub(in crate::session) fn describes_portal(mut frames: &[u8]) -> bool {
    while let Ok(Some(n)) = crate::protocol::split_frame(frames, usize::MAX) {
        if frames[0] == tags::DESCRIBE && frames.get(5) == Some(&b'P') {
            return true;
        }
        frames = &frames[n..];
    }
    false
}

impl Session {
    /// The answer to a shape check: a different shape means the statement changed under
    /// its clients; PostgreSQL would answer their next use with 0A000.
    pub(in crate::session) fn on_shape_checked(&mut self, stmt: &Arc<Statement>, frame: &[u8], srv: &mut ServerState) {
        self.leave(Phase::Held);
        if stmt.shape.get().is_some_and(|s| same_shape(s, frame)) {
            return;
        }
        tracing::debug!(statement = %stmt.server_name, "row shape changed since clients described it");
        self.registry().mark_stale(stmt);
        srv.stmts.remove(stmt);
        self.close_quietly(&stmt.server_name, Fx::default());
        self.stmts.shape_mismatch = Some(stmt.clone());
    }

    /// A description of the client's plain unnamed statement of Parse sequence `seq`: what
    /// the client was told it returns, or (`check`) what another server's parse of it
    /// describes, compared with that.
    pub(in crate::session) fn on_plain_shape(&mut self, seq: u64, frame: &[u8], check: bool) {
        if check {
            self.leave(Phase::Held);
        }
        let Unnamed::Plain { seq: s, shape, stale, .. } = &mut self.stmts.unnamed else { return };
        if *s != seq {
            return;
        }
        match shape {
            Some(told) if check && !same_shape(told, frame) => {
                tracing::debug!("the client's unnamed statement describes other rows on this server");
                *stale = true;
            }
            Some(_) => {}
            None if check => {}
            None => *shape = Some(frame.into()),
        }
    }

    /// A server described a cached statement with rows of another shape than clients were
    /// told: it parsed the text after a schema change (a fresh client Parse, or a server
    /// that had evicted it). Clients told the old shape must get 0A000 from now on, as from
    /// their own backends: the statement goes stale. The client reading this description
    /// moves to a new generation that carries it. The server's copy stays until evicted
    /// (closing it now would also close portals of it still in use).
    pub(in crate::session) fn on_new_shape(&mut self, stmt: &Arc<Statement>, frame: &[u8]) {
        tracing::debug!(statement = %stmt.server_name, "a server described another row shape: new generation");
        let registry = self.registry().clone();
        registry.mark_stale(stmt);
        let fresh = registry.current(stmt);
        let _ = fresh.shape.get_or_init(|| frame.into());
        self.stmts.remap(stmt, &fresh);
        self.stmts.described.insert(fresh.id);
    }
}
