//! What the node datapath should hold (pure; no I/O): the local pods, and per
//! pod the (VIP, port, protocol) -> targetPort entries of the Services they
//! back. [`plan`] diffs two states into map operations; `maps::apply` writes
//! them. The agent builds a [`NodeState`] from Services, EndpointSlices and
//! this node's Pods, and never edits maps directly.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use crate::{Error, abi};

/// Transport protocol of a Service port (shared with `ringlb-xdp`).
pub use ringlb_bpf_types::Proto;

/// One service entry's key: traffic the edge tunnelled to `tunnel_dst` (a
/// local pod address) for `vip:port/proto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub tunnel_dst: IpAddr,
    pub vip: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

/// Where that traffic goes: the pod's address of the VIP's family, and the
/// targetPort (resolved for this pod: named ports may differ between pods).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceTarget {
    pub pod: IpAddr,
    pub target_port: u16,
}

/// The desired (or programmed) contents of the node maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// Every address of every local pod that may receive tunnelled traffic.
    pub pods: BTreeSet<IpAddr>,
    /// The outer sources tunnels may come from (the edges' node addresses);
    /// enforced when the datapath was loaded with `NodeOptions::check_source`.
    pub edges: BTreeSet<IpAddr>,
    pub services: BTreeMap<ServiceKey, ServiceTarget>,
}

impl NodeState {
    /// Adds `pod` and the entry `vip:port/proto -> pod:target_port`, tunnelled
    /// to the pod's own address (the usual case: same family).
    pub fn add_backend(
        &mut self,
        vip: IpAddr,
        port: u16,
        proto: Proto,
        pod: IpAddr,
        target_port: u16,
    ) -> &mut Self {
        self.pods.insert(pod);
        self.services.insert(
            ServiceKey {
                tunnel_dst: pod,
                vip,
                port,
                proto,
            },
            ServiceTarget { pod, target_port },
        );
        self
    }

    /// Checks what the program cannot check: ports non-zero, the translated
    /// destination in the VIP's family, the tunnel destination a local pod.
    pub fn validate(&self) -> Result<(), Error> {
        for (k, t) in &self.services {
            let bad = |reason: &str| Error::InvalidEntry {
                entry: format!(
                    "{}:{}/{:?} via {} -> {}:{}",
                    k.vip, k.port, k.proto, k.tunnel_dst, t.pod, t.target_port
                ),
                reason: reason.to_string(),
            };
            if k.port == 0 || t.target_port == 0 {
                return Err(bad("port 0"));
            }
            if k.vip.is_ipv4() != t.pod.is_ipv4() {
                return Err(bad(
                    "the pod address must be of the VIP's family (no NAT46/64)",
                ));
            }
            if !self.pods.contains(&k.tunnel_dst) {
                return Err(bad("the tunnel destination is not a local pod"));
            }
        }
        Ok(())
    }
}

/// One map write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    PutEdge(IpAddr),
    PutPod(IpAddr),
    PutService(ServiceKey, ServiceTarget),
    DelService(ServiceKey),
    DelPod(IpAddr),
    DelEdge(IpAddr),
}

/// The operations that turn `have` into `want`, in a safe order: pods before
/// the services that need them, services removed before their pods; new edges
/// first, edges that left last (a moving edge is never refused in between). Flow
/// entries are never removed: established connections of a pod that left a
/// Service keep their replies translated until the LRU recycles them.
pub fn plan(have: &NodeState, want: &NodeState) -> Vec<MapOp> {
    let mut ops = Vec::new();
    ops.extend(
        want.edges
            .difference(&have.edges)
            .map(|e| MapOp::PutEdge(*e)),
    );
    ops.extend(want.pods.difference(&have.pods).map(|p| MapOp::PutPod(*p)));
    for (k, t) in &want.services {
        if have.services.get(k) != Some(t) {
            ops.push(MapOp::PutService(*k, *t));
        }
    }
    for k in have.services.keys() {
        if !want.services.contains_key(k) {
            ops.push(MapOp::DelService(*k));
        }
    }
    ops.extend(have.pods.difference(&want.pods).map(|p| MapOp::DelPod(*p)));
    ops.extend(
        have.edges
            .difference(&want.edges)
            .map(|e| MapOp::DelEdge(*e)),
    );
    ops
}

/// The `services` map key and value of an entry.
pub fn service_entry(k: &ServiceKey, t: &ServiceTarget) -> (abi::SvcKey, abi::SvcValue) {
    (svc_key(k), svc_value(t))
}

pub fn svc_key(k: &ServiceKey) -> abi::SvcKey {
    let (tunnel_dst, tunnel_family) = abi::RawAddr::from_ip(k.tunnel_dst);
    let (vip, family) = abi::RawAddr::from_ip(k.vip);
    abi::SvcKey {
        tunnel_dst,
        vip,
        vip_port: abi::Be16::from_host(k.port),
        proto: k.proto.number(),
        family,
        tunnel_family,
        pad: [0; 3],
    }
}

