//! The map layer over the kernel: the loaded object's BPF maps through aya.
//! Rings are written straight into their mmapped memory; backends and owners in
//! `BPF_MAP_UPDATE_BATCH` batches (`batch.rs`). New and deleted rings are staged
//! and enter the `rings` map of maps in one batch: the kernel waits an RCU grace
//! period after each write to a map of maps (milliseconds each), and after a
//! batch only once. Kernels without batch operations on a map of maps (5.10)
//! get one update per ring.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

use aya::{
    Ebpf,
    maps::{Array, ArrayOfMaps, HashMap, IterableMap, LpmTrie, MapData, PerCpuArray, PerCpuValues},
};

use super::Maps;
use crate::flow_filter::{self, FilterBits, RebuildStats};
use crate::vip_filter::VipFilter;
use crate::{
    BpfError, Counters, Error, SourceRange, Vip, VipAbi, abi,
    batch::{
        self, BPF_F_MMAPABLE, read_mmapped_u32, update_batch, write_mmapped_ring, write_mmapped_u32,
    },
    map_err, src_ranges,
};

/// `BPF_F_INNER_MAP`: inner maps of different sizes may share the outer map.
const BPF_F_INNER_MAP: u32 = 0x1000;

/// The kernel's "operation not supported" (524), which `bpf()` returns for a
/// batch operation a map type lacks.
const ENOTSUPP: i32 = 524;

/// The most rings staged at once: each holds a file descriptor until it is
/// flushed, and the process's limit may be as low as 1,024.
const MAX_STAGED: usize = 512;

/// The loaded object's maps (and its programs, which the loader attaches).
pub struct KernelMaps {
    ebpf: Ebpf,
    /// The `owners` map, taken out of the object (the program reads it on a
    /// conntrack hit): backend id -> 1 + vip_id of the service that owns the id,
    /// 0 = none. Pinned next to the program's maps, so a restarted loader
    /// knows which service each id belongs to, also ids no ring names (a
    /// draining pod that only keeps its established flows).
    owners: Option<Array<MapData, u32>>,
    /// What this layer last wrote into `vip_filter` (`None`: not written yet, the
    /// kernel map may hold anything a pinned earlier run left).
    filter: Option<VipFilter>,
    /// Rings made since the last flush, not yet in `rings`, by vip_id.
    staged: BTreeMap<u32, Staged>,
    /// The one-slot ring every deleted vip_id points at (made once).
    empty: Option<Array<MapData, u32>>,
}

/// A ring waiting for [`Maps::flush_rings`].
enum Staged {
    /// A new inner map (its slots may already be written).
    Ring(Array<MapData, u32>),
    /// The shared one-slot ring: the vip_id's ring is deleted.
    Empty,
}

impl KernelMaps {
    pub fn new(ebpf: Ebpf, owners: Option<Array<MapData, u32>>) -> Self {
        Self {
            ebpf,
            owners,
            filter: None,
            staged: BTreeMap::new(),
            empty: None,
        }
    }

    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub fn owners_map(&self) -> Option<&Array<MapData, u32>> {
        self.owners.as_ref()
    }

