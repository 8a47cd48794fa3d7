//! `ringlb-lab demo` and `up`: the namespace lab built and walked step by step, each
//! step with its evidence (docs/lab.md).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ringlb_e2e::lab::{self, Addrs, Bins, Cluster, Topology, config};

use super::{INTERRUPTED, SERVICE};

pub(crate) struct Printer {
    n: usize,
    total: usize,
    start: Instant,
}

impl Printer {
    /// A step counter for `total` steps, its clock started now.
    pub(crate) fn new(total: usize) -> Self {
        Self {
            n: 0,
            total,
            start: Instant::now(),
        }
    }

    pub(crate) fn step(&mut self, title: &str) {
        self.n += 1;
        println!(
            "\n\x1b[1m==> [{}/{}] {title}\x1b[0m  (t={:.1}s)",
            self.n,
            self.total,
            self.start.elapsed().as_secs_f64()
        );
    }
    pub(crate) fn cmd(&self, shown: &str, out: &str) {
        println!("$ {shown}");
        for l in out.trim_end().lines() {
            println!("  {l}");
        }
    }
}

/// The lab as `up` leaves it and `demo` continues from.
pub(crate) struct Running {
    pub(crate) topo: Topology,
    pub(crate) cluster: Cluster,
    pub(crate) vip: String,
}

pub(crate) fn bring_up(
    prefix: &str,
    dir: &std::path::Path,
    p: &mut Printer,
) -> anyhow::Result<Running> {
    let bins = Bins::discover()?;
    p.step("fabric: client, ToR, 2 edges, 2 worker nodes with a pod each, in network namespaces");
    let topo = Topology::up(prefix, dir, Addrs::default()).context("building the fabric")?;
    let a = topo.addrs.clone();
    println!(
        "  namespaces {prefix}-{{tor,client,edge1,edge2,node1,node2,pod1,pod2}}; client {}, edges {}, nodes {}, pods {}",
        a.client,
        a.edges.join(" "),
        a.nodes.join(" "),
        a.pods.join(" ")
    );
    println!(
        "  ToR: ringlb_pass XDP on ve-e1/ve-e2, routes to the pod CIDRs {} via the nodes",
        a.pod_cidrs.join(" ")
    );
    let mut cluster = Cluster::new(&topo, bins);
    match run_steps(&topo, &mut cluster, p) {
        Ok(vip) => Ok(Running { topo, cluster, vip }),
        Err(e) => {
            if !INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!("{}", cluster.log_tails(20));
            }
            Err(e)
        }
    }
}

/// Steps 2..7: pods, BIRD, control plane, edges, the Service and its VIP, BGP.
fn run_steps(topo: &Topology, cluster: &mut Cluster, p: &mut Printer) -> anyhow::Result<String> {
    let a = topo.addrs.clone();
    let prefix = topo.prefix.clone();
    p.step(&format!(
        "pods: `ringlb-lab pod-http` in each pod namespace on :{}",
        a.target_port
    ));
    cluster.start_pods()?;

    p.step("ToR: BIRD 2 (AS 65000), eBGP to both edges, ECMP into the kernel");
    cluster.start_bird()?;
    p.cmd(
        &cluster.birdc_shown("show protocols"),
        &cluster.birdc(&["show", "protocols"])?,
    );

    p.step(
        "control plane: etcd + kube-apiserver + kube-controller-manager + lab kubelet, \
         bridged to the ToR; ringlb-controller in the ToR namespace",
    );
    let t0 = Instant::now();
    cluster.start_control_plane()?;
    println!(
        "  up in {:.1} s; kube-apiserver on the host's loopback, reached at {}:{} through the bridge",
        t0.elapsed().as_secs_f64(),
        a.tor_fabric,
        a.api_port
    );
    p.cmd(
        &cluster.kubectl_shown("get nodes -o wide"),
        &cluster.kubectl(&["get", "nodes", "-o", "wide"])?,
    );
    cluster.start_controller()?;
    let manifests = cluster.write_manifests()?;
    let applied = cluster.apply(&manifests)?;
    p.cmd(
        &cluster.kubectl_shown(&format!("apply -f {}", manifests.display())),
        &applied,
    );
    let pods = lab::wait_for(
        "2 Running pods with the lab's IPs",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || {
            let out = cluster.kubectl(&["get", "pods", "-o", "wide"])?;
            Ok(if a.pods.iter().all(|ip| out.contains(ip)) {
                Ok(out)
            } else {
                Err(out)
            })
        },
    )?;
    p.cmd(&cluster.kubectl_shown("get pods -o wide"), &pods);

    p.step("edges: `ringlb-edge run` in edge1 and edge2 (native XDP on eth0, BGP from BGPPeer)");
    let pins: Vec<PathBuf> = (1..=a.edges.len()).map(|i| topo.pin_dir(i)).collect();
    cluster.start_edges(&pins)?;
    for line in cluster.wait_xdp(Duration::from_secs(15))? {
        println!("  {line}");
    }

    p.step("worker nodes: `ringlb-edge node` in node1 and node2 (tc on eth0: decap, VIP:80 -> pod:8080, replies back)");
    let pins: Vec<PathBuf> = (1..=a.nodes.len()).map(|i| topo.node_pin_dir(i)).collect();
    cluster.start_node_agents(&pins)?;
    for line in cluster.wait_tc(Duration::from_secs(15))? {
        println!("  {line}");
    }

    p.step("kubectl expose deployment web --type=LoadBalancer: the controller allocates a VIP");
    let (port, target) = (a.port.to_string(), a.target_port.to_string());
    let exposed = cluster.expose(SERVICE)?;
    p.cmd(
        &cluster.kubectl_shown(&format!(
            "expose deployment web --port={port} --target-port={target} --type=LoadBalancer"
        )),
        &exposed,
    );
    let t0 = Instant::now();
    let vip = cluster.wait_vip(SERVICE, Duration::from_secs(15))?;
    println!("  EXTERNAL-IP after {} ms", t0.elapsed().as_millis());
    p.cmd(
        &cluster.kubectl_shown("get svc web"),
        &cluster.kubectl(&["get", "svc", SERVICE])?,
    );
    p.cmd(
        &cluster.kubectl_shown("get endpointslices -l kubernetes.io/service-name=web"),
        &cluster.kubectl(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
        ])?,
    );
    cluster.wait_node_services(&vip, Duration::from_secs(15))?;
    println!("  both node agents map {vip}:{port} to their pod's :{target}");

    p.step("BGP: both edges announce the VIP; the ToR installs one route with 2 next hops");
    let t1 = Instant::now();
    cluster.wait_ecmp(&vip, a.edges.len(), Duration::from_secs(30))?;
    println!(
        "  ECMP in the ToR's FIB {} ms after the VIP appeared",
        t1.elapsed().as_millis()
    );
    let (bird, _, kernel, _) = cluster.routes(&vip)?;
    p.cmd(
        &cluster.birdc_shown(&format!("show route for {vip} all")),
        &bird,
    );
    p.cmd(&format!("ip -n {prefix}-tor route show {vip}"), &kernel);
    // the edges write their session state into the BGPPeer's status
    match cluster.wait_peer_status("tor", Duration::from_secs(15)) {
        Ok(out) => p.cmd(
            &cluster.kubectl_shown(&format!(
                "get bgppeers tor -o '{}'",
                lab::cluster::PEER_STATUS
            )),
            &out,
        ),
        Err(e) => println!("  (BGPPeer status not complete yet: {e})"),
    }
    Ok(vip)
}

