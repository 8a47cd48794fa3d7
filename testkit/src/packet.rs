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
}
