//! kubectl against the API simulator: create deployment, expose --type=LoadBalancer,
//! get svc (EXTERNAL-IP <pending>, then the IP), apply -f (a Service manifest, the
//! project's CRD YAML, an IPPool), wait --for=condition, delete. Skips loudly when
//! kubectl is not on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use ringlb_e2e::{SimHandle, SimOptions, Simulator};
use serde_json::json;

/// A private HOME/KUBECACHEDIR for kubectl, removed on drop (also on failure).
struct Home(PathBuf);

impl Home {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "ringlb-apisim-kubectl-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Home(p)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn have_kubectl() -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "SKIPPED: kubectl is not on PATH; the kubectl-against-apisim tests need it (CI installs it)"
        );
    }
    ok
}

/// Runs kubectl against the simulator; returns (success, stdout, stderr).
async fn kubectl(sim: &SimHandle, home: &Home, args: &[&str]) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .args(args);
    cmd.env("HOME", &home.0)
        .env("KUBECACHEDIR", home.0.join("cache"))
        .env_remove("KUBECONFIG");
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("kubectl timed out")
        .expect("kubectl runs");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    (out.status.success(), o, e)
}

async fn ok(sim: &SimHandle, home: &Home, args: &[&str]) -> String {
    let (success, out, err) = kubectl(sim, home, args).await;
    assert!(
        success,
        "kubectl {args:?} failed:\nstdout: {out}\nstderr: {err}"
    );
    out
}

