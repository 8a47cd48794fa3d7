//! The kernel layer: one trait, two implementations. `NetlinkKernel` speaks
//! generic netlink to IPVS and rtnetlink for the VIPs on `lo`; `MemoryKernel`
//! (feature `memory-kernel`, tests only) holds the same state in memory and
//! fails chosen writes, so the datapath's failure tests run the real apply
//! path without IPVS.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::Error;
use crate::model::{Dest, Service, ServiceKey, Stats};
use crate::plan::Op;

#[cfg(any(test, feature = "memory-kernel"))]
pub mod memory;
pub mod netlink;
mod socket;

/// What the datapath needs from the kernel.
pub trait Kernel {
    /// Every address-and-port IPVS service (firewall-mark ones left out),
    /// ringlb's or not, with its counters.
    fn services(&mut self) -> Result<Vec<(Service, Stats)>, Error>;
    /// A service's real servers in the kernel's list order (head first).
    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<Dest>, Error>;
    /// The VIPs ringlb bound (see `codec::addr` for how they are marked).
    fn vips(&mut self) -> Result<BTreeSet<IpAddr>, Error>;
    /// One write. On error nothing is known about it: the caller re-reads.
    fn write(&mut self, op: &Op) -> Result<(), Error>;
}
