//! The pure diff: desired services against what the maps hold, as the map
//! operations that make the kernel follow (see the parent module for the id
//! rules it keeps).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::plan_ops::PlanOps;
use super::{
    DesiredState, MapOp, Programmed, ProgrammedBackend, ProgrammedVip, ServiceEntry, Vip, vip_flags,
};
use crate::{Error, abi};

/// Sorted, without duplicates.
fn distinct(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let mut v = addrs.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// Walks the sorted `new` addresses against a service's current ids (also
/// sorted) in one merge pass, without a map lookup per address: `f` gets
/// each new address with its current id (if it has one), `gone` the ids of
/// addresses that are not in `new`.
fn merge<'a>(
    new: &[IpAddr],
    old: impl IntoIterator<Item = (&'a IpAddr, &'a ProgrammedBackend)>,
    mut f: impl FnMut(IpAddr, Option<ProgrammedBackend>),
    mut gone: impl FnMut(ProgrammedBackend),
) {
    let mut old = old.into_iter().peekable();
    for a in new {
        while let Some((oa, ob)) = old.peek()
            && *oa < a
        {
            gone(**ob);
            old.next();
        }
        match old.peek() {
            Some((oa, ob)) if *oa == a => {
                f(*a, Some(**ob));
                old.next();
            }
            _ => f(*a, None),
        }
    }
    for (_, ob) in old {
        gone(*ob);
    }
}

/// Changes one service (`None` removes it) in place: returns the map
/// operations that make the kernel follow. Cost is O(this service's ring),
/// independent of how many other services exist; it only ever writes or
/// deletes this service's own backend ids. On error `p` is unchanged.
pub fn plan_update(
    p: &mut Programmed,
    vip: &Vip,
    new: Option<&ServiceEntry>,
) -> Result<Vec<MapOp>, Error> {
    plan_update_ops(p, vip, new).map(PlanOps::in_safe_order)
}

/// [`plan_update`]'s operations, by kind.
fn plan_update_ops(
    p: &mut Programmed,
    vip: &Vip,
    new: Option<&ServiceEntry>,
) -> Result<PlanOps, Error> {
    if let Some(svc) = new.filter(|s| s.ring().len() > abi::MAX_RING_SIZE as usize) {
        return Err(Error::InvalidService {
            vip: vip.to_string(),
            reason: format!(
                "ring size {} outside 1..={}",
                svc.ring().len(),
                abi::MAX_RING_SIZE
            ),
        });
    }
    let new_addrs = new.map(|s| distinct(s.backends())).unwrap_or_default();
    let remote = |a: &IpAddr| new.is_some_and(|s| s.is_remote(a));
    check_ids_available(p, vip, new, &new_addrs, &remote)?;
    let old = p.vips.remove(vip);
    let mut ops = PlanOps::default();
    // source ranges left under a vip_id nobody has: gone before it is reused
    for (vip_id, ranges) in std::mem::take(&mut p.stray_src_ranges) {
        let ranges = ranges.into_iter().collect();
        ops.src_strays.push(MapOp::DelSrcRanges { vip_id, ranges });
    }
    // the ring (and owner) id: the old one, or a new ring when M changes
    let ring_id = new.map(|svc| match &old {
        Some(o) if o.ring_size == svc.ring().len() as u32 => (o.vip_id, false),
        _ => (p.vip_ids.alloc().expect("checked above"), true),
    });
    let src = new.is_some_and(|s| s.source_ranges().is_some());
    let src_plan = super::src_plan::plan(p, ring_id, new, old.as_ref(), &mut ops);

    // 1. this service's ids: kept per address, new addresses get a fresh id
    //    and generation; ids of addresses that left are deleted last. Every
    //    kept id is owned again when the ring moves, when the VIP's ranges
    //    bit changes, and after a restart when ranges are or were involved
    //    (the owners bit is not read back).
    let reown = old.as_ref().is_some_and(|o| {
        let had = o.flags & abi::VIP_F_SRC_RANGES != 0;
        ring_id.is_some_and(|(_, fresh)| fresh)
            || had != src
            || (o.entry.is_none() && (had || src || !o.src_ranges.is_empty()))
    });
    let (kept, leaving) = assign_backend_ids(p, &new_addrs, &remote, old.as_ref(), &mut ops.puts);
    own_backend_ids(
        p,
        vip,
        ring_id,
        (reown, src),
        (new, old.as_ref()),
        &kept,
        &mut ops,
    );
    // sorted input: built in one pass
    let backends = kept.into_iter().map(|(a, b, _)| (a, b)).collect();

    // 2. the ring and the VIP entry
    let freed_vip = match (new, &old) {
        (Some(svc), _) => {
            let ring_id = ring_id.expect("a new entry has a ring");
            let freed = program_service(p, vip, svc, ring_id, old.as_ref(), backends, &mut ops);
            if let Some(pv) = p.vips.get_mut(vip) {
                pv.src_ranges = src_plan.trie;
                pv.src_set_of = src_plan.set_of;
            }
            freed
        }
        (None, Some(o)) => {
            ops.del_vips.push(MapOp::DelVip { vip: *vip });
            ops.dels.push(MapOp::DelRing { vip_id: o.vip_id });
            Some(o.vip_id)
        }
        (None, None) => None,
    };

    // 3. the ids that leave, the orphans and strays this update frees; a
    //    set this update stopped naming is reused by a later one only
    release_ids(p, vip, &leaving, freed_vip, &mut ops);
    if let Some(set) = src_plan.release {
        p.src_sets.release(set);
    }
    Ok(ops)
}

