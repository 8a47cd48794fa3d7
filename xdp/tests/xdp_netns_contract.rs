//! The Service contract through two XDP edges, with real traffic in network
//! namespaces:
//!
//! ```text
//!  client 10.205.1.2 (inside the ranges) ---+--- tor --- edge1 10.205.0.11  XDP ringlb_xdp
//!  other  10.205.5.3 (outside them) ---------+     |  \-- edge2 10.205.0.12  XDP ringlb_xdp
//!                                          pod1  pod2  pod3   tc ringlb_decap, VIP on lo
//! ```
//! The ToR routes the VIP over both edges (ECMP, hashed on the 5-tuple, as a
//! ToR's BGP multipath does), and both edges hold the same desired state:
//!
//! - source ranges: the client's address inside the ranges is served through
//!   both edges; a client outside them gets no answer at all, and the edges
//!   count the drops for the VIP;
//! - client affinity: 200 connections of one client, spread over both edges by
//!   the ToR, all reach one pod; without affinity they reach every pod;
//! - a UDP client on a fixed source port keeps getting answers when its pod is
//!   replaced by another one (the flow's conntrack entry turns stale on both
//!   edges, and its next datagram takes a live pod).
//!
//! Needs root (namespaces, BPF, tc); skips with a message otherwise.

mod xdp_support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufReader;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use ringlb_testkit::pod::ask;
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, SourceRange, Vip,
    xdp::{XdpDatapath, XdpOptions},
};
use xdp_support::*;

const VIP: &str = "10.205.100.1";
const INSIDE: &str = "10.205.1.2";
const OUTSIDE: &str = "10.205.5.3";
const EDGES: [&str; 2] = ["10.205.0.11", "10.205.0.12"];
const PODS: [&str; 3] = ["10.205.2.21", "10.205.3.22", "10.205.4.23"];
const NAMES: [&str; 3] = ["pod1", "pod2", "pod3"];
const UDP_PORT: u16 = 53;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn vip(port: u16, proto: Proto) -> Vip {
    Vip {
        addr: ip(VIP),
        port,
        proto,
    }
}

/// VIP:80/TCP and VIP:53/UDP over `pods`, `f` applied to the TCP entry.
fn desired(pods: &[&str], f: impl Fn(ServiceEntry) -> ServiceEntry) -> DesiredState {
    let entry = |v: &Vip| maglev_entry(v, pods, v.port);
    let (tcp, udp) = (vip(80, Proto::Tcp), vip(UDP_PORT, Proto::Udp));
    DesiredState {
        services: [(tcp, f(entry(&tcp))), (udp, entry(&udp))]
            .into_iter()
            .collect(),
    }
}

#[test]
fn source_ranges_affinity_and_a_replaced_udp_pod_through_two_edges() {
    if !require_root("the two-edge XDP netns test (netns, BPF, tc)") {
        return;
    }
    let names = ["c", "o", "t", "e1", "e2", "p1", "p2", "p3"];
    let nss = Netns::per_process("rlbk", names);
    let [c, o, t, e1, e2, p1, p2, p3] = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| nss[i].0.as_str());
    wire([c, o], t, [e1, e2], [p1, p2, p3]);
    let mut programs = vec![attach_pass(t, "ve-e1"), attach_pass(t, "ve-e2")];
    for (i, p) in [p1, p2, p3].into_iter().enumerate() {
        programs.push(attach_decap(p));
        serve(p.to_string(), ip(VIP), NAMES[i]);
        serve_udp(p.to_string(), ip(VIP), UDP_PORT, NAMES[i]);
    }
    let mut edges = [the_edge(e1, EDGES[0]), the_edge(e2, EDGES[1])];

    only_the_sources_inside_the_ranges_are_served([c, o], &mut edges);
    affinity_keeps_one_client_on_one_pod_through_both_edges(c, &mut edges);
    a_udp_client_on_a_fixed_port_survives_its_pod_being_replaced(c, &mut edges);
    for dp in edges {
        dp.uninstall().unwrap();
    }
    drop(programs);
}

fn apply(edges: &mut [XdpDatapath; 2], d: &DesiredState) {
    for dp in edges.iter_mut() {
        dp.apply(d).unwrap();
    }
}

