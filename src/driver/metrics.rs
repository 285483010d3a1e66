//! The HTTP listener of `metrics_listen`: `GET /metrics` (Prometheus text format, rendered
//! by `admin::render_metrics` over the console's live `View`), `GET /ready` (200 while
//! parsnip accepts and serves clients; 503 once a shutdown began or while every pool is
//! paused, so a load balancer stops sending clients) and `GET /live` (200 while the process
//! answers). HTTP/1.1 by `hyper`; each connection gets 10 s to send its request head.

use super::Shared;
use super::admin::Live;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;

/// Binds `addr`; errors are start-up errors.
pub(super) async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr).await?;
    tracing::info!("metrics on http://{}/metrics", l.local_addr()?);
    Ok(l)
}

/// Serves scrapes for the process's life: during a graceful shutdown too, when `/ready`
/// answers 503 while clients drain (a load balancer must see it).
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let resp = respond(&shared, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "metrics connection");
            }
        });
    }
}

fn respond(shared: &Shared, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ctype));
        r
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            reply(StatusCode::OK, crate::admin::METRICS_CONTENT_TYPE, crate::admin::render_metrics(&Live(shared)))
        }
        "/ready" => {
            if shared.stopping.load(Ordering::Acquire) || *shared.shutdown.borrow() {
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "shutting down\n".into())
            } else if shared.pauses.all() {
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "paused\n".into())
            } else {
                reply(StatusCode::OK, TEXT, "ready\n".into())
            }
        }
        "/live" => reply(StatusCode::OK, TEXT, "live\n".into()),
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found: try /metrics, /ready or /live\n".into()),
    }
}