/// Fails before anything changes when the update needs more backend ids (one
/// per new address) or a VIP id (a new ring) than are free.
fn check_ids_available(
    p: &Programmed,
    vip: &Vip,
    new: Option<&ServiceEntry>,
    new_addrs: &[IpAddr],
    remote: &dyn Fn(&IpAddr) -> bool,
) -> Result<(), Error> {
    let old = p.vips.get(vip);
    let mut missing = 0u64;
    merge(
        new_addrs,
        old.iter().flat_map(|o| &o.backends),
        |a, b| missing += u64::from(b.is_none_or(|b| b.remote != remote(&a))),
        |_| {},
    );
    if missing > p.backend_ids.available() {
        return Err(Error::IdsExhausted {
            what: "backend",
            max: abi::MAX_BACKENDS - 1,
        });
    }
    let needs_vip_id =
        new.is_some_and(|s| old.is_none_or(|o| o.ring_size != s.ring().len() as u32));
    if needs_vip_id && p.vip_ids.available() == 0 {
        return Err(Error::IdsExhausted {
            what: "VIP",
            max: p.vip_ids.max,
        });
    }
    Ok(())
}

/// (address, id, whether the id is new in this plan)
type Kept = Vec<(IpAddr, ProgrammedBackend, bool)>;

/// Step 1: the id of each new address (its current one, or a fresh id and
/// generation written to `puts`), and the ids of the addresses that left.
/// An address whose remote flag changed (pod <-> another region's VIP) is
/// another backend: a fresh id, and the old one leaves.
fn assign_backend_ids(
    p: &mut Programmed,
    new_addrs: &[IpAddr],
    remote: &dyn Fn(&IpAddr) -> bool,
    old: Option<&ProgrammedVip>,
    puts: &mut Vec<MapOp>,
) -> (Kept, Vec<ProgrammedBackend>) {
    let mut kept = Vec::with_capacity(new_addrs.len());
    let (mut leaving, mut replaced) = (Vec::new(), Vec::new());
    merge(
        new_addrs,
        old.iter().flat_map(|o| &o.backends),
        |a, b| {
            let remote = remote(&a);
            let b = match b {
                Some(b) if b.remote == remote => Some(b),
                Some(b) => {
                    replaced.push(b);
                    None
                }
                None => None,
            };
            let is_new = b.is_none();
            let b = b.unwrap_or_else(|| {
                let id = p.backend_ids.alloc().expect("checked above");
                p.last_generation = p.last_generation.wrapping_add(1).max(1);
                puts.push(MapOp::PutBackend {
                    id,
                    addr: a,
                    generation: p.last_generation,
                    remote,
                });
                ProgrammedBackend {
                    id,
                    generation: p.last_generation,
                    remote,
                }
            });
            kept.push((a, b, is_new));
        },
        |b| leaving.push(b),
    );
    leaving.append(&mut replaced);
    (kept, leaving)
}