/// One connection from namespace `ns` to VIP:80 and one line: the pod that
/// answered, or the error (1 s to connect).
fn ask_once(ns: &str) -> Result<String, String> {
    in_netns(ns, || {
        let to: SocketAddr = (ip(VIP), 80).into();
        let sock =
            TcpStream::connect_timeout(&to, Duration::from_secs(1)).map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        ask(&mut BufReader::new(sock)).map_err(|e| e.to_string())
    })
}

/// The counter `label` summed over both edges.
fn counter(edges: &[XdpDatapath; 2], label: &str) -> u64 {
    edges
        .iter()
        .map(|dp| {
            let c = dp.read_counters().unwrap();
            c.global
                .iter()
                .find(|(l, _)| *l == label)
                .map_or(0, |x| x.1)
        })
        .sum()
}

fn only_the_sources_inside_the_ranges_are_served([c, o]: [&str; 2], edges: &mut [XdpDatapath; 2]) {
    let inside = SourceRange::new(ip(INSIDE), 32).unwrap();
    let tcp = vip(80, Proto::Tcp);
    apply(
        edges,
        &desired(&PODS, |e| e.with_source_ranges(&tcp, [inside])),
    );
    let tx_before: Vec<u64> = edges.iter().map(tx).collect();
    for i in 0..40 {
        let who = ask_once(c).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert!(NAMES.contains(&who.as_str()), "{who}");
    }
    let carried: Vec<u64> = edges
        .iter()
        .zip(&tx_before)
        .map(|(dp, b)| tx(dp) - b)
        .collect();
    assert!(
        carried.iter().all(|n| *n > 0),
        "the ToR spreads the client over both edges: {carried:?}"
    );
    let dropped_before = counter(edges, "drop_source_range");
    for _ in 0..3 {
        let r = ask_once(o);
        assert!(r.is_err(), "a source outside the ranges was served: {r:?}");
    }
    let dropped = counter(edges, "drop_source_range") - dropped_before;
    assert!(
        dropped >= 3,
        "the edges counted the refused SYNs: {dropped}"
    );
    let per_vip: u64 = edges
        .iter()
        .flat_map(|dp| dp.read_counters().unwrap().per_vip_dropped)
        .filter(|(v, r, _)| *v == tcp && *r == "source_range")
        .map(|(_, _, n)| n)
        .sum();
    assert!(per_vip >= 3, "counted for the VIP: {per_vip}");
}

fn tx(dp: &XdpDatapath) -> u64 {
    let c = dp.read_counters().unwrap();
    c.global.iter().find(|(l, _)| *l == "tx").map_or(0, |x| x.1)
}

fn affinity_keeps_one_client_on_one_pod_through_both_edges(c: &str, edges: &mut [XdpDatapath; 2]) {
    let pods_of_200 = |edges: &[XdpDatapath; 2]| {
        let before: Vec<u64> = edges.iter().map(tx).collect();
        let mut per_pod: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..200 {
            let who = ask_once(c).unwrap_or_else(|e| panic!("connection {i}: {e}"));
            *per_pod.entry(who).or_default() += 1;
        }
        let carried: Vec<u64> = edges.iter().zip(&before).map(|(d, b)| tx(d) - b).collect();
        assert!(carried.iter().all(|n| *n > 0), "both edges: {carried:?}");
        per_pod
    };
    apply(edges, &desired(&PODS, |e| e.with_client_affinity(10_800)));
    let with = pods_of_200(edges);
    assert_eq!(with.len(), 1, "one pod for every connection: {with:?}");
    apply(edges, &desired(&PODS, |e| e));
    let without = pods_of_200(edges);
    assert_eq!(
        without.keys().cloned().collect::<BTreeSet<_>>(),
        NAMES.iter().map(|n| n.to_string()).collect(),
        "every pod without affinity: {without:?}"
    );
}

