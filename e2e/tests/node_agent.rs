//! The node agent (`ringlb-edge node`, `edge-lb/src/node_agent/`) against a real
//! kube-apiserver: its reflectors, its desired state and its sync loop run in-process
//! as ServiceAccount `ringlb-node` under the chart's RBAC
//! (`charts/ringlb/templates/node-rbac.yaml`), over the node datapath's real apply
//! path on in-memory maps (`ringlb_node::maps::Applier<FakeMaps>`: no root, no
//! kernel). Pods get bound, IPs and Ready from the lab kubelet; the Service's
//! EndpointSlices come from the real EndpointSlice controller, named targetPorts
//! resolved per pod by it. The test asserts that the datapath holds exactly
//! node-1's pods' entries, then follows a pod deletion and a targetPort change.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use ringlb_e2e::controlplane::{
    ControlPlane, KubeletOptions, LabNode, Options, kubelet::POD_IPS_ANNOTATION,
};
use ringlb_edge::node_agent::datapath::maps::{Applier, FakeMaps};
use ringlb_edge::node_agent::datapath::{NodeState, Proto, ServiceKey, ServiceTarget};
use ringlb_edge::node_agent::sync::{NodeMetrics, NodeProgram, SyncConfig};
use ringlb_edge::node_agent::{Agent, sync_heartbeat, watch_stores};
use ringlb_ops::Health;
use serde_json::json;
use tokio::sync::Notify;

/// The chart's release namespace in this test (its ServiceAccounts live there).
const RELEASE_NS: &str = "ringlb-system";
const VIP: &str = "192.0.2.10";
const OTHER_VIP: &str = "192.0.2.20";

/// The datapath the agent loop owns, shared so the test can read the maps.
#[derive(Clone)]
struct Shared(Arc<Mutex<Applier<FakeMaps>>>);

impl NodeProgram for Shared {
    fn apply(
        &mut self,
        want: &NodeState,
    ) -> Result<usize, ringlb_edge::node_agent::datapath::Error> {
        self.0.lock().unwrap().apply(want)
    }
}

impl Shared {
    /// What the (fake) kernel maps hold, read back as the loader would after a restart.
    fn maps(&self) -> NodeState {
        use ringlb_edge::node_agent::datapath::maps::NodeMaps;
        self.0.lock().unwrap().maps().read().unwrap()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `(pod, VIP port) -> targetPort` entries of VIP over TCP, each tunnelled to the pod.
/// The edge's address: the only tunnel source the node takes.
const EDGE: &str = "192.168.0.11";

fn state(entries: &[(&str, u16, u16)], pods: &[&str]) -> NodeState {
    let mut s = NodeState {
        pods: pods.iter().map(|p| ip(p)).collect::<BTreeSet<_>>(),
        edges: [ip(EDGE)].into(),
        services: BTreeMap::new(),
    };
    for (pod, port, target) in entries {
        s.services.insert(
            ServiceKey {
                tunnel_dst: ip(pod),
                vip: ip(VIP),
                port: *port,
                proto: Proto::Tcp,
            },
            ServiceTarget {
                pod: ip(pod),
                target_port: *target,
            },
        );
    }
    s
}

/// Waits up to 30 s until the maps hold `want`.
async fn maps_become(dp: &Shared, want: &NodeState, what: &str) {
    let t0 = Instant::now();
    loop {
        let have = dp.maps();
        if &have == want {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: not after 30 s\n want {want:#?}\n have {have:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod of `app=web` on `node` with address `addr`; its container names port
/// `https` `https`.
fn pod(name: &str, node: &str, addr: &str, https: u16) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": "web"},
            "annotations": {POD_IPS_ANNOTATION: addr},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": "registry.invalid/web",
                "ports": [{"name": "https", "containerPort": https}],
            }],
        },
    }))
    .unwrap()
}

/// A LoadBalancer Service selecting `app=web` with a VIP in its status (written as
/// the admin, as the controller would).
async fn create_service(api: &Api<Service>, name: &str, class: Option<&str>, vip: &str) {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": class,
            "selector": {"app": "web"},
            "ipFamilies": ["IPv4"],
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {"name": "https", "port": 443, "protocol": "TCP", "targetPort": "https"},
            ],
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &svc).await.unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"loadBalancer": {"ingress": [{"ip": vip, "ipMode": "VIP"}]}}}),
        ),
    )
    .await
    .unwrap();
}

/// A client as ServiceAccount `ringlb-node` under the chart's RBAC, checked to be
/// refused a list of Secrets.
async fn node_client_under_chart_rbac(cp: &ControlPlane) -> kube::Client {
    let node_client = cp
        .service_account_client(RELEASE_NS, "ringlb-node")
        .await
        .expect("a client as ringlb-node");
    // the node's role only reads Services, EndpointSlices and Pods
    match Api::<Secret>::all(node_client.clone())
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("ringlb-node may list Secrets: {other:?}"),
    }
    node_client
}

