//! The guest half of the IPVS lab (`ringlb-lab vm-guest`, run as `/tests/ipvs_lab`
//! by the kernel matrix's /init): the lab's fabric in namespaces, BIRD, two
//! `ringlb-edge run --datapath ipvs`, three worker nodes with `ringlb-edge node`
//! and a pod each, against the host's kube-apiserver; then the checks, each
//! printed as a libtest line (`test ipvs_lab::NAME ... ok|FAILED`) that the
//! matrix's report parser reads, and the measured figures as `FIGURE` lines.
//!
//! 1. both edges program IPVS and announce the VIP; the ToR has 2 next hops; the
//!    two edges' real-server lists are equal, in the same order (`ipvsadm -Ln`);
//! 2. HTTP from the client reaches every pod through both edges; every client
//!    packet was IPIP from an edge; replies bypass the edges (DSR);
//! 3. edge1 killed (`kill -9`) with long downloads in flight: every download ends
//!    whole from the pod that started it, and flows asked again through edge2
//!    alone get the pod they had (the edges agree); edge1 comes back;
//! 4. the same with edge1 drained (SIGTERM: withdraw, then its IPVS services go);
//! 5. pod3 stops being ready: only the flows that pod3 had move;
//! 6. the Service restricted to a range without the client: both edges' guards
//!    (nftables, before IPVS) drop its packets, counted, and IPVS forwards none;
//!    the client's address added to the range: served again;
//! 7. the Service with `sessionAffinity: ClientIP`: both edges' IPVS services
//!    persistent with its timeout; every new connection of the client, through
//!    both edges, reaches one pod, which both edges' persistence templates name;
//!    affinity off again: new connections reach more than one pod;
//! 8. affinity on again, and the client's pod deleted with a grace period: both
//!    edges keep it at weight 0 (serving while terminating), and the client's new
//!    connections, whose persistence template named it, reach a ready pod.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use super::flows::{self, FlowMap};
use super::ipvsadm::{dest_weight, parse_dests, parse_templates};
use super::{FIGURE, GUEST_ADMIN_KUBECONFIG, GUEST_API, VmConfig};
use crate::lab::bridge::Bridge;
use crate::lab::cmd::run_in;
use crate::lab::httpd::SLOW_LINES;
use crate::lab::{Addrs, Bins, Cluster, EdgeDatapath, Topology, wait_for};

/// Where the guest's binaries are (`host` packs them there).
pub const BIN_DIR: &str = "/usr/local/bin";
/// First source port of the per-flow maps; the long downloads use the next
/// thousand, the affinity check the thousand after.
const FLOW_PORT: u16 = 40001;
const LONG_PORT: u16 = 41001;
const AFFINITY_PORT: u16 = 42001;
/// The affinity check's timeout: not the default, so the one IPVS shows is the
/// Service's.
const AFFINITY_TIMEOUT: u32 = 600;
/// Generous: everything runs under emulation.
const LONG: Duration = Duration::from_secs(180);

/// The running lab; fields drop in order: daemons, then the fabric.
struct Lab {
    _bridge: Bridge,
    cluster: Cluster,
    topo: Topology,
    cfg: VmConfig,
    a: Addrs,
    kube: kube::Client,
    /// Which pod each flow had with every pod ready (step 2).
    map1: FlowMap,
    rt: tokio::runtime::Runtime,
}

/// One check of the scenario; the first one makes the lab.
type Step = fn(&mut Option<Lab>, &Path) -> anyhow::Result<()>;

