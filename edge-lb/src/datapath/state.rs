//! Desired datapath state and the pure diff that turns it into map operations.
//!
//! Backends get stable global ids (the ring value is the id). An id freed by a
//! plan is reused only by a *later* plan, and every (re)assignment bumps a
//! generation number that conntrack entries carry: a flow pinned to a removed
//! backend is never sent to the pod that later inherits the id.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use super::{Error, abi};

/// L4 protocol of a VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            6 => Some(Proto::Tcp),
            17 => Some(Proto::Udp),
            _ => None,
        }
    }
}

impl std::str::FromStr for Proto {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" | "6" => Ok(Proto::Tcp),
            "udp" | "17" => Ok(Proto::Udp),
            other => Err(format!("unknown protocol {other:?} (want tcp or udp)")),
        }
    }
}

/// A VIP:port:protocol. Port 0 is the wildcard: every port of (addr, proto)
/// that has no exact entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vip {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

impl fmt::Display for Vip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{p}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{p}", self.port),
        }
    }
}

impl Vip {
    pub fn to_abi(self) -> abi::VipKey {
        let (addr, family) = abi::RawAddr::from_ip(self.addr);
        abi::VipKey {
            addr,
            port: abi::Be16::from_host(self.port),
            proto: self.proto.number(),
            family,
        }
    }
    pub fn from_abi(k: &abi::VipKey) -> Option<Self> {
        Some(Vip {
            addr: k.addr.to_ip(k.family)?,
            port: k.port.to_host(),
            proto: Proto::from_number(k.proto)?,
        })
    }
}

/// One service as the datapath needs it: the backend pod IPs and the Maglev
/// ring (slot -> index into `backends`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    backends: Vec<IpAddr>,
    ring: Vec<u32>,
    conntrack: bool,
}

impl ServiceEntry {
    /// Validates that every ring slot names a backend and the ring fits the map.
    pub fn new(vip: &Vip, backends: Vec<IpAddr>, ring: Vec<u32>) -> Result<Self, Error> {
        let bad = |reason: String| Error::InvalidService {
            vip: vip.to_string(),
            reason,
        };
        if ring.is_empty() || ring.len() > abi::MAX_RING_SIZE as usize {
            return Err(bad(format!(
                "ring size {} outside 1..={}",
                ring.len(),
                abi::MAX_RING_SIZE
            )));
        }
        if backends.is_empty() {
            return Err(bad("no backends (withdraw the VIP instead)".into()));
        }
        if let Some(s) = ring.iter().find(|&&i| i as usize >= backends.len()) {
            return Err(bad(format!(
                "ring names backend index {s}, only {} backends",
                backends.len()
            )));
        }
        Ok(Self {
            backends,
            ring,
            conntrack: true,
        })
    }

    /// From a Maglev table: backends in the table's canonical order.
    pub fn from_table(vip: &Vip, table: &crate::maglev::Table) -> Result<Self, Error> {
        let backends = table.backends().iter().map(|b| b.addr).collect();
        Self::new(vip, backends, table.slots().to_vec())
    }

    /// Turn conntrack off (pure hashing) for this service.
    pub fn without_conntrack(mut self) -> Self {
        self.conntrack = false;
        self
    }
    pub fn backends(&self) -> &[IpAddr] {
        &self.backends
    }
    pub fn ring(&self) -> &[u32] {
        &self.ring
    }
    fn flags(&self) -> u32 {
        if self.conntrack { 0 } else { abi::VIP_F_NO_CT }
    }
}

/// Everything the datapath should forward.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<Vip, ServiceEntry>,
}

/// A backend as it sits in the `backends` map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgrammedBackend {
    pub id: u32,
    pub generation: u32,
    /// How many VIPs use it; it is deleted when this reaches 0.
    pub refs: u32,
}

