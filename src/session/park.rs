//! Parking an idle session: what a client with no server, no request in flight and nothing
//! to write must keep (its settings, its prepared statements, its counts) is moved into a
//! small [`Parked`] value, and the rest of the session (reply queue, output buffers,
//! transaction and retry state: most of its size) is left blank, for the driver to reuse for
//! whichever client becomes active next. An idle client then holds only the `Parked`.
//!
//! The halves are types of their own (`Kept`, `Busy` in the parent module): parking moves
//! the `Kept` out whole. Owns the line between the two: `at_rest` says when nothing of the
//! busy half would be lost. Must not touch sockets or free lists; the driver keeps the blank sessions.

use super::stmts::names::NamedStmts;
use super::stmts::{ClientStmts, Unnamed};
use super::{Kept, Link, Session};
use crate::stmt::idmap::IdSet;
use crate::stmt::{Registry, Statement};
use std::sync::Arc;

/// What an idle client keeps of its session (see the module doc).
#[derive(Debug)]
pub struct Parked {
    kept: Kept,
    stmts: ParkedStmts,
}

/// An idle client's prepared statements: without any (the client sends simple Queries, or
/// only unnamed statements it has closed), two words; otherwise all of them, boxed.
/// Autoprepare's lift templates are not the client's: they stay with the busy half
/// (`Busy::lifts`).
#[derive(Debug)]
enum ParkedStmts {
    None {
        registry: Option<Arc<Registry>>,
        unnamed_seq: u64,
    },
    /// Nothing but a plain unnamed statement (its frame and the shape the client was told):
    /// what a client of the extended protocol without named statements keeps, in a box of
    /// its own instead of a whole set of statements.
    Unnamed(Box<ParkedUnnamed>),
    /// Nothing but an unnamed statement the cache serves (a `-M extended` client of
    /// promoted statements): the statement and whether the client was told its rows, in
    /// four words.
    Cached(Box<ParkedCached>),
    /// Named statements, the descriptions given and the unnamed statement, if any (boxed
    /// apart: the pgx, asyncpg, pgjdbc, `-M prepared` client has none; psycopg, which parses
    /// unnamed below its prepare threshold, has one), nothing else: a third of a whole set's
    /// box.
    Named(Box<ParkedNamed>),
    Some(Box<ClientStmts>),
}

/// See `ParkedStmts::Named`.
#[derive(Debug)]
struct ParkedNamed {
    registry: Option<Arc<Registry>>,
    unnamed_seq: u64,
    named: NamedStmts,
    described: IdSet,
    unnamed: Option<Box<Unnamed>>,
}

/// See `ParkedStmts::Cached`.
#[derive(Debug)]
struct ParkedCached {
    registry: Option<Arc<Registry>>,
    unnamed_seq: u64,
    stmt: Arc<Statement>,
    described: bool,
}

/// See `ParkedStmts::Unnamed`.
#[derive(Debug)]
struct ParkedUnnamed {
    registry: Option<Arc<Registry>>,
    unnamed_seq: u64,
    unnamed: Unnamed,
}

impl Session {
    /// Nothing of the busy half would be lost by parking: no server linked or coming,
    /// nothing to write, not pinned to a server, and the busy part blank (`Busy::is_blank`).
    pub(crate) fn at_rest(&self) -> bool {
        self.link == Link::Unlinked
            && self.to_client.is_empty()
            && self.to_server.is_empty()
            && !self.kept.pins.holds()
            && self.busy.is_blank()
    }

