//! ipvs-bench's flood section: pktgen in the ToR namespace floods one edge's veth
//! directly, so the edge (not a userspace sender) is the bottleneck; the ToR drops
//! what the edge sends back with `ringlb_drop`, so nothing after the edge costs.
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::bail;
use ringlb_ipvs::{IpvsDatapath, kernel::netlink::NetlinkKernel};
use ringlb_testkit::netns::Netns;
use ringlb_xdp::xdp::XdpDatapath;

use super::{Args, Lab, UDP_PORT, VIP, edge_packets, median, pktgen};

/// Not a VIP: the XDP edge passes it to its stack, which drops it (no forwarding).
/// The pass path's only use: what taking a packet into the stack costs.
const NOT_VIP: &str = "10.204.200.1";
/// Source ports the flood cycles through: one flow each.
const SPORTS: (u16, u16) = (1024, 4095);

fn stat(ns: &Netns, dev: &str, what: &str) -> anyhow::Result<u64> {
    let s = ns.exec(&["cat", &format!("/sys/class/net/{dev}/statistics/{what}")])?;
    Ok(s.trim().parse()?)
}

fn mac(ns: &Netns, dev: &str) -> anyhow::Result<String> {
    Ok(ns
        .exec(&["cat", &format!("/sys/class/net/{dev}/address")])?
        .trim()
        .to_string())
}

/// `f` until it stops changing for 300 ms (softirq work left after pktgen's end).
fn settled(mut f: impl FnMut() -> anyhow::Result<u64>) -> anyhow::Result<u64> {
    let mut last = f()?;
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = f()?;
        if now == last || t0.elapsed() > Duration::from_secs(10) {
            return Ok(now);
        }
        last = now;
    }
}

