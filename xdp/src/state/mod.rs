//! Desired datapath state and the pure diff that turns it into map operations.
//!
//! Every (service, pod address) pair gets its own backend id (the ring value
//! is the id): a pod that backs VIP A and VIP B has two ids, so taking it out
//! of A frees A's id and invalidates exactly A's conntrack entries, while B's
//! flows stay. An id freed by a plan is reused only by a *later* plan, and
//! every (re)assignment bumps a generation number that conntrack entries
//! carry: a flow pinned to a removed backend is never sent to the pod that
//! later inherits the id. Because no id is shared, there is nothing to count:
//! a service's plan writes and deletes only its own ids.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use super::abi;

mod diff;
mod plan_ops;
mod src_plan;
mod view;
pub use diff::{plan, plan_update};
pub use view::View;

/// The seam's types (`ringlb-datapath`), where the planner finds them.
pub use ringlb_datapath::{DesiredState, Proto, ServiceEntry, SourceRange, Vip};

/// A [`Vip`] as the `vips` map keys it.
pub trait VipAbi: Sized {
    fn to_abi(self) -> abi::VipKey;
    fn from_abi(k: &abi::VipKey) -> Option<Self>;
}

impl VipAbi for Vip {
    fn to_abi(self) -> abi::VipKey {
        let (addr, family) = abi::RawAddr::from_ip(self.addr);
        abi::VipKey {
            addr,
            port: abi::Be16::from_host(self.port),
            proto: self.proto.number(),
            family,
        }
    }
    fn from_abi(k: &abi::VipKey) -> Option<Self> {
        Some(Vip {
            addr: k.addr.to_ip(k.family)?,
            port: k.port.to_host(),
            proto: Proto::from_number(k.proto)?,
        })
    }
}

/// The `VipInfo::flags` of a service.
fn vip_flags(svc: &ServiceEntry) -> u32 {
    let mut f = 0;
    if !svc.conntrack() {
        f |= abi::VIP_F_NO_CT;
    }
    if svc.failover_alias() {
        f |= abi::VIP_F_FAILOVER_ALIAS;
    }
    if svc.source_ranges().is_some() {
        f |= abi::VIP_F_SRC_RANGES;
    }
    if let Some(timeout) = svc.client_affinity() {
        f |= abi::VIP_F_CLIENT_AFFINITY
            | timeout.min(abi::MAX_AFFINITY_TIMEOUT) << abi::VIP_AFFINITY_SHIFT;
    }
    f
}

/// A backend id as it sits in the `backends` map. An id belongs to exactly
/// one (service, pod address) pair: a pod that backs two VIPs has two ids, so
/// removing it from one VIP invalidates only that VIP's conntrack entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgrammedBackend {
    pub id: u32,
    pub generation: u32,
    /// The address is another region's VIP (`abi::BE_F_REMOTE_VIP`). An
    /// address that turns remote, or back, gets a new id (its flows move).
    pub remote: bool,
}

/// A VIP as it sits in the `vips` / `rings` maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgrammedVip {
    pub vip_id: u32,
    pub ring_size: u32,
    pub flags: u32,
    /// Backend id per slot; `None` when unknown (a ring that could not be
    /// read back): the next plan rewrites every slot.
    pub ring: Option<Arc<[u32]>>,
    /// This VIP's backend ids, one per pod address. Ids are never shared
    /// with another VIP.
    pub backends: BTreeMap<IpAddr, ProgrammedBackend>,
    /// The entry last applied; `None` after a restart (always re-planned).
    pub entry: Option<ServiceEntry>,
    /// What `src_ranges` holds under `vip_id` (`src_ranges.rs`).
    pub src_ranges: BTreeSet<SourceRange>,
    /// What `src_set_of[vip_id]` holds (0: no set), `None` when unknown (a
    /// new vip_id). The VIP owns that set while it has source ranges.
    pub src_set_of: Option<u32>,
}

/// Lowest-first id allocator. While held (a whole-state plan), released ids
/// wait in `held` until the operations that free them are emitted, so the
/// plan never hands an id it frees to another service in the same batch of
/// operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdPool {
    free: BTreeSet<u32>,
    next: u32,
    max: u32,
    held: Option<Vec<u32>>,
}

