//! The planner against a pure model of the kernel maps: writes that fail at
//! every point of a change, then re-read, re-planned and re-applied.
use super::fixtures::{draining, read, run, state, svc, vip};
use super::*;
use crate::maps::memory::MemoryMaps;

/// Invariants of the maps, checked after every step of the failure tests.
trait Invariants {
    fn vipless(&self) -> Result<(), String>;
    fn check(&self, want: &DesiredState, only: Option<&Vip>) -> Result<(), String>;
}

impl Invariants for MemoryMaps {
    /// The invariant conntrack-first relies on: every live id belongs to a
    /// VIP that exists (its `owners` entry names a VIP entry's vip_id, or a
    /// VIP's ring names it). A conntrack hit on a live id is forwarded
    /// without looking at `vips`, so a live id of a deleted VIP keeps its
    /// flows going.
    fn vipless(&self) -> Result<(), String> {
        let vids: BTreeSet<u32> = self.vips.values().map(|i| i.vip_id).collect();
        let named: BTreeSet<u32> = self
            .vips
            .values()
            .flat_map(|i| self.rings[&i.vip_id].iter().copied())
            .collect();
        for id in self.live() {
            let owned = self.owners.get(&id).is_some_and(|v| vids.contains(v));
            if !owned && !named.contains(&id) {
                return Err(format!(
                    "id {id} is live, its VIP (owner {:?}) is gone",
                    self.owners.get(&id)
                ));
            }
        }
        Ok(())
    }

    /// Every slot of every VIP names a live backend (one of `want`'s addresses
    /// for the VIPs `only` selects), and no id is in two VIPs' rings.
    fn check(&self, want: &DesiredState, only: Option<&Vip>) -> Result<(), String> {
        let mut owner = BTreeMap::new();
        for (v, i) in &self.vips {
            let ring = &self.rings[&i.vip_id];
            for (s, id) in ring.iter().enumerate() {
                let b = self.backends.get(id).copied().unwrap_or_default();
                let Some(a) = b.addr.to_ip(b.family) else {
                    return Err(format!("{v} slot {s}: id {id} is not a live backend"));
                };
                if only.is_some_and(|o| o == v) && !want.services[v].backends().contains(&a) {
                    return Err(format!("{v} slot {s}: {a} is not one of its backends"));
                }
                if let Some(other) = owner.insert(*id, *v)
                    && other != *v
                {
                    return Err(format!("id {id} is in the rings of {other} and {v}"));
                }
            }
        }
        Ok(())
    }
}

