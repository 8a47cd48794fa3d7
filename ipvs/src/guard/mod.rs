//! The guard: an nftables table in front of IPVS that enforces source ranges
//! (`loadBalancerSourceRanges`) and drops, counted by reason, what is addressed
//! to a VIP address but to no VIP:port:protocol, as the XDP program does (docs/ipvs.md,
//! "The guard").
//!
//! - `ruleset`: what is served -> one `nft -f` script, pure.
//! - `nft`: the `Nft` trait, `NftCommand` (the `nft` binary) and `MemoryNft`
//!   (feature `memory-kernel`).
//! - [`Guard`], here: the served state in memory, the script the kernel holds,
//!   and counters that stay monotonic although every rewrite of the table starts
//!   the kernel's at 0.

pub mod nft;
pub mod ruleset;

use std::collections::{BTreeMap, BTreeSet};

use ringlb_datapath::SourceRange;

use crate::Error;
use crate::model::ServiceKey;
use nft::Nft;
use ruleset::{Admitted, GLOBAL_COUNTERS, Ruleset, ruleset};

/// The global count of packets refused by a VIP:port's source ranges (the XDP
/// datapath's label); per VIP the reason is [`SOURCE_RANGE`].
pub const DROP_SOURCE_RANGE: &str = "drop_source_range";
/// The per-VIP drop reason of a source outside the ranges.
pub const SOURCE_RANGE: &str = "source_range";

/// The guard's counters, totals since this guard started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardCounters {
    /// `drop_no_service`, `drop_vip_icmp`, `drop_vip_other`, `drop_source_range`.
    pub global: Vec<(&'static str, u64)>,
    /// Packets refused by the source ranges, per VIP:port with ranges.
    pub per_service: Vec<(ServiceKey, u64)>,
}

/// The table `inet ringlb_guard` over an [`Nft`].
pub struct Guard {
    nft: Box<dyn Nft>,
    admitted: Admitted,
    /// What the kernel holds as far as this guard knows (`None`: unknown, the
    /// next sync writes).
    held: Option<Ruleset>,
    /// Counts of the tables this guard replaced, per counter name.
    base: BTreeMap<String, u64>,
    /// Counts of the per-service counters whose VIP:port went away.
    source_range_gone: u64,
}

impl Guard {
    pub fn new(nft: Box<dyn Nft>) -> Self {
        Guard {
            nft,
            admitted: Admitted::new(),
            held: None,
            base: BTreeMap::new(),
            source_range_gone: 0,
        }
    }

    /// What the guard is to let through (written by the next [`Guard::sync`]).
    pub fn admitted(&self) -> &Admitted {
        &self.admitted
    }

    /// The ruleset the kernel holds, when known.
    pub fn held(&self) -> Option<&Ruleset> {
        self.held.as_ref()
    }

    /// Serve exactly `admitted`.
    pub fn admit_all(&mut self, admitted: Admitted) {
        self.admitted = admitted;
    }

    /// Serve `key` with `ranges` (`None` every source), or stop serving it
    /// (`serve` false).
    pub fn admit(&mut self, key: ServiceKey, serve: bool, ranges: Option<&BTreeSet<SourceRange>>) {
        if serve {
            self.admitted.insert(key, ranges.cloned());
        } else {
            self.admitted.remove(&key);
        }
    }

    /// Makes the kernel hold the table of what is admitted; true when it wrote.
    /// Skips the write when the kernel holds that table already; writes it again
    /// when it went away (`nft flush ruleset` by someone else). On an error the
    /// table is unknown and the next sync writes it.
    pub fn sync(&mut self) -> Result<bool, Error> {
        let want = ruleset(&self.admitted);
        let counts = self.nft.counters()?;
        let table = !self.admitted.is_empty();
        match (&counts, table) {
            (None, false) => {
                self.held = Some(want);
                return Ok(false);
            }
            (Some(_), true) if self.held.as_ref() == Some(&want) => return Ok(false),
            (None, _) if self.held.as_ref().is_some_and(holds_table) => {
                tracing::warn!(
                    table = ruleset::TABLE,
                    "the IPVS guard's nftables table is gone (flushed by someone else?); writing it again"
                );
            }
            _ => {}
        }
        self.held = None;
        self.nft.apply(&want.script)?;
        self.fold(counts.unwrap_or_default(), &want);
        self.held = Some(want);
        Ok(true)
    }

    /// Adds the counts of a replaced table to the base; a per-service counter that
    /// is not in `next` goes to the global source-range count.
    fn fold(&mut self, counts: BTreeMap<String, u64>, next: &Ruleset) {
        for (name, n) in counts {
            *self.base.entry(name).or_default() += n;
        }
        let gone: Vec<String> = self
            .base
            .keys()
            .filter(|k| !GLOBAL_COUNTERS.contains(&k.as_str()) && !next.counters.contains_key(*k))
            .cloned()
            .collect();
        for name in gone {
            self.source_range_gone += self.base.remove(&name).unwrap_or(0);
        }
    }

    /// The counters, totals since this guard started. A table that went away is
    /// written again first (what it counted since the last read is lost).
    pub fn counters(&mut self) -> Result<GuardCounters, Error> {
        let mut kernel = self.nft.counters()?;
        if kernel.is_none() && self.held.as_ref().is_some_and(holds_table) {
            self.sync()?;
            kernel = self.nft.counters()?;
        }
        let kernel = kernel.unwrap_or_default();
        let total = |name: &str| {
            self.base.get(name).copied().unwrap_or(0) + kernel.get(name).copied().unwrap_or(0)
        };
        let per_service: Vec<(ServiceKey, u64)> = self
            .held
            .iter()
            .flat_map(|h| h.counters.iter())
            .map(|(name, key)| (*key, total(name)))
            .collect();
        let refused = self.source_range_gone + per_service.iter().map(|(_, n)| n).sum::<u64>();
        let mut global: Vec<(&'static str, u64)> =
            GLOBAL_COUNTERS.iter().map(|c| (*c, total(c))).collect();
        global.push((DROP_SOURCE_RANGE, refused));
        Ok(GuardCounters {
            global,
            per_service,
        })
    }
}

/// Whether `r` makes a table (not the removal of an empty state).
fn holds_table(r: &Ruleset) -> bool {
    !r.script.is_empty() && r.script != ruleset::removal()
}

#[cfg(test)]
mod tests;
