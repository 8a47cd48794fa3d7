//! Messages of the `IPVS` generic-netlink family (linux/ip_vs.h; the kernel's
//! side is `ip_vs_genl_*` in net/netfilter/ipvs/ip_vs_ctl.c).
//!
//! A message is a command plus up to two nested attributes:
//! `IPVS_CMD_ATTR_SERVICE` (which service, and for NEW/SET_SERVICE its
//! settings) and `IPVS_CMD_ATTR_DEST` (which real server, and for
//! NEW/SET_DEST its settings). The kernel's dump of services answers with
//! `IPVS_CMD_NEW_SERVICE` messages holding full services plus counters; its
//! dump of a service's real servers with `IPVS_CMD_NEW_DEST` messages holding
//! only the real server, in the service's list order. Unknown attributes are
//! skipped, so newer kernels' additions decode.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::consts::*;
use super::{Attr, DecodeError, Writer, attrs, genl_body};
use crate::model::{Dest, DestKey, Forward, Proto, Service, ServiceKey, Stats, af_of};

/// `IPVS_CMD_*`
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    NewService,
    SetService,
    DelService,
    GetService,
    NewDest,
    SetDest,
    DelDest,
    GetDest,
}

impl Command {
    pub const fn number(self) -> u8 {
        match self {
            Command::NewService => IPVS_CMD_NEW_SERVICE,
            Command::SetService => IPVS_CMD_SET_SERVICE,
            Command::DelService => IPVS_CMD_DEL_SERVICE,
            Command::GetService => IPVS_CMD_GET_SERVICE,
            Command::NewDest => IPVS_CMD_NEW_DEST,
            Command::SetDest => IPVS_CMD_SET_DEST,
            Command::DelDest => IPVS_CMD_DEL_DEST,
            Command::GetDest => IPVS_CMD_GET_DEST,
        }
    }
    pub fn from_number(n: u8) -> Result<Self, DecodeError> {
        Ok(match n {
            IPVS_CMD_NEW_SERVICE => Command::NewService,
            IPVS_CMD_SET_SERVICE => Command::SetService,
            IPVS_CMD_DEL_SERVICE => Command::DelService,
            IPVS_CMD_GET_SERVICE => Command::GetService,
            IPVS_CMD_NEW_DEST => Command::NewDest,
            IPVS_CMD_SET_DEST => Command::SetDest,
            IPVS_CMD_DEL_DEST => Command::DelDest,
            IPVS_CMD_GET_DEST => Command::GetDest,
            n => {
                return Err(DecodeError::Value {
                    what: "IPVS command",
                    value: n.into(),
                });
            }
        })
    }
    fn is_get(self) -> bool {
        matches!(self, Command::GetService | Command::GetDest)
    }
}

/// `IPVS_CMD_ATTR_SERVICE`: a service by key, or with its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SvcAttr {
    Key(ServiceKey),
    Full(Service),
    /// A firewall-mark service (someone else's; ringlb never makes one).
    Fwmark {
        af: u16,
        fwmark: u32,
    },
}

impl SvcAttr {
    pub fn key(&self) -> Option<ServiceKey> {
        match self {
            SvcAttr::Key(k) => Some(*k),
            SvcAttr::Full(s) => Some(s.key),
            SvcAttr::Fwmark { .. } => None,
        }
    }
}

/// `IPVS_CMD_ATTR_DEST`: a real server by key, or with its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DestAttr {
    Key(DestKey),
    Full(Dest),
}

/// One IPVS message. `stats` (`*_ATTR_STATS64`) sits in the dest attribute
/// when there is one, else in the service attribute; only the kernel sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub cmd: Command,
    pub service: Option<SvcAttr>,
    pub dest: Option<DestAttr>,
    pub stats: Option<Stats>,
}

