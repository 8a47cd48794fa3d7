//! Table population (paper §3.4, Pseudocode 1) over canonically ordered backends.
//!
//! Each backend walks its own permutation `offset, offset+skip, offset+2*skip, .. (mod M)`
//! and, on its turn, takes the first slot that is still empty. With equal weights the
//! turns go round-robin in canonical order until the table is full, exactly as in the
//! paper. With unequal weights every backend first gets a quota (its weighted share of M,
//! rounded by largest remainder, so the quotas sum to M) and the turns are interleaved in
//! proportion to the quotas; a backend stops taking slots when its quota is met.
//!
//! The loops are written for speed: the permutation is never materialised (`next = prev +
//! skip`, one compare-and-subtract instead of a multiply and a modulo), "is the slot
//! taken" is one bit in a bitmap that stays in L1/L2 cache (8 KiB for M = 65,537), and the
//! slot vector is only written, once per slot.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Filled-slot bitmap plus the slot vector being written.
struct Fill {
    m: u32,
    bits: Vec<u64>,
    slots: Vec<u32>,
}

impl Fill {
    fn new(m: u32) -> Self {
        Fill {
            m,
            bits: vec![0; (m as usize).div_ceil(64)],
            slots: vec![0; m as usize],
        }
    }

    /// Walks backend `i`'s permutation from `*pos` to the first empty slot, takes it,
    /// and leaves `*pos` on the entry after it.
    #[inline(always)]
    fn take(&mut self, i: u32, pos: &mut u32, skip: u32) {
        let mut p = *pos;
        loop {
            let (w, b) = ((p >> 6) as usize, 1u64 << (p & 63));
            let c = p;
            p += skip;
            if p >= self.m {
                p -= self.m;
            }
            let word = &mut self.bits[w];
            if *word & b == 0 {
                *word |= b;
                self.slots[c as usize] = i;
                *pos = p;
                return;
            }
        }
    }
}

/// Equal weights: round-robin turns until all `m` slots are taken. `perm[i]` is backend
/// i's `(offset, skip)`. Requires `1 <= perm.len() <= m`.
pub(super) fn equal(perm: &[(u32, u32)], m: u32) -> Vec<u32> {
    let mut fill = Fill::new(m);
    let mut state: Vec<(u32, u32)> = perm.to_vec(); // (next position, skip)
    let mut left = m;
    'rounds: loop {
        for (i, (pos, skip)) in state.iter_mut().enumerate() {
            fill.take(i as u32, pos, *skip);
            left -= 1;
            if left == 0 {
                break 'rounds;
            }
        }
    }
    fill.slots
}

/// Largest-remainder apportionment of `m` slots by `weights` (all > 0): `q_i` is
/// `floor(m*w_i/W)` or that plus one, the leftover going to the largest remainders (ties to
/// the lower index), and `sum(q) == m`.
pub(super) fn quotas(weights: &[u32], m: u32) -> Vec<u32> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let m64 = u64::from(m);
    // m <= 2^20 and w < 2^32, so m*w < 2^52: no overflow.
    let mut q: Vec<u32> = weights
        .iter()
        .map(|&w| (m64 * u64::from(w) / total) as u32)
        .collect();
    let given: u64 = q.iter().map(|&x| u64::from(x)).sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = m64 * u64::from(weights[a]) % total;
        let rb = m64 * u64::from(weights[b]) % total;
        rb.cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().take((m64 - given) as usize) {
        q[i] += 1;
    }
    q
}

/// A backend's next turn: its `j`-th turn of `q` happens at virtual time `(2j+1)/(2q)`,
/// so turns are spread evenly over [0, 1) in proportion to the quota. Min-heap order by
/// time (exact rational compare), then by index.
#[derive(PartialEq, Eq)]
struct Turn {
    num: u64, // 2j+1
    den: u64, // 2q
    idx: u32,
}

impl Ord for Turn {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed for BinaryHeap (a max-heap): the earliest turn is the greatest.
        // num <= 2^21, den <= 2^21: the products fit easily.
        (other.num * self.den)
            .cmp(&(self.num * other.den))
            .then(other.idx.cmp(&self.idx))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Weighted: turns in order of virtual time until every backend has its quota. The
/// quotas sum to `m`, so the table is exactly full when the last turn is taken.
pub(super) fn weighted(perm: &[(u32, u32)], quotas: &[u32], m: u32) -> Vec<u32> {
    let mut fill = Fill::new(m);
    let mut state: Vec<(u32, u32)> = perm.to_vec();
    let mut heap: BinaryHeap<Turn> = quotas
        .iter()
        .enumerate()
        .filter(|&(_, &q)| q > 0)
        .map(|(i, &q)| Turn {
            num: 1,
            den: 2 * u64::from(q),
            idx: i as u32,
        })
        .collect();
    while let Some(mut t) = heap.pop() {
        let (pos, skip) = &mut state[t.idx as usize];
        fill.take(t.idx, pos, *skip);
        t.num += 2;
        if t.num < t.den {
            heap.push(t);
        }
    }
    fill.slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_sum_to_m_and_are_floor_or_ceil() {
        let cases: [&[u32]; 5] = [
            &[1, 1, 1],
            &[1, 2, 3, 4],
            &[u32::MAX, 1, 7],
            &[5; 1000],
            &[1_000_000, 1, 1, 1],
        ];
        for w in cases {
            for m in [251u32, 65_537, 1_048_573] {
                let q = quotas(w, m);
                assert_eq!(q.iter().map(|&x| u64::from(x)).sum::<u64>(), u64::from(m));
                let total: f64 = w.iter().map(|&x| f64::from(x)).sum();
                for (qi, wi) in q.iter().zip(w) {
                    let ideal = f64::from(m) * f64::from(*wi) / total;
                    assert!((f64::from(*qi) - ideal).abs() < 1.0, "{qi} vs {ideal}");
                }
            }
        }
    }

    #[test]
    fn equal_fills_every_slot_round_robin() {
        // Tiny table by hand: m = 7, two backends.
        let slots = equal(&[(0, 1), (0, 3)], 7);
        // b0 takes 0; b1 wants 0 (taken) -> 3; b0 -> 1; b1 -> 6; b0 -> 2; b1 -> 2 taken,
        // 5; b0 -> 3 taken, 4.
        assert_eq!(slots, vec![0, 0, 0, 1, 0, 1, 1]);
    }

    #[test]
    fn weighted_meets_quotas_exactly() {
        let perm = [(0, 1), (3, 2), (5, 4)];
        let slots = weighted(&perm, &[3, 0, 8], 11);
        assert_eq!(slots.iter().filter(|&&s| s == 0).count(), 3);
        assert_eq!(slots.iter().filter(|&&s| s == 1).count(), 0);
        assert_eq!(slots.iter().filter(|&&s| s == 2).count(), 8);
    }
}
