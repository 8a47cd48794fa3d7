//! BPF_PROG_TEST_RUN fixtures for BFD held by the datapath across a hitless
//! restart (`bpf/bfd_hold.h`): exact input and output frames, verdicts and
//! the entry's counters. Needs root (BPF); skips loudly otherwise.

mod xdp_support;
use xdp_support::fixture::*;

use std::net::Ipv4Addr;
use std::time::Duration;

use ringlb_testkit::packet::{internet_checksum, ipv4_checksum, pseudo_header_sum};
use ringlb_xdp::bfd_hold::{HeldSession, monotonic_now};
use ringlb_xdp::xdp::XdpDatapath;

const TOR_MAC: [u8; 6] = [0x02, 0x70, 0, 0, 0, 0x01];
const EDGE_MAC: [u8; 6] = [0x02, 0xed, 0, 0, 0, 0x11];
const TOR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const EDGE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
const OUR_DISC: u32 = 0x1122_3344;
const PEER_DISC: u32 = 0x0000_0007;
const OUR_PORT: u16 = 49200;

/// A BFD Control packet's 24 bytes.
struct Bfd {
    state: u8,
    flags: u8, // P F C A D M, in the low 6 bits of byte 1
    mult: u8,
    my: u32,
    your: u32,
    tx_us: u32,
    rx_us: u32,
}

impl Bfd {
    fn tor_up(poll: bool) -> Bfd {
        Bfd {
            state: 3,
            flags: if poll { 0x20 } else { 0 },
            mult: 3,
            my: PEER_DISC,
            your: OUR_DISC,
            tx_us: 300_000,
            rx_us: 300_000,
        }
    }
    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0x20, (self.state << 6) | self.flags, self.mult, 24];
        for w in [self.my, self.your, self.tx_us, self.rx_us, 0] {
            v.extend(w.to_be_bytes());
        }
        v
    }
}