impl Message {
    fn of(cmd: Command, service: Option<SvcAttr>, dest: Option<DestAttr>) -> Self {
        Message {
            cmd,
            service,
            dest,
            stats: None,
        }
    }
    pub fn new_service(s: Service) -> Self {
        Self::of(Command::NewService, Some(SvcAttr::Full(s)), None)
    }
    pub fn set_service(s: Service) -> Self {
        Self::of(Command::SetService, Some(SvcAttr::Full(s)), None)
    }
    pub fn del_service(k: ServiceKey) -> Self {
        Self::of(Command::DelService, Some(SvcAttr::Key(k)), None)
    }
    /// A dump of every service.
    pub fn get_services() -> Self {
        Self::of(Command::GetService, None, None)
    }
    pub fn new_dest(k: ServiceKey, d: Dest) -> Self {
        Self::of(
            Command::NewDest,
            Some(SvcAttr::Key(k)),
            Some(DestAttr::Full(d)),
        )
    }
    pub fn set_dest(k: ServiceKey, d: Dest) -> Self {
        Self::of(
            Command::SetDest,
            Some(SvcAttr::Key(k)),
            Some(DestAttr::Full(d)),
        )
    }
    pub fn del_dest(k: ServiceKey, d: DestKey) -> Self {
        Self::of(
            Command::DelDest,
            Some(SvcAttr::Key(k)),
            Some(DestAttr::Key(d)),
        )
    }
    /// A dump of one service's real servers, in the kernel's list order.
    pub fn get_dests(k: ServiceKey) -> Self {
        Self::of(Command::GetDest, Some(SvcAttr::Key(k)), None)
    }

    /// The flags a request of this command carries: a dump for GET_*, an
    /// acknowledged request otherwise.
    pub fn request_flags(&self) -> u16 {
        if self.cmd.is_get() {
            NLM_F_REQUEST | NLM_F_DUMP
        } else {
            NLM_F_REQUEST | NLM_F_ACK
        }
    }

    /// The request to the family `family` (its id from `ctrl`).
    pub fn encode(&self, family: u16, seq: u32) -> Vec<u8> {
        self.encode_with(family, self.request_flags(), seq)
    }

    pub fn encode_with(&self, family: u16, flags: u16, seq: u32) -> Vec<u8> {
        let mut w = Writer::new(family, flags, seq);
        w.bytes(&[self.cmd.number(), IPVS_GENL_VERSION, 0, 0]);
        let dest_stats = self.dest.is_some();
        if let Some(s) = &self.service {
            w.nest(IPVS_CMD_ATTR_SERVICE);
            put_service(&mut w, s);
            if !dest_stats && let Some(st) = &self.stats {
                put_stats(&mut w, IPVS_SVC_ATTR_STATS64, st);
            }
            w.end_nest();
        }
        if let Some(d) = &self.dest {
            w.nest(IPVS_CMD_ATTR_DEST);
            put_dest(&mut w, d);
            if let Some(st) = &self.stats {
                put_stats(&mut w, IPVS_DEST_ATTR_STATS64, st);
            }
            w.end_nest();
        }
        w.finish()
    }

    /// Decodes the payload of a message of the IPVS family (after nlmsghdr).
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let (cmd, body) = genl_body(payload)?;
        let cmd = Command::from_number(cmd)?;
        let mut m = Message::of(cmd, None, None);
        let mut svc_stats = None;
        for a in attrs(body, "IPVS message")? {
            match a.ty {
                IPVS_CMD_ATTR_SERVICE => {
                    let (s, st) = decode_service(a.payload)?;
                    m.service = Some(s);
                    svc_stats = st;
                }
                IPVS_CMD_ATTR_DEST => {
                    let (d, st) = decode_dest(a.payload)?;
                    m.dest = Some(d);
                    m.stats = st;
                }
                _ => {}
            }
        }
        if m.dest.is_none() {
            m.stats = svc_stats;
        }
        Ok(m)
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first 4.
fn inet_addr(a: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => b = v6.octets(),
    }
    b
}

