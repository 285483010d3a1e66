//! LISTEN/NOTIFY under transaction pooling, the client's side. A `LISTEN`, `UNLISTEN` or
//! `UNLISTEN *` sent alone in a simple Query is answered here, as PostgreSQL answers it,
//! without a server; one sent alone through the extended protocol (statement cache on) is
//! parsed and bound on the server as any statement, and its Execute answered here; the client's channels are kept across transactions (`ClientStmts::listen`,
//! absent for a client that never listened). Outside a transaction block the change takes
//! effect at once; inside one, at its COMMIT (dropped at a rollback), as PostgreSQL applies
//! it. The driver applies each change to its pool's listening connection
//! (`Action::Subscribe`, `take_subscriptions`) and hands over the NotificationResponse
//! frames that connection receives (`queue_notifications`); they are queued here and
//! written to the client only where PostgreSQL would send them: between transactions, with
//! no request in flight (`deliver_notifications`), or just before the ReadyForQuery 'I'
//! that ends a transaction or a request; checked against the client's channels as they are
//! then, as PostgreSQL checks them when it reads its queue. A client that does not read them is
//! closed with FATAL 53400 once `MAX_QUEUED` (or `MAX_QUEUED_BYTES`) wait for it.

use super::{Action, Phase, Session};
use crate::config::PoolMode;
use crate::error::{Error, SqlState};
use crate::protocol::{body, split_frame, tags};
use crate::state::TxStatus;
use crate::stmt::sql::listen::{ListenCmd, maybe_listen, parse_listen};
use bytes::BytesMut;
use std::collections::HashSet;

/// Notifications one client may have waiting (queued here or on their way from the
/// listening connection) before it is closed.
pub(crate) const MAX_QUEUED: usize = 10_000;
/// The same cap in bytes.
pub(crate) const MAX_QUEUED_BYTES: usize = 16 << 20;
/// Channels one client may listen on (committed and pending in its transaction block): the
/// pool's one listening connection holds the union of every client's, so one client must
/// not be able to make it listen on an unbounded number.
pub(crate) const MAX_CHANNELS: usize = 10_000;
/// Notifications are written to the client only while less than this waits in `to_client`
/// (a client that does not read lets its queue fill, not the output buffer).
const DELIVER_BELOW: usize = 256 * 1024;

/// A listening client's channels and notifications (see the module doc).
#[derive(Debug, Default)]
pub(in crate::session) struct Listening {
    /// The channels the client listens on (committed).
    channels: HashSet<Box<[u8]>>,
    /// LISTEN/UNLISTEN run in the open transaction block, applied at its COMMIT.
    in_tx: Vec<ListenCmd>,
    /// The COMMIT of the open transaction block was seen (its ReadyForQuery is next).
    commit_seen: bool,
    /// Changes of `channels` the driver has not applied yet.
    changes: Vec<ListenCmd>,
    /// Portals bound to a lone LISTEN/UNLISTEN (extended protocol, cache on): their Execute
    /// is answered here. Portals end with their transaction: cleared at ReadyForQuery `I`.
    portals: Vec<(Box<[u8]>, ListenCmd)>,
    /// LISTEN/UNLISTEN executed that way in the batch in flight, settled at its
    /// ReadyForQuery (`listen_batch_end`).
    batch: Vec<ListenCmd>,
    /// Channels of LISTENs pending in the open block that the client does not listen on
    /// yet, subscribed ahead of its COMMIT: PostgreSQL checks a notification against the
    /// channels a listening session has when it reads it (at its transaction's end), so one
    /// sent to such a channel during the block is delivered if the block commits.
    early: HashSet<Box<[u8]>>,
    /// The queue may hold notifications of channels the client no longer (or not yet)
    /// listens on: filtered when delivered.
    recheck: bool,
    /// NotificationResponse frames waiting for the client's next idle moment.
    queue: BytesMut,
    queued: usize,
}

impl Listening {
    /// Applies a committed LISTEN/UNLISTEN; the driver is told of real changes.
    fn apply(&mut self, cmd: ListenCmd) -> bool {
        let changed = match &cmd {
            ListenCmd::Listen(ch) => self.channels.insert(ch.clone()),
            ListenCmd::Unlisten(ch) => self.channels.remove(ch),
            ListenCmd::UnlistenAll => {
                let any = !self.channels.is_empty();
                self.channels.clear();
                any
            }
        };
        if changed {
            // What is queued is checked against the channels left when it is delivered.
            self.recheck |= self.queued > 0 && !matches!(cmd, ListenCmd::Listen(_));
            self.changes.push(cmd);
        }
        changed
    }

