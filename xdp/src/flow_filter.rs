//! The `flow_filter` map: a presence filter of the conntrack keys that a new
//! flow's SYN checks before its conntrack lookup (`bpf/flow_filter.h`, which
//! also proves the rebuild below safe). One bit per slot, two interleaved
//! halves and `active`, the half the program reads.
//!
//! The program sets a key's slot in both halves after every conntrack insert;
//! slots never clear there, so the edge's XDP owner rebuilds the filter
//! periodically ([`rebuild`]): clear the inactive half, walk the conntrack keys
//! and set theirs in it, flip `active`. Until the first rebuild, a loader
//! that shares pinned maps with a running program sets every slot
//! ([`FilterBits::fill`] with `true`): every SYN looks up, as without the
//! filter.
//!
//! The words are shared with the program on every CPU, so they are only
//! touched as [`AtomicU64`], and changed only by atomic OR and AND of the bits
//! meant (the program sets with an atomic OR too): no write undoes a
//! concurrent set of another slot or of the other half.

use std::{
    sync::atomic::{AtomicU8, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use crate::abi;

/// The filter's slot of a flow hash: its top `bits` bits (the ring uses the
/// hash modulo a prime, so the two are unrelated).
pub fn slot_of(hash: u32, bits: u32) -> u32 {
    hash >> (32 - bits)
}

/// The flow hash of a conntrack key (`ringlb_flow_hash_of` in the program).
pub fn flow_hash(f: &abi::Flow) -> u32 {
    // the program reads the stored (network-order) bytes as a native u16
    let raw = |p: abi::Be16| u16::from_ne_bytes(p.to_host().to_be_bytes());
    ringlb_maglev::hash::flow_hash_words(
        &f.saddr.0,
        &f.daddr.0,
        raw(f.sport),
        raw(f.dport),
        f.proto,
    )
}

/// The bits of one half in every word: half 0 the even bits, half 1 the odd.
fn half_mask(half: u8) -> u64 {
    0x5555_5555_5555_5555 << (half & 1)
}

/// The filter's memory: `active` (byte 0), padding to
/// [`abi::FLOW_FILTER_HEADER`], then 64-bit words: slot `s` of half `h` is bit
/// `(2 * s + h) % 64` of word `(2 * s + h) / 64`.
pub struct FilterBits<'a> {
    active: &'a AtomicU8,
    words: &'a [AtomicU64],
    bits: u32,
}

impl<'a> FilterBits<'a> {
    /// The filter over `bytes` (the map's value: header + 2 bits per slot).
    /// `None` when its length is not header + 2 x a power of two bits (at
    /// least one word), or the words would not be 8-byte aligned.
    pub fn new(bytes: &'a [AtomicU8]) -> Option<Self> {
        let body = bytes.get(abi::FLOW_FILTER_HEADER..)?;
        let slots = body.len() * 8 / 2;
        if !slots.is_power_of_two() || !(32..=1 << 31).contains(&slots) {
            return None;
        }
        let words = crate::batch::atomic_words(body)?;
        Some(Self {
            active: &bytes[0],
            words,
            bits: slots.trailing_zeros(),
        })
    }

    pub fn bits(&self) -> u32 {
        self.bits
    }

    pub fn slots(&self) -> u32 {
        1 << self.bits
    }

    /// The half the program reads.
    pub fn active(&self) -> u8 {
        self.active.load(Ordering::Acquire) & 1
    }

    /// The word and bit of `slot` in `half`.
    fn at(&self, half: u8, slot: u32) -> (&AtomicU64, u64) {
        let i = 2 * slot as usize + usize::from(half & 1);
        (&self.words[i / 64], 1 << (i % 64))
    }

    pub fn get(&self, half: u8, slot: u32) -> bool {
        let (w, bit) = self.at(half, slot);
        w.load(Ordering::Relaxed) & bit != 0
    }

    /// The bit of `hash`'s slot in the active half, as a SYN reads it.
    pub fn maybe(&self, hash: u32) -> bool {
        self.get(self.active(), slot_of(hash, self.bits))
    }

    pub fn set(&self, half: u8, slot: u32) {
        let (w, bit) = self.at(half, slot);
        w.fetch_or(bit, Ordering::Relaxed);
    }

    /// Every slot of `half` set (`true`) or clear, one atomic OR or AND per
    /// word: the other half's bits stay as they are.
    pub fn fill(&self, half: u8, v: bool) {
        let m = half_mask(half);
        for w in self.words {
            if v {
                w.fetch_or(m, Ordering::Relaxed);
            } else {
                w.fetch_and(!m, Ordering::Relaxed);
            }
        }
    }

    /// Set slots of `half`.
    pub fn count(&self, half: u8) -> u32 {
        let m = half_mask(half);
        self.words
            .iter()
            .map(|w| (w.load(Ordering::Relaxed) & m).count_ones())
            .sum()
    }

    /// Makes `half` the one the program reads; every store before is
    /// visible before the flip is.
    pub fn flip_to(&self, half: u8) {
        self.active.store(half & 1, Ordering::Release);
    }
}

/// What a rebuild did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RebuildStats {
    /// Conntrack keys walked.
    pub keys: usize,
    /// Slots set in the new active half (keys sharing a slot count once).
    pub set: u32,
    pub slots: u32,
    /// The half SYNs read from now on.
    pub active: u8,
    pub took: Duration,
}

