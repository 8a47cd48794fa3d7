//! Packet builders for BPF_PROG_TEST_RUN fixtures and the benchmark (pure).
//! They produce real frames (correct IPv4 header checksums); L4 checksums are
//! left zero because the datapath never reads or changes them.

use std::net::IpAddr;

/// One test frame.
#[derive(Clone, Debug)]
pub struct Frame {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub vlan: Option<u16>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub payload: usize,
    pub ttl: u8,
    pub tos: u8,
    pub df: bool,
    /// TCP flags byte (CWR ECE URG ACK PSH RST SYN FIN); ignored for UDP.
    pub tcp_flags: u8,
}

/// TCP flags: a connection's first packet, and any later one.
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

impl Frame {
    pub fn tcp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> Self {
        Self {
            dst_mac: [0x02, 0, 0, 0, 0, 0x01],
            src_mac: [0x02, 0, 0, 0, 0, 0x02],
            vlan: None,
            src,
            dst,
            proto: 6,
            sport,
            dport,
            payload: 0,
            ttl: 64,
            tos: 0,
            df: true,
            tcp_flags: TCP_SYN,
        }
    }
    pub fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> Self {
        Self {
            proto: 17,
            df: false,
            ..Self::tcp(src, dst, sport, dport)
        }
    }

    /// The same flow's packet once the connection is up (TCP ACK).
    pub fn established(mut self) -> Self {
        self.tcp_flags = TCP_ACK;
        self
    }

    /// L4 header (+ payload): 20-byte TCP (flags `tcp_flags`) or 8-byte UDP.
    pub fn l4(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.sport.to_be_bytes());
        v.extend_from_slice(&self.dport.to_be_bytes());
        if self.proto == 6 {
            v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, self.tcp_flags]);
            v.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
        } else {
            let len = (8 + self.payload) as u16;
            v.extend_from_slice(&len.to_be_bytes());
            v.extend_from_slice(&[0, 0]);
        }
        v.extend((0..self.payload).map(|i| (i & 0xff) as u8));
        v
    }

    /// The L3 packet (IP header + L4).
    pub fn l3(&self) -> Vec<u8> {
        let l4 = self.l4();
        let mut v = ip_header(
            self.src,
            self.dst,
            self.proto,
            l4.len(),
            self.tos,
            self.df,
            self.ttl,
            0,
        );
        v.extend_from_slice(&l4);
        v
    }

    /// The whole frame.
    pub fn bytes(&self) -> Vec<u8> {
        let ethertype = if self.src.is_ipv4() {
            0x0800u16
        } else {
            0x86dd
        };
        let mut v = l2_header(self.dst_mac, self.src_mac, self.vlan, ethertype);
        v.extend_from_slice(&self.l3());
        v
    }
}

/// `b` in hex, 16 bytes a line: for the message of a failed frame comparison.
pub fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| {
            c.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Ethernet header (+ one 802.1Q tag).
pub fn l2_header(dst: [u8; 6], src: [u8; 6], vlan: Option<u16>, ethertype: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(18);
    v.extend_from_slice(&dst);
    v.extend_from_slice(&src);
    if let Some(tci) = vlan {
        v.extend_from_slice(&0x8100u16.to_be_bytes());
        v.extend_from_slice(&tci.to_be_bytes());
    }
    v.extend_from_slice(&ethertype.to_be_bytes());
    v
}

/// An IPv4 header (with checksum) or an IPv6 header for `payload_len` bytes.
/// `flow_label` is used for IPv6 only.
#[allow(clippy::too_many_arguments)]
pub fn ip_header(
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    payload_len: usize,
    tos: u8,
    df: bool,
    ttl: u8,
    flow_label: u32,
) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = vec![0x45, tos];
            h.extend_from_slice(&((20 + payload_len) as u16).to_be_bytes());
            h.extend_from_slice(&[0, 0]);
            h.extend_from_slice(&(if df { 0x4000u16 } else { 0 }).to_be_bytes());
            h.extend_from_slice(&[ttl, proto, 0, 0]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let c = ipv4_checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            h
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let first = (6u32 << 28) | ((tos as u32) << 20) | (flow_label & 0xf_ffff);
            let mut h = first.to_be_bytes().to_vec();
            h.extend_from_slice(&(payload_len as u16).to_be_bytes());
            h.extend_from_slice(&[proto, ttl]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            h
        }
        _ => panic!("ip_header: mixed families {src} -> {dst}"),
    }
}

