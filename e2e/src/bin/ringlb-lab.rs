//! ringlb-lab: the real cluster (`make demo`) and the end-to-end network-namespace lab.
//!
//! ```text
//! ringlb-lab cluster-demo [--keep]  the real cluster, helm install, traffic (docs/real-cluster.md)
//! ringlb-lab cluster-down          remove what a crashed cluster-demo left
//! ringlb-lab conformance           Kubernetes' LoadBalancer e2e tests (docs/conformance.md)
//! ringlb-lab demo [--requests N]   build the lab, show every step with evidence, tear down
//! ringlb-lab up                    build the lab and leave it running (prints how to poke it)
//! ringlb-lab down                  remove the lab (daemons, namespaces, bpffs, files)
//! ringlb-lab gtm-up                two regions, a core router, PowerDNS as the GTM; left running
//! ```
//!
//! Everything runs as real programs: Kubernetes' own control plane (etcd,
//! kube-apiserver, kube-controller-manager, kubectl; `make k8s`), ringlb-controller and
//! ringlb-edge, plus BIRD, in namespaces named `<prefix>-*`; see docs/lab.md. The one
//! stand-in is the lab kubelet (no container runtime; docs/controlplane.md).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use ringlb_e2e::lab::{self, Addrs, Bins, Cluster, Topology, config, topology};
use ringlb_e2e::realcluster;

#[derive(Debug, Parser)]
#[command(
    name = "ringlb-lab",
    about = "ringlb end-to-end lab in network namespaces (needs root)"
)]
struct Args {
    /// Namespace name prefix; every namespace is `<prefix>-<role>`.
    #[arg(long, default_value = "rlb-demo", global = true)]
    prefix: String,
    /// Directory for logs, configs, the kubeconfig, PID file and bpffs.
    /// Default: /run/ringlb-lab/<prefix>.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The real cluster (docs/real-cluster.md): build it, `helm install` ringlb from the
    /// images built here, expose a Deployment as a dual-stack LoadBalancer Service and
    /// show the path with evidence; tear it down at the end, or at Ctrl-C with --keep.
    ClusterDemo {
        /// Leave the cluster up until Ctrl-C (or SIGTERM), printing what to try.
        #[arg(long)]
        keep: bool,
        /// kube-proxy's mode on every node: iptables, nftables, or ipvs (needs the
        /// kernel's IPVS).
        #[arg(long, default_value = "iptables")]
        proxy_mode: String,
    },
    /// Remove a real cluster (also what a crashed `cluster-demo` left).
    ClusterDown,
    /// The real cluster with ringlb installed, then Kubernetes' own e2e suite
    /// (`e2e.test`) from the client behind the ToR: every `[Feature:LoadBalancer]`
    /// test and the Services conformance tests; then checks that the suite left no
    /// allocated address, route or BPF entry (docs/conformance.md).
    Conformance {
        /// kube-proxy's mode on every node: iptables, nftables, or ipvs.
        #[arg(long, default_value = "iptables")]
        proxy_mode: String,
        /// `--ginkgo.focus` instead of the whole selection.
        #[arg(long)]
        focus: Option<String>,
        /// `--ginkgo.skip`.
        #[arg(long)]
        skip: Option<String>,
        /// Where the JUnit report and the suite's log go.
        #[arg(long, default_value = "target/conformance")]
        report_dir: PathBuf,
    },
    /// Build the lab, run the whole path with evidence at each step, tear it down.
    Demo {
        /// HTTP requests from the client to the VIP.
        #[arg(long, default_value_t = 20)]
        requests: usize,
    },
    /// Build the lab and leave it running.
    Up,
    /// Tear the lab down (also the leftovers of an interrupted run).
    Down,
    /// Build the two-region lab (two regions, a core router, a client, PowerDNS as
    /// the GTM) and leave it running; `down` with the same --prefix removes it.
    GtmUp,
    /// Build the lab, then time N Service creations: API call -> VIP in status ->
    /// first route in the ToR's FIB -> ECMP over both edges; tear down.
    Bench {
        #[arg(long, default_value_t = 50)]
        services: usize,
    },
    /// (inside the ToR namespace) the measuring half of `bench`.
    #[command(hide = true)]
    Measure {
        #[arg(long)]
        kubeconfig: PathBuf,
        #[arg(long)]
        services: usize,
        #[arg(long, default_value_t = 2)]
        edges: usize,
        #[arg(long, default_value_t = 8080)]
        port: u16,
    },
    /// (a lab daemon, on the host) the real control plane, the lab kubelet and the
    /// bridge to the ToR's fabric address, until SIGTERM.
    #[command(hide = true)]
    ControlPlane {
        /// The region's network: `10.<net>.0.0/16` (`Addrs::region`).
        #[arg(long, default_value_t = 210)]
        net: u8,
        /// The region's edges (Nodes `edge1..`).
        #[arg(long, default_value_t = 2)]
        edges: usize,
        /// The region's worker nodes (Nodes `node1..`, one pod each).
        #[arg(long, default_value_t = 2)]
        nodes: usize,
    },
    /// Boot a Debian kernel under qemu with the lab inside it, both edges on
    /// `--datapath ipvs`, and check flows across an edge kill and a backend removal
    /// (docs/lab.md, "The IPVS lab in a VM").
    IpvsVm(IpvsVmArgs),
    /// (inside the VM, as /tests/ipvs_lab) the guest half of `ipvs-vm`.
    #[command(hide = true)]
    VmGuest {
        #[arg(long)]
        etc: PathBuf,
    },
    /// (run by qemu for each guest connection to the API) copy stdin/stdout to ADDR.
    #[command(hide = true)]
    Connect { addr: std::net::SocketAddr },
    /// (inside a pod namespace) answer HTTP with this pod's name.
    #[command(hide = true)]
    PodHttp {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        name: String,
    },
}

