//! The per-client session after login: a sans-IO state machine. It is fed whole frames
//! from the client and from the linked server, and answers with bytes to write (in
//! `to_client` / `to_server`) and actions (acquire, release, close). It never touches a
//! socket, a clock or the pool; the driver does that and calls back.
//!
//! Owns: the reply queue of the linked server, transaction boundaries (from ReadyForQuery
//! only, never from parsing SQL, but for a lone BEGIN answered here: `begin`), pool-mode
//! rules, replaying session settings onto whichever server the client is given, and the
//! client's view of its prepared statements over the shared statement cache.
//!
//! The parts, one file each: `client` (frames from the client), `begin` (a lone BEGIN
//! answered here, sent with the transaction's first statement), `flush` (when output may
//! reach the client), `server` (frames from the server, releasing), `failure` (how a session fails
//! or ends: one FATAL per failure), `linking` (what runs on a server before
//! the client's requests: settings replayed, other clients' timeouts reset first), `tx` (the
//! client's transaction and the settings made in it), `stmts` (the client's prepared
//! statements), `retry` (replaying a batch after a stale plan), `pipeline` (lending the
//! server to other clients' fast reads), `reply_queue` (what each reply in flight is for), `error_text` (a server's error
//! reworded as the client's own text would have had it),
//! `settings` (recognizing SQL that changes settings), `pins` (pinning to the server
//! connection under transaction pooling, and when it ends), `notify` (LISTEN/UNLISTEN answered
//! here, notifications queued until the client is between transactions), `timeout` (which idle timeout
//! applies, and its error), `park` (what an idle client keeps while its busy half serves
//! others), `settle` (bringing a server back to idle when its client left it
//! mid-conversation), `inflow` (large client frames passed on as they arrive), `timing` (server time of
//! executions of cached statements, for their statistics and plan guard), `wire_trace`
//! (the frames of a conversation, logged at trace level). `Session`'s state is grouped by
//! how long it lives (see `Session`): the link's (`Link`, `LinkState`), the client's kept
//! across transactions (`Kept`, its statements), and a busy client's (`Busy`).

mod begin;
mod client;
mod config;
mod error_text;
mod failure;
mod flush;
mod inflow;
mod linking;
pub use inflow::{STREAM_FROM, Streamed, stream_from};
mod notify;
pub(crate) use notify::{MAX_QUEUED, MAX_QUEUED_BYTES};
mod park;
mod pins;
pub use park::Parked;
mod pipeline;
pub(crate) use pipeline::{BackendPhase, Timed};
pub(crate) mod reply_queue;
mod retry;
mod server;
pub(crate) mod settings;
mod settle;
mod stmts;
mod timeout;
pub(crate) use timeout::Timeouts;
mod timing;
mod tx;
mod wire_trace;

#[cfg(test)]
mod tests;

use crate::config::PoolMode;
use crate::error::Error;
use crate::state::TxStatus;
use crate::state::settings::Settings;
use crate::stmt::Registry;
use bytes::BytesMut;
use reply_queue::ReplyQueue;
use retry::Retry;
use std::collections::VecDeque;
use std::sync::Arc;
use stmts::ClientStmts;
use tx::TxState;

/// What the driver must do for the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Get a server connection from the pool, then call `handle_server_linked` and feed
    /// the client frame that was not consumed again.
    AcquireServer,
    /// Give the linked server back; `reusable: false` means close it.
    ReleaseServer {
        /// The server is idle, outside a transaction, with nothing outstanding.
        reusable: bool,
    },
    /// The server said it is going down (a FATAL or warning 57P01 or 57P02: a fast or
    /// immediate shutdown, a crash, a terminated backend): every connection of the pool
    /// opened before now is closed instead of reused (`reconnect`). The others' own FATAL
    /// may not have been read yet, and a client must not get it as the answer to its next
    /// request. Comes before the `ReleaseServer` of the connection that said it.
    RetireServers,
    /// Write out `to_client`, then close the client connection.
    Close,
    /// The client's LISTEN channels changed (`notify`): apply `take_subscriptions` to the
    /// pool's listening connection before writing `to_client` (a LISTEN is answered once
    /// the channel is listened on).
    Subscribe,
}