/// RFC 1071 checksum of an IPv4 header whose checksum field is zero.
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// RFC 1071 Internet checksum of `data` (odd lengths padded with a zero byte),
/// starting from the partial sum `init` (for pseudo headers).
pub fn internet_checksum(init: u32, data: &[u8]) -> u16 {
    let mut sum = init;
    for c in data.chunks(2) {
        let hi = u32::from(c[0]) << 8;
        sum += hi | c.get(1).map_or(0, |b| u32::from(*b));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The partial sum of the TCP/UDP/ICMPv6 pseudo header.
pub fn pseudo_header_sum(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> u32 {
    let mut b = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            b.extend_from_slice(&s.octets());
            b.extend_from_slice(&d.octets());
            b.extend_from_slice(&[0, proto]);
            b.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            b.extend_from_slice(&s.octets());
            b.extend_from_slice(&d.octets());
            b.extend_from_slice(&(len as u32).to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => panic!("pseudo header: mixed families {src} -> {dst}"),
    }
    u32::from(!internet_checksum(0, &b))
}

/// The checksum field value for an L4 segment (`segment`'s own checksum field
/// zero) of `proto` between `src` and `dst`. A UDP result of 0 is sent as 0xffff.
pub fn l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, segment: &[u8]) -> u16 {
    let c = internet_checksum(pseudo_header_sum(src, dst, proto, segment.len()), segment);
    if proto == 17 && c == 0 { 0xffff } else { c }
}

/// A TCP or UDP segment with a real checksum, for fixtures that check the
/// datapath's checksum updates (`Frame` leaves L4 checksums zero).
#[derive(Clone, Debug)]
pub struct Segment {
    pub src: std::net::SocketAddr,
    pub dst: std::net::SocketAddr,
    /// 6 = TCP, 17 = UDP.
    pub proto: u8,
    /// TCP flags byte.
    pub flags: u8,
    /// TCP options (padded to a multiple of 4 with EOL).
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
    /// UDP over IPv4 only: send checksum 0 ("no checksum").
    pub udp_no_checksum: bool,
}

/// TCP SYN+ACK flags.
pub const TCP_SYN_ACK: u8 = TCP_SYN | TCP_ACK;

/// The TCP MSS option (kind 2, length 4).
pub fn tcp_opt_mss(mss: u16) -> Vec<u8> {
    let m = mss.to_be_bytes();
    vec![2, 4, m[0], m[1]]
}

impl Segment {
    pub fn tcp(src: std::net::SocketAddr, dst: std::net::SocketAddr, flags: u8) -> Self {
        Self {
            src,
            dst,
            proto: 6,
            flags,
            options: Vec::new(),
            payload: Vec::new(),
            udp_no_checksum: false,
        }
    }
    pub fn udp(src: std::net::SocketAddr, dst: std::net::SocketAddr, payload: &[u8]) -> Self {
        Self {
            proto: 17,
            payload: payload.to_vec(),
            ..Self::tcp(src, dst, 0)
        }
    }

    /// The L4 bytes with their checksum.
    pub fn l4(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.src.port().to_be_bytes());
        v.extend_from_slice(&self.dst.port().to_be_bytes());
        let csum_at = if self.proto == 6 { 16 } else { 6 };
        if self.proto == 6 {
            let mut opts = self.options.clone();
            while !opts.len().is_multiple_of(4) {
                opts.push(0);
            }
            let doff = ((20 + opts.len()) / 4) as u8;
            v.extend_from_slice(&0x0102_0304u32.to_be_bytes()); // seq
            v.extend_from_slice(&0x0a0b_0c0du32.to_be_bytes()); // ack
            v.extend_from_slice(&[doff << 4, self.flags, 0xfa, 0xf0, 0, 0, 0, 0]);
            v.extend_from_slice(&opts);
        } else {
            v.extend_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
            v.extend_from_slice(&[0, 0]);
        }
        v.extend_from_slice(&self.payload);
        if !(self.proto == 17 && self.udp_no_checksum) {
            let c = l4_checksum(self.src.ip(), self.dst.ip(), self.proto, &v);
            v[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
        }
        v
    }

    /// IP header (TTL 64, DF for TCP, no DF for UDP) + L4.
    pub fn l3(&self) -> Vec<u8> {
        let l4 = self.l4();
        let mut v = ip_header(
            self.src.ip(),
            self.dst.ip(),
            self.proto,
            l4.len(),
            0,
            self.proto == 6,
            64,
            0,
        );
        v.extend_from_slice(&l4);
        v
    }

    /// Ethernet (02:..:01 <- 02:..:02) + L3.
    pub fn frame(&self) -> Vec<u8> {
        eth(&self.l3())
    }
}

/// An Ethernet frame (02:00:00:00:00:01 <- 02:00:00:00:00:02) around an IP
/// packet, EtherType from its version nibble.
pub fn eth(l3: &[u8]) -> Vec<u8> {
    let ethertype = if l3[0] >> 4 == 4 { 0x0800 } else { 0x86dd };
    let mut v = l2_header(
        [0x02, 0, 0, 0, 0, 0x01],
        [0x02, 0, 0, 0, 0, 0x02],
        None,
        ethertype,
    );
    v.extend_from_slice(l3);
    v
}

/// An outer header (IPv4 DF TTL 64 / IPv6 hop limit 64) from `src` to `dst`
/// around the IP packet `inner`: protocol 4 for IPv4 inside, 41 for IPv6.
pub fn ipip(src: IpAddr, dst: IpAddr, inner: &[u8]) -> Vec<u8> {
    let proto = if inner[0] >> 4 == 4 { 4 } else { 41 };
    let mut v = ip_header(src, dst, proto, inner.len(), 0, true, 64, 0);
    v.extend_from_slice(inner);
    v
}

/// An ICMP (IPv4) or ICMPv6 error from `src` to `dst`: type, code, the 4
/// bytes after the checksum (e.g. the MTU of Frag Needed / Packet Too Big),
/// quoting `quoted` (the start of the offending packet). Checksum computed.
pub fn icmp_error(
    src: IpAddr,
    dst: IpAddr,
    icmp_type: u8,
    code: u8,
    rest: u32,
    quoted: &[u8],
) -> Vec<u8> {
    let mut m = vec![icmp_type, code, 0, 0];
    m.extend_from_slice(&rest.to_be_bytes());
    m.extend_from_slice(quoted);
    let proto = if src.is_ipv4() { 1 } else { 58 };
    let c = if src.is_ipv4() {
        internet_checksum(0, &m)
    } else {
        l4_checksum(src, dst, 58, &m)
    };
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut v = ip_header(src, dst, proto, m.len(), 0xc0, false, 64, 0);
    v.extend_from_slice(&m);
    v
}

/// Checks every checksum of an Ethernet frame carrying IPv4/IPv6 with TCP,
/// UDP, ICMP or ICMPv6: the IPv4 header, the L4 checksum over its pseudo
/// header, and for ICMP errors the quoted IPv4 header. `Err` names the first
/// wrong one. (An independent check: it never reuses the datapath's output.)
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let l3 = &frame[14..];
    let (src, dst, proto, l4): (IpAddr, IpAddr, u8, &[u8]) = match l3[0] >> 4 {
        4 => {
            let ihl = usize::from(l3[0] & 0xf) * 4;
            if internet_checksum(0, &l3[..ihl]) != 0 {
                return Err("IPv4 header checksum".into());
            }
            let tot = usize::from(u16::from_be_bytes([l3[2], l3[3]]));
            let s: [u8; 4] = l3[12..16].try_into().unwrap();
            let d: [u8; 4] = l3[16..20].try_into().unwrap();
            (s.into(), d.into(), l3[9], &l3[ihl..tot])
        }
        6 => {
            let plen = usize::from(u16::from_be_bytes([l3[4], l3[5]]));
            let s: [u8; 16] = l3[8..24].try_into().unwrap();
            let d: [u8; 16] = l3[24..40].try_into().unwrap();
            (s.into(), d.into(), l3[6], &l3[40..40 + plen])
        }
        v => return Err(format!("IP version {v}")),
    };
    let ok = match proto {
        6 | 58 => internet_checksum(pseudo_header_sum(src, dst, proto, l4.len()), l4) == 0,
        17 => {
            l4[6..8] == [0, 0] && src.is_ipv4()
                || internet_checksum(pseudo_header_sum(src, dst, proto, l4.len()), l4) == 0
        }
        1 => internet_checksum(0, l4) == 0,
        p => return Err(format!("protocol {p}")),
    };
    if !ok {
        return Err(format!("L4 (protocol {proto}) checksum"));
    }
    if proto == 1 && l4.len() >= 28 && l4[8] >> 4 == 4 {
        let ihl = usize::from(l4[8] & 0xf) * 4;
        if internet_checksum(0, &l4[8..8 + ihl]) != 0 {
            return Err("quoted IPv4 header checksum".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_checksum_matches_a_known_header() {
        // RFC 1071 example style: a header captured from the wire
        // 4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7
        let h = ip_header(
            "192.168.0.1".parse().unwrap(),
            "192.168.0.199".parse().unwrap(),
            17,
            0x73 - 20,
            0,
            true,
            64,
            0,
        );
        assert_eq!(
            h,
            [
                0x45, 0, 0, 0x73, 0, 0, 0x40, 0, 0x40, 0x11, 0xb8, 0x61, 192, 168, 0, 1, 192, 168,
                0, 199
            ]
        );
    }

    #[test]
    fn frames_have_the_right_lengths() {
        let f = Frame::tcp(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            1,
            80,
        );
        assert_eq!(f.bytes().len(), 14 + 20 + 20);
        let f = Frame::udp(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            1,
            53,
        );
        assert_eq!(f.bytes().len(), 14 + 40 + 8);
        let mut f = f;
        f.vlan = Some(7);
        assert_eq!(f.bytes()[12..16], [0x81, 0, 0, 7]);
    }

    #[test]
    fn segments_carry_checksums_that_verify() {
        let a: std::net::SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let b: std::net::SocketAddr = "10.2.0.5:8080".parse().unwrap();
        let mut s = Segment::tcp(a, b, TCP_SYN_ACK);
        s.options = tcp_opt_mss(1460);
        assert_eq!(verify_checksums(&s.frame()), Ok(()));
        let u = Segment::udp(a, b, b"hello");
        assert_eq!(verify_checksums(&u.frame()), Ok(()));
        let a6: std::net::SocketAddr = "[2001:db8::7]:40000".parse().unwrap();
        let b6: std::net::SocketAddr = "[2001:db8:2::5]:8080".parse().unwrap();
        assert_eq!(
            verify_checksums(&Segment::udp(a6, b6, b"x").frame()),
            Ok(())
        );
        let mut f = s.frame();
        f[14 + 20 + 4] ^= 1; // seq
        assert!(verify_checksums(&f).is_err());
        let e = icmp_error(b.ip(), a.ip(), 3, 3, 0, &u.l3());
        assert_eq!(verify_checksums(&eth(&e)), Ok(()));
        let e6 = icmp_error(b6.ip(), a6.ip(), 1, 4, 0, &Segment::udp(a6, b6, b"x").l3());
        assert_eq!(verify_checksums(&eth(&e6)), Ok(()));
    }

    #[test]
    fn internet_checksum_matches_rfc1071_example() {
        // RFC 1071 section 3: 0001 f203 f4f5 f6f7 sums to ddf2
        assert_eq!(
            internet_checksum(0, &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }
}
