//! Autoprepare: a simple Query holding one data statement, outside a transaction block,
//! runs as a cached statement. Its numeric literals are lifted into typed parameters
//! (`stmt::lift`), and the Query becomes the extended-protocol batch a driver would send
//! for it (Parse of the lifted text, Bind of the literals as text, Describe of the portal,
//! Execute, Sync), fed through the session like the client's own frames: the unnamed
//! statement's promotion (counted by `autoprepare_after`) caches it, the shape guard and
//! the transparent retry after a stale plan apply as they do to any unnamed statement.
//! Inside a transaction block the cache serves only statements that need no savepoint
//! guard there (`parse::lookup_unnamed`: those that return nothing, or are parsed afresh);
//! a Query whose kept template's statement returns rows goes as it is, as the batch
//! would cost more than the Query.
//! The client sees the replies of its simple Query: the batch's ParseComplete,
//! BindComplete and NoData are dropped (`Pending::simple`), errors are mapped back to its
//! text (positions, and a lifted literal's placeholder quoted in a message: `Origin`), and
//! the unnamed statement the batch used is not the client's.
use crate::protocol::frontend;
use crate::session::Session;
use crate::state::{ServerState, TxStatus};
use crate::stmt::lift::template::{Applied, Template, prefix_key};
use crate::stmt::lift::{Lifted, Origin, lift};
use bytes::BytesMut;
use std::sync::Arc;

/// An autoprepared Query whose frames are being fed.
#[derive(Debug)]
pub(in crate::session) struct AutoPrep {
    /// Frames of the batch still to be consumed.
    pub(in crate::session) frames_left: u8,
    /// How the lifted text maps back to the client's (for its errors).
    pub(in crate::session) origin: Arc<Origin>,
    /// The reply queue's push count when the frame being fed began.
    pushes_before: u32,
}

/// Lifts made for the Queries of the clients a busy half served (`Busy::lifts`), reused for
/// any next text that differs only in its integers (`stmt::lift::template`): the most
/// recent first, at most `MEMO_TEMPLATES`. A template is a fact about texts, whoever sends
/// them; what its lifted text was found cached as (`Kept::known`) is checked against the
/// registry and search_path of the client using it.
#[derive(Debug, Default)]
pub(in crate::session) struct Memo {
    /// Boxed: moved to the front when used, a pointer is all that moves.
    #[allow(clippy::vec_box)]
    pub(super) templates: Vec<Box<Kept>>,
    /// What `find` found: the lift of the text by `templates[0]`.
    pub(super) applied: Applied,
    /// The origin last handed out (`origin_for`), filled again once nobody holds it.
    origin: Arc<Origin>,
    /// The Query just handled was bound directly (`fastbind`): nothing of a simple Query
    /// reached the server (its unnamed statement is still there).
    pub(super) bound: bool,
    /// Tests: never bind directly (the batch is always fed as frames).
    #[cfg(test)]
    pub(in crate::session) frames_only: bool,
    /// Tests: Queries bound directly.
    #[cfg(test)]
    pub(in crate::session) fast_binds: u32,
}

/// A kept template, and the cached statement its lifted text was last found as.
#[derive(Debug)]
pub(super) struct Kept {
    pub(super) t: Template,
    pub(super) known: Option<super::fastbind::Known>,
}

/// Templates a busy half keeps: room for the shapes of an application's Queries.
const MEMO_TEMPLATES: usize = 16;
/// Texts longer than this are lifted every time (the template keeps a copy).
const MEMO_TEXT_MAX: usize = 4096;

impl Memo {
    /// Tests: a memo whose Queries are (`frames_only`) never bound directly.
    #[cfg(test)]
    pub(in crate::session) fn with_frames_only(frames_only: bool) -> Memo {
        Memo { frames_only, ..Default::default() }
    }

    /// Templates kept.
    #[cfg(test)]
    pub(in crate::session) fn len(&self) -> usize {
        self.templates.len()
    }

