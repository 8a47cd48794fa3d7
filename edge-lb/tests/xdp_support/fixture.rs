//! What the BPF_PROG_TEST_RUN tests share: verdicts, a fixed next hop, a
//! service whose whole ring points at one backend, and running one frame.

use std::net::IpAddr;

use ringlb_edge::datapath::{DesiredState, ServiceEntry, Vip, nexthop::NextHop, xdp::XdpDatapath};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// The next hop every backend gets unless a test says otherwise: on the
/// ingress port (ifindex 0), untagged.
pub const NH: NextHop = NextHop {
    ifindex: 0,
    smac: [0x02, 0xee, 0, 0, 0, 0x01],
    dmac: [0x02, 0xee, 0, 0, 0, 0x02],
    vlan: None,
};

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A service whose whole ring (13 slots) points at `backends[target]`.
pub fn svc(v: &Vip, backends: &[&str], target: u32) -> ServiceEntry {
    ServiceEntry::new(
        v,
        backends.iter().map(|b| ip(b)).collect(),
        vec![target; 13],
    )
    .unwrap()
}

pub fn state(entries: Vec<(Vip, ServiceEntry)>) -> DesiredState {
    DesiredState {
        services: entries.into_iter().collect(),
    }
}

/// One test run of `frame`: (verdict, output frame).
pub fn run(dp: &XdpDatapath, frame: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 128];
    let (verdict, len, _) = dp.test_run(frame, &mut out, 1).expect("test run");
    out.truncate(len);
    (verdict, out)
}

/// A global counter (`abi::Stat` label), summed over CPUs.
pub fn counter(dp: &XdpDatapath, label: &str) -> u64 {
    let c = dp.read_counters().unwrap();
    c.global.iter().find(|(l, _)| *l == label).unwrap().1
}
