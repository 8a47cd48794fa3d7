//! xdp-bench: the XDP datapath's figures, measured side by side in one run.
//!
//!   cargo build --release -p ringlb-bench --bin xdp-bench
//!   sudo target/release/xdp-bench            # everything (root: BPF, netns)
//!   sudo target/release/xdp-bench --only packet
//!
//! Sections (see docs/bench-xdp.md for method and results):
//!   packet   ns/packet by BPF_PROG_TEST_RUN: ringlb_xdp (conntrack hit and
//!            miss, 1 and V VIPs) against XDP_PASS and the MAC-swap XDP_TX
//!            floor, each by two methods (R: one call, repeat=N, kernel
//!            average; S: N calls with repeat=1, mean kernel duration)
//!   iptables kube-proxy-style nat rules (N services) in a netns: time per
//!            new flow through PREROUTING, minus the same with 0 services
//!   update   one service change with N services present: our map update
//!            against `iptables-restore` of the equivalent ruleset

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;
use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::{NextHop, StaticResolver};
use ringlb_testkit::netns::{Netns, run as sh};
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip, abi,
    xdp::{XdpDatapath, XdpOptions, objects, test_run},
};

#[derive(Parser, Debug)]
#[command(about = "ringlb XDP datapath benchmarks (needs root)")]
struct Args {
    /// Only this section: packet, iptables, update.
    #[arg(long)]
    only: Option<String>,
    /// Repetitions for method R (one BPF_PROG_TEST_RUN call).
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Calls for method S (repeat = 1 each).
    #[arg(long, default_value_t = 200_000)]
    calls: u32,
    /// VIPs for the packet benchmark.
    #[arg(long, default_value_t = 1000)]
    vips: u32,
    /// Backends per VIP.
    #[arg(long, default_value_t = 100)]
    backends: u32,
    /// Maglev ring size.
    #[arg(long, default_value_t = 65_537)]
    ring: u32,
    /// Service counts for the iptables per-packet comparison.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    iptables_services: Vec<u32>,
    /// Service counts present for the update-latency comparison.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,20000")]
    update_services: Vec<u32>,
    /// Ring size of the services that only populate the maps in `update`.
    #[arg(long, default_value_t = 1021)]
    filler_ring: u32,
    /// Experiment: load this object (a -DRINGLB_BENCH_RESTORE build) for the R hit row.
    #[arg(long)]
    bench_object: Option<std::path::PathBuf>,
    /// Experiment: load this object instead of the production one for the S rows.
    #[arg(long)]
    prod_object: Option<std::path::PathBuf>,
}

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

fn resolver() -> Box<StaticResolver> {
    Box::new(StaticResolver::everywhere(NextHop {
        ifindex: 0,
        smac: [2, 0, 0, 0, 0, 1],
        dmac: [2, 0, 0, 0, 0, 2],
        vlan: None,
    }))
}

fn vip_addr(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i))
}

fn backend_addr(vip: u32, b: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 128, 0, 0)) + vip * 128 + b,
    ))
}

fn service(i: u32, backends: u32, ring: u32, shift: u32) -> anyhow::Result<(Vip, ServiceEntry)> {
    let vip = Vip {
        addr: vip_addr(i),
        port: 80,
        proto: Proto::Tcp,
    };
    let bs: Vec<Backend> = (0..backends)
        .map(|b| Backend {
            addr: backend_addr(i, b + shift),
            port: 8080,
            weight: 1,
        })
        .collect();
    let table = Table::build(&bs, ring).context("maglev table")?;
    Ok((vip, ServiceEntry::from_table(&vip, &table)?))
}

fn desired(vips: u32, backends: u32, ring: u32) -> anyhow::Result<DesiredState> {
    let mut services = BTreeMap::new();
    for i in 0..vips {
        let (v, s) = service(i, backends, ring, 0)?;
        services.insert(v, s);
    }
    Ok(DesiredState { services })
}

