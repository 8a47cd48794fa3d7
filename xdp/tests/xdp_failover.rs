//! Failover VIPs in the XDP program, by BPF_PROG_TEST_RUN with exact frames
//! (docs/datapath.md, Failover VIPs). Region A's edge encapsulates a VIP's
//! traffic to region B's VIP (a remote-VIP backend); B's edge decapsulates an
//! IPIP packet to one of its own VIPs and forwards the inner packet only by a
//! failover alias, to the alias's pods; a plain packet to an alias, and IPIP
//! that is not ours, are passed; a decapsulated packet never travels on to a
//! remote VIP (the loop guard); IPIP from a sender outside `decap_senders` is
//! dropped before anything else. Needs root (BPF); skips loudly otherwise.

mod xdp_support;
use xdp_support::fixture::*;
use xdp_support::private_bpffs;

use aya::maps::{Array, Map, MapData};
use ringlb_nexthop::StaticResolver;
use ringlb_testkit::packet::{Frame, ip_header, l2_header};
use ringlb_xdp::{
    Datapath, Proto, Vip, abi,
    lookup::Lookup,
    xdp::{XdpDatapath, XdpOptions},
};

/// B's own VIP (the outer destination A's edge uses).
const OWN: &str = "10.100.0.1";
/// A's VIP, accepted by B as a failover alias.
const ALIAS: &str = "10.200.0.1";
/// A's edge (the outer source).
const A_EDGE: &str = "10.0.0.99";
/// A's other edges: a prefix B accepts as well.
const A_EDGES: (&str, u8) = ("10.0.1.0", 24);

/// B's edge: accepts failover traffic from A's edges only.
fn b_opts(mtu: u32) -> XdpOptions {
    XdpOptions {
        decap_senders: vec![
            (A_EDGE.parse().unwrap(), 32),
            (A_EDGES.0.parse().unwrap(), A_EDGES.1),
        ],
        ..opts(mtu, false)
    }
}
const CLIENT: &str = "192.0.2.7";

fn own() -> Vip {
    vip(OWN, 80, Proto::Tcp)
}
fn alias() -> Vip {
    vip(ALIAS, 80, Proto::Tcp)
}
/// Another VIP of B (not an alias) on an address with no other VIP.
fn plain_vip() -> Vip {
    vip("10.100.0.2", 80, Proto::Tcp)
}

/// B: its own VIP (pod .1), a plain second VIP (pod .4), and A's VIP as a
/// failover alias whose whole ring names pod .3 (of .2 and .3).
fn region_b(dp: &mut XdpDatapath) {
    let (o, a, p) = (own(), alias(), plain_vip());
    dp.apply(&state(vec![
        (o, svc(&o, &["10.1.0.1"], 0)),
        (p, svc(&p, &["10.1.0.4"], 0)),
        (
            a,
            svc(&a, &["10.1.0.2", "10.1.0.3"], 1)
                .as_failover_alias(&a)
                .unwrap(),
        ),
    ]))
    .unwrap();
}

/// The client's packet to `dst`:`dport` as A's edge sends it on: IPIP from
/// A's edge to `outer`, optionally VLAN-tagged on B's ingress.
fn ipip(inner: &Frame, outer: &str, vlan: Option<u16>) -> Vec<u8> {
    ipip_from(A_EDGE, inner, outer, vlan)
}

/// As [`ipip`], from `sender`.
fn ipip_from(sender: &str, inner: &Frame, outer: &str, vlan: Option<u16>) -> Vec<u8> {
    let l3 = inner.l3();
    let mut v = l2_header([2, 0, 0, 0, 0, 0xb], [2, 0, 0, 0, 0, 0xa], vlan, 0x0800);
    v.extend(ip_header(
        ip(sender),
        ip(outer),
        4,
        l3.len(),
        0,
        true,
        63,
        0,
    ));
    v.extend(l3);
    v
}

fn to_alias(sport: u16) -> Frame {
    Frame::tcp(ip(CLIENT), ip(ALIAS), sport, 80).established()
}

