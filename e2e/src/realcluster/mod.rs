//! The real cluster: kubelets, containerd, the reference CNI plugins, kube-proxy and
//! CoreDNS on network-namespace nodes, behind a BIRD ToR, with ringlb installed by
//! `helm install` from the images built here (docs/real-cluster.md).
//!
//! ```text
//!                    client  10.211.1.2 / fd00:211:1::2   (tx checksum offload off)
//!                       |
//!  +------------------ tor ------------------------------------------------------+
//!  | BIRD 2 (AS 65000): static routes to every pod CIDR, eBGP v4 + v6 to the     |
//!  | edges, ECMP; kube-apiserver bridged to 172.31.0.254:6443; CoreDNS :53;      |
//!  | br-fab 172.31.0.254/24 fd00:31::fe/64 (edges' ports run an XDP pass program)|
//!  +------|--------------|------------------|------------------|-----------------+
//!        e1             e2                 w1                 w2        (Nodes)
//!   172.31.0.11    172.31.0.12        172.31.0.21        172.31.0.22
//!   each: own net + mount namespace, containerd, kubelet (system:node:<name>),
//!   kube-proxy, cni0 with the pods of 10.244.<i>.0/24 and fd00:10:244:<i>::/64;
//!   edges labelled ringlb.io/edge=true (the chart's edge DaemonSet runs there)
//! ```
//!
//! The control plane (etcd, kube-apiserver with the Node authorizer and
//! NodeRestriction, kube-controller-manager, kube-scheduler) runs on the host's
//! loopback ([`ringlb_controlplane`]); the nodes and pods reach it through a TCP
//! bridge in the ToR (the `kubernetes` Service's endpoint), and it reaches the
//! kubelets through an HTTP CONNECT proxy ([`egress`]).
//!
//! Modules: [`plan`] (addresses and every file written; pure), [`node`] (one node's
//! namespaces and programs), [`egress`] (the API server's way in).

pub mod conformance;
pub mod demo;
pub mod egress;
pub mod node;
pub mod plan;
pub mod traffic;
pub mod workload;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::controlplane::{Assets, ControlPlane, Options as CpOptions};
use crate::lab::bridge::Bridge;
use crate::lab::cmd::{run, run_in, which};
use crate::lab::daemon::Daemon;
use crate::lab::netns::{self, Netns};
use crate::lab::{Error, Result, wait_for};

pub use node::Node;
pub use plan::{Plan, ProxyMode};

/// What to bring up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace prefix, unique per cluster (tests put their PID in it).
    pub prefix: String,
    /// Logs, configurations, node folders.
    pub dir: PathBuf,
    pub edges: u8,
    pub workers: u8,
    pub proxy_mode: ProxyMode,
    /// Docker archives imported into every node besides pause and agnhost: ringlb's
    /// images (`make images`).
    pub images: Vec<PathBuf>,
}

impl Options {
    /// 2 edges, 2 workers, iptables kube-proxy, ringlb's images from `images/out`.
    pub fn new(prefix: &str, dir: &Path) -> Options {
        Options {
            prefix: prefix.to_string(),
            dir: dir.to_path_buf(),
            edges: 2,
            workers: 2,
            proxy_mode: ProxyMode::Iptables,
            images: ringlb_images(),
        }
    }
}

/// Why the real cluster cannot run here, if it cannot: not root, or a tool missing.
pub fn skip_reason() -> Option<String> {
    if let Some(r) = crate::lab::skip_reason() {
        return Some(r);
    }
    for tool in [
        "containerd",
        "runc",
        "ctr",
        "nsenter",
        "unshare",
        "iptables",
    ] {
        if which(tool).is_none() {
            return Some(format!(
                "`{tool}` is not installed (scripts/setup.sh installs it)"
            ));
        }
    }
    if !Path::new("/usr/lib/cni/bridge").is_file() {
        return Some(
            "the CNI plugins are not installed (containernetworking-plugins; scripts/setup.sh)"
                .into(),
        );
    }
    None
}

