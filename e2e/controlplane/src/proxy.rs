//! A TCP proxy on loopback in front of kube-apiserver that can stall: while stalled it
//! forwards no bytes in either direction (requests hang, as behind a stuck load
//! balancer or a black-holed link), and new connections are accepted but not served.
//! TLS passes through untouched, so clients still verify the API server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running proxy; stops (and drops every connection) on drop.
pub struct StallProxy {
    addr: SocketAddr,
    stalled: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl StallProxy {
    /// Listens on 127.0.0.1:<free> and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<StallProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stalled = Arc::new(AtomicBool::new(false));
        let flag = stalled.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let flag = flag.clone();
                conns.spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, flag).await;
                    }
                });
            }
        });
        Ok(StallProxy {
            addr,
            stalled,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops (true) or resumes (false) forwarding.
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(a: TcpStream, b: TcpStream, stalled: Arc<AtomicBool>) {
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    tokio::select! {
        _ = pump(ar, bw, stalled.clone()) => {}
        _ = pump(br, aw, stalled) => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
