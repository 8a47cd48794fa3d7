//! Maglev consistent hashing (Eisenbud et al., NSDI 2016, §3.4). Pure, no I/O.
//!
//! Every edge builds, per VIP:port, a table of prime size M mapping `flow_hash % M` to a
//! backend. The table depends only on the set of backends (address, port, weight) and M:
//! input order, process, machine and release do not matter (the golden file
//! `maglev/testdata/maglev/golden.txt` freezes it). See `docs/maglev.md` for the exact
//! definitions.
//!
//! ```
//! use ringlb_maglev::{Backend, Table, DEFAULT_TABLE_SIZE, diff, flow_hash};
//! let b = |last: u8| Backend { addr: [10, 0, 0, last].into(), port: 8080, weight: 1 };
//! let old = Table::build(&[b(1), b(2), b(3)], DEFAULT_TABLE_SIZE).unwrap();
//! let new = Table::build(&[b(1), b(3)], DEFAULT_TABLE_SIZE).unwrap();
//! let h = flow_hash([192, 0, 2, 7].into(), [198, 51, 100, 1].into(), 40000, 80, 6);
//! assert!(new.backends().contains(new.lookup(h)));
//! // Only b(2)'s slots (about a third) plus a small surplus change.
//! assert!(diff(&old, &new).len() < DEFAULT_TABLE_SIZE as usize * 2 / 5);
//! ```

pub mod hash;
mod populate;

use std::net::IpAddr;

pub use hash::flow_hash;

/// The default table size M (prime). 100x the paper's guidance for up to ~650 backends.
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;
/// The smallest accepted table size.
pub const MIN_TABLE_SIZE: u32 = 251;
/// The largest accepted table size (the largest prime below 2^20).
pub const MAX_TABLE_SIZE: u32 = 1_048_573;

/// The sizes [`fitted_size`] picks from: primes, each about twice the one before.
pub const SIZE_LADDER: [u32; 9] = [251, 509, 1_021, 2_039, 4_093, 8_191, 16_381, 32_749, 65_537];
/// The slots a fitted table has per backend at least: the paper's M >> N, at which
/// the spread is within about 1 % and a backend's loss moves about 1/N of the slots.
pub const SLOTS_PER_BACKEND: u64 = 100;

/// The table size for `backends` backends: the smallest of [`SIZE_LADDER`] with at
/// least [`SLOTS_PER_BACKEND`] slots per backend, and never above `max` (then
/// `max`). A pure function of the count, so every edge picks the same M for the
/// same backend set; a count that crosses a step (10 -> 11 backends: 1,021 ->
/// 2,039) builds the table anew at the other size.
pub fn fitted_size(backends: usize, max: u32) -> u32 {
    let want = (backends as u64).saturating_mul(SLOTS_PER_BACKEND);
    SIZE_LADDER
        .iter()
        .copied()
        .find(|m| u64::from(*m) >= want)
        .map_or(max, |m| m.min(max))
}

/// [`fitted_size`] for a weighted backend set: it counts as many backends as the
/// lightest one fits into the total weight (equal weights: their number), so the
/// lightest keeps its share to about 1 % (a failover VIP's 1 % of 10 pods' new
/// flows gets a ring of 16,381).
pub fn fitted_size_for(backends: &[Backend], max: u32) -> u32 {
    let weights = || {
        backends
            .iter()
            .map(|b| u64::from(b.weight))
            .filter(|w| *w > 0)
    };
    let (total, lightest) = (weights().sum::<u64>(), weights().min().unwrap_or(1));
    let count = total.div_ceil(lightest).max(backends.len() as u64);
    fitted_size(usize::try_from(count).unwrap_or(usize::MAX), max)
}

/// One backend of a VIP:port. Identity is `(addr, port)`; `weight` 0 takes it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
}

/// Why a table could not be built. All of these are caused by input, none by I/O.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("Maglev table size {size} is not prime")]
    NotPrime { size: u32 },
    #[error("Maglev table size {size} is outside {MIN_TABLE_SIZE}..={MAX_TABLE_SIZE}")]
    OutOfRange { size: u32 },
    #[error("Maglev table size {size} is smaller than the {backends} backends it must hold")]
    TooSmall { size: u32, backends: usize },
    #[error("no backends to build a Maglev table from")]
    NoBackends,
    #[error("all {backends} backends have weight 0")]
    AllWeightsZero { backends: usize },
    #[error("backend {addr} port {port} is listed twice with weights {first} and {second}")]
    ConflictingWeights {
        addr: IpAddr,
        port: u16,
        first: u32,
        second: u32,
    },
}

impl Error {
    /// A short, stable label for metrics (`reason="..."`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NotPrime { .. } => "not_prime",
            Error::OutOfRange { .. } => "size_out_of_range",
            Error::TooSmall { .. } => "size_too_small",
            Error::NoBackends => "no_backends",
            Error::AllWeightsZero { .. } => "all_weights_zero",
            Error::ConflictingWeights { .. } => "conflicting_weights",
        }
    }
}

/// A populated Maglev lookup table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    size: u32,
    backends: Vec<Backend>,
    slots: Vec<u32>,
}

