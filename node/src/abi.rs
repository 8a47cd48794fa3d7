//! Rust mirror of `node/bpf/node_abi.h`, the one definition of the node
//! datapath's maps. Every struct is `#[repr(C)]` with its padding spelled out
//! and a compile-time size check; network-order fields use [`Be16`] and
//! [`RawAddr`], so a host-order value cannot be written by mistake. The test
//! `abi_matches_object` (tests/node_fixtures.rs) checks the compiled object's
//! maps against these sizes.

use std::net::IpAddr;

/// The network-order field types and families, shared with `ringlb-xdp`.
pub use ringlb_bpf_types::{AF_INET, AF_INET6, Be16, RawAddr};

pub const MAX_PODS: u32 = 16_384;
pub const MAX_SERVICES: u32 = 65_536;
pub const FLOWS: u32 = 131_072;
pub const MAX_EDGES: u32 = 4096;

/// `ringlb_node_config.flags`: decapsulate only tunnels from an address in `edges`.
pub const CFG_CHECK_SOURCE: u32 = 1;

/// Program names in the object.
pub mod prog {
    /// Uplink ingress: decapsulation + DNAT.
    pub const INGRESS: &str = "ringlb_node_ingress";
    /// Uplink egress: reply SNAT, MSS clamp, ICMP translation.
    pub const EGRESS: &str = "ringlb_node_egress";
}

/// Map names in the object (`SEC(".maps")` variables).
pub mod map {
    pub const LOCAL_PODS: &str = "local_pods";
    pub const EDGES: &str = "edges";
    pub const SERVICES: &str = "services";
    pub const FLOWS: &str = "flows";
    pub const CONFIG: &str = "node_config";
    pub const STATS: &str = "node_stats";
    /// Every map, for pinning and cleanup.
    pub const ALL: [&str; 6] = [LOCAL_PODS, EDGES, SERVICES, FLOWS, CONFIG, STATS];
}

/// `struct ringlb_node_addr`: key of `local_pods`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub addr: RawAddr,
    pub family: u8,
    pub pad: [u8; 3],
}

impl PodKey {
    pub fn new(ip: IpAddr) -> Self {
        let (addr, family) = RawAddr::from_ip(ip);
        Self {
            addr,
            family,
            pad: [0; 3],
        }
    }
}

/// `struct ringlb_node_pod`: value of `local_pods`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodValue {
    /// Reserved, 0.
    pub flags: u32,
}

/// `struct ringlb_node_edge`: value of `edges` (keyed by [`PodKey`], which is
/// `struct ringlb_node_addr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EdgeValue {
    /// Reserved, 0.
    pub flags: u32,
}

/// `struct ringlb_node_svc_key`: key of `services`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SvcKey {
    pub tunnel_dst: RawAddr,
    pub vip: RawAddr,
    pub vip_port: Be16,
    pub proto: u8,
    pub family: u8,
    pub tunnel_family: u8,
    pub pad: [u8; 3],
}

/// `struct ringlb_node_svc_value`: value of `services`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SvcValue {
    pub pod: RawAddr,
    pub target_port: Be16,
    pub pad: u16,
}

/// `struct ringlb_node_flow_key`: key of `flows` (as the reply sees it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub client: RawAddr,
    pub pod: RawAddr,
    pub client_port: Be16,
    pub pod_port: Be16,
    pub proto: u8,
    pub family: u8,
    pub pad: [u8; 2],
}

/// `struct ringlb_node_flow_value`: value of `flows`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowValue {
    pub vip: RawAddr,
    pub vip_port: Be16,
    pub pad: u16,
}

/// `struct ringlb_node_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigValue {
    /// Host order; MSS clamp of IPv4 SYN-ACKs, 0 = off.
    pub mss4: u16,
    /// Host order; MSS clamp of IPv6 SYN-ACKs, 0 = off.
    pub mss6: u16,
    pub flags: u32,
}

const _: () = assert!(size_of::<PodKey>() == 20);
const _: () = assert!(size_of::<PodValue>() == 4);
const _: () = assert!(size_of::<EdgeValue>() == 4);
const _: () = assert!(size_of::<SvcKey>() == 40);
const _: () = assert!(size_of::<SvcValue>() == 20);
const _: () = assert!(size_of::<FlowKey>() == 40);
const _: () = assert!(size_of::<FlowValue>() == 20);
const _: () = assert!(size_of::<ConfigValue>() == 8);

