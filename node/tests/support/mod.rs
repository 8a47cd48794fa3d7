//! What the node fixture tests share: the datapath loaded with a small
//! service set, running one frame through a hook, and addresses.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

use ringlb_node::{Hook, NodeDatapath, NodeOptions, NodeState, Proto, abi::Stat};

pub(crate) use ringlb_testkit::tier::require_root;

pub(crate) const TC_ACT_OK: u32 = 0;
pub(crate) const TC_ACT_SHOT: u32 = 2;

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
pub(crate) fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub(crate) const EDGE4: &str = "10.0.0.11";
pub(crate) const EDGE6: &str = "2001:db8::11";
pub(crate) const POD4: &str = "10.2.0.5";
pub(crate) const POD6: &str = "2001:db8:2::5";
pub(crate) const VIP4: &str = "10.100.0.1";
pub(crate) const VIP6: &str = "2001:db8:100::1";
pub(crate) const CLIENT4: &str = "192.0.2.7:40000";
pub(crate) const CLIENT6: &str = "[2001:db8:ffff::9]:41000";

/// VIP4:80/TCP -> POD4:8080, VIP4:53/UDP -> POD4:5353, and the same for
/// VIP6 -> POD6 (443 -> 8443 TCP, 53 -> 5353 UDP).
pub(crate) fn services() -> NodeState {
    let mut s = NodeState::default();
    s.add_backend(ip(VIP4), 80, Proto::Tcp, ip(POD4), 8080)
        .add_backend(ip(VIP4), 53, Proto::Udp, ip(POD4), 5353)
        .add_backend(ip(VIP6), 443, Proto::Tcp, ip(POD6), 8443)
        .add_backend(ip(VIP6), 53, Proto::Udp, ip(POD6), 5353);
    s
}

/// The production object, unpinned, MSS 1440/1400, with [`services`];
/// `None` (after a loud SKIP) without root.
pub(crate) fn load() -> Option<NodeDatapath> {
    let opts = NodeOptions {
        pin_dir: None,
        ..NodeOptions::default()
    };
    load_with(&opts, &services())
}

/// The production object loaded with `opts`, `state` applied; `None` (after a
/// loud SKIP) without root.
pub(crate) fn load_with(opts: &NodeOptions, state: &NodeState) -> Option<NodeDatapath> {
    if !require_root("loading the node fixtures' BPF programs") {
        return None;
    }
    let mut dp = NodeDatapath::load(opts).expect("loading node.o");
    dp.apply(state).expect("writing the node state");
    Some(dp)
}

/// One test run: (verdict, frame out).
pub(crate) fn run(dp: &NodeDatapath, hook: Hook, frame: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 256];
    let (verdict, len, _) = dp.test_run(hook, frame, &mut out, 1).expect("test run");
    out.truncate(len);
    (verdict, out)
}

pub(crate) fn count(dp: &NodeDatapath, s: Stat) -> u64 {
    dp.counter(s).unwrap()
}

/// Asserts a frame went through unchanged with TC_ACT_OK.
pub(crate) fn assert_untouched(dp: &NodeDatapath, hook: Hook, frame: &[u8]) {
    let (v, out) = run(dp, hook, frame);
    assert_eq!(v, TC_ACT_OK, "verdict");
    assert_eq!(out, frame, "not one byte may change");
}
