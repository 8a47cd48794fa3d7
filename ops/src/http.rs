//! A tiny HTTP/1.1 server for `/metrics` (Prometheus text), `/healthz` and `/readyz`.
//!
//! It answers GET only and closes each connection after one response; scrapers and
//! kubelet probes need nothing more, and it keeps a web framework out of the binaries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Mutex;

/// Liveness and readiness flags the program flips as it starts and runs.
#[derive(Debug, Default)]
pub struct Health {
    live: AtomicBool,
    ready: AtomicBool,
}

impl Health {
    pub fn new() -> Arc<Self> {
        let h = Self::default();
        h.live.store(true, Ordering::Relaxed);
        Arc::new(h)
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Relaxed);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }
}

/// Binds `addr` and serves the ops endpoints until the task is dropped.
/// Returns the bound address (useful with port 0).
pub async fn serve_ops(
    addr: SocketAddr,
    registry: Arc<Mutex<Registry>>,
    health: Arc<Health>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let registry = registry.clone();
            let health = health.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = match sock.read(&mut buf).await {
                    Ok(n) => n,
                    Err(_) => return,
                };
                let req = String::from_utf8_lossy(&buf[..n]);
                let path = request_path(&req);
                let (status, ctype, body) = match path {
                    Some("/metrics") => {
                        let mut out = String::new();
                        let reg = registry.lock().await;
                        match prometheus_client::encoding::text::encode(&mut out, &reg) {
                            Ok(()) => (
                                "200 OK",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                out,
                            ),
                            Err(e) => ("500 Internal Server Error", "text/plain", e.to_string()),
                        }
                    }
                    Some("/healthz") if health.is_live() => ("200 OK", "text/plain", "ok\n".into()),
                    Some("/healthz") => {
                        ("503 Service Unavailable", "text/plain", "not live\n".into())
                    }
                    Some("/readyz") if health.is_ready() => ("200 OK", "text/plain", "ok\n".into()),
                    Some("/readyz") => (
                        "503 Service Unavailable",
                        "text/plain",
                        "not ready\n".into(),
                    ),
                    Some(_) => ("404 Not Found", "text/plain", "not found\n".into()),
                    None => ("400 Bad Request", "text/plain", "bad request\n".into()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(body.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok((bound, task))
}

/// The path of a `GET` request line, without its query string.
fn request_path(req: &str) -> Option<&str> {
    let line = req.lines().next()?;
    let mut parts = line.split_whitespace();
    if parts.next()? != "GET" {
        return None;
    }
    let target = parts.next()?;
    Some(target.split('?').next().unwrap_or(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_request_path() {
        assert_eq!(request_path("GET /metrics HTTP/1.1\r\n"), Some("/metrics"));
        assert_eq!(
            request_path("GET /readyz?verbose HTTP/1.1\r\n"),
            Some("/readyz")
        );
        assert_eq!(request_path("POST /metrics HTTP/1.1\r\n"), None);
        assert_eq!(request_path(""), None);
    }

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
        let get = |p: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        let m = get("/metrics").await;
        assert!(m.contains("ringlb_test_events_total 1"), "{m}");
        task.abort();
    }
}
