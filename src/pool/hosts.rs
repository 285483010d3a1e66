//! Choosing among a database's hosts, without IO: what role a server has (from the
//! ParameterStatus it sends at login, or from the answer to the driver's role query),
//! whether that role suits libpq's `target_session_attrs`, the order in which hosts are
//! tried, and a short memory per host (down, or its role) shared by every pool, so that a
//! host known to be dead or of the wrong role is tried last rather than first on every new
//! connection. The driver (`driver::hosts`) connects and asks.

use crate::config::{LoadBalanceHosts, TargetSessionAttrs};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long what was learnt about a host steers the order hosts are tried in. A host
/// remembered as down or of the wrong role is still tried, after the others.
pub(crate) const HOST_MEMORY: Duration = Duration::from_secs(10);

/// The query asking a server for its role when it did not report it at login (before
/// PostgreSQL 14): in recovery, and read-only by default.
pub(crate) const ROLE_QUERY: &str =
    "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only')";

/// What a server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Role {
    /// In recovery (a hot standby).
    pub(crate) standby: bool,
    /// Its sessions are read-only (a standby, or `default_transaction_read_only` on).
    pub(crate) read_only: bool,
}

fn on(v: &str) -> bool {
    matches!(v, "on" | "t" | "true")
}

impl Role {
    /// From the ParameterStatus a server sent at login: PostgreSQL 14 and later report
    /// `in_hot_standby` and `default_transaction_read_only`. None when either is missing.
    pub(crate) fn from_params(params: &[(String, String)]) -> Option<Role> {
        let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| on(v));
        let standby = get("in_hot_standby")?;
        let read_only = get("default_transaction_read_only")?;
        Some(Role { standby, read_only: standby || read_only })
    }

    /// From the row `ROLE_QUERY` returns.
    pub(crate) fn from_row(row: &[Option<String>]) -> Option<Role> {
        let standby = on(row.first()?.as_deref()?);
        let read_only = on(row.get(1)?.as_deref()?);
        Some(Role { standby, read_only: standby || read_only })
    }

    /// Whether a server of this role serves `attrs`; prefer-standby is asked as standby
    /// (its fallback to any server is the caller's).
    pub(crate) fn fits(self, attrs: TargetSessionAttrs) -> bool {
        match attrs {
            TargetSessionAttrs::Any => true,
            TargetSessionAttrs::ReadWrite => !self.read_only,
            TargetSessionAttrs::ReadOnly => self.read_only,
            TargetSessionAttrs::Primary => !self.standby,
            TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => self.standby,
        }
    }

    /// Why a server of this role does not serve `attrs` (for the error a client sees).
    pub(crate) fn why_not(self, attrs: TargetSessionAttrs) -> &'static str {
        match attrs {
            TargetSessionAttrs::ReadWrite if self.standby => "is a standby (in hot standby)",
            TargetSessionAttrs::ReadWrite => "is read-only (default_transaction_read_only is on)",
            TargetSessionAttrs::ReadOnly => "is read-write",
            TargetSessionAttrs::Primary => "is a standby (in hot standby)",
            _ => "is not a standby",
        }
    }
}

/// What was last learnt about one host.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// A connection to it failed.
    Down,
    /// A connection to it logged in and it had this role.
    Up(Role),
    /// It claimed read-write and was refused as a primary (`fence`).
    Fenced,
}

/// What was last learnt about each host, by (host, port), for `HOST_MEMORY`; and the
/// fencing memory (which servers are refused as primaries, kept until `UNFENCE`).
#[derive(Debug, Default)]
pub(crate) struct HostMemory {
    hosts: Mutex<HashMap<(String, u16), (Instant, Known)>>,
    pub(crate) fences: super::fence::Fences,
}

impl HostMemory {
    fn note(&self, host: &str, port: u16, k: Known) {
        let mut m = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if m.len() > 1024 {
            m.retain(|_, (at, _)| now.duration_since(*at) < HOST_MEMORY);
        }
        m.insert((host.to_owned(), port), (now, k));
    }

    /// A connection to the host failed.
    pub(crate) fn down(&self, host: &str, port: u16) {
        self.note(host, port, Known::Down);
    }

    /// The host logged a connection in and has `role`.
    pub(crate) fn role(&self, host: &str, port: u16, role: Role) {
        self.note(host, port, Known::Up(role));
    }

    /// The host claimed read-write and was refused as a primary.
    pub(crate) fn fenced(&self, host: &str, port: u16) {
        self.note(host, port, Known::Fenced);
    }

