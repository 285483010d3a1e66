//! Fencing, without IO: which server may be taken as a primary. For each cluster (its
//! `system_identifier`, shared by a primary and the standbys made from it) the newest
//! timeline seen on a read-write server is kept; a server that claims read-write on an
//! older timeline than that is an old primary come back after a failover (a standby
//! promoted meanwhile started a new timeline) and is refused as a primary until an
//! operator says otherwise (`UNFENCE`). The driver (`driver::hosts`) asks the server and
//! calls `check`; the console lists the refusals and clears them.
//!
//! What was seen only orders what was seen: a parsnip that never met the promoted server
//! would take an old primary listed before it. So until a database's host list was
//! surveyed (`known`), the driver asks every host at once and gives all the answers to
//! `learn`, which judges them newest timeline first; the list is then known (`surveyed`)
//! until `UNFENCE` forgets its cluster or a reload changes the list.

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

/// A read-write server's answer to `FENCE_QUERY`, in a survey of a database's hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) system_id: String,
    pub(crate) timeline: u32,
}

/// The order in which a survey's answers are judged (indices into `answers`): newest
/// timeline first, so that within each cluster the newest read-write server sets the
/// timeline the older ones are refused against, whatever order the hosts are listed in.
/// Equal timelines keep their order (they look alike and are all taken).
pub(crate) fn newest_first(answers: &[Answer]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..answers.len()).collect();
    order.sort_by(|&a, &b| answers[b].timeline.cmp(&answers[a].timeline));
    order
}

/// A host list as a key: the same hosts in any order.
fn list_key(hosts: &[(String, u16)]) -> Vec<(String, u16)> {
    let mut k = hosts.to_vec();
    k.sort();
    k.dedup();
    k
}

/// How many surveyed host lists are kept (reloads may make new ones): beyond, all are
/// forgotten and surveyed again once.
const SURVEYED_MAX: usize = 1024;

#[derive(Debug, Default)]
struct Inner {
    /// Per system identifier, the newest timeline seen on a read-write server.
    newest: HashMap<String, Seen>,
    /// The hosts refused, by (host, port).
    fenced: BTreeMap<(String, u16), Fenced>,
    /// The host lists (`list_key`) surveyed, with the clusters their read-write servers
    /// answered for: known while each of those clusters' newest timeline is.
    surveyed: HashMap<Vec<(String, u16)>, Vec<String>>,
}