/// A VIP as it sits in the `vips` / `rings` maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgrammedVip {
    pub vip_id: u32,
    pub ring_size: u32,
    pub flags: u32,
    /// Backend id per slot; `None` when unknown (read back after a restart):
    /// the next plan rewrites every slot.
    pub ring: Option<Vec<u32>>,
    /// The distinct backends this VIP holds a reference on.
    pub backends: Vec<IpAddr>,
    /// The entry last applied; `None` after a restart (always re-planned).
    pub entry: Option<ServiceEntry>,
}

/// Lowest-first id allocator. Ids freed by a plan are released only after
/// the plan's operations are emitted, so one plan never reuses an id it frees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdPool {
    free: BTreeSet<u32>,
    next: u32,
    max: u32,
}

impl IdPool {
    fn new(first: u32, max: u32, used: impl IntoIterator<Item = u32>) -> Self {
        let used: BTreeSet<u32> = used.into_iter().collect();
        let next = used.last().map_or(first, |m| m + 1).max(first);
        let free = (first..next).filter(|i| !used.contains(i)).collect();
        Self { free, next, max }
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
        self.free.insert(id);
    }
}

/// What the kernel maps hold (as far as the loader knows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Programmed {
    pub vips: BTreeMap<Vip, ProgrammedVip>,
    pub backends: BTreeMap<IpAddr, ProgrammedBackend>,
    pub last_generation: u32,
    backend_ids: IdPool,
    vip_ids: IdPool,
}

impl Default for Programmed {
    fn default() -> Self {
        Self::restored(BTreeMap::new(), BTreeMap::new())
    }
}

impl Programmed {
    /// State read back from existing maps (ring contents and per-VIP backend
    /// lists unknown: the next full plan rewrites rings and recounts refs).
    pub fn restored(
        vips: BTreeMap<Vip, ProgrammedVip>,
        backends: BTreeMap<IpAddr, ProgrammedBackend>,
    ) -> Self {
        let last_generation = backends.values().map(|b| b.generation).max().unwrap_or(0);
        Self {
            backend_ids: IdPool::new(1, abi::MAX_BACKENDS, backends.values().map(|b| b.id)),
            vip_ids: IdPool::new(0, abi::MAX_VIPS, vips.values().map(|v| v.vip_id)),
            vips,
            backends,
            last_generation,
        }
    }
}

/// One write to the maps. Plans emit them in a safe order: backends that
/// appear, then rings, then VIP entries, then VIP/ring/backend removals, so
/// the program never follows an id to something not yet (or no longer) there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    PutBackend {
        id: u32,
        addr: IpAddr,
        generation: u32,
    },
    /// A new inner ring map of `size` slots at `rings[vip_id]` (counters reset).
    CreateRing {
        vip_id: u32,
        size: u32,
    },
    /// (slot, backend id) pairs, written in one batch.
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

fn distinct(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let set: BTreeSet<IpAddr> = addrs.iter().copied().collect();
    set.into_iter().collect()
}