// SAFETY (for every impl below): aya::Pod requires plain old data with no
// padding bytes the kernel could read uninitialised and no invalid bit
// patterns. Each type is #[repr(C)], made only of integers and arrays of
// integers, spells its padding out as fields, and its size is asserted above.
#[allow(unsafe_code)]
mod pod {
    use super::*;
    unsafe impl aya::Pod for PodKey {}
    unsafe impl aya::Pod for PodValue {}
    unsafe impl aya::Pod for EdgeValue {}
    unsafe impl aya::Pod for SvcKey {}
    unsafe impl aya::Pod for SvcValue {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowValue {}
    unsafe impl aya::Pod for ConfigValue {}
}

/// Counter indices: `enum ringlb_node_stat`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stat {
    Decap4 = 0,
    Decap6,
    Dnat,
    FlowNew,
    FlowErr,
    NoService,
    NotLocal,
    InnerUnsup,
    DropAdjust,
    FlowForget,
    IngressPass,
    ReplySnat,
    MssClamped,
    IcmpXlate,
    IcmpNoFlow,
    DropRewrite,
    EgressPass,
    DropSource,
}

pub const STAT_MAX: u32 = 18;

impl Stat {
    pub const ALL: [Stat; STAT_MAX as usize] = [
        Stat::Decap4,
        Stat::Decap6,
        Stat::Dnat,
        Stat::FlowNew,
        Stat::FlowErr,
        Stat::NoService,
        Stat::NotLocal,
        Stat::InnerUnsup,
        Stat::DropAdjust,
        Stat::FlowForget,
        Stat::IngressPass,
        Stat::ReplySnat,
        Stat::MssClamped,
        Stat::IcmpXlate,
        Stat::IcmpNoFlow,
        Stat::DropRewrite,
        Stat::EgressPass,
        Stat::DropSource,
    ];

    /// Metric label: `ringlb_node_packets_total{reason="..."}`.
    pub const fn label(self) -> &'static str {
        match self {
            Stat::Decap4 => "decap4",
            Stat::Decap6 => "decap6",
            Stat::Dnat => "dnat",
            Stat::FlowNew => "flow_new",
            Stat::FlowErr => "flow_err",
            Stat::NoService => "no_service",
            Stat::NotLocal => "not_local",
            Stat::InnerUnsup => "inner_unsupported",
            Stat::DropAdjust => "drop_adjust",
            Stat::FlowForget => "flow_forget",
            Stat::IngressPass => "ingress_pass",
            Stat::ReplySnat => "reply_snat",
            Stat::MssClamped => "mss_clamped",
            Stat::IcmpXlate => "icmp_translated",
            Stat::IcmpNoFlow => "icmp_no_flow",
            Stat::DropRewrite => "drop_rewrite",
            Stat::EgressPass => "egress_pass",
            Stat::DropSource => "drop_source",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_indices_follow_the_enum() {
        for (i, s) in Stat::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32, "{s:?}");
        }
    }

    /// The counter list in node_abi.h, read from the header itself: same
    /// names, same order as `Stat::ALL`.
    #[test]
    fn stat_enum_matches_the_header() {
        let h = include_str!("../bpf/node_abi.h");
        let names: Vec<&str> = h
            .lines()
            .filter_map(|l| l.trim().strip_prefix("RINGLB_NODE_ST_"))
            .map(|l| l.split([' ', ',', '=']).next().unwrap())
            .filter(|n| *n != "MAX")
            .collect();
        let ours: Vec<String> = Stat::ALL
            .iter()
            .map(|s| s.label().replace('_', ""))
            .collect();
        let theirs: Vec<String> = names
            .iter()
            .map(|n| n.to_lowercase().replace('_', ""))
            .collect();
        assert_eq!(names.len(), STAT_MAX as usize);
        // labels are the C names, lower case, with a few spelled out
        let spelled = |s: &str| {
            s.replace("innerunsupported", "innerunsup")
                .replace("icmptranslated", "icmpxlate")
        };
        let ours: Vec<String> = ours.iter().map(|s| spelled(s)).collect();
        assert_eq!(ours, theirs);
    }
}
