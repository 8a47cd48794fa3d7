//! Table population (paper §3.4, Pseudocode 1) over canonically ordered backends.
//!
//! Each backend walks its own permutation `offset, offset+skip, offset+2*skip, .. (mod M)`
//! and, on its turn, takes the first slot that is still empty. With equal weights the
//! turns go round-robin in canonical order until the table is full, exactly as in the
//! paper. With unequal weights every backend first gets a quota (its weighted share of M,
//! rounded by largest remainder, so the quotas sum to M) and takes exactly that many turns,
//! spread evenly over R = max(quota) rounds (see [`weighted`]).
//!
//! The loops are written for speed: the permutation is never materialised (`next = prev +
//! skip`, one compare-and-subtract instead of a multiply and a modulo), "is the slot
//! taken" is one bit in a bitmap that stays in L1/L2 cache (8 KiB for M = 65,537), taken
//! slots are skipped 4 at a time without branches, the slot vector is only written, once
//! per slot, and the last ~sqrt(M) slots are found by scanning the empty ones instead of
//! probing (see [`Fill`]). None of this changes the table: the golden file pins it.

/// Probes per batch once a backend's next slot turns out to be taken.
const BATCH: usize = 4;

/// A backend's walk through its permutation: the next position, and `k * skip mod m` for
/// k = 0..=BATCH so a batch of positions is computed without a serial dependency chain.
#[derive(Clone, Copy)]
struct Walk {
    pos: u32,
    step: [u32; BATCH + 1],
    /// `skip^-1 mod m`, computed when the fill reaches its tail; 0 = not yet.
    inv: u32,
}

impl Walk {
    fn new(offset: u32, skip: u32, m: u32) -> Self {
        let mut step = [0u32; BATCH + 1];
        for k in 1..=BATCH {
            step[k] = add_mod(step[k - 1], skip, m);
        }
        Walk {
            pos: offset,
            step,
            inv: 0,
        }
    }
}

/// `(a + b) mod m` for `a, b < m`: one add and one conditional subtract, no division.
#[inline(always)]
fn add_mod(a: u32, b: u32, m: u32) -> u32 {
    let s = a + b;
    if s >= m { s - m } else { s }
}

/// `x mod m` for `x < 2^40` by Barrett reduction with `r = floor(2^64 / m)`: one
/// widening multiply instead of a division.
#[inline(always)]
fn barrett(x: u64, m: u32, r: u64) -> u32 {
    let q = ((u128::from(x) * u128::from(r)) >> 64) as u64;
    let rem = x - q * u64::from(m);
    (if rem >= u64::from(m) {
        rem - u64::from(m)
    } else {
        rem
    }) as u32
}

/// Inverse of `a` modulo the prime `m` (extended Euclid), `0 < a < m`.
fn inverse(a: u32, m: u32) -> u32 {
    let (mut r0, mut r1) = (i64::from(m), i64::from(a));
    let (mut t0, mut t1) = (0i64, 1i64);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    t0.rem_euclid(i64::from(m)) as u32
}

/// Filled-slot bitmap plus the slot vector being written.
///
/// Filling is probe-bound at the end: with E slots left a walk needs ~M/E probes to find
/// one. Once E drops to `tail_at` (~sqrt(M)), `take` switches to scanning the E empty
/// slots instead: the number of steps from a walk's position `p` to an empty slot `e` is
/// `(e - p) * skip^-1 mod M`, and the empty slot with the fewest steps is exactly the one
/// the walk would have reached first. Same table, a fraction of the work.
struct Fill {
    m: u32,
    barrett: u64,
    left: u32,
    tail_at: u32,
    bits: Vec<u64>,
    slots: Vec<u32>,
    /// Empty slots, filled in when `left` reaches `tail_at`.
    empty: Vec<u32>,
}

impl Fill {
    fn new(m: u32) -> Self {
        Fill {
            m,
            barrett: u64::MAX / u64::from(m),
            left: m,
            tail_at: m.isqrt(),
            bits: vec![0; (m as usize).div_ceil(64)],
            slots: vec![0; m as usize],
            empty: Vec::new(),
        }
    }

