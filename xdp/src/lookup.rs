//! `XdpDatapath::lookup`: what the XDP program would do with a 5-tuple now,
//! decided step by step as `bpf/xdp_lb.bpf.c` does (the VIP address filter,
//! conntrack with its generation check, then the VIP and the port-0 wildcard,
//! then the Maglev ring), from the live maps, for any packet but a TCP SYN (a
//! SYN never follows a conntrack entry: the ring decides, which `slot` shows
//! on a miss; the program only rewrites an old entry that names another
//! backend). Read-only: nothing is inserted. The operator's
//! `ringlb-edge datapath lookup` prints it; `tests/xdp_lookup.rs` checks it
//! against BPF_PROG_TEST_RUN.

use std::net::{IpAddr, Ipv4Addr};

use aya::maps::{
    Array, ArrayOfMaps, HashMap, MapData, MapError,
    lpm_trie::{Key, LpmTrie},
};

use super::{Error, Vip, VipAbi, abi, map_err, xdp::XdpDatapath};

/// The conntrack step of a [`Lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtState {
    /// The VIP has conntrack off (`VIP_F_NO_CT`).
    Off,
    /// No entry: the ring decides (and the program inserts an entry).
    Miss,
    /// An entry whose backend is live with the same generation: it decides.
    Hit,
    /// An entry whose backend id was removed (tombstone, empty) or reassigned
    /// (another generation): ignored, the ring decides (`ct_stale`).
    Stale { id: u32, generation: u32 },
}

/// What the program does with a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// No VIP entry for (address, port, protocol) nor the port-0 wildcard:
    /// `XDP_PASS` (`pass_not_vip`). `conntrack` is `Miss` (also when the
    /// address's `vip_filter` bit is clear: then conntrack is not looked up at
    /// all), or `Stale` for an entry of a VIP that is gone whose address still
    /// has a VIP (the program counts and deletes it).
    NotVip { conntrack: CtState },
    /// One of this edge's own VIP addresses (`vip_addrs`), but no VIP entry
    /// for the port and protocol nor the port-0 wildcard: `XDP_DROP`
    /// (`drop_no_service`; passed, the kernel would route it back to the
    /// ToR). `conntrack` as for `NotVip`.
    NoService { conntrack: CtState },
    /// Sent to backend `id` at `addr`. `slot` is the ring slot when the ring
    /// decided, `None` when conntrack did.
    Backend {
        vip: Vip,
        id: u32,
        addr: IpAddr,
        conntrack: CtState,
        slot: Option<u32>,
    },
    /// A failover alias (another region's VIP accepted here): it serves only
    /// IPIP packets to one of this edge's VIPs, so this plain packet is passed
    /// (`pass_alias_plain`). (A failed-over flow's conntrack entry is apart:
    /// keyed with `FLOW_F_DECAP`, which `lookup` does not follow.)
    AliasPlain { vip: Vip },
    /// Sent to backend `id` at `addr`, the pod the client's earlier new flow
    /// took, from the `affinity` map (a VIP with client affinity and a
    /// timeout, the entry younger than it and its pod still the VIP's).
    Affinity {
        vip: Vip,
        id: u32,
        addr: IpAddr,
        conntrack: CtState,
    },
    /// A VIP with source ranges (`loadBalancerSourceRanges`) none of which
    /// holds the source: `XDP_DROP` (`drop_source_range`), also for an
    /// established flow (`conntrack` is `Hit` then).
    SourceRefused { vip: Vip, conntrack: CtState },
    /// A VIP, but its ring slot names no live backend (id 0, a tombstone, no
    /// ring): `XDP_DROP` (`drop_no_backend`).
    NoBackend {
        vip: Vip,
        slot: Option<u32>,
        id: u32,
        conntrack: CtState,
    },
}

/// The pod address of a live backend slot, read the way the program does
/// (IPv6 if the family says so, else IPv4 in word 0).
/// The ring slot hash of a VIP with client affinity (`abi::VIP_F_CLIENT_AFFINITY`):
/// `ringlb_client_hash` in flow_hash.h, the flow hash of the client's address
/// with everything else zero.
pub fn client_hash(src: IpAddr) -> u32 {
    ringlb_maglev::flow_hash(src, IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, 0, 0)
}

