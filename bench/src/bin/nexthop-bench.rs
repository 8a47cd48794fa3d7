//! Time per next-hop resolve: rtnetlink (`KernelResolver`) against the way the first
//! version did it (three `ip -j` processes per backend: route get, link show, neigh
//! show), in the same run, on the same namespaces. Needs root.
//!
//! `cargo run --release -p ringlb-bench --bin nexthop-bench [BACKENDS]`
//!
//! It makes two network namespaces joined by a veth pair (deleted again at exit, also
//! on error), routes 10.88.0.0/16 through the peer, and resolves BACKENDS addresses in
//! it (default 2000; the `ip -j` way resolves a tenth of them).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use ringlb_nexthop::{KernelResolver, Resolver};
use ringlb_testkit::netns::{Netns, run as sh};

/// The first version's resolve: `ip -j route get`, `ip -j link show`, `ip -j neigh show`.
fn resolve_with_ip(ns: &str, addr: IpAddr) -> anyhow::Result<[u8; 6]> {
    let a = addr.to_string();
    let route: serde_json::Value =
        serde_json::from_str(&sh(&["ip", "-n", ns, "-j", "route", "get", &a])?)?;
    let dev = route[0]["dev"].as_str().context("no dev")?.to_string();
    let nh = route[0]["gateway"].as_str().unwrap_or(&a).to_string();
    let link: serde_json::Value =
        serde_json::from_str(&sh(&["ip", "-n", ns, "-j", "link", "show", "dev", &dev])?)?;
    link[0]["ifindex"].as_u64().context("no ifindex")?;
    let neigh: serde_json::Value = serde_json::from_str(&sh(&[
        "ip", "-n", ns, "-j", "neigh", "show", "to", &nh, "dev", &dev,
    ])?)?;
    let mac = neigh[0]["lladdr"].as_str().context("no lladdr")?;
    let v: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()?;
    v.try_into().ok().context("not a MAC")
}

fn per_op(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().with_context(|| format!("BACKENDS {s:?}"))?,
        None => 2000,
    };
    anyhow::ensure!((1..=60_000).contains(&n), "BACKENDS must be 1..=60000");
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    });
    anyhow::ensure!(root, "needs root: it creates network namespaces");
    let pid = std::process::id();
    let edge = Netns::create(&format!("rlnhb{pid}e"))?;
    let peer = Netns::create(&format!("rlnhb{pid}p"))?;
    let (e, p) = (edge.0.as_str(), peer.0.as_str());
    sh(&[
        "ip", "-n", e, "link", "add", "e0", "type", "veth", "peer", "name", "p0", "netns", p,
    ])?;
    sh(&["ip", "-n", e, "addr", "add", "10.77.0.1/24", "dev", "e0"])?;
    sh(&["ip", "-n", p, "addr", "add", "10.77.0.2/24", "dev", "p0"])?;
    sh(&["ip", "-n", e, "link", "set", "e0", "up"])?;
    sh(&["ip", "-n", p, "link", "set", "p0", "up"])?;
    sh(&[
        "ip",
        "-n",
        e,
        "route",
        "add",
        "10.88.0.0/16",
        "via",
        "10.77.0.2",
    ])?;
    let addrs: Vec<IpAddr> = (0..n)
        .map(|i| IpAddr::from([10, 88, (i / 250) as u8, (i % 250 + 1) as u8]))
        .collect();

    let r = KernelResolver::new(Some(e.to_string()));
    let first = r.resolve(addrs[0])?; // opens the socket, resolves the gateway once
    let t0 = Instant::now();
    for a in &addrs {
        let nh = r.resolve(*a)?;
        anyhow::ensure!(nh == first, "{a}: {nh:?} != {first:?}");
    }
    let netlink = t0.elapsed();

    let m = (n / 10).max(1);
    let t0 = Instant::now();
    for a in &addrs[..m] {
        let mac = resolve_with_ip(e, *a)?;
        anyhow::ensure!(mac == first.dmac, "{a}: ip -j disagrees");
    }
    let ip_j = t0.elapsed();

    let (a, b) = (per_op(netlink, n), per_op(ip_j, m));
    println!("| method | resolves | total | per resolve |");
    println!("|---|---:|---:|---:|");
    println!("| rtnetlink (KernelResolver) | {n} | {netlink:.2?} | {a:.1} µs |");
    println!("| `ip -j` x3 per backend (first version) | {m} | {ip_j:.2?} | {b:.1} µs |");
    println!("\nrtnetlink is {:.0}x faster per resolve", b / a);
    Ok(())
}
