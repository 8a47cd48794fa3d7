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
    /// `other`'s operations after this one's, kind by kind.
    pub(super) fn append(&mut self, mut other: PlanOps) {
        for (mine, theirs) in [
            (&mut self.src_strays, &mut other.src_strays),
            (&mut self.strays, &mut other.strays),
            (&mut self.src_puts, &mut other.src_puts),
            (&mut self.src_sets, &mut other.src_sets),
            (&mut self.puts, &mut other.puts),
            (&mut self.own_new, &mut other.own_new),
            (&mut self.rings, &mut other.rings),
            (&mut self.put_vips, &mut other.put_vips),
            (&mut self.regen, &mut other.regen),
            (&mut self.own_kept, &mut other.own_kept),
            (&mut self.del_vips, &mut other.del_vips),
            (&mut self.dels, &mut other.dels),
        ] {
            mine.append(theirs);
        }
    }

    pub(super) fn in_safe_order(mut self) -> Vec<MapOp> {
        // Ring removals before the other removals: the backends they name
        // are tombstoned only after the kernel's grace period for the rings
        // (one for all of them, `run_ops`).
        self.dels
            .sort_by_key(|op| !matches!(op, MapOp::DelRing { .. }));
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