/// Runs every step; the process exit code (0: all passed).
pub fn run(etc: &Path) -> i32 {
    let t0 = Instant::now();
    let mut results = (0, 0);
    let mut lab = None;
    let steps: [(&str, Step); 8] = [
        ("two_ipvs_edges_agree_and_announce_the_vip", start),
        (
            "http_reaches_every_pod_through_both_edges_with_dsr",
            traffic,
        ),
        ("edge_killed_flows_keep_their_pod", edge_killed),
        ("edge_drained_flows_keep_their_pod", edge_drained),
        ("backend_removed_only_its_flows_move", backend_removed),
        (
            "source_ranges_refuse_the_client_at_both_edges",
            source_ranges,
        ),
        (
            "client_affinity_holds_one_pod_through_both_edges",
            client_affinity,
        ),
        (
            "a_terminating_pods_affinity_client_moves_to_a_ready_pod",
            terminating_affinity,
        ),
    ];
    let mut failed = false;
    for (name, step) in steps {
        print!("test {name} ... ");
        if failed {
            println!("ignored, an earlier step failed");
            continue;
        }
        let t = Instant::now();
        match step(&mut lab, etc) {
            Ok(()) => {
                println!("({:.1}s)\nok", t.elapsed().as_secs_f64());
                results.0 += 1;
            }
            Err(e) => {
                println!("\n{e:#}");
                if let Some(l) = &lab {
                    println!("{}", l.cluster.log_tails(15));
                }
                println!("FAILED");
                results.1 += 1;
                failed = true;
            }
        }
    }
    println!(
        "{FIGURE}guest scenario: {:.0}s from start to the last check",
        t0.elapsed().as_secs_f64()
    );
    let word = if failed { "FAILED" } else { "ok" };
    println!(
        "\ntest result: {word}. {} passed; {} failed",
        results.0, results.1
    );
    drop(lab);
    i32::from(failed)
}

fn lab(l: &mut Option<Lab>) -> anyhow::Result<&mut Lab> {
    l.as_mut().context("the lab did not start")
}