impl IdPool {
    fn new(first: u32, max: u32, used: impl IntoIterator<Item = u32>) -> Self {
        let used: BTreeSet<u32> = used.into_iter().collect();
        let next = used.last().map_or(first, |m| m + 1).max(first);
        let free = (first..next).filter(|i| !used.contains(i)).collect();
        Self {
            free,
            next,
            max,
            held: None,
        }
    }
    fn available(&self) -> u64 {
        self.free.len() as u64 + u64::from(self.max.saturating_sub(self.next))
    }
    fn alloc(&mut self) -> Option<u32> {
        if let Some(id) = self.free.pop_first() {
            return Some(id);
        }
        (self.next < self.max).then(|| {
            self.next += 1;
            self.next - 1
        })
    }
    fn release(&mut self, id: u32) {
        match &mut self.held {
            Some(held) => held.push(id),
            None => {
                self.free.insert(id);
            }
        }
    }
    /// From now on released ids wait until [`IdPool::free_held`].
    fn hold(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }
    /// Frees the waiting ids; `keep_holding` or not.
    fn free_held(&mut self, keep_holding: bool) {
        let held = self.held.take().unwrap_or_default();
        self.free.extend(held);
        if keep_holding {
            self.hold();
        }
    }
    fn holds_any(&self) -> bool {
        self.held.as_ref().is_some_and(|h| !h.is_empty())
    }
}

/// What the kernel maps hold (as far as the loader knows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Programmed {
    pub vips: BTreeMap<Vip, ProgrammedVip>,
    pub last_generation: u32,
    /// Live ids a ring names but no (VIP, address) pair can own (read back
    /// after a failed apply), with the VIPs whose rings name them. Each
    /// `plan_update` of one of those VIPs rewrites its ring (or removes it)
    /// and crosses the VIP off; the update that crosses off the last one
    /// deletes the id, so `apply_service` alone never leaves one live.
    pub orphans: BTreeMap<u32, BTreeSet<Vip>>,
    /// Live ids no ring names and no VIP owns (read back after a failed
    /// apply): the next plan or plan_update deletes them, so conntrack
    /// entries pointing at them turn stale.
    pub strays: BTreeSet<u32>,
    /// Ids a VIP took over from its ring at restore because their `owners`
    /// entry was missing or named a VIP that is gone: the VIP's next plan
    /// writes their owner.
    pub adopted: BTreeMap<Vip, Vec<u32>>,
    /// `src_ranges` entries under a vip_id no VIP has (read back after a
    /// failed apply): the next plan deletes them, before it can give the
    /// vip_id to a VIP.
    pub stray_src_ranges: BTreeMap<u32, BTreeSet<SourceRange>>,
    backend_ids: IdPool,
    /// `src_sets` indexes (set 0 unused).
    src_sets: IdPool,
    vip_ids: IdPool,
}

impl Default for Programmed {
    fn default() -> Self {
        Self::restore(ReadBack::default())
    }
}

impl Programmed {
    /// Released backend ids, vip_ids and source-range sets wait until
    /// [`Programmed::free_held`].
    fn hold_ids(&mut self) {
        self.backend_ids.hold();
        self.vip_ids.hold();
        self.src_sets.hold();
    }
    fn free_held(&mut self, keep_holding: bool) {
        self.backend_ids.free_held(keep_holding);
        self.vip_ids.free_held(keep_holding);
        self.src_sets.free_held(keep_holding);
    }
    fn holds_any(&self) -> bool {
        self.backend_ids.holds_any() || self.vip_ids.holds_any() || self.src_sets.holds_any()
    }
}

/// What `XdpDatapath::read_programmed` found in the maps: the input of the
/// pure [`Programmed::restore`].
#[derive(Clone, Debug, Default)]
pub struct ReadBack {
    /// Every VIP entry with its ring's contents (`None`: not readable).
    pub vips: Vec<(Vip, abi::VipInfo, Option<Vec<u32>>)>,
    /// The loader's `owners` map: backend id -> vip_id of the service that
    /// owns it, for every id with an owner.
    pub owners: BTreeMap<u32, u32>,
    /// `backends[id]` for every id in `owners` or named by a ring.
    pub backends: BTreeMap<u32, abi::BackendValue>,
    /// The generation high-water mark kept in `backends[0]`.
    pub high_water: u32,
    /// Every `src_ranges` entry, by vip_id.
    pub src_ranges: BTreeMap<u32, BTreeSet<SourceRange>>,
    /// `src_set_of[vip_id]` of every VIP entry's vip_id.
    pub src_set_of: BTreeMap<u32, u32>,
    /// How many vip_ids the per-VIP counters hold (`None`: [`abi::MAX_VIPS`]).
    pub vip_capacity: Option<u32>,
}