/// Flags of `ringlb-lab ipvs-vm`.
#[derive(Debug, clap::Args)]
struct IpvsVmArgs {
    /// A kernel line of the matrix (5.10, 6.1, 6.12, newest) or a linux-image-* package.
    #[arg(long, short = 'k', default_value = "6.12")]
    kernel: String,
    /// Kernels kept between runs (the kernel matrix's cache).
    #[arg(long, env = "RINGLB_KERNEL_CACHE")]
    cache: Option<PathBuf>,
    /// Images, console, results.
    #[arg(long, default_value = "target/ipvs-vm")]
    out: PathBuf,
    /// Flows (client source ports 40001..) in the per-flow maps.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u16).range(1..=999))]
    flows: u16,
    /// Long downloads in flight when an edge is killed (source ports 41001..).
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u16).range(1..=999))]
    long_flows: u16,
    /// Seconds the guest may take from boot to power-off.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    #[arg(long, default_value_t = 2048)]
    memory_mb: u32,
}

const SERVICE: &str = "web";

/// Set when SIGINT/SIGTERM started the teardown: the worker's errors are then expected.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct Printer {
    n: usize,
    total: usize,
    start: Instant,
}

impl Printer {
    /// A step counter for `total` steps, its clock started now.
    fn new(total: usize) -> Self {
        Self {
            n: 0,
            total,
            start: Instant::now(),
        }
    }

    fn step(&mut self, title: &str) {
        self.n += 1;
        println!(
            "\n\x1b[1m==> [{}/{}] {title}\x1b[0m  (t={:.1}s)",
            self.n,
            self.total,
            self.start.elapsed().as_secs_f64()
        );
    }
    fn cmd(&self, shown: &str, out: &str) {
        println!("$ {shown}");
        for l in out.trim_end().lines() {
            println!("  {l}");
        }
    }
}

/// The lab as `up` leaves it and `demo` continues from.
struct Running {
    topo: Topology,
    cluster: Cluster,
    vip: String,
}

