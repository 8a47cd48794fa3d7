//! The XDP datapath: loads `bpf/xdp_lb.bpf.c`, pins its maps, attaches it and
//! applies desired states as diffs (see `state::plan`).
//!
//! Pinning: with a pin directory (default `/sys/fs/bpf/ringlb`) every map is
//! pinned as `<dir>/<map>` and the XDP link as `<dir>/link_<iface>`. A new
//! process reuses the pinned maps (conntrack survives), and replaces the
//! program inside the pinned link atomically (`bpf_link_update`), so traffic
//! never sees a moment without a program.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use aya::{
    EbpfLoader, include_bytes_aligned,
    maps::Array,
    programs::{
        ProgramError, TestRun, TestRunOptions, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};

use ringlb_datapath::Error as SeamError;
use ringlb_nexthop::Resolver;

use super::{
    ApplyStats, BpfError, Counters, Datapath, DesiredState, Error, Programmed, ServiceEntry, Vip,
    abi,
    abi_check::{check_abi, take_owners, warn_without_owners},
    apply::Applier,
    attach_mode::{Reuse, reuse, xdp_progs},
    batch::{BPF_LINK_TYPE_XDP, if_index, pinned_link_info},
    flow_filter::{self, FilterBits, RebuildStats},
    map_err,
    maps::kernel::KernelMaps,
};

/// The compiled BPF objects (built by build.rs). Benchmark builds of the same
/// source are in `ringlb-bench`, test-only programs in `ringlb-testkit`.
pub mod objects {
    use super::include_bytes_aligned;
    /// The production program.
    pub static XDP_LB: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb.o"));
    /// The production program without the flow filter (`-DRINGLB_NO_FLOW_FILTER`):
    /// what a kernel without BPF atomic OR (Linux 5.12) gets instead (every
    /// new flow's SYN looks conntrack up).
    pub static XDP_LB_NO_FLOW_FILTER: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_lb_no_flow_filter.o"));
    /// One XDP program with an atomic OR on a map value: does the verifier
    /// take `BPF_ATOMIC | BPF_OR` (Linux 5.12)?
    pub static PROBE_ATOMIC_OR: &[u8] =
        include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe_atomic_or.o"));
}

/// Whether this kernel's verifier takes an atomic OR (Linux 5.12+), which the
/// flow filter's bit sets are (`bpf/flow_filter.h`): the error it gave if not.
pub fn probe_atomic_or() -> Result<(), String> {
    let mut ebpf = aya::Ebpf::load(objects::PROBE_ATOMIC_OR).map_err(|e| e.to_string())?;
    let prog: &mut Xdp = ebpf
        .program_mut("ringlb_probe_atomic_or")
        .ok_or("no program in the probe object")?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    prog.load().map_err(|e| match e {
        ProgramError::LoadError { verifier_log, .. } => {
            let last = verifier_log.to_string();
            let last = last.lines().rev().find(|l| !l.trim().is_empty());
            format!("the verifier refused it: {}", last.unwrap_or("(no log)"))
        }
        e => e.to_string(),
    })
}

/// Which build of the program [`XdpDatapath::load`] loads.
#[derive(Clone, Copy)]
pub enum XdpObject {
    /// The production program as this kernel's verifier takes it: with the
    /// flow filter where it has atomic OR (Linux 5.12+), else
    /// [`objects::XDP_LB_NO_FLOW_FILTER`] (logged).
    Production,
    /// This object as it is (benchmark and test builds).
    Exactly(&'static [u8]),
}

impl std::fmt::Debug for XdpObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Production => f.write_str("Production"),
            Self::Exactly(o) => write!(f, "Exactly({} bytes)", o.len()),
        }
    }
}

impl XdpObject {
    /// The object to load, and whether it reads the flow filter (every
    /// `Exactly` object is taken to).
    fn for_kernel(self) -> (&'static [u8], bool) {
        match self {
            Self::Exactly(object) => (object, true),
            Self::Production => match probe_atomic_or() {
                Ok(()) => (objects::XDP_LB, true),
                Err(error) => {
                    tracing::warn!(
                        %error,
                        "this kernel's BPF verifier has no atomic OR (Linux 5.12+): loading the \
                         XDP program without the flow filter, so every new flow's SYN looks \
                         conntrack up"
                    );
                    (objects::XDP_LB_NO_FLOW_FILTER, false)
                }
            },
        }
    }
}