fn a_udp_client_on_a_fixed_port_survives_its_pod_being_replaced(
    c: &str,
    edges: &mut [XdpDatapath; 2],
) {
    apply(edges, &desired(&PODS[..2], |e| e));
    in_netns(c, || {
        let s = UdpSocket::bind((ip(INSIDE), 40_053)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let ask = |s: &UdpSocket| {
            s.send_to(b"who", (ip(VIP), UDP_PORT)).unwrap();
            let mut buf = [0u8; 64];
            let (n, _) = s.recv_from(&mut buf).expect("an answer");
            String::from_utf8_lossy(&buf[..n]).to_string()
        };
        let first = ask(&s);
        for _ in 0..5 {
            assert_eq!(ask(&s), first, "the flow stays on its pod");
        }
        // the pod is replaced: pod3 takes its place on both edges
        let i = NAMES.iter().position(|n| *n == first).unwrap();
        let mut pods: Vec<&str> = PODS[..2].to_vec();
        pods[i] = PODS[2];
        let d = desired(&pods, |e| e);
        for dp in edges.iter_mut() {
            dp.apply(&d).unwrap();
        }
        let next = ask(&s);
        assert_ne!(next, first, "the replaced pod does not answer any more");
        for _ in 0..5 {
            assert_eq!(ask(&s), next, "and the flow stays on its new pod");
        }
    });
    assert!(
        counter(edges, "ct_stale") >= 1,
        "the old entry turned stale"
    );
}

/// The picture at the top: links, routes (ECMP over the edges), sysctls.
fn wire([c, o]: [&str; 2], t: &str, edges: [&str; 2], pods: [&str; 3]) {
    veth(
        c,
        "eth0",
        &format!("{INSIDE}/24"),
        t,
        "ve-cl",
        "10.205.1.1/24",
    );
    default_route(c, "10.205.1.1");
    veth(
        o,
        "eth0",
        &format!("{OUTSIDE}/24"),
        t,
        "ve-o",
        "10.205.5.1/24",
    );
    default_route(o, "10.205.5.1");
    for (i, (e, addr)) in edges.iter().zip(EDGES).enumerate() {
        let dev = format!("ve-e{}", i + 1);
        veth(e, "eth0", &format!("{addr}/24"), t, &dev, "10.205.0.1/24");
        default_route(e, "10.205.0.1");
        sysctl(t, &format!("net.ipv4.conf.{dev}.rp_filter=0"));
    }
    for (i, (p, addr)) in pods.iter().zip(PODS).enumerate() {
        let gw = format!("10.205.{}.1", i + 2);
        veth(
            p,
            "eth0",
            &format!("{addr}/24"),
            t,
            &format!("ve-p{}", i + 1),
            &format!("{gw}/24"),
        );
        default_route(p, &gw);
        dsr_pod(p, VIP);
        sysctl(t, &format!("net.ipv4.conf.ve-p{}.rp_filter=0", i + 1));
    }
    // both edges share one /24 on two ToR ports: each gets a host route
    for (i, addr) in EDGES.iter().enumerate() {
        let dev = format!("ve-e{}", i + 1);
        sh(&[
            "ip",
            "-n",
            t,
            "route",
            "replace",
            &format!("{addr}/32"),
            "dev",
            &dev,
        ]);
    }
    // the VIP over both edges, hashed on the 5-tuple (BGP multipath's job)
    sh(&[
        "ip",
        "-n",
        t,
        "route",
        "add",
        &format!("{VIP}/32"),
        "nexthop",
        "via",
        EDGES[0],
        "dev",
        "ve-e1",
        "nexthop",
        "via",
        EDGES[1],
        "dev",
        "ve-e2",
    ]);
    sysctl(t, "net.ipv4.fib_multipath_hash_policy=1");
    sysctl(t, "net.ipv4.ip_forward=1");
    sysctl(t, "net.ipv4.conf.ve-cl.rp_filter=0");
    sysctl(t, "net.ipv4.conf.ve-o.rp_filter=0");
    for ns in [c, o, t].into_iter().chain(edges).chain(pods) {
        no_rp_filter(ns);
    }
    // a veth frame sent with XDP_TX keeps a partial checksum otherwise
    for ns in [c, o] {
        in_netns(ns, || tx_checksum_off("eth0"));
    }
}

/// One edge: the datapath loaded with the three pods and attached natively.
fn the_edge(ns: &str, addr: &str) -> XdpDatapath {
    let opts = XdpOptions {
        src4: Some(addr.parse().unwrap()),
        ..lab_opts()
    };
    edge_in(ns, &opts, &desired(&PODS, |e| e))
}
