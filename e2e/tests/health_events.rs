//! The edge's health Events against a real kube-apiserver: a VIP:port that goes
//! unhealthy on an edge leaves a Warning `VIPUnhealthy` Event on its Service, and one
//! that recovers a Normal `VIPHealthy`, written as ServiceAccount `ringlb-edge` under
//! the chart's RBAC (`charts/ringlb/templates/edge-rbac.yaml`); and the edge's Lease,
//! which acknowledges the Services it has acted on, written and deleted under the
//! same RBAC.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector;
use kube::runtime::watcher;
use ringlb_datapath::{Proto, Vip};
use ringlb_e2e::controlplane::{ControlPlane, Options};
use ringlb_edge::agent::health_events::HealthEvents;
use ringlb_edge::serving::Skipped;
use ringlb_edge::vip_health::hysteresis::Transition;
use ringlb_edge::vip_health::{Changed, FailoverChanged};
use serde_json::json;

const RELEASE_NS: &str = "ringlb-system";

fn changed(transition: Transition) -> Changed {
    Changed {
        vip: Vip {
            addr: "192.0.2.10".parse().unwrap(),
            port: 80,
            proto: Proto::Tcp,
        },
        service: "default/web".into(),
        transition,
        ready: 1,
        min_ready: 2,
    }
}

#[tokio::test]
async fn health_changes_are_events_on_the_service_under_the_edge_role() {
    let cp = ControlPlane::start_with_chart_rbac(Options::default(), RELEASE_NS)
        .await
        .expect("the control plane starts with the chart's RBAC");
    let admin = cp.client().await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
    }))
    .unwrap();
    let services = Api::<Service>::namespaced(admin.clone(), "default");
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();

    let edge = cp
        .service_account_client(RELEASE_NS, "ringlb-edge")
        .await
        .unwrap();
    let (store, mut writer) = reflector::store::<Service>();
    writer.apply_watcher_event(&watcher::Event::Apply(svc));
    let events = HealthEvents::new(edge.clone(), "edge-1".into());
    events.publish(
        &store,
        &[
            changed(Transition::Healthy),
            changed(Transition::Unhealthy),
            changed(Transition::Recovered),
        ],
    );
    // Cross-region failover: one Event per change.
    let failover = |active| FailoverChanged {
        vip: changed(Transition::Healthy).vip,
        service: "default/web".into(),
        remote: "198.51.100.7".parse().unwrap(),
        active,
    };
    events.publish_failovers(&store, &[failover(true), failover(false)]);
    // A bad annotation: once, however many syncs report it.
    let bad = Skipped {
        service: "default/web".into(),
        reason: "annotation ringlb.io/failover-vip=\"x\": not an address; ignored".into(),
    };
    for _ in 0..3 {
        events.publish_bad_annotations(&store, std::slice::from_ref(&bad));
    }

    let api = Api::<Event>::namespaced(admin.clone(), "default");
    let mut seen = Vec::new();
    for _ in 0..120 {
        let list = api.list(&ListParams::default()).await.unwrap();
        seen = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
            // kube-apiserver's ClusterIP repair loop may warn about the same
            // Service on a fresh apiserver (`ClusterIPNotAllocated`); only the
            // edge's Events count here.
            .filter(|e| e.reporting_controller.as_deref() == Some("ringlb-edge"))
            .map(|e| {
                (
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default(),
                    e.reporting_instance.clone().unwrap_or_default(),
                )
            })
            .collect();
        if seen.len() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A moment more: a duplicate would show up now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    seen.sort();
    let reasons: Vec<(&str, &str)> = seen.iter().map(|e| (e.0.as_str(), e.1.as_str())).collect();
    assert_eq!(
        reasons,
        [
            ("Normal", "FailoverEnded"),
            ("Normal", "VIPHealthy"),
            ("Warning", "BadAnnotation"),
            ("Warning", "FailoverActive"),
            ("Warning", "VIPUnhealthy"),
        ],
        "one Event per change but the first-time healthy: {seen:?}"
    );
    assert!(
        seen[4].2.starts_with(
            "edge edge-1: VIP 192.0.2.10:80/TCP unhealthy (1 ready backends, 2 required)"
        ),
        "{seen:?}"
    );
    assert_eq!(
        seen[3].2,
        "edge edge-1: VIP 192.0.2.10:80/TCP has no ready pods; new flows go to remote VIP \
         198.51.100.7"
    );
    assert!(
        seen[2]
            .2
            .starts_with("edge edge-1: annotation ringlb.io/failover-vip"),
        "{seen:?}"
    );
    assert_eq!(
        seen[4].3, "edge-1",
        "the reporting instance is the edge's node"
    );

    the_edge_lease_acknowledges_then_goes_with_a_drain(&admin, &edge).await;
}

async fn the_edge_lease_acknowledges_then_goes_with_a_drain(
    admin: &kube::Client,
    edge: &kube::Client,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    use ringlb_crds::edge_ack::EdgeAck;
    use ringlb_edge::agent::ack::Acks;

    let leases = Api::<Lease>::namespaced(admin.clone(), RELEASE_NS);
    let ack_of = || async {
        leases
            .get_opt("ringlb-edge-edge-1")
            .await
            .unwrap()
            .and_then(|l| EdgeAck::from_lease(&l))
    };
    let (tx, rx) = tokio::sync::watch::channel(Some(41));
    let task = tokio::spawn(Acks::new(edge, RELEASE_NS, "edge-1").run(rx));
    let mut seen = None;
    for want in [41, 42] {
        tx.send(Some(want)).unwrap();
        for _ in 0..40 {
            seen = ack_of().await;
            if seen.as_ref().is_some_and(|a| a.applied == Some(want)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ack = seen
            .clone()
            .unwrap_or_else(|| panic!("no edge Lease for {want}"));
        assert_eq!(ack.applied, Some(want), "{ack:?}");
        assert_eq!(ack.node, "edge-1");
        assert!(ack.alive(k8s_openapi::jiff::Timestamp::now()), "{ack:?}");
    }
    drop(tx);
    task.await.unwrap();
    Acks::new(edge, RELEASE_NS, "edge-1").remove().await;
    assert_eq!(ack_of().await, None, "a drained edge's Lease is deleted");
}
