//! Rust mirror of `xdp/bpf/abi.h`, the one definition of the XDP maps.
//!
//! Every struct is `#[repr(C)]` with explicit padding and a compile-time size
//! check against the C layout; network-order fields use [`Be16`] / [`RawAddr`]
//! so host-order values cannot be written by mistake. Every load opens the
//! maps with these types (`abi_check.rs`), which checks them
//! against the key/value sizes the compiled object declares; a test below
//! checks the sizes and constants against `abi.h` itself.

use std::net::IpAddr;

use ringlb_nexthop::{NextHop, Vlan, VlanProtocol};

/// The network-order field types and families, shared with `ringlb-node`.
pub use ringlb_bpf_types::{AF_INET, AF_INET6, Be16, RawAddr};

pub const MAX_VIPS: u32 = 65_536;
pub const MAX_BACKENDS: u32 = 1_048_576;
pub const MAX_RING_SIZE: u32 = 65_537;
pub const CT_SIZE: u32 = 262_144;
/// `vip_filter`: 2^VIP_FILTER_BITS bits in VIP_FILTER_WORDS 64-bit words.
pub const VIP_FILTER_BITS: u32 = 16;
pub const VIP_FILTER_WORDS: u32 = 1024;
/// `flow_filter`: 2^FLOW_FILTER_BITS one-bit slots per half (two halves,
/// interleaved, in 64-bit words after a 64-byte header holding `active`;
/// `flow_filter.rs`).
pub const FLOW_FILTER_BITS: u32 = 18;
/// Bytes before the slots in the `flow_filter` value (`active` + padding).
pub const FLOW_FILTER_HEADER: usize = 64;
/// The `flow_filter` value's size: the header, then 2 bits per slot.
pub const FLOW_FILTER_VALUE_SIZE: usize = FLOW_FILTER_HEADER + (2usize << FLOW_FILTER_BITS) / 8;

pub const VIP_F_NO_CT: u32 = 0x1;
/// `VipInfo::flags`: another region's VIP accepted here for failover, forwarded
/// only for IPIP packets to one of this edge's own VIP addresses (`vip_addrs`).
pub const VIP_F_FAILOVER_ALIAS: u32 = 0x2;
/// `VipInfo::flags`: the VIP accepts only the sources in `src_ranges` under
/// its vip_id (`spec.loadBalancerSourceRanges`; src_ranges.h).
pub const VIP_F_SRC_RANGES: u32 = 0x4;
/// `VipInfo::flags`: `sessionAffinity: ClientIP`; a new flow's ring slot is the
/// hash of the client's address alone (`lookup::client_hash`), and with a
/// timeout (the bits from `VIP_AFFINITY_SHIFT`) the client's pod is kept in the
/// `affinity` map while it lives (affinity.h).
pub const VIP_F_CLIENT_AFFINITY: u32 = 0x8;
/// `VipInfo::flags >> VIP_AFFINITY_SHIFT`: the affinity timeout in seconds.
pub const VIP_AFFINITY_SHIFT: u32 = 8;
/// The largest timeout the flags hold (24 bits; Kubernetes allows 86,400 s).
pub const MAX_AFFINITY_TIMEOUT: u32 = (1 << (32 - VIP_AFFINITY_SHIFT)) - 1;
/// `decap_senders` entries (the other region's edges, or their prefixes).
pub const MAX_DECAP_SENDERS: u32 = 1024;
/// `affinity` entries (LRU, per-CPU lists).
pub const AFFINITY_SIZE: u32 = 65_536;
/// The `owners` value's bit for a VIP with `VIP_F_SRC_RANGES` (a conntrack hit
/// checks the source too); the rest (`OWNER_VIP_MASK`) is 1 + vip_id.
pub const OWNER_F_SRC_RANGES: u32 = 0x8000_0000;
/// The `owners` value's bit for a backend the VIP's ring does not name (draining:
/// kept for established flows); a client's affinity to it ends.
pub const OWNER_F_DRAINING: u32 = 0x4000_0000;
pub const OWNER_VIP_MASK: u32 = 0x3fff_ffff;
/// `src_ranges` entries (LPM trie, allocated on use).
pub const MAX_SRC_RANGES: u32 = 65_536;
/// Ranges a `src_sets` entry holds; a VIP with more has them in the trie.
pub const SRC_SET_NETS: usize = 8;
/// `src_sets` entries (set 0 unused).
pub const MAX_SRC_SETS: u32 = 16_384;
pub const CFG_F_FIB_FALLBACK: u32 = 0x1;
/// `BackendValue::nh_valid`: the next hop (MACs, ifindex, VLAN) is resolved.
pub const NH_VALID: u8 = 0x1;
/// `BackendValue::nh_valid`: `vlan_tci` goes under TPID 0x88a8 (802.1ad), not 0x8100.
pub const NH_VLAN_8021AD: u8 = 0x2;
/// `BackendValue::nh_valid` (not a next-hop bit; it shares the byte): the
/// backend is another region's VIP. A decapsulated packet is never sent to one.
pub const BE_F_REMOTE_VIP: u8 = 0x4;
/// `BackendValue::nh_valid` (not a next-hop bit): the backend is a pod on this
/// node. The program passes the encapsulated frame to this port's stack with
/// the L2 header it came in with (the node agent's tc program decapsulates it).
pub const BE_F_LOCAL: u8 = 0x8;
/// `Flow::flags`: a decapsulated (failed-over) flow's entry.
pub const FLOW_F_DECAP: u8 = 0x1;

