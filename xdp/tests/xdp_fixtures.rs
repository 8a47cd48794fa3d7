//! BPF_PROG_TEST_RUN fixtures for the XDP program: input frame, exact expected
//! output frame, expected verdict and counter. Needs root (BPF); skips loudly
//! otherwise.

mod xdp_support;
use xdp_support::fixture::*;
use xdp_support::require_root;

use std::net::IpAddr;

use ringlb_nexthop::{NextHop, StaticResolver};
use ringlb_testkit::packet::{Frame, ip_header, l2_header};
use ringlb_xdp::{Datapath, DesiredState, Proto, ServiceEntry, Vip, xdp::XdpDatapath};

fn vip4u() -> Vip {
    vip("10.100.0.1", 53, Proto::Udp)
}
fn vip6() -> Vip {
    vip("2001:db8:100::1", 443, Proto::Tcp)
}

fn base_state() -> DesiredState {
    state(vec![
        (vip4(), svc(&vip4(), &["10.1.0.1", "10.1.0.2"], 0)),
        (vip4u(), svc(&vip4u(), &["10.1.0.2"], 0)),
        (vip6(), svc(&vip6(), &["2001:db8:1::1"], 0)),
    ])
}

/// The IPv6 outer flow label: entropy from the client's ports and address,
/// computed the way the program does (XOR of the raw little-endian loads).
fn flow_label(f: &Frame) -> u32 {
    let (s0, s3) = match f.src {
        IpAddr::V4(a) => (u32::from_ne_bytes(a.octets()), 0),
        IpAddr::V6(a) => {
            let o = a.octets();
            (
                u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
                u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
            )
        }
    };
    let sp = u32::from(u16::from_ne_bytes(f.sport.to_be_bytes()));
    let dp = u32::from(u16::from_ne_bytes(f.dport.to_be_bytes()));
    (sp ^ dp ^ s0 ^ s3) & 0xf_ffff
}

#[test]
fn abi_sizes_match_object() {
    let Some(dp) = load(1500, true) else { return };
    dp.check_abi()
        .expect("Rust ABI mirror matches the object's maps");
}

#[test]
fn ipv4_tcp_is_ipip_encapsulated_with_exact_bytes() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    // the outer header, written out by hand: 60 bytes, DF, TTL 64, proto 4,
    // checksum 0x26b2, 10.0.0.11 -> 10.1.0.1
    assert_eq!(
        &out[14..34],
        &[
            0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 4, 0x26, 0xb2, 10, 0, 0, 11, 10, 1, 0, 1
        ]
    );
    assert_eq!(
        &out[..14],
        &[2, 0xee, 0, 0, 0, 2, 2, 0xee, 0, 0, 0, 1, 0x08, 0]
    );
    assert_eq!(out, encapped(&f, "10.0.0.11", "10.1.0.1", 0));
    assert_eq!(counter(&dp, "tx"), 1);
    let c = dp.read_counters().unwrap();
    let (_, pk, by) = c.per_vip.iter().find(|(v, _, _)| *v == vip4()).unwrap();
    assert_eq!((*pk, *by), (1, f.bytes().len() as u64));
}

#[test]
fn ipv4_udp_without_df_keeps_df_clear_and_tos() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    let mut f = Frame::udp(ip("192.0.2.7"), ip("10.100.0.1"), 5353, 53);
    f.payload = 100;
    f.tos = 0xb8; // EF
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, encapped(&f, "10.0.0.11", "10.1.0.2", 0));
    assert_eq!(out[14 + 6] & 0x40, 0, "DF must stay clear");
    assert_eq!(out[14 + 1], 0xb8, "TOS copied");
}

#[test]
fn ipv6_tcp_is_ip6ip6_encapsulated() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    let f = Frame::tcp(ip("2001:db8:ffff::9"), ip("2001:db8:100::1"), 41000, 443);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(
        out,
        encapped(&f, "2001:db8::11", "2001:db8:1::1", flow_label(&f))
    );
    assert_eq!(out[14 + 6], 41, "next header IPv6");
    assert_eq!(out[14 + 7], 64, "hop limit");
    assert_eq!(
        u16::from_be_bytes([out[14 + 4], out[14 + 5]]),
        60,
        "payload length"
    );
}

#[test]
fn mixed_families_4in6_and_6in4() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v4 = vip("10.100.0.9", 80, Proto::Tcp);
    let v6 = vip("2001:db8:100::9", 80, Proto::Udp);
    dp.apply(&state(vec![
        (v4, svc(&v4, &["2001:db8:1::4"], 0)),
        (v6, svc(&v6, &["10.1.0.6"], 0)),
    ]))
    .unwrap();
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.9"), 40001, 80);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(
        out,
        encapped(&f, "2001:db8::11", "2001:db8:1::4", flow_label(&f))
    );
    let f = Frame::udp(ip("2001:db8:ffff::9"), ip("2001:db8:100::9"), 40001, 80);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out, encapped(&f, "10.0.0.11", "10.1.0.6", 0));
}

