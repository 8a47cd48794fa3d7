//! The chart against the real control plane (etcd + kube-apiserver +
//! kube-controller-manager, `ringlb_controlplane`), with the real helm:
//!
//! - kube-apiserver accepts every rendered object (server-side dry run);
//! - `helm install` creates every object (CRDs included), `helm upgrade` changes what
//!   the values say, and `helm uninstall` leaves no object behind but the CRDs; the
//!   post-delete hook that removes the cleanup finalizer is part of the release.
//!
//! No pod runs: there is no kubelet (the real cluster's test, `real_cluster.rs`,
//! runs the chart's pods and its hook).

mod chart_util;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chart_util::*;
use ringlb_e2e::controlplane::{ControlPlane, chart_dir};
use serde_json::Value;

/// kube-apiserver validates and admits every object the chart renders, with the
/// default and the example values, and stores none (server-side dry run).
#[tokio::test]
async fn the_api_server_accepts_every_rendered_object() {
    let cp = control_plane(true).await;
    let (ok, _, err) = kubectl(&cp, &["create", "namespace", NS], "");
    assert!(ok, "{err}");
    let example = example_values();
    for extra in [vec![], vec!["--values", example.to_str().unwrap()]] {
        let yaml = template_ok(&extra);
        let n = docs(&yaml).len();
        let (ok, out, err) = kubectl(&cp, &["apply", "--dry-run=server", "-f", "-"], &yaml);
        assert!(
            ok,
            "server-side dry run of {extra:?} refused:\n{err}\n{out}"
        );
        let accepted = out
            .lines()
            .filter(|l| l.ends_with("(server dry run)"))
            .count();
        assert_eq!(accepted, n, "every object accepted:\n{out}");
    }
    let (_, out, _) = kubectl(
        &cp,
        &["get", "deployments,daemonsets,ippools", "-A", "-o", "name"],
        "",
    );
    assert_eq!(out.trim(), "", "a dry run stores nothing");
}

