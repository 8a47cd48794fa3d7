//! The lab's fabric: namespaces, links, bridges, sysctls, the ToR-side XDP programs,
//! the worker nodes with their pods behind veths, the ToR's routes to the pod CIDRs,
//! the ToR's nftables counters and a private bpffs for the edges and nodes.
//! Everything is removed again when [`Topology`] drops (unless kept for `ringlb-lab up`).
//!
//! Settings each one has a reason (see docs/lab.md, "Pitfalls"):
//! - the ToR-side veth of each edge runs `ringlb_pass`: a native XDP_TX frame only
//!   reaches a veth peer that has an XDP program;
//! - the client sends with TX checksum offload off: XDP_TX loses CHECKSUM_PARTIAL;
//! - loose rp_filter on the ToR: DSR replies arrive from br-pod, the VIP routes to br-lb;
//! - ECMP hash over the 5-tuple (policy 3, fields 0x37), not the socket's random hash;
//! - edges forward (bpf_fib_lookup needs it); the fabric's MTU is 1500, so the node
//!   agent clamps the MSS of the pods' SYN-ACKs to leave room for the 20-byte IPIP
//!   header;
//! - the worker nodes run `ringlb-edge node` on their uplink: it removes the IPIP
//!   header of traffic to their pods, maps VIP:80 to pod:8080, and rewrites the
//!   replies back to VIP:80 (pods hold no VIP and run no BPF).

use std::path::{Path, PathBuf};

use super::addrs::Addrs;
use super::cmd::{run, run_in};
use super::netns::{self, Netns};
use super::{Error, Result, daemon};

/// MTU of the fabric (edges, ToR, nodes, pods), as in most datacenters: the IPIP
/// header's 20 bytes come out of the MSS, which the node agent clamps.
pub const FABRIC_MTU: u32 = 1500;

/// A built fabric.
#[derive(Debug)]
pub struct Topology {
    pub prefix: String,
    pub dir: PathBuf,
    pub addrs: Addrs,
    namespaces: Vec<Netns>,
    bpffs: Option<PathBuf>,
    keep: bool,
}

impl Topology {
    /// Builds the fabric for lab `prefix`, with its files (logs, configs, PID file,
    /// bpffs) in `dir`. Leftovers of an earlier run with the same prefix are removed.
    pub fn up(prefix: &str, dir: &Path, addrs: Addrs) -> Result<Topology> {
        teardown(prefix, dir);
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let mut t = Topology {
            prefix: prefix.to_string(),
            dir: dir.to_path_buf(),
            addrs,
            namespaces: Vec::new(),
            bpffs: None,
            keep: false,
        };
        t.build()?;
        Ok(t)
    }

    /// The namespace name of `role` (tor, client, edge1, edge2, node1, node2, pod1,
    /// pod2).
    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    /// The bpffs pin directory of edge `i` (1-based).
    pub fn pin_dir(&self, i: usize) -> PathBuf {
        self.dir.join("bpffs").join(format!("edge{i}"))
    }

    /// The bpffs pin directory of worker node `i` (1-based).
    pub fn node_pin_dir(&self, i: usize) -> PathBuf {
        self.dir.join("bpffs").join(format!("node{i}"))
    }