/// A write that fails halfway leaves the maps between two states; the loader
/// re-reads them (no reference counts). Whatever the failure point,
/// single-service updates afterwards (`apply_service`) never delete an id
/// another VIP's ring still names, every slot keeps a live backend, and after
/// every update the invariant conntrack-first relies on holds: no live id
/// whose VIP is gone. (Between the failed write and the next update such
/// ids may be live: the window docs/datapath.md describes.)
#[test]
fn apply_service_after_a_failed_write_never_breaks_another_service() {
    let (a, b, c, d) = (vip(1, 80), vip(2, 80), vip(3, 53), vip(4, 80));
    let before = state(vec![
        (a, draining(&a, &[1, 2], &[5], 7)),
        (b, svc(&b, &[2, 3], 7)),
        (c, svc(&c, &[1, 2, 3], 5)),
        (d, svc(&d, &[2, 6], 5)),
    ]);
    // d is deleted, b's ring changes size (it takes d's old vip_id), c turns
    // conntrack off
    let after = state(vec![
        (a, draining(&a, &[2, 4], &[1], 7)),
        (b, svc(&b, &[2], 11)),
        (c, draining(&c, &[1, 3], &[2], 5).without_conntrack()),
    ]);
    let (first, p0) = plan(&Programmed::default(), &before).unwrap();
    let (change, _) = plan(&p0, &after).unwrap();
    assert!(change.contains(&MapOp::DelVip { vip: d }));
    let mut windows = 0;
    for k in 0..=change.len() {
        let mut m = MemoryMaps::default();
        run(&mut m, &first);
        run(&mut m, &change[..k]); // the write fails at op k
        m.check(&after, None)
            .unwrap_or_else(|e| panic!("maps after a failure at op {k}: {e}"));
        windows += usize::from(m.vipless().is_err());
        let mut p = Programmed::restore(read(&m));
        // the fast path, one service at a time; the removal last, so the
        // strays of d (if its entry went already) are left to other updates
        let updates = after
            .services
            .iter()
            .map(|(v, e)| (*v, Some(e)))
            .chain([(d, None)]);
        for (v, e) in updates {
            let ops = plan_update(&mut p, &v, e).unwrap();
            let named: BTreeSet<u32> = m
                .vips
                .iter()
                .filter(|(o, _)| **o != v)
                .flat_map(|(_, i)| m.rings[&i.vip_id].iter().copied())
                .collect();
            for op in &ops {
                if let MapOp::DelBackend { id } = op {
                    assert!(
                        !named.contains(id),
                        "failure at op {k}: updating {v} deletes id {id}, which another VIP's ring names"
                    );
                }
            }
            run(&mut m, &ops);
            let only = e.is_some().then_some(&v);
            m.check(&after, only)
                .unwrap_or_else(|e| panic!("failure at op {k}, after updating {v}: {e}"));
            m.vipless()
                .unwrap_or_else(|e| panic!("failure at op {k}, after updating {v}: {e}"));
            // every live id is known: a claimed id, or an orphan a ring of
            // a VIP not updated yet still names
            let known: BTreeSet<u32> = p
                .backends()
                .map(|(_, _, b)| b.id)
                .chain(p.orphans.keys().copied())
                .collect();
            let leaked: Vec<u32> = m.live().difference(&known).copied().collect();
            assert!(
                leaked.is_empty(),
                "failure at op {k}, after {v}: live ids nobody knows: {leaked:?}"
            );
        }
        // every VIP was updated: no orphan is left live, exactly the pairs of
        // `after` are (apply_service alone, no full resync)
        assert!(p.orphans.is_empty(), "failure at op {k}: {:?}", p.orphans);
        assert!(p.strays.is_empty(), "failure at op {k}: {:?}", p.strays);
        let claimed: BTreeSet<u32> = p.backends().map(|(_, _, b)| b.id).collect();
        assert_eq!(m.live(), claimed, "failure at op {k}: after apply_service");
        // a full resync afterwards converges and cleans up
        let (ops, next) = plan(&Programmed::restore(read(&m)), &after).unwrap();
        run(&mut m, &ops);
        for v in after.services.keys() {
            m.check(&after, Some(v)).unwrap();
        }
        m.vipless().unwrap();
        assert!(next.orphans.is_empty() && next.strays.is_empty());
        assert!(plan(&next, &after).unwrap().0.is_empty());
        // exactly the pairs of `after` are live, each owned by its VIP
        let want: BTreeMap<u32, u32> = next
            .backends()
            .map(|(v, _, b)| (b.id, next.vips[v].vip_id))
            .collect();
        assert_eq!(
            m.live(),
            want.keys().copied().collect(),
            "failure at op {k}"
        );
        assert_eq!(m.owners, want, "failure at op {k}");
        let pairs: usize = after.services.values().map(|e| e.backends().len()).sum();
        assert_eq!(want.len(), pairs);
    }
    assert!(
        windows > 0,
        "some failure point leaves d's ids live without d"
    );
}

/// After a restart (or a failed apply) the loader cannot know whether the
/// write that turned conntrack off got as far as the new generations: a
/// restored VIP that is off already gets them (again).
#[test]
fn a_restored_vip_without_conntrack_is_regenerated_once() {
    let v = vip(1, 80);
    let off = state(vec![(v, svc(&v, &[1, 2], 5).without_conntrack())]);
    let on = state(vec![(v, svc(&v, &[1, 2], 5))]);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(&Programmed::default(), &on).unwrap();
    run(&mut m, &ops);
    let (ops, _) = plan(&p, &off).unwrap();
    // the write fails right after the VIP entry
    let at = ops
        .iter()
        .position(|op| matches!(op, MapOp::PutVip { .. }))
        .unwrap();
    run(&mut m, &ops[..=at]);
    let restored = Programmed::restore(read(&m));
    assert_eq!(restored.vips[&v].flags, abi::VIP_F_NO_CT);
    let (ops, next) = plan(&restored, &off).unwrap();
    assert_eq!(regenerated_after_the_vip_or_start(&ops, &next, &v), 2);
    run(&mut m, &ops);
    for (a, b) in &next.vips[&v].backends {
        assert_ne!(b.generation, p.vips[&v].backends[a].generation);
        assert_eq!(m.backends[&b.id].generation, b.generation);
    }
    assert!(plan(&next, &off).unwrap().0.is_empty(), "once");
}

