//! BPF_PROG_TEST_RUN fixtures for packets to one of the edge's VIP addresses
//! that no VIP entry forwards (bpf/vip_addr.h): an ICMP/ICMPv6 echo request
//! is answered from the VIP by XDP_TX, anything else is dropped and counted
//! by reason, never passed (the edge's kernel would route it back to the ToR:
//! a loop). Packets to other addresses are passed untouched, as before.
//! Expected frames are built from scratch (checksums computed here, never
//! copied from the program's output) and `verify_checksums` re-checks the
//! answers. Needs root.

mod xdp_support;
use xdp_support::fixture::*;

use std::net::IpAddr;

use ringlb_testkit::packet::{
    Frame, hex, icmp_error, internet_checksum, ip_header, l2_header, l4_checksum, verify_checksums,
};
use ringlb_xdp::{Datapath, Proto, xdp::XdpDatapath};

/// A VIP address with a port-0 (every port) TCP entry.
const WILD4: &str = "10.100.0.5";
const NOT_VIP4: &str = "10.100.0.2";
const NOT_VIP6: &str = "2001:db8:100::2";

/// The ICMP fixtures' services and WILD4:*/TCP.
fn loaded() -> Option<XdpDatapath> {
    load_applied(
        1500,
        &icmp_services((vip(WILD4, 0, Proto::Tcp), "10.1.0.1")),
    )
}

/// An ICMP (IPv4) or ICMPv6 echo message in an Ethernet frame.
#[derive(Clone)]
struct Echo {
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    vlan: Option<u16>,
    src: IpAddr,
    dst: IpAddr,
    icmp_type: u8,
    ttl: u8,
    tos: u8,
    df: bool,
    flow_label: u32,
    id: u16,
    seq: u16,
    data: Vec<u8>,
}

impl Echo {
    /// An echo request as `ping` sends it (IPv4 with DF).
    fn request(src: &str, dst: &str) -> Self {
        let v4 = ip(src).is_ipv4();
        Echo {
            dst_mac: [0x02, 0, 0, 0, 0, 0x01],
            src_mac: [0x02, 0, 0, 0, 0, 0x02],
            vlan: None,
            src: ip(src),
            dst: ip(dst),
            icmp_type: if v4 { 8 } else { 128 },
            ttl: 61,
            tos: 0,
            df: true,
            flow_label: if v4 { 0 } else { 0x5_4321 },
            id: 0x1c2d,
            seq: 7,
            data: (0..56).map(|i| (i * 7 + 3) as u8).collect(),
        }
    }

    /// The reply the edge must give: MACs and addresses swapped, TTL 64,
    /// the reply type, everything else as the request had it.
    fn reply(&self) -> Self {
        Echo {
            dst_mac: self.src_mac,
            src_mac: self.dst_mac,
            src: self.dst,
            dst: self.src,
            icmp_type: if self.src.is_ipv4() { 0 } else { 129 },
            ttl: 64,
            ..self.clone()
        }
    }

    fn icmp(&self) -> Vec<u8> {
        let mut m = vec![self.icmp_type, 0, 0, 0];
        m.extend_from_slice(&self.id.to_be_bytes());
        m.extend_from_slice(&self.seq.to_be_bytes());
        m.extend_from_slice(&self.data);
        let c = if self.src.is_ipv4() {
            internet_checksum(0, &m)
        } else {
            l4_checksum(self.src, self.dst, 58, &m)
        };
        m[2..4].copy_from_slice(&c.to_be_bytes());
        m
    }

    fn bytes(&self) -> Vec<u8> {
        let (ethertype, proto) = if self.src.is_ipv4() {
            (0x0800, 1)
        } else {
            (0x86dd, 58)
        };
        let m = self.icmp();
        let mut v = l2_header(self.dst_mac, self.src_mac, self.vlan, ethertype);
        v.extend(ip_header(
            self.src,
            self.dst,
            proto,
            m.len(),
            self.tos,
            self.df,
            self.ttl,
            self.flow_label,
        ));
        v.extend(m);
        v
    }
}