/// The session's server connection, and what is true of it only while it is linked: the
/// state dies with the link, so nothing of one server carries over to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Unlinked,
    Acquiring,
    Linked(LinkState),
}

/// What the session knows of its linked server beyond the reply queue (see `Link`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LinkState {
    /// The server took another client's batch behind this session's replies (`pipeline`):
    /// nothing more may be written to it.
    lent: bool,
    /// A standby's server (`set_on_reads`): only plain reads are written to it; anything
    /// else waits until it is given back, then goes to the primary.
    on_reads: bool,
    /// The client may have changed the server's session in a way parsnip cannot replay
    /// (`set_config(…, false)`, `settings::may_set_session_config`; an internal error; a
    /// Query it did not read): the server is closed, not reused, when given back.
    dirty: bool,
    /// When the last timed execution on this server ended (`timing`), µs.
    last_done_us: u64,
    /// The server was shared with this session's batch written behind another client's
    /// (`set_behind`): its executions wait for that one first, so they are not timed.
    behind: bool,
    /// The shortest statement or lock timeout in effect at any time on this link, µs (0:
    /// none; `state::timers`): a batch that runs half as long may leave a cancel signal.
    timer_us: u64,
    /// When the server last became busy with this client's requests (the clock when one
    /// was queued with none outstanding, or when linked), µs.
    busy_since_us: u64,
    /// Resets of another client's timeouts sent on this link (`linking`).
    clear_tries: u8,
}

impl Link {
    /// The linked server's state, if one is linked.
    fn state(&self) -> Option<&LinkState> {
        match self {
            Link::Linked(l) => Some(l),
            _ => None,
        }
    }

    fn state_mut(&mut self) -> Option<&mut LinkState> {
        match self {
            Link::Linked(l) => Some(l),
            _ => None,
        }
    }

    fn is_linked(&self) -> bool {
        matches!(self, Link::Linked(_))
    }

    /// Unlinks, returning the state the link had (None if no server was linked).
    fn unlink(&mut self) -> Option<LinkState> {
        match std::mem::replace(self, Link::Unlinked) {
            Link::Linked(l) => Some(l),
            other => {
                *self = other;
                None
            }
        }
    }
}

/// What became of a client frame given to [`Session::handle_client`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Handled: its bytes and actions are queued.
    Consumed,
    /// Not consumed: it needs a server. `AcquireServer` is queued (or under way); feed the
    /// same frame again after `handle_server_linked` (or `handle_acquire_failed`).
    NeedsServer,
    /// Not consumed: what it means depends on replies of the linked server still on their
    /// way (a shape check, an earlier batch). Feed it again after the next server frames.
    AwaitsReplies,
}

/// Where the conversation stands, beyond the request/reply flow of the reply queue. The
/// phases exclude each other; `Closing` is final.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Frames flow as usual.
    #[default]
    Ready,
    /// The server is in COPY FROM STDIN (CopyInResponse seen): the client sends COPY data,
    /// and a Sync gets no reply.
    CopyIn,
    /// The server hit an error in an extended-protocol batch the client has not ended with
    /// Sync yet: it ignores everything until that Sync, and so does the session.
    ServerSkipping,
    /// A request failed without a server (the pool could not serve it, or the session
    /// answered it with an error): the client's frames are dropped until its Sync.
    ClientSkipping,
    /// A shape check of a statement injected on the server is outstanding: client frames
    /// wait for its answer (they are fed again).
    Held,
    /// The session is closing: nothing more is fed.
    Closing,
}

/// One client's conversation. See the module doc. Its state is split by how long it
/// lives: the output buffers (the driver's interface), the link (`Link`: what is true of
/// the linked server dies with it), what the client keeps across transactions (`Kept`, and
/// its statements), and what only a busy client needs (`Busy`), blank between
/// transactions.
#[derive(Debug)]
pub struct Session {
    /// Bytes to write to the client.
    pub to_client: BytesMut,
    /// Bytes to write to the linked server.
    pub to_server: BytesMut,
    link: Link,
    kept: Kept,
    /// The client's prepared statements, kept across transactions.
    /// Boxed: parking hands the box over (`park`) instead of copying the statements.
    stmts: Box<ClientStmts>,
    busy: Busy,
}