/// `images/out/ringlb-{controller,edge}-<version>.tar`, as `make images` writes them.
pub fn ringlb_images() -> Vec<PathBuf> {
    let out = std::env::var_os("RINGLB_IMAGES_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("images/out"));
    let v = env!("CARGO_PKG_VERSION");
    ["ringlb-controller", "ringlb-edge"]
        .iter()
        .map(|p| out.join(format!("{p}-{v}.tar")))
        .collect()
}

/// The folder `scripts/build-test-images.sh` writes pause and agnhost into.
pub fn test_images_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RINGLB_TEST_IMAGES") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    cache.join("ringlb").join(format!(
        "test-images-{}",
        crate::controlplane::kubernetes_version()
    ))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// Global sysctls the kubelet changes (`kernel.panic`, ...), restored on drop.
struct SavedSysctls(Vec<(PathBuf, String)>);

impl SavedSysctls {
    fn save() -> SavedSysctls {
        let keys = [
            "kernel/panic",
            "kernel/panic_on_oops",
            "vm/overcommit_memory",
            "kernel/keys/root_maxkeys",
            "kernel/keys/root_maxbytes",
        ];
        SavedSysctls(
            keys.iter()
                .filter_map(|k| {
                    let p = Path::new("/proc/sys").join(k);
                    std::fs::read_to_string(&p).ok().map(|v| (p, v))
                })
                .collect(),
        )
    }
}

impl Drop for SavedSysctls {
    fn drop(&mut self) {
        for (p, v) in &self.0 {
            let _ = std::fs::write(p, v);
        }
    }
}

/// A running cluster. Dropped in field order: the nodes (kubelets first, then
/// containers, kube-proxy, containerd), BIRD and CoreDNS, the bridges, the control
/// plane, the namespaces, then the kernel settings the kubelets changed. Its folder
/// is removed, except after a failure, when the logs and configurations stay (the
/// nodes' image stores go either way).
pub struct RealCluster {
    pub nodes: Vec<Node>,
    bird: Option<Daemon>,
    coredns: Option<Daemon>,
    _api_bridge: Bridge,
    _egress: egress::Egress,
    pub cp: ControlPlane,
    namespaces: Vec<Netns>,
    _sysctls: SavedSysctls,
    pub plan: Plan,
    pub dir: PathBuf,
    assets: Assets,
    /// Kubeconfigs that point at the API bridge (for programs inside the fabric).
    fabric_admin: PathBuf,
    proxy_kubeconfig: PathBuf,
    pub timings: Vec<(String, Duration)>,
}