    fn build(&mut self) -> Result<()> {
        let a = self.addrs.clone();
        let xdp_pass = self.dir.join("xdp_floor.o");
        std::fs::write(&xdp_pass, ringlb_testkit::objects::XDP_FLOOR)
            .map_err(Error::io(format!("writing {}", xdp_pass.display())))?;
        let xdp_pass = xdp_pass.display().to_string();
        let edges: Vec<String> = (1..=a.edges.len()).map(|i| format!("edge{i}")).collect();
        let nodes: Vec<String> = (1..=a.nodes.len()).map(|i| format!("node{i}")).collect();
        let pods: Vec<String> = (1..=a.pods.len()).map(|i| format!("pod{i}")).collect();
        let mut roles = vec!["tor".to_string()];
        if a.uplink.is_none() {
            roles.push("client".to_string());
        }
        roles.extend(edges.iter().cloned());
        roles.extend(nodes.iter().cloned());
        roles.extend(pods.iter().cloned());
        for r in &roles {
            let ns = self.ns(r);
            self.namespaces.push(Netns::create(&ns)?);
            // before any link exists, so every device inherits it
            let rpf = if r == "tor" { "2" } else { "0" };
            netns::sysctls(
                &ns,
                &[
                    &format!("net.ipv4.conf.all.rp_filter={rpf}"),
                    &format!("net.ipv4.conf.default.rp_filter={rpf}"),
                ],
            )?;
        }
        let tor = self.ns("tor");
        netns::sysctls(
            &tor,
            &[
                "net.ipv4.ip_forward=1",
                "net.ipv4.fib_multipath_hash_policy=3",
                "net.ipv4.fib_multipath_hash_fields=0x0037",
            ],
        )?;

        // the client, or the uplink to a core router (which then takes the client's
        // address on this link, and is the ToR's way to everything else)
        let (far_ns, far_dev) = match &a.uplink {
            None => (self.ns("client"), "eth0".to_string()),
            Some(u) => (u.ns.clone(), u.ifname.clone()),
        };
        netns::veth(&far_ns, &far_dev, &tor, "ve-cl", 1500)?;
        netns::addr(&far_ns, &far_dev, &format!("{}/24", a.client))?;
        netns::addr(&tor, "ve-cl", &format!("{}/24", a.tor_client_side))?;
        match a.uplink {
            None => netns::default_route(&far_ns, &a.tor_client_side)?,
            Some(_) => netns::default_route(&tor, &a.client)?,
        }
        run_in(&far_ns, &["ethtool", "-K", &far_dev, "tx", "off"])?;

        // edges on br-lb
        let mut lb_ports = Vec::new();
        for (i, (role, ip)) in edges.iter().zip(&a.edges).enumerate() {
            let ns = self.ns(role);
            let port = format!("ve-e{}", i + 1);
            netns::veth(&ns, "eth0", &tor, &port, FABRIC_MTU)?;
            netns::addr(&ns, "eth0", &format!("{ip}/24"))?;
            netns::default_route(&ns, &a.tor_fabric)?;
            netns::sysctls(&ns, &["net.ipv4.ip_forward=1"])?;
            netns::xdp_pass(&tor, &port, &xdp_pass)?;
            lb_ports.push(port);
        }
        let lb_refs: Vec<&str> = lb_ports.iter().map(String::as_str).collect();
        netns::bridge(
            &tor,
            "br-lb",
            &format!("{}/24", a.tor_fabric),
            FABRIC_MTU,
            &lb_refs,
        )?;

        self.workers(&nodes, &pods)?;

        // evidence: forward-path counters in the ToR
        let rules = self.dir.join("tor.nft");
        std::fs::write(&rules, super::config::nft_ruleset(&a))
            .map_err(Error::io(format!("writing {}", rules.display())))?;
        run_in(&tor, &["nft", "-f", &rules.display().to_string()])?;

        // a private bpffs for the edges' pinned maps and links (`ip netns exec` remounts
        // /sys, so /sys/fs/bpf is not there inside a namespace)
        let bpffs = self.dir.join("bpffs");
        std::fs::create_dir_all(&bpffs)
            .map_err(Error::io(format!("creating {}", bpffs.display())))?;
        run(&["mount", "-t", "bpf", "bpf", &bpffs.display().to_string()])?;
        self.bpffs = Some(bpffs);
        Ok(())
    }