/// The egress L2 header is the next hop's: NH is untagged, so the ingress
/// tag is stripped also on XDP_TX (tests/xdp_vlan.rs has the tagged cases).
#[test]
fn vlan_tag_is_stripped_for_an_untagged_next_hop_and_wildcard_port_matches() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let w = vip("10.100.0.5", 0, Proto::Tcp);
    dp.apply(&state(vec![(w, svc(&w, &["10.1.0.5"], 0))]))
        .unwrap();
    let mut f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.5"), 40000, 8443);
    f.vlan = Some(0x0064);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    let untagged = Frame {
        vlan: None,
        ..f.clone()
    };
    assert_eq!(out, encapped(&untagged, "10.0.0.11", "10.1.0.5", 0));
    assert_eq!(&out[12..14], &[0x08, 0x00], "no tag");
}

/// A next hop on another port: the frame is redirected there, with the next
/// hop's L2 header; this one is untagged, so the ingress tag is removed.
#[test]
fn vlan_tag_is_removed_when_the_next_hop_is_on_another_port() {
    if !require_root("loading the xdp fixtures' BPF programs") {
        return;
    }
    const XDP_REDIRECT: u32 = 4;
    // test runs see the loopback device (ifindex 1) as the ingress port
    let other = NextHop { ifindex: 999, ..NH };
    let resolver = StaticResolver {
        default: Some(NH),
        per_addr: [(ip("10.1.0.7"), other)].into_iter().collect(),
    };
    let mut dp = XdpDatapath::load(&opts(1500, true), Box::new(resolver)).unwrap();
    let v = vip("10.100.0.7", 80, Proto::Tcp);
    dp.apply(&state(vec![(v, svc(&v, &["10.1.0.7"], 0))]))
        .unwrap();
    let mut f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.7"), 40000, 80);
    f.vlan = Some(0x0064);
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_REDIRECT);
    let untagged = Frame {
        vlan: None,
        ..f.clone()
    };
    assert_eq!(out, encapped(&untagged, "10.0.0.11", "10.1.0.7", 0));
    assert_eq!(
        out.len(),
        f.bytes().len() + 20 - 4,
        "tag gone, outer header added"
    );
    assert_eq!(counter(&dp, "redirect"), 1);
    // the same without a tag: only the outer header is added
    let plain = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.7"), 40001, 80);
    let (verdict, out) = run(&dp, &plain.bytes());
    assert_eq!(verdict, XDP_REDIRECT);
    assert_eq!(out, encapped(&plain, "10.0.0.11", "10.1.0.7", 0));
}

#[test]
fn non_vip_traffic_passes_untouched() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "pass_not_vip",
            Frame::tcp(ip("192.0.2.7"), ip("10.100.0.2"), 1, 80).bytes(),
        ),
        (
            "pass_not_vip",
            Frame::udp(ip("192.0.2.7"), ip("10.100.0.2"), 1, 53).bytes(),
        ),
        ("pass_not_ip", {
            let mut arp = l2_header([0xff; 6], NH.smac, None, 0x0806);
            arp.extend([0u8; 28]);
            arp
        }),
        ("pass_icmp", {
            let mut f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.2"), 0, 0);
            f.proto = 1;
            f.bytes()
        }),
        ("pass_fragment", {
            let mut b = Frame::udp(ip("192.0.2.7"), ip("10.100.0.2"), 5, 53).bytes();
            b[14 + 6] |= 0x20; // MF (checksum not fixed: the program does not check it)
            b
        }),
        ("pass_ipv6_ext", {
            let mut f = Frame::tcp(ip("2001:db8:ffff::9"), ip("2001:db8:100::2"), 1, 443);
            f.proto = 0; // hop-by-hop options
            f.bytes()
        }),
        ("pass_other_l4", {
            let mut f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.2"), 1, 80);
            f.proto = 132; // SCTP
            f.bytes()
        }),
    ];
    for (label, frame) in cases {
        let before = counter(&dp, label);
        let (verdict, out) = run(&dp, &frame);
        assert_eq!(verdict, XDP_PASS, "{label}");
        assert_eq!(out, frame, "{label}: passed frames are not modified");
        assert_eq!(counter(&dp, label), before + 1, "{label}");
    }
    assert_eq!(counter(&dp, "tx"), 0);
}

