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
    let mut failures = Vec::new();
    bad_objects_are_refused_naming_field_and_rule(&cp, &mut failures);
    good_objects_on_the_rules_edges_are_accepted(&cp, &mut failures);
    kubectl_get_ippools_shows_free_addresses_and_overlaps(&cp);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// An IPPool named `name` with `spec`.
fn pool(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

/// A BGPPeer with myASN 64512 and `spec` (which names peerAddress unless it is
/// the field under test).
fn peer(name: &str, spec: &str) -> String {
    let addr = if spec.contains("peerAddress:") {
        ""
    } else {
        "  peerAddress: 192.0.2.1\n"
    };
    format!(
        "apiVersion: ringlb.io/v1alpha1\nkind: BGPPeer\nmetadata:\n  name: {name}\n\
         spec:\n{addr}  myASN: 64512\n{spec}"
    )
}

/// Every bad IPPool and BGPPeer is refused, kubectl's output naming the field path and
/// the rule's message; what is not so goes to `failures`.
fn bad_objects_are_refused_naming_field_and_rule(cp: &ControlPlane, failures: &mut Vec<String>) {
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
                "host-bits",
                "  cidrs: [\"192.0.2.0/28\", \"10.9.1.5/24\"]\n",
            ),
            &[
                "spec.cidrs[1]: Invalid value",
                "10.9.1.5/24 has host bits set; write its network address",
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
    for (yaml, wanted) in &bad {
        let (ok, out) = apply(cp, yaml);
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
}

/// Good objects on the edges of the same rules are accepted (else: to `failures`).
fn good_objects_on_the_rules_edges_are_accepted(cp: &ControlPlane, failures: &mut Vec<String>) {
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
        let (ok, out) = apply(cp, &yaml);
        if !ok {
            failures.push(format!("refused a valid object:\n{yaml}\n{out}"));
        }
    }
}

/// `kubectl get ippools` shows free addresses per family and overlaps, from the
/// status the controller writes (written here by hand on IPPool `v4`).
fn kubectl_get_ippools_shows_free_addresses_and_overlaps(cp: &ControlPlane) {
    let (ok, out) = kubectl_stdin(
        cp,
        &[
            "patch",
            "ippool",
            "v4",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"ipv4":{"allocated":1,"free":"0"},"ipv6":{"allocated":0,"free":"1"},
                "conditions":[{"type":"Overlapping","status":"True","reason":"Overlaps",
                "message":"overlaps pool(s) one","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
        ],
        "",
    );
    assert!(ok, "kubectl patch --subresource=status: {out}");
    let (ok, out) = kubectl_stdin(cp, &["get", "ippools", "v4"], "");
    assert!(ok, "kubectl get ippools: {out}");
    eprintln!("---- kubectl get ippools v4:\n{out}");
    // Columns: NAME AUTO PRIORITY V4-USED V4-FREE V6-USED V6-FREE OVERLAPPING AGE.
    let header = out.lines().next().unwrap_or("");
    assert!(
        header.contains("V6 FREE") && header.contains("OVERLAPPING"),
        "{out}"
    );
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(..8),
        Some(&["v4", "true", "0", "1", "0", "0", "1", "True"][..]),
        "{out}"
    );
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
        "jsonpath={range .status.conditions[*]}{.type}={.status}/{.reason}{\"\\n\"}{end}",
    ]);
    // this cluster has no BGPAdvertisement: no router is offered the VIP
    assert_eq!(
        conditions.trim(),
        "ringlb.io/IPAllocated=True/Allocated\nringlb.io/BackendsReady=True/BackendsReady\n\
         ringlb.io/Announced=False/NoAdvertisement",
        "each of the controller's conditions is kept"
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