pub(crate) fn traffic(r: &mut Running, requests: usize, p: &mut Printer) -> anyhow::Result<()> {
    let vip = r.vip.clone();
    p.step(&format!(
        "traffic: {requests} HTTP requests from the client to {vip}:{}",
        r.topo.addrs.port
    ));
    let before = r.topo.counters()?;
    let mut bodies = Vec::new();
    for i in 0..requests {
        let body = r
            .cluster
            .http_get(&vip)
            .with_context(|| format!("request {i}"))?;
        if i < 6 || i + 1 == requests {
            println!(
                "  ip netns exec {} curl -s http://{vip}:{}/  ->  {}",
                r.topo.ns("client"),
                r.topo.addrs.port,
                body.trim()
            );
        } else if i == 6 {
            println!("  ...");
        }
        bodies.push(body);
    }
    let per_pod = config::count_answers(bodies.iter().map(String::as_str));
    println!("  answers per pod: {per_pod:?}");

    p.step("DSR: the ToR's forward-path counters (nftables) for exactly these requests");
    let after = r.topo.counters()?;
    let delta = |k: &str| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    for (k, what) in [
        ("to_vip", "client -> VIP packets entering the ToR"),
        ("ipip_from_edge1", "IPIP packets edge1 -> pods (XDP encap)"),
        ("ipip_from_edge2", "IPIP packets edge2 -> pods (XDP encap)"),
        (
            "replies_to_client",
            "VIP -> client packets from the pods, routed straight to the client",
        ),
        (
            "replies_toward_edges",
            "packets from the VIP sent toward the edges",
        ),
    ] {
        println!("  {:>6}  {what}", delta(k));
    }
    let ipip = delta("ipip_from_edge1") + delta("ipip_from_edge2");
    if per_pod.len() < 2 {
        bail!("only {per_pod:?} answered; expected both pods");
    }
    if delta("replies_toward_edges") != 0 || delta("replies_to_client") == 0 || ipip == 0 {
        bail!("the counters do not show DSR: {after:?}");
    }
    println!(
        "  => every request was encapsulated by an edge ({ipip} IPIP packets), every reply went pod -> client"
    );
    Ok(())
}

pub(crate) fn failover(r: &mut Running, p: &mut Printer) -> anyhow::Result<()> {
    let vip = r.vip.clone();
    p.step("failover: kill -9 the edge1 agent; the ToR drops it, edge2 carries everything");
    let t = Instant::now();
    r.cluster.kill("edge1")?;
    r.cluster.wait_ecmp(&vip, 1, Duration::from_secs(10))?;
    println!(
        "  ToR route down to 1 next hop {} ms after the kill (the kernel closed edge1's BGP session)",
        t.elapsed().as_millis()
    );
    let (_, _, kernel, _) = r.cluster.routes(&vip)?;
    p.cmd(
        &format!("ip -n {}-tor route show {vip}", r.topo.prefix),
        &kernel,
    );
    let before = r.topo.counters()?;
    let mut bodies = Vec::new();
    for i in 0..10 {
        bodies.push(
            r.cluster
                .http_get(&vip)
                .with_context(|| format!("request {i} after the failover"))?,
        );
    }
    let after = r.topo.counters()?;
    let per_pod = config::count_answers(bodies.iter().map(String::as_str));
    let d = |k: &str| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    println!(
        "  10 requests: answers per pod {per_pod:?}; IPIP from edge1 {}, from edge2 {}",
        d("ipip_from_edge1"),
        d("ipip_from_edge2")
    );
    if d("ipip_from_edge1") != 0 || d("ipip_from_edge2") == 0 {
        bail!("traffic did not move to edge2: {after:?}");
    }
    Ok(())
}
