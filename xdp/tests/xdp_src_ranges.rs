//! spec.loadBalancerSourceRanges in the XDP program, by BPF_PROG_TEST_RUN with
//! exact frames: a packet to a VIP with ranges from a source outside them is
//! dropped (the frame untouched, nothing inserted into conntrack, counted
//! globally and for the VIP), one from inside is forwarded as usual, IPv4 and
//! IPv6; narrowing the ranges cuts an established flow at its next packet;
//! two Services on one address keep their own ranges.
//! Needs root (BPF); skips loudly otherwise.

mod xdp_support;
use xdp_support::fixture::*;

use ringlb_testkit::packet::Frame;
use ringlb_xdp::lookup::{CtState, Lookup};
use ringlb_xdp::{Datapath, Proto, ServiceEntry, SourceRange, Vip, xdp::XdpDatapath};

fn range(s: &str) -> SourceRange {
    let (a, p) = s.split_once('/').unwrap();
    SourceRange::new(ip(a), p.parse().unwrap()).unwrap()
}

fn ranged(v: &Vip, backends: &[&str], ranges: &[&str]) -> ServiceEntry {
    svc(v, backends, 0).with_source_ranges(v, ranges.iter().map(|r| range(r)))
}

/// What `lookup` says of the TCP flow from `src`:40000 to 10.100.0.1:80.
fn look(dp: &XdpDatapath, src: &str) -> Lookup {
    dp.lookup(&ringlb_xdp::cli::flow(
        Proto::Tcp,
        format!("{src}:40000").parse().unwrap(),
        "10.100.0.1:80".parse().unwrap(),
    ))
    .unwrap()
}

/// Packets the program dropped for `v` because of its ranges.
fn vip_dropped(dp: &XdpDatapath, v: &Vip) -> u64 {
    let c = dp.read_counters().unwrap();
    let (_, reason, n) = c.per_vip_dropped.iter().find(|(x, _, _)| x == v).unwrap();
    assert_eq!(*reason, "source_range");
    *n
}

fn ct_entries(dp: &XdpDatapath) -> usize {
    let m: aya::maps::HashMap<_, ringlb_xdp::abi::Flow, ringlb_xdp::abi::CtValue> =
        dp.maps().map(ringlb_xdp::abi::map::CONNTRACK).unwrap();
    m.keys().count()
}

/// A refused IPv4 SYN, written out byte for byte: it must come back as it
/// went in, with XDP_DROP.
const REFUSED_SYN_V4: [u8; 54] = [
    // Ethernet: to 02:00:00:00:00:02 from 02:00:00:00:00:01, IPv4
    0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00,
    // IPv4: 40 bytes, DF, TTL 64, TCP, 198.51.100.9 -> 10.100.0.1
    0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 198, 51, 100, 9, 10, 100, 0, 1,
    // TCP: 40000 -> 80, seq 1, SYN, window 65535 (checksums are not read)
    0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
];

#[test]
fn ipv4_sources_outside_the_ranges_are_dropped_before_the_ring() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    dp.apply(&state(vec![(
        v,
        ranged(&v, &["10.1.0.1"], &["192.0.2.0/24", "203.0.113.7/32"]),
    )]))
    .unwrap();

    // inside: forwarded exactly as without ranges
    for src in ["192.0.2.7", "192.0.2.255", "203.0.113.7"] {
        let syn = Frame::tcp(ip(src), ip("10.100.0.1"), 40000, 80);
        assert_eq!(
            run(&dp, &syn.bytes()),
            (XDP_TX, encapped(&syn, "10.0.0.11", "10.1.0.1", 0)),
            "{src}"
        );
    }
    // outside: the frame untouched, XDP_DROP, counted
    let (verdict, out) = run(&dp, &REFUSED_SYN_V4);
    assert_eq!(verdict, XDP_DROP);
    assert_eq!(out, REFUSED_SYN_V4);
    for src in ["192.0.3.7", "203.0.113.8", "10.100.0.2"] {
        let f = Frame::tcp(ip(src), ip("10.100.0.1"), 40000, 80).established();
        assert_eq!(run(&dp, &f.bytes()), (XDP_DROP, f.bytes()), "{src}");
    }
    assert_eq!(counter(&dp, "drop_source_range"), 4);
    assert_eq!(vip_dropped(&dp, &v), 4);
    // `lookup` says the same, from the VIP's set
    assert!(matches!(look(&dp, "192.0.3.7"), Lookup::SourceRefused { vip, .. } if vip == v));
    assert!(matches!(look(&dp, "203.0.113.7"), Lookup::Backend { .. }));
    assert_eq!(counter(&dp, "ct_miss"), 0, "a refused ACK inserts nothing");
    assert_eq!(ct_entries(&dp), 0);
    assert_eq!(counter(&dp, "tx"), 3);
}

