//! BPF_PROG_TEST_RUN fixtures for packets too big for the tunnel: the edge
//! answers IPv4 with DF by ICMP Fragmentation Needed (type 3 code 4, next-hop
//! MTU = mtu - outer header) and IPv6 by ICMPv6 Packet Too Big (type 2, MTU =
//! mtu - outer header), from the VIP, by XDP_TX with the MACs swapped; IPv4
//! without DF is still passed. Expected frames are built from scratch by
//! `ringlb_testkit::packet` (checksums computed there, never copied from the
//! program's output) and `verify_checksums` re-checks the output. Needs root.

mod xdp_support;
use xdp_support::fixture::*;

use ringlb_testkit::packet::{Frame, hex, icmp_error, l2_header, verify_checksums};
use ringlb_xdp::{Proto, xdp::XdpDatapath};

/// Bytes of the offending packet the answer quotes (RINGLB_ICMP_QUOTE).
const QUOTE: usize = 512;

/// The ICMP fixtures' services and VIP4:8080/TCP -> an IPv6 backend (4-in-6:
/// 40 bytes of outer).
fn loaded(mtu: u32) -> Option<XdpDatapath> {
    load_applied(
        mtu,
        &icmp_services((vip(VIP4, 8080, Proto::Tcp), "2001:db8:1::1")),
    )
}

/// A TCP packet from the client to `vip:port` whose IP packet is `l3_len`
/// bytes long.
fn tcp(client: &str, vip: &str, port: u16, l3_len: usize) -> Frame {
    let mut f = Frame::tcp(ip(client), ip(vip), 40000, port);
    let hdrs = if f.src.is_ipv4() { 40 } else { 60 };
    f.payload = l3_len - hdrs;
    f
}

/// The answer the program must give to `f`: its L2 header with the MACs
/// swapped (a tag kept), then the ICMP error from the VIP to the client with
/// `mtu` in the MTU field, quoting the first QUOTE bytes of `f`'s IP packet.
fn too_big(f: &Frame, mtu: u16) -> Vec<u8> {
    let (ethertype, icmp_type, code) = if f.src.is_ipv4() {
        (0x0800, 3, 4)
    } else {
        (0x86dd, 2, 0)
    };
    let mut v = l2_header(f.src_mac, f.dst_mac, f.vlan, ethertype);
    let l3 = f.l3();
    v.extend(icmp_error(
        f.dst,
        f.src,
        icmp_type,
        code,
        u32::from(mtu),
        &l3[..QUOTE],
    ));
    v
}

fn assert_answer(dp: &XdpDatapath, f: &Frame, mtu: u16) {
    let (verdict, out) = run(dp, &f.bytes());
    assert_eq!(verdict, XDP_TX);
    let want = too_big(f, mtu);
    assert_eq!(out, want, "\n{}\n--\n{}", hex(&out), hex(&want));
    // (verify_checksums reads untagged frames: drop the tag for it)
    let untagged = match f.vlan {
        Some(_) => [&out[..12], &out[16..]].concat(),
        None => out,
    };
    verify_checksums(&untagged).unwrap();
}

#[test]
fn ipv4_with_df_gets_fragmentation_needed_from_the_vip() {
    let Some(dp) = loaded(1500) else { return };
    // 1480 + 20 fits: encapsulated as ever
    let fits = tcp(CLIENT4, VIP4, 80, 1480);
    assert_eq!(run(&dp, &fits.bytes()).0, XDP_TX);
    assert_eq!(counter(&dp, "tx"), 1);
    // 1481 + 20 does not: type 3 code 4, next-hop MTU 1500 - 20
    let big = tcp(CLIENT4, VIP4, 80, 1481);
    assert!(big.df);
    assert_answer(&dp, &big, 1480);
    assert_eq!(counter(&dp, "icmp_too_big"), 1);
    assert_eq!(counter(&dp, "pass_mtu"), 0);
    assert_eq!(
        counter(&dp, "tx"),
        1,
        "the answer is not counted as encapsulated"
    );
    // a full-size 1500-byte client packet (the case the MSS clamp avoids)
    assert_answer(&dp, &tcp(CLIENT4, VIP4, 80, 1500), 1480);
    assert_eq!(counter(&dp, "icmp_too_big"), 2);
}

#[test]
fn ipv6_gets_packet_too_big_with_the_pseudo_header_checksum() {
    let Some(dp) = loaded(1500) else { return };
    let fits = tcp(CLIENT6, VIP6, 443, 1460);
    assert_eq!(run(&dp, &fits.bytes()).0, XDP_TX);
    // 1461 + 40 > 1500: ICMPv6 type 2, MTU 1500 - 40
    assert_answer(&dp, &tcp(CLIENT6, VIP6, 443, 1461), 1460);
    assert_answer(&dp, &tcp(CLIENT6, VIP6, 443, 1500), 1460);
    assert_eq!(counter(&dp, "icmp_too_big"), 2);
}

#[test]
fn ipv4_to_an_ipv6_backend_reports_the_ipv6_overhead() {
    let Some(dp) = loaded(1500) else { return };
    assert_eq!(run(&dp, &tcp(CLIENT4, VIP4, 8080, 1460).bytes()).0, XDP_TX);
    assert_answer(&dp, &tcp(CLIENT4, VIP4, 8080, 1461), 1460);
}

#[test]
fn a_vlan_tag_is_kept_on_the_answer() {
    let Some(dp) = loaded(1500) else { return };
    let mut big = tcp(CLIENT4, VIP4, 80, 1481);
    big.vlan = Some(100);
    assert_answer(&dp, &big, 1480);
    let mut big6 = tcp(CLIENT6, VIP6, 443, 1461);
    big6.vlan = Some(4094);
    assert_answer(&dp, &big6, 1460);
}

#[test]
fn a_smaller_configured_mtu_is_what_the_client_is_told() {
    let Some(dp) = loaded(1400) else { return };
    assert_answer(&dp, &tcp(CLIENT4, VIP4, 80, 1381), 1380);
    assert_answer(&dp, &tcp(CLIENT6, VIP6, 443, 1361), 1360);
}

#[test]
fn ipv4_without_df_is_still_passed_and_counted() {
    let Some(dp) = loaded(1500) else { return };
    let mut udp = Frame::udp(ip(CLIENT4), ip(VIP4), 40000, 53);
    udp.payload = 1481 - 28;
    assert!(!udp.df);
    let (verdict, out) = run(&dp, &udp.bytes());
    assert_eq!(verdict, XDP_PASS);
    assert_eq!(out, udp.bytes(), "not one byte may change");
    let mut no_df = tcp(CLIENT4, VIP4, 80, 1481);
    no_df.df = false;
    assert_eq!(run(&dp, &no_df.bytes()), (XDP_PASS, no_df.bytes()));
    assert_eq!(counter(&dp, "pass_mtu"), 2);
    assert_eq!(counter(&dp, "icmp_too_big"), 0);
}