    /// Map `name` with its Rust key/value types (aya checks their sizes).
    pub fn map<'a, T>(&'a self, name: &'static str) -> Result<T, Error>
    where
        T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = self.ebpf.map(name).ok_or(BpfError::Missing { name })?;
        T::try_from(m).map_err(map_err(name))
    }

    pub fn map_mut<'a, T>(&'a mut self, name: &'static str) -> Result<T, Error>
    where
        T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = self.ebpf.map_mut(name).ok_or(BpfError::Missing { name })?;
        T::try_from(m).map_err(map_err(name))
    }

    fn new_ring(size: u32) -> Result<Array<MapData, u32>, Error> {
        Array::<MapData, u32>::create(size, BPF_F_INNER_MAP | BPF_F_MMAPABLE)
            .map_err(map_err("ring"))
    }

    /// Runs `f` on the ring of `vip_id`: the staged one if there is one, else
    /// `rings[vip_id]`.
    fn with_ring(
        &self,
        vip_id: u32,
        f: impl FnOnce(&Array<MapData, u32>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        match self.staged.get(&vip_id) {
            Some(Staged::Ring(r)) => f(r),
            Some(Staged::Empty) => Err(BpfError::Missing { name: "ring" }.into()),
            None => {
                let rings: ArrayOfMaps<&MapData, Array<MapData, u32>> =
                    self.map(abi::map::RINGS)?;
                f(&rings.get(&vip_id, 0).map_err(map_err(abi::map::RINGS))?)
            }
        }
    }

    /// Zeroes entry `index` of the PERCPU_ARRAY `name` on every CPU.
    fn zero_per_cpu<V: aya::Pod + Default>(
        &mut self,
        name: &'static str,
        index: u32,
    ) -> Result<(), Error> {
        let ncpu = crate::possible_cpus()?;
        let zeros = PerCpuValues::try_from((0..ncpu).map(|_| V::default()).collect::<Vec<_>>())
            .map_err(|e| Error::Syscall {
                call: "PerCpuValues",
                source: e,
            })?;
        let mut m: PerCpuArray<_, V> = self.map_mut(name)?;
        m.set(index, zeros, 0).map_err(map_err(name))
    }

    /// Runs `f` over the `flow_filter` map's memory (mmapped; see
    /// `flow_filter.rs`).
    pub fn with_flow_filter<T>(&self, f: impl FnOnce(&FilterBits<'_>) -> T) -> Result<T, Error> {
        let name = abi::map::FLOW_FILTER;
        let Some(aya::maps::Map::Array(data)) = self.ebpf.map(name) else {
            return Err(BpfError::Missing { name }.into());
        };
        with_flow_filter_of(data, f)
    }

    /// Every key of the conntrack map (`BPF_MAP_LOOKUP_BATCH`).
    pub fn conntrack_keys(&self) -> Result<Vec<abi::Flow>, Error> {
        let ct: HashMap<&MapData, abi::Flow, abi::CtValue> = self.map(abi::map::CONNTRACK)?;
        conntrack_keys_of(ct.map())
    }
}

impl Maps for KernelMaps {
    fn put_backends(&mut self, ids: &[u32], values: &[abi::BackendValue]) -> Result<(), Error> {
        let m: Array<&MapData, abi::BackendValue> = self.map(abi::map::BACKENDS)?;
        update_batch(m.map().fd().as_fd(), ids, values)
    }

    fn backend(&self, id: u32) -> Result<Option<abi::BackendValue>, Error> {
        let m: Array<_, abi::BackendValue> = self.map(abi::map::BACKENDS)?;
        if id >= m.len() {
            return Ok(None);
        }
        m.get(&id, 0).map(Some).map_err(map_err(abi::map::BACKENDS))
    }

    fn create_ring(&mut self, vip_id: u32, size: u32) -> Result<(), Error> {
        if self.staged.len() >= MAX_STAGED {
            self.flush_rings()?;
        }
        self.staged
            .insert(vip_id, Staged::Ring(Self::new_ring(size)?));
        // a reused vip_id starts afresh: no counts, no open insert window
        self.zero_per_cpu::<abi::VipStats>(abi::map::VIP_STATS, vip_id)?;
        self.zero_per_cpu::<abi::CtBudget>(abi::map::CT_BUDGET, vip_id)?;
        self.zero_per_cpu::<u64>(abi::map::SRC_DROPS, vip_id)
    }

    fn write_slots(&mut self, vip_id: u32, slots: &[(u32, u32)]) -> Result<(), Error> {
        // straight into the mmapped ring; a ring without BPF_F_MMAPABLE (made by
        // an older loader) gets one batch
        self.with_ring(vip_id, |ring| {
            let fd = ring.map().fd().as_fd();
            if write_mmapped_u32(fd, ring.len(), slots).is_err() {
                let (keys, vals): (Vec<u32>, Vec<u32>) = slots.iter().copied().unzip();
                update_batch(fd, &keys, &vals)?;
            }
            Ok(())
        })
    }

    fn write_ring(&mut self, vip_id: u32, ids: &[u32]) -> Result<(), Error> {
        self.with_ring(vip_id, |ring| {
            let fd = ring.map().fd().as_fd();
            if write_mmapped_ring(fd, ring.len(), ids).is_err() {
                let keys: Vec<u32> = (0..ids.len() as u32).collect();
                update_batch(fd, &keys, ids)?;
            }
            Ok(())
        })
    }

    fn del_ring(&mut self, vip_id: u32) -> Result<(), Error> {
        // An array of maps has no delete; pointing the slot at the shared
        // one-slot ring releases the old inner map's memory.
        if self.empty.is_none() {
            self.empty = Some(Self::new_ring(1)?);
        }
        if self.staged.len() >= MAX_STAGED {
            self.flush_rings()?;
        }
        self.staged.insert(vip_id, Staged::Empty);
        Ok(())
    }

    fn flush_rings(&mut self) -> Result<(), Error> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let staged = std::mem::take(&mut self.staged);
        let empty = self.empty.as_ref().map(|e| e.map().fd().as_fd());
        let (mut keys, mut fds) = (Vec::new(), Vec::new());
        for (vip_id, s) in &staged {
            let fd = match s {
                Staged::Ring(r) => r.map().fd().as_fd(),
                Staged::Empty => empty.ok_or(BpfError::Missing { name: "ring" })?,
            };
            keys.push(*vip_id);
            fds.push(fd.as_raw_fd() as u32);
        }
        let name = abi::map::RINGS;
        let Some(aya::maps::Map::ArrayOfMaps(rings)) = self.ebpf.map(name) else {
            return Err(BpfError::Missing { name }.into());
        };
        // the outer map holds its own references; `staged` closes ours
        match update_batch(rings.fd().as_fd(), &keys, &fds) {
            Err(Error::Syscall { source, .. }) if source.raw_os_error() == Some(ENOTSUPP) => {}
            done => return done,
        }
        // A kernel without batch operations on a map of maps (5.10): one
        // update, and one grace period, per ring.
        let mut rings: ArrayOfMaps<&mut MapData, Array<MapData, u32>> =
            match self.ebpf.map_mut(name) {
                Some(m) => m.try_into().map_err(map_err(name))?,
                None => return Err(BpfError::Missing { name }.into()),
            };
        for (vip_id, s) in &staged {
            let ring = match s {
                Staged::Ring(r) => r,
                Staged::Empty => self
                    .empty
                    .as_ref()
                    .ok_or(BpfError::Missing { name: "ring" })?,
            };
            rings.set(*vip_id, ring, 0).map_err(map_err(name))?;
        }
        Ok(())
    }

    fn drop_staged_rings(&mut self) {
        self.staged.clear();
    }

    fn ring(&self, vip_id: u32, size: u32) -> Result<Option<Vec<u32>>, Error> {
        let rings: ArrayOfMaps<&MapData, Array<MapData, u32>> = self.map(abi::map::RINGS)?;
        let ring = match rings.get(&vip_id, 0) {
            Ok(r) => r,
            Err(aya::maps::MapError::KeyNotFound) => return Ok(None),
            Err(e) => return Err(map_err(abi::map::RINGS)(e)),
        };
        if ring.len() != size {
            return Ok(None);
        }
        Ok(read_mmapped_u32(ring.map().fd().as_fd(), ring.len(), size).ok())
    }

    fn put_vip(&mut self, vip: &Vip, info: &abi::VipInfo) -> Result<(), Error> {
        let mut m: HashMap<_, abi::VipKey, abi::VipInfo> = self.map_mut(abi::map::VIPS)?;
        m.insert(vip.to_abi(), info, 0)
            .map_err(map_err(abi::map::VIPS))
    }

    fn del_vip(&mut self, vip: &Vip) -> Result<(), Error> {
        let mut m: HashMap<_, abi::VipKey, abi::VipInfo> = self.map_mut(abi::map::VIPS)?;
        match m.remove(&vip.to_abi()) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(abi::map::VIPS)(e)),
        }
    }

    fn vips(&self) -> Result<Vec<(Vip, abi::VipInfo)>, Error> {
        let vips: HashMap<_, abi::VipKey, abi::VipInfo> = self.map(abi::map::VIPS)?;
        let mut entries = Vec::new();
        for kv in vips.iter() {
            let (k, v) = kv.map_err(map_err(abi::map::VIPS))?;
            if let Some(vip) = Vip::from_abi(&k) {
                entries.push((vip, v));
            }
        }
        Ok(entries)
    }

    fn set_owners(&mut self, ids: &[u32], owner: u32) -> Result<(), Error> {
        match &self.owners {
            Some(o) => update_batch(o.map().fd().as_fd(), ids, &vec![owner; ids.len()]),
            None => Ok(()),
        }
    }

    fn owners(&self) -> Result<BTreeMap<u32, u32>, Error> {
        let Some(o) = &self.owners else {
            return Ok(BTreeMap::new());
        };
        let v = read_mmapped_u32(o.map().fd().as_fd(), o.len(), o.len())?;
        Ok((0..)
            .zip(v)
            .filter_map(|(id, owner)| Some((id, src_ranges::owner_of(owner).0?)))
            .collect())
    }

    fn vip_filter_add(&mut self, addr: std::net::IpAddr) -> Result<(), Error> {
        let (w, v) = match self.filter.as_mut() {
            Some(f) => f.set(addr),
            None => {
                // not rebuilt yet: add to what the kernel map holds
                let mut f = VipFilter::default();
                let (w, _) = f.set(addr);
                let m: Array<_, u64> = self.map(abi::map::VIP_FILTER)?;
                let old = m.get(&w, 0).map_err(map_err(abi::map::VIP_FILTER))?;
                (w, old | f.0[w as usize])
            }
        };
        let mut m: Array<_, u64> = self.map_mut(abi::map::VIP_FILTER)?;
        m.set(w, v, 0).map_err(map_err(abi::map::VIP_FILTER))
    }

    fn vip_filter_set(&mut self, filter: &VipFilter) -> Result<(), Error> {
        let words = filter.changed_since(self.filter.as_ref());
        if !words.is_empty() {
            let (keys, vals): (Vec<u32>, Vec<u64>) = words.into_iter().unzip();
            let m: Array<&MapData, u64> = self.map(abi::map::VIP_FILTER)?;
            update_batch(m.map().fd().as_fd(), &keys, &vals)?;
        }
        self.filter = Some(filter.clone());
        Ok(())
    }

    fn vip_addrs(&self) -> Result<BTreeSet<IpAddr>, Error> {
        let m: HashMap<_, abi::VipKey, u32> = self.map(abi::map::VIP_ADDRS)?;
        let mut addrs = BTreeSet::new();
        for k in m.keys() {
            let k = k.map_err(map_err(abi::map::VIP_ADDRS))?;
            addrs.extend(k.addr.to_ip(k.family));
        }
        Ok(addrs)
    }

    fn vip_addrs_update(&mut self, add: &[IpAddr], del: &[IpAddr]) -> Result<(), Error> {
        let mut m: HashMap<_, abi::VipKey, u32> = self.map_mut(abi::map::VIP_ADDRS)?;
        for a in add {
            m.insert(abi::VipKey::of_addr(*a), 1, 0)
                .map_err(map_err(abi::map::VIP_ADDRS))?;
        }
        for a in del {
            match m.remove(&abi::VipKey::of_addr(*a)) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(abi::map::VIP_ADDRS)(e)),
            }
        }
        Ok(())
    }

    fn put_src_ranges(&mut self, vip_id: u32, ranges: &[SourceRange]) -> Result<(), Error> {
        let mut m: LpmTrie<_, abi::SrcRange, u32> = self.map_mut(abi::map::SRC_RANGES)?;
        for r in ranges {
            let (k, family) = src_ranges::key(vip_id, r);
            m.insert(&k, family, 0)
                .map_err(map_err(abi::map::SRC_RANGES))?;
        }
        Ok(())
    }

    fn del_src_ranges(&mut self, vip_id: u32, ranges: &[SourceRange]) -> Result<(), Error> {
        let mut m: LpmTrie<_, abi::SrcRange, u32> = self.map_mut(abi::map::SRC_RANGES)?;
        for r in ranges {
            match m.remove(&src_ranges::key(vip_id, r).0) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(abi::map::SRC_RANGES)(e)),
            }
        }
        Ok(())
    }

    fn src_ranges(&self) -> Result<BTreeMap<u32, BTreeSet<SourceRange>>, Error> {
        let m: LpmTrie<_, abi::SrcRange, u32> = self.map(abi::map::SRC_RANGES)?;
        let mut by_vip: BTreeMap<u32, BTreeSet<SourceRange>> = BTreeMap::new();
        for kv in m.iter() {
            let (k, family) = kv.map_err(map_err(abi::map::SRC_RANGES))?;
            if let Some((vip_id, r)) = src_ranges::from_key(&k, family) {
                by_vip.entry(vip_id).or_default().insert(r);
            }
        }
        Ok(by_vip)
    }

    fn put_src_set(&mut self, set: u32, value: &abi::SrcSet) -> Result<(), Error> {
        let mut m: Array<_, abi::SrcSet> = self.map_mut(abi::map::SRC_SETS)?;
        m.set(set, value, 0).map_err(map_err(abi::map::SRC_SETS))
    }

    fn point_src_set(&mut self, vip_id: u32, set: u32) -> Result<(), Error> {
        let mut m: Array<_, u32> = self.map_mut(abi::map::SRC_SET_OF)?;
        m.set(vip_id, set, 0).map_err(map_err(abi::map::SRC_SET_OF))
    }

    fn src_set_of(&self, vip_ids: &[u32]) -> Result<BTreeMap<u32, u32>, Error> {
        let m: Array<_, u32> = self.map(abi::map::SRC_SET_OF)?;
        let mut out = BTreeMap::new();
        for &id in vip_ids {
            let set = m.get(&id, 0).map_err(map_err(abi::map::SRC_SET_OF))?;
            if set != 0 {
                out.insert(id, set);
            }
        }
        Ok(out)
    }

    fn counters(&self, vips: &[(Vip, u32)]) -> Result<Counters, Error> {
        let stats: PerCpuArray<_, u64> = self.map(abi::map::STATS)?;
        let mut c = Counters::default();
        for s in abi::Stat::ALL {
            let v = stats
                .get(&(s as u32), 0)
                .map_err(map_err(abi::map::STATS))?;
            c.global.push((s.label(), v.iter().sum()));
        }
        let vs: PerCpuArray<_, abi::VipStats> = self.map(abi::map::VIP_STATS)?;
        for (vip, vip_id) in vips {
            let v = vs.get(vip_id, 0).map_err(map_err(abi::map::VIP_STATS))?;
            c.per_vip.push((
                *vip,
                v.iter().map(|x| x.packets).sum(),
                v.iter().map(|x| x.bytes).sum(),
            ));
        }
        let drops: PerCpuArray<_, u64> = self.map(abi::map::SRC_DROPS)?;
        for (vip, vip_id) in vips {
            let v = drops.get(vip_id, 0).map_err(map_err(abi::map::SRC_DROPS))?;
            c.per_vip_dropped
                .push((*vip, "source_range", v.iter().sum()));
        }
        Ok(c)
    }

    fn vip_capacity(&self) -> Result<u32, Error> {
        let mut cap = abi::MAX_VIPS;
        for name in abi::map::PER_VIP_COUNTERS {
            let map = self.ebpf.map(name).ok_or(BpfError::Missing { name })?;
            if let aya::maps::Map::PerCpuArray(m) = map {
                cap = cap.min(m.info().map_err(map_err(name))?.max_entries());
            }
        }
        Ok(cap)
    }
}

