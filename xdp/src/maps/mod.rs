//! The map layer: the writes and reads the apply path makes, behind one trait.
//!
//! ```text
//!  Applier (apply.rs) ── plan() ──> Vec<MapOp> ── run_ops ──> dyn Maps
//!                                                              ├─ KernelMaps: aya, the pinned BPF maps
//!                                                              └─ MemoryMaps: BTreeMaps (feature `memory-maps`,
//!                                                                 tests: failures injected at any write)
//!  a failed write ── read_back(dyn Maps) ──> Programmed::restore ──> View
//! ```
//!
//! `run_ops` and `read_back` are the only code that turns map operations into map
//! writes and map contents into the loader's view, so the failure tests exercise the
//! same path the kernel layer runs.

pub mod kernel;
#[cfg(any(test, feature = "memory-maps"))]
pub mod memory;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ringlb_nexthop::{NextHop, Resolver};

use crate::{
    ApplyStats, Counters, Error, MapOp, SourceRange, Vip, abi, src_ranges, state::ReadBack,
    vip_filter::VipFilter,
};

/// The BPF maps of the XDP program, as the loader writes and reads them.
pub trait Maps {
    /// `backends[ids[i]] = values[i]`, in one batch.
    fn put_backends(&mut self, ids: &[u32], values: &[abi::BackendValue]) -> Result<(), Error>;
    /// `backends[id]`, `None` past the end of the array.
    fn backend(&self, id: u32) -> Result<Option<abi::BackendValue>, Error>;
    /// A new, zeroed ring of `size` slots for `vip_id`, staged until
    /// [`Maps::flush_rings`] puts it at `rings[vip_id]`, and zeroed counters
    /// for `vip_id`.
    fn create_ring(&mut self, vip_id: u32, size: u32) -> Result<(), Error>;
    /// `(slot, backend id)` pairs into the ring of `vip_id` (the staged one if
    /// there is one, else `rings[vip_id]`).
    fn write_slots(&mut self, vip_id: u32, slots: &[(u32, u32)]) -> Result<(), Error>;
    /// Slot `i` of the ring of `vip_id` (as [`Maps::write_slots`] finds it) gets
    /// `ids[i]`, for every `i`: a whole ring without (slot, id) pairs.
    fn write_ring(&mut self, vip_id: u32, ids: &[u32]) -> Result<(), Error>;
    /// Stages an empty one-slot ring for `rings[vip_id]` (frees the old memory
    /// once flushed).
    fn del_ring(&mut self, vip_id: u32) -> Result<(), Error>;
    /// Puts every staged ring into `rings` in one write.
    fn flush_rings(&mut self) -> Result<(), Error>;
    /// Forgets the staged rings (after a failed write: the view is re-read from
    /// what the maps hold).
    fn drop_staged_rings(&mut self);
    /// Every slot of `rings[vip_id]`; `None` if there is none of `size` slots.
    fn ring(&self, vip_id: u32, size: u32) -> Result<Option<Vec<u32>>, Error>;
    fn put_vip(&mut self, vip: &Vip, info: &abi::VipInfo) -> Result<(), Error>;
    /// Deletes the VIP entry; deleting a missing one is not an error.
    fn del_vip(&mut self, vip: &Vip) -> Result<(), Error>;
    /// Every VIP entry.
    fn vips(&self) -> Result<Vec<(Vip, abi::VipInfo)>, Error>;
    /// `owners[id] = owner` for each id (1 + vip_id, and maybe
    /// `abi::OWNER_F_SRC_RANGES`; 0 = none). A layer without an
    /// owners map (pinned by an old release) ignores it.
    fn set_owners(&mut self, ids: &[u32], owner: u32) -> Result<(), Error>;
    /// Every non-zero `owners` entry as id -> vip_id (empty without an owners map).
    fn owners(&self) -> Result<BTreeMap<u32, u32>, Error>;
    /// Sets `addr`'s bit in `vip_filter` (before its `vips` entry is written).
    fn vip_filter_add(&mut self, addr: IpAddr) -> Result<(), Error>;
    /// Makes `vip_filter` exactly `filter` (writes the words that differ from
    /// what this layer last wrote; all of them the first time).
    fn vip_filter_set(&mut self, filter: &VipFilter) -> Result<(), Error>;
    /// Every address in `vip_addrs` (this edge's own VIP addresses).
    fn vip_addrs(&self) -> Result<BTreeSet<IpAddr>, Error>;
    /// Adds `add` to `vip_addrs` and removes `del` (a missing one is no error).
    fn vip_addrs_update(&mut self, add: &[IpAddr], del: &[IpAddr]) -> Result<(), Error>;
    /// Adds `ranges` to `src_ranges` under `vip_id`.
    fn put_src_ranges(&mut self, vip_id: u32, ranges: &[SourceRange]) -> Result<(), Error>;
    /// Removes `ranges` of `vip_id` from `src_ranges` (a missing one is no error).
    fn del_src_ranges(&mut self, vip_id: u32, ranges: &[SourceRange]) -> Result<(), Error>;
    /// Every `src_ranges` entry, by vip_id.
    fn src_ranges(&self) -> Result<BTreeMap<u32, BTreeSet<SourceRange>>, Error>;
    /// `src_sets[set] = value`.
    fn put_src_set(&mut self, set: u32, value: &abi::SrcSet) -> Result<(), Error>;
    /// `src_set_of[vip_id] = set`.
    fn point_src_set(&mut self, vip_id: u32, set: u32) -> Result<(), Error>;
    /// `src_set_of[vip_id]` for each of `vip_ids` (0 = no set).
    fn src_set_of(&self, vip_ids: &[u32]) -> Result<BTreeMap<u32, u32>, Error>;
    /// The global counters, and the per-VIP ones of `vips` (VIP, vip_id), summed
    /// over CPUs.
    fn counters(&self, vips: &[(Vip, u32)]) -> Result<Counters, Error>;
    /// How many vip_ids the per-VIP counter maps hold (the loader sizes them,
    /// `XdpOptions::vip_capacity`): ids are given out below it.
    fn vip_capacity(&self) -> Result<u32, Error> {
        Ok(abi::MAX_VIPS)
    }
}