/// Runs `req` and checks the exact reply and its checksums.
fn assert_replied(dp: &XdpDatapath, req: &Echo) {
    let (verdict, out) = run(dp, &req.bytes());
    assert_eq!(verdict, XDP_TX, "{} -> {}", req.src, req.dst);
    let want = req.reply().bytes();
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    let untagged = match req.vlan {
        Some(_) => [&out[..12], &out[16..]].concat(),
        None => out,
    };
    verify_checksums(&untagged).unwrap();
}

/// Runs `frame` and checks it is dropped untouched, counted under `label`.
fn assert_dropped(dp: &XdpDatapath, what: &str, frame: &[u8], label: &str) {
    let before = counter(dp, label);
    let (verdict, out) = run(dp, frame);
    assert_eq!(verdict, XDP_DROP, "{what}");
    assert_eq!(out, frame, "{what}: dropped frames are not modified");
    assert_eq!(counter(dp, label), before + 1, "{what}: {label}");
}

/// Runs `frame` and checks it is passed untouched, counted under `label`.
fn assert_passed(dp: &XdpDatapath, what: &str, frame: &[u8], label: &str) {
    let before = counter(dp, label);
    assert_eq!(run(dp, frame), (XDP_PASS, frame.to_vec()), "{what}");
    assert_eq!(counter(dp, label), before + 1, "{what}: {label}");
}

#[test]
fn ipv4_echo_to_a_vip_is_answered_from_the_vip() {
    let Some(dp) = loaded() else { return };
    assert_replied(&dp, &Echo::request(CLIENT4, VIP4));
    // a VIP address with only a wildcard entry is a VIP address too
    assert_replied(&dp, &Echo::request(CLIENT4, WILD4));
    // without DF, with a TOS and an odd-length payload: kept as they came
    let mut odd = Echo::request(CLIENT4, VIP4);
    odd.df = false;
    odd.tos = 0x28;
    odd.data.truncate(17);
    assert_replied(&dp, &odd);
    assert_eq!(counter(&dp, "icmp_echo"), 3);
    assert_eq!(
        counter(&dp, "tx"),
        0,
        "an answer is not counted as forwarded"
    );
    assert_eq!(counter(&dp, "pass_icmp"), 0);
}

#[test]
fn ipv6_echo_to_a_vip_is_answered_with_the_pseudo_header_checksum() {
    let Some(dp) = loaded() else { return };
    assert_replied(&dp, &Echo::request(CLIENT6, VIP6));
    let mut tc = Echo::request(CLIENT6, VIP6);
    tc.tos = 0xb8;
    tc.data = vec![0xff; 1000];
    assert_replied(&dp, &tc);
    assert_eq!(counter(&dp, "icmp_echo"), 2);
}

#[test]
fn a_vlan_tag_is_kept_on_the_echo_reply() {
    let Some(dp) = loaded() else { return };
    let mut req = Echo::request(CLIENT4, VIP4);
    req.vlan = Some(100);
    assert_replied(&dp, &req);
    let mut req6 = Echo::request(CLIENT6, VIP6);
    req6.vlan = Some(4094);
    assert_replied(&dp, &req6);
}

