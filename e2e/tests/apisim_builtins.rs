//! The simulator's built-in controllers (EndpointSlices, Deployments, kubelet, GC),
//! CRDs created through the API, and robustness against bad HTTP input.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use ringlb_e2e::{SimHandle, SimOptions, Simulator};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Polls `f` until it returns `Some` or 5 s pass.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (address, ready, serving, terminating) of every endpoint of a Service's slices.
async fn endpoints(
    slices: &Api<EndpointSlice>,
    svc: &str,
) -> Vec<(String, bool, bool, bool, Vec<i32>)> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let mut out = Vec::new();
    for s in slices.list(&lp).await.unwrap().items {
        let ports: Vec<i32> = s
            .ports
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.port)
            .collect();
        for e in s.endpoints {
            let c = e.conditions.unwrap_or_default();
            out.push((
                e.addresses[0].clone(),
                c.ready.unwrap_or(false),
                c.serving.unwrap_or(false),
                c.terminating.unwrap_or(false),
                ports.clone(),
            ));
        }
    }
    out.sort();
    out
}

fn pod(name: &str, ip: &str, ready: bool) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "web"},
            "annotations": {"apisim.ringlb.io/pod-ips": ip, "apisim.ringlb.io/ready": ready.to_string()}},
        "spec": {"containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": 8080}]}]}}))
    .unwrap()
}

#[tokio::test]
async fn endpoint_slices_follow_pods_and_readiness() {
    let sim = Simulator::start(SimOptions::default()).await.unwrap();
    let client = sim.client().await;
    let (pods, svcs, slices): (Api<Pod>, Api<Service>, Api<EndpointSlice>) = (
        Api::default_namespaced(client.clone()),
        Api::default_namespaced(client.clone()),
        Api::default_namespaced(client),
    );
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer",
        "selector": {"app": "web"}, "ports": [{"name": "h", "port": 80, "targetPort": "http"}]}}),
    )
    .unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    // the pod IPs come from the annotation (lab host IPs in the e2e lab)
    pods.create(&PostParams::default(), &pod("a", "198.51.100.1", true))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", "198.51.100.2", false))
        .await
        .unwrap();
    let want = vec![
        ("198.51.100.1".to_string(), true, true, false, vec![8080]),
        ("198.51.100.2".to_string(), false, false, false, vec![8080]),
    ];
    eventually("two endpoints, named port resolved", || async {
        let e = endpoints(&slices, "web").await;
        (e == want).then_some(())
    })
    .await;

    // b becomes Ready through its status (what a kubelet would write).
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("b", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();
    eventually("b ready", || async {
        let e = endpoints(&slices, "web").await;
        (e.len() == 2 && e.iter().all(|x| x.1)).then_some(())
    })
    .await;

    // a terminating pod (held by a finalizer) is serving but not ready.
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["test/hold"]}})),
    )
    .await
    .unwrap();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("a terminating", || async {
        let e = endpoints(&slices, "web").await;
        e.iter()
            .any(|x| x.0 == "198.51.100.1" && !x.1 && x.2 && x.3)
            .then_some(())
    })
    .await;
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("a gone", || async {
        let e = endpoints(&slices, "web").await;
        (e.len() == 1 && e[0].0 == "198.51.100.2").then_some(())
    })
    .await;

    // The slice carries the labels and owner edges use, and goes with the Service.
    let s = &slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap()
        .items[0];
    assert_eq!(s.address_type, "IPv4");
    assert_eq!(
        s.metadata.owner_references.as_ref().unwrap()[0].kind,
        "Service"
    );
    svcs.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("slices garbage-collected", || async {
        endpoints(&slices, "web").await.is_empty().then_some(())
    })
    .await;
    sim.shutdown().await;
}