/// Every global counter, to see which ones a packet moved.
fn counters(dp: &XdpDatapath) -> Vec<(&'static str, u64)> {
    dp.read_counters().unwrap().global
}

/// The counters that differ between two readings, with their increase.
fn moved(
    before: &[(&'static str, u64)],
    after: &[(&'static str, u64)],
) -> Vec<(&'static str, u64)> {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| a.1 != b.1)
        .map(|(b, a)| (a.0, a.1 - b.1))
        .collect()
}

/// (a) IPIP to B's own VIP whose inner destination is an alias: the inner
/// packet, byte for byte, encapsulated again to the alias's pod (XDP_TX),
/// tagged or not on the way in; the flow's next packet follows conntrack.
#[test]
fn ipip_to_an_own_vip_is_forwarded_by_the_alias_to_its_pod() {
    let Some(mut dp) = load_with(&b_opts(1500)) else {
        return;
    };
    region_b(&mut dp);
    let inner = to_alias(40000);
    for vlan in [None, Some(100)] {
        let c0 = counters(&dp);
        let (verdict, out) = run(&dp, &ipip(&inner, OWN, vlan));
        assert_eq!(verdict, XDP_TX, "vlan {vlan:?}");
        // our L2 (the next hop's), outer 10.0.0.11 -> the alias's pod .3, and
        // the inner packet exactly as the client sent it
        assert_eq!(out, encapped(&inner, "10.0.0.11", "10.1.0.3", 0));
        assert_eq!(&out[14 + 20..], &inner.l3()[..], "inner byte-identical");
        let want_ct = if vlan.is_none() { "ct_miss" } else { "ct_hit" };
        assert_eq!(
            moved(&c0, &counters(&dp)),
            vec![("tx", 1), (want_ct, 1), ("failover_in", 1)],
            "vlan {vlan:?}"
        );
    }
    let c = dp.read_counters().unwrap();
    let (_, pk, _) = c.per_vip.iter().find(|(v, _, _)| *v == alias()).unwrap();
    assert_eq!(*pk, 2, "counted for the alias");
    let (_, pk, _) = c.per_vip.iter().find(|(v, _, _)| *v == own()).unwrap();
    assert_eq!(*pk, 0, "not for the own VIP it came to");
}

/// (b) IPIP to B's own VIP whose inner destination is no alias (a plain VIP
/// of B's, or nothing), or carrying no TCP/UDP: dropped untouched with a
/// counter (passed, B's kernel would route it back to the ToR: a loop); IPIP
/// to an address that is only an alias's (not one of B's own VIP addresses):
/// not ours, passed untouched.
#[test]
fn ipip_that_no_alias_serves_is_dropped_or_passed_untouched() {
    let Some(mut dp) = load_with(&b_opts(1500)) else {
        return;
    };
    region_b(&mut dp);
    let cases = [
        (
            ipip(&Frame::tcp(ip(CLIENT), ip("10.100.0.2"), 1, 80), OWN, None),
            "drop_decap_no_alias",
        ),
        (
            ipip(&Frame::tcp(ip(CLIENT), ip("10.9.9.9"), 1, 80), OWN, None),
            "drop_decap_no_alias",
        ),
        // the alias's port 443: no entry
        (
            ipip(
                &Frame {
                    dport: 443,
                    ..to_alias(2)
                },
                OWN,
                None,
            ),
            "drop_decap_no_alias",
        ),
        // outer destination: the alias's address (its filter bit is set), not ours
        (ipip(&to_alias(3), ALIAS, None), "pass_decap_not_ours"),
        // the inner packet is UDP to the alias's TCP port: no alias
        (
            ipip(&Frame::udp(ip(CLIENT), ip(ALIAS), 4, 80), OWN, None),
            "drop_decap_no_alias",
        ),
    ];
    for (frame, reason) in cases {
        let c0 = counters(&dp);
        let (verdict, out) = run(&dp, &frame);
        let want = if reason.starts_with("drop") {
            XDP_DROP
        } else {
            XDP_PASS
        };
        assert_eq!(verdict, want, "{reason}");
        assert_eq!(out, frame, "untouched");
        let m = moved(&c0, &counters(&dp));
        assert_eq!(m, vec![(reason, 1)], "{reason}");
    }
    // inner ICMP and an inner fragment: to our VIP address, but not a
    // packet the failover path takes
    let mut icmp = ipip(&to_alias(5), OWN, None);
    icmp[14 + 20 + 9] = 1; // inner protocol (its checksum is not checked)
    let mut frag = ipip(&to_alias(6), OWN, None);
    frag[14 + 20 + 6] |= 0x20; // inner MF
    for frame in [icmp, frag] {
        let c0 = counters(&dp);
        assert_eq!(run(&dp, &frame), (XDP_DROP, frame.clone()));
        assert_eq!(moved(&c0, &counters(&dp)), vec![("drop_vip_other", 1)]);
    }
}

/// (c) A plain packet to an alias is passed: aliases serve failed-over
/// traffic only, also when that flow has a conntrack entry (its key carries
/// the decap flag, so the plain packet does not find it).
#[test]
fn a_plain_packet_to_an_alias_is_passed() {
    let Some(mut dp) = load_with(&b_opts(1500)) else {
        return;
    };
    region_b(&mut dp);
    let inner = to_alias(40000);
    assert_eq!(run(&dp, &ipip(&inner, OWN, None)).0, XDP_TX);
    let c0 = counters(&dp);
    let (verdict, out) = run(&dp, &inner.bytes());
    assert_eq!((verdict, out), (XDP_PASS, inner.bytes()));
    assert_eq!(moved(&c0, &counters(&dp)), vec![("pass_alias_plain", 1)]);
    // the operator's lookup says the same
    let f = ringlb_xdp::cli::flow(
        Proto::Tcp,
        format!("{CLIENT}:40000").parse().unwrap(),
        format!("{ALIAS}:80").parse().unwrap(),
    );
    assert_eq!(dp.lookup(&f).unwrap(), Lookup::AliasPlain { vip: alias() });
}

/// (d) A's side: a VIP whose only backend is B's VIP is encapsulated to that
/// VIP like to a pod (outer destination = B's VIP), counted `failover_out`.
#[test]
fn a_remote_vip_backend_is_the_outer_destination() {
    let Some(mut dp) = load_with(&b_opts(1500)) else {
        return;
    };
    let v = vip("10.200.0.1", 80, Proto::Tcp);
    let remote = ip(OWN);
    let e = svc(&v, &[OWN], 0).with_remote(&v, [remote]).unwrap();
    dp.apply(&state(vec![(v, e)])).unwrap();
    let f = Frame::tcp(ip(CLIENT), ip("10.200.0.1"), 40000, 80).established();
    let c0 = counters(&dp);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, encapped(&f, "10.0.0.11", OWN, 0));
    assert_eq!(
        moved(&c0, &counters(&dp)),
        vec![("tx", 1), ("ct_miss", 1), ("failover_out", 1)]
    );
    // the flow stays on the remote VIP by conntrack (like any backend)
    let c0 = counters(&dp);
    assert_eq!(run(&dp, &f.bytes()).1, encapped(&f, "10.0.0.11", OWN, 0));
    assert_eq!(
        moved(&c0, &counters(&dp)),
        vec![("tx", 1), ("ct_hit", 1), ("failover_out", 1)]
    );
    // the backend entry carries the flag; the id reads back as remote
    let id = dp.programmed().backend(&v, remote).unwrap().id;
    assert!(dp.programmed().backend(&v, remote).unwrap().remote);
    assert!(dp.backend_values([id]).unwrap()[&id].is_remote());
    let read = dp.read_programmed().unwrap();
    assert!(read.backend(&v, remote).unwrap().remote, "read back");
}

/// (e) The loop guard: a decapsulated packet whose backend is a remote VIP is
/// dropped, whether the ring chose it or conntrack did. The loader never
/// programs that (an alias has no remote backend), so the flag is set on the
/// alias's backend through the pinned map, as bpftool could.
#[test]
fn a_decapsulated_packet_never_goes_to_a_remote_vip() {
    let Some(fs) = private_bpffs("the xdp failover test (BPF, bpffs)", "failover") else {
        return;
    };
    let o = XdpOptions {
        pin_dir: Some(fs.path().join("ringlb")),
        ..b_opts(1500)
    };
    let mut dp = XdpDatapath::load(&o, Box::new(StaticResolver::everywhere(NH))).unwrap();
    region_b(&mut dp);
    // a flow with a conntrack entry to pod .3, before the flag is set
    let est = to_alias(41000);
    assert_eq!(run(&dp, &ipip(&est, OWN, None)).0, XDP_TX);
    let b = dp.programmed().backend(&alias(), ip("10.1.0.3")).unwrap();
    let mut backends: Array<MapData, abi::BackendValue> = Array::try_from(Map::Array(
        MapData::from_pin(fs.path().join("ringlb").join("backends")).unwrap(),
    ))
    .unwrap();
    let mut v = backends.get(&b.id, 0).unwrap();
    v.nh_valid |= abi::BE_F_REMOTE_VIP;
    backends.set(b.id, v, 0).unwrap();
    // conntrack's choice, then the ring's (a new flow)
    for (f, how) in [(est, "ct_hit"), (to_alias(42000), "ct_miss")] {
        let c0 = counters(&dp);
        let (verdict, _) = run(&dp, &ipip(&f, OWN, None));
        assert_eq!(verdict, XDP_DROP, "{how}");
        let m = moved(&c0, &counters(&dp));
        let want: Vec<(&str, u64)> = if how == "ct_hit" {
            vec![("failover_loop", 1)] // dropped before it counts as a hit
        } else {
            vec![("ct_miss", 1), ("failover_loop", 1)]
        };
        assert_eq!(m, want, "{how}");
    }
    // no entry was inserted for the dropped new flow: conntrack holds the
    // established one only
    let ct: aya::maps::HashMap<_, abi::Flow, abi::CtValue> =
        dp.maps().map(abi::map::CONNTRACK).unwrap();
    assert_eq!(ct.keys().count(), 1);
    let k = ct.keys().next().unwrap().unwrap();
    assert_eq!(k.flags, abi::FLOW_F_DECAP, "a decapsulated flow's key");
    // a plain packet to a remote VIP backend is fine (A's side): not dropped
    let c0 = counters(&dp);
    let plain = Frame::tcp(ip(CLIENT), ip(OWN), 43000, 80).established();
    assert_eq!(run(&dp, &plain.bytes()).0, XDP_TX);
    assert!(
        moved(&c0, &counters(&dp))
            .iter()
            .all(|(l, _)| *l != "failover_loop")
    );
}

/// (f) IPIP to an address that is no VIP: passed by the address filter,
/// before conntrack or any lookup (only `pass_not_vip` moves).
#[test]
fn ipip_to_a_non_vip_address_costs_only_the_filter() {
    let Some(mut dp) = load_with(&b_opts(1500)) else {
        return;
    };
    region_b(&mut dp);
    let frame = ipip(&to_alias(7), "10.0.0.11", None);
    let c0 = counters(&dp);
    assert_eq!(run(&dp, &frame), (XDP_PASS, frame.clone()));
    assert_eq!(moved(&c0, &counters(&dp)), vec![("pass_not_vip", 1)]);
}

/// MTU: the decapsulated packet is encapsulated again (20 bytes, like to a
/// pod); too big for the configured MTU with DF, the client is told the
/// size that fits, from the alias's VIP, quoting the inner packet.
#[test]
fn a_decapsulated_packet_too_big_for_the_tunnel_gets_frag_needed_from_the_alias() {
    let Some(mut dp) = load_with(&b_opts(1400)) else {
        return;
    };
    region_b(&mut dp);
    let mut inner = to_alias(44000);
    inner.payload = 1400 - 20 - 20; // inner 1400: 1420 once encapsulated
    let frame = ipip(&inner, OWN, None);
    let c0 = counters(&dp);
    let (verdict, out) = run(&dp, &frame);
    assert_eq!(verdict, XDP_TX);
    assert_eq!(
        moved(&c0, &counters(&dp)),
        vec![("ct_miss", 1), ("icmp_too_big", 1), ("failover_in", 1)]
    );
    // MACs swapped, ICMP from the alias VIP to the client, next-hop MTU 1380
    assert_eq!(&out[..6], &frame[6..12]);
    assert_eq!(&out[14 + 12..14 + 16], &[10, 200, 0, 1]);
    assert_eq!(&out[14 + 16..14 + 20], &[192, 0, 2, 7]);
    assert_eq!((out[14 + 9], out[34], out[35]), (1, 3, 4));
    assert_eq!(u16::from_be_bytes([out[40], out[41]]), 1380);
    // the quote is the inner packet
    assert_eq!(&out[42..42 + 40], &inner.l3()[..40]);
    assert_eq!(out.len(), 14 + 28 + 512);
}

/// (g) Who may send: IPIP to B's own VIP is decapsulated only from a sender in
/// `decap_senders` (an address, or inside a prefix); from anyone else it is
/// dropped untouched before the inner packet is looked at, counted
/// `drop_decap_sender`, nothing inserted. A reload over the pinned maps
/// rewrites the set: with none, nobody's IPIP is taken apart.
#[test]
fn ipip_from_a_sender_outside_the_other_regions_edges_is_dropped() {
    let Some(fs) = private_bpffs("the xdp failover test (BPF, bpffs)", "failover-senders") else {
        return;
    };
    let pinned = |senders: Vec<(std::net::Ipv4Addr, u8)>| XdpOptions {
        pin_dir: Some(fs.path().join("ringlb")),
        decap_senders: senders,
        ..opts(1500, false)
    };
    let b = pinned(b_opts(1500).decap_senders);
    let mut dp = XdpDatapath::load(&b, Box::new(StaticResolver::everywhere(NH))).unwrap();
    region_b(&mut dp);
    for (sender, sport) in [(A_EDGE, 44000), ("10.0.1.77", 44001)] {
        let (verdict, _) = run(&dp, &ipip_from(sender, &to_alias(sport), OWN, None));
        assert_eq!(verdict, XDP_TX, "{sender} is one of A's edges");
    }
    for (sender, sport) in [
        ("10.0.0.98", 44002),
        ("10.0.2.1", 44003),
        ("192.0.2.9", 44004),
    ] {
        let frame = ipip_from(sender, &to_alias(sport), OWN, None);
        let c0 = counters(&dp);
        assert_eq!(run(&dp, &frame), (XDP_DROP, frame.clone()), "{sender}");
        assert_eq!(
            moved(&c0, &counters(&dp)),
            vec![("drop_decap_sender", 1)],
            "{sender}"
        );
    }
    let ct: aya::maps::HashMap<_, abi::Flow, abi::CtValue> =
        dp.maps().map(abi::map::CONNTRACK).unwrap();
    assert_eq!(
        ct.keys().count(),
        2,
        "entries for A's two edges' flows only"
    );
    drop(dp);
    // the next start with no senders: A's edge is refused too
    let dp = XdpDatapath::load(
        &pinned(Vec::new()),
        Box::new(StaticResolver::everywhere(NH)),
    )
    .unwrap();
    let frame = ipip(&to_alias(44005), OWN, None);
    let c0 = counters(&dp);
    assert_eq!(run(&dp, &frame), (XDP_DROP, frame.clone()));
    assert_eq!(moved(&c0, &counters(&dp)), vec![("drop_decap_sender", 1)]);
}