fn load(object: &'static [u8], d: &DesiredState) -> anyhow::Result<XdpDatapath> {
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some(Ipv4Addr::new(10, 0, 0, 11)),
        src6: None,
        mtu: 1500,
        fib_fallback: false,
        object,
    };
    let mut dp = XdpDatapath::load(&opts, resolver())?;
    dp.apply(d)?;
    Ok(dp)
}

/// A 64-byte TCP SYN to VIP `vip` from a client chosen by `n`.
fn syn_frame(vip: u32, n: u32) -> Frame {
    let src = IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(192, 168, 0, 0)) + (n >> 14),
    ));
    let mut f = Frame::tcp(src, vip_addr(vip), 1024 + (n & 0x3fff) as u16, 80);
    f.payload = 10;
    f
}

fn syn(vip: u32, n: u32) -> Vec<u8> {
    syn_frame(vip, n).bytes()
}

/// The same flow's packet once the connection is up: an ACK (the program skips
/// the conntrack lookup for a SYN, so a SYN never "hits").
fn ack(vip: u32, n: u32) -> Vec<u8> {
    syn_frame(vip, n).established().bytes()
}

/// Method R: one call with `repeat`; the kernel's average. Checks the verdict.
fn method_r(prog: &aya::programs::Xdp, pkt: &[u8], repeat: u32, want: u32) -> anyhow::Result<f64> {
    let mut out = vec![0u8; pkt.len() + 64];
    let (verdict, _, d) = test_run(prog, pkt, &mut out, repeat)?;
    if verdict != want {
        bail!("verdict {verdict}, expected {want}");
    }
    Ok(d.as_nanos() as f64)
}

/// Method S: `calls` calls with repeat = 1, `pkt(i)` each; mean kernel duration.
fn method_s(
    prog: &aya::programs::Xdp,
    calls: u32,
    want: u32,
    want_len: Option<usize>,
    pkt: impl Fn(u32) -> Vec<u8>,
) -> anyhow::Result<f64> {
    let mut total = Duration::ZERO;
    let mut out = vec![0u8; 256];
    for i in 0..calls {
        let p = pkt(i);
        let (verdict, len, d) = test_run(prog, &p, &mut out, 1)?;
        if verdict != want || want_len.is_some_and(|l| l != len) {
            bail!("call {i}: verdict {verdict} len {len}, expected {want} {want_len:?}");
        }
        total += d;
    }
    Ok(total.as_nanos() as f64 / f64::from(calls))
}

