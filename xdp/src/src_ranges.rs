//! `spec.loadBalancerSourceRanges` in the XDP maps (src_ranges.h): the keys of
//! the `src_ranges` LPM trie and the `owners` value that carries a VIP's
//! "has ranges" bit to conntrack hits.
//!
//! A VIP with source ranges has `abi::VIP_F_SRC_RANGES` in its `vips` entry and
//! `abi::OWNER_F_SRC_RANGES` in the `owners` entry of each of its backend ids,
//! and one trie entry per prefix of its family under its vip_id. A VIP whose
//! Service lists ranges but none of its family has the bits and no entry: it
//! accepts no source (never opened to the world by mistake).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::lpm_trie::Key;
use ringlb_datapath::SourceRange;

use crate::abi;

/// The trie key of `range` under `vip_id`: (32 + prefix, vip_id, address).
pub fn key(vip_id: u32, range: &SourceRange) -> (Key<abi::SrcRange>, u32) {
    let (addr, family) = abi::RawAddr::from_ip(range.addr());
    let k = Key::new(
        32 + u32::from(range.prefix()),
        abi::SrcRange { vip_id, addr },
    );
    (k, u32::from(family))
}

/// The vip_id and range of a trie entry (its value is the range's family);
/// `None` for an entry no loader writes.
pub fn from_key(k: &Key<abi::SrcRange>, family: u32) -> Option<(u32, SourceRange)> {
    let data = k.data();
    let prefix = u8::try_from(k.prefix_len().checked_sub(32)?).ok()?;
    let addr = data.addr.to_ip(u8::try_from(family).ok()?)?;
    let r = SourceRange::new(addr, prefix)?;
    (r.addr() == addr).then_some((data.vip_id, r))
}

/// The `src_sets` value of up to `abi::SRC_SET_NETS` ranges (more are left out:
/// the planner gives such a VIP trie entries instead).
pub fn set_value(ranges: &[SourceRange]) -> abi::SrcSet {
    let mut v = abi::SrcSet::default();
    for (net, r) in v.net.iter_mut().zip(ranges) {
        let (addr, _) = abi::RawAddr::from_ip(r.addr());
        let mask = match r.addr() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(
                u32::MAX
                    .checked_shl(32 - u32::from(r.prefix()))
                    .unwrap_or(0),
            )),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(
                u128::MAX
                    .checked_shl(128 - u32::from(r.prefix()))
                    .unwrap_or(0),
            )),
        };
        *net = abi::SrcNet {
            addr,
            mask: abi::RawAddr::from_ip(mask).0,
        };
        v.n += 1;
    }
    v
}

/// The `owners` value of a backend id of VIP `vip_id`; `draining`: the VIP's ring
/// does not name it.
pub fn owner_value(vip_id: u32, src_ranges: bool, draining: bool) -> u32 {
    let mut v = (vip_id + 1) & abi::OWNER_VIP_MASK;
    if src_ranges {
        v |= abi::OWNER_F_SRC_RANGES;
    }
    if draining {
        v |= abi::OWNER_F_DRAINING;
    }
    v
}

/// The vip_id an `owners` value names (`None`: no owner), and its ranges bit.
pub fn owner_of(value: u32) -> (Option<u32>, bool) {
    let v = value & abi::OWNER_VIP_MASK;
    (
        (v != 0).then(|| v - 1),
        value & abi::OWNER_F_SRC_RANGES != 0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn r(s: &str, p: u8) -> SourceRange {
        SourceRange::new(s.parse::<IpAddr>().unwrap(), p).unwrap()
    }

    #[test]
    fn keys_round_trip_with_their_family() {
        for range in [
            r("192.0.2.0", 24),
            r("0.0.0.0", 0),
            r("2001:db8::", 32),
            r("::", 0),
        ] {
            let (k, fam) = key(7, &range);
            assert_eq!(k.prefix_len(), 32 + u32::from(range.prefix()));
            assert_eq!(from_key(&k, fam), Some((7, range)));
        }
        // 192.0.2.0/24 and 2001:db8::/32 differ in family, not only bits
        let (k4, f4) = key(1, &r("192.0.2.0", 24));
        assert_eq!(f4, u32::from(abi::AF_INET));
        assert!(from_key(&k4, 99).is_none(), "unknown family");
        // the bytes the program matches: vip_id, then the address as on the wire
        let d = k4.data();
        assert_eq!(d.addr.0[0].to_ne_bytes(), [192, 0, 2, 0]);
    }

    /// The set the program scans: address and mask words as on the wire, an
    /// IPv4 net in word 0 only.
    #[test]
    fn set_values_hold_address_and_mask_words() {
        let v = set_value(&[r("192.0.2.0", 24), r("2001:db8::", 33), r("0.0.0.0", 0)]);
        assert_eq!(v.n, 3);
        assert_eq!(v.net[0].addr.0[0].to_ne_bytes(), [192, 0, 2, 0]);
        assert_eq!(v.net[0].mask.0[0].to_ne_bytes(), [255, 255, 255, 0]);
        assert_eq!(&v.net[0].mask.0[1..], &[0, 0, 0]);
        assert_eq!(v.net[1].mask.0[0], u32::MAX);
        assert_eq!(v.net[1].mask.0[1].to_ne_bytes(), [0x80, 0, 0, 0]);
        assert_eq!(v.net[2].mask.0, [0; 4]);
        assert_eq!(v.net[3], abi::SrcNet::default());
    }

    #[test]
    fn owner_values_carry_the_ranges_bit_beside_the_vip() {
        assert_eq!(owner_value(0, false, false), 1);
        assert_eq!(owner_value(4, true, false), 5 | 0x8000_0000);
        assert_eq!(owner_value(4, false, true), 5 | 0x4000_0000);
        assert_eq!(owner_of(owner_value(4, true, true)), (Some(4), true));
        assert_eq!(
            owner_of(owner_value(65_535, false, true)),
            (Some(65_535), false)
        );
        assert_eq!(owner_of(0), (None, false));
    }
}
