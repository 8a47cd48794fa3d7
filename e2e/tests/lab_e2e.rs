//! The full path, as `make demo` shows it, with assertions: in network namespaces,
//! the real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager on
//! the host, bridged to the ToR; the lab kubelet for the pods), ringlb-controller, a
//! BIRD ToR, two `ringlb-edge run` agents (native XDP, BGP from a BGPPeer object), two
//! worker nodes running `ringlb-edge node` (tc decap, VIP:80 -> pod:8080, replies
//! back), one pod behind each. The controller, the edges and the node agents
//! authenticate as the chart's ServiceAccounts, under the chart's RBAC. The fabric's
//! MTU is 1500.
//!
//! - the pods are Running and Ready with the lab's pod IPs, one on each worker node,
//!   and kube-controller-manager's EndpointSlice lists both;
//! - `kubectl expose --port=80 --target-port=8080 --type=LoadBalancer` gets a VIP from
//!   the lab's IPPool, and both node agents map it to their pod;
//! - BIRD learns the VIP from both edges and the ToR's kernel route has 2 next hops;
//! - HTTP from the client to VIP:80 reaches both pods, which see it on their own
//!   address and port 8080; every client packet was IPIP-encapsulated by an edge (both
//!   edges carried traffic), and every reply went from the pod's node straight to the
//!   client as VIP:80 (DSR: nothing from the VIP toward the edges);
//! - the drain this design exists for: 100 long downloads in flight, edge1 drained
//!   (SIGTERM: GRACEFUL_SHUTDOWN, withdraw), then, with edge1 back, 100 more and edge2
//!   killed with `-9`: the ToR drops the edge, every download completes from the one
//!   pod that started it (both edges hold the same Maglev table), no connection
//!   breaks, and new traffic keeps reaching both pods through the other edge;
//! - the upgrade this design exists for: the BGPPeer gets `gracefulRestart` and BFD
//!   100 ms x 3 (BIRD runs `bfd on`, which flushes an edge whose BFD goes down, even
//!   by AdminDown), edge1 (`--on-sigterm restart`) is restarted while 100 long
//!   downloads run: its BFD session is held by the XDP program meanwhile and never
//!   leaves Up at BIRD; BIRD's route
//!   and the ToR's kernel route keep edge1's next hop in every sample (polled every
//!   ~50 ms), the new agent re-reads the pinned maps, re-announces and sends
//!   End-of-RIB, and no download breaks.
//!
//! Needs root, BIRD, nftables, ethtool; skips loudly otherwise. Needs the
//! ringlb-controller and ringlb-edge binaries next to this package's (`make test`
//! builds the whole workspace) and the control plane built by `make k8s` (fails,
//! does not skip, without it).

use std::time::{Duration, Instant};

use ringlb_e2e::lab::daemon::Daemon;
use ringlb_e2e::lab::httpd::SLOW_LINES;
use ringlb_e2e::lab::{self, Addrs, Bins, Cluster, Topology, config};

const REQUESTS: usize = 30;
/// Long downloads in flight when an edge goes (the lab's goal: at least 100).
const SLOW_FLOWS: usize = 100;

fn bins() -> Bins {
    Bins::beside(std::path::Path::new(env!("CARGO_BIN_EXE_ringlb-lab")))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `n` GETs from the client; every one must succeed. Returns the bodies.
fn requests(cluster: &Cluster, vip: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            cluster
                .http_get(vip)
                .unwrap_or_else(|e| panic!("request {i} to {vip}: {e}"))
        })
        .collect()
}