impl RealCluster {
    /// Builds the fabric, starts the control plane, BIRD, CoreDNS and every node, and
    /// waits until every Node is Ready.
    pub async fn up(o: Options) -> Result<RealCluster> {
        if o.proxy_mode == ProxyMode::Ipvs && !Path::new("/proc/net/ip_vs").exists() {
            return Err(Error::Unsupported(
                "kube-proxy's ipvs mode needs the kernel's IPVS (ip_vs), which this kernel \
                 lacks; use iptables or nftables here (docs/real-cluster.md)"
                    .into(),
            ));
        }
        let images_dir = test_images_dir();
        let mut images = vec![images_dir.join("pause.tar"), images_dir.join("agnhost.tar")];
        images.extend(o.images.iter().cloned());
        if let Some(missing) = images.iter().find(|p| !p.is_file()) {
            return Err(Error::Unsupported(format!(
                "the image archive {} is missing: `make cluster-images` builds ringlb's \
                 images (images/out, or RINGLB_IMAGES_OUT) and pause and agnhost \
                 (scripts/build-test-images.sh, or RINGLB_TEST_IMAGES)",
                missing.display()
            )));
        }
        let assets = Assets::find()?;
        for p in ["kubelet", "kube-proxy", "coredns"] {
            if !assets.bin(p).is_file() {
                return Err(Error::MissingBinary {
                    name: p.into(),
                    searched: assets.dir.display().to_string(),
                    hint: "`make k8s` (scripts/build-k8s.sh)".into(),
                });
            }
        }
        node::mkdir(&o.dir)?;
        let plan = Plan::new(&o.prefix, o.edges, o.workers, o.proxy_mode);
        let mut timings = Vec::new();
        let t = Instant::now();
        let sysctls = SavedSysctls::save();
        let namespaces = fabric(&plan, &o.dir)?;
        timings.push(("fabric".to_string(), t.elapsed()));

        let t = Instant::now();
        let egress_sock = o.dir.join("egress.sock");
        let egress = egress::Egress::start(&egress_sock, &plan.ns("tor"))?;
        let egress_conf = o.dir.join("egress-selector.yaml");
        node::write(&egress_conf, &plan::egress_selector(&egress_sock))?;
        let sans: Vec<IpAddr> = vec![
            plan::TOR_V4.into(),
            plan::TOR_V6.into(),
            plan::KUBERNETES_V4.parse().expect("address"),
            plan::KUBERNETES_V6.parse().expect("address"),
        ];
        let cp = ControlPlane::start(CpOptions {
            extra_sans: sans,
            nodes: plan.nodes.iter().map(|n| n.name.clone()).collect(),
            scheduler: true,
            kcm_controllers: Some("*".into()),
            parent_dir: Some(o.dir.clone()),
            apiserver_args: vec![
                "--enable-admission-plugins=NodeRestriction".into(),
                format!("--egress-selector-config-file={}", egress_conf.display()),
                "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            ],
            ..CpOptions::default()
        })
        .await?;
        let listen = SocketAddr::new(plan::TOR_V4.into(), plan::API_PORT);
        let api_bridge = Bridge::start(&plan.ns("tor"), listen, cp.api_addr())?;
        let fabric_admin = o.dir.join("admin-fabric.kubeconfig");
        std::fs::copy(
            cp.kubeconfig_via(cp.kubeconfig_path(), listen)?,
            &fabric_admin,
        )
        .map_err(Error::io("writing the fabric admin kubeconfig"))?;
        let proxy_kubeconfig = o.dir.join("kube-proxy.kubeconfig");
        std::fs::copy(
            cp.kubeconfig_via(&cp.proxy_kubeconfig(), listen)?,
            &proxy_kubeconfig,
        )
        .map_err(Error::io("writing kube-proxy's kubeconfig"))?;
        cp.apply_yaml(&plan::cluster_services()).await?;
        timings.push(("control plane".to_string(), t.elapsed()));

        let mut rc = RealCluster {
            nodes: Vec::new(),
            bird: None,
            coredns: None,
            _api_bridge: api_bridge,
            _egress: egress,
            cp,
            namespaces,
            _sysctls: sysctls,
            plan,
            dir: o.dir.clone(),
            assets,
            fabric_admin,
            proxy_kubeconfig,
            timings,
        };
        rc.start_tor_daemons()?;
        let t = Instant::now();
        rc.start_nodes(&images).await?;
        rc.timings.push(("nodes Ready".to_string(), t.elapsed()));
        Ok(rc)
    }

    fn start_tor_daemons(&mut self) -> Result<()> {
        let tor = self.plan.ns("tor");
        let conf = self.dir.join("bird.conf");
        node::write(&conf, &plan::bird_conf(&self.plan))?;
        let sock = self.bird_sock();
        self.bird = Some(Daemon::spawn(
            &self.dir,
            "bird",
            Some(&tor),
            &["bird", "-f", "-c", &conf.display().to_string(), "-s", &sock],
            &[],
        )?);
        let corefile = self.dir.join("Corefile");
        node::write(&corefile, &plan::corefile(&self.fabric_admin))?;
        let coredns = self.assets.bin("coredns").display().to_string();
        self.coredns = Some(Daemon::spawn(
            &self.dir,
            "coredns",
            Some(&tor),
            &[&coredns, "-conf", &corefile.display().to_string()],
            &[],
        )?);
        Ok(())
    }

    fn bird_sock(&self) -> String {
        self.dir.join("bird.ctl").display().to_string()
    }

    async fn start_nodes(&mut self, images: &[PathBuf]) -> Result<()> {
        let listen = SocketAddr::new(plan::TOR_V4.into(), plan::API_PORT);
        for n in self.plan.nodes.clone() {
            let dir = self.dir.join(&n.name);
            let mut node = Node::prepare(&n, &self.plan.prefix, &dir)?;
            node.start_containerd()?;
            self.nodes.push(node);
        }
        // the image imports are the slow part: one thread per node
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .nodes
                .iter()
                .map(|n| s.spawn(move || n.import_images(images)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Unsupported("import thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<()>>>()
        })?;
        let kubelet = self.assets.bin("kubelet");
        let proxy = self.assets.bin("kube-proxy");
        for i in 0..self.nodes.len() {
            let name = self.nodes[i].plan.name.clone();
            let kc = self.dir.join(format!("node-{name}.kubeconfig"));
            std::fs::copy(
                self.cp
                    .kubeconfig_via(&self.cp.node_kubeconfig(&name), listen)?,
                &kc,
            )
            .map_err(Error::io(format!("writing {}", kc.display())))?;
            let ca = self.cp.ca_cert().to_path_buf();
            self.nodes[i].start_kubelet(&kubelet, &kc, &ca)?;
            let mode = self.plan.proxy_mode;
            let pkc = self.proxy_kubeconfig.clone();
            self.nodes[i].start_proxy(&proxy, &pkc, mode)?;
        }
        self.set_pod_cidrs().await?;
        self.wait_nodes_ready(Duration::from_secs(120))
    }

    /// Gives each Node its pod CIDRs (as kube-controller-manager's node IPAM would; the
    /// CNI configuration already uses them) once it has registered.
    async fn set_pod_cidrs(&mut self) -> Result<()> {
        for n in self.plan.nodes.clone() {
            let name = n.name.clone();
            wait_for(
                &format!("Node {name} to register"),
                Duration::from_secs(60),
                Duration::from_millis(250),
                || {
                    self.check_nodes()?;
                    Ok(self
                        .kubectl(&["get", "node", &name, "-o", "name"])
                        .map(|_| ())
                        .map_err(|e| e.to_string()))
                },
            )?;
            let patch = format!(
                r#"{{"spec":{{"podCIDR":"{}","podCIDRs":["{}","{}"]}}}}"#,
                n.pod_cidr_v4(),
                n.pod_cidr_v4(),
                n.pod_cidr_v6()
            );
            self.kubectl(&["patch", "node", &name, "--type", "merge", "-p", &patch])?;
        }
        Ok(())
    }

    fn wait_nodes_ready(&mut self, limit: Duration) -> Result<()> {
        let want = self.plan.nodes.len();
        wait_for(
            "every Node Ready",
            limit,
            Duration::from_millis(500),
            || {
                self.check_nodes()?;
                let out = self.kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
            ])?;
                let ready = out
                    .split_whitespace()
                    .filter(|w| w.ends_with("=True"))
                    .count();
                Ok(if ready == want { Ok(()) } else { Err(out) })
            },
        )
    }

