//! ringlb's worker-node datapath: two tc BPF programs on the node's uplink(s)
//! and their loader.
//!
//! ```text
//!  desired state (pure)        plan() (pure)          apply (I/O)
//!  NodeState -------------> Vec<MapOp> -----------> local_pods, services
//!   pods, (pod, VIP, port,     (diff against what     (pinned under
//!   proto) -> targetPort        the maps hold)         /sys/fs/bpf/ringlb-node)
//!
//!  uplink ingress: IPIP/IP6IP6 to a local pod -> decap, VIP:port -> pod:targetPort,
//!                  flows[client, pod] = VIP:port -> routing delivers to the pod
//!  uplink egress:  pod:targetPort -> client with a flow -> VIP:port (DSR),
//!                  SYN-ACK MSS clamp, ICMP errors translated
//! ```
//!
//! `state` and `maps::apply` are tested without root; `loader` loads, pins,
//! attaches and runs the programs (BPF_PROG_TEST_RUN fixtures in `tests/`).
//! See docs/node.md.

pub mod abi;
pub mod loader;
pub mod maps;
pub mod state;

pub use loader::{Hook, NodeDatapath, NodeOptions};
pub use ringlb_bpf_types::BpfError;
pub use state::{MapOp, NodeState, Proto, ServiceKey, ServiceTarget, plan};

/// The compiled BPF object (built by build.rs).
pub mod objects {
    /// Both programs and their maps.
    pub static NODE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node.o"));
}

/// Errors of the node datapath.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("entry {entry}: {reason}")]
    InvalidEntry { entry: String, reason: String },
    /// Loading, pinning or attaching the programs, or a map operation.
    #[error(transparent)]
    Bpf(#[from] BpfError),
}

impl Error {
    /// Label for `ringlb_node_errors_total{kind=...}`.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidEntry { .. } => "invalid_entry",
            Error::Bpf(e) => e.metric_label(),
        }
    }
}

pub(crate) fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    ringlb_bpf_types::map_err(name)
}
