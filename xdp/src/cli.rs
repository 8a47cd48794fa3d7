//! `ringlb-edge datapath ...`: operator commands against the pinned XDP maps
//! of a running edge (nothing is loaded or attached by these commands, except
//! `uninstall`, which removes the datapath).
//!
//! ```text
//! ringlb-edge datapath dump [--slots]          VIPs, their backends, next hops
//! ringlb-edge datapath counters                global verdicts/reasons, per-VIP packets/bytes
//! ringlb-edge datapath lookup --proto tcp --src 192.0.2.7:40000 --dst 10.0.0.1:80
//! ringlb-edge datapath uninstall              detach and remove the pins
//! ```

use std::{collections::BTreeMap, fmt::Write as _, io::Write, net::SocketAddr, path::PathBuf};

use super::{
    Counters, Error, Proto, abi,
    lookup::{CtState, Lookup},
    xdp::XdpDatapath,
};

#[derive(clap::Args, Debug)]
pub struct DatapathArgs {
    /// Where the edge pinned its maps.
    #[arg(long, default_value = super::xdp::DEFAULT_PIN_DIR, global = true)]
    pub pin_dir: PathBuf,
    #[command(subcommand)]
    pub command: DatapathCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DatapathCommand {
    /// VIPs with their ring size and backends (id, address, generation, next
    /// hop). Backend ids are per (VIP, pod): a pod in two VIPs has two ids.
    Dump {
        /// Also count ring slots per backend (reads every slot: slower).
        #[arg(long)]
        slots: bool,
    },
    /// Global verdict/reason counters and per-VIP packets and bytes.
    Counters,
    /// Which backend a packet of this 5-tuple goes to now: the VIP address
    /// filter, conntrack, then the ring. For any packet but a TCP SYN. A SYN
    /// never follows a conntrack entry: it goes where the ring says, and
    /// rewrites an older entry of its 5-tuple that names another backend
    /// (ct_syn_rewrite). Where the 5-tuple has a live entry, this shows the
    /// entry, not the ring's choice a new SYN would take.
    Lookup {
        #[arg(long, default_value = "tcp")]
        proto: Proto,
        /// Client address:port.
        #[arg(long)]
        src: SocketAddr,
        /// VIP address:port.
        #[arg(long)]
        dst: SocketAddr,
    },
    /// Detach the program (every pinned link in --pin-dir) and remove every
    /// pin; traffic to the VIPs then goes to the kernel stack.
    Uninstall,
}

/// Runs one operator command, writing human-readable output to `out`.
pub fn run(args: &DatapathArgs, out: &mut dyn Write) -> Result<(), Error> {
    let dp = XdpDatapath::open_pinned(&args.pin_dir)?;
    let mut s = String::new();
    match &args.command {
        DatapathCommand::Dump { slots } => {
            let ids = dp.programmed().backends().map(|(_, _, b)| b.id);
            let backends = dp.backend_values(ids)?;
            let mut counts = BTreeMap::new();
            if *slots {
                for p in dp.programmed().vips.values() {
                    counts.insert(p.vip_id, dp.ring_slot_counts(p.vip_id, p.ring_size)?);
                }
            }
            s = format_dump(&dp, &backends, &counts);
        }
        DatapathCommand::Counters => s = format_counters(&dp.read_counters()?),
        DatapathCommand::Lookup { proto, src, dst } => {
            if src.is_ipv4() != dst.is_ipv4() {
                return Err(Error::InvalidService {
                    vip: dst.to_string(),
                    reason: format!("source {src} and destination {dst} are different families"),
                });
            }
            let f = flow(*proto, *src, *dst);
            s = format_lookup(&lookup_header(*proto, *src, *dst), &dp.lookup(&f)?);
        }
        DatapathCommand::Uninstall => {
            dp.remove()?;
            writeln!(s, "datapath removed from {}", args.pin_dir.display()).ok();
        }
    }
    out.write_all(s.as_bytes())
        .map_err(|source| Error::Syscall {
            call: "write",
            source,
        })
}

/// What a lookup's answer starts with: `192.0.2.7:40000 -> 10.0.0.1:80/tcp`, the
/// VIP written as `dump`, `counters` and the metric labels write it (one case).
pub fn lookup_header(proto: Proto, src: SocketAddr, dst: SocketAddr) -> String {
    let vip = super::Vip {
        addr: dst.ip(),
        port: dst.port(),
        proto,
    };
    format!("{src} -> {vip}")
}

/// The conntrack key of a 5-tuple.
pub fn flow(proto: Proto, src: SocketAddr, dst: SocketAddr) -> abi::Flow {
    let (saddr, family) = abi::RawAddr::from_ip(src.ip());
    abi::Flow {
        saddr,
        daddr: abi::RawAddr::from_ip(dst.ip()).0,
        sport: abi::Be16::from_host(src.port()),
        dport: abi::Be16::from_host(dst.port()),
        proto: proto.number(),
        family,
        flags: 0,
        pad: 0,
    }
}

fn mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// " vlan 100" (802.1Q) or " vlan 100 (802.1ad)" for a tagged next hop, "" untagged.
fn vlan_label(b: &abi::BackendValue) -> String {
    let tci = b.vlan_tci.to_host();
    if tci == 0 {
        return String::new();
    }
    let ad = if b.nh_valid & abi::NH_VLAN_8021AD != 0 {
        " (802.1ad)"
    } else {
        ""
    };
    format!(" vlan {}{ad}", tci & 0x0fff)
}

/// "remote VIP " for a backend that is another region's VIP, "" for a pod.
fn remote_label(b: &abi::BackendValue) -> &'static str {
    if b.is_remote() { "remote VIP " } else { "" }
}