#[test]
fn icmp_to_other_addresses_is_passed_as_before() {
    let Some(dp) = loaded() else { return };
    for (src, dst) in [
        (CLIENT4, NOT_VIP4),
        (CLIENT6, NOT_VIP6),
        (CLIENT4, "10.0.0.11"),
    ] {
        let f = Echo::request(src, dst).bytes();
        assert_passed(&dp, &format!("echo to {dst}"), &f, "pass_icmp");
    }
    // an address whose Bloom filter bit is a VIP's: the exact check passes it
    let bit = ringlb_xdp::vip_filter::bit(ip(VIP4));
    let twin = (0..=u16::MAX)
        .map(|i| IpAddr::from([10, 200, (i >> 8) as u8, i as u8]))
        .find(|a| ringlb_xdp::vip_filter::bit(*a) == bit)
        .expect("an address sharing the VIP's filter bit");
    let f = Echo::request(CLIENT4, &twin.to_string()).bytes();
    assert_passed(&dp, "echo to the VIP's filter twin", &f, "pass_icmp");
    let syn = Frame::tcp(ip(CLIENT4), twin, 40000, 81).bytes();
    assert_passed(&dp, "SYN to the filter twin", &syn, "pass_not_vip");
    assert_eq!(counter(&dp, "icmp_echo"), 0);
}

#[test]
fn tcp_and_udp_to_a_vip_address_on_an_unused_port_are_dropped() {
    let Some(dp) = loaded() else { return };
    let cases = [
        (
            "TCP SYN to VIP4:81",
            Frame::tcp(ip(CLIENT4), ip(VIP4), 40000, 81),
        ),
        (
            "TCP ACK to VIP4:22",
            Frame::tcp(ip(CLIENT4), ip(VIP4), 40000, 22).established(),
        ),
        (
            "UDP to VIP4:54",
            Frame::udp(ip(CLIENT4), ip(VIP4), 40000, 54),
        ),
        // the port is a Service's, the protocol is not
        (
            "UDP to VIP4:80",
            Frame::udp(ip(CLIENT4), ip(VIP4), 40000, 80),
        ),
        (
            "TCP to VIP4:53",
            Frame::tcp(ip(CLIENT4), ip(VIP4), 40000, 53),
        ),
        (
            "TCP SYN to VIP6:80",
            Frame::tcp(ip(CLIENT6), ip(VIP6), 40000, 80),
        ),
        (
            "UDP to VIP6:443",
            Frame::udp(ip(CLIENT6), ip(VIP6), 40000, 443),
        ),
        // a wildcard entry takes every port of its protocol only
        (
            "UDP to WILD4:53",
            Frame::udp(ip(CLIENT4), ip(WILD4), 40000, 53),
        ),
    ];
    for (what, f) in &cases {
        assert_dropped(&dp, what, &f.bytes(), "drop_no_service");
    }
    assert_eq!(counter(&dp, "drop_no_service"), cases.len() as u64);
    assert_eq!(counter(&dp, "pass_not_vip"), 0);
    // the Services themselves are forwarded as ever
    for f in [
        Frame::tcp(ip(CLIENT4), ip(VIP4), 40000, 80),
        Frame::udp(ip(CLIENT4), ip(VIP4), 40000, 53),
        Frame::tcp(ip(CLIENT6), ip(VIP6), 40000, 443),
        Frame::tcp(ip(CLIENT4), ip(WILD4), 40000, 8443),
    ] {
        assert_eq!(run(&dp, &f.bytes()).0, XDP_TX, "{} -> {}", f.src, f.dport);
    }
    assert_eq!(counter(&dp, "tx"), 4);
    // and a packet to no VIP address is the node's: passed
    let node = Frame::tcp(ip(CLIENT4), ip(NOT_VIP4), 40000, 81).bytes();
    assert_passed(&dp, "TCP to a node address", &node, "pass_not_vip");
}

