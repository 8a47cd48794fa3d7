//! kube-apiserver's way into the fabric: an HTTP CONNECT proxy on a unix socket
//! (kube-apiserver's egress selector, `proxyProtocol: HTTPConnect` over `uds`), which
//! dials each target from inside the ToR namespace. kube-apiserver runs on the host's
//! loopback; with this, `kubectl logs`, `exec` and `port-forward` reach the kubelets
//! at their node addresses, as on a real cluster.
//!
//! ```text
//!  kube-apiserver ── CONNECT 172.31.0.21:10250 ──► <dir>/egress.sock (this task)
//!                                                   │ connect() in <prefix>-tor
//!                                                   ▼
//!                                         kubelet 172.31.0.21:10250
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::lab::{Error, Result};

/// A running proxy; the socket and every tunnel close on drop.
pub struct Egress {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl Egress {
    /// Listens on unix socket `path` and dials targets inside namespace `netns`.
    pub fn start(path: &Path, netns: &str) -> Result<Egress> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .map_err(Error::io(format!("listening on {}", path.display())))?;
        let task = tokio::spawn(accept_loop(listener, netns.to_string()));
        Ok(Egress {
            path: path.to_path_buf(),
            task,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn accept_loop(listener: UnixListener, netns: String) {
    let mut tunnels = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => {
                    let netns = netns.clone();
                    tunnels.spawn(async move {
                        if let Err(e) = tunnel(conn, &netns).await {
                            tracing::debug!(error = %e, "egress: tunnel");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "egress: accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = tunnels.join_next() => {}
        }
    }
}

/// Reads `CONNECT host:port HTTP/1.1` and its headers, dials, answers 200, then copies
/// both ways.
async fn tunnel(mut conn: UnixStream, netns: &str) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await? == 0 || head.len() > 8192 {
            return Err(std::io::Error::other("CONNECT request cut short"));
        }
        head.push(byte[0]);
    }
    let target = match connect_target(&String::from_utf8_lossy(&head)) {
        Some(t) => t,
        None => {
            conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await?;
            return Err(std::io::Error::other("not a CONNECT request"));
        }
    };
    let ns = netns.to_string();
    let std_stream = tokio::task::spawn_blocking(move || {
        ringlb_ops::netns::in_named(&ns, || {
            let s =
                std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_secs(5))?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    })
    .await
    .map_err(std::io::Error::other)?;
    let mut upstream = match std_stream.and_then(TcpStream::from_std) {
        Ok(s) => s,
        Err(e) => {
            conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
            return Err(e);
        }
    };
    let _ = upstream.set_nodelay(true);
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}

/// The target of an HTTP CONNECT request's first line (`CONNECT 10.0.0.1:10250
/// HTTP/1.1`, or `[fd00::1]:10250` for IPv6).
fn connect_target(head: &str) -> Option<SocketAddr> {
    let mut words = head.lines().next()?.split_whitespace();
    if words.next()? != "CONNECT" {
        return None;
    }
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_target_reads_v4_and_v6_and_refuses_other_methods() {
        assert_eq!(
            connect_target("CONNECT 172.31.0.21:10250 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("172.31.0.21:10250".parse().unwrap())
        );
        assert_eq!(
            connect_target("CONNECT [fd00:31::21]:10250 HTTP/1.1\r\n\r\n"),
            Some("[fd00:31::21]:10250".parse().unwrap())
        );
        assert_eq!(connect_target("GET / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(
            connect_target("CONNECT node-a:10250 HTTP/1.1\r\n\r\n"),
            None
        );
    }
}