#[test]
fn truncated_and_malformed_headers_pass_without_overreading() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    let good = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80).bytes();
    let good6 = Frame::tcp(ip("2001:db8:ffff::9"), ip("2001:db8:100::1"), 1, 443).bytes();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("eth only", good[..14].to_vec()),
        ("half an IPv4 header", good[..14 + 10].to_vec()),
        ("ports cut", {
            let mut b = good[..14 + 20 + 2].to_vec();
            b[14 + 2..14 + 4].copy_from_slice(&22u16.to_be_bytes());
            b
        }),
        ("half an IPv6 header", good6[..14 + 20].to_vec()),
        ("vlan tag cut", {
            let mut b = l2_header([1; 6], [2; 6], None, 0x8100);
            b.extend([0, 1]);
            b
        }),
    ];
    let mut long = good.clone();
    long[14 + 2..14 + 4].copy_from_slice(&1000u16.to_be_bytes()); // tot_len > frame
    cases.push(("tot_len beyond frame", long));
    let mut ihl = good.clone();
    ihl[14] = 0x44; // ihl 4 < 5
    cases.push(("ihl < 5", ihl));
    let mut v6len = good6.clone();
    v6len[14 + 4..14 + 6].copy_from_slice(&900u16.to_be_bytes());
    cases.push(("ipv6 payload_len beyond frame", v6len));
    // An IPv4 header with no L4 (tot_len 20), padded to Ethernet's 60-byte minimum
    // with bytes that look like ports to the VIP: the ports are not in the packet.
    let mut padded = good[..14 + 20].to_vec();
    padded[14 + 2..14 + 4].copy_from_slice(&20u16.to_be_bytes());
    padded.extend(40000u16.to_be_bytes());
    padded.extend(80u16.to_be_bytes());
    padded.resize(60, 0);
    cases.push(("ports in Ethernet padding", padded));
    for (what, frame) in cases {
        let before = counter(&dp, "pass_malformed");
        let (verdict, out) = run(&dp, &frame);
        assert_eq!(verdict, XDP_PASS, "{what}");
        assert_eq!(out, frame, "{what}");
        assert_eq!(counter(&dp, "pass_malformed"), before + 1, "{what}");
    }
}

#[test]
fn oversize_after_encap_without_df_is_counted_and_passed() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    // inner 1480 + 20 = 1500: fits
    let mut f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    f.payload = 1480 - 40;
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    assert_eq!(out.len(), 14 + 1500);
    // inner 1481 + 20 > 1500 without DF: passed unchanged, counted (with DF,
    // or IPv6, the program answers with ICMP: xdp_ptb.rs)
    f.payload += 1;
    f.df = false;
    let (verdict, out) = run(&dp, &f.bytes());
    assert_eq!(verdict, XDP_PASS);
    assert_eq!(out, f.bytes());
    assert_eq!(counter(&dp, "pass_mtu"), 1);
    // IPv6 outer adds 40: inner 1461 + 40 > 1500
    let mut f = Frame::tcp(ip("2001:db8:ffff::9"), ip("2001:db8:100::1"), 1, 443);
    f.payload = 1461 - 60;
    assert_eq!(run(&dp, &f.bytes()).0, XDP_TX);
    assert_eq!(counter(&dp, "pass_mtu"), 1);
    assert_eq!(counter(&dp, "icmp_too_big"), 1);
}

#[test]
fn missing_outer_source_and_unresolved_next_hop() {
    // no IPv6 source configured: v6 backends cannot be reached -> pass, counted
    let Some(mut dp) = load(1500, false) else {
        return;
    };
    dp.apply(&base_state()).unwrap();
    let f = Frame::tcp(ip("2001:db8:ffff::9"), ip("2001:db8:100::1"), 1, 443);
    assert_eq!(run(&dp, &f.bytes()).0, XDP_PASS);
    assert_eq!(counter(&dp, "pass_no_src"), 1);
    // a resolver that knows nothing: nh_valid = 0, fib fallback off -> drop
    let mut dp =
        XdpDatapath::load(&opts(1500, false), Box::new(StaticResolver::default())).unwrap();
    dp.apply(&base_state()).unwrap();
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    assert_eq!(run(&dp, &f.bytes()).0, XDP_DROP);
    assert_eq!(counter(&dp, "drop_fib"), 1);
}