/// Trial division; sizes are at most 2^20 so at most ~512 divisions.
pub fn is_prime(n: u32) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) {
        return false;
    }
    let mut d = 3u32;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// Checks that `size` is an accepted table size.
pub fn check_size(size: u32) -> Result<(), Error> {
    if !(MIN_TABLE_SIZE..=MAX_TABLE_SIZE).contains(&size) {
        return Err(Error::OutOfRange { size });
    }
    if !is_prime(size) {
        return Err(Error::NotPrime { size });
    }
    Ok(())
}

/// Sorts by identity, merges exact duplicates, rejects an identity listed with two
/// weights, and drops weight-0 backends.
fn canonical(backends: &[Backend]) -> Result<Vec<Backend>, Error> {
    if backends.is_empty() {
        return Err(Error::NoBackends);
    }
    let mut v = backends.to_vec();
    v.sort_unstable();
    v.dedup();
    if let Some(w) = v
        .windows(2)
        .find(|w| (w[0].addr, w[0].port) == (w[1].addr, w[1].port))
    {
        return Err(Error::ConflictingWeights {
            addr: w[0].addr,
            port: w[0].port,
            first: w[0].weight,
            second: w[1].weight,
        });
    }
    v.retain(|b| b.weight > 0);
    if v.is_empty() {
        return Err(Error::AllWeightsZero {
            backends: backends.len(),
        });
    }
    Ok(v)
}

impl Table {
    /// Builds the table for `backends` with `size` slots. Sorts/dedups backends into a
    /// canonical order first (by address, then port), so every edge builds the same table
    /// from the same set regardless of input order. Weight-0 backends are left out.
    pub fn build(backends: &[Backend], size: u32) -> Result<Table, Error> {
        check_size(size)?;
        let backends = canonical(backends)?;
        if backends.len() > size as usize {
            return Err(Error::TooSmall {
                size,
                backends: backends.len(),
            });
        }
        let perm: Vec<(u32, u32)> = backends
            .iter()
            .map(|b| hash::backend_offset_skip(b.addr, b.port, size))
            .collect();
        let first = backends[0].weight;
        let slots = if backends.iter().all(|b| b.weight == first) {
            populate::equal(&perm, size)
        } else {
            let weights: Vec<u32> = backends.iter().map(|b| b.weight).collect();
            populate::weighted(&perm, &populate::quotas(&weights, size), size)
        };
        Ok(Table {
            size,
            backends,
            slots,
        })
    }

    /// The table size M.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The backends with weight > 0, in canonical order (by address, then port).
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// Slot -> index into [`Table::backends`]; `size()` entries.
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// The backend for a flow: `backends()[slots()[flow_hash % size]]`.
    #[inline]
    pub fn lookup(&self, flow_hash: u32) -> &Backend {
        &self.backends[self.slots[(flow_hash % self.size) as usize] as usize]
    }

    /// How many slots each backend holds, indexed like [`Table::backends`].
    pub fn slot_counts(&self) -> Vec<u32> {
        let mut c = vec![0u32; self.backends.len()];
        for &s in &self.slots {
            c[s as usize] += 1;
        }
        c
    }

    /// Index of the backend with this identity in [`Table::backends`].
    pub fn position(&self, addr: IpAddr, port: u16) -> Option<usize> {
        self.backends
            .binary_search_by(|b| (b.addr, b.port).cmp(&(addr, port)))
            .ok()
    }
}

/// One slot to rewrite: `backend` is the index into `new.backends()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotChange {
    pub slot: u32,
    pub backend: u32,
}

