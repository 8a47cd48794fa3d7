//! The end-to-end network-namespace lab: ringlb's real programs on a small fabric.
//!
//! ```text
//!                       client  eth0 10.210.1.2/24 (tx checksum offload off)
//!                          |
//!                    ve-cl 10.210.1.1
//!  +-------------------------- tor ----------------------------------------------+
//!  | BIRD 2 (AS 65000), ECMP `merge paths`; kube-apiserver bridged to             |
//!  | 10.210.0.1:6443; ringlb-controller; nftables counters (evidence)             |
//!  | br-lb 10.210.0.1/24 (ve-e1, ve-e2: ringlb_pass XDP)   br-pod 10.210.2.1/24   |
//!  +-------|-------------------|-----------------------------|--------------|-----+
//!        edge1               edge2                          pod1           pod2
//!   eth0 10.210.0.11    eth0 10.210.0.12               eth0 10.210.2.21  .22
//!   ringlb-edge run     ringlb-edge run                tc ringlb_decap, VIP on lo,
//!   (XDP ringlb_xdp,    (AS 65001)                     HTTP on :8080 (its own name)
//!    BGP AS 65001)
//! ```
//!
//! client -> ToR (ECMP over the BGP routes of both edges) -> edge XDP (Maglev, IPIP to
//! the pod IP, XDP_TX) -> ToR -> pod (tc decap) -> reply from the VIP straight to the
//! client (DSR), never through an edge.
//!
//! The Kubernetes API is the real control plane (etcd, kube-apiserver,
//! kube-controller-manager) on the host's loopback with the lab kubelet, run by the
//! daemon `ringlb-lab control-plane` ([`api`]); a [`bridge`] puts it at the ToR's
//! fabric address. The controller and the edges use ServiceAccount tokens bound by the
//! chart's RBAC.
//!
//! Modules: [`cmd`] (running programs, in namespaces), [`netns`] (namespaces, links,
//! Drop-guard cleanup), [`daemon`] (spawned programs with PID files), [`addrs`] (the
//! address plan: addresses, ASNs, ports), [`config`] (pure writers and parsers: BIRD
//! config, Nodes, manifests, `birdc`/`ip route`/`nft` output), [`topology`] (the
//! fabric above), [`api`] (control plane, kubelet, bridge, kubeconfigs), [`bridge`]
//! (TCP from a namespace to the host), [`cluster`] (control plane daemon, controller,
//! BIRD, edges, kubectl), [`httpd`] (the pods' HTTP server),
//! [`gtm`] (two such regions behind a core router, for the global traffic manager),
//! [`pdns`] (PowerDNS as that traffic manager), [`scale`] (the edge at datacenter
//! scale: many Services, one edge started cold) and [`vm`] (the same lab with IPVS
//! edges inside a Debian kernel under qemu).

pub mod addrs;
pub mod api;
pub mod bridge;
pub mod cluster;
pub mod cmd;
pub mod config;
pub use ringlb_controlplane::daemon;
pub mod gtm;
pub mod httpd;
pub mod measure;
pub mod netns;
pub mod pdns;
pub mod scale;
pub mod topology;
pub mod vm;

use std::time::Duration;

pub use addrs::Addrs;
pub use cluster::{Bins, Cluster, EdgeDatapath};
pub use topology::Topology;

/// What can go wrong in the lab.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("cannot run `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
    #[error("program `{name}` not found (looked in {searched}); build it: {hint}")]
    MissingBinary {
        name: String,
        searched: String,
        hint: String,
    },
    #[error(transparent)]
    Daemon(#[from] daemon::Error),
    #[error("the lab cannot run here: {0}")]
    Unsupported(String),
    #[error("unexpected output of `{what}`: {detail}")]
    Parse { what: String, detail: String },
    #[error("control plane: {0}")]
    ControlPlane(#[source] Box<crate::controlplane::Error>),
}

impl From<crate::controlplane::Error> for Error {
    fn from(e: crate::controlplane::Error) -> Error {
        Error::ControlPlane(Box::new(e))
    }
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the lab cannot run on this machine, if it cannot: not root, or a tool missing.
/// (kubectl and the control plane come from `make k8s`; a missing build is an error
/// when the lab starts, not a reason to skip.)
pub fn skip_reason() -> Option<String> {
    if !cmd::is_root() {
        return Some("needs root (network namespaces, BPF, nftables)".into());
    }
    for tool in [
        "ip", "tc", "nft", "bird", "birdc", "curl", "ethtool", "mount",
    ] {
        if cmd::which(tool).is_none() {
            return Some(format!(
                "`{tool}` is not installed (scripts/setup.sh installs it)"
            ));
        }
    }
    None
}

/// Polls `f` every `every` until it returns `Ok(Ok(v))` or `limit` passes. `f`
/// returns `Ok(Err(seen))` (or a transient error) with what it saw; an
/// exited daemon ([`daemon::Error::DaemonExited`]) ends the wait at once.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut f: impl FnMut() -> Result<Result<T, String>>,
) -> Result<T> {
    let start = std::time::Instant::now();
    loop {
        let last = match f() {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(seen)) => seen,
            // a daemon died: waiting longer cannot help
            Err(e @ Error::Daemon(daemon::Error::DaemonExited { .. })) => return Err(e),
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= limit {
            return Err(Error::Timeout {
                what: what.to_string(),
                waited: start.elapsed(),
                last,
            });
        }
        std::thread::sleep(every);
    }
}