fn section_packet(a: &Args) -> anyhow::Result<()> {
    // One CPU for the whole section: the conntrack LRU keeps a free list per
    // CPU, and the "conntrack full" row must know which list it fills.
    let cpu = ringlb_testkit::bench::pin_to_current_cpu().context("sched_setaffinity")?;
    let cpus = u32::try_from(aya::util::nr_cpus().map_err(|(_, e)| e)?)?;
    println!("## packet path (BPF_PROG_TEST_RUN, 64-byte TCP packets)\n");
    println!(
        "R = one call, repeat={}, kernel average; S = calls with repeat=1 ({} for the floor and hit rows), \
         mean of the kernel-reported duration. Pinned to CPU {cpu} of {cpus} possible.\n",
        a.repeat, a.calls
    );
    println!("| program | path | VIPs | R ns/pkt | S ns/pkt |");
    println!("|---|---|---|---|---|");
    let mut floor = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR)?;
    for (name, path, want) in [
        ("ringlb_pass", "XDP_PASS", XDP_PASS),
        ("ringlb_floor", "MAC swap + XDP_TX (floor)", XDP_TX),
    ] {
        let prog: &mut aya::programs::Xdp = floor.program_mut(name).context(name)?.try_into()?;
        prog.load()?;
        let r = method_r(prog, &syn(0, 0), a.repeat, want)?;
        let s = method_s(prog, a.calls, want, None, |_| syn(0, 0))?;
        println!("| {name} | {path} | - | {r:.1} | {s:.1} |");
    }
    let pkt_len = syn(0, 0).len();
    for vips in [1, a.vips] {
        let t = Instant::now();
        let d = desired(vips, a.backends, a.ring)?;
        let built = t.elapsed();
        // hit: R with the restoring bench build (flow warmed), S with the production build
        let t = Instant::now();
        let obj: &'static [u8] = match &a.bench_object {
            Some(p) => Box::leak(std::fs::read(p)?.into_boxed_slice()),
            None => ringlb_testkit::objects::XDP_LB_BENCH,
        };
        let bench = load(obj, &d)?;
        eprintln!(
            "{vips} VIPs x {} backends, ring {}: tables {built:?}, maps {:?}",
            a.backends,
            a.ring,
            t.elapsed()
        );
        let target = vips / 2;
        let prog = bench.program()?;
        method_r(prog, &syn(target, 7), 1, XDP_TX)?; // creates the conntrack entry
        let hit_r = method_r(prog, &ack(target, 7), a.repeat, XDP_TX)?;
        let ct = bench.read_counters()?;
        let hits = ct
            .global
            .iter()
            .find(|(l, _)| *l == "ct_hit")
            .map_or(0, |x| x.1);
        if a.bench_object.is_none() && hits < u64::from(a.repeat) {
            bail!("expected {} conntrack hits, counted {hits}", a.repeat);
        }
        drop(bench);
        let miss = load(ringlb_testkit::objects::XDP_LB_BENCH_MISS, &d)?;
        let miss_r = method_r(miss.program()?, &syn(target, 7), a.repeat, XDP_TX)?;
        drop(miss);
        let obj: &'static [u8] = match &a.prod_object {
            Some(p) => Box::leak(std::fs::read(p)?.into_boxed_slice()),
            None => objects::XDP_LB,
        };
        let prod = load(obj, &d)?;
        let prog = prod.program()?;
        let enc = Some(pkt_len + 20);
        method_s(prog, 1, XDP_TX, enc, |_| syn(target, 7))?; // the flow's first packet
        let hit_s = method_s(prog, a.calls, XDP_TX, enc, |_| ack(target, 7))?;
        // traffic for the node itself (not a VIP): a conntrack miss, then the
        // vips lookup and its port-0 wildcard, then XDP_PASS
        let not_vip = |n| {
            let mut f = syn_frame(target, n).established();
            f.dst = IpAddr::V4(Ipv4Addr::new(10, 255, 255, 254));
            f.bytes()
        };
        let pass_r = method_r(prog, &not_vip(7), a.repeat, XDP_PASS)?;
        let pass_s = method_s(prog, a.calls, XDP_PASS, None, |_| not_vip(7))?;
        // Every call a new flow's SYN (new source port/address): ring lookup +
        // conntrack insert. Two regimes of the LRU, which the test runs on this
        // CPU's list (capacity CT_SIZE / possible CPUs): with free entries, and
        // full, where every insert first evicts the least recently used entry.
        let cap = abi::CT_SIZE / cpus;
        let room = a.calls.min(cap / 2);
        let miss_s = method_s(prog, room, XDP_TX, enc, |i| syn(target, 100 + i))?;
        let fill = cap + cap / 10 - room; // past capacity: from here on, inserts evict
        method_s(prog, fill, XDP_TX, enc, |i| syn(target, 100 + room + i))?;
        let evict_s = method_s(prog, a.calls.min(cap), XDP_TX, enc, |i| {
            syn(target, 100 + room + fill + i)
        })?;
        println!("| ringlb_xdp | conntrack hit (ACK) | {vips} | {hit_r:.1} | {hit_s:.1} |");
        println!("| ringlb_xdp | not a VIP: XDP_PASS | {vips} | {pass_r:.1} | {pass_s:.1} |");
        println!(
            "| ringlb_xdp | new flow (SYN): Maglev ring + conntrack insert | {vips} | {miss_r:.1} | {miss_s:.1} |"
        );
        println!(
            "| ringlb_xdp | new flow (SYN), conntrack full: insert evicts | {vips} | - | {evict_s:.1} |"
        );
    }
    println!(
        "\nR for ringlb_xdp uses the benchmark builds (-DRINGLB_BENCH_RESTORE, and -DRINGLB_BENCH_NO_CT_INSERT for the miss row: \
         a miss that does not insert); S uses the production object, and its miss row inserts a new conntrack entry every call.\n"
    );
    Ok(())
}