/// The `owners` writes of step 1: new ids are owned before any ring names
/// them; kept ids follow their VIP to a new ring once the VIP entry points
/// there, and are owned again when they enter or leave the ring (the
/// draining bit, which ends a client's affinity to a terminating pod).
fn own_backend_ids(
    p: &mut Programmed,
    vip: &Vip,
    ring_id: Option<(u32, bool)>,
    (all, src_ranges): (bool, bool),
    (new, old): (Option<&ServiceEntry>, Option<&ProgrammedVip>),
    kept: &Kept,
    ops: &mut PlanOps,
) {
    let Some((vip_id, _)) = ring_id else {
        p.adopted.remove(vip);
        return;
    };
    let draining: BTreeSet<IpAddr> = new
        .map(|e| {
            e.backends_in_ring()
                .into_iter()
                .filter(|(_, in_ring)| !in_ring)
                .map(|(a, _)| a)
                .collect()
        })
        .unwrap_or_default();
    // what the owners bits say now: the old ring's ids are not draining, its
    // other ids are (also after a restart, from the rings read back); an
    // unknown ring: every kept id is owned again
    let was_draining: Option<BTreeSet<IpAddr>> = old.and_then(|o| {
        let in_ring: BTreeSet<u32> = o.ring.as_ref()?.iter().copied().collect();
        Some(
            o.backends
                .iter()
                .filter(|(_, b)| !in_ring.contains(&b.id))
                .map(|(a, _)| *a)
                .collect(),
        )
    });
    let mut own_new: [Vec<u32>; 2] = Default::default();
    let mut own_kept: [Vec<u32>; 2] = Default::default();
    // O(kept): a set for the adopted ids, and the new-id flag from the
    // merge (a scan of `puts` per id was O(n^2) for a new VIP)
    let adopted: BTreeSet<u32> = p
        .adopted
        .remove(vip)
        .unwrap_or_default()
        .into_iter()
        .collect();
    for (a, b, is_new) in kept {
        let d = draining.contains(a);
        if *is_new {
            // a fresh id (its PutBackend is in `puts`)
            own_new[d as usize].push(b.id);
        } else if all
            || adopted.contains(&b.id)
            || was_draining.as_ref().is_none_or(|w| w.contains(a) != d)
        {
            own_kept[d as usize].push(b.id);
        }
    }
    for (out, groups) in [(&mut ops.own_new, own_new), (&mut ops.own_kept, own_kept)] {
        let by_bit = [false, true].into_iter().zip(groups);
        out.extend(
            by_bit
                .filter(|(_, ids)| !ids.is_empty())
                .map(|(draining, ids)| MapOp::Own {
                    vip_id,
                    ids,
                    src_ranges,
                    draining,
                }),
        );
    }
}

/// Step 2 for a service that stays or arrives: its ring (`(vip_id, fresh)`,
/// fresh when the ring is new), its VIP entry, and its new state in `p`.
/// Returns the vip_id of the ring it replaced, if any.
fn program_service(
    p: &mut Programmed,
    vip: &Vip,
    svc: &ServiceEntry,
    (vip_id, fresh): (u32, bool),
    old: Option<&ProgrammedVip>,
    mut backends: BTreeMap<IpAddr, ProgrammedBackend>,
    ops: &mut PlanOps,
) -> Option<u32> {
    // index -> id once, then the ring: O(M) without a map lookup per slot
    let id_of: Vec<u32> = svc.backends().iter().map(|a| backends[a].id).collect();
    let ids: std::sync::Arc<[u32]> = svc.ring().iter().map(|&i| id_of[i as usize]).collect();
    let size = ids.len() as u32;
    let mut freed_vip = None;
    if fresh && let Some(o) = old {
        ops.dels.push(MapOp::DelRing { vip_id: o.vip_id });
        freed_vip = Some(o.vip_id);
    }
    let prev = old
        .and_then(|o| o.ring.as_deref())
        .filter(|r| !fresh && r.len() == ids.len());
    if fresh {
        ops.rings.push(MapOp::CreateRing { vip_id, size });
    }
    match prev {
        Some(prev) => {
            let slots = changed_slots(prev, &ids);
            if !slots.is_empty() {
                ops.rings.push(MapOp::WriteSlots { vip_id, slots });
            }
        }
        None => ops.rings.push(MapOp::WriteRing {
            vip_id,
            ids: ids.clone(),
        }),
    }
    let info = abi::VipInfo {
        vip_id,
        ring_size: size,
        flags: vip_flags(svc),
    };
    if fresh || old.is_none_or(|o| o.flags != info.flags) {
        ops.put_vips.push(MapOp::PutVip { vip: *vip, info });
    }
    // Conntrack turned off: the program looks conntrack up before the
    // VIP, so the VIP's existing entries would keep pinning their flows.
    // Every id of the VIP gets a new generation (same id, same pod: the
    // program never follows an id to something absent), written after
    // the VIP entry says "no conntrack" (before, a packet could still
    // insert an entry with the new generation). The old entries turn
    // stale and their flows follow the ring. A restored VIP (entry
    // unknown) that is off already gets it too: an apply may have failed,
    // or the edge stopped, between the VIP write and these.
    let ct_off = info.flags & abi::VIP_F_NO_CT != 0;
    let was_on = |o: &ProgrammedVip| o.flags & abi::VIP_F_NO_CT == 0 || o.entry.is_none();
    if ct_off && old.is_some_and(was_on) {
        renew_generations(p, &mut backends, &mut ops.regen);
    }
    p.vips.insert(
        *vip,
        ProgrammedVip {
            vip_id,
            ring_size: size,
            flags: info.flags,
            ring: Some(ids),
            backends,
            entry: Some(svc.clone()),
            src_ranges: BTreeSet::new(),
            src_set_of: None,
        },
    );
    freed_vip
}