impl RebuildStats {
    /// The share of set slots: the false-positive rate of a new flow's SYN
    /// right after the rebuild.
    pub fn fill(&self) -> f64 {
        f64::from(self.set) / f64::from(self.slots.max(1))
    }
}

/// How long a rebuild waits between zeroing a half and walking conntrack
/// (see [`rebuild`]); an insert takes well under a microsecond.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(2);

/// Rebuilds the inactive half from the conntrack keys and flips to it:
/// (1) clear it, (2) `keys()` walks the conntrack map (after step 1: the
/// order `bpf/flow_filter.h` relies on) and each key's slot is set, (3) flip.
/// If the walk fails nothing is flipped: the active half stays a superset.
pub fn rebuild<E>(
    f: &FilterBits<'_>,
    keys: impl FnOnce() -> Result<Vec<abi::Flow>, E>,
) -> Result<RebuildStats, E> {
    let t = Instant::now();
    let half = f.active() ^ 1;
    f.fill(half, false);
    // The clearing must be visible before the walk reads a bucket, and an insert
    // whose bit set raced the clearing must have published its element (its
    // map update precedes its bit set, but a weakly ordered CPU may show the
    // bit first): a full fence, then a moment for such an insert to finish.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(SETTLE);
    let keys = keys()?;
    for k in &keys {
        f.set(half, slot_of(flow_hash(k), f.bits));
    }
    let set = f.count(half);
    f.flip_to(half);
    Ok(RebuildStats {
        keys: keys.len(),
        set,
        slots: f.slots(),
        active: half,
        took: t.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// A filter's memory of 2^bits slots per half (8-byte aligned, as the
    /// mmapped map value is).
    fn mem(bits: u32) -> Vec<AtomicU64> {
        (0..(abi::FLOW_FILTER_HEADER + (2usize << bits) / 8) / 8)
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    fn bytes(m: &[AtomicU64]) -> &[AtomicU8] {
        crate::batch::atomic_bytes_of(m)
    }

    fn flow(i: u32) -> abi::Flow {
        let a = |ip: &str| abi::RawAddr::from_ip(ip.parse::<IpAddr>().unwrap()).0;
        abi::Flow {
            saddr: abi::RawAddr([0x0100_a8c0 + (i << 24), 0, 0, 0]),
            daddr: a("10.96.0.1"),
            sport: abi::Be16::from_host(1024 + i as u16),
            dport: abi::Be16::from_host(80),
            proto: 6,
            family: abi::AF_INET,
            flags: 0,
            pad: 0,
        }
    }

    #[test]
    fn flow_hash_is_the_ring_hash() {
        let f = flow(3);
        let ip = |r: abi::RawAddr| IpAddr::V4(r.0[0].to_ne_bytes().into());
        let want = ringlb_maglev::flow_hash(ip(f.saddr), ip(f.daddr), 1027, 80, 6);
        assert_eq!(flow_hash(&f), want);
    }

    #[test]
    fn only_header_plus_two_bits_per_power_of_two_slots_aligned() {
        let m = mem(10);
        let b = bytes(&m);
        let f = FilterBits::new(b).unwrap();
        assert_eq!((f.bits(), f.slots()), (10, 1024));
        assert!(FilterBits::new(&b[..b.len() - 8]).is_none()); // 3 x 2^8 bits
        assert!(FilterBits::new(&b[..b.len() - 2]).is_none()); // not whole words
        assert!(FilterBits::new(&b[..10]).is_none());
        // a body that does not start 8-byte aligned
        assert!(FilterBits::new(&b[1..1 + abi::FLOW_FILTER_HEADER + 64]).is_none());
    }

    #[test]
    fn a_slot_is_one_bit_of_each_half_interleaved() {
        let m = mem(8);
        let f = FilterBits::new(bytes(&m)).unwrap();
        f.set(0, 0);
        f.set(1, 33);
        let header = abi::FLOW_FILTER_HEADER / 8;
        // slot 0 of half 0: bit 0 of word 0; slot 33 of half 1: bit 67 = word 1, bit 3
        assert_eq!(m[header].load(Ordering::Relaxed), 1);
        assert_eq!(m[header + 1].load(Ordering::Relaxed), 1 << 3);
        // clearing half 0 leaves half 1's bit, and the other way round
        f.fill(0, false);
        assert_eq!((f.count(0), f.count(1)), (0, 1));
        f.fill(0, true);
        f.fill(1, false);
        assert_eq!((f.count(0), f.count(1)), (256, 0));
    }

    #[test]
    fn rebuild_keeps_the_live_keys_and_clears_the_rest() {
        let m = mem(12);
        let f = FilterBits::new(bytes(&m)).unwrap();
        f.fill(0, true);
        f.fill(1, true); // a loader's start: everything "maybe"
        let live: Vec<abi::Flow> = (0..50).map(flow).collect();
        let st = rebuild(&f, || Ok::<_, ()>(live.clone())).unwrap();
        assert_eq!(st.active, 1);
        assert_eq!(f.active(), 1);
        assert_eq!(st.keys, 50);
        assert!(live.iter().all(|k| f.maybe(flow_hash(k))));
        assert_eq!(f.count(1), st.set);
        assert!(st.set <= 50 && st.set >= 45, "{st:?}");
        // the old half is untouched until the next rebuild clears it
        assert_eq!(f.count(0), 4096);
        let st = rebuild(&f, || Ok::<_, ()>(live[..10].to_vec())).unwrap();
        assert_eq!((st.active, f.active()), (0, 0));
        assert!(live[..10].iter().all(|k| f.maybe(flow_hash(k))));
        assert_eq!(f.count(0), st.set);
        assert!(st.fill() < 0.01);
    }

    #[test]
    fn a_failed_walk_flips_nothing() {
        let m = mem(8);
        let f = FilterBits::new(bytes(&m)).unwrap();
        f.fill(0, true);
        assert_eq!(rebuild(&f, || Err("walk")), Err("walk"));
        assert_eq!(f.active(), 0);
        assert_eq!(f.count(0), 256);
    }

    #[test]
    fn a_set_does_not_touch_the_other_half() {
        let m = mem(8);
        let f = FilterBits::new(bytes(&m)).unwrap();
        f.set(1, 7);
        assert!(f.get(1, 7) && !f.get(0, 7));
        assert_eq!((f.count(0), f.count(1)), (0, 1));
    }
}