pub use crate::attach_mode::AttachMode;
pub use ringlb_bpf_types::check_pin_dir;

pub const PROGRAM: &str = "ringlb_xdp";
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ringlb";

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
    /// The program to load (`Production` except in benchmarks and tests).
    pub object: XdpObject,
    /// New conntrack entries one VIP may insert per CPU per window of at
    /// least a second; 0 = no limit (conntrack.h; [`auto_ct_insert_budget`]
    /// is the edge's default).
    pub ct_insert_budget: u32,
    /// How many VIP:port entries the per-VIP per-CPU counters hold
    /// (`abi::map::PER_VIP_COUNTERS`; vip_ids are given out below it), at most
    /// and by default [`abi::MAX_VIPS`]. Each entry is one per-CPU allocation in
    /// each of those maps, the largest part of the time a load takes: tests
    /// that program a few VIPs load with a few hundred.
    pub vip_capacity: u32,
    /// The outer IPv4 sources (network, prefix length) whose IPIP packets to
    /// one of this edge's VIPs are decapsulated for failover: the other
    /// region's edges. Empty (the default): none are (`decap_senders.rs`).
    pub decap_senders: Vec<(Ipv4Addr, u8)>,
}

impl Default for XdpOptions {
    fn default() -> Self {
        Self {
            pin_dir: Some(PathBuf::from(DEFAULT_PIN_DIR)),
            src4: None,
            src6: None,
            mtu: 1500,
            fib_fallback: true,
            object: XdpObject::Production,
            ct_insert_budget: 0,
            vip_capacity: abi::MAX_VIPS,
            decap_senders: Vec::new(),
        }
    }
}

/// The edge's default insert budget on this machine:
/// [`ct_insert_budget_for`] its possible CPUs.
pub fn auto_ct_insert_budget() -> Result<u32, Error> {
    Ok(ct_insert_budget_for(crate::possible_cpus()? as u32))
}

/// An eighth of one CPU's share of the conntrack LRU per second (`possible`
/// CPUs, as the kernel splits the per-CPU lists). A flood of new flows to one
/// VIP then turns over at most that share in 8 s, so an established flow
/// that sends a packet more often than that keeps its entry. 16,384 with 2
/// CPUs, 2,048 with 16.
pub fn ct_insert_budget_for(possible_cpus: u32) -> u32 {
    (abi::CT_SIZE / possible_cpus.max(1) / 8).max(1)
}

/// The loaded (and maybe attached) XDP datapath.
pub struct XdpDatapath {
    /// The apply path over the object's maps (which also hold its program).
    applier: Applier<KernelMaps>,
    pin_dir: Option<PathBuf>,
    link_pin: Option<PathBuf>,
    link: Option<FdLink>,
    /// The loaded program reads the flow filter (not the build for kernels
    /// without atomic OR).
    flow_filter: bool,
}

fn prog_err(source: ProgramError) -> Error {
    ringlb_bpf_types::prog_err(PROGRAM)(source)
}

