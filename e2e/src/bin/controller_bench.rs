//! Benchmark (a program, not a test): N LoadBalancer Services created against a real
//! control plane (etcd, kube-apiserver, kube-controller-manager; `ControlPlane`) while
//! the real `ringlb-controller` runs as a pod would, under the chart's RBAC with a
//! ServiceAccount token. Reports the time until all have a VIP, p50/p99
//! create->status latency, the controller's peak RSS (VmHWM) and CPU time.
//! `--create-only` runs no controller and measures how fast the API server accepts the
//! creates alone (the bound on "all allocated").
//!
//! ```text
//! cargo build --release -p ringlb-e2e -p ringlb-controller --bins
//! target/release/controller_bench --services 10000
//! target/release/controller_bench --services 10000 --create-only
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use ringlb_crds::{IPPool, IPPoolSpec};
use ringlb_e2e::controlplane::{ControlPlane, Options};
use ringlb_e2e::procfs::{cpu_seconds, status_kb};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    about = "Create N LoadBalancer Services against a real control plane and time the controller"
)]
struct Args {
    /// How many Services to create.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Concurrent create requests.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// The controller binary. Default: ringlb-controller next to this program.
    #[arg(long)]
    controller: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Run no controller: only create the Services and report the API server's create
    /// rate.
    #[arg(long)]
    create_only: bool,
    /// Do not run kube-controller-manager (by default it runs, as in a cluster, and
    /// writes one EndpointSlice per Service alongside the benchmark).
    #[arg(long)]
    no_controller_manager: bool,
    /// Time MetalLB's controller instead of ringlb-controller, for a ratio: the path
    /// of its binary (built from its Go module outside this repository).
    #[arg(long, requires = "metallb_crds")]
    metallb_controller: Option<PathBuf>,
    /// The folder of MetalLB's CRDs (`config/crd/bases` of the same version).
    #[arg(long)]
    metallb_crds: Option<PathBuf>,
}

/// The namespace the chart installs into; the controller's ServiceAccount and Lease
/// live there.
const RELEASE_NS: &str = "ringlb-system";

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The control plane's own processes (`PID NAME` lines of its folder's `pids` file).
fn control_plane_pids(cp: &ControlPlane) -> Vec<(u32, String)> {
    std::fs::read_to_string(cp.dir().join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (pid, name) = l.split_once(' ')?;
            Some((pid.parse().ok()?, name.to_string()))
        })
        .collect()
}

