//! A backend on this node (`BE_F_LOCAL`) by BPF_PROG_TEST_RUN, exact bytes
//! (root; skips otherwise): the frame is encapsulated to the pod like any
//! other, keeps the L2 header it came in with (its MACs, its VLAN tag) and is
//! passed (XDP_PASS) to the node's stack, where the node agent decapsulates
//! it; `local` counts it. A pod elsewhere on the same VIP still leaves by
//! XDP_TX with its next hop's L2 header.

mod xdp_support;

use ringlb_nexthop::{LocalPods, StaticResolver, WithLocalPods};
use ringlb_testkit::packet::{Frame, ip_header, l2_header};
use ringlb_xdp::{Datapath, xdp::XdpDatapath};
use xdp_support::fixture::*;

const LOCAL_POD: &str = "10.1.0.5";
const OTHER_POD: &str = "10.2.0.5";

fn load_local() -> Option<XdpDatapath> {
    let local = LocalPods::default();
    local.set([ip(LOCAL_POD)].into());
    let resolver = WithLocalPods::new(StaticResolver::everywhere(NH), local);
    load_resolving(&opts(1500, false), Box::new(resolver))
}

/// The input frame's own L2 header, the outer IPv4 header to the pod, the
/// inner packet.
fn passed(f: &Frame) -> Vec<u8> {
    let inner = f.l3();
    let mut v = l2_header(f.dst_mac, f.src_mac, f.vlan, 0x0800);
    v.extend(ip_header(
        ip("10.0.0.11"),
        ip(LOCAL_POD),
        4,
        inner.len(),
        f.tos,
        f.df,
        64,
        0,
    ));
    v.extend(inner);
    v
}

#[test]
fn a_pod_on_this_node_is_passed_up_with_the_frames_own_l2_header() {
    let Some(mut dp) = load_local() else { return };
    let v = vip4();
    // slot 0 of both VIPs' rings: the local pod for :80, the other for :81
    let other = vip("10.100.0.1", 81, ringlb_xdp::Proto::Tcp);
    dp.apply(&state(vec![
        (v, svc(&v, &[LOCAL_POD, OTHER_POD], 0)),
        (other, svc(&other, &[LOCAL_POD, OTHER_POD], 1)),
    ]))
    .unwrap();

    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_PASS);
    assert_eq!(
        out,
        passed(&f),
        "untagged: same MACs, outer header to the pod"
    );
    assert_eq!(counter(&dp, "local"), 1);
    assert_eq!(counter(&dp, "tx"), 0);

    // a tagged frame keeps its tag (the node's VLAN device takes it up)
    let tagged = Frame {
        vlan: Some(100),
        ..Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40001, 80)
    };
    let (verdict, out) = run(&dp, &tagged.bytes());
    assert_eq!(verdict, XDP_PASS);
    assert_eq!(out, passed(&tagged), "tagged: the tag kept");
    assert_eq!(counter(&dp, "local"), 2);

    // the other pod of the same node's VIPs: its next hop, XDP_TX
    let g = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40002, 81);
    let (verdict, out) = run(&dp, &g.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, encapped(&g, "10.0.0.11", OTHER_POD, 0));
    assert_eq!((counter(&dp, "local"), counter(&dp, "tx")), (2, 1));
}
