//! A plan's map operations in buckets by kind, filled by the diff (`diff.rs`)
//! and the source-range planner (`src_plan.rs`), and the order they run in.

use super::MapOp;

/// A plan's operations by kind, concatenated in the order [`MapOp`] describes.
#[derive(Default)]
pub(super) struct PlanOps {
    pub(super) src_strays: Vec<MapOp>,
    pub(super) strays: Vec<MapOp>,
    /// `src_ranges` entries a VIP gains, then `src_sets` writes and pointers
    /// (`src_plan`): before the VIP entry and owners say "ranges"
    pub(super) src_puts: Vec<MapOp>,
    pub(super) src_sets: Vec<MapOp>,
    pub(super) puts: Vec<MapOp>,
    pub(super) own_new: Vec<MapOp>,
    pub(super) rings: Vec<MapOp>,
    pub(super) put_vips: Vec<MapOp>,
    pub(super) regen: Vec<MapOp>,
    pub(super) own_kept: Vec<MapOp>,
    pub(super) del_vips: Vec<MapOp>,
    pub(super) dels: Vec<MapOp>,
}

impl PlanOps {
    pub(super) fn in_safe_order(self) -> Vec<MapOp> {
        // removals of the VIP entry come before the ring and backend removals
        [
            self.src_strays,
            self.strays,
            self.src_puts,
            self.src_sets,
            self.puts,
            self.own_new,
            self.rings,
            self.put_vips,
            self.regen,
            self.own_kept,
            self.del_vips,
            self.dels,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}