/// IPv4 `f` with 4 bytes of IP options (NOPs): IHL 6, checksum recomputed.
fn with_ip_options(f: &[u8]) -> Vec<u8> {
    let mut h = f[14..34].to_vec();
    h.extend([1, 1, 1, 1]);
    h[0] = 0x46;
    let tot = u16::from_be_bytes([h[2], h[3]]) + 4;
    h[2..4].copy_from_slice(&tot.to_be_bytes());
    h[10..12].copy_from_slice(&[0, 0]);
    let c = internet_checksum(0, &h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    [&f[..14], &h[..], &f[34..]].concat()
}

#[test]
fn other_icmp_and_protocols_to_a_vip_address_are_dropped() {
    let Some(dp) = loaded() else { return };
    let flow = Frame::tcp(ip(VIP4), ip(CLIENT4), 80, 40000).l3();
    let flow6 = Frame::tcp(ip(VIP6), ip(CLIENT6), 443, 40000).l3();
    let icmp: Vec<(&str, Vec<u8>)> = vec![
        (
            "Fragmentation Needed quoting a flow from the VIP",
            ringlb_testkit::packet::eth(&icmp_error(ip("192.0.2.1"), ip(VIP4), 3, 4, 1400, &flow)),
        ),
        (
            "Packet Too Big quoting a flow from the VIP",
            ringlb_testkit::packet::eth(&icmp_error(
                ip("2001:db8:ffff::1"),
                ip(VIP6),
                2,
                0,
                1400,
                &flow6,
            )),
        ),
        ("an echo reply to the VIP", {
            let mut r = Echo::request(CLIENT4, VIP4);
            r.icmp_type = 0;
            r.bytes()
        }),
        ("an ICMPv6 echo reply to the VIP", {
            let mut r = Echo::request(CLIENT6, VIP6);
            r.icmp_type = 129;
            r.bytes()
        }),
        (
            "an echo request with IP options",
            with_ip_options(&Echo::request(CLIENT4, VIP4).bytes()),
        ),
        ("an echo request cut after 4 bytes of ICMP", {
            let mut f = Frame::tcp(ip(CLIENT4), ip(VIP4), 0x0800, 0);
            f.proto = 1;
            let mut b = f.bytes();
            b.truncate(14 + 20 + 4);
            b[14 + 2..14 + 4].copy_from_slice(&24u16.to_be_bytes());
            b[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
            let c = internet_checksum(0, &b[14..34]);
            b[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
            b
        }),
    ];
    for (what, f) in &icmp {
        assert_dropped(&dp, what, f, "drop_vip_icmp");
    }
    let other: Vec<(&str, Vec<u8>)> = vec![
        ("an IPv4 fragment", {
            let mut b = Frame::udp(ip(CLIENT4), ip(VIP4), 5, 53).bytes();
            b[14 + 6] |= 0x20; // MF (checksum not fixed: the program does not check it)
            b
        }),
        ("IPv6 hop-by-hop options", {
            let mut f = Frame::tcp(ip(CLIENT6), ip(VIP6), 1, 443);
            f.proto = 0;
            f.bytes()
        }),
        ("SCTP", {
            let mut f = Frame::tcp(ip(CLIENT4), ip(VIP4), 1, 80);
            f.proto = 132;
            f.bytes()
        }),
    ];
    for (what, f) in &other {
        assert_dropped(&dp, what, f, "drop_vip_other");
    }
    assert_eq!(counter(&dp, "icmp_echo"), 0);
    assert_eq!(counter(&dp, "pass_icmp"), 0);
}

#[test]
fn an_address_whose_last_vip_is_deleted_is_passed_again() {
    let Some(mut dp) = loaded() else { return };
    assert_replied(&dp, &Echo::request(CLIENT4, VIP4));
    let v443 = vip(VIP6, 443, Proto::Tcp);
    dp.apply(&state(vec![(v443, svc(&v443, &["2001:db8:1::1"], 0))]))
        .unwrap();
    let f = Echo::request(CLIENT4, VIP4).bytes();
    assert_passed(&dp, "echo to a deleted VIP", &f, "pass_icmp");
    let syn = Frame::tcp(ip(CLIENT4), ip(VIP4), 40000, 80).bytes();
    assert_passed(&dp, "SYN to a deleted VIP", &syn, "pass_not_vip");
    assert_replied(&dp, &Echo::request(CLIENT6, VIP6));
}
