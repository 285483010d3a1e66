//! Fencing, without IO: which server may be taken as a primary. For each cluster (its
//! `system_identifier`, shared by a primary and the standbys made from it) the newest
//! timeline seen on a read-write server is kept; a server that claims read-write on an
//! older timeline than that is an old primary come back after a failover (a standby
//! promoted meanwhile started a new timeline) and is refused as a primary until an
//! operator says otherwise (`UNFENCE`). The driver (`driver::hosts`) asks the server and
//! calls `check`; the console lists the refusals and clears them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Asks a read-write server for its cluster and its timeline: the system identifier (as
/// text: it is a 64-bit unsigned number) and the timeline of the WAL it writes now (the
/// first 8 hex digits of the current WAL file's name; `pg_control_checkpoint()`'s
/// timeline lags behind a promotion until the next checkpoint).
pub(crate) const FENCE_QUERY: &str = "SELECT (SELECT system_identifier FROM pg_catalog.pg_control_system())::text, \
     ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::int::text";

/// A read-write server seen: where, and on which timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) timeline: u32,
}

/// A host refused as a primary, for the console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fenced {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) system_identifier: String,
    /// Its timeline when last refused.
    pub(crate) timeline: u32,
    /// The newer one seen, and where.
    pub(crate) newest: Seen,
    /// Times it was refused.
    pub(crate) refusals: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per system identifier, the newest timeline seen on a read-write server.
    newest: HashMap<String, Seen>,
    /// The hosts refused, by (host, port).
    fenced: BTreeMap<(String, u16), Fenced>,
}

/// The fencing memory of the process, shared by every pool.
#[derive(Debug, Default)]
pub(crate) struct Fences(Mutex<Inner>, std::sync::atomic::AtomicU64);

impl Fences {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Promotions seen so far: a cluster's read-write server on a newer timeline than the
    /// one seen before. Open connections may then be to a server whose role changed.
    pub(crate) fn promotions(&self) -> u64 {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A server at `host`:`port` claims read-write, in cluster `system_id` on `timeline`.
    /// Ok when no newer timeline of that cluster was seen (it is then the newest); Err with
    /// the newer one when it is an old primary.
    pub(crate) fn check(&self, host: &str, port: u16, system_id: &str, timeline: u32) -> Result<(), Seen> {
        let mut g = self.lock();
        match g.newest.get(system_id) {
            Some(n) if n.timeline > timeline => {
                let newest = n.clone();
                let key = (host.to_owned(), port);
                let f = g.fenced.entry(key).or_insert_with(|| Fenced {
                    host: host.to_owned(),
                    port,
                    system_identifier: system_id.to_owned(),
                    timeline,
                    newest: newest.clone(),
                    refusals: 0,
                });
                f.timeline = timeline;
                f.newest = newest.clone();
                f.refusals += 1;
                Err(newest)
            }
            before => {
                if before.is_some_and(|n| n.timeline < timeline) {
                    self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let seen = Seen { host: host.to_owned(), port, timeline };
                g.newest.insert(system_id.to_owned(), seen);
                g.fenced.remove(&(host.to_owned(), port));
                Ok(())
            }
        }
    }

    /// `UNFENCE`: forgets what was seen of the clusters of the fenced hosts among `hosts`
    /// (all: None), so that the next read-write server of each is taken as it is. The
    /// number of hosts no longer fenced.
    pub(crate) fn unfence(&self, hosts: Option<&[(String, u16)]>) -> usize {
        let mut g = self.lock();
        let chosen: Vec<(String, u16)> =
            g.fenced.keys().filter(|k| hosts.is_none_or(|h| h.contains(k))).cloned().collect();
        for k in &chosen {
            if let Some(f) = g.fenced.remove(k) {
                g.newest.remove(&f.system_identifier);
            }
        }
        if hosts.is_none() {
            g.newest.clear();
        }
        chosen.len()
    }

    /// The hosts refused now, by (host, port).
    pub(crate) fn list(&self) -> Vec<Fenced> {
        self.lock().fenced.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_primary_on_an_older_timeline_is_refused_until_unfenced() {
        let f = Fences::default();
        assert_eq!(f.check("a", 1, "42", 1), Ok(()), "the first primary seen");
        assert_eq!(f.check("a", 1, "42", 1), Ok(()));
        assert_eq!(f.promotions(), 0);
        // A standby promoted: timeline 2. The old primary comes back on timeline 1.
        assert_eq!(f.check("b", 2, "42", 2), Ok(()));
        assert_eq!(f.promotions(), 1, "a promotion seen");
        let newer = f.check("a", 1, "42", 1).expect_err("old primary");
        assert_eq!((newer.host.as_str(), newer.port, newer.timeline), ("b", 2, 2));
        assert!(f.check("a", 1, "42", 1).is_err());
        let listed = f.list();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].host.as_str(), listed[0].timeline, listed[0].refusals), ("a", 1, 2));
        // Another cluster is not concerned.
        assert_eq!(f.check("c", 3, "7", 1), Ok(()));
        // UNFENCE of hosts that are not fenced changes nothing.
        assert_eq!(f.unfence(Some(&[("b".to_owned(), 2)])), 0);
        assert!(f.check("a", 1, "42", 1).is_err());
        // UNFENCE of the database holding it: taken as it is.
        assert_eq!(f.unfence(Some(&[("a".to_owned(), 1), ("b".to_owned(), 2)])), 1);
        assert_eq!(f.check("a", 1, "42", 1), Ok(()));
        assert!(f.list().is_empty());
        // Rebuilt on a newer timeline, the old primary is taken again, and so on.
        assert_eq!(f.check("a", 1, "42", 3), Ok(()));
        assert!(f.check("b", 2, "42", 2).is_err());
        assert_eq!(f.unfence(None), 1);
        assert_eq!(f.check("b", 2, "42", 2), Ok(()));
    }
}
