//! API objects -> what this node's datapath holds. Pure: Services, EndpointSlices and
//! Pods in, a [`ringlb_node::NodeState`] out.
//!
//! The node must accept exactly what the edges send, so it starts from the edges' own
//! answer, [`serving::build`]: for every VIP:port:protocol the endpoints (pod IP,
//! targetPort), ready ones and `serving && terminating` ones (existing flows must
//! finish), with the same Service selection, the same owner when two Services claim one
//! VIP:port, and the same family choice. An edge tunnels to the endpoint's address; so
//! for every endpoint whose address belongs to a pod on this node the entry is
//!
//! ```text
//! (tunnel dst = endpoint address, VIP, port, proto) -> (pod address of the VIP's family, targetPort)
//! ```
//!
//! The targetPort is the EndpointSlice's port for the Service port, so a named
//! targetPort is resolved per pod (pods that resolve it differently sit in different
//! slices). The edges serve a VIP only from endpoints of its family, so the tunnel
//! destination is the pod's address of the VIP's family and the translated destination
//! too: an IPv4 VIP whose Service has only IPv6 endpoints gets no entry (the edges
//! neither tunnel nor announce it; no NAT46).
//!
//! A failover alias (another region's VIP this Service accepts,
//! `ringlb.io/accept-failover-from`) is one more VIP:port of the same pods: the edge
//! decapsulates the other region's tunnel and re-tunnels the inner packet (destination
//! the other region's VIP) to the pod, so the pod gets the same entry with the alias
//! as the VIP. The reply rewrite takes the VIP from the flow the ingress recorded (the
//! inner destination), so clients see replies from the VIP they asked.
//!
//! The local pods are the Pods whose `spec.nodeName` is this node and that have not
//! finished (a Succeeded or Failed pod's address may already be another pod's), with
//! every address in `status.podIPs`; hostNetwork pods included (their address is the
//! node's; the decapsulated packet is then delivered locally).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_node::{NodeState, ServiceKey, ServiceTarget};

use crate::serving::{self, Skipped};

/// What this node's datapath should hold, and what it cannot take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDesired {
    pub state: NodeState,
    /// Entries of local pods that cannot be programmed, with the reason.
    pub skipped: Vec<Skipped>,
    /// What the edges skip too (not TCP/UDP, VIP:port claimed twice): no entry anywhere.
    pub not_served: Vec<Skipped>,
}

/// One pod on this node: `namespace/name` and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LocalPod {
    key: String,
    ips: Vec<IpAddr>,
}

/// The pods of `pods` that run on `node` and have not finished.
fn local_pods(node: &str, pods: &[Pod]) -> Vec<LocalPod> {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .map(|p| {
            let status = p.status.as_ref();
            let listed = status
                .and_then(|s| s.pod_ips.as_ref())
                .into_iter()
                .flatten()
                .map(|a| a.ip.as_str());
            let single = status.and_then(|s| s.pod_ip.as_deref());
            let mut ips: Vec<IpAddr> = listed
                .chain(single)
                .filter_map(|a| a.parse().ok())
                .collect();
            ips.sort();
            ips.dedup();
            LocalPod {
                key: format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or("")
                ),
                ips,
            }
        })
        .collect()
}

