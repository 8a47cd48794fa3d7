//! Who may send to a node: with the source check on (`NodeOptions::check_source`,
//! as `ringlb-edge node` loads it), a tunnel to a local pod is decapsulated only
//! when its outer source is in `edges` (the edges' node addresses); from any other
//! host it is dropped and counted (`drop_source`). BPF_PROG_TEST_RUN fixtures with
//! exact frames, IPv4 and IPv6. Needs root; skips loudly otherwise.

mod support;
use support::*;

use ringlb_node::{Hook, NodeDatapath, NodeOptions, NodeState, Proto, abi::Stat};
use ringlb_testkit::packet::{Segment, TCP_SYN, eth, hex, ipip, verify_checksums};

/// A host that can reach the node but is no edge.
const STRANGER4: &str = "10.0.0.99";
const STRANGER6: &str = "2001:db8::99";

fn with_edges(edges: &[&str]) -> NodeState {
    let mut s = services();
    s.edges = edges.iter().map(|e| ip(e)).collect();
    s
}

/// The production object with the source check on, [`services`] and the edges
/// EDGE4 and EDGE6.
fn load_checking() -> Option<NodeDatapath> {
    let opts = NodeOptions {
        pin_dir: None,
        check_source: true,
        ..NodeOptions::default()
    };
    load_with(&opts, &with_edges(&[EDGE4, EDGE6]))
}

fn tunnelled(seg: &Segment, from: &str, pod: &str) -> Vec<u8> {
    eth(&ipip(ip(from), ip(pod), &seg.l3()))
}

fn at(ip_: &str, port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip(ip_), port)
}

#[test]
fn ipv4_from_an_edge_is_decapsulated_and_from_another_host_dropped() {
    let Some(dp) = load_checking() else { return };
    let syn = Segment::tcp(sa(CLIENT4), at(VIP4, 80), TCP_SYN);

    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&syn, EDGE4, POD4));
    assert_eq!(v, TC_ACT_OK);
    let want = Segment::tcp(sa(CLIENT4), at(POD4, 8080), TCP_SYN).frame();
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    verify_checksums(&out).unwrap();
    assert_eq!(count(&dp, Stat::Decap4), 1);

    // The same packet from a host that is no edge: dropped, counted, and no flow
    // entry for the reply path.
    let other = Segment::tcp(sa("192.0.2.8:40001"), at(VIP4, 80), TCP_SYN);
    let (v, _) = run(&dp, Hook::Ingress, &tunnelled(&other, STRANGER4, POD4));
    assert_eq!(v, TC_ACT_SHOT);
    assert_eq!(count(&dp, Stat::DropSource), 1);
    assert_eq!(count(&dp, Stat::Decap4), 1, "nothing more decapsulated");
    assert_eq!(
        dp.flow(sa("192.0.2.8:40001"), at(POD4, 8080), Proto::Tcp)
            .unwrap(),
        None
    );
}

#[test]
fn ipv6_from_an_edge_is_decapsulated_and_from_another_host_dropped() {
    let Some(dp) = load_checking() else { return };
    let q = Segment::udp(sa(CLIENT6), at(VIP6, 53), b"what is the answer?");

    let (v, out) = run(&dp, Hook::Ingress, &tunnelled(&q, EDGE6, POD6));
    assert_eq!(v, TC_ACT_OK);
    let want = Segment::udp(sa(CLIENT6), at(POD6, 5353), b"what is the answer?").frame();
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    verify_checksums(&out).unwrap();
    assert_eq!(count(&dp, Stat::Decap6), 1);

    let (v, _) = run(&dp, Hook::Ingress, &tunnelled(&q, STRANGER6, POD6));
    assert_eq!(v, TC_ACT_SHOT);
    assert_eq!(count(&dp, Stat::DropSource), 1);
    assert_eq!(count(&dp, Stat::Decap6), 1);
}

#[test]
fn an_edge_that_leaves_is_refused_from_the_next_packet() {
    let Some(mut dp) = load_checking() else {
        return;
    };
    let syn = Segment::tcp(sa(CLIENT4), at(VIP4, 80), TCP_SYN);
    let frame = tunnelled(&syn, EDGE4, POD4);
    assert_eq!(run(&dp, Hook::Ingress, &frame).0, TC_ACT_OK);
    dp.apply(&with_edges(&[EDGE6])).unwrap();
    assert_eq!(run(&dp, Hook::Ingress, &frame).0, TC_ACT_SHOT);
    assert_eq!(count(&dp, Stat::DropSource), 1);
    dp.apply(&with_edges(&[EDGE4, EDGE6])).unwrap();
    assert_eq!(run(&dp, Hook::Ingress, &frame).0, TC_ACT_OK);
}

#[test]
fn tunnels_to_addresses_that_are_no_local_pod_are_left_alone() {
    // A CNI's own IPIP between nodes (outer destination: a node, not a pod) from
    // any source passes untouched, the check applies only to ringlb's tunnels.
    let Some(dp) = load_checking() else { return };
    let seg = Segment::tcp(sa(CLIENT4), at("10.244.1.9", 80), TCP_SYN);
    let frame = tunnelled(&seg, STRANGER4, "10.0.0.21");
    assert_untouched(&dp, Hook::Ingress, &frame);
    assert_eq!(count(&dp, Stat::NotLocal), 1);
    assert_eq!(count(&dp, Stat::DropSource), 0);
}

#[test]
fn without_the_check_any_source_is_decapsulated() {
    // What tests and tools that load the library without the agent get.
    let Some(dp) = load() else { return };
    let syn = Segment::tcp(sa(CLIENT4), at(VIP4, 80), TCP_SYN);
    let (v, _) = run(&dp, Hook::Ingress, &tunnelled(&syn, STRANGER4, POD4));
    assert_eq!(v, TC_ACT_OK);
    assert_eq!(count(&dp, Stat::Decap4), 1);
    assert_eq!(count(&dp, Stat::DropSource), 0);
}
