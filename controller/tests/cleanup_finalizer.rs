//! The cleanup finalizer `service.kubernetes.io/load-balancer-cleanup` against a real
//! kube-apiserver, with the controller running as the chart's ServiceAccount: added
//! with the VIP; on delete or a change of type the VIP leaves the status first, the
//! address stays held until every live edge's Lease acknowledges that status (the
//! edges withdraw it), then it is released and the finalizer removed; a Service deleted while the controller was
//! down is cleaned up once it is back; `remove-finalizers` (helm uninstall) removes
//! the finalizer once no controller leads. No root needed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use ringlb_controller::cleanup::FINALIZER;
use serde_json::json;

/// Without a live edge Lease nothing is waited for; these tests allow this long.
const RELEASE: Duration = Duration::from_secs(10);

fn has_finalizer(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

async fn get_opt(client: &kube::Client, name: &str) -> Option<Service> {
    Api::<Service>::namespaced(client.clone(), "default")
        .get_opt(name)
        .await
        .expect("get Service")
}

/// Waits until `name` is gone from the API; returns when that was seen.
async fn wait_gone(client: &kube::Client, name: &str, timeout: Duration) -> Instant {
    wait_for(timeout, &format!("Service {name} gone"), || async {
        get_opt(client, name).await.is_none().then(Instant::now)
    })
    .await
}

/// A Service asking for `ip` (no sharing key).
fn wanting(name: &str, ip: &str) -> Service {
    lb_service(
        name,
        80,
        json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": ip}}}),
    )
}

/// The finalizer comes with the VIP, on a Service without NodePorts and with
/// `externalTrafficPolicy: Local` too (neither matters to ringlb). Deleted, its VIP
/// leaves the status at once, the address stays taken (another Service asking for
/// it is refused) while a live edge has not acknowledged the cleared status in its
/// Lease, and once it has, the address is released, the finalizer removed and the
/// object gone, well before the longest wait.
#[tokio::test]
async fn finalizer_added_with_the_vip_and_removed_after_release() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/24").await;
    edge_lease(&client, "edge-1", None).await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    let spec = json!({
        "metadata": {"annotations": {"ringlb.io/load-balancer-ips": "192.0.2.50"}},
        "spec": {"allocateLoadBalancerNodePorts": false, "externalTrafficPolicy": "Local"}
    });
    create_svc(&client, &lb_service("web", 80, spec)).await;
    let ips = wait_ips(&client, "web", Duration::from_secs(20)).await;
    assert_eq!(ips, ["192.0.2.50".parse::<std::net::IpAddr>().unwrap()]);
    let web = get_svc(&client, "web").await;
    assert!(has_finalizer(&web), "{:?}", web.metadata.finalizers);
    let ports = web.spec.unwrap().ports.unwrap();
    assert_eq!(ports[0].node_port, None, "no NodePort was allocated");

    delete_svc(&client, "web").await;
    let withdrawn = wait_for(
        Duration::from_secs(10),
        "the VIP out of web's status",
        || async {
            let s = get_opt(&client, "web").await?;
            (s.metadata.deletion_timestamp.is_some() && ingress_ips(&s).is_empty()).then_some(s)
        },
    )
    .await;
    // Still held while the edge has not acknowledged it.
    create_svc(&client, &wanting("next", "192.0.2.50")).await;
    wait_warning(&client, "next", "IPInUse", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get_opt(&client, "web").await.is_some(),
        "the finalizer stays while the edge has not acknowledged"
    );
    // The edge acknowledges an older state, then the cleared status.
    let rv = withdrawn.resource_version().unwrap();
    let older = (rv.parse::<u64>().unwrap() - 1).to_string();
    edge_lease(&client, "edge-1", Some(&older)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(get_opt(&client, "web").await.is_some(), "{older} < {rv}");
    let acked = Instant::now();
    edge_lease(&client, "edge-1", Some(&rv)).await;
    let gone = wait_gone(&client, "web", Duration::from_secs(10)).await;
    assert!(
        gone - acked < Duration::from_secs(3),
        "released on the acknowledgement, not after the longest wait: {:?}",
        gone - acked
    );
    assert_eq!(
        wait_ips(&client, "next", Duration::from_secs(10)).await,
        ips,
        "the released address moves on"
    );
}

/// Deleted while no controller runs, the Service stays (the finalizer) with its VIP;
/// the controller, once started, withdraws, releases and lets it go.
#[tokio::test]
async fn a_service_deleted_while_the_controller_was_stopped_is_cleaned_up_on_start() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/24").await;
    let mut ctrl = Ctrl::start(&cluster, "c1", &[]);
    create_svc(&client, &wanting("web", "192.0.2.60")).await;
    let ips = wait_ips(&client, "web", Duration::from_secs(20)).await;
    assert!(has_finalizer(&get_svc(&client, "web").await));
    ctrl.kill();

    delete_svc(&client, "web").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = get_opt(&client, "web")
        .await
        .expect("kept by the finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(ingress_ips(&held), ips, "nobody withdrew it yet");

    let _ctrl = Ctrl::start(&cluster, "c2", &[]);
    wait_gone(&client, "web", RELEASE + Duration::from_secs(10)).await;
    create_svc(&client, &wanting("next", "192.0.2.60")).await;
    assert_eq!(
        wait_ips(&client, "next", Duration::from_secs(10)).await,
        ips
    );
}

/// `type: LoadBalancer` -> `ClusterIP`: the VIP leaves the status, and after the
/// cleanup wait the address is released (Event) and the finalizer removed.
#[tokio::test]
async fn a_type_change_to_cluster_ip_removes_the_vip_and_the_finalizer() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/24").await;
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    create_svc(&client, &wanting("web", "192.0.2.70")).await;
    let ips = wait_ips(&client, "web", Duration::from_secs(20)).await;
    assert!(has_finalizer(&get_svc(&client, "web").await));

    let api = Api::<Service>::namespaced(client.clone(), "default");
    let to_cluster_ip = json!({"spec": {"type": "ClusterIP"}});
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&to_cluster_ip),
    )
    .await
    .expect("change the type");
    let svc = wait_for(RELEASE, "no VIP and no finalizer", || async {
        let s = get_svc(&client, "web").await;
        (ingress_ips(&s).is_empty() && !has_finalizer(&s) && condition(&s).is_none()).then_some(s)
    })
    .await;
    assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
    create_svc(&client, &wanting("next", "192.0.2.70")).await;
    assert_eq!(
        wait_ips(&client, "next", Duration::from_secs(10)).await,
        ips
    );
}

