//! `ringlb-lab scale`: the edge at datacenter scale (docs/bench-scale.md). The lab
//! with its VIP pool widened ([`scale::addrs`]), the controller allocating, and for
//! each size (Service ports, ascending): the Services added up to it, then one
//! `ringlb-edge run` started cold (no pinned maps) in edge1 and measured: until every
//! VIP:port is in its `vips` map and every /32 is in BIRD, its peak RSS, the kernel
//! memory of its BPF maps, and one Service's endpoints changed -> its ring resized.
//! At the largest size, optionally, a burst of deletions and creations with the API
//! server frozen in the middle ([`burst`]).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ringlb_e2e::lab::{self, Bins, Cluster, Topology, scale, topology};

mod burst;

/// What to run: the sizes and the shape of each Service.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ScaleArgs {
    /// Service ports per size, ascending (each a multiple of --ports-per-service).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000usize, 10_000, 50_000])]
    sizes: Vec<usize>,
    /// TCP ports per Service (one VIP each).
    #[arg(long, default_value_t = 5)]
    ports_per_service: u16,
    /// Ready endpoints per Service.
    #[arg(long, default_value_t = 10)]
    pods: usize,
    /// Endpoint changes timed per size.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// At the largest size: delete the Services of this many ports and create as
    /// many new ones at once, with the API server frozen in the middle (0: skip).
    #[arg(long, default_value_t = 0)]
    burst_ports: usize,
    /// How long the API server stays frozen during the burst.
    #[arg(long, default_value = "30s", value_parser = ringlb_ops::flags::parse_duration)]
    outage: Duration,
    /// Where the table and the programs' logs (edge1's of the last size) are kept.
    #[arg(long, default_value = "target/scale-bench")]
    report_dir: PathBuf,
}

impl ScaleArgs {
    fn check(&self) -> anyhow::Result<()> {
        let p = usize::from(self.ports_per_service);
        if p == 0 || self.pods == 0 {
            bail!("--ports-per-service and --pods must be at least 1");
        }
        if self.sizes.is_empty() || !self.sizes.windows(2).all(|w| w[0] < w[1]) {
            bail!("--sizes must be ascending: {:?}", self.sizes);
        }
        for s in &self.sizes {
            if s % p != 0 {
                bail!("--sizes: {s} is not a multiple of --ports-per-service {p}");
            }
        }
        // the pool (10.212.0.0/16) and the datapath's VIP map (65,536 entries)
        let last = *self.sizes.last().unwrap_or(&0);
        if last / p > 65_000 || last > 65_536 {
            bail!("--sizes: {last} ports exceed the pool (65,000 VIPs) or the VIP map (65,536)");
        }
        let burst = self.burst_ports;
        if burst > 0 && (!burst.is_multiple_of(p) || burst >= last) {
            bail!(
                "--burst-ports {burst}: a multiple of --ports-per-service {p} below the last size {last}"
            );
        }
        // the deleted and the created Services may hold VIPs at the same time
        if (last + burst) / p > 65_000 || last + burst > 65_536 {
            bail!(
                "--sizes and --burst-ports: {last} + {burst} ports exceed the pool or the VIP map"
            );
        }
        Ok(())
    }
}

pub(crate) fn run(prefix: String, dir: PathBuf, args: ScaleArgs) -> anyhow::Result<()> {
    if let Some(why) = lab::skip_reason() {
        bail!("{why}");
    }
    args.check()?;
    let (p2, d2) = (prefix.clone(), dir.clone());
    super::with_teardown_on_signal(prefix, dir, move || {
        let result = bring_up_and_measure(&p2, &d2, &args);
        topology::teardown(&p2, &d2);
        let (rows, burst) = result?;
        let mut table = scale::table(&rows);
        if let Some(b) = &burst {
            table = format!("{table}\n{}", scale::burst_table(b));
        }
        println!("\n{table}");
        std::fs::write(args.report_dir.join("table.md"), &table)?;
        println!("table and logs: {}", args.report_dir.display());
        Ok(())
    })
}

/// Copies the lab's logs (`<dir>/*.log`) into `report`.
fn keep_logs(dir: &Path, report: &Path) {
    let _ = std::fs::create_dir_all(report);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log")
            && let Some(name) = p.file_name()
        {
            let _ = std::fs::copy(&p, report.join(name));
        }
    }
}