/// Services `web` (ours, VIP) and `other` (another provider's, OTHER_VIP) over pods
/// a and c on node-1 and b on node-2; `ringlb-node` may not write Service status.
async fn create_services_and_pods(
    services: &Api<Service>,
    pods: &Api<Pod>,
    node_client: &kube::Client,
) {
    create_service(services, "web", None, VIP).await;
    // the same pods behind another provider's Service: not ours, no entries
    create_service(services, "other", Some("example.com/other"), OTHER_VIP).await;
    for p in [
        pod("a", "node-1", "10.244.0.11", 8443),
        pod("c", "node-1", "10.244.0.13", 9443),
        pod("b", "node-2", "10.244.0.12", 8443),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    match Api::<Service>::namespaced(node_client.clone(), "default")
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": []}}})),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("ringlb-node may write Service status: {other:?}"),
    }
}

#[tokio::test]
async fn the_node_agent_programs_exactly_its_nodes_pods_under_chart_rbac() {
    let cp = ControlPlane::start_with_chart_rbac(Options::default(), RELEASE_NS)
        .await
        .expect("the control plane starts with the chart's RBAC");
    let admin = cp.client().await;
    let node_client = node_client_under_chart_rbac(&cp).await;
    let _kubelet = cp
        .start_kubelet(KubeletOptions {
            nodes: vec![
                LabNode::new("node-1"),
                LabNode::new("node-2"),
                LabNode::new("edge-1")
                    .label("ringlb.io/edge", "true")
                    .address(ip(EDGE))
                    .without_pods(),
            ],
            pod_ips: vec![],
            pod_cidrs: vec!["10.244.0.0/24".parse().unwrap()],
        })
        .await
        .expect("the lab kubelet registers its nodes");

    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    create_services_and_pods(&services, &pods, &node_client).await;

    // the agent, as `ringlb-edge node --node-name node-1` runs it, over fake maps
    let notify = Arc::new(Notify::new());
    let stores = watch_stores(&node_client, "node-1", "ringlb.io/edge=true", &notify)
        .await
        .expect("the node's reflectors list under its RBAC");
    let health = Health::new();
    let agent = Agent {
        stores,
        notify,
        cfg: SyncConfig {
            node_name: "node-1".into(),
            default_class: true,
        },
        health: health.clone(),
        heartbeat: sync_heartbeat(&health),
        metrics: NodeMetrics::register(&mut Registry::default()),
    };
    let dp = Shared(Arc::new(Mutex::new(
        Applier::new(FakeMaps::default()).unwrap(),
    )));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let mut dp = dp.clone();
        async move {
            agent
                .run_until(&mut dp, async {
                    let _ = stop_rx.await;
                })
                .await
        }
    });

    // node-1's two pods, port 80 -> 8080 and the named https port per pod; nothing
    // of node-2's pod b, nothing of the other provider's VIP; tunnels taken from the
    // edge Node's address only (node-1's and node-2's are no edges)
    maps_become(
        &dp,
        &state(
            &[
                ("10.244.0.11", 80, 8080),
                ("10.244.0.11", 443, 8443),
                ("10.244.0.13", 80, 8080),
                ("10.244.0.13", 443, 9443),
            ],
            &["10.244.0.11", "10.244.0.13"],
        ),
        "node-1's pods programmed",
    )
    .await;
    assert!(health.is_ready(), "/readyz after the first apply");
    assert!(health.is_live(), "the sync loop beats");

    follows_a_pod_deletion_and_a_target_port_change(&dp, &pods, &services).await;

    stop_tx.send(()).unwrap();
    task.await.unwrap();
    assert!(!health.is_ready(), "not ready once the loop stopped");
}

/// Pod c's deletion takes its entries and address out of the maps; a targetPort
/// change reaches the entry through the EndpointSlice.
async fn follows_a_pod_deletion_and_a_target_port_change(
    dp: &Shared,
    pods: &Api<Pod>,
    services: &Api<Service>,
) {
    // pod c goes (after its grace period): its entries and its address go
    pods.delete("c", &DeleteParams::default()).await.unwrap();
    maps_become(
        dp,
        &state(
            &[("10.244.0.11", 80, 8080), ("10.244.0.11", 443, 8443)],
            &["10.244.0.11"],
        ),
        "pod c removed",
    )
    .await;

    // targetPort 8080 -> 9090: the EndpointSlice follows, then the entry
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "replace", "path": "/spec/ports/0/targetPort", "value": 9090}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    maps_become(
        dp,
        &state(
            &[("10.244.0.11", 80, 9090), ("10.244.0.11", 443, 8443)],
            &["10.244.0.11"],
        ),
        "targetPort changed",
    )
    .await;
}