/// Writes `ops`. Rings are staged and flushed before the first operation that
/// is not about rings, so every later operation sees them in place, as if each
/// were written at once. `tombstone_gen` is the generation high-water mark: every
/// batch of new backends also writes it into `backends[0]` (id 0 is "no
/// backend": family 0, never followed by the program), and a deleted
/// backend slot keeps it too (family 0, so the program treats the slot as
/// empty). A restarted loader reads it back and never hands out a
/// generation a conntrack entry may still carry.
pub fn run_ops(
    maps: &mut dyn Maps,
    resolver: &dyn Resolver,
    ops: &[MapOp],
    tombstone_gen: u32,
) -> Result<ApplyStats, Error> {
    let run = run_staged(maps, resolver, ops, tombstone_gen).and_then(|st| {
        maps.flush_rings()?;
        Ok(st)
    });
    if run.is_err() {
        maps.drop_staged_rings();
    }
    run
}

fn run_staged(
    maps: &mut dyn Maps,
    resolver: &dyn Resolver,
    ops: &[MapOp],
    tombstone_gen: u32,
) -> Result<ApplyStats, Error> {
    let tombstone = abi::BackendValue {
        generation: tombstone_gen,
        ..Default::default()
    };
    let mut st = ApplyStats::default();
    let mut i = 0;
    while i < ops.len() {
        if !matches!(
            ops[i],
            MapOp::CreateRing { .. }
                | MapOp::WriteRing { .. }
                | MapOp::WriteSlots { .. }
                | MapOp::DelRing { .. }
        ) {
            maps.flush_rings()?;
        }
        match &ops[i] {
            MapOp::PutBackend { .. } => {
                // one batch for every consecutive PutBackend
                // (a pod in several services is resolved once)
                let (mut ids, mut vals) = (vec![0], vec![tombstone]);
                let mut nhs = BTreeMap::new();
                while let Some(MapOp::PutBackend {
                    id,
                    addr,
                    generation,
                    remote,
                }) = ops.get(i)
                {
                    let (nh, local) = *nhs
                        .entry(*addr)
                        .or_insert_with(|| next_hop(resolver, *addr));
                    ids.push(*id);
                    vals.push(
                        abi::BackendValue::new(*addr, *generation, nh, *remote).with_local(local),
                    );
                    i += 1;
                }
                maps.put_backends(&ids, &vals)?;
                st.backends_written += ids.len() - 1;
                continue;
            }
            MapOp::CreateRing { vip_id, size } => {
                maps.create_ring(*vip_id, *size)?;
                st.rings_created += 1;
            }
            MapOp::WriteRing { vip_id, ids } => {
                maps.write_ring(*vip_id, ids)?;
                st.slots_written += ids.len();
            }
            MapOp::WriteSlots { vip_id, slots } => {
                maps.write_slots(*vip_id, slots)?;
                st.slots_written += slots.len();
            }
            MapOp::PutVip { vip, info } => {
                // the filter bit first: a packet never finds the entry hidden
                maps.vip_filter_add(vip.addr)?;
                maps.put_vip(vip, info)?;
                st.vips_written += 1;
            }
            MapOp::DelVip { vip } => {
                maps.del_vip(vip)?;
                st.vips_deleted += 1;
            }
            MapOp::DelRing { vip_id } => {
                maps.del_ring(*vip_id)?;
                st.rings_deleted += 1;
            }
            MapOp::Own {
                vip_id,
                ids,
                src_ranges: r,
                draining,
            } => maps.set_owners(ids, src_ranges::owner_value(*vip_id, *r, *draining))?,
            MapOp::PutSrcRanges { vip_id, ranges } => maps.put_src_ranges(*vip_id, ranges)?,
            MapOp::DelSrcRanges { vip_id, ranges } => maps.del_src_ranges(*vip_id, ranges)?,
            MapOp::PutSrcSet { set, ranges } => {
                maps.put_src_set(*set, &src_ranges::set_value(ranges))?
            }
            MapOp::PointSrcSet { vip_id, set } => maps.point_src_set(*vip_id, *set)?,
            MapOp::DelBackend { id } => {
                maps.put_backends(&[*id], &[tombstone])?;
                // after the tombstone: a live id never loses its owner
                maps.set_owners(&[*id], 0)?;
                st.backends_deleted += 1;
            }
        }
        i += 1;
    }
    Ok(st)
}

