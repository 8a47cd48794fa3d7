//! Source prefixes a VIP accepts (`spec.loadBalancerSourceRanges`): the seam's
//! own small CIDR type, so that this crate needs no network crate.

use std::fmt;
use std::net::IpAddr;

/// An address prefix with its host bits zero (`10.0.0.0/8`, `2001:db8::/32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRange {
    addr: IpAddr,
    prefix: u8,
}

impl SourceRange {
    /// `addr/prefix` with the host bits cleared; `None` when `prefix` is longer
    /// than the address (32 for IPv4, 128 for IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let addr = match addr {
            IpAddr::V4(a) if prefix <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) if prefix <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
            _ => return None,
        };
        Some(Self { addr, prefix })
    }

    /// The network address (host bits zero).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside the prefix (an address of the other family never is).
    pub fn contains(&self, ip: IpAddr) -> bool {
        Self::new(ip, self.prefix).is_some_and(|r| r.addr == self.addr)
    }
}

impl fmt::Display for SourceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn host_bits_are_cleared_and_membership_follows_the_prefix() {
        let r = SourceRange::new(ip("192.0.2.77"), 24).unwrap();
        assert_eq!(r.to_string(), "192.0.2.0/24");
        assert!(r.contains(ip("192.0.2.1")));
        assert!(!r.contains(ip("192.0.3.1")));
        assert!(!r.contains(ip("::ffff:192.0.2.1")), "other family");
        let all = SourceRange::new(ip("1.2.3.4"), 0).unwrap();
        assert_eq!(all.to_string(), "0.0.0.0/0");
        assert!(all.contains(ip("203.0.113.9")));
        let six = SourceRange::new(ip("2001:db8:ffff::1"), 32).unwrap();
        assert_eq!(six.to_string(), "2001:db8::/32");
        assert!(six.contains(ip("2001:db8::5")) && !six.contains(ip("2001:db9::5")));
        assert_eq!(
            SourceRange::new(ip("2001:db8::1"), 128).unwrap().prefix(),
            128
        );
        assert!(SourceRange::new(ip("10.0.0.1"), 33).is_none());
        assert!(SourceRange::new(ip("::1"), 129).is_none());
    }
}