#[test]
fn service_vip_is_announced_by_both_edges_and_served_by_both_pods_with_dsr() {
    if let Some(why) = lab::skip_reason() {
        eprintln!("SKIPPED lab_e2e: {why}");
        return;
    }
    let bins = bins();
    let start = Instant::now();
    let pid = std::process::id();
    let prefix = format!("rlb{pid}");
    let dir = std::env::temp_dir().join(format!("ringlb-lab-test-{pid}"));
    // declared first, dropped last: the daemons stop before the namespaces go
    let topo = Topology::up(&prefix, &dir, Addrs::default()).expect("fabric");
    let a = topo.addrs.clone();
    let mut cluster = Cluster::new(&topo, bins);

    start_the_cluster_as_the_charts_serviceaccounts(&mut cluster);
    the_pods_run_ready_with_the_labs_ips(&cluster, &a);
    let pins: Vec<_> = (1..=a.edges.len()).map(|i| topo.pin_dir(i)).collect();
    cluster.start_edges(&pins).unwrap();
    let xdp = cluster.wait_xdp(Duration::from_secs(15)).unwrap();
    assert!(xdp.iter().all(|l| l.contains("name ringlb_xdp")), "{xdp:?}");

    let pins: Vec<_> = (1..=a.nodes.len()).map(|i| topo.node_pin_dir(i)).collect();
    cluster.start_node_agents(&pins).unwrap();
    let tc = cluster.wait_tc(Duration::from_secs(15)).unwrap();
    eprintln!("node agents: {tc:?}");

    let vip = a_service_gets_a_vip_from_the_pool(&mut cluster, &a);
    let edges = the_tor_learns_the_vip_from_both_edges(&mut cluster, &a, &vip);
    each_edge_says_the_vip_is_healthy(&topo, &a, &vip);
    both_pods_serve_and_replies_bypass_the_edges(&cluster, &topo, &a, &vip);
    let broken =
        downloads_survive_losing_an_edge(&mut cluster, &topo, &dir, &vip, &edges, Loss::Drain);
    assert_eq!(broken, 0, "connections broken by draining edge1");
    cluster
        .start_edge_with(1, &topo.pin_dir(1), RESTART)
        .unwrap();
    cluster.wait_ecmp(&vip, 2, Duration::from_secs(30)).unwrap();
    let broken =
        downloads_survive_losing_an_edge(&mut cluster, &topo, &dir, &vip, &edges, Loss::Kill);
    assert_eq!(broken, 0, "connections broken by kill -9 of edge2");
    cluster.start_edge(2, &topo.pin_dir(2)).unwrap();
    cluster.wait_ecmp(&vip, 2, Duration::from_secs(30)).unwrap();
    let (broken, missing) =
        downloads_survive_a_hitless_restart(&mut cluster, &topo, &dir, &vip, &edges);
    assert_eq!(
        broken, 0,
        "connections broken by the hitless restart of edge1"
    );
    assert!(
        missing.is_empty(),
        "the ToR dropped edge1's next hop during its restart: {missing:?}"
    );
    eprintln!("lab e2e done in {:?}", start.elapsed());
}

/// Pods, BIRD, the control plane and the controller, then the lab's manifests.
fn start_the_cluster_as_the_charts_serviceaccounts(cluster: &mut Cluster) {
    cluster.start_pods().unwrap();
    cluster.start_bird().unwrap();
    let t_cp = Instant::now();
    cluster.start_control_plane().unwrap();
    eprintln!("control plane up and bridged in {:?}", t_cp.elapsed());
    // the programs run as the chart's ServiceAccounts, not as the admin
    for (kc, sa) in [
        (cluster.controller_kubeconfig(), "ringlb-controller"),
        (cluster.edge_kubeconfig(), "ringlb-edge"),
        (cluster.node_kubeconfig(), "ringlb-node"),
    ] {
        let who = cluster
            .kubectl(&[
                "--kubeconfig",
                &kc.display().to_string(),
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ])
            .unwrap();
        assert_eq!(who, format!("system:serviceaccount:ringlb-system:{sa}"));
    }
    cluster.start_controller().unwrap();
    let manifests = cluster.write_manifests().unwrap();
    let applied = cluster.apply(&manifests).unwrap();
    assert!(
        applied.contains("bgppeer.ringlb.io/tor created"),
        "{applied}"
    );
}

/// Waits until the lines `kubectl args` prints are `want`, in any order; returns them.
fn wait_kubectl_lines(
    cluster: &Cluster,
    what: &str,
    timeout: Duration,
    args: &[&str],
    want: &[String],
) -> String {
    lab::wait_for(what, timeout, Duration::from_millis(200), || {
        let out = cluster.kubectl(args)?;
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        Ok(if lines == want { Ok(out) } else { Err(out) })
    })
    .unwrap()
}