#[tokio::test]
async fn deployment_makes_ready_pods_with_configured_ips() {
    let opts = SimOptions {
        pod_ips: vec!["10.99.0.7".parse().unwrap(), "10.99.0.8".parse().unwrap()],
        ..SimOptions::default()
    };
    let sim = Simulator::start(opts).await.unwrap();
    let client = sim.client().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
    .unwrap();
    deps.create(&PostParams::default(), &d).await.unwrap();
    let mut ips = eventually("two running pods", || async {
        let l = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        let ips: Vec<String> = l
            .items
            .iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .collect();
        (ips.len() == 2).then_some(ips)
    })
    .await;
    ips.sort();
    assert_eq!(
        ips,
        ["10.99.0.7", "10.99.0.8"],
        "pods get the configured IPs first"
    );
    // A malformed Deployment (no Deployment validation in the simulator) must not
    // take the built-in controllers down: the scaling and GC below still work.
    let raw: Api<DynamicObject> = Api::default_namespaced_with(
        deps.clone().into_client(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        ),
    );
    let bad: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "bad"}, "spec": {"template": "x", "selector": 5, "replicas": 1}}))
        .unwrap();
    raw.create(&PostParams::default(), &bad).await.unwrap();
    eventually("deployment status", || async {
        let s = deps.get("web").await.unwrap().status?;
        (s.ready_replicas == Some(2)).then_some(())
    })
    .await;
    // scale down through the scale subresource, then delete: pods go away (GC).
    deps.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    eventually("one pod", || async {
        (pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .len()
            == 1)
            .then_some(())
    })
    .await;
    deps.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("no pods", || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    sim.shutdown().await;
}