/// Map names in the object (`SEC(".maps")` variables).
pub mod map {
    pub const VIPS: &str = "vips";
    pub const RINGS: &str = "rings";
    pub const BACKENDS: &str = "backends";
    pub const CONNTRACK: &str = "conntrack";
    /// backend id -> 1 + vip_id of its VIP (0 = none); see abi.h.
    pub const OWNERS: &str = "owners";
    pub const CONFIG: &str = "config";
    pub const VIP_STATS: &str = "vip_stats";
    pub const STATS: &str = "stats";
    /// word -> u64: a Bloom filter of the VIP addresses (`vip_filter.rs`).
    pub const VIP_FILTER: &str = "vip_filter";
    /// `VipKey` (port 0, proto 0) -> 1: this edge's own VIP addresses, to which
    /// IPIP packets are decapsulated (every VIP entry but failover aliases).
    pub const VIP_ADDRS: &str = "vip_addrs";
    /// One value: a presence filter of the conntrack keys (`flow_filter.rs`).
    pub const FLOW_FILTER: &str = "flow_filter";
    /// `BfdHoldKey` -> `BfdHold`: BFD sessions the program answers while the
    /// agent restarts (`bfd_hold.rs`).
    pub const BFD_HOLD: &str = "bfd_hold";
    /// vip_id -> `CtBudget` per CPU: conntrack inserts of new flows in the
    /// current window (program state, zeroed when a VIP gets the id;
    /// conntrack.h).
    pub const CT_BUDGET: &str = "ct_budget";
    /// `Key<SrcRange>` -> family: the source prefixes of each VIP with source
    /// ranges (LPM trie; src_ranges.h).
    pub const SRC_RANGES: &str = "src_ranges";
    /// vip_id -> u64 per CPU: packets dropped for a source outside the VIP's
    /// ranges.
    pub const SRC_DROPS: &str = "src_drops";
    /// set -> `SrcSet`: the ranges of a VIP with a few, scanned in place.
    pub const SRC_SETS: &str = "src_sets";
    /// vip_id -> the set of its ranges (0 = none: `src_ranges`).
    pub const SRC_SET_OF: &str = "src_set_of";
    /// `AffinityKey` -> `AffinityValue`: the pod of each client of a VIP with
    /// client affinity (LRU; affinity.h).
    pub const AFFINITY: &str = "affinity";
    /// `lpm_trie::Key<u32>` (the big-endian IPv4 address) -> 1: the outer
    /// sources whose IPIP packets to one of this edge's VIPs are decapsulated
    /// for failover (failover.h; `decap_senders.rs`).
    pub const DECAP_SENDERS: &str = "decap_senders";
    /// The per-CPU arrays indexed by vip_id, which the loader sizes to
    /// `XdpOptions::vip_capacity` (each entry is one per-CPU allocation).
    pub const PER_VIP_COUNTERS: [&str; 3] = [VIP_STATS, CT_BUDGET, SRC_DROPS];
    /// Every map, for pinning and cleanup.
    pub const ALL: [&str; 19] = [
        VIPS,
        RINGS,
        BACKENDS,
        CONNTRACK,
        OWNERS,
        CONFIG,
        VIP_STATS,
        STATS,
        VIP_FILTER,
        VIP_ADDRS,
        FLOW_FILTER,
        BFD_HOLD,
        CT_BUDGET,
        SRC_RANGES,
        SRC_DROPS,
        SRC_SETS,
        SRC_SET_OF,
        AFFINITY,
        DECAP_SENDERS,
    ];
    /// Maps newer than some pin dirs in the field: a running edge of an
    /// older release has none pinned.
    pub const NEWER: [&str; 8] = [
        BFD_HOLD,
        CT_BUDGET,
        SRC_RANGES,
        SRC_DROPS,
        SRC_SETS,
        SRC_SET_OF,
        AFFINITY,
        DECAP_SENDERS,
    ];
}

