//! BPF_PROG_TEST_RUN fixtures for the node programs: input frame, exact
//! expected frame, verdict and counters. Expected frames are built from
//! scratch by `ringlb_testkit::packet` with freshly computed checksums (never
//! copied from the program's output), and `verify_checksums` re-checks every
//! checksum of the output independently. Needs root; skips loudly otherwise.

mod support;
use support::*;

use ringlb_node::{Hook, Proto, abi::Stat};
use ringlb_testkit::packet::{
    Segment, TCP_ACK, TCP_SYN, eth, hex, ipip, l2_header, verify_checksums,
};

fn vip4(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip(VIP4), port)
}
fn vip6(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip(VIP6), port)
}
fn pod4(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip(POD4), port)
}
fn pod6(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip(POD6), port)
}

/// What the edge sends: `seg` to the VIP inside an outer header to `pod`.
fn tunnelled(seg: &Segment, edge: &str, pod: &str) -> Vec<u8> {
    eth(&ipip(ip(edge), ip(pod), &seg.l3()))
}

#[test]
fn abi_matches_object() {
    // load() opens every map through its typed Rust mirror: aya refuses a
    // key or value size that differs from node_abi.h's
    let Some(dp) = load() else { return };
    assert_eq!(dp.counters().unwrap().len(), Stat::ALL.len());
    assert_eq!(dp.programmed(), &services());
}

#[test]
fn ipv4_tcp_syn_is_decapsulated_and_translated_to_the_target_port() {
    let Some(dp) = load() else { return };
    let syn = Segment::tcp(sa(CLIENT4), vip4(80), TCP_SYN);
    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, POD4));
    assert_eq!(v, TC_ACT_OK);
    let want = Segment::tcp(sa(CLIENT4), pod4(8080), TCP_SYN).frame();
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    verify_checksums(&out).unwrap();
    assert_eq!(count(&dp, Stat::Decap4), 1);
    assert_eq!(count(&dp, Stat::Dnat), 1);
    assert_eq!(count(&dp, Stat::FlowNew), 1);
    assert_eq!(
        dp.flow(sa(CLIENT4), pod4(8080), Proto::Tcp).unwrap(),
        Some(vip4(80))
    );
    // the same flow again writes nothing
    run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, POD4));
    assert_eq!(count(&dp, Stat::FlowNew), 1);
}

#[test]
fn ipv6_udp_is_decapsulated_and_translated() {
    let Some(dp) = load() else { return };
    let q = Segment::udp(sa(CLIENT6), vip6(53), b"what is the answer?");
    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&q, EDGE6, POD6));
    assert_eq!(v, TC_ACT_OK);
    let want = Segment::udp(sa(CLIENT6), pod6(5353), b"what is the answer?").frame();
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    verify_checksums(&out).unwrap();
    assert_eq!(count(&dp, Stat::Decap6), 1);
    assert_eq!(
        dp.flow(sa(CLIENT6), pod6(5353), Proto::Udp).unwrap(),
        Some(vip6(53))
    );
}

#[test]
fn ipv6_tcp_with_payload_is_translated() {
    let Some(dp) = load() else { return };
    let mut seg = Segment::tcp(sa(CLIENT6), vip6(443), TCP_ACK);
    seg.payload = (0..200u8).collect();
    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&seg, EDGE6, POD6));
    assert_eq!(v, TC_ACT_OK);
    let mut want = Segment::tcp(sa(CLIENT6), pod6(8443), TCP_ACK);
    want.payload = seg.payload.clone();
    assert_eq!(out, want.frame());
    verify_checksums(&out).unwrap();
}

#[test]
fn ipv4_udp_without_checksum_keeps_it_zero() {
    let Some(dp) = load() else { return };
    let mut q = Segment::udp(sa(CLIENT4), vip4(53), b"q");
    q.udp_no_checksum = true;
    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&q, EDGE4, POD4));
    assert_eq!(v, TC_ACT_OK);
    let mut want = Segment::udp(sa(CLIENT4), pod4(5353), b"q");
    want.udp_no_checksum = true;
    assert_eq!(out, want.frame());
    assert_eq!(&out[14 + 20 + 6..14 + 20 + 8], &[0, 0]);
}

