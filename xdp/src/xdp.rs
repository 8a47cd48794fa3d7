//! The XDP datapath: loads `bpf/xdp_lb.bpf.c`, pins its maps, attaches it and
//! applies desired states as diffs (see `state::plan`).
//!
//! Pinning: with a pin directory (default `/sys/fs/bpf/ringlb`) every map is
//! pinned as `<dir>/<map>` and the XDP link as `<dir>/link_<iface>`. A new
//! process reuses the pinned maps (conntrack survives), and replaces the
//! program inside the pinned link atomically (`bpf_link_update`), so traffic
//! never sees a moment without a program.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader, include_bytes_aligned,
    maps::{Array, ArrayOfMaps, HashMap, IterableMap, MapData, PerCpuArray, PerCpuValues},
    programs::{
        ProgramError, TestRun, TestRunOptions, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};

use ringlb_nexthop::{NextHop, Resolver};

use super::{
    ApplyStats, Counters, Datapath, DesiredState, Error, MapOp, Programmed, ServiceEntry, Vip, abi,
    batch::{
        BPF_F_MMAPABLE, BPF_LINK_TYPE_XDP, if_index, pinned_link_ifindex, update_batch,
        write_mmapped_u32,
    },
    map_err,
    readback::{OWNERS, take_owners, warn_without_owners},
    state::{View, plan, plan_update},
};

/// The compiled BPF objects (built by build.rs). Benchmark builds of the same
/// source are in `ringlb-bench`, test-only programs in `ringlb-testkit`.
pub mod objects {
    use super::include_bytes_aligned;
    /// The production program.
    pub static XDP_LB: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb.o"));
}

pub const PROGRAM: &str = "ringlb_xdp";
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ringlb";
const BPF_F_INNER_MAP: u32 = 1 << 12;

/// How to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic with a warning.
    Auto,
    Native,
    Generic,
}

/// Loader options.
#[derive(Clone, Debug)]
pub struct XdpOptions {
    /// Pin maps (and the link) here; `None` = nothing pinned (tests, benchmarks).
    pub pin_dir: Option<PathBuf>,
    /// Outer source address for IPv4 / IPv6 outer headers.
    pub src4: Option<Ipv4Addr>,
    pub src6: Option<Ipv6Addr>,
    /// Largest L3 packet after encapsulation (the egress MTU).
    pub mtu: u32,
    /// Use bpf_fib_lookup when a backend's next hop is unresolved.
    pub fib_fallback: bool,
    /// The object to load (`objects::XDP_LB` except in benchmarks).
    pub object: &'static [u8],
}

impl Default for XdpOptions {
    fn default() -> Self {
        Self {
            pin_dir: Some(PathBuf::from(DEFAULT_PIN_DIR)),
            src4: None,
            src6: None,
            mtu: 1500,
            fib_fallback: true,
            object: objects::XDP_LB,
        }
    }
}

/// The loaded (and maybe attached) XDP datapath.
pub struct XdpDatapath {
    ebpf: Ebpf,
    /// What the maps hold, or unknown after a failed write whose re-read
    /// failed too (then nothing is planned until a re-read succeeds).
    programmed: View,
    resolver: Box<dyn Resolver>,
    pin_dir: Option<PathBuf>,
    link_pin: Option<PathBuf>,
    link: Option<FdLink>,
    /// The `owners` map, taken out of the object (the program reads it on a
    /// conntrack hit): backend id -> 1 + vip_id of the service that owns the id,
    /// 0 = none. Pinned next to the program's maps, so a restarted loader
    /// knows which service each id belongs to, also ids no ring names (a
    /// draining pod that only keeps its established flows).
    pub(super) owners: Option<Array<MapData, u32>>,
}

fn prog_err(source: ProgramError) -> Error {
    Error::Program {
        name: PROGRAM,
        source: Box::new(source),
    }
}