/// `dump` output (pure: tested without BPF).
pub fn format_dump(
    dp: &XdpDatapath,
    backends: &BTreeMap<u32, abi::BackendValue>,
    slot_counts: &BTreeMap<u32, BTreeMap<u32, u32>>,
) -> String {
    format_dump_parts(&dp.programmed().vips, backends, slot_counts)
}

fn format_dump_parts(
    vips: &BTreeMap<super::Vip, super::state::ProgrammedVip>,
    backends: &BTreeMap<u32, abi::BackendValue>,
    slot_counts: &BTreeMap<u32, BTreeMap<u32, u32>>,
) -> String {
    let pairs: usize = vips.values().map(|p| p.backends.len()).sum();
    let mut s = format!(
        "{} VIPs, {pairs} backend ids (one per VIP and pod)\n",
        vips.len()
    );
    for (vip, p) in vips {
        let no_ct = if p.flags & abi::VIP_F_NO_CT != 0 {
            " no-conntrack"
        } else {
            ""
        };
        let alias = if p.flags & abi::VIP_F_FAILOVER_ALIAS != 0 {
            " failover-alias (IPIP to our VIPs only)"
        } else {
            ""
        };
        writeln!(
            s,
            "VIP {vip}  id {}  ring {}{no_ct}{alias}",
            p.vip_id, p.ring_size
        )
        .ok();
        let mut counts = slot_counts.get(&p.vip_id).cloned();
        for (addr, pb) in &p.backends {
            let nh = match backends.get(&pb.id) {
                Some(b) if b.family == 0 => "slot is empty (tombstone)".to_string(),
                Some(b) if b.is_local() => {
                    "a pod on this node: passed up the port to the node agent".to_string()
                }
                Some(b) if b.nh_valid & abi::NH_VALID != 0 => format!(
                    "{}via ifindex {}{} {} -> {}",
                    remote_label(b),
                    b.ifindex,
                    vlan_label(b),
                    mac(&b.smac),
                    mac(&b.dmac)
                ),
                Some(b) => format!(
                    "{}next hop unresolved (bpf_fib_lookup fallback)",
                    remote_label(b)
                ),
                None => "<missing>".to_string(),
            };
            let slots = counts
                .as_mut()
                .map(|c| format!("{:>6} slots  ", c.remove(&pb.id).unwrap_or(0)))
                .unwrap_or_default();
            let addr = addr.to_string();
            writeln!(
                s,
                "  backend {:>7} {addr:<39} gen {:<6} {slots}{nh}",
                pb.id, pb.generation
            )
            .ok();
        }
        // ring slots naming an id this VIP does not own (empty, being replaced)
        for (id, n) in counts.into_iter().flatten() {
            writeln!(s, "  backend {id:>7} {:<39} {n:>6} slots  not this VIP's (the program drops or the next apply rewrites them)", "-").ok();
        }
    }
    s
}

