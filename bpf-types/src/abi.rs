//! Network-order fields of the BPF map layouts. `#[repr(C)]`/`transparent`,
//! no padding, sizes asserted: safe to embed in any `#[repr(C)]` map key or
//! value, and to read and write through aya.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `AF_INET`, the family byte stored next to a [`RawAddr`].
pub const AF_INET: u8 = 2;
/// `AF_INET6`, the family byte stored next to a [`RawAddr`].
pub const AF_INET6: u8 = 10;

/// A 16-bit value in network byte order (as it sits in the packet).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Be16(u16);

impl Be16 {
    pub const fn from_host(v: u16) -> Self {
        Self(v.to_be())
    }
    pub const fn to_host(self) -> u16 {
        u16::from_be(self.0)
    }
}

/// An address as four raw network-order words (`__u32 addr[4]` in C): IPv4 in
/// word 0, words 1..3 zero. Always stored next to a family byte.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawAddr(pub [u32; 4]);

impl RawAddr {
    /// The address and its `AF_*` family.
    pub fn from_ip(ip: IpAddr) -> (Self, u8) {
        match ip {
            IpAddr::V4(a) => (Self([u32::from_ne_bytes(a.octets()), 0, 0, 0]), AF_INET),
            IpAddr::V6(a) => {
                let o = a.octets();
                let mut w = [0u32; 4];
                for (i, c) in o.chunks_exact(4).enumerate() {
                    w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                }
                (Self(w), AF_INET6)
            }
        }
    }

    /// Inverse of [`RawAddr::from_ip`]; `None` for an unknown family.
    pub fn to_ip(self, family: u8) -> Option<IpAddr> {
        match family {
            AF_INET => Some(IpAddr::V4(Ipv4Addr::from(self.0[0].to_ne_bytes()))),
            AF_INET6 => {
                let mut o = [0u8; 16];
                for (i, w) in self.0.iter().enumerate() {
                    o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
                }
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            _ => None,
        }
    }
}

const _: () = assert!(size_of::<Be16>() == 2);
const _: () = assert!(size_of::<RawAddr>() == 16);
const _: () = assert!(align_of::<RawAddr>() == 4);

// SAFETY (for both impls): aya::Pod requires plain old data with no padding
// bytes the kernel could read uninitialised and no invalid bit patterns. Both
// types are repr(C)/transparent over integers, with no padding (sizes above).
#[allow(unsafe_code)]
mod pod {
    unsafe impl aya::Pod for super::Be16 {}
    unsafe impl aya::Pod for super::RawAddr {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_addr_round_trips_and_holds_packet_bytes() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        let (r, f) = RawAddr::from_ip(v4);
        assert_eq!(f, AF_INET);
        // the first word holds the packet bytes 10,1,2,3 in memory order
        assert_eq!(r.0[0].to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(&r.0[1..], &[0, 0, 0]);
        assert_eq!(r.to_ip(f), Some(v4));
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let (r, f) = RawAddr::from_ip(v6);
        assert_eq!(f, AF_INET6);
        assert_eq!(r.0[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(r.to_ip(f), Some(v6));
        assert_eq!(r.to_ip(7), None);
    }

    #[test]
    fn be16_is_network_order() {
        let p = Be16::from_host(0x1f90);
        assert_eq!(p.to_host(), 0x1f90);
        assert_eq!(p.0.to_ne_bytes(), [0x1f, 0x90]);
    }
}
