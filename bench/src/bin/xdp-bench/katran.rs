//! `--katran-object PATH`: Katran's XDP balancer (katran/lib/bpf/balancer.bpf.c,
//! compiled by the user: docs/bench-xdp.md, "How to run Katran side by side")
//! timed beside ours by method S, on the same VIPs, backends and packets.
//!
//! The maps are programmed the way Katran's userspace (KatranLb.cpp) does:
//! VIP number `i` for the `i`-th VIP added (vipNums_ counts from 0), real
//! index 1, 2, ... for each new backend address (realNums_ counts from 1; 0
//! means "no real"), `ch_rings[vip_num * RING_SIZE + slot] = real index`, the
//! default router's MAC in `ctl_array[0]`, and one LRU_HASH of `LruSize /
//! forwarding cores` entries per forwarding core (here: every possible CPU)
//! in `lru_mapping`. The ring's contents are the same Maglev tables as our
//! rows (Katran's MaglevHash seeds its permutation with folly's address hash,
//! which is not reproduced here; the contents do not change what a lookup
//! costs). Sizes compiled into the object (MAX_VIPS, RING_SIZE, MAX_REALS)
//! are read from its maps; the rest are Katran's defaults (balancer_consts.h),
//! which the documented build leaves alone.

use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::AsFd,
    path::Path,
};

use anyhow::{Context, bail, ensure};
use aya::{
    Ebpf,
    maps::{Array, ArrayOfMaps, HashMap, IterableMap, Map, MapData, PerCpuArray},
    programs::Xdp,
};
use ringlb_xdp::{DesiredState, abi, batch::update_batch};

use crate::{
    Args, check,
    setup::{XDP_PASS, XDP_TX, ack, not_vip, vip_addr},
    timing::{handshakes, method_s},
};

/// The XDP program of balancer.bpf.c (`SEC("xdp")`).
const PROGRAM: &str = "balancer_ingress";

/// The default router's MAC (`ctl_array[kMacAddrPos]`): the next hop of our
/// rows, so both programs' frames go to the same MAC.
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// KatranConfig::LruSize default (kDefaultLruSize, KatranLbStructs.h): the
/// connection table, split evenly over the forwarding cores.
const LRU_SIZE: u32 = 8_000_000;

/// balancer_consts.h defaults the documented build keeps.
const MAX_CONN_RATE: u32 = 125_000; // new flows per second and CPU before LRU bypass
const IPIP_V4_PREFIX: [u8; 2] = [172, 16]; // outer source 172.16.x.y
// DEFAULT_TTL 64: the TTL check::ipip wants of every balancer

/// Offsets past MAX_VIPS of the global counters in `stats`
/// (balancer_consts.h).
const LRU_CNTRS: u32 = 0; // v1 VIP packets, v2 LRU misses
const LRU_MISS_CNTR: u32 = 1; // v1 misses of SYNs, v2 of other TCP packets
const FALLBACK_LRU_CNTR: u32 = 3; // packets that found no per-CPU LRU
const XDP_TX_CNTR: u32 = 17;
const XDP_PASS_CNTR: u32 = 19;

const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

/// `struct vip_definition` (balancer_structs.h): the address in network
/// order (v4 in the first 4 bytes), the port in network order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct VipDefinition {
    vip: [u8; 16],
    port: [u8; 2],
    proto: u8,
    pad: u8,
}

/// `struct vip_meta`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct VipMeta {
    flags: u32,
    vip_num: u32,
}

/// `struct real_definition`: flags 0 = an IPv4 real (F_IPV6 unset).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RealDefinition {
    dst: [u8; 16],
    flags: u8,
    pad: [u8; 3],
}

/// `struct ctl_value`: a union of u64, u32 ifindex and the 6-byte MAC.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
struct CtlValue {
    mac: [u8; 6],
    pad: [u8; 2],
}

/// `struct flow_key`: the LRU's key (only its size matters here).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FlowKey {
    src: [u8; 16],
    dst: [u8; 16],
    ports: [u8; 4],
    proto: u8,
    pad: [u8; 3],
}

