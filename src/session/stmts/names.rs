//! The client's named statements: one entry per name, holding the shared statement and
//! what the client's own view of it says beyond it (`view::Shown`: its text, origin and
//! time; the characters before a `PREPARE`'s definition, for error positions).
//!
//! One collection, not one per fact, and a short list rather than a hash table while the
//! names are few: every idle client that prepared something carries it (docs/benchmarks.md
//! "Idle clients"), and each map is a table allocation and a copy of every name. Owns
//! nothing but the collection; which names a message may define or drop is the handlers'
//! (`parse`, `portal`, `sql`, `script`).

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

/// The client's named statements, by name: a short list while the client holds few (a
/// lookup compares a few short names, and one name costs one small allocation instead of
/// a hash table's four buckets), a map past `FEW`.
#[derive(Clone, Debug, Default)]
pub(crate) struct NamedStmts(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Few(Vec<(Box<[u8]>, Named)>),
    Many(HashMap<Box<[u8]>, Named>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Few(Vec::new())
    }
}

/// How many names the list holds before it becomes a map.
const FEW: usize = 8;

impl NamedStmts {
    /// The statement `name` holds.
    pub(in crate::session) fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.entry(name).map(|n| &n.stmt)
    }

    /// The whole entry of `name`.
    pub(in crate::session) fn entry(&self, name: &[u8]) -> Option<&Named> {
        match &self.0 {
            Repr::Few(v) => v.iter().find(|(k, _)| **k == *name).map(|(_, n)| n),
            Repr::Many(m) => m.get(name),
        }
    }

    pub(in crate::session) fn contains_key(&self, name: &[u8]) -> bool {
        self.entry(name).is_some()
    }

    pub(in crate::session) fn len(&self) -> usize {
        match &self.0 {
            Repr::Few(v) => v.len(),
            Repr::Many(m) => m.len(),
        }
    }

    pub(in crate::session) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every name, and the room they took.
    pub(in crate::session) fn clear(&mut self) {
        self.0 = Repr::default();
    }

    /// `name` now holds `stmt`, shown as `shown`.
    pub(in crate::session) fn insert(&mut self, name: Box<[u8]>, stmt: Arc<Statement>, shown: Shown) {
        self.restore(name, Named { stmt, shown });
    }

    /// An entry taken out earlier comes back (an undo); also what `insert` does.
    pub(in crate::session) fn restore(&mut self, name: Box<[u8]>, named: Named) {
        match &mut self.0 {
            Repr::Few(v) => {
                if let Some((_, n)) = v.iter_mut().find(|(k, _)| *k == name) {
                    *n = named;
                } else if v.len() < FEW {
                    // One name at a time: a client with one statement holds room for one.
                    v.reserve_exact(1);
                    v.push((name, named));
                } else {
                    let mut m: HashMap<Box<[u8]>, Named> = std::mem::take(v).into_iter().collect();
                    m.insert(name, named);
                    self.0 = Repr::Many(m);
                }
            }
            Repr::Many(m) => {
                m.insert(name, named);
            }
        }
    }

    /// Entries taken out together come back (the undo of a `DEALLOCATE ALL`).
    pub(in crate::session) fn restore_all(&mut self, saved: NamedStmts) {
        match saved.0 {
            Repr::Few(v) => v.into_iter().for_each(|(k, n)| self.restore(k, n)),
            Repr::Many(m) => m.into_iter().for_each(|(k, n)| self.restore(k, n)),
        }
    }

    pub(in crate::session) fn remove(&mut self, name: &[u8]) -> Option<Named> {
        match &mut self.0 {
            Repr::Few(v) => {
                let at = v.iter().position(|(k, _)| **k == *name)?;
                Some(v.swap_remove(at).1)
            }
            Repr::Many(m) => m.remove(name),
        }
    }

    pub(in crate::session) fn iter(&self) -> Box<dyn Iterator<Item = (&[u8], &Named)> + '_> {
        match &self.0 {
            Repr::Few(v) => Box::new(v.iter().map(|(k, n)| (&**k, n))),
            Repr::Many(m) => Box::new(m.iter().map(|(k, n)| (&**k, n))),
        }
    }

    /// Every statement held, to point some elsewhere (`ClientStmts::remap`).
    pub(in crate::session) fn for_each_statement(&mut self, mut f: impl FnMut(&mut Arc<Statement>)) {
        match &mut self.0 {
            Repr::Few(v) => v.iter_mut().for_each(|(_, n)| f(&mut n.stmt)),
            Repr::Many(m) => m.values_mut().for_each(|n| f(&mut n.stmt)),
        }
    }
}

/// A client's statements hold its names' facts in one collection, not three maps (each map
/// cost its table allocation and a copy of every name, 96 B of `ClientStmts` besides): with
/// the names parked alone (`session::park`), 1.32 against 2.0 KiB per additional idle
/// prepared-statement client (docs/benchmarks.md).
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

#[cfg(test)]
mod tests {
    use super::{FEW, NamedStmts, Shown};
    use crate::stmt::registry::{Registry, StmtConfig, StmtKind};
    use std::sync::Arc;

    fn names(n: usize) -> (NamedStmts, Vec<Arc<crate::stmt::Statement>>) {
        let r = Registry::new(StmtConfig::default());
        let mut m = NamedStmts::default();
        let mut all = Vec::new();
        for i in 0..n {
            let q = format!("SELECT {i}");
            let s = r.get_or_insert(q.as_bytes(), StmtKind::Protocol, q.as_bytes(), b"");
            m.insert(format!("s{i}").into_bytes().into(), s.clone(), Shown::parsed(None, i as u64));
            all.push(s);
        }
        (m, all)
    }

    #[test]
    fn names_are_found_in_the_list_and_in_the_map_it_becomes() {
        for n in [1, FEW, FEW + 1, 3 * FEW] {
            let (mut m, all) = names(n);
            assert_eq!(m.len(), n);
            for (i, s) in all.iter().enumerate() {
                let got = m.get(format!("s{i}").as_bytes()).expect("a name inserted is found");
                assert!(Arc::ptr_eq(got, s), "s{i} holds its own statement");
            }
            assert!(m.get(b"missing").is_none());
            // A name defined again holds the new statement, and is counted once.
            m.insert(b"s0"[..].into(), all[n - 1].clone(), Shown::parsed(None, 0));
            assert_eq!(m.len(), n);
            assert!(Arc::ptr_eq(m.get(b"s0").unwrap(), &all[n - 1]));
            let gone = m.remove(b"s0").expect("removed");
            assert!(Arc::ptr_eq(&gone.stmt, &all[n - 1]));
            assert_eq!(m.len(), n - 1);
            assert!(!m.contains_key(b"s0"));
            m.restore(b"s0"[..].into(), gone);
            assert_eq!(m.iter().count(), n);
        }
    }

    #[test]
    fn names_taken_out_together_come_back_together() {
        let (mut m, _) = names(FEW + 2);
        let saved = std::mem::take(&mut m);
        assert!(m.is_empty());
        m.insert(b"other"[..].into(), saved.get(b"s1").unwrap().clone(), Shown::parsed(None, 0));
        m.restore_all(saved);
        assert_eq!(m.len(), FEW + 3);
        m.clear();
        assert!(m.is_empty() && m.get(b"s1").is_none());
    }
}