/// The Deployment's two pods, Running and Ready, one on each worker node with the IP
/// of the pod namespace behind it.
fn the_pods_run_ready_with_the_labs_ips(cluster: &Cluster, a: &Addrs) {
    // the lab kubelet runs the Deployment's pods with the lab's pod IPs, and the real
    // EndpointSlice controller lists both as ready
    let want: Vec<String> = a
        .pods
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("{ip} node{} True", i + 1))
        .collect();
    let pods = wait_kubectl_lines(
        cluster,
        "2 Running+Ready pods with the lab's IPs, one per worker node",
        Duration::from_secs(30),
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            r#"jsonpath={range .items[*]}{.status.podIP} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
        ],
        &want,
    );
    eprintln!("pods:\n{pods}");
}

/// `kubectl expose` (port 80, targetPort 8080): the Service gets a VIP from the lab's
/// pool, kube-controller-manager's EndpointSlice lists both pods ready, and both node
/// agents program the mapping for their pod. Returns the VIP.
fn a_service_gets_a_vip_from_the_pool(cluster: &mut Cluster, a: &Addrs) -> String {
    cluster.expose("web").unwrap();
    let vip = cluster.wait_vip("web", Duration::from_secs(10)).unwrap();
    let want: Vec<String> = a.pods.iter().map(|ip| format!("{ip} true")).collect();
    let slice = wait_kubectl_lines(
        cluster,
        "kube-controller-manager's EndpointSlice for web with both pods ready",
        Duration::from_secs(20),
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            r#"jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {.conditions.ready}{"\n"}{end}"#,
        ],
        &want,
    );
    eprintln!("endpoints:\n{slice}");
    let v: std::net::Ipv4Addr = vip.parse().expect("an IPv4 VIP");
    let (lo, hi): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
        (a.vip_first.parse().unwrap(), a.vip_last.parse().unwrap());
    assert!(lo <= v && v <= hi, "VIP {vip} is from the lab pool");
    let table = cluster.kubectl(&["get", "svc", "web"]).unwrap();
    assert!(table.contains(&vip), "kubectl get svc shows it: {table}");
    assert!(table.contains("80:"), "port 80: {table}");
    cluster
        .wait_node_services(&vip, Duration::from_secs(15))
        .unwrap();
    vip
}

/// The ToR learns `vip` from both edges: ECMP in BIRD and in the kernel, and the
/// BGPPeer's status names both edges. Returns the edges' addresses.
fn the_tor_learns_the_vip_from_both_edges(
    cluster: &mut Cluster,
    a: &Addrs,
    vip: &str,
) -> Vec<std::net::IpAddr> {
    cluster.wait_ecmp(vip, 2, Duration::from_secs(30)).unwrap();
    let (_, bird_hops, _, kernel_hops) = cluster.routes(vip).unwrap();
    let edges: Vec<std::net::IpAddr> = a.edges.iter().map(|e| e.parse().unwrap()).collect();
    assert_eq!(bird_hops, edges, "BIRD has a path through each edge");
    assert_eq!(kernel_hops, edges, "the kernel route has both next hops");
    let status = cluster
        .wait_peer_status("tor", Duration::from_secs(15))
        .unwrap();
    assert!(
        status.contains("edge1") && status.contains("edge2"),
        "{status}"
    );
    edges
}

/// docs/gtm.md's health probe, `curl -s -w '%{http_code}\n' URL`, against each real
/// edge's ops port: 200, healthy, both pods ready.
fn each_edge_says_the_vip_is_healthy(topo: &Topology, a: &Addrs, vip: &str) {
    for i in 1..=a.edges.len() {
        let url = format!("http://127.0.0.1:9090/health/vip/{vip}/80");
        let ns = topo.ns(&format!("edge{i}"));
        let out = lab::cmd::run_in(&ns, &["curl", "-s", "-w", "%{http_code}\n", &url])
            .unwrap_or_else(|e| panic!("curl on edge{i}: {e}"));
        let lines: Vec<&str> = out.split_terminator('\n').collect();
        assert_eq!(lines.len(), 2, "edge{i}: {out:?}");
        assert_eq!(lines[1], "200", "edge{i}: {out}");
        let body: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(body["state"], "healthy", "edge{i}: {body}");
        assert_eq!(body["readyBackends"], 2, "edge{i}: {body}");
        assert_eq!(body["announced"], true, "edge{i}: {body}");
    }
}