/// An Ethernet + IPv4 + UDP frame with correct checksums (TOS 0xc0, as BIRD
/// sends, DF clear, id 0x1234).
fn frame(
    macs: ([u8; 6], [u8; 6]),
    vlan: Option<u16>,
    (src, dst): (Ipv4Addr, Ipv4Addr),
    (sport, dport): (u16, u16),
    ttl: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(macs.0);
    f.extend(macs.1);
    if let Some(id) = vlan {
        f.extend([0x81, 0x00]);
        f.extend(id.to_be_bytes());
    }
    f.extend([0x08, 0x00]);
    let udp_len = 8 + payload.len();
    let mut ip = vec![0x45, 0xc0];
    ip.extend(((20 + udp_len) as u16).to_be_bytes());
    ip.extend([0x12, 0x34, 0, 0, ttl, 17, 0, 0]);
    ip.extend(src.octets());
    ip.extend(dst.octets());
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut udp = Vec::new();
    udp.extend(sport.to_be_bytes());
    udp.extend(dport.to_be_bytes());
    udp.extend((udp_len as u16).to_be_bytes());
    udp.extend([0, 0]);
    udp.extend(payload);
    let c = internet_checksum(pseudo_header_sum(src.into(), dst.into(), 17, udp_len), &udp);
    udp[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
    f.extend(ip);
    f.extend(udp);
    f
}

fn from_tor(ttl: u8, dport: u16, b: &Bfd) -> Vec<u8> {
    frame(
        (EDGE_MAC, TOR_MAC),
        None,
        (TOR, EDGE),
        (49999, dport),
        ttl,
        &b.bytes(),
    )
}

fn held(deadline: Duration) -> HeldSession {
    HeldSession {
        local: EDGE,
        peer: TOR,
        my_disc: OUR_DISC,
        your_disc: PEER_DISC,
        min_tx: Duration::from_millis(100),
        min_rx: Duration::from_millis(300),
        detect_mult: 3,
        peer_min_tx: Duration::from_millis(300),
        peer_min_rx: Duration::from_millis(300),
        peer_mult: 3,
        src_port: OUR_PORT,
        deadline,
    }
}

fn load_with(s: Option<HeldSession>) -> Option<XdpDatapath> {
    let dp = load(1500, false)?;
    if let Some(s) = s {
        dp.bfd_hold().unwrap().write(&s).unwrap();
    }
    Some(dp)
}

fn counts(dp: &XdpDatapath) -> (u64, u32) {
    let e = dp.bfd_hold().unwrap().get(EDGE, TOR).unwrap().unwrap();
    (e.answered, e.refused)
}

/// Checks a frame's IPv4 header and UDP checksums from scratch: both sums
/// over the received bytes (pseudo header included) come to 0xffff.
fn assert_checksums_valid(f: &[u8], l2: usize) {
    let ip = &f[l2..l2 + 20];
    assert_eq!(ipv4_checksum(ip), 0, "IPv4 header checksum");
    let udp = &f[l2 + 20..];
    assert_ne!(&udp[6..8], &[0, 0], "UDP checksum computed, not left out");
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let sum = pseudo_header_sum(src.into(), dst.into(), 17, udp.len());
    assert_eq!(internet_checksum(sum, udp), 0, "UDP checksum");
}

#[test]
fn a_held_session_is_answered_up_with_final_for_a_poll() {
    let Some(dp) = load_with(Some(held(monotonic_now() + Duration::from_secs(60)))) else {
        return;
    };
    for poll in [true, false] {
        let (verdict, out) = run(&dp, &from_tor(255, 3784, &Bfd::tor_up(poll)));
        assert_eq!(verdict, XDP_TX, "poll {poll}");
        // written out by hand: MACs and addresses swapped, TTL 255, our port
        // to 3784, Up (0xc0) with Final (0x10) only for a Poll, mult 3, our
        // discriminator then the ToR's, 100 ms / 300 ms, echo 0
        let want_bfd = [
            0x20,
            if poll { 0xd0 } else { 0xc0 },
            3,
            24,
            0x11,
            0x22,
            0x33,
            0x44,
            0,
            0,
            0,
            7,
            0x00,
            0x01,
            0x86,
            0xa0,
            0x00,
            0x04,
            0x93,
            0xe0,
            0,
            0,
            0,
            0,
        ];
        let want = frame(
            (TOR_MAC, EDGE_MAC),
            None,
            (EDGE, TOR),
            (OUR_PORT, 3784),
            255,
            &want_bfd,
        );
        assert_eq!(out, want, "poll {poll}");
        assert_checksums_valid(&out, 14);
    }
    assert_eq!(counts(&dp), (2, 0));
    let e = dp.bfd_hold().unwrap().get(EDGE, TOR).unwrap().unwrap();
    assert!(e.last_answer.is_some_and(|t| t <= monotonic_now()));
}

#[test]
fn a_vlan_tagged_packet_is_answered_with_its_tag() {
    let Some(dp) = load_with(Some(held(monotonic_now() + Duration::from_secs(60)))) else {
        return;
    };
    let b = Bfd::tor_up(false).bytes();
    let input = frame(
        (EDGE_MAC, TOR_MAC),
        Some(42),
        (TOR, EDGE),
        (49999, 3784),
        255,
        &b,
    );
    let (verdict, out) = run(&dp, &input);
    assert_eq!(verdict, XDP_TX);
    assert_eq!(&out[12..16], &[0x81, 0x00, 0, 42], "tag kept");
    assert_eq!(&out[0..12], &[TOR_MAC, EDGE_MAC].concat()[..]);
    assert_eq!(out[18 + 8 + 20 + 1], 0xc0, "Up, no Final");
    assert_checksums_valid(&out, 18);
}

/// Passed to the kernel, unchanged.
fn assert_passed(dp: &XdpDatapath, input: &[u8]) {
    let (verdict, out) = run(dp, input);
    assert_eq!(verdict, XDP_PASS);
    assert_eq!(out, input);
}

#[test]
fn an_expired_entry_is_not_answered() {
    let Some(dp) = load_with(Some(held(monotonic_now() - Duration::from_millis(1)))) else {
        return;
    };
    assert_passed(&dp, &from_tor(255, 3784, &Bfd::tor_up(true)));
    assert_eq!(counts(&dp), (0, 0));
}

#[test]
fn a_packet_with_ttl_other_than_255_is_not_answered() {
    let Some(dp) = load_with(Some(held(monotonic_now() + Duration::from_secs(60)))) else {
        return;
    };
    assert_passed(&dp, &from_tor(254, 3784, &Bfd::tor_up(false)));
    assert_eq!(counts(&dp), (0, 1), "counted as refused");
}

#[test]
fn other_udp_from_the_held_peer_is_not_answered() {
    let Some(dp) = load_with(Some(held(monotonic_now() + Duration::from_secs(60)))) else {
        return;
    };
    // the echo port and a DNS-sized payload: not BFD Control
    assert_passed(&dp, &from_tor(255, 3785, &Bfd::tor_up(false)));
    let dns = frame(
        (EDGE_MAC, TOR_MAC),
        None,
        (TOR, EDGE),
        (3784, 53),
        64,
        &[0u8; 30],
    );
    assert_passed(&dp, &dns);
    assert_eq!(counts(&dp), (0, 0));
}

#[test]
fn bfd_from_an_unknown_peer_or_another_session_is_not_answered() {
    let Some(dp) = load_with(Some(held(monotonic_now() + Duration::from_secs(60)))) else {
        return;
    };
    let b = Bfd::tor_up(false).bytes();
    let stranger = Ipv4Addr::new(10, 0, 0, 99);
    let other = frame(
        (EDGE_MAC, TOR_MAC),
        None,
        (stranger, EDGE),
        (49999, 3784),
        255,
        &b,
    );
    assert_passed(&dp, &other);
    assert_eq!(counts(&dp), (0, 0), "no entry of its own: nothing counted");
    // the held peer, but not the held session: Down, new discriminators
    let mut down = Bfd::tor_up(false);
    down.state = 1;
    assert_passed(&dp, &from_tor(255, 3784, &down));
    let mut new_disc = Bfd::tor_up(false);
    new_disc.my = 8;
    assert_passed(&dp, &from_tor(255, 3784, &new_disc));
    let mut auth = Bfd::tor_up(false);
    auth.flags = 0x04;
    assert_passed(&dp, &from_tor(255, 3784, &auth));
    assert_eq!(counts(&dp), (0, 3));
}

#[test]
fn without_an_entry_bfd_passes() {
    let Some(dp) = load_with(None) else { return };
    assert_passed(&dp, &from_tor(255, 3784, &Bfd::tor_up(false)));
    assert!(dp.bfd_hold().unwrap().entries().unwrap().is_empty());
}
