//! The datapath seam: what the edge agent programs (`DesiredState`: VIP:port:protocol
//! -> backends and their Maglev ring), the `Datapath` trait it programs through, and
//! a datapath-neutral `Error`. Two datapaths implement it: XDP (`ringlb-xdp`, aya)
//! and kernel IPVS (`ringlb-ipvs`, generic netlink). This crate has neither aya nor
//! Kubernetes, so the IPVS path builds without BPF and the agent's sync without
//! either datapath.
//!
//! ```text
//!  edge agent ──> DesiredState ──> dyn Datapath ──┬─> XdpDatapath (BPF maps)
//!                                                 └─> IpvsDatapath (IPVS, mh)
//! ```

mod error;
mod proto;
mod ranges;
mod state;

pub use error::{Error, InvalidService};
pub use proto::Proto;
pub use ranges::SourceRange;
pub use state::{DesiredState, ServiceEntry, Vip};

/// What one `apply` wrote, for logs and the update-latency benchmark. The fields
/// are named after the XDP maps; a datapath without a counterpart leaves them 0
/// (IPVS: a virtual service is a "VIP", a real server a "backend"; the kernel
/// builds its own Maglev table, so no ring or slot is written).
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
    /// (label, value) of datapath-wide counters (XDP: in `abi::Stat` order;
    /// IPVS: none).
    pub global: Vec<(&'static str, u64)>,
    /// (vip, packets, bytes)
    pub per_vip: Vec<(Vip, u64, u64)>,
    /// (vip, reason, packets) the datapath dropped for a VIP on purpose
    /// (XDP: `source_range`, a source outside the Service's ranges); only
    /// the reasons a datapath counts.
    pub per_vip_dropped: Vec<(Vip, &'static str, u64)>,
}

/// The seam the edge agent programs a datapath through: XDP (`ringlb_xdp`'s
/// `XdpDatapath` over the kernel's maps, or its `Applier` over any map layer) or
/// IPVS (`ringlb_ipvs::IpvsDatapath` over netlink or an in-memory kernel).
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
    /// Current counters. `&mut`: reading them may take a request on a socket the
    /// datapath owns (IPVS).
    fn counters(&mut self) -> Result<Counters, Error>;
    /// Detach and remove every kernel object this datapath created.
    fn uninstall(self) -> Result<(), Error>
    where
        Self: Sized;
}
