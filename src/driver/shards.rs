//! Thread per core: the event-loop threads clients run on. Each is a single-threaded tokio
//! runtime of its own; the accept loop hands every new client to the thread with the
//! fewest clients, and the client's server connections are opened on (and preferred by,
//! `pool::home`) that same thread; a connection taken by a client of another thread moves
//! to it (`Stream::rehome`). A client, the server connection serving it and every wake-up
//! between them then stay on one core: no task moves between threads, as one does on a
//! work-stealing runtime when another worker polled its event (docs/benchmarks.md "Thread
//! per core, and the hop's floor" compares the two).
//!
//! Owns the threads and the per-thread client counts; knows nothing of the protocol. What is
//! shared between threads (pools, cancel keys, the console's state) lives in `Shared` behind
//! its own small locks, as before.

use super::stream::Stream;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use tokio::runtime::Handle;

/// How the process runs its event loops (`PARSNIP_WORKERS`, `PARSNIP_SCHEDULER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// Everything on the thread that runs `start` (one core).
    One,
    /// Clients on this many single-threaded event loops, one per core (the default: as
    /// many as the machine has cores); listeners, signals and the janitor on the main one.
    PerCore(usize),
}

/// The number of event loops when `PARSNIP_WORKERS` does not set it: one per core, or,
/// when every server runs on this machine, one per two cores (at least one). There
/// PostgreSQL's backends (and often the clients) need the other cores: on 2 cores one loop
/// beat two in every cell of a side-by-side run, in throughput, CPU per transaction, p99 and
/// idle memory, because two loops that each sleep and wake take turns with the backends
/// (docs/benchmarks.md, "One event loop against two on 2 shared cores").
pub fn default_loops(cores: usize, servers_on_this_machine: bool) -> usize {
    if servers_on_this_machine { (cores / 2).max(1) } else { cores.max(1) }
}

/// One event-loop thread.
#[derive(Debug)]
struct Shard {
    handle: Handle,
    /// Clients it serves now.
    clients: AtomicUsize,
}

/// The client event loops.
#[derive(Debug)]
pub(crate) struct Shards(Vec<Arc<Shard>>);

impl Shards {
    /// Starts `n` event-loop threads (they run until the process exits).
    pub(crate) fn start(n: usize) -> io::Result<Shards> {
        let mut shards = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, rx) = mpsc::sync_channel(1);
            std::thread::Builder::new().name(format!("parsnip-{i}")).spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                // Connections opened here remember thread i + 1 (0: the main thread).
                crate::pool::home::enter(i as u16 + 1);
                let _ = tx.send(Ok(rt.handle().clone()));
                rt.block_on(std::future::pending::<()>());
            })?;
            let handle = rx.recv().map_err(|_| io::Error::other("event-loop thread did not start"))??;
            shards.push(Arc::new(Shard { handle, clients: AtomicUsize::new(0) }));
        }
        Ok(Shards(shards))
    }

    /// Runs `serve` for a client just accepted on the thread that has the fewest clients;
    /// its socket moves to that thread's event loop. The future `serve` makes is the task
    /// itself, without a wrapper (an idle client's task is its whole memory, docs/benchmarks.md
    /// "Idle clients"): it holds the `Leave` it is given, which counts the client out of its
    /// thread however the task ends.
    pub(crate) fn spawn<F, Fut>(&self, stream: Stream, serve: F)
    where
        F: FnOnce(Stream, Leave) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(shard) = self.0.iter().min_by_key(|s| s.clients.load(Ordering::Relaxed)) else {
            return;
        };
        let Some(detached) = Detached::from(stream) else { return };
        // Registered with the chosen thread's event loop from here.
        let attached = {
            let _in = shard.handle.enter();
            detached.attach()
        };
        match attached {
            Ok(stream) => {
                shard.clients.fetch_add(1, Ordering::Relaxed);
                drop(shard.handle.spawn(serve(stream, Leave(shard.clone()))));
            }
            Err(e) => tracing::warn!(error = %e, "could not move a client to its event loop"),
        }
    }
}

/// A client counted on its event-loop thread; counted out when dropped.
pub(crate) struct Leave(Arc<Shard>);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A just-accepted socket between two event loops: registered with neither.
enum Detached {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Detached {
    fn from(s: Stream) -> Option<Detached> {
        let r = match s {
            Stream::Tcp(t) => t.into_std().map(Detached::Tcp),
            Stream::Unix(u) => u.into_std().map(Detached::Unix),
            // Accepted sockets are plain; TLS starts later, on the client's own thread.
            Stream::Tls(_) | Stream::Closed => return None,
        };
        r.map_err(|e| tracing::warn!(error = %e, "could not detach an accepted socket")).ok()
    }

    /// Registers it with the current thread's event loop.
    fn attach(self) -> io::Result<Stream> {
        Ok(match self {
            Detached::Tcp(t) => Stream::Tcp(tokio::net::TcpStream::from_std(t)?),
            Detached::Unix(u) => Stream::Unix(tokio::net::UnixStream::from_std(u)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::default_loops;

    #[test]
    fn a_server_on_this_machine_leaves_it_half_the_cores() {
        assert_eq!([1, 2, 4, 16].map(|c| default_loops(c, false)), [1, 2, 4, 16]);
        assert_eq!([1, 2, 3, 4, 16].map(|c| default_loops(c, true)), [1, 1, 1, 2, 8]);
        assert_eq!(default_loops(0, true), 1);
    }
}