/// What the maps hold: the VIPs, their rings, the `owners` map and the backends
/// those name (`Programmed::restore` decides who owns what). The generation
/// high-water mark is kept in `backends[0]` (see [`run_ops`]). The 1M-entry
/// `backends` array is never scanned.
pub fn read_back(maps: &dyn Maps) -> Result<ReadBack, Error> {
    let mut r = ReadBack {
        owners: maps.owners()?,
        src_ranges: maps.src_ranges()?,
        vip_capacity: Some(maps.vip_capacity()?),
        ..Default::default()
    };
    let mut entries = maps.vips()?;
    entries.sort_by_key(|(vip, _)| *vip);
    let mut ids: BTreeSet<u32> = r.owners.keys().copied().collect();
    ids.insert(0);
    let vip_ids: Vec<u32> = entries.iter().map(|(_, i)| i.vip_id).collect();
    r.src_set_of = maps.src_set_of(&vip_ids)?;
    for (vip, info) in entries {
        let ring = maps.ring(info.vip_id, info.ring_size)?;
        ids.extend(ring.iter().flatten().copied());
        r.vips.push((vip, info, ring));
    }
    for id in ids {
        if let Some(b) = maps.backend(id)? {
            r.backends.insert(id, b);
        }
    }
    r.high_water = r.backends.remove(&0).map_or(0, |b| b.generation);
    Ok(r)
}

/// The next hop of `addr`, `None` (logged) when unresolved.
/// A backend's next hop, and whether it is a pod on this node (then it has
/// none: the program passes its frames to this node's stack).
pub fn next_hop(resolver: &dyn Resolver, addr: IpAddr) -> (Option<NextHop>, bool) {
    if resolver.is_local(addr) {
        return (None, true);
    }
    (resolve(resolver, addr), false)
}

fn resolve(resolver: &dyn Resolver, addr: IpAddr) -> Option<NextHop> {
    resolver
        .resolve(addr)
        .inspect_err(|e| {
            tracing::warn!(backend = %addr, error = %e, "next hop unresolved; the program will use bpf_fib_lookup")
        })
        .ok()
}