fn bring_up(prefix: &str, dir: &std::path::Path, p: &mut Printer) -> anyhow::Result<Running> {
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

fn traffic(r: &mut Running, requests: usize, p: &mut Printer) -> anyhow::Result<()> {
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

fn failover(r: &mut Running, p: &mut Printer) -> anyhow::Result<()> {
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

fn print_samples(samples: &[lab::measure::Sample]) {
    use lab::measure::percentile;
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    let cols: [(&str, Vec<Duration>); 3] = [
        (
            "create -> VIP in Service status",
            samples.iter().map(|s| s.to_status).collect(),
        ),
        (
            "create -> first route in ToR FIB",
            samples.iter().map(|s| s.to_first_route).collect(),
        ),
        (
            "create -> ECMP (2 next hops) in ToR FIB",
            samples.iter().map(|s| s.to_ecmp).collect(),
        ),
    ];
    println!("  {} Services; milliseconds", samples.len());
    println!("  | interval | min | p50 | p90 | p99 | max |");
    println!("  |---|---|---|---|---|---|");
    for (name, v) in &cols {
        println!(
            "  | {name} | {} | {} | {} | {} | {} |",
            ms(percentile(v, 0.0)),
            ms(percentile(v, 50.0)),
            ms(percentile(v, 90.0)),
            ms(percentile(v, 99.0)),
            ms(percentile(v, 100.0))
        );
    }
}

/// `ringlb-lab gtm-up`: [`lab::gtm::GtmLab::up`], kept running; prints how to poke it.
fn gtm_up(prefix: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    if let Some(why) = lab::skip_reason() {
        bail!("{why}");
    }
    let bins = Bins::discover()?;
    let t = Instant::now();
    let mut g = match lab::gtm::GtmLab::up(prefix, dir, &bins) {
        Ok(g) => g,
        Err(e) => {
            topology::teardown(prefix, dir);
            return Err(e.into());
        }
    };
    g.keep();
    let (va, vb) = (&g.va, &g.vb);
    let health = |topo: &Topology, vip: &str| {
        lab::pdns::health_url(&topo.addrs.edges[0], lab::cluster::EDGE_HTTP_PORT, vip, 80)
    };
    println!(
        "two-region lab {prefix} is up after {:.1} s (files in {}): VIP A {va}, VIP B {vb}, anycast {}, \
         failover pair (Service {}) {} / {}. Try:",
        t.elapsed().as_secs_f64(),
        dir.display(),
        lab::gtm::ANYCAST_VIP,
        lab::gtm::FAILOVER_SVC,
        g.fa,
        g.fb
    );
    println!("  {}", g.dns.dig_shown(&g.core.ns("client")));
    println!(
        "  ip netns exec {prefix}-dns curl -s {}",
        health(&g.topo_a, va)
    );
    println!(
        "  ip netns exec {prefix}-dns curl -s {}",
        health(&g.topo_b, vb)
    );
    println!("  ip netns exec {prefix}-client curl -s http://{va}/");
    println!(
        "  ip netns exec {prefix}-client curl -s http://{}/",
        lab::gtm::ANYCAST_VIP
    );
    println!(
        "  {}",
        g.ca.kubectl_shown("annotate pods -l app=web lab.ringlb.io/ready=false --overwrite")
    );
    println!(
        "  {} --prefix {prefix} --dir {} down",
        bins.lab.display(),
        dir.display()
    );
    Ok(())
}

fn dir_of(args: &Args) -> PathBuf {
    args.dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/run/ringlb-lab").join(&args.prefix))
}

/// Runs `f` on a worker thread; SIGINT/SIGTERM tear the lab down and exit.
fn with_teardown_on_signal(
    prefix: String,
    dir: PathBuf,
    f: impl FnOnce() -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let work = tokio::task::spawn_blocking(f);
        tokio::select! {
            r = work => r.context("the lab thread panicked")?,
            _ = tokio::signal::ctrl_c() => interrupted(&prefix, &dir),
            _ = term.recv() => interrupted(&prefix, &dir),
        }
    })
}

fn interrupted(prefix: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
    eprintln!("\ninterrupted: tearing the lab down");
    let removed = topology::teardown(prefix, dir);
    eprintln!("removed: {}", removed.join(", "));
    std::process::exit(130);
}

/// `ringlb-lab control-plane`: [`lab::api::LabApi`] until SIGTERM or SIGINT; dropping
/// it stops the bridge, the kubelet and the control plane's processes.
fn run_control_plane(prefix: &str, dir: &std::path::Path, addrs: Addrs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let api = lab::api::LabApi::start(dir, prefix, &addrs)
            .await
            .context("starting the lab's control plane")?;
        tracing::info!(url = %api.control_plane().url(), "lab control plane ready");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("stopping the lab control plane");
        drop(api);
        Ok(())
    })
}