    /// Whether a notification on `ch` is queued: a channel listened on, or one LISTENed in
    /// the open block while already listening on some (PostgreSQL's session is then a
    /// registered listener, reading from where it last stopped; a session listening on
    /// nothing yet starts reading at its COMMIT).
    fn wants(&self, ch: &[u8]) -> bool {
        self.channels.contains(ch) || (!self.channels.is_empty() && self.early.contains(ch))
    }

    /// Drops queued notifications of channels the client does not listen on now.
    fn filter_queue(&mut self) {
        self.recheck = false;
        let old = std::mem::take(&mut self.queue);
        self.queued = 0;
        let mut at = 0;
        while let Ok(Some(n)) = split_frame(&old[at..], usize::MAX) {
            let f = &old[at..at + n];
            at += n;
            if notification_channel(f).is_some_and(|ch| self.channels.contains(ch)) {
                self.queue.extend_from_slice(f);
                self.queued += 1;
            }
        }
    }
}

/// The channel of a NotificationResponse frame.
fn notification_channel(f: &[u8]) -> Option<&[u8]> {
    if f.first() != Some(&tags::NOTIFICATION_RESPONSE) {
        return None;
    }
    body(f).get(4..).and_then(|r| r.split(|&c| c == 0).next())
}

impl Session {
    /// A simple Query that is one LISTEN/UNLISTEN (`stmt::sql::listen`), answered here.
    /// None: not one (or not here: session mode, where the client has its own server);
    /// Some(false): requests are in flight, feed it again after their replies.
    pub(super) fn on_listen_query(&mut self, frame: &[u8]) -> Option<bool> {
        if self.kept.mode == PoolMode::Session || self.busy.phase != Phase::Ready {
            return None;
        }
        let text = self.query_text_of(frame)?;
        if !maybe_listen(text) || self.autoprep_feeding() || self.busy.replies.is_unsynced() {
            return None;
        }
        let cmd = parse_listen(text)?;
        if !self.busy.replies.is_empty() {
            // Answered in order, after what is in flight.
            return Some(false);
        }
        if self.too_many_channels(&cmd) {
            return Some(true);
        }
        let status = self.busy.tx.status;
        let tag = match status {
            TxStatus::Failed => {
                Error::new(
                    SqlState::IN_FAILED_SQL_TRANSACTION,
                    "current transaction is aborted, commands ignored until end of transaction block",
                )
                .write_to(&mut self.to_client);
                None
            }
            _ => {
                let tag = if matches!(cmd, ListenCmd::Listen(_)) { "LISTEN" } else { "UNLISTEN" };
                if status == TxStatus::InBlock {
                    self.pend_in_block(vec![cmd]);
                } else if self.stmts.listen.is_some() || matches!(cmd, ListenCmd::Listen(_)) {
                    // (An UNLISTEN by a client that never listened changes nothing.)
                    self.apply_listen(cmd);
                }
                Some(tag)
            }
        };
        self.answered_here(tag, status);
        Some(true)
    }

    /// A LISTEN of one channel more than `MAX_CHANNELS`: the client is closed (true).
    fn too_many_channels(&mut self, cmd: &ListenCmd) -> bool {
        if let (ListenCmd::Listen(ch), Some(l)) = (cmd, self.stmts.listen.as_ref())
            && l.channels.len() + l.in_tx.len() + l.batch.len() >= MAX_CHANNELS
            && !l.channels.contains(ch)
        {
            self.fail(Error::fatal(
                SqlState::PROGRAM_LIMIT_EXCEEDED,
                format!("too many LISTEN channels for one client (limit {MAX_CHANNELS})"),
            ));
            return true;
        }
        false
    }

    /// A Bind of `portal` (cache on, transaction pooling) to a statement whose text is
    /// `listen` when it is a lone LISTEN/UNLISTEN: its Execute will be answered here.
    pub(super) fn listen_note_bind(&mut self, portal: &[u8], listen: Option<ListenCmd>) {
        match listen {
            Some(cmd) if self.kept.mode != PoolMode::Session => {
                let l = self.stmts.listen.get_or_insert_default();
                l.portals.retain(|(p, _)| **p != *portal);
                l.portals.push((portal.into(), cmd));
            }
            _ => {
                if let Some(l) = self.stmts.listen.as_mut()
                    && !l.portals.is_empty()
                {
                    l.portals.retain(|(p, _)| **p != *portal);
                }
            }
        }
    }