/// Fabric, bridge to the API, pods, BIRD, both IPVS edges, the node agents.
fn start(slot: &mut Option<Lab>, etc: &Path) -> anyhow::Result<()> {
    let cfg: VmConfig = serde_json::from_str(&std::fs::read_to_string(etc.join("vm.json"))?)?;
    let a = Addrs::three_workers();
    let dir = PathBuf::from("/run/ringlb-lab/vm");
    let topo = Topology::up("vm", &dir, a.clone()).context("building the fabric")?;
    for f in [
        "kubeconfig",
        "ringlb-edge.kubeconfig",
        "ringlb-node.kubeconfig",
    ] {
        std::fs::copy(etc.join(f), dir.join(f)).with_context(|| f.to_string())?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listen = format!("{}:{}", a.tor_fabric, a.api_port).parse()?;
    let bridge = {
        let _g = rt.enter();
        Bridge::start(&topo.ns("tor"), listen, GUEST_API.parse()?)?
    };
    let kube = rt.block_on(crate::controlplane::client_for(
        &etc.join(GUEST_ADMIN_KUBECONFIG),
    ))?;
    let bin = |n: &str| Path::new(BIN_DIR).join(n);
    let bins = Bins {
        kubectl: PathBuf::from("/bin/false"),
        controller: PathBuf::from("/bin/false"),
        edge: bin("ringlb-edge"),
        lab: bin("ringlb-lab"),
    };
    let mut cluster = Cluster::new(&topo, bins);
    cluster.edge_datapath = EdgeDatapath::Ipvs;
    let l = slot.insert(Lab {
        _bridge: bridge,
        cluster,
        topo,
        cfg,
        a,
        kube,
        map1: FlowMap::new(),
        rt,
    });
    l.cluster.start_pods()?;
    l.cluster.start_bird()?;
    // nothing is set for IPVS here: `ringlb-edge` switches on sloppy_tcp itself
    // (flows the ToR moves to an edge arrive without a SYN; step 3 fails without it)
    let pins: Vec<_> = (1..=l.a.edges.len()).map(|i| l.topo.pin_dir(i)).collect();
    let t = Instant::now();
    l.cluster.start_edges(&pins)?;
    let vip = l.cfg.vip.clone();
    l.cluster.wait_ecmp(&vip, 2, LONG)?;
    println!(
        "{FIGURE}both IPVS edges announced {vip} {:.1}s after they started",
        t.elapsed().as_secs_f64()
    );
    let pins: Vec<_> = (1..=l.a.nodes.len())
        .map(|i| l.topo.node_pin_dir(i))
        .collect();
    l.cluster.start_node_agents(&pins)?;
    l.cluster.wait_tc(LONG)?;
    l.cluster.wait_node_services(&vip, LONG)?;
    let lists = agreeing_dests(l, 3)?;
    println!(
        "both edges' real servers, in IPVS's order:\n  {}",
        lists.join("\n  ")
    );
    Ok(())
}

/// The real servers of the VIP's service on edge `i`, in the kernel's order
/// (`ipvsadm -Ln --nosort`: `ADDR:PORT FORWARD WEIGHT`).
fn dests(l: &Lab, i: usize) -> crate::lab::Result<Vec<String>> {
    let svc = format!("{}:{}", l.cfg.vip, l.a.port);
    let ns = l.topo.ns(&format!("edge{i}"));
    // --nosort: ipvsadm sorts by address unless told not to
    let out = run_in(&ns, &["ipvsadm", "-Ln", "--nosort", "-t", &svc])?;
    Ok(parse_dests(&out))
}

/// Waits until both edges hold `n` real servers of weight > 0, the same list in the
/// same order; that list.
fn agreeing_dests(l: &mut Lab, n: usize) -> anyhow::Result<Vec<String>> {
    let what = format!("both edges to hold the same {n} real servers");
    Ok(wait_for(&what, LONG, Duration::from_millis(500), || {
        l.cluster.check_daemons()?;
        let (e1, e2) = (dests(l, 1)?, dests(l, 2)?);
        let live = e1.iter().filter(|d| !d.ends_with(" 0")).count();
        Ok(if e1 == e2 && live == n && e1.len() == n {
            Ok(e1)
        } else {
            Err(format!("edge1 {e1:?}, edge2 {e2:?}"))
        })
    })?)
}

/// One GET from each flow's source port; which pod answered each.
fn flow_map(l: &Lab) -> anyhow::Result<FlowMap> {
    flow_map_from(l, FLOW_PORT)
}

/// [`flow_map`] of the `--flows` source ports from `first` on.
fn flow_map_from(l: &Lab, first: u16) -> anyhow::Result<FlowMap> {
    let client: Ipv4Addr = l.a.client.parse()?;
    let dst = SocketAddrV4::new(l.cfg.vip.parse()?, l.a.port);
    let ns = l.topo.ns("client");
    let mut m = FlowMap::new();
    for port in first..first + l.cfg.flows {
        let body = flows::get(&ns, client, port, dst, "/", Duration::from_secs(10))
            .with_context(|| format!("flow from port {port}"))?;
        let pod = body.split_whitespace().next().unwrap_or("(empty)");
        m.insert(port, pod.to_string());
    }
    Ok(m)
}

fn traffic(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    let l = lab(slot)?;
    let before = l.topo.counters()?;
    let m = flow_map(l)?;
    let after = l.topo.counters()?;
    let d = |k: &str| after[k] - before[k];
    let pods = flows::per_pod(&m);
    println!("flows per pod: {pods:?}; ToR counters: {after:?}");
    ensure!(pods.len() == 3, "every pod answers: {pods:?}");
    ensure!(
        d("ipip_from_edge1") > 0 && d("ipip_from_edge2") > 0,
        "both edges carried traffic (ECMP)"
    );
    ensure!(
        d("ipip_from_edge1") + d("ipip_from_edge2") == d("to_vip"),
        "every client packet to the VIP left an edge as IPIP"
    );
    ensure!(
        d("replies_to_client") >= 2 * u64::from(l.cfg.flows),
        "replies went from the pods to the client"
    );
    ensure!(
        d("replies_toward_edges") == 0,
        "DSR: no reply passed an edge"
    );
    l.map1 = m;
    Ok(())
}

/// What one long download ended with (the pod that sent the whole body, or the
/// error), and when.
type Finished = (Result<String, String>, Instant);

/// `n` long downloads (`/slow`) from their own source ports, each on a thread.
fn long_downloads(l: &Lab) -> anyhow::Result<Vec<std::thread::JoinHandle<Finished>>> {
    let client: Ipv4Addr = l.a.client.parse()?;
    let dst = SocketAddrV4::new(l.cfg.vip.parse()?, l.a.port);
    Ok((LONG_PORT..LONG_PORT + l.cfg.long_flows)
        .map(|port| {
            let ns = l.topo.ns("client");
            std::thread::spawn(move || {
                let got = flows::get(&ns, client, port, dst, "/slow", Duration::from_secs(60))
                    .map_err(|e| e.to_string())
                    .and_then(|body| {
                        flows::single_pod(&body, SLOW_LINES)
                            .ok_or_else(|| format!("port {port}: not whole from one pod: {body:?}"))
                    });
                (got, Instant::now())
            })
        })
        .collect())
}

/// How edge1 goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// `kill -9`: the kernel closes its BGP session; its IPVS services stay.
    Kill,
    /// SIGTERM: GRACEFUL_SHUTDOWN, withdraw, then its IPVS services and VIPs go.
    Drain,
}