    /// Whether the host was recently down or of a role not serving `attrs`.
    fn unpromising(&self, host: &str, port: u16, attrs: TargetSessionAttrs, now: Instant) -> bool {
        let m = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(&(host.to_owned(), port)) {
            Some((at, k)) if now.duration_since(*at) < HOST_MEMORY => match k {
                Known::Down => true,
                Known::Up(role) => !role.fits(attrs),
                Known::Fenced => matches!(attrs, TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary),
            },
            _ => false,
        }
    }

    /// The order in which to try `hosts` (indices) for `attrs`: configured or random
    /// order, hosts recently down or of the wrong role moved to the end (still tried: what
    /// was learnt may be stale, e.g. after a promotion).
    pub(crate) fn plan(
        &self,
        hosts: &[(String, u16)],
        attrs: TargetSessionAttrs,
        balance: LoadBalanceHosts,
    ) -> Vec<usize> {
        let mut order: Vec<usize> = (0..hosts.len()).collect();
        if balance == LoadBalanceHosts::Random {
            rand::seq::SliceRandom::shuffle(&mut order[..], &mut rand::rng());
        }
        if hosts.len() < 2 {
            return order;
        }
        let now = Instant::now();
        let (good, later): (Vec<usize>, Vec<usize>) =
            order.into_iter().partition(|&i| !self.unpromising(&hosts[i].0, hosts[i].1, attrs, now));
        good.into_iter().chain(later).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TargetSessionAttrs::*;

    const PRIMARY: Role = Role { standby: false, read_only: false };
    const STANDBY: Role = Role { standby: true, read_only: true };
    const READ_ONLY_PRIMARY: Role = Role { standby: false, read_only: true };

    #[test]
    fn roles_fit_as_in_libpq() {
        let fits = |r: Role| [Any, ReadWrite, ReadOnly, Primary, Standby, PreferStandby].map(|a| r.fits(a));
        assert_eq!(fits(PRIMARY), [true, true, false, true, false, false]);
        assert_eq!(fits(STANDBY), [true, false, true, false, true, true]);
        assert_eq!(fits(READ_ONLY_PRIMARY), [true, false, true, true, false, false]);
        assert_eq!(STANDBY.why_not(ReadWrite), "is a standby (in hot standby)");
        assert!(READ_ONLY_PRIMARY.why_not(ReadWrite).contains("default_transaction_read_only"));
    }

    #[test]
    fn role_from_login_parameters_or_the_query() {
        let p = |s: &str, ro: &str| {
            vec![
                ("in_hot_standby".to_string(), s.to_string()),
                ("default_transaction_read_only".to_string(), ro.to_string()),
            ]
        };
        assert_eq!(Role::from_params(&p("off", "off")), Some(PRIMARY));
        assert_eq!(Role::from_params(&p("on", "off")), Some(STANDBY));
        assert_eq!(Role::from_params(&p("off", "on")), Some(READ_ONLY_PRIMARY));
        assert_eq!(Role::from_params(&[("server_version".into(), "13.1".into())]), None);
        assert_eq!(Role::from_row(&[Some("t".into()), Some("on".into())]), Some(STANDBY));
        assert_eq!(Role::from_row(&[Some("f".into()), Some("off".into())]), Some(PRIMARY));
        assert_eq!(Role::from_row(&[Some("f".into())]), None);
        assert_eq!(Role::from_row(&[None, None]), None);
    }

    #[test]
    fn hosts_known_down_or_unfit_are_tried_last() {
        let hosts: Vec<(String, u16)> = vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)];
        let m = HostMemory::default();
        assert_eq!(m.plan(&hosts, ReadWrite, LoadBalanceHosts::Disable), vec![0, 1, 2]);
        m.role("a", 1, STANDBY);
        m.down("b", 2);
        assert_eq!(m.plan(&hosts, ReadWrite, LoadBalanceHosts::Disable), vec![2, 0, 1]);
        assert_eq!(m.plan(&hosts, Standby, LoadBalanceHosts::Disable), vec![0, 2, 1]);
        assert_eq!(m.plan(&hosts, Any, LoadBalanceHosts::Disable), vec![0, 2, 1]);
        let r = m.plan(&hosts, ReadWrite, LoadBalanceHosts::Random);
        assert_eq!(r[0], 2, "the one promising host comes first");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            seen.insert(HostMemory::default().plan(&hosts, Any, LoadBalanceHosts::Random));
        }
        assert!(seen.len() > 1, "random order varies");
    }
}
