//! Real traffic through the XDP datapath in network namespaces:
//!
//! ```text
//!  client 10.201.1.2 --- tor (router) --- edge 10.201.0.11   XDP ringlb_xdp (native)
//!                          |      |
//!                        pod1    pod2    tc ringlb_decap, VIP 10.201.100.1 on lo
//! ```
//! client -> tor -> edge (XDP: Maglev + IPIP, XDP_TX) -> tor -> pod (tc decap)
//! -> the reply leaves the pod with the VIP as source, straight to the client.
//! Many TCP connections spread over both pods; removing pod1 from the desired
//! state keeps every established connection on pod2 alive. A ping of the VIP
//! is answered by the edge, and probes of ports no Service has are dropped
//! there, with the edge forwarding like a real node's kernel (no loop back
//! through the ToR). Needs root.

mod xdp_support;

use std::{
    collections::BTreeMap,
    io::BufReader,
    net::{IpAddr, TcpStream},
    time::Duration,
};

use ringlb_testkit::pod::{ask, connect};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, Vip,
    xdp::{XdpDatapath, XdpOptions},
};
use xdp_support::*;

const VIP: &str = "10.201.100.1";
const POD1: &str = "10.201.2.21";
const POD2: &str = "10.201.3.22";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn desired(pods: &[&str]) -> DesiredState {
    let vip = Vip {
        addr: ip(VIP),
        port: 80,
        proto: Proto::Tcp,
    };
    DesiredState {
        services: [(vip, maglev_entry(&vip, pods, 80))].into_iter().collect(),
    }
}

#[test]
fn tcp_through_xdp_to_two_pods_with_dsr_and_established_flows_survive() {
    if !require_root("the XDP netns traffic test (netns, BPF, tc)") {
        return;
    }
    let [client, tor, edge, pod1, pod2] = Netns::per_process("rlbx", ["c", "t", "e", "p1", "p2"]);
    let (c, t, e, p1, p2) = (&client.0, &tor.0, &edge.0, &pod1.0, &pod2.0);
    wire_the_lab([c, t, e, p1, p2]);

    // ringlb_pass on the ToR side (veth XDP_TX needs it), tc decap in the pods
    let _programs = attach_lab_programs(t, [p1, p2]);
    serve(p1.clone(), ip(VIP), "pod1");
    serve(p2.clone(), ip(VIP), "pod2");
    let mut dp = the_edge(e);

    let mut conns = sixty_connections_spread_over_both_pods(c, &dp);
    replies_bypass_the_edge(c, e);
    ping_and_unused_ports_do_not_loop(c, t, e, &dp);
    pod1_leaves_and_the_flows_on_pod2_survive(c, &mut dp, &mut conns);
    drop(conns);
    dp.uninstall().unwrap();
}

/// The namespaces of the picture at the top: links, routes, and the sysctls DSR
/// needs.
fn wire_the_lab([c, t, e, p1, p2]: [&str; 5]) {
    veth(c, "eth0", "10.201.1.2/24", t, "ve-cl", "10.201.1.1/24");
    veth(e, "eth0", "10.201.0.11/24", t, "ve-e", "10.201.0.1/24");
    veth(p1, "eth0", "10.201.2.21/24", t, "ve-p1", "10.201.2.1/24");
    veth(p2, "eth0", "10.201.3.22/24", t, "ve-p2", "10.201.3.1/24");
    default_route(c, "10.201.1.1");
    default_route(e, "10.201.0.1");
    default_route(p1, "10.201.2.1");
    default_route(p2, "10.201.3.1");
    // the ToR sends the VIP to the edge (BGP's job in production)
    route(t, &format!("{VIP}/32"), "10.201.0.11");
    sysctl(t, "net.ipv4.ip_forward=1");
    for ns in [c, t, e, p1, p2] {
        no_rp_filter(ns);
    }
    for dev in ["ve-cl", "ve-e", "ve-p1", "ve-p2"] {
        sysctl(t, &format!("net.ipv4.conf.{dev}.rp_filter=0"));
    }
    for ns in [p1, p2] {
        dsr_pod(ns, VIP);
    }
    // a veth frame sent with XDP_TX keeps a partial checksum otherwise
    in_netns(c, || tx_checksum_off("eth0"));
}

/// The edge: the datapath loaded, both pods applied, attached natively to eth0.
fn the_edge(e: &str) -> XdpDatapath {
    let opts = XdpOptions {
        src4: Some("10.201.0.11".parse().unwrap()),
        ..lab_opts()
    };
    edge_in(e, &opts, &desired(&[POD1, POD2]))
}

/// 60 connections from the client, each asks once; both pods get a fair share and
/// XDP encapsulated every packet. Returns the connections with the pod that
/// answered each.
fn sixty_connections_spread_over_both_pods(
    c: &str,
    dp: &XdpDatapath,
) -> Vec<(BufReader<TcpStream>, String)> {
    let conns: Vec<(BufReader<TcpStream>, String)> = in_netns(c, || {
        (0..60)
            .map(|i| {
                let mut r = connect((ip(VIP), 80).into())
                    .unwrap_or_else(|e| panic!("connection {i} to the VIP: {e}"));
                let who = ask(&mut r).unwrap_or_else(|e| panic!("connection {i}: {e}"));
                (r, who)
            })
            .collect()
    });
    let mut per_pod: BTreeMap<String, usize> = BTreeMap::new();
    for (_, who) in &conns {
        *per_pod.entry(who.clone()).or_default() += 1;
    }
    assert_spread_over_both_pods(dp, &per_pod, 60, 15);
    conns
}