impl Loss {
    fn what(self) -> &'static str {
        match self {
            Loss::Kill => "edge killed",
            Loss::Drain => "edge drained",
        }
    }
}

fn edge_killed(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    edge_lost(lab(slot)?, Loss::Kill)
}

fn edge_drained(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    edge_lost(lab(slot)?, Loss::Drain)
}

/// Long downloads in flight, some through edge1; edge1 goes; every download ends
/// whole from its pod, and the flows of step 2 asked again (all through edge2)
/// get the pod they had. Then edge1 starts again and both edges agree.
fn edge_lost(l: &mut Lab, loss: Loss) -> anyhow::Result<()> {
    let what = loss.what();
    let vip = l.cfg.vip.clone();
    let running = long_downloads(l)?;
    let (w0, started) = (l.topo.counters()?, Instant::now());
    // a second of the downloads, some of them through edge1
    wait_for(
        "long downloads through edge1",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || {
            let w = l.topo.counters()?;
            let grew = w["ipip_from_edge1"] > w0["ipip_from_edge1"];
            Ok(if grew && started.elapsed() >= Duration::from_secs(1) {
                Ok(())
            } else {
                Err(format!("edge1's IPIP packets: {}", w["ipip_from_edge1"]))
            })
        },
    )?;
    let t = Instant::now();
    match loss {
        Loss::Kill => l.cluster.kill("edge1")?,
        Loss::Drain => l.cluster.terminate("edge1", Duration::from_secs(60))?,
    }
    l.cluster.wait_ecmp(&vip, 1, Duration::from_secs(60))?;
    println!(
        "{loss:?} of edge1: the ToR has one next hop after {:?}",
        t.elapsed()
    );
    let outcomes: Vec<Finished> = running
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| (Err("thread panicked".into()), Instant::now()))
        })
        .collect();
    let broken: Vec<&String> = outcomes.iter().filter_map(|o| o.0.as_ref().err()).collect();
    let kept = outcomes.len() - broken.len();
    // started before the kill; those that ended after it were in flight
    let in_flight = outcomes.iter().filter(|o| o.1 > t).count();
    println!(
        "{FIGURE}{what}: {kept} of {} long downloads finished whole from the pod that started them ({in_flight} were in flight when edge1 went)",
        outcomes.len()
    );
    ensure!(
        2 * in_flight >= outcomes.len(),
        "only {in_flight} of {} downloads were in flight when edge1 went",
        outcomes.len()
    );
    let after = flow_map(l)?;
    let moved = flows::moved(&l.map1, &after);
    println!(
        "{FIGURE}{what}: {} of {} flows asked again through edge2 alone got the pod they had with both edges",
        l.map1.len() - moved.len(),
        l.map1.len()
    );
    ensure!(broken.is_empty(), "broken downloads: {broken:#?}");
    ensure!(moved.is_empty(), "flows that changed pod: {moved:?}");
    l.cluster.start_edge(1, &l.topo.pin_dir(1))?;
    l.cluster.wait_ecmp(&vip, 2, LONG)?;
    agreeing_dests(l, 3)?;
    Ok(())
}

/// The web pods' API and the name of the one with IP `ip`.
async fn web_pod(kube: &kube::Client, ip: &str) -> anyhow::Result<(kube::Api<Pod>, String)> {
    let pods: kube::Api<Pod> = kube::Api::namespaced(kube.clone(), "default");
    let list = pods.list(&ListParams::default().labels("app=web")).await?;
    let name = list
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(ip))
        .and_then(|p| p.metadata.name)
        .with_context(|| format!("no web pod with IP {ip}"))?;
    Ok((pods, name))
}

/// Marks pod3 not ready as a failing readiness probe would: the lab kubelet's
/// readiness annotation, after which that kubelet writes Ready=False (it owns the
/// pod's status and would put back a Ready written by anyone else); the
/// EndpointSlice drops it.
async fn unready(kube: &kube::Client, ip: &str) -> anyhow::Result<String> {
    let (pods, name) = web_pod(kube, ip).await?;
    let ann = crate::controlplane::kubelet::READY_ANNOTATION;
    let patch = serde_json::json!({ "metadata": { "annotations": { ann: "false" } } });
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(name)
}