impl XdpDatapath {
    /// Loads the program and its maps (reusing pinned maps if present) and
    /// writes the config. Does not attach.
    pub fn load(opts: &XdpOptions, resolver: Box<dyn Resolver>) -> Result<Self, Error> {
        let mut loader = EbpfLoader::new();
        if let Some(dir) = &opts.pin_dir {
            ringlb_bpf_types::prepare_pin_dir(dir)?;
            warn_without_owners(dir);
            replace_stale_derived_maps(dir)?;
            for name in abi::map::ALL {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let (object, flow_filter) = opts.object.for_kernel();
        let capacity = opts.vip_capacity.clamp(1, abi::MAX_VIPS);
        for name in abi::map::PER_VIP_COUNTERS {
            loader.map_max_entries(name, capacity);
        }
        loader.override_global(abi::CT_INSERT_BUDGET_GLOBAL, &opts.ct_insert_budget, true);
        let mut ebpf = loader
            .load(object)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or(BpfError::Missing { name: PROGRAM })?
            .try_into()
            .map_err(prog_err)?;
        prog.load().map_err(prog_err)?;
        let owners = Some(take_owners(&mut ebpf)?);
        let mut maps = KernelMaps::new(ebpf, owners);
        // pinned maps from an older build with another layout: refuse clearly
        check_abi(&maps)?;
        write_config(&mut maps, opts)?;
        crate::decap_senders::write(&mut maps, &opts.decap_senders)?;
        if opts.pin_dir.is_some() {
            // pinned conntrack entries, or a running program, may have keys
            // the filter lacks: every SYN looks up until the owner's first
            // rebuild (`rebuild_flow_filter`, after attach)
            maps.with_flow_filter(|f| {
                f.fill(0, true);
                f.fill(1, true);
            })?;
        }
        Ok(Self {
            applier: Applier::new(maps, resolver)?,
            pin_dir: opts.pin_dir.clone(),
            link_pin: None,
            link: None,
            flow_filter,
        })
    }

    /// Whether the loaded program reads the flow filter (false on a kernel
    /// without BPF atomic OR, which gets the build without it): only then
    /// is [`Self::rebuild_flow_filter`] worth running.
    pub fn flow_filter(&self) -> bool {
        self.flow_filter
    }

    /// Opens the maps a running edge pinned in `dir`, without loading or
    /// attaching anything (for the operator CLI). Fails if nothing is pinned.
    pub fn open_pinned(dir: &Path) -> Result<Self, Error> {
        // an older edge has none of the newer maps; the others must be there
        for name in abi::map::ALL
            .into_iter()
            .filter(|n| !abi::map::NEWER.contains(n))
        {
            let p = dir.join(name);
            if !p.exists() {
                return Err(BpfError::NotPinned { path: p }.into());
            }
        }
        let mut loader = EbpfLoader::new();
        for name in abi::map::ALL {
            loader.map_pin_path(name, dir.join(name));
        }
        let mut ebpf = loader
            .load(objects::XDP_LB)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        let owners = Some(take_owners(&mut ebpf)?);
        let maps = KernelMaps::new(ebpf, owners);
        let resolver = Box::new(ringlb_nexthop::StaticResolver::default());
        Ok(Self {
            applier: Applier::observer(maps, resolver)?,
            pin_dir: Some(dir.to_path_buf()),
            link_pin: None,
            link: None,
            // the running program is this build's, as this kernel took it
            flow_filter: probe_atomic_or().is_ok(),
        })
    }

    /// The apply path and its view of the maps.
    pub fn applier(&self) -> &Applier<KernelMaps> {
        &self.applier
    }

    /// The object's maps.
    pub fn maps(&self) -> &KernelMaps {
        self.applier.maps()
    }

    /// What the loader believes the maps hold (see [`Applier::programmed`]).
    pub fn programmed(&self) -> &Programmed {
        self.applier.programmed()
    }

    /// See [`Applier::view_known`].
    pub fn view_known(&self) -> bool {
        self.applier.view_known()
    }

    /// Re-reads the maps (what a restarted loader would find).
    pub fn read_programmed(&self) -> Result<Programmed, Error> {
        self.applier.read_programmed()
    }

    /// Rebuilds the flow filter from the conntrack keys (`flow_filter.rs`).
    /// Only the XDP owner calls this, periodically and after attaching; never
    /// an observer ([`Self::open_pinned`]).
    pub fn rebuild_flow_filter(&self) -> Result<RebuildStats, Error> {
        let maps = self.maps();
        maps.with_flow_filter(|f| flow_filter::rebuild(f, || maps.conntrack_keys()))?
    }

    /// The `bfd_hold` map (BFD held across a restart; `bfd_hold.rs`).
    pub fn bfd_hold(&self) -> Result<crate::bfd_hold::BfdHoldMap, Error> {
        crate::bfd_hold::BfdHoldMap::of_loaded(self.maps().ebpf())
    }

    /// Runs `f` over the flow filter's memory (tests, benchmarks, the CLI).
    pub fn with_flow_filter<T>(&self, f: impl FnOnce(&FilterBits<'_>) -> T) -> Result<T, Error> {
        self.maps().with_flow_filter(f)
    }
}

/// Pinned maps of another shape than this build's that hold only derived
/// state are unpinned, so the load creates this build's: `flow_filter` of
/// another value size (an older edge's byte-per-slot filter; rebuilt from
/// conntrack after the attach, and all "maybe" until then) and `stats` with
/// another number of counters (an older build's; they restart from 0). A
/// program still running keeps its own maps.
fn replace_stale_derived_maps(dir: &Path) -> Result<(), Error> {
    replace_if_other(dir, abi::map::FLOW_FILTER, "value_size", |i| {
        i.value_size() as usize == abi::FLOW_FILTER_VALUE_SIZE
    })?;
    replace_if_other(dir, abi::map::STATS, "max_entries", |i| {
        i.max_entries() == abi::STAT_MAX
    })
}

/// Unpins `dir/name` when `ours` says its kernel info is not this build's.
fn replace_if_other(
    dir: &Path,
    name: &str,
    what: &str,
    ours: fn(&aya::maps::MapInfo) -> bool,
) -> Result<(), Error> {
    let path = dir.join(name);
    let Ok(map) = aya::maps::MapData::from_pin(&path) else {
        return Ok(()); // none pinned (or unreadable: the load will say)
    };
    let Ok(info) = map.info() else {
        return Ok(()); // the load will say
    };
    if !ours(&info) {
        tracing::info!(
            path = %path.display(),
            differs = what,
            value_size = info.value_size(),
            max_entries = info.max_entries(),
            "replacing a pinned map of another layout (an older build's): it holds derived state only"
        );
        std::fs::remove_file(&path).map_err(|source| BpfError::Pin { path, source })?;
    }
    Ok(())
}

fn write_config(maps: &mut KernelMaps, opts: &XdpOptions) -> Result<(), Error> {
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
    let mut m: Array<_, abi::ConfigValue> = maps.map_mut(abi::map::CONFIG)?;
    m.set(0, cfg, 0).map_err(map_err(abi::map::CONFIG))
}

/// Removes the pin at `pin` and detaches the link before returning: the pin is
/// opened first, so closing that last reference frees the link synchronously (a
/// removed pin alone is released later, from a work queue, and a new attach in
/// the other mode would meet the old program: "Native and generic XDP can't be
/// active at the same time").
fn unpin(pin: &Path) -> Result<(), Error> {
    let pin_err = |source| -> Error {
        BpfError::Pin {
            path: pin.to_path_buf(),
            source,
        }
        .into()
    };
    match PinnedLink::from_pin(pin) {
        Ok(link) => {
            let fd_link = link.unpin().map_err(pin_err)?;
            drop(fd_link); // the last reference: the kernel detaches it now
            Ok(())
        }
        Err(e) => {
            tracing::debug!(pin = %pin.display(), error = %e, "opening the pinned link failed; removing the pin");
            std::fs::remove_file(pin).map_err(pin_err)
        }
    }
}

/// A failed attach, explained when the interface already has an XDP program that
/// is not this edge's pinned link (one pinned under another `--pin-dir`, or
/// attached with `ip link`): the kernel's EBUSY/EEXIST alone does not say so.
fn attach_error(iface: &str, e: aya::programs::ProgramError) -> Error {
    let progs = match xdp_progs(if_index(iface)) {
        Ok(p) => p,
        Err(_) => return prog_err(e),
    };
    let attached = [
        (progs.native, "native"),
        (progs.generic, "generic"),
        (progs.offload, "offload"),
    ]
    .into_iter()
    .find_map(|(id, mode)| id.map(|id| (id, mode)));
    match attached {
        Some((id, mode)) => BpfError::Interface {
            iface: iface.into(),
            reason: format!(
                "attaching XDP failed ({e}): the interface already has an XDP program \
                 (id {id}, {mode} mode) that is not the link pinned in this --pin-dir: one \
                 pinned under another --pin-dir, or attached with `ip link`. See `ip -d link \
                 show dev {iface}`; remove it with `ringlb-edge datapath --pin-dir <that dir> \
                 uninstall` or `ip link set dev {iface} xdp off`"
            ),
        }
        .into(),
        None => prog_err(e),
    }
}

/// Unpins (and so detaches) the XDP links pinned in `dir` for interfaces other
/// than `iface`: they were attached under an earlier `--interface`, and would go
/// on forwarding there with the same maps.
fn unpin_links_of_other_interfaces(dir: &Path, iface: &str) -> Result<(), Error> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let ours = format!("link_{iface}");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(other) = name.strip_prefix("link_") else {
            continue;
        };
        if name == ours {
            continue;
        }
        let path = e.path();
        let xdp = pinned_link_info(&path).is_ok_and(|i| i.link_type == BPF_LINK_TYPE_XDP);
        if !xdp {
            continue;
        }
        tracing::warn!(
            interface = other,
            now = iface,
            pin = %path.display(),
            "an XDP link is pinned for another interface (an earlier --interface): detaching it there"
        );
        unpin(&path)?;
    }
    Ok(())
}

impl XdpDatapath {
    /// The loaded program (for BPF_PROG_TEST_RUN).
    pub fn program(&self) -> Result<&Xdp, Error> {
        self.maps()
            .ebpf()
            .program(PROGRAM)
            .ok_or(BpfError::Missing { name: PROGRAM })?
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
    /// fresh link is attached; so is a link in another mode than `mode` asks
    /// for (see [`crate::attach_mode::reuse`]), and a link pinned for another
    /// interface (an earlier `--interface`) is detached.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<&'static str, Error> {
        // `auto` on a veth whose peer runs no XDP program: generic (auto_mode.rs)
        let mode = crate::auto_mode::resolve(iface, mode);
        let link_pin = self
            .pin_dir
            .as_ref()
            .map(|d| d.join(format!("link_{iface}")));
        if let Some(dir) = &self.pin_dir {
            unpin_links_of_other_interfaces(dir, iface)?;
        }
        if let Some(pin) = link_pin.as_ref().filter(|p| p.exists()) {
            let want = if_index(iface);
            if want == 0 {
                return Err(BpfError::Interface {
                    iface: iface.into(),
                    reason: "no such interface".into(),
                }
                .into());
            }
            let info = pinned_link_info(pin).map_err(|e| BpfError::Interface {
                iface: iface.into(),
                reason: format!("reading pinned link {}: {e}", pin.display()),
            })?;
            let (link_type, have) = (info.link_type, info.ifindex);
            if link_type != BPF_LINK_TYPE_XDP || have != want {
                tracing::warn!(
                    iface,
                    ifindex = want,
                    link_ifindex = have,
                    link_type,
                    pin = %pin.display(),
                    "the pinned XDP link does not drive this interface (defunct: the interface was deleted and re-created); unpinning it and attaching afresh"
                );
                unpin(pin)?;
            } else {
                let have_mode = match xdp_progs(want) {
                    Ok(progs) => progs.mode_of(info.prog_id),
                    Err(e) => {
                        tracing::warn!(iface, error = %e, "reading the interface's XDP mode failed; keeping the pinned link as it is");
                        None
                    }
                };
                if let Reuse::Reattach { have, want } = reuse(have_mode, mode) {
                    tracing::warn!(
                        iface,
                        pinned_mode = have.as_str(),
                        requested = ?want,
                        pin = %pin.display(),
                        "the pinned XDP link runs in {} mode but --xdp-mode asks for {want:?}: detaching it and attaching in the requested mode (the interface is without XDP between the two)",
                        have.as_str()
                    );
                    unpin(pin)?;
                }
            }
        }
        if let Some(pin) = link_pin.as_ref().filter(|p| p.exists()) {
            let pinned = PinnedLink::from_pin(pin).map_err(|e| BpfError::Interface {
                iface: iface.into(),
                reason: format!("opening pinned link {}: {e}", pin.display()),
            })?;
            let fd_link: FdLink = pinned.into();
            let xdp_link = XdpLink::try_from(fd_link).map_err(|e| BpfError::Interface {
                iface: iface.into(),
                reason: format!("pinned link is not an XDP link: {e}"),
            })?;
            let prog = self.xdp_mut()?;
            let id = prog.attach_to_link(xdp_link).map_err(prog_err)?;
            let link = prog.take_link(id).map_err(prog_err)?;
            self.link = Some(FdLink::try_from(link).map_err(|e| BpfError::Interface {
                iface: iface.into(),
                reason: format!("link: {e}"),
            })?);
            self.link_pin = link_pin;
            tracing::info!(iface, "replaced the program in the pinned XDP link");
            return Ok("replaced");
        }
        let prog = self.xdp_mut()?;
        let attach_err = |e| attach_error(iface, e);
        let (id, used) = match mode {
            AttachMode::Native => (
                prog.attach(iface, XdpMode::Driver).map_err(attach_err)?,
                "native",
            ),
            AttachMode::Generic => (
                prog.attach(iface, XdpMode::Skb).map_err(attach_err)?,
                "generic",
            ),
            AttachMode::Auto => match prog.attach(iface, XdpMode::Driver) {
                Ok(id) => (id, "native"),
                Err(e) => {
                    tracing::warn!(iface, error = %e, "native XDP attach failed; falling back to generic (skb) mode, which is much slower");
                    (
                        prog.attach(iface, XdpMode::Skb).map_err(attach_err)?,
                        "generic",
                    )
                }
            },
        };
        let link = prog.take_link(id).map_err(prog_err)?;
        let fd_link = FdLink::try_from(link).map_err(|e| BpfError::Interface {
            iface: iface.into(),
            reason: format!("kernel gave no bpf_link for XDP: {e}"),
        })?;
        if let Some(pin) = &link_pin {
            let pinned = fd_link.pin(pin).map_err(|e| BpfError::Pin {
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
        self.applier
            .maps_mut()
            .ebpf_mut()
            .program_mut(PROGRAM)
            .ok_or(BpfError::Missing { name: PROGRAM })?
            .try_into()
            .map_err(prog_err)
    }

    /// Detaches (removes the pinned link). Maps stay pinned.
    pub fn detach(&mut self) -> Result<(), Error> {
        if let Some(pin) = self.link_pin.take() {
            match std::fs::remove_file(&pin) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(BpfError::Pin { path: pin, source }.into()),
            }
        }
        self.link = None; // closing the last fd of an unpinned link detaches it
        Ok(())
    }

    /// Global and per-VIP counters, summed over CPUs.
    pub fn read_counters(&self) -> Result<Counters, Error> {
        self.applier.counters()
    }

    /// True when `dir` holds a pinned map or link of an earlier install.
    pub fn is_installed(dir: &Path) -> bool {
        abi::map::ALL.iter().any(|m| dir.join(m).exists())
            || std::fs::read_dir(dir).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("link_"))
            })
    }

