//! ipvs-bench: the IPVS edge against the XDP edge, the same traffic through each in
//! one run on one kernel, the ratio reported. Needs root and a kernel with IPVS
//! (`ip_vs`, `ip_vs_mh`) and XDP; this dev VM's kernel has no IPVS, so it runs in
//! a kernel-matrix guest:
//!
//!   cargo run -p ringlb-kernels --bin kernel-matrix -- -k 6.1 --bench ipvs-bench
//!   sudo target/release/ipvs-bench --seconds 5 --rounds 3     # where IPVS exists
//!
//! ```text
//!  client 10.204.1.2 --- tor --- edge-ipvs 10.204.0.11  IPVS mh, tunnel (VIP on lo)
//!                         |  \-- edge-xdp  10.204.2.11  ringlb_xdp, IPIP, XDP_TX
//!                         `----- pod 10.204.3.21        tunl0 decap, VIP on lo, DSR
//! ```
//! Two measurements, each edge in turn on the same client, ToR and pod (the pod
//! decapsulates with `tunl0` for both), so the difference is the edge: IPVS (the
//! full IP stack, LOCAL_IN, IPVS's connection table, ip_tunnel output) against
//! XDP (Maglev lookup and IPIP in the driver hook).
//! - TCP: short connections (connect, one request line, the answer, close),
//!   `--clients` threads for `--seconds` per edge, the order alternating per round:
//!   requests/s.
//! - UDP: `--packets` packets, each a new flow or all one flow, with at most 32
//!   in flight (no ring overflows): ns per packet from the first send to the last
//!   packet read by the pod, through each edge and straight to the pod (the base);
//!   the edge's share is the difference from the base.
//!
//! - Flood (`--only flood` alone): the two above are bound by the userspace
//!   sender under emulation, so here the kernel's pktgen in the ToR namespace
//!   floods one edge's veth directly (`--flood-packets`, 3,072 flows) and the
//!   ToR drops what comes back with XDP: packets/s each edge forwards when it is
//!   the bottleneck, against a floor with no edge (bench/src/ipvs_flood.rs).
//!
//! Each edge's own counter must show it carried the traffic. Under qemu's
//! emulation absolute figures mean nothing; the ratios, measured side by side in
//! one run, are the result.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;
use ringlb_ipvs::{Config, IpvsDatapath, kernel::netlink::NetlinkKernel};
use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::KernelResolver;
use ringlb_testkit::netns::{Netns, run as sh};
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};

#[path = "../ipvs_flood.rs"]
mod flood;
#[path = "../pktgen.rs"]
mod pktgen;
#[allow(unsafe_code)]
#[path = "../raw.rs"]
mod raw;

#[derive(Parser, Debug)]
#[command(
    about = "IPVS edge vs XDP edge: short TCP connections, UDP, a pktgen flood (needs root, IPVS)"
)]
struct Args {
    /// Seconds per edge per round.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds (each runs both edges, the order alternating).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Client threads, each one connection at a time.
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// UDP packets per measurement.
    #[arg(long, default_value_t = 5_000)]
    packets: u32,
    /// Run only this section: tcp, udp or flood (default: all three).
    #[arg(long)]
    only: Option<String>,
    /// pktgen packets per edge per round (the flood section).
    #[arg(long, default_value_t = 200_000)]
    flood_packets: u64,
}

const VIP: &str = "10.204.100.1";
const POD: &str = "10.204.3.21";
const EDGE_IPVS: &str = "10.204.0.11";
const EDGE_XDP: &str = "10.204.2.11";
/// The UDP service (the pod discards what it gets).
const UDP_PORT: u16 = 9;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn desired() -> anyhow::Result<DesiredState> {
    let vip = Vip {
        addr: ip(VIP),
        port: 80,
        proto: Proto::Tcp,
    };
    let b = [Backend {
        addr: ip(POD),
        port: 80,
        weight: 1,
    }];
    let table = Table::build(&b, 251)?;
    let udp = Vip {
        port: UDP_PORT,
        proto: Proto::Udp,
        ..vip
    };
    Ok(DesiredState {
        services: [
            (vip, ServiceEntry::from_table(&vip, &table)?),
            (udp, ServiceEntry::from_table(&udp, &table)?),
        ]
        .into(),
    })
}

