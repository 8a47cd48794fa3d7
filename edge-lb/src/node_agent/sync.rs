//! One sync of the node agent: API objects -> [`desired::build`] -> the datapath
//! (through the [`NodeProgram`] seam). Tested here over the real apply path
//! (`ringlb_node::maps::Applier`) on in-memory maps; no API server, no kernel.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use prometheus_client::metrics::{
    counter::Counter, family::Family, gauge::Gauge, histogram::Histogram,
};
use prometheus_client::registry::Registry;
use ringlb_node::abi::Stat;
use ringlb_node::maps::{Applier, NodeMaps};
use ringlb_node::{NodeDatapath, NodeState};

use super::desired;
use crate::serving::Skipped;

/// What the sync needs from the datapath: apply a desired state (writing only the
/// difference) and read the packet counters.
pub trait NodeProgram {
    fn apply(&mut self, want: &NodeState) -> Result<usize, ringlb_node::Error>;
    /// Every counter, summed over CPUs (none without a kernel).
    fn counters(&self) -> Result<Vec<(Stat, u64)>, ringlb_node::Error> {
        Ok(Vec::new())
    }
}

impl NodeProgram for NodeDatapath {
    fn apply(&mut self, want: &NodeState) -> Result<usize, ringlb_node::Error> {
        NodeDatapath::apply(self, want)
    }
    fn counters(&self) -> Result<Vec<(Stat, u64)>, ringlb_node::Error> {
        NodeDatapath::counters(self)
    }
}

impl<M: NodeMaps> NodeProgram for Applier<M> {
    fn apply(&mut self, want: &NodeState) -> Result<usize, ringlb_node::Error> {
        Applier::apply(self, want)
    }
}

/// The reflectors the sync reads (Pods: this node's only; Nodes: the edges' only).
pub struct Stores {
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub pods: Store<Pod>,
    pub edges: Store<Node>,
}

/// What a sync needs besides the API objects.
#[derive(Clone, Debug)]
pub struct SyncConfig {
    pub node_name: String,
    pub default_class: bool,
}

/// What one sync leaves for the next.
#[derive(Debug, Default)]
pub struct SyncState {
    /// A sync has programmed the datapath at least once.
    pub synced_once: bool,
    /// The last apply failed: sync again soon without waiting for an event.
    pub retry: bool,
    /// What was last reported as not programmable (logged again only when it changes).
    pub skipped: Vec<Skipped>,
    /// The last sync found no edge address (warned once until that changes).
    pub warned_no_edges: bool,
}

/// `ringlb_node_*` metrics.
#[derive(Clone)]
pub struct NodeMetrics {
    pub packets: Family<Vec<(String, String)>, Counter>,
    pub apply_seconds: Histogram,
    pub apply_errors: Family<Vec<(String, String)>, Counter>,
    pub pods: Gauge,
    pub entries: Gauge,
    pub skipped: Gauge,
    pub tunnel_sources: Gauge,
    last: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

impl NodeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            packets: Family::default(),
            apply_seconds: Histogram::new([1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0]),
            apply_errors: Family::default(),
            pods: Gauge::default(),
            entries: Gauge::default(),
            skipped: Gauge::default(),
            tunnel_sources: Gauge::default(),
            last: Default::default(),
        };
        let sub = registry.sub_registry_with_prefix("node");
        sub.register(
            "packets",
            "Node datapath packets by counter (see docs/node.md)",
            m.packets.clone(),
        );
        sub.register(
            "apply_seconds",
            "Time to apply a desired-state change to the node maps",
            m.apply_seconds.clone(),
        );
        sub.register(
            "apply_errors",
            "Failed applies by kind",
            m.apply_errors.clone(),
        );
        sub.register(
            "local_pods",
            "Local pod addresses programmed",
            m.pods.clone(),
        );
        sub.register(
            "service_entries",
            "(pod, VIP, port, protocol) entries programmed",
            m.entries.clone(),
        );
        sub.register(
            "tunnel_sources",
            "Edge addresses tunnels to local pods are taken from",
            m.tunnel_sources.clone(),
        );
        sub.register(
            "skipped_entries",
            "Entries of local pods that cannot be programmed",
            m.skipped.clone(),
        );
        m
    }

    /// Adds what the kernel counted since the last call (a counter that went down,
    /// e.g. maps re-created, starts over).
    pub fn update(&self, counters: &[(Stat, u64)]) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.resize(Stat::ALL.len(), 0);
        for (stat, now) in counters {
            let before = std::mem::replace(&mut last[*stat as usize], *now);
            let delta = if *now >= before { now - before } else { *now };
            if delta > 0 {
                self.packets
                    .get_or_create(&vec![("counter".into(), stat.label().into())])
                    .inc_by(delta);
            }
        }
    }
}

