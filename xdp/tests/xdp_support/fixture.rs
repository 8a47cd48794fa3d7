//! What the BPF_PROG_TEST_RUN tests share: verdicts, a fixed next hop, the
//! production object loaded with it, a service whose whole ring points at one
//! backend, running one frame, and the exact frame an encapsulation must give.

use std::net::IpAddr;

use ringlb_nexthop::{NextHop, Resolver, StaticResolver};
use ringlb_testkit::packet::{Frame, ip_header, l2_header};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};

use super::{Netns, in_netns, require_root};

pub(crate) const XDP_DROP: u32 = 1;
pub(crate) const XDP_PASS: u32 = 2;
pub(crate) const XDP_TX: u32 = 3;
pub(crate) const XDP_REDIRECT: u32 = 4;

/// The next hop every backend gets unless a test says otherwise: on the
/// ingress port (ifindex 0), untagged.
pub(crate) const NH: NextHop = NextHop {
    ifindex: 0,
    smac: [0x02, 0xee, 0, 0, 0, 0x01],
    dmac: [0x02, 0xee, 0, 0, 0, 0x02],
    vlan: None,
};

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A service whose whole ring (13 slots) points at `backends[target]`.
pub(crate) fn svc(v: &Vip, backends: &[&str], target: u32) -> ServiceEntry {
    ServiceEntry::new(
        v,
        backends.iter().map(|b| ip(b)).collect(),
        vec![target; 13],
    )
    .unwrap()
}

pub(crate) fn state(entries: Vec<(Vip, ServiceEntry)>) -> DesiredState {
    DesiredState {
        services: entries.into_iter().collect(),
    }
}

/// One test run of `frame`: (verdict, output frame).
pub(crate) fn run(dp: &XdpDatapath, frame: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 128];
    let (verdict, len, _) = dp.test_run(frame, &mut out, 1).expect("test run");
    out.truncate(len);
    (verdict, out)
}

/// A global counter (`abi::Stat` label), summed over CPUs.
pub(crate) fn counter(dp: &XdpDatapath, label: &str) -> u64 {
    let c = dp.read_counters().unwrap();
    c.global.iter().find(|(l, _)| *l == label).unwrap().1
}

/// The production object with outer sources 10.0.0.11 (and 2001:db8::11).
pub(crate) fn opts(mtu: u32, src6: bool) -> XdpOptions {
    XdpOptions {
        pin_dir: None,
        src4: Some("10.0.0.11".parse().unwrap()),
        src6: src6.then(|| "2001:db8::11".parse().unwrap()),
        mtu,
        fib_fallback: false,
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    }
}

/// Loads it with every backend on `NH`; `None` (after a loud SKIP) without root.
pub(crate) fn load(mtu: u32, src6: bool) -> Option<XdpDatapath> {
    load_with(&opts(mtu, src6))
}

/// [`load`] with options of the test's own (built from [`opts`]).
pub(crate) fn load_with(o: &XdpOptions) -> Option<XdpDatapath> {
    load_resolving(o, Box::new(StaticResolver::everywhere(NH)))
}

/// [`load_with`] and a resolver of the test's own.
pub(crate) fn load_resolving(o: &XdpOptions, resolver: Box<dyn Resolver>) -> Option<XdpDatapath> {
    if !require_root("loading the xdp fixtures' BPF programs") {
        return None;
    }
    Some(XdpDatapath::load(o, resolver).expect("loading xdp_lb.o"))
}

/// Keeps `dp`'s program in the kernel's XDP dispatcher until the returned
/// namespace is dropped, by attaching it natively to a veth (down: no
/// packet reaches it) in a namespace of its own. A loop of many test runs
/// wants this: Linux 5.10 adds the program to the dispatcher and takes it
/// out again around every BPF_PROG_TEST_RUN (`bpf_prog_change_xdp`), which
/// rebuilds the dispatcher twice; under qemu a run cost 370 µs that way
/// against 38 µs with the program attached. Later kernels do it only for a
/// repeat above 1 (6.1: 39 µs either way).
pub(crate) fn keep_in_xdp_dispatcher(dp: &mut XdpDatapath) -> Netns {
    let ns = Netns::new(&format!("rlbdisp{}", std::process::id()));
    ns.exec(&[
        "ip", "link", "add", "name", "disp0", "type", "veth", "peer", "name", "disp1",
    ])
    .unwrap();
    in_netns(&ns.0, || dp.attach("disp0", AttachMode::Native)).expect("native XDP on a veth");
    ns
}

