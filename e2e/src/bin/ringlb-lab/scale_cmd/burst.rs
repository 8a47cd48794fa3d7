//! The scale bench's bad input (`--burst-ports`): at the largest size, with the edge
//! running, the first Services covering that many ports are deleted and as many new
//! ones created, as fast as the API server takes them, and the API server is frozen
//! (SIGSTOP) for `--outage` in the middle. While it is frozen the edge must keep every
//! untouched VIP programmed and announced and announce nothing it does not serve;
//! once it is back, every VIP:port of the API's final state must be programmed and
//! every VIP announced.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ringlb_e2e::lab::{self, Cluster, scale};

use super::Ctx;

/// How often the edge is looked at while the API is frozen.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The most the bench waits for the edge to catch up once the API is back (the
/// goal, the cold start's 30 s, is the docs' to compare with).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(300);
/// How long the burst runs before the API server is frozen.
const FREEZE_AFTER: Duration = Duration::from_millis(500);

pub(super) fn burst_with_outage(
    cx: &Ctx<'_>,
    cluster: &mut Cluster,
    pin: &Path,
    vips: &[Ipv4Addr],
) -> anyhow::Result<scale::Burst> {
    let per = usize::from(cx.args.ports_per_service);
    let (n, services) = (cx.args.burst_ports / per, vips.len());
    if n == 0 || n >= services {
        bail!(
            "--burst-ports {}: not between one Service's ports and all of them ({} Services)",
            cx.args.burst_ports,
            services
        );
    }
    println!(
        "  burst: {n} Services deleted, {n} created, the API server frozen for {:?} in the middle",
        cx.args.outage
    );
    let untouched = &vips[n..];
    let api = apiserver_pid(cluster)?;
    let map = scale::VipsMap::open(pin)?.context("the edge's vips map")?;
    let burst = spawn_burst(cx, cluster.kubeconfig(), n, services);
    std::thread::sleep(FREEZE_AFTER);
    let mut b = scale::Burst {
        ports: n * per,
        untouched: untouched.len(),
        min_programmed: usize::MAX,
        min_announced: usize::MAX,
        ..Default::default()
    };
    {
        let _frozen = Frozen::stop(api)?;
        let t = Instant::now();
        while t.elapsed() < cx.args.outage {
            edge_alive(cluster)?;
            let served = map.v4_vips();
            let announced = edge_routes(cluster)?;
            let count =
                |set: &BTreeSet<Ipv4Addr>| untouched.iter().filter(|v| set.contains(v)).count();
            b.min_programmed = b.min_programmed.min(count(&served));
            b.min_announced = b.min_announced.min(count(&announced));
            b.announced_unserved += announced.difference(&served).count();
            b.samples += 1;
            std::thread::sleep(LOOK_EVERY);
        }
        b.outage = t.elapsed();
    }
    let back = Instant::now();
    println!(
        "  API frozen {:.1} s: untouched VIPs programmed / announced at least {} / {} of {}, {} announced without being served",
        b.outage.as_secs_f64(),
        b.min_programmed,
        b.min_announced,
        b.untouched,
        b.announced_unserved
    );
    b.requests = burst
        .join()
        .map_err(|_| anyhow::anyhow!("the burst's thread panicked"))??;
    let want = final_vips(cx, n, services)?;
    loop {
        edge_alive(cluster)?;
        let (served, announced) = (map.v4_vips(), edge_routes(cluster)?);
        if served == want && announced == want && map.count() == services * per {
            break;
        }
        if back.elapsed() > CATCH_UP_LIMIT {
            bail!(
                "{CATCH_UP_LIMIT:?} after the API returned: {} of {} VIPs programmed ({} VIP:ports), {} announced",
                served.intersection(&want).count(),
                want.len(),
                map.count(),
                announced.len()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    b.caught_up = back.elapsed();
    Ok(b)
}

/// Deletes Services `0..n` and creates `services..services + n` at once, on a thread
/// and client of its own: the calling thread watches the edge meanwhile. Returns
/// how long the requests took.
fn spawn_burst(
    cx: &Ctx<'_>,
    kubeconfig: PathBuf,
    n: usize,
    services: usize,
) -> std::thread::JoinHandle<anyhow::Result<Duration>> {
    let pods = cx.pods[..cx.args.pods].to_vec();
    let ports = cx.args.ports_per_service;
    // a thread starts in its creator's network namespace: the ToR's, where the API is
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            let client = ringlb_ops::kube_client::client(cfg)?;
            let t = Instant::now();
            let (deleted, created) = tokio::join!(
                scale::delete(&client, 0..n),
                scale::create(&client, services..services + n, ports, &pods)
            );
            deleted?;
            created?;
            Ok::<_, anyhow::Error>(t.elapsed())
        })
    })
}

/// The VIPs of Services `n..services + n` once every one has its VIP.
fn final_vips(cx: &Ctx<'_>, n: usize, services: usize) -> anyhow::Result<BTreeSet<Ipv4Addr>> {
    Ok(lab::wait_for(
        "a VIP on every Service of the final state",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            let all = cx.rt.block_on(scale::vips(&cx.client))?;
            let have: BTreeSet<Ipv4Addr> = all.range(n..services + n).map(|(_, v)| *v).collect();
            Ok(if have.len() == services {
                Ok(have)
            } else {
                Err(format!("{} of {services}", have.len()))
            })
        },
    )?)
}

/// The /32s BIRD has from edge1.
fn edge_routes(cluster: &Cluster) -> anyhow::Result<BTreeSet<Ipv4Addr>> {
    let out = cluster.birdc(&["show", "route", "protocol", "edge1"])?;
    Ok(scale::bird_host_routes(&out))
}

fn edge_alive(cluster: &mut Cluster) -> anyhow::Result<()> {
    let edge = cluster
        .daemons
        .iter_mut()
        .find(|d| d.name == "edge1")
        .context("no edge1 daemon")?;
    if !edge.alive() {
        bail!("edge1 exited during the burst:\n{}", edge.log_tail(40));
    }
    Ok(())
}

/// The lab's kube-apiserver: a descendant of its control-plane daemon.
fn apiserver_pid(cluster: &Cluster) -> anyhow::Result<u32> {
    let cp = cluster
        .daemons
        .iter()
        .find(|d| d.name == "control-plane")
        .context("no control-plane daemon")?;
    let found = ringlb_e2e::procfs::descendants_named(cp.pid(), "kube-apiserver");
    match found[..] {
        [pid] => Ok(pid),
        _ => bail!("expected one kube-apiserver below the control plane, found {found:?}"),
    }
}

/// The API server frozen with SIGSTOP until this is dropped (SIGCONT), also when
/// the bench fails on the way.
struct Frozen(u32);

impl Frozen {
    fn stop(pid: u32) -> anyhow::Result<Frozen> {
        signal(pid, "STOP")?;
        Ok(Frozen(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = signal(self.0, "CONT") {
            eprintln!("resuming kube-apiserver {}: {e:#}", self.0);
        }
    }
}

fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let st = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .context("running kill")?;
    if !st.success() {
        bail!("kill -{sig} {pid}: {st}");
    }
    Ok(())
}