/// `ringlb-lab ipvs-vm`: the IPVS lab inside a matrix kernel under qemu.
fn run_ipvs_vm(a: IpvsVmArgs) -> anyhow::Result<()> {
    let o = lab::vm::host::Options {
        kernel: a.kernel,
        cache: a.cache.unwrap_or_else(ringlb_kernels::default_cache),
        out: std::path::absolute(&a.out)?,
        flows: a.flows,
        long_flows: a.long_flows,
        timeout: Duration::from_secs(a.timeout),
        memory_mb: a.memory_mb,
    };
    if !lab::cmd::is_root() {
        bail!("ipvs-vm needs root (apt-get for the kernel, namespaces in the guest)");
    }
    if !lab::vm::host::run(&o)? {
        bail!("the IPVS lab failed; see {}", o.out.display());
    }
    Ok(())
}

/// `ringlb-lab connect ADDR`: stdin to ADDR, ADDR to stdout (flushed after each
/// read: TLS records carry no newlines); exits when ADDR closes.
fn connect(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let s = std::net::TcpStream::connect(addr).with_context(|| format!("connecting {addr}"))?;
    let mut to = s.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    let (mut from, mut out, mut buf) = (s, std::io::stdout().lock(), vec![0u8; 64 * 1024]);
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return Ok(()),
            Ok(n) => {
                out.write_all(&buf[..n])?;
                out.flush()?;
            }
        }
    }
}