impl Programmed {
    /// Rebuilds the loader's view from the maps. A live id (family != 0)
    /// belongs to the VIP its `owners` entry names. Failing that (no entry,
    /// or that VIP is gone: an apply failed halfway), to the first VIP whose
    /// ring names it, if that VIP has no id for the address yet. A live id
    /// nobody can own is an orphan if a ring names it (deleted by the update
    /// that rewrites or removes the last ring naming it), else a stray
    /// (deleted by the next update). Tombstones (family 0) are free ids.
    pub fn restore(r: ReadBack) -> Self {
        let by_vid: BTreeMap<u32, Vip> = r.vips.iter().map(|(v, i, _)| (i.vip_id, *v)).collect();
        let mut src_ranges = r.src_ranges.clone();
        let mut owned = BTreeMap::new();
        let mut claimed = BTreeSet::new();
        let mut last_generation = r.high_water;
        let live = |id: &u32| {
            let b = r.backends.get(id)?;
            Some((b.addr.to_ip(b.family)?, (b.generation, b.is_remote())))
        };
        type Owned = BTreeMap<Vip, BTreeMap<IpAddr, ProgrammedBackend>>;
        fn claim(
            (owned, claimed): (&mut Owned, &mut BTreeSet<u32>),
            vip: Vip,
            id: u32,
            addr: IpAddr,
            (generation, remote): (u32, bool),
        ) -> bool {
            let mine = owned.entry(vip).or_default();
            if mine.contains_key(&addr) || claimed.contains(&id) {
                return false;
            }
            mine.insert(
                addr,
                ProgrammedBackend {
                    id,
                    generation,
                    remote,
                },
            );
            claimed.insert(id);
            true
        }
        let mut unowned = BTreeSet::new();
        for (id, vid) in &r.owners {
            let Some((addr, generation)) = live(id) else {
                continue;
            };
            last_generation = last_generation.max(generation.0);
            let ok = by_vid
                .get(vid)
                .is_some_and(|v| claim((&mut owned, &mut claimed), *v, *id, addr, generation));

            if !ok {
                unowned.insert(*id);
            }
        }
        let mut named: BTreeMap<u32, BTreeSet<Vip>> = BTreeMap::new();
        let mut adopted = BTreeMap::new();
        for (vip, _, ring) in &r.vips {
            let ids: BTreeSet<u32> = ring.iter().flatten().copied().collect();
            for id in ids {
                named.entry(id).or_default().insert(*vip);
                if let Some((addr, generation)) = live(&id) {
                    last_generation = last_generation.max(generation.0);
                    if claimed.contains(&id) {
                        continue;
                    }
                    if claim((&mut owned, &mut claimed), *vip, id, addr, generation) {
                        adopted.entry(*vip).or_insert_with(Vec::new).push(id);
                    } else {
                        unowned.insert(id);
                    }
                }
            }
        }
        unowned.retain(|id| !claimed.contains(id));
        let (orphans, strays): (BTreeMap<u32, BTreeSet<Vip>>, BTreeSet<u32>) = {
            let (o, s): (BTreeSet<u32>, BTreeSet<u32>) =
                unowned.into_iter().partition(|id| named.contains_key(id));
            let o = o.into_iter().map(|id| (id, named[&id].clone())).collect();
            (o, s)
        };
        let mut vips = BTreeMap::new();
        for (vip, info, ring) in r.vips {
            vips.insert(
                vip,
                ProgrammedVip {
                    vip_id: info.vip_id,
                    ring_size: info.ring_size,
                    flags: info.flags,
                    ring: ring.map(Into::into),
                    backends: owned.remove(&vip).unwrap_or_default(),
                    entry: None,
                    src_ranges: src_ranges.remove(&info.vip_id).unwrap_or_default(),
                    src_set_of: Some(r.src_set_of.get(&info.vip_id).copied().unwrap_or(0)),
                },
            );
        }
        let used: Vec<u32> = claimed
            .iter()
            .chain(orphans.keys())
            .chain(&strays)
            .copied()
            .collect();
        // the sets VIPs with ranges name are in use; any other is free
        let sets = vips
            .values()
            .filter(|v| v.flags & abi::VIP_F_SRC_RANGES != 0)
            .filter_map(|v| v.src_set_of.filter(|&s| s != 0));
        Self {
            src_sets: IdPool::new(1, abi::MAX_SRC_SETS, sets),
            backend_ids: IdPool::new(1, abi::MAX_BACKENDS, used),
            vip_ids: IdPool::new(
                0,
                r.vip_capacity.unwrap_or(abi::MAX_VIPS),
                vips.values().map(|v| v.vip_id),
            ),
            vips,
            last_generation,
            orphans,
            strays,
            adopted,
            stray_src_ranges: src_ranges,
        }
    }

