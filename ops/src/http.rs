//! The `/metrics` (Prometheus text), `/healthz` and `/readyz` endpoint, served by hyper
//! (already in every binary through kube-client): HTTP/1.1 with keep-alive, a 10 s
//! limit on reading a request's head, GET and HEAD only. `/healthz` answers 503 with
//! one `stalled: NAME ...` line per stalled loop (see [`crate::health`]). A program may
//! add its own read-only pages with [`serve_ops_with`] (the edge's per-VIP health).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use crate::health::Health;

/// How long a client may take to send a request's head before the connection closes.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A page a program adds to the ops endpoint: given a request path, `None` when the
/// path is not its, else the answer.
pub trait ExtraPages: Send + Sync + 'static {
    fn answer(&self, path: &str) -> Option<Page>;
}

/// One answer of an [`ExtraPages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// Binds `addr` and serves the ops endpoints until the task is dropped.
/// Returns the bound address (useful with port 0).
pub async fn serve_ops(
    addr: SocketAddr,
    registry: Arc<Mutex<Registry>>,
    health: Arc<Health>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_ops_with(addr, registry, health, None).await
}

/// [`serve_ops`] plus the pages of `extra`, asked for any path the ops endpoint does
/// not serve itself.
pub async fn serve_ops_with(
    addr: SocketAddr,
    registry: Arc<Mutex<Registry>>,
    health: Arc<Health>,
    extra: Option<Arc<dyn ExtraPages>>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                // EMFILE and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let registry = registry.clone();
            let health = health.clone();
            let extra = extra.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    let health = health.clone();
                    let extra = extra.clone();
                    async move {
                        Ok::<_, Infallible>(
                            answer(&req, &registry, &health, extra.as_deref()).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

async fn answer(
    req: &Request<Incoming>,
    registry: &Mutex<Registry>,
    health: &Health,
    extra: Option<&dyn ExtraPages>,
) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &str| reply(status, "text/plain", body.to_string());
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut out = String::new();
            let reg = registry.lock().await;
            match prometheus_client::encoding::text::encode(&mut out, &reg) {
                Ok(()) => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                ),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            }
        }
        "/healthz" => {
            let stalled = health.stalled();
            if stalled.is_empty() {
                text(StatusCode::OK, "ok\n")
            } else {
                let lines: String = stalled.iter().map(|s| format!("stalled: {s}\n")).collect();
                text(StatusCode::SERVICE_UNAVAILABLE, &lines)
            }
        }
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            let faults: String = health
                .faults()
                .iter()
                .map(|(n, r)| format!("{n}: {r}\n"))
                .collect();
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("not ready\n{faults}"),
            )
        }
        path => match extra.and_then(|e| e.answer(path)) {
            Some(page) => reply(
                StatusCode::from_u16(page.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                page.content_type,
                page.body,
            ),
            None => text(StatusCode::NOT_FOUND, "not found\n"),
        },
    }
}

fn reply(status: StatusCode, ctype: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_health_and_metrics() {
        let health = Health::new();
        let mut reg = Registry::with_prefix("ringlb");
        let c: prometheus_client::metrics::counter::Counter = Default::default();
        reg.register("test_events", "test", c.clone());
        c.inc();
        let (addr, task) = serve_ops(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Mutex::new(reg)),
            health.clone(),
        )
        .await
        .unwrap();
        let get = |p: &'static str| get(addr, p);
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        // a fault makes it not ready, with its reason, until it is cleared
        health.set_fault("xdp_tx", Some("transmits fail".into()));
        let r = get("/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("xdp_tx: transmits fail"), "{r}");
        health.set_fault("xdp_tx", None);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        let m = get("/metrics").await;
        assert!(m.contains("ringlb_test_events_total 1"), "{m}");
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        // A loop that stops beating turns /healthz to 503, naming the loop.
        let hb = health.heartbeat("pool-watch", Duration::from_secs(1));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let h = get("/healthz").await;
        assert!(h.starts_with("HTTP/1.1 503"), "{h}");
        assert!(h.contains("stalled: pool-watch silent for"), "{h}");
        hb.beat();
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        // A client that never finishes its request head is dropped, not kept forever.
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(
            HEADER_READ_TIMEOUT + Duration::from_secs(5),
            idle.read_to_end(&mut rest),
        )
        .await
        .expect("the server closes a connection whose head never completes");
        assert!(n.is_ok());
        task.abort();
    }

    /// One `GET path` on a fresh connection; the whole answer.
    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    struct Echo;
    impl ExtraPages for Echo {
        fn answer(&self, path: &str) -> Option<Page> {
            let rest = path.strip_prefix("/echo/")?;
            Some(Page {
                status: if rest == "bad" { 400 } else { 200 },
                content_type: "application/json",
                body: format!("{{\"got\":\"{rest}\"}}"),
            })
        }
    }

    #[tokio::test]
    async fn extra_pages_answer_their_paths_only() {
        let (addr, task) = serve_ops_with(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Mutex::new(Registry::default())),
            Health::new(),
            Some(Arc::new(Echo)),
        )
        .await
        .unwrap();
        let get = |p: &'static str| get(addr, p);
        let ok = get("/echo/a").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("content-type: application/json"), "{ok}");
        assert!(ok.ends_with("{\"got\":\"a\"}"), "{ok}");
        assert!(get("/echo/bad").await.starts_with("HTTP/1.1 400"));
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        task.abort();
    }
}
