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
//! ringlb-lab bench --services N    create -> VIP -> ECMP latency, N Services (docs/bench-lab.md)
//! ringlb-lab scale [--sizes ...]   one edge cold against 1k..50k Service ports (docs/bench-scale.md)
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
use ringlb_e2e::lab::{self, Addrs, Bins, Topology, topology};
use ringlb_e2e::realcluster;

mod lab_demo;
mod scale_cmd;
use lab_demo::{Printer, bring_up, failover, traffic};

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
    /// The edge at datacenter scale: for each size, Services with ports and
    /// endpoints up to it, one edge started cold against them; a table of cold
    /// start, peak RSS, BPF memory and one change's latency (docs/bench-scale.md).
    Scale(scale_cmd::ScaleArgs),
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
        Cmd::Scale(a) => scale_cmd::run(prefix, dir, a),
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