impl XdpDatapath {
    /// Loads the program and its maps (reusing pinned maps if present) and
    /// writes the config. Does not attach.
    pub fn load(opts: &XdpOptions, resolver: Box<dyn Resolver>) -> Result<Self, Error> {
        let mut loader = EbpfLoader::new();
        if let Some(dir) = &opts.pin_dir {
            std::fs::create_dir_all(dir).map_err(|source| Error::Pin {
                path: dir.clone(),
                source,
            })?;
            warn_without_owners(dir);
            for name in abi::map::ALL {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader
            .load(opts.object)
            .map_err(|e| Error::Load(Box::new(e)))?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or(Error::MissingMap { name: PROGRAM })?
            .try_into()
            .map_err(prog_err)?;
        prog.load().map_err(prog_err)?;
        let owners = Some(take_owners(&mut ebpf)?);
        let mut me = Self {
            ebpf,
            programmed: View::default(),
            resolver,
            pin_dir: opts.pin_dir.clone(),
            link_pin: None,
            link: None,
            owners,
        };
        // pinned maps from an older build with another layout: refuse clearly
        me.check_abi()?;
        me.write_config(opts)?;
        me.programmed.set(me.read_programmed()?);
        Ok(me)
    }

    /// Opens the maps a running edge pinned in `dir`, without loading or
    /// attaching anything (for the operator CLI). Fails if nothing is pinned.
    pub fn open_pinned(dir: &Path) -> Result<Self, Error> {
        for name in abi::map::ALL {
            let p = dir.join(name);
            if !p.exists() {
                return Err(Error::Pin {
                    path: p,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "map not pinned: is the edge running with this --pin-dir?",
                    ),
                });
            }
        }
        let mut loader = EbpfLoader::new();
        for name in abi::map::ALL {
            loader.map_pin_path(name, dir.join(name));
        }
        let mut ebpf = loader
            .load(objects::XDP_LB)
            .map_err(|e| Error::Load(Box::new(e)))?;
        let owners = Some(take_owners(&mut ebpf)?);
        let mut me = Self {
            ebpf,
            programmed: View::default(),
            resolver: Box::new(ringlb_nexthop::StaticResolver::default()),
            pin_dir: Some(dir.to_path_buf()),
            link_pin: None,
            link: None,
            owners,
        };
        me.programmed.set(me.read_programmed()?);
        Ok(me)
    }

    fn write_config(&mut self, opts: &XdpOptions) -> Result<(), Error> {
        let mut cfg = abi::ConfigValue {
            mtu: opts.mtu,
            flags: if opts.fib_fallback {
                abi::CFG_F_FIB_FALLBACK
            } else {
                0
            },
            ..Default::default()
        };
        if let Some(a) = opts.src4 {
            cfg.src4 = abi::RawAddr::from_ip(a.into()).0.0[0];
        }
        if let Some(a) = opts.src6 {
            cfg.src6 = abi::RawAddr::from_ip(a.into()).0;
        }
        let mut m: Array<_, abi::ConfigValue> = self.map_mut(abi::map::CONFIG)?;
        m.set(0, cfg, 0).map_err(map_err(abi::map::CONFIG))
    }

    fn map_mut<'a, T>(&'a mut self, name: &'static str) -> Result<T, Error>
    where
        T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = self.ebpf.map_mut(name).ok_or(Error::MissingMap { name })?;
        T::try_from(m).map_err(map_err(name))
    }