    /// Are every node's programs, BIRD and CoreDNS still running?
    pub fn check_nodes(&mut self) -> Result<()> {
        for n in &mut self.nodes {
            n.check()?;
        }
        for d in [self.bird.as_mut(), self.coredns.as_mut()]
            .into_iter()
            .flatten()
        {
            d.check_alive()?;
        }
        Ok(())
    }

    /// `kubectl --kubeconfig <admin> ARGS`
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let kubectl = self.assets.kubectl().display().to_string();
        let kc = self.cp.kubeconfig_path().display().to_string();
        let mut argv = vec![kubectl.as_str(), "--kubeconfig", &kc];
        argv.extend_from_slice(args);
        run(&argv)
    }

    /// `helm --kubeconfig <admin> ARGS`
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let helm = self
            .assets
            .helm()
            .ok_or_else(|| Error::MissingBinary {
                name: "helm".into(),
                searched: self.assets.dir.display().to_string(),
                hint: "`make k8s` (scripts/build-k8s.sh)".into(),
            })?
            .display()
            .to_string();
        let kc = self.cp.kubeconfig_path().display().to_string();
        let mut argv = vec![helm.as_str(), "--kubeconfig", &kc];
        argv.extend_from_slice(args);
        run(&argv)
    }

    /// Writes the values file (with `extra` YAML appended), runs `helm install
    /// ringlb charts/ringlb -n ringlb-system -f <it> --wait` and waits until every pod
    /// of the release is Ready.
    pub fn helm_install(&self, extra: &str) -> Result<String> {
        let values = self.dir.join("values.yaml");
        node::write(&values, &plan::values_yaml(extra))?;
        let chart = repo_root().join("charts/ringlb");
        let out = self.helm(&[
            "install",
            "ringlb",
            &chart.display().to_string(),
            "-n",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "-f",
            &values.display().to_string(),
            "--wait",
            "--timeout",
            "180s",
        ])?;
        // helm's --wait counts a DaemonSet ready with maxUnavailable pods not ready
        self.kubectl(&[
            "wait",
            "--for=condition=Ready",
            "pods",
            "--all",
            "-n",
            RELEASE_NAMESPACE,
            "--timeout=120s",
        ])?;
        Ok(out)
    }

    /// `birdc -s <ToR socket> ARGS` in the ToR.
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let sock = self.bird_sock();
        let mut argv = vec!["birdc", "-s", sock.as_str()];
        argv.extend_from_slice(args);
        run_in(&self.plan.ns("tor"), &argv)
    }

    /// Runs `argv` in the client's namespace.
    pub fn client(&self, argv: &[&str]) -> Result<String> {
        run_in(&self.plan.ns("client"), argv)
    }

    /// `curl` from the client, 3 s at most.
    pub fn curl(&self, url: &str) -> Result<String> {
        self.client(&["curl", "-sS", "-g", "--max-time", "3", url])
    }

    /// The next hops of `prefix` in the ToR's kernel table.
    pub fn tor_next_hops(&self, prefix: &str, v6: bool) -> Result<Vec<IpAddr>> {
        let fam = if v6 { "-6" } else { "-4" };
        let out = run_in(
            &self.plan.ns("tor"),
            &["ip", fam, "-j", "route", "show", prefix],
        )?;
        crate::lab::config::kernel_next_hops(&out).map_err(|detail| Error::Parse {
            what: format!("ip -j route show {prefix}"),
            detail,
        })
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.plan.name == name)
    }

    pub fn node_mut(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.plan.name == name)
    }

    pub fn assets(&self) -> &Assets {
        &self.assets
    }

    /// Restarts node `name`'s kubelet (SIGKILL, then start).
    pub fn restart_kubelet(&mut self, name: &str) -> Result<()> {
        // the node's kubeconfig as start_nodes wrote it (through the API bridge)
        let kc = self.dir.join(format!("node-{name}.kubeconfig"));
        let kubelet = self.assets.bin("kubelet");
        let ca = self.cp.ca_cert().to_path_buf();
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.plan.name == name)
            .ok_or_else(|| Error::Unsupported(format!("no node {name}")))?;
        node.restart_kubelet(&kubelet, &kc, &ca)
    }

    /// The last `n` lines of BIRD's, CoreDNS's and every node program's log.
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for name in ["bird", "coredns"] {
            out.push_str(&format!(
                "---- {name} ----\n{}\n",
                crate::lab::daemon::tail(&self.dir.join(format!("{name}.log")), n)
            ));
        }
        for node in &self.nodes {
            for p in ["kubelet", "containerd", "kube-proxy"] {
                out.push_str(&format!(
                    "---- {} {p} ----\n{}\n",
                    node.plan.name,
                    crate::lab::daemon::tail(&node.dir.join(format!("{p}.log")), n)
                ));
            }
        }
        out
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "real cluster files (logs, configurations) in {}",
                self.dir.display()
            );
            eprintln!("{}", self.log_tails(15));
        }
        let node_dirs: Vec<PathBuf> = self.nodes.iter().map(|n| n.dir.clone()).collect();
        self.nodes.clear();
        self.namespaces.clear();
        // the nodes' containerd folders hold the unpacked images (about 0.7 GB a node):
        // never left behind; the rest (logs, configurations) only after a failure
        for d in node_dirs {
            remove_dir_soon(&d.join("containerd"));
        }
        if !std::thread::panicking() {
            remove_dir_soon(&self.dir);
        }
    }
}

