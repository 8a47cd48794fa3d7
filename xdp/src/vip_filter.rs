//! The `vip_filter` map: a one-hash Bloom filter of the VIP addresses that the
//! program checks before conntrack, so traffic for the node itself skips
//! conntrack and the `vips` lookups (`bpf/vip_filter.h`, same hash).
//!
//! A bit is set before the VIP's `vips` entry is written (`maps::run_ops`), and
//! the whole filter is rebuilt from the loader's view after every full apply
//! and at start, which clears the bits of deleted VIPs. A stale set bit only
//! costs a packet the usual path; a missing bit would pass a VIP's packets, so
//! a bit is never cleared while its VIP may be in `vips`.

use std::net::IpAddr;

use crate::abi;

/// The filter's bit for `addr`: the XOR of the address's four 32-bit words as
/// a little-endian CPU loads them from the packet (IPv4 is word 0), times the
/// 32-bit golden-ratio constant, top `VIP_FILTER_BITS` bits.
pub fn bit(addr: IpAddr) -> u32 {
    let (raw, _) = abi::RawAddr::from_ip(addr);
    let x = raw.0.iter().fold(0u32, |x, w| x ^ *w);
    x.wrapping_mul(0x9e37_79b1) >> (32 - abi::VIP_FILTER_BITS)
}

/// The filter's words, as the map holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipFilter(pub Vec<u64>);

impl Default for VipFilter {
    fn default() -> Self {
        Self(vec![0; abi::VIP_FILTER_WORDS as usize])
    }
}

impl VipFilter {
    /// The filter of exactly these addresses.
    pub fn of(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut f = Self::default();
        for a in addrs {
            f.set(a);
        }
        f
    }

    /// Sets `addr`'s bit; returns its word `(index, value)`.
    pub fn set(&mut self, addr: IpAddr) -> (u32, u64) {
        let b = bit(addr);
        let w = (b >> 6) as usize;
        self.0[w] |= 1 << (b & 63);
        (w as u32, self.0[w])
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        let b = bit(addr);
        self.0[(b >> 6) as usize] >> (b & 63) & 1 == 1
    }

    /// The words of `self` that differ from `old` (all of them without `old`).
    pub fn changed_since(&self, old: Option<&VipFilter>) -> Vec<(u32, u64)> {
        self.0
            .iter()
            .enumerate()
            .filter(|(i, w)| old.is_none_or(|o| o.0[*i] != **w))
            .map(|(i, w)| (i as u32, *w))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_of_a_vip_pool_spread_and_are_found() {
        let addrs: Vec<IpAddr> = (0..1000u32)
            .map(|i| IpAddr::V4((0x0a60_0000 + i).into()))
            .collect();
        let f = VipFilter::of(addrs.iter().copied());
        assert!(addrs.iter().all(|a| f.contains(*a)));
        let set: u32 = f.0.iter().map(|w| w.count_ones()).sum();
        assert!(
            set > 990,
            "1,000 consecutive addresses share few bits: {set}"
        );
        // the edge's own address is not in it (this one's bit is clear)
        assert!(!f.contains("10.255.255.254".parse().unwrap()));
    }

    #[test]
    fn ipv6_uses_every_word_and_ipv4_word_0() {
        // the C side loads the packet's words little-endian: 10.96.0.1 is 0x0100600a
        assert_eq!(
            bit("10.96.0.1".parse().unwrap()),
            0x0100_600au32.wrapping_mul(0x9e37_79b1) >> 16
        );
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let x = 0xb80d_0120u32 ^ 0x0100_0000;
        assert_eq!(bit(a), x.wrapping_mul(0x9e37_79b1) >> 16);
    }

    #[test]
    fn changed_words_only() {
        let a = VipFilter::of(["10.96.0.1".parse().unwrap()]);
        let b = VipFilter::of(["10.96.0.1".parse().unwrap(), "10.96.0.2".parse().unwrap()]);
        assert_eq!(b.changed_since(Some(&a)).len(), 1);
        assert_eq!(b.changed_since(None).len(), abi::VIP_FILTER_WORDS as usize);
    }
}
