//! Benchmark (a program, not a test): N LoadBalancer Services created against the API
//! simulator while the real `ringlb-controller` runs; reports the time until all have
//! a VIP, p50/p99 create->status latency and the controller's peak RSS (VmHWM).
//!
//! ```text
//! cargo build --release -p ringlb-controller -p ringlb-e2e --bin controller_bench
//! target/release/controller_bench --services 10000
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
use ringlb_e2e::{SimOptions, Simulator};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    about = "Create N LoadBalancer Services against the API simulator and time the controller"
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
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
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
    let controller = match args.controller.clone() {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("ringlb-controller"),
    };
    if !controller.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p ringlb-controller) or pass --controller",
            controller.display()
        );
    }
    let sim = Simulator::start(SimOptions {
        kubelet: false,
        controllers: false,
        history_limit: 50 * args.services.max(1000),
        ..SimOptions::default()
    })
    .await?;
    let client = sim.client().await;
    Api::<IPPool>::all(client.clone())
        .create(
            &PostParams::default(),
            &IPPool::new(
                "bench",
                IPPoolSpec {
                    cidrs: vec!["10.0.0.0/14".into()],
                    ranges: vec![],
                    auto_assign: true,
                    avoid_buggy_ips: false,
                    service_selector: None,
                    namespace_selector: None,
                    priority: 0,
                },
            ),
        )
        .await
        .context("creating the IPPool")?;

    let child = Command::new(&controller)
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--lease-namespace",
            "default",
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", controller.display()))?;
    let pid = child.id();
    let _guard = Guard(child);

    // Record when each Service is first seen with a VIP.
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let api = api.clone();
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

    // Warm-up: the controller is up (leader, rebuilt) once one Service gets a VIP.
    let svc = |name: String| -> anyhow::Result<Service> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": [{"port": 80, "protocol": "TCP"}], "selector": {"app": "bench"}}
        }))?)
    };
    api.create(&PostParams::default(), &svc("warmup".into())?)
        .await?;
    let t = Instant::now();
    while !seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key("warmup")
    {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("the controller did not allocate the warm-up Service within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rss_idle = proc_status_kb(pid, "VmRSS:").unwrap_or(0);
    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);

    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let start = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..args.services)
        .map(|i| {
            let api = api.clone();
            let created = created.clone();
            let s = svc(format!("bench-{i:05}"));
            async move {
                let s = s?;
                let name = s.name_any();
                created
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name, Instant::now());
                api.create(&PostParams::default(), &s).await?;
                Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let create_done = start.elapsed();
    for r in results {
        r.context("creating a Service")?;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    loop {
        let n = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .filter(|k| k.starts_with("bench-"))
            .count();
        if n >= args.services {
            break;
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
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let created = created.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let last = created
        .keys()
        .filter_map(|k| seen.get(k))
        .max()
        .copied()
        .unwrap_or(start);
    let all_allocated = last - start;
    let mut lat: Vec<Duration> = created
        .iter()
        .filter_map(|(k, c)| Some(seen.get(k)?.saturating_duration_since(*c)))
        .collect();
    lat.sort();
    let hwm = proc_status_kb(pid, "VmHWM:").unwrap_or(0);
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    watch.abort();

    println!(
        "controller benchmark: {} Services, concurrency {}",
        args.services, args.concurrency
    );
    println!(
        "  all created (API calls returned):  {:>10.3} s",
        create_done.as_secs_f64()
    );
    println!(
        "  all allocated (VIP in status):     {:>10.3} s",
        all_allocated.as_secs_f64()
    );
    println!(
        "  throughput:                        {:>10.0} Services/s",
        args.services as f64 / all_allocated.as_secs_f64()
    );
    println!(
        "  create->status latency p50:        {:>10.1} ms",
        percentile(&lat, 0.50).as_secs_f64() * 1e3
    );
    println!(
        "  create->status latency p99:        {:>10.1} ms",
        percentile(&lat, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "  create->status latency max:        {:>10.1} ms",
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!(
        "  controller RSS idle (1 Service):   {:>10.1} MiB",
        rss_idle as f64 / 1024.0
    );
    println!(
        "  controller peak RSS (VmHWM):       {:>10.1} MiB",
        hwm as f64 / 1024.0
    );
    println!("  controller CPU time during run:    {:>10.2} s", cpu);
    Ok(())
}
