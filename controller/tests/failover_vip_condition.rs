//! The real controller binary against a real kube-apiserver: the
//! `ringlb.io/FailoverActive` condition of a Service with `ringlb.io/failover-vip`
//! follows its EndpointSlice, beside `ringlb.io/BackendsReady`.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const FAILOVER: &str = "ringlb.io/FailoverActive";

/// (status, reason, message) of condition `type_` of Service `web`, if present.
async fn cond(client: &kube::Client, type_: &str) -> Option<(String, String, String)> {
    let svc = get_svc(client, "web").await;
    let c = svc
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

/// Waits until condition `type_` reads `status`/`reason` (`None`: absent).
async fn becomes(client: &kube::Client, type_: &str, want: Option<(&str, &str)>) -> String {
    let what = format!("{type_} = {want:?}");
    wait_for(Duration::from_secs(20), &what, || {
        let client = client.clone();
        async move {
            let got = cond(&client, type_).await;
            let as_str = got.as_ref().map(|(s, r, _)| (s.as_str(), r.as_str()));
            (as_str == want).then(|| got.map(|g| g.2).unwrap_or_default())
        }
    })
    .await
}

fn slice(ready: bool) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-x", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": ready}}]
    }))
    .unwrap()
}

#[tokio::test]
async fn failover_active_follows_the_endpoint_slice_and_leaves_with_the_annotation() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/30").await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    slices
        .create(&PostParams::default(), &slice(true))
        .await
        .expect("create EndpointSlice");
    let ann = json!({"metadata": {"annotations": {
        "ringlb.io/failover-vip": "198.51.100.10",
        "ringlb.io/failover-weight": "1"
    }}});
    create_svc(&client, &lb_service("web", 80, ann)).await;
    wait_ips(&client, "web", Duration::from_secs(20)).await;
    let msg = becomes(&client, FAILOVER, Some(("False", "LocalBackendsReady"))).await;
    assert_eq!(
        msg,
        "every port has ready endpoints; failover VIP 198.51.100.10 takes 1% of new flows"
    );

    // The only endpoint goes unready: True, beside BackendsReady False.
    slices
        .replace("web-x", &PostParams::default(), &{
            let mut s = slice(false);
            s.metadata.resource_version =
                slices.get("web-x").await.unwrap().metadata.resource_version;
            s
        })
        .await
        .expect("update EndpointSlice");
    let msg = becomes(&client, FAILOVER, Some(("True", "NoReadyBackends"))).await;
    assert!(msg.contains("failover VIP 198.51.100.10"), "{msg}");
    becomes(
        &client,
        "ringlb.io/BackendsReady",
        Some(("False", "NoReadyBackends")),
    )
    .await;

    // The annotation removed: the condition goes, the other two stay.
    let services =
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default");
    let patch = json!({"metadata": {"annotations": {"ringlb.io/failover-vip": null}}});
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("remove the annotation");
    becomes(&client, FAILOVER, None).await;
    assert!(cond(&client, "ringlb.io/BackendsReady").await.is_some());
    assert!(cond(&client, CONDITION).await.is_some());
}