    /// Whether a kept template takes `text`: then it is moved to the front, and its lift
    /// of `text` is in `applied`.
    fn find(&mut self, text: &[u8], escapes_everywhere: bool) -> bool {
        if self.templates.is_empty() {
            return false;
        }
        let key = prefix_key(text);
        let Some(k) = self
            .templates
            .iter()
            .position(|t| t.t.key == key && t.t.apply_into(text, escapes_everywhere, &mut self.applied))
        else {
            return false;
        };
        self.templates[..=k].rotate_right(1);
        true
    }

    /// The origin of `text` by `applied`, in the storage of the one handed out last when
    /// nobody holds that any more (no allocation for a client repeating its queries).
    pub(super) fn origin_for(&mut self, text: &[u8]) -> Arc<Origin> {
        if Arc::get_mut(&mut self.origin).is_none() {
            self.origin = Arc::default();
        }
        if let Some(o) = Arc::get_mut(&mut self.origin) {
            self.applied.origin_into(text, o);
        }
        self.origin.clone()
    }

    /// Keeps the template of `l` (lifted from `text`), if it makes one, at the front.
    fn insert(&mut self, text: &[u8], l: &Lifted, escapes_everywhere: bool) {
        if text.len() > MEMO_TEXT_MAX {
            return;
        }
        let Some(t) = Template::new(text, l, escapes_everywhere) else { return };
        self.templates.truncate(MEMO_TEMPLATES - 1);
        self.templates.insert(0, Box::new(Kept { t, known: None }));
    }

    /// See the field `bound` (cleared).
    pub(in crate::session) fn take_bound(&mut self) -> bool {
        std::mem::take(&mut self.bound)
    }
}

/// Frames in the batch an autoprepared Query becomes.
const FRAMES: u8 = 5;

impl Session {
    /// A simple Query (`text`) with the cache on and no server work outstanding (but a
    /// link's preamble: a transaction's first statement goes with its deferred BEGIN), on the
    /// linked `srv`: if autoprepare applies, the batch it becomes is either bound directly
    /// (`fastbind`: written to the server and queued, `Memo::bound` set) or queued to be fed
    /// (`take_replay`: nothing was sent), and true is returned.
    pub(in crate::session) fn try_autoprepare(&mut self, text: &[u8], srv: &mut ServerState) -> bool {
        let Some(registry) = self.stmts.registry.as_ref() else { return false };
        if !registry.cfg.autoprepare
            // Inside a transaction block, see `serves_in_block`. (In a failed block the
            // server refuses anything, and its error is PostgreSQL's own.)
            || !matches!(self.busy.tx.status, TxStatus::Idle | TxStatus::InBlock)
            || !self.busy.replies.only_link_preamble()
            || self.busy.replies.is_unsynced()
            || self.busy.retry.replay.is_some()
            || self.busy.retry.autoprep.is_some()
        {
            return false;
        }
        let escapes_everywhere = self.kept.settings.reported("standard_conforming_strings") == Some("off");
        // Out of `self` while it is used (put back below).
        let mut memo = self.busy.lifts.take().unwrap_or_default();
        let done = self.autoprepare_with(&mut memo, text, escapes_everywhere, srv);
        self.busy.lifts = Some(memo);
        done
    }