#[test]
fn ipv4_in_ipv6_changes_the_ethertype() {
    let Some(mut dp) = load() else { return };
    // a dual-stack pod: the edge tunnels VIP4 traffic to the pod's IPv6 address
    let mut s = services();
    s.pods.insert(ip(POD6));
    s.services.insert(
        ringlb_node::ServiceKey {
            tunnel_dst: ip(POD6),
            vip: ip(VIP4),
            port: 80,
            proto: Proto::Tcp,
        },
        ringlb_node::ServiceTarget {
            pod: ip(POD4),
            target_port: 8080,
        },
    );
    dp.apply(&s).unwrap();
    let syn = Segment::tcp(sa(CLIENT4), vip4(80), TCP_SYN);
    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE6, POD6));
    assert_eq!(
        v, TC_ACT_OK,
        "4-in-6 decap needs Linux 6.3 to change the family (bpf_skb_adjust_room)"
    );
    assert_eq!(out, Segment::tcp(sa(CLIENT4), pod4(8080), TCP_SYN).frame());
    assert_eq!(&out[12..14], &[0x08, 0x00]);
}

#[test]
fn reply_leaves_with_the_vip_as_source() {
    let Some(dp) = load() else { return };
    let syn = Segment::tcp(sa(CLIENT4), vip4(80), TCP_SYN);
    run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, POD4));
    let mut reply = Segment::tcp(pod4(8080), sa(CLIENT4), TCP_ACK);
    reply.payload = b"HTTP/1.0 200 OK\r\n\r\nhello".to_vec();
    let (v, out) = run(&dp, Hook::Egress, &reply.frame());
    assert_eq!(v, TC_ACT_OK);
    let mut want = Segment::tcp(vip4(80), sa(CLIENT4), TCP_ACK);
    want.payload = reply.payload.clone();
    assert_eq!(
        out,
        want.frame(),
        "\n{}\n--\n{}",
        hex(&out),
        hex(&want.frame())
    );
    verify_checksums(&out).unwrap();
    assert_eq!(count(&dp, Stat::ReplySnat), 1);
}

#[test]
fn ipv6_udp_reply_leaves_with_the_vip_as_source() {
    let Some(dp) = load() else { return };
    let q = Segment::udp(sa(CLIENT6), vip6(53), b"q");
    run(&dp, Hook::Ingress, &tunnelled(&q, EDGE6, POD6));
    let r = Segment::udp(pod6(5353), sa(CLIENT6), b"42");
    let (v, out) = run(&dp, Hook::Egress, &r.frame());
    assert_eq!(v, TC_ACT_OK);
    assert_eq!(out, Segment::udp(vip6(53), sa(CLIENT6), b"42").frame());
    verify_checksums(&out).unwrap();
}

/// A SYN-ACK from the pod with `options`; returns the frame after egress.
fn syn_ack(dp: &ringlb_node::NodeDatapath, v6: bool, options: Vec<u8>) -> Vec<u8> {
    let (client, vip, pod, edge, podip) = if v6 {
        (sa(CLIENT6), vip6(443), pod6(8443), EDGE6, POD6)
    } else {
        (sa(CLIENT4), vip4(80), pod4(8080), EDGE4, POD4)
    };
    run(
        dp,
        Hook::Ingress,
        &tunnelled(&Segment::tcp(client, vip, TCP_SYN), edge, podip),
    );
    let mut sa_ = Segment::tcp(pod, client, TCP_SYN | TCP_ACK);
    sa_.options = options;
    let (v, out) = run(dp, Hook::Egress, &sa_.frame());
    assert_eq!(v, TC_ACT_OK);
    verify_checksums(&out).unwrap();
    out
}

fn expect_syn_ack(v6: bool, options: Vec<u8>) -> Vec<u8> {
    let (client, vip) = if v6 {
        (sa(CLIENT6), vip6(443))
    } else {
        (sa(CLIENT4), vip4(80))
    };
    let mut s = Segment::tcp(vip, client, TCP_SYN | TCP_ACK);
    s.options = options;
    s.frame()
}

/// Linux's SYN-ACK options: MSS, SACK permitted, timestamps, NOP, window scale.
fn linux_opts(mss: u16) -> Vec<u8> {
    let m = mss.to_be_bytes();
    vec![
        2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 3, 3, 7,
    ]
}

#[test]
fn syn_ack_mss_is_clamped_to_fit_the_tunnel() {
    let Some(dp) = load() else { return };
    let out = syn_ack(&dp, false, linux_opts(1460));
    assert_eq!(out, expect_syn_ack(false, linux_opts(1440)));
    assert_eq!(count(&dp, Stat::MssClamped), 1);
    let out = syn_ack(&dp, true, linux_opts(1440));
    assert_eq!(out, expect_syn_ack(true, linux_opts(1400)));
    assert_eq!(count(&dp, Stat::MssClamped), 2);
}

