//! Cancel forwarding between parsnip instances (`peer_id`, `[peers]`): the peer id this
//! instance writes into the cancel keys it hands out, where a CancelRequest goes (here, on
//! to the peer its key names, or nowhere), and the forwarding itself. Several processes
//! sharing a port (`so_reuseport`) or a load balancer send a client's cancel connection to
//! any of them; the key says which one has the client.
//!
//! The encoding (docs/scaling.md): with `peer_id` set, the top 10 bits of the 32-bit
//! cancel key are the peer id and the low 22 bits are random. The pid half is left alone:
//! parsnip's own pids stay above every OS pid and a session-mode client keeps its
//! backend's real pid. A forwarded request has bit 31 of its pid set (a pid parsnip hands
//! out never has it: all are positive): the receiving peer clears it, looks the key up
//! among its own clients and never forwards such a request again, so a misconfigured
//! `[peers]` table cannot make requests circle.

use super::Shared;
use super::stream::Stream;
use crate::config::{MAX_PEER_ID, PeerConfig};
use crate::protocol::startup;
use std::time::Duration;

/// Bits of the key below the peer id.
const PEER_SHIFT: u32 = 22;
/// The random bits of a key when peering is on.
const RANDOM_MASK: u32 = (1 << PEER_SHIFT) - 1;
/// Set in the pid of a request a peer forwarded.
const FORWARDED: u32 = 1 << 31;
/// Connecting to a peer, sending the request and waiting for it to be handled: a cancel
/// that cannot reach its peer ends here (only this cancel connection waits for it).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

const _: () = assert!(MAX_PEER_ID as u32 <= u32::MAX >> PEER_SHIFT, "peer ids fit above the random bits");

/// A new cancel key for a client of instance `peer_id` (0: peering off, all 32 bits random).
pub(crate) fn stamp(random: i32, peer_id: u16) -> i32 {
    if peer_id == 0 {
        return random;
    }
    ((u32::from(peer_id) << PEER_SHIFT) | (random as u32 & RANDOM_MASK)) as i32
}

/// The peer id a cancel key carries (0 for none, or a key of another length).
fn peer_of(key: &[u8]) -> u16 {
    match <[u8; 4]>::try_from(key) {
        Ok(k) => (u32::from_be_bytes(k) >> PEER_SHIFT) as u16,
        Err(_) => 0,
    }
}

/// Where a CancelRequest goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// One of this instance's clients, if the key matches (the pid without the mark).
    Local(i32),
    /// On to this peer.
    Forward(u16),
    /// Nowhere: it names a peer this instance does not know, or was already forwarded once.
    Drop,
}

/// Where a CancelRequest with `pid` and `key` goes, on instance `own` (0: peering off);
/// `known` says whether a peer id is in `[peers]`.
pub(crate) fn route(own: u16, pid: i32, key: &[u8], known: impl Fn(u16) -> bool) -> Route {
    let forwarded = pid as u32 & FORWARDED != 0;
    let pid = (pid as u32 & !FORWARDED) as i32;
    if own == 0 {
        return Route::Local(pid);
    }
    match peer_of(key) {
        // Ours, or a key with no peer id (none of ours: the lookup finds nothing).
        p if p == own || p == 0 => Route::Local(pid),
        _ if forwarded => Route::Drop,
        p if known(p) => Route::Forward(p),
        _ => Route::Drop,
    }
}

impl Shared {
    /// Handles a CancelRequest (in the task of the connection that carried it): cancels
    /// the query of one of this instance's clients, or forwards the request to the peer its
    /// key names; anything else is dropped without a word, as PostgreSQL does.
    pub(crate) async fn cancel_request(&self, pid: i32, key: &[u8]) {
        let own = self.cancels.peer_id();
        let cfg = self.cfg.load_full();
        match route(own, pid, key, |p| cfg.peer(p).is_some()) {
            Route::Local(pid) => self.cancels.cancel(pid, key).await,
            Route::Forward(p) => {
                let Some(peer) = cfg.peer(p) else { return };
                forward(p, peer, pid, key).await;
            }
            Route::Drop => tracing::debug!(pid, peer = peer_of(key), "cancel request for an unknown peer dropped"),
        }
    }
}

/// Sends the request to `peer` on a connection of its own, marked as forwarded, and waits
/// (bounded) until the peer closes it: it has handled the request by then.
async fn forward(id: u16, peer: &PeerConfig, pid: i32, key: &[u8]) {
    let marked = (pid as u32 | FORWARDED) as i32;
    let sent = tokio::time::timeout(FORWARD_TIMEOUT, async {
        let mut s = if peer.host.starts_with('/') {
            tokio::net::UnixStream::connect(format!("{}/.s.PGSQL.{}", peer.host, peer.port)).await.map(Stream::Unix)?
        } else {
            tokio::net::TcpStream::connect((peer.host.as_str(), peer.port)).await.map(Stream::Tcp)?
        };
        s.write_all(&startup::cancel_request(marked, key)).await?;
        let mut b = bytes::BytesMut::with_capacity(16);
        while s.read_buf(&mut b).await? > 0 {
            b.clear();
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
    match sent {
        Ok(Ok(())) => tracing::debug!(peer = id, "cancel request forwarded to a peer"),
        Ok(Err(e)) => {
            let (host, port) = (&peer.host, peer.port);
            tracing::warn!(peer = id, host = %host, port, error = %e, "could not forward cancel request to peer")
        }
        Err(_) => {
            let (host, port) = (&peer.host, peer.port);
            tracing::warn!(peer = id, host = %host, port, "forwarding a cancel request to a peer timed out")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: i32) -> [u8; 4] {
        k.to_be_bytes()
    }

    #[test]
    fn the_peer_id_takes_the_top_bits_and_the_rest_stays_random() {
        for random in [0, -1, 0x1234_5678, i32::MIN, i32::MAX] {
            assert_eq!(stamp(random, 0), random, "peering off: the key is all random");
            for id in [1, 2, 512, MAX_PEER_ID] {
                let k = stamp(random, id);
                assert_eq!(peer_of(&key(k)), id);
                assert_eq!(k as u32 & RANDOM_MASK, random as u32 & RANDOM_MASK, "22 random bits kept");
            }
        }
        assert_eq!(peer_of(&[1, 2, 3]), 0, "a key of another length names no peer");
        assert_eq!(peer_of(&[0xff; 8]), 0);
    }

    #[test]
    fn routes() {
        let known = |p: u16| p == 2 || p == 3;
        let pid = crate::driver::cancel::FIRST_CLIENT_PID;
        let of = |id| key(stamp(0x0abc_def0, id));
        // Peering off: every request is looked up here, as before.
        assert_eq!(route(0, pid, &of(2), known), Route::Local(pid));
        // Its own key, a session-mode client's real pid included.
        assert_eq!(route(1, pid, &of(1), known), Route::Local(pid));
        assert_eq!(route(1, 4242, &of(1), known), Route::Local(4242));
        // Another peer's key goes there; an unknown peer's is dropped.
        assert_eq!(route(1, pid, &of(2), known), Route::Forward(2));
        assert_eq!(route(1, pid, &of(9), known), Route::Drop);
        // Forwarded once: looked up here (the mark cleared), never forwarded again.
        let marked = (pid as u32 | FORWARDED) as i32;
        assert_eq!(route(2, marked, &of(2), known), Route::Local(pid));
        assert_eq!(route(1, marked, &of(3), known), Route::Drop, "no second hop");
        assert_eq!(route(0, marked, &of(3), known), Route::Local(pid));
    }
}