    #[inline(always)]
    fn is_set(&self, p: u32) -> u64 {
        (self.bits[(p >> 6) as usize] >> (p & 63)) & 1
    }

    #[inline(always)]
    fn set(&mut self, i: u32, p: u32) {
        self.bits[(p >> 6) as usize] |= 1u64 << (p & 63);
        self.slots[p as usize] = i;
        self.left -= 1;
    }

    /// Walks backend `i`'s permutation to the first empty slot, takes it, and leaves the
    /// walk on the entry after it. Exactly the paper's loop; the first probe is tried on
    /// its own (early in the fill it is nearly always empty), after that BATCH positions
    /// are tested at once, branch-free, and the first empty one of them wins.
    #[inline(always)]
    fn take(&mut self, i: u32, w: &mut Walk) {
        if self.left <= self.tail_at {
            return self.take_tail(i, w);
        }
        let m = self.m;
        let p = w.pos;
        if self.is_set(p) == 0 {
            self.set(i, p);
            w.pos = add_mod(p, w.step[1], m);
            return;
        }
        let mut base = add_mod(p, w.step[1], m);
        loop {
            let mut full = 0u32;
            let mut at = [0u32; BATCH];
            for (k, (a, step)) in at.iter_mut().zip(&w.step).enumerate() {
                *a = add_mod(base, *step, m);
                full |= (self.is_set(*a) as u32) << k;
            }
            if full != (1 << BATCH) - 1 {
                let k = (!full).trailing_zeros() as usize;
                self.set(i, at[k]);
                w.pos = add_mod(at[k], w.step[1], m);
                return;
            }
            base = add_mod(base, w.step[BATCH], m);
        }
    }

    /// `take` for the last few slots: the empty slot nearest along the walk.
    #[cold]
    fn take_tail(&mut self, i: u32, w: &mut Walk) {
        let m = self.m;
        if self.empty.is_empty() {
            self.empty = (0..m).filter(|&p| self.is_set(p) == 0).collect();
        }
        if w.inv == 0 {
            w.inv = inverse(w.step[1], m);
        }
        let inv = u64::from(w.inv);
        let (mut best, mut best_k) = (u32::MAX, 0usize);
        for (k, &e) in self.empty.iter().enumerate() {
            let d = barrett(u64::from(add_mod(e, m - w.pos, m)) * inv, m, self.barrett);
            if d < best {
                (best, best_k) = (d, k);
            }
        }
        let e = self.empty.swap_remove(best_k);
        self.set(i, e);
        w.pos = add_mod(e, w.step[1], m);
    }
}