/// What `helm get manifest` says the release holds: "kind/name" (lower-case kind).
fn release_objects(cp: &ControlPlane) -> BTreeSet<String> {
    let manifest = helm_on(cp, &["get", "manifest", RELEASE, "-n", NS]);
    docs(&manifest)
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap().to_lowercase(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// The objects of the release found in the cluster, as "kind/name".
fn found_in_cluster(cp: &ControlPlane) -> BTreeSet<String> {
    let manifest = helm_on(cp, &["get", "manifest", RELEASE, "-n", NS]);
    let (ok, out, err) = kubectl(cp, &["get", "-f", "-", "-o", "name"], &manifest);
    assert!(ok, "kubectl get of the release's objects: {err}");
    out.lines()
        .map(|l| {
            // "deployment.apps/ringlb-controller" -> "deployment/ringlb-controller"
            let (kind, name) = l.split_once('/').unwrap();
            format!("{}/{name}", kind.split('.').next().unwrap())
        })
        .collect()
}

/// The kinds the chart renders, and what kube-controller-manager makes from them.
const KINDS: &str = "deployments,replicasets,pods,daemonsets,poddisruptionbudgets,\
    serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,services,\
    ippools,bgppeers,bgpadvertisements";

fn jsonpath(cp: &ControlPlane, what: &[&str], path: &str) -> String {
    let mut a = vec!["get", "-n", NS];
    a.extend_from_slice(what);
    let expr = format!("jsonpath={path}");
    a.extend(["-o", expr.as_str()]);
    let (ok, out, err) = kubectl(cp, &a, "");
    assert!(ok, "kubectl {a:?}: {err}");
    out
}

/// `helm install` with the example values into a cluster without ringlb's CRDs:
/// helm installs the CRDs, then every object (the IPPool, BGPPeer and
/// BGPAdvertisement from values too). `helm upgrade` with other values changes the
/// Deployment; `helm uninstall` removes every object and leaves the CRDs (helm never
/// deletes `crds/`, so pools and peers of other tools' making survive).
#[tokio::test]
async fn install_upgrade_uninstall_leave_nothing_behind() {
    let cp = control_plane(false).await;
    let chart = chart_dir();
    let (chart, example) = (chart.to_str().unwrap(), example_values());
    let values = example.to_str().unwrap();
    let base = ["-n", NS, "--values", values];

    let out = helm_on(
        &cp,
        &[
            &["install", RELEASE, chart, "--create-namespace"][..],
            &base,
        ]
        .concat(),
    );
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(
        out.contains("1 IPPool(s), 1 BGPPeer(s)"),
        "NOTES rendered: {out}"
    );
    let want = release_objects(&cp);
    // hooks (the post-delete finalizer cleanup) are not part of the release's manifest
    let rendered = docs(&template_ok(&["--values", values]))
        .iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .count();
    let hooks = helm_on(&cp, &["get", "hooks", RELEASE, "-n", NS]);
    let hooks = docs(&hooks);
    let job = find(&hooks, "Job", "ringlb-controller-cleanup");
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"],
        "post-delete"
    );
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["args"][2],
        "remove-finalizers"
    );
    assert_eq!(
        want.len(),
        rendered,
        "the release holds every rendered object: {want:?}"
    );
    assert_eq!(
        found_in_cluster(&cp),
        want,
        "every object of the release exists"
    );
    let (ok, _, err) = kubectl(
        &cp,
        &["get", "crd", "ippools.ringlb.io", "bgppeers.ringlb.io"],
        "",
    );
    assert!(ok, "helm installed the CRDs: {err}");
    let pool = jsonpath(&cp, &["ippool", "public"], "{.spec.cidrs[0]}");
    assert_eq!(pool, "192.0.2.0/26");
    assert_eq!(
        jsonpath(
            &cp,
            &["deployment", "ringlb-controller"],
            "{.spec.replicas}"
        ),
        "2"
    );

    helm_on(
        &cp,
        &[
            &["upgrade", RELEASE, chart][..],
            &base,
            &[
                "--set",
                "controller.replicas=3",
                "--set",
                "controller.logLevel=debug",
            ],
        ]
        .concat(),
    );
    let d = ["deployment", "ringlb-controller"];
    assert_eq!(jsonpath(&cp, &d, "{.spec.replicas}"), "3");
    let env = jsonpath(
        &cp,
        &d,
        "{.spec.template.spec.containers[0].env[?(@.name==\"RINGLB_LOG\")].value}",
    );
    assert_eq!(env, "debug");
    let history = helm_on(&cp, &["history", RELEASE, "-n", NS, "-o", "json"]);
    assert_eq!(
        serde_json::from_str::<Vec<Value>>(&history).unwrap().len(),
        2
    );

    // No kubelet here runs the post-delete Job (the real cluster's test does):
    // without --no-hooks helm would wait for it.
    helm_on(
        &cp,
        &[
            "uninstall",
            RELEASE,
            "-n",
            NS,
            "--wait",
            "--timeout",
            "60s",
            "--no-hooks",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let selector = "app.kubernetes.io/name=ringlb";
    loop {
        let (ok, out, err) = kubectl(&cp, &["get", KINDS, "-A", "-l", selector, "-o", "name"], "");
        assert!(ok, "{err}");
        if out.trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind after uninstall:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for obj in &want {
        let (_, out, _) = kubectl(
            &cp,
            &["get", obj, "-n", NS, "--ignore-not-found", "-o", "name"],
            "",
        );
        assert_eq!(out.trim(), "", "{obj} is left after uninstall");
    }
    let (ok, _, err) = kubectl(&cp, &["get", "crd", "ippools.ringlb.io"], "");
    assert!(
        ok,
        "CRDs stay after uninstall (helm never deletes crds/): {err}"
    );
}