/// The cells of the row of `name` in kubectl's table output, by column header.
fn row(table: &str, name: &str) -> Option<std::collections::HashMap<String, String>> {
    let mut lines = table.lines();
    let header: Vec<String> = lines
        .next()?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let cells: Vec<String> = lines
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|c| c.first().map(String::as_str) == Some(name))?;
    Some(header.into_iter().zip(cells).collect())
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn create_expose_get_delete() {
    if !have_kubectl() {
        return;
    }
    let sim = Simulator::start(SimOptions::default()).await.unwrap();
    let home = Home::new("expose");
    let out = ok(
        &sim,
        &home,
        &["create", "deployment", "web", "--image=nginx"],
    )
    .await;
    assert!(out.contains("deployment.apps/web created"), "{out}");
    let pods: Api<Pod> = Api::default_namespaced(sim.client().await);
    eventually("a running web pod", || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let out = ok(&sim, &home, &["get", "deployment", "web"]).await;
    assert_eq!(row(&out, "web").unwrap()["READY"], "1/1", "{out}");

    let out = ok(
        &sim,
        &home,
        &[
            "expose",
            "deployment",
            "web",
            "--port=80",
            "--target-port=8080",
            "--type=LoadBalancer",
        ],
    )
    .await;
    assert!(out.contains("service/web exposed"), "{out}");
    let out = ok(&sim, &home, &["get", "svc"]).await;
    let r = row(&out, "web").unwrap_or_else(|| panic!("no web row in\n{out}"));
    assert_eq!(r["TYPE"], "LoadBalancer");
    assert_eq!(r["EXTERNAL-IP"], "<pending>", "{out}");
    assert!(
        r["PORT(S)"].starts_with("80:3") && r["PORT(S)"].ends_with("/TCP"),
        "{out}"
    );
    assert!(row(&out, "kubernetes").is_some());

    // `kubectl get svc web -w` sees <pending> turn into the VIP when the
    // controller's status write lands.
    let mut watch = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .args(["get", "svc", "web", "-w"])
        .env("HOME", &home.0)
        .env("KUBECACHEDIR", home.0.join("cache"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let l = lines.next_line().await.unwrap().unwrap();
            if l.starts_with("web ") {
                return l;
            }
        }
    })
    .await
    .expect("kubectl get -w prints the Service");
    assert!(first.contains("<pending>"), "{first}");

    // What the controller does: a status patch with the VIP.
    let svcs: Api<Service> = Api::default_namespaced(sim.client().await);
    let st =
        json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"}]}}});
    svcs.patch_status("web", &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("a watch update within 5 s");
    let changed = changed.unwrap().unwrap_or_default();
    assert!(
        changed.contains("192.0.2.10") && changed.starts_with("web "),
        "{changed}"
    );
    drop(watch);
    let out = ok(&sim, &home, &["get", "svc", "web"]).await;
    assert_eq!(
        row(&out, "web").unwrap()["EXTERNAL-IP"],
        "192.0.2.10",
        "{out}"
    );

    // A Warning Event from kube-rs's Recorder (events.k8s.io) shows in
    // `kubectl get events` and `kubectl describe svc` (core v1 Events).
    {
        use kube::Resource;
        use kube::runtime::events::{Event, EventType, Recorder, Reporter};
        let web = svcs.get("web").await.unwrap();
        let recorder = Recorder::new(
            sim.client().await,
            Reporter {
                controller: "ringlb-controller".into(),
                instance: None,
            },
        );
        let ev = Event {
            type_: EventType::Warning,
            reason: "AllocationFailed".into(),
            note: Some("no pool matches".into()),
            action: "Allocate".into(),
            secondary: None,
        };
        recorder.publish(&ev, &web.object_ref(&())).await.unwrap();
    }
    let out = ok(&sim, &home, &["get", "events"]).await;
    assert!(
        out.contains("Warning") && out.contains("AllocationFailed") && out.contains("service/web"),
        "{out}"
    );
    let out = ok(&sim, &home, &["describe", "svc", "web"]).await;
    assert!(
        out.contains("AllocationFailed") && out.contains("no pool matches"),
        "{out}"
    );
    assert!(
        out.contains("LoadBalancer Ingress:") && out.contains("192.0.2.10"),
        "{out}"
    );

    // The EndpointSlice built from the deployment's pod, resolved to targetPort 8080.
    let out = ok(
        &sim,
        &home,
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "jsonpath={.items[0].ports[0].port} {.items[0].endpoints[0].conditions.ready}",
        ],
    )
    .await;
    assert_eq!(out, "8080 true");

    let out = ok(&sim, &home, &["delete", "svc", "web"]).await;
    assert!(out.contains("service \"web\" deleted"), "{out}");
    let (found, _, err) = kubectl(&sim, &home, &["get", "svc", "web"]).await;
    assert!(!found && err.contains("NotFound"), "{err}");
    ok(&sim, &home, &["delete", "deployment", "web"]).await;
    eventually("pods garbage-collected", || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    sim.shutdown().await;
}

fn repo_crds() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

#[tokio::test]
async fn apply_crds_pool_and_service_manifests() {
    if !have_kubectl() {
        return;
    }
    let sim = Simulator::start(SimOptions {
        install_crds: false,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let home = Home::new("apply");
    let crds = repo_crds();
    let out = ok(&sim, &home, &["apply", "-f", crds.to_str().unwrap()]).await;
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/ippools.ringlb.io created"),
        "{out}"
    );
    // Applying the same files again is a no-op.
    let out = ok(&sim, &home, &["apply", "-f", crds.to_str().unwrap()]).await;
    assert!(out.contains("ippools.ringlb.io unchanged"), "{out}");

    let pool = home.0.join("pool.yaml");
    std::fs::write(&pool, "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: lab\nspec:\n  cidrs: [\"192.0.2.0/28\"]\n").unwrap();
    let out = ok(&sim, &home, &["apply", "-f", pool.to_str().unwrap()]).await;
    assert!(out.contains("ippool.ringlb.io/lab created"), "{out}");
    std::fs::write(&pool, "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: lab\nspec:\n  cidrs: [\"192.0.2.0/28\", \"2001:db8::/64\"]\n").unwrap();
    let out = ok(&sim, &home, &["apply", "-f", pool.to_str().unwrap()]).await;
    assert!(out.contains("ippool.ringlb.io/lab configured"), "{out}");
    let out = ok(
        &sim,
        &home,
        &["get", "ippools", "lab", "-o", "jsonpath={.spec.cidrs}"],
    )
    .await;
    assert_eq!(out, r#"["192.0.2.0/28","2001:db8::/64"]"#);
    let out = ok(&sim, &home, &["get", "ipp"]).await;
    assert!(
        row(&out, "lab").is_some(),
        "short name and printer columns: {out}"
    );

    let svc = home.0.join("svc.yaml");
    let manifest = |port: u16| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: api\n  annotations:\n    ringlb.io/ip-pool: lab\nspec:\n  type: LoadBalancer\n  loadBalancerClass: ringlb.io/maglev\n  selector: {{app: api}}\n  ports:\n  - name: http\n    port: {port}\n    targetPort: 8080\n"
        )
    };
    std::fs::write(&svc, manifest(80)).unwrap();
    let out = ok(&sim, &home, &["apply", "-f", svc.to_str().unwrap()]).await;
    assert!(out.contains("service/api created"), "{out}");
    let node_port = ok(
        &sim,
        &home,
        &[
            "get",
            "svc",
            "api",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ],
    )
    .await;
    std::fs::write(&svc, manifest(81)).unwrap();
    let out = ok(&sim, &home, &["apply", "-f", svc.to_str().unwrap()]).await;
    assert!(out.contains("service/api configured"), "{out}");
    let out = ok(
        &sim,
        &home,
        &[
            "get",
            "svc",
            "api",
            "-o",
            "jsonpath={.spec.ports[0].port} {.spec.ports[0].nodePort} {.spec.loadBalancerClass}",
        ],
    )
    .await;
    assert_eq!(out, format!("81 {node_port} ringlb.io/maglev"));

    // Server-side dry run and kubectl diff: validated and shown, nothing stored.
    std::fs::write(&svc, manifest(82)).unwrap();
    let out = ok(
        &sim,
        &home,
        &["apply", "--dry-run=server", "-f", svc.to_str().unwrap()],
    )
    .await;
    assert!(
        out.contains("service/api configured (server dry run)"),
        "{out}"
    );
    let (same, diff, err) = kubectl(&sim, &home, &["diff", "-f", svc.to_str().unwrap()]).await;
    assert!(
        !same && diff.contains("-    port: 81") && diff.contains("+    port: 82"),
        "{diff}\n{err}"
    );
    let out = ok(
        &sim,
        &home,
        &["get", "svc", "api", "-o", "jsonpath={.spec.ports[0].port}"],
    )
    .await;
    assert_eq!(out, "81", "the dry runs changed nothing");

    // kubectl wait on the condition the controller sets.
    let svcs: Api<Service> = Api::default_namespaced(sim.client().await);
    let waiter = {
        let (kc, h) = (sim.kubeconfig_path().to_path_buf(), home.0.clone());
        tokio::spawn(async move {
            tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(kc)
                .args([
                    "wait",
                    "--for=condition=ringlb.io/IPAllocated",
                    "svc/api",
                    "--timeout=20s",
                ])
                .env("HOME", &h)
                .env("KUBECACHEDIR", h.join("cache"))
                .output()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cond = json!({"status": {"conditions": [{"type": "ringlb.io/IPAllocated", "status": "True", "reason": "Allocated", "message": "192.0.2.1", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    svcs.patch_status("api", &PatchParams::default(), &Patch::Merge(&cond))
        .await
        .unwrap();
    let out = waiter.await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));

    let out = ok(&sim, &home, &["delete", "-f", pool.to_str().unwrap()]).await;
    assert!(out.contains("ippool.ringlb.io \"lab\" deleted"), "{out}");
    let out = ok(&sim, &home, &["get", "ippools"]).await;
    assert!(!out.contains("lab"), "{out}");
    sim.shutdown().await;
}

/// kubectl 1.33 sends these as protobuf; the simulator decodes them.
#[tokio::test]
async fn typed_creates_sent_as_protobuf() {
    if !have_kubectl() {
        return;
    }
    let sim = Simulator::start(SimOptions {
        kubelet: false,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let home = Home::new("typed");
    ok(
        &sim,
        &home,
        &[
            "create",
            "service",
            "loadbalancer",
            "lb1",
            "--tcp=80:8080,443:8443",
        ],
    )
    .await;
    let out = ok(&sim, &home, &["get", "svc", "lb1", "-o", "jsonpath={.spec.type} {.spec.ports[1].port} {.spec.ports[1].targetPort} {.spec.selector.app}"]).await;
    assert_eq!(out, "LoadBalancer 443 8443 lb1");
    ok(&sim, &home, &["create", "namespace", "team"]).await;
    let out = ok(
        &sim,
        &home,
        &[
            "get",
            "ns",
            "team",
            "-o",
            "jsonpath={.metadata.labels.kubernetes\\.io/metadata\\.name}",
        ],
    )
    .await;
    assert_eq!(out, "team");
    ok(
        &sim,
        &home,
        &[
            "-n",
            "team",
            "create",
            "configmap",
            "cm1",
            "--from-literal=a=b",
        ],
    )
    .await;
    assert_eq!(
        ok(
            &sim,
            &home,
            &["-n", "team", "get", "cm", "cm1", "-o", "jsonpath={.data.a}"]
        )
        .await,
        "b"
    );
    ok(
        &sim,
        &home,
        &[
            "create",
            "secret",
            "generic",
            "s1",
            "--from-literal=pw=secret",
        ],
    )
    .await;
    assert_eq!(
        ok(
            &sim,
            &home,
            &["get", "secret", "s1", "-o", "jsonpath={.data.pw} {.type}"]
        )
        .await,
        "c2VjcmV0 Opaque"
    );
    ok(
        &sim,
        &home,
        &[
            "run",
            "p1",
            "--image=busybox",
            "--labels=app=x",
            "--port=9090",
            "--",
            "sleep",
            "10",
        ],
    )
    .await;
    let out = ok(&sim, &home, &["get", "pod", "p1", "-o", "jsonpath={.spec.containers[0].ports[0].containerPort} {.spec.containers[0].args} {.status.phase}"]).await;
    assert_eq!(out, r#"9090 ["sleep","10"] Pending"#);
    ok(
        &sim,
        &home,
        &[
            "create",
            "deployment",
            "zero",
            "--image=nginx",
            "--replicas=0",
        ],
    )
    .await;
    assert_eq!(
        ok(
            &sim,
            &home,
            &["get", "deploy", "zero", "-o", "jsonpath={.spec.replicas}"]
        )
        .await,
        "0",
        "a pointer field keeps an explicit 0"
    );
    sim.shutdown().await;
}