// ---- kube-proxy-style iptables --------------------------------------------

fn pod(i: u32, e: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + i * 4 + e)
}

/// The nat table kube-proxy (iptables mode) writes for `n` ClusterIP/LB
/// services with two endpoints each: KUBE-SERVICES -> KUBE-SVC-* (statistic
/// random) -> KUBE-SEP-* (DNAT). `changed` moves service `changed`'s second
/// endpoint, the "one rule changed" of the update benchmark.
fn kube_proxy_rules(n: u32, proto: &str, changed: Option<u32>) -> String {
    let mut chains = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n",
    );
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n",
    );
    for i in 0..n {
        let vip = vip_addr(i);
        chains.push_str(&format!(
            ":KUBE-SVC-{i:08X} - [0:0]\n:KUBE-SEP-{i:08X}A - [0:0]\n:KUBE-SEP-{i:08X}B - [0:0]\n"
        ));
        rules.push_str(&format!(
            "-A KUBE-SERVICES -d {vip}/32 -p {proto} -m comment --comment \"ns/svc-{i}:http cluster IP\" -m {proto} --dport 80 -j KUBE-SVC-{i:08X}\n\
             -A KUBE-SVC-{i:08X} -m comment --comment \"ns/svc-{i}:http -> {a}:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-{i:08X}A\n\
             -A KUBE-SVC-{i:08X} -m comment --comment \"ns/svc-{i}:http -> {b}:8080\" -j KUBE-SEP-{i:08X}B\n\
             -A KUBE-SEP-{i:08X}A -s {a}/32 -m comment --comment \"ns/svc-{i}:http\" -j KUBE-MARK-MASQ\n\
             -A KUBE-SEP-{i:08X}A -p {proto} -m comment --comment \"ns/svc-{i}:http\" -m {proto} -j DNAT --to-destination {a}:8080\n\
             -A KUBE-SEP-{i:08X}B -s {b}/32 -m comment --comment \"ns/svc-{i}:http\" -j KUBE-MARK-MASQ\n\
             -A KUBE-SEP-{i:08X}B -p {proto} -m comment --comment \"ns/svc-{i}:http\" -m {proto} -j DNAT --to-destination {b}:8080\n",
            a = pod(i, 0),
            b = if changed == Some(i) { pod(i, 2) } else { pod(i, 1) },
        ));
    }
    rules.push_str("COMMIT\n");
    chains + &rules
}

/// Times `tool [--noflush] FILE` in `ns` (kube-proxy restores with --noflush).
fn restore(ns: &Netns, tool: &str, noflush: bool, rules: &str) -> anyhow::Result<Duration> {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!("ringlb-bench-rules-{}", std::process::id()));
    std::fs::File::create(&path)?.write_all(rules.as_bytes())?;
    let t = Instant::now();
    let file = path.to_str().unwrap_or_default();
    let r = if noflush {
        ns.exec(&[tool, "--noflush", file])
    } else {
        ns.exec(&[tool, file])
    };
    let d = t.elapsed();
    let _ = std::fs::remove_file(&path);
    r?;
    Ok(d)
}

#[allow(unsafe_code)]
mod raw {
    //! A raw IPv4 socket (IP_HDRINCL) to send crafted UDP packets, each a new
    //! flow, without a socket per flow.
    use std::{
        io,
        net::Ipv4Addr,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };

    pub struct RawSock(OwnedFd);