/// Removes `dir`, retrying for a few seconds: the containers' overlay mounts go with
/// their node's mount namespace, which the kernel frees a moment after its last
/// process has exited (until then removing their folders fails with EBUSY).
fn remove_dir_soon(dir: &Path) {
    for _ in 0..20 {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("real cluster: could not remove {}: {e}", dir.display());
    }
}

/// What a `ringlb-lab` command on the real cluster does first: refuse with the
/// reason where the cluster cannot run, parse kube-proxy's `mode`, sweep what an
/// earlier run under `prefix` left, and start the runtime the cluster runs on.
pub fn cli_start(
    prefix: &str,
    dir: &Path,
    mode: &str,
) -> Result<(ProxyMode, tokio::runtime::Runtime)> {
    if let Some(why) = skip_reason() {
        return Err(Error::Unsupported(why));
    }
    let proxy_mode: ProxyMode = mode.parse().map_err(Error::Unsupported)?;
    teardown(prefix, dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(Error::io("starting the runtime"))?;
    Ok((proxy_mode, rt))
}

/// Removes real cluster `prefix` completely, also what a crashed run left: the
/// nodes' containers, every daemon recorded under `dir`, the `<prefix>-*`
/// namespaces, the nodes' mount namespaces and cgroups, and `dir`.
pub fn teardown(prefix: &str, dir: &Path) -> Vec<String> {
    let nodes = node::leftovers(prefix);
    for ns in &nodes {
        node::kill_containers(ns);
    }
    let mut removed = crate::lab::topology::teardown(prefix, dir);
    for ns in &nodes {
        node::release(ns);
        removed.push(format!("node {ns}"));
    }
    removed
}

/// The release namespace the harness installs the chart into.
pub const RELEASE_NAMESPACE: &str = "ringlb-system";

/// The namespaces, links, addresses, routes and sysctls of [`plan`]'s fabric.
fn fabric(p: &Plan, dir: &Path) -> Result<Vec<Netns>> {
    let tor = p.ns("tor");
    let client = p.ns("client");
    let mut namespaces = Vec::new();
    let mut roles = vec![tor.clone(), client.clone()];
    roles.extend(p.nodes.iter().map(|n| p.ns(&n.name)));
    for ns in &roles {
        namespaces.push(Netns::create(ns)?);
        let rpf = if *ns == tor { "2" } else { "0" };
        netns::sysctls(
            ns,
            &[
                &format!("net.ipv4.conf.all.rp_filter={rpf}"),
                &format!("net.ipv4.conf.default.rp_filter={rpf}"),
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ],
        )?;
    }
    netns::sysctls(
        &tor,
        &[
            "net.ipv4.fib_multipath_hash_policy=1",
            "net.ipv6.fib_multipath_hash_policy=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        ],
    )?;
    // the client
    netns::veth(&client, "eth0", &tor, "p-client", 1500)?;
    netns::addr(&client, "eth0", &format!("{}/24", plan::CLIENT_V4))?;
    netns::addr(&client, "eth0", &format!("{}/64", plan::CLIENT_V6))?;
    netns::addr(&tor, "p-client", &format!("{}/24", plan::TOR_CLIENT_V4))?;
    netns::addr(&tor, "p-client", &format!("{}/64", plan::TOR_CLIENT_V6))?;
    netns::default_route(&client, &plan::TOR_CLIENT_V4.to_string())?;
    run(&[
        "ip",
        "-n",
        &client,
        "-6",
        "route",
        "add",
        "default",
        "via",
        &plan::TOR_CLIENT_V6.to_string(),
    ])?;
    // XDP_TX loses CHECKSUM_PARTIAL: the client computes its checksums itself
    run_in(&client, &["ethtool", "-K", "eth0", "tx", "off"])?;

    // the nodes on br-fab
    let pass = dir.join("xdp_pass.o");
    std::fs::write(&pass, ringlb_testkit::objects::XDP_FLOOR)
        .map_err(Error::io(format!("writing {}", pass.display())))?;
    let pass = pass.display().to_string();
    let mut ports = Vec::new();
    for n in &p.nodes {
        let ns = p.ns(&n.name);
        let port = n.tor_port();
        netns::veth(&ns, "eth0", &tor, &port, 1500)?;
        netns::addr(&ns, "eth0", &format!("{}/24", n.v4))?;
        netns::addr(&ns, "eth0", &format!("{}/64", n.v6))?;
        netns::default_route(&ns, &plan::TOR_V4.to_string())?;
        run(&[
            "ip",
            "-n",
            &ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &plan::TOR_V6.to_string(),
        ])?;
        if n.edge {
            netns::xdp_pass(&tor, &port, &pass)?;
        }
        ports.push(port);
    }
    let refs: Vec<&str> = ports.iter().map(String::as_str).collect();
    netns::bridge(&tor, "br-fab", &format!("{}/24", plan::TOR_V4), 1500, &refs)?;
    netns::addr(&tor, "br-fab", &format!("{}/64", plan::TOR_V6))?;
    Ok(namespaces)
}