/// Builds this node's desired datapath state from what the agent's reflectors hold.
/// `pods` may hold pods of other nodes; only `node`'s count.
pub fn build(
    node: &str,
    services: &[Service],
    slices: &[EndpointSlice],
    pods: &[Pod],
    default_class: bool,
) -> NodeDesired {
    let local = local_pods(node, pods);
    let by_ip: BTreeMap<IpAddr, &LocalPod> = local
        .iter()
        .flat_map(|p| p.ips.iter().map(move |ip| (*ip, p)))
        .collect();
    let mut out = NodeDesired::default();
    out.state.pods.extend(by_ip.keys().copied());

    let serving = serving::build(services, slices, default_class);
    out.not_served = serving.skipped;
    for (vip, backends) in &serving.vips {
        // ready first: when one pod is listed twice with different ports (hand-made
        // slices), the entry follows the endpoint that takes new flows
        for b in backends.ready.iter().chain(&backends.draining) {
            let Some(pod) = by_ip.get(&b.addr) else {
                continue; // another node's pod
            };
            let mut skip = |reason: String| {
                out.skipped.push(Skipped {
                    service: backends.service.clone(),
                    reason: format!("{vip} on pod {} ({}): {reason}", pod.key, b.addr),
                });
            };
            if vip.port == 0 || b.port == 0 {
                skip("port 0".into());
                continue;
            }
            if b.addr.is_ipv4() != vip.addr.is_ipv4() {
                // `serving::build` gives a VIP endpoints of its family only
                skip("the endpoint is not of the VIP's family (no NAT46/64)".into());
                continue;
            }
            let key = ServiceKey {
                tunnel_dst: b.addr,
                vip: vip.addr,
                port: vip.port,
                proto: vip.proto,
            };
            let target = ServiceTarget {
                pod: b.addr,
                target_port: b.port,
            };
            match out.state.services.get(&key) {
                None => {
                    out.state.services.insert(key, target);
                }
                Some(t) if *t == target => {}
                Some(t) => skip(format!(
                    "also listed with targetPort {}; {} is kept",
                    b.port, t.target_port
                )),
            }
        }
    }
    out
}

