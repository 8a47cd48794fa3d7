//! The real control plane itself: it starts, enforces what kube-apiserver enforces
//! (unknown fields, the CRDs' CEL rules with field paths in kubectl's output, RBAC),
//! and kube-controller-manager writes EndpointSlices.

use std::time::{Duration, Instant};

use ringlb_e2e::controlplane::{ControlPlane, Options, daemon::Daemon};

async fn cp() -> ControlPlane {
    ControlPlane::start(Options::default())
        .await
        .expect("the control plane starts")
}

fn kubectl_stdin(cp: &ControlPlane, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = cp
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("kubectl finishes");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn starts_and_serves_the_crds() {
    let t0 = Instant::now();
    let cp = cp().await;
    eprintln!("control plane up in {:?}", t0.elapsed());
    let (ok, out) = kubectl_stdin(&cp, &["get", "ippools"], "");
    assert!(ok, "kubectl get ippools: {out}");
    let _ = Duration::ZERO;
}

/// `kubectl apply -f -` of `yaml`: (succeeded, stdout + stderr).
fn apply(cp: &ControlPlane, yaml: &str) -> (bool, String) {
    kubectl_stdin(cp, &["apply", "-f", "-"], yaml)
}

/// The bug the simulator let through: a typo'd field (`autoAsign`) was dropped, the
/// pool was created with `autoAssign: true` and handed out addresses the user meant to
/// keep back. kubectl asks for strict field validation by default, and the real server
/// refuses the object and names the field; nothing is created.
#[tokio::test]
async fn kubectl_apply_refuses_an_unknown_field_and_names_it() {
    let cp = cp().await;
    let (ok, out) = apply(
        &cp,
        "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: typo\n\
         spec:\n  cidrs: [\"192.0.2.0/28\"]\n  autoAsign: false\n",
    );
    eprintln!("kubectl apply (unknown field):\n{out}");
    assert!(!ok, "an IPPool with an unknown field was accepted: {out}");
    assert!(
        out.contains("unknown field \"spec.autoAsign\""),
        "kubectl's output does not name the field: {out}"
    );
    let (found, get) = kubectl_stdin(&cp, &["get", "ippool", "typo"], "");
    assert!(!found, "the refused IPPool exists anyway: {get}");

    // The same object spelled right is accepted, and keeps autoAssign false: the
    // refusal above was about the field name, not the rest of the object.
    let (ok, out) = apply(
        &cp,
        "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: typo\n\
         spec:\n  cidrs: [\"192.0.2.0/28\"]\n  autoAssign: false\n",
    );
    assert!(ok, "the corrected IPPool: {out}");
    let (ok, auto) = kubectl_stdin(
        &cp,
        &["get", "ippool", "typo", "-o", "jsonpath={.spec.autoAssign}"],
        "",
    );
    assert!(ok && auto.trim() == "false", "autoAssign: {auto}");
}

/// The CRDs' validation as kube-apiserver v1.34 runs it (its own CEL environment with
/// the `isCIDR`/`isIP`/`ip()` libraries, and the OpenAPI schema), seen through
/// kubectl's own output: every bad object is refused with the field path and the
/// rule's message. A valid object of each kind is accepted, so the rules do not simply
/// refuse everything. (The CRDs themselves, with their CEL cost estimates, were
/// accepted when the control plane installed them at start.)
#[tokio::test]
async fn crd_rules_refuse_bad_objects_with_the_field_path_in_kubectl_output() {
    let cp = cp().await;
    let pool = |name: &str, spec: &str| {
        format!(
            "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };
    // A BGPPeer with myASN 64512 and `spec` (which names peerAddress unless it is
    // the field under test).
    let peer = |name: &str, spec: &str| {
        let addr = if spec.contains("peerAddress:") {
            ""
        } else {
            "  peerAddress: 192.0.2.1\n"
        };
        format!(
            "apiVersion: ringlb.io/v1alpha1\nkind: BGPPeer\nmetadata:\n  name: {name}\n\
             spec:\n{addr}  myASN: 64512\n{spec}"
        )
    };
    // (object, what kubectl's output must contain: the field path and the message)
    let bad: Vec<(String, &[&str])> = vec![
        (
            pool("bad-cidr", "  cidrs: [\"10.0.0.0/33\"]\n"),
            &[
                "The IPPool \"bad-cidr\" is invalid",
                "spec.cidrs: Invalid value",
                "every entry must be a CIDR",
            ],
        ),
        (
            pool(
                "backwards",
                "  ranges:\n  - {start: 192.0.2.20, end: 192.0.2.10}\n",
            ),
            &[
                "spec.ranges[0]: Invalid value",
                "start must not be after end",
            ],
        ),
        (
            pool(
                "mixed",
                "  ranges:\n  - {start: 192.0.2.1, end: \"2001:db8::1\"}\n",
            ),
            &[
                "spec.ranges[0]: Invalid value",
                "start and end must be of the same address family",
            ],
        ),
        (
            pool(
                "bad-ip",
                "  ranges:\n  - {start: 192.0.2.300, end: 192.0.2.1}\n",
            ),
            &[
                "spec.ranges[0].start: Invalid value",
                "must be an IP address",
            ],
        ),
        (
            pool("empty", "  autoAssign: true\n"),
            &[
                "spec: Invalid value",
                "an IPPool needs at least one entry in cidrs or ranges",
            ],
        ),
        (
            peer("asn-zero", "  peerASN: 0\n"),
            &[
                "The BGPPeer \"asn-zero\" is invalid",
                "spec.peerASN: Invalid value: 0",
                "greater than or equal to 1",
            ],
        ),
        (
            peer("hold-one", "  peerASN: 64513\n  holdTime: 1\n"),
            &[
                "spec.holdTime: Invalid value",
                "must be 0 or at least 3 seconds",
            ],
        ),
        (
            peer(
                "keepalive-hold",
                "  peerASN: 64513\n  holdTime: 9\n  keepaliveTime: 9\n",
            ),
            &[
                "spec: Invalid value",
                "keepaliveTime must be less than holdTime",
            ],
        ),
        (
            peer("bad-peer", "  peerASN: 64513\n  peerAddress: router1\n"),
            &[
                "spec.peerAddress: Invalid value",
                "must be an IPv4 or IPv6 address",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (yaml, wanted) in &bad {
        let (ok, out) = apply(&cp, yaml);
        eprintln!("---- kubectl apply of\n{yaml}---- said:\n{out}");
        if ok {
            failures.push(format!("accepted:\n{yaml}\n{out}"));
            continue;
        }
        for w in wanted.iter() {
            if !out.contains(w) {
                failures.push(format!("output lacks {w:?}:\n{out}"));
            }
        }
    }
    // Good objects on the edges of the same rules.
    for yaml in [
        pool("v4", "  cidrs: [\"10.0.0.0/32\", \"2001:db8::/128\"]\n"),
        pool(
            "one",
            "  ranges:\n  - {start: 192.0.2.10, end: 192.0.2.10}\n",
        ),
        peer(
            "hold-zero",
            "  peerASN: 64513\n  holdTime: 0\n  keepaliveTime: 30\n",
        ),
        peer(
            "hold-three",
            "  peerASN: 64513\n  holdTime: 3\n  keepaliveTime: 1\n",
        ),
    ] {
        let (ok, out) = apply(&cp, &yaml);
        if !ok {
            failures.push(format!("refused a valid object:\n{yaml}\n{out}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `ringlb-controller` next to this test binary (`target/<profile>/`), or in
/// `RINGLB_BIN_DIR`; None when it is not built.
fn controller_bin() -> Option<std::path::PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("RINGLB_BIN_DIR") {
        dirs.push(std::path::PathBuf::from(d));
    }
    // target/<profile>/deps/controlplane-<hash> -> target/<profile>
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent()?.parent().map(|d| d.to_path_buf()))
    {
        dirs.push(d);
    }
    dirs.into_iter()
        .map(|d| d.join("ringlb-controller"))
        .find(|p| p.is_file())
}

/// What a user types on a real cluster, with the real `ringlb-controller` running as a
/// pod would: under the chart's RBAC, with a ServiceAccount token (not the admin
/// certificate). `kubectl expose --type=LoadBalancer` of a Deployment gets an
/// EXTERNAL-IP from the pool in `kubectl get svc`; the Deployment's pods come from the
/// real ReplicaSet controller, run Ready with the lab kubelet's IPs, and the
/// Service's EndpointSlice, listing both pods ready on the target port, comes from the
/// real EndpointSlice controller (kube-controller-manager).
#[tokio::test]
async fn kubectl_expose_gets_an_external_ip_from_the_controller_under_chart_rbac() {
    let Some(bin) = controller_bin() else {
        eprintln!(
            "SKIPPED kubectl_expose_gets_an_external_ip...: ringlb-controller is not built \
             next to this test; build it: cargo build -p ringlb-controller \
             (or set RINGLB_BIN_DIR)"
        );
        return;
    };
    let mut cp = cp().await;
    cp.apply_chart_rbac("ringlb-system")
        .await
        .expect("the chart's RBAC applies");
    let kubeconfig = cp
        .service_account_kubeconfig("ringlb-system", "ringlb-controller")
        .await
        .expect("a ServiceAccount token");
    // Pods get bound, an IP and Ready from the lab kubelet (no container runtime here).
    let _kubelet = cp
        .start_kubelet(ringlb_e2e::controlplane::KubeletOptions {
            nodes: vec![
                ringlb_e2e::controlplane::LabNode::new("node-1"),
                ringlb_e2e::controlplane::LabNode::new("node-2"),
            ],
            pod_ips: vec![],
            pod_cidrs: vec!["10.244.0.0/24".parse().unwrap()],
        })
        .await
        .expect("the lab kubelet registers its nodes");
    let (ok, out) = apply(
        &cp,
        "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: lab\n\
         spec:\n  cidrs: [\"192.0.2.0/28\"]\n",
    );
    assert!(ok, "the IPPool: {out}");
    let kubeconfig = kubeconfig.display().to_string();
    let mut ctrl = ringlb_e2e::lab::daemon::Daemon::spawn(
        cp.dir(),
        "ringlb-controller",
        None,
        &[
            &bin.display().to_string(),
            "--kubeconfig",
            &kubeconfig,
            "--metrics-addr",
            "127.0.0.1:0",
            "--lease-namespace",
            "ringlb-system",
            "--identity",
            "expose-test",
            "--log-level",
            "info,kube=warn",
        ],
        &[],
    )
    .expect("ringlb-controller starts");

    let run = |args: &[&str]| kubectl(&cp, args);
    run(&["create", "deployment", "web", "--image=x", "--replicas=2"]);
    run(&[
        "expose",
        "deployment",
        "web",
        "--type=LoadBalancer",
        "--port=80",
        "--target-port=8080",
    ]);
    let table = external_ip_in_kubectl_get_svc(&cp, &mut ctrl).await;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header.get(3), Some(&"EXTERNAL-IP"), "{table}");
    let ip: std::net::Ipv4Addr = table
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        u32::from(ip) & 0xffff_fff0,
        u32::from(std::net::Ipv4Addr::new(192, 0, 2, 0)),
        "{ip} is not from the pool 192.0.2.0/28"
    );

    // The Deployment's 2 pods (made by the ReplicaSet controller) run Ready with the
    // lab kubelet's IPs, and the EndpointSlice controller of kube-controller-manager
    // (its managed-by label) lists exactly those IPs, ready, on the target port 8080.
    let (pod_ips, slices) = ready_pods_in_the_endpointslice(&cp).await;
    eprintln!(
        "Ready pods {pod_ips:?}; EndpointSlice of web: {}",
        slices.trim()
    );

    // The controller's ringlb.io/BackendsReady condition follows the real slice: True
    // with both pods ready; False (NoReadyBackends) once the Deployment is scaled to 0
    // (its pods terminating, then gone); True again when it is scaled back.
    let t0 = Instant::now();
    backends_condition_becomes(&cp, &mut ctrl, "True BackendsReady", "80/TCP 2;").await;
    run(&["scale", "deployment", "web", "--replicas=0"]);
    backends_condition_becomes(&cp, &mut ctrl, "False NoReadyBackends", "80/TCP 0;").await;
    run(&["scale", "deployment", "web", "--replicas=2"]);
    backends_condition_becomes(&cp, &mut ctrl, "True BackendsReady", "80/TCP 2;").await;
    eprintln!("BackendsReady True -> False -> True in {:?}", t0.elapsed());
    let conditions = run(&[
        "get",
        "svc",
        "web",
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status}{\"\\n\"}{end}",
    ]);
    assert_eq!(
        conditions.trim(),
        "ringlb.io/IPAllocated=True\nringlb.io/BackendsReady=True",
        "both of the controller's conditions are kept"
    );
    ctrl.check_alive().expect("ringlb-controller still runs");
    cp.check_controller_manager()
        .expect("kube-controller-manager still runs");
}

/// Waits (60 s at most) until web's `ringlb.io/BackendsReady` condition reads
/// `"<status> <reason>"` with `message_part` in its message.
async fn backends_condition_becomes(
    cp: &ControlPlane,
    ctrl: &mut Daemon,
    want: &str,
    message_part: &str,
) {
    let t0 = Instant::now();
    loop {
        let got = kubectl(
            cp,
            &[
                "get",
                "svc",
                "web",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"ringlb.io/BackendsReady\")]\
                 ['status','reason','message']}",
            ],
        );
        if got.starts_with(want) && got.contains(message_part) {
            eprintln!("BackendsReady after {:?}: {got}", t0.elapsed());
            return;
        }
        if let Err(e) = ctrl.check_alive() {
            panic!("ringlb-controller exited: {e}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "BackendsReady is {got:?}, not {want:?} with {message_part:?}, after 60 s\n\
             controller log:\n{}",
            ctrl.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl args`, which must succeed: its output.
fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    let (ok, out) = kubectl_stdin(cp, args, "");
    assert!(ok, "kubectl {}: {out}", args.join(" "));
    out
}

/// `kubectl get svc web` once it shows an EXTERNAL-IP (30 s at most).
async fn external_ip_in_kubectl_get_svc(cp: &ControlPlane, ctrl: &mut Daemon) -> String {
    let t0 = Instant::now();
    loop {
        let table = kubectl(cp, &["get", "svc", "web"]);
        // NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE
        let external = table
            .lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(3))
            .unwrap_or_default()
            .to_string();
        if external.parse::<std::net::Ipv4Addr>().is_ok() {
            eprintln!("kubectl get svc web ({:?}):\n{table}", t0.elapsed());
            return table;
        }
        if let Err(e) = ctrl.check_alive() {
            panic!("ringlb-controller exited: {e}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no EXTERNAL-IP after 30 s:\n{table}\ncontroller log:\n{}",
            ctrl.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The IPs of web's Ready pods, and its one EndpointSlice listing them (30 s at most).
async fn ready_pods_in_the_endpointslice(cp: &ControlPlane) -> (Vec<String>, String) {
    let t0 = Instant::now();
    loop {
        let pods = kubectl(
            cp,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.status.podIP} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ],
        );
        let mut ips: Vec<String> = pods
            .lines()
            .filter(|l| l.ends_with(" True"))
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
            .collect();
        ips.sort();
        let slices = kubectl(
            cp,
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "jsonpath={range .items[*]}{.metadata.labels.endpointslice\\.kubernetes\\.io/managed-by} \
             {.addressType} {.ports[*].port}:{range .endpoints[*]} {.addresses[0]}={.conditions.ready}{end}{\"\\n\"}{end}",
            ],
        );
        let want = format!(
            "endpointslice-controller.k8s.io IPv4 8080:{}",
            ips.iter()
                .map(|ip| format!(" {ip}=true"))
                .collect::<String>()
        );
        // Endpoint order in a slice is the controller's; compare sorted.
        let sorted = |line: &str| {
            let (head, eps) = line.split_once(':').unwrap_or((line, ""));
            let mut eps: Vec<&str> = eps.split_whitespace().collect();
            eps.sort();
            format!("{head}: {}", eps.join(" "))
        };
        if ips.len() == 2 && slices.lines().count() == 1 && sorted(slices.trim()) == sorted(&want) {
            return (ips, slices);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "after 30 s: Ready pods of web {pods:?}, EndpointSlices of web {slices:?} (want {want:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lab kubelet (`controlplane::kubelet`) under the real controllers: a Deployment's
/// pods are bound, get the kubelet's IPs and turn Running and Ready; the real
/// EndpointSlice controller lists them ready; a deleted pod is kept Ready through its
/// grace period (the slice shows it serving and terminating), then deleted, and its
/// IP goes to the ReplicaSet's replacement.
mod lab_kubelet {
    use std::net::IpAddr;
    use std::time::{Duration, Instant};

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, DeleteParams, ListParams};
    use ringlb_e2e::controlplane::{KubeletOptions, LabNode};

    const V4: [&str; 2] = ["10.244.0.10", "10.244.0.11"];

    /// Polls `f` every 100 ms until it gives `Some`, at most `limit`.
    async fn until<T, F: std::future::Future<Output = Result<T, String>>>(
        what: &str,
        limit: Duration,
        mut f: impl FnMut() -> F,
    ) -> T {
        let t0 = Instant::now();
        loop {
            match f().await {
                Ok(v) => return v,
                Err(seen) if t0.elapsed() > limit => {
                    panic!("{what}: not after {limit:?}; last seen: {seen}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn ready(p: &Pod) -> bool {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    }

    fn ips(p: &Pod) -> Vec<IpAddr> {
        p.status
            .as_ref()
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .map(|i| i.ip.parse().unwrap())
            .collect()
    }

    /// (address, ready, serving, terminating) of every endpoint of Service `web`.
    /// Waits up to 30 s until the slices list exactly `want`.
    async fn endpoints_become(
        slices: &Api<EndpointSlice>,
        want: &[(String, bool, bool, bool)],
        what: &str,
    ) {
        until(what, Duration::from_secs(30), || async {
            let eps = endpoints(slices).await;
            if eps == want {
                Ok(())
            } else {
                Err(format!("{eps:?}"))
            }
        })
        .await;
    }

    async fn endpoints(slices: &Api<EndpointSlice>) -> Vec<(String, bool, bool, bool)> {
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let mut v: Vec<_> = slices
            .list(&lp)
            .await
            .unwrap()
            .items
            .into_iter()
            .flat_map(|s| s.endpoints)
            .map(|e| {
                let c = e.conditions.unwrap_or_default();
                (
                    e.addresses[0].clone(),
                    c.ready == Some(true),
                    c.serving == Some(true),
                    c.terminating == Some(true),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn deployment_pods_run_ready_terminate_and_the_real_endpointslices_follow() {
        let t_start = Instant::now();
        let cp = super::cp().await;
        let _kubelet = cp
            .start_kubelet(KubeletOptions {
                nodes: vec![
                    LabNode::new("lab-node-1").address("192.0.2.1".parse().unwrap()),
                    LabNode::new("lab-node-2").address("192.0.2.2".parse().unwrap()),
                    LabNode::new("lab-edge").without_pods(),
                ],
                pod_ips: V4.iter().map(|s| s.parse().unwrap()).collect(),
                pod_cidrs: vec!["fd00:10:244::/64".parse().unwrap()],
            })
            .await
            .expect("the lab kubelet registers its nodes");
        cp.apply_yaml(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n\
             spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n\
             \x20   metadata: {labels: {app: web}}\n    spec:\n      terminationGracePeriodSeconds: 3\n\
             \x20     containers: [{name: web, image: lab/web, ports: [{containerPort: 8080}]}]\n\
             ---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
             spec:\n  selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]\n",
        )
        .await
        .expect("the Deployment and Service apply");
        let client = cp.client().await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let slices: Api<EndpointSlice> = Api::namespaced(client, "default");

        // 2 pods: bound to the two pod nodes (never the edge), Running, Ready, with one
        // IP of the list and one of the IPv6 CIDR each
        let running = until("2 Running+Ready pods", Duration::from_secs(30), || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await;
            let list = list.map_err(|e| e.to_string())?.items;
            let ok = list.len() == 2
                && list.iter().all(|p| {
                    ready(p)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                });
            if ok {
                Ok(list)
            } else {
                Err(format!("{} pods", list.len()))
            }
        })
        .await;
        eprintln!("2 Running+Ready pods after {:?}", t_start.elapsed());
        let mut v4: Vec<String> = Vec::new();
        let mut nodes: Vec<String> = Vec::new();
        for p in &running {
            let ips = ips(p);
            assert_eq!(ips.len(), 2, "dual-stack podIPs: {ips:?}");
            assert!(
                ips[0].is_ipv4() && ips[1].is_ipv6(),
                "primary family first: {ips:?}"
            );
            assert!(
                "fd00:10:244::/64"
                    .parse::<ipnetwork::IpNetwork>()
                    .unwrap()
                    .contains(ips[1]),
                "{ips:?}"
            );
            v4.push(ips[0].to_string());
            nodes.push(p.spec.as_ref().unwrap().node_name.clone().unwrap());
        }
        v4.sort();
        nodes.sort();
        assert_eq!(v4, V4, "the pods hold the list's IPs");
        assert_eq!(
            nodes,
            ["lab-node-1", "lab-node-2"],
            "round robin over the pod nodes"
        );

        // the real EndpointSlice controller lists both, ready
        let want: Vec<_> = V4
            .iter()
            .map(|ip| (ip.to_string(), true, true, false))
            .collect();
        endpoints_become(&slices, &want, "both endpoints ready in the EndpointSlice").await;

        // delete one: terminating (still serving) during its 3 s grace, then gone
        let victim = running
            .iter()
            .find(|p| ips(p)[0].to_string() == V4[0])
            .unwrap();
        let name = victim.metadata.name.clone().unwrap();
        let t_del = Instant::now();
        pods.delete(&name, &DeleteParams::default()).await.unwrap();
        until(
            "the deleted pod serving+terminating",
            Duration::from_secs(3),
            || async {
                let eps = endpoints(&slices).await;
                if eps.contains(&(V4[0].to_string(), false, true, true)) {
                    Ok(())
                } else {
                    Err(format!("{eps:?}"))
                }
            },
        )
        .await;
        let during = pods
            .get(&name)
            .await
            .expect("still there during the grace period");
        assert!(
            ready(&during),
            "the kubelet keeps it Ready while it terminates"
        );
        until("the deleted pod gone", Duration::from_secs(15), || async {
            match pods.get_opt(&name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        })
        .await;
        let gone_after = t_del.elapsed();
        assert!(
            gone_after >= Duration::from_secs(2),
            "deleted only at the end of its grace period, not at once ({gone_after:?})"
        );
        eprintln!("deleted pod gone {gone_after:?} after the DELETE (grace 3 s)");
        // its IPv4 address was the last free one of the list: the ReplicaSet's
        // replacement gets it now, and the slice is back to two ready endpoints
        endpoints_become(&slices, &want, "the replacement with the freed IP, ready").await;
        eprintln!("lab kubelet test done in {:?}", t_start.elapsed());
    }

    /// With kube-scheduler running, the kubelet binds nothing: kube-scheduler places the
    /// pods on the kubelet's nodes (Ready, their not-ready taint lifted), as its
    /// Scheduled events show, and the kubelet then runs them.
    #[tokio::test]
    async fn with_kube_scheduler_the_scheduler_binds_and_the_kubelet_runs() {
        let t_start = Instant::now();
        let cp = ringlb_e2e::controlplane::ControlPlane::start(ringlb_e2e::controlplane::Options {
            scheduler: true,
            ..Default::default()
        })
        .await
        .expect("the control plane starts with kube-scheduler");
        let _kubelet = cp
            .start_kubelet(KubeletOptions {
                nodes: vec![LabNode::new("sched-node-1"), LabNode::new("sched-node-2")],
                pod_ips: V4.iter().map(|s| s.parse().unwrap()).collect(),
                pod_cidrs: Vec::new(),
            })
            .await
            .unwrap();
        cp.apply_yaml(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n\
             spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n\
             \x20   metadata: {labels: {app: web}}\n    spec:\n\
             \x20     containers: [{name: web, image: lab/web}]\n",
        )
        .await
        .unwrap();
        let pods: Api<Pod> = Api::namespaced(cp.client().await, "default");
        let running = until(
            "2 Ready pods placed by kube-scheduler",
            Duration::from_secs(60),
            || async {
                let list = pods.list(&ListParams::default().labels("app=web")).await;
                let list = list.map_err(|e| e.to_string())?.items;
                if list.len() == 2 && list.iter().all(ready) {
                    Ok(list)
                } else {
                    Err(format!("{} pods", list.len()))
                }
            },
        )
        .await;
        let mut v4: Vec<String> = running.iter().map(|p| ips(p)[0].to_string()).collect();
        v4.sort();
        assert_eq!(v4, V4);
        // the binding came from kube-scheduler: its Scheduled events name the nodes
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(cp.client().await, "default");
        let scheduled = until(
            "kube-scheduler's Scheduled events",
            Duration::from_secs(10),
            || async {
                let list = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let from_scheduler: Vec<String> = list
                    .items
                    .iter()
                    .filter(|e| e.reason.as_deref() == Some("Scheduled"))
                    .filter(|e| e.reporting_controller.as_deref() == Some("default-scheduler"))
                    .filter_map(|e| e.note.clone())
                    .collect();
                if from_scheduler.len() == 2 {
                    Ok(from_scheduler)
                } else {
                    Err(format!("{from_scheduler:?}"))
                }
            },
        )
        .await;
        eprintln!("{scheduled:?}; done in {:?}", t_start.elapsed());
    }
}

/// The chart the tests apply RBAC from is one helm accepts: `helm lint` passes and
/// `helm template` renders the ServiceAccounts into the release namespace.
#[test]
fn helm_lints_and_renders_the_chart() {
    let assets = ringlb_e2e::controlplane::Assets::find().unwrap_or_else(|e| panic!("{e}"));
    let helm = assets
        .helm()
        .unwrap_or_else(|| panic!("no helm in {}: run `make k8s`", assets.dir.display()));
    let chart = ringlb_e2e::controlplane::chart_dir();
    let lint = std::process::Command::new(&helm)
        .arg("lint")
        .arg(&chart)
        .output()
        .expect("helm runs");
    assert!(
        lint.status.success(),
        "helm lint: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    let yaml = ringlb_e2e::controlplane::helm_template_rbac(&helm, "lb-system")
        .expect("helm template renders the RBAC");
    for sa in ["ringlb-controller", "ringlb-edge"] {
        assert!(
            yaml.contains(&format!(
                "kind: ServiceAccount\nmetadata:\n  name: {sa}\n  namespace: lb-system"
            )),
            "ServiceAccount {sa} in lb-system:\n{yaml}"
        );
    }
    assert!(!yaml.contains("{{"), "unrendered template left:\n{yaml}");
}
