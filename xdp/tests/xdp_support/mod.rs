//! Shared helpers for the XDP tests (the generic ones are `ringlb_testkit::netns`).
#![allow(dead_code)]

pub(crate) mod fixture;

use std::collections::BTreeMap;

use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::KernelResolver;
use ringlb_xdp::{
    Datapath, DesiredState, ServiceEntry, Vip,
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};

pub(crate) use ringlb_testkit::netns::*;
pub(crate) use ringlb_testkit::tier::require_root;

/// A veth pair `a` (in `a_ns`, address `a_ip`) -- `b` (in `b_ns`), both up.
pub(crate) fn veth(a_ns: &str, a: &str, a_ip: &str, b_ns: &str, b: &str, b_ip: &str) {
    sh(&[
        "ip", "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ]);
    sh(&["ip", "-n", a_ns, "addr", "add", a_ip, "dev", a]);
    sh(&["ip", "-n", b_ns, "addr", "add", b_ip, "dev", b]);
    sh(&["ip", "-n", a_ns, "link", "set", a, "up"]);
    sh(&["ip", "-n", b_ns, "link", "set", b, "up"]);
}

/// The default route of namespace `ns`, via `gw`.
pub(crate) fn default_route(ns: &str, gw: &str) {
    route(ns, "default", gw);
}

/// The route of namespace `ns` to `dst`, via `gw`.
pub(crate) fn route(ns: &str, dst: &str, gw: &str) {
    sh(&["ip", "-n", ns, "route", "add", dst, "via", gw]);
}

/// No reverse-path filter in `ns` (DSR: replies come back on another port
/// than the VIP's route).
pub(crate) fn no_rp_filter(ns: &str) {
    sysctl(ns, "net.ipv4.conf.all.rp_filter=0");
    sysctl(ns, "net.ipv4.conf.default.rp_filter=0");
}

/// A DSR pod in `ns`: the IPv4 `vip` on its lo, never answered or announced
/// by ARP, and no reverse-path filter on its eth0.
pub(crate) fn dsr_pod(ns: &str, vip: &str) {
    sh(&[
        "ip",
        "-n",
        ns,
        "addr",
        "add",
        &format!("{vip}/32"),
        "dev",
        "lo",
    ]);
    sysctl(ns, "net.ipv4.conf.all.arp_ignore=1");
    sysctl(ns, "net.ipv4.conf.all.arp_announce=2");
    sysctl(ns, "net.ipv4.conf.eth0.rp_filter=0");
}

/// A private bpffs named after `tag`; `None` (after a loud SKIP: `what` needs
/// root) without root.
pub(crate) fn private_bpffs(what: &str, tag: &str) -> Option<BpfFs> {
    if !require_root(what) {
        return None;
    }
    Some(BpfFs::new(tag))
}

/// For `test`: a private bpffs and a namespace of its own, entered by this
/// thread, both named after `tag` (the namespace with the pid too); `None`
/// (after a loud SKIP) without root.
pub(crate) fn bpffs_and_netns(test: &str, tag: &str) -> Option<(BpfFs, Netns)> {
    let bpffs = private_bpffs(&format!("{test} (bpffs mount, netns, BPF)"), tag)?;
    let ns = Netns::new(&format!("rlb{tag}-{}", std::process::id()));
    enter_netns(&ns.0);
    Some((bpffs, ns))
}

/// A veth pair `a` -- `b` in the current namespace, both up.
pub(crate) fn veth_pair(a: &str, b: &str) {
    sh(&["ip", "link", "add", a, "type", "veth", "peer", "name", b]);
    sh(&["ip", "link", "set", a, "up"]);
    sh(&["ip", "link", "set", b, "up"]);
}

/// Every backend on one next hop: the ingress port (ifindex 0), untagged.
pub(crate) fn one_next_hop() -> Box<ringlb_nexthop::StaticResolver> {
    Box::new(ringlb_nexthop::StaticResolver::everywhere(
        ringlb_nexthop::NextHop {
            ifindex: 0,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0, 0, 0, 2],
            vlan: None,
        },
    ))
}

/// An edge pinned under `<bpffs>/ringlb`, outer source 10.0.0.11, no FIB
/// fallback.
pub(crate) fn pinned_opts(bpffs: &std::path::Path) -> XdpOptions {
    XdpOptions {
        pin_dir: Some(bpffs.join("ringlb")),
        src4: Some("10.0.0.11".parse().unwrap()),
        fib_fallback: false,
        ..XdpOptions::default()
    }
}

/// A loader (an edge starting or restarting) over the pins of `bpffs`, every
/// backend on [`one_next_hop`].
pub(crate) fn load_pinned(bpffs: &std::path::Path) -> Result<XdpDatapath, ringlb_xdp::Error> {
    XdpDatapath::load(&pinned_opts(bpffs), one_next_hop())
}

pub(crate) fn sysctl(ns: &str, kv: &str) {
    nsx(ns, &["sysctl", "-qw", kv]);
}

/// The options of a netns lab's edge: nothing pinned, the tests' VIP
/// capacity, the defaults otherwise (the FIB fallback on).
pub(crate) fn lab_opts() -> XdpOptions {
    XdpOptions {
        pin_dir: None,
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    }
}

/// An edge in namespace `ns`: loaded with `opts` and the next hops of `ns`'s
/// kernel, `desired` applied, attached natively to its eth0.
pub(crate) fn edge_in(ns: &str, opts: &XdpOptions, desired: &DesiredState) -> XdpDatapath {
    let resolver = KernelResolver::new(Some(ns.to_string()));
    let mut dp = XdpDatapath::load(opts, Box::new(resolver)).unwrap();
    dp.apply(desired).unwrap();
    let mode = in_netns(ns, || dp.attach("eth0", AttachMode::Native).unwrap());
    assert_eq!(mode, "native");
    dp
}

/// A Maglev table of 251 slots over `pods`, each on `port` with weight 1.
pub(crate) fn maglev_table(pods: &[&str], port: u16) -> Table {
    let backends: Vec<Backend> = pods
        .iter()
        .map(|p| Backend {
            addr: p.parse().unwrap(),
            port,
            weight: 1,
        })
        .collect();
    Table::build(&backends, 251).unwrap()
}

/// The Service `v` whose ring is [`maglev_table`] over `pods` on `port`.
pub(crate) fn maglev_entry(v: &Vip, pods: &[&str], port: u16) -> ServiceEntry {
    ServiceEntry::from_table(v, &maglev_table(pods, port)).unwrap()
}

/// `n` connections answered (`per_pod`: by whom), at least `min` by each of
/// pod1 and pod2, and the edge `dp` encapsulated at least the three packets
/// of each connection's client.
pub(crate) fn assert_spread_over_both_pods(
    dp: &XdpDatapath,
    per_pod: &BTreeMap<String, usize>,
    n: usize,
    min: usize,
) {
    eprintln!("connections per pod: {per_pod:?}");
    assert_eq!(per_pod.values().sum::<usize>(), n);
    assert!(
        per_pod.get("pod1").copied().unwrap_or(0) >= min
            && per_pod.get("pod2").copied().unwrap_or(0) >= min,
        "both pods get a fair share: {per_pod:?}"
    );
    let tx = fixture::counter(dp, "tx");
    assert!(
        tx >= n as u64 * 3,
        "every client packet was encapsulated by XDP ({tx})"
    );
}

/// A line server in `ns` on `vip:80`, answering every line with `name` (which pod).
pub(crate) fn serve(ns: String, vip: std::net::IpAddr, name: &'static str) {
    use std::io::{BufRead, BufReader, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let l = std::net::TcpListener::bind((vip, 80)).expect("bind VIP:80");
        tx.send(()).unwrap();
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                for line in BufReader::new(c).lines() {
                    if line.is_err() || w.write_all(format!("{name}\n").as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("server up");
}

/// The lab's BPF around the edge: `ringlb_pass` on the ToR's side of the edge link
/// (`ve-e`; veth XDP_TX needs a program on the peer) and the tc decap on each pod's
/// eth0 ingress. Keep the returned objects alive for the test's duration.
pub(crate) fn attach_lab_programs(tor: &str, pods: [&str; 2]) -> Vec<aya::Ebpf> {
    let mut objs = vec![attach_pass(tor, "ve-e")];
    objs.extend(pods.into_iter().map(attach_decap));
    objs
}

/// A UDP server in `ns` on `vip:port`, answering every datagram with `name`.
pub(crate) fn serve_udp(ns: String, vip: std::net::IpAddr, port: u16, name: &'static str) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let s = std::net::UdpSocket::bind((vip, port)).expect("bind VIP UDP");
        tx.send(()).unwrap();
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(name.as_bytes(), from);
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("UDP server up");
}