    /// Parks an idle session (`at_rest`): what the client keeps is moved out and returned,
    /// and this session is left blank, ready for `unpark`. None (and nothing changes) when
    /// the session is not at rest.
    pub fn park(&mut self) -> Option<Parked> {
        if !self.at_rest() {
            return None;
        }
        self.busy.retry.forget_last_batch();
        // Nothing is held (`to_client` is empty): no server answer is waited for either.
        self.release_held();
        // Portals end with their transaction: none is left to describe.
        self.stmts.forget_portals();
        // Nothing is in flight at rest.
        self.stmts.guard_in_flight = false;
        // What the last link was (a read pool's) is set afresh at the next one.
        self.busy.wants_reads = false;
        self.busy.tx_since = None;
        let stmts = if let Some(stmt) = self.stmts.take_only_cached_unnamed() {
            let described = self.stmts.described.contains(&stmt.id);
            // Any other description is moot (see below); the busy half keeps the set's room
            // for its next client.
            self.stmts.described.clear();
            ParkedStmts::Cached(Box::new(ParkedCached {
                registry: self.stmts.registry.take(),
                unnamed_seq: std::mem::take(&mut self.stmts.unnamed_seq),
                stmt,
                described,
            }))
        } else if self.stmts.holds_only_names() {
            ParkedStmts::Named(Box::new(ParkedNamed {
                registry: self.stmts.registry.take(),
                unnamed_seq: std::mem::take(&mut self.stmts.unnamed_seq),
                named: std::mem::take(&mut self.stmts.named),
                described: std::mem::take(&mut self.stmts.described),
                unnamed: match std::mem::take(&mut self.stmts.unnamed) {
                    Unnamed::None => None,
                    unnamed => Some(Box::new(unnamed)),
                },
            }))
        } else if self.stmts.holds_only_unnamed() {
            // With no named statement and no cached unnamed one, the descriptions the
            // client was given are of statements it can no longer name without a Parse,
            // which forgets them anyway.
            self.stmts.described.clear();
            let registry = self.stmts.registry.take();
            let unnamed_seq = std::mem::take(&mut self.stmts.unnamed_seq);
            match std::mem::take(&mut self.stmts.unnamed) {
                Unnamed::None => ParkedStmts::None { registry, unnamed_seq },
                unnamed => ParkedStmts::Unnamed(Box::new(ParkedUnnamed { registry, unnamed_seq, unnamed })),
            }
        } else {
            // The spare box (a blank set of statements) takes the place of the client's.
            let spare = self.busy.spare_stmts.take().unwrap_or_default();
            ParkedStmts::Some(std::mem::replace(&mut self.stmts, spare))
        };
        Some(Parked { kept: self.kept.take(), stmts })
    }

    /// Makes this blank session (one `park` left, or `unparked` made) the session of the
    /// client that parked `p`.
    pub fn unpark(&mut self, p: Parked) {
        debug_assert!(self.at_rest() && self.stmts.holds_nothing());
        self.kept = p.kept;
        match p.stmts {
            ParkedStmts::None { registry, unnamed_seq } => {
                self.stmts.registry = registry;
                self.stmts.unnamed_seq = unnamed_seq;
            }
            ParkedStmts::Unnamed(u) => {
                let ParkedUnnamed { registry, unnamed_seq, unnamed } = *u;
                self.stmts.registry = registry;
                self.stmts.unnamed_seq = unnamed_seq;
                self.stmts.unnamed = unnamed;
            }
            ParkedStmts::Cached(c) => {
                let ParkedCached { registry, unnamed_seq, stmt, described } = *c;
                if described {
                    self.stmts.described.insert(stmt.id);
                }
                self.stmts.registry = registry;
                self.stmts.unnamed_seq = unnamed_seq;
                self.stmts.unnamed = Unnamed::Cached(stmt);
            }
            ParkedStmts::Named(n) => {
                let ParkedNamed { registry, unnamed_seq, named, described, unnamed } = *n;
                self.stmts.registry = registry;
                self.stmts.unnamed_seq = unnamed_seq;
                self.stmts.named = named;
                self.stmts.described = described;
                self.stmts.unnamed = unnamed.map(|u| *u).unwrap_or_default();
            }
            ParkedStmts::Some(b) => {
                // The blank statements stay as the spare: the next client to park keeps
                // its own in their place.
                let blank = std::mem::replace(&mut self.stmts, b);
                if self.busy.spare_stmts.is_none() {
                    self.busy.spare_stmts = Some(blank);
                }
            }
        }
    }