    /// `try_autoprepare` with the client's lifts `memo`.
    fn autoprepare_with(
        &mut self,
        memo: &mut Memo,
        text: &[u8],
        escapes_everywhere: bool,
        srv: &mut ServerState,
    ) -> bool {
        // Lifted afresh (None when a template was reused): the lift, and its types as a
        // Parse carries them.
        let fresh: Option<(Lifted, Vec<u8>)>;
        let origin = if memo.find(text, escapes_everywhere) {
            if self.busy.tx.status == TxStatus::InBlock && !self.serves_in_block_lifted(memo) {
                // The cache would not serve it here: the Query costs less as it is.
                return false;
            }
            if self.bind_fast(memo, text, srv) {
                memo.bound = true;
                #[cfg(test)]
                {
                    memo.fast_binds += 1;
                }
                return true;
            }
            fresh = None;
            memo.origin_for(text)
        } else {
            let Some(l) = lift(text, escapes_everywhere) else { return false };
            let origin = Arc::new(Origin::new(text, &l));
            memo.insert(text, &l, escapes_everywhere);
            let mut types = Vec::with_capacity(4 * l.types.len());
            for t in &l.types {
                types.extend_from_slice(&t.to_be_bytes());
            }
            fresh = Some((l, types));
            origin
        };
        let (ltext, ltypes, values): (&[u8], &[u8], &[std::ops::Range<usize>]) = match &fresh {
            Some((l, ty)) => (&l.text, ty, &l.values),
            None => {
                let t = &memo.templates[0].t;
                (&t.text, &t.type_bytes, &memo.applied.values)
            }
        };
        let mut f = BytesMut::with_capacity(ltext.len() + 64 + 8 * values.len());
        frontend::parse(&mut f, b"", ltext, ltypes);
        frontend::bind_text_with(&mut f, b"", b"", values.len(), values.iter().map(|r| &text[r.clone()]));
        frontend::describe_portal(&mut f, b"");
        frontend::execute(&mut f, b"");
        frontend::sync(&mut f);
        self.busy.retry.replay = Some(Box::new(f.to_vec()));
        // One more: the Query's own frame is counted out first (`autoprep_after_frame`).
        let frames_left = FRAMES + 1;
        self.busy.retry.autoprep = Some(Box::new(AutoPrep { frames_left, origin, pushes_before: 0 }));
        true
    }

    /// Inside a transaction block, whether the cache may serve the lifted text of
    /// `memo.templates[0]` (`guard`'s `serves_in_block`): unless the registry holds its
    /// statement and it may not serve it there, the batch is worth feeding. Not yet
    /// promoted, it is a sighting towards that. (Asked before `bind_fast`, whose own lookup
    /// then finds the statement this one kept.)
    fn serves_in_block_lifted(&mut self, memo: &mut Memo) -> bool {
        let Some(registry) = self.stmts.registry.clone() else { return false };
        self.known_statement(memo, &registry).is_none_or(|s| self.serves_in_block(&s, true))
    }

    /// True while an autoprepared Query's frames are fed: what is answered now is part of
    /// it (a ParseComplete the cache makes at once is not the client's).
    pub(in crate::session) fn autoprep_feeding(&self) -> bool {
        self.busy.retry.autoprep.is_some()
    }

    /// Before a client frame is handled.
    #[inline]
    pub(in crate::session) fn autoprep_before_frame(&mut self) {
        if let Some(a) = self.busy.retry.autoprep.as_mut() {
            a.pushes_before = self.busy.replies.pushes;
        }
    }

    /// After a frame was handled: the requests it pushed belong to the autoprepared Query
    /// (`Pending::simple`); one frame less of it; after its Sync, the unnamed statement it
    /// used is not the client's (PostgreSQL has none after a simple Query).
    #[inline]
    pub(in crate::session) fn autoprep_after_frame(&mut self, consumed: bool) {
        let Some(a) = self.busy.retry.autoprep.as_mut() else { return };
        let pushed = self.busy.replies.pushes.wrapping_sub(a.pushes_before) as usize;
        let origin = a.origin.clone();
        let n = self.busy.replies.len();
        for p in self.busy.replies.iter_mut().skip(n.saturating_sub(pushed)) {
            p.simple = Some(origin.clone());
        }
        if !consumed {
            return;
        }
        let Some(a) = self.busy.retry.autoprep.as_mut() else { return };
        a.frames_left = a.frames_left.saturating_sub(1);
        if a.frames_left == 0 {
            self.busy.retry.autoprep = None;
            self.stmts.unnamed = super::Unnamed::None;
        }
    }

    /// A retry replays an autoprepared Query's batch: feed it as one again.
    pub(in crate::session) fn autoprep_replay(&mut self, origin: Arc<Origin>, frames: u8) {
        self.busy.retry.autoprep = Some(Box::new(AutoPrep { frames_left: frames, origin, pushes_before: 0 }));
    }
}