fn put_service(w: &mut Writer, s: &SvcAttr) {
    let key = match s {
        SvcAttr::Fwmark { af, fwmark } => {
            w.u16(IPVS_SVC_ATTR_AF, *af)
                .u32(IPVS_SVC_ATTR_FWMARK, *fwmark);
            return;
        }
        SvcAttr::Key(k) => k,
        SvcAttr::Full(s) => &s.key,
    };
    w.u16(IPVS_SVC_ATTR_AF, af_of(key.addr))
        .u16(IPVS_SVC_ATTR_PROTOCOL, key.proto.number())
        .attr(IPVS_SVC_ATTR_ADDR, &inet_addr(key.addr))
        .be16(IPVS_SVC_ATTR_PORT, key.port);
    if let SvcAttr::Full(s) = s {
        let mut flags = [0u8; 8]; // struct ip_vs_flags { flags, mask }
        flags[..4].copy_from_slice(&s.flags.to_ne_bytes());
        flags[4..].copy_from_slice(&SVC_FLAGS_MANAGED.to_ne_bytes());
        w.string(IPVS_SVC_ATTR_SCHED_NAME, &s.sched_name)
            .attr(IPVS_SVC_ATTR_FLAGS, &flags)
            .u32(IPVS_SVC_ATTR_TIMEOUT, s.timeout)
            .u32(IPVS_SVC_ATTR_NETMASK, s.netmask);
    }
}

fn put_dest(w: &mut Writer, d: &DestAttr) {
    let key = match d {
        DestAttr::Key(k) => k,
        DestAttr::Full(d) => &d.key,
    };
    w.attr(IPVS_DEST_ATTR_ADDR, &inet_addr(key.addr))
        .be16(IPVS_DEST_ATTR_PORT, key.port)
        .u16(IPVS_DEST_ATTR_ADDR_FAMILY, af_of(key.addr));
    if let DestAttr::Full(d) = d {
        w.u32(IPVS_DEST_ATTR_FWD_METHOD, d.forward.conn_flags())
            .u32(IPVS_DEST_ATTR_WEIGHT, d.weight)
            .u32(IPVS_DEST_ATTR_U_THRESH, d.u_thresh)
            .u32(IPVS_DEST_ATTR_L_THRESH, d.l_thresh);
        if let Some(t) = d.tun_type {
            w.attr(IPVS_DEST_ATTR_TUN_TYPE, &[t]);
        }
    }
}

fn put_stats(w: &mut Writer, ty: u16, s: &Stats) {
    w.nest(ty)
        .u64(IPVS_STATS_ATTR_CONNS, s.conns)
        .u64(IPVS_STATS_ATTR_INPKTS, s.inpkts)
        .u64(IPVS_STATS_ATTR_OUTPKTS, s.outpkts)
        .u64(IPVS_STATS_ATTR_INBYTES, s.inbytes)
        .u64(IPVS_STATS_ATTR_OUTBYTES, s.outbytes)
        .end_nest();
}

fn decode_addr(af: u16, a: &Attr<'_>, within: &'static str) -> Result<IpAddr, DecodeError> {
    let p = a.payload;
    let bad = |want| DecodeError::AttrSize {
        within,
        attr: a.ty,
        len: p.len(),
        want,
    };
    match af {
        AF_INET if p.len() >= 4 => Ok(Ipv4Addr::new(p[0], p[1], p[2], p[3]).into()),
        AF_INET => Err(bad(">= 4 (IPv4)")),
        AF_INET6 => {
            let b: [u8; 16] = p
                .get(..16)
                .ok_or(bad(">= 16 (IPv6)"))?
                .try_into()
                .expect("16");
            Ok(Ipv6Addr::from(b).into())
        }
        af => Err(DecodeError::Value {
            what: "address family",
            value: af.into(),
        }),
    }
}

fn missing(within: &'static str, attr: u16) -> DecodeError {
    DecodeError::Missing { within, attr }
}

type Found<'a> = [Option<Attr<'a>>; 16];

/// The last of each attribute type below 16 (the kernel's nla_parse keeps the last).
fn index<'a>(buf: &'a [u8], within: &'static str) -> Result<Found<'a>, DecodeError> {
    let mut found: Found = [None; 16];
    for a in attrs(buf, within)? {
        if let Some(slot) = found.get_mut(a.ty as usize) {
            *slot = Some(a);
        }
    }
    Ok(found)
}