    impl RawSock {
        pub fn open() -> io::Result<Self> {
            // SAFETY: plain socket(2); the fd is owned by OwnedFd right away.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fd is a fresh, valid descriptor nobody else owns.
            Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
        }
        pub fn send(&self, pkt: &[u8], dst: Ipv4Addr) -> io::Result<()> {
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(dst.octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: pkt and sa are valid for the lengths given; sendto does
            // not keep the pointers.
            let n = unsafe {
                libc::sendto(
                    self.0.as_raw_fd(),
                    pkt.as_ptr().cast(),
                    pkt.len(),
                    0,
                    (&sa as *const libc::sockaddr_in).cast(),
                    size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    }
}

/// Sends `count` UDP packets (each a new flow) from netns `client` to
/// service `target`; returns the mean wall time per packet.
fn blast(client: &str, target: u32, count: u32, salt: u32) -> anyhow::Result<f64> {
    let client = client.to_string();
    let h = std::thread::spawn(move || -> anyhow::Result<f64> {
        ringlb_ops::netns::enter_named(&client)?;
        let sock = raw::RawSock::open()?;
        let dst = match vip_addr(target) {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => bail!("v4 only"),
        };
        let pkts: Vec<Vec<u8>> = (0..count)
            .map(|i| {
                let n = salt * 1_000_000 + i;
                let src = IpAddr::V4(Ipv4Addr::from(
                    u32::from(Ipv4Addr::new(10, 251, 0, 0)) + (n >> 15),
                ));
                Frame::udp(src, IpAddr::V4(dst), 1024 + (n & 0x7fff) as u16, 80).l3()
            })
            .collect();
        let t = Instant::now();
        for p in &pkts {
            sock.send(p, dst)?;
        }
        Ok(t.elapsed().as_nanos() as f64 / f64::from(count))
    });
    h.join()
        .map_err(|_| anyhow::anyhow!("sender thread panicked"))?
}

fn two_netns(tag: &str) -> anyhow::Result<(Netns, Netns)> {
    let pid = std::process::id();
    let c = Netns::create(&format!("rlbb-c{tag}-{pid}"))?;
    let r = Netns::create(&format!("rlbb-r{tag}-{pid}"))?;
    sh(&[
        "ip", "-n", &c.0, "link", "add", "c0", "type", "veth", "peer", "name", "r0", "netns", &r.0,
    ])?;
    c.exec(&["ip", "addr", "add", "10.250.0.1/24", "dev", "c0"])?;
    r.exec(&["ip", "addr", "add", "10.250.0.2/24", "dev", "r0"])?;
    for (ns, dev) in [(&c, "c0"), (&r, "r0")] {
        ns.exec(&["ip", "link", "set", dev, "up"])?;
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"])?;
        ns.exec(&["sysctl", "-qw", &format!("net.ipv4.conf.{dev}.rp_filter=0")])?;
    }
    c.exec(&["ip", "route", "add", "10.96.0.0/12", "via", "10.250.0.2"])?;
    r.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    r.exec(&["ip", "route", "add", "blackhole", "10.128.0.0/10"])?;
    c.exec(&["ping", "-c1", "-W1", "10.250.0.2"])?; // resolve the neighbour
    Ok((c, r))
}

fn section_iptables(a: &Args) -> anyhow::Result<()> {
    println!("## kube-proxy iptables (nat, statistic + DNAT), per new flow\n");
    println!(
        "UDP packets sent with a raw socket from one netns to another that holds the rules; every packet is a new flow (new conntrack entry, full KUBE-SERVICES walk). Target = the service in the middle of KUBE-SERVICES. Wall time per packet, median of 3 runs. The baseline is the same with 1 service (one rule, the same DNAT and conntrack work), so the last column is what walking KUBE-SERVICES adds.\n"
    );
    println!("| services | ns/packet | ns/packet with 1 service | cost of the rule walk |");
    println!("|---|---|---|---|");
    let (c, r) = two_netns("i")?;
    let mut salt = 1;
    let mut run = |target: u32, count: u32| -> anyhow::Result<f64> {
        let mut v = Vec::new();
        for _ in 0..3 {
            salt += 1;
            v.push(blast(&c.0, target, count, salt)?);
        }
        v.sort_by(f64::total_cmp);
        Ok(v[1])
    };
    restore(
        &r,
        "iptables-restore",
        false,
        &kube_proxy_rules(1, "udp", None),
    )?;
    let base = run(0, 20_000)?;
    for &n in &a.iptables_services {
        restore(
            &r,
            "iptables-restore",
            false,
            &kube_proxy_rules(n, "udp", None),
        )?;
        let count = if n >= 5000 { 2000 } else { 10_000 };
        let target = n / 2;
        let t = run(target, count)?;
        let save = r.exec(&["iptables-save", "-c", "-t", "nat"])?;
        let needle = format!("-j KUBE-SVC-{target:08X}");
        let line = save
            .lines()
            .find(|l| l.starts_with('[') && l.contains("-A KUBE-SERVICES") && l.ends_with(&needle));
        let pkts: u64 = line
            .and_then(|l| l[1..].split(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if pkts < u64::from(count) {
            bail!(
                "only {pkts} of {count} packets matched service {target}'s rule: measurement invalid"
            );
        }
        println!("| {n} | {t:.0} | {base:.0} | {:.0} |", t - base);
    }
    println!();
    Ok(())
}

fn section_update(a: &Args) -> anyhow::Result<()> {
    println!("## update latency: one service's backends change, N services present\n");
    println!(
        "ringlb: `XdpDatapath::apply_service` (plan + slot writes into the mmapped ring) for a service with {} backends and ring {}, one backend replaced; the other N-1 services have 2 backends and ring {} (memory). Median/max of 21 changes. iptables: `iptables-restore --noflush` of the whole kube-proxy nat table with one endpoint changed (what kube-proxy does), median of 3.\n",
        a.backends, a.ring, a.filler_ring
    );
    println!(
        "| services | ringlb median | ringlb max | of which plan (median) | slots written | iptables-restore (nft) one change | initial iptables-restore |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &a.update_services {
        let mut d = desired(n.saturating_sub(1), 2, a.filler_ring)?;
        let (tv, ts) = service(n, a.backends, a.ring, 0)?;
        d.services.insert(tv, ts);
        let mut dp = load(objects::XDP_LB, &d)?;
        let (_, alt) = service(n, a.backends, a.ring, 1)?; // backend 0 out, backend 100 in
        let (_, orig) = service(n, a.backends, a.ring, 0)?;
        let mut times = Vec::new();
        let mut slots = 0;
        for k in 0..21 {
            let e = if k % 2 == 0 { &alt } else { &orig };
            let t = Instant::now();
            let st = dp.apply_service(&tv, Some(e))?;
            times.push(t.elapsed());
            slots = st.slots_written;
        }
        times.sort();
        drop(dp);
        // the pure part alone (plan_update on the same state, no map writes)
        let mut prog = ringlb_xdp::plan(&Default::default(), &d)?.1;
        let mut plan_times = Vec::new();
        for k in 0..21 {
            let e = if k % 2 == 0 { &alt } else { &orig };
            let t = Instant::now();
            ringlb_xdp::plan_update(&mut prog, &tv, Some(e))?;
            plan_times.push(t.elapsed());
        }
        plan_times.sort();
        drop(prog);
        let ns = Netns::create(&format!("rlbb-u-{}", std::process::id()))?;
        let t0 = restore(
            &ns,
            "iptables-restore",
            false,
            &kube_proxy_rules(n, "tcp", None),
        )?;
        let mut ipt = Vec::new();
        for k in 0..3 {
            let rules = kube_proxy_rules(n, "tcp", (k % 2 == 0).then_some(n / 2));
            ipt.push(restore(&ns, "iptables-restore", true, &rules)?);
        }
        ipt.sort();
        println!(
            "| {n} | {:?} | {:?} | {:?} | {slots} | {:?} | {t0:?} |",
            times[10], times[20], plan_times[10], ipt[1]
        );
    }
    println!();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let want = |s: &str| a.only.as_deref().is_none_or(|o| o == s);
    println!(
        "# xdp-bench ({})\n",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    if want("packet") {
        section_packet(&a)?;
    }
    if want("iptables") {
        section_iptables(&a)?;
    }
    if want("update") {
        section_update(&a)?;
    }
    Ok(())
}
