//! BPF_PROG_TEST_RUN fixtures for ICMP errors on the reply path: the error a
//! pod (or a router on the way to it) sends about a translated flow must
//! reach the client quoting the packet the client sent (client -> VIP:port),
//! from the VIP when the pod itself sent it. Expected frames are built from
//! scratch with fresh checksums. Needs root; skips loudly otherwise.

mod support;
use support::*;

use std::net::SocketAddr;

use ringlb_node::{Hook, abi::Stat};
use ringlb_testkit::packet::{
    Segment, TCP_ACK, TCP_SYN, eth, hex, icmp_error, ipip, verify_checksums,
};

fn at(ipaddr: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(ipaddr), port)
}

/// Sends `seg` (client -> VIP) through the ingress, creating its flow.
fn open_flow(dp: &ringlb_node::NodeDatapath, seg: &Segment, edge: &str, pod: &str) {
    let (v, _) = run(dp, Hook::Ingress, &eth(&ipip(ip(edge), ip(pod), &seg.l3())));
    assert_eq!(v, TC_ACT_OK);
}

fn check(dp: &ringlb_node::NodeDatapath, sent: Vec<u8>, want: Vec<u8>) {
    let (v, out) = run(dp, Hook::Egress, &eth(&sent));
    assert_eq!(v, TC_ACT_OK);
    let want = eth(&want);
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    verify_checksums(&out).unwrap();
}

#[test]
fn ipv4_port_unreachable_from_the_pod_comes_from_the_vip() {
    let Some(dp) = load() else { return };
    let client = sa(CLIENT4);
    open_flow(&dp, &Segment::udp(client, at(VIP4, 53), b"q"), EDGE4, POD4);
    let seen_by_pod = Segment::udp(client, at(POD4, 5353), b"q").l3();
    let sent = icmp_error(ip(POD4), client.ip(), 3, 3, 0, &seen_by_pod);
    let as_sent_by_client = Segment::udp(client, at(VIP4, 53), b"q").l3();
    let want = icmp_error(ip(VIP4), client.ip(), 3, 3, 0, &as_sent_by_client);
    check(&dp, sent, want);
    assert_eq!(count(&dp, Stat::IcmpXlate), 1);
}

#[test]
fn ipv4_frag_needed_from_the_node_keeps_its_source_and_fixes_the_quote() {
    let Some(dp) = load() else { return };
    let client = sa(CLIENT4);
    let mut seg = Segment::tcp(client, at(VIP4, 80), TCP_ACK);
    seg.payload = vec![7; 1400];
    open_flow(
        &dp,
        &Segment::tcp(client, at(VIP4, 80), TCP_SYN),
        EDGE4,
        POD4,
    );
    // the node (10.0.0.1) could not forward a full-size segment to the pod;
    // it quotes the IP header + 8 bytes (ports and sequence number: no TCP
    // checksum in the quote)
    let mut seen = seg.clone();
    seen.dst = at(POD4, 8080);
    let sent = icmp_error(ip("10.0.0.1"), client.ip(), 3, 4, 1400, &seen.l3()[..28]);
    let want = icmp_error(ip("10.0.0.1"), client.ip(), 3, 4, 1400, &seg.l3()[..28]);
    check(&dp, sent, want);
}

#[test]
fn ipv6_packet_too_big_from_the_pod_comes_from_the_vip() {
    let Some(dp) = load() else { return };
    let client = sa(CLIENT6);
    let mut seg = Segment::tcp(client, at(VIP6, 443), TCP_ACK);
    seg.payload = vec![1; 64];
    open_flow(
        &dp,
        &Segment::tcp(client, at(VIP6, 443), TCP_SYN),
        EDGE6,
        POD6,
    );
    let mut seen = seg.clone();
    seen.dst = at(POD6, 8443);
    let sent = icmp_error(ip(POD6), client.ip(), 2, 0, 1280, &seen.l3());
    let want = icmp_error(ip(VIP6), client.ip(), 2, 0, 1280, &seg.l3());
    check(&dp, sent, want);
    assert_eq!(count(&dp, Stat::IcmpXlate), 1);
}

#[test]
fn ipv6_port_unreachable_from_the_pod_comes_from_the_vip() {
    let Some(dp) = load() else { return };
    let client = sa(CLIENT6);
    open_flow(&dp, &Segment::udp(client, at(VIP6, 53), b"q?"), EDGE6, POD6);
    let seen = Segment::udp(client, at(POD6, 5353), b"q?").l3();
    let sent = icmp_error(ip(POD6), client.ip(), 1, 4, 0, &seen);
    let want = icmp_error(
        ip(VIP6),
        client.ip(),
        1,
        4,
        0,
        &Segment::udp(client, at(VIP6, 53), b"q?").l3(),
    );
    check(&dp, sent, want);
}

#[test]
fn icmp_without_a_flow_and_echo_pass_untouched() {
    let Some(dp) = load() else { return };
    let client = sa(CLIENT4);
    // an error about a connection the pod opened itself
    let own = Segment::udp(at(POD4, 5353), client, b"q").l3();
    let e = icmp_error(ip(POD4), client.ip(), 3, 3, 0, &own);
    assert_untouched(&dp, Hook::Egress, &eth(&e));
    assert_eq!(count(&dp, Stat::IcmpNoFlow), 1);
    // echo request (type 8) is no error
    let mut echo = icmp_error(ip(POD4), client.ip(), 8, 0, 0x0001_0001, b"ping");
    // icmp_error computed the checksum over type 8 already
    verify_checksums(&eth(&echo)).unwrap();
    assert_untouched(&dp, Hook::Egress, &eth(&echo));
    echo.truncate(20 + 4); // truncated ICMP: still untouched
    assert_untouched(&dp, Hook::Egress, &eth(&echo));
}