/// `struct ringlb_vip_key`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VipKey {
    pub addr: RawAddr,
    pub port: Be16,
    pub proto: u8,
    pub family: u8,
}

impl VipKey {
    /// The `vip_addrs` key of an address: port 0, proto 0.
    pub fn of_addr(addr: IpAddr) -> Self {
        let (addr, family) = RawAddr::from_ip(addr);
        VipKey {
            addr,
            family,
            ..Default::default()
        }
    }
}

/// `struct ringlb_vip_info`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipInfo {
    pub vip_id: u32,
    pub ring_size: u32,
    pub flags: u32,
}

/// `struct ringlb_affinity_key`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityKey {
    pub saddr: RawAddr,
    pub vip_id: u32,
    pub family: u8,
    pub pad: [u8; 3],
}

/// `struct ringlb_affinity_value`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub generation: u32,
    pub last_ns: u64,
}

/// `struct ringlb_backend`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendValue {
    pub addr: RawAddr,
    pub generation: u32,
    pub ifindex: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    pub family: u8,
    /// `NH_*` bits.
    pub nh_valid: u8,
    /// Egress VLAN tag control (PCP 0, DEI 0, VID); 0 = untagged.
    pub vlan_tci: Be16,
}

/// `struct ringlb_flow`: the conntrack key (5-tuple).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flow {
    pub saddr: RawAddr,
    pub daddr: RawAddr,
    pub sport: Be16,
    pub dport: Be16,
    pub proto: u8,
    pub family: u8,
    /// `FLOW_F_*`
    pub flags: u8,
    pub pad: u8,
}

/// `struct ringlb_ct_value`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtValue {
    pub backend_id: u32,
    pub generation: u32,
}

/// `struct ringlb_config`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigValue {
    pub src4: u32,
    pub src6: RawAddr,
    pub mtu: u32,
    pub flags: u32,
}

/// `struct ringlb_src_key` past its `prefixlen` (aya's `lpm_trie::Key` holds
/// that): the data an `src_ranges` entry matches.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrcRange {
    /// Host order; always matched whole (32 bits of the prefix length).
    pub vip_id: u32,
    pub addr: RawAddr,
}

/// `struct ringlb_src_net`: one range of a set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrcNet {
    pub addr: RawAddr,
    pub mask: RawAddr,
}

/// `struct ringlb_src_set`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrcSet {
    pub n: u32,
    pub pad: u32,
    pub net: [SrcNet; SRC_SET_NETS],
}

/// `struct ringlb_vip_stats`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipStats {
    pub packets: u64,
    pub bytes: u64,
}

/// `struct ringlb_ct_budget`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtBudget {
    pub start: u64,
    pub used: u32,
    pub pad: u32,
}

/// The `.rodata` constant `ringlb_ct_insert_budget` (conntrack.h): new
/// conntrack entries a VIP may insert per CPU per window of at least a
/// second; 0 = no limit.
pub const CT_INSERT_BUDGET_GLOBAL: &str = "ringlb_ct_insert_budget";

