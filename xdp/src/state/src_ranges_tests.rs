//! The planner's `src_ranges` writes (spec.loadBalancerSourceRanges): in
//! which order they come, and what the maps hold after them.
use super::tests::{ip, state, svc, vip};
use super::*;
use crate::maps::memory::MemoryMaps;
use crate::state::failure_tests::{read, run};

fn r(s: &str, p: u8) -> SourceRange {
    SourceRange::new(s.parse().unwrap(), p).unwrap()
}

fn with(v: &Vip, backends: &[u8], size: usize, ranges: &[SourceRange]) -> ServiceEntry {
    svc(v, backends, size).with_source_ranges(v, ranges.iter().copied())
}

fn pos(ops: &[MapOp], f: impl Fn(&MapOp) -> bool) -> usize {
    ops.iter()
        .position(f)
        .unwrap_or_else(|| panic!("not in {ops:?}"))
}

fn set(rs: &[SourceRange]) -> BTreeSet<SourceRange> {
    rs.iter().copied().collect()
}

/// Ranges on: the trie entries first, then the VIP entry with the flag, and
/// the owners of every id with the bit; off: the bits go first, the entries last.
#[test]
fn ranges_are_written_before_the_flags_and_deleted_after_them() {
    let v = vip(1, 80);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(
        &Programmed::default(),
        &state(vec![(v, svc(&v, &[1, 2], 7))]),
    )
    .unwrap();
    run(&mut m, &ops);
    let id = p.vips[&v].vip_id;

    let office = [r("192.0.2.0", 24), r("198.51.100.7", 32)];
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1, 2], 7, &office))])).unwrap();
    let put = pos(&ops, |o| matches!(o, MapOp::PutSrcRanges { .. }));
    let vip_op = pos(
        &ops,
        |o| matches!(o, MapOp::PutVip { info, .. } if info.flags & abi::VIP_F_SRC_RANGES != 0),
    );
    let own = pos(
        &ops,
        |o| matches!(o, MapOp::Own { ids, src_ranges: true, .. } if ids.len() == 2),
    );
    assert!(put < vip_op && vip_op < own, "{ops:?}");
    run(&mut m, &ops);
    assert_eq!(m.src_ranges[&id], set(&office));
    assert_eq!(m.owners_src_ranges.len(), 2, "both ids carry the bit");
    assert_eq!(p.vips[&v].src_ranges, set(&office));

    // narrowed: one entry deleted, last; nothing else written
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1, 2], 7, &office[..1]))])).unwrap();
    assert_eq!(
        ops,
        vec![MapOp::DelSrcRanges {
            vip_id: id,
            ranges: vec![office[1]]
        }]
    );
    run(&mut m, &ops);
    assert_eq!(m.src_ranges[&id], set(&office[..1]));

    // a new pod while restricted: its id is owned with the bit
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1, 2, 3], 7, &office[..1]))])).unwrap();
    assert!(
        ops.iter()
            .any(|o| matches!(o, MapOp::Own { ids, src_ranges: true, .. } if ids.len() == 1))
    );
    run(&mut m, &ops);
    assert_eq!(m.owners_src_ranges.len(), 3);

    // off: the VIP entry and the owners lose the bit before the entry goes
    let (ops, p) = plan(&p, &state(vec![(v, svc(&v, &[1, 2, 3], 7))])).unwrap();
    let vip_op = pos(
        &ops,
        |o| matches!(o, MapOp::PutVip { info, .. } if info.flags & abi::VIP_F_SRC_RANGES == 0),
    );
    let own = pos(&ops, |o| {
        matches!(
            o,
            MapOp::Own {
                src_ranges: false,
                ..
            }
        )
    });
    let del = pos(&ops, |o| matches!(o, MapOp::DelSrcRanges { .. }));
    assert!(vip_op < own && own < del, "{ops:?}");
    run(&mut m, &ops);
    assert!(m.src_ranges.is_empty() && m.owners_src_ranges.is_empty());
    assert!(p.vips[&v].src_ranges.is_empty());
}

