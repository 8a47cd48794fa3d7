//! Loads `bpf/node.bpf.c`, pins its maps, attaches its programs to uplinks
//! and writes desired states into the maps.
//!
//! Pinning: with a pin directory (default `/sys/fs/bpf/ringlb-node`) every map
//! is pinned as `<dir>/<map>`, so a restarted agent reuses them and keeps its
//! flows; on kernels with tcx (Linux 6.6) each attachment is a bpf_link pinned
//! as `<dir>/link_<iface>_<hook>`, and a restarted agent swaps its program into
//! that link atomically (traffic never sees a moment without a program). On
//! older kernels the loader falls back to a clsact qdisc + netlink filter,
//! which lives only as long as the loader.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, IterableMap, MapData, PerCpuArray},
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType, TestRun, TestRunOptions,
        links::{FdLink, PinnedLink},
        tc::{self, SchedClassifierLink, TcAttachOptions},
    },
};

use crate::{
    BpfError, Error, abi, map_err,
    maps::{Applier, KernelMaps},
    objects,
    state::{NodeState, Proto},
};

pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ringlb-node";

/// Where a program runs on an uplink.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Decapsulation + DNAT (`ringlb_node_ingress`).
    Ingress,
    /// Reply SNAT, MSS clamp, ICMP translation (`ringlb_node_egress`).
    Egress,
}

impl Hook {
    pub const BOTH: [Hook; 2] = [Hook::Ingress, Hook::Egress];
    pub const fn program(self) -> &'static str {
        match self {
            Hook::Ingress => abi::prog::INGRESS,
            Hook::Egress => abi::prog::EGRESS,
        }
    }
    pub const fn label(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
    const fn attach_type(self) -> TcAttachType {
        match self {
            Hook::Ingress => TcAttachType::Ingress,
            Hook::Egress => TcAttachType::Egress,
        }
    }
}

/// Loader options.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Pin maps (and tcx links) here; `None` = nothing pinned (tests).
    pub pin_dir: Option<PathBuf>,
    /// MSS clamp for IPv4 / IPv6 SYN-ACKs of translated flows; 0 = off.
    pub mss4: u16,
    pub mss6: u16,
    /// Decapsulate only tunnels whose outer source is in `NodeState::edges`
    /// (the node agent turns it on; off, any source is taken).
    pub check_source: bool,
}

impl NodeOptions {
    /// The largest MSS whose segments still fit a `fabric_mtu` path after the
    /// edge's encapsulation: IPv4 MTU - 20 (outer) - 20 (IP) - 20 (TCP),
    /// IPv6 MTU - 40 (outer) - 40 (IP) - 20 (TCP). 1500 gives 1440 / 1400.
    pub const fn mss_for_mtu(fabric_mtu: u16) -> (u16, u16) {
        (
            fabric_mtu.saturating_sub(60),
            fabric_mtu.saturating_sub(100),
        )
    }
}

impl Default for NodeOptions {
    fn default() -> Self {
        let (mss4, mss6) = Self::mss_for_mtu(1500);
        Self {
            pin_dir: Some(PathBuf::from(DEFAULT_PIN_DIR)),
            mss4,
            mss6,
            check_source: false,
        }
    }
}

/// One attachment. The links are only held: dropping the last reference
/// to an unpinned link detaches the program.
enum Attached {
    /// A tcx bpf_link, pinned at `pin` when there is a pin directory.
    Tcx { _link: FdLink, pin: Option<PathBuf> },
    /// A netlink filter on a clsact qdisc (kernels before 6.6).
    Netlink { _link: SchedClassifierLink },
}

/// The loaded (and maybe attached) node datapath.
pub struct NodeDatapath {
    ebpf: Ebpf,
    maps: Applier<KernelMaps>,
    flows: HashMap<MapData, abi::FlowKey, abi::FlowValue>,
    pin_dir: Option<PathBuf>,
    links: BTreeMap<(String, Hook), Attached>,
}

fn prog_err(name: &'static str) -> impl Fn(ProgramError) -> Error {
    ringlb_bpf_types::prog_err(name)
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, Error>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf.take_map(name).ok_or(BpfError::Missing { name })?;
    T::try_from(m).map_err(map_err(name))
}