/// Traffic: both pods serve, both edges encapsulate, replies bypass the edges.
fn both_pods_serve_and_replies_bypass_the_edges(
    cluster: &Cluster,
    topo: &Topology,
    a: &Addrs,
    vip: &str,
) {
    let before = topo.counters().unwrap();
    let bodies = requests(cluster, vip, REQUESTS);
    let after = topo.counters().unwrap();
    let d = |k: &str| after[k] - before[k];
    let per_pod = config::count_answers(bodies.iter().map(String::as_str));
    eprintln!("answers per pod: {per_pod:?}; counters: {after:?}");
    assert_eq!(
        per_pod.keys().map(String::as_str).collect::<Vec<_>>(),
        ["pod1", "pod2"],
        "both pods answer: {per_pod:?}"
    );
    // the client asked VIP:80 (curl got its answer from there); each pod saw the
    // connection on its own address and port 8080: the node agent translated both ways
    for b in &bodies {
        let (pod, local) = b.trim().split_once(' ').unwrap_or_default();
        let i: usize = pod.trim_start_matches("pod").parse().unwrap_or(0);
        assert!(
            i >= 1 && local == format!("{}:{}", a.pods[i - 1], a.target_port),
            "{pod} saw the connection on {local}, want its own address and :8080"
        );
    }
    assert!(
        d("ipip_from_edge1") > 0 && d("ipip_from_edge2") > 0,
        "both edges carried traffic (ECMP): {after:?}"
    );
    assert_eq!(
        d("ipip_from_edge1") + d("ipip_from_edge2"),
        d("to_vip"),
        "every client packet to the VIP was IPIP-encapsulated by an edge"
    );
    assert!(
        d("to_vip") >= 3 * REQUESTS as u64,
        "the requests went through the ToR"
    );
    assert!(
        d("replies_to_client") >= 2 * REQUESTS as u64,
        "replies went from the pods to the client: {after:?}"
    );
    assert_eq!(d("replies_toward_edges"), 0, "DSR: no reply passed an edge");
}

/// `run` flags of an edge that restarts hitlessly on SIGTERM.
const RESTART: &[&str] = &["--on-sigterm", "restart"];

