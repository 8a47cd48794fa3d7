//! Which backends are pods on this edge's own node (an endpoint's `nodeName`).
//!
//! The XDP datapath passes their frames up this node's stack (`BE_F_LOCAL`), where
//! the node agent (`ringlb-edge node`) decapsulates them as on any worker; a next
//! hop would point at the CNI's bridge or veth, which no XDP redirect delivers to
//! (docs/datapath.md, Pods on edge nodes). The set is kept in a
//! [`ringlb_nexthop::LocalPods`] that the XDP datapath's resolver reads.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_nexthop::LocalPods;

/// This node's name and the shared set of its pods' addresses.
#[derive(Clone, Debug, Default)]
pub struct LocalPodsOf {
    /// The node's name; empty = no node, no pod is local.
    pub node: String,
    pub pods: LocalPods,
    /// The XDP interface, where the node agent's program must run (checked
    /// when the set changes); `None` = not checked.
    pub interface: Option<String>,
}

impl LocalPodsOf {
    pub fn new(node: &str, pods: LocalPods) -> Self {
        Self {
            node: node.into(),
            pods,
            interface: None,
        }
    }

    /// Checks on `iface` that the node agent runs there when pods are local.
    pub fn on_interface(mut self, iface: Option<&str>) -> Self {
        self.interface = iface.map(String::from);
        self
    }

    /// Takes the set from `slices`; returns whether it changed (then the
    /// datapath's existing backends need their next hops refreshed).
    pub fn update<E: Borrow<EndpointSlice>>(&self, slices: &[E]) -> bool {
        let now = on_node(slices, &self.node);
        let n = now.len();
        let changed = self.pods.set(now);
        if changed {
            tracing::info!(
                node = %self.node,
                pods = n,
                "backends on this node changed: their packets go up this node's stack, where the node agent (ringlb-edge node) must run to deliver them"
            );
            self.check_node_agent(n);
        }
        changed
    }

    /// Warns when pods are local but the node agent's program is not on the
    /// XDP interface: their flows would be lost.
    fn check_node_agent(&self, pods: usize) {
        let Some(iface) = self.interface.as_deref().filter(|_| pods > 0) else {
            return;
        };
        match ringlb_xdp::node_agent::ingress_attached(iface) {
            Some(false) => tracing::warn!(
                node = %self.node,
                iface,
                pods,
                "pods on this node back VIPs, but no node agent program runs on {iface}: their flows are lost until the node agent runs on this edge node (chart: nodeAgent.excludeEdgeNodes=false) on this interface"
            ),
            Some(true) => {}
            None => tracing::debug!(
                iface,
                "cannot tell whether the node agent runs here (no tcx)"
            ),
        }
    }
}

/// The addresses of the endpoints whose `nodeName` is `node` (any condition:
/// a draining pod on this node is still local). Empty for an empty `node`.
pub fn on_node<E: Borrow<EndpointSlice>>(slices: &[E], node: &str) -> BTreeSet<IpAddr> {
    if node.is_empty() {
        return BTreeSet::new();
    }
    slices
        .iter()
        .flat_map(|s| &s.borrow().endpoints)
        .filter(|e| e.node_name.as_deref() == Some(node))
        .flat_map(|e| &e.addresses)
        .filter_map(|a| a.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::serving::fixtures::slice;

    const NO_SLICES: &[EndpointSlice] = &[];

    fn slice_of(eps: serde_json::Value) -> EndpointSlice {
        slice("web", "web-1", "IPv4", json!([{"port": 8080}]), eps)
    }

    #[test]
    fn pods_of_this_node_are_local_and_others_are_not() {
        let s = slice_of(json!([
            {"addresses": ["10.244.1.5"], "nodeName": "edge-1", "conditions": {"ready": true}},
            {"addresses": ["10.244.2.5"], "nodeName": "worker-1", "conditions": {"ready": true}},
            {"addresses": ["10.244.1.6"], "nodeName": "edge-1", "conditions": {"ready": false, "terminating": true}},
            {"addresses": ["10.244.3.5"], "conditions": {"ready": true}},
        ]));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            on_node(std::slice::from_ref(&s), "edge-1"),
            [ip("10.244.1.5"), ip("10.244.1.6")].into()
        );
        assert_eq!(
            on_node(std::slice::from_ref(&s), "worker-1"),
            [ip("10.244.2.5")].into()
        );
        assert!(on_node(std::slice::from_ref(&s), "").is_empty());

        let local = LocalPodsOf::new("edge-1", LocalPods::default());
        assert!(local.update(std::slice::from_ref(&s)));
        assert!(
            !local.update(std::slice::from_ref(&s)),
            "no change the second time"
        );
        assert!(local.pods.contains(&ip("10.244.1.5")));
        assert!(!local.pods.contains(&ip("10.244.2.5")));
        assert!(local.update(NO_SLICES));
        assert!(local.pods.is_empty());
    }
}