/// DSR: the edge never saw a reply (nothing from the VIP ever reached it)
fn replies_bypass_the_edge(c: &str, e: &str) {
    let edge_rx: serde_json::Value =
        serde_json::from_str(&nsx(e, &["ip", "-j", "-s", "link", "show", "dev", "eth0"])).unwrap();
    let rx_packets = edge_rx[0]["stats64"]["rx"]["packets"].as_u64().unwrap();
    let client_tx: serde_json::Value =
        serde_json::from_str(&nsx(c, &["ip", "-j", "-s", "link", "show", "dev", "eth0"])).unwrap();
    let client_tx_packets = client_tx[0]["stats64"]["tx"]["packets"].as_u64().unwrap();
    let client_rx_packets = client_tx[0]["stats64"]["rx"]["packets"].as_u64().unwrap();
    assert!(
        rx_packets < client_tx_packets + 20,
        "edge received {rx_packets}, client sent {client_tx_packets}: replies must not pass the edge"
    );
    assert!(
        client_rx_packets >= 120,
        "the client got the replies ({client_rx_packets})"
    );
}

/// Packets the ToR sent the edge on its link so far.
fn tor_to_edge_packets(t: &str) -> u64 {
    let link: serde_json::Value =
        serde_json::from_str(&nsx(t, &["ip", "-j", "-s", "link", "show", "dev", "ve-e"])).unwrap();
    link[0]["stats64"]["tx"]["packets"].as_u64().unwrap()
}

/// The edge's kernel forwards (as a node's does), so a VIP packet the program
/// passed would go back to the ToR and return, until its TTL ran out. A ping
/// of the VIP is answered by the program, and probes of 1,000 ports no Service
/// has (500 UDP ports, one datagram each; 500 TCP ports, one connect each) are
/// dropped: one packet per probe on the edge link. The TCP connects run 25 at
/// a time with a 300 ms timeout, before the first SYN retransmit (1 s), so
/// each sends a single SYN.
fn ping_and_unused_ports_do_not_loop(c: &str, t: &str, e: &str, dp: &XdpDatapath) {
    sysctl(e, "net.ipv4.ip_forward=1");
    // The lab is IPv4: without this, the ToR's IPv6 start-up chatter on the new
    // link (MLD reports, router solicitations) lands in the count.
    sysctl(t, "net.ipv6.conf.ve-e.disable_ipv6=1");
    let counter = |label: &str| fixture::counter(dp, label);
    let before = tor_to_edge_packets(t);
    let out = nsx(c, &["ping", "-c", "3", "-i", "0.2", "-W", "2", VIP]);
    // iputils says "3 received", busybox (the kernel matrix guests) "3 packets received"
    assert!(out.contains(", 0% packet loss"), "{out}");
    assert!(counter("icmp_echo") >= 3, "answered by the program: {out}");
    // Away from the Service's port 80.
    const UDP_PORTS: std::ops::Range<u16> = 10000..10500;
    const TCP_PORTS: std::ops::Range<u16> = 20000..20500;
    const TCP_THREADS: u16 = 25;
    const PROBES: u64 = (UDP_PORTS.end - UDP_PORTS.start + TCP_PORTS.end - TCP_PORTS.start) as u64;
    in_netns(c, || {
        let u = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for port in UDP_PORTS {
            u.send_to(b"probe", (ip(VIP), port)).unwrap();
            // A pause every 50 datagrams: a burst of 500 could overrun the
            // 256-packet ring of the edge's native XDP veth and never be counted.
            if port % 50 == 49 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    // setns moves only the calling thread: each connecting thread enters the
    // client's namespace itself.
    let per_thread = (TCP_PORTS.end - TCP_PORTS.start) / TCP_THREADS;
    std::thread::scope(|s| {
        for k in 0..TCP_THREADS {
            let first = TCP_PORTS.start + k * per_thread;
            s.spawn(move || {
                in_netns(c, || {
                    for port in first..first + per_thread {
                        let r = TcpStream::connect_timeout(
                            &(ip(VIP), port).into(),
                            Duration::from_millis(300),
                        );
                        assert!(r.is_err(), "nothing answers port {port}");
                    }
                })
            });
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let sent = tor_to_edge_packets(t) - before;
    assert_eq!(counter("drop_no_service"), PROBES);
    // 3 echo requests, one packet per probe, and a little room for ARP
    assert!(
        sent <= 3 + PROBES + 4,
        "the ToR sent the edge {sent} packets for 3 pings and {PROBES} probes: a loop"
    );
}

/// pod1 leaves the service: every connection on pod2 stays alive
fn pod1_leaves_and_the_flows_on_pod2_survive(
    c: &str,
    dp: &mut XdpDatapath,
    conns: &mut [(BufReader<TcpStream>, String)],
) {
    dp.apply(&desired(&[POD2])).unwrap();
    for (i, (r, who)) in conns.iter_mut().enumerate() {
        if who == "pod2" {
            assert_eq!(
                ask(r).unwrap_or_else(|e| panic!("pod2 connection {i} broke: {e}")),
                "pod2"
            );
        }
    }
    // and new connections all go to pod2
    in_netns(c, || {
        for _ in 0..10 {
            assert_eq!(
                ask(&mut connect((ip(VIP), 80).into()).unwrap()).unwrap(),
                "pod2"
            );
        }
    });
    let hits = fixture::counter(dp, "ct_hit");
    assert!(hits > 0, "established flows were served from conntrack");
}
