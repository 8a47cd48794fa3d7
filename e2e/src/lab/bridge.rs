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

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

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
        let std_listener = in_netns(netns, || {
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

/// Runs `make` (which creates sockets) inside namespace `name`, on a thread made for
/// it: a socket keeps the namespace it was created in, the thread's change dies with
/// the thread, and no other thread of the process ever changes namespace.
fn in_netns<T: Send>(
    name: &str,
    make: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(std::io::Error::other(format!(
            "{name:?} is not a namespace name"
        )));
    }
    let ns = File::open(format!("/run/netns/{name}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            setns_net(ns.as_fd())?;
            make()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("namespace thread panicked")))
    })
}

/// Enters the network namespace of `fd` on the calling thread only.
#[allow(unsafe_code)] // setns(2) has no safe wrapper in libc; only called on a thread made for it
fn setns_net(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: setns takes a valid, open descriptor (borrowed for the call) and only
    // changes the network namespace of the calling thread.
    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_as_namespace_names() {
        for bad in ["", "..", "a/b"] {
            assert!(in_netns(bad, || Ok(())).is_err(), "{bad:?}");
        }
    }
}
