//! The planner's part for source ranges (`spec.loadBalancerSourceRanges`; the
//! maps are described in `xdp/bpf/src_ranges.h`): a VIP with 1..=8 ranges gets a
//! set (`src_sets`, named by `src_set_of[vip_id]`), a VIP with more, or with
//! none of its family (closed), gets `src_ranges` trie entries under its vip_id.
//!
//! Order, so that no packet is refused or accepted by mistake while an update
//! runs: trie entries the VIP gains, then a new set and the pointer to it, go
//! before the VIP entry and owners carry the "ranges" bit (`src_puts`,
//! `src_sets`); trie entries it loses go last (`dels`), after they stop saying
//! so. A set is never written while a VIP with ranges names it: a change
//! writes a new set, points the VIP at it, and the old set is reused by a
//! later update only.

use std::collections::BTreeSet;

use super::plan_ops::PlanOps;
use super::{MapOp, Programmed, ProgrammedVip, ServiceEntry, SourceRange};
use crate::abi;

/// What one update leaves: the trie entries and pointer of the VIP's vip_id,
/// and the set it no longer owns (released once the update's ops are out).
pub(super) struct SrcPlan {
    pub trie: BTreeSet<SourceRange>,
    pub set_of: Option<u32>,
    pub release: Option<u32>,
}

/// The set a VIP owns: it has ranges and its pointer names one.
fn owned_set(o: &ProgrammedVip) -> Option<u32> {
    (o.flags & abi::VIP_F_SRC_RANGES != 0)
        .then_some(o.src_set_of)
        .flatten()
        .filter(|&s| s != 0)
}

/// The source-range writes of one update of a VIP: `ring_id` its (new)
/// vip_id, `old` what it was. See the module for the order.
pub(super) fn plan(
    p: &mut Programmed,
    ring_id: Option<(u32, bool)>,
    new: Option<&ServiceEntry>,
    old: Option<&ProgrammedVip>,
    ops: &mut PlanOps,
) -> SrcPlan {
    let want = new.and_then(|s| s.source_ranges());
    let small = want.filter(|w| (1..=abi::SRC_SET_NETS).contains(&w.len()));
    // the same vip_id as before: its trie entries and pointer are known
    let same = old.filter(|o| ring_id.is_some_and(|(id, _)| id == o.vip_id));
    let old_set = old.and_then(owned_set);
    let mut out = SrcPlan {
        trie: BTreeSet::new(),
        set_of: same.and_then(|o| o.src_set_of),
        release: None,
    };
    // a set: kept when nothing changed, else a new one
    let mut set = None;
    if let (Some((vip_id, _)), Some(w)) = (ring_id, small) {
        let unchanged = same.filter(|o| {
            o.entry
                .as_ref()
                .and_then(|e| e.source_ranges())
                .is_some_and(|r| r == w)
        });
        set = match unchanged.and_then(owned_set) {
            Some(s) => Some(s),
            None => p.src_sets.alloc().inspect(|&s| {
                let ranges = w.iter().copied().collect();
                ops.src_sets.push(MapOp::PutSrcSet { set: s, ranges });
                ops.src_sets.push(MapOp::PointSrcSet { vip_id, set: s });
                out.set_of = Some(s);
            }),
        };
    }
    if old_set.is_some() && old_set != set {
        out.release = old_set;
    }
    // the trie: a VIP with ranges and no set (more than a set holds, none of
    // its family, or no free set)
    let want_trie: BTreeSet<SourceRange> = match (want, set) {
        (Some(w), None) => w.clone(),
        _ => BTreeSet::new(),
    };
    let empty = BTreeSet::new();
    let have = same.map_or(&empty, |o| &o.src_ranges);
    if let Some((vip_id, _)) = ring_id {
        let add: Vec<SourceRange> = want_trie.difference(have).copied().collect();
        if !add.is_empty() {
            ops.src_puts.push(MapOp::PutSrcRanges {
                vip_id,
                ranges: add,
            });
        }
        let gone: Vec<SourceRange> = have.difference(&want_trie).copied().collect();
        if !gone.is_empty() {
            ops.dels.push(MapOp::DelSrcRanges {
                vip_id,
                ranges: gone,
            });
        }
        // ranges in the trie: the pointer must say so (it may name a set
        // this VIP had, or be unknown for a new vip_id)
        if want.is_some() && set.is_none() && out.set_of != Some(0) {
            ops.src_sets.push(MapOp::PointSrcSet { vip_id, set: 0 });
            out.set_of = Some(0);
        }
    }
    // the old vip_id's entries when the VIP moved or went away
    if let Some(o) = old.filter(|o| same.is_none() && !o.src_ranges.is_empty()) {
        let ranges = o.src_ranges.iter().copied().collect();
        ops.dels.push(MapOp::DelSrcRanges {
            vip_id: o.vip_id,
            ranges,
        });
    }
    out.trie = want_trie;
    out
}
