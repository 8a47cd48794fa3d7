//! One node of the real cluster: its own network namespace (`<prefix>-<name>`) and
//! mount namespace, with its own containerd, kubelet and kube-proxy.
//!
//! The mount namespace is a slave of the host's, held open by a bind mount at
//! `/run/ringlb-lab-mnt/<prefix>-<name>`, and every program of the node is started
//! with `nsenter --net=... --mount=...` (not `ip netns exec`, which remounts /sys and
//! hides the cgroup mounts that runc and the kubelet need). Inside it the node gets
//! what a machine has to itself: a bpffs at /sys/fs/bpf (ringlb's pins), /var/log/pods
//! and /var/log/containers (kubelets that share them delete each other's logs),
//! /var/lib/cni and /run/netns (the pods' network namespaces).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::plan::{self, NodePlan, ProxyMode};
use crate::lab::cmd::run;
use crate::lab::daemon::{self, Daemon};
use crate::lab::{Error, Result};

/// Where the nodes' mount namespaces are held (a private mount, so the bind mounts
/// of namespace files do not propagate back into themselves).
const MNT_ROOT: &str = "/run/ringlb-lab-mnt";
/// The cgroup v1 controllers a node's cgroup root is created in.
const CGROUP_CONTROLLERS: [&str; 9] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
];
/// The folders a node mounts privately over the host's, inside its mount namespace.
/// The kubelet's device-plugin socket is at a fixed path whatever `--root-dir` says:
/// kubelets sharing it race to bind it and the loser exits.
const PRIVATE_DIRS: [&str; 5] = [
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/netns",
    "/var/lib/kubelet/device-plugins",
];

/// A node's programs (each stopped on drop) and its namespaces' handles.
pub struct Node {
    pub plan: NodePlan,
    /// `<prefix>-<name>`: the network namespace, and the mount namespace's file name.
    pub ns: String,
    pub dir: PathBuf,
    mnt: PathBuf,
    cgroup_root: String,
    containerd: Option<Daemon>,
    kubelet: Option<Daemon>,
    proxy: Option<Daemon>,
}

impl Node {
    /// Writes the node's configuration and creates its mount namespace and cgroup root.
    /// The network namespace must exist.
    pub fn prepare(plan: &NodePlan, prefix: &str, dir: &Path) -> Result<Node> {
        let ns = format!("{prefix}-{}", plan.name);
        let node = Node {
            plan: plan.clone(),
            mnt: Path::new(MNT_ROOT).join(&ns),
            cgroup_root: format!("/{ns}"),
            ns,
            dir: dir.to_path_buf(),
            containerd: None,
            kubelet: None,
            proxy: None,
        };
        for d in [
            "containerd/root",
            "containerd/state",
            "cni/net.d",
            "cni/ipam",
            "kubelet",
        ] {
            mkdir(&dir.join(d))?;
        }
        let default = run(&["containerd", "config", "default"])?;
        let config = plan::containerd_config(&default, dir).map_err(Error::Unsupported)?;
        write(&dir.join("containerd.toml"), &config)?;
        write(
            &dir.join("cni/net.d/10-ringlb-lab.conflist"),
            &plan::cni_conflist(plan, dir),
        )?;
        node.mount_namespace()?;
        for c in CGROUP_CONTROLLERS {
            let d = Path::new("/sys/fs/cgroup").join(c);
            if d.is_dir() {
                mkdir(&d.join(&node.ns))?;
            }
        }
        Ok(node)
    }

    fn mount_namespace(&self) -> Result<()> {
        let root = Path::new(MNT_ROOT);
        mkdir(root)?;
        if !is_mountpoint(root) {
            let r = root.display().to_string();
            run(&["mount", "--bind", &r, &r])?;
            run(&["mount", "--make-private", &r])?;
        }
        write(&self.mnt, "")?;
        // shared, as on a systemd host: the chart mounts /sys/fs/bpf into its pods with
        // Bidirectional and HostToContainer propagation, which runc refuses on a
        // private mount
        let fs = if self.plan.bpffs { "bpf" } else { "tmpfs" };
        let mut script = format!(
            "set -e; mount --make-rshared /; mount -t {fs} {fs} /sys/fs/bpf; \
             mount --make-shared /sys/fs/bpf; "
        );
        for d in PRIVATE_DIRS {
            let own = self.dir.join(format!("private{d}"));
            mkdir(&own)?;
            mkdir(Path::new(d))?;
            script.push_str(&format!("mount --bind {} {d}; ", own.display()));
        }
        run(&[
            "unshare",
            &format!("--mount={}", self.mnt.display()),
            "--propagation",
            "slave",
            "sh",
            "-c",
            &script,
        ])?;
        Ok(())
    }