    /// An Execute of a portal bound to a lone LISTEN/UNLISTEN (`listen_note_bind`): answered
    /// here in its place in the batch (the server never runs it, so the client is not
    /// pinned), and settled when the batch's ReadyForQuery tells how its transaction ended.
    /// False: not such a portal.
    pub(super) fn on_listen_execute(&mut self, frame: &[u8]) -> bool {
        let Some(l) = self.stmts.listen.as_ref() else { return false };
        if l.portals.is_empty() {
            return false;
        }
        let Some((portal, _)) = crate::protocol::read_cstr(body(frame)) else { return false };
        let Some(cmd) = l.portals.iter().find(|(p, _)| **p == *portal).map(|(_, c)| c.clone()) else {
            return false;
        };
        if self.too_many_channels(&cmd) {
            return true;
        }
        let tag = if matches!(cmd, ListenCmd::Listen(_)) { "LISTEN" } else { "UNLISTEN" };
        self.stmts.listen.get_or_insert_default().batch.push(cmd);
        self.push_synth(super::reply_queue::Synth::Tag(tag), Default::default());
        true
    }

    /// A LISTEN/UNLISTEN of a multi-statement Query ran in its place (`stmts::script`): kept
    /// for the Query's ReadyForQuery, as one of the extended protocol. False: the client is
    /// closed (too many channels).
    pub(super) fn listen_script_ran(&mut self, cmd: ListenCmd) -> bool {
        if self.too_many_channels(&cmd) {
            return false;
        }
        self.stmts.listen.get_or_insert_default().batch.push(cmd);
        true
    }

    /// The ReadyForQuery ending a batch (transaction status `before` it, `status` now,
    /// `failed`: an error in it): LISTEN/UNLISTEN executed in it (`on_listen_execute`) take
    /// effect now if it was an implicit transaction that committed, join the block's
    /// (applied at its COMMIT, which may be in this batch) if one is or was open, and are
    /// dropped with a failed batch. Portals end with the transaction.
    pub(super) fn listen_batch_end(&mut self, before: TxStatus, status: TxStatus, failed: bool) {
        let Some(l) = self.stmts.listen.as_mut() else { return };
        if status == TxStatus::Idle {
            l.portals.clear();
        }
        if l.batch.is_empty() {
            return;
        }
        let cmds = std::mem::take(&mut l.batch);
        if failed || status == TxStatus::Failed {
            return;
        }
        if before == TxStatus::Idle && status == TxStatus::Idle && !l.commit_seen {
            for cmd in cmds {
                self.apply_listen(cmd);
            }
        } else {
            self.pend_in_block(cmds);
        }
    }

    /// LISTEN/UNLISTEN run in the open transaction block, applied at its COMMIT. A LISTEN
    /// of a channel not listened on yet is subscribed at once (`Listening::early`).
    fn pend_in_block(&mut self, cmds: Vec<ListenCmd>) {
        let l = self.stmts.listen.get_or_insert_default();
        let first = l.changes.is_empty();
        for cmd in &cmds {
            if let ListenCmd::Listen(ch) = cmd
                && !l.channels.contains(ch)
                && l.early.insert(ch.clone())
            {
                l.changes.push(cmd.clone());
            }
        }
        l.in_tx.extend(cmds);
        if first && !l.changes.is_empty() {
            self.busy.actions.push_back(Action::Subscribe);
        }
    }

    fn apply_listen(&mut self, cmd: ListenCmd) {
        let l = self.stmts.listen.get_or_insert_default();
        let first = l.changes.is_empty();
        if l.apply(cmd) && first {
            self.busy.actions.push_back(Action::Subscribe);
        }
    }

    /// LISTEN/UNLISTEN sent inside the open block or batch wait for its end.
    pub(super) fn listen_pending_in_tx(&self) -> bool {
        self.stmts.listen.as_ref().is_some_and(|l| !l.in_tx.is_empty() || !l.batch.is_empty())
    }

