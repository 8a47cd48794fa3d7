//! What IPVS holds, as values: virtual services and their real servers
//! ("destinations"). The codec turns them into generic-netlink messages and back;
//! the planner compares them.

use std::fmt;
use std::net::IpAddr;

use crate::codec::consts::*;

/// L4 protocol of a virtual service (`IPVS_SVC_ATTR_PROTOCOL`, an IP protocol number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    /// Another protocol (SCTP, ...) met in a dump; ringlb never creates one.
    Other(u16),
}

impl Proto {
    pub const fn number(self) -> u16 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Other(n) => n,
        }
    }
    pub const fn from_number(n: u16) -> Self {
        match n {
            6 => Proto::Tcp,
            17 => Proto::Udp,
            n => Proto::Other(n),
        }
    }
}

/// Address family number (`AF_INET`, `AF_INET6`) of an address.
pub fn af_of(addr: IpAddr) -> u16 {
    match addr {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

/// What identifies a virtual service: VIP, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.proto {
            Proto::Tcp => "tcp".to_string(),
            Proto::Udp => "udp".to_string(),
            Proto::Other(n) => format!("proto{n}"),
        };
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{p}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{p}", self.port),
        }
    }
}

/// A virtual service with the settings a `NEW_SERVICE` must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub key: ServiceKey,
    /// `mh` for ringlb; at most 15 bytes (`IP_VS_SCHEDNAME_MAXLEN` with the NUL).
    pub sched_name: String,
    /// `IP_VS_SVC_F_*`. Sent with the mask [`SVC_FLAGS_MANAGED`]; a dump
    /// reports every bit, the kernel's `IP_VS_SVC_F_HASHED` too.
    pub flags: u32,
    /// Persistence timeout in seconds (0: not persistent).
    pub timeout: u32,
    /// `IPVS_SVC_ATTR_NETMASK` as the kernel reads it (`nla_get_be32`, no
    /// swap): for IPv4 the persistence mask's bytes in network order (all ones
    /// for /32), for IPv6 a prefix length in host order (128).
    pub netmask: u32,
}

impl Service {
    /// The settings ringlb gives a VIP:port: scheduler `mh`, `flags`
    /// (`IP_VS_SVC_F_SCHED1` = mh-fallback, `IP_VS_SVC_F_SCHED2` = mh-port),
    /// no persistence, a host netmask.
    pub fn mh(key: ServiceKey, flags: u32) -> Self {
        let netmask = match key.addr {
            IpAddr::V4(_) => u32::MAX,
            IpAddr::V6(_) => 128,
        };
        Service {
            key,
            sched_name: "mh".into(),
            flags,
            timeout: 0,
            netmask,
        }
    }

    /// Whether the kernel's `other` has the settings of `self`, looking only at
    /// the flags ringlb manages.
    pub fn same_settings(&self, other: &Service) -> bool {
        self.sched_name == other.sched_name
            && self.flags & SVC_FLAGS_MANAGED == other.flags & SVC_FLAGS_MANAGED
            && self.timeout == other.timeout
            && self.netmask == other.netmask
    }
}

/// How IPVS sends a packet to a real server (`IPVS_DEST_ATTR_FWD_METHOD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Forward {
    /// IPIP (or IP6IP6, or mixed) encapsulation to the pod: `IP_VS_CONN_F_TUNNEL`.
    Tunnel,
    /// Rewrite the MAC only, for a pod on the edge's L2: `IP_VS_CONN_F_DROUTE`.
    DirectRoute,
    /// NAT, local node, or anything else met in a dump.
    Other(u32),
}

impl Forward {
    pub const fn conn_flags(self) -> u32 {
        match self {
            Forward::Tunnel => IP_VS_CONN_F_TUNNEL,
            Forward::DirectRoute => IP_VS_CONN_F_DROUTE,
            Forward::Other(n) => n,
        }
    }
    pub const fn from_conn_flags(n: u32) -> Self {
        match n & IP_VS_CONN_F_FWD_MASK {
            IP_VS_CONN_F_TUNNEL => Forward::Tunnel,
            IP_VS_CONN_F_DROUTE => Forward::DirectRoute,
            n => Forward::Other(n),
        }
    }
}

impl std::str::FromStr for Forward {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tunnel" | "ipip" => Ok(Forward::Tunnel),
            "dr" | "direct" | "droute" => Ok(Forward::DirectRoute),
            other => Err(format!("unknown forwarding {other:?} (want tunnel or dr)")),
        }
    }
}

/// What identifies a real server inside its service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestKey {
    pub addr: IpAddr,
    pub port: u16,
}

impl fmt::Display for DestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// A real server with the settings a `NEW_DEST` must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dest {
    pub key: DestKey,
    pub forward: Forward,
    /// 0: no new connections (the kernel's mh treats it as unavailable);
    /// existing ones stay.
    pub weight: u32,
    /// Connection thresholds (0: none).
    pub u_thresh: u32,
    pub l_thresh: u32,
    /// `IP_VS_CONN_F_TUNNEL_TYPE_*` (kernel >= 5.3; ipip = 0); `None` is not sent.
    pub tun_type: Option<u8>,
}

impl Dest {
    /// A real server as ringlb programs it.
    pub fn new(addr: IpAddr, port: u16, forward: Forward, weight: u32) -> Self {
        Dest {
            key: DestKey { addr, port },
            forward,
            weight,
            u_thresh: 0,
            l_thresh: 0,
            tun_type: (forward == Forward::Tunnel).then_some(IP_VS_CONN_F_TUNNEL_TYPE_IPIP),
        }
    }

    /// Whether the kernel's `other` has the settings of `self` (an absent
    /// tunnel type is the kernel's default, ipip).
    pub fn same_settings(&self, other: &Dest) -> bool {
        let tun = |d: &Dest| (d.forward == Forward::Tunnel).then(|| d.tun_type.unwrap_or(0));
        self.forward == other.forward
            && self.weight == other.weight
            && self.u_thresh == other.u_thresh
            && self.l_thresh == other.l_thresh
            && tun(self) == tun(other)
    }
}

/// Traffic counters of a service or real server (`*_ATTR_STATS64`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub conns: u64,
    pub inpkts: u64,
    pub outpkts: u64,
    pub inbytes: u64,
    pub outbytes: u64,
}
