//! The planner's source-range writes (spec.loadBalancerSourceRanges): a set for
//! a VIP with a few ranges, trie entries for more; in which order they come,
//! and what the maps hold after them.
use super::fixtures::{ip, read, run, state, svc, vip};
use super::*;
use crate::maps::memory::MemoryMaps;

fn r(s: &str, p: u8) -> SourceRange {
    SourceRange::new(s.parse().unwrap(), p).unwrap()
}

/// `n` distinct IPv4 /24s, 198.18.k.0.
fn nets(n: u8) -> Vec<SourceRange> {
    (0..n)
        .map(|k| SourceRange::new(IpAddr::from([198, 18, k, 0]), 24).unwrap())
        .collect()
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

fn flagged(o: &MapOp, on: bool) -> bool {
    matches!(o, MapOp::PutVip { info, .. } if (info.flags & abi::VIP_F_SRC_RANGES != 0) == on)
}

/// A few ranges: a new set and the pointer to it before the VIP flag and the
/// owners bit; a change writes another set (the old one is reused by a later
/// update only); off: the bits go, the set is freed.
#[test]
fn a_few_ranges_get_a_set_written_before_the_flags() {
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
    let put = pos(&ops, |o| matches!(o, MapOp::PutSrcSet { set: 1, .. }));
    let point = pos(&ops, |o| *o == MapOp::PointSrcSet { vip_id: id, set: 1 });
    let vip_op = pos(&ops, |o| flagged(o, true));
    let own = pos(
        &ops,
        |o| matches!(o, MapOp::Own { ids, src_ranges: true, .. } if ids.len() == 2),
    );
    assert!(put < point && point < vip_op && vip_op < own, "{ops:?}");
    assert!(!ops.iter().any(|o| matches!(o, MapOp::PutSrcRanges { .. })));
    run(&mut m, &ops);
    assert_eq!(m.src_sets[&1], crate::src_ranges::set_value(&office));
    assert_eq!(m.src_set_of[&id], 1);
    assert_eq!(m.owners_src_ranges.len(), 2, "both ids carry the bit");

    // narrowed: a new set (never the one the VIP names), pointed at; no flag write
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1, 2], 7, &office[..1]))])).unwrap();
    assert_eq!(
        ops,
        vec![
            MapOp::PutSrcSet {
                set: 2,
                ranges: office[..1].to_vec()
            },
            MapOp::PointSrcSet { vip_id: id, set: 2 },
        ]
    );
    run(&mut m, &ops);
    // set 1 is free again: the next change takes it
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1, 2], 7, &office[1..]))])).unwrap();
    assert!(
        ops.contains(&MapOp::PointSrcSet { vip_id: id, set: 1 }),
        "{ops:?}"
    );
    run(&mut m, &ops);

    // a new pod while restricted: its id is owned with the bit
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1, 2, 3], 7, &office[1..]))])).unwrap();
    assert!(!ops.iter().any(|o| matches!(o, MapOp::PutSrcSet { .. })));
    run(&mut m, &ops);
    assert_eq!(m.owners_src_ranges.len(), 3);

    // off: the VIP entry and the owners lose the bit; nothing else
    let (ops, p) = plan(&p, &state(vec![(v, svc(&v, &[1, 2, 3], 7))])).unwrap();
    let vip_op = pos(&ops, |o| flagged(o, false));
    let own = pos(&ops, |o| {
        matches!(
            o,
            MapOp::Own {
                src_ranges: false,
                ..
            }
        )
    });
    assert!(vip_op < own, "{ops:?}");
    run(&mut m, &ops);
    assert!(m.owners_src_ranges.is_empty() && m.src_ranges.is_empty());
    // on again with more than a set holds: trie entries, the pointer set to
    // "none" after them (it still names the freed set), then the flags
    let many = nets(9);
    let (ops, _) = plan(&p, &state(vec![(v, with(&v, &[1, 2, 3], 7, &many))])).unwrap();
    let trie = pos(&ops, |o| matches!(o, MapOp::PutSrcRanges { .. }));
    let point = pos(&ops, |o| *o == MapOp::PointSrcSet { vip_id: id, set: 0 });
    let vip_op = pos(&ops, |o| flagged(o, true));
    assert!(trie < point && point < vip_op, "{ops:?}");
    run(&mut m, &ops);
    assert_eq!(m.src_ranges[&id], set(&many));
    assert!(!m.src_set_of.contains_key(&id));
}