fn backend_addr(b: &abi::BackendValue) -> IpAddr {
    let family = if b.family == abi::AF_INET6 {
        abi::AF_INET6
    } else {
        abi::AF_INET
    };
    b.addr
        .to_ip(family)
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// The program's VIP step: the exact (address, port, protocol), then the
/// port-0 wildcard; `key` is left at the one that matched.
fn vip_info(
    vips: &HashMap<&MapData, abi::VipKey, abi::VipInfo>,
    key: &mut abi::VipKey,
) -> Result<Option<abi::VipInfo>, Error> {
    match vips.get(key, 0) {
        Ok(i) => return Ok(Some(i)),
        Err(MapError::KeyNotFound) => {}
        Err(e) => return Err(map_err(abi::map::VIPS)(e)),
    }
    key.port = abi::Be16::from_host(0); // the wildcard
    match vips.get(key, 0) {
        Ok(i) => Ok(Some(i)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(map_err(abi::map::VIPS)(e)),
    }
}

impl XdpDatapath {
    /// The VIP that owns backend `id` now (`owners`: 1 + vip_id), as the
    /// loader programmed it.
    fn owner_vip(&self, id: u32) -> Result<Option<Vip>, Error> {
        let Some(owners) = self.maps().owners_map() else {
            return Ok(None);
        };
        // the value's ranges bit (`abi::OWNER_F_SRC_RANGES`) is not the VIP's
        let vid = match owners.get(&id, 0).map(|v| crate::src_ranges::owner_of(v).0) {
            Ok(None) | Err(MapError::OutOfBounds { .. }) => return Ok(None),
            Ok(Some(v)) => v,
            Err(e) => return Err(map_err(abi::map::OWNERS)(e)),
        };
        Ok(self
            .programmed()
            .vips
            .iter()
            .find(|(_, pv)| pv.vip_id == vid)
            .map(|(v, _)| *v))
    }

    /// The (backend id, generation) of `flow`'s client in the `affinity` map,
    /// when the VIP has client affinity with a timeout, the entry is younger
    /// than it and the id is still the VIP's (`owners`); the caller checks the
    /// backend's generation. `None` also when no `affinity` map is pinned (an
    /// older edge's).
    fn affinity_pick(
        &self,
        info: &abi::VipInfo,
        flow: &abi::Flow,
    ) -> Result<Option<(u32, u32)>, Error> {
        let timeout = u64::from(info.flags >> abi::VIP_AFFINITY_SHIFT);
        if info.flags & abi::VIP_F_CLIENT_AFFINITY == 0 || timeout == 0 {
            return Ok(None);
        }
        let Ok(table) = self
            .maps()
            .map::<HashMap<_, abi::AffinityKey, abi::AffinityValue>>(abi::map::AFFINITY)
        else {
            return Ok(None);
        };
        let key = abi::AffinityKey {
            saddr: flow.saddr,
            vip_id: info.vip_id,
            family: flow.family,
            pad: [0; 3],
        };
        let v = match table.get(&key, 0) {
            Ok(v) => v,
            Err(MapError::KeyNotFound) => return Ok(None),
            Err(e) => return Err(map_err(abi::map::AFFINITY)(e)),
        };
        let now = crate::bfd_hold::monotonic_now().as_nanos() as u64;
        if now.saturating_sub(v.last_ns) > timeout * 1_000_000_000 {
            return Ok(None);
        }
        let owned = match self.maps().owners_map().map(|o| o.get(&v.backend_id, 0)) {
            Some(Ok(o)) => crate::src_ranges::owner_of(o).0 == Some(info.vip_id),
            _ => false,
        };
        Ok(owned.then_some((v.backend_id, v.generation)))
    }

    /// Whether `vip` (the owner of a conntrack hit) takes `flow`'s source: it
    /// has no source ranges, or one holds the source.
    fn source_allowed(&self, vip: &Vip, flow: &abi::Flow) -> Result<bool, Error> {
        match self.programmed().vips.get(vip) {
            Some(p) if p.flags & abi::VIP_F_SRC_RANGES != 0 => self.src_allowed(p.vip_id, flow),
            _ => Ok(true),
        }
    }

    /// Whether a range of VIP `vip_id` holds `flow`'s source, read as the
    /// program reads it: the VIP's set, else the trie (src_ranges.h).
    fn src_allowed(&self, vip_id: u32, flow: &abi::Flow) -> Result<bool, Error> {
        let set_of: Array<_, u32> = self.maps().map(abi::map::SRC_SET_OF)?;
        let set = set_of
            .get(&vip_id, 0)
            .map_err(map_err(abi::map::SRC_SET_OF))?;
        let s = flow.saddr.0;
        if set != 0 {
            let sets: Array<_, abi::SrcSet> = self.maps().map(abi::map::SRC_SETS)?;
            let v = sets.get(&set, 0).map_err(map_err(abi::map::SRC_SETS))?;
            let n = (v.n as usize).min(abi::SRC_SET_NETS);
            return Ok(v.net[..n]
                .iter()
                .any(|net| (0..4).all(|w| s[w] & net.mask.0[w] == net.addr.0[w])));
        }
        let trie: LpmTrie<_, abi::SrcRange, u32> = self.maps().map(abi::map::SRC_RANGES)?;
        let key = Key::new(
            32 + 128,
            abi::SrcRange {
                vip_id,
                addr: flow.saddr,
            },
        );
        match trie.get(&key, 0) {
            Ok(_) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(abi::map::SRC_RANGES)(e)),
        }
    }

    /// Whether `flow`'s destination is one of this edge's own VIP addresses
    /// (`vip_addrs`, exact), as vip_filter.h asks it.
    fn own_vip_addr(&self, flow: &abi::Flow) -> Result<bool, Error> {
        let addrs: HashMap<_, abi::VipKey, u32> = self.maps().map(abi::map::VIP_ADDRS)?;
        let key = abi::VipKey {
            addr: flow.daddr,
            family: flow.family,
            ..Default::default()
        };
        match addrs.get(&key, 0) {
            Ok(_) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(abi::map::VIP_ADDRS)(e)),
        }
    }

    /// What the program would do with `flow` now.
    pub fn lookup(&self, flow: &abi::Flow) -> Result<Lookup, Error> {
        let backends: Array<_, abi::BackendValue> = self.maps().map(abi::map::BACKENDS)?;
        // an id outside the array: the program's lookup returns NULL
        let backend = |id: u32| -> Result<Option<abi::BackendValue>, Error> {
            match backends.get(&id, 0) {
                Ok(b) => Ok(Some(b)),
                Err(MapError::OutOfBounds { .. }) => Ok(None),
                Err(e) => Err(map_err(abi::map::BACKENDS)(e)),
            }
        };
        let vips: HashMap<_, abi::VipKey, abi::VipInfo> = self.maps().map(abi::map::VIPS)?;
        let mut key = abi::VipKey {
            addr: flow.daddr,
            port: flow.dport,
            proto: flow.proto,
            family: flow.family,
        };
        // 0. the VIP address filter: a clear bit passes before conntrack
        let filter: Array<_, u64> = self.maps().map(abi::map::VIP_FILTER)?;
        let daddr = flow
            .daddr
            .to_ip(flow.family)
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let bit = crate::vip_filter::bit(daddr);
        let word = filter
            .get(&(bit >> 6), 0)
            .map_err(map_err(abi::map::VIP_FILTER))?;
        if word >> (bit & 63) & 1 == 0 {
            return Ok(Lookup::NotVip {
                conntrack: CtState::Miss,
            });
        }
        // 1. conntrack first, as the program does (for any packet but a SYN):
        // an entry whose backend slot is live with the same generation decides
        let ct: HashMap<_, abi::Flow, abi::CtValue> = self.maps().map(abi::map::CONNTRACK)?;
        let entry = match ct.get(flow, 0) {
            Ok(c) => Some(c),
            Err(MapError::KeyNotFound) => None,
            Err(e) => return Err(map_err(abi::map::CONNTRACK)(e)),
        };
        if let Some(c) = entry
            && let Some(b) = backend(c.backend_id)?
            && b.family != 0
            && b.generation == c.generation
        {
            // The program does not look at vips on a hit: the VIP is the one
            // that owns the id (`owners`), which it counts the packet for. That
            // need not be the exact VIP the packet is addressed to (a wildcard
            // VIP's flow stays with it after an exact VIP:port appears).
            if let Some(vip) = self.owner_vip(c.backend_id)? {
                if !self.source_allowed(&vip, flow)? {
                    let conntrack = CtState::Hit;
                    return Ok(Lookup::SourceRefused { vip, conntrack });
                }
                return Ok(Lookup::Backend {
                    vip,
                    id: c.backend_id,
                    addr: backend_addr(&b),
                    conntrack: CtState::Hit,
                    slot: None,
                });
            }
        }

        // 2. no live entry: the VIP (then the wildcard)
        let stale = entry.map(|c| CtState::Stale {
            id: c.backend_id,
            generation: c.generation,
        });
        let conntrack = stale.unwrap_or(CtState::Miss);
        let not_vip = Lookup::NotVip { conntrack };
        let Some(info) = vip_info(&vips, &mut key)? else {
            return Ok(if self.own_vip_addr(flow)? {
                Lookup::NoService { conntrack }
            } else {
                not_vip
            });
        };
        let Some(vip) = Vip::from_abi(&key) else {
            return Ok(not_vip);
        };
        if info.flags & abi::VIP_F_FAILOVER_ALIAS != 0 {
            return Ok(Lookup::AliasPlain { vip });
        }
        let conntrack = match stale {
            Some(s) => s,
            None if info.flags & abi::VIP_F_NO_CT != 0 => CtState::Off,
            None => CtState::Miss,
        };
        if info.flags & abi::VIP_F_SRC_RANGES != 0 && !self.src_allowed(info.vip_id, flow)? {
            return Ok(Lookup::SourceRefused { vip, conntrack });
        }

        self.pick_backend(&info, vip, flow, conntrack, &backend)
    }

    /// Steps 3 and 4 of [`Self::lookup`] for a flow of `vip` without a live
    /// conntrack entry: the client's pod from the affinity table, else the ring.
    fn pick_backend(
        &self,
        info: &abi::VipInfo,
        vip: Vip,
        flow: &abi::Flow,
        conntrack: CtState,
        backend: &dyn Fn(u32) -> Result<Option<abi::BackendValue>, Error>,
    ) -> Result<Lookup, Error> {
        // 3. client affinity with a timeout: the client's pod, while it lives
        if let Some((id, b)) = self.affinity_pick(info, flow)?
            && let Some(live) = backend(id)?
            && live.family != 0
            && live.generation == b
        {
            return Ok(Lookup::Affinity {
                vip,
                id,
                addr: backend_addr(&live),
                conntrack,
            });
        }

        // 4. the Maglev ring
        let no_backend = |slot, id| Lookup::NoBackend {
            vip,
            slot,
            id,
            conntrack,
        };
        let rings: ArrayOfMaps<&MapData, Array<MapData, u32>> = self.maps().map(abi::map::RINGS)?;
        let ring = match rings.get(&info.vip_id, 0) {
            Ok(r) => r,
            Err(MapError::KeyNotFound) => return Ok(no_backend(None, 0)),
            Err(e) => return Err(map_err(abi::map::RINGS)(e)),
        };
        if info.ring_size == 0 {
            return Ok(no_backend(None, 0));
        }
        let addr = |a: abi::RawAddr| {
            a.to_ip(flow.family)
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
        };
        let h = if info.flags & abi::VIP_F_CLIENT_AFFINITY != 0 {
            client_hash(addr(flow.saddr))
        } else {
            ringlb_maglev::flow_hash(
                addr(flow.saddr),
                addr(flow.daddr),
                flow.sport.to_host(),
                flow.dport.to_host(),
                flow.proto,
            )
        };
        let slot = h % info.ring_size;
        let id = match ring.get(&slot, 0) {
            Ok(id) => id,
            // a slot beyond the inner array: the program's lookup returns NULL
            Err(MapError::OutOfBounds { .. }) => return Ok(no_backend(Some(slot), 0)),
            Err(e) => return Err(map_err("ring")(e)),
        };
        if id == 0 {
            return Ok(no_backend(Some(slot), 0));
        }
        match backend(id)? {
            Some(b) if b.family != 0 => Ok(Lookup::Backend {
                vip,
                id,
                addr: backend_addr(&b),
                conntrack,
                slot: Some(slot),
            }),
            _ => Ok(no_backend(Some(slot), id)), // empty slot or tombstone
        }
    }
}
