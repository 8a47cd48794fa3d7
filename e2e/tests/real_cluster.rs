//! ringlb on a real cluster, installed as its users install it (docs/real-cluster.md):
//! four kubelet + containerd nodes (two edges, two workers) in their own network and
//! mount namespaces, registered with node credentials under the Node authorizer and
//! NodeRestriction, the reference CNI plugins, kube-proxy (iptables) and CoreDNS,
//! a BIRD ToR, and `helm install ringlb charts/ringlb -f <values>` from the images
//! `make images` built, imported into every node's containerd (nothing is pulled).
//!
//! - `kubectl get nodes -o wide`: four Ready Nodes with `containerd://` runtimes;
//! - every chart pod (2 controllers, 2 edges, a node agent per node) Running and Ready;
//! - `kubectl create deployment` + `kubectl expose --type=LoadBalancer`, dual-stack:
//!   an IPv4 and an IPv6 VIP in the Service's status, ECMP over both edges at the ToR
//!   for each;
//! - HTTP from the client reaches pods on both workers over IPv4 and IPv6, each pod
//!   sees the client's own address, every reply comes from a worker (the ToR counts
//!   no frame with a VIP source from an edge) and the edges carried the requests
//!   (IPIP from both);
//! - a pod reaches the VIP from inside the cluster (kube-proxy, `ipMode: VIP`);
//! - `helm uninstall` leaves no ringlb object, no BPF program, link or pin on any
//!   node, and no VIP route at the ToR.
//!
//! Needs root and what scripts/setup.sh installs, the Go builds of `make k8s`, the
//! images of `make images` and scripts/build-test-images.sh; skips loudly when not
//! root or a tool is missing, fails when a build is missing.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ringlb_e2e::realcluster::{self, Options, RealCluster, workload::WEB};

mod real_cluster_util;
use real_cluster_util::{faults::*, *};