/// A Service that lists ranges, none of the VIP's family: the flag without
/// entries, so no source is accepted (never opened to the world).
#[test]
fn ranges_of_the_other_family_only_close_the_vip() {
    let v = vip(1, 80);
    let e = with(&v, &[1], 7, &[r("2001:db8::", 32)]);
    assert_eq!(e.source_ranges(), Some(&BTreeSet::new()));
    let (ops, p) = plan(&Programmed::default(), &state(vec![(v, e)])).unwrap();
    assert!(!ops.iter().any(|o| matches!(o, MapOp::PutSrcRanges { .. })));
    assert_ne!(p.vips[&v].flags & abi::VIP_F_SRC_RANGES, 0);
    assert!(ops.iter().any(|o| matches!(
        o,
        MapOp::Own {
            src_ranges: true,
            ..
        }
    )));
}

/// Two Services on one address, other ports: each VIP:port has its own
/// vip_id and so its own ranges; a ring-size change moves them to the new
/// vip_id and deletes the old one's; a deleted VIP takes its ranges along.
#[test]
fn ranges_belong_to_one_vip_port_and_follow_its_vip_id() {
    let (a, b) = (vip(1, 80), vip(1, 443));
    let (ra, rb) = (r("192.0.2.0", 24), r("203.0.113.0", 24));
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(
        &Programmed::default(),
        &state(vec![
            (a, with(&a, &[1], 7, &[ra])),
            (b, with(&b, &[2], 7, &[rb])),
        ]),
    )
    .unwrap();
    run(&mut m, &ops);
    let (ia, ib) = (p.vips[&a].vip_id, p.vips[&b].vip_id);
    assert_ne!(ia, ib);
    assert_eq!(m.src_ranges[&ia], set(&[ra]));
    assert_eq!(m.src_ranges[&ib], set(&[rb]));

    // a's ring grows: a new vip_id with a's ranges, the old one's deleted
    let (ops, p) = plan(
        &p,
        &state(vec![
            (a, with(&a, &[1], 11, &[ra])),
            (b, with(&b, &[2], 7, &[rb])),
        ]),
    )
    .unwrap();
    run(&mut m, &ops);
    let ia2 = p.vips[&a].vip_id;
    assert_ne!(ia2, ia);
    assert_eq!(m.src_ranges.get(&ia2), Some(&set(&[ra])));
    assert!(
        !m.src_ranges.contains_key(&ia),
        "old vip_id's ranges deleted"
    );
    assert_eq!(m.owners[&p.vips[&a].backends[&ip(1)].id], ia2);

    // b deleted: its ranges go too
    let (ops, _) = plan(&p, &state(vec![(a, with(&a, &[1], 11, &[ra]))])).unwrap();
    run(&mut m, &ops);
    assert!(!m.src_ranges.contains_key(&ib));
    assert_eq!(m.src_ranges.len(), 1);
}

/// A restarted loader reads the ranges back and rewrites none of them; it
/// owns the ids again (the bit is not read back) and deletes entries under a
/// vip_id no VIP has.
#[test]
fn restored_ranges_are_kept_and_strays_deleted() {
    let v = vip(1, 80);
    let d = state(vec![(v, with(&v, &[1, 2], 7, &[r("192.0.2.0", 24)]))]);
    let mut m = MemoryMaps::default();
    let (ops, _) = plan(&Programmed::default(), &d).unwrap();
    run(&mut m, &ops);
    m.src_ranges.insert(9, set(&[r("10.0.0.0", 8)])); // a vip_id nobody has
    let before = m.src_ranges[&0].clone();

    let restored = Programmed::restore(read(&m));
    assert_eq!(restored.vips[&v].src_ranges, before);
    assert_eq!(restored.stray_src_ranges.len(), 1);
    let (ops, p) = plan(&restored, &d).unwrap();
    assert!(
        !ops.iter().any(|o| matches!(o, MapOp::PutSrcRanges { .. })),
        "{ops:?}"
    );
    assert!(ops.contains(&MapOp::DelSrcRanges {
        vip_id: 9,
        ranges: vec![r("10.0.0.0", 8)]
    }));
    assert!(
        ops.iter()
            .any(|o| matches!(o, MapOp::Own { ids, src_ranges: true, .. } if ids.len() == 2))
    );
    run(&mut m, &ops);
    assert_eq!(m.src_ranges.keys().copied().collect::<Vec<_>>(), vec![0]);
    assert!(p.stray_src_ranges.is_empty());
}
