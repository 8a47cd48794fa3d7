//! One sync of the edge agent: API objects -> Maglev tables -> the datapath (through
//! the `ringlb_datapath::Datapath` seam) -> each VIP:port's hold-down (`vip_health`)
//! -> the routes the speaker announces, de-preferred or withdrawn below a Service's
//! health threshold, and the facts the health pages answer from. Tested
//! here against the real apply paths of both datapaths, XDP over in-memory maps and
//! IPVS over an in-memory kernel, and a real speaker; no API server, no kernel.
//! Also how long the agent lets events settle before a sync ([`debounce`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use ringlb_bgp::{RouteAttrs, Speaker};
use ringlb_crds::edge_ack::parse_resource_version;
use ringlb_datapath::Datapath;

use super::local_pods::LocalPodsOf;
use super::metrics::DatapathMetrics;
use crate::vip_health::{Board, Changed, FailoverChanged, Tracker};
use crate::{serving, tables};

/// The least the agent waits for more events before it syncs: the events of one
/// change (a Service, its status, its EndpointSlice) arrive within a few ms.
const SETTLE: Duration = Duration::from_millis(5);
/// The most it waits. Between the two it waits as long as its last sync took, so
/// that under a stream of events the loop syncs at most about half of the time.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// How long to wait for more events once one arrived: as long as the last sync
/// took, within `SETTLE..=DEBOUNCE`.
pub fn debounce(last_sync_took: Duration) -> Duration {
    last_sync_took.clamp(SETTLE, DEBOUNCE)
}

/// What one sync leaves for the next.
#[derive(Default)]
pub struct SyncState {
    /// The routes the speaker announces, with their attributes.
    pub announced: BTreeMap<IpNetwork, RouteAttrs>,
    /// A sync has programmed the datapath at least once.
    pub synced_once: bool,
    /// The last apply failed: sync again soon without waiting for an event.
    pub retry: bool,
    /// Maglev tables of the last sync, reused while their backends do not change.
    pub tables: tables::Tables,
    /// The hold-down of every VIP:port.
    pub health: Tracker,
    /// What the health pages read; the sync publishes to it.
    pub board: Arc<Board>,
    /// The earliest end of a running hold-down: sync again then.
    pub due: Option<Instant>,
    /// Health transitions of the last sync (for Events and metrics).
    pub changed: Vec<Changed>,
    /// VIP:ports that started or stopped failing over in the last sync (for Events).
    pub failovers: Vec<FailoverChanged>,
    /// Failover aliases programmed by the last sync that reached the datapath.
    pub aliases: usize,
    /// The bad annotations of the last sync (for Events).
    pub bad_annotations: Vec<serving::Skipped>,
    /// This node's pods, which the XDP datapath passes up this node's stack.
    pub local_pods: LocalPodsOf,
    /// The set of local pods changed since the last refresh of next hops that
    /// followed a successful apply.
    pub local_pods_changed: bool,
    /// The highest Service resourceVersion a successful sync has acted on: what the
    /// edge's Lease acknowledges (`ack`). It never goes back.
    pub applied_rv: Option<u64>,
}

/// The reflectors the sync reads.
pub struct Stores {
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
}

/// What a sync needs besides the API objects.
pub struct SyncConfig {
    pub ring_size: u32,
    pub default_class: bool,
}

