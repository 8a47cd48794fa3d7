//! The maps and packets every section shares: VIPs, backends, the objects
//! compared side by side.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::Context;
use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::{NextHop, StaticResolver};
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{XdpDatapath, XdpObject, XdpOptions},
};

pub(crate) const XDP_PASS: u32 = 2;
pub(crate) const XDP_TX: u32 = 3;

pub(crate) fn resolver() -> Box<StaticResolver> {
    Box::new(StaticResolver::everywhere(NextHop {
        ifindex: 0,
        smac: [2, 0, 0, 0, 0, 1],
        dmac: [2, 0, 0, 0, 0, 2],
        vlan: None,
    }))
}

pub(crate) fn vip_addr(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i))
}

pub(crate) fn backend_addr(vip: u32, b: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 128, 0, 0)) + vip * 128 + b,
    ))
}

pub(crate) fn service(
    i: u32,
    backends: u32,
    ring: u32,
    shift: u32,
) -> anyhow::Result<(Vip, ServiceEntry)> {
    let vip = Vip {
        addr: vip_addr(i),
        port: 80,
        proto: Proto::Tcp,
    };
    let bs: Vec<Backend> = (0..backends)
        .map(|b| Backend {
            addr: backend_addr(i, b + shift),
            port: 8080,
            weight: 1,
        })
        .collect();
    let table = Table::build(&bs, ring).context("maglev table")?;
    Ok((vip, ServiceEntry::from_table(&vip, &table)?))
}

pub(crate) fn desired(vips: u32, backends: u32, ring: u32) -> anyhow::Result<DesiredState> {
    let mut services = BTreeMap::new();
    for i in 0..vips {
        let (v, s) = service(i, backends, ring, 0)?;
        services.insert(v, s);
    }
    Ok(DesiredState { services })
}

pub(crate) fn load(object: &'static [u8], d: &DesiredState) -> anyhow::Result<XdpDatapath> {
    load_budgeted(object, d, 0)
}

/// [`load`] with a conntrack insert budget (`XdpOptions::ct_insert_budget`).
pub(crate) fn load_budgeted(
    object: &'static [u8],
    d: &DesiredState,
    ct_insert_budget: u32,
) -> anyhow::Result<XdpDatapath> {
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some(SRC4),
        src6: None,
        mtu: 1500,
        fib_fallback: false,
        object: XdpObject::Exactly(object),
        ct_insert_budget,
        // the production sizes: the program measured is the one edges run
        ..XdpOptions::default()
    };
    let mut dp = XdpDatapath::load(&opts, resolver())?;
    dp.apply(d)?;
    Ok(dp)
}

/// A 64-byte TCP SYN to VIP `vip` from a client chosen by `n`.
pub(crate) fn syn_frame(vip: u32, n: u32) -> Frame {
    let src = IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(192, 168, 0, 0)) + (n >> 14),
    ));
    let mut f = Frame::tcp(src, vip_addr(vip), 1024 + (n & 0x3fff) as u16, 80);
    f.payload = 10;
    f
}

pub(crate) fn syn(vip: u32, n: u32) -> Vec<u8> {
    syn_frame(vip, n).bytes()
}

/// The same flow's packet once the connection is up: an ACK (the program skips
/// the conntrack lookup for a SYN, so a SYN never "hits").
pub(crate) fn ack(vip: u32, n: u32) -> Vec<u8> {
    syn_frame(vip, n).established().bytes()
}

/// Traffic for the node itself: flow `n`'s ACK with a destination that is no
/// VIP (every program must pass it up unchanged).
pub(crate) fn not_vip(vip: u32, n: u32) -> Vec<u8> {
    let mut f = syn_frame(vip, n).established();
    f.dst = IpAddr::V4(Ipv4Addr::new(10, 255, 255, 254));
    f.bytes()
}

/// The outer source of every encapsulated frame (`load`).
pub(crate) const SRC4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);

/// A program build compared side by side: the production object and its two
/// benchmark builds (restoring; restoring without conntrack insert), and the
/// conntrack insert budget they are loaded with (0 = none).
pub(crate) struct Variant {
    pub name: &'static str,
    pub prod: &'static [u8],
    pub bench: &'static [u8],
    pub miss: &'static [u8],
    pub budget: u32,
}

/// The production program without the flow filter (the build for kernels
/// before 5.12), the production program, the same with an insert budget, and
/// with a larger flow filter. Experiments and older programs (built from a
/// git revision): `RINGLB_BENCH_EXTRA=name=object.o,...` adds objects built
/// by hand (their R rows use ringlb_xdp's bench builds). Such an object must
/// have this build's maps and counters, which the loader checks: one built
/// before the insert budget (edc71b6) is refused with "ct_budget is missing
/// from the object".
pub(crate) fn variants() -> Vec<Variant> {
    use ringlb_testkit::objects as t;
    let mut v = vec![
        // every SYN looks its 5-tuple up (the build for kernels without
        // atomic OR)
        Variant {
            name: "no_flow_filter",
            prod: ringlb_xdp::xdp::objects::XDP_LB_NO_FLOW_FILTER,
            bench: t::XDP_LB_NO_FLOW_FILTER_BENCH,
            miss: t::XDP_LB_NO_FLOW_FILTER_BENCH_MISS,
            budget: 0,
        },
        Variant {
            name: "ringlb_xdp",
            prod: ringlb_xdp::xdp::objects::XDP_LB,
            bench: t::XDP_LB_BENCH,
            miss: t::XDP_LB_BENCH_MISS,
            budget: 0,
        },
        // ringlb_xdp with an insert budget that never runs out: what the
        // budget's check costs an insert (the edge runs with a budget)
        Variant {
            name: "budget_check",
            prod: ringlb_xdp::xdp::objects::XDP_LB,
            bench: t::XDP_LB_BENCH,
            miss: t::XDP_LB_BENCH_MISS,
            budget: u32::MAX,
        },
        // the flow filter at 2^20 slots per half; R rows as ringlb_xdp's
        Variant {
            name: "flow_filter_20",
            prod: t::XDP_LB_FLOW_FILTER_20,
            bench: t::XDP_LB_BENCH,
            miss: t::XDP_LB_BENCH_MISS,
            budget: 0,
        },
    ];
    // RINGLB_BENCH_ONLY=name,...: only these (a shorter run)
    if let Ok(only) = std::env::var("RINGLB_BENCH_ONLY") {
        v.retain(|x| only.split(',').any(|o| o == x.name));
    }
    for e in std::env::var("RINGLB_BENCH_EXTRA")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((name, path)) = e.split_once('=') {
            let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("{path}: {err}"));
            v.push(Variant {
                name: Box::leak(name.to_string().into_boxed_str()),
                prod: Box::leak(bytes.into_boxed_slice()),
                bench: t::XDP_LB_BENCH,
                miss: t::XDP_LB_BENCH_MISS,
                budget: 0,
            });
        }
    }
    v
}

/// A global counter of the program, summed over CPUs.
pub(crate) fn counter(dp: &XdpDatapath, label: &str) -> anyhow::Result<u64> {
    let c = dp.read_counters()?;
    c.global
        .iter()
        .find(|(l, _)| *l == label)
        .map(|x| x.1)
        .with_context(|| format!("no counter {label}"))
}