/// Changes one service (`None` removes it) in place: returns the map
/// operations that make the kernel follow. Cost is O(this service's ring),
/// independent of how many other services exist. On error `p` is unchanged.
pub fn plan_update(
    p: &mut Programmed,
    vip: &Vip,
    new: Option<&ServiceEntry>,
) -> Result<Vec<MapOp>, Error> {
    let new_addrs = new.map(|s| distinct(&s.backends)).unwrap_or_default();
    let missing = new_addrs
        .iter()
        .filter(|a| !p.backends.contains_key(a))
        .count() as u64;
    if missing > p.backend_ids.available() {
        return Err(Error::IdsExhausted {
            what: "backend",
            max: abi::MAX_BACKENDS - 1,
        });
    }
    let old = p.vips.get(vip);
    let needs_vip_id = new.is_some_and(|s| old.is_none_or(|o| o.ring_size != s.ring.len() as u32));
    if needs_vip_id && p.vip_ids.available() == 0 {
        return Err(Error::IdsExhausted {
            what: "VIP",
            max: abi::MAX_VIPS,
        });
    }
    let old = p.vips.remove(vip);
    let (mut puts, mut ring_ops, mut vip_ops, mut dels) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut freed_backends, mut freed_vip) = (Vec::new(), None);

    // 1. references on the new backends (new ones get an id and a generation)
    for a in &new_addrs {
        if let Some(b) = p.backends.get_mut(a) {
            b.refs += 1;
            continue;
        }
        let id = p.backend_ids.alloc().expect("checked above");
        p.last_generation = p.last_generation.wrapping_add(1).max(1);
        puts.push(MapOp::PutBackend {
            id,
            addr: *a,
            generation: p.last_generation,
        });
        p.backends.insert(
            *a,
            ProgrammedBackend {
                id,
                generation: p.last_generation,
                refs: 1,
            },
        );
    }

    // 2. the ring and the VIP entry
    if let Some(svc) = new {
        // index -> id once, then the ring: O(M) without a map lookup per slot
        let id_of: Vec<u32> = svc.backends.iter().map(|a| p.backends[a].id).collect();
        let ids: Vec<u32> = svc.ring.iter().map(|&i| id_of[i as usize]).collect();
        let size = ids.len() as u32;
        let (vip_id, fresh) = match &old {
            Some(o) if o.ring_size == size => (o.vip_id, false),
            _ => {
                if let Some(o) = &old {
                    dels.push(MapOp::DelRing { vip_id: o.vip_id });
                    freed_vip = Some(o.vip_id);
                }
                (p.vip_ids.alloc().expect("checked above"), true)
            }
        };
        let prev = old
            .as_ref()
            .and_then(|o| o.ring.as_ref())
            .filter(|_| !fresh);
        let slots: Vec<(u32, u32)> = match prev {
            Some(prev) => (0..size)
                .filter(|&s| prev[s as usize] != ids[s as usize])
                .map(|s| (s, ids[s as usize]))
                .collect(),
            None => (0..size).map(|s| (s, ids[s as usize])).collect(),
        };
        if fresh {
            ring_ops.push(MapOp::CreateRing { vip_id, size });
        }
        if !slots.is_empty() {
            ring_ops.push(MapOp::WriteSlots { vip_id, slots });
        }
        let info = abi::VipInfo {
            vip_id,
            ring_size: size,
            flags: svc.flags(),
        };
        if fresh || old.as_ref().is_none_or(|o| o.flags != info.flags) {
            vip_ops.push(MapOp::PutVip { vip: *vip, info });
        }
        p.vips.insert(
            *vip,
            ProgrammedVip {
                vip_id,
                ring_size: size,
                flags: info.flags,
                ring: Some(ids),
                backends: new_addrs,
                entry: Some(svc.clone()),
            },
        );
    } else if let Some(o) = &old {
        vip_ops.push(MapOp::DelVip { vip: *vip });
        dels.push(MapOp::DelRing { vip_id: o.vip_id });
        freed_vip = Some(o.vip_id);
    }

    // 3. drop the old references; unused backends go last
    if let Some(o) = &old {
        for a in &o.backends {
            let Some(b) = p.backends.get_mut(a) else {
                continue;
            };
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                dels.push(MapOp::DelBackend { id: b.id });
                freed_backends.push(b.id);
                p.backends.remove(a);
            }
        }
    }
    for id in freed_backends {
        p.backend_ids.release(id);
    }
    if let Some(id) = freed_vip {
        p.vip_ids.release(id);
    }
    // removals of the VIP entry come before the ring and backend removals
    let (del_vips, put_vips): (Vec<MapOp>, Vec<MapOp>) = vip_ops
        .into_iter()
        .partition(|op| matches!(op, MapOp::DelVip { .. }));
    let mut ops = puts;
    ops.extend(ring_ops);
    ops.extend(put_vips);
    ops.extend(del_vips);
    ops.extend(dels);
    Ok(ops)
}