/// Equal weights: round-robin turns until all `m` slots are taken. `perm[i]` is backend
/// i's `(offset, skip)`. Requires `1 <= perm.len() <= m`.
pub(super) fn equal(perm: &[(u32, u32)], m: u32) -> Vec<u32> {
    let mut fill = Fill::new(m);
    let mut walks: Vec<Walk> = perm.iter().map(|&(o, s)| Walk::new(o, s, m)).collect();
    let mut left = m;
    'rounds: loop {
        for (i, w) in walks.iter_mut().enumerate() {
            fill.take(i as u32, w);
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

/// Calls `f(round)` for each of the `q` turns of a backend, the `j`-th in round
/// `floor(j * r / q)`: turns spread evenly over the `r` rounds. Bresenham-style, no
/// division per turn.
#[inline(always)]
fn turn_rounds(q: u32, r: u32, mut f: impl FnMut(u32)) {
    let (step, frac) = (r / q, r % q);
    let (mut round, mut acc) = (0u32, 0u32);
    for _ in 0..q {
        f(round);
        round += step;
        acc += frac;
        if acc >= q {
            acc -= q;
            round += 1;
        }
    }
}

/// Weighted: backend i takes `quotas[i]` turns; with `R = max(quotas)` rounds, its `j`-th
/// turn is in round `floor(j * R / q_i)`, and within a round turns go in canonical index
/// order. The quotas sum to `m`, so the table is exactly full after the last turn. The
/// turn order is laid out with a counting sort by round: O(M + N), no heap.
pub(super) fn weighted(perm: &[(u32, u32)], quotas: &[u32], m: u32) -> Vec<u32> {
    let rounds = quotas.iter().copied().max().unwrap_or(0);
    let mut start = vec![0u32; rounds as usize + 1];
    for &q in quotas.iter().filter(|&&q| q > 0) {
        turn_rounds(q, rounds, |r| start[r as usize + 1] += 1);
    }
    for r in 1..start.len() {
        start[r] += start[r - 1];
    }
    let mut order = vec![0u32; m as usize];
    for (i, &q) in quotas.iter().enumerate().filter(|&(_, &q)| q > 0) {
        turn_rounds(q, rounds, |r| {
            order[start[r as usize] as usize] = i as u32;
            start[r as usize] += 1;
        });
    }
    let mut fill = Fill::new(m);
    let mut walks: Vec<Walk> = perm.iter().map(|&(o, s)| Walk::new(o, s, m)).collect();
    for &i in &order {
        fill.take(i, &mut walks[i as usize]);
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
    fn turn_rounds_spread_evenly() {
        let mut v = Vec::new();
        turn_rounds(3, 6, |r| v.push(r));
        assert_eq!(v, [0, 2, 4]);
        v.clear();
        turn_rounds(4, 6, |r| v.push(r));
        assert_eq!(v, [0, 1, 3, 4]);
        v.clear();
        turn_rounds(6, 6, |r| v.push(r));
        assert_eq!(v, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn weighted_meets_quotas_exactly() {
        let perm = [(0, 1), (3, 2), (5, 4)];
        let slots = weighted(&perm, &[3, 0, 8], 11);
        assert_eq!(slots.iter().filter(|&&s| s == 0).count(), 3);
        assert_eq!(slots.iter().filter(|&&s| s == 1).count(), 0);
        assert_eq!(slots.iter().filter(|&&s| s == 2).count(), 8);
    }

    /// The paper's loop, one probe at a time, no bitmap, no tail scan: the optimised
    /// `Fill::take` must produce exactly the same tables.
    fn reference(perm: &[(u32, u32)], order: impl Iterator<Item = u32>, m: u32) -> Vec<u32> {
        let mut slots = vec![u32::MAX; m as usize];
        let mut pos: Vec<u32> = perm.iter().map(|p| p.0).collect();
        for i in order {
            let (i, skip) = (i as usize, perm[i as usize].1);
            while slots[pos[i] as usize] != u32::MAX {
                pos[i] = (pos[i] + skip) % m;
            }
            slots[pos[i] as usize] = i as u32;
            pos[i] = (pos[i] + skip) % m;
        }
        slots
    }

    #[test]
    fn optimised_fill_equals_reference_loop() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for (m, n) in [
            (251u32, 1usize),
            (251, 7),
            (251, 251),
            (1_009, 50),
            (4_093, 300),
        ] {
            let perm: Vec<(u32, u32)> = (0..n)
                .map(|_| {
                    (
                        (rnd() % u64::from(m)) as u32,
                        (rnd() % u64::from(m - 1)) as u32 + 1,
                    )
                })
                .collect();
            let rr = (0..m).map(|t| t % n as u32);
            assert_eq!(
                equal(&perm, m),
                reference(&perm, rr, m),
                "equal m={m} n={n}"
            );

            let weights: Vec<u32> = (0..n).map(|_| (rnd() % 5) as u32 + 1).collect();
            let q = quotas(&weights, m);
            let rounds = *q.iter().max().unwrap();
            let mut turns: Vec<(u32, u32)> = Vec::new();
            for (i, &qi) in q.iter().enumerate().filter(|&(_, &qi)| qi > 0) {
                turn_rounds(qi, rounds, |r| turns.push((r, i as u32)));
            }
            turns.sort_unstable();
            let order = turns.into_iter().map(|(_, i)| i);
            assert_eq!(
                weighted(&perm, &q, m),
                reference(&perm, order, m),
                "weighted m={m}"
            );
        }
    }
}