#[test]
fn mss_at_an_odd_offset_is_clamped_with_a_right_checksum() {
    let Some(dp) = load() else { return };
    // NOP, MSS 1460, NOP, NOP, NOP: the value sits at TCP offset 23
    let opts = vec![1, 2, 4, 0x05, 0xb4, 1, 1, 1];
    let out = syn_ack(&dp, false, opts);
    assert_eq!(
        out,
        expect_syn_ack(false, vec![1, 2, 4, 0x05, 0xa0, 1, 1, 1])
    );
}

#[test]
fn a_smaller_mss_is_never_raised() {
    let Some(dp) = load() else { return };
    let out = syn_ack(&dp, false, linux_opts(1200));
    assert_eq!(out, expect_syn_ack(false, linux_opts(1200)));
    // no MSS option at all: nothing added
    let out = syn_ack(&dp, false, vec![1, 1, 4, 2]);
    assert_eq!(out, expect_syn_ack(false, vec![1, 1, 4, 2]));
    assert_eq!(count(&dp, Stat::MssClamped), 0);
    assert_eq!(count(&dp, Stat::ReplySnat), 2);
}

#[test]
fn packets_that_are_not_ours_pass_ingress_untouched() {
    let Some(dp) = load() else { return };
    // plain TCP to a pod (pod-to-pod, or a client of a NodePort)
    let mut plain = Segment::tcp(sa("10.2.1.9:5555"), pod4(8080), TCP_ACK);
    plain.payload = b"x".to_vec();
    assert_untouched(&dp, Hook::Ingress, &plain.frame());
    // IPIP to an address that is no local pod
    let syn = Segment::tcp(sa(CLIENT4), vip4(80), TCP_SYN);
    assert_untouched(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, "10.2.0.99"));
    assert_eq!(count(&dp, Stat::NotLocal), 1);
    // IPIP to a local pod for a port it does not serve
    let other = Segment::tcp(sa(CLIENT4), vip4(81), TCP_SYN);
    assert_untouched(&dp, Hook::Ingress, &tunnelled(&other, EDGE4, POD4));
    assert_eq!(count(&dp, Stat::NoService), 1);
    // ARP
    let mut arp = l2_header([0xff; 6], [2, 0, 0, 0, 0, 2], None, 0x0806);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[0u8; 20]);
    assert_untouched(&dp, Hook::Ingress, &arp);
    assert_eq!(count(&dp, Stat::Dnat), 0);
}

#[test]
fn traffic_without_a_flow_passes_egress_untouched() {
    let Some(dp) = load() else { return };
    // a reply-shaped packet with no flow (the pod's own connection, or a
    // direct pod-to-pod answer)
    let r = Segment::tcp(pod4(8080), sa(CLIENT4), TCP_ACK);
    assert_untouched(&dp, Hook::Egress, &r.frame());
    let p2p = Segment::udp(pod6(5353), sa("[2001:db8:2::6]:1234"), b"hi");
    assert_untouched(&dp, Hook::Egress, &p2p.frame());
    // after a VIP flow exists, another client port of the same client is
    // still not touched
    let syn = Segment::tcp(sa(CLIENT4), vip4(80), TCP_SYN);
    run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, POD4));
    let r2 = Segment::tcp(pod4(8080), sa("192.0.2.7:40001"), TCP_ACK);
    assert_untouched(&dp, Hook::Egress, &r2.frame());
    assert_eq!(count(&dp, Stat::ReplySnat), 0);
}

#[test]
fn a_plain_syn_forgets_a_stale_vip_flow() {
    let Some(dp) = load() else { return };
    let syn = Segment::tcp(sa(CLIENT4), vip4(80), TCP_SYN);
    run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, POD4));
    assert!(
        dp.flow(sa(CLIENT4), pod4(8080), Proto::Tcp)
            .unwrap()
            .is_some()
    );
    // the same client port now connects to the pod directly
    let direct = Segment::tcp(sa(CLIENT4), pod4(8080), TCP_SYN);
    assert_untouched(&dp, Hook::Ingress, &direct.frame());
    assert_eq!(count(&dp, Stat::FlowForget), 1);
    assert!(
        dp.flow(sa(CLIENT4), pod4(8080), Proto::Tcp)
            .unwrap()
            .is_none()
    );
    let r = Segment::tcp(pod4(8080), sa(CLIENT4), TCP_SYN | TCP_ACK);
    assert_untouched(&dp, Hook::Egress, &r.frame());
}