/// `struct real_pos_lru`: the LRU's value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RealPosLru {
    pos: u32,
    pad: u32,
    atime: u64,
}

/// `struct lb_stats`: the value of `stats` (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct LbStats {
    v1: u64,
    v2: u64,
}

const _: () = assert!(size_of::<VipDefinition>() == 20);
const _: () = assert!(size_of::<VipMeta>() == 8);
const _: () = assert!(size_of::<RealDefinition>() == 20);
const _: () = assert!(size_of::<CtlValue>() == 8);
const _: () = assert!(size_of::<FlowKey>() == 40);
const _: () = assert!(size_of::<RealPosLru>() == 16);
const _: () = assert!(size_of::<LbStats>() == 16);

// SAFETY (for every impl below): aya::Pod requires plain old data with no
// padding bytes the kernel could read uninitialised and no invalid bit
// patterns. Each type is #[repr(C)], made only of integers and arrays of
// integers, spells its padding out as fields, and its size is asserted above.
#[allow(unsafe_code)]
mod pod {
    use super::*;
    unsafe impl aya::Pod for VipDefinition {}
    unsafe impl aya::Pod for VipMeta {}
    unsafe impl aya::Pod for RealDefinition {}
    unsafe impl aya::Pod for CtlValue {}
    unsafe impl aya::Pod for LbStats {}
}

/// Katran's object, loaded, with its maps programmed for one desired state.
struct Katran {
    ebpf: Ebpf,
    /// MAX_VIPS (vip_map's size): the global counters start there in `stats`.
    max_vips: u32,
    /// RING_SIZE (ch_rings' size / MAX_VIPS).
    ring: u32,
}

fn map<'a>(ebpf: &'a Ebpf, name: &str) -> anyhow::Result<&'a Map> {
    ebpf.map(name)
        .with_context(|| format!("Katran object: no map `{name}` (not balancer.bpf.c?)"))
}

fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("Katran object: no map `{name}` (not balancer.bpf.c?)"))
}

fn v4(addr: IpAddr) -> anyhow::Result<Ipv4Addr> {
    match addr {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(a) => bail!("{a}: the Katran rows are IPv4 only"),
    }
}

/// The first 4 of 16 bytes: a v4 address in Katran's address unions.
fn addr16(a: Ipv4Addr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&a.octets());
    b
}

impl Katran {
    /// Loads the object: its maps, the program (verified), the per-CPU LRUs.
    fn load(object: &[u8], cpus: u32) -> anyhow::Result<Self> {
        let mut ebpf = Ebpf::load(object).context("loading the Katran object")?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .with_context(|| format!("Katran object: no program `{PROGRAM}`"))?
            .try_into()
            .with_context(|| format!("Katran object: `{PROGRAM}` is not an XDP program"))?;
        prog.load()
            .with_context(|| format!("Katran object: loading `{PROGRAM}` (verifier)"))?;
        let vips: HashMap<&MapData, VipDefinition, VipMeta> = map(&ebpf, "vip_map")?.try_into()?;
        let max_vips = vips.map().info().context("vip_map")?.max_entries();
        let rings: Array<&MapData, u32> = map(&ebpf, "ch_rings")?.try_into()?;
        ensure!(
            max_vips > 0 && rings.len().is_multiple_of(max_vips),
            "ch_rings has {} entries, not a multiple of MAX_VIPS {max_vips}",
            rings.len()
        );
        let ring = rings.len() / max_vips;
        let stats: PerCpuArray<&MapData, LbStats> = map(&ebpf, "stats")?.try_into()?;
        ensure!(
            stats.len() == 2 * max_vips,
            "stats has {} entries, expected 2 x MAX_VIPS {max_vips}",
            stats.len()
        );
        let mut k = Katran {
            ebpf,
            max_vips,
            ring,
        };
        k.attach_lrus(cpus)?;
        k.set_router_mac(ROUTER_MAC)?;
        Ok(k)
    }