/// What a client keeps across transactions, besides its statements: parking moves it out
/// of the session (`park`).
#[derive(Debug)]
struct Kept {
    mode: PoolMode,
    settings: Arc<Settings>,
    /// Unique id of this client (for the server's unnamed-statement owner).
    uid: u64,
    /// What the client has done, counted for the console and the metrics.
    tally: Tally,
    /// The client's pool splits plain reads to standbys (`set_read_split`): only then is a
    /// batch asking for a server looked at for being one (`is_read_batch`).
    read_split: bool,
    /// A lone BEGIN with no server linked is answered here and sent with the transaction's
    /// first statement (`begin`, `set_defer_begin`).
    defer_begin: bool,
    /// Under transaction pooling, why the client keeps its server connection (session
    /// advisory locks, WITH HOLD cursors, temporary tables, a LISTEN parsnip does not
    /// answer itself), and when that is asked again (`pins`).
    pins: pins::Pins,
}

impl Kept {
    /// Moves the kept part out, leaving this session's a blank one (that still refers to the
    /// client's settings until the next `unpark` replaces it).
    fn take(&mut self) -> Kept {
        let blank =
            Kept { settings: self.settings.clone(), tally: Tally::default(), pins: pins::Pins::default(), ..*self };
        std::mem::replace(self, blank)
    }
}

/// What only a busy client needs: blank between transactions (`is_blank`), so that an idle
/// client's session can be parked and this part reused for whichever client is busy next.
#[derive(Debug, Default)]
struct Busy {
    /// What each request in flight on the linked server is for.
    replies: ReplyQueue,
    /// How many bytes at the end of `to_client` wait for the client's next Sync or Flush
    /// (`flush`).
    held: usize,
    /// The held bytes go with the server's next answer: the client's Sync came, and the
    /// server has yet to answer its batch (`flush`).
    held_for_server: bool,
    actions: VecDeque<Action>,
    /// Where the conversation stands (COPY, skipping to Sync, held, closing).
    phase: Phase,
    /// Boxed: rare, and every session carries the field.
    acquire_error: Option<Box<Error>>,
    /// ParameterDescription of a Describe S of a cached statement, held until the row
    /// description arrives (a stale statement errors in between, and is then retried).
    param_desc: Option<Box<[u8]>>,
    /// The batch that asked for a server last (`Action::AcquireServer`) is a plain read
    /// that a standby may serve (`is_read_batch`), and so is everything written to that
    /// server since. Read by the driver after the server is given back, so not the link's.
    wants_reads: bool,
    /// The client's transaction.
    tx: TxState,
    /// The batch kept for a transparent retry.
    retry: Retry,
    /// A blank set of statements for the next client that parks with some (`park`).
    spare_stmts: Option<Box<ClientStmts>>,
    /// Scratch space for statement cache keys.
    key_buf: Vec<u8>,
    /// Lift templates of autoprepared Queries (`stmts::autoprepare::Memo`). A template
    /// belongs to a text, not to a client: it stays with this busy half when its client
    /// parks, for whichever client it serves next (an idle client keeps none).
    lifts: Option<Box<stmts::autoprepare::Memo>>,
    /// The driver's clock as last told (`timing`), µs.
    clock_us: u64,
    /// When the client's transaction (or its statement outside one) started, as far as the
    /// driver's polls saw (`timeout`: `transaction_timeout_ms`).
    tx_since: Option<std::time::Instant>,
    /// The Query text of the client frame being handled and its marks (`query_text_of`,
    /// `query_marks`).
    frame_marks: FrameMarks,
}

/// Where the Query text of the client frame being handled is (`Session::query_text_of`:
/// its end found once, not by each reader) and its marks (`stmt::sql::Marks`, worked out
/// once for the classifiers that read them: `Session::query_marks`). Set and cleared around
/// each client frame (`on_client_frame`): the frame and its text are known by their
/// addresses and lengths, which nothing else has while the frame is borrowed.
#[derive(Clone, Copy, Debug, Default)]
struct FrameMarks {
    /// The frame: address and length.
    frame: Option<(usize, usize)>,
    /// Its Query text: address and length.
    text: Option<(usize, usize)>,
    marks: Option<crate::stmt::sql::Marks>,
    /// The frames the driver has read after this one end its batch with a Sync before any
    /// Flush (`Session::note_synced_ahead`, told before a Parse): a guarded use in that
    /// batch can be retried.
    synced_ahead: bool,
}

