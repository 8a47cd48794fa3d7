//! The chart's RBAC for the controller grants every request the controller makes,
//! and nothing it never makes. The requests are read from the controller's own
//! kube-client HTTP log while it goes through start-up, allocation, refusal,
//! release, pool status and leader election against a real kube-apiserver.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::json;

/// (apiGroup, resource incl. subresource, verb, namespaced-in-release-namespace?)
type Access = (String, String, String);

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c2 in chars.by_ref() {
                if c2.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Maps one logged request to the RBAC (group, resource, verb) it needs.
fn access(method: &str, url: &str) -> Option<Access> {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let path = path
        .split("://")
        .nth(1)
        .map(|p| &p[p.find('/').unwrap_or(p.len())..])
        .unwrap_or(path);
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match *parts.first()? {
        "api" => (String::new(), &parts[2..]),
        "apis" => (parts.get(1)?.to_string(), &parts[3..]),
        _ => return None,
    };
    let rest = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        &rest[2..]
    } else {
        rest
    };
    let resource = match rest.len() {
        1 | 2 => rest[0].to_string(),
        3 => format!("{}/{}", rest[0], rest[2]),
        _ => return None,
    };
    let named = rest.len() >= 2;
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => return None,
    };
    Some((group, resource, verb.to_string()))
}

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
    let cluster = cluster().await;
    let client = cluster.client().await;
    create_pool(&client, "main", &["192.0.2.0/31"], |_| {}).await;
    let mut ctrl = Ctrl::start(&cluster, "rbac", &["--log-level", "warn,kube_client=debug"]);
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
    wait_for(Duration::from_secs(5), "MalformedAnnotation", || {
        let client = client.clone();
        async move {
            (condition(&get_svc(&client, "c").await)?.1 == "MalformedAnnotation").then_some(())
        }
    })
    .await;
    api.patch("c", &pp, &kube::api::Patch::Merge(set(json!(null))))
        .await
        .unwrap();
    wait_for(Duration::from_secs(5), "PoolExhausted again", || {
        let client = client.clone();
        async move { (condition(&get_svc(&client, "c").await)?.1 == "PoolExhausted").then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    delete_svc(&client, "a").await; // release -> c allocated
    wait_ips(&client, "c", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // pool status write, lease renewals
    ctrl.terminate().await; // lease release

    let log = strip_ansi(&ctrl.logs());
    let mut used = BTreeSet::new();
    for line in log.lines() {
        let (Some(m), Some(u)) = (
            line.split("http.method=").nth(1),
            line.split("http.url=").nth(1),
        ) else {
            continue;
        };
        let method = m.split_whitespace().next().unwrap_or("");
        let url = u
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches(['}', ':']);
        if let Some(a) = access(method, url) {
            used.insert(a);
        }
    }
    assert!(
        used.len() > 5,
        "too few requests parsed from the log:\n{log}"
    );
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

#[test]
fn maps_urls_to_rbac() {
    let a = |m, u| access(m, u).unwrap();
    let t = |g: &str, r: &str, v: &str| (g.to_string(), r.to_string(), v.to_string());
    assert_eq!(
        a(
            "GET",
            "http://h:1/api/v1/services?watch=true&resourceVersion=5"
        ),
        t("", "services", "watch")
    );
    assert_eq!(
        a(
            "PATCH",
            "http://h:1/api/v1/namespaces/d/services/x/status?fieldManager=f"
        ),
        t("", "services/status", "patch")
    );
    assert_eq!(
        a(
            "GET",
            "http://h:1/apis/coordination.k8s.io/v1/namespaces/d/leases/l"
        ),
        t("coordination.k8s.io", "leases", "get")
    );
    assert_eq!(
        a("GET", "http://h:1/apis/ringlb.io/v1alpha1/ippools?&limit=1"),
        t("ringlb.io", "ippools", "list")
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
    let rbac = ringlb_e2e::controlplane::chart_rbac_templates()
        .expect("the chart's RBAC templates")
        .into_iter()
        .find(|t| t.contains("name: ringlb-controller"))
        .expect("controller-rbac.yaml");
    let rendered = ringlb_e2e::controlplane::render_release_namespace(&rbac, RELEASE_NS);
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
