//! The Maglev crates a user would pick instead of ours, behind one interface, and a way
//! to read each one's table slot by slot so it can be checked (every slot filled, shares
//! floor/ceil) and compared (disruption). Shared by `benches/maglev.rs` and
//! `examples/maglev-quality.rs`.
//!
//! None of the peers exposes its table. Each maps a key to a slot with its own fixed hash
//! (`slot = hash(key) % M`), so we replicate that hash, find for every slot some `u64` key
//! that lands on it, and ask the peer for that key's node. The replication is verified on
//! fresh keys (`get(k) == table[slot(k)]`); if a peer's hash ever changes, this panics
//! instead of measuring nonsense.
//!
//! What each peer supports (read from their sources):
//! * `maglev` 0.2: `Maglev::with_capacity(nodes, c)`, M = first prime >= c. Materialises
//!   every permutation: N*M `usize`s (N=1,000, M=65,537: 524 MB; M=655,373: 5.2 GB).
//!   Offset/skip from std `DefaultHasher` (not stable across Rust releases).
//! * `maglev-hash` 0.1: `MaglevTable::with_capacity(nodes, c)`, M = first prime >= c
//!   found by iterating all primes. Computes `(offset + j*skip) % M` per step (u64
//!   multiply and modulo). Also `DefaultHasher`.
//! * `hash-rings` 1.1 `maglev::Ring::with_capacity_hint(nodes, c)`, M = first prime >= c.
//!   Materialises permutations like `maglev`. SipHash-2-4 keyed from an unseeded XorShift.

#![allow(dead_code)] // each of the two users needs a different subset

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use ringlb_maglev::Backend;

/// The peers we compare against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    Maglev,
    MaglevHash,
    HashRings,
}

impl Peer {
    pub(crate) const ALL: [Peer; 3] = [Peer::Maglev, Peer::MaglevHash, Peer::HashRings];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Peer::Maglev => "maglev 0.2",
            Peer::MaglevHash => "maglev-hash 0.1",
            Peer::HashRings => "hash-rings 1.1",
        }
    }

    /// Bytes of permutation storage a build needs (the peers that materialise them).
    pub(crate) fn build_bytes(self, n: usize, m: usize) -> usize {
        match self {
            Peer::Maglev | Peer::HashRings => n * m * std::mem::size_of::<usize>(),
            Peer::MaglevHash => 0,
        }
    }
}

/// A built peer table.
pub(crate) enum Built<'a> {
    Maglev(maglev::Maglev<Backend>),
    MaglevHash(maglev_hash::MaglevTable<Backend>),
    HashRings(hash_rings::maglev::Ring<'a, Backend>),
}

/// Builds `peer`'s table over `nodes` with (at least) `m` slots.
pub(crate) fn build(peer: Peer, nodes: &[Backend], m: usize) -> Built<'_> {
    match peer {
        Peer::Maglev => Built::Maglev(maglev::Maglev::with_capacity(nodes.to_vec(), m)),
        Peer::MaglevHash => {
            Built::MaglevHash(maglev_hash::MaglevTable::with_capacity(nodes.to_vec(), m))
        }
        Peer::HashRings => Built::HashRings(hash_rings::maglev::Ring::with_capacity_hint(
            nodes.iter().collect(),
            m,
        )),
    }
}

impl Built<'_> {
    pub(crate) fn size(&self) -> usize {
        use maglev::ConsistentHasher;
        match self {
            Built::Maglev(t) => t.capacity(),
            Built::MaglevHash(t) => t.capacity(),
            Built::HashRings(t) => t.capacity(),
        }
    }

    /// The peer's public lookup for a key.
    pub(crate) fn get(&self, key: u64) -> Backend {
        use maglev::ConsistentHasher;
        match self {
            Built::Maglev(t) => *t.get(&key).expect("non-empty"),
            Built::MaglevHash(t) => *t.get(&key).expect("non-empty"),
            Built::HashRings(t) => *t.get_node(&key),
        }
    }

    /// The slot the peer's lookup reads for `key` (its hash, replicated).
    pub(crate) fn slot_of(&self, key: u64) -> usize {
        let m = self.size() as u64;
        let h = match self {
            // maglev 0.2: BuildHasherDefault<DefaultHasher>, write_u32(seed 0xdead_babe), key.
            Built::Maglev(_) => {
                let mut h = std::hash::DefaultHasher::new();
                h.write_u32(0xdead_babe);
                key.hash(&mut h);
                h.finish()
            }
            // maglev-hash 0.1: DefaultHasher, seed 2u64 hashed first, then the key.
            Built::MaglevHash(_) => {
                let mut h = std::hash::DefaultHasher::new();
                2u64.hash(&mut h);
                key.hash(&mut h);
                h.finish()
            }
            // hash-rings 1.1: SipHasher(2-4) keyed with the first two u64 of an unseeded
            // rand 0.4 XorShiftRng.
            Built::HashRings(_) => {
                use rand04::Rng;
                let mut rng = rand04::XorShiftRng::new_unseeded();
                let (k0, k1) = (rng.next_u64(), rng.next_u64());
                let mut h = siphasher02::sip::SipHasher::new_with_keys(k0, k1);
                key.hash(&mut h);
                h.finish()
            }
        };
        (h % m) as usize
    }

    /// The whole table as indices into `nodes`, verified against the peer's own lookups.
    pub(crate) fn slots(&self, nodes: &[Backend]) -> Vec<u32> {
        let m = self.size();
        let index: HashMap<Backend, u32> = nodes
            .iter()
            .enumerate()
            .map(|(i, b)| (*b, i as u32))
            .collect();
        let mut slots = vec![u32::MAX; m];
        let mut missing = m;
        let mut key = 0u64;
        while missing > 0 {
            let s = self.slot_of(key);
            if slots[s] == u32::MAX {
                slots[s] = index[&self.get(key)];
                missing -= 1;
            }
            key += 1;
        }
        for k in (1u64 << 40)..(1u64 << 40) + 20_000 {
            assert_eq!(
                index[&self.get(k)],
                slots[self.slot_of(k)],
                "replicated slot hash of a peer disagrees with its lookup"
            );
        }
        slots
    }
}

/// Per-backend slot counts of a table given as indices into `n` backends.
pub(crate) fn counts(slots: &[u32], n: usize) -> Vec<u32> {
    let mut c = vec![0u32; n];
    for &s in slots {
        c[s as usize] += 1;
    }
    c
}

/// Panics unless every slot names a backend and every backend holds floor(M/N) or
/// ceil(M/N) slots: what a correct equal-weight Maglev population guarantees.
pub(crate) fn assert_valid_maglev(what: &str, slots: &[u32], n: usize) {
    let m = slots.len();
    assert!(
        slots.iter().all(|&s| (s as usize) < n),
        "{what}: a slot is unfilled"
    );
    let c = counts(slots, n);
    let (lo, hi) = ((m / n) as u32, m.div_ceil(n) as u32);
    assert!(
        c.iter().all(|&x| x == lo || x == hi),
        "{what}: shares not floor/ceil of M/N: min {} max {}",
        c.iter().min().unwrap(),
        c.iter().max().unwrap()
    );
}

/// `n` distinct IPv4 backends on port 8080, weight 1: 10.0.0.1, 10.0.0.2, ...
pub(crate) fn backends(n: usize) -> Vec<Backend> {
    (1..=n as u32)
        .map(|i| Backend {
            addr: std::net::IpAddr::from((0x0a00_0000 | i).to_be_bytes()),
            port: 8080,
            weight: 1,
        })
        .collect()
}
