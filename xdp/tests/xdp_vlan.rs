//! BPF_PROG_TEST_RUN fixtures for the egress L2 header: the next hop decides
//! it, not the ingress frame. A next hop behind a VLAN device (resolved to its
//! parent port plus the tag) gets its tag pushed on an untagged frame or
//! written over the ingress tag; an untagged next hop gets any ingress tag
//! stripped. XDP_TX when the next hop is on the ingress port (ifindex 0 in
//! these static fixtures), bpf_redirect otherwise. Exact output bytes. Needs
//! root (BPF); skips loudly otherwise.

mod xdp_support;
use xdp_support::fixture::*;

use std::net::IpAddr;

use ringlb_nexthop::{NextHop, StaticResolver, Vlan, VlanProtocol};
use ringlb_testkit::packet::{Frame, ip_header, l2_header};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{XdpDatapath, XdpObject, XdpOptions},
};

fn dot1q(id: u16) -> Option<Vlan> {
    Some(Vlan {
        id,
        protocol: VlanProtocol::Dot1Q,
    })
}

/// A datapath whose every backend resolves to `nh`, with one TCP VIP
/// 10.100.0.7:80 -> 10.1.0.7.
fn load(nh: NextHop) -> Option<XdpDatapath> {
    load_object(nh, XdpObject::Production)
}

fn load_object(nh: NextHop, object: XdpObject) -> Option<XdpDatapath> {
    let o = XdpOptions {
        object,
        ..opts(1500, true)
    };
    let mut dp = load_resolving(&o, Box::new(StaticResolver::everywhere(nh)))?;
    let v = Vip {
        addr: ip("10.100.0.7"),
        port: 0, // the port-0 wildcard matches too
        proto: Proto::Tcp,
    };
    let e = ServiceEntry::new(&v, vec![ip("10.1.0.7")], vec![0; 13]).unwrap();
    dp.apply(&DesiredState {
        services: [(v, e)].into_iter().collect(),
    })
    .unwrap();
    Some(dp)
}

/// Expected output: the next hop's MACs, `tag` (TPID, TCI) or none, the outer
/// IPv4 header 10.0.0.11 -> 10.1.0.7, the inner packet unchanged.
fn expected(f: &Frame, tag: Option<(u16, u16)>) -> Vec<u8> {
    let inner = f.l3();
    let mut v = l2_header(NH.dmac, NH.smac, None, 0x0800);
    if let Some((tpid, tci)) = tag {
        v.truncate(12);
        v.extend_from_slice(&tpid.to_be_bytes());
        v.extend_from_slice(&tci.to_be_bytes());
        v.extend_from_slice(&0x0800u16.to_be_bytes());
    }
    v.extend(ip_header(
        ip("10.0.0.11"),
        ip("10.1.0.7"),
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

fn frame(vlan: Option<u16>, sport: u16) -> Frame {
    let mut f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.7"), sport, 8443);
    f.vlan = vlan;
    f
}

#[test]
fn untagged_in_tagged_out_pushes_the_next_hops_tag() {
    let Some(dp) = load(NextHop {
        vlan: dot1q(100),
        ..NH
    }) else {
        return;
    };
    let f = frame(None, 40000);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, expected(&f, Some((0x8100, 100))));
    assert_eq!(out.len(), f.bytes().len() + 4 + 20, "tag and outer header");
    assert_eq!(counter(&dp, "tx"), 1);
}

#[test]
fn tagged_in_other_vid_out_rewrites_the_tag() {
    let Some(dp) = load(NextHop {
        vlan: dot1q(200),
        ..NH
    }) else {
        return;
    };
    // ingress PCP 5 on VLAN 100: the egress tag is the next hop's, PCP 0
    let f = frame(Some(0xa064), 40001);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, expected(&f, Some((0x8100, 200))));
    assert_eq!(out.len(), f.bytes().len() + 20, "only the outer header");
}

#[test]
fn tagged_in_same_vid_out_is_xdp_tx_with_the_tag() {
    let Some(dp) = load(NextHop {
        vlan: dot1q(100),
        ..NH
    }) else {
        return;
    };
    let f = frame(Some(100), 40002);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, expected(&f, Some((0x8100, 100))));
    assert_eq!(&out[12..16], &[0x81, 0x00, 0x00, 0x64]);
    assert_eq!(counter(&dp, "redirect"), 0);
}

#[test]
fn tagged_in_untagged_out_strips_the_tag() {
    let Some(dp) = load(NH) else {
        return;
    };
    let f = frame(Some(100), 40003);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, expected(&f, None));
    assert_eq!(
        out.len(),
        f.bytes().len() - 4 + 20,
        "tag gone, outer header"
    );
}

#[test]
fn an_8021ad_next_hop_gets_tpid_88a8() {
    let Some(dp) = load(NextHop {
        vlan: Some(Vlan {
            id: 300,
            protocol: VlanProtocol::Dot1Ad,
        }),
        ..NH
    }) else {
        return;
    };
    for f in [frame(None, 40004), frame(Some(100), 40005)] {
        let (verdict, out) = run(&dp, &f.bytes());
        assert_eq!(verdict, XDP_TX);
        assert_eq!(out, expected(&f, Some((0x88a8, 300))));
    }
}