/// Graceful restart on the BGPPeer, then edge1 restarted (SIGTERM with
/// `--on-sigterm restart`, a new agent on the same pins) while `SLOW_FLOWS`
/// downloads run. A thread polls BIRD's and the kernel's routes to the VIP the whole
/// time. Returns the broken downloads and the samples that lacked edge1.
fn downloads_survive_a_hitless_restart(
    cluster: &mut Cluster,
    topo: &Topology,
    dir: &std::path::Path,
    vip: &str,
    edges: &[std::net::IpAddr],
) -> (usize, Vec<String>) {
    // Graceful restart, and BFD (100 ms x 3) against BIRD's `bfd on`: a BFD session
    // going down, AdminDown included, flushes the edge at once, so the restart is
    // hitless only because the XDP program answers the ToR's BFD meanwhile (BFD held
    // by the datapath, docs/bgp.md).
    let patch = r#"{"spec":{"gracefulRestart":{"restartTime":60},"bfd":{"minRxMs":100,"minTxMs":100,"multiplier":3}}}"#;
    cluster
        .kubectl(&["patch", "bgppeer", "tor", "--type", "merge", "-p", patch])
        .unwrap();
    // The sessions restart with the capability; wait until BIRD has it from both,
    // and both BFD sessions are Up.
    lab::wait_for(
        "BIRD sees graceful restart and BFD Up from both edges",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let n = (1..=2)
                .filter(|i| {
                    cluster
                        .birdc(&["show", "protocols", "all", &format!("edge{i}")])
                        .is_ok_and(|s| s.contains("Established") && s.contains("Restart time: 60"))
                })
                .count();
            let bfd = bfd_up(cluster);
            Ok(if n == 2 && bfd == 2 {
                Ok(())
            } else {
                Err(format!("{n} of 2 with GR, {bfd} BFD sessions Up"))
            })
        },
    )
    .unwrap();
    let bird_log = dir.join("bird.log");
    let bfd_changes_before = bfd_changes(&bird_log, edges[0]).len();
    cluster.wait_ecmp(vip, 2, Duration::from_secs(30)).unwrap();

    let mut slow = start_slow_downloads(topo, dir, vip, "Restart");
    std::thread::sleep(Duration::from_millis(700));
    let probe = cluster.route_probe();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (stop, vip, edge1) = (stop.clone(), vip.to_string(), edges[0]);
        std::thread::spawn(move || {
            let (mut samples, mut missing) = (0usize, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match probe.sample(&vip) {
                    Ok((bird, kernel)) => {
                        samples += 1;
                        if !bird.contains(&edge1) || !kernel.contains(&edge1) {
                            missing.push(format!("BIRD via {bird:?}, kernel via {kernel:?}"));
                        }
                    }
                    Err(e) => missing.push(format!("probe failed: {e}")),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (samples, missing)
        })
    };
    let t = Instant::now();
    cluster.terminate("edge1", Duration::from_secs(10)).unwrap();
    let down = t.elapsed();
    // read before the new agent's log replaces it
    let old_log = std::fs::read_to_string(dir.join("edge1.log")).unwrap_or_default();
    cluster
        .start_edge_with(1, &topo.pin_dir(1), RESTART)
        .unwrap();
    lab::wait_for(
        "edge1 Established again",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            let s = cluster.birdc(&["show", "protocols", "edge1"])?;
            Ok(if s.contains("Established") {
                Ok(())
            } else {
                Err(s)
            })
        },
    )
    .unwrap();
    let up = t.elapsed();
    let status = cluster
        .wait_peer_status("tor", Duration::from_secs(30))
        .unwrap();
    let announced = t.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (samples, missing) = poller.join().unwrap();
    let changes = bfd_changes(&bird_log, edges[0])[bfd_changes_before..].to_vec();
    eprintln!(
        "hitless restart of edge1: old agent gone after {down:?}, session Established again \
         after {up:?}, VIP re-announced (BGPPeer status) after {announced:?}; edge1's next hop \
         in BIRD and the kernel in {} of {samples} samples; BIRD's BFD state changes for \
         edge1: {changes:?}\n{status}",
        samples - missing.len()
    );
    assert!(
        samples > 20,
        "the ToR was polled too rarely: {samples} samples"
    );
    assert!(
        missing.is_empty(),
        "the ToR dropped edge1's next hop during its restart: {missing:?}"
    );
    // BIRD's BFD session with edge1 never left Up: the old agent left it to the
    // XDP program, the new agent resumed the same session; both are Up now
    assert!(
        changes.is_empty(),
        "BIRD's BFD session with edge1 changed state: {changes:?}"
    );
    assert_eq!(bfd_up(cluster), 2, "both BFD sessions Up after the restart");
    assert!(
        old_log.contains("BFD session held by XDP"),
        "edge1 did not hold its BFD session:\n{old_log}"
    );
    let new_log = std::fs::read_to_string(dir.join("edge1.log")).unwrap_or_default();
    assert!(
        new_log.contains("BFD session resumed Up"),
        "the new edge1 did not resume the held session:\n{new_log}"
    );
    let broken = finish_downloads(&mut slow, "Restart");
    (broken.len(), missing)
}

/// BFD sessions Up at BIRD (`birdc show bfd sessions`).
fn bfd_up(cluster: &Cluster) -> usize {
    cluster
        .birdc(&["show", "bfd", "sessions"])
        .map_or(0, |s| s.matches(" Up ").count())
}

/// BIRD's BFD state changes for `edge` (its log, `debug { events }`).
fn bfd_changes(bird_log: &std::path::Path, edge: std::net::IpAddr) -> Vec<String> {
    let needle = format!("Session to {edge} changed state");
    std::fs::read_to_string(bird_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_string)
        .collect()
}

/// Waits for the downloads; returns a line per broken one.
fn finish_downloads(slow: &mut [(Daemon, std::path::PathBuf)], what: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (d, out) in slow.iter_mut() {
        let st = d.wait_exit(Duration::from_secs(30)).unwrap();
        let body = std::fs::read_to_string(&*out).unwrap_or_default();
        let pods = config::count_answers(body.lines());
        let whole = pods.values().sum::<usize>() == SLOW_LINES && pods.len() == 1;
        if !st.success() || !whole {
            broken.push(format!("{}: {st}, {pods:?}: {}", d.name, d.log_tail(2)));
        }
    }
    eprintln!(
        "{what}: {} of {SLOW_FLOWS} long downloads broke{}",
        broken.len(),
        if broken.is_empty() {
            String::new()
        } else {
            format!(": {broken:#?}")
        }
    );
    broken
}