/// MetalLB's controller against the same control plane, set up as close to ours as
/// its flags allow: a ServiceAccount token (bound to cluster-admin rather than MetalLB's
/// chart RBAC; the same API priority level as ringlb-controller's ServiceAccount), an
/// IPAddressPool with the same /14, webhooks off, no leader election (it has none).
async fn start_metallb(
    cp: &ControlPlane,
    bin: &std::path::Path,
    crds: &std::path::Path,
) -> anyhow::Result<Guard> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(crds)
        .with_context(|| format!("reading {}", crds.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    for p in &paths {
        let yaml = std::fs::read_to_string(p)?;
        cp.apply_yaml(&yaml)
            .await
            .with_context(|| format!("applying {}", p.display()))?;
    }
    cp.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: metallb-system}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: controller, namespace: metallb-system}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: metallb-bench}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n\
         subjects: [{kind: ServiceAccount, name: controller, namespace: metallb-system}]\n",
    )
    .await
    .context("MetalLB's namespace and ServiceAccount")?;
    // The CRDs take a moment to be served.
    let pool = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\n\
                metadata: {name: bench, namespace: metallb-system}\n\
                spec: {addresses: [10.0.0.0/14]}\n";
    let t = Instant::now();
    while let Err(e) = cp.apply_yaml(pool).await {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("creating MetalLB's IPAddressPool: {e}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kubeconfig = cp
        .service_account_kubeconfig("metallb-system", "controller")
        .await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log_path = cp.dir().join("metallb-controller.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(bin)
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "--namespace",
            "metallb-system",
            "--webhook-mode",
            "disabled",
            "--log-level",
            "warn",
            "--port",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Guard(child))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let controller = controller_binary(&args)?;
    let (cp, client, kubeconfig) = set_up(&args).await?;
    let controller_proc = start_controller(&args, &cp, &controller, &kubeconfig).await?;
    let pid = controller_proc.as_ref().map(|g| g.0.id());
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let (seen, watch) = watch_allocations(api.clone());
    if let Some(pid) = pid {
        warm_up(&api, &seen, pid, &cp).await?;
    }
    let before = Baseline::take(pid, &cp);

    let creates = create_services(&api, &args).await?;
    report_creates(&args, &creates);
    let Some(pid) = pid else {
        watch.abort();
        before.print_control_plane_cpu();
        return Ok(());
    };

    wait_for_allocation(&seen, &args).await?;
    let m = measure(&seen, &creates, pid, &before);
    watch.abort();
    report_allocation(&args, &m, &before);
    Ok(())
}

type Times = Arc<Mutex<HashMap<String, Instant>>>;

/// The ringlb-controller binary: `--controller`, or the one next to this program.
fn controller_binary(args: &Args) -> anyhow::Result<PathBuf> {
    let controller = match args.controller.clone() {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("ringlb-controller"),
    };
    if !args.create_only && args.metallb_controller.is_none() && !controller.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p ringlb-controller) or pass --controller",
            controller.display()
        );
    }
    Ok(controller)
}

/// Set-up: the control plane with the chart's RBAC, the controller's ServiceAccount
/// kubeconfig, and the IPPool the Services draw from.
async fn set_up(args: &Args) -> anyhow::Result<(ControlPlane, kube::Client, PathBuf)> {
    let t0 = Instant::now();
    let cp = ControlPlane::start(Options {
        controller_manager: !args.no_controller_manager,
        ..Options::default()
    })
    .await
    .context("starting the control plane (make k8s builds it)")?;
    eprintln!(
        "control plane up in {:.1} s ({}, kube-apiserver {})",
        t0.elapsed().as_secs_f64(),
        cp.dir().display(),
        ringlb_e2e::controlplane::kubernetes_version()
    );
    let client = cp.client().await;
    cp.apply_chart_rbac(RELEASE_NS)
        .await
        .context("applying the chart's RBAC")?;
    let kubeconfig = cp
        .service_account_kubeconfig(RELEASE_NS, "ringlb-controller")
        .await
        .context("a ServiceAccount kubeconfig for the controller")?;
    Api::<IPPool>::all(client.clone())
        .create(
            &PostParams::default(),
            &IPPool::new("bench", IPPoolSpec::from_cidrs(&["10.0.0.0/14"])),
        )
        .await
        .context("creating the IPPool")?;
    Ok((cp, client, kubeconfig))
}