    /// Tests: `p` keeps nothing of its statements but its unnamed one (`ParkedStmts::Unnamed`).
    #[cfg(test)]
    pub(crate) fn parked_unnamed_only(p: &Parked) -> bool {
        matches!(p.stmts, ParkedStmts::Unnamed(_) | ParkedStmts::Cached(_))
    }

    /// Tests: `p` keeps only an unnamed statement the cache serves (`ParkedStmts::Cached`).
    #[cfg(test)]
    pub(crate) fn parked_cached_unnamed(p: &Parked) -> bool {
        matches!(p.stmts, ParkedStmts::Cached(_))
    }

    /// Tests: `p` keeps named statements and descriptions only (`ParkedStmts::Named`).
    #[cfg(test)]
    pub(crate) fn parked_names_only(p: &Parked) -> bool {
        matches!(p.stmts, ParkedStmts::Named(_))
    }

    /// A new session for the client that parked `p` (when no blank one is at hand).
    pub fn unparked(p: Parked) -> Session {
        let mut s = Session::new(p.kept.mode, p.kept.settings.clone(), p.kept.uid, None);
        s.unpark(p);
        s
    }
}

impl ClientStmts {
    /// Forgets the portals the client bound: they end with their transaction, so none is
    /// left to describe or time.
    pub(super) fn forget_portals(&mut self) {
        self.last_bind = None;
        self.last_plain = None;
        self.as_sent_next = None;
    }

    /// Nothing but the registry and the Parse sequence: no named, unnamed or SQL-level
    /// statement, nothing described or remembered about one.
    pub(super) fn holds_nothing(&self) -> bool {
        matches!(self.unnamed, Unnamed::None) && self.described.is_empty() && self.holds_only_unnamed()
    }

    /// The unnamed statement, taken, when it is one the cache serves and the client holds
    /// nothing else (`holds_only_unnamed`).
    fn take_only_cached_unnamed(&mut self) -> Option<Arc<Statement>> {
        if !self.holds_only_unnamed() {
            return None;
        }
        match std::mem::take(&mut self.unnamed) {
            Unnamed::Cached(s) => Some(s),
            other => {
                self.unnamed = other;
                None
            }
        }
    }

    /// Nothing but the registry, the Parse sequence, the unnamed statement and the
    /// descriptions given (`ParkedStmts::Cached`, `Unnamed` or `None`).
    fn holds_only_unnamed(&self) -> bool {
        self.named.is_empty() && self.holds_no_extras()
    }

    /// Nothing but the registry, the Parse sequence, named statements, the descriptions
    /// given and the unnamed statement (`ParkedStmts::Named`).
    fn holds_only_names(&self) -> bool {
        !self.named.is_empty() && self.holds_no_extras()
    }

    /// None of what a set of statements holds beyond the registry, the Parse sequence, the
    /// names, the unnamed statement and the descriptions given.
    fn holds_no_extras(&self) -> bool {
        self.last_bind.is_none()
            && self.last_plain.is_none()
            && self.as_sent_next.is_none()
            && self.dealloc_portal.is_none()
            && self.shape_mismatch.is_none()
            && self.fresh_in_tx.is_none()
            && self.fresh_sql.is_none()
            && self.listen.is_none()
            && !self.pipelines_in_block
    }
}

#[cfg(test)]
mod tests {
    /// The names' box stays a third of a whole set's: the unnamed statement sits in a box of
    /// its own when there is one, a word when there is none.
    #[test]
    fn the_names_box_holds_the_unnamed_statement_in_a_word() {
        let named = std::mem::size_of::<super::ParkedNamed>();
        let whole = std::mem::size_of::<super::ClientStmts>();
        assert!(named <= 104, "{named} B");
        assert!(named * 5 / 2 <= whole, "{named} B against a whole set's {whole} B");
    }
}