    fn program(&self) -> anyhow::Result<&Xdp> {
        Ok(self
            .ebpf
            .program(PROGRAM)
            .with_context(|| format!("no program `{PROGRAM}`"))?
            .try_into()?)
    }

    /// KatranLb::initLrus + attachLrus: one LRU_HASH per forwarding core,
    /// `lru_mapping[core]` = that map.
    fn attach_lrus(&mut self, cpus: u32) -> anyhow::Result<()> {
        let mut outer: ArrayOfMaps<&mut MapData, MapData> =
            map_mut(&mut self.ebpf, "lru_mapping")?.try_into()?;
        for cpu in 0..cpus {
            let def = aya_obj::Map::new_from_params(
                BPF_MAP_TYPE_LRU_HASH,
                size_of::<FlowKey>() as u32,
                size_of::<RealPosLru>() as u32,
                LRU_SIZE / cpus,
                0,
            );
            let lru = MapData::create(def, &format!("katran_lru{cpu}"), None)
                .with_context(|| format!("creating the LRU of CPU {cpu}"))?;
            outer
                .set(cpu, &lru, 0)
                .with_context(|| format!("lru_mapping[{cpu}]"))?;
        }
        Ok(())
    }

    /// `ctl_array[kMacAddrPos = 0]`: the MAC every encapsulated frame goes to.
    fn set_router_mac(&mut self, mac: [u8; 6]) -> anyhow::Result<()> {
        let mut ctl: Array<&mut MapData, CtlValue> =
            map_mut(&mut self.ebpf, "ctl_array")?.try_into()?;
        ctl.set(0, CtlValue { mac, pad: [0; 2] }, 0)
            .context("ctl_array[0]")?;
        Ok(())
    }

    /// KatranLb::addVip + modifyRealsForVip for every service of `d`, in
    /// order: VIP `i` gets vip_num `i`, its backends the next real indices.
    fn add_services(&mut self, d: &DesiredState) -> anyhow::Result<()> {
        let n = u32::try_from(d.services.len())?;
        ensure!(
            n <= self.max_vips,
            "{n} VIPs but the object's MAX_VIPS is {}: rebuild it with -DMAX_VIPS={}",
            self.max_vips,
            n.next_power_of_two()
        );
        let mut next_real = 1u32;
        for (vip_num, (vip, entry)) in d.services.iter().enumerate() {
            let vip_num = u32::try_from(vip_num)?;
            let first = next_real;
            let reals: Vec<RealDefinition> = entry
                .backends()
                .iter()
                .map(|&b| {
                    Ok(RealDefinition {
                        dst: addr16(v4(b)?),
                        ..RealDefinition::default()
                    })
                })
                .collect::<anyhow::Result<_>>()?;
            next_real += u32::try_from(reals.len())?;
            self.put_reals(first, &reals)?;
            self.put_ring(vip_num, first, entry.ring())?;
            let key = VipDefinition {
                vip: addr16(v4(vip.addr)?),
                port: vip.port.to_be_bytes(),
                proto: vip.proto.number(),
                pad: 0,
            };
            let mut vips: HashMap<&mut MapData, VipDefinition, VipMeta> =
                map_mut(&mut self.ebpf, "vip_map")?.try_into()?;
            vips.insert(key, VipMeta { flags: 0, vip_num }, 0)
                .with_context(|| format!("vip_map: VIP {} (vip_num {vip_num})", vip.addr))?;
        }
        Ok(())
    }

    /// `reals[first + k] = reals[k]` (KatranLb::increaseRefCountForReal).
    fn put_reals(&mut self, first: u32, reals: &[RealDefinition]) -> anyhow::Result<()> {
        let m: Array<&MapData, RealDefinition> = map(&self.ebpf, "reals")?.try_into()?;
        let n = u32::try_from(reals.len())?;
        ensure!(
            first + n <= m.len(),
            "{} reals needed but the object's MAX_REALS is {}: rebuild it with a larger -DMAX_REALS",
            first + n,
            m.len()
        );
        let keys: Vec<u32> = (first..first + n).collect();
        update_batch(m.map().fd().as_fd(), &keys, reals).context("reals")
    }

