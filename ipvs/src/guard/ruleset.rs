//! The guard's nftables ruleset, pure: what the edge serves (every VIP:port:protocol
//! with the sources it accepts) in, one `nft -f` script out. The script replaces
//! the table `inet ringlb_guard` in one transaction (`add table` + `delete table` +
//! the whole definition), so a packet meets either the old ruleset or the new one.
//!
//! ```text
//!  prerouting, priority raw (-300): before conntrack, before IPVS (LOCAL_IN)
//!   iif lo ───────────────────────────────────────────> accept (the edge's own traffic)
//!   daddr not in @addrs4/@addrs6 ─────────────────────> accept (policy)
//!   daddr in @addrs4 ─> to_vip4:
//!     daddr . l4proto . dport in @ports4 ─┬─ accept          (no source ranges)
//!                                         └─ jump src_<vip> ─ saddr in ranges: accept
//!                                                             else counter src_<vip>, drop
//!     a non-first fragment (no ports) ──────────────────────> accept
//!     ICMP echo request, destination unreachable, time exceeded ─> accept
//!     other ICMP ─────────────────────────────────────────> counter drop_vip_icmp, drop
//!     TCP, UDP ───────────────────────────────────────────> counter drop_no_service, drop
//!     anything else ──────────────────────────────────────> counter drop_vip_other, drop
//!   daddr in @addrs6 ─> to_vip6: the same for IPv6 (ICMPv6: echo request, the error
//!     types and neighbour discovery accepted)
//! ```
//!
//! Elements and chains come in BTree order, so the same state always gives the
//! same script byte for byte (the guard skips a rewrite when it is unchanged).
//! No VIP at all gives [`removal`]: no table, no hook.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::IpAddr;

use ringlb_datapath::SourceRange;

use crate::model::{Proto, ServiceKey};

/// The table ringlb owns (family `inet`: one table for both families).
pub const TABLE: &str = "inet ringlb_guard";

/// TCP or UDP to a VIP address on a port and protocol no VIP:port has.
pub const DROP_NO_SERVICE: &str = "drop_no_service";
/// ICMP or ICMPv6 to a VIP address that is no echo request, error or
/// neighbour discovery.
pub const DROP_VIP_ICMP: &str = "drop_vip_icmp";
/// Any other protocol to a VIP address.
pub const DROP_VIP_OTHER: &str = "drop_vip_other";
/// The guard's datapath-wide counters, named as the XDP datapath's.
pub const GLOBAL_COUNTERS: [&str; 3] = [DROP_NO_SERVICE, DROP_VIP_ICMP, DROP_VIP_OTHER];

/// ICMP types accepted to a VIP address: echo requests (the edge's stack answers)
/// and the errors IPVS relays to the real server of the connection they quote
/// (`ip_vs_in_icmp`: a Fragmentation Needed about a DSR reply reaches its pod).
const ICMP_ACCEPTED: &str = "echo-request, destination-unreachable, time-exceeded";
/// ICMPv6: the same (IPVS relays every error type), and neighbour discovery.
const ICMPV6_ACCEPTED: &str = "echo-request, destination-unreachable, packet-too-big, \
                               time-exceeded, parameter-problem, nd-neighbor-solicit, \
                               nd-neighbor-advert";

/// Every VIP:port:protocol the edge serves, with the sources it accepts: `None`
/// every source, `Some` only those inside the ranges (of the VIP's family), and
/// an empty set none.
pub type Admitted = BTreeMap<ServiceKey, Option<BTreeSet<SourceRange>>>;

/// One script and what its per-service counters count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// The `nft -f -` input.
    pub script: String,
    /// Per-service counter name -> the VIP:port:protocol whose refused sources
    /// it counts (reason `source_range`).
    pub counters: BTreeMap<String, ServiceKey>,
}

/// The script that removes the table, whether it exists or not.
pub fn removal() -> String {
    format!("add table {TABLE}\ndelete table {TABLE}\n")
}

/// The name of the counter (and chain) of a VIP:port with source ranges, readable
/// in `nft list ruleset`: `src_10.100.0.1_tcp_443`, `src_2001-db8--5_udp_53` (an
/// nft name takes no `:`).
pub fn counter_name(key: &ServiceKey) -> String {
    let addr = key.addr.to_string().replace(':', "-");
    format!("src_{addr}_{}_{}", proto_name(key.proto), key.port)
}

fn proto_name(p: Proto) -> String {
    match p {
        Proto::Tcp => "tcp".into(),
        Proto::Udp => "udp".into(),
        Proto::Other(n) => n.to_string(),
    }
}

/// The ranges of the family of `v4` without those inside another one: the
/// prefixes left are disjoint, which an interval set needs (older nft refuses
/// overlapping elements).
fn disjoint(ranges: &BTreeSet<SourceRange>, v4: bool) -> Vec<SourceRange> {
    let inside = |r: &SourceRange| {
        ranges
            .iter()
            .any(|o| o.prefix() < r.prefix() && o.contains(r.addr()))
    };
    ranges
        .iter()
        .filter(|r| r.addr().is_ipv4() == v4 && !inside(r))
        .copied()
        .collect()
}

/// What one family's part of the table is built from.
struct Family<'a> {
    /// `4` or `6`: the suffix of its set, map and chain.
    v: char,
    ip: &'a str,
    addr_type: &'a str,
    addrs: BTreeSet<IpAddr>,
    /// (element, verdict) of the port map.
    ports: Vec<(String, String)>,
}

