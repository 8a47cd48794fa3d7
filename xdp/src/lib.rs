//! The XDP datapath (aya) behind the seam of `ringlb-datapath`, whose types
//! (`Datapath`, `DesiredState`, `Vip`, ...) are re-exported here. Kernel IPVS
//! (`ringlb-ipvs`) implements the same seam.
//!
//! ```text
//!  desired state (pure)          plan() (pure)            apply (I/O)
//!  DesiredState ----------> Programmed + Vec<MapOp> ---> Xdp: batched map writes
//!   services: Vip -> ring        (diff against what        (pinned under
//!   of backend IPs               the maps hold now)         /sys/fs/bpf/ringlb)
//! ```
//!
//! `state` turns Maglev tables into the desired state and diffs two states into
//! map operations without touching the kernel, so the diffing is unit-tested
//! without root; `apply` runs plans through a map layer (`maps`: the kernel's
//! BPF maps, or in memory for tests) and re-reads it after a failed write;
//! `xdp` loads, pins and attaches the program around it.

pub mod abi;
mod abi_check;
pub mod apply;
pub mod attach_mode;
pub mod auto_mode;
pub mod batch;
pub mod bfd_hold;
pub mod cli;
pub mod decap_senders;
pub mod ethtool;
pub mod flow_filter;
pub mod lookup;
pub mod maps;
pub mod node_agent;
pub mod readback;
pub mod src_ranges;
pub mod state;
pub mod vip_filter;
pub mod xdp;

pub use ringlb_bpf_types::BpfError;
pub use ringlb_datapath::{ApplyStats, Counters, Datapath, SourceRange};
pub use state::{
    DesiredState, MapOp, Programmed, Proto, ServiceEntry, Vip, VipAbi, plan, plan_update,
};

/// Errors of the datapath layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("service {vip}: {reason}")]
    InvalidService { vip: String, reason: String },
    #[error("out of {what} ids (max {max})")]
    IdsExhausted { what: &'static str, max: u32 },
    /// Loading, pinning or attaching the program, or a map operation.
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error("{call} failed: {source}")]
    Syscall {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the loader's view of the maps is unknown: {reason}; retrying re-reads them first")]
    ViewUnknown { reason: String },
    #[error(transparent)]
    NextHop(#[from] ringlb_nexthop::Error),
}

impl Error {
    /// Short, stable label for the `ringlb_datapath_errors_total{kind}` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidService { .. } => "invalid_service",
            Error::IdsExhausted { .. } => "ids_exhausted",
            // a missing map has always counted as a map error here
            Error::Bpf(BpfError::Missing { .. }) => "map",
            Error::Bpf(e) => e.metric_label(),
            Error::Syscall { .. } => "syscall",
            Error::NextHop(_) => "nexthop",
            Error::ViewUnknown { .. } => "view_unknown",
        }
    }
}

impl From<Error> for ringlb_datapath::Error {
    /// Behind the seam, under the same `metric_label()`.
    fn from(e: Error) -> Self {
        ringlb_datapath::Error::new(e.metric_label(), e)
    }
}

pub(crate) fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    ringlb_bpf_types::map_err(name)
}

/// The possible CPUs: how many values a per-CPU map has, and how the kernel
/// splits a per-CPU LRU.
pub(crate) fn possible_cpus() -> Result<usize, Error> {
    aya::util::nr_cpus().map_err(|(_, e)| Error::Syscall {
        call: "nr_cpus",
        source: e,
    })
}
