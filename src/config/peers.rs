//! `peer_id` and `[peers]`: the other parsnip instances a cancel request may be forwarded
//! to (docs/scaling.md), checked with the rest of the configuration.

use super::{Config, ConfigError};
use serde::{Deserialize, Serialize};

/// The highest `peer_id`: the id takes the top 10 bits of a 32-bit cancel key, leaving
/// 22 random bits (docs/scaling.md).
pub const MAX_PEER_ID: u16 = 1023;

/// One `[peers.N]` entry: where peer N listens, given as a `[databases.NAME]` entry gives
/// its server.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct PeerConfig {
    /// Host name or IP, or a directory holding the peer's unix socket `.s.PGSQL.<port>`.
    pub(crate) host: String,
    /// Port (for a unix socket: the number in the socket file's name).
    pub(crate) port: u16,
}

impl Config {
    pub(super) fn validate_peers(&self) -> Result<(), ConfigError> {
        if self.peer_id > MAX_PEER_ID {
            return Err(ConfigError(format!("peer_id must be between 0 (off) and {MAX_PEER_ID}")));
        }
        if self.peer_id == 0 && !self.peers.is_empty() {
            return Err(ConfigError("[peers] needs peer_id: set it to this instance's own id".into()));
        }
        for (name, p) in &self.peers {
            if !name.parse::<u16>().is_ok_and(|id| (1..=MAX_PEER_ID).contains(&id)) || name.starts_with('0') {
                return Err(ConfigError(format!("peers.{name}: a peer id is a number between 1 and {MAX_PEER_ID}")));
            }
            if p.host.is_empty() {
                return Err(ConfigError(format!("peers.{name}: host is required")));
            }
            if p.port == 0 {
                return Err(ConfigError(format!("peers.{name}: port is required")));
            }
        }
        Ok(())
    }

    /// This instance's own `[peers]` entry, if it has one: the address its peers forward
    /// cancel requests to.
    pub(crate) fn own_peer(&self) -> Option<&PeerConfig> {
        if self.peer_id == 0 {
            return None;
        }
        self.peers.get(self.peer_id.to_string().as_str())
    }

    /// Where peer `id` listens (None: not in `[peers]`, or this instance itself).
    pub(crate) fn peer(&self, id: u16) -> Option<&PeerConfig> {
        if id == self.peer_id {
            return None;
        }
        self.peers.get(id.to_string().as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_checked() {
        let db = "[databases.a]\nhost='h'\nport=1\n";
        let bad = [
            ("peer_id = 1024\n", "between 0 (off) and 1023"),
            ("[peers.2]\nhost='h'\nport=1\n", "needs peer_id"),
            ("peer_id = 1\n[peers.x]\nhost='h'\nport=1\n", "peers.x: a peer id"),
            ("peer_id = 1\n[peers.1024]\nhost='h'\nport=1\n", "peers.1024: a peer id"),
            ("peer_id = 1\n[peers.02]\nhost='h'\nport=1\n", "peers.02: a peer id"),
            ("peer_id = 1\n[peers.2]\nport=1\n", "peers.2: host is required"),
            ("peer_id = 1\n[peers.2]\nhost='h'\n", "peers.2: port is required"),
            ("peer_id = 1\n[peers.2]\nhost='h'\nport=1\npool_size=3\n", "unknown field"),
        ];
        for (text, want) in bad {
            let e = Config::from_toml(&format!("{text}{db}")).unwrap_err();
            assert!(e.0.contains(want), "{text}: {e}");
        }
        let cfg = Config::from_toml(&format!(
            "peer_id = 1\nso_reuseport = true\n{db}[peers.1]\nhost='127.0.0.1'\nport=6432\n\
                [peers.2]\nhost='/tmp'\nport=6433\n"
        ))
        .unwrap();
        assert!(cfg.so_reuseport);
        assert_eq!(cfg.peer(1), None, "its own entry is not a peer");
        assert_eq!(cfg.own_peer(), Some(&PeerConfig { host: "127.0.0.1".into(), port: 6432 }));
        assert_eq!(cfg.peer(2), Some(&PeerConfig { host: "/tmp".into(), port: 6433 }));
        assert_eq!(cfg.peer(3), None);
        assert!(!Config::default().so_reuseport);
        assert_eq!(Config::default().peer_id, 0);
    }
}