/// What a run measured: a row per size, and the burst if there was one.
type Measured = (Vec<scale::Row>, Option<scale::Burst>);

fn bring_up_and_measure(prefix: &str, dir: &Path, args: &ScaleArgs) -> anyhow::Result<Measured> {
    let bins = Bins::discover()?;
    let topo = Topology::up(prefix, dir, scale::addrs()).context("building the fabric")?;
    let mut cluster = Cluster::new(&topo, bins);
    let r = (|| {
        cluster.start_bird()?;
        cluster.start_control_plane()?;
        cluster.start_controller()?;
        let manifests = cluster.write_manifests()?;
        cluster.apply(&manifests)?;
        let tor = topo.ns("tor");
        // the API is at the ToR's fabric address: the measuring thread lives there
        ringlb_ops::netns::in_named(&tor, || {
            measure_sizes(&topo, &mut cluster, args).map_err(std::io::Error::other)
        })
        .context("measuring in the ToR namespace")
    })();
    if r.is_err() {
        eprintln!("{}", cluster.log_tails(30));
    }
    // before the lab's folder goes with `topo`
    keep_logs(dir, &args.report_dir);
    r
}

/// What every measurement of one run shares.
struct Ctx<'a> {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    topo: &'a Topology,
    args: &'a ScaleArgs,
    /// `args.pods + 1` endpoint addresses (a change adds the last one).
    pods: Vec<Ipv4Addr>,
}

fn measure_sizes(
    topo: &Topology,
    cluster: &mut Cluster,
    args: &ScaleArgs,
) -> anyhow::Result<Measured> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let kc = kube::config::Kubeconfig::read_from(cluster.kubeconfig())?;
    let client = rt.block_on(async {
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        anyhow::Ok(ringlb_ops::kube_client::client(cfg)?)
    })?;
    let pods = scale::pod_addrs(&topo.addrs, args.pods + 1)?;
    let cx = Ctx {
        rt,
        client,
        topo,
        args,
        pods,
    };
    let ports = args.ports_per_service;
    let mut rows = Vec::new();
    let mut burst = None;
    let mut have = 0;
    for (k, &size) in args.sizes.iter().enumerate() {
        let services = size / usize::from(ports);
        println!(
            "== {size} Service ports: {services} Services x {ports} ports, {} pods each",
            args.pods
        );
        let t = Instant::now();
        cx.rt.block_on(scale::create(
            &cx.client,
            have..services,
            ports,
            &cx.pods[..args.pods],
        ))?;
        have = services;
        println!(
            "  created {services} Services and EndpointSlices in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let vips = wait_allocated(&cx, services)?;
        println!(
            "  all {services} have a VIP after {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let last = k + 1 == args.sizes.len() && args.burst_ports > 0;
        let (row, b) = measure_edge(&cx, cluster, size, &vips, last)?;
        println!("{}", scale::table(std::slice::from_ref(&row)));
        if let Some(b) = &b {
            println!("{}", scale::burst_table(b));
        }
        rows.push(row);
        burst = burst.or(b);
    }
    Ok((rows, burst))
}

fn wait_allocated(cx: &Ctx<'_>, services: usize) -> anyhow::Result<Vec<Ipv4Addr>> {
    let vips = lab::wait_for(
        "a VIP on every bench Service",
        Duration::from_secs(900),
        Duration::from_millis(500),
        || {
            let v = cx.rt.block_on(scale::vips(&cx.client))?;
            Ok(if v.len() >= services {
                Ok(v)
            } else {
                Err(format!("{} of {services}", v.len()))
            })
        },
    )?;
    (0..services)
        .map(|i| {
            vips.get(&i)
                .copied()
                .with_context(|| format!("Service scale-{i} has no VIP"))
        })
        .collect()
}

/// Edge1 started cold against what the API holds now, then the burst if `burst`;
/// stopped again at the end.
fn measure_edge(
    cx: &Ctx<'_>,
    cluster: &mut Cluster,
    size: usize,
    vips: &[Ipv4Addr],
    burst: bool,
) -> anyhow::Result<(scale::Row, Option<scale::Burst>)> {
    let pin = cx.topo.pin_dir(1);
    ringlb_xdp::xdp::XdpDatapath::remove_pins(&pin)?;
    let before = scale::max_map_id(&bpftool_maps()?)?;
    let t0 = Instant::now();
    // each sync's time and the apply's work in its log (kept in --report-dir)
    cluster.start_edge_with(
        1,
        &pin,
        &["--log-level", "info,ringlb_edge::agent::sync=debug"],
    )?;
    let (mut programmed, mut announced) = (None, None);
    let (programmed, announced) = lab::wait_for(
        "every VIP:port programmed and announced",
        Duration::from_secs(600),
        Duration::from_millis(100),
        || {
            cluster.check_daemons()?;
            if programmed.is_none()
                && let Some(m) = scale::VipsMap::open(&pin)?
                && m.count() >= size
            {
                programmed = Some(t0.elapsed());
            }
            if announced.is_none() {
                let out = cluster.birdc(&["show", "route", "count", "protocol", "edge1"])?;
                if scale::route_count(&out).unwrap_or(0) >= vips.len() {
                    announced = Some(t0.elapsed());
                }
            }
            Ok(match (programmed, announced) {
                (Some(p), Some(a)) => Ok((p, a)),
                _ => Err(format!(
                    "programmed {programmed:?}, announced {announced:?}"
                )),
            })
        },
    )?;
    println!(
        "  cold start: programmed {:.2} s, announced {:.2} s",
        programmed.as_secs_f64(),
        announced.as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));
    let (bpf_bytes, bpf_maps) = scale::memlock_after(&bpftool_maps()?, before)?;
    let times = time_changes(cx, &pin, vips)?;
    let rss_kib = cluster
        .daemons
        .iter_mut()
        .find(|d| d.name == "edge1")
        .and_then(|d| d.alive().then_some(d))
        .and_then(|d| ringlb_e2e::procfs::status_kb(d.pid(), "VmHWM:"))
        .context("the edge's VmHWM")?;
    let burst = if burst {
        Some(burst::burst_with_outage(cx, cluster, &pin, vips)?)
    } else {
        None
    };
    cluster.terminate("edge1", Duration::from_secs(30))?;
    ringlb_xdp::xdp::XdpDatapath::remove_pins(&pin)?;
    let row = scale::Row {
        ports: size,
        services: vips.len(),
        programmed,
        announced,
        rss_kib,
        bpf_bytes,
        bpf_maps,
        change_p50: lab::measure::percentile(&times, 50.0),
        change_p99: lab::measure::percentile(&times, 99.0),
        changes: times.len(),
    };
    Ok((row, burst))
}