/// More ranges than a set holds: trie entries before the flags, deleted
/// after them; narrowing deletes only what left, last; moving to a set and
/// back keeps the pointer right.
#[test]
fn many_ranges_go_to_the_trie_and_are_deleted_last() {
    let v = vip(1, 80);
    let many = nets(10);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(
        &Programmed::default(),
        &state(vec![(v, with(&v, &[1], 7, &many))]),
    )
    .unwrap();
    let put = pos(&ops, |o| matches!(o, MapOp::PutSrcRanges { .. }));
    let vip_op = pos(&ops, |o| flagged(o, true));
    assert!(put < vip_op, "{ops:?}");
    run(&mut m, &ops);
    let id = p.vips[&v].vip_id;
    assert_eq!(m.src_ranges[&id], set(&many));

    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1], 7, &many[..9]))])).unwrap();
    assert_eq!(
        ops,
        vec![MapOp::DelSrcRanges {
            vip_id: id,
            ranges: vec![many[9]]
        }]
    );
    run(&mut m, &ops);

    // down to a set: set and pointer first, the trie entries last
    let (ops, p) = plan(&p, &state(vec![(v, with(&v, &[1], 7, &many[..2]))])).unwrap();
    let point = pos(
        &ops,
        |o| matches!(o, MapOp::PointSrcSet { set, .. } if *set != 0),
    );
    let del = pos(&ops, |o| matches!(o, MapOp::DelSrcRanges { .. }));
    assert!(point < del, "{ops:?}");
    run(&mut m, &ops);
    assert!(m.src_ranges.is_empty());
    // off with a trie: the entries go after the flags
    let (ops, _) = plan(&p, &state(vec![(v, with(&v, &[1], 7, &many))])).unwrap();
    run(&mut m, &ops);
    let p = Programmed::restore(read(&m));
    let (ops, _) = plan(&p, &state(vec![(v, svc(&v, &[1], 7))])).unwrap();
    let vip_op = pos(&ops, |o| flagged(o, false));
    let del = pos(&ops, |o| matches!(o, MapOp::DelSrcRanges { .. }));
    assert!(vip_op < del, "{ops:?}");
    run(&mut m, &ops);
    assert!(m.src_ranges.is_empty());
}