    /// `nsenter NET MNT -- argv...`: `net` and `mnt` are the `--net=`/`--mount=`
    /// flags naming this node's namespaces.
    fn argv<'a>(net: &'a str, mnt: &'a str, argv: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["nsenter", net, mnt, "--"];
        v.extend_from_slice(argv);
        v
    }

    fn spawn(&self, name: &str, argv: &[&str]) -> Result<Daemon> {
        let net = format!("--net=/run/netns/{}", self.ns);
        let mnt = format!("--mount={}", self.mnt.display());
        let full = Self::argv(&net, &mnt, argv);
        Ok(Daemon::spawn(&self.dir, name, None, &full, &[])?)
    }

    /// Runs `argv` inside this node's namespaces and returns its output.
    pub fn exec(&self, argv: &[&str]) -> Result<String> {
        let net = format!("--net=/run/netns/{}", self.ns);
        let mnt = format!("--mount={}", self.mnt.display());
        run(&Self::argv(&net, &mnt, argv))
    }

    fn sock(&self) -> String {
        self.dir.join("containerd.sock").display().to_string()
    }

    /// `ctr --address <this node's socket> -n k8s.io ARGS`
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let sock = self.sock();
        let mut argv = vec!["ctr", "--address", &sock, "-n", "k8s.io"];
        argv.extend_from_slice(args);
        run(&argv)
    }

    /// Starts containerd and waits until it answers.
    pub fn start_containerd(&mut self) -> Result<()> {
        let config = self.dir.join("containerd.toml").display().to_string();
        let d = self.spawn("containerd", &["containerd", "--config", &config])?;
        self.containerd = Some(d);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if let Some(d) = self.containerd.as_mut() {
                d.check_alive()?;
            }
            if Instant::now() > until {
                return Err(Error::Unsupported(format!(
                    "containerd of node {} did not answer in 30 s; log {}",
                    self.plan.name,
                    self.dir.join("containerd.log").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Imports docker archives into containerd's `k8s.io` namespace (the kubelet's).
    ///
    /// `--no-unpack`: only the blobs are written; the CRI plugin unpacks an image
    /// into the snapshotter when it first creates a container of it on this node,
    /// so a node unpacks only the images it runs (the two controller replicas run
    /// on two of the four nodes, for one).
    pub fn import_images(&self, tars: &[PathBuf]) -> Result<()> {
        for t in tars {
            self.ctr(&["images", "import", "--no-unpack", &t.display().to_string()])?;
        }
        Ok(())
    }

    /// Starts the kubelet with this node's credential (`system:node:<name>`).
    pub fn start_kubelet(&mut self, bin: &Path, kubeconfig: &Path, ca: &Path) -> Result<()> {
        let config = self.dir.join("kubelet.yaml");
        write(
            &config,
            &plan::kubelet_config(&self.plan, &self.dir, &self.cgroup_root, ca),
        )?;
        let root = self.dir.join("kubelet");
        let node_ip = format!("--node-ip={},{}", self.plan.v4, self.plan.v6);
        let mut argv: Vec<String> = vec![
            bin.display().to_string(),
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", root.display()),
            format!("--cert-dir={}", root.join("pki").display()),
            format!("--hostname-override={}", self.plan.name),
            node_ip,
            "--v=1".into(),
        ];
        if self.plan.edge {
            argv.push("--node-labels=ringlb.io/edge=true".into());
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.kubelet = Some(self.spawn("kubelet", &argv)?);
        Ok(())
    }

    /// Starts kube-proxy in `mode` (credential `system:kube-proxy`).
    pub fn start_proxy(&mut self, bin: &Path, kubeconfig: &Path, mode: ProxyMode) -> Result<()> {
        let argv: Vec<String> = vec![
            bin.display().to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={}", self.plan.name),
            format!("--proxy-mode={}", mode.as_str()),
            format!("--cluster-cidr={}", plan::CLUSTER_CIDRS),
            "--conntrack-max-per-core=0".into(),
            "--oom-score-adj=0".into(),
            // every node address, iptables mode's default: nftables mode defaults to
            // the node's primary IP of each family, so an IPv4 Service's NodePorts and
            // health-check node port would not answer on a dual-stack node's IPv6
            // address, which Kubernetes' e2e tests probe (docs/conformance.md)
            "--nodeport-addresses=0.0.0.0/0,::/0".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--v=1".into(),
        ];
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.proxy = Some(self.spawn("kube-proxy", &argv)?);
        Ok(())
    }

    /// Are this node's programs still running? An error with the log tail if not.
    pub fn check(&mut self) -> Result<()> {
        for d in [
            self.containerd.as_mut(),
            self.kubelet.as_mut(),
            self.proxy.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            d.check_alive()?;
        }
        Ok(())
    }

    /// Kills the kubelet (SIGKILL) and starts it again, as a crash and a supervisor would.
    pub fn restart_kubelet(&mut self, bin: &Path, kubeconfig: &Path, ca: &Path) -> Result<()> {
        if let Some(mut d) = self.kubelet.take() {
            d.kill();
        }
        self.start_kubelet(bin, kubeconfig, ca)
    }

    /// Kills containerd (SIGKILL; the containers' shims and the containers keep
    /// running, as on a real node) and starts it again.
    pub fn restart_containerd(&mut self) -> Result<()> {
        if let Some(mut d) = self.containerd.take() {
            d.kill();
        }
        self.start_containerd()
    }

    /// Stops everything of this node: the kubelet first (so it restarts nothing), the
    /// containers, kube-proxy and containerd (with its shims: they share its network
    /// namespace), then the mount namespace and the cgroups.
    pub fn teardown(&mut self) {
        if let Some(mut d) = self.kubelet.take() {
            d.stop(Duration::from_secs(2));
        }
        kill_containers(&self.ns);
        for d in [self.proxy.take(), self.containerd.take()]
            .into_iter()
            .flatten()
        {
            let mut d = d;
            d.stop(Duration::from_secs(2));
        }
        release(&self.ns);
    }
}

/// Kills every process in node `ns`'s cgroup root (its pods' containers).
pub(super) fn kill_containers(ns: &str) {
    for _ in 0..3 {
        let pids = cgroup_pids(&Path::new("/sys/fs/cgroup/pids").join(ns));
        if pids.is_empty() {
            return;
        }
        for p in pids {
            daemon::signal(p, "KILL");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// After its programs stopped: kills what is left in node `ns`'s network namespace
/// (the containers' shims), releases its mount namespace and removes its cgroups.
pub(super) fn release(ns: &str) {
    for p in crate::lab::netns::pids(ns) {
        daemon::signal(p, "KILL");
    }
    let mnt = Path::new(MNT_ROOT).join(ns);
    if mnt.exists() {
        let m = mnt.display().to_string();
        let _ = run(&["umount", "-l", &m]);
        let _ = std::fs::remove_file(&mnt);
    }
    for c in CGROUP_CONTROLLERS {
        remove_cgroup(&Path::new("/sys/fs/cgroup").join(c).join(ns));
    }
}

/// The names of the nodes' namespaces whose mount namespace or cgroup root is left
/// for prefix `prefix` (a crashed run).
pub(super) fn leftovers(prefix: &str) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for dir in [Path::new(MNT_ROOT), Path::new("/sys/fs/cgroup/pids")] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{prefix}-")) {
                out.insert(name);
            }
        }
    }
    out.into_iter().collect()
}

/// Every PID in a cgroup v1 folder and its children.
fn cgroup_pids(root: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
        let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
        pids.extend(
            procs
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids
}

impl Drop for Node {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Removes a cgroup v1 folder and its children, deepest first (a cgroup folder is
/// removed with rmdir, never with its files).
fn remove_cgroup(d: &Path) {
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            remove_cgroup(&e.path());
        }
    }
    let _ = std::fs::remove_dir(d);
}

fn is_mountpoint(p: &Path) -> bool {
    let p = p.display().to_string();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(p.as_str()))
}

pub(super) fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).map_err(Error::io(format!("creating {}", p.display())))
}

pub(super) fn write(p: &Path, text: &str) -> Result<()> {
    std::fs::write(p, text).map_err(Error::io(format!("writing {}", p.display())))
}