impl Busy {
    /// Nothing would be lost by handing this part to another client: no request in flight
    /// or batch open, no action or error pending, nothing held of a reply, no transaction,
    /// nothing kept for a retry. Names every field, so that a new one is not forgotten.
    fn is_blank(&self) -> bool {
        let Busy {
            replies,
            // Counts bytes of `to_client`, which is empty when this is asked.
            held: _,
            // Cleared with `held` (`release_held`).
            held_for_server: _,
            actions,
            phase,
            acquire_error,
            param_desc,
            // Set afresh when the next batch asks for a server.
            wants_reads: _,
            tx,
            retry,
            // Storage and scratch, nobody's.
            spare_stmts: _,
            key_buf: _,
            lifts: _,
            clock_us: _,
            // Cleared when the session parks.
            tx_since: _,
            // Cleared after each client frame.
            frame_marks: _,
        } = self;
        replies.is_empty()
            && !replies.is_unsynced()
            && actions.is_empty()
            && *phase == Phase::Ready
            && acquire_error.is_none()
            && param_desc.is_none()
            && tx.is_blank()
            && retry.is_blank()
    }
}

/// Counts of what one client has done since the driver last took them (`take_tally`, after
/// feeding server frames: a count means a query or transaction ended), for its pool's
/// figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// The client's requests answered (its ReadyForQuery frames).
    pub(crate) queries: u32,
    /// Of those, the ones that left the transaction idle (autocommit statements and
    /// transaction ends).
    pub(crate) xacts: u32,
    /// Binds of statements of the shared cache.
    pub(crate) binds: u32,
    /// Errors PostgreSQL returned to the client, by SQLSTATE class (count 0: a free
    /// slot). More distinct classes than slots in one tally (rare: the driver takes it
    /// after every read) count under the last.
    pub(crate) error_classes: [([u8; 2], u8); Tally::ERROR_SLOTS],
}

impl Tally {
    /// Error classes one tally holds apart.
    pub(crate) const ERROR_SLOTS: usize = 3;

    /// An error of SQLSTATE `code` went to the client.
    pub(crate) fn error(&mut self, code: &[u8]) {
        let class = [code.first().copied().unwrap_or(b'?'), code.get(1).copied().unwrap_or(b'?')];
        let slots = &mut self.error_classes;
        let i = slots.iter().position(|(c, n)| *n == 0 || *c == class).unwrap_or(Self::ERROR_SLOTS - 1);
        if slots[i].1 == 0 {
            slots[i].0 = class;
        }
        slots[i].1 = slots[i].1.saturating_add(1);
    }

    /// Whether an error was counted.
    pub(crate) fn has_errors(&self) -> bool {
        self.error_classes[0].1 > 0
    }

    /// The error classes counted, each with its count.
    pub(crate) fn errors(&self) -> impl Iterator<Item = ([u8; 2], u32)> + '_ {
        self.error_classes.iter().filter(|(_, n)| *n > 0).map(|(c, n)| (*c, u32::from(*n)))
    }
}

impl Session {
    /// A session in `mode` whose client expects `settings`. With a `registry`, prepared
    /// statements go through the shared cache; without, they pass through.
    pub fn new(mode: PoolMode, settings: Arc<Settings>, uid: u64, registry: Option<Arc<Registry>>) -> Session {
        Session {
            to_client: BytesMut::new(),
            to_server: BytesMut::new(),
            link: Link::Unlinked,
            kept: Kept {
                mode,
                settings,
                uid,
                tally: Tally::default(),
                read_split: false,
                defer_begin: false,
                pins: pins::Pins::default(),
            },
            stmts: Box::new(ClientStmts::new(registry)),
            busy: Busy::default(),
        }
    }

    // ---- A: getters ----