#[tokio::test]
async fn crds_created_through_the_api_are_served() {
    let sim = Simulator::start(SimOptions {
        install_crds: false,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let client = sim.client().await;
    let gvk = GroupVersionKind::gvk("example.io", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &ar);
    assert!(
        widgets.list(&ListParams::default()).await.is_err(),
        "not served before the CRD exists"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({"metadata": {"name": "widgets.example.io"},
        "spec": {"group": "example.io", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}))
    .unwrap();
    let created = crds.create(&PostParams::default(), &crd).await.unwrap();
    let established = created
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);
    let w: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "example.io/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}, "status": {"ignored": true}}))
        .unwrap();
    let got = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert!(
        got.data.get("status").is_none(),
        "status is dropped on create when the CRD has a status subresource"
    );
    widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ok": true}})),
        )
        .await
        .unwrap();
    assert_eq!(widgets.get("w1").await.unwrap().data["status"]["ok"], true);
    crds.delete("widgets.example.io", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        widgets.list(&ListParams::default()).await.is_err(),
        "not served after the CRD is deleted"
    );
    // Our own CRDs are pre-installed by default.
    let sim2 = Simulator::start(SimOptions::default()).await.unwrap();
    let crds2: Api<CustomResourceDefinition> = Api::all(sim2.client().await);
    let names: Vec<String> = crds2
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(
        names.contains(&"ippools.ringlb.io".to_string()),
        "{names:?}"
    );
    sim2.shutdown().await;
    sim.shutdown().await;
}

/// Sends one raw HTTP/1.1 request and returns (status code, body).
async fn raw(sim: &SimHandle, method: &str, path: &str, ctype: &str, body: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[tokio::test]
async fn bad_input_gets_status_errors_and_the_server_survives() {
    let sim = Simulator::start(SimOptions::default()).await.unwrap();
    let svcs = "/api/v1/namespaces/default/services";
    let cases: Vec<(&str, String, &str, Vec<u8>, u16)> = vec![
        (
            "POST",
            svcs.into(),
            "application/json",
            b"{not json".to_vec(),
            400,
        ),
        (
            "POST",
            svcs.into(),
            "application/json",
            b"[1,2]".to_vec(),
            400,
        ),
        (
            "POST",
            svcs.into(),
            "application/json",
            br#"{"metadata":{"name":"Bad_Name"},"spec":{"ports":[{"port":1}]}}"#.to_vec(),
            422,
        ),
        (
            "POST",
            svcs.into(),
            "application/json",
            br#"{"metadata":{"name":"x"},"spec":{"ports":[{"port":70000}]}}"#.to_vec(),
            422,
        ),
        (
            "POST",
            svcs.into(),
            "application/json",
            br#"{"kind":"Pod","metadata":{"name":"x"}}"#.to_vec(),
            400,
        ),
        (
            "POST",
            svcs.into(),
            "application/json",
            br#"{"metadata":{"name":"x","resourceVersion":"5"},"spec":{"ports":[{"port":1}]}}"#
                .to_vec(),
            500,
        ),
        (
            "POST",
            svcs.into(),
            "application/vnd.kubernetes.protobuf",
            b"k8s\x00\x0a\xff".to_vec(),
            415,
        ),
        (
            "PATCH",
            format!("{svcs}/kubernetes"),
            "text/plain",
            b"{}".to_vec(),
            415,
        ),
        (
            "PATCH",
            format!("{svcs}/kubernetes"),
            "application/json-patch+json",
            b"{\"op\":1}".to_vec(),
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/nothings".into(),
            "application/json",
            vec![],
            404,
        ),
        (
            "GET",
            "/apis/nope/v1".into(),
            "application/json",
            vec![],
            404,
        ),
        (
            "GET",
            format!("{svcs}?labelSelector=a%20in%20b"),
            "application/json",
            vec![],
            400,
        ),
        (
            "GET",
            format!("{svcs}?watch=1&resourceVersion=abc"),
            "application/json",
            vec![],
            400,
        ),
        (
            "GET",
            format!("{svcs}?limit=-1"),
            "application/json",
            vec![],
            400,
        ),
        (
            "GET",
            format!("{svcs}?continue=garbage"),
            "application/json",
            vec![],
            400,
        ),
        (
            "DELETE",
            format!("{svcs}/kubernetes"),
            "application/json",
            b"{bad".to_vec(),
            400,
        ),
        (
            "PUT",
            format!("{svcs}/missing"),
            "application/json",
            br#"{"metadata":{"name":"missing"}}"#.to_vec(),
            404,
        ),
        (
            "PUT",
            format!("{svcs}/kubernetes/status"),
            "application/json",
            br#"{"metadata":{"name":"other"}}"#.to_vec(),
            400,
        ),
    ];
    for (method, path, ctype, body, want) in cases {
        let (code, text) = raw(&sim, method, &path, ctype, &body).await;
        assert_eq!(code, want, "{method} {path}: {text}");
        assert!(
            text.contains("\"kind\":\"Status\""),
            "{method} {path} answers a Status: {text}"
        );
    }
    let (code, _) = raw(&sim, "GET", "/version", "application/json", &[]).await;
    assert_eq!(code, 200, "still serving");
    sim.shutdown().await;
}

#[tokio::test]
async fn custom_resources_are_pruned_defaulted_and_validated() {
    let sim = Simulator::start(SimOptions::default()).await.unwrap();
    let gvk = GroupVersionKind::gvk("ringlb.io", "v1alpha1", "IPPool");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "ippools");
    let pools: Api<DynamicObject> = Api::all_with(sim.client().await, &ar);
    let pool = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "IPPool", "metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let got = pools
        .create(
            &PostParams::default(),
            &pool("ok", json!({"cidrs": ["192.0.2.0/24"], "bogusField": 1})),
        )
        .await
        .unwrap();
    assert_eq!(
        got.data["spec"]["autoAssign"], true,
        "schema default filled in"
    );
    assert!(
        got.data["spec"].get("bogusField").is_none(),
        "unknown field pruned"
    );
    let err = pools
        .create(
            &PostParams::default(),
            &pool("bad", json!({"cidrs": ["not-a-cidr"]})),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
            assert!(
                s.message.contains("IPPool.ringlb.io \"bad\" is invalid"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    // updates are validated too
    let bad = json!({"spec": {"cidrs": ["300.0.0.0/8"]}});
    assert!(
        pools
            .patch("ok", &PatchParams::default(), &Patch::Merge(bad))
            .await
            .is_err()
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn graceful_pod_deletion_keeps_serving_terminating_endpoints() {
    let opts = SimOptions {
        pod_termination_grace: Duration::from_millis(800),
        ..SimOptions::default()
    };
    let sim = Simulator::start(opts).await.unwrap();
    let client = sim.client().await;
    let (pods, svcs, slices): (Api<Pod>, Api<Service>, Api<EndpointSlice>) = (
        Api::default_namespaced(client.clone()),
        Api::default_namespaced(client.clone()),
        Api::default_namespaced(client),
    );
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))
    .unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    pods.create(&PostParams::default(), &pod("a", "198.51.100.1", true))
        .await
        .unwrap();
    eventually("a ready", || async {
        endpoints(&slices, "web")
            .await
            .first()
            .is_some_and(|e| e.1)
            .then_some(())
    })
    .await;
    let t = std::time::Instant::now();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    // still there, terminating: serving but not ready
    let p = pods.get("a").await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());
    eventually("a terminating", || async {
        let e = endpoints(&slices, "web").await;
        (e.len() == 1 && !e[0].1 && e[0].2 && e[0].3).then_some(())
    })
    .await;
    eventually("a removed by the kubelet", || async {
        pods.get_opt("a").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "removed after the grace period, not before ({:?})",
        t.elapsed()
    );
    // gracePeriodSeconds=0 deletes at once
    pods.create(&PostParams::default(), &pod("b", "198.51.100.2", true))
        .await
        .unwrap();
    pods.delete("b", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("b").await.unwrap().is_none());
    sim.shutdown().await;
}
