//! How a whole-state plan batches its Services: ids it frees are held until
//! its operations are emitted, and an update that needs one starts a new batch.

use super::fixtures::{run, state, svc, vip};
use super::*;
use crate::maps::memory::MemoryMaps;

/// A whole-state plan never gives an id one service frees to another in the
/// same batch: a VIP that goes and one that arrives get different vip_ids
/// and backend ids, and the next plan can reuse them.
#[test]
fn ids_freed_by_a_plan_are_not_reused_within_its_batch() {
    let (a, b) = (vip(1, 80), vip(2, 80));
    let (_, one) = plan(&Programmed::default(), &state(vec![(a, svc(&a, &[1], 7))])).unwrap();
    let (ops, two) = plan(&one, &state(vec![(b, svc(&b, &[2], 7))])).unwrap();
    assert_ne!(two.vips[&b].vip_id, one.vips[&a].vip_id, "{ops:?}");
    let a_ids: BTreeSet<u32> = one.backends().map(|(_, _, b)| b.id).collect();
    assert!(
        two.backends().all(|(_, _, b)| !a_ids.contains(&b.id)),
        "{ops:?}"
    );
    // freed once the plan is done
    let c = vip(3, 80);
    let (_, three) = plan(
        &two,
        &state(vec![(b, svc(&b, &[2], 7)), (c, svc(&c, &[3], 7))]),
    )
    .unwrap();
    assert_eq!(three.vips[&c].vip_id, one.vips[&a].vip_id);
}

/// When the only free vip_id is one the plan itself frees, the update that
/// needs it starts a new batch after the operations that free it.
#[test]
fn an_update_that_needs_a_freed_id_runs_after_the_free() {
    let small = Programmed::restore(ReadBack {
        vip_capacity: Some(1),
        ..ReadBack::default()
    });
    let (a, b) = (vip(1, 80), vip(2, 80));
    let (_, one) = plan(&small, &state(vec![(a, svc(&a, &[1], 7))])).unwrap();
    let (ops, two) = plan(&one, &state(vec![(b, svc(&b, &[2], 7))])).unwrap();
    let pos = |want: &dyn Fn(&MapOp) -> bool| ops.iter().position(want).unwrap();
    let del_ring = pos(&|op| matches!(op, MapOp::DelRing { vip_id: 0 }));
    let create = pos(&|op| matches!(op, MapOp::CreateRing { vip_id: 0, .. }));
    assert!(del_ring < create, "{ops:?}");
    assert_eq!(two.vips[&b].vip_id, 0);
    let mut m = MemoryMaps::default();
    run(
        &mut m,
        &plan(&Programmed::default(), &state(vec![(a, svc(&a, &[1], 7))]))
            .unwrap()
            .0,
    );
    run(&mut m, &ops);
    assert_eq!(m.rings[&0].len(), 7, "b's ring, not the empty one");
}