fn svc_value(t: &ServiceTarget) -> abi::SvcValue {
    abi::SvcValue {
        pod: abi::RawAddr::from_ip(t.pod).0,
        target_port: abi::Be16::from_host(t.target_port),
        pad: 0,
    }
}

/// Inverse of [`service_entry`] (reading maps back after a restart); `None`
/// for an entry this build would not have written.
pub fn entry_from_raw(k: &abi::SvcKey, v: &abi::SvcValue) -> Option<(ServiceKey, ServiceTarget)> {
    Some((
        ServiceKey {
            tunnel_dst: k.tunnel_dst.to_ip(k.tunnel_family)?,
            vip: k.vip.to_ip(k.family)?,
            port: k.vip_port.to_host(),
            proto: Proto::from_number(k.proto)?,
        },
        ServiceTarget {
            pod: v.pod.to_ip(k.family)?,
            target_port: v.target_port.to_host(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn one() -> NodeState {
        let mut s = NodeState::default();
        s.add_backend(ip("10.100.0.1"), 80, Proto::Tcp, ip("10.2.0.5"), 8080);
        s
    }

    #[test]
    fn plan_from_empty_puts_the_pod_before_its_service() {
        let ops = plan(&NodeState::default(), &one());
        assert!(matches!(ops[0], MapOp::PutPod(p) if p == ip("10.2.0.5")));
        assert!(matches!(ops[1], MapOp::PutService(k, t) if k.port == 80 && t.target_port == 8080));
        assert_eq!(ops.len(), 2);
    }

    #[test]
    fn plan_to_empty_deletes_the_service_before_its_pod() {
        let ops = plan(&one(), &NodeState::default());
        assert!(matches!(ops[0], MapOp::DelService(_)));
        assert!(matches!(ops[1], MapOp::DelPod(_)));
    }

    #[test]
    fn plan_adds_edges_first_and_removes_them_last() {
        let mut want = one();
        want.edges.insert(ip("192.168.0.11"));
        let ops = plan(&NodeState::default(), &want);
        assert_eq!(ops[0], MapOp::PutEdge(ip("192.168.0.11")));
        let ops = plan(&want, &NodeState::default());
        assert_eq!(ops.last(), Some(&MapOp::DelEdge(ip("192.168.0.11"))));
        let mut moved = want.clone();
        moved.edges = [ip("192.168.0.12")].into();
        assert_eq!(
            plan(&want, &moved),
            [
                MapOp::PutEdge(ip("192.168.0.12")),
                MapOp::DelEdge(ip("192.168.0.11"))
            ]
        );
    }

    #[test]
    fn plan_of_equal_states_is_empty_and_a_changed_target_is_one_put() {
        assert!(plan(&one(), &one()).is_empty());
        let mut b = NodeState::default();
        b.add_backend(ip("10.100.0.1"), 80, Proto::Tcp, ip("10.2.0.5"), 9090);
        let ops = plan(&one(), &b);
        assert_eq!(ops.len(), 1);
        assert!(matches!(ops[0], MapOp::PutService(_, t) if t.target_port == 9090));
    }

    #[test]
    fn validate_refuses_what_the_program_cannot_do() {
        assert!(one().validate().is_ok());
        let mut s = one();
        s.add_backend(ip("2001:db8::1"), 80, Proto::Tcp, ip("10.2.0.6"), 8080);
        assert!(s.validate().is_err(), "family mismatch");
        let mut s = one();
        s.pods.clear();
        assert!(s.validate().is_err(), "tunnel to a non-local address");
        let mut s = NodeState::default();
        s.add_backend(ip("10.100.0.1"), 0, Proto::Udp, ip("10.2.0.5"), 53);
        assert!(s.validate().is_err(), "port 0");
    }

    #[test]
    fn entries_round_trip_through_the_raw_layout() {
        let mut s = one();
        s.add_backend(
            ip("2001:db8:100::1"),
            443,
            Proto::Udp,
            ip("2001:db8:2::5"),
            8443,
        );
        for (k, t) in &s.services {
            let (rk, rv) = service_entry(k, t);
            assert_eq!(entry_from_raw(&rk, &rv), Some((*k, *t)));
        }
        let (rk, rv) = service_entry(
            s.services.keys().next().unwrap(),
            s.services.values().next().unwrap(),
        );
        assert_eq!(rk.vip_port.to_host(), 80);
        // IPv4 in word 0, the packet's bytes in memory order
        assert_eq!(rv.pod.0, [u32::from_ne_bytes([10, 2, 0, 5]), 0, 0, 0]);
    }
}
