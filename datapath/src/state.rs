//! The desired state every datapath programs: VIP:port:protocol -> the backend pod
//! addresses and the Maglev ring over them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::{Error, Proto, SourceRange};

/// A VIP:port:protocol. Port 0 is the wildcard: every port of (addr, proto)
/// that has no exact entry (XDP only; IPVS refuses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vip {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

impl fmt::Display for Vip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{p}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{p}", self.port),
        }
    }
}

/// One service as the datapath needs it: the backend pod IPs and the Maglev
/// ring (slot -> index into `backends`). A backend the ring does not name is
/// draining: its established flows stay, new ones go elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    backends: Vec<IpAddr>,
    /// Shared: clones of an entry (the edge's table cache, the desired and
    /// programmed states) share one ring, and equal rings compare by pointer
    /// first.
    ring: Arc<[u32]>,
    conntrack: bool,
    /// Backends that are another region's VIP (a failover VIP): the
    /// datapath encapsulates to them as to a pod, and the remote edge decapsulates.
    remote: BTreeSet<IpAddr>,
    /// This entry is another region's VIP accepted here for failover: served only
    /// for IPIP packets whose outer destination is one of this edge's own VIPs,
    /// never announced, and never forwarded to a remote backend (the loop guard).
    failover_alias: bool,
    /// `Some`: only sources inside these prefixes (of the VIP's family) reach
    /// the backends, on every packet; an empty set refuses every source.
    /// `None`: every source.
    source_ranges: Option<BTreeSet<SourceRange>>,
    /// `sessionAffinity: ClientIP` with its timeout in seconds: every connection
    /// of one client takes the same backend (XDP: the client's address alone
    /// picks the ring slot). `None`: each flow is hashed on its own.
    client_affinity: Option<u32>,
}

impl ServiceEntry {
    /// Validates that every ring slot names a backend and the ring is a Maglev
    /// table's size at most. A datapath may hold smaller rings only (XDP: its
    /// `abi::MAX_RING_SIZE`) and refuses larger ones when it plans.
    pub fn new(vip: &Vip, backends: Vec<IpAddr>, ring: Vec<u32>) -> Result<Self, Error> {
        let max = ringlb_maglev::MAX_TABLE_SIZE;
        if ring.is_empty() || ring.len() > max as usize {
            return Err(Error::invalid_service(
                vip,
                format!("ring size {} outside 1..={max}", ring.len()),
            ));
        }
        if backends.is_empty() {
            return Err(Error::invalid_service(
                vip,
                "no backends (withdraw the VIP instead)",
            ));
        }
        if let Some(s) = ring.iter().find(|&&i| i as usize >= backends.len()) {
            return Err(Error::invalid_service(
                vip,
                format!(
                    "ring names backend index {s}, only {} backends",
                    backends.len()
                ),
            ));
        }
        Ok(Self {
            backends,
            ring: ring.into(),
            conntrack: true,
            remote: BTreeSet::new(),
            failover_alias: false,
            source_ranges: None,
            client_affinity: None,
        })
    }

    /// From a Maglev table: backends in the table's canonical order.
    pub fn from_table(vip: &Vip, table: &ringlb_maglev::Table) -> Result<Self, Error> {
        let backends = table.backends().iter().map(|b| b.addr).collect();
        Self::new(vip, backends, table.slots().to_vec())
    }

    /// Turn conntrack off (pure hashing) for this service.
    pub fn without_conntrack(mut self) -> Self {
        self.conntrack = false;
        self
    }
    /// Marks `addrs` as remote VIPs (failover targets). Each must be a backend,
    /// and a failover alias may have none (a failed-over packet must not travel on).
    pub fn with_remote(
        mut self,
        vip: &Vip,
        addrs: impl IntoIterator<Item = IpAddr>,
    ) -> Result<Self, Error> {
        for a in addrs {
            if !self.backends.contains(&a) {
                return Err(Error::invalid_service(
                    vip,
                    format!("remote VIP {a} is not one of the backends"),
                ));
            }
            self.remote.insert(a);
        }
        self.check_loop(vip)?;
        Ok(self)
    }

    /// Makes this entry a failover alias (see the field). Refused when it has a
    /// remote backend: that would forward failed-over traffic again (a loop).
    pub fn as_failover_alias(mut self, vip: &Vip) -> Result<Self, Error> {
        self.failover_alias = true;
        self.check_loop(vip)?;
        Ok(self)
    }

    /// Restricts the sources (`spec.loadBalancerSourceRanges`) to `ranges`.
    /// Only prefixes of the VIP's family can match its packets, so the others
    /// are left out; none left means no source is accepted (a restricted
    /// Service is never opened by a range of the other family).
    pub fn with_source_ranges(
        mut self,
        vip: &Vip,
        ranges: impl IntoIterator<Item = SourceRange>,
    ) -> Self {
        let v4 = vip.addr.is_ipv4();
        self.source_ranges = Some(
            ranges
                .into_iter()
                .filter(|r| r.addr().is_ipv4() == v4)
                .collect(),
        );
        self
    }

    /// The sources this VIP accepts (`None`: all of them).
    pub fn source_ranges(&self) -> Option<&BTreeSet<SourceRange>> {
        self.source_ranges.as_ref()
    }