/// `lookup` output.
pub fn format_lookup(what: &str, l: &Lookup) -> String {
    let ct = |c: &CtState| match c {
        CtState::Off => "conntrack off for this VIP".to_string(),
        CtState::Miss => "no conntrack entry yet".to_string(),
        CtState::Hit => "conntrack entry".to_string(),
        CtState::Stale { id, generation } => format!(
            "the conntrack entry (backend id {id}, generation {generation}) is stale: that backend was removed or its id reused"
        ),
    };
    match l {
        Lookup::NotVip {
            conntrack: CtState::Stale { id, .. },
        } => format!(
            "{what}: not a VIP (any more), passed to the kernel (pass_not_vip); its stale conntrack entry (backend id {id}) is deleted (ct_stale)\n"
        ),
        Lookup::NotVip { .. } => {
            format!("{what}: not a VIP, passed to the kernel (pass_not_vip)\n")
        }
        Lookup::NoService {
            conntrack: CtState::Stale { id, .. },
        } => format!(
            "{what}: one of this edge's VIP addresses, but no Service on this port and protocol (any more): dropped (drop_no_service); its stale conntrack entry (backend id {id}) is deleted (ct_stale)\n"
        ),
        Lookup::NoService { .. } => format!(
            "{what}: one of this edge's VIP addresses, but no Service on this port and protocol: dropped (drop_no_service)\n"
        ),
        Lookup::Backend {
            vip,
            id,
            addr,
            conntrack: CtState::Hit,
            ..
        } => format!("{what}: VIP {vip}, backend {addr} (id {id}; from the conntrack entry)\n"),
        Lookup::Backend {
            vip,
            id,
            addr,
            conntrack,
            slot,
        } => format!(
            "{what}: VIP {vip}, backend {addr} (id {id}; Maglev ring slot {}; {})\n",
            slot.unwrap_or(0),
            ct(conntrack)
        ),
        Lookup::Affinity {
            vip,
            id,
            addr,
            conntrack,
        } => format!(
            "{what}: VIP {vip}, backend {addr} (id {id}; the client's pod from the affinity table; {})\n",
            ct(conntrack)
        ),
        Lookup::SourceRefused { vip, conntrack } => format!(
            "{what}: VIP {vip}: the source is outside its loadBalancerSourceRanges: dropped (drop_source_range; {})\n",
            ct(conntrack)
        ),
        Lookup::AliasPlain { vip } => format!(
            "{what}: VIP {vip} is a failover alias: it serves only IPIP packets to one of this edge's VIPs; a plain packet is passed to the kernel (pass_alias_plain)\n"
        ),
        Lookup::NoBackend {
            vip,
            slot,
            id,
            conntrack,
        } => format!(
            "{what}: VIP {vip}, but no backend: ring slot {} holds {} ({}); the program drops it (drop_no_backend)\n",
            slot.map_or_else(|| "-".to_string(), |s| s.to_string()),
            if *id == 0 {
                "no backend id".to_string()
            } else {
                format!("id {id}, an empty backend slot")
            },
            ct(conntrack)
        ),
    }
}