/// How the test takes an edge away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// SIGTERM to edge1: GRACEFUL_SHUTDOWN, withdraw, exit (the XDP program stays).
    Drain,
    /// `kill -9` of edge2: the ToR notices when the hold time (3 s) runs out.
    Kill,
}

/// `SLOW_FLOWS` long downloads in flight (some through the victim edge), then the
/// edge goes: the ToR drops it, the flows move to the other edge, whose Maglev table
/// is the same, so they reach the same pods and finish. New traffic still reaches
/// both pods. Returns how many downloads broke.
fn downloads_survive_losing_an_edge(
    cluster: &mut Cluster,
    topo: &Topology,
    dir: &std::path::Path,
    vip: &str,
    edges: &[std::net::IpAddr],
    loss: Loss,
) -> usize {
    let (victim, other) = match loss {
        Loss::Drain => (1, 2),
        Loss::Kill => (2, 1),
    };
    let (via_victim, via_other) = (
        format!("ipip_from_edge{victim}"),
        format!("ipip_from_edge{other}"),
    );
    let mut slow = start_slow_downloads(topo, dir, vip, &format!("{loss:?}"));
    std::thread::sleep(Duration::from_millis(700));
    let w0 = topo.counters().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let w1 = topo.counters().unwrap();
    assert!(
        w1[&via_victim] > w0[&via_victim],
        "some of the {SLOW_FLOWS} long flows run through edge{victim} before it goes"
    );
    let t = Instant::now();
    let name = format!("edge{victim}");
    match loss {
        Loss::Drain => {
            cluster.terminate(&name, Duration::from_secs(10)).unwrap();
            // the whole agent (BGPPeer status task and all) ends with a Cease
            let bird = cluster.birdc(&["show", "protocols", "all", &name]).unwrap();
            assert!(
                bird.contains("Administrative shutdown"),
                "the ToR got {name}'s Cease (Administrative shutdown):\n{bird}"
            );
        }
        Loss::Kill => cluster.kill(&name).unwrap(),
    }
    cluster.wait_ecmp(vip, 1, Duration::from_secs(6)).unwrap();
    let (_, _, kernel, hops) = cluster.routes(vip).unwrap();
    assert_eq!(
        hops,
        vec![edges[other - 1]],
        "only edge{other} is left: {kernel}"
    );
    eprintln!(
        "{loss:?} of {name}: ToR down to 1 next hop after {:?}",
        t.elapsed()
    );
    let broken = finish_downloads(&mut slow, &format!("{loss:?}"));
    let w2 = topo.counters().unwrap();
    assert!(
        w2[&via_other] > w1[&via_other],
        "edge{other} carried the flows after edge{victim} went"
    );
    let before = topo.counters().unwrap();
    // 20: the chance that Maglev sends every new flow to one pod is 2^-19
    let bodies = requests(cluster, vip, 20);
    let after = topo.counters().unwrap();
    let per_pod = config::count_answers(bodies.iter().map(String::as_str));
    assert_eq!(per_pod.len(), 2, "both pods still serve: {per_pod:?}");
    assert_eq!(after[&via_victim], before[&via_victim]);
    assert!(after[&via_other] > before[&via_other]);
    assert_eq!(after["replies_toward_edges"], 0);
    broken.len()
}

/// `SLOW_FLOWS` curl downloads of /slow from the client, each with its output file.
fn start_slow_downloads(
    topo: &Topology,
    dir: &std::path::Path,
    vip: &str,
    tag: &str,
) -> Vec<(Daemon, std::path::PathBuf)> {
    let client = topo.ns("client");
    let url = format!("http://{vip}:{}/slow", topo.addrs.port);
    (0..SLOW_FLOWS)
        .map(|i| {
            let out = dir.join(format!("slow-{tag}-{i}.out"));
            let o = out.display().to_string();
            let argv = [
                "curl",
                "--noproxy",
                "*",
                "-sS",
                "--max-time",
                "20",
                "-o",
                &o,
                &url,
            ];
            let d =
                Daemon::spawn(dir, &format!("slow-{tag}-{i}"), Some(&client), &argv, &[]).unwrap();
            (d, out)
        })
        .collect()
}
