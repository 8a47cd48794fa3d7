//! Pod IP allocation for the lab kubelet:
//! the explicit list first, then the pod CIDRs (pure, no I/O).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use ipnetwork::IpNetwork;

/// Pod IP allocation: the explicit list first, then the CIDRs.
pub struct PodIps {
    pub explicit: Vec<IpAddr>,
    pub cidrs: Vec<IpNetwork>,
    pub used: HashSet<IpAddr>,
    pub next: HashMap<usize, u128>,
}

impl PodIps {
    pub fn allocate(&mut self, v4: bool) -> Option<IpAddr> {
        if let Some(ip) = self
            .explicit
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == v4 && !self.used.contains(ip))
        {
            self.used.insert(ip);
            return Some(ip);
        }
        let (idx, cidr) = self
            .cidrs
            .iter()
            .enumerate()
            .find(|(_, c)| c.is_ipv4() == v4)?;
        let size: u128 = match cidr {
            IpNetwork::V4(n) => 1u128 << (32 - n.prefix()),
            IpNetwork::V6(n) => 1u128 << (128 - n.prefix()).min(32),
        };
        // Skip the network and broadcast addresses, except in /31 and /32.
        let (lo, hi) = if size <= 2 { (0, size) } else { (1, size - 1) };
        for _ in lo..hi {
            let off = self.next.entry(idx).or_insert(lo);
            let cur = *off;
            *off = if cur + 1 >= hi { lo } else { cur + 1 };
            let ip = match cidr {
                IpNetwork::V4(n) => {
                    IpAddr::from(((u32::from(n.network()) as u128 + cur) as u32).to_be_bytes())
                }
                IpNetwork::V6(n) => IpAddr::from((u128::from(n.network()) + cur).to_be_bytes()),
            };
            if self.used.insert(ip) {
                return Some(ip);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ip_allocation_prefers_explicit() {
        let mut p = PodIps {
            explicit: vec!["192.0.2.7".parse().unwrap()],
            cidrs: vec!["10.1.0.0/30".parse().unwrap()],
            used: HashSet::new(),
            next: HashMap::new(),
        };
        assert_eq!(p.allocate(true), Some("192.0.2.7".parse().unwrap()));
        assert_eq!(p.allocate(true), Some("10.1.0.1".parse().unwrap()));
        assert_eq!(p.allocate(true), Some("10.1.0.2".parse().unwrap()));
        assert_eq!(p.allocate(true), None);
        assert_eq!(p.allocate(false), None);
        let mut one = PodIps {
            explicit: vec![],
            cidrs: vec!["192.0.2.9/32".parse().unwrap()],
            used: HashSet::new(),
            next: HashMap::new(),
        };
        assert_eq!(one.allocate(true), Some("192.0.2.9".parse().unwrap()));
        assert_eq!(one.allocate(true), None);
    }
}