impl Inner {
    /// `Fences::check` under the lock; true in Ok when it is a promotion.
    fn check(&mut self, host: &str, port: u16, system_id: &str, timeline: u32) -> Result<bool, Seen> {
        match self.newest.get(system_id) {
            Some(n) if n.timeline > timeline => {
                let newest = n.clone();
                let key = (host.to_owned(), port);
                let f = self.fenced.entry(key).or_insert_with(|| Fenced {
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
                let promotion = before.is_some_and(|n| n.timeline < timeline);
                let seen = Seen { host: host.to_owned(), port, timeline };
                self.newest.insert(system_id.to_owned(), seen);
                self.fenced.remove(&(host.to_owned(), port));
                Ok(promotion)
            }
        }
    }
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
        let promotion = self.lock().check(host, port, system_id, timeline)?;
        if promotion {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether the host list `hosts` was surveyed, and the newest timeline of each cluster
    /// its servers answered for is still known (`UNFENCE` forgets it).
    pub(crate) fn known(&self, hosts: &[(String, u16)]) -> bool {
        let g = self.lock();
        g.surveyed.get(&list_key(hosts)).is_some_and(|ids| ids.iter().all(|id| g.newest.contains_key(id)))
    }

    /// The answers of a survey of a database's hosts, judged together (`newest_first`):
    /// one verdict per answer, in `answers`' order, as `check` gives it.
    pub(crate) fn learn(&self, answers: &[Answer]) -> Vec<Result<(), Seen>> {
        let mut verdicts: Vec<Result<(), Seen>> = vec![Ok(()); answers.len()];
        let mut promotions = 0;
        {
            let mut g = self.lock();
            for i in newest_first(answers) {
                let a = &answers[i];
                verdicts[i] = g.check(&a.host, a.port, &a.system_id, a.timeline).map(|p| promotions += u64::from(p));
            }
        }
        self.1.fetch_add(promotions, std::sync::atomic::Ordering::Relaxed);
        verdicts
    }

    /// The host list `hosts` was surveyed and a server taken from it; its read-write
    /// servers answered for the clusters `system_ids` (none: they could not tell, and are
    /// taken unchecked as before).
    pub(crate) fn surveyed(&self, hosts: &[(String, u16)], mut system_ids: Vec<String>) {
        system_ids.sort();
        system_ids.dedup();
        let mut g = self.lock();
        if g.surveyed.len() >= SURVEYED_MAX {
            g.surveyed.clear();
        }
        g.surveyed.insert(list_key(hosts), system_ids);
    }

    /// `UNFENCE`: forgets what was seen of the clusters of the fenced hosts among `hosts`
    /// (all: None), and that the host lists holding any of `hosts` were surveyed, so that
    /// the next connection of each asks its hosts again and takes the newest read-write
    /// server that answers. The number of hosts no longer fenced.
    pub(crate) fn unfence(&self, hosts: Option<&[(String, u16)]>) -> usize {
        let mut g = self.lock();
        let chosen: Vec<(String, u16)> =
            g.fenced.keys().filter(|k| hosts.is_none_or(|h| h.contains(k))).cloned().collect();
        for k in &chosen {
            if let Some(f) = g.fenced.remove(k) {
                g.newest.remove(&f.system_identifier);
            }
        }
        match hosts {
            None => {
                g.newest.clear();
                g.surveyed.clear();
            }
            Some(h) => g.surveyed.retain(|list, _| !list.iter().any(|k| h.contains(k))),
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

    fn answer(host: &str, port: u16, system_id: &str, timeline: u32) -> Answer {
        Answer { host: host.to_owned(), port, system_id: system_id.to_owned(), timeline }
    }

    #[test]
    fn a_survey_takes_the_newest_timeline_whatever_the_order_listed() {
        // A fresh parsnip: the old primary back on timeline 1 listed first, the promoted
        // standby on timeline 2, and a server of another cluster.
        let answers = [
            answer("old", 1, "42", 1),
            answer("other", 3, "7", 5),
            answer("new", 2, "42", 2),
            answer("twin", 4, "42", 2),
        ];
        assert_eq!(newest_first(&answers), vec![1, 2, 3, 0]);
        let f = Fences::default();
        let hosts: Vec<(String, u16)> = answers.iter().map(|a| (a.host.clone(), a.port)).collect();
        assert!(!f.known(&hosts), "never surveyed");
        let verdicts = f.learn(&answers);
        let newer = verdicts[0].clone().expect_err("the old primary is refused");
        assert_eq!(newer.timeline, 2, "refused against timeline 2 (seen last on the twin)");
        assert_eq!(&verdicts[1..], &[Ok(()), Ok(()), Ok(())], "the newest of each cluster, twins alike");
        assert_eq!(f.promotions(), 0, "nothing was seen before: no promotion");
        assert_eq!(f.list().len(), 1);
        f.surveyed(&hosts, vec!["42".into(), "7".into(), "42".into()]);
        let mut reordered = hosts.clone();
        reordered.reverse();
        assert!(f.known(&reordered), "the same hosts in another order");
        assert!(!f.known(&hosts[..2]), "another list (a reload changed it)");
        // Later connections are checked one by one, as before.
        assert!(f.check("old", 1, "42", 1).is_err());
        // UNFENCE forgets the cluster: the list is surveyed again; a list whose clusters
        // and hosts are untouched stays known.
        f.surveyed(&hosts[1..2], vec!["7".into()]);
        assert_eq!(f.unfence(Some(&[("old".to_owned(), 1)])), 1);
        assert!(!f.known(&hosts));
        assert!(f.known(&hosts[1..2]));
        // UNFENCE of a database with nothing fenced: its hosts are asked again all the same
        // (an old primary taken while the promoted server was unreachable).
        assert_eq!(f.unfence(Some(&[("other".to_owned(), 3)])), 0);
        assert!(!f.known(&hosts[1..2]));
        // A survey after a promotion parsnip missed counts as one.
        assert_eq!(f.learn(&[answer("new", 2, "42", 2)]), vec![Ok(())]);
        assert_eq!(
            f.learn(&[answer("old", 1, "42", 3), answer("new", 2, "42", 2)]).iter().filter(|v| v.is_ok()).count(),
            1
        );
        assert_eq!(f.promotions(), 1);
        f.surveyed(&hosts, Vec::new());
        assert!(f.known(&hosts), "servers that could not tell: known, taken unchecked");
        assert_eq!(f.unfence(None), 1);
        assert!(!f.known(&hosts) && !f.known(&hosts[1..2]), "UNFENCE of all: every list surveyed again");
    }
}
