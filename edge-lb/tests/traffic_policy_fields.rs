//! `externalTrafficPolicy`, `healthCheckNodePort` and `allocateLoadBalancerNodePorts`
//! change nothing in what an edge serves: the edges forward to pod IPs (IPIP, direct
//! server return) and never to a NodePort, so a Service with `Local`, a health-check
//! port and no NodePorts has the same backends, Maglev tables and datapath entries as
//! the same Service with `Cluster` and NodePorts (docs/controller.md,
//! "externalTrafficPolicy and NodePorts"). Pure: no server, no root.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_edge::serving::{self, Serving};
use ringlb_edge::tables::{Tables, datapath_state};
use serde_json::{Value, json};

/// A dual-stack ringlb Service `web` with two ports and a VIP per family; `spec` is
/// merged over the common part.
fn service(spec: Value) -> Service {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "default",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "type": "LoadBalancer",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}
            ]
        },
        "status": {"loadBalancer": {"ingress": [
            {"ip": "192.0.2.10", "ipMode": "VIP"},
            {"ip": "2001:db8::10", "ipMode": "VIP"}
        ]}}
    });
    for (k, val) in spec.as_object().expect("spec is an object") {
        if k == "ports" {
            v["spec"]["ports"] = val.clone();
        } else {
            v["spec"][k] = val.clone();
        }
    }
    serde_json::from_value(v).expect("a valid Service")
}

fn slice(name: &str, family: &str, ips: &[&str]) -> EndpointSlice {
    let eps: Vec<Value> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": format!("w{i}")}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": family,
        "ports": [
            {"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "dns", "port": 5353, "protocol": "UDP"}
        ],
        "endpoints": eps
    }))
    .expect("a valid EndpointSlice")
}

fn slices() -> Vec<EndpointSlice> {
    vec![
        slice("web-v4", "IPv4", &["10.0.0.1", "10.0.1.1", "10.0.2.1"]),
        slice("web-v6", "IPv6", &["fd00::1", "fd00::2"]),
    ]
}

/// What the edge serves for `svc`, and the datapath state built from it.
fn desired(svc: Service) -> (Serving, ringlb_datapath::DesiredState) {
    let serving = serving::build(&[svc], &slices(), true);
    let (state, problems) = datapath_state(&serving, 65_537, &mut Tables::default());
    assert!(problems.is_empty(), "no problems: {problems:?}");
    (serving, state)
}

/// The baseline: `Cluster`, NodePorts allocated (what kube-apiserver writes by default).
fn baseline() -> Service {
    service(json!({
        "externalTrafficPolicy": "Cluster",
        "allocateLoadBalancerNodePorts": true,
        "ports": [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30053}
        ]
    }))
}

#[test]
fn local_policy_without_node_ports_serves_the_same_as_cluster_with_them() {
    let (serving, state) = desired(baseline());
    // The baseline is not empty: four VIP:ports, each with its pods as backends.
    assert_eq!(serving.vips.len(), 4, "{serving:?}");
    assert_eq!(state.services.len(), 4);
    assert!(serving.vips.values().all(|b| !b.ready.is_empty()));
    assert!(serving.skipped.is_empty() && serving.bad_annotations.is_empty());

    let variants = [
        (
            "Local, no NodePorts, no health-check port",
            json!({"externalTrafficPolicy": "Local", "allocateLoadBalancerNodePorts": false}),
        ),
        (
            "Local with NodePorts and a healthCheckNodePort",
            json!({
                "externalTrafficPolicy": "Local",
                "healthCheckNodePort": 32000,
                "ports": [
                    {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080},
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30053}
                ]
            }),
        ),
        (
            "Cluster without NodePorts",
            json!({"externalTrafficPolicy": "Cluster", "allocateLoadBalancerNodePorts": false}),
        ),
        (
            "Local, different NodePorts, internalTrafficPolicy Local",
            json!({
                "externalTrafficPolicy": "Local",
                "internalTrafficPolicy": "Local",
                "healthCheckNodePort": 31999,
                "ports": [
                    {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31080},
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 31053}
                ]
            }),
        ),
    ];
    for (what, spec) in variants {
        let (s, d) = desired(service(spec));
        assert_eq!(s, serving, "{what}: the same backends per VIP:port");
        assert_eq!(d, state, "{what}: the same datapath state");
    }
}

#[test]
fn backends_on_every_node_stay_with_local_policy() {
    // With `Local`, kube-proxy would drop traffic on nodes without a local endpoint;
    // ringlb's edges are not those nodes and send to every ready pod, wherever it runs.
    let svc =
        service(json!({"externalTrafficPolicy": "Local", "allocateLoadBalancerNodePorts": false}));
    let (serving, _) = desired(svc);
    let v4: Vec<String> = serving
        .vips
        .iter()
        .find(|(vip, _)| vip.addr.is_ipv4() && vip.port == 80)
        .map(|(_, b)| b.ready.iter().map(|b| b.addr.to_string()).collect())
        .expect("the v4 VIP's port 80");
    assert_eq!(v4, ["10.0.0.1", "10.0.1.1", "10.0.2.1"]);
}
