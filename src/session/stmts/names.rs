//! The client's named statements: one map entry per name, holding the shared statement and
//! what the client's own view of it says beyond it (`view::Shown`: its text, origin and
//! time; the characters before a `PREPARE`'s definition, for error positions).
//!
//! One map, not one per fact: every idle client that prepared something carries it
//! (docs/benchmarks.md "Idle clients"), and each map is a table allocation and a copy of
//! every name. Owns nothing but the map; which names a message may define or drop is the
//! handlers' (`parse`, `portal`, `sql`, `script`).

use super::view::Shown;
use crate::stmt::Statement;
use std::collections::HashMap;
use std::sync::Arc;

/// One of the client's names: the statement it holds, and how the view shows it.
#[derive(Clone, Debug)]
pub(crate) struct Named {
    pub(in crate::session) stmt: Arc<Statement>,
    pub(in crate::session) shown: Shown,
}

/// The client's named statements, by name.
#[derive(Clone, Debug, Default)]
pub(crate) struct NamedStmts(HashMap<Box<[u8]>, Named>);

impl NamedStmts {
    /// The statement `name` holds.
    pub(in crate::session) fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.0.get(name).map(|n| &n.stmt)
    }

    /// The whole entry of `name`.
    pub(in crate::session) fn entry(&self, name: &[u8]) -> Option<&Named> {
        self.0.get(name)
    }

    pub(in crate::session) fn contains_key(&self, name: &[u8]) -> bool {
        self.0.contains_key(name)
    }

    pub(in crate::session) fn len(&self) -> usize {
        self.0.len()
    }

    pub(in crate::session) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(in crate::session) fn clear(&mut self) {
        self.0.clear();
    }

    /// `name` now holds `stmt`, shown as `shown`.
    pub(in crate::session) fn insert(&mut self, name: Box<[u8]>, stmt: Arc<Statement>, shown: Shown) {
        self.0.insert(name, Named { stmt, shown });
    }

    /// An entry taken out earlier comes back (an undo).
    pub(in crate::session) fn restore(&mut self, name: Box<[u8]>, named: Named) {
        self.0.insert(name, named);
    }

    /// Entries taken out together come back (the undo of a `DEALLOCATE ALL`).
    pub(in crate::session) fn restore_all(&mut self, saved: NamedStmts) {
        self.0.extend(saved.0);
    }

    pub(in crate::session) fn remove(&mut self, name: &[u8]) -> Option<Named> {
        self.0.remove(name)
    }

    pub(in crate::session) fn iter(&self) -> impl Iterator<Item = (&[u8], &Named)> {
        self.0.iter().map(|(k, v)| (&**k, v))
    }

    /// Every statement held, to point some elsewhere (`ClientStmts::remap`).
    pub(in crate::session) fn statements_mut(&mut self) -> impl Iterator<Item = &mut Arc<Statement>> {
        self.0.values_mut().map(|n| &mut n.stmt)
    }
}

/// What a client that prepared something keeps while idle, boxed in its parked session
/// (`session::park`): the names' facts are one map, not three (each map costs its table
/// allocation and a copy of every name; 1.77 against 2.0 KiB per idle prepared client).
#[cfg(test)]
mod size {
    #[test]
    fn a_clients_statements_hold_one_map_of_names() {
        let stmts = std::mem::size_of::<super::super::ClientStmts>();
        let entry = std::mem::size_of::<super::Named>();
        eprintln!("ClientStmts {stmts} B, a name's entry {entry} B");
        assert!(entry <= 40, "a name's entry is {entry} B");
        assert!(stmts <= 280, "ClientStmts is {stmts} B");
    }
}