/// The (slot, backend id) writes that turn the ring `prev` into `ids` (of the
/// same size): only the slots that differ.
fn changed_slots(prev: &[u32], ids: &[u32]) -> Vec<(u32, u32)> {
    (0..ids.len() as u32)
        .filter(|&s| prev[s as usize] != ids[s as usize])
        .map(|s| (s, ids[s as usize]))
        .collect()
}

/// A new generation for every id of the VIP, written to `regen`.
fn renew_generations(
    p: &mut Programmed,
    backends: &mut BTreeMap<IpAddr, ProgrammedBackend>,
    regen: &mut Vec<MapOp>,
) {
    for (a, b) in backends.iter_mut() {
        p.last_generation = p.last_generation.wrapping_add(1).max(1);
        b.generation = p.last_generation;
        regen.push(MapOp::PutBackend {
            id: b.id,
            addr: *a,
            generation: b.generation,
            remote: b.remote,
        });
    }
}

/// Step 3: this service's ids for addresses that left go last; nobody else
/// uses them. So do orphans whose last naming ring was this VIP's
/// (rewritten or removed above, so it names none now). Strays read
/// back after a failed apply (no ring names them, no VIP owns them:
/// only conntrack entries of a VIP that is gone still reach them) go
/// first: before this plan can give their old owner's vip_id to
/// another VIP, and as early as possible. The freed ids return to the pools.
fn release_ids(
    p: &mut Programmed,
    vip: &Vip,
    leaving: &[ProgrammedBackend],
    freed_vip: Option<u32>,
    ops: &mut PlanOps,
) {
    let strays = std::mem::take(&mut p.strays);
    ops.strays = strays.iter().map(|&id| MapOp::DelBackend { id }).collect();
    let mut freed: Vec<u32> = leaving.iter().map(|b| b.id).collect();
    p.orphans.retain(|id, named| {
        named.remove(vip);
        let keep = !named.is_empty();
        if !keep {
            freed.push(*id);
        }
        keep
    });
    ops.dels
        .extend(freed.iter().map(|&id| MapOp::DelBackend { id }));
    for id in freed.into_iter().chain(strays) {
        p.backend_ids.release(id);
    }
    if let Some(id) = freed_vip {
        p.vip_ids.release(id);
    }
}

/// Diff `current` against a whole `desired` state (start-up, resync): the
/// map operations to run and the state the maps hold once they ran. Only
/// services whose entry differs are touched; orphan ids (read back after a
/// failed apply) are deleted at the end, once no ring names them.
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
    // Every update's operations are merged kind by kind into one batch, so
    // that all new rings enter the map of maps in one write and all removed
    // ones in another (`run_ops`), not one grace period each. That is safe
    // because the ids an update frees are held until the batch is emitted:
    // services in one batch never share an id. An update that needs held ids
    // starts a new batch.
    next.hold_ids();
    let mut batch = PlanOps::default();
    let changed = desired
        .services
        .iter()
        .filter(|(v, svc)| current.vips.get(v).and_then(|p| p.entry.as_ref()) != Some(svc));
    let updates: Vec<(&Vip, Option<&ServiceEntry>)> = gone
        .iter()
        .map(|v| (v, None))
        .chain(changed.map(|(v, svc)| (v, Some(svc))))
        .collect();
    for (vip, svc) in updates {
        let one = match plan_update_ops(&mut next, vip, svc) {
            Err(Error::IdsExhausted { .. }) if next.holds_any() => {
                ops.extend(std::mem::take(&mut batch).in_safe_order());
                next.free_held(true);
                plan_update_ops(&mut next, vip, svc)?
            }
            r => r?,
        };
        batch.append(one);
    }
    ops.extend(batch.in_safe_order());
    next.free_held(false);
    // strays are drained by the first plan_update; with no service at all
    // to update they go here
    for (vip_id, ranges) in std::mem::take(&mut next.stray_src_ranges) {
        let ranges = ranges.into_iter().collect();
        ops.push(MapOp::DelSrcRanges { vip_id, ranges });
    }
    for id in std::mem::take(&mut next.strays) {
        ops.push(MapOp::DelBackend { id });
        next.backend_ids.release(id);
    }
    if !next.orphans.is_empty() {
        let named: BTreeSet<u32> = next
            .vips
            .values()
            .flat_map(|v| v.ring.iter().flat_map(|r| r.iter()))
            .copied()
            .filter(|id| next.orphans.contains_key(id))
            .collect();
        let free: Vec<u32> = next
            .orphans
            .keys()
            .filter(|id| !named.contains(id))
            .copied()
            .collect();
        for id in free {
            next.orphans.remove(&id);
            ops.push(MapOp::DelBackend { id });
            next.backend_ids.release(id);
        }
    }
    Ok((ops, next))
}