    /// Removes the pin directory's files: links (detaching them) and maps.
    pub fn remove_pins(dir: &Path) -> Result<(), Error> {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("link_") {
                    unpin(&e.path())?; // detached when this returns
                }
            }
        }
        for name in abi::map::ALL {
            let p = dir.join(name);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(BpfError::Pin { path: p, source }.into()),
            }
        }
        let _ = std::fs::remove_dir(dir); // only if empty: other links may remain
        Ok(())
    }
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
    fn apply(&mut self, desired: &DesiredState) -> Result<ApplyStats, SeamError> {
        Ok(self.applier.apply(desired)?)
    }
    fn apply_service(
        &mut self,
        vip: &Vip,
        entry: Option<&ServiceEntry>,
    ) -> Result<ApplyStats, SeamError> {
        Ok(self.applier.apply_service(vip, entry)?)
    }
    fn refresh_next_hops(&mut self) -> Result<usize, SeamError> {
        Ok(self.applier.refresh_next_hops()?)
    }
    fn counters(&mut self) -> Result<Counters, SeamError> {
        Ok(self.read_counters()?)
    }
    fn uninstall(self) -> Result<(), SeamError> {
        Ok(self.remove()?)
    }
}

impl XdpDatapath {
    /// Detaches the program and removes its pins ([`Datapath::uninstall`]).
    pub fn remove(mut self) -> Result<(), Error> {
        self.detach()?;
        let dir = self.pin_dir.take();
        drop(self);
        if let Some(dir) = dir {
            Self::remove_pins(&dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_insert_budget_is_an_eighth_of_a_cpus_conntrack_share() {
        assert_eq!(ct_insert_budget_for(2), 16_384);
        assert_eq!(ct_insert_budget_for(16), 2_048);
        // never 0 (which means no limit), whatever the CPU count says
        assert_eq!(ct_insert_budget_for(0), abi::CT_SIZE / 8);
        assert_eq!(ct_insert_budget_for(1 << 20), 1);
    }
}