/// Diff `current` against a whole `desired` state (start-up, resync): the
/// map operations to run and the state the maps hold once they ran. Only
/// services whose entry differs are touched; backends nobody references any
/// more (e.g. read back after a restart) are deleted at the end.
pub fn plan(
    current: &Programmed,
    desired: &DesiredState,
) -> Result<(Vec<MapOp>, Programmed), Error> {
    let mut next = current.clone();
    let mut ops = Vec::new();
    let gone: Vec<Vip> = current
        .vips
        .keys()
        .filter(|v| !desired.services.contains_key(v))
        .copied()
        .collect();
    for vip in &gone {
        ops.extend(plan_update(&mut next, vip, None)?);
    }
    for (vip, svc) in &desired.services {
        let same = next.vips.get(vip).and_then(|p| p.entry.as_ref()) == Some(svc);
        if !same {
            ops.extend(plan_update(&mut next, vip, Some(svc))?);
        }
    }
    let orphans: Vec<(IpAddr, u32)> = next
        .backends
        .iter()
        .filter(|(_, b)| b.refs == 0)
        .map(|(a, b)| (*a, b.id))
        .collect();
    for (a, id) in orphans {
        next.backends.remove(&a);
        ops.push(MapOp::DelBackend { id });
        next.backend_ids.release(id);
    }
    Ok((ops, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(last: u8, port: u16) -> Vip {
        Vip {
            addr: IpAddr::from([10, 0, 0, last]),
            port,
            proto: Proto::Tcp,
        }
    }
    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 1, 0, last])
    }
    /// A toy ring: slot s -> backend s % n (enough to test the diff).
    fn svc(v: &Vip, backends: &[u8], size: usize) -> ServiceEntry {
        let b: Vec<IpAddr> = backends.iter().map(|&x| ip(x)).collect();
        let ring = (0..size).map(|s| (s % b.len()) as u32).collect();
        ServiceEntry::new(v, b, ring).unwrap()
    }
    fn state(entries: Vec<(Vip, ServiceEntry)>) -> DesiredState {
        DesiredState {
            services: entries.into_iter().collect(),
        }
    }

    #[test]
    fn first_plan_writes_everything_in_order() {
        let v = vip(1, 80);
        let d = state(vec![(v, svc(&v, &[1, 2], 7))]);
        let (ops, next) = plan(&Programmed::default(), &d).unwrap();
        assert!(matches!(
            ops[0],
            MapOp::PutBackend {
                id: 1,
                generation: 1,
                ..
            }
        ));
        assert!(matches!(
            ops[1],
            MapOp::PutBackend {
                id: 2,
                generation: 2,
                ..
            }
        ));
        assert_eq!(ops[2], MapOp::CreateRing { vip_id: 0, size: 7 });
        match &ops[3] {
            MapOp::WriteSlots { vip_id: 0, slots } => {
                assert_eq!(slots.len(), 7);
                assert_eq!(slots[0], (0, 1));
                assert_eq!(slots[1], (1, 2));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(ops[4], MapOp::PutVip { .. }));
        assert_eq!(ops.len(), 5);
        assert_eq!(next.backends[&ip(1)].refs, 1);
        // applying the same state again is a no-op
        let (ops2, next2) = plan(&next, &d).unwrap();
        assert!(ops2.is_empty(), "{ops2:?}");
        assert_eq!(next2, next);
    }

    #[test]
    fn backend_change_writes_only_changed_slots_and_frees_id_later() {
        let v = vip(1, 80);
        let (_, s1) = plan(
            &Programmed::default(),
            &state(vec![(v, svc(&v, &[1, 2], 8))]),
        )
        .unwrap();
        // replace backend 2 by 3: new id 3 (id 2 is still in use during this plan)
        let (ops, s2) = plan(&s1, &state(vec![(v, svc(&v, &[1, 3], 8))])).unwrap();
        assert_eq!(
            ops[0],
            MapOp::PutBackend {
                id: 3,
                addr: ip(3),
                generation: 3
            }
        );
        match &ops[1] {
            MapOp::WriteSlots { slots, .. } => {
                assert_eq!(slots, &vec![(1, 3), (3, 3), (5, 3), (7, 3)]);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(ops[2], MapOp::DelBackend { id: 2 });
        assert_eq!(ops.len(), 3, "no VIP rewrite: {ops:?}");
        // id 2 is free again for the next plan, with a new generation
        let (ops, _) = plan(&s2, &state(vec![(v, svc(&v, &[1, 3, 4], 8))])).unwrap();
        assert_eq!(
            ops[0],
            MapOp::PutBackend {
                id: 2,
                addr: ip(4),
                generation: 4
            }
        );
    }

    #[test]
    fn shared_backends_are_refcounted() {
        let (a, b) = (vip(1, 80), vip(2, 53));
        let d = state(vec![(a, svc(&a, &[1, 2], 5)), (b, svc(&b, &[2], 5))]);
        let (_, s) = plan(&Programmed::default(), &d).unwrap();
        assert_eq!(s.backends[&ip(2)].refs, 2);
        // removing VIP a keeps backend 2 (still used by b) and deletes backend 1
        let (ops, s2) = plan(&s, &state(vec![(b, svc(&b, &[2], 5))])).unwrap();
        assert_eq!(
            ops,
            vec![
                MapOp::DelVip { vip: a },
                MapOp::DelRing { vip_id: 0 },
                MapOp::DelBackend { id: 1 }
            ]
        );
        assert_eq!(s2.backends[&ip(2)].refs, 1);
    }

    #[test]
    fn ring_size_change_gets_a_new_ring_before_the_old_goes() {
        let v = vip(1, 80);
        let (_, s1) = plan(&Programmed::default(), &state(vec![(v, svc(&v, &[1], 5))])).unwrap();
        let (ops, s2) = plan(&s1, &state(vec![(v, svc(&v, &[1], 7))])).unwrap();
        assert_eq!(ops[0], MapOp::CreateRing { vip_id: 1, size: 7 });
        assert!(matches!(ops[1], MapOp::WriteSlots { vip_id: 1, .. }));
        assert!(matches!(
            ops[2],
            MapOp::PutVip {
                info: abi::VipInfo {
                    vip_id: 1,
                    ring_size: 7,
                    ..
                },
                ..
            }
        ));
        assert_eq!(ops[3], MapOp::DelRing { vip_id: 0 });
        assert_eq!(s2.vips[&v].vip_id, 1);
    }

    #[test]
    fn unknown_ring_after_restart_is_rewritten_whole() {
        let v = vip(1, 80);
        let d = state(vec![(v, svc(&v, &[1, 2], 5))]);
        let (_, mut s) = plan(&Programmed::default(), &d).unwrap();
        let pv = s.vips.get_mut(&v).unwrap();
        pv.ring = None;
        pv.entry = None;
        let (ops, _) = plan(&s, &d).unwrap();
        assert_eq!(ops.len(), 1);
        assert!(matches!(&ops[0], MapOp::WriteSlots { slots, .. } if slots.len() == 5));
    }

    #[test]
    fn conntrack_flag_change_rewrites_only_the_vip() {
        let v = vip(1, 80);
        let (_, s) = plan(&Programmed::default(), &state(vec![(v, svc(&v, &[1], 3))])).unwrap();
        let (ops, _) = plan(&s, &state(vec![(v, svc(&v, &[1], 3).without_conntrack())])).unwrap();
        assert_eq!(ops.len(), 1);
        assert!(matches!(
            ops[0],
            MapOp::PutVip {
                info: abi::VipInfo {
                    flags: abi::VIP_F_NO_CT,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn bad_services_are_rejected_with_a_reason() {
        let v = vip(1, 80);
        let e = ServiceEntry::new(&v, vec![ip(1)], vec![0, 1]).unwrap_err();
        assert!(e.to_string().contains("backend index 1"), "{e}");
        assert!(ServiceEntry::new(&v, vec![], vec![0]).is_err());
        assert!(ServiceEntry::new(&v, vec![ip(1)], vec![]).is_err());
        assert!(ServiceEntry::new(&v, vec![ip(1)], vec![0; 70_000]).is_err());
    }

    #[test]
    fn vip_key_roundtrip() {
        let v = Vip {
            addr: "2001:db8::5".parse().unwrap(),
            port: 443,
            proto: Proto::Udp,
        };
        assert_eq!(Vip::from_abi(&v.to_abi()), Some(v));
        assert_eq!(v.to_string(), "[2001:db8::5]:443/udp");
    }

    #[test]
    fn single_service_update_touches_only_that_service() {
        let vips: Vec<Vip> = (0..100).map(|i| vip(i, 80)).collect();
        let d = state(vips.iter().map(|v| (*v, svc(v, &[1, 2], 11))).collect());
        let (_, mut p) = plan(&Programmed::default(), &d).unwrap();
        let target = vips[42];
        let id = p.vips[&target].vip_id;
        let ops = plan_update(&mut p, &target, Some(&svc(&target, &[1, 2, 3], 11))).unwrap();
        assert!(matches!(ops[0], MapOp::PutBackend { addr, .. } if addr == ip(3)));
        assert!(
            ops[1..]
                .iter()
                .all(|op| matches!(op, MapOp::WriteSlots { vip_id, .. } if *vip_id == id)),
            "{ops:?}"
        );
        // removal through plan_update frees only what nobody else uses
        let ops = plan_update(&mut p, &target, None).unwrap();
        assert_eq!(
            ops,
            vec![
                MapOp::DelVip { vip: target },
                MapOp::DelRing { vip_id: id },
                MapOp::DelBackend { id: 3 }
            ]
        );
        assert_eq!(p.backends[&ip(1)].refs, 99);
        // and the full plan agrees that nothing else differs
        let rest = state(
            vips.iter()
                .filter(|v| **v != target)
                .map(|v| (*v, svc(v, &[1, 2], 11)))
                .collect(),
        );
        assert!(plan(&p, &rest).unwrap().0.is_empty());
    }

    #[test]
    fn restored_state_recounts_refs_and_deletes_orphans() {
        let v = vip(1, 80);
        let backends = [
            (
                ip(1),
                ProgrammedBackend {
                    id: 1,
                    generation: 7,
                    refs: 0,
                },
            ),
            (
                ip(2),
                ProgrammedBackend {
                    id: 4,
                    generation: 9,
                    refs: 0,
                },
            ),
        ];
        let pv = ProgrammedVip {
            vip_id: 3,
            ring_size: 5,
            flags: 0,
            ring: None,
            backends: vec![],
            entry: None,
        };
        let p = Programmed::restored(
            [(v, pv)].into_iter().collect(),
            backends.into_iter().collect(),
        );
        assert_eq!(p.last_generation, 9);
        let (ops, next) = plan(&p, &state(vec![(v, svc(&v, &[1, 5], 5))])).unwrap();
        // the new backend takes the lowest free id (2) and a fresh generation
        assert_eq!(
            ops[0],
            MapOp::PutBackend {
                id: 2,
                addr: ip(5),
                generation: 10
            }
        );
        assert!(matches!(&ops[1], MapOp::WriteSlots { vip_id: 3, slots } if slots.len() == 5));
        assert_eq!(
            ops.last(),
            Some(&MapOp::DelBackend { id: 4 }),
            "orphan deleted"
        );
        assert_eq!(next.backends[&ip(1)].refs, 1);
        assert!(!next.backends.contains_key(&ip(2)));
    }

    #[test]
    fn ids_run_out_with_a_clear_error_and_no_change() {
        let mut p = Programmed {
            vip_ids: IdPool::new(0, 1, []),
            ..Default::default()
        };
        let (a, b) = (vip(1, 80), vip(2, 80));
        plan_update(&mut p, &a, Some(&svc(&a, &[1], 3))).unwrap();
        let before = p.clone();
        let e = plan_update(&mut p, &b, Some(&svc(&b, &[2], 3))).unwrap_err();
        assert!(e.to_string().contains("out of VIP ids"), "{e}");
        assert_eq!(p, before);
    }
}