fn cloned<K: kube::Resource + Clone>(store: &Store<K>) -> Vec<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// One reconcile of the node: the API objects in `stores` become the node's desired
/// state, which `dp` applies (writing only the difference). A failed apply sets
/// `st.retry`; the datapath keeps what it held.
pub fn sync(
    stores: &Stores,
    cfg: &SyncConfig,
    dp: &mut dyn NodeProgram,
    metrics: &NodeMetrics,
    st: &mut SyncState,
) {
    let mut want = desired::build(
        &cfg.node_name,
        &cloned(&stores.services),
        &cloned(&stores.slices),
        &cloned(&stores.pods),
        cfg.default_class,
    );
    want.state.edges = desired::edge_addresses(&cloned(&stores.edges));
    if want.state.edges.is_empty() && !st.warned_no_edges {
        tracing::warn!("no edge Node has an address: tunnels to local pods are refused");
    }
    st.warned_no_edges = want.state.edges.is_empty();
    for s in &want.not_served {
        tracing::debug!(service = %s.service, reason = %s.reason, "not served");
    }
    if want.skipped != st.skipped {
        for s in &want.skipped {
            tracing::warn!(service = %s.service, reason = %s.reason, "not programmed on this node");
        }
        st.skipped = want.skipped.clone();
    }
    metrics.skipped.set(want.skipped.len() as i64);
    let start = Instant::now();
    let result = dp.apply(&want.state);
    metrics.apply_seconds.observe(start.elapsed().as_secs_f64());
    match result {
        Ok(ops) => {
            if ops > 0 {
                tracing::info!(
                    ops,
                    pods = want.state.pods.len(),
                    entries = want.state.services.len(),
                    "node datapath updated"
                );
            }
            metrics.pods.set(want.state.pods.len() as i64);
            metrics.entries.set(want.state.services.len() as i64);
            metrics.tunnel_sources.set(want.state.edges.len() as i64);
            st.retry = false;
            st.synced_once = true;
        }
        Err(e) => {
            tracing::error!(error = %e, kind = e.metric_label(), "node datapath apply failed; retrying");
            metrics
                .apply_errors
                .get_or_create(&vec![("kind".into(), e.metric_label().into())])
                .inc();
            st.retry = true;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::IpAddr;

    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use ringlb_node::maps::FakeMaps;
    use ringlb_node::{Proto, ServiceKey};
    use serde_json::json;

    use super::*;
    use crate::node_agent::desired::fixtures::pod;
    use crate::serving::fixtures::{ep, service, slice};

    /// Reflector stores holding the objects, as the watches fill them.
    pub(crate) fn stores(
        services: Vec<Service>,
        slices: Vec<EndpointSlice>,
        pods: Vec<Pod>,
    ) -> Stores {
        stores_with_edges(services, slices, pods, Vec::new())
    }

    /// [`stores`] with the edges' Nodes too.
    pub(crate) fn stores_with_edges(
        services: Vec<Service>,
        slices: Vec<EndpointSlice>,
        pods: Vec<Pod>,
        edges: Vec<k8s_openapi::api::core::v1::Node>,
    ) -> Stores {
        fn fill<K>(objs: Vec<K>) -> Store<K>
        where
            K: kube::Resource + Clone,
            K::DynamicType: Eq + std::hash::Hash + Clone + Default,
        {
            let (reader, mut writer) = reflector::store::<K>();
            for o in objs {
                writer.apply_watcher_event(&Event::Apply(o));
            }
            reader
        }
        Stores {
            services: fill(services),
            slices: fill(slices),
            pods: fill(pods),
            edges: fill(edges),
        }
    }

    struct Node {
        dp: Applier<FakeMaps>,
        metrics: NodeMetrics,
        st: SyncState,
        cfg: SyncConfig,
    }

    impl Node {
        fn new() -> Self {
            Node {
                dp: Applier::new(FakeMaps::default()).unwrap(),
                metrics: NodeMetrics::register(&mut Registry::default()),
                st: SyncState::default(),
                cfg: SyncConfig {
                    node_name: "node-1".into(),
                    default_class: true,
                },
            }
        }
        fn sync(&mut self, stores: &Stores) {
            sync(stores, &self.cfg, &mut self.dp, &self.metrics, &mut self.st);
        }
        /// (tunnel dst, VIP:port) -> pod:targetPort, as the maps hold them.
        fn entries(&self) -> Vec<(String, String, String)> {
            let s = self.dp.maps().read().unwrap();
            s.services
                .iter()
                .map(|(k, t)| {
                    (
                        k.tunnel_dst.to_string(),
                        format!("{}:{}", k.vip, k.port),
                        format!("{}:{}", t.pod, t.target_port),
                    )
                })
                .collect()
        }
    }

    fn web(target: u16) -> Service {
        service(
            "web",
            &["192.0.2.1"],
            json!([{"port": 80, "protocol": "TCP", "targetPort": target}]),
        )
    }

    fn web_slice(target: u16, ips: &[&str]) -> EndpointSlice {
        let eps: Vec<_> = ips.iter().map(|ip| ep(ip, true, true, false)).collect();
        slice(
            "web",
            "web-1",
            "IPv4",
            json!([{"port": target, "protocol": "TCP"}]),
            json!(eps),
        )
    }

    fn pods() -> Vec<Pod> {
        vec![
            pod("a", "node-1", &["10.1.0.1"]),
            pod("b", "node-2", &["10.2.0.1"]),
        ]
    }

    fn e(tunnel: &str, vip: &str, to: &str) -> (String, String, String) {
        (tunnel.into(), vip.into(), to.into())
    }

    #[test]
    fn the_edges_addresses_become_the_allowed_tunnel_sources() {
        let edge = |name: &str, addr: &str| -> k8s_openapi::api::core::v1::Node {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"ringlb.io/edge": "true"}},
                "status": {"addresses": [{"type": "InternalIP", "address": addr}]}
            }))
            .unwrap()
        };
        let mut node = Node::new();
        let objs = || {
            (
                vec![web(8080)],
                vec![web_slice(8080, &["10.1.0.1"])],
                pods(),
            )
        };
        let (sv, sl, po) = objs();
        node.sync(&stores_with_edges(
            sv,
            sl,
            po,
            vec![edge("edge1", "192.168.0.11"), edge("edge2", "192.168.0.12")],
        ));
        let held: Vec<String> = node
            .dp
            .maps()
            .read()
            .unwrap()
            .edges
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(held, ["192.168.0.11", "192.168.0.12"]);
        assert_eq!(node.metrics.tunnel_sources.get(), 2);
        assert!(!node.st.warned_no_edges);
        // edge2 leaves (unlabelled or deleted): its address goes
        let (sv, sl, po) = objs();
        node.sync(&stores_with_edges(
            sv,
            sl,
            po,
            vec![edge("edge1", "192.168.0.11")],
        ));
        assert_eq!(node.dp.maps().edges.len(), 1);
        // no edge at all: nothing is allowed, and the agent says so once
        let (sv, sl, po) = objs();
        node.sync(&stores_with_edges(sv, sl, po, vec![]));
        assert!(node.dp.maps().edges.is_empty());
        assert!(node.st.warned_no_edges);
    }

    #[test]
    fn a_sync_programs_this_nodes_pods_and_follows_changes() {
        let mut node = Node::new();
        node.sync(&stores(
            vec![web(8080)],
            vec![web_slice(8080, &["10.1.0.1", "10.2.0.1"])],
            pods(),
        ));
        assert!(node.st.synced_once && !node.st.retry);
        assert_eq!(
            node.entries(),
            [e("10.1.0.1", "192.0.2.1:80", "10.1.0.1:8080")]
        );
        assert_eq!(node.metrics.entries.get(), 1);
        // targetPort changes: one rewrite
        let writes = node.dp.maps().writes;
        node.sync(&stores(
            vec![web(9090)],
            vec![web_slice(9090, &["10.1.0.1", "10.2.0.1"])],
            pods(),
        ));
        assert_eq!(
            node.entries(),
            [e("10.1.0.1", "192.0.2.1:80", "10.1.0.1:9090")]
        );
        assert_eq!(node.dp.maps().writes, writes + 1);
        // the pod goes: its entry and its address go
        node.sync(&stores(
            vec![web(9090)],
            vec![web_slice(9090, &["10.2.0.1"])],
            vec![pod("b", "node-2", &["10.2.0.1"])],
        ));
        assert!(node.entries().is_empty());
        assert!(node.dp.maps().pods.is_empty());
    }

    #[test]
    fn a_failed_apply_is_retried_from_what_the_maps_hold() {
        let mut node = Node::new();
        node.dp.maps_mut().fail_after = Some(1);
        let objs = stores(
            vec![web(8080)],
            vec![web_slice(8080, &["10.1.0.1"])],
            pods(),
        );
        node.sync(&objs);
        assert!(node.st.retry && !node.st.synced_once);
        assert_eq!(
            node.metrics
                .apply_errors
                .get_or_create(&vec![("kind".into(), "invalid_entry".into())])
                .get(),
            1
        );
        node.dp.maps_mut().fail_after = None;
        node.sync(&objs);
        assert!(!node.st.retry && node.st.synced_once);
        let key = ServiceKey {
            tunnel_dst: "10.1.0.1".parse::<IpAddr>().unwrap(),
            vip: "192.0.2.1".parse().unwrap(),
            port: 80,
            proto: Proto::Tcp,
        };
        assert_eq!(node.dp.programmed().services[&key].target_port, 8080);
    }

    #[test]
    fn packet_counters_become_metric_deltas() {
        let m = NodeMetrics::register(&mut Registry::default());
        let get = |m: &NodeMetrics| {
            m.packets
                .get_or_create(&vec![("counter".into(), Stat::Dnat.label().into())])
                .get()
        };
        m.update(&[(Stat::Dnat, 5)]);
        m.update(&[(Stat::Dnat, 7)]);
        assert_eq!(get(&m), 7);
        m.update(&[(Stat::Dnat, 2)]); // maps re-created: starts over
        assert_eq!(get(&m), 9);
    }
}