fn remove_finalizers(cluster: &Cluster, timeout: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringlb-controller"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["--lease-namespace", RELEASE_NS])
        .args(["remove-finalizers", "--timeout", timeout])
        .output()
        .expect("run ringlb-controller remove-finalizers")
}

/// The uninstall path: `remove-finalizers`, as the chart's ServiceAccount, refuses
/// while a controller leads (it would put the finalizer back), and once the controller
/// is gone removes the finalizer from every Service, keeping the status (a later
/// installation adopts the same address), and deletes the edges' Leases; a delete
/// then goes through at once.
#[tokio::test]
async fn remove_finalizers_waits_for_the_leader_then_leaves_nothing_stuck() {
    let (cluster, client) = cluster_with_pool("192.0.2.0/24").await;
    let mut ctrl = Ctrl::start(&cluster, "c1", &[]);
    for n in ["a", "b"] {
        create_svc(&client, &lb_service(n, 80, json!({}))).await;
        wait_ips(&client, n, Duration::from_secs(20)).await;
        assert!(has_finalizer(&get_svc(&client, n).await));
    }

    let out = remove_finalizers(&cluster, "3s");
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "refused while c1 leads: {err}");
    assert!(err.contains("still held by c1"), "{err}");
    assert!(has_finalizer(&get_svc(&client, "a").await));

    ctrl.kill(); // its Lease expires (2 s in these tests)
    edge_lease(&client, "edge-1", Some("1")).await;
    grant_edge_lease_deletion(&client).await;
    let out = remove_finalizers(&cluster, "20s");
    let log =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}");
    for n in ["a", "b"] {
        let s = get_svc(&client, n).await;
        assert!(!has_finalizer(&s), "{n}: {:?}", s.metadata.finalizers);
        assert!(!ingress_ips(&s).is_empty(), "{n} keeps its status");
    }
    let leases = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        client.clone(),
        RELEASE_NS,
    );
    assert!(
        leases
            .get_opt("ringlb-edge-edge-1")
            .await
            .unwrap()
            .is_none(),
        "the edge Lease is deleted: {log}"
    );
    delete_svc(&client, "a").await;
    wait_gone(&client, "a", Duration::from_secs(5)).await;
}

/// The one rule the uninstall hook's Role adds for deleting the edges' Leases
/// (`charts/ringlb/templates/controller-cleanup-hook.yaml`), granted to the
/// controller's ServiceAccount this test runs `remove-finalizers` as.
async fn grant_edge_lease_deletion(client: &kube::Client) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::PostParams;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "edge-lease-cleanup", "namespace": RELEASE_NS},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "verbs": ["deletecollection"]}]
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "edge-lease-cleanup", "namespace": RELEASE_NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "edge-lease-cleanup"},
        "subjects": [{"kind": "ServiceAccount", "name": "ringlb-controller",
                      "namespace": RELEASE_NS}]
    }))
    .unwrap();
    let pp = PostParams::default();
    Api::<Role>::namespaced(client.clone(), RELEASE_NS)
        .create(&pp, &role)
        .await
        .expect("the hook's Lease rule");
    Api::<RoleBinding>::namespaced(client.clone(), RELEASE_NS)
        .create(&pp, &binding)
        .await
        .expect("its binding");
}