/// One reconcile of the edge: the API objects in `stores` become Maglev tables and
/// the datapath's desired state, which `dp` applies; then the health tracker steps
/// every VIP:port, the speaker announces the VIPs that are programmed and healthy (or
/// de-preferred, as their Service asks) and withdraws the others. After a failed
/// apply nothing new is announced and nothing withdrawn, and `st.retry` is set.
pub fn sync(
    stores: &Stores,
    cfg: &SyncConfig,
    dp: &mut dyn Datapath,
    speaker: &Speaker,
    metrics: &DatapathMetrics,
    st: &mut SyncState,
) {
    let start = Instant::now();
    // shared with the stores, not cloned: a clone of every object costs
    // about 25 us each
    let services = stores.services.state();
    // The store holds every event up to its newest object: acting on this snapshot
    // acts on every Service state up to that resourceVersion.
    let seen_rv = services
        .iter()
        .filter_map(|s| s.metadata.resource_version.as_deref())
        .filter_map(parse_resource_version)
        .max();
    let slices = stores.slices.state();
    let snapshot_ms = ms(start.elapsed());
    let want = serving::build(&services, &slices, cfg.default_class);
    let built_ms = ms(start.elapsed());
    for s in &want.skipped {
        tracing::warn!(service = %s.service, reason = %s.reason, "not served");
    }
    for s in &want.bad_annotations {
        tracing::warn!(service = %s.service, reason = %s.reason, "bad annotation");
    }
    st.bad_annotations.clone_from(&want.bad_annotations);
    let (state, problems) = tables::datapath_state(&want, cfg.ring_size, &mut st.tables);
    let tables_ms = ms(start.elapsed());
    for p in &problems {
        tracing::warn!(what = %p.what, reason = %p.reason, "not programmed");
    }
    // before the apply, so new backends are written local; existing ones are
    // rewritten by the refresh after it
    st.local_pods_changed |= st.local_pods.update(&slices);
    let applied = Instant::now();
    let result = dp.apply(&state);
    let applied_ms = ms(start.elapsed());
    metrics.observe_apply(applied.elapsed().as_secs_f64(), result.as_ref().map(|_| ()));
    if result.is_ok() && st.local_pods_changed {
        match dp.refresh_next_hops() {
            Ok(n) => {
                st.local_pods_changed = false;
                tracing::debug!(
                    rewritten = n,
                    "next hops refreshed for the pods on this node"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = e.metric_label(), "refreshing next hops for the pods on this node; retrying next sync")
            }
        }
    }
    st.changed.clear();
    st.failovers.clear();
    let routes = match result {
        Ok(stats) => {
            tracing::debug!(?stats, vips = state.services.len(), "datapath applied");
            st.retry = false;
            let ev = st.health.evaluate(&want, &state, Instant::now());
            for c in &ev.changed {
                tracing::info!(vip = %c.vip, service = %c.service, transition = ?c.transition,
                    ready = c.ready, min_ready = c.min_ready, "VIP health changed");
            }
            for c in &ev.failovers {
                tracing::warn!(vip = %c.vip, service = %c.service, remote = %c.remote,
                    active = c.active, "failover changed");
            }
            st.board.publish(ev.facts, ev.routes.clone());
            st.due = ev.due;
            st.changed = ev.changed;
            st.failovers = ev.failovers;
            st.aliases = ev.aliases;
            st.applied_rv = st.applied_rv.max(seen_rv);
            ev.routes
        }
        Err(e) => {
            // Announce nothing new and withdraw nothing until the datapath is right.
            tracing::error!(error = %e, kind = e.metric_label(), "datapath apply failed; retrying");
            st.retry = true;
            st.announced.clone()
        }
    };
    for gone in st.announced.keys().filter(|r| !routes.contains_key(r)) {
        speaker.withdraw(*gone);
    }
    // New routes, and routes whose attributes (de-preference) changed.
    speaker.announce_many(
        routes
            .iter()
            .filter(|(r, a)| st.announced.get(r) != Some(a))
            .map(|(r, a)| (*r, a.clone())),
    );
    st.announced = routes;
    st.synced_once |= !st.retry;
    // where the time went: each figure is the time since the start
    tracing::debug!(
        elapsed_ms = ms(start.elapsed()),
        snapshot_ms,
        built_ms,
        tables_ms,
        applied_ms,
        announced = st.announced.len(),
        "synced"
    );
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use prometheus_client::registry::Registry;
    use ringlb_ipvs::guard::nft::MemoryNft;
    use ringlb_ipvs::kernel::memory::MemoryKernel;
    use ringlb_ipvs::{Forward, IpvsDatapath};
    use ringlb_nexthop::StaticResolver;
    use ringlb_xdp::apply::Applier;
    use ringlb_xdp::maps::memory::MemoryMaps;
    use serde_json::json;

    use std::collections::BTreeSet;

    use super::*;
    use crate::serving::fixtures::{ep, service, slice};

    /// Reflector stores holding `services` and `slices`, as the watches fill them.
    fn stores(services: Vec<Service>, slices: Vec<EndpointSlice>) -> Stores {
        let (svc_reader, mut svc_writer) = reflector::store::<Service>();
        let (slice_reader, mut slice_writer) = reflector::store::<EndpointSlice>();
        for s in services {
            svc_writer.apply_watcher_event(&Event::Apply(s));
        }
        for s in slices {
            slice_writer.apply_watcher_event(&Event::Apply(s));
        }
        Stores {
            services: svc_reader,
            slices: slice_reader,
        }
    }

    fn web(vip: &str) -> Service {
        service(
            "web",
            &[vip],
            json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}]),
        )
    }

    fn web_slice(pods: &[(&str, bool)]) -> EndpointSlice {
        let eps: Vec<_> = pods
            .iter()
            .map(|(ip, ready)| ep(ip, *ready, *ready, false))
            .collect();
        slice(
            "web",
            "web-1",
            "IPv4",
            json!([{"port": 8080, "protocol": "TCP"}]),
            json!(eps),
        )
    }

    struct Edge<D> {
        dp: D,
        speaker: Speaker,
        metrics: DatapathMetrics,
        st: SyncState,
        cfg: SyncConfig,
    }

    impl Edge<Applier<MemoryMaps>> {
        fn new() -> Self {
            Edge::with(
                Applier::new(MemoryMaps::default(), Box::new(StaticResolver::default())).unwrap(),
                "xdp",
            )
        }
    }

    impl<D: Datapath> Edge<D> {
        fn with(dp: D, name: &str) -> Self {
            let mut registry = Registry::default();
            Edge {
                dp,
                // port 0: no listener; announcing only fills the speaker's table
                speaker: Speaker::start(0, &mut registry).unwrap(),
                metrics: DatapathMetrics::register(&mut registry, name),
                st: SyncState::default(),
                cfg: SyncConfig {
                    ring_size: 251,
                    default_class: true,
                },
            }
        }

        fn sync(&mut self, stores: &Stores) {
            sync(
                stores,
                &self.cfg,
                &mut self.dp,
                &self.speaker,
                &self.metrics,
                &mut self.st,
            );
        }

        fn announced(&self) -> Vec<String> {
            self.speaker
                .announced()
                .iter()
                .map(ToString::to_string)
                .collect()
        }
    }

    impl Edge<Applier<MemoryMaps>> {
        /// The pod addresses the VIP's ring names, from the maps.
        fn ring_pods(&self) -> BTreeSet<String> {
            let m = self.dp.maps();
            m.vips
                .values()
                .flat_map(|i| m.rings[&i.vip_id].iter())
                .map(|id| {
                    let b = m.backends[id];
                    b.addr.to_ip(b.family).unwrap().to_string()
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn a_pod_on_this_node_is_written_local_and_others_keep_their_next_hop() {
        use ringlb_nexthop::{LocalPods, NextHop, WithLocalPods};
        let nh = NextHop {
            ifindex: 2,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0, 0, 0, 2],
            vlan: None,
        };
        let pods = LocalPods::default();
        let resolver = WithLocalPods::new(StaticResolver::everywhere(nh), pods.clone());
        let mut edge = Edge::with(
            Applier::new(MemoryMaps::default(), Box::new(resolver)).unwrap(),
            "xdp",
        );
        let on = |ip: &str, node: &str| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true, "serving": true}});
        let objs = stores(
            vec![web("10.100.0.1")],
            vec![slice(
                "web",
                "web-1",
                "IPv4",
                json!([{"port": 8080, "protocol": "TCP"}]),
                json!([on("10.1.0.1", "edge-1"), on("10.1.0.2", "worker-1")]),
            )],
        );
        let local_of = |edge: &Edge<Applier<MemoryMaps>>| -> BTreeSet<String> {
            let m = edge.dp.maps();
            m.backends
                .values()
                .filter(|b| b.family != 0)
                .inspect(|b| assert_eq!(b.is_local(), b.next_hop().is_none(), "{b:?}"))
                .filter(|b| b.is_local())
                .map(|b| b.addr.to_ip(b.family).unwrap().to_string())
                .collect()
        };
        // no node name: nothing is local, both pods have a next hop
        edge.sync(&objs);
        assert!(local_of(&edge).is_empty());
        // this edge is edge-1: its pod's existing entry is rewritten local
        edge.st.local_pods = LocalPodsOf::new("edge-1", pods.clone());
        edge.sync(&objs);
        assert_eq!(local_of(&edge), ["10.1.0.1".to_string()].into());
        assert!(!edge.st.local_pods_changed, "refreshed after the apply");
        let m = edge.dp.maps();
        let other = m
            .backends
            .values()
            .find(|b| !b.is_local() && b.family != 0)
            .unwrap();
        assert_eq!(other.next_hop(), Some(nh));
        assert_eq!(edge.announced(), ["10.100.0.1/32"]);
    }

    #[tokio::test]
    async fn a_service_with_ready_pods_is_programmed_then_announced() {
        let mut edge = Edge::new();
        let objs = stores(
            vec![web("10.100.0.1")],
            vec![web_slice(&[
                ("10.1.0.1", true),
                ("10.1.0.2", true),
                ("10.1.0.3", false),
            ])],
        );
        edge.sync(&objs);
        assert!(edge.st.synced_once && !edge.st.retry);
        assert_eq!(
            edge.ring_pods(),
            ["10.1.0.1", "10.1.0.2"].map(String::from).into(),
            "ready pods only"
        );
        let vip = edge.dp.maps().vips.keys().next().copied().unwrap();
        assert_eq!(
            (vip.addr.to_string().as_str(), vip.port),
            ("10.100.0.1", 80)
        );
        assert_eq!(edge.announced(), ["10.100.0.1/32"]);
    }

    #[tokio::test]
    async fn a_vip_whose_pods_all_go_is_withdrawn_and_removed() {
        let mut edge = Edge::new();
        edge.sync(&stores(
            vec![web("10.100.0.1")],
            vec![web_slice(&[("10.1.0.1", true)])],
        ));
        assert_eq!(edge.announced(), ["10.100.0.1/32"]);
        edge.sync(&stores(
            vec![web("10.100.0.1")],
            vec![web_slice(&[("10.1.0.1", false)])],
        ));
        assert!(edge.announced().is_empty(), "no ready backend, no route");
        assert!(edge.dp.maps().vips.is_empty());
        assert!(edge.dp.maps().live().is_empty(), "no backend left live");
    }

    #[tokio::test]
    async fn a_vip_with_a_failover_vip_stays_announced_and_rings_only_the_remote() {
        let mut edge = Edge::new();
        let mut a = web("10.100.0.1");
        a.metadata.annotations = Some(
            [
                (
                    "ringlb.io/failover-vip".to_string(),
                    "10.200.0.1".to_string(),
                ),
                // A region-B role too: accepts another region's VIP as an alias.
                (
                    "ringlb.io/accept-failover-from".to_string(),
                    "10.150.0.1".to_string(),
                ),
            ]
            .into(),
        );
        edge.sync(&stores(
            vec![a.clone()],
            vec![web_slice(&[("10.1.0.1", true)])],
        ));
        assert_eq!(
            edge.announced(),
            ["10.100.0.1/32"],
            "the alias is not announced"
        );
        assert_eq!(edge.st.aliases, 1);
        assert_eq!(edge.dp.maps().vips.len(), 2, "the VIP and the alias");
        assert!(edge.st.failovers.is_empty());
        // Every pod gone: still announced, the ring holds only the remote VIP, and
        // the change is reported once.
        let gone = stores(vec![a], vec![web_slice(&[("10.1.0.1", false)])]);
        edge.sync(&gone);
        assert_eq!(edge.announced(), ["10.100.0.1/32"]);
        assert_eq!(edge.ring_pods(), ["10.200.0.1"].map(String::from).into());
        assert_eq!(
            edge.dp.maps().vips.len(),
            1,
            "the alias has no backend left"
        );
        assert_eq!(edge.st.failovers.len(), 1);
        assert!(edge.st.failovers[0].active);
        edge.sync(&gone);
        assert!(edge.st.failovers.is_empty(), "once per change");
    }

    /// `web` on 10.100.0.1 and `api` (one pod, 10.1.0.9) on 10.100.0.2.
    fn web_and_api() -> Stores {
        stores(
            vec![web("10.100.0.1"), {
                let mut s = service(
                    "api",
                    &["10.100.0.2"],
                    json!([{"port": 443, "protocol": "TCP"}]),
                );
                s.metadata.name = Some("api".into());
                s
            }],
            vec![web_slice(&[("10.1.0.1", true)]), {
                slice(
                    "api",
                    "api-1",
                    "IPv4",
                    json!([{"port": 443, "protocol": "TCP"}]),
                    json!([ep("10.1.0.9", true, true, false)]),
                )
            }],
        )
    }

    #[tokio::test]
    async fn a_failed_apply_announces_nothing_new_and_withdraws_nothing() {
        let mut edge = Edge::new();
        edge.sync(&stores(
            vec![web("10.100.0.1")],
            vec![web_slice(&[("10.1.0.1", true)])],
        ));
        let both = web_and_api();
        edge.dp.maps_mut().fail_after = Some(0);
        edge.sync(&both);
        assert!(edge.st.retry, "the failed apply is retried");
        assert_eq!(edge.announced(), ["10.100.0.1/32"], "the new VIP waits");
        edge.dp.maps_mut().fail_after = None;
        edge.sync(&both);
        assert!(!edge.st.retry);
        assert_eq!(edge.announced(), ["10.100.0.1/32", "10.100.0.2/32"]);
    }

    /// `web` asking for two ready pods, de-preferred by two prepends below that.
    fn web_min2(hold_down: &str) -> Service {
        let mut s = web("10.100.0.1");
        s.metadata.annotations = Some(
            [
                ("ringlb.io/min-ready-backends", "2"),
                ("ringlb.io/unhealthy-bgp", "prepend=2"),
                ("ringlb.io/health-hold-down", hold_down),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        s
    }

    fn prepends(edge: &Edge<Applier<MemoryMaps>>) -> Option<u8> {
        let net = "10.100.0.1/32".parse().unwrap();
        edge.st.announced[&net].deprefer.map(|d| d.prepend)
    }

    #[tokio::test]
    async fn below_its_minimum_a_vip_is_depreferred_until_the_hold_down_ends() {
        let mut edge = Edge::new();
        let two = web_slice(&[("10.1.0.1", true), ("10.1.0.2", true)]);
        let one = web_slice(&[("10.1.0.1", true), ("10.1.0.2", false)]);
        edge.sync(&stores(vec![web_min2("300ms")], vec![two.clone()]));
        assert_eq!(prepends(&edge), None);
        edge.sync(&stores(vec![web_min2("300ms")], vec![one]));
        assert_eq!(edge.announced(), ["10.100.0.1/32"], "still announced");
        assert_eq!(prepends(&edge), Some(2), "de-preferred at once");
        assert_eq!(edge.st.changed.len(), 1);
        edge.sync(&stores(vec![web_min2("300ms")], vec![two.clone()]));
        assert_eq!(prepends(&edge), Some(2), "held down");
        let due = edge
            .st
            .due
            .expect("the agent is told when the hold-down ends");
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        edge.sync(&stores(vec![web_min2("300ms")], vec![two]));
        assert_eq!(prepends(&edge), None, "healthy again after the hold-down");
        assert_eq!(edge.st.due, None);
    }

    /// GET `path` from the ops endpoint at `addr`: (status, body).
    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        (status, serde_json::from_str(body).unwrap_or_default())
    }

    #[tokio::test]
    async fn the_health_url_answers_from_the_sync_over_http() {
        let mut edge = Edge::new();
        // One established session, as the agent counts them.
        edge.st.board = Arc::new(Board::new(Box::new(|| {
            vec![ringlb_bgp::reach::PeerView::everything()]
        })));
        let pages: Arc<dyn ringlb_ops::ExtraPages> = edge.st.board.clone();
        let health = ringlb_ops::Health::new();
        let registry = Arc::new(tokio::sync::Mutex::new(Registry::default()));
        let any = "127.0.0.1:0".parse().unwrap();
        let (addr, task) = ringlb_ops::serve_ops_with(any, registry, health, Some(pages))
            .await
            .unwrap();
        let (status, body) = get(addr, "/health/vip/10.100.0.1").await;
        assert_eq!(
            (status, &body["reason"]),
            (503, &json!("the edge has not synced yet"))
        );
        let two = web_slice(&[("10.1.0.1", true), ("10.1.0.2", true)]);
        edge.sync(&stores(vec![web_min2("1h")], vec![two]));
        let (status, body) = get(addr, "/health/vip/10.100.0.1/80").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["state"], "healthy");
        assert_eq!(body["readyBackends"], 2);
        assert_eq!(body["minReady"], 2);
        assert_eq!(body["announced"], true);
        assert_eq!(get(addr, "/health/vip/10.100.0.1").await.0, 200);
        let one = web_slice(&[("10.1.0.1", true), ("10.1.0.2", false)]);
        edge.sync(&stores(vec![web_min2("1h")], vec![one]));
        let (status, body) = get(addr, "/health/vip/10.100.0.1/80").await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["state"], "degraded");
        assert_eq!(
            body["reason"],
            "1 ready backends, 2 required; route de-preferred"
        );
        edge.sync(&stores(
            vec![web_min2("1h")],
            vec![web_slice(&[("10.1.0.1", false)])],
        ));
        let (status, body) = get(addr, "/health/vip/10.100.0.1/80").await;
        assert_eq!((status, &body["state"]), (503, &json!("down")), "{body}");
        assert_eq!(body["programmed"], false);
        assert_eq!(get(addr, "/health/vip/10.100.0.1/81").await.0, 404);
        assert_eq!(get(addr, "/health/vip/10.100.0.9").await.0, 404);
        assert_eq!(get(addr, "/health/vip/10.100.0.999").await.0, 400);
        task.abort();
    }

    // The same sync over the IPVS datapath and its in-memory kernel.

    /// (address, port, weight, forwarding)
    type RealServer = (String, u16, u32, Forward);

    /// The IPVS edge as the agent makes it: with the nftables guard (in memory).
    fn ipvs_edge() -> Edge<IpvsDatapath<MemoryKernel>> {
        let nft = Box::new(MemoryNft::default());
        let cfg = ringlb_ipvs::Config::default();
        let dp = IpvsDatapath::with_guard(MemoryKernel::default(), cfg, nft);
        Edge::with(dp.unwrap(), "ipvs")
    }

    impl Edge<IpvsDatapath<MemoryKernel>> {
        /// Every virtual service in the kernel with its real servers (address,
        /// port, weight, forwarding) in the kernel's list order.
        fn ipvs(&self) -> Vec<(String, Vec<RealServer>)> {
            let k = &self.dp.kernel().state;
            k.services
                .iter()
                .map(|(key, h)| {
                    let dests = h.dests.iter().map(|d| {
                        let a = d.key.addr.to_string();
                        (a, d.key.port, d.weight, d.forward)
                    });
                    (key.to_string(), dests.collect())
                })
                .collect()
        }

        fn bound(&self) -> Vec<String> {
            let k = &self.dp.kernel().state;
            k.vips.iter().map(ToString::to_string).collect()
        }
    }

    fn rs(addr: &str, weight: u32) -> RealServer {
        // DR and tunnel keep the VIP's port: the node agent maps it to targetPort
        (addr.to_string(), 80, weight, Forward::Tunnel)
    }

    #[tokio::test]
    async fn ipvs_a_service_with_ready_pods_becomes_a_virtual_service_then_announced() {
        let mut edge = ipvs_edge();
        edge.sync(&stores(
            vec![web("10.100.0.1")],
            vec![web_slice(&[
                ("10.1.0.1", true),
                ("10.1.0.2", true),
                ("10.1.0.3", false),
            ])],
        ));
        assert!(edge.st.synced_once && !edge.st.retry);
        assert_eq!(
            edge.ipvs(),
            [(
                "10.100.0.1:80/tcp".to_string(),
                vec![rs("10.1.0.2", 1), rs("10.1.0.1", 1)]
            )],
            "ready pods only, tunnel, canonical order"
        );
        assert_eq!(edge.bound(), ["10.100.0.1"], "the VIP is bound on lo");
        assert_eq!(edge.announced(), ["10.100.0.1/32"]);
    }

    /// ClientIP affinity reaches IPVS as persistence with its timeout; source
    /// ranges reach the guard in front of IPVS, which drops the other sources
    /// and counts them per VIP as the XDP datapath does.
    #[tokio::test]
    async fn ipvs_affinity_is_persistence_and_source_ranges_reach_the_guard() {
        let mut svc = web("10.100.0.1");
        let spec = svc.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        spec.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
        let stores = stores(vec![svc], vec![web_slice(&[("10.1.0.1", true)])]);
        let mut edge = ipvs_edge();
        edge.sync(&stores);
        let held = &edge.dp.held().services;
        let s = &held.values().next().unwrap().service;
        assert_eq!((s.flags & 1, s.timeout), (1, 10_800), "persistent, 3 h");
        let guard = edge.dp.guard().unwrap().held().unwrap();
        assert!(
            guard
                .script
                .contains("10.100.0.1 . tcp . 80 : jump src_10.100.0.1_tcp_80")
                && guard.script.contains("ip saddr { 192.0.2.0/24 } accept"),
            "{}",
            guard.script
        );
        let c = Datapath::counters(&mut edge.dp).unwrap();
        let vip = ringlb_datapath::Vip {
            addr: "10.100.0.1".parse().unwrap(),
            port: 80,
            proto: ringlb_datapath::Proto::Tcp,
        };
        assert_eq!(c.per_vip_dropped, [(vip, "source_range", 0)]);
    }

    #[tokio::test]
    async fn ipvs_a_terminating_pod_drains_at_weight_zero() {
        let mut edge = ipvs_edge();
        let eps = json!([
            ep("10.1.0.1", true, true, false),
            ep("10.1.0.2", false, true, true),
        ]);
        let ports = json!([{"port": 8080, "protocol": "TCP"}]);
        let s = slice("web", "web-1", "IPv4", ports, eps);
        edge.sync(&stores(vec![web("10.100.0.1")], vec![s]));
        assert_eq!(
            edge.ipvs()[0].1,
            [rs("10.1.0.2", 0), rs("10.1.0.1", 1)],
            "not in the ring: its connections stay, new ones go to the ready pod"
        );
    }

    #[tokio::test]
    async fn ipvs_a_vip_whose_pods_all_go_is_withdrawn_and_removed() {
        let mut edge = ipvs_edge();
        let svc = vec![web("10.100.0.1")];
        edge.sync(&stores(svc.clone(), vec![web_slice(&[("10.1.0.1", true)])]));
        assert_eq!(edge.announced(), ["10.100.0.1/32"]);
        edge.sync(&stores(svc, vec![web_slice(&[("10.1.0.1", false)])]));
        assert!(edge.announced().is_empty(), "no ready backend, no route");
        assert!(edge.ipvs().is_empty(), "the virtual service is deleted");
        assert!(edge.bound().is_empty(), "the VIP is unbound");
    }

    #[tokio::test]
    async fn ipvs_a_failed_write_announces_nothing_new_and_withdraws_nothing() {
        let mut edge = ipvs_edge();
        edge.sync(&stores(
            vec![web("10.100.0.1")],
            vec![web_slice(&[("10.1.0.1", true)])],
        ));
        let both = web_and_api();
        edge.dp.kernel_mut().fail_after = Some(0);
        edge.sync(&both);
        assert!(edge.st.retry, "the failed apply is retried");
        assert_eq!(edge.announced(), ["10.100.0.1/32"], "the new VIP waits");
        assert_eq!(edge.ipvs().len(), 1, "the failed write changed nothing");
        edge.dp.kernel_mut().fail_after = None;
        edge.sync(&both);
        assert!(!edge.st.retry);
        assert_eq!(edge.announced(), ["10.100.0.1/32", "10.100.0.2/32"]);
        assert_eq!(edge.ipvs().len(), 2);
    }

    #[test]
    fn events_settle_for_as_long_as_the_last_sync_took_within_bounds() {
        use super::{DEBOUNCE, Duration, SETTLE, debounce};
        assert_eq!(debounce(Duration::ZERO), SETTLE);
        let took = Duration::from_millis(12);
        assert_eq!(debounce(took), took);
        assert_eq!(debounce(Duration::from_secs(2)), DEBOUNCE);
    }
}