    pub(super) fn map<'a, T>(&'a self, name: &'static str) -> Result<T, Error>
    where
        T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = self.ebpf.map(name).ok_or(Error::MissingMap { name })?;
        T::try_from(m).map_err(map_err(name))
    }

    /// What the loader believes the maps hold (possibly out of date while
    /// [`Self::view_known`] is false).
    pub fn programmed(&self) -> &Programmed {
        &self.programmed
    }

    /// False after a failed write whose re-read failed too: the next apply
    /// re-reads the maps first and refuses to plan until that succeeds.
    pub fn view_known(&self) -> bool {
        self.programmed.is_known()
    }

    /// Re-reads the maps if the view is unknown; errors while it stays so.
    fn ensure_view(&mut self) -> Result<(), Error> {
        if !self.programmed.is_known() {
            let read = self.read_programmed();
            self.programmed.reread(read)?;
            tracing::info!("re-read the maps after an earlier failure; planning resumes");
        }
        Ok(())
    }

    /// The loaded program (for BPF_PROG_TEST_RUN).
    pub fn program(&self) -> Result<&Xdp, Error> {
        self.ebpf
            .program(PROGRAM)
            .ok_or(Error::MissingMap { name: PROGRAM })?
            .try_into()
            .map_err(prog_err)
    }

    /// Runs the program on `data` with BPF_PROG_TEST_RUN.
    pub fn test_run(
        &self,
        data: &[u8],
        out: &mut [u8],
        repeat: u32,
    ) -> Result<(u32, usize, std::time::Duration), Error> {
        test_run(self.program()?, data, out, repeat)
    }

    /// Attaches to `iface`. With a pin directory and an existing pinned link
    /// for `iface`, the program inside that link is replaced atomically. A
    /// pinned link that no longer drives `iface` (the interface was deleted
    /// and re-created: the link is defunct) is unpinned with a warning and a
    /// fresh link is attached.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<&'static str, Error> {
        let link_pin = self
            .pin_dir
            .as_ref()
            .map(|d| d.join(format!("link_{iface}")));
        if let Some(pin) = link_pin.as_ref().filter(|p| p.exists()) {
            let want = if_index(iface);
            if want == 0 {
                return Err(Error::Interface {
                    iface: iface.into(),
                    reason: "no such interface".into(),
                });
            }
            let (link_type, have) = pinned_link_ifindex(pin).map_err(|e| Error::Interface {
                iface: iface.into(),
                reason: format!("reading pinned link {}: {e}", pin.display()),
            })?;
            if link_type != BPF_LINK_TYPE_XDP || have != want {
                tracing::warn!(
                    iface,
                    ifindex = want,
                    link_ifindex = have,
                    link_type,
                    pin = %pin.display(),
                    "the pinned XDP link does not drive this interface (defunct: the interface was deleted and re-created); unpinning it and attaching afresh"
                );
                std::fs::remove_file(pin).map_err(|source| Error::Pin {
                    path: pin.clone(),
                    source,
                })?;
            }
        }
        if let Some(pin) = link_pin.as_ref().filter(|p| p.exists()) {
            let pinned = PinnedLink::from_pin(pin).map_err(|e| Error::Interface {
                iface: iface.into(),
                reason: format!("opening pinned link {}: {e}", pin.display()),
            })?;
            let fd_link: FdLink = pinned.into();
            let xdp_link = XdpLink::try_from(fd_link).map_err(|e| Error::Interface {
                iface: iface.into(),
                reason: format!("pinned link is not an XDP link: {e}"),
            })?;
            let prog = self.xdp_mut()?;
            let id = prog.attach_to_link(xdp_link).map_err(prog_err)?;
            let link = prog.take_link(id).map_err(prog_err)?;
            self.link = Some(FdLink::try_from(link).map_err(|e| Error::Interface {
                iface: iface.into(),
                reason: format!("link: {e}"),
            })?);
            self.link_pin = link_pin;
            tracing::info!(iface, "replaced the program in the pinned XDP link");
            return Ok("replaced");
        }
        let prog = self.xdp_mut()?;
        let (id, used) = match mode {
            AttachMode::Native => (
                prog.attach(iface, XdpMode::Driver).map_err(prog_err)?,
                "native",
            ),
            AttachMode::Generic => (
                prog.attach(iface, XdpMode::Skb).map_err(prog_err)?,
                "generic",
            ),
            AttachMode::Auto => match prog.attach(iface, XdpMode::Driver) {
                Ok(id) => (id, "native"),
                Err(e) => {
                    tracing::warn!(iface, error = %e, "native XDP attach failed; falling back to generic (skb) mode, which is much slower");
                    (
                        prog.attach(iface, XdpMode::Skb).map_err(prog_err)?,
                        "generic",
                    )
                }
            },
        };
        let link = prog.take_link(id).map_err(prog_err)?;
        let fd_link = FdLink::try_from(link).map_err(|e| Error::Interface {
            iface: iface.into(),
            reason: format!("kernel gave no bpf_link for XDP: {e}"),
        })?;
        if let Some(pin) = &link_pin {
            let pinned = fd_link.pin(pin).map_err(|e| Error::Pin {
                path: pin.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
            self.link = Some(pinned.into());
        } else {
            self.link = Some(fd_link);
        }
        self.link_pin = link_pin;
        tracing::info!(iface, mode = used, "attached XDP program");
        Ok(used)
    }

    fn xdp_mut(&mut self) -> Result<&mut Xdp, Error> {
        self.ebpf
            .program_mut(PROGRAM)
            .ok_or(Error::MissingMap { name: PROGRAM })?
            .try_into()
            .map_err(prog_err)
    }

    /// Detaches (removes the pinned link). Maps stay pinned.
    pub fn detach(&mut self) -> Result<(), Error> {
        if let Some(pin) = self.link_pin.take() {
            match std::fs::remove_file(&pin) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(Error::Pin { path: pin, source }),
            }
        }
        self.link = None; // closing the last fd of an unpinned link detaches it
        Ok(())
    }

    /// Re-resolves every backend's next hop and rewrites entries that changed.
    /// Each distinct pod address is resolved once, however many services (ids)
    /// it backs.
    pub fn refresh_next_hops(&mut self) -> Result<usize, Error> {
        // After a failed write and a failed re-read the view may name ids
        // that are deleted in the maps: rewriting them would revive them.
        self.ensure_view()?;
        let mut by_addr: std::collections::BTreeMap<IpAddr, Vec<(u32, u32)>> = Default::default();
        for (_, addr, b) in self.programmed.backends() {
            by_addr.entry(*addr).or_default().push((b.id, b.generation));
        }
        let (mut ids, mut vals) = (Vec::new(), Vec::new());
        // (old, new) next hop -> pods that moved: one log line per change of an
        // (interface, next hop), not one per pod (a ToR MAC change moves them all)
        let mut moved: std::collections::BTreeMap<(Option<NextHop>, Option<NextHop>), usize> =
            Default::default();
        let mut lost: Option<(IpAddr, ringlb_nexthop::Error)> = None;
        let mut lost_count = 0usize;
        {
            let backends: Array<_, abi::BackendValue> = self.map(abi::map::BACKENDS)?;
            for (addr, pairs) in by_addr {
                let nh = self.resolver.resolve(addr);
                let new_nh = nh.as_ref().ok().copied();
                let mut old_nh = None;
                for (id, generation) in pairs {
                    let old = backends.get(&id, 0).map_err(map_err(abi::map::BACKENDS))?;
                    let new = backend_value(addr, generation, new_nh);
                    if new != old {
                        old_nh.get_or_insert(next_hop_of(&old));
                        ids.push(id);
                        vals.push(new);
                    }
                }
                let Some(old_nh) = old_nh else {
                    if let Err(e) = nh {
                        tracing::debug!(backend = %addr, error = %e, "next hop still unresolved");
                    }
                    continue;
                };
                tracing::debug!(backend = %addr, old = %show(old_nh), new = %show(new_nh), "next hop changed");
                *moved.entry((old_nh, new_nh)).or_default() += 1;
                // Refreshes run on every netlink change: an unresolved pod is
                // reported when it loses its next hop, not on every refresh.
                if let (Some(_), Err(e)) = (old_nh, nh) {
                    lost_count += 1;
                    lost.get_or_insert((addr, e));
                }
            }
        }
        // one BPF_MAP_UPDATE_BATCH for every changed id (a gateway change can move
        // every (VIP, pod) id at once)
        if !ids.is_empty() {
            let m: Array<&MapData, abi::BackendValue> = self.map(abi::map::BACKENDS)?;
            update_batch(m.map().fd().as_fd(), &ids, &vals)?;
        }
        // logged once the map holds it
        for ((old, new), pods) in &moved {
            if old.is_some() && new.is_some() {
                tracing::info!(old = %show(*old), new = %show(*new), pods, "next hop changed");
            } else if old.is_none() {
                tracing::info!(new = %show(*new), pods, "next hop resolved");
            }
        }
        if let Some((addr, e)) = lost {
            tracing::warn!(pods = lost_count, example = %addr, error = %e, "next hop lost; the program will use bpf_fib_lookup for these pods");
        }
        Ok(ids.len())
    }

    /// Writes `ops`. `tombstone_gen` is the generation high-water mark: every
    /// batch of new backends also writes it into `backends[0]` (id 0 is "no
    /// backend": family 0, never followed by the program), and a deleted
    /// backend slot keeps it too (family 0, so the program treats the slot as
    /// empty). A restarted loader reads it back and never hands out a
    /// generation a conntrack entry may still carry.
    fn run_ops(&mut self, ops: Vec<MapOp>, tombstone_gen: u32) -> Result<ApplyStats, Error> {
        let mut st = ApplyStats::default();
        let mut i = 0;
        while i < ops.len() {
            match &ops[i] {
                MapOp::PutBackend { .. } => {
                    // one batch for every consecutive PutBackend
                    // (a pod in several services is resolved once)
                    let mut ids = vec![0];
                    let mut vals = vec![abi::BackendValue {
                        generation: tombstone_gen,
                        ..Default::default()
                    }];
                    let mut nhs = std::collections::BTreeMap::new();
                    while let Some(MapOp::PutBackend {
                        id,
                        addr,
                        generation,
                    }) = ops.get(i)
                    {
                        let nh = *nhs
                            .entry(*addr)
                            .or_insert_with(|| resolve(self.resolver.as_ref(), *addr));
                        ids.push(*id);
                        vals.push(backend_value(*addr, *generation, nh));
                        i += 1;
                    }
                    let m: Array<&MapData, abi::BackendValue> = self.map(abi::map::BACKENDS)?;
                    update_batch(m.map().fd().as_fd(), &ids, &vals)?;
                    st.backends_written += ids.len() - 1;
                    continue;
                }
                MapOp::CreateRing { vip_id, size } => {
                    let ring =
                        Array::<MapData, u32>::create(*size, BPF_F_INNER_MAP | BPF_F_MMAPABLE)
                            .map_err(map_err("ring"))?;
                    let mut rings: ArrayOfMaps<&mut MapData, Array<MapData, u32>> =
                        self.map_mut(abi::map::RINGS)?;
                    rings
                        .set(*vip_id, &ring, 0)
                        .map_err(map_err(abi::map::RINGS))?;
                    let ncpu = aya::util::nr_cpus().map_err(|(_, e)| Error::Syscall {
                        call: "nr_cpus",
                        source: e,
                    })?;
                    let mut vs: PerCpuArray<_, abi::VipStats> =
                        self.map_mut(abi::map::VIP_STATS)?;
                    let zeros = PerCpuValues::try_from(vec![abi::VipStats::default(); ncpu])
                        .map_err(|e| Error::Syscall {
                            call: "PerCpuValues",
                            source: e,
                        })?;
                    vs.set(*vip_id, zeros, 0)
                        .map_err(map_err(abi::map::VIP_STATS))?;
                    st.rings_created += 1;
                }
                MapOp::WriteSlots { vip_id, slots } => {
                    let rings: ArrayOfMaps<&MapData, Array<MapData, u32>> =
                        self.map(abi::map::RINGS)?;
                    let ring = rings.get(vip_id, 0).map_err(map_err(abi::map::RINGS))?;
                    // straight into the mmapped ring; a ring without
                    // BPF_F_MMAPABLE (made by an older loader) gets one batch
                    let fd = ring.map().fd().as_fd();
                    if write_mmapped_u32(fd, ring.len(), slots).is_err() {
                        let (keys, vals): (Vec<u32>, Vec<u32>) = slots.iter().copied().unzip();
                        update_batch(fd, &keys, &vals)?;
                    }
                    st.slots_written += slots.len();
                }
                MapOp::PutVip { vip, info } => {
                    let mut m: HashMap<_, abi::VipKey, abi::VipInfo> =
                        self.map_mut(abi::map::VIPS)?;
                    m.insert(vip.to_abi(), info, 0)
                        .map_err(map_err(abi::map::VIPS))?;
                    st.vips_written += 1;
                }
                MapOp::DelVip { vip } => {
                    let mut m: HashMap<_, abi::VipKey, abi::VipInfo> =
                        self.map_mut(abi::map::VIPS)?;
                    match m.remove(&vip.to_abi()) {
                        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                        Err(e) => return Err(map_err(abi::map::VIPS)(e)),
                    }
                    st.vips_deleted += 1;
                }
                MapOp::DelRing { vip_id } => {
                    // ARRAY_OF_MAPS has no delete in aya 0.14; an empty 1-slot
                    // ring releases the old inner map's memory.
                    let ring = Array::<MapData, u32>::create(1, BPF_F_INNER_MAP | BPF_F_MMAPABLE)
                        .map_err(map_err("ring"))?;
                    let mut rings: ArrayOfMaps<&mut MapData, Array<MapData, u32>> =
                        self.map_mut(abi::map::RINGS)?;
                    rings
                        .set(*vip_id, &ring, 0)
                        .map_err(map_err(abi::map::RINGS))?;
                    st.rings_deleted += 1;
                }
                MapOp::Own { vip_id, ids } => {
                    if let Some(o) = &self.owners {
                        let vals = vec![vip_id + 1; ids.len()];
                        update_batch(o.map().fd().as_fd(), ids, &vals)?;
                    }
                }
                MapOp::DelBackend { id } => {
                    let mut m: Array<_, abi::BackendValue> = self.map_mut(abi::map::BACKENDS)?;
                    let tombstone = abi::BackendValue {
                        generation: tombstone_gen,
                        ..Default::default()
                    };
                    m.set(*id, tombstone, 0)
                        .map_err(map_err(abi::map::BACKENDS))?;
                    // after the tombstone: a live id never loses its owner
                    if let Some(o) = &mut self.owners {
                        o.set(*id, 0, 0).map_err(map_err(OWNERS))?;
                    }
                    st.backends_deleted += 1;
                }
            }
            i += 1;
        }
        Ok(st)
    }

    /// Global and per-VIP counters, summed over CPUs.
    pub fn read_counters(&self) -> Result<Counters, Error> {
        let stats: PerCpuArray<_, u64> = self.map(abi::map::STATS)?;
        let mut c = Counters::default();
        for s in abi::Stat::ALL {
            let v = stats
                .get(&(s as u32), 0)
                .map_err(map_err(abi::map::STATS))?;
            c.global.push((s.label(), v.iter().sum()));
        }
        let vs: PerCpuArray<_, abi::VipStats> = self.map(abi::map::VIP_STATS)?;
        for (vip, p) in &self.programmed.vips {
            let v = vs.get(&p.vip_id, 0).map_err(map_err(abi::map::VIP_STATS))?;
            c.per_vip.push((
                *vip,
                v.iter().map(|x| x.packets).sum(),
                v.iter().map(|x| x.bytes).sum(),
            ));
        }
        Ok(c)
    }

    /// Changes one service (`None` removes it) without looking at any other:
    /// the fast path for a single Service/EndpointSlice event.
    pub fn apply_service(
        &mut self,
        vip: &Vip,
        entry: Option<&ServiceEntry>,
    ) -> Result<ApplyStats, Error> {
        self.ensure_view()?;
        let p = self.programmed.plannable()?;
        let ops = plan_update(p, vip, entry)?;
        let tombstone_gen = p.last_generation;
        self.run_ops_or_resync(ops, tombstone_gen)
    }

    /// Runs `ops`; if a write fails the maps are somewhere between two
    /// states: re-read them so the next apply converges from the truth, and
    /// if that fails too, mark the view unknown (the next apply re-reads
    /// first and refuses to plan until it can).
    fn run_ops_or_resync(
        &mut self,
        ops: Vec<MapOp>,
        tombstone_gen: u32,
    ) -> Result<ApplyStats, Error> {
        self.run_ops(ops, tombstone_gen).inspect_err(|e| {
            let read = self.read_programmed();
            self.programmed.write_failed(e, read);
        })
    }

    fn apply_inner(&mut self, desired: &DesiredState) -> Result<ApplyStats, Error> {
        self.ensure_view()?;
        let (ops, next) = plan(self.programmed.plannable()?, desired)?;
        let st = self.run_ops_or_resync(ops, next.last_generation)?;
        self.programmed.set(next);
        Ok(st)
    }

    /// Removes the pin directory's files: links (detaching them) and maps.
    fn remove_pins(dir: &Path) -> Result<(), Error> {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("link_") {
                    std::fs::remove_file(e.path()).map_err(|source| Error::Pin {
                        path: e.path(),
                        source,
                    })?;
                }
            }
        }
        for name in abi::map::ALL {
            let p = dir.join(name);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(Error::Pin { path: p, source }),
            }
        }
        let _ = std::fs::remove_dir(dir); // only if empty: other links may remain
        Ok(())
    }
}

