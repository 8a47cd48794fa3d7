//! Unit tests of the pure planner (no kernel).
use super::fixtures::{draining, ip, read, run, state, svc, vip};
use super::*;
use crate::maps::memory::MemoryMaps;

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
    assert_eq!(
        ops[2],
        MapOp::Own {
            vip_id: 0,
            ids: vec![1, 2],
            src_ranges: false,
            draining: false,
        },
        "owned before any ring names them"
    );
    assert_eq!(ops[3], MapOp::CreateRing { vip_id: 0, size: 7 });
    match &ops[4] {
        MapOp::WriteRing { vip_id: 0, ids } => {
            assert_eq!(ids.len(), 7);
            assert_eq!(ids[..2], [1, 2]);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(ops[5], MapOp::PutVip { .. }));
    assert_eq!(ops.len(), 6);
    assert_eq!(next.backend(&v, ip(1)).map(|b| b.id), Some(1));
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
            generation: 3,
            remote: false,
        }
    );
    assert_eq!(
        ops[1],
        MapOp::Own {
            vip_id: 0,
            ids: vec![3],
            src_ranges: false,
            draining: false,
        }
    );
    match &ops[2] {
        MapOp::WriteSlots { slots, .. } => {
            assert_eq!(slots, &vec![(1, 3), (3, 3), (5, 3), (7, 3)]);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(ops[3], MapOp::DelBackend { id: 2 });
    assert_eq!(ops.len(), 4, "no VIP rewrite: {ops:?}");
    // id 2 is free again for the next plan, with a new generation
    let (ops, _) = plan(&s2, &state(vec![(v, svc(&v, &[1, 3, 4], 8))])).unwrap();
    assert_eq!(
        ops[0],
        MapOp::PutBackend {
            id: 2,
            addr: ip(4),
            generation: 4,
            remote: false,
        }
    );
}

#[test]
fn a_pod_in_two_services_has_one_id_per_service() {
    let (a, b) = (vip(1, 80), vip(2, 53));
    let d = state(vec![(a, svc(&a, &[1, 2], 5)), (b, svc(&b, &[2], 5))]);
    let (_, s) = plan(&Programmed::default(), &d).unwrap();
    let (a2, b2) = (s.backend(&a, ip(2)).unwrap(), s.backend(&b, ip(2)).unwrap());
    assert_ne!(a2.id, b2.id, "pod 2 has an id per service");
    assert_ne!(a2.generation, b2.generation);
    // pod 2 leaves a only: a's id for it goes (its conntrack entries turn
    // stale), b's id and ring are untouched
    let (ops, s2) = plan(
        &s,
        &state(vec![(a, svc(&a, &[1], 5)), (b, svc(&b, &[2], 5))]),
    )
    .unwrap();
    assert!(
        matches!(&ops[0], MapOp::WriteSlots { vip_id: 0, .. }),
        "{ops:?}"
    );
    assert_eq!(ops[1], MapOp::DelBackend { id: a2.id });
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert_eq!(s2.backend(&b, ip(2)), Some(b2));
    assert_eq!(s2.backend(&a, ip(2)), None);
    // removing VIP a deletes a's ids only
    let (ops, s3) = plan(&s2, &state(vec![(b, svc(&b, &[2], 5))])).unwrap();
    let a1 = s2.backend(&a, ip(1)).unwrap().id;
    assert_eq!(
        ops,
        vec![
            MapOp::DelVip { vip: a },
            MapOp::DelRing { vip_id: 0 },
            MapOp::DelBackend { id: a1 }
        ]
    );
    assert_eq!(s3.backends().count(), 1);
}

#[test]
fn ring_size_change_gets_a_new_ring_before_the_old_goes() {
    let v = vip(1, 80);
    let (_, s1) = plan(&Programmed::default(), &state(vec![(v, svc(&v, &[1], 5))])).unwrap();
    let (ops, s2) = plan(&s1, &state(vec![(v, svc(&v, &[1], 7))])).unwrap();
    assert_eq!(ops[0], MapOp::CreateRing { vip_id: 1, size: 7 });
    assert!(matches!(ops[1], MapOp::WriteRing { vip_id: 1, .. }));
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
    assert_eq!(
        ops[3],
        MapOp::Own {
            vip_id: 1,
            ids: vec![1],
            src_ranges: false,
            draining: false,
        },
        "the kept id follows its VIP to the new ring once the VIP points there"
    );
    assert_eq!(ops[4], MapOp::DelRing { vip_id: 0 });
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
    assert_eq!(ops.len(), 2, "{ops:?}");
    assert!(matches!(&ops[0], MapOp::WriteRing { ids, .. } if ids.len() == 5));
    // which ids the lost ring named is unknown too: every id is owned again
    assert!(matches!(&ops[1], MapOp::Own { ids, draining: false, .. } if ids.len() == 2));
}

/// The ops after the VIP entry that turns conntrack off, and a check that
/// every id of the VIP gets its new generation there (the state agrees).
fn regenerated_after_the_vip(ops: &[MapOp], p: &Programmed, v: &Vip) -> Vec<u32> {
    let at = ops
        .iter()
        .position(|op| {
            matches!(op, MapOp::PutVip { vip, info } if vip == v && info.flags == abi::VIP_F_NO_CT)
        })
        .expect("the VIP entry is rewritten with VIP_F_NO_CT");
    let mut ids = Vec::new();
    for (a, b) in &p.vips[v].backends {
        let put = ops[at + 1..].iter().any(|op| {
            *op == MapOp::PutBackend {
                id: b.id,
                addr: *a,
                generation: b.generation,
                remote: false,
            }
        });
        assert!(
            put,
            "id {} ({a}) gets generation {} after the VIP: {ops:?}",
            b.id, b.generation
        );
        ids.push(b.id);
    }
    ids
}

/// Conntrack is looked up before the VIP: turning it off for a VIP must
/// retire its existing entries, or they would pin their flows forever (LRU,
/// no timeout). Every id of the VIP gets a new generation (same id, same
/// pod), after the VIP entry says "no conntrack" so no packet can insert an
/// entry with the new generation meanwhile.
#[test]
fn turning_conntrack_off_gives_every_id_of_the_vip_a_new_generation() {
    let (v, other) = (vip(1, 80), vip(2, 80));
    let d = state(vec![
        (v, draining(&v, &[1, 2], &[3], 3)),
        (other, svc(&other, &[1], 3)),
    ]);
    let (_, s) = plan(&Programmed::default(), &d).unwrap();
    let old: BTreeMap<IpAddr, ProgrammedBackend> = s.vips[&v].backends.clone();
    let off = state(vec![
        (v, draining(&v, &[1, 2], &[3], 3).without_conntrack()),
        (other, svc(&other, &[1], 3)),
    ]);
    let (ops, s2) = plan(&s, &off).unwrap();
    assert!(
        matches!(ops[0], MapOp::PutVip { vip, .. } if vip == v),
        "{ops:?}"
    );
    let ids = regenerated_after_the_vip(&ops, &s2, &v);
    assert_eq!(ids.len(), 3, "the draining pod's id too");
    assert_eq!(
        ops.len(),
        4,
        "nothing else, the other VIP untouched: {ops:?}"
    );
    for (a, b) in &s2.vips[&v].backends {
        assert_eq!(b.id, old[a].id, "same id");
        assert_ne!(
            b.generation, old[a].generation,
            "{a}: old entries turn stale"
        );
    }
    assert!(s2.last_generation >= s2.backends().map(|(_, _, b)| b.generation).max().unwrap());
    // off -> off writes nothing; off -> on writes the VIP entry only (no
    // entry of the old generations is left to revive)
    assert!(plan(&s2, &off).unwrap().0.is_empty());
    let (ops, _) = plan(&s2, &d).unwrap();
    assert!(
        matches!(&ops[..], [MapOp::PutVip { info, .. }] if info.flags == 0),
        "{ops:?}"
    );
    // a backend change in the same update: the new pod's id is in the live
    // ring before the VIP entry changes, so it is regenerated too
    let (ops, s3) = plan(
        &s,
        &state(vec![
            (v, draining(&v, &[1, 4], &[3], 3).without_conntrack()),
            (other, svc(&other, &[1], 3)),
        ]),
    )
    .unwrap();
    assert_eq!(regenerated_after_the_vip(&ops, &s3, &v).len(), 3);
}

/// A new VIP with many endpoints: every id is new and owned once, and a ring
/// size change moves all of them to the new ring. (The plan is O(n): the
/// kept-id check once scanned every new id per id, ~4 s here for 50,000
/// endpoints in a debug build, 0.07 s now. That is a figure, not asserted: a
/// timed test would be flaky on a loaded machine.)
#[test]
fn a_new_vip_with_50_000_endpoints_is_planned_and_owned() {
    let v = vip(1, 80);
    let addrs: Vec<IpAddr> = (0..50_000u32)
        .map(|i| IpAddr::from((0x0a80_0000u32 + i).to_be_bytes()))
        .collect();
    let e = ServiceEntry::new(&v, addrs, (0..7).collect()).unwrap();
    let mut p = Programmed::default();
    let ops = plan_update(&mut p, &v, Some(&e)).unwrap();
    assert_eq!(p.vips[&v].backends.len(), 50_000);
    // owned in two writes: the 7 the ring names, and the others (draining)
    let owned = |ops: &[MapOp]| -> Vec<(usize, bool)> {
        ops.iter()
            .filter_map(|op| match op {
                MapOp::Own { ids, draining, .. } => Some((ids.len(), *draining)),
                _ => None,
            })
            .collect()
    };
    assert!(matches!(&ops[50_000], MapOp::Own { .. }));
    assert_eq!(owned(&ops), [(7, false), (49_993, true)]);
    // a ring size change, where every kept id moves
    let e2 = ServiceEntry::new(&v, e.backends().to_vec(), (0..11).collect()).unwrap();
    let ops = plan_update(&mut p, &v, Some(&e2)).unwrap();
    assert_eq!(owned(&ops), [(11, false), (49_989, true)]);
}

/// An orphan (a live id a ring names but nobody can own, read back after a
/// failed apply) is deleted by the single-service update that rewrites the
/// last ring naming it: `apply_service` alone must not leave it live, or
/// conntrack entries pointing at it would keep forwarding to its pod.
#[test]
fn apply_service_deletes_an_orphan_once_no_ring_names_it() {
    let (a, b) = (vip(1, 80), vip(2, 80));
    let r = ReadBack {
        src_ranges: Default::default(),
        src_set_of: Default::default(),
        vip_capacity: None,
        vips: vec![
            // 7 is a second id for .1 in a's ring and in b's (maps of a
            // loader with global ids, or a failed apply)
            (a, info(0, 3), Some(vec![1, 7, 1])),
            (b, info(1, 3), Some(vec![7, 2, 8])),
        ],
        owners: [(1, 0), (2, 1), (8, 1)].into_iter().collect(),
        backends: [
            (1, be(ip(1), 1)),
            (2, be(ip(2), 2)),
            (7, be(ip(1), 3)),
            (8, be(ip(1), 4)),
        ]
        .into_iter()
        .collect(),
        high_water: 4,
    };
    let mut p = Programmed::restore(r);
    assert_eq!(p.orphans.keys().copied().collect::<Vec<_>>(), vec![7]);
    let ops = plan_update(&mut p, &a, Some(&svc(&a, &[1], 3))).unwrap();
    assert!(
        !ops.contains(&MapOp::DelBackend { id: 7 }),
        "b's ring still names 7: {ops:?}"
    );
    let ops = plan_update(&mut p, &b, None).unwrap();
    assert_eq!(ops.last(), Some(&MapOp::DelBackend { id: 7 }), "{ops:?}");
    assert!(p.orphans.is_empty());
}

#[test]
fn bad_services_are_rejected_with_a_reason() {
    let v = vip(1, 80);
    let e = ServiceEntry::new(&v, vec![ip(1)], vec![0, 1]).unwrap_err();
    assert!(e.to_string().contains("backend index 1"), "{e}");
    assert!(ServiceEntry::new(&v, vec![], vec![0]).is_err());
    assert!(ServiceEntry::new(&v, vec![ip(1)], vec![]).is_err());
    // a Maglev table's size, but more than the XDP maps hold: refused by the plan
    let big = ServiceEntry::new(&v, vec![ip(1)], vec![0; 70_000]).unwrap();
    let e = plan_update(&mut Programmed::default(), &v, Some(&big)).unwrap_err();
    assert_eq!(e.metric_label(), "invalid_service", "{e}");
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
    assert!(matches!(&ops[1], MapOp::Own { vip_id, ids, .. } if *vip_id == id && ids.len() == 1));
    assert!(
        ops[2..]
            .iter()
            .all(|op| matches!(op, MapOp::WriteSlots { vip_id, .. } if *vip_id == id)),
        "{ops:?}"
    );
    // removal through plan_update deletes only this service's ids
    let own: Vec<u32> = p.vips[&target].backends.values().map(|b| b.id).collect();
    assert_eq!(own.len(), 3);
    let ops = plan_update(&mut p, &target, None).unwrap();
    let mut want = vec![MapOp::DelVip { vip: target }, MapOp::DelRing { vip_id: id }];
    want.extend(own.iter().map(|&id| MapOp::DelBackend { id }));
    assert_eq!(ops, want);
    assert_eq!(p.backends().filter(|(_, a, _)| **a == ip(1)).count(), 99);
    // and the full plan agrees that nothing else differs
    let rest = state(
        vips.iter()
            .filter(|v| **v != target)
            .map(|v| (*v, svc(v, &[1, 2], 11)))
            .collect(),
    );
    assert!(plan(&p, &rest).unwrap().0.is_empty());
}

pub(super) fn be(addr: IpAddr, generation: u32) -> abi::BackendValue {
    let (addr, family) = abi::RawAddr::from_ip(addr);
    abi::BackendValue {
        addr,
        family,
        generation,
        ..Default::default()
    }
}

pub(super) fn info(vip_id: u32, ring_size: u32) -> abi::VipInfo {
    abi::VipInfo {
        vip_id,
        ring_size,
        flags: 0,
    }
}

#[test]
fn restore_takes_ownership_from_the_rings() {
    let (a, b) = (vip(1, 80), vip(2, 80));
    let tomb = abi::BackendValue {
        generation: 12,
        ..Default::default()
    };
    let r = ReadBack {
        src_ranges: Default::default(),
        src_set_of: Default::default(),
        vip_capacity: None,
        vips: vec![
            // a: ids 1 (.1) and 4 (.2), an empty slot and a tombstone (6)
            (a, info(3, 5), Some(vec![1, 4, 0, 6, 1])),
            // b: id 4 again (maps of a loader with global ids), 7 a second
            // id for .1 in the same ring, 5 (.1) its own
            (b, info(0, 5), Some(vec![4, 5, 7, 5, 5])),
        ],
        // 5 is b's by its owners entry; 8 (.3, draining) is a's though no
        // ring names it; 9's VIP (42) is gone and no ring names it: a stray.
        // 1, 4 and 7 have no entry (an apply failed before writing it).
        owners: [(5, 0), (8, 3), (9, 42)].into_iter().collect(),
        backends: [
            (1, be(ip(1), 7)),
            (4, be(ip(2), 9)),
            (5, be(ip(1), 10)),
            (6, tomb),
            (7, be(ip(1), 11)),
            (8, be(ip(3), 12)),
            (9, be(ip(9), 5)),
        ]
        .into_iter()
        .collect(),
        high_water: 13,
    };
    let p = Programmed::restore(r);
    assert_eq!(p.last_generation, 13, "the high-water mark survives");
    assert_eq!(p.backend(&a, ip(1)).map(|b| b.id), Some(1));
    assert_eq!(p.backend(&a, ip(2)).map(|b| b.id), Some(4));
    assert_eq!(p.backend(&b, ip(1)).map(|b| b.id), Some(5));
    assert_eq!(p.backend(&b, ip(2)), None, "id 4 stays with a");
    assert_eq!(
        p.backend(&a, ip(3)).map(|b| b.id),
        Some(8),
        "draining, by owner"
    );
    assert_eq!(
        p.orphans,
        [(7, [b].into_iter().collect())].into_iter().collect(),
        "named by b's ring"
    );
    assert_eq!(p.strays, [9].into_iter().collect());
    // re-applying: a is rewritten where its ring differs, b's .2 gets a new id
    // and the orphan goes once b's ring no longer names it
    let d = state(vec![
        (a, draining(&a, &[1, 2], &[3], 5)),
        (b, svc(&b, &[1, 2], 5)),
    ]);
    let (ops, next) = plan(&p, &d).unwrap();
    assert_eq!(ops[0], MapOp::DelBackend { id: 9 }, "the stray goes first");
    let a_writes: Vec<&MapOp> = ops
        .iter()
        .filter(|op| matches!(op, MapOp::WriteSlots { vip_id: 3, .. }))
        .collect();
    assert_eq!(
        a_writes,
        vec![&MapOp::WriteSlots {
            vip_id: 3,
            slots: vec![(2, 1), (3, 4)]
        }],
        "a: only the empty slot and the tombstone are rewritten"
    );
    let puts: Vec<&MapOp> = ops
        .iter()
        .filter(|op| matches!(op, MapOp::PutBackend { .. }))
        .collect();
    assert_eq!(
        puts,
        vec![&MapOp::PutBackend {
            id: 2,
            addr: ip(2),
            generation: 14,
            remote: false,
        }],
        "b's .2: lowest free id, generation above the high-water mark"
    );
    assert_eq!(ops.last(), Some(&MapOp::DelBackend { id: 7 }));
    assert!(ops.contains(&MapOp::DelBackend { id: 9 }), "the stray goes");
    // also when no service is left to plan
    // a stray also goes when no service is left at all
    let lone = Programmed::restore(ReadBack {
        src_ranges: Default::default(),
        src_set_of: Default::default(),
        vip_capacity: None,
        owners: [(3, 5)].into_iter().collect(),
        backends: [(3, be(ip(9), 2))].into_iter().collect(),
        ..Default::default()
    });
    assert_eq!(lone.strays, [3].into_iter().collect());
    let (none, _) = plan(&lone, &DesiredState::default()).unwrap();
    assert_eq!(none, vec![MapOp::DelBackend { id: 3 }]);
    assert!(next.orphans.is_empty() && next.strays.is_empty());
    assert!(
        !ops.iter()
            .any(|op| matches!(op, MapOp::DelBackend { id } if *id == 4 || *id == 1 || *id == 5)),
        "{ops:?}"
    );
    // and nothing is left to do
    assert!(plan(&next, &d).unwrap().0.is_empty());
}

#[test]
fn restored_identical_state_writes_nothing() {
    let v = vip(1, 80);
    let d = state(vec![(v, svc(&v, &[1, 2], 5))]);
    let (_, p) = plan(&Programmed::default(), &d).unwrap();
    let pv = &p.vips[&v];
    let r = ReadBack {
        src_ranges: Default::default(),
        src_set_of: Default::default(),
        vip_capacity: None,
        vips: vec![(
            v,
            info(pv.vip_id, 5),
            pv.ring.as_deref().map(<[u32]>::to_vec),
        )],
        owners: pv.backends.values().map(|b| (b.id, pv.vip_id)).collect(),
        backends: pv
            .backends
            .iter()
            .map(|(a, b)| (b.id, be(*a, b.generation)))
            .collect(),
        high_water: p.last_generation,
    };
    let restored = Programmed::restore(r);
    let (ops, _) = plan(&restored, &d).unwrap();
    assert!(ops.is_empty(), "{ops:?}");
    // an unreadable ring is rewritten whole (with fresh ids: ownership unknown)
    let r = ReadBack {
        src_ranges: Default::default(),
        src_set_of: Default::default(),
        vip_capacity: None,
        vips: vec![(v, info(pv.vip_id, 5), None)],
        ..Default::default()
    };
    let (ops, _) = plan(&Programmed::restore(r), &d).unwrap();
    assert!(
        ops.iter()
            .any(|op| matches!(op, MapOp::WriteRing { ids, .. } if ids.len() == 5))
    );
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

/// A restart reads every id back with its owner, also a draining pod's id
/// that no ring names: its established flows keep their backend, and when it
/// finally leaves its id is deleted (not leaked live, which would keep those
/// conntrack entries valid forever).
#[test]
fn a_restart_keeps_the_ids_of_draining_pods() {
    let v = vip(1, 80);
    let d = state(vec![(v, draining(&v, &[1, 2], &[3], 7))]);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(&Programmed::default(), &d).unwrap();
    run(&mut m, &ops);
    let restored = Programmed::restore(read(&m));
    assert_eq!(
        restored.backends().collect::<Vec<_>>(),
        p.backends().collect::<Vec<_>>()
    );
    let (ops, _) = plan(&restored, &d).unwrap();
    assert!(ops.is_empty(), "{ops:?}");
    // the draining pod leaves: its id is deleted
    let id3 = restored.backend(&v, ip(3)).unwrap().id;
    let (ops, _) = plan(&restored, &state(vec![(v, svc(&v, &[1, 2], 7))])).unwrap();
    assert_eq!(ops, vec![MapOp::DelBackend { id: id3 }]);
}

/// A pod that leaves the ring but keeps its id (terminating, draining) gets
/// the draining bit in `owners`, so a client's affinity to it ends; back in
/// the ring, the bit goes. A restart (rings read back) rewrites nothing.
#[test]
fn owners_say_which_ids_are_draining() {
    let v = vip(1, 80);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(
        &Programmed::default(),
        &state(vec![(v, draining(&v, &[1, 2], &[3], 7))]),
    )
    .unwrap();
    run(&mut m, &ops);
    let id = |p: &Programmed, x: u8| p.backend(&v, ip(x)).unwrap().id;
    assert_eq!(m.owners_draining, BTreeSet::from([id(&p, 3)]));
    let restored = Programmed::restore(read(&m));
    let (ops, _) = plan(&restored, &state(vec![(v, draining(&v, &[1, 2], &[3], 7))])).unwrap();
    assert!(ops.is_empty(), "{ops:?}");

    // 2 starts terminating, 3 is ready again: one Own per direction
    let (ops, p2) = plan(&p, &state(vec![(v, draining(&v, &[1, 3], &[2], 7))])).unwrap();
    let owns: Vec<_> = ops
        .iter()
        .filter_map(|o| match o {
            MapOp::Own { ids, draining, .. } => Some((ids.clone(), *draining)),
            _ => None,
        })
        .collect();
    assert_eq!(
        owns,
        [(vec![id(&p, 3)], false), (vec![id(&p, 2)], true)],
        "{ops:?}"
    );
    run(&mut m, &ops);
    assert_eq!(m.owners_draining, BTreeSet::from([id(&p2, 2)]));
    assert_eq!(m.owners[&id(&p2, 2)], p2.vips[&v].vip_id, "still the VIP's");
}

/// A ring size change moves the VIP to a new ring id; the owners follow once
/// the VIP entry points there, and a restart at that point keeps every id.
#[test]
fn owners_follow_a_ring_size_change() {
    let v = vip(1, 80);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(
        &Programmed::default(),
        &state(vec![(v, svc(&v, &[1, 2], 5))]),
    )
    .unwrap();
    run(&mut m, &ops);
    let (ops, p2) = plan(&p, &state(vec![(v, svc(&v, &[1, 2, 3], 7))])).unwrap();
    let put_vip = ops
        .iter()
        .position(|op| matches!(op, MapOp::PutVip { .. }))
        .unwrap();
    let own_kept = ops
        .iter()
        .position(|op| matches!(op, MapOp::Own { ids, .. } if ids.len() == 2))
        .unwrap();
    assert!(own_kept > put_vip, "{ops:?}");
    run(&mut m, &ops);
    let new_vid = p2.vips[&v].vip_id;
    assert!(m.owners.values().all(|o| *o == new_vid), "{:?}", m.owners);
    let r = Programmed::restore(read(&m));
    assert_eq!(
        r.backends().collect::<Vec<_>>(),
        p2.backends().collect::<Vec<_>>()
    );
}

/// Cross-region failover: a remote-VIP backend and a failover alias are written
/// with their flags, read back with them (a restart plans nothing), and an
/// address that turns remote (or back) gets a new id, so its flows move.
#[test]
fn remote_backends_and_aliases_round_trip_through_the_maps() {
    let (a, b) = (vip(1, 80), vip(2, 80));
    let remote = IpAddr::from([10, 9, 0, 1]);
    let with_remote = |remote_flag: bool| {
        let e = ServiceEntry::new(&a, vec![ip(1), remote], vec![0, 1, 0, 1, 1]).unwrap();
        if remote_flag {
            e.with_remote(&a, [remote]).unwrap()
        } else {
            e
        }
    };
    let d = state(vec![
        (a, with_remote(true)),
        (b, svc(&b, &[2, 3], 5).as_failover_alias(&b).unwrap()),
    ]);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(&Programmed::default(), &d).unwrap();
    run(&mut m, &ops);
    assert!(ops.contains(&MapOp::PutBackend {
        id: p.backend(&a, remote).unwrap().id,
        addr: remote,
        generation: p.backend(&a, remote).unwrap().generation,
        remote: true,
    }));
    let rid = p.backend(&a, remote).unwrap().id;
    assert!(m.backends[&rid].is_remote());
    assert!(!m.backends[&p.backend(&a, ip(1)).unwrap().id].is_remote());
    assert_eq!(m.vips[&b].flags, abi::VIP_F_FAILOVER_ALIAS);
    assert_eq!(m.vips[&a].flags, 0);
    assert_eq!(p.own_vip_addrs(), [a.addr].into_iter().collect());
    assert!(p.is_own_vip_addr(a.addr) && !p.is_own_vip_addr(b.addr));

    // a restart reads the flags back and has nothing to write
    let restored = Programmed::restore(read(&m));
    assert!(restored.backend(&a, remote).unwrap().remote);
    assert_eq!(restored.vips[&b].flags, abi::VIP_F_FAILOVER_ALIAS);
    let (ops, _) = plan(&restored, &d).unwrap();
    assert!(ops.is_empty(), "{ops:?}");

    // the address is a pod now: a new id (not remote), the remote one leaves
    let d2 = state(vec![(a, with_remote(false)), (b, d.services[&b].clone())]);
    let (ops, p2) = plan(&restored, &d2).unwrap();
    let now = p2.backend(&a, remote).unwrap();
    assert!(!now.remote && now.id != rid, "{now:?}");
    assert!(ops.contains(&MapOp::DelBackend { id: rid }), "{ops:?}");
    run(&mut m, &ops);
    assert!(!m.backends[&now.id].is_remote());
}

#[test]
fn vip_ids_stay_below_the_counters_capacity() {
    let small = Programmed::restore(ReadBack {
        vip_capacity: Some(1),
        ..ReadBack::default()
    });
    let (a, b) = (vip(1, 80), vip(2, 80));
    let (_, one) = plan(&small, &state(vec![(a, svc(&a, &[1], 7))])).unwrap();
    let err = plan(
        &one,
        &state(vec![(a, svc(&a, &[1], 7)), (b, svc(&b, &[2], 7))]),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            crate::Error::IdsExhausted {
                what: "VIP",
                max: 1
            }
        ),
        "{err:?}"
    );
}
