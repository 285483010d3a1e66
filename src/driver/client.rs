//! One client connection's task: the login, then the console or the proxy loop
//! (`driver::proxy`).

use super::Shared;
use super::login::{self, LoginEnd};
use super::proxy::Proxy;
use super::stream::Stream;
use crate::config::PoolMode;
use crate::error::Error;
use crate::login::Refusal;
use crate::session::Session;
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Duration;

/// Serves one accepted client connection to the end; with a `refusal`, a CancelRequest is
/// handled and a login refused (57P03: the instance is stopping; 53300: too many clients),
/// as PostgreSQL refuses it. `held` (a client slot, the
/// count of its event loop) is dropped when the client is gone. The future is the client's
/// task, and what it holds is an idle client's memory (`task_size`): the login runs boxed
/// (its state is freed when it ends), and the proxy and its loop are all that is left.
pub(crate) fn serve<T: Send + 'static>(
    stream: Stream,
    shared: Arc<Shared>,
    refusal: Option<Refusal>,
    held: T,
) -> impl Future<Output = ()> + Send + 'static {
    let login = Box::pin(log_in(stream, shared, refusal));
    async move {
        let _held = held;
        let Some(mut p) = login.await else { return };
        p.run().await;
        p.meter_finish();
        p.leave_channels();
        p.leave_limits();
        let pid = p.pid();
        p.shared().cancels.unregister(pid);
    }
}

/// The login (or the console, to its end): the proxy of a client that logged in.
async fn log_in(mut stream: Stream, shared: Arc<Shared>, refusal: Option<Refusal>) -> Option<Proxy> {
    stream.set_nodelay();
    let connected_us = super::census::unix_us();
    let mut buf = BytesMut::new();
    let timeout = shared.cfg.load().client_login_timeout();
    // Boxed: the login future is large and only needed once.
    let res = match tokio::time::timeout(timeout, Box::pin(login::login(&mut stream, &shared, &mut buf, refusal))).await
    {
        Ok(r) => r,
        Err(_) => Err(LoginEnd::Close(Some(Error::protocol(
            "timeout while waiting for the startup packet or authentication",
        )))),
    };
    let client = match res {
        Ok(c) => c,
        Err(LoginEnd::Cancel) => return None,
        Err(LoginEnd::Admin { read_only, who }) => {
            let (user, db, application_name) = *who;
            let ends = super::census::Endpoints::of(&stream);
            let who = super::census::ConsoleClient { id: 0, user, db, application_name, ends, connected_us };
            Box::pin(super::admin::serve(stream, buf, &shared, read_only, who)).await;
            return None;
        }
        Err(LoginEnd::Close(err)) => {
            if let Some(e) = err {
                tracing::debug!(error = %e, "login refused");
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&e.to_bytes())).await;
            }
            return None;
        }
    };
    tracing::debug!(user = %client.user, db = %client.db, pid = client.pid, "client logged in");
    // Only what the proxy needs lives on in the task (names and strings are dropped here).
    let login::LoggedIn { pool, settings, pid, server, .. } = client;
    let slot = shared.cancels.slot(pid);
    slot.bind_pool(&pool);
    pool.stats.logins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let _ = slot.info.set(super::census::ClientInfo {
        ends: super::census::Endpoints::of(&stream),
        connected_us,
        settings: settings.clone(),
    });
    let registry =
        (pool.mode != PoolMode::Session && shared.cfg.load().prepared_statements).then(|| pool.stmts.clone());
    let mut session = Session::new(pool.mode, settings, pid as u64, registry);
    session.set_read_split(pool.connector().split().is_some());
    session.set_defer_begin(shared.cfg.load().defer_begin);
    let mut p = Proxy::new(stream, buf, session, pool, slot, shared);
    if let Some(s) = server {
        p.link_at_login(s);
    }
    Some(p)
}

/// An idle client's task is this future (docs/benchmarks.md "Idle clients"): the login's
/// locals must not add to the proxy's (1424 B when the login and the proxy loop were one
/// function, 1112 B when the login ran inline and the session was not parked).
#[cfg(test)]
mod task_size {
    fn future_size<
        F: FnOnce(super::Stream, std::sync::Arc<super::Shared>, Option<super::Refusal>, Held) -> Fut,
        Fut,
    >(
        _: F,
    ) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// What the accept loop has a client's task hold: its slot and its thread's count.
    type Held = (tokio::sync::OwnedSemaphorePermit, crate::driver::shards::Leave);

    #[test]
    fn a_client_task_is_the_proxy_and_little_else() {
        let serve = future_size(super::serve);
        // 400 B: with tokio's header and trailer, a task cell of 512 B (cells are
        // multiples of 128 B); 1112 B (a 1280-B cell) before the session was parked when
        // idle and the login boxed.
        assert!(serve <= 400, "serve() is {serve} B");
    }
}