/// `RINGLB_BFD_HOLD_MAX`: held BFD sessions.
pub const BFD_HOLD_MAX: u32 = 64;
/// `RINGLB_BFD_PORT`: single-hop BFD Control packets (RFC 5881).
pub const BFD_PORT: u16 = 3784;

/// A 32-bit field in network byte order (the BFD fields of `BfdHold`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Be32(u32);

impl Be32 {
    pub const fn from_host(v: u32) -> Self {
        Be32(v.to_be())
    }
    pub const fn to_host(self) -> u32 {
        u32::from_be(self.0)
    }
    /// The four bytes as they lie in the map (network order).
    pub const fn to_ne_bytes(self) -> [u8; 4] {
        self.0.to_ne_bytes()
    }
}

/// `struct ringlb_bfd_hold_key`: (our IPv4 address, the peer's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BfdHoldKey {
    /// Network order, as `RawAddr` word 0.
    pub local: u32,
    pub peer: u32,
}

impl BfdHoldKey {
    pub fn new(local: std::net::Ipv4Addr, peer: std::net::Ipv4Addr) -> Self {
        BfdHoldKey {
            local: u32::from_ne_bytes(local.octets()),
            peer: u32::from_ne_bytes(peer.octets()),
        }
    }
    pub fn local(&self) -> std::net::Ipv4Addr {
        self.local.to_ne_bytes().into()
    }
    pub fn peer(&self) -> std::net::Ipv4Addr {
        self.peer.to_ne_bytes().into()
    }
}

/// `struct ringlb_bfd_hold`: one held session (see abi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BfdHold {
    /// CLOCK_MONOTONIC nanoseconds; answered before it only.
    pub deadline_ns: u64,
    pub answered: u64,
    pub last_ns: u64,
    pub my_disc: Be32,
    pub your_disc: Be32,
    pub min_tx_us: Be32,
    pub min_rx_us: Be32,
    pub peer_min_tx_us: Be32,
    pub peer_min_rx_us: Be32,
    pub src_port: Be16,
    pub detect_mult: u8,
    pub peer_mult: u8,
    pub refused: u32,
}

const _: () = assert!(size_of::<BfdHoldKey>() == 8);
const _: () = assert!(size_of::<BfdHold>() == 56);
const _: () = assert!(size_of::<VipKey>() == 20);
const _: () = assert!(size_of::<VipInfo>() == 12);
const _: () = assert!(size_of::<AffinityKey>() == 24);
const _: () = assert!(size_of::<AffinityValue>() == 16);
const _: () = assert!(size_of::<BackendValue>() == 40);
const _: () = assert!(size_of::<Flow>() == 40);
const _: () = assert!(size_of::<CtValue>() == 8);
const _: () = assert!(size_of::<ConfigValue>() == 28);
const _: () = assert!(size_of::<VipStats>() == 16);
const _: () = assert!(size_of::<CtBudget>() == 16);
// struct ringlb_src_key (24) = prefixlen (4) + this
const _: () = assert!(size_of::<SrcRange>() == 20);
const _: () = assert!(size_of::<SrcNet>() == 32);
const _: () = assert!(size_of::<SrcSet>() == 264);

// SAFETY (for every impl below): aya::Pod requires a plain-old-data type with
// no padding bytes the kernel could read uninitialised and no invalid bit
// patterns. Each type is #[repr(C)], made only of integers/arrays of integers,
// has its padding spelled out as fields, and its size is asserted above.
#[allow(unsafe_code)]
mod pod {
    use super::*;
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for VipInfo {}
    unsafe impl aya::Pod for BackendValue {}
    unsafe impl aya::Pod for Flow {}
    unsafe impl aya::Pod for CtValue {}
    unsafe impl aya::Pod for ConfigValue {}
    unsafe impl aya::Pod for VipStats {}
    unsafe impl aya::Pod for CtBudget {}
    unsafe impl aya::Pod for SrcRange {}
    unsafe impl aya::Pod for SrcNet {}
    unsafe impl aya::Pod for SrcSet {}
    unsafe impl aya::Pod for BfdHoldKey {}
    unsafe impl aya::Pod for BfdHold {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
}

/// Global counter indices: `enum ringlb_stat`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    Tx = 0,
    Redirect,
    PassNotIp,
    PassNotVip,
    PassIcmp,
    PassFragment,
    PassIpv6Ext,
    PassOtherL4,
    PassMalformed,
    PassMtu,
    PassNoSrc,
    DropNoBackend,
    DropFib,
    DropAdjust,
    CtHit,
    CtMiss,
    CtStale,
    FibFallback,
    IcmpTooBig,
    CtSynRing,
    CtSynRewrite,
    FailoverIn,
    FailoverOut,
    PassDecapNotOurs,
    DropDecapNoAlias,
    PassAliasPlain,
    FailoverLoop,
    CtSynFiltered,
    CtOverBudget,
    Local,
    DropSourceRange,
    IcmpEcho,
    DropNoService,
    DropVipIcmp,
    DropVipOther,
    AffinityHit,
    AffinityNew,
    DropDecapSender,
}