/// Like `regenerated_after_the_vip` for a plan with no VIP write (the VIP
/// entry is off already): every id of the VIP gets its new generation.
fn regenerated_after_the_vip_or_start(ops: &[MapOp], p: &Programmed, v: &Vip) -> usize {
    for (a, b) in &p.vips[v].backends {
        let put = MapOp::PutBackend {
            id: b.id,
            addr: *a,
            generation: b.generation,
            remote: b.remote,
        };
        assert!(ops.contains(&put), "{put:?} missing: {ops:?}");
    }
    p.vips[v].backends.len()
}

/// A VIP's removal fails after its `DelVip`: its ids stay live (strays after
/// the re-read). The next update deletes them before anything else, in
/// particular before it hands the removed VIP's vip_id to another VIP: the
/// strays' `owners` entries name that vip_id, and a re-read after a second
/// failure would give them to the new VIP, whose conntrack hits they would
/// then keep forwarding.
#[test]
fn strays_go_before_their_old_vip_id_is_reused() {
    let (b, d) = (vip(2, 80), vip(4, 80));
    let before = state(vec![(b, svc(&b, &[2, 3], 7)), (d, svc(&d, &[6, 7], 5))]);
    let mut m = MemoryMaps::default();
    let (ops, mut p) = plan(&Programmed::default(), &before).unwrap();
    run(&mut m, &ops);
    let d_vid = p.vips[&d].vip_id;
    let d_ids: BTreeSet<u32> = p.vips[&d].backends.values().map(|x| x.id).collect();
    let ops = plan_update(&mut p, &d, None).unwrap();
    let del_vip = ops
        .iter()
        .position(|op| *op == MapOp::DelVip { vip: d })
        .unwrap();
    run(&mut m, &ops[..=del_vip]); // fails right after the VIP entry went
    assert!(m.vipless().is_err(), "the window: d's ids are live");
    let mut p = Programmed::restore(read(&m));
    assert_eq!(p.strays, d_ids);
    // b's ring changes size: it gets a new vip_id, d's old one
    let ops = plan_update(&mut p, &b, Some(&svc(&b, &[2, 3], 11))).unwrap();
    assert_eq!(p.vips[&b].vip_id, d_vid, "d's vip_id is reused");
    let create = ops
        .iter()
        .position(|op| matches!(op, MapOp::CreateRing { .. }))
        .unwrap();
    for (i, op) in ops.iter().enumerate() {
        if let MapOp::DelBackend { id } = op
            && d_ids.contains(id)
        {
            assert!(
                i < create,
                "stray {id} deleted at op {i}, after CreateRing: {ops:?}"
            );
        }
    }
    // this update fails too, at every point: a re-read never gives d's ids
    // to b, and the next update leaves none of them live
    for k in 0..=ops.len() {
        let mut m2 = m.clone();
        run(&mut m2, &ops[..k]);
        let mut p2 = Programmed::restore(read(&m2));
        let stolen: Vec<u32> = p2
            .backends()
            .map(|(_, _, x)| x.id)
            .filter(|id| d_ids.contains(id))
            .collect();
        assert!(
            stolen.is_empty(),
            "failure at op {k}: b took d's ids {stolen:?}"
        );
        let again = plan_update(&mut p2, &b, Some(&svc(&b, &[2, 3], 11))).unwrap();
        run(&mut m2, &again);
        m2.vipless()
            .unwrap_or_else(|e| panic!("failure at op {k}: {e}"));
        assert!(m2.live().is_disjoint(&d_ids), "failure at op {k}");
    }
}
