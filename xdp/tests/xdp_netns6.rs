//! IPv6 real traffic through the XDP datapath (IPv6-in-IPv6 to the pods):
//! the same topology as xdp_netns.rs, IPv6 only; a ping of the VIP gets the
//! edge's ICMPv6 echo reply. Needs root.

mod xdp_support;

use std::{
    collections::BTreeMap,
    io::{BufRead, Write},
    net::IpAddr,
};

use ringlb_testkit::pod::connect;
use ringlb_xdp::{Datapath, DesiredState, Proto, Vip, xdp::XdpOptions};
use xdp_support::*;

const VIP: &str = "fd00:201:100::1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn veth6(a_ns: &str, a: &str, a_ip: &str, b_ns: &str, b: &str, b_ip: &str) {
    sh(&[
        "ip", "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ]);
    sh(&[
        "ip", "-n", a_ns, "-6", "addr", "add", a_ip, "dev", a, "nodad",
    ]);
    sh(&[
        "ip", "-n", b_ns, "-6", "addr", "add", b_ip, "dev", b, "nodad",
    ]);
    sh(&["ip", "-n", a_ns, "link", "set", a, "up"]);
    sh(&["ip", "-n", b_ns, "link", "set", b, "up"]);
}

#[test]
fn ipv6_tcp_through_xdp_ip6ip6_to_two_pods() {
    if !require_root("the XDP IPv6 netns traffic test (netns, BPF, tc)") {
        return;
    }
    let [client, tor, edge, pod1, pod2] = Netns::per_process("rlb6x", ["c", "t", "e", "p1", "p2"]);
    let (c, t, e, p1, p2) = (&client.0, &tor.0, &edge.0, &pod1.0, &pod2.0);
    veth6(
        c,
        "eth0",
        "fd00:201:1::2/64",
        t,
        "ve-cl",
        "fd00:201:1::1/64",
    );
    veth6(e, "eth0", "fd00:201::11/64", t, "ve-e", "fd00:201::1/64");
    veth6(
        p1,
        "eth0",
        "fd00:201:2::21/64",
        t,
        "ve-p1",
        "fd00:201:2::1/64",
    );
    veth6(
        p2,
        "eth0",
        "fd00:201:3::22/64",
        t,
        "ve-p2",
        "fd00:201:3::1/64",
    );
    for (ns, gw) in [
        (c, "fd00:201:1::1"),
        (e, "fd00:201::1"),
        (p1, "fd00:201:2::1"),
        (p2, "fd00:201:3::1"),
    ] {
        sh(&["ip", "-n", ns, "-6", "route", "add", "default", "via", gw]);
    }
    sh(&[
        "ip",
        "-n",
        t,
        "-6",
        "route",
        "add",
        &format!("{VIP}/128"),
        "via",
        "fd00:201::11",
    ]);
    sysctl(t, "net.ipv6.conf.all.forwarding=1");
    for ns in [p1, p2] {
        sh(&[
            "ip",
            "-n",
            ns,
            "-6",
            "addr",
            "add",
            &format!("{VIP}/128"),
            "dev",
            "lo",
            "nodad",
        ]);
    }
    in_netns(c, || tx_checksum_off("eth0"));

    let _programs = attach_lab_programs(t, [p1, p2]);
    serve(p1.clone(), ip(VIP), "pod1");
    serve(p2.clone(), ip(VIP), "pod2");

    let opts = XdpOptions {
        src4: None,
        src6: Some("fd00:201::11".parse().unwrap()),
        ..lab_opts()
    };
    let vip = Vip {
        addr: ip(VIP),
        port: 80,
        proto: Proto::Tcp,
    };
    let pods = maglev_entry(&vip, &["fd00:201:2::21", "fd00:201:3::22"], 80);
    let dp = edge_in(
        e,
        &opts,
        &DesiredState {
            services: [(vip, pods)].into_iter().collect(),
        },
    );

    let per_pod: BTreeMap<String, usize> = in_netns(c, || {
        let mut m = BTreeMap::new();
        for i in 0..40 {
            let mut r = connect((ip(VIP), 80).into())
                .unwrap_or_else(|e| panic!("IPv6 connection {i} to the VIP: {e}"));
            r.get_mut().write_all(b"hello\n").unwrap();
            let mut who = String::new();
            r.read_line(&mut who).unwrap();
            *m.entry(who.trim().to_string()).or_default() += 1;
        }
        m
    });
    assert_spread_over_both_pods(&dp, &per_pod, 40, 8);
    // a ping of the VIP is answered by the program, also with the edge's
    // kernel forwarding (which would send a passed echo back to the ToR)
    sysctl(e, "net.ipv6.conf.all.forwarding=1");
    let out = nsx(c, &["ping", "-c", "3", "-i", "0.2", "-W", "2", VIP]);
    // iputils says "3 received", busybox (the kernel matrix guests) "3 packets received"
    assert!(out.contains(", 0% packet loss"), "{out}");
    assert!(
        fixture::counter(&dp, "icmp_echo") >= 3,
        "answered by the program: {out}"
    );
    dp.uninstall().unwrap();
}