fn decode_service(buf: &[u8]) -> Result<(SvcAttr, Option<Stats>), DecodeError> {
    const W: &str = "IPVS_CMD_ATTR_SERVICE";
    let f = index(buf, W)?;
    let get = |t: u16| f[t as usize].ok_or(missing(W, t));
    let af = get(IPVS_SVC_ATTR_AF)?.u16(W)?;
    let stats = f[IPVS_SVC_ATTR_STATS64 as usize]
        .map(|a| decode_stats(a.payload))
        .transpose()?;
    if let Some(mark) = f[IPVS_SVC_ATTR_FWMARK as usize] {
        let fwmark = mark.u32(W)?;
        return Ok((SvcAttr::Fwmark { af, fwmark }, stats));
    }
    let key = ServiceKey {
        addr: decode_addr(af, &get(IPVS_SVC_ATTR_ADDR)?, W)?,
        port: get(IPVS_SVC_ATTR_PORT)?.be16(W)?,
        proto: Proto::from_number(get(IPVS_SVC_ATTR_PROTOCOL)?.u16(W)?),
    };
    let full = [
        IPVS_SVC_ATTR_SCHED_NAME,
        IPVS_SVC_ATTR_FLAGS,
        IPVS_SVC_ATTR_TIMEOUT,
        IPVS_SVC_ATTR_NETMASK,
    ];
    if full.iter().all(|t| f[*t as usize].is_none()) {
        return Ok((SvcAttr::Key(key), stats));
    }
    let flags = get(IPVS_SVC_ATTR_FLAGS)?.fixed::<8>(W, "8 (struct ip_vs_flags)")?;
    let service = Service {
        key,
        sched_name: get(IPVS_SVC_ATTR_SCHED_NAME)?.string("scheduler name")?,
        flags: u32::from_ne_bytes(flags[..4].try_into().expect("4")),
        timeout: get(IPVS_SVC_ATTR_TIMEOUT)?.u32(W)?,
        netmask: get(IPVS_SVC_ATTR_NETMASK)?.u32(W)?,
    };
    Ok((SvcAttr::Full(service), stats))
}

fn decode_dest(buf: &[u8]) -> Result<(DestAttr, Option<Stats>), DecodeError> {
    const W: &str = "IPVS_CMD_ATTR_DEST";
    let f = index(buf, W)?;
    let get = |t: u16| f[t as usize].ok_or(missing(W, t));
    let af = get(IPVS_DEST_ATTR_ADDR_FAMILY)?.u16(W)?;
    let key = DestKey {
        addr: decode_addr(af, &get(IPVS_DEST_ATTR_ADDR)?, W)?,
        port: get(IPVS_DEST_ATTR_PORT)?.be16(W)?,
    };
    let stats = f[IPVS_DEST_ATTR_STATS64 as usize]
        .map(|a| decode_stats(a.payload))
        .transpose()?;
    let full = [
        IPVS_DEST_ATTR_FWD_METHOD,
        IPVS_DEST_ATTR_WEIGHT,
        IPVS_DEST_ATTR_U_THRESH,
        IPVS_DEST_ATTR_L_THRESH,
    ];
    if full.iter().all(|t| f[*t as usize].is_none()) {
        return Ok((DestAttr::Key(key), stats));
    }
    let dest = Dest {
        key,
        forward: Forward::from_conn_flags(get(IPVS_DEST_ATTR_FWD_METHOD)?.u32(W)?),
        weight: get(IPVS_DEST_ATTR_WEIGHT)?.u32(W)?,
        u_thresh: get(IPVS_DEST_ATTR_U_THRESH)?.u32(W)?,
        l_thresh: get(IPVS_DEST_ATTR_L_THRESH)?.u32(W)?,
        tun_type: f[IPVS_DEST_ATTR_TUN_TYPE as usize]
            .map(|a| a.u8(W))
            .transpose()?,
    };
    Ok((DestAttr::Full(dest), stats))
}

fn decode_stats(buf: &[u8]) -> Result<Stats, DecodeError> {
    const W: &str = "STATS64";
    let f = index(buf, W)?;
    let get = |t: u16| f[t as usize].map(|a| a.u64(W)).transpose();
    Ok(Stats {
        conns: get(IPVS_STATS_ATTR_CONNS)?.unwrap_or(0),
        inpkts: get(IPVS_STATS_ATTR_INPKTS)?.unwrap_or(0),
        outpkts: get(IPVS_STATS_ATTR_OUTPKTS)?.unwrap_or(0),
        inbytes: get(IPVS_STATS_ATTR_INBYTES)?.unwrap_or(0),
        outbytes: get(IPVS_STATS_ATTR_OUTBYTES)?.unwrap_or(0),
    })
}
