//! PAUSE and KILL: which databases' pools hold their checkouts. The one place this is kept:
//! the driver sets it (console, SIGUSR1/SIGUSR2) and every pool reads it on each checkout,
//! so a pool made while its database is paused starts paused, and a RESUME reaches every
//! pool at once.

use crate::error::{Error, SqlState};
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The pauses in force.
#[derive(Debug, Default)]
pub struct Pauses {
    /// `PAUSE` without a database (or SIGUSR1).
    all: AtomicBool,
    /// Whether `dbs` holds any (read without its lock on every checkout).
    some: AtomicBool,
    /// Databases `PAUSE db` or `KILL db` holds.
    dbs: Mutex<HashSet<String>>,
}

impl Pauses {
    fn dbs(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.dbs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the pools of `db` hold their checkouts.
    pub(crate) fn holds(&self, db: &str) -> bool {
        self.all() || (self.some.load(Ordering::SeqCst) && self.dbs().contains(db))
    }

    /// Whether every pool is paused.
    pub(crate) fn all(&self) -> bool {
        self.all.load(Ordering::SeqCst)
    }

    /// PAUSE: the pools of `db` (all: None) hold their checkouts, and so will pools made
    /// for it later.
    pub(crate) fn pause(&self, db: Option<&str>) {
        match db {
            None => self.all.store(true, Ordering::SeqCst),
            Some(d) => {
                let mut dbs = self.dbs();
                dbs.insert(d.to_owned());
                self.some.store(true, Ordering::SeqCst);
            }
        }
    }

    /// RESUME: undoes PAUSE and KILL of `db` (all: None; a database stays held while
    /// everything is paused); an error when nothing it names was paused.
    pub(crate) fn resume(&self, db: Option<&str>) -> Result<(), Error> {
        let mut dbs = self.dbs();
        match db {
            None => {
                let was = self.all.swap(false, Ordering::SeqCst);
                if !was && dbs.is_empty() {
                    return Err(Error::new(
                        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                        "pooler is not paused/suspended",
                    ));
                }
                dbs.clear();
            }
            Some(d) => {
                if !dbs.remove(d) && !self.all() {
                    return Err(Error::new(
                        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                        format!("database {d} is not paused"),
                    ));
                }
            }
        }
        self.some.store(!dbs.is_empty(), Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_held_by_its_own_pause_or_the_pause_of_all() {
        let p = Pauses::default();
        assert!(!p.holds("a"));
        assert_eq!(p.resume(None).unwrap_err().code, SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE);
        p.pause(Some("a"));
        assert!(p.holds("a") && !p.holds("b") && !p.all());
        assert_eq!(p.resume(Some("b")).unwrap_err().code, SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE);
        p.pause(None);
        assert!(p.holds("b"));
        p.resume(Some("a")).expect("a was paused");
        assert!(p.holds("a"), "still held by the pause of all");
        p.resume(None).expect("all paused");
        assert!(!p.holds("a") && !p.holds("b"));
        p.pause(Some("a"));
        p.resume(None).expect("a was paused");
        assert!(!p.holds("a"));
    }
}