#[test]
fn maglev_ring_in_the_kernel_agrees_with_the_rust_table() {
    use ringlb_maglev::{Backend, Table, flow_hash};
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    let backends: Vec<Backend> = (1..=5)
        .map(|i| Backend {
            addr: ip(&format!("10.1.0.{i}")),
            port: 8080,
            weight: 1,
        })
        .collect();
    let table = Table::build(&backends, 65_537).unwrap();
    dp.apply(&state(vec![(
        v,
        ServiceEntry::from_table(&v, &table).unwrap(),
    )]))
    .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for sport in 30000..30200u16 {
        let src = ip(&format!("192.0.2.{}", sport % 200 + 1));
        let f = Frame::tcp(src, ip("10.100.0.1"), sport, 80);
        let want = table
            .lookup(flow_hash(src, ip("10.100.0.1"), sport, 80, 6))
            .addr;
        let (verdict, out) = run(&dp, &f.bytes());
        assert_eq!(verdict, XDP_TX);
        assert_eq!(
            out,
            encapped(&f, "10.0.0.11", &want.to_string(), 0),
            "flow {src}:{sport}"
        );
        // the handshake's ACK inserts the entry (the SYN does not)
        let ack = f.clone().established();
        assert_eq!(
            run(&dp, &ack.bytes()).1,
            encapped(&ack, "10.0.0.11", &want.to_string(), 0),
            "ACK of {src}:{sport}"
        );
        // the operator lookup answers the same, now from conntrack
        let (raw_s, fam) = ringlb_xdp::abi::RawAddr::from_ip(src);
        let flow = ringlb_xdp::abi::Flow {
            saddr: raw_s,
            daddr: ringlb_xdp::abi::RawAddr::from_ip(ip("10.100.0.1")).0,
            sport: ringlb_xdp::abi::Be16::from_host(sport),
            dport: ringlb_xdp::abi::Be16::from_host(80),
            proto: 6,
            family: fam,
            flags: 0,
            pad: 0,
        };
        match dp.lookup(&flow).unwrap() {
            ringlb_xdp::lookup::Lookup::Backend {
                addr,
                conntrack: ringlb_xdp::lookup::CtState::Hit,
                ..
            } => assert_eq!(addr, want),
            other => panic!("flow {src}:{sport}: {other:?}"),
        }
        seen.insert(want);
    }
    assert_eq!(seen.len(), 5, "200 flows reach all 5 backends");
}

#[test]
fn ring_slots_are_written_through_mmap() {
    use aya::maps::{Array, IterableMap, MapData};
    use ringlb_xdp::batch::{BPF_F_MMAPABLE, write_mmapped_u32};
    use std::os::fd::AsFd;
    if !require_root("creating BPF maps") {
        return;
    }
    const BPF_F_INNER_MAP: u32 = 1 << 12;
    let ring = Array::<MapData, u32>::create(251, BPF_F_INNER_MAP | BPF_F_MMAPABLE).unwrap();
    let fd = ring.map().fd().as_fd();
    write_mmapped_u32(fd, 251, &[(0, 7), (1, 8), (250, 9)]).unwrap();
    assert_eq!(ring.get(&0, 0).unwrap(), 7);
    assert_eq!(ring.get(&1, 0).unwrap(), 8);
    assert_eq!(ring.get(&250, 0).unwrap(), 9);
    assert_eq!(ring.get(&2, 0).unwrap(), 0);
    assert!(
        write_mmapped_u32(fd, 251, &[(251, 1)]).is_err(),
        "out of range is refused"
    );
    // a ring without BPF_F_MMAPABLE cannot be mapped (the loader then batches)
    let plain = Array::<MapData, u32>::create(251, BPF_F_INNER_MAP).unwrap();
    assert!(write_mmapped_u32(plain.map().fd().as_fd(), 251, &[(0, 1)]).is_err());
}

#[test]
fn ipv4_with_options_finds_the_ports_behind_them() {
    use ringlb_testkit::packet::ipv4_checksum;
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    // the VIP matches only if dport is read after the 4 option bytes (reading
    // at offset 20 would see the options and pass the packet as not-a-VIP)
    dp.apply(&base_state()).unwrap();
    let f = Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), 40000, 80);
    let plain = f.bytes();
    let mut l3 = plain[14..34].to_vec();
    l3[0] = 0x46; // IHL 6
    let tot = (plain.len() - 14 + 4) as u16;
    l3[2..4].copy_from_slice(&tot.to_be_bytes());
    l3[10..12].copy_from_slice(&[0, 0]);
    l3.extend([1, 1, 1, 0]); // NOP NOP NOP EOL
    let c = ipv4_checksum(&l3);
    l3[10..12].copy_from_slice(&c.to_be_bytes());
    l3.extend_from_slice(&plain[34..]);
    let mut frame = plain[..14].to_vec();
    frame.extend_from_slice(&l3);
    let (verdict, out) = run(&dp, &frame);
    assert_eq!(verdict, XDP_TX);
    let mut want = l2_header(NH.dmac, NH.smac, None, 0x0800);
    want.extend(ip_header(
        ip("10.0.0.11"),
        ip("10.1.0.1"),
        4,
        l3.len(),
        0,
        true,
        64,
        0,
    ));
    want.extend(&l3);
    assert_eq!(out, want);
}
