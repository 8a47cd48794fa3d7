//! apisim_bench: how fast the API simulator serves the load the controller
//! benchmark puts on it, so that benchmark measures the controller and not the
//! simulator.
//!
//! ```text
//! cargo run --release -p ringlb-e2e --bin apisim_bench -- --services 10000 --watchers 4
//! ```
//!
//! Phases (one simulator, one process, real HTTP over loopback through kube-rs):
//! 1. create N LoadBalancer Services with `--concurrency` requests in flight;
//! 2. list them all, paged by 500 as kube-rs's watcher does;
//! 3. patch every Service's status (what the controller writes) while
//!    `--watchers` watches on Services run, measuring write→event latency at the
//!    slowest watcher;
//! 4. peak RSS of the process (simulator + client).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use ringlb_e2e::{SimOptions, Simulator};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(
    name = "apisim_bench",
    about = "Throughput and latency of the API simulator"
)]
struct Args {
    /// Services to create.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Requests in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Concurrent watches on Services during the status phase.
    #[arg(long, default_value_t = 4)]
    watchers: usize,
    /// Run the built-in controllers with this many pods selected by every
    /// Service (0: controllers off, as in the controller benchmark).
    #[arg(long, default_value_t = 0)]
    pods: usize,
}

fn pct(v: &[Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)].as_secs_f64() * 1e3
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let sim = Simulator::start(SimOptions {
        kubelet: args.pods > 0,
        controllers: args.pods > 0,
        history_limit: 10 * args.services.max(1000),
        ..SimOptions::default()
    })
    .await
    .context("starting the simulator")?;
    let api: Api<Service> = Api::default_namespaced(sim.client().await);
    let svc = |i: usize| -> Service {
        serde_json::from_value(json!({"metadata": {"name": format!("bench-{i:05}")},
            "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                "selector": {"app": "bench"}, "ports": [{"port": 80, "protocol": "TCP"}]}}))
        .expect("static Service JSON")
    };

    if args.pods > 0 {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::default_namespaced(sim.client().await);
        for i in 0..args.pods {
            let p = serde_json::from_value(
                json!({"metadata": {"name": format!("pod-{i}"), "labels": {"app": "bench"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}),
            )?;
            pods.create(&PostParams::default(), &p).await?;
        }
    }

    // 1. creates
    let t = Instant::now();
    let mut lat: Vec<Duration> = futures::stream::iter(0..args.services)
        .map(|i| {
            let api = api.clone();
            let s = svc(i);
            async move {
                let t = Instant::now();
                api.create(&PostParams::default(), &s)
                    .await
                    .map(|_| t.elapsed())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect()
        .await
        .context("creating Services")?;
    let create_s = t.elapsed().as_secs_f64();
    lat.sort();

    // 2. paged list
    let t = Instant::now();
    let mut listed = 0;
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(c) = &token {
            lp = lp.continue_token(c);
        }
        let page = api.list(&lp).await.context("listing")?;
        listed += page.items.len();
        token = page.metadata.continue_.filter(|c| !c.is_empty());
        if token.is_none() {
            break;
        }
    }
    let list_ms = t.elapsed().as_secs_f64() * 1e3;

    // 3. status patches observed by watchers
    let rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut watchers = Vec::new();
    for _ in 0..args.watchers {
        let api = api.clone();
        let sent = sent.clone();
        let n = args.services;
        let rv = rv.clone();
        watchers.push(tokio::spawn(async move {
            let mut seen: Vec<Duration> = Vec::with_capacity(n);
            let mut s = api
                .watch(&WatchParams::default().timeout(290), &rv)
                .await?
                .boxed();
            while seen.len() < n {
                match s.try_next().await? {
                    Some(WatchEvent::Modified(o)) => {
                        let name = o.metadata.name.unwrap_or_default();
                        if let Some(t) = sent.lock().unwrap_or_else(|e| e.into_inner()).get(&name) {
                            seen.push(t.elapsed());
                        }
                    }
                    Some(_) => {}
                    None => anyhow::bail!("watch ended early"),
                }
            }
            Ok::<_, anyhow::Error>(seen)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    futures::stream::iter(0..args.services)
        .map(|i| {
            let api = api.clone();
            let sent = sent.clone();
            async move {
                let name = format!("bench-{i:05}");
                let st = json!({"status": {"loadBalancer": {"ingress": [{"ip": format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255), "ipMode": "VIP"}]}}});
                sent.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone(), Instant::now());
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st)).await.map(|_| ())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await
        .context("patching status")?;
    let patch_s = t.elapsed().as_secs_f64();
    let mut watch_lat: Vec<Duration> = Vec::new();
    for w in watchers {
        watch_lat.extend(w.await.context("watcher task")??);
    }
    let all_seen_s = t.elapsed().as_secs_f64();
    watch_lat.sort();
    let slices = if args.pods > 0 {
        // wait for the EndpointSlice controller to catch up
        let sl: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::default_namespaced(sim.client().await);
        let t = Instant::now();
        loop {
            let n = sl.list_metadata(&ListParams::default()).await?.items.len();
            if n >= args.services || t.elapsed() > Duration::from_secs(120) {
                break format!(
                    "  EndpointSlices: {n} present {:.2} s after the last status patch\n",
                    t.elapsed().as_secs_f64()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    } else {
        String::new()
    };

    println!(
        "apisim benchmark: {} Services, concurrency {}, {} watchers, {} pods (controllers {})",
        args.services,
        args.concurrency,
        args.watchers,
        args.pods,
        if args.pods > 0 { "on" } else { "off" }
    );
    println!(
        "  create:           {:>9.0} Services/s   p50 {:>6.2} ms  p99 {:>6.2} ms",
        args.services as f64 / create_s,
        pct(&lat, 0.5),
        pct(&lat, 0.99)
    );
    println!(
        "  paged list (500): {:>9.1} ms for {listed} Services",
        list_ms
    );
    println!(
        "  status patch:     {:>9.0} patches/s",
        args.services as f64 / patch_s
    );
    println!(
        "  patch -> watch event at {} watchers: p50 {:>6.2} ms  p99 {:>6.2} ms  (all delivered after {:.2} s)",
        args.watchers,
        pct(&watch_lat, 0.5),
        pct(&watch_lat, 0.99),
        all_seen_s
    );
    print!("{slices}");
    println!("  peak RSS (simulator + client): {:.1} MiB", peak_rss_mib());
    sim.shutdown().await;
    Ok(())
}