fn check_size(name: &'static str, data: &MapData, want: u32) -> Result<(), Error> {
    let fix = "uninstall, or use a new pin dir";
    Ok(ringlb_bpf_types::check_capacity(
        name,
        data,
        want,
        "node_abi.h",
        fix,
    )?)
}

/// A pinned counter map of a build with another number of counters (a release
/// that added one) is unpinned, so this build creates its own: the counters
/// start from zero, the pods, services and flows are kept.
fn drop_stale_stats(dir: &std::path::Path) {
    let path = dir.join(abi::map::STATS);
    let Ok(old) = MapData::from_pin(&path) else {
        return;
    };
    let have = old.info().map(|i| i.max_entries()).ok();
    if have != Some(abi::STAT_MAX) {
        tracing::info!(
            ?have,
            want = abi::STAT_MAX,
            "replacing the pinned counter map"
        );
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "could not unpin the old counter map");
        }
    }
}

impl NodeDatapath {
    /// Loads both programs and the maps (reusing pinned maps when present),
    /// checks the maps against the Rust ABI, writes the config and reads back
    /// what the maps hold. Attaches nothing.
    pub fn load(opts: &NodeOptions) -> Result<Self, Error> {
        Self::load_object(opts, objects::NODE)
    }

    /// [`NodeDatapath::load`] with another build of `bpf/node.bpf.c` (the
    /// benchmark build in `ringlb-testkit`); the object must have the same ABI.
    pub fn load_object(opts: &NodeOptions, object: &[u8]) -> Result<Self, Error> {
        let mut loader = EbpfLoader::new();
        if let Some(dir) = &opts.pin_dir {
            ringlb_bpf_types::prepare_pin_dir(dir)?;
            drop_stale_stats(dir);
            for name in abi::map::ALL {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader
            .load(object)
            .map_err(|e| BpfError::Load(Box::new(e)))?;
        for hook in Hook::BOTH {
            let name = hook.program();
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(BpfError::Missing { name })?
                .try_into()
                .map_err(prog_err(name))?;
            prog.load().map_err(prog_err(name))?;
        }
        // typed views check key/value sizes against node_abi.h's mirror
        let pods: HashMap<MapData, abi::PodKey, abi::PodValue> =
            take_map(&mut ebpf, abi::map::LOCAL_PODS)?;
        let edges: HashMap<MapData, abi::PodKey, abi::EdgeValue> =
            take_map(&mut ebpf, abi::map::EDGES)?;
        let services: HashMap<MapData, abi::SvcKey, abi::SvcValue> =
            take_map(&mut ebpf, abi::map::SERVICES)?;
        let flows: HashMap<MapData, abi::FlowKey, abi::FlowValue> =
            take_map(&mut ebpf, abi::map::FLOWS)?;
        check_size(abi::map::LOCAL_PODS, pods.map(), abi::MAX_PODS)?;
        check_size(abi::map::EDGES, edges.map(), abi::MAX_EDGES)?;
        check_size(abi::map::SERVICES, services.map(), abi::MAX_SERVICES)?;
        check_size(abi::map::FLOWS, flows.map(), abi::FLOWS)?;
        let maps = Applier::new(KernelMaps {
            pods,
            edges,
            services,
        })?;
        let mut me = Self {
            ebpf,
            maps,
            flows,
            pin_dir: opts.pin_dir.clone(),
            links: BTreeMap::new(),
        };
        me.check_stats()?;
        me.write_config(opts)?;
        Ok(me)
    }

    fn check_stats(&self) -> Result<(), Error> {
        let name = abi::map::STATS;
        let m = self.ebpf.map(name).ok_or(BpfError::Missing { name })?;
        let stats: PerCpuArray<_, u64> = PerCpuArray::try_from(m).map_err(map_err(name))?;
        if stats.len() != abi::STAT_MAX {
            return Err(BpfError::Layout {
                name,
                reason: format!(
                    "object has {} counters, Rust knows {}",
                    stats.len(),
                    abi::STAT_MAX
                ),
            }
            .into());
        }
        Ok(())
    }

    fn write_config(&mut self, opts: &NodeOptions) -> Result<(), Error> {
        let name = abi::map::CONFIG;
        let m = self.ebpf.map_mut(name).ok_or(BpfError::Missing { name })?;
        let mut cfg: Array<_, abi::ConfigValue> = Array::try_from(m).map_err(map_err(name))?;
        let v = abi::ConfigValue {
            mss4: opts.mss4,
            mss6: opts.mss6,
            flags: if opts.check_source {
                abi::CFG_CHECK_SOURCE
            } else {
                0
            },
        };
        cfg.set(0, v, 0).map_err(map_err(name))
    }

    /// What the maps hold (as last read or written).
    pub fn programmed(&self) -> &NodeState {
        self.maps.programmed()
    }

    /// Writes the difference between what the maps hold and `want`
    /// ([`Applier::apply`]). Returns the number of map operations.
    pub fn apply(&mut self, want: &NodeState) -> Result<usize, Error> {
        self.maps.apply(want)
    }

    fn prog_mut(&mut self, hook: Hook) -> Result<&mut SchedClassifier, Error> {
        let name = hook.program();
        self.ebpf
            .program_mut(name)
            .ok_or(BpfError::Missing { name })?
            .try_into()
            .map_err(prog_err(name))
    }

    fn prog(&self, hook: Hook) -> Result<&SchedClassifier, Error> {
        let name = hook.program();
        self.ebpf
            .program(name)
            .ok_or(BpfError::Missing { name })?
            .try_into()
            .map_err(prog_err(name))
    }

    /// Attaches both programs to uplink `iface` (ingress and egress).
    pub fn attach_uplink(&mut self, iface: &str) -> Result<(), Error> {
        for hook in Hook::BOTH {
            self.attach(iface, hook)?;
        }
        Ok(())
    }

    /// Attaches the `hook` program to `iface`: into the pinned tcx link when
    /// there is one (atomic replace), else a new tcx link (pinned), else
    /// (no tcx) a netlink filter on a clsact qdisc.
    pub fn attach(&mut self, iface: &str, hook: Hook) -> Result<(), Error> {
        let name = hook.program();
        let pin = self
            .pin_dir
            .as_ref()
            .map(|d| d.join(format!("link_{iface}_{}", hook.label())));
        let if_err = |reason: String| BpfError::Interface {
            iface: iface.to_string(),
            reason,
        };
        if let Some(p) = pin.as_ref().filter(|p| p.exists()) {
            let old = PinnedLink::from_pin(p)
                .map_err(|e| if_err(format!("opening pinned link {}: {e}", p.display())))?;
            let link = SchedClassifierLink::try_from(FdLink::from(old))
                .map_err(|e| if_err(format!("pinned link is not a tcx link: {e}")))?;
            let prog = self.prog_mut(hook)?;
            let id = prog.attach_to_link(link).map_err(prog_err(name))?;
            let link = prog.take_link(id).map_err(prog_err(name))?;
            let fd = FdLink::try_from(link).map_err(|e| if_err(format!("link: {e}")))?;
            self.links
                .insert((iface.to_string(), hook), Attached::Tcx { _link: fd, pin });
            tracing::info!(
                iface,
                hook = hook.label(),
                "replaced the program in the pinned tcx link"
            );
            return Ok(());
        }
        let prog = self.prog_mut(hook)?;
        let tcx = prog.attach_with_options(
            iface,
            hook.attach_type(),
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        );
        let attached = match tcx {
            Ok(id) => {
                let link = prog.take_link(id).map_err(prog_err(name))?;
                let fd = FdLink::try_from(link).map_err(|e| if_err(format!("tcx link: {e}")))?;
                match &pin {
                    Some(p) => {
                        let pinned = fd.pin(p).map_err(|e| BpfError::Pin {
                            path: p.clone(),
                            source: std::io::Error::other(e.to_string()),
                        })?;
                        Attached::Tcx {
                            _link: pinned.into(),
                            pin,
                        }
                    }
                    None => Attached::Tcx {
                        _link: fd,
                        pin: None,
                    },
                }
            }
            Err(e) => {
                tracing::info!(iface, error = %e, "no tcx link; falling back to clsact + netlink filter");
                match tc::qdisc_add_clsact(iface) {
                    Ok(()) | Err(tc::TcError::AlreadyAttached) => {}
                    Err(e) => tracing::debug!(iface, error = %e, "clsact (probably exists)"),
                }
                let id = prog
                    .attach_with_options(
                        iface,
                        hook.attach_type(),
                        TcAttachOptions::Netlink(Default::default()),
                    )
                    .map_err(prog_err(name))?;
                Attached::Netlink {
                    _link: prog.take_link(id).map_err(prog_err(name))?,
                }
            }
        };
        self.links.insert((iface.to_string(), hook), attached);
        tracing::info!(iface, hook = hook.label(), "attached node program");
        Ok(())
    }

    /// Detaches everything this loader attached (unpinning tcx links).
    pub fn detach_all(&mut self) -> Result<(), Error> {
        for (_, a) in std::mem::take(&mut self.links) {
            if let Attached::Tcx { pin: Some(p), .. } = &a {
                remove_if_present(p)?;
            }
            drop(a); // the last reference: the kernel detaches the program
        }
        Ok(())
    }

    /// Detaches, then removes every pin (maps and links, also links a previous
    /// instance left) and the pin directory: no program, map or pin remains.
    pub fn uninstall(mut self) -> Result<(), Error> {
        self.detach_all()?;
        let dir = self.pin_dir.take();
        drop(self);
        match dir {
            Some(d) => remove_pins(&d),
            None => Ok(()),
        }
    }

    /// Runs the `hook` program on `frame` (BPF_PROG_TEST_RUN): verdict, bytes
    /// out (written into `out`), and the average time per run.
    pub fn test_run(
        &self,
        hook: Hook,
        frame: &[u8],
        out: &mut [u8],
        repeat: u32,
    ) -> Result<(u32, usize, Duration), Error> {
        let mut o = TestRunOptions::new();
        o.data_in = Some(frame);
        o.data_out = Some(out);
        o.repeat = repeat;
        let r = self
            .prog(hook)?
            .test_run(o)
            .map_err(prog_err(hook.program()))?;
        Ok((r.return_value, r.data_size_out as usize, r.duration))
    }

    /// Every counter, summed over CPUs.
    pub fn counters(&self) -> Result<Vec<(abi::Stat, u64)>, Error> {
        let name = abi::map::STATS;
        let m = self.ebpf.map(name).ok_or(BpfError::Missing { name })?;
        let stats: PerCpuArray<_, u64> = PerCpuArray::try_from(m).map_err(map_err(name))?;
        abi::Stat::ALL
            .iter()
            .map(|s| {
                let v = stats.get(&(*s as u32), 0).map_err(map_err(name))?;
                Ok((*s, v.iter().sum()))
            })
            .collect()
    }

    /// One counter, summed over CPUs.
    pub fn counter(&self, stat: abi::Stat) -> Result<u64, Error> {
        Ok(self
            .counters()?
            .into_iter()
            .find(|(s, _)| *s == stat)
            .map_or(0, |(_, v)| v))
    }

    /// The VIP:port a reply `pod -> client` is translated to, if any.
    pub fn flow(
        &self,
        client: SocketAddr,
        pod: SocketAddr,
        proto: Proto,
    ) -> Result<Option<SocketAddr>, Error> {
        let (c, family) = abi::RawAddr::from_ip(client.ip());
        let key = abi::FlowKey {
            client: c,
            pod: abi::RawAddr::from_ip(pod.ip()).0,
            client_port: abi::Be16::from_host(client.port()),
            pod_port: abi::Be16::from_host(pod.port()),
            proto: proto.number(),
            family,
            pad: [0; 2],
        };
        match self.flows.get(&key, 0) {
            Ok(v) => Ok(v
                .vip
                .to_ip(family)
                .map(|ip: IpAddr| SocketAddr::new(ip, v.vip_port.to_host()))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(abi::map::FLOWS)(e)),
        }
    }
}

fn remove_if_present(p: &Path) -> Result<(), Error> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BpfError::Pin {
            path: p.to_path_buf(),
            source,
        }
        .into()),
    }
}

/// Removes the maps and links pinned in `dir`, then `dir` itself (when
/// empty). For `uninstall` without a running loader too.
pub fn remove_pins(dir: &Path) -> Result<(), Error> {
    for name in abi::map::ALL {
        remove_if_present(&dir.join(name))?;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("link_") {
                remove_if_present(&e.path())?;
            }
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BpfError::Pin {
            path: dir.to_path_buf(),
            source,
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mss_defaults_fit_a_1500_byte_fabric() {
        assert_eq!(NodeOptions::mss_for_mtu(1500), (1440, 1400));
        let o = NodeOptions::default();
        assert_eq!((o.mss4, o.mss6), (1440, 1400));
        assert_eq!(o.pin_dir.as_deref(), Some(Path::new(DEFAULT_PIN_DIR)));
    }
}
