//! Fixtures the planner's tests share: services and states, and the in-memory
//! maps run and read back through the real map path.

use std::net::IpAddr;

use ringlb_nexthop::StaticResolver;

use super::{DesiredState, MapOp, Proto, ReadBack, ServiceEntry, Vip};
use crate::maps::{memory::MemoryMaps, read_back, run_ops};

pub(super) fn vip(last: u8, port: u16) -> Vip {
    Vip {
        addr: IpAddr::from([10, 0, 0, last]),
        port,
        proto: Proto::Tcp,
    }
}

pub(super) fn ip(last: u8) -> IpAddr {
    IpAddr::from([10, 1, 0, last])
}

/// A toy ring: slot s -> backend s % n (enough to test the diff).
pub(super) fn svc(v: &Vip, backends: &[u8], size: usize) -> ServiceEntry {
    let b: Vec<IpAddr> = backends.iter().map(|&x| ip(x)).collect();
    let ring = (0..size).map(|s| (s % b.len()) as u32).collect();
    ServiceEntry::new(v, b, ring).unwrap()
}

pub(super) fn state(entries: Vec<(Vip, ServiceEntry)>) -> DesiredState {
    DesiredState {
        services: entries.into_iter().collect(),
    }
}

/// A service whose ring uses `ready` only; `drain` pods keep an id (their
/// established flows stay) but take no slot.
pub(super) fn draining(v: &Vip, ready: &[u8], drain: &[u8], size: usize) -> ServiceEntry {
    let b: Vec<IpAddr> = ready.iter().chain(drain).map(|&x| ip(x)).collect();
    let ring = (0..size).map(|s| (s % ready.len()) as u32).collect();
    ServiceEntry::new(v, b, ring).unwrap()
}

/// Runs `ops` through the real map-writing path (`maps::run_ops`) into the
/// in-memory map layer. The tombstone generation is what the loader passes: the
/// high-water mark of every generation handed out so far.
pub(super) fn run(m: &mut MemoryMaps, ops: &[MapOp]) {
    let high_water = ops
        .iter()
        .filter_map(|op| match op {
            MapOp::PutBackend { generation, .. } => Some(*generation),
            _ => None,
        })
        .chain(m.backends.get(&0).map(|b| b.generation))
        .max()
        .unwrap_or(0);
    run_ops(m, &StaticResolver::default(), ops, high_water).expect("in-memory writes");
}

/// What a (restarted) loader reads back from `m` (`maps::read_back`).
pub(super) fn read(m: &MemoryMaps) -> ReadBack {
    read_back(m).expect("in-memory reads")
}
