//! Small helpers: bounded waits, free ports, temp paths.

#![allow(dead_code)]

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Runs `f`, panicking if it takes longer than `secs` seconds.
pub async fn bounded<F: Future>(secs: u64, what: &str, f: F) -> F::Output {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {secs}s"),
    }
}

/// Runs `f`, Err if it takes longer than `dur`.
pub async fn within<F: Future>(dur: Duration, f: F) -> Result<F::Output, String> {
    tokio::time::timeout(dur, f).await.map_err(|_| format!("timed out after {dur:?}"))
}

/// A free TCP port on 127.0.0.1 (the listener is closed again before returning).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("binding 127.0.0.1:0")
}

/// A path inside the system temp dir that does not exist yet.
pub fn temp_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "parsnip-e2e-{}-{}-{what}",
        std::process::id(),
        FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Whether a path exists.
pub fn exists(p: &Path) -> bool {
    p.exists()
}

pub(crate) static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);