/// The next hop of `addr`, `None` (logged) when unresolved.
fn resolve(resolver: &dyn Resolver, addr: IpAddr) -> Option<NextHop> {
    resolver
        .resolve(addr)
        .inspect_err(|e| {
            tracing::warn!(backend = %addr, error = %e, "next hop unresolved; the program will use bpf_fib_lookup")
        })
        .ok()
}

/// The next hop a backends entry holds; `None` if unresolved.
fn next_hop_of(v: &abi::BackendValue) -> Option<NextHop> {
    if v.nh_valid & abi::NH_VALID == 0 {
        return None;
    }
    let tci = v.vlan_tci.to_host();
    let vlan = (tci != 0).then_some(ringlb_nexthop::Vlan {
        id: tci & 0x0fff,
        protocol: if v.nh_valid & abi::NH_VLAN_8021AD != 0 {
            ringlb_nexthop::VlanProtocol::Dot1Ad
        } else {
            ringlb_nexthop::VlanProtocol::Dot1Q
        },
    });
    Some(NextHop {
        ifindex: v.ifindex,
        smac: v.smac,
        dmac: v.dmac,
        vlan,
    })
}

fn show(nh: Option<NextHop>) -> String {
    nh.map_or_else(|| "unresolved".to_string(), |n| n.to_string())
}