/// `ringlb-lab bench`: the lab up, `measure` in the ToR namespace, the lab down.
fn run_bench(prefix: String, dir: PathBuf, services: usize) -> anyhow::Result<()> {
    if let Some(why) = lab::skip_reason() {
        bail!("{why}");
    }
    if !(1..=200).contains(&services) {
        bail!("--services must be 1..=200 (the lab's pool has 241 addresses)");
    }
    let (p2, d2) = (prefix.clone(), dir.clone());
    with_teardown_on_signal(prefix, dir, move || {
        let mut p = Printer::new(9);
        let result = bring_up(&p2, &d2, &mut p).and_then(|r| {
            p.step(&format!("bench: {services} Services, one after the other"));
            let tor = r.topo.ns("tor");
            let kc = r.cluster.kubeconfig().display().to_string();
            let lab_bin = r.cluster.bins.lab.display().to_string();
            let n = services.to_string();
            let status = std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &tor,
                    &lab_bin,
                    "measure",
                    "--kubeconfig",
                    &kc,
                ])
                .args(["--services", &n, "--edges", "2", "--port", "8080"])
                .status()
                .context("running ringlb-lab measure in the ToR namespace")?;
            if !status.success() {
                bail!("measure failed ({status})");
            }
            Ok(())
        });
        topology::teardown(&p2, &d2);
        result
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = dir_of(&args);
    let prefix = args.prefix.clone();
    match args.command {
        Cmd::ClusterDemo { keep, proxy_mode } => {
            Ok(realcluster::demo::cli(&prefix, &dir, keep, &proxy_mode)?)
        }
        Cmd::Conformance {
            proxy_mode,
            focus,
            skip,
            report_dir,
        } => {
            let report_dir = std::path::absolute(&report_dir)?.join(&proxy_mode);
            let mut suite = realcluster::conformance::Suite::full(&report_dir);
            if let Some(f) = focus {
                suite.focus = f;
            }
            suite.skip = skip;
            Ok(realcluster::conformance::cli(
                &prefix,
                &dir,
                &proxy_mode,
                suite,
            )?)
        }
        Cmd::ClusterDown => {
            let removed = realcluster::teardown(&prefix, &dir);
            println!("removed for {prefix}: {}", removed.join(", "));
            Ok(())
        }
        Cmd::ControlPlane { net, edges, nodes } => {
            run_control_plane(&prefix, &dir, Addrs::region(net, edges, nodes))
        }
        Cmd::IpvsVm(a) => run_ipvs_vm(a),
        Cmd::VmGuest { etc } => std::process::exit(lab::vm::guest::run(&etc)),
        Cmd::Connect { addr } => connect(addr),
        Cmd::PodHttp { listen, name } => {
            let l =
                std::net::TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
            lab::httpd::serve(l, &name);
            Ok(())
        }
        Cmd::Measure {
            kubeconfig,
            services,
            edges,
            port,
        } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let samples = rt.block_on(lab::measure::measure(&kubeconfig, services, edges, port))?;
            print_samples(&samples);
            Ok(())
        }
        Cmd::Bench { services } => run_bench(prefix, dir, services),
        Cmd::Down => {
            let removed = topology::teardown(&prefix, &dir);
            if removed.is_empty() {
                println!("nothing to remove for lab {prefix}");
            } else {
                println!("removed: {}", removed.join(", "));
            }
            Ok(())
        }
        Cmd::Demo { requests } => {
            if let Some(why) = lab::skip_reason() {
                bail!("{why}");
            }
            let (p2, d2) = (prefix.clone(), dir.clone());
            with_teardown_on_signal(prefix, dir, move || {
                let mut p = Printer::new(11);
                let result = bring_up(&p2, &d2, &mut p).and_then(|mut r| {
                    let res =
                        traffic(&mut r, requests, &mut p).and_then(|()| failover(&mut r, &mut p));
                    if res.is_err() && !INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
                        eprintln!("{}", r.cluster.log_tails(20));
                    }
                    res
                });
                // `Running` dropped above: daemons stopped, namespaces deleted, bpffs
                // unmounted. This sweeps anything an error path left behind.
                println!("\n==> teardown");
                let removed = topology::teardown(&p2, &d2);
                let left: Vec<String> = lab::netns::list()
                    .into_iter()
                    .filter(|n| n.starts_with(&format!("{p2}-")))
                    .collect();
                println!(
                    "  daemons stopped, namespaces deleted{}; {p2}-* namespaces left: {}",
                    if removed.is_empty() {
                        String::new()
                    } else {
                        format!(" (swept: {})", removed.join(", "))
                    },
                    left.len()
                );
                result?;
                println!(
                    "\ndemo OK: Service -> VIP -> BGP ECMP at the ToR -> XDP on both edges -> node agents (VIP:80 -> pod:8080) -> both pods, replies by DSR; edge failover"
                );
                Ok(())
            })
        }
        Cmd::GtmUp => {
            let (p2, d2) = (prefix.clone(), dir.clone());
            with_teardown_on_signal(prefix, dir, move || gtm_up(&p2, &d2))
        }
        Cmd::Up => {
            if let Some(why) = lab::skip_reason() {
                bail!("{why}");
            }
            let (p2, d2) = (prefix.clone(), dir.clone());
            with_teardown_on_signal(prefix, dir, move || {
                let mut p = Printer::new(8);
                let mut r = match bring_up(&p2, &d2, &mut p) {
                    Ok(r) => r,
                    Err(e) => {
                        topology::teardown(&p2, &d2);
                        return Err(e);
                    }
                };
                r.cluster.keep();
                r.topo.keep();
                println!("\nlab {p2} is up (files in {}). Try:", d2.display());
                println!(
                    "  ip netns exec {p2}-client curl http://{}:{}/",
                    r.vip, r.topo.addrs.port
                );
                println!("  {}", r.cluster.kubectl_shown("get svc,pods,bgppeers"));
                println!("  {}", r.cluster.birdc_shown("show route all"));
                println!(
                    "  {} --prefix {p2} --dir {} down",
                    r.cluster.bins.lab.display(),
                    d2.display()
                );
                Ok(())
            })
        }
    }
}