    /// `ch_rings[vip_num * RING_SIZE + slot] = first + ring[slot]`
    /// (KatranLb::programHashRing).
    fn put_ring(&mut self, vip_num: u32, first: u32, ring: &[u32]) -> anyhow::Result<()> {
        ensure!(
            ring.len() == self.ring as usize,
            "ring of {} slots but the object's RING_SIZE is {}: pass --ring {} \
             or rebuild the object with -DRING_SIZE={}",
            ring.len(),
            self.ring,
            self.ring,
            ring.len()
        );
        let m: Array<&MapData, u32> = map(&self.ebpf, "ch_rings")?.try_into()?;
        let keys: Vec<u32> = (0..self.ring).map(|s| vip_num * self.ring + s).collect();
        let values: Vec<u32> = ring.iter().map(|&b| first + b).collect();
        update_batch(m.map().fd().as_fd(), &keys, &values).context("ch_rings")
    }

    /// `stats[key]`, summed over CPUs.
    fn stat(&self, key: u32) -> anyhow::Result<LbStats> {
        let m: PerCpuArray<&MapData, LbStats> = map(&self.ebpf, "stats")?.try_into()?;
        let per_cpu = m.get(&key, 0).with_context(|| format!("stats[{key}]"))?;
        Ok(per_cpu.iter().fold(LbStats::default(), |s, x| LbStats {
            v1: s.v1 + x.v1,
            v2: s.v2 + x.v2,
        }))
    }

    /// The counters that tell which path the packets took.
    fn counters(&self, vip_num: u32) -> anyhow::Result<Counters> {
        let g = |off| self.stat(self.max_vips + off);
        let (lru, miss) = (g(LRU_CNTRS)?, g(LRU_MISS_CNTR)?);
        Ok(Counters {
            tx: g(XDP_TX_CNTR)?.v1,
            pass: g(XDP_PASS_CNTR)?.v1,
            vip_packets: self.stat(vip_num)?.v1,
            lru_misses: lru.v2,
            syn_misses: miss.v1,
            other_misses: miss.v2,
            fallback_lru: g(FALLBACK_LRU_CNTR)?.v1,
        })
    }

    /// Runs `timed` and checks that the counters moved by exactly `want`.
    fn counted<T>(
        &self,
        vip_num: u32,
        want: Counters,
        timed: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let before = self.counters(vip_num)?;
        let t = timed()?;
        let moved = self.counters(vip_num)?.minus(&before);
        ensure!(
            moved == want,
            "Katran's counters moved by {moved:?}, expected {want:?}"
        );
        Ok(t)
    }
}

/// Katran's counters a benchmark row moves (sums over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    tx: u64,
    pass: u64,
    vip_packets: u64,
    /// Packets of a VIP not found in the LRU.
    lru_misses: u64,
    syn_misses: u64,
    /// Non-SYN TCP misses (a first ACK that missed: under flood, no insert).
    other_misses: u64,
    /// Packets on a CPU without its own LRU (must stay 0).
    fallback_lru: u64,
}

impl Counters {
    fn minus(&self, o: &Counters) -> Counters {
        Counters {
            tx: self.tx - o.tx,
            pass: self.pass - o.pass,
            vip_packets: self.vip_packets - o.vip_packets,
            lru_misses: self.lru_misses - o.lru_misses,
            syn_misses: self.syn_misses - o.syn_misses,
            other_misses: self.other_misses - o.other_misses,
            fallback_lru: self.fallback_lru - o.fallback_lru,
        }
    }
}