/// pktgen floods through each edge and to the floor: packets/s each edge forwarded.
pub(crate) fn section(
    a: &Args,
    l: &Lab,
    ipvs: &mut IpvsDatapath<NetlinkKernel>,
    xdp: &XdpDatapath,
) -> anyhow::Result<()> {
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    // the ToR now drops everything with XDP, ARP replies included: pin the neighbours
    for (ns, gw, dev) in [(&l.ei, "10.204.0.1", "ve-i"), (&l.ex, "10.204.2.1", "ve-x")] {
        let m = mac(&l.t, dev)?;
        ns.exec(&[
            "ip",
            "neigh",
            "replace",
            gw,
            "lladdr",
            &m,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])?;
    }
    let (mac_i, mac_x) = (mac(&l.ei, "eth0")?, mac(&l.ex, "eth0")?);
    let mac_tor = mac(&l.t, "ve-x")?;
    println!("\n## Flood: packets/s an edge forwards when it is the bottleneck\n");
    println!(
        "method: the kernel's pktgen in the ToR namespace sends {} UDP packets of 60 bytes \
         (to {VIP}:{UDP_PORT}, {} flows by source port) straight into one edge's veth per \
         measurement, one CPU, no delay; the ToR drops what the edge sends back with an XDP \
         drop program, so the path after the edge costs the same for both; forwarded = \
         packets the ToR received back from the edge (its veth rx counter) per second of \
         pktgen's run, the edge's own counter (IPVS inpkts, XDP tx) must agree; floor = no edge: the \
         same flood from the XDP edge's namespace out of its eth0 into the ToR's dropping \
         veth (generation, one veth hop, the drop: the edge's share is a path's ns/packet \
         minus the floor's); pass = the same flood into the XDP edge to {NOT_VIP} (not a VIP: \
         passed to its stack, dropped there; counted as taken in); {} rounds, the order \
         rotating\n",
        a.flood_packets,
        SPORTS.1 - SPORTS.0 + 1,
        a.rounds
    );
    println!(
        "| round | path | pktgen pps (offered) | edge received | edge counter | forwarded | forwarded/s | ns/packet |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let (vip, not_vip): (Ipv4Addr, Ipv4Addr) = (VIP.parse()?, NOT_VIP.parse()?);
    let mut t: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for r in 0..a.rounds {
        let mut paths = ["floor", "ipvs", "xdp", "pass"];
        paths.rotate_left(r as usize % 4);
        for path in paths {
            // (pktgen's namespace and device, the ToR's veth the result comes back
            // on, the namespace whose eth0 takes the flood in, the MAC and address)
            let (gen_ns, gen_dev, tor_dev, edge_ns, dst_mac, dst) = match path {
                "ipvs" => (&l.t, "ve-i", "ve-i", &l.ei, &mac_i, vip),
                "xdp" => (&l.t, "ve-x", "ve-x", &l.ex, &mac_x, vip),
                "pass" => (&l.t, "ve-x", "ve-x", &l.ex, &mac_x, not_vip),
                // no edge: from the XDP edge's namespace out of its eth0 to the ToR
                _ => (&l.ex, "eth0", "ve-x", &l.t, &mac_tor, vip),
            };
            let rx_dev = if path == "floor" { "ve-x" } else { "eth0" };
            let back0 = stat(&l.t, tor_dev, "rx_packets")?;
            let rx0 = stat(edge_ns, rx_dev, "rx_packets")?;
            let edge0 = match path {
                "floor" | "pass" => 0,
                p => edge_packets(p, ipvs, xdp)?,
            };
            let out = pktgen::run(
                &gen_ns.0,
                &pktgen::Flood {
                    dev: gen_dev,
                    dst_mac,
                    src: "10.204.1.2".parse()?,
                    dst,
                    udp_dst: UDP_PORT,
                    sports: SPORTS,
                    count: a.flood_packets,
                    size: 60,
                },
            )?;
            let back = settled(|| stat(&l.t, tor_dev, "rx_packets"))? - back0;
            let rx = stat(edge_ns, rx_dev, "rx_packets")? - rx0;
            let secs = out.usec as f64 / 1e6;
            let (counted, fwd) = if path == "pass" {
                // nothing is forwarded: the figure is what the edge took in
                (0, rx)
            } else if path == "floor" {
                (0, back)
            } else {
                // IPVS folds its per-CPU counters every 2 s (its estimator)
                let t0 = Instant::now();
                let mut c = edge_packets(path, ipvs, xdp)? - edge0;
                while c < back && t0.elapsed() < Duration::from_secs(6) {
                    std::thread::sleep(Duration::from_millis(200));
                    c = edge_packets(path, ipvs, xdp)? - edge0;
                }
                if c < back * 9 / 10 || back < out.sent / 100 {
                    bail!(
                        "{path}: the edge counted {c}, the ToR got {back} back of {} sent: \
                         the flood did not go through the edge",
                        out.sent
                    );
                }
                (c, back)
            };
            let pps = fwd as f64 / secs;
            println!(
                "| {} | {path} | {} | {rx} | {counted} | {fwd} | {pps:.0} | {:.0} |",
                r + 1,
                out.pps,
                1e9 / pps
            );
            t.entry(path).or_default().push(pps);
        }
    }
    summary(&mut t);
    Ok(())
}

/// The per-round ratios and the medians of each path's packets/s.
fn summary(t: &mut std::collections::BTreeMap<&str, Vec<f64>>) {
    let mut ratios: Vec<f64> = (0..t["ipvs"].len())
        .map(|r| t["xdp"][r] / t["ipvs"][r])
        .collect();
    let per_round: Vec<String> = (0..t["ipvs"].len())
        .map(|r| {
            let ns = |k: &str| 1e9 / t[k][r];
            let share = (ns("ipvs") - ns("floor")) / (ns("xdp") - ns("floor"));
            format!("{:.2} ({share:.2})", ratios[r])
        })
        .collect();
    println!(
        "\nper round, xdp/ipvs packets/s (in brackets: ipvs/xdp of the edge's share, ns/packet \
         minus the floor's): {}; median of the rounds' xdp/ipvs: {:.2}",
        per_round.join(", "),
        median(&mut ratios)
    );
    let m: std::collections::BTreeMap<&str, f64> =
        t.iter_mut().map(|(k, v)| (*k, median(v))).collect();
    let ns = |k: &str| 1e9 / m[k];
    let (f, i, x, p) = (ns("floor"), ns("ipvs"), ns("xdp"), ns("pass"));
    println!(
        "\nmedian packets/s: ipvs {:.0}, xdp {:.0}, floor (no edge) {:.0}, pass (stack drop) \
         {:.0}; xdp/ipvs = {:.2}\nns/packet: ipvs {i:.0}, xdp {x:.0}, floor {f:.0}, pass \
         {p:.0}; the edge's share (minus the floor): ipvs {:.0}, xdp {:.0}, ipvs/xdp = {:.2}",
        m["ipvs"],
        m["xdp"],
        m["floor"],
        m["pass"],
        m["xdp"] / m["ipvs"],
        i - f,
        x - f,
        (i - f) / (x - f)
    );
}