    /// This edge's own VIP addresses (`vip_addrs`): those of every VIP entry
    /// but failover aliases. IPIP packets to them are decapsulated.
    pub fn own_vip_addrs(&self) -> BTreeSet<IpAddr> {
        self.vips
            .iter()
            .filter(|(_, p)| p.flags & abi::VIP_F_FAILOVER_ALIAS == 0)
            .map(|(v, _)| v.addr)
            .collect()
    }

    /// Whether `addr` is one of [`Self::own_vip_addrs`] (its VIPs only).
    pub fn is_own_vip_addr(&self, addr: IpAddr) -> bool {
        let lo = Vip {
            addr,
            port: 0,
            proto: Proto::Tcp,
        };
        let hi = Vip {
            addr,
            port: u16::MAX,
            proto: Proto::Udp,
        };
        self.vips
            .range(lo..=hi)
            .any(|(_, p)| p.flags & abi::VIP_F_FAILOVER_ALIAS == 0)
    }

    /// The highest backend id ever handed out plus one.
    pub fn backend_id_limit(&self) -> u32 {
        self.backend_ids.next
    }

    /// The id of `addr`'s backend in `vip`'s service.
    pub fn backend(&self, vip: &Vip, addr: IpAddr) -> Option<&ProgrammedBackend> {
        self.vips.get(vip)?.backends.get(&addr)
    }

    /// Every (VIP, address, id) pair.
    pub fn backends(&self) -> impl Iterator<Item = (&Vip, &IpAddr, &ProgrammedBackend)> {
        self.vips
            .iter()
            .flat_map(|(v, p)| p.backends.iter().map(move |(a, b)| (v, a, b)))
    }
}

/// One write to the maps. Plans emit them in a safe order: strays (live ids
/// nothing but conntrack reaches) deleted, backends that appear, then rings, then VIP entries, then new generations of a VIP whose
/// conntrack was turned off, then VIP/ring/backend removals, so the program
/// never follows an id to something not yet (or no longer) there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    PutBackend {
        id: u32,
        addr: IpAddr,
        generation: u32,
        /// Another region's VIP (`abi::BE_F_REMOTE_VIP`).
        remote: bool,
    },
    /// Records in the `owners` map that `ids` belong to the VIP whose ring is
    /// `vip_id`. The loader reads it back after a restart; the program reads
    /// it on a conntrack hit, to count the packet for the VIP that owns the
    /// id (it never uses it to choose a backend).
    Own {
        vip_id: u32,
        ids: Vec<u32>,
        /// The VIP has source ranges: the owner value carries
        /// `abi::OWNER_F_SRC_RANGES`, so conntrack hits check the source.
        src_ranges: bool,
        /// The ring does not name these ids (`abi::OWNER_F_DRAINING`): a
        /// client's affinity to them does not hold for a new flow.
        draining: bool,
    },
    /// `src_ranges` entries of `vip_id`, added.
    PutSrcRanges {
        vip_id: u32,
        ranges: Vec<SourceRange>,
    },
    /// `src_ranges` entries of `vip_id`, removed.
    DelSrcRanges {
        vip_id: u32,
        ranges: Vec<SourceRange>,
    },
    /// `src_sets[set]` = these ranges (no VIP names the set yet).
    PutSrcSet {
        set: u32,
        ranges: Vec<SourceRange>,
    },
    /// `src_set_of[vip_id] = set` (0: the VIP's ranges are in the trie).
    PointSrcSet {
        vip_id: u32,
        set: u32,
    },
    /// A new inner ring map of `size` slots at `rings[vip_id]` (counters reset).
    CreateRing {
        vip_id: u32,
        size: u32,
    },
    /// Every slot of a ring that is new (or unknown): slot `i` gets `ids[i]`.
    /// Shared with the programmed state, so a cold start holds each ring once.
    WriteRing {
        vip_id: u32,
        ids: std::sync::Arc<[u32]>,
    },
    /// (slot, backend id) pairs, written in one batch: the slots of a known
    /// ring that changed.
    WriteSlots {
        vip_id: u32,
        slots: Vec<(u32, u32)>,
    },
    PutVip {
        vip: Vip,
        info: abi::VipInfo,
    },
    DelVip {
        vip: Vip,
    },
    DelRing {
        vip_id: u32,
    },
    DelBackend {
        id: u32,
    },
}

#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod plan_batch_tests;
#[cfg(test)]
mod src_ranges_tests;
#[cfg(test)]
mod tests;
