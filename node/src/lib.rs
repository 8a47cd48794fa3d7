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

use std::path::PathBuf;

pub use loader::{Hook, NodeDatapath, NodeOptions};
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
    #[error("loading the BPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("BPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("BPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("BPF map {name}: {reason}")]
    Layout { name: &'static str, reason: String },
    #[error("{name} is missing from the object")]
    Missing { name: &'static str },
    #[error("pinning under {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("interface {iface}: {reason}")]
    Interface { iface: String, reason: String },
}

impl Error {
    /// Label for `ringlb_node_errors_total{kind=...}`.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidEntry { .. } => "invalid_entry",
            Error::Load(_) => "load",
            Error::Program { .. } => "program",
            Error::Map { .. } => "map",
            Error::Layout { .. } => "layout",
            Error::Missing { .. } => "missing",
            Error::Pin { .. } => "pin",
            Error::Interface { .. } => "interface",
        }
    }
}

pub(crate) fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |e| Error::Map {
        name,
        source: Box::new(e),
    }
}
