//! The lab's Kubernetes API: the real control plane ([`crate::controlplane`]: etcd,
//! kube-apiserver, kube-controller-manager) on the host's loopback, the lab kubelet for
//! the lab's Nodes and pods, and a [`Bridge`] that puts kube-apiserver at the ToR's
//! fabric address, where the controller (ToR namespace) and the edges (edge
//! namespaces) reach it as they would reach a cluster's API.
//!
//! ```text
//!  ringlb-lab control-plane (a lab daemon on the host; outlives `ringlb-lab up`)
//!    ├─ ControlPlane  https://127.0.0.1:<port>, serving cert also for 10.210.0.1
//!    ├─ chart RBAC in ringlb-system; TokenRequests for ringlb-controller, ringlb-edge
//!    ├─ LabKubelet    Nodes edge1, edge2 (no pods), lab-worker; pods get the lab's IPs
//!    └─ Bridge        <prefix>-tor 10.210.0.1:6443 ─► 127.0.0.1:<port>
//!  writes <dir>/kubeconfig (admin), ringlb-controller.kubeconfig and
//!  ringlb-edge.kubeconfig (ServiceAccount tokens; all three via
//!  the bridge), then <dir>/control-plane.ready; SIGTERM stops everything.
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::controlplane::{ControlPlane, KubeletOptions, LabKubelet, Options};

use super::addrs::Addrs;
use super::bridge::Bridge;
use super::{Error, Result, config};

/// The namespace the chart's RBAC (ServiceAccounts, leader-election Role) goes into.
pub const RELEASE_NAMESPACE: &str = "ringlb-system";
/// Written once every kubeconfig is in place and the bridge listens.
pub const READY_FILE: &str = "control-plane.ready";
/// The ServiceAccounts of the chart's RBAC templates.
pub const CONTROLLER_SA: &str = "ringlb-controller";
pub const EDGE_SA: &str = "ringlb-edge";
pub const NODE_SA: &str = "ringlb-node";

/// The admin kubeconfig (system:masters; for kubectl), via the bridge.
pub fn admin_kubeconfig(dir: &Path) -> PathBuf {
    dir.join("kubeconfig")
}

/// ServiceAccount `sa`'s kubeconfig (a bound token), via the bridge.
pub fn sa_kubeconfig(dir: &Path, sa: &str) -> PathBuf {
    dir.join(format!("{sa}.kubeconfig"))
}

/// The control plane (its serving certificate also for `extra_sans`) with the chart's
/// RBAC in [`RELEASE_NAMESPACE`] and the lab kubelet for `a`'s Nodes (no pods).
pub async fn start_control_plane(
    a: &Addrs,
    extra_sans: Vec<IpAddr>,
) -> crate::controlplane::Result<(ControlPlane, LabKubelet)> {
    let cp = ControlPlane::start(Options {
        extra_sans,
        ..Options::default()
    })
    .await?;
    cp.apply_chart_rbac(RELEASE_NAMESPACE).await?;
    let kubelet = cp
        .start_kubelet(KubeletOptions {
            nodes: config::lab_nodes(a),
            pod_ips: Vec::new(),
            pod_cidrs: Vec::new(),
        })
        .await?;
    Ok((cp, kubelet))
}

/// The running control plane, kubelet and bridge (dropped in this order: bridge,
/// kubelet, then the control plane's processes).
pub struct LabApi {
    _bridge: Bridge,
    _kubelet: LabKubelet,
    cp: ControlPlane,
}

impl LabApi {
    /// Starts everything for the lab `prefix` and writes the kubeconfigs into `dir`.
    /// The ToR namespace must exist with its fabric address (`Topology::up`).
    pub async fn start(dir: &Path, prefix: &str, a: &Addrs) -> Result<LabApi> {
        let tor: IpAddr = a
            .tor_fabric
            .parse()
            .map_err(|e| Error::Unsupported(format!("ToR address {}: {e}", a.tor_fabric)))?;
        let (cp, kubelet) = start_control_plane(a, vec![tor]).await?;
        let listen = SocketAddr::new(tor, a.api_port);
        let bridge = Bridge::start(&format!("{prefix}-tor"), listen, cp.api_addr())?;
        let api = LabApi {
            _bridge: bridge,
            _kubelet: kubelet,
            cp,
        };
        api.write_kubeconfig(api.cp.kubeconfig_path(), &admin_kubeconfig(dir), listen)?;
        for sa in [CONTROLLER_SA, EDGE_SA, NODE_SA] {
            let direct = api
                .cp
                .service_account_kubeconfig(RELEASE_NAMESPACE, sa)
                .await?;
            api.write_kubeconfig(&direct, &sa_kubeconfig(dir, sa), listen)?;
        }
        let ready = dir.join(READY_FILE);
        std::fs::write(&ready, api.cp.url())
            .map_err(Error::io(format!("writing {}", ready.display())))?;
        Ok(api)
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// Copies kubeconfig `from` to `to` with the server address `via` (the bridge).
    fn write_kubeconfig(&self, from: &Path, to: &Path, via: SocketAddr) -> Result<()> {
        let rewritten = self.cp.kubeconfig_via(from, via)?;
        std::fs::copy(&rewritten, to)
            .map(|_| ())
            .map_err(Error::io(format!("writing {}", to.display())))
    }
}