/// `counters` output.
pub fn format_counters(c: &Counters) -> String {
    let mut s = String::from("global:\n");
    for (label, v) in &c.global {
        writeln!(s, "  {label:<18} {v}").ok();
    }
    writeln!(s, "per VIP:").ok();
    for (vip, p, b) in &c.per_vip {
        writeln!(s, "  {vip:<45} {p:>12} packets {b:>15} bytes").ok();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Vip,
        state::{ProgrammedBackend, ProgrammedVip},
    };

    #[test]
    fn dump_lists_vips_slots_and_next_hops() {
        let vip = Vip {
            addr: "10.0.0.1".parse().unwrap(),
            port: 80,
            proto: Proto::Tcp,
        };
        let vips = [(
            vip,
            ProgrammedVip {
                vip_id: 3,
                ring_size: 251,
                flags: abi::VIP_F_NO_CT,
                ring: None,
                backends: [(
                    "10.1.0.1".parse().unwrap(),
                    ProgrammedBackend {
                        id: 1,
                        generation: 4,
                        remote: false,
                    },
                )]
                .into_iter()
                .collect(),
                entry: None,
                src_ranges: Default::default(),
                src_set_of: None,
            },
        )]
        .into_iter()
        .collect();
        let (addr, family) = abi::RawAddr::from_ip("10.1.0.1".parse().unwrap());
        let b = abi::BackendValue {
            addr,
            family,
            generation: 4,
            ifindex: 2,
            smac: [2, 0, 0, 0, 0, 1],
            dmac: [2, 0, 0, 0, 0, 0xff],
            nh_valid: 1,
            ..Default::default()
        };
        let counts = [(3, [(1, 250), (0, 1)].into_iter().collect())]
            .into_iter()
            .collect();
        let s = format_dump_parts(&vips, &[(1, b)].into_iter().collect(), &counts);
        assert!(
            s.contains("VIP 10.0.0.1:80/tcp  id 3  ring 251 no-conntrack"),
            "{s}"
        );
        assert!(s.contains("10.1.0.1") && s.contains("250 slots"), "{s}");
        assert!(
            s.contains("gen 4") && s.contains("1 slots  not this VIP's"),
            "{s}"
        );
        assert!(
            s.contains("via ifindex 2 02:00:00:00:00:01 -> 02:00:00:00:00:ff"),
            "{s}"
        );
        // a next hop behind a VLAN device names its tag
        let tagged = abi::BackendValue {
            vlan_tci: abi::Be16::from_host(100),
            ..b
        };
        let s = format_dump_parts(&vips, &[(1, tagged)].into_iter().collect(), &counts);
        assert!(
            s.contains("via ifindex 2 vlan 100 02:00:00:00:00:01"),
            "{s}"
        );
        let ad = abi::BackendValue {
            nh_valid: abi::NH_VALID | abi::NH_VLAN_8021AD,
            ..tagged
        };
        let s = format_dump_parts(&vips, &[(1, ad)].into_iter().collect(), &counts);
        assert!(s.contains("vlan 100 (802.1ad)"), "{s}");
        // a remote-VIP backend (failover) of an alias-free VIP, unresolved
        let remote = abi::BackendValue {
            nh_valid: abi::BE_F_REMOTE_VIP,
            ..b
        };
        let s = format_dump_parts(&vips, &[(1, remote)].into_iter().collect(), &counts);
        assert!(
            s.contains("remote VIP next hop unresolved (bpf_fib_lookup fallback)"),
            "{s}"
        );
        // a pod on this node (BE_F_LOCAL)
        let local = b.with_local(true);
        let s = format_dump_parts(&vips, &[(1, local)].into_iter().collect(), &counts);
        assert!(
            s.contains("a pod on this node: passed up the port to the node agent"),
            "{s}"
        );
        let mut alias = vips.clone();
        alias.get_mut(&vip).unwrap().flags = abi::VIP_F_FAILOVER_ALIAS;
        let s = format_dump_parts(&alias, &[(1, b)].into_iter().collect(), &counts);
        assert!(
            s.contains("ring 251 failover-alias (IPIP to our VIPs only)"),
            "{s}"
        );
    }

    #[test]
    fn a_read_of_a_pin_dir_without_maps_says_so_once() {
        let dir = std::env::temp_dir().join(format!("ringlb-no-pins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = DatapathArgs {
            pin_dir: dir.clone(),
            command: DatapathCommand::Dump { slots: false },
        };
        let e = run(&args, &mut Vec::new()).unwrap_err();
        std::fs::remove_dir(&dir).unwrap();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("no pinned map at {}/", dir.display()))
                && text.ends_with("is the edge running with this --pin-dir?"),
            "{text}"
        );
        assert!(!text.contains("pinning"), "a read is no pinning: {text}");
        // Nothing under `Caused by:` repeats it.
        assert!(std::error::Error::source(&e).is_none(), "{e:?}");
    }

    #[test]
    fn counters_and_flow_keys() {
        let c = Counters {
            global: vec![("tx", 5)],
            ..Default::default()
        };
        assert!(format_counters(&c).contains("tx"));
        let f = flow(
            Proto::Udp,
            "192.0.2.1:5".parse().unwrap(),
            "10.0.0.1:53".parse().unwrap(),
        );
        assert_eq!(
            (f.proto, f.family, f.dport.to_host()),
            (17, abi::AF_INET, 53)
        );
    }

    #[test]
    fn lookup_says_what_the_program_does() {
        let vip = Vip {
            addr: "10.0.0.1".parse().unwrap(),
            port: 0,
            proto: Proto::Tcp,
        };
        let header = lookup_header(
            Proto::Tcp,
            "192.0.2.7:40000".parse().unwrap(),
            "10.0.0.1:80".parse().unwrap(),
        );
        assert_eq!(header, "192.0.2.7:40000 -> 10.0.0.1:80/tcp");
        let v6 = lookup_header(
            Proto::Udp,
            "[2001:db8::7]:5".parse().unwrap(),
            "[2001:db8::1]:53".parse().unwrap(),
        );
        assert!(v6.ends_with(":53/udp"), "{v6}");
        let f = |l: Lookup| format_lookup("c -> v", &l);
        assert!(
            f(Lookup::NotVip {
                conntrack: CtState::Miss
            })
            .contains("not a VIP")
        );
        assert!(
            f(Lookup::NoService {
                conntrack: CtState::Miss
            })
            .contains("no Service on this port and protocol: dropped (drop_no_service)")
        );
        let hit = f(Lookup::Backend {
            vip,
            id: 7,
            addr: "10.1.0.1".parse().unwrap(),
            conntrack: CtState::Hit,
            slot: None,
        });
        assert!(
            hit.contains("10.1.0.1 (id 7; from the conntrack entry)"),
            "{hit}"
        );
        let stale = f(Lookup::Backend {
            vip,
            id: 8,
            addr: "10.1.0.2".parse().unwrap(),
            conntrack: CtState::Stale {
                id: 7,
                generation: 3,
            },
            slot: Some(5),
        });
        assert!(
            stale.contains("ring slot 5") && stale.contains("is stale"),
            "{stale}"
        );
        let drop = f(Lookup::NoBackend {
            vip,
            slot: Some(2),
            id: 0,
            conntrack: CtState::Miss,
        });
        assert!(
            drop.contains("VIP 10.0.0.1:0/tcp") && drop.contains("drop_no_backend"),
            "{drop}"
        );
    }
}