fn backend_removed(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    let l = lab(slot)?;
    // with both edges back, the flows still have the pods of step 2
    let again = flow_map(l)?;
    let drift = flows::moved(&l.map1, &again);
    ensure!(
        drift.is_empty(),
        "before the removal, flows changed pod: {drift:?}"
    );
    let gone_ip = l.a.pods[2].to_string();
    let gone = "pod3";
    let name = l.rt.block_on(unready(&l.kube, &gone_ip))?;
    println!("pod {name} ({gone_ip}, {gone}) marked not ready");
    let lists = agreeing_dests(l, 2)?;
    if lists.iter().any(|d| d.starts_with(&gone_ip)) {
        bail!("{gone_ip} is still a real server: {lists:?}");
    }
    let after = flow_map(l)?;
    let moved = flows::moved(&l.map1, &after);
    let had = flows::per_pod(&l.map1).get(gone).copied().unwrap_or(0);
    let of_gone = moved.iter().filter(|(_, b, _)| b == gone).count();
    let others = moved.len() - of_gone;
    println!("moved flows (port, before, after): {moved:?}");
    println!(
        "{FIGURE}backend removed: {} of {} flows moved: {of_gone} of the {had} that {gone} had, {others} of other pods",
        moved.len(),
        l.map1.len()
    );
    ensure!(had > 0, "{gone} had flows before");
    ensure!(of_gone == had, "every flow of {gone} moved");
    ensure!(others == 0, "only {gone}'s flows move");
    Ok(())
}

/// Sets the Service's `spec.loadBalancerSourceRanges` (`None`: removes it).
fn set_source_ranges(l: &Lab, ranges: Option<&[&str]>) -> anyhow::Result<()> {
    let svcs: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(l.kube.clone(), "default");
    let patch = serde_json::json!({ "spec": { "loadBalancerSourceRanges": ranges } });
    l.rt.block_on(svcs.patch("web", &PatchParams::default(), &Patch::Merge(&patch)))?;
    Ok(())
}

/// Packets each edge's guard refused for the VIP:port (its named counter).
fn guard_refused(l: &Lab) -> anyhow::Result<Vec<u64>> {
    let name = format!("src_{}_tcp_{}", l.cfg.vip, l.a.port);
    (1..=2)
        .map(|i| {
            let ns = l.topo.ns(&format!("edge{i}"));
            let c = crate::lab::topology::nft_counters_in(&ns, "ringlb_guard")?;
            c.get(&name)
                .copied()
                .with_context(|| format!("edge{i}: no counter {name} in {c:?}"))
        })
        .collect()
}

/// Waits until both edges' guard tables hold `needle`.
fn wait_guards(l: &mut Lab, needle: &str) -> anyhow::Result<()> {
    let what = format!("both edges' guards to hold {needle:?}");
    Ok(wait_for(&what, LONG, Duration::from_millis(500), || {
        l.cluster.check_daemons()?;
        for i in 1..=2 {
            let ns = l.topo.ns(&format!("edge{i}"));
            let t = run_in(&ns, &["nft", "list", "table", "inet", "ringlb_guard"])?;
            if !t.contains(needle) {
                return Ok(Err(format!("edge{i}: {t}")));
            }
        }
        Ok(Ok(()))
    })?)
}

fn source_ranges(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    let l = lab(slot)?;
    let client: Ipv4Addr = l.a.client.parse()?;
    let dst = SocketAddrV4::new(l.cfg.vip.parse()?, l.a.port);
    let ns = l.topo.ns("client");
    set_source_ranges(l, Some(&["192.0.2.0/24"]))?;
    let t = Instant::now();
    println!("Service web restricted to 192.0.2.0/24 (the client is {client})");
    // as `nft list` prints them: a set of one is a plain match, a /32 an address
    wait_guards(l, "ip saddr 192.0.2.0/24 accept")?;
    println!(
        "{FIGURE}source ranges: both edges' guards restricted {dst} {:.1}s after the patch",
        t.elapsed().as_secs_f64()
    );
    let (w0, r0) = (l.topo.counters()?, guard_refused(l)?);
    let flows = 4;
    for port in FLOW_PORT..FLOW_PORT + flows {
        let got = flows::get(&ns, client, port, dst, "/", Duration::from_secs(3));
        ensure!(
            got.is_err(),
            "port {port}: served from outside the range: {got:?}"
        );
    }
    let (w1, r1) = (l.topo.counters()?, guard_refused(l)?);
    let d = |k: &str| w1[k] - w0[k];
    let refused: Vec<u64> = r1.iter().zip(&r0).map(|(a, b)| a - b).collect();
    println!(
        "{FIGURE}source ranges: {flows} flows from outside: {} packets to the VIP, refused by the guards {refused:?}, {} forwarded as IPIP",
        d("to_vip"),
        d("ipip_from_edge1") + d("ipip_from_edge2")
    );
    ensure!(
        d("to_vip") >= u64::from(flows),
        "the client's SYNs reached the edges"
    );
    ensure!(
        d("ipip_from_edge1") + d("ipip_from_edge2") == 0,
        "IPVS forwarded none of them"
    );
    ensure!(
        refused.iter().sum::<u64>() >= u64::from(flows),
        "the guards counted every SYN: {refused:?}"
    );
    let own = format!("{client}/32");
    set_source_ranges(l, Some(&["192.0.2.0/24", &own]))?;
    wait_guards(l, &format!("ip saddr {{ {client}, 192.0.2.0/24 }} accept"))?;
    let body = flows::get(&ns, client, FLOW_PORT, dst, "/", Duration::from_secs(10))
        .context("served again with the client's address in the range")?;
    println!("served again: {}", body.trim());
    set_source_ranges(l, None)?;
    Ok(())
}