/// Slots whose backend identity (address, port) differs between `old` and `new`, in slot
/// order. A weight change alone is not a change of identity. If the sizes differ every
/// slot of `new` is returned (the datapath must rewrite, or rather recreate, the ring).
/// One pass over the slots; the result is proportional to the disruption.
pub fn diff(old: &Table, new: &Table) -> Vec<SlotChange> {
    if old.size != new.size {
        return new
            .slots
            .iter()
            .enumerate()
            .map(|(s, &b)| SlotChange {
                slot: s as u32,
                backend: b,
            })
            .collect();
    }
    // old index -> new index of the same identity, or u32::MAX if it is gone.
    let remap: Vec<u32> = old
        .backends
        .iter()
        .map(|b| new.position(b.addr, b.port).map_or(u32::MAX, |i| i as u32))
        .collect();
    old.slots
        .iter()
        .zip(&new.slots)
        .enumerate()
        .filter(|&(_, (&o, &n))| remap[o as usize] != n)
        .map(|(s, (_, &n))| SlotChange {
            slot: s as u32,
            backend: n,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(last: u8, weight: u32) -> Backend {
        Backend {
            addr: IpAddr::from([10, 0, 0, last]),
            port: 80,
            weight,
        }
    }

    #[test]
    fn fitted_sizes_are_primes_of_at_least_100_slots_per_backend_up_to_the_cap() {
        assert!(SIZE_LADDER.iter().all(|m| is_prime(*m)));
        assert!(SIZE_LADDER.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*SIZE_LADDER.last().unwrap(), DEFAULT_TABLE_SIZE);
        assert_eq!(fitted_size(1, DEFAULT_TABLE_SIZE), 251);
        assert_eq!(fitted_size(3, DEFAULT_TABLE_SIZE), 509);
        assert_eq!(fitted_size(10, DEFAULT_TABLE_SIZE), 1_021);
        assert_eq!(fitted_size(11, DEFAULT_TABLE_SIZE), 2_039);
        assert_eq!(fitted_size(655, DEFAULT_TABLE_SIZE), 65_537);
        // more than the ladder holds, or a lower cap: the cap
        assert_eq!(fitted_size(1_000, DEFAULT_TABLE_SIZE), DEFAULT_TABLE_SIZE);
        assert_eq!(fitted_size(1_000, MAX_TABLE_SIZE), MAX_TABLE_SIZE);
        assert_eq!(fitted_size(10, 251), 251);
        assert_eq!(fitted_size(10, 1_009), 1_009);
        for n in 1..700 {
            let m = fitted_size(n, DEFAULT_TABLE_SIZE);
            assert!(
                is_prime(m) && u64::from(m) >= (n as u64 * 100).min(65_537),
                "{n}: {m}"
            );
        }
        // weights: the lightest backend's share decides
        let equal: Vec<Backend> = (1..=10).map(|i| b(i, 1)).collect();
        assert_eq!(fitted_size_for(&equal, DEFAULT_TABLE_SIZE), 1_021);
        let mut skewed: Vec<Backend> = (1..=10).map(|i| b(i, 99)).collect();
        skewed.push(b(11, 10)); // a 1 % share: 100 backends' worth
        assert_eq!(fitted_size_for(&skewed, DEFAULT_TABLE_SIZE), 16_381);
        assert_eq!(
            fitted_size_for(&[b(1, 0), b(2, 5)], DEFAULT_TABLE_SIZE),
            251
        );
    }

    #[test]
    fn primes() {
        let small: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65_537) && is_prime(655_373) && is_prime(1_048_573));
        assert!(!is_prime(65_535) && !is_prime(1_048_575) && !is_prime(251 * 257));
    }

    #[test]
    fn size_errors() {
        let one = [b(1, 1)];
        assert_eq!(
            Table::build(&one, 65_536),
            Err(Error::NotPrime { size: 65_536 })
        );
        assert_eq!(
            Table::build(&one, 241),
            Err(Error::OutOfRange { size: 241 })
        );
        assert_eq!(
            Table::build(&one, 1_048_583),
            Err(Error::OutOfRange { size: 1_048_583 })
        );
        let many: Vec<Backend> = (0..=251u32)
            .map(|i| Backend {
                addr: IpAddr::from(i.to_be_bytes()),
                port: 1,
                weight: 1,
            })
            .collect();
        assert_eq!(
            Table::build(&many, 251),
            Err(Error::TooSmall {
                size: 251,
                backends: 252
            })
        );
        assert!(Table::build(&many[..251], 251).is_ok());
    }

    #[test]
    fn backend_errors() {
        assert_eq!(Table::build(&[], 251), Err(Error::NoBackends));
        assert_eq!(
            Table::build(&[b(1, 0), b(2, 0)], 251),
            Err(Error::AllWeightsZero { backends: 2 })
        );
        let e = Table::build(&[b(1, 1), b(1, 2)], 251).unwrap_err();
        assert_eq!(e.metric_label(), "conflicting_weights");
        assert!(e.to_string().contains("10.0.0.1 port 80"), "{e}");
        // Exact duplicates are merged, weight 0 is left out.
        let t = Table::build(&[b(1, 1), b(1, 1), b(2, 0), b(3, 1)], 251).unwrap();
        assert_eq!(t.backends(), &[b(1, 1), b(3, 1)]);
    }

    #[test]
    fn every_slot_names_a_backend_and_lookup_agrees() {
        let t = Table::build(&[b(3, 1), b(1, 1), b(2, 1)], 251).unwrap();
        assert_eq!(t.slots().len(), 251);
        assert!(t.slots().iter().all(|&s| (s as usize) < 3));
        for h in [0u32, 1, 250, 251, u32::MAX] {
            assert_eq!(
                *t.lookup(h),
                t.backends()[t.slots()[(h % 251) as usize] as usize]
            );
        }
    }

    #[test]
    fn diff_of_identical_tables_is_empty_and_weight_only_change_is_not_a_change() {
        let a = Table::build(&[b(1, 1), b(2, 1)], 251).unwrap();
        assert!(diff(&a, &a).is_empty());
        // Same set, scaled weights: same table, so nothing to write.
        let c = Table::build(&[b(1, 5), b(2, 5)], 251).unwrap();
        assert!(diff(&a, &c).is_empty());
    }

    #[test]
    fn diff_across_sizes_rewrites_everything() {
        let a = Table::build(&[b(1, 1), b(2, 1)], 251).unwrap();
        let c = Table::build(&[b(1, 1), b(2, 1)], 257).unwrap();
        let d = diff(&a, &c);
        assert_eq!(d.len(), 257);
        assert!(d.iter().all(|ch| ch.backend == c.slots()[ch.slot as usize]));
    }
}
