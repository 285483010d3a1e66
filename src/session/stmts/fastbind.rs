//! The direct bind of an autoprepared Query (`autoprepare`). Its batch, fed as frames
//! (Parse "" of the lifted text, Bind, Describe P, Execute, Sync), comes to this when the
//! cache answers the Parse with a statement the linked server has: a ParseComplete the
//! client never sees, and the Bind/Describe/Execute/Sync of that statement. When the text
//! took a kept lift template whose statement is known to be that one (found in the
//! registry at its current `changes`, under the same search_path, valid, not stale), and
//! nothing the frames would meet can turn out otherwise, the four messages are written
//! and queued here at once, with every effect the frames would have had: the Parse's
//! (`parse_cached`: counters, the described set), the Bind's (`on_bind`, `resolve`,
//! `send_use`: the server's LRU touch, the portal bookkeeping, the retry point, and inside
//! a transaction block the savepoint guard of a statement that returns rows, whose Parse
//! made it fresh there), the Execute's (`time_execute`), the retry's record of the batch
//! (a transparent retry replays it as frames) and the `Pending::simple` marks of
//! `autoprep_after_frame`. Anything else — a block where the cache does not serve the
//! statement (`serves_in_block`), an earlier batch kept for a retry, a statement
//! that must be prepared or checked first, one the plan guard runs as sent this time, a
//! text that sets or pins anything — is left to the frames.
//!
//! Owns: `Known`, what a template's lifted text was last found cached as.

use super::autoprepare::Memo;
use super::guard::GuardCmd;
use super::{DEALLOCATE_ALL_STANDIN, cached_bind_text};
use crate::protocol::frontend;
use crate::session::reply_queue::{Fx, OnReply, Pending, Req};
use crate::session::{Phase, Session};
use crate::state::{ServerState, TxStatus};
use crate::stmt::lift::Origin;
use crate::stmt::registry::{StmtKind, make_key};
use crate::stmt::{Registry, Statement};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// The statement a template's lifted text was found cached as.
#[derive(Debug)]
pub(in crate::session) struct Known {
    /// The registry it was found in (only compared: held weakly, so that no other registry
    /// can be at its address).
    registry: Weak<Registry>,
    /// `Registry::changes` then: while it has not moved, the key still finds it.
    changes: u64,
    /// The client's search_path then (part of the registry key).
    search_path: Box<[u8]>,
    /// Not kept alive by this (the registry drops statements nobody holds).
    stmt: Weak<Statement>,
    /// `plain_text` of it.
    plain: bool,
}

/// Whether a Bind of `s` does nothing but bind it: its text sets, pins and tracks nothing,
/// is not answered by the session (LISTEN, the stand-in of DEALLOCATE ALL), and reads no
/// `pg_prepared_statements` (rewritten per client, never cached).
fn plain_text(s: &Statement) -> bool {
    let w = cached_bind_text(s).watch;
    !(w.sets_config
        || w.session_stmt
        || w.pins_begin
        || w.pins_end
        || *s.query == *DEALLOCATE_ALL_STANDIN
        // (`maybe_listen` alone is a first-letter test: every UPDATE passes it.)
        || crate::stmt::sql::listen::maybe_listen(&s.query) && crate::stmt::sql::listen::parse_listen(&s.query).is_some()
        || crate::stmt::pgps::mentions(&s.query)
        || s.kind != StmtKind::Protocol)
}

impl Session {
    /// Binds the autoprepared Query `text` (its lift `memo.applied` by `memo.templates[0]`)
    /// directly, if that is exactly what its frames would come to. False: nothing was done
    /// (but for a plan guard's choice to run it as sent, which `as_sent_next` carries to the
    /// Parse).
    pub(super) fn bind_fast(&mut self, memo: &mut Memo, text: &[u8], srv: &mut ServerState) -> bool {
        #[cfg(test)]
        if memo.frames_only {
            return false;
        }
        let Some(registry) = self.stmts.registry.clone() else { return false };
        let in_block = self.busy.tx.status == TxStatus::InBlock;
        if registry.cfg.autoprepare_after == 0
            || !(self.busy.tx.status == TxStatus::Idle || in_block)
            || self.busy.phase != Phase::Ready
            || self.busy.replies.portal_leftover()
            || !self.busy.retry.batch.is_empty()
            || self.stmts.fresh_in_tx.is_some()
            || self.link.state().is_some_and(|l| l.lent)
        {
            return false;
        }
        let Some(s) = self.known_statement(memo, &registry) else { return false };
        if !srv.stmts.has(&s)
            || !s.is_valid()
            || in_block && !self.serves_in_block(&s, true)
            || self.stmts.as_sent_next == Some(s.id)
            || self.stmts.shape_mismatch.as_ref().is_some_and(|m| Arc::ptr_eq(m, &s))
        {
            return false;
        }
        // Last: the plan guard's sample is taken here, as the Parse would take it.
        if let Some(g) = s.guard(&registry.cfg)
            && g.as_sent(s.id)
        {
            self.stmts.as_sent_next = Some(s.id);
            return false;
        }
        let origin = memo.origin_for(text);
        // In a block, a statement that returns rows is bound under a savepoint guard (its
        // first use in the block: the Query's Parse makes it fresh there every time).
        let guarded = in_block && !super::guard::returns_nothing(&s);
        self.bound_now(memo, text, s, origin, guarded, &registry, srv);
        true
    }

