//! The packet datapath behind one trait: XDP (aya). A kernel IPVS backend would implement
//! the same trait; it is not built (this kernel has no IPVS).
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
pub mod apply;
pub mod batch;
pub mod cli;
pub mod lookup;
pub mod maps;
pub mod metrics;

pub mod readback;
pub mod state;
pub mod xdp;

pub use ringlb_bpf_types::BpfError;
pub use state::{DesiredState, MapOp, Programmed, Proto, ServiceEntry, Vip, plan, plan_update};

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

pub(crate) fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    ringlb_bpf_types::map_err(name)
}

/// What one `apply` wrote, for logs and the update-latency benchmark.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub backends_written: usize,
    pub backends_deleted: usize,
    pub rings_created: usize,
    pub rings_deleted: usize,
    pub slots_written: usize,
    pub vips_written: usize,
    pub vips_deleted: usize,
}

/// Global and per-VIP packet counters, summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// (label, value) in `abi::Stat` order.
    pub global: Vec<(&'static str, u64)>,
    /// (vip, packets, bytes)
    pub per_vip: Vec<(Vip, u64, u64)>,
}

/// The seam the edge agent programs a datapath through: XDP (`xdp::XdpDatapath`
/// over the kernel's maps, or `apply::Applier` over any map layer); an IPVS backend
/// would implement it too.
pub trait Datapath {
    /// Make the kernel state equal `desired`, writing only what differs.
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyStats, Error>;
    /// Changes one service (`None` removes it) without looking at any other.
    fn apply_service(
        &mut self,
        vip: &Vip,
        entry: Option<&ServiceEntry>,
    ) -> Result<ApplyStats, Error>;
    /// Re-resolves the backends' next hops and rewrites the entries that changed;
    /// how many. A datapath whose kernel resolves next hops itself does nothing.
    fn refresh_next_hops(&mut self) -> Result<usize, Error> {
        Ok(0)
    }
    /// Current counters.
    fn counters(&self) -> Result<Counters, Error>;
    /// Detach and remove every kernel object this datapath created.
    fn uninstall(self) -> Result<(), Error>
    where
        Self: Sized;
}