/// Sets the Service's `sessionAffinity`: `ClientIP` with `timeout` seconds, or
/// (`None`) `None`, whose config the API refuses, so it is removed.
fn set_affinity(l: &Lab, timeout: Option<u32>) -> anyhow::Result<()> {
    let svcs: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(l.kube.clone(), "default");
    let spec = match timeout {
        Some(t) => serde_json::json!({
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": { "clientIP": { "timeoutSeconds": t } },
        }),
        None => serde_json::json!({ "sessionAffinity": "None", "sessionAffinityConfig": null }),
    };
    let patch = serde_json::json!({ "spec": spec });
    l.rt.block_on(svcs.patch("web", &PatchParams::default(), &Patch::Merge(&patch)))?;
    Ok(())
}

/// Waits until both edges' virtual service for the VIP:port is persistent with
/// `timeout` seconds (`None`: not persistent, `mh-port` back); edge1's line for it
/// in `ipvsadm -Ln`.
fn wait_persistence(l: &mut Lab, timeout: Option<u32>) -> anyhow::Result<String> {
    let svc = format!("{}:{}", l.cfg.vip, l.a.port);
    let what = match timeout {
        Some(t) => format!("both edges' {svc} to be persistent {t}"),
        None => format!("both edges' {svc} to be no longer persistent"),
    };
    Ok(wait_for(&what, LONG, Duration::from_millis(500), || {
        l.cluster.check_daemons()?;
        let mut heads = Vec::new();
        for i in 1..=2 {
            let ns = l.topo.ns(&format!("edge{i}"));
            let out = run_in(&ns, &["ipvsadm", "-Ln", "-t", &svc])?;
            let head = out.lines().find(|x| x.contains(&svc)).unwrap_or("");
            let done = match timeout {
                Some(t) => head.contains(&format!("persistent {t}")) && !head.contains("mh-port"),
                None => !head.contains("persistent") && head.contains("mh-port"),
            };
            if !done {
                return Ok(Err(format!("edge{i}: {head:?}")));
            }
            heads.push(head.trim().to_string());
        }
        Ok(Ok(heads.swap_remove(0)))
    })?)
}

/// The real servers that edge `i`'s persistence templates name for `client`.
fn templates(l: &Lab, i: usize, client: &str) -> anyhow::Result<Vec<String>> {
    let ns = l.topo.ns(&format!("edge{i}"));
    let out = run_in(&ns, &["ipvsadm", "-Lnc"])?;
    let virt = format!("{}:{}", l.cfg.vip, l.a.port);
    Ok(parse_templates(&out, client, &virt))
}