/// A next hop on another port (a VLAN device's parent that is not the
/// ingress port): bpf_redirect to it, with the next hop's tag whatever the
/// ingress frame carried.
#[test]
fn a_next_hop_on_another_port_is_redirected_with_its_own_tag() {
    // test runs see the loopback device (ifindex 1) as the ingress port
    let Some(dp) = load(NextHop {
        ifindex: 999,
        vlan: dot1q(100),
        ..NH
    }) else {
        return;
    };
    for f in [frame(None, 40006), frame(Some(7), 40007)] {
        let (verdict, out) = run(&dp, &f.bytes());
        assert_eq!(verdict, XDP_REDIRECT);
        assert_eq!(out, expected(&f, Some((0x8100, 100))));
    }
    assert_eq!(counter(&dp, "redirect"), 2);
    assert_eq!(counter(&dp, "tx"), 0);
}

/// The benchmark build (-DRINGLB_BENCH_RESTORE) undoes the encapsulation so
/// that every repetition of a test run times the same path: with a tag pushed,
/// rewritten or stripped, the frame it leaves behind must be the input, byte
/// for byte, and the verdict the real program's.
#[test]
fn the_bench_build_restores_the_frame_exactly_after_a_tag_change() {
    // the build without the flow filter where the kernel has no atomic OR
    // (before 5.12), as the loader does for the production program
    let object = XdpObject::Exactly(if ringlb_xdp::xdp::probe_atomic_or().is_ok() {
        ringlb_testkit::objects::XDP_LB_BENCH
    } else {
        ringlb_testkit::objects::XDP_LB_NO_FLOW_FILTER_BENCH
    });
    for (nh_vlan, in_vlan) in [
        (dot1q(100), None),
        (dot1q(200), Some(100)),
        (None, Some(100)),
        (dot1q(100), Some(0xa064)),
    ] {
        let Some(dp) = load_object(
            NextHop {
                vlan: nh_vlan,
                ..NH
            },
            object,
        ) else {
            return;
        };
        let f = frame(in_vlan, 40010).established();
        let input = f.bytes();
        let mut out = vec![0u8; input.len() + 128];
        let (verdict, len, _) = dp.test_run(&input, &mut out, 100).expect("test run");
        assert_eq!(verdict, XDP_TX, "{nh_vlan:?} {in_vlan:?}");
        assert_eq!(&out[..len], &input[..], "{nh_vlan:?} {in_vlan:?}");
    }
}

/// A resolver whose answer the test changes.
struct Switchable(std::sync::Arc<std::sync::Mutex<NextHop>>);

impl ringlb_nexthop::Resolver for Switchable {
    fn resolve(&self, _: IpAddr) -> Result<NextHop, ringlb_nexthop::Error> {
        Ok(*self.0.lock().unwrap())
    }
}

/// The node's address moves onto a VLAN subinterface (and back): a refresh
/// writes the tag into every backend entry of the pod (one batch), and the
/// next packet leaves with it; moving back strips it again.
#[test]
fn a_refresh_moves_the_backends_onto_and_off_a_vlan() {
    let answer = std::sync::Arc::new(std::sync::Mutex::new(NH));
    let resolver = Box::new(Switchable(answer.clone()));
    let Some(mut dp) = load_resolving(&opts(1500, false), resolver) else {
        return;
    };
    // the pod backs two VIPs: two backend ids, one address
    let vips = [("10.100.0.7", 80), ("10.100.0.7", 443)].map(|(a, port)| Vip {
        addr: ip(a),
        port,
        proto: Proto::Tcp,
    });
    dp.apply(&DesiredState {
        services: vips
            .iter()
            .map(|v| {
                let e = ServiceEntry::new(v, vec![ip("10.1.0.7")], vec![0; 13]).unwrap();
                (*v, e)
            })
            .collect(),
    })
    .unwrap();
    let mut f80 = frame(None, 40020);
    f80.dport = 80;
    let mut f443 = frame(None, 40021);
    f443.dport = 443;
    assert_eq!(run(&dp, &f80.bytes()).1, expected(&f80, None));
    assert_eq!(dp.refresh_next_hops().unwrap(), 0, "nothing changed");

    *answer.lock().unwrap() = NextHop {
        vlan: dot1q(100),
        ..NH
    };
    assert_eq!(dp.refresh_next_hops().unwrap(), 2, "both ids of the pod");
    assert_eq!(dp.refresh_next_hops().unwrap(), 0, "written once");
    for f in [&f80, &f443] {
        let (verdict, out) = run(&dp, &f.bytes());
        assert_eq!(verdict, XDP_TX);
        assert_eq!(out, expected(f, Some((0x8100, 100))));
    }

    *answer.lock().unwrap() = NH;
    assert_eq!(dp.refresh_next_hops().unwrap(), 2);
    let (_, out) = run(&dp, &f443.bytes());
    assert_eq!(out, expected(&f443, None));
}
