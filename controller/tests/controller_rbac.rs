//! The chart's RBAC for the controller grants every request the controller makes,
//! and nothing it never makes. The requests are read from kube-apiserver's audit log
//! (the authorizer's own view: group, resource/subresource, verb) while the
//! controller, running as the chart's ServiceAccount, goes through start-up,
//! allocation, refusal, release, pool status and leader election.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::json;

/// (apiGroup, resource incl. subresource, verb).
type Access = (String, String, String);

/// Every (group, resource, verb) the chart grants, ignoring resourceNames.
fn granted() -> BTreeSet<Access> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/ringlb/templates/controller-rbac.yaml"
    );
    let text = std::fs::read_to_string(path)
        .expect("read controller-rbac.yaml")
        .replace("{{ .Release.Namespace }}", "ringlb-system");
    let mut out = BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).expect("valid YAML");
        for rule in v["rules"].as_array().into_iter().flatten() {
            for g in rule["apiGroups"].as_array().unwrap() {
                for r in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        out.insert((
                            g.as_str().unwrap().into(),
                            r.as_str().unwrap().into(),
                            verb.as_str().unwrap().into(),
                        ));
                    }
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn chart_rbac_is_exactly_what_the_controller_uses() {
    let cluster = cluster_with(ringlb_controlplane::Options {
        controller_manager: false,
        audit: true,
        ..Default::default()
    })
    .await;
    let client = cluster.client().await;
    create_pool(&client, "main", &["192.0.2.0/31"], |_| {}).await;
    let mut ctrl = Ctrl::start(&cluster, "rbac", &[]);
    for n in ["a", "b"] {
        create_svc(&client, &lb_service(n, 80, json!({}))).await;
    }
    wait_ips(&client, "b", Duration::from_secs(20)).await;
    create_svc(&client, &lb_service("c", 80, json!({}))).await; // pool exhausted: Event
    wait_for(Duration::from_secs(5), "refusal Event", || {
        let client = client.clone();
        async move { (!warnings(&client, "c").await.is_empty()).then_some(()) }
    })
    .await;
    // The same refusal again later (after a different one) is folded into the first
    // Event's series: that is the Events `patch`.
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    let set = |v: serde_json::Value| json!({"metadata": {"annotations": {"ringlb.io/load-balancer-ips": v}}});
    let pp = kube::api::PatchParams::default();
    api.patch("c", &pp, &kube::api::Patch::Merge(set(json!("bogus"))))
        .await
        .unwrap();
    wait_reason(&client, "c", "MalformedAnnotation", Duration::from_secs(5)).await;
    api.patch("c", &pp, &kube::api::Patch::Merge(set(json!(null))))
        .await
        .unwrap();
    wait_reason(&client, "c", "PoolExhausted", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    delete_svc(&client, "a").await; // release (after the cleanup wait) -> c allocated
    wait_ips(
        &client,
        "c",
        ringlb_controller::cleanup::CLEANUP_MAX_WAIT + Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // pool status write, lease renewals
    ctrl.terminate().await; // lease release

    let used = cluster
        .cp
        .audited_access(&format!(
            "system:serviceaccount:{RELEASE_NS}:ringlb-controller"
        ))
        .expect("the audit log");
    assert!(used.len() > 5, "too few requests audited: {used:?}");
    let granted = granted();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        missing.is_empty(),
        "the controller makes requests the chart does not grant: {missing:?}"
    );
    assert!(
        unused.is_empty(),
        "the chart grants verbs the controller never used: {unused:?}"
    );
}

/// The chart's RBAC is not only sufficient but needed: with `patch` on
/// `services/status` taken out, the controller cannot publish a VIP, the Service
/// gets none, and the controller's log names the refusal (403 Forbidden from the
/// API server's RBAC authorizer).
#[tokio::test]
async fn a_verb_taken_out_of_the_chart_breaks_the_controller() {
    let cluster = cluster().await;
    let client = cluster.client().await;
    // Re-apply the ClusterRole without services/status (server-side apply replaces
    // the rules list it owns).
    let rbac = ringlb_controlplane::chart_rbac_templates()
        .expect("the chart's RBAC templates")
        .into_iter()
        .find(|t| t.contains("name: ringlb-controller"))
        .expect("controller-rbac.yaml");
    let rendered = ringlb_controlplane::render_release_namespace(&rbac, RELEASE_NS);
    let cut = rendered.replace(
        "  - apiGroups: [\"\"]\n    resources: [\"services/status\"]\n    verbs: [\"patch\"]\n",
        "",
    );
    assert_ne!(
        cut, rendered,
        "the services/status rule was found and removed"
    );
    cluster
        .cp
        .apply_yaml(&cut)
        .await
        .expect("apply the cut RBAC");
    create_pool(&client, "main", &["192.0.2.0/29"], |_| {}).await;
    let ctrl = Ctrl::start(&cluster, "rbac-cut", &[]);
    create_svc(&client, &lb_service("a", 80, json!({}))).await;
    wait_for(
        Duration::from_secs(20),
        "a Forbidden status write in the log",
        || {
            let log = ctrl.logs();
            async move { (log.contains("forbidden") || log.contains("Forbidden")).then_some(()) }
        },
    )
    .await;
    assert!(
        ingress_ips(&get_svc(&client, "a").await).is_empty(),
        "no VIP can be published without services/status patch"
    );
}