    /// Client affinity (`sessionAffinity: ClientIP`) with a timeout in seconds.
    pub fn with_client_affinity(mut self, timeout_seconds: u32) -> Self {
        self.client_affinity = Some(timeout_seconds);
        self
    }

    /// The client affinity's timeout in seconds (`None`: no affinity).
    pub fn client_affinity(&self) -> Option<u32> {
        self.client_affinity
    }

    fn check_loop(&self, vip: &Vip) -> Result<(), Error> {
        if self.failover_alias && !self.remote.is_empty() {
            return Err(Error::invalid_service(
                vip,
                "a failover alias cannot itself fail over to a remote VIP (loop)",
            ));
        }
        Ok(())
    }

    /// The backends that are another region's VIP.
    pub fn remote_backends(&self) -> &BTreeSet<IpAddr> {
        &self.remote
    }
    /// Whether `addr` is a remote VIP rather than a pod.
    pub fn is_remote(&self, addr: &IpAddr) -> bool {
        self.remote.contains(addr)
    }
    /// Whether this entry is another region's VIP accepted for failover.
    pub fn failover_alias(&self) -> bool {
        self.failover_alias
    }
    pub fn backends(&self) -> &[IpAddr] {
        &self.backends
    }
    pub fn ring(&self) -> &[u32] {
        &self.ring
    }
    /// Whether the datapath keeps per-flow state for this service (XDP's
    /// conntrack; on by default).
    pub fn conntrack(&self) -> bool {
        self.conntrack
    }
    /// Every backend with whether the ring names it (false: draining).
    pub fn backends_in_ring(&self) -> Vec<(IpAddr, bool)> {
        let mut named = vec![false; self.backends.len()];
        for &i in self.ring.iter() {
            named[i as usize] = true;
        }
        self.backends.iter().copied().zip(named).collect()
    }
}

/// Everything the datapath should forward.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<Vip, ServiceEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip() -> Vip {
        Vip {
            addr: "2001:db8::5".parse().unwrap(),
            port: 443,
            proto: Proto::Udp,
        }
    }

    #[test]
    fn bad_services_are_rejected_with_a_reason() {
        let v = vip();
        let ip: IpAddr = "10.1.0.1".parse().unwrap();
        let e = ServiceEntry::new(&v, vec![ip], vec![0, 1]).unwrap_err();
        assert!(e.to_string().contains("backend index 1"), "{e}");
        assert_eq!(e.metric_label(), "invalid_service");
        assert!(ServiceEntry::new(&v, vec![], vec![0]).is_err());
        assert!(ServiceEntry::new(&v, vec![ip], vec![]).is_err());
        assert_eq!(v.to_string(), "[2001:db8::5]:443/udp");
    }

    #[test]
    fn a_failover_alias_never_forwards_to_a_remote_vip() {
        let v = vip();
        let pod: IpAddr = "10.1.0.1".parse().unwrap();
        let remote: IpAddr = "2001:db8:2::5".parse().unwrap();
        let e = ServiceEntry::new(&v, vec![pod, remote], vec![0, 1]).unwrap();
        let with = e.clone().with_remote(&v, [remote]).unwrap();
        assert!(with.is_remote(&remote) && !with.is_remote(&pod));
        let err = with.as_failover_alias(&v).unwrap_err();
        assert!(err.to_string().contains("loop"), "{err}");
        let alias = e.clone().as_failover_alias(&v).unwrap();
        assert!(alias.failover_alias());
        assert!(alias.with_remote(&v, [remote]).is_err());
        let stranger: IpAddr = "10.9.9.9".parse().unwrap();
        let err = e.with_remote(&v, [stranger]).unwrap_err();
        assert!(err.to_string().contains("not one of the backends"), "{err}");
    }

    #[test]
    fn source_ranges_keep_the_vips_family_only() {
        let v = vip();
        let e = ServiceEntry::new(&v, vec!["10.1.0.1".parse().unwrap()], vec![0]).unwrap();
        assert_eq!(e.source_ranges(), None);
        let r = |s: &str, p| SourceRange::new(s.parse().unwrap(), p).unwrap();
        let e = e.with_source_ranges(&v, [r("2001:db8:1::", 48), r("192.0.2.0", 24)]);
        let want: BTreeSet<_> = [r("2001:db8:1::", 48)].into();
        assert_eq!(e.source_ranges(), Some(&want));
        let closed = e.with_source_ranges(&v, [r("192.0.2.0", 24)]);
        assert_eq!(
            closed.source_ranges(),
            Some(&BTreeSet::new()),
            "closed, not open"
        );
    }

    #[test]
    fn backends_the_ring_does_not_name_are_draining() {
        let a: Vec<IpAddr> = ["10.1.0.1", "10.1.0.2", "10.1.0.3"]
            .map(|s| s.parse().unwrap())
            .into();
        let e = ServiceEntry::new(&vip(), a.clone(), vec![0, 2, 0, 2, 2]).unwrap();
        assert_eq!(
            e.backends_in_ring(),
            vec![(a[0], true), (a[1], false), (a[2], true)]
        );
    }
}