/// The controller under test: none with `--create-only`, MetalLB's when asked, else
/// ringlb-controller.
async fn start_controller(
    args: &Args,
    cp: &ControlPlane,
    controller: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<Option<Guard>> {
    Ok(if args.create_only {
        None
    } else if let (Some(bin), Some(crds)) = (&args.metallb_controller, &args.metallb_crds) {
        Some(start_metallb(cp, bin, crds).await?)
    } else {
        Some(start_ringlb(cp, controller, kubeconfig)?)
    })
}

/// The controller as the chart's pod runs it: ServiceAccount token, chart RBAC,
/// leader election on a Lease in the release namespace. Its log goes to the
/// control plane's folder (kept with RINGLB_KEEP_CONTROLPLANE=1).
fn start_ringlb(
    cp: &ControlPlane,
    controller: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<Guard> {
    let log_path = cp.dir().join("ringlb-controller.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(controller)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--lease-namespace",
            RELEASE_NS,
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", controller.display()))?;
    Ok(Guard(child))
}

/// Record when each Service is first seen with a VIP.
fn watch_allocations(api: Api<Service>) -> (Times, tokio::task::JoinHandle<()>) {
    let seen: Times = Arc::default();
    let watch = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut s = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Ok(Some(svc)) = s.try_next().await {
                if !ringlb_crds::service::status_ips(&svc).is_empty() {
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(svc.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    (seen, watch)
}

/// The benchmark's LoadBalancer Service `name`.
fn svc(name: String) -> anyhow::Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": [{"port": 80, "protocol": "TCP"}], "selector": {"app": "bench"}}
    }))?)
}

/// Warm-up: the controller is up (leader, rebuilt) once one Service gets a VIP.
async fn warm_up(
    api: &Api<Service>,
    seen: &Times,
    pid: u32,
    cp: &ControlPlane,
) -> anyhow::Result<()> {
    api.create(&PostParams::default(), &svc("warmup".into())?)
        .await?;
    let t = Instant::now();
    while !seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key("warmup")
    {
        if t.elapsed() > Duration::from_secs(30) {
            bail!(
                "the controller (pid {pid}) did not allocate the warm-up Service within 30 s; \
                 its log: {}",
                cp.dir().join("ringlb-controller.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The controller's RSS and the CPU time of every process before the run.
struct Baseline {
    rss_idle: u64,
    cpu0: f64,
    cp_pids: Vec<(u32, String)>,
    cp_cpu0: Vec<f64>,
}

impl Baseline {
    fn take(pid: Option<u32>, cp: &ControlPlane) -> Self {
        let rss_idle = pid.and_then(|p| status_kb(p, "VmRSS:")).unwrap_or(0);
        let cpu0 = pid.and_then(cpu_seconds).unwrap_or(0.0);
        let cp_pids = control_plane_pids(cp);
        let cp_cpu0: Vec<f64> = cp_pids
            .iter()
            .map(|(p, _)| cpu_seconds(*p).unwrap_or(0.0))
            .collect();
        Self {
            rss_idle,
            cpu0,
            cp_pids,
            cp_cpu0,
        }
    }

    fn print_control_plane_cpu(&self) {
        for ((p, name), c0) in self.cp_pids.iter().zip(&self.cp_cpu0) {
            if let Some(c) = cpu_seconds(*p) {
                println!("  {name:<27} CPU time:  {:>8.2} s", c - c0);
            }
        }
    }
}

/// The create phase: when each create was sent and when its API call returned.
struct Creates {
    created: Times,
    returned: Times,
    start: Instant,
    create_done: Duration,
    /// Request latencies, sorted.
    create_lat: Vec<Duration>,
}

/// Create the `bench-NNNNN` Services, `args.concurrency` requests at a time.
async fn create_services(api: &Api<Service>, args: &Args) -> anyhow::Result<Creates> {
    let created: Times = Arc::default();
    let returned: Times = Arc::default();
    let start = Instant::now();
    let results: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..args.services)
        .map(|i| {
            let api = api.clone();
            let created = created.clone();
            let returned = returned.clone();
            let s = svc(format!("bench-{i:05}"));
            async move {
                let s = s?;
                let name = s.name_any();
                let sent = Instant::now();
                created
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), sent);
                api.create(&PostParams::default(), &s).await?;
                let now = Instant::now();
                returned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name, now);
                Ok(now - sent)
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let create_done = start.elapsed();
    let mut create_lat = Vec::with_capacity(results.len());
    for r in results {
        create_lat.push(r.context("creating a Service")?);
    }
    create_lat.sort();
    Ok(Creates {
        created,
        returned,
        start,
        create_done,
        create_lat,
    })
}

/// Report: the create phase.
fn report_creates(args: &Args, c: &Creates) {
    println!(
        "{} benchmark against kube-apiserver {}: {} Services, concurrency {}{}{}",
        if args.metallb_controller.is_some() {
            "MetalLB controller"
        } else {
            "controller"
        },
        ringlb_e2e::controlplane::kubernetes_version(),
        args.services,
        args.concurrency,
        if args.no_controller_manager {
            ", no kube-controller-manager"
        } else {
            ", kube-controller-manager on"
        },
        if args.create_only {
            ", no ringlb-controller (create rate only)"
        } else {
            ""
        }
    );
    println!(
        "  all created (API calls returned):  {:>10.3} s",
        c.create_done.as_secs_f64()
    );
    println!(
        "  create rate:                       {:>10.0} Services/s",
        args.services as f64 / c.create_done.as_secs_f64()
    );
    println!(
        "  create request latency p50 / p99:  {:>10.1} / {:.1} ms",
        percentile(&c.create_lat, 0.50).as_secs_f64() * 1e3,
        percentile(&c.create_lat, 0.99).as_secs_f64() * 1e3
    );
}

/// Wait until every `bench-` Service has been seen with a VIP.
async fn wait_for_allocation(seen: &Times, args: &Args) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    loop {
        let n = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .filter(|k| k.starts_with("bench-"))
            .count();
        if n >= args.services {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "only {n}/{} Services allocated after {} s",
                args.services,
                args.timeout_secs
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What the allocation phase measured.
struct Measured {
    all_allocated: Duration,
    /// create sent -> VIP seen, sorted.
    lat: Vec<Duration>,
    /// create answered -> VIP seen, sorted.
    lat_after: Vec<Duration>,
    hwm: u64,
    cpu: f64,
}

/// Measure: allocation time and latencies from the recorded times, the controller's
/// peak RSS and CPU time.
fn measure(seen: &Times, creates: &Creates, pid: u32, before: &Baseline) -> Measured {
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let created = creates
        .created
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let last = created
        .keys()
        .filter_map(|k| seen.get(k))
        .max()
        .copied()
        .unwrap_or(creates.start);
    let all_allocated = last - creates.start;
    let mut lat: Vec<Duration> = created
        .iter()
        .filter_map(|(k, c)| Some(seen.get(k)?.saturating_duration_since(*c)))
        .collect();
    lat.sort();
    // The controller's own part: the create answered -> the VIP seen in status.
    let returned = creates
        .returned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut lat_after: Vec<Duration> = returned
        .iter()
        .filter_map(|(k, r)| Some(seen.get(k)?.saturating_duration_since(*r)))
        .collect();
    lat_after.sort();
    let hwm = status_kb(pid, "VmHWM:").unwrap_or(0);
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - before.cpu0;
    Measured {
        all_allocated,
        lat,
        lat_after,
        hwm,
        cpu,
    }
}

/// Report: the allocation phase and every process's CPU time.
fn report_allocation(args: &Args, m: &Measured, before: &Baseline) {
    println!(
        "  all allocated (VIP in status):     {:>10.3} s",
        m.all_allocated.as_secs_f64()
    );
    println!(
        "  throughput:                        {:>10.0} Services/s",
        args.services as f64 / m.all_allocated.as_secs_f64()
    );
    println!(
        "  create->status latency p50:        {:>10.1} ms",
        percentile(&m.lat, 0.50).as_secs_f64() * 1e3
    );
    println!(
        "  create->status latency p99:        {:>10.1} ms",
        percentile(&m.lat, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "  create->status latency max:        {:>10.1} ms",
        m.lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!(
        "  create answered->status p50 / p99: {:>10.1} / {:.1} ms",
        percentile(&m.lat_after, 0.50).as_secs_f64() * 1e3,
        percentile(&m.lat_after, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "  controller RSS idle (1 Service):   {:>10.1} MiB",
        before.rss_idle as f64 / 1024.0
    );
    println!(
        "  controller peak RSS (VmHWM):       {:>10.1} MiB",
        m.hwm as f64 / 1024.0
    );
    println!("  controller CPU time during run:    {:>10.2} s", m.cpu);
    before.print_control_plane_cpu();
}