    /// A CommandComplete the client gets: the COMMIT of a block with LISTEN/UNLISTEN in it
    /// applies them at its ReadyForQuery.
    #[inline]
    pub(super) fn listen_note_complete(&mut self, frame: &[u8]) {
        if let Some(l) = self.stmts.listen.as_mut()
            && (!l.in_tx.is_empty() || !l.batch.is_empty())
            && body(frame) == b"COMMIT\0"
        {
            l.commit_seen = true;
        }
    }

    /// The client's ReadyForQuery with transaction status `status`: a committed block's
    /// LISTEN/UNLISTEN take effect, a rolled back one's are dropped.
    #[inline]
    pub(super) fn listen_tx_end(&mut self, status: TxStatus) {
        let Some(l) = self.stmts.listen.as_mut() else { return };
        if l.in_tx.is_empty() {
            return;
        }
        if l.commit_seen {
            l.commit_seen = false;
            for cmd in std::mem::take(&mut l.in_tx) {
                self.apply_listen(cmd);
            }
        } else if status == TxStatus::Idle {
            l.in_tx.clear();
        } else {
            return;
        }
        // The block ended: channels subscribed ahead of it that it did not keep are dropped,
        // and what was queued meanwhile is checked against the channels it left.
        let l = self.stmts.listen.get_or_insert_default();
        let first = l.changes.is_empty();
        for ch in std::mem::take(&mut l.early) {
            if !l.channels.contains(&ch) {
                l.changes.push(ListenCmd::Unlisten(ch));
            }
        }
        l.recheck |= l.queued > 0;
        if first && !l.changes.is_empty() {
            self.busy.actions.push_back(Action::Subscribe);
        }
    }

    /// The subscription changes to apply to the pool's listening connection, in order
    /// (asked for by `Action::Subscribe`).
    pub(crate) fn take_subscriptions(&mut self) -> Vec<ListenCmd> {
        self.stmts.listen.as_mut().map(|l| std::mem::take(&mut l.changes)).unwrap_or_default()
    }

    /// NotificationResponse frames from the pool's listening connection (whole frames, in
    /// the order received), `overflowed` if some were dropped on their way because too many
    /// waited: those for a channel the client listens on are queued and written when the
    /// client is between transactions. A client with too many waiting is closed (FATAL
    /// 53400): PostgreSQL's own queue, when full, fails the NOTIFY of the sender, which a
    /// pooler cannot do after the fact; losing notifications silently would be worse.
    pub(crate) fn queue_notifications(&mut self, frames: &[u8], overflowed: bool) {
        if self.busy.phase == Phase::Closing {
            return;
        }
        let Some(l) = self.stmts.listen.as_mut() else { return };
        let mut at = 0;
        while let Ok(Some(n)) = split_frame(&frames[at..], usize::MAX) {
            let f = &frames[at..at + n];
            at += n;
            let Some(ch) = notification_channel(f) else { continue };
            if l.wants(ch) {
                l.recheck |= !l.channels.contains(ch);
                l.queue.extend_from_slice(f);
                l.queued += 1;
            }
        }
        if overflowed || l.queued > MAX_QUEUED || l.queue.len() > MAX_QUEUED_BYTES {
            tracing::warn!(
                session = self.kept.uid,
                queued = l.queued,
                "listener closed: too many notifications unread"
            );
            l.queue.clear();
            l.queued = 0;
            return self.fail(
                Error::fatal(SqlState::CONFIGURATION_LIMIT_EXCEEDED, "too many notifications queued for this client")
                    .with_detail(format!(
                        "More than {MAX_QUEUED} notifications (or {} MB) were waiting for the client to read them.",
                        MAX_QUEUED_BYTES >> 20
                    )),
            );
        }
        self.deliver_notifications();
    }

    /// Writes the queued notifications if the client is where PostgreSQL would send them:
    /// outside a transaction block, no request in flight, nothing held for its next Sync,
    /// and its output not backed up.
    pub(crate) fn deliver_notifications(&mut self) {
        let Some(l) = self.stmts.listen.as_mut() else { return };
        if l.queued == 0
            || !self.busy.replies.is_empty()
            || self.busy.replies.is_unsynced()
            || self.busy.tx.status != TxStatus::Idle
            || self.busy.phase != Phase::Ready
            || self.busy.held != 0
            || self.link == super::Link::Acquiring
            || self.to_client.len() >= DELIVER_BELOW
        {
            return;
        }
        if l.recheck {
            l.filter_queue();
        }
        self.to_client.extend_from_slice(&l.queue);
        l.queue.clear();
        l.queued = 0;
    }
}