    /// The statement an unnamed Parse of `memo.templates[0]`'s lifted text is served by
    /// now, if the registry holds it (no sighting counted): the one found last while the
    /// registry has not moved, or looked up again. None also when its text is not
    /// `plain_text`.
    pub(super) fn known_statement(&mut self, memo: &mut Memo, registry: &Arc<Registry>) -> Option<Arc<Statement>> {
        let changes = registry.changes();
        let kept = memo.templates.first_mut()?;
        if let Some(k) = &kept.known
            && std::ptr::eq(k.registry.as_ptr(), Arc::as_ptr(registry))
            && k.changes == changes
            && *k.search_path == *self.search_path()
            && let Some(s) = k.stmt.upgrade()
            && !s.stale.load(Ordering::Relaxed)
            && !s.infers_stale_types()
        {
            return k.plain.then_some(s);
        }
        let mut key = std::mem::take(&mut self.busy.key_buf);
        make_key(&mut key, &StmtKind::Protocol, self.search_path(), &kept.t.text, &kept.t.type_bytes);
        let found = registry.cached_for_parse(&key);
        self.busy.key_buf = key;
        let (s, changes) = found?;
        let plain = plain_text(&s);
        let stmt = Arc::downgrade(&s);
        let registry = Arc::downgrade(registry);
        kept.known = Some(Known { registry, changes, search_path: self.search_path().into(), stmt, plain });
        plain.then_some(s)
    }

    /// Writes and queues the batch of `memo.templates[0]` bound to `s` (see the module doc),
    /// in the order its frames would have done it.
    #[allow(clippy::too_many_arguments)]
    fn bound_now(
        &mut self,
        memo: &Memo,
        text: &[u8],
        s: Arc<Statement>,
        origin: Arc<Origin>,
        guarded: bool,
        registry: &Registry,
        srv: &mut ServerState,
    ) {
        let t = &memo.templates[0].t;
        // The frames are written straight into the batch the retry keeps (a transparent
        // retry feeds them again), as `Retry::record` would keep them one by one.
        let batch = &mut self.busy.retry.batch;
        debug_assert!(batch.is_empty());

        // Parse "": answered by the cache, its ParseComplete dropped at once.
        put_parse(batch, &t.text, &t.type_bytes);
        registry.stats.client_parses.fetch_add(1, Ordering::Relaxed);
        self.stmts.described.remove(&s.id);
        registry.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.busy.replies.pushes = self.busy.replies.pushes.wrapping_add(1);

        // Bind "" "": the statement is there (its LRU place moves). (No portal left by a
        // failed Query to close: `bind_fast` checked; none is left by what is sent here.)
        let batch = &mut self.busy.retry.batch;
        let p_end = batch.len();
        put_bind_text(batch, text, &memo.applied.values);
        let b_end = batch.len();
        batch.extend_from_slice(DESCRIBE_EXECUTE_SYNC);
        self.busy.retry.frame_at = p_end as u32;
        if guarded {
            self.open_guard(&s, srv);
        }
        // The Bind's tail: everything after its two names ("" and "").
        let batch = &self.busy.retry.batch;
        frontend::bind_with_tail(&mut self.to_server, b"", s.server_name.as_bytes(), &batch[p_end + 7..b_end]);
        srv.stmts.touch(&s);
        if self.stmts.last_plain.as_ref().is_some_and(|(p, _)| p.is_empty()) {
            self.stmts.last_plain = None;
        }
        self.listen_note_bind(b"", None);
        if self.stmts.dealloc_portal.as_deref() == Some(b"") {
            self.stmts.dealloc_portal = None;
        }
        if self.busy.tx.tracked_portal.as_deref().is_some_and(|(p, _)| p.is_empty()) {
            self.busy.tx.tracked_portal = None;
        }
        self.kept.tally.binds = self.kept.tally.binds.wrapping_add(1);
        self.stmts.last_bind = Some((Box::default(), s.clone()));
        let replay_from = if guarded { Some(p_end as u32) } else { self.retry_point() };
        let fx = Fx { uses: Some(s.clone()), replay_from, guarded, ..Fx::default() };
        self.push_simple(Pending::with(Req::Bind, OnReply::Forward, fx), &origin);
        if guarded {
            self.guard_command(GuardCmd::Release, srv);
        }

        // Describe P "", Execute "" (timed for the statement) and Sync, written at once.
        self.to_server.extend_from_slice(DESCRIBE_EXECUTE_SYNC);
        let fx = Fx { portal_of: Some(s.clone()), ..Fx::default() };
        self.push_simple(Pending::with(Req::Describe, OnReply::Forward, fx), &origin);
        self.busy.retry.frame_handled(crate::protocol::tags::EXECUTE, true, true);
        let mut p = Pending::client(Req::Execute);
        p.timed = Some(s);
        p.timed_cached = true;
        p.sent_us = self.busy.clock_us;
        p.behind = self.link.state().is_some_and(|l| l.behind);
        self.push_simple(p, &origin);
        // The batch is the last one now, kept for a retry.
        self.busy.retry.frame_at = (b_end + DESCRIBE_EXECUTE_SYNC.len() - SYNC_LEN) as u32;
        self.busy.retry.frame_handled(crate::protocol::tags::SYNC, true, true);
        self.push_simple(Pending::client(Req::Sync), &origin);
    }