struct Lab {
    c: Netns,
    t: Netns,
    ei: Netns,
    ex: Netns,
    p: Netns,
}

fn veth(a: &Netns, an: &str, aip: &str, b: &Netns, bn: &str, bip: &str) -> anyhow::Result<()> {
    sh(&[
        "ip", "-n", &a.0, "link", "add", an, "type", "veth", "peer", "name", bn, "netns", &b.0,
    ])?;
    for (ns, dev, addr) in [(a, an, aip), (b, bn, bip)] {
        ns.exec(&["ip", "addr", "add", addr, "dev", dev])?;
        ns.exec(&["ip", "link", "set", dev, "up"])?;
    }
    Ok(())
}

fn lab() -> anyhow::Result<Lab> {
    let pid = std::process::id();
    let n = |s: &str| Netns::create(&format!("rlbib{pid}{s}"));
    let l = Lab {
        c: n("c")?,
        t: n("t")?,
        ei: n("ei")?,
        ex: n("ex")?,
        p: n("p")?,
    };
    veth(&l.c, "eth0", "10.204.1.2/24", &l.t, "ve-c", "10.204.1.1/24")?;
    veth(
        &l.ei,
        "eth0",
        &format!("{EDGE_IPVS}/24"),
        &l.t,
        "ve-i",
        "10.204.0.1/24",
    )?;
    veth(
        &l.ex,
        "eth0",
        &format!("{EDGE_XDP}/24"),
        &l.t,
        "ve-x",
        "10.204.2.1/24",
    )?;
    veth(
        &l.p,
        "eth0",
        &format!("{POD}/24"),
        &l.t,
        "ve-p",
        "10.204.3.1/24",
    )?;
    for (ns, gw) in [
        (&l.c, "10.204.1.1"),
        (&l.ei, "10.204.0.1"),
        (&l.ex, "10.204.2.1"),
        (&l.p, "10.204.3.1"),
    ] {
        ns.exec(&["ip", "route", "add", "default", "via", gw])?;
    }
    l.t.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    for ns in [&l.c, &l.t, &l.ei, &l.ex, &l.p] {
        ns.exec(&["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0"])?;
        if ns.0 != l.t.0 {
            ns.exec(&["sysctl", "-qw", "net.ipv4.conf.eth0.rp_filter=0"])?;
        }
    }
    for dev in ["ve-c", "ve-i", "ve-x", "ve-p"] {
        l.t.exec(&["sysctl", "-qw", &format!("net.ipv4.conf.{dev}.rp_filter=0")])?;
    }
    let p = &l.p;
    p.exec(&["ip", "addr", "add", &format!("{VIP}/32"), "dev", "lo"])?;
    p.exec(&["sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1"])?;
    p.exec(&["sysctl", "-qw", "net.ipv4.conf.all.arp_announce=2"])?;
    p.exec(&["ip", "link", "set", "tunl0", "up"])
        .context("the pod's tunl0 (modprobe ipip)")?;
    p.exec(&["sysctl", "-qw", "net.ipv4.conf.tunl0.rp_filter=0"])?;
    // the neighbours the XDP edge's resolver needs, and a path check
    l.ex.exec(&["ping", "-c1", "-W2", "10.204.2.1"])?;
    l.c.exec(&["ping", "-c1", "-W2", POD])?;
    // a veth frame the XDP edge sends back with XDP_TX keeps a partial checksum
    ringlb_testkit::netns::in_netns(&l.c.0, || ringlb_testkit::netns::tx_checksum_off("eth0"));
    Ok(l)
}