#[test]
fn ipv6_sources_outside_the_ranges_are_dropped() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip("2001:db8:100::1", 443, Proto::Tcp);
    // an IPv4 range on an IPv6 VIP matches nothing (left out)
    dp.apply(&state(vec![(
        v,
        ranged(&v, &["10.1.0.1"], &["2001:db8:c1::/48", "192.0.2.0/24"]),
    )]))
    .unwrap();
    let ok = Frame::tcp(ip("2001:db8:c1:ff::7"), ip("2001:db8:100::1"), 40000, 443);
    assert_eq!(
        run(&dp, &ok.bytes()),
        (XDP_TX, encapped(&ok, "10.0.0.11", "10.1.0.1", 0)),
        "6-in-4 to the pod"
    );
    for src in ["2001:db8:c2::7", "2001:db8:c0:ffff::1", "::ffff:192.0.2.7"] {
        let f = Frame::tcp(ip(src), ip("2001:db8:100::1"), 40000, 443);
        assert_eq!(run(&dp, &f.bytes()), (XDP_DROP, f.bytes()), "{src}");
    }
    assert_eq!(counter(&dp, "drop_source_range"), 3);
    assert_eq!(vip_dropped(&dp, &v), 3);
}

/// The check runs on conntrack hits too: a flow established from inside the
/// ranges is cut at its next packet once they no longer hold its source, and
/// follows its conntrack entry again (same pod) once they do.
#[test]
fn narrowing_the_ranges_cuts_an_established_flow() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    let pods = ["10.1.0.1", "10.1.0.2"];
    dp.apply(&state(vec![(v, ranged(&v, &pods, &["192.0.2.0/24"]))]))
        .unwrap();
    let syn = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    assert_eq!(run(&dp, &syn.bytes()).0, XDP_TX);
    let ack = syn.clone().established();
    assert_eq!(
        run(&dp, &ack.bytes()),
        (XDP_TX, encapped(&ack, "10.0.0.11", "10.1.0.1", 0))
    );
    assert_eq!(ct_entries(&dp), 1);
    // the ring now sends new flows to .2; the entry keeps this flow on .1
    let to_2 = || ServiceEntry::new(&v, pods.iter().map(|p| ip(p)).collect(), vec![1; 13]).unwrap();
    let moved = |ranges: &[&str]| {
        state(vec![(
            v,
            to_2().with_source_ranges(&v, ranges.iter().map(|r| range(r))),
        )])
    };
    dp.apply(&moved(&["192.0.2.0/25", "198.51.100.0/24"]))
        .unwrap();
    assert_eq!(
        run(&dp, &ack.bytes()),
        (XDP_TX, encapped(&ack, "10.0.0.11", "10.1.0.1", 0)),
        "still inside: conntrack keeps the pod"
    );
    let hits = counter(&dp, "ct_hit");
    // `lookup` names the VIP of the hit (the owners value's ranges bit aside)
    let said = look(&dp, "192.0.2.7");
    assert!(
        matches!(said, Lookup::Backend { vip, conntrack: CtState::Hit, .. } if vip == v),
        "{said:?}"
    );

    // narrowed past the client: its next packet is dropped, on the hit path
    dp.apply(&moved(&["192.0.2.128/25"])).unwrap();
    assert_eq!(run(&dp, &ack.bytes()), (XDP_DROP, ack.bytes()));
    let said = look(&dp, "192.0.2.7");
    assert_eq!(
        said,
        Lookup::SourceRefused {
            vip: v,
            conntrack: CtState::Hit
        }
    );
    assert_eq!(counter(&dp, "drop_source_range"), 1);
    assert_eq!(counter(&dp, "ct_hit"), hits, "not counted as a hit");
    assert_eq!(counter(&dp, "ct_miss"), 1, "the ring was not asked");

    // the ranges removed (open to all): the flow goes on to its pod
    dp.apply(&moved(&[])).unwrap();
    assert_eq!(run(&dp, &ack.bytes()).0, XDP_DROP, "an empty list closes");
    dp.apply(&state(vec![(v, to_2())])).unwrap();
    assert_eq!(
        run(&dp, &ack.bytes()),
        (XDP_TX, encapped(&ack, "10.0.0.11", "10.1.0.1", 0))
    );
    assert_eq!(counter(&dp, "ct_hit"), hits + 1);
}