/// The script that makes the table hold exactly `admitted` ([`removal`] when it
/// is empty).
pub fn ruleset(admitted: &Admitted) -> Ruleset {
    if admitted.is_empty() {
        return Ruleset {
            script: removal(),
            counters: BTreeMap::new(),
        };
    }
    let mut v4 = Family {
        v: '4',
        ip: "ip",
        addr_type: "ipv4_addr",
        addrs: BTreeSet::new(),
        ports: Vec::new(),
    };
    let mut v6 = Family {
        v: '6',
        ip: "ip6",
        addr_type: "ipv6_addr",
        addrs: BTreeSet::new(),
        ports: Vec::new(),
    };
    let mut counters = BTreeMap::new();
    let mut src_chains = String::new();
    for (key, ranges) in admitted {
        let f = if key.addr.is_ipv4() { &mut v4 } else { &mut v6 };
        f.addrs.insert(key.addr);
        let element = format!("{} . {} . {}", key.addr, proto_name(key.proto), key.port);
        let verdict = match ranges {
            None => "accept".to_string(),
            Some(ranges) => {
                let name = counter_name(key);
                src_chain(&mut src_chains, &name, f.ip, ranges);
                counters.insert(name.clone(), *key);
                format!("jump {name}")
            }
        };
        f.ports.push((element, verdict));
    }
    let mut s = removal();
    let _ = writeln!(s, "table {TABLE} {{");
    for name in GLOBAL_COUNTERS
        .iter()
        .copied()
        .chain(counters.keys().map(String::as_str))
    {
        let _ = writeln!(s, "  counter {name} {{\n  }}");
    }
    let families = [&v4, &v6];
    let families = families.iter().filter(|f| !f.addrs.is_empty());
    for f in families.clone() {
        let addrs: Vec<String> = f.addrs.iter().map(ToString::to_string).collect();
        let _ = writeln!(s, "  set addrs{} {{\n    type {}", f.v, f.addr_type);
        elements(&mut s, addrs.iter().map(String::as_str));
        let _ = writeln!(s, "  }}");
        let _ = writeln!(
            s,
            "  map ports{} {{\n    type {} . inet_proto . inet_service : verdict",
            f.v, f.addr_type
        );
        let ports: Vec<String> = f.ports.iter().map(|(e, v)| format!("{e} : {v}")).collect();
        elements(&mut s, ports.iter().map(String::as_str));
        let _ = writeln!(s, "  }}");
    }
    let _ = writeln!(
        s,
        "  chain prerouting {{\n    type filter hook prerouting priority raw; policy accept;\n    \
         iif \"lo\" accept"
    );
    for f in families.clone() {
        let _ = writeln!(s, "    {} daddr @addrs{} jump to_vip{}", f.ip, f.v, f.v);
    }
    let _ = writeln!(s, "  }}");
    for f in families {
        to_vip_chain(&mut s, f);
    }
    s.push_str(&src_chains);
    s.push_str("}\n");
    Ruleset {
        script: s,
        counters,
    }
}

/// `elements = { ... }`, one per line (none: no line; nft takes no empty list).
fn elements<'a>(s: &mut String, items: impl Iterator<Item = &'a str>) {
    let mut any = false;
    for item in items {
        if !any {
            s.push_str("    elements = {\n");
            any = true;
        }
        let _ = writeln!(s, "      {item},");
    }
    if any {
        s.push_str("    }\n");
    }
}

/// The chain of packets to one family's VIP addresses.
fn to_vip_chain(s: &mut String, f: &Family) {
    let (fragment, icmp, icmp_proto, accepted) = match f.v {
        '4' => ("ip frag-off & 0x1fff != 0", "icmp", "icmp", ICMP_ACCEPTED),
        _ => ("frag frag-off != 0", "icmpv6", "ipv6-icmp", ICMPV6_ACCEPTED),
    };
    let _ = writeln!(s, "  chain to_vip{} {{", f.v);
    let _ = writeln!(
        s,
        "    {} daddr . meta l4proto . th dport vmap @ports{}",
        f.ip, f.v
    );
    let _ = writeln!(s, "    {fragment} accept");
    let _ = writeln!(s, "    {icmp} type {{ {accepted} }} accept");
    let _ = writeln!(
        s,
        "    meta l4proto {icmp_proto} counter name \"{DROP_VIP_ICMP}\" drop"
    );
    let _ = writeln!(
        s,
        "    meta l4proto {{ tcp, udp }} counter name \"{DROP_NO_SERVICE}\" drop"
    );
    let _ = writeln!(s, "    counter name \"{DROP_VIP_OTHER}\" drop");
    let _ = writeln!(s, "  }}");
}

/// The chain of one VIP:port with ranges: its sources accepted, the rest counted
/// and dropped (no range: every source dropped).
fn src_chain(s: &mut String, name: &str, ip: &str, ranges: &BTreeSet<SourceRange>) {
    let _ = writeln!(s, "  chain {name} {{");
    let nets: Vec<String> = disjoint(ranges, ip == "ip")
        .iter()
        .map(ToString::to_string)
        .collect();
    if !nets.is_empty() {
        let _ = writeln!(s, "    {ip} saddr {{ {} }} accept", nets.join(", "));
    }
    let _ = writeln!(s, "    counter name \"{name}\" drop");
    let _ = writeln!(s, "  }}");
}

#[cfg(test)]
mod tests;