/// `changes` times: one Service's endpoints go from `pods` to `pods + 1` (or back),
/// which moves its ring to the next size of the ladder; timed from the PATCH until
/// the edge's `vips` map shows the new ring size for its first port.
fn time_changes(cx: &Ctx<'_>, pin: &Path, vips: &[Ipv4Addr]) -> anyhow::Result<Vec<Duration>> {
    let map = scale::VipsMap::open(pin)?.context("the edge's vips map")?;
    let pods = cx.args.pods;
    let mut grown = std::collections::BTreeSet::new();
    let mut times = Vec::with_capacity(cx.args.changes);
    for k in 0..cx.args.changes {
        // spread over the Services, the same one now and then (grown and shrunk back)
        let i = (k * 7_919) % vips.len();
        let was = map
            .ring_size(vips[i], scale::FIRST_PORT)
            .context("a bench VIP not programmed")?;
        let n = if grown.remove(&i) {
            pods
        } else {
            grown.insert(i);
            pods + 1
        };
        let t = Instant::now();
        cx.rt
            .block_on(scale::set_endpoints(&cx.client, i, &cx.pods[..n]))?;
        loop {
            if map.ring_size(vips[i], scale::FIRST_PORT) != Some(was) {
                times.push(t.elapsed());
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!(
                    "Service scale-{i}: its ring stayed at {was} slots 10 s after its endpoints changed"
                );
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // back to `pods` endpoints, so that the next size starts where this one did
    for i in grown {
        cx.rt
            .block_on(scale::set_endpoints(&cx.client, i, &cx.pods[..pods]))?;
    }
    Ok(times)
}

fn bpftool_maps() -> anyhow::Result<String> {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "show"])
        .output()
        .context("running bpftool -j map show")?;
    if !out.status.success() {
        bail!(
            "bpftool -j map show: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}