    /// The worker nodes on br-pod, each with its pod behind a veth (the node side is
    /// the pod's gateway, `.1` of the node's pod CIDR), and the ToR's route to each
    /// node's pod CIDR.
    fn workers(&self, nodes: &[String], pods: &[String]) -> Result<()> {
        let a = &self.addrs;
        let tor = self.ns("tor");
        let mut ports = Vec::new();
        for (i, role) in nodes.iter().enumerate() {
            let (node, pod) = (self.ns(role), self.ns(&pods[i]));
            let port = format!("ve-n{}", i + 1);
            netns::veth(&node, "eth0", &tor, &port, FABRIC_MTU)?;
            netns::addr(&node, "eth0", &format!("{}/24", a.nodes[i]))?;
            netns::default_route(&node, &a.tor_pod_side)?;
            netns::sysctls(&node, &["net.ipv4.ip_forward=1"])?;
            let gw = pod_gateway(&a.pod_cidrs[i])?;
            let prefix = a.pod_cidrs[i].rsplit('/').next().unwrap_or("24");
            netns::veth(&pod, "eth0", &node, &format!("v{}", pods[i]), FABRIC_MTU)?;
            netns::addr(&node, &format!("v{}", pods[i]), &format!("{gw}/{prefix}"))?;
            netns::addr(&pod, "eth0", &format!("{}/{prefix}", a.pods[i]))?;
            netns::default_route(&pod, &gw)?;
            ports.push(port);
        }
        let refs: Vec<&str> = ports.iter().map(String::as_str).collect();
        netns::bridge(
            &tor,
            "br-pod",
            &format!("{}/24", a.tor_pod_side),
            FABRIC_MTU,
            &refs,
        )?;
        for (cidr, node) in a.pod_cidrs.iter().zip(&a.nodes) {
            // onlink: the new bridge may not have carrier yet
            let route = ["route", "add", cidr, "via", node, "dev", "br-pod", "onlink"];
            run(&[&["ip", "-n", tor.as_str()][..], &route[..]].concat())?;
        }
        Ok(())
    }

    /// The ToR's nftables counters (packets per named counter).
    pub fn counters(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        nft_counters_in(&self.ns("tor"), "ringlb_lab")
    }

    /// Leaves everything in place when this value drops (`ringlb-lab up`).
    pub fn keep(&mut self) {
        self.keep = true;
        for n in &mut self.namespaces {
            n.keep();
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        self.namespaces.clear();
        if let Some(b) = self.bpffs.take() {
            let _ = run(&["umount", &b.display().to_string()]);
        }
        if std::thread::panicking() {
            eprintln!("lab files (logs, configs) kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The first address of a pod CIDR: the node side of its pods' veths.
fn pod_gateway(cidr: &str) -> Result<String> {
    let net: ipnetwork::Ipv4Network = cidr
        .parse()
        .map_err(|e| Error::Unsupported(format!("pod CIDR {cidr}: {e}")))?;
    Ok(std::net::Ipv4Addr::from(u32::from(net.network()) + 1).to_string())
}

/// Removes lab `prefix` completely: the daemons in `<dir>/pids`, every `<prefix>-*`
/// namespace with whatever still runs in it, the bpffs mount and `dir`. Safe to run on
/// a lab that is half built or already gone. Returns what it removed.
pub fn teardown(prefix: &str, dir: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    // the regions of a two-region lab: `<dir>/<name>` holds lab `<prefix>-<name>`
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let sub = entry.path();
        if sub.join("pids").is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            removed.extend(teardown(&format!("{prefix}-{name}"), &sub));
        }
    }
    let mut stopped = daemon::stop_recorded(dir);
    // the control plane's own processes, should its daemon have died without
    // stopping them (its folder is under the lab's: TMPDIR)
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("ringlb-cp-")
        {
            stopped += daemon::stop_recorded(&entry.path());
        }
    }
    if stopped > 0 {
        removed.push(format!("{stopped} daemons"));
    }
    removed.extend(netns::teardown_prefix(prefix));
    let bpffs = dir.join("bpffs");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let b = bpffs.display().to_string();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(b.as_str()))
    {
        let _ = run(&["umount", &b]);
        removed.push(b);
    }
    if dir.exists() && std::fs::remove_dir_all(dir).is_ok() {
        removed.push(dir.display().to_string());
    }
    removed
}

/// The nftables counters (packets per named counter) of table `inet TABLE` in
/// namespace `ns`.
pub(crate) fn nft_counters_in(
    ns: &str,
    table: &str,
) -> Result<std::collections::BTreeMap<String, u64>> {
    let out = run_in(
        ns,
        &["nft", "-j", "list", "counters", "table", "inet", table],
    )?;
    super::config::nft_counters(&out).map_err(|detail| Error::Parse {
        what: "nft -j list counters".into(),
        detail,
    })
}
