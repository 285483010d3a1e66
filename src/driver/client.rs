//! One client connection's task: the login, then the console or the proxy loop
//! (`driver::proxy`).

use super::Shared;
use super::login::{self, LoginEnd};
use super::proxy::Proxy;
use super::servers::ServerPool;
use super::stream::Stream;
use crate::admin::ConsoleStep;
use crate::config::PoolMode;
use crate::error::Error;
use crate::pool::PoolPurpose;
use crate::session::Session;
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Duration;

/// Serves one accepted client connection to the end.
pub(crate) async fn serve(mut stream: Stream, shared: Arc<Shared>) {
    stream.set_nodelay();
    let mut buf = BytesMut::new();
    let timeout = shared.cfg.client_login_timeout();
    // Boxed: the login future is large and only needed once.
    let res = match tokio::time::timeout(timeout, Box::pin(login::login(&mut stream, &shared, &mut buf))).await {
        Ok(r) => r,
        Err(_) => Err(LoginEnd::Close(Some(Error::protocol(
            "timeout while waiting for the startup packet or authentication",
        )))),
    };
    let client = match res {
        Ok(c) => c,
        Err(LoginEnd::Cancel) => return,
        Err(LoginEnd::Admin) => return Box::pin(serve_admin(stream, buf, &shared)).await,
        Err(LoginEnd::Close(err)) => {
            if let Some(e) = err {
                tracing::debug!(error = %e, "login refused");
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&e.to_bytes())).await;
            }
            return;
        }
    };
    tracing::debug!(user = %client.user, db = %client.db, pid = client.pid, "client logged in");
    // Only what the proxy needs lives on in the task (names and strings are dropped here).
    let login::LoggedIn { pool, settings, pid, .. } = client;
    let slot = shared.cancels.slot(pid);
    slot.bind_pool(&pool);
    let registry = (pool.mode != PoolMode::Session && shared.cfg.prepared_statements).then(|| pool.stmts.clone());
    let session = Session::new(pool.mode, settings, pid as u64, registry);
    let mut p = Proxy::new(stream, buf, session, pool, slot, shared);
    p.run().await;
    p.shared().cancels.unregister(pid);
}

/// The console: the sans-IO `admin::Console` answers; this moves the bytes.
async fn serve_admin(mut stream: Stream, mut buf: BytesMut, shared: &Shared) {
    let mut console = crate::admin::Console::default();
    loop {
        let step = console.handle_bytes(&mut buf, || {
            let pools: Vec<Arc<ServerPool>> = {
                let map = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
                map.values().filter(|p| p.key.purpose == PoolPurpose::Clients).cloned().collect()
            };
            let mut v: Vec<_> = pools.iter().map(|p| p.snapshot()).collect();
            v.sort_by(|a, b| a.key.cmp(&b.key));
            v
        });
        if !console.to_client.is_empty() {
            if stream.write_all(&console.to_client).await.is_err() {
                return;
            }
            console.to_client.clear();
        }
        if step == ConsoleStep::Close {
            return;
        }
        buf.reserve(1024);
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