/// Two Services on one address, other ports: each VIP:port its own ranges.
#[test]
fn two_services_on_one_address_keep_their_own_ranges() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let (web, admin) = (vip4(), vip("10.100.0.1", 8443, Proto::Tcp));
    dp.apply(&state(vec![
        (web, ranged(&web, &["10.1.0.1"], &["0.0.0.0/0"])),
        (admin, ranged(&admin, &["10.1.0.2"], &["192.0.2.0/24"])),
    ]))
    .unwrap();
    let to = |src: &str, port| Frame::tcp(ip(src), ip("10.100.0.1"), 40000, port);
    let f = to("198.51.100.9", 80);
    assert_eq!(
        run(&dp, &f.bytes()),
        (XDP_TX, encapped(&f, "10.0.0.11", "10.1.0.1", 0))
    );
    let f = to("198.51.100.9", 8443);
    assert_eq!(run(&dp, &f.bytes()), (XDP_DROP, f.bytes()));
    let f = to("192.0.2.9", 8443);
    assert_eq!(
        run(&dp, &f.bytes()),
        (XDP_TX, encapped(&f, "10.0.0.11", "10.1.0.2", 0))
    );
    assert_eq!((vip_dropped(&dp, &web), vip_dropped(&dp, &admin)), (0, 1));
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// More ranges than a set holds go to the LPM trie: the same answers, IPv4
/// and IPv6, and an established flow keeps them across the move between the
/// trie and a set.
#[test]
fn many_ranges_are_matched_by_the_trie() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let (v4, v6) = (vip4(), vip("2001:db8:100::1", 443, Proto::Tcp));
    let many4: Vec<String> = (0..11).map(|k| format!("198.18.{k}.0/24")).collect();
    let many6: Vec<String> = (0..11).map(|k| format!("2001:db8:{k:x}::/48")).collect();
    dp.apply(&state(vec![
        (v4, ranged(&v4, &["10.1.0.1"], &refs(&many4))),
        (v6, ranged(&v6, &["10.1.0.1"], &refs(&many6))),
    ]))
    .unwrap();
    let ack = Frame::tcp(ip("198.18.10.7"), ip("10.100.0.1"), 40000, 80).established();
    assert_eq!(
        run(&dp, &ack.bytes()),
        (XDP_TX, encapped(&ack, "10.0.0.11", "10.1.0.1", 0))
    );
    let ok6 = Frame::tcp(ip("2001:db8:a:1::7"), ip("2001:db8:100::1"), 40000, 443);
    assert_eq!(run(&dp, &ok6.bytes()).0, XDP_TX);
    for (src, dst, port) in [
        ("198.18.11.7", "10.100.0.1", 80),
        ("2001:db8:b::7", "2001:db8:100::1", 443),
    ] {
        let f = Frame::tcp(ip(src), ip(dst), 40000, port);
        assert_eq!(run(&dp, &f.bytes()), (XDP_DROP, f.bytes()), "{src}");
    }
    // the established flow (conntrack) through trie -> set -> trie
    for ranges in [&["198.18.10.0/24"][..], &refs(&many4)[..]] {
        dp.apply(&state(vec![(v4, ranged(&v4, &["10.1.0.1"], ranges))]))
            .unwrap();
        assert_eq!(run(&dp, &ack.bytes()).0, XDP_TX, "{ranges:?}");
    }
    // `lookup` reads the trie as the program does
    assert!(matches!(look(&dp, "198.18.3.9"), Lookup::Backend { .. }));
    assert!(matches!(
        look(&dp, "198.18.11.9"),
        Lookup::SourceRefused { .. }
    ));
    dp.apply(&state(vec![(
        v4,
        ranged(&v4, &["10.1.0.1"], &["198.18.9.0/24"]),
    )]))
    .unwrap();
    assert_eq!(run(&dp, &ack.bytes()), (XDP_DROP, ack.bytes()));
    assert_eq!(counter(&dp, "drop_source_range"), 3);
}