/// Runs `serve` on a thread of its own in namespace `ns`, with the socket `open`
/// makes there; returns once `open` has succeeded, or with its error (10 s at most).
fn serve_in<S>(
    ns: &str,
    open: impl FnOnce() -> std::io::Result<S> + Send + 'static,
    serve: impl FnOnce(S) + Send + 'static,
) -> anyhow::Result<()> {
    let ns = ns.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let s = ringlb_ops::netns::enter_named(&ns)
            .map_err(anyhow::Error::from)
            .and_then(|_| Ok(open()?));
        match s {
            Ok(s) => {
                tx.send(Ok(())).unwrap();
                serve(s)
            }
            Err(e) => tx.send(Err(e)).unwrap(),
        }
    });
    rx.recv_timeout(Duration::from_secs(10))?
}

/// The pod's server: one answer line per request line.
fn serve(ns: &str) -> anyhow::Result<()> {
    let open = || std::net::TcpListener::bind((ip(VIP), 80));
    serve_in(ns, open, |l| {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(mut w) = c.try_clone() else { return };
                for line in BufReader::new(c).lines() {
                    if line.is_err() || w.write_all(b"pod\n").is_err() {
                        break;
                    }
                }
            });
        }
    })
}

fn one_request() -> std::io::Result<()> {
    let s = TcpStream::connect_timeout(&SocketAddr::new(ip(VIP), 80), Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(s);
    r.get_mut().write_all(b"hello\n")?;
    let mut line = String::new();
    r.read_line(&mut line)?;
    if line != "pod\n" {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// `clients` threads in the client namespace for `secs`: (requests done, failed).
fn load(client: &str, clients: u32, secs: u64) -> (u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (stop, ok, bad, ns) = (stop.clone(), ok.clone(), bad.clone(), client.to_string());
            std::thread::spawn(move || {
                ringlb_ops::netns::enter_named(&ns).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    match one_request() {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => bad.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    (ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if !ringlb_testkit::netns::is_root() {
        bail!("ipvs-bench needs root (namespaces, IPVS, XDP)");
    }
    for m in ["ip_vs", "ip_vs_mh", "ipip", "pktgen"] {
        let _ = std::process::Command::new("modprobe").arg(m).output();
    }
    if !std::path::Path::new("/proc/net/ip_vs").exists() {
        bail!(
            "this kernel has no IPVS (/proc/net/ip_vs absent): run it in a kernel-matrix guest, \
             cargo run -p ringlb-kernels --bin kernel-matrix -- -k 6.1 --bench ipvs-bench"
        );
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let l = lab()?;
    serve(&l.p.0)?;
    let d = desired()?;

    let mut ipvs: IpvsDatapath<NetlinkKernel> =
        ringlb_testkit::netns::in_netns(&l.ei.0, || -> anyhow::Result<_> {
            Ok(IpvsDatapath::new(
                NetlinkKernel::open()?,
                Config::default(),
            )?)
        })?;
    Datapath::apply(&mut ipvs, &d)?;

    // ringlb_pass on the ToR's side of the XDP edge: veth XDP_TX needs a program there
    let mut pass = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
    let prog: &mut aya::programs::Xdp = pass
        .program_mut("ringlb_pass")
        .context("ringlb_pass")?
        .try_into()?;
    prog.load()?;
    let pass_link = ringlb_testkit::netns::in_netns(&l.t.0, || {
        prog.attach("ve-x", aya::programs::XdpMode::Driver)
    })?;
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some(EDGE_XDP.parse()?),
        ..XdpOptions::default()
    };
    let mut xdp = XdpDatapath::load(&opts, Box::new(KernelResolver::new(Some(l.ex.0.clone()))))?;
    xdp.apply(&d)?;
    let mode = ringlb_testkit::netns::in_netns(&l.ex.0, || xdp.attach("eth0", AttachMode::Native))?;

    println!(
        "# ipvs-bench: IPVS edge vs XDP edge, Linux {}\n",
        release.trim()
    );
    println!(
        "XDP attached {mode}; IPVS scheduler mh, IPIP tunnel; the pod decapsulates with tunl0 for both\n"
    );
    let want = |s: &str| a.only.as_deref().is_none_or(|o| o == s);
    if let Some(o) = a
        .only
        .as_deref()
        .filter(|o| !["tcp", "udp", "flood"].contains(o))
    {
        bail!("--only {o}: one of tcp, udp, flood");
    }
    if want("tcp") {
        section_tcp(&a, &l, &mut ipvs, &xdp)?;
    }
    if want("udp") {
        section_udp(&a, &l, &mut ipvs, &xdp)?;
    }
    if want("flood") {
        // last: it swaps the ToR's XDP programs for ringlb_drop
        let prog: &mut aya::programs::Xdp = pass
            .program_mut("ringlb_pass")
            .context("ringlb_pass")?
            .try_into()?;
        ringlb_testkit::netns::in_netns(&l.t.0, || prog.detach(pass_link))?;
        let drop: &mut aya::programs::Xdp = pass
            .program_mut("ringlb_drop")
            .context("ringlb_drop")?
            .try_into()?;
        drop.load()?;
        for dev in ["ve-i", "ve-x"] {
            ringlb_testkit::netns::in_netns(&l.t.0, || {
                drop.attach(dev, aya::programs::XdpMode::Driver)
            })?;
        }
        flood::section(&a, &l, &mut ipvs, &xdp)?;
    }
    ipvs.uninstall()?;
    xdp.uninstall()?;
    drop(pass);
    Ok(())
}

/// Short TCP connections through each edge in turn: requests/s.
fn section_tcp(
    a: &Args,
    l: &Lab,
    ipvs: &mut IpvsDatapath<NetlinkKernel>,
    xdp: &XdpDatapath,
) -> anyhow::Result<()> {
    println!("## TCP: requests/s of short connections\n");
    println!(
        "method: short TCP connections (connect, one request, answer, close), {} client threads, \
         {} s per edge per round, {} rounds, order alternating\n",
        a.clients, a.seconds, a.rounds
    );
    println!("| round | edge | requests | failed | requests/s | edge counter (packets in) |");
    println!("|---|---|---|---|---|---|");
    let (mut rps_ipvs, mut rps_xdp) = (Vec::new(), Vec::new());
    for r in 0..a.rounds {
        let order = if r % 2 == 0 {
            ["ipvs", "xdp"]
        } else {
            ["xdp", "ipvs"]
        };
        for edge in order {
            let via = if edge == "ipvs" { EDGE_IPVS } else { EDGE_XDP };
            l.t.exec(&["ip", "route", "replace", &format!("{VIP}/32"), "via", via])?;
            let before = edge_packets(edge, ipvs, xdp)?;
            let (ok, bad) = load(&l.c.0, a.clients, a.seconds);
            let carried = edge_packets(edge, ipvs, xdp)? - before;
            let rps = ok as f64 / a.seconds as f64;
            println!(
                "| {} | {edge} | {ok} | {bad} | {rps:.1} | {carried} |",
                r + 1
            );
            if carried < ok * 2 {
                bail!(
                    "the {edge} edge counted {carried} packets for {ok} requests: traffic did not go through it"
                );
            }
            if edge == "ipvs" {
                rps_ipvs.push(rps)
            } else {
                rps_xdp.push(rps)
            }
        }
    }
    let (mi, mx) = (median(&mut rps_ipvs), median(&mut rps_xdp));
    println!(
        "\nmedian requests/s: ipvs {mi:.1}, xdp {mx:.1}; ipvs/xdp = {:.2} (xdp/ipvs = {:.2})",
        mi / mx,
        mx / mi
    );
    Ok(())
}

/// Packets the edge has handled so far: IPVS's packets in for the VIP, or the
/// XDP program's `tx` (encapsulated and sent) counter.
fn edge_packets(
    edge: &str,
    ipvs: &mut IpvsDatapath<NetlinkKernel>,
    xdp: &XdpDatapath,
) -> anyhow::Result<u64> {
    Ok(if edge == "ipvs" {
        ipvs.counters()?.iter().map(|(_, s)| s.inpkts).sum()
    } else {
        let c = xdp.read_counters()?;
        c.global
            .iter()
            .find(|(l, _)| *l == "tx")
            .map(|x| x.1)
            .unwrap_or(0)
    })
}

/// Datagrams the pod's sink has read.
static RECEIVED: AtomicU64 = AtomicU64::new(0);
/// Packets in flight at most: below the 256-entry rings of veth's XDP path, so
/// none is dropped for a full ring.
const WINDOW: u64 = 32;
/// No packet read for this long: the ones in flight are counted as lost, and the
/// wait is left out of the time.
const STALL: Duration = Duration::from_millis(300);

/// The pod's UDP sink (so no port-unreachable is sent back), counting what it reads.
fn udp_sink(ns: &str) -> anyhow::Result<()> {
    let open = || std::net::UdpSocket::bind(("0.0.0.0", UDP_PORT));
    serve_in(ns, open, |sock| {
        let mut buf = [0u8; 2048];
        while sock.recv(&mut buf).is_ok() {
            RECEIVED.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// `n` UDP packets from the client namespace to `dst`: each a new flow (a new
/// source address and port per packet, `salt` keeping measurements apart) or all
/// one flow, at most [`WINDOW`] not yet read by the pod's sink. Returns ns per
/// packet from the first send to the last packet read (the path's throughput:
/// sender, ToR, edge, pod on the guest's two CPUs), less the waits for lost
/// packets, and how many were lost.
fn blast(
    client: &str,
    dst: Ipv4Addr,
    n: u32,
    new_flows: bool,
    salt: u32,
) -> anyhow::Result<(f64, u64)> {
    let client = client.to_string();
    std::thread::spawn(move || -> anyhow::Result<(f64, u64)> {
        ringlb_ops::netns::enter_named(&client)?;
        let sock = raw::RawSock::open()?;
        let pkts: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let k = if new_flows { salt * 1_000_000 + i } else { 0 };
                let src = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 251, 0, 0)) + (k >> 15));
                let sport = 1024 + (k & 0x7fff) as u16;
                Frame::udp(IpAddr::V4(src), IpAddr::V4(dst), sport, UDP_PORT).l3()
            })
            .collect();
        let start = RECEIVED.load(Ordering::Relaxed);
        let read = || RECEIVED.load(Ordering::Relaxed) - start;
        let t = Instant::now();
        let (mut lost, mut stalled) = (0u64, Duration::ZERO);
        let mut progress = (Instant::now(), 0);
        let mut wait = |sent: u64, until_all: bool| {
            loop {
                let r = read();
                if (until_all && r + lost >= sent) || (!until_all && sent - r - lost < WINDOW) {
                    return;
                }
                if r != progress.1 {
                    progress = (Instant::now(), r);
                } else if progress.0.elapsed() > STALL {
                    stalled += progress.0.elapsed();
                    lost = sent - r;
                    progress = (Instant::now(), r);
                }
                std::thread::yield_now();
            }
        };
        for (i, p) in pkts.iter().enumerate() {
            wait(i as u64, false);
            sock.send(p, dst)?;
        }
        wait(u64::from(n), true);
        let took = t.elapsed() - stalled;
        Ok((took.as_nanos() as f64 / f64::from(n), lost))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("sender thread panicked"))?
}

/// Points the ToR's route for the VIP at an edge.
fn route_vip(l: &Lab, via: &str) -> anyhow::Result<()> {
    l.t.exec(&["ip", "route", "replace", &format!("{VIP}/32"), "via", via])?;
    Ok(())
}

/// UDP packets to the pod directly (the base), through the IPVS edge and through
/// the XDP edge: ns per packet of the whole path, and the edge's share by
/// subtracting the base.
fn section_udp(
    a: &Args,
    l: &Lab,
    ipvs: &mut IpvsDatapath<NetlinkKernel>,
    xdp: &XdpDatapath,
) -> anyhow::Result<()> {
    udp_sink(&l.p.0)?;
    println!("\n## UDP: ns per packet through the path\n");
    println!(
        "method: {} UDP packets per measurement from a raw socket in the client namespace, at \
         most {WINDOW} not yet read by the pod's UDP socket; time from the first send to the last \
         packet read, per packet (throughput of the whole path); base = the same packets to the \
         pod's own address (client -> ToR -> pod, no edge); {} rounds, the order rotating; a \
         packet not read within 0.3 s is lost, the wait left out of the time (at most 5 %)\n",
        a.packets, a.rounds
    );
    println!("| flows | round | path | ns/packet | lost | pod eth0 rx |");
    println!("|---|---|---|---|---|---|");
    let (pod, vip): (Ipv4Addr, Ipv4Addr) = (POD.parse()?, VIP.parse()?);
    let mut salt = 1;
    for new_flows in [true, false] {
        let flows = if new_flows { "new" } else { "one" };
        let mut t: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for r in 0..a.rounds {
            let mut paths = ["base", "ipvs", "xdp"];
            paths.rotate_left(r as usize % 3);
            for path in paths {
                let dst = match path {
                    "base" => pod,
                    "ipvs" => {
                        route_vip(l, EDGE_IPVS)?;
                        vip
                    }
                    _ => {
                        route_vip(l, EDGE_XDP)?;
                        vip
                    }
                };
                let before = Lab::rx(&l.p)?;
                let edge_before = match path {
                    "base" => 0,
                    _ => edge_packets(path, ipvs, xdp)?,
                };
                salt += 1;
                let (ns, lost) = blast(&l.c.0, dst, a.packets, new_flows, salt)?;
                let got = Lab::rx(&l.p)? - before;
                println!(
                    "| {flows} | {} | {path} | {ns:.0} | {lost} | {got} |",
                    r + 1
                );
                if lost > u64::from(a.packets) / 20 {
                    bail!("{path}: {lost} of {} packets lost", a.packets);
                }
                if path != "base" {
                    // IPVS folds its per-CPU counters every 2 s (its estimator)
                    let t0 = Instant::now();
                    while edge_packets(path, ipvs, xdp)? - edge_before
                        < u64::from(a.packets) * 9 / 10
                    {
                        if t0.elapsed() > Duration::from_secs(6) {
                            bail!("the {path} edge's counter did not count the packets");
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                t.entry(path).or_default().push(ns);
            }
        }
        let m: BTreeMap<&str, f64> = t.iter_mut().map(|(k, v)| (*k, median(v))).collect();
        let (base, i, x) = (m["base"], m["ipvs"], m["xdp"]);
        println!(
            "\n{flows} flow(s), median ns/packet: base {base:.0}, ipvs {i:.0}, xdp {x:.0}; whole \
             path ipvs/xdp = {:.2}; the edge's share (minus base): ipvs {:.0}, xdp {:.0}, \
             ipvs/xdp = {:.2}\n",
            i / x,
            i - base,
            x - base,
            (i - base) / (x - base)
        );
    }
    Ok(())
}

impl Lab {
    /// Packets the namespace's eth0 received.
    fn rx(ns: &Netns) -> anyhow::Result<u64> {
        let s = ns.exec(&["cat", "/sys/class/net/eth0/statistics/rx_packets"])?;
        Ok(s.trim().parse()?)
    }
}