    /// Queues `p` as part of an autoprepared Query.
    #[inline]
    fn push_simple(&mut self, mut p: Pending, origin: &Arc<Origin>) {
        p.simple = Some(origin.clone());
        self.busy.replies.push(p);
    }
}

/// Describe P "", Execute "" (all rows) and Sync, as `frontend` writes them.
const DESCRIBE_EXECUTE_SYNC: &[u8] = b"D\0\0\0\x06P\0E\0\0\0\x09\0\0\0\0\0S\0\0\0\x04";
/// The Sync's part of it.
const SYNC_LEN: usize = 5;

/// A message `tag` whose body `body` writes, as `frontend` writes them (into a `Vec`).
#[inline]
fn put_msg(out: &mut Vec<u8>, tag: u8, body: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.push(tag);
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = (out.len() - at - 1) as u32;
    out[at + 1..at + 5].copy_from_slice(&len.to_be_bytes());
}

/// `frontend::parse` of the unnamed statement.
fn put_parse(out: &mut Vec<u8>, query: &[u8], types: &[u8]) {
    put_msg(out, b'P', |b| {
        b.push(0);
        b.extend_from_slice(query);
        b.push(0);
        b.extend_from_slice(&((types.len() / 4) as i16).to_be_bytes());
        b.extend_from_slice(types);
    });
}

/// `frontend::bind_text_with` of the unnamed portal and statement, the `values` of `text`.
fn put_bind_text(out: &mut Vec<u8>, text: &[u8], values: &[std::ops::Range<usize>]) {
    put_msg(out, b'B', |b| {
        b.extend_from_slice(&[0, 0, 0, 0]);
        b.extend_from_slice(&(values.len() as i16).to_be_bytes());
        for r in values {
            let v = &text[r.clone()];
            b.extend_from_slice(&(v.len() as i32).to_be_bytes());
            b.extend_from_slice(v);
        }
        b.extend_from_slice(&[0, 0]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames written here are the bytes `frontend` writes.
    #[test]
    fn frames_as_frontend_writes_them() {
        let text = b"SELECT 1 WHERE aid = 4711 AND x = 22";
        let values = [21..25, 34..36];
        let mut ours = vec![];
        put_parse(&mut ours, b"SELECT $1 WHERE aid = $2", &[0, 0, 0, 23, 0, 0, 0, 20]);
        put_bind_text(&mut ours, text, &values);
        ours.extend_from_slice(DESCRIBE_EXECUTE_SYNC);
        let mut theirs = bytes::BytesMut::new();
        frontend::parse(&mut theirs, b"", b"SELECT $1 WHERE aid = $2", &[0, 0, 0, 23, 0, 0, 0, 20]);
        frontend::bind_text_with(&mut theirs, b"", b"", 2, values.iter().map(|r| &text[r.clone()]));
        frontend::describe_portal(&mut theirs, b"");
        frontend::execute(&mut theirs, b"");
        let before_sync = theirs.len();
        frontend::sync(&mut theirs);
        assert_eq!(ours, &theirs[..]);
        assert_eq!(theirs.len() - before_sync, SYNC_LEN);
    }
}