pub const STAT_MAX: u32 = 38;

impl Stat {
    pub const ALL: [Stat; STAT_MAX as usize] = [
        Stat::Tx,
        Stat::Redirect,
        Stat::PassNotIp,
        Stat::PassNotVip,
        Stat::PassIcmp,
        Stat::PassFragment,
        Stat::PassIpv6Ext,
        Stat::PassOtherL4,
        Stat::PassMalformed,
        Stat::PassMtu,
        Stat::PassNoSrc,
        Stat::DropNoBackend,
        Stat::DropFib,
        Stat::DropAdjust,
        Stat::CtHit,
        Stat::CtMiss,
        Stat::CtStale,
        Stat::FibFallback,
        Stat::IcmpTooBig,
        Stat::CtSynRing,
        Stat::CtSynRewrite,
        Stat::FailoverIn,
        Stat::FailoverOut,
        Stat::PassDecapNotOurs,
        Stat::DropDecapNoAlias,
        Stat::PassAliasPlain,
        Stat::FailoverLoop,
        Stat::CtSynFiltered,
        Stat::CtOverBudget,
        Stat::Local,
        Stat::DropSourceRange,
        Stat::IcmpEcho,
        Stat::DropNoService,
        Stat::DropVipIcmp,
        Stat::DropVipOther,
        Stat::AffinityHit,
        Stat::AffinityNew,
        Stat::DropDecapSender,
    ];

    /// Metric label: `ringlb_xdp_packets_total{reason="..."}`.
    pub const fn label(self) -> &'static str {
        match self {
            Stat::Tx => "tx",
            Stat::Redirect => "redirect",
            Stat::PassNotIp => "pass_not_ip",
            Stat::PassNotVip => "pass_not_vip",
            Stat::PassIcmp => "pass_icmp",
            Stat::PassFragment => "pass_fragment",
            Stat::PassIpv6Ext => "pass_ipv6_ext",
            Stat::PassOtherL4 => "pass_other_l4",
            Stat::PassMalformed => "pass_malformed",
            Stat::PassMtu => "pass_mtu",
            Stat::PassNoSrc => "pass_no_src",
            Stat::DropNoBackend => "drop_no_backend",
            Stat::DropFib => "drop_fib",
            Stat::DropAdjust => "drop_adjust",
            Stat::CtHit => "ct_hit",
            Stat::CtMiss => "ct_miss",
            Stat::CtStale => "ct_stale",
            Stat::FibFallback => "fib_fallback",
            Stat::IcmpTooBig => "icmp_too_big",
            Stat::CtSynRing => "ct_syn_ring",
            Stat::CtSynRewrite => "ct_syn_rewrite",
            Stat::FailoverIn => "failover_in",
            Stat::FailoverOut => "failover_out",
            Stat::PassDecapNotOurs => "pass_decap_not_ours",
            Stat::DropDecapNoAlias => "drop_decap_no_alias",
            Stat::PassAliasPlain => "pass_alias_plain",
            Stat::FailoverLoop => "failover_loop",
            Stat::CtSynFiltered => "ct_syn_filtered",
            Stat::CtOverBudget => "ct_over_budget",
            Stat::Local => "local",
            Stat::DropSourceRange => "drop_source_range",
            Stat::IcmpEcho => "icmp_echo",
            Stat::DropNoService => "drop_no_service",
            Stat::DropVipIcmp => "drop_vip_icmp",
            Stat::DropVipOther => "drop_vip_other",
            Stat::AffinityHit => "affinity_hit",
            Stat::AffinityNew => "affinity_new",
            Stat::DropDecapSender => "drop_decap_sender",
        }
    }
}