/// The outer sources this node takes tunnels from: every `InternalIP` and
/// `ExternalIP` address of the edges' Nodes (the agent watches only Nodes that match
/// `--edge-selector`). An edge encapsulates from its `--source-v4`/`--source-v6`,
/// which the chart sets to the node's address. Hostnames and unparsable entries are
/// ignored.
pub fn edge_addresses(edges: &[Node]) -> BTreeSet<IpAddr> {
    edges
        .iter()
        .filter_map(|n| n.status.as_ref()?.addresses.as_ref())
        .flatten()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Pods as the API serves them, for tests.
    use super::*;
    use serde_json::json;

    /// A running pod `name` on `node` with `ips` (the first is `status.podIP`).
    pub(crate) fn pod(name: &str, node: &str, ips: &[&str]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {
                "phase": "Running",
                "podIP": ips.first(),
                "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::pod;
    use super::*;

    #[test]
    fn edge_addresses_are_the_edges_internal_and_external_ips() {
        let node = |name: &str, addrs: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"ringlb.io/edge": "true"}},
                "status": {"addresses": addrs}
            }))
            .unwrap()
        };
        let edges = [
            node(
                "edge1",
                serde_json::json!([
                    {"type": "InternalIP", "address": "192.168.0.11"},
                    {"type": "InternalIP", "address": "fd00::11"},
                    {"type": "Hostname", "address": "edge1"}
                ]),
            ),
            node(
                "edge2",
                serde_json::json!([
                    {"type": "ExternalIP", "address": "198.51.100.12"},
                    {"type": "InternalDNS", "address": "edge2.example"},
                    {"type": "InternalIP", "address": "not-an-ip"}
                ]),
            ),
            serde_json::from_value(serde_json::json!({"metadata": {"name": "edge3"}})).unwrap(),
        ];
        let want: BTreeSet<IpAddr> = ["192.168.0.11", "fd00::11", "198.51.100.12"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(edge_addresses(&edges), want);
        assert!(edge_addresses(&[]).is_empty());
    }
    use crate::serving::fixtures::{ep, service, slice};
    use ringlb_node::Proto;
    use serde_json::json;

    const NODE: &str = "node-1";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entry(
        d: &NodeDesired,
        tunnel: &str,
        vip: &str,
        port: u16,
        proto: Proto,
    ) -> Option<(IpAddr, u16)> {
        d.state
            .services
            .get(&ServiceKey {
                tunnel_dst: ip(tunnel),
                vip: ip(vip),
                port,
                proto,
            })
            .map(|t| (t.pod, t.target_port))
    }

    /// Asserts that `d` tunnels `vip`:`port` to pod `pod` (at its own address) on
    /// port `target`.
    #[track_caller]
    fn assert_tunnels(d: &NodeDesired, pod: &str, vip: &str, port: u16, proto: Proto, target: u16) {
        assert_eq!(entry(d, pod, vip, port, proto), Some((ip(pod), target)));
    }

    fn web() -> Service {
        service(
            "web",
            &["192.0.2.1"],
            json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]),
        )
    }

    fn web_slice(eps: serde_json::Value) -> EndpointSlice {
        slice(
            "web",
            "web-1",
            "IPv4",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            eps,
        )
    }

    #[test]
    fn local_pods_get_their_entries_and_other_nodes_pods_none() {
        let d = build(
            NODE,
            &[web()],
            &[web_slice(json!([
                ep("10.1.0.1", true, true, false),
                ep("10.2.0.1", true, true, false),
            ]))],
            &[
                pod("a", NODE, &["10.1.0.1"]),
                pod("b", "node-2", &["10.2.0.1"]),
            ],
            true,
        );
        assert_eq!(d.state.pods, [ip("10.1.0.1")].into(), "only node-1's pod");
        assert_eq!(d.state.services.len(), 1);
        assert_tunnels(&d, "10.1.0.1", "192.0.2.1", 80, Proto::Tcp, 8080);
        assert!(d.skipped.is_empty() && d.not_served.is_empty());
        assert!(d.state.validate().is_ok());
    }

    #[test]
    fn local_pods_without_a_service_are_known_and_finished_ones_are_not() {
        let mut done = pod("done", NODE, &["10.1.0.9"]);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let d = build(
            NODE,
            &[],
            &[],
            &[pod("idle", NODE, &["10.1.0.2", "fd00::2"]), done],
            true,
        );
        assert_eq!(d.state.pods, [ip("10.1.0.2"), ip("fd00::2")].into());
        assert!(d.state.services.is_empty());
    }

    #[test]
    fn terminating_but_serving_endpoints_keep_their_entry_and_not_serving_ones_do_not() {
        let d = build(
            NODE,
            &[web()],
            &[web_slice(json!([
                ep("10.1.0.1", false, true, true),
                ep("10.1.0.2", false, false, true),
                ep("10.1.0.3", false, false, false),
            ]))],
            &[
                pod("a", NODE, &["10.1.0.1"]),
                pod("b", NODE, &["10.1.0.2"]),
                pod("c", NODE, &["10.1.0.3"]),
            ],
            true,
        );
        let tunnels: Vec<IpAddr> = d.state.services.keys().map(|k| k.tunnel_dst).collect();
        assert_eq!(tunnels, [ip("10.1.0.1")], "flows of a draining pod finish");
        assert_eq!(d.state.pods.len(), 3, "every local pod is known");
    }

    #[test]
    fn named_target_ports_resolve_per_pod_through_their_slices() {
        // one Service port with targetPort "http"; two pods name different numbers,
        // so the EndpointSlice controller puts them into two slices
        let svc = service(
            "web",
            &["192.0.2.1"],
            json!([{"name": "web", "port": 80, "protocol": "TCP", "targetPort": "http"}]),
        );
        let s1 = slice(
            "web",
            "web-a",
            "IPv4",
            json!([{"name": "web", "port": 8080, "protocol": "TCP"}]),
            json!([ep("10.1.0.1", true, true, false)]),
        );
        let s2 = slice(
            "web",
            "web-b",
            "IPv4",
            json!([{"name": "web", "port": 9090, "protocol": "TCP"}]),
            json!([ep("10.1.0.2", true, true, false)]),
        );
        let d = build(
            NODE,
            &[svc],
            &[s1, s2],
            &[pod("a", NODE, &["10.1.0.1"]), pod("b", NODE, &["10.1.0.2"])],
            true,
        );
        assert_tunnels(&d, "10.1.0.1", "192.0.2.1", 80, Proto::Tcp, 8080);
        assert_tunnels(&d, "10.1.0.2", "192.0.2.1", 80, Proto::Tcp, 9090);
    }

    #[test]
    fn dual_stack_pods_get_one_entry_per_family() {
        let svc = service(
            "web",
            &["192.0.2.1", "2001:db8::1"],
            json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}, {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]),
        );
        let ports = json!([{"port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]);
        let v4 = slice(
            "web",
            "v4",
            "IPv4",
            ports.clone(),
            json!([ep("10.1.0.1", true, true, false)]),
        );
        let v6 = slice(
            "web",
            "v6",
            "IPv6",
            ports,
            json!([ep("fd00::1", true, true, false)]),
        );
        let d = build(
            NODE,
            &[svc],
            &[v4, v6],
            &[pod("a", NODE, &["10.1.0.1", "fd00::1"])],
            true,
        );
        assert_eq!(d.state.services.len(), 4, "{:?}", d.state.services);
        assert_tunnels(&d, "10.1.0.1", "192.0.2.1", 80, Proto::Tcp, 8080);
        assert_tunnels(&d, "fd00::1", "2001:db8::1", 80, Proto::Tcp, 8080);
        assert_tunnels(&d, "fd00::1", "2001:db8::1", 53, Proto::Udp, 5353);
        assert!(entry(&d, "10.1.0.1", "2001:db8::1", 80, Proto::Tcp).is_none());
        assert!(d.state.validate().is_ok());
    }

    #[test]
    fn a_vip_without_endpoints_of_its_family_gets_no_entry() {
        // IPv4 VIP, IPv6 endpoints only: the edges neither tunnel nor announce it,
        // whether or not the pod also has an IPv4 address
        let svc = service(
            "web",
            &["192.0.2.1"],
            json!([{"port": 80, "protocol": "TCP"}]),
        );
        let v6 = slice(
            "web",
            "v6",
            "IPv6",
            json!([{"port": 80, "protocol": "TCP"}]),
            json!([
                ep("fd00::1", true, true, false),
                ep("fd00::2", true, true, false)
            ]),
        );
        let d = build(
            NODE,
            &[svc],
            &[v6],
            &[
                pod("dual", NODE, &["fd00::1", "10.1.0.1"]),
                pod("single", NODE, &["fd00::2"]),
            ],
            true,
        );
        assert!(d.state.services.is_empty(), "{:?}", d.state.services);
        assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    }

    #[test]
    fn services_not_ours_or_without_a_vip_give_no_entries() {
        let mut other = service(
            "other",
            &["192.0.2.9"],
            json!([{"port": 80, "protocol": "TCP"}]),
        );
        other.spec.as_mut().unwrap().load_balancer_class = Some("metallb.io/x".into());
        let mut cluster_ip = service("cip", &[], json!([{"port": 80, "protocol": "TCP"}]));
        cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        let pending = service("pending", &[], json!([{"port": 80, "protocol": "TCP"}]));
        let eps = json!([ep("10.1.0.1", true, true, false)]);
        let slices: Vec<EndpointSlice> = ["other", "cip", "pending"]
            .iter()
            .map(|s| slice(s, s, "IPv4", json!([{"port": 80}]), eps.clone()))
            .collect();
        let pods = [pod("a", NODE, &["10.1.0.1"])];
        let d = build(
            NODE,
            &[other.clone(), cluster_ip, pending],
            &slices,
            &pods,
            true,
        );
        assert!(d.state.services.is_empty(), "{:?}", d.state.services);
        assert_eq!(d.state.pods.len(), 1);
        // no class: ours only with --default-class
        let mut unclassed = other;
        unclassed.spec.as_mut().unwrap().load_balancer_class = None;
        assert_eq!(
            build(NODE, std::slice::from_ref(&unclassed), &slices, &pods, true)
                .state
                .services
                .len(),
            1
        );
        assert!(
            build(NODE, &[unclassed], &slices, &pods, false)
                .state
                .services
                .is_empty()
        );
    }

    #[test]
    fn a_pod_in_two_services_gets_the_entries_of_both() {
        let api = service(
            "api",
            &["192.0.2.2"],
            json!([{"port": 443, "protocol": "TCP", "targetPort": 8443}]),
        );
        let api_slice = slice(
            "api",
            "api-1",
            "IPv4",
            json!([{"port": 8443, "protocol": "TCP"}]),
            json!([ep("10.1.0.1", true, true, false)]),
        );
        let d = build(
            NODE,
            &[web(), api],
            &[
                web_slice(json!([ep("10.1.0.1", true, true, false)])),
                api_slice,
            ],
            &[pod("a", NODE, &["10.1.0.1"])],
            true,
        );
        assert_tunnels(&d, "10.1.0.1", "192.0.2.1", 80, Proto::Tcp, 8080);
        assert_tunnels(&d, "10.1.0.1", "192.0.2.2", 443, Proto::Tcp, 8443);
        assert_eq!(d.state.services.len(), 2);
    }

    #[test]
    fn a_pod_listed_twice_with_two_ports_keeps_one_entry_and_says_so() {
        let eps = |ip: &str, ready: bool| json!([ep(ip, ready, true, !ready)]);
        let a = slice(
            "web",
            "a",
            "IPv4",
            json!([{"name": "http", "port": 9090, "protocol": "TCP"}]),
            eps("10.1.0.1", false),
        );
        let b = web_slice(eps("10.1.0.1", true));
        let d = build(
            NODE,
            &[web()],
            &[a, b],
            &[pod("a", NODE, &["10.1.0.1"])],
            true,
        );
        assert_eq!(
            entry(&d, "10.1.0.1", "192.0.2.1", 80, Proto::Tcp),
            Some((ip("10.1.0.1"), 8080)),
            "the ready endpoint's port wins"
        );
        assert_eq!(d.skipped.len(), 1);
        assert!(d.skipped[0].reason.contains("9090"), "{:?}", d.skipped);
    }

    #[test]
    fn what_the_edges_skip_is_reported_not_programmed() {
        let sctp = service(
            "sctp",
            &["192.0.2.3"],
            json!([{"port": 9, "protocol": "SCTP"}]),
        );
        let d = build(NODE, &[sctp], &[], &[], true);
        assert!(d.state.services.is_empty());
        assert_eq!(d.not_served.len(), 1);
    }

    #[test]
    fn failover_aliases_get_the_same_entries_as_the_real_vip() {
        let mut svc = web();
        svc.metadata.annotations = Some(
            [(
                "ringlb.io/accept-failover-from".to_string(),
                "198.51.100.7,198.51.100.8".to_string(),
            )]
            .into(),
        );
        let d = build(
            NODE,
            &[svc],
            &[web_slice(json!([
                ep("10.1.0.1", true, true, false),
                ep("10.2.0.1", true, true, false),
            ]))],
            &[
                pod("a", NODE, &["10.1.0.1", "fd00::1"]),
                pod("b", "node-2", &["10.2.0.1"]),
            ],
            true,
        );
        for vip in ["192.0.2.1", "198.51.100.7", "198.51.100.8"] {
            assert_tunnels(&d, "10.1.0.1", vip, 80, Proto::Tcp, 8080);
        }
        assert_eq!(d.state.services.len(), 3, "{:?}", d.state.services);
        assert!(d.skipped.is_empty(), "{:?}", d.skipped);
        assert!(d.state.validate().is_ok());
    }
}
