//! The IPVS lab in a VM (`ringlb-lab ipvs-vm`): the namespace lab with both edges
//! on `--datapath ipvs`, inside a Debian kernel booted under qemu (this host's
//! kernel has no IPVS). docs/lab.md, "The IPVS lab in a VM".
//!
//! ```text
//!  host                                         guest (kernels crate: qemu TCG)
//!  ringlb-lab ipvs-vm ([`host`])                 /tests/ipvs_lab -> ringlb-lab vm-guest ([`guest`])
//!   ├─ ControlPlane 127.0.0.1:P  <── guestfwd ──  eth0 10.0.2.15 ── 10.0.2.100:6443
//!   │   (SANs 10.210.0.1, 10.0.2.100)   `ringlb-lab connect`      ▲ Bridge (ToR ns 10.210.0.1:6443)
//!   ├─ lab kubelet: edge1, edge2, node1..3     fabric of namespaces: client, ToR (BIRD ECMP),
//!   ├─ ringlb-controller (host loopback)       edge1/edge2 `ringlb-edge run --datapath ipvs`,
//!   ├─ IPPool, BGPPeer, Deployment(3), Service node1..3 `ringlb-edge node`, pod1..3 HTTP
//!   ├─ lab.cpio: binaries + libs, kubeconfigs, /etc/ringlb-lab/vm.json
//!   └─ boot, then read the results port ───────  libtest-style lines + FIGURE lines
//! ```
//!
//! Kubernetes stays on the host (it would be slow under emulation); the guest
//! reaches kube-apiserver only through qemu's user network with `restrict=on`: no
//! other traffic leaves the guest.

pub mod flows;
pub mod guest;
pub mod host;
pub mod ipvsadm;

use serde::{Deserialize, Serialize};

/// Where the guest reaches the host's kube-apiserver (qemu `guestfwd`).
pub const GUEST_API: &str = "10.0.2.100:6443";
/// The guest's own address on qemu's user network.
pub const GUEST_ADDR: &str = "10.0.2.15/24";
/// The lab's files in the guest: kubeconfigs and [`VmConfig`] (`vm.json`).
pub const GUEST_ETC: &str = "/etc/ringlb-lab";
/// The admin kubeconfig the guest program uses (server [`GUEST_API`]).
pub const GUEST_ADMIN_KUBECONFIG: &str = "admin-guest.kubeconfig";
/// The name of the test executable in the guest (`/tests/ipvs_lab`).
pub const TEST_NAME: &str = "ipvs_lab";
/// Lines with a measured figure start with this on the results port.
pub const FIGURE: &str = "FIGURE ";

/// What the host tells the guest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// The Service's VIP, allocated before the guest boots.
    pub vip: String,
    /// Flows (source ports) asked for the per-flow maps.
    pub flows: u16,
    /// Long downloads in flight when an edge is killed.
    pub long_flows: u16,
}
