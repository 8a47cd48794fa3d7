//! rtnetlink address messages (linux/rtnetlink.h, linux/if_addr.h): what
//! `ip addr add VIP/32 dev lo` sends, so IPVS sees the VIP's packets in
//! LOCAL_IN.
//!
//! ringlb marks the addresses it binds, so a later run (after a crash) finds
//! and removes them without touching an operator's: every one carries
//! `IFA_F_NOPREFIXROUTE` (a host route on `lo` needs no prefix route), and an
//! IPv4 one also the label `lo:ringlb` (the kernel keeps no labels for IPv6).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::consts::*;
use super::{DecodeError, Writer, attrs};
use crate::model::af_of;

/// `lo`'s ifindex: the loopback device is the first one of every namespace
/// (`LOOPBACK_IFINDEX` in include/net/flow.h).
pub const LO_IFINDEX: u32 = 1;
/// The label of the IPv4 VIPs ringlb binds.
pub const LABEL: &str = "lo:ringlb";

fn host_prefix(a: IpAddr) -> u8 {
    match a {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn ifaddrmsg(w: &mut Writer, family: u8, prefix: u8, index: u32) {
    w.bytes(&[family, prefix, 0, 0]).bytes(&index.to_ne_bytes());
}

fn marks(addr: IpAddr) -> u32 {
    match addr {
        IpAddr::V4(_) => IFA_F_NOPREFIXROUTE,
        IpAddr::V6(_) => IFA_F_NOPREFIXROUTE | IFA_F_NODAD,
    }
}

/// `RTM_NEWADDR` of `addr`/32 (/128) on `ifindex`, marked as ringlb's.
pub fn add(addr: IpAddr, ifindex: u32, seq: u32) -> Vec<u8> {
    let mut w = Writer::new(
        RTM_NEWADDR,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE_EXCL,
        seq,
    );
    ifaddrmsg(&mut w, af_of(addr) as u8, host_prefix(addr), ifindex);
    w.attr(IFA_LOCAL, &octets(addr))
        .attr(IFA_ADDRESS, &octets(addr));
    if addr.is_ipv4() {
        w.string(IFA_LABEL, LABEL);
    }
    w.u32(IFA_FLAGS, marks(addr)).finish()
}

/// `RTM_DELADDR` of `addr`/32 (/128) on `ifindex`.
pub fn del(addr: IpAddr, ifindex: u32, seq: u32) -> Vec<u8> {
    let mut w = Writer::new(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, seq);
    ifaddrmsg(&mut w, af_of(addr) as u8, host_prefix(addr), ifindex);
    w.attr(IFA_LOCAL, &octets(addr))
        .attr(IFA_ADDRESS, &octets(addr))
        .finish()
}

/// `RTM_GETADDR` dump of every address of every family.
pub fn dump(seq: u32) -> Vec<u8> {
    let mut w = Writer::new(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq);
    ifaddrmsg(&mut w, 0, 0, 0);
    w.finish()
}

/// One address of a `RTM_NEWADDR` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAddr {
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub ifindex: u32,
    pub label: Option<String>,
    /// `IFA_FLAGS` if present, else the header's 8-bit flags.
    pub flags: u32,
}

impl LocalAddr {
    /// Decodes the payload of an `RTM_NEWADDR` message.
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        const W: &str = "ifaddrmsg";
        if payload.len() < IFADDRMSG_LEN {
            return Err(DecodeError::Short {
                what: W,
                len: payload.len(),
                need: IFADDRMSG_LEN,
            });
        }
        let (family, prefix_len, flags8) = (payload[0], payload[1], payload[2]);
        let ifindex = u32::from_ne_bytes(payload[4..8].try_into().expect("4"));
        let (mut local, mut address, mut label, mut flags) = (None, None, None, None);
        for a in attrs(&payload[IFADDRMSG_LEN..], W)? {
            match a.ty {
                IFA_LOCAL => local = Some(a.payload),
                IFA_ADDRESS => address = Some(a.payload),
                IFA_LABEL => label = Some(a.string("IFA_LABEL")?),
                IFA_FLAGS => flags = Some(a.u32(W)?),
                _ => {}
            }
        }
        // IPv4 reports IFA_LOCAL (and IFA_ADDRESS, the peer); IPv6 only IFA_ADDRESS.
        let raw = local.or(address).ok_or(DecodeError::Missing {
            within: W,
            attr: IFA_ADDRESS,
        })?;
        let addr = match (u16::from(family), raw.len()) {
            (AF_INET, 4) => IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3])),
            (AF_INET6, 16) => {
                IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(raw).expect("16 bytes")))
            }
            (f, n) => {
                return Err(DecodeError::Value {
                    what: "address family / length",
                    value: (u64::from(f) << 32) | n as u64,
                });
            }
        };
        Ok(LocalAddr {
            addr,
            prefix_len,
            ifindex,
            label,
            flags: flags.unwrap_or(flags8.into()),
        })
    }

    /// Whether ringlb bound this address (see the module's marks).
    pub fn is_ringlb_vip(&self) -> bool {
        self.ifindex == LO_IFINDEX
            && self.prefix_len == host_prefix(self.addr)
            && self.flags & IFA_F_NOPREFIXROUTE != 0
            && (self.addr.is_ipv6() || self.label.as_deref() == Some(LABEL))
    }

    /// The answer the kernel sends for a VIP ringlb bound (tests, fuzz corpus).
    pub fn encode(&self, seq: u32) -> Vec<u8> {
        let mut w = Writer::new(RTM_NEWADDR, NLM_F_MULTI, seq);
        ifaddrmsg(
            &mut w,
            af_of(self.addr) as u8,
            self.prefix_len,
            self.ifindex,
        );
        w.attr(IFA_ADDRESS, &octets(self.addr));
        if let Some(l) = &self.label {
            w.string(IFA_LABEL, l);
        }
        w.u32(IFA_FLAGS, self.flags).finish()
    }
}