fn client_affinity(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    let l = lab(slot)?;
    let client = l.a.client.clone();
    let n = l.cfg.flows;
    set_affinity(l, Some(AFFINITY_TIMEOUT))?;
    let t = Instant::now();
    println!("Service web: sessionAffinity ClientIP, timeoutSeconds {AFFINITY_TIMEOUT}");
    let head = wait_persistence(l, Some(AFFINITY_TIMEOUT))?;
    println!(
        "{FIGURE}affinity: both edges' IPVS services persistent {:.1}s after the patch: {head}",
        t.elapsed().as_secs_f64()
    );
    let w0 = l.topo.counters()?;
    let m = flow_map_from(l, AFFINITY_PORT)?;
    let w1 = l.topo.counters()?;
    let d = |k: &str| w1[k] - w0[k];
    let (e1, e2) = (d("ipip_from_edge1"), d("ipip_from_edge2"));
    let pods = flows::per_pod(&m);
    let tpl = [templates(l, 1, &client)?, templates(l, 2, &client)?];
    println!(
        "persistence templates of {client}: edge1 {:?}, edge2 {:?}",
        tpl[0], tpl[1]
    );
    println!(
        "{FIGURE}affinity: {n} new connections from the client answered by {pods:?}; IPIP packets from edge1 {e1}, from edge2 {e2}"
    );
    ensure!(
        pods.len() == 1,
        "every connection reached one pod: {pods:?}"
    );
    ensure!(e1 > 0 && e2 > 0, "both edges carried some of them (ECMP)");
    let pod = pods.keys().next().context("no pod answered")?;
    let ip = pod_addr(l, pod)?;
    for (i, t) in tpl.iter().enumerate() {
        ensure!(
            t.len() == 1 && t[0].split(':').next() == Some(ip.as_str()),
            "edge{}: one template for {client}, naming {pod} ({ip}): {t:?}",
            i + 1
        );
    }
    set_affinity(l, None)?;
    wait_persistence(l, None)?;
    let m = flow_map_from(l, AFFINITY_PORT + n)?;
    let pods = flows::per_pod(&m);
    println!("{FIGURE}affinity off: {n} new connections from the client answered by {pods:?}");
    ensure!(
        pods.len() > 1,
        "without affinity, more than one pod: {pods:?}"
    );
    Ok(())
}

/// The address of lab pod `podN`.
fn pod_addr(l: &Lab, pod: &str) -> anyhow::Result<String> {
    pod.strip_prefix("pod")
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| l.a.pods.get(i.wrapping_sub(1)))
        .cloned()
        .with_context(|| format!("no address for {pod}"))
}

/// Deletes the web pod with IP `ip`, with `grace` seconds to go (the lab kubelet
/// keeps it Ready until then, so its endpoint is serving and terminating); its name.
async fn delete_pod(kube: &kube::Client, ip: &str, grace: u32) -> anyhow::Result<String> {
    let (pods, name) = web_pod(kube, ip).await?;
    let dp = DeleteParams {
        grace_period_seconds: Some(grace),
        ..DeleteParams::default()
    };
    pods.delete(&name, &dp).await?;
    Ok(name)
}

fn terminating_affinity(slot: &mut Option<Lab>, _: &Path) -> anyhow::Result<()> {
    let l = lab(slot)?;
    let n = l.cfg.flows;
    let first = AFFINITY_PORT + 2 * n;
    set_affinity(l, Some(AFFINITY_TIMEOUT))?;
    wait_persistence(l, Some(AFFINITY_TIMEOUT))?;
    let pods = flows::per_pod(&flow_map_from(l, first)?);
    ensure!(pods.len() == 1, "with affinity, one pod: {pods:?}");
    let had = pods.keys().next().context("no pod answered")?.clone();
    let ip = pod_addr(l, &had)?;
    let name = l.rt.block_on(delete_pod(&l.kube, &ip, 600))?;
    println!("pod {name} ({ip}, {had}) deleted with a 600 s grace period");
    let svc = format!("{}:{}", l.cfg.vip, l.a.port);
    wait_for(
        &format!("both edges to keep {ip} at weight 0"),
        LONG,
        Duration::from_millis(500),
        || {
            l.cluster.check_daemons()?;
            for i in 1..=2 {
                let ns = l.topo.ns(&format!("edge{i}"));
                let out = run_in(&ns, &["ipvsadm", "-Ln", "-t", &svc])?;
                if dest_weight(&out, &ip) != Some(0) {
                    return Ok(Err(format!("edge{i}: {out}")));
                }
            }
            Ok(Ok(()))
        },
    )?;
    let pods = flows::per_pod(&flow_map_from(l, first + n)?);
    println!(
        "{FIGURE}terminating: {n} new connections of the client whose pod {had} is terminating answered by {pods:?}"
    );
    ensure!(
        !pods.contains_key(&had) && pods.len() == 1,
        "new connections reach one ready pod, not the terminating {had}: {pods:?}"
    );
    Ok(())
}
