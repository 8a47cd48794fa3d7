//! Property tests of Maglev table population (proptest, 64 cases each: CI runs debug).
//!
//! * determinism and input-order independence;
//! * equal weights: every backend holds exactly floor(M/N) or ceil(M/N) slots;
//! * weights: every backend holds its weighted share of M to within one slot;
//! * removing 1 of N moves exactly that backend's slots plus a small surplus (measured,
//!   bounded, and printed), and `diff` is exactly the set of changed slots;
//! * adding it back restores the original table.

use std::collections::BTreeSet;
use std::net::IpAddr;

use proptest::prelude::*;
use ringlb_maglev::hash::{flow_key, murmur3_32};
use ringlb_maglev::{Backend, Table, diff, flow_hash};

/// Primes from the accepted range, small enough for debug-mode tests.
const SIZES: [u32; 5] = [251, 1_009, 4_093, 16_381, 65_537];

fn addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
}

/// 1..=max_n backends with distinct identities and weight `w`.
fn backends(max_n: usize, w: u32) -> impl Strategy<Value = Vec<Backend>> {
    prop::collection::btree_set((addr(), any::<u16>()), 1..=max_n).prop_map(move |ids| {
        ids.into_iter()
            .map(|(addr, port)| Backend {
                addr,
                port,
                weight: w,
            })
            .collect()
    })
}

fn size() -> impl Strategy<Value = u32> {
    prop::sample::select(SIZES.to_vec())
}

fn identity(t: &Table, slot: usize) -> (IpAddr, u16) {
    let b = t.backends()[t.slots()[slot] as usize];
    (b.addr, b.port)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn deterministic_and_order_independent(
        set in backends(40, 1),
        m in size(),
        seed in any::<u64>(),
    ) {
        let a = Table::build(&set, m).unwrap();
        let b = Table::build(&set, m).unwrap();
        prop_assert_eq!(&a, &b);
        // A seeded shuffle plus duplicated entries: same canonical table.
        let mut shuffled = set.clone();
        let mut s = seed | 1;
        for i in (1..shuffled.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            shuffled.swap(i, (s % (i as u64 + 1)) as usize);
        }
        shuffled.extend_from_slice(&set[..set.len() / 2]);
        prop_assert_eq!(&a, &Table::build(&shuffled, m).unwrap());
    }

    #[test]
    fn equal_weights_give_exact_floor_ceil(set in backends(200, 3), m in size()) {
        let t = Table::build(&set, m).unwrap();
        let n = t.backends().len() as u32;
        let (lo, hi) = (m / n, m.div_ceil(n));
        let counts = t.slot_counts();
        prop_assert!(counts.iter().all(|&c| c == lo || c == hi), "{counts:?}");
        prop_assert_eq!(counts.iter().filter(|&&c| c == hi && hi != lo).count() as u32, m % n);
    }

    #[test]
    fn weighted_shares_within_one_slot(
        set in backends(100, 1),
        weights in prop::collection::vec(0u32..1000, 100),
        m in size(),
    ) {
        let set: Vec<Backend> = set
            .into_iter()
            .zip(weights)
            .map(|(b, w)| Backend { weight: w, ..b })
            .collect();
        let Ok(t) = Table::build(&set, m) else {
            // Only an all-zero draw may fail (sizes >= 251 >= N).
            prop_assert!(set.iter().all(|b| b.weight == 0));
            return Ok(());
        };
        let total: f64 = t.backends().iter().map(|b| f64::from(b.weight)).sum();
        for (b, c) in t.backends().iter().zip(t.slot_counts()) {
            let ideal = f64::from(m) * f64::from(b.weight) / total;
            prop_assert!((f64::from(c) - ideal).abs() < 1.0, "{b:?}: {c} slots, ideal {ideal}");
            // Hence within 1% of the ideal share whenever that share is >= 100 slots.
            if ideal >= 100.0 {
                prop_assert!((f64::from(c) - ideal).abs() <= 0.01 * ideal);
            }
        }
    }

    #[test]
    fn flow_hash_is_murmur3_of_the_documented_key(
        src in addr(), dst in addr(), sp in any::<u16>(), dp in any::<u16>(), p in any::<u8>(),
    ) {
        prop_assert_eq!(flow_hash(src, dst, sp, dp, p), murmur3_32(&flow_key(src, dst, sp, dp, p), 0));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        rng_seed: prop::test_runner::RngSeed::Fixed(0x6d61_676c_6576),
        ..config()
    })]

    #[test]
    fn remove_one_moves_its_slots_plus_small_surplus_and_add_back_restores(
        set in backends(40, 1).prop_filter("need 2+", |s| s.len() >= 2),
        m in prop::sample::select(vec![4_093u32, 16_381, 65_537]),
        pick in any::<prop::sample::Index>(),
    ) {
        let old = Table::build(&set, m).unwrap();
        let gone = old.backends()[pick.index(old.backends().len())];
        let rest: Vec<Backend> = set.iter().copied().filter(|b| *b != gone).collect();
        let new = Table::build(&rest, m).unwrap();

        let changes = diff(&old, &new);
        // diff is exactly the set of slots whose backend identity changed...
        let changed: BTreeSet<u32> = changes.iter().map(|c| c.slot).collect();
        for s in 0..m as usize {
            prop_assert_eq!(changed.contains(&(s as u32)), identity(&old, s) != identity(&new, s));
        }
        for c in &changes {
            prop_assert_eq!(c.backend, new.slots()[c.slot as usize]);
        }
        // ...it includes every slot of the removed backend...
        let gi = old.position(gone.addr, gone.port).unwrap() as u32;
        let own: BTreeSet<u32> = (0..m).filter(|&s| old.slots()[s as usize] == gi).collect();
        prop_assert!(own.is_subset(&changed));
        // ...plus a surplus of other slots. This is inherent to Maglev (the peer crates
        // show the same): at M >= 100*N (here N <= 40) it averages 0.3-0.9x the removed
        // backend's own slots and was never seen above 2.2x in 300-2,000 random trials per
        // size (docs/bench-maglev.md). Bound at 3x; the RNG seed is fixed, so no flakes.
        let surplus = changed.len() - own.len();
        let n = old.backends().len();
        let bound = 3 * own.len();
        eprintln!("remove 1 of {n} (M={m}): {} own slots, surplus {surplus}", own.len());
        prop_assert!(surplus <= bound, "surplus {surplus} > {bound} (own {})", own.len());

        // Adding it back restores the original table, and diff says exactly how.
        let back = Table::build(&rest.iter().copied().chain([gone]).collect::<Vec<_>>(), m).unwrap();
        prop_assert_eq!(&back, &old);
        let undo = diff(&new, &back);
        let mut patched: Vec<(IpAddr, u16)> = (0..m as usize).map(|s| identity(&new, s)).collect();
        for c in undo {
            let b = back.backends()[c.backend as usize];
            patched[c.slot as usize] = (b.addr, b.port);
        }
        prop_assert!((0..m as usize).all(|s| patched[s] == identity(&old, s)));
    }
}