impl BackendValue {
    /// The entry of backend `addr`, with its next hop when resolved; `remote`
    /// marks another region's VIP (`BE_F_REMOTE_VIP`).
    pub fn new(addr: IpAddr, generation: u32, nh: Option<NextHop>, remote: bool) -> Self {
        let (raw, family) = RawAddr::from_ip(addr);
        let mut v = BackendValue {
            addr: raw,
            generation,
            family,
            nh_valid: if remote { BE_F_REMOTE_VIP } else { 0 },
            ..Default::default()
        };
        if let Some(nh) = nh {
            v.ifindex = nh.ifindex;
            v.dmac = nh.dmac;
            v.smac = nh.smac;
            v.nh_valid |= NH_VALID;
            if let Some(vlan) = nh.vlan {
                // PCP 0, DEI 0: the VLAN id only
                v.vlan_tci = Be16::from_host(vlan.id & 0x0fff);
                if vlan.protocol == VlanProtocol::Dot1Ad {
                    v.nh_valid |= NH_VLAN_8021AD;
                }
            }
        }
        v
    }

    /// Marks the backend a pod on this node (`BE_F_LOCAL`): the next hop is
    /// the ingress frame's own L2 header, so no resolved one is kept.
    pub fn with_local(mut self, local: bool) -> Self {
        if local {
            self.nh_valid = (self.nh_valid & BE_F_REMOTE_VIP) | BE_F_LOCAL;
            self.ifindex = 0;
            self.dmac = [0; 6];
            self.smac = [0; 6];
            self.vlan_tci = Be16::default();
        }
        self
    }

    /// Whether the backend is a pod on this node (`BE_F_LOCAL`).
    pub fn is_local(&self) -> bool {
        self.nh_valid & BE_F_LOCAL != 0
    }

    /// Whether the backend is another region's VIP (`BE_F_REMOTE_VIP`).
    pub fn is_remote(&self) -> bool {
        self.nh_valid & BE_F_REMOTE_VIP != 0
    }