/// The outer source Katran writes (create_encap_ipv4_src): 172.16, then the
/// client address's last two bytes XOR the source port's low and high byte.
fn outer_source(input: &[u8]) -> Ipv4Addr {
    let (src, port) = (&input[26..30], &input[34..36]);
    Ipv4Addr::new(
        IPIP_V4_PREFIX[0],
        IPIP_V4_PREFIX[1],
        src[2] ^ port[1],
        src[3] ^ port[0],
    )
}

/// Checks Katran's IPIP frame `out` made from `input` for VIP `vip`, whose
/// backends are `backend_addr(vip, 0..backends)`: what every IPIP frame must
/// be (`check::ipip`), to the router's MAC from the input's destination MAC
/// and from Katran's outer source, and the outer header's TOS the inner one's,
/// id 0, no fragment bits. Returns the backend.
fn encapped(input: &[u8], out: &[u8], vip: u32, backends: u32) -> anyhow::Result<Ipv4Addr> {
    let mut from = [0u8; 6];
    from.copy_from_slice(&input[..6]);
    let (ip, dst) = check::ipip(
        input,
        out,
        (ROUTER_MAC, from),
        outer_source(input),
        vip,
        backends,
    )?;
    ensure!(
        ip[1] == input[15] && ip[4..8] == [0, 0, 0, 0],
        "outer TOS, id or fragment bits {ip:02x?}"
    );
    Ok(dst)
}

/// The vip_num `add_services` gave the VIP at `addr`.
fn vip_num(d: &DesiredState, addr: IpAddr) -> anyhow::Result<u32> {
    let i = d.services.keys().position(|v| v.addr == addr);
    Ok(u32::try_from(i.with_context(|| format!("no VIP {addr}"))?)?)
}

/// Reads the object given with `--katran-object` (before any row runs).
pub(crate) fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("--katran-object {}", path.display()))
}

/// One loaded object and the VIP the rows send to.
struct Target {
    k: Katran,
    /// The VIP's number in `setup` (its packets: `syn(vip, n)`, `ack(vip, n)`).
    vip: u32,
    /// Its vip_num in Katran's maps (its `stats` entry).
    vip_num: u32,
    backends: u32,
}

impl Target {
    /// The backend of an encapsulated frame, checked ([`encapped`]).
    fn to(&self, input: &[u8], out: &[u8]) -> anyhow::Result<Ipv4Addr> {
        encapped(input, out, self.vip, self.backends)
    }

    /// Conntrack hit: `calls` ACKs of flow 7, established first.
    fn hit(&self, calls: u32) -> anyhow::Result<f64> {
        let prog = self.k.program()?;
        handshakes(prog, self.vip, 7, 1, |i, o| self.to(i, o)).context("flow 7")?;
        let want = Counters {
            tx: calls.into(),
            vip_packets: calls.into(),
            ..Counters::default()
        };
        self.k.counted(self.vip_num, want, || {
            let pkt = |_| ack(self.vip, 7);
            method_s(prog, calls, XDP_TX, pkt, |i, o| self.to(i, o).map(|_| ()))
        })
    }

    /// `calls` packets to an address that is no VIP: passed unchanged.
    fn not_vip(&self, calls: u32) -> anyhow::Result<f64> {
        let prog = self.k.program()?;
        let want = Counters {
            pass: calls.into(),
            ..Counters::default()
        };
        self.k.counted(self.vip_num, want, || {
            let pkt = |n| not_vip(self.vip, n);
            method_s(prog, calls, XDP_PASS, pkt, check::unchanged)
        })
    }

    /// `flows` new flows (source ports from flow 100 on): each SYN, then its
    /// first ACK, which must be an LRU hit. Mean ns of the SYNs, of the ACKs.
    fn new_flows(&self, flows: u32) -> anyhow::Result<(f64, f64)> {
        let prog = self.k.program()?;
        let n = u64::from(flows);
        let want = Counters {
            tx: 2 * n,
            vip_packets: 2 * n,
            lru_misses: n,
            syn_misses: n,
            ..Counters::default()
        };
        self.k.counted(self.vip_num, want, || {
            handshakes(prog, self.vip, 100, flows, |i, o| self.to(i, o))
        })
    }
}