fn backend_value(addr: IpAddr, generation: u32, nh: Option<NextHop>) -> abi::BackendValue {
    let (raw, family) = abi::RawAddr::from_ip(addr);
    let mut v = abi::BackendValue {
        addr: raw,
        generation,
        family,
        ..Default::default()
    };
    if let Some(nh) = nh {
        v.ifindex = nh.ifindex;
        v.dmac = nh.dmac;
        v.smac = nh.smac;
        v.nh_valid = abi::NH_VALID;
        if let Some(vlan) = nh.vlan {
            // PCP 0, DEI 0: the VLAN id only
            v.vlan_tci = abi::Be16::from_host(vlan.id & 0x0fff);
            if vlan.protocol == ringlb_nexthop::VlanProtocol::Dot1Ad {
                v.nh_valid |= abi::NH_VLAN_8021AD;
            }
        }
    }
    v
}

/// BPF_PROG_TEST_RUN on any XDP program: (verdict, output length, duration
/// per repetition as the kernel reports it).
pub fn test_run(
    prog: &Xdp,
    data: &[u8],
    out: &mut [u8],
    repeat: u32,
) -> Result<(u32, usize, std::time::Duration), Error> {
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(data);
    opts.data_out = Some(out);
    opts.repeat = repeat;
    let r = prog.test_run(opts).map_err(prog_err)?;
    Ok((r.return_value, r.data_size_out as usize, r.duration))
}

impl Datapath for XdpDatapath {
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyStats, Error> {
        self.apply_inner(desired)
    }
    fn counters(&self) -> Result<Counters, Error> {
        self.read_counters()
    }
    fn uninstall(mut self) -> Result<(), Error> {
        self.detach()?;
        let dir = self.pin_dir.take();
        drop(self);
        if let Some(dir) = dir {
            Self::remove_pins(&dir)?;
        }
        Ok(())
    }
}
