//! The kube-proxy comparisons: iptables rule walk per new flow, and update
//! latency against `iptables-restore` (sections `iptables` and `update`).

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::bail;
use ringlb_testkit::netns::{Netns, run as sh};
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{Datapath, xdp::objects};

use crate::Args;
use crate::setup::{desired, load, service, vip_addr};

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
#[path = "../../raw.rs"]
mod raw;

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

pub(crate) fn section_iptables(a: &Args) -> anyhow::Result<()> {
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

pub(crate) fn section_update(a: &Args) -> anyhow::Result<()> {
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