    /// The reply queue's storage when it is empty, for a client going idle (the driver
    /// recycles it with the IO buffers; an idle client keeps none).
    pub(crate) fn take_idle_storage(&mut self) -> Option<VecDeque<reply_queue::Pending>> {
        self.busy.replies.take_storage()
    }
    /// Storage for the reply queue of a client becoming active, if it has none: `get`
    /// supplies it (called only then).
    pub(crate) fn lend_storage(&mut self, get: impl FnOnce() -> Option<VecDeque<reply_queue::Pending>>) {
        self.busy.replies.lend_storage(get)
    }
    /// A server is linked.
    pub(crate) fn is_linked(&self) -> bool {
        self.link.is_linked()
    }
    /// Waiting for the pool.
    pub(crate) fn is_acquiring(&self) -> bool {
        self.link == Link::Acquiring
    }
    /// Linked, inside a transaction, with nothing outstanding: the client is idle in a transaction.
    pub(crate) fn is_idle_in_transaction(&self) -> bool {
        self.link.is_linked() && self.busy.replies.is_empty() && self.busy.tx.status != TxStatus::Idle
    }
    /// Requests outstanding on the linked server.
    pub(crate) fn outstanding(&self) -> usize {
        self.busy.replies.len()
    }
    /// The client's settings.
    #[cfg(test)]
    pub(crate) fn settings(&self) -> &Settings {
        &self.kept.settings
    }
    /// What the client did since the last call (see `Tally`); None if nothing ended.
    pub(crate) fn take_tally(&mut self) -> Option<Tally> {
        (self.kept.tally.queries > 0 || self.kept.tally.binds > 0 || self.kept.tally.has_errors())
            .then(|| std::mem::take(&mut self.kept.tally))
    }
    /// Pinned to its server connection (see the field).
    pub(crate) fn is_pinned(&self) -> bool {
        self.kept.pins.holds()
    }
    /// Prepared statements the client holds.
    pub(crate) fn prepared_count(&self) -> usize {
        self.stmts.named.len()
    }
    /// The client is inside a transaction block (or a failed one).
    pub(crate) fn in_transaction(&self) -> bool {
        self.busy.tx.status != TxStatus::Idle
    }
    /// The session is closing: feed nothing more.
    pub(crate) fn is_closing(&self) -> bool {
        self.busy.phase == Phase::Closing
    }
    /// Frames queued to be fed before the client's next ones (a retry, an autoprepared
    /// Query): the driver stops feeding after the frame that queued them.
    pub(crate) fn has_replay(&self) -> bool {
        self.busy.retry.has_replay()
    }
    /// Those frames (`has_replay`), taken.
    pub(crate) fn take_replay(&mut self) -> Option<Vec<u8>> {
        self.busy.retry.take_replay()
    }
    /// Actions are waiting for the driver.
    pub(crate) fn has_actions(&self) -> bool {
        !self.busy.actions.is_empty()
    }

    /// The linked server is not to be reused when `yes` (`LinkState::dirty`).
    fn dirty_server_if(&mut self, yes: bool) {
        if yes && let Some(l) = self.link.state_mut() {
            l.dirty = true;
        }
    }

    /// Enters phase `p` from `Ready`; a closing session stays closing.
    fn enter(&mut self, p: Phase) {
        debug_assert!(
            matches!(self.busy.phase, Phase::Ready | Phase::Closing) || self.busy.phase == p,
            "{:?} -> {p:?}",
            self.busy.phase
        );
        if self.busy.phase != Phase::Closing {
            self.busy.phase = p;
        }
    }

    /// Leaves phase `p` for `Ready`, if the session is in it.
    fn leave(&mut self, p: Phase) {
        if self.busy.phase == p {
            self.busy.phase = Phase::Ready;
        }
    }

    // ---- D: outputs ----

    /// Next action for the driver; call until None after every input.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.busy.actions.pop_front()
    }

    /// Logs what the session wrote to either side since the buffers had these lengths.
    fn trace_output(&self, to_s: usize, to_c: usize) {
        if let Some(out) = self.to_server.get(to_s..) {
            wire_trace::frames(self.kept.uid, "  >server", true, out);
        }
        if let Some(out) = self.to_client.get(to_c..) {
            wire_trace::frames(self.kept.uid, "  >client", false, out);
        }
    }
}
