//! A TCP bridge from a lab namespace to the host: its listening socket is created
//! inside the namespace (on a thread that entered it), every accepted connection is
//! forwarded to an address in the host's namespace. The lab uses it to put
//! kube-apiserver, which listens on the host's loopback, at the ToR's fabric address.
//!
//! ```text
//!  <prefix>-tor  10.210.0.1:6443 (listener made in the ToR namespace)
//!        │ accept ─► one task per connection: copy both ways
//!        ▼
//!  host  127.0.0.1:<kube-apiserver port>
//! ```
//!
//! TLS passes through untouched: clients verify kube-apiserver's certificate, which
//! names the bridge address (`controlplane::Options::extra_sans`).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::{Error, Result};

/// A running bridge; the listener and every forwarded connection close on drop.
pub struct Bridge {
    listen: SocketAddr,
    task: JoinHandle<()>,
}

impl Bridge {
    /// Listens on `listen` inside network namespace `netns` (a name under
    /// /run/netns) and forwards each connection to `target`.
    pub fn start(netns: &str, listen: SocketAddr, target: SocketAddr) -> Result<Bridge> {
        let std_listener = ringlb_ops::netns::in_named(netns, || {
            let l = std::net::TcpListener::bind(listen)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .map_err(Error::io(format!(
            "listening on {listen} in namespace {netns}"
        )))?;
        let listener = TcpListener::from_std(std_listener)
            .map_err(Error::io(format!("registering the listener on {listen}")))?;
        let task = tokio::spawn(accept_loop(listener, target));
        Ok(Bridge { listen, task })
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr) {
    // owned by this task: aborting it drops the set, which aborts every connection
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((mut inbound, peer)) => {
                    conns.spawn(async move {
                        let mut outbound = match TcpStream::connect(target).await {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::warn!(%peer, %target, error = %e, "bridge: connecting");
                                return;
                            }
                        };
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bridge: accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next() => {}
        }
    }
}