/// A Service that lists ranges, none of the VIP's family: the flag with
/// neither a set nor entries, so no source is accepted (never opened).
#[test]
fn ranges_of_the_other_family_only_close_the_vip() {
    let v = vip(1, 80);
    let e = with(&v, &[1], 7, &[r("2001:db8::", 32)]);
    assert_eq!(e.source_ranges(), Some(&BTreeSet::new()));
    let (ops, p) = plan(&Programmed::default(), &state(vec![(v, e)])).unwrap();
    assert!(
        !ops.iter()
            .any(|o| matches!(o, MapOp::PutSrcRanges { .. } | MapOp::PutSrcSet { .. }))
    );
    assert!(ops.contains(&MapOp::PointSrcSet {
        vip_id: p.vips[&v].vip_id,
        set: 0
    }));
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
/// vip_id (a new set; the old vip_id's trie entries deleted); a deleted VIP
/// takes its entries along.
#[test]
fn ranges_belong_to_one_vip_port_and_follow_its_vip_id() {
    let (a, b) = (vip(1, 80), vip(1, 443));
    let ra = [r("192.0.2.0", 24)];
    let rb = nets(9);
    let mut m = MemoryMaps::default();
    let (ops, p) = plan(
        &Programmed::default(),
        &state(vec![
            (a, with(&a, &[1], 7, &ra)),
            (b, with(&b, &[2], 7, &rb)),
        ]),
    )
    .unwrap();
    run(&mut m, &ops);
    let (ia, ib) = (p.vips[&a].vip_id, p.vips[&b].vip_id);
    assert_ne!(ia, ib);
    let sa = m.src_set_of[&ia];
    assert_eq!(m.src_sets[&sa], crate::src_ranges::set_value(&ra));
    assert_eq!(m.src_ranges[&ib], set(&rb));
    assert!(!m.src_ranges.contains_key(&ia) && !m.src_set_of.contains_key(&ib));

    // both rings grow: new vip_ids; a's new set, b's entries under its new id
    let (ops, p) = plan(
        &p,
        &state(vec![
            (a, with(&a, &[1], 11, &ra)),
            (b, with(&b, &[2], 11, &rb)),
        ]),
    )
    .unwrap();
    run(&mut m, &ops);
    let (ia2, ib2) = (p.vips[&a].vip_id, p.vips[&b].vip_id);
    assert!(ia2 != ia && ib2 != ib);
    assert_ne!(m.src_set_of[&ia2], sa, "a new set, the old one still named");
    assert_eq!(m.src_ranges.get(&ib2), Some(&set(&rb)));
    assert!(
        !m.src_ranges.contains_key(&ib),
        "old vip_id's entries deleted"
    );
    assert_eq!(m.owners[&p.vips[&a].backends[&ip(1)].id], ia2);

    // b deleted: its entries go too
    let (ops, _) = plan(&p, &state(vec![(a, with(&a, &[1], 11, &ra))])).unwrap();
    run(&mut m, &ops);
    assert!(m.src_ranges.is_empty());
}

/// A restarted loader reads the trie and the pointers back: trie entries are
/// not rewritten, a set VIP gets a fresh set (its contents are not read
/// back) without losing the old one before the pointer moves, the ids are
/// owned again (the bit is not read back), and entries under a vip_id no VIP
/// has are deleted.
#[test]
fn restored_ranges_are_kept_and_strays_deleted() {
    let (a, b) = (vip(1, 80), vip(2, 80));
    let d = state(vec![
        (a, with(&a, &[1, 2], 7, &nets(9))),
        (b, with(&b, &[3], 7, &nets(2))),
    ]);
    let mut m = MemoryMaps::default();
    let (ops, p0) = plan(&Programmed::default(), &d).unwrap();
    run(&mut m, &ops);
    m.src_ranges.insert(9, set(&[r("10.0.0.0", 8)])); // a vip_id nobody has
    let (ia, ib) = (p0.vips[&a].vip_id, p0.vips[&b].vip_id);
    let sb = m.src_set_of[&ib];

    let restored = Programmed::restore(read(&m));
    assert_eq!(restored.vips[&a].src_ranges, set(&nets(9)));
    assert_eq!(restored.vips[&b].src_set_of, Some(sb));
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
    let put = pos(
        &ops,
        |o| matches!(o, MapOp::PutSrcSet { set, .. } if *set != sb),
    );
    let point = pos(
        &ops,
        |o| matches!(o, MapOp::PointSrcSet { vip_id, .. } if *vip_id == ib),
    );
    assert!(put < point);
    assert!(ops.iter().any(|o| matches!(
        o,
        MapOp::Own { ids, src_ranges: true, .. } if ids.len() == 2
    )));
    run(&mut m, &ops);
    assert_eq!(m.src_ranges.keys().copied().collect::<Vec<_>>(), vec![ia]);
    assert_ne!(m.src_set_of[&ib], sb);
    assert!(p.stray_src_ranges.is_empty());
}