    /// The next hop the entry holds; `None` if unresolved.
    pub fn next_hop(&self) -> Option<NextHop> {
        if self.nh_valid & NH_VALID == 0 {
            return None;
        }
        let tci = self.vlan_tci.to_host();
        let vlan = (tci != 0).then_some(Vlan {
            id: tci & 0x0fff,
            protocol: if self.nh_valid & NH_VLAN_8021AD != 0 {
                VlanProtocol::Dot1Ad
            } else {
                VlanProtocol::Dot1Q
            },
        });
        Some(NextHop {
            ifindex: self.ifindex,
            smac: self.smac,
            dmac: self.dmac,
            vlan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// abi.h is the source of truth: its sizes and counter names must match.
    #[test]
    fn header_constants_and_counters_match() {
        let h = include_str!("../bpf/abi.h");
        let define = |name: &str| -> u32 {
            let line = h
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not in abi.h"));
            let v = line.split_whitespace().nth(2).unwrap();
            if let Some(x) = v.strip_prefix("0x") {
                u32::from_str_radix(x, 16).unwrap()
            } else {
                v.parse().unwrap()
            }
        };
        assert_eq!(define("RINGLB_MAX_VIPS"), MAX_VIPS);
        assert_eq!(define("RINGLB_MAX_BACKENDS"), MAX_BACKENDS);
        assert_eq!(define("RINGLB_MAX_RING_SIZE"), MAX_RING_SIZE);
        assert_eq!(define("RINGLB_CT_SIZE"), CT_SIZE);
        assert_eq!(define("RINGLB_VIP_FILTER_BITS"), VIP_FILTER_BITS);
        assert_eq!(define("RINGLB_VIP_FILTER_WORDS"), VIP_FILTER_WORDS);
        assert_eq!(define("RINGLB_FLOW_FILTER_BITS"), FLOW_FILTER_BITS);
        assert!(h.contains("__u8 pad[63];     /* the slots start on their own cache line */"));
        assert!(h.contains("__u64 word[2 * RINGLB_FLOW_FILTER_SLOTS / 64];"));
        assert_eq!(define("RINGLB_AF_INET"), AF_INET as u32);
        assert_eq!(define("RINGLB_AF_INET6"), AF_INET6 as u32);
        assert_eq!(define("RINGLB_VIP_F_NO_CT"), VIP_F_NO_CT);
        assert_eq!(define("RINGLB_CFG_F_FIB_FALLBACK"), CFG_F_FIB_FALLBACK);
        assert_eq!(define("RINGLB_NH_VALID"), NH_VALID as u32);
        assert_eq!(define("RINGLB_NH_VLAN_8021AD"), NH_VLAN_8021AD as u32);
        assert_eq!(define("RINGLB_VIP_F_FAILOVER_ALIAS"), VIP_F_FAILOVER_ALIAS);
        assert_eq!(define("RINGLB_BE_F_REMOTE_VIP"), BE_F_REMOTE_VIP as u32);
        assert_eq!(define("RINGLB_VIP_F_SRC_RANGES"), VIP_F_SRC_RANGES);
        assert_eq!(
            define("RINGLB_VIP_F_CLIENT_AFFINITY"),
            VIP_F_CLIENT_AFFINITY
        );
        assert_eq!(define("RINGLB_VIP_AFFINITY_SHIFT"), VIP_AFFINITY_SHIFT);
        assert_eq!(define("RINGLB_AFFINITY_SIZE"), AFFINITY_SIZE);
        assert_eq!(define("RINGLB_OWNER_F_SRC_RANGES"), OWNER_F_SRC_RANGES);
        assert_eq!(define("RINGLB_OWNER_F_DRAINING"), OWNER_F_DRAINING);
        assert_eq!(define("RINGLB_OWNER_VIP_MASK"), OWNER_VIP_MASK);
        assert_eq!(define("RINGLB_MAX_SRC_RANGES"), MAX_SRC_RANGES);
        assert_eq!(define("RINGLB_SRC_SET_NETS") as usize, SRC_SET_NETS);
        assert_eq!(define("RINGLB_MAX_SRC_SETS"), MAX_SRC_SETS);
        assert_eq!(define("RINGLB_MAX_DECAP_SENDERS"), MAX_DECAP_SENDERS);
        assert!(h.contains("struct ringlb_decap_sender_key {\n\t__u32 prefixlen;"));
        assert!(h.contains("struct ringlb_src_key {\n\t__u32 prefixlen;"));
        assert_eq!(define("RINGLB_BE_F_LOCAL"), BE_F_LOCAL as u32);
        assert_eq!(define("RINGLB_FLOW_F_DECAP"), FLOW_F_DECAP as u32);
        assert_eq!(define("RINGLB_BFD_HOLD_MAX"), BFD_HOLD_MAX);
        assert_eq!(define("RINGLB_BFD_PORT"), u32::from(BFD_PORT));
        // struct ringlb_bfd_hold: ... src_port (48..50), detect_mult, peer_mult, refused (52)
        assert_eq!(std::mem::offset_of!(BfdHold, src_port), 48);
        assert_eq!(std::mem::offset_of!(BfdHold, refused), 52);
        // struct ringlb_flow: ... proto (36), family (37), flags (38)
        assert_eq!(std::mem::offset_of!(Flow, flags), 38);
        // struct ringlb_backend: ... family (36), nh_valid (37), vlan_tci (38..40)
        assert_eq!(std::mem::offset_of!(BackendValue, nh_valid), 37);
        assert_eq!(std::mem::offset_of!(BackendValue, vlan_tci), 38);
        let names: Vec<String> = h
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("RINGLB_ST_"))
            .map(|l| l.split([',', ' ']).next().unwrap().to_ascii_lowercase())
            .collect();
        assert_eq!(names.last().map(String::as_str), Some("max"));
        let labels: Vec<&str> = Stat::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(&names[..names.len() - 1], &labels[..]);
    }

    #[test]
    fn stat_indices_are_dense_and_labelled() {
        for (i, s) in Stat::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert!(!s.label().is_empty());
        }
    }
}