/// Whether this kernel's verifier has BPF atomic OR, by its release (Linux
/// 5.12): what the loader's probe must find.
pub(crate) fn kernel_has_atomic_or() -> bool {
    use ringlb_ops::kernel::{Version, running_release};
    let release = running_release().expect("kernel release");
    Version::parse(&release).expect("a version in the release") >= Version::new(5, 12)
}

/// Fails, with the words kernels/src/report.rs expects below Linux 5.12, when
/// the loaded program does not read the flow filter (a kernel without atomic
/// OR gets the build without it).
pub(crate) fn require_flow_filter(dp: &XdpDatapath) {
    assert!(
        dp.flow_filter(),
        "the flow filter needs BPF atomic OR (Linux 5.12): this kernel got the build without it"
    );
}

pub(crate) fn vip(addr: &str, port: u16, proto: Proto) -> Vip {
    Vip {
        addr: ip(addr),
        port,
        proto,
    }
}

pub(crate) fn vip4() -> Vip {
    vip("10.100.0.1", 80, Proto::Tcp)
}

/// The addresses of the ICMP fixtures (xdp_ptb.rs, xdp_vip_addr.rs).
pub(crate) const CLIENT4: &str = "192.0.2.7";
pub(crate) const CLIENT6: &str = "2001:db8:ffff::9";
pub(crate) const VIP4: &str = "10.100.0.1";
pub(crate) const VIP6: &str = "2001:db8:100::1";

/// The ICMP fixtures' services: VIP4:80/TCP and VIP4:53/UDP -> an IPv4
/// backend, VIP6:443/TCP -> an IPv6 backend, and `more` (a VIP, its backend).
pub(crate) fn icmp_services(more: (Vip, &str)) -> DesiredState {
    let v80 = vip(VIP4, 80, Proto::Tcp);
    let v53 = vip(VIP4, 53, Proto::Udp);
    let v443 = vip(VIP6, 443, Proto::Tcp);
    let (v, backend) = more;
    state(vec![
        (v80, svc(&v80, &["10.1.0.1"], 0)),
        (v53, svc(&v53, &["10.1.0.1"], 0)),
        (v443, svc(&v443, &["2001:db8:1::1"], 0)),
        (v, svc(&v, &[backend], 0)),
    ])
}

/// [`load`] (with the IPv6 source) and `desired` applied.
pub(crate) fn load_applied(mtu: u32, desired: &DesiredState) -> Option<XdpDatapath> {
    let mut dp = load(mtu, true)?;
    dp.apply(desired).unwrap();
    Some(dp)
}

/// Expected output: our L2 (next-hop MACs), the outer header, the inner L3.
pub(crate) fn encapped(f: &Frame, outer_src: &str, backend: &str, flow_label: u32) -> Vec<u8> {
    let inner = f.l3();
    let (ethertype, proto) = match (ip(backend).is_ipv4(), f.src.is_ipv4()) {
        (true, true) => (0x0800, 4),
        (true, false) => (0x0800, 41),
        (false, true) => (0x86dd, 4),
        (false, false) => (0x86dd, 41),
    };
    let df = if f.src.is_ipv4() { f.df } else { true };
    let mut v = l2_header(NH.dmac, NH.smac, f.vlan, ethertype);
    v.extend(ip_header(
        ip(outer_src),
        ip(backend),
        proto,
        inner.len(),
        f.tos,
        df,
        64,
        flow_label,
    ));
    v.extend(inner);
    v
}