/// Runs `f` over the memory of `data`, a `flow_filter` map.
fn with_flow_filter_of<T>(
    data: &MapData,
    f: impl FnOnce(&FilterBits<'_>) -> T,
) -> Result<T, Error> {
    let name = abi::map::FLOW_FILTER;
    let len = data.info().map_err(map_err(name))?.value_size() as usize;
    batch::with_mmapped_bytes(data.fd().as_fd(), len, |bytes| {
        FilterBits::new(bytes).map(|fb| f(&fb))
    })?
    .ok_or_else(|| Error::InvalidService {
        vip: format!("{name} map"),
        reason: format!(
            "value of {len} bytes: not {} + 2 x a power of two bits, 8-byte aligned",
            abi::FLOW_FILTER_HEADER
        ),
    })
}

/// Every key of `data`, a conntrack map.
fn conntrack_keys_of(data: &MapData) -> Result<Vec<abi::Flow>, Error> {
    batch::lookup_batch_keys(data.fd().as_fd(), size_of::<abi::CtValue>(), 8192)
}

/// The `flow_filter` and `conntrack` maps a running edge pinned, opened on
/// their own: the edge's rebuild thread holds these, not the datapath (whose
/// owner task it would otherwise have to share). Only the edge that owns the
/// program rebuilds; the operator CLI's observer never opens this.
pub struct PinnedFlowFilter {
    filter: MapData,
    conntrack: MapData,
}

impl PinnedFlowFilter {
    pub fn open(dir: &std::path::Path) -> Result<Self, Error> {
        let open = |name: &'static str| {
            let path = dir.join(name);
            MapData::from_pin(&path).map_err(|e| BpfError::Pin {
                path,
                source: std::io::Error::other(e.to_string()),
            })
        };
        Ok(Self {
            filter: open(abi::map::FLOW_FILTER)?,
            conntrack: open(abi::map::CONNTRACK)?,
        })
    }

    /// See `flow_filter::rebuild`.
    pub fn rebuild(&self) -> Result<RebuildStats, Error> {
        with_flow_filter_of(&self.filter, |f| {
            flow_filter::rebuild(f, || conntrack_keys_of(&self.conntrack))
        })?
    }
}