/// The `katran` rows with the VIPs of `d` (target VIP `vips / 2`), method S:
/// conntrack hit, not a VIP, a new flow's SYN and its first ACK. Every frame
/// and the counters of every row are checked.
pub(crate) fn rows(
    a: &Args,
    object: &[u8],
    d: &DesiredState,
    vips: u32,
    cpus: u32,
) -> anyhow::Result<()> {
    let t = std::time::Instant::now();
    let mut k = Katran::load(object, cpus)?;
    k.add_services(d)?;
    eprintln!(
        "katran {vips} VIPs: maps {:?} (MAX_VIPS {}, RING_SIZE {})",
        t.elapsed(),
        k.max_vips,
        k.ring
    );
    let vip = vips / 2;
    let vip_num = vip_num(d, vip_addr(vip))?;
    let tg = Target {
        k,
        vip,
        vip_num,
        backends: a.backends,
    };
    let hit = tg.hit(a.calls).context("katran: conntrack hit")?;
    let pass = tg.not_vip(a.calls).context("katran: not a VIP")?;
    // as many new flows as ringlb_xdp's "new flow" rows, and fewer than
    // MAX_CONN_RATE (beyond it Katran stops inserting for the second)
    let flows = (a.calls.min(abi::CT_SIZE / cpus / 2) / 2).min(MAX_CONN_RATE - 1);
    let (syn, ack) = tg.new_flows(flows).context("katran: new flows")?;
    for (path, ns) in [
        ("conntrack hit (ACK)", hit),
        ("not a VIP: XDP_PASS", pass),
        ("new flow: SYN", syn),
        ("new flow: its first ACK", ack),
    ] {
        println!("| katran | {path} | {vips} | - | {ns:.1} |");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::{backend_addr, syn};

    /// balancer_consts.h's DEFAULT_TTL.
    const DEFAULT_TTL: u8 = 64;

    /// The frame Katran's encap_v4 makes of `input` for `backend`, by hand.
    fn katran_frame(input: &[u8], backend: Ipv4Addr) -> Vec<u8> {
        let mut out = ROUTER_MAC.to_vec();
        out.extend_from_slice(&input[..6]);
        out.extend_from_slice(&[0x08, 0x00]);
        let len = u16::from_be_bytes([input[16], input[17]]) + 20;
        let mut ip = vec![0x45, input[15]];
        ip.extend_from_slice(&len.to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0, 0, DEFAULT_TTL, 4, 0, 0]);
        ip.extend_from_slice(&outer_source(input).octets());
        ip.extend_from_slice(&backend.octets());
        let c = ringlb_testkit::packet::ipv4_checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
        out.extend_from_slice(&input[14..]);
        out
    }

    #[test]
    fn outer_source_is_katrans() {
        // client 192.168.0.1, source port 0x0400 + 5 = 1029 (flow 5 + 16384)
        let p = syn(3, (1 << 14) + 5);
        assert_eq!(&p[26..30], &[192, 168, 0, 1]);
        assert_eq!(&p[34..36], &[0x04, 0x05]);
        assert_eq!(outer_source(&p), Ipv4Addr::new(172, 16, 5, 1 ^ 4));
    }

    #[test]
    fn encapped_accepts_katrans_frame_and_nothing_else() {
        let p = syn(3, 7);
        let b = v4(backend_addr(3, 99)).unwrap();
        let good = katran_frame(&p, b);
        assert_eq!(encapped(&p, &good, 3, 100).unwrap(), b);
        assert!(encapped(&p, &good, 3, 99).is_err(), "backend 99 of 99");
        assert!(encapped(&p, &good, 4, 100).is_err(), "another VIP");
        // any single byte changed: rejected
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            assert!(encapped(&p, &bad, 3, 100).is_err(), "byte {at} changed");
        }
        assert!(encapped(&p, &good[..good.len() - 1], 3, 100).is_err());
    }
}