/// Not root, or a tool missing: skip (a failure under `CI=true`).
fn skip() -> bool {
    if let Some(why) = realcluster::skip_reason() {
        ringlb_testkit::tier::skip(format_args!("real cluster: {why}"));
        return true;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_on_real_kubelets_serves_a_dual_stack_loadbalancer_by_dsr() {
    if skip() {
        return;
    }
    let prefix = format!("rc{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("ringlb-{prefix}"));
    let t0 = Instant::now();
    let rc = RealCluster::up(Options::new(&prefix, &dir))
        .await
        .unwrap_or_else(|e| panic!("bringing the cluster up: {e}"));
    eprintln!(
        "cluster up in {:.1} s: {:?}",
        t0.elapsed().as_secs_f64(),
        rc.timings
    );
    tokio::task::block_in_place(|| scenario(&rc));
}

fn scenario(rc: &RealCluster) {
    installed(rc);
    let (v4, v6) = exposed(rc);
    dsr_from_the_client(rc, v4, v6);
    pods_on_edges_are_served(rc, v4, v6);
    from_inside_the_cluster(rc, v4);
    finalizer_goes_after_the_route(rc);
    uninstalled(rc, v4);
}

/// A second Service of the same pods, deleted: its cleanup finalizer is removed only
/// after its route has left the ToR (each edge's Lease acknowledges the cleared
/// status once it has withdrawn it). Polled as: the Service first, then the route,
/// so a route still at the ToR after the Service was seen gone fails the test.
fn finalizer_goes_after_the_route(rc: &RealCluster) {
    let leases = rc
        .kubectl(&[
            "get",
            "leases",
            "-n",
            "ringlb-system",
            "-l",
            "ringlb.io/edge-ack=true",
            "-o",
            "jsonpath={.items[*].spec.holderIdentity}",
        ])
        .unwrap();
    assert_eq!(
        leases.split_whitespace().count(),
        2,
        "an edge Lease per edge: {leases:?}"
    );
    rc.kubectl(&[
        "expose",
        "deployment",
        WEB,
        "--name=gone",
        "--type=LoadBalancer",
        "--port=81",
        &format!("--target-port={}", realcluster::workload::TARGET_PORT),
    ])
    .unwrap();
    let vip: IpAddr = ringlb_e2e::lab::wait_for(
        "Service gone to get a VIP",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let ip = rc.kubectl(&[
                "get",
                "service",
                "gone",
                "-o",
                "jsonpath={.status.loadBalancer.ingress[0].ip}",
            ])?;
            Ok(ip.trim().parse::<IpAddr>().map_err(|_| ip))
        },
    )
    .unwrap();
    rc.wait_ecmp(vip, 2, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    rc.kubectl(&["delete", "service", "gone", "--wait=false"])
        .unwrap();
    let prefix = format!("{vip}/32");
    let mut route_left = None;
    // (when the Service was seen gone, a route still at the ToR after that)
    let (gone, late_route) = ringlb_e2e::lab::wait_for(
        "Service gone to be deleted",
        Duration::from_secs(40),
        Duration::from_millis(20),
        || {
            let svc =
                rc.kubectl(&["get", "service", "gone", "--ignore-not-found", "-o", "name"])?;
            let hops = rc.tor_next_hops(&prefix, false)?;
            if hops.is_empty() && route_left.is_none() {
                route_left = Some(t.elapsed());
            }
            Ok(if svc.trim().is_empty() {
                Ok((t.elapsed(), (!hops.is_empty()).then(|| format!("{hops:?}"))))
            } else {
                Err(format!("still there; next hops {hops:?}"))
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "Service gone deleted: its route left the ToR after {route_left:?}, the Service \
         was gone by {gone:?}"
    );
    assert_eq!(
        late_route, None,
        "the Service went before its route left the ToR"
    );
    assert!(
        route_left.is_some_and(|r| r <= gone),
        "{route_left:?} {gone:?}"
    );
}

/// Four Ready nodes on containerd; `helm install --wait`; every chart pod Ready.
fn installed(rc: &RealCluster) {
    let nodes = rc.kubectl(&["get", "nodes", "-o", "wide"]).unwrap();
    eprintln!("{nodes}");
    assert_eq!(
        nodes.matches("containerd://").count(),
        4,
        "four nodes on containerd:\n{nodes}"
    );
    assert_eq!(nodes.matches(" Ready ").count(), 4, "{nodes}");

    let t = Instant::now();
    let installed = rc.helm_install("").unwrap_or_else(|e| {
        panic!(
            "helm install: {e}\n{}",
            rc.kubectl(&["get", "pods", "-A", "-o", "wide"])
                .unwrap_or_default()
        )
    });
    eprintln!(
        "helm install --wait: {:.1} s\n{installed}",
        t.elapsed().as_secs_f64()
    );
    let pods = rc
        .kubectl(&["get", "pods", "-n", "ringlb-system", "-o", "wide"])
        .unwrap();
    eprintln!("{pods}");
    let running = pods.lines().filter(|l| l.contains("Running")).count();
    assert_eq!(
        running,
        2 + 2 + 4,
        "2 controllers, 2 edges, a node agent on every node:\n{pods}"
    );
    for l in pods.lines().skip(1) {
        let ready = l.split_whitespace().nth(1).unwrap_or("");
        let (a, b) = ready.split_once('/').unwrap_or(("0", "1"));
        assert_eq!(a, b, "not Ready: {l}");
    }
    // the node that started without a bpffs got one from the chart's init container
    for n in rc.plan.nodes.iter().filter(|n| !n.bpffs) {
        let fs = rc
            .node(&n.name)
            .unwrap()
            .exec(&["stat", "-f", "-c", "%T", "/sys/fs/bpf"])
            .unwrap();
        assert_eq!(fs.trim(), "bpf_fs", "node {}: /sys/fs/bpf is {fs}", n.name);
    }
    let init = rc
        .kubectl(&[
            "logs",
            "-n",
            "ringlb-system",
            "-l",
            "app.kubernetes.io/component=node",
            "-c",
            "mount-bpffs",
            "--tail=5",
        ])
        .unwrap();
    assert!(
        init.contains("mounted a bpffs"),
        "no node agent mounted one:\n{init}"
    );
    // what `kubectl logs` shows a log collector: plain lines, no colour escapes
    for c in ["controller", "edge", "node"] {
        let logs = rc
            .kubectl(&[
                "logs",
                "-n",
                "ringlb-system",
                "-l",
                &format!("app.kubernetes.io/component={c}"),
                "--tail=40",
            ])
            .unwrap();
        assert!(!logs.trim().is_empty(), "no {c} log lines");
        assert!(!logs.contains('\x1b'), "{c} logs carry escapes:\n{logs}");
    }
}

/// `kubectl create deployment` + `expose --type=LoadBalancer`, dual-stack: a VIP of
/// each family, ECMP over both edges at the ToR for each.
fn exposed(rc: &RealCluster) -> (IpAddr, IpAddr) {
    rc.deploy_web(4, false).unwrap();
    rc.expose_web().unwrap();
    let (v4, v6) = rc
        .wait_vips(WEB, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("VIPs {v4} {v6}");
    for vip in [v4, v6] {
        let hops = rc
            .wait_ecmp(vip, 2, Duration::from_secs(60))
            .unwrap_or_else(|e| {
                panic!(
                    "{e}\n{}",
                    rc.birdc(&["show", "protocols"]).unwrap_or_default()
                )
            });
        eprintln!("{vip}: next hops {hops:?}");
    }
    (v4, v6)
}

/// From the client over both families: the pod sees the client, pods on both workers
/// answer, the edges encapsulated and no reply came back through an edge.
fn dsr_from_the_client(rc: &RealCluster, v4: IpAddr, v6: IpAddr) {
    rc.count_vip_sources().unwrap();
    let pods = rc.web_pods().unwrap();
    let workers: Vec<&str> = rc.plan.workers().map(|n| n.name.as_str()).collect();
    for (vip, client) in [
        (v4, IpAddr::from(realcluster::plan::CLIENT_V4)),
        (v6, IpAddr::from(realcluster::plan::CLIENT_V6)),
    ] {
        let seen = rc
            .get(vip, "clientip")
            .unwrap_or_else(|e| panic!("GET {vip}: {e}"));
        let addr = seen.trim().rsplit_once(':').map(|(a, _)| a).unwrap_or("");
        assert_eq!(
            addr.trim_matches(|c| c == '[' || c == ']'),
            client.to_string(),
            "the pod sees the client's own address"
        );
        let spread = rc.spread(vip, 40).unwrap_or_else(|e| panic!("{vip}: {e}"));
        eprintln!("{vip}: {spread:?}");
        let nodes_hit: std::collections::BTreeSet<&str> = spread
            .keys()
            .filter_map(|p| pods.get(p).map(String::as_str))
            .collect();
        for w in &workers {
            assert!(
                nodes_hit.contains(w),
                "{vip}: no answer from a pod on {w}: {spread:?} (pods {pods:?})"
            );
        }
    }
    let counters = rc.vip_source_counters().unwrap();
    eprintln!("ToR counters: {counters:?}");
    for e in rc.plan.edges() {
        assert_eq!(
            counters.get(&format!("{}-reply", e.name)),
            Some(&0),
            "a reply went through edge {}: {counters:?}",
            e.name
        );
        assert!(
            counters
                .get(&format!("{}-encap", e.name))
                .copied()
                .unwrap_or(0)
                > 0,
            "edge {} encapsulated nothing: {counters:?}",
            e.name
        );
    }
    let replies: u64 = workers
        .iter()
        .map(|w| counters.get(&format!("{w}-reply")).copied().unwrap_or(0))
        .sum();
    assert!(replies > 0, "{counters:?}");
}

/// Pods on the edge nodes too, as on a real cluster where edges are ordinary nodes:
/// the edge passes their packets to the node agent on its own node.
fn pods_on_edges_are_served(rc: &RealCluster, v4: IpAddr, v6: IpAddr) {
    rc.kubectl(&[
        "patch",
        "deployment",
        WEB,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/template/spec/affinity"},{"op":"replace","path":"/spec/replicas","value":8}]"#,
    ])
    .unwrap();
    rc.kubectl(&["rollout", "status", "deployment/web", "--timeout=120s"])
        .unwrap();
    let pods = rc.web_pods().unwrap();
    let on_edges: Vec<&String> = pods
        .iter()
        .filter(|(_, n)| n.starts_with('e'))
        .map(|(p, _)| p)
        .collect();
    eprintln!("pods: {pods:?}");
    assert!(
        !on_edges.is_empty(),
        "the scheduler put no pod on an edge: {pods:?}"
    );
    for vip in [v4, v6] {
        let spread = rc.spread(vip, 60).unwrap_or_else(|e| panic!("{vip}: {e}"));
        eprintln!("{vip} with pods on the edges: {spread:?}");
        for p in &on_edges {
            assert!(
                spread.contains_key(p.as_str()),
                "{vip}: the pod {p} on an edge node never answered: {spread:?}"
            );
        }
    }
}

/// From inside the cluster: kube-proxy carries a pod's traffic to the VIP.
fn from_inside_the_cluster(rc: &RealCluster, v4: IpAddr) {
    let pods = rc.web_pods().unwrap();
    let pod = pods.keys().next().unwrap().clone();
    let inside = rc
        .kubectl(&[
            "exec",
            &pod,
            "--",
            "curl",
            "-sS",
            "--max-time",
            "3",
            &format!("http://{v4}/hostname"),
        ])
        .unwrap_or_else(|e| panic!("a pod reaching the VIP: {e}"));
    assert!(pods.contains_key(inside.trim()), "{inside}");
}

/// Uninstall with the Service still there: the chart's post-delete hook takes the
/// controller's cleanup finalizer off it; nothing of ringlb is left on any node or
/// at the ToR.
fn uninstalled(rc: &RealCluster, v4: IpAddr) {
    let fin = web_field(rc, ".metadata.finalizers");
    assert!(
        fin.contains("service.kubernetes.io/load-balancer-cleanup"),
        "the controller put its cleanup finalizer on: {fin:?}"
    );
    rc.helm(&[
        "uninstall",
        "ringlb",
        "-n",
        "ringlb-system",
        "--wait",
        "--timeout",
        "180s",
    ])
    .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    let fin = web_field(rc, ".metadata.finalizers");
    assert!(
        !fin.contains("load-balancer-cleanup"),
        "the finalizer outlived the uninstall: {fin:?}"
    );
    rc.kubectl(&["delete", "service", WEB, "--wait=true", "--timeout=30s"])
        .unwrap();
    let left = ringlb_e2e::lab::wait_for(
        "no ringlb pod left",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let out = rc.kubectl(&["get", "pods", "-n", "ringlb-system", "-o", "name"])?;
            Ok(if out.trim().is_empty() {
                Ok(())
            } else {
                Err(out)
            })
        },
    );
    left.unwrap();
    let leases = rc
        .kubectl(&[
            "get",
            "leases",
            "-A",
            "-l",
            "ringlb.io/edge-ack=true",
            "-o",
            "name",
        ])
        .unwrap();
    assert!(leases.trim().is_empty(), "edge Leases left: {leases}");
    for n in &rc.nodes {
        let pins = n.exec(&["sh", "-c", "ls -A /sys/fs/bpf"]).unwrap();
        assert!(
            !pins.contains("ringlb"),
            "node {}: pins left in /sys/fs/bpf: {pins}",
            n.plan.name
        );
        // XDP, tc and tcx attachments on the uplink
        let net = n.exec(&["bpftool", "net", "show", "dev", "eth0"]).unwrap();
        assert!(
            !net.contains("ringlb"),
            "node {}: a program left on eth0:\n{net}",
            n.plan.name
        );
    }
    let routes = ringlb_e2e::lab::wait_for(
        "the VIP routes to leave the ToR",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let out = rc.birdc(&["show", "route"])?;
            Ok(if out.contains(&v4.to_string()) {
                Err(out)
            } else {
                Ok(())
            })
        },
    );
    routes.unwrap();
    // a reinstall elects a leader at once: the old leader released its Lease
    let t = Instant::now();
    rc.helm_install("")
        .unwrap_or_else(|e| panic!("helm install again: {e}"));
    let ready = t.elapsed();
    let lead = ringlb_e2e::lab::wait_for(
        "a leader after the reinstall",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let l = leader(rc);
            Ok(if l.is_empty() { Err(l) } else { Ok(l) })
        },
    )
    .unwrap();
    let after = t.elapsed().saturating_sub(ready);
    eprintln!(
        "reinstalled: pods Ready after {:.1} s, {lead} leads {} ms later",
        ready.as_secs_f64(),
        after.as_millis()
    );
    assert!(
        after < Duration::from_secs(3),
        "the leader came {after:?} after the pods were Ready"
    );
}

/// The faults of a real cluster, each with 100 long-lived connections open and a loop
/// of new connections running: the controller's leader pod deleted (no VIP changes),
/// an edge pod deleted (0 broken), a rolling `helm upgrade` of the edges (0 failed),
/// a values change naming an interface no edge has (the roll stops at one edge, 0
/// failed), a worker's containerd and kubelet killed and restarted (0 broken), a worker
/// drained (only connections to its own pods break; new connections are counted), and
/// an edge node cut off (out of the ToR's ECMP within the BFD time). kube-proxy runs
/// in nftables mode here (iptables in the other real-cluster tests), so `make test`
/// covers both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_on_real_kubelets_break_no_connection() {
    if skip() {
        return;
    }
    let prefix = format!("rf{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("ringlb-{prefix}"));
    let mut o = Options::new(&prefix, &dir);
    o.proxy_mode = realcluster::ProxyMode::Nftables;
    let mut rc = RealCluster::up(o)
        .await
        .unwrap_or_else(|e| panic!("bringing the cluster up: {e}"));
    tokio::task::block_in_place(|| faults(&mut rc));
}

fn faults(rc: &mut RealCluster) {
    rc.helm_install("")
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    rc.deploy_web(4, false).unwrap();
    rc.expose_web().unwrap();
    let (v4, v6) = rc.wait_vips(WEB, Duration::from_secs(30)).unwrap();
    rc.wait_ecmp(v4, 2, Duration::from_secs(60)).unwrap();
    rc.wait_ecmp(v6, 2, Duration::from_secs(60)).unwrap();
    leader_deleted(rc);
    let client = rc.plan.ns("client");
    edge_pod_deleted(rc, &client, v4);
    edges_rolled(rc, &client, v4);
    attach_mode_upgraded(rc);
    wrong_interface_stops_the_roll(rc, &client, v4);
    worker_daemons_restarted(rc, &client, v4);
    worker_drained(rc, &client, v4);
    edge_cut_off(rc, v4);
}
