//! The programs on the fabric: the real Kubernetes control plane (`ringlb-lab
//! control-plane`, see [`super::api`]) bridged to the ToR's fabric address, the
//! controller in the ToR namespace (the edges reach the API over the fabric), BIRD as
//! the ToR, one `ringlb-edge run` per edge, one `ringlb-edge node` per worker node,
//! `ringlb-lab pod-http` per pod, and the built kubectl. Only real programs run here: the project's, BIRD and Kubernetes'.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::addrs::Addrs;
use super::cmd::{run_in, run_in_env};
use super::daemon::Daemon;
use super::topology::{FABRIC_MTU, Topology};
use super::{Error, Result, api, config, wait_for};

/// The `-o` of `kubectl get bgppeers`: one line per node, its session state and how
/// many routes it advertises.
pub const PEER_STATUS: &str = r#"jsonpath={range .status.nodes[*]}{.node}{"  "}{.state}{"  advertised="}{.advertised}{"\n"}{end}"#;

/// The port of the edges' HTTP server (`--metrics-addr 0.0.0.0:PORT`: /metrics and
/// the per-VIP health endpoint, reachable over the fabric, where a GTM probes it).
pub const EDGE_HTTP_PORT: u16 = 9090;

/// Where the project's binaries and the built kubectl are.
#[derive(Debug, Clone)]
pub struct Bins {
    /// kubectl from the control-plane assets (`make k8s`), never one from PATH.
    pub kubectl: PathBuf,
    pub controller: PathBuf,
    pub edge: PathBuf,
    pub lab: PathBuf,
}

impl Bins {
    /// Looks in `$RINGLB_BIN_DIR`, then next to the running program and one level up
    /// (a test runs from `target/debug/deps`, its binaries are in `target/debug`).
    pub fn discover() -> Result<Bins> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(d) = std::env::var_os("RINGLB_BIN_DIR") {
            dirs.push(d.into());
        }
        if let Ok(exe) = std::env::current_exe()
            && let Some(d) = exe.parent()
        {
            dirs.push(d.to_path_buf());
            if let Some(up) = d.parent() {
                dirs.push(up.to_path_buf());
            }
        }
        Self::find_in(&dirs)
    }

    /// For the lab's integration tests: looks in `$RINGLB_BIN_DIR`, then beside
    /// `lab_bin` (the test's `env!("CARGO_BIN_EXE_ringlb-lab")`).
    pub fn beside(lab_bin: &Path) -> Result<Bins> {
        let mut dirs = vec![lab_bin.parent().unwrap_or(Path::new(".")).to_path_buf()];
        if let Some(d) = std::env::var_os("RINGLB_BIN_DIR") {
            dirs.insert(0, d.into());
        }
        Self::find_in(&dirs)
    }

    /// Finds the project's three binaries in the first of `dirs` that has them, and
    /// kubectl among the control-plane assets.
    pub fn find_in(dirs: &[PathBuf]) -> Result<Bins> {
        let find = |name: &str| -> Result<PathBuf> {
            dirs.iter()
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| Error::MissingBinary {
                    name: name.into(),
                    searched: dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    hint: "cargo build -p ringlb-e2e -p ringlb-controller -p ringlb-edge --bins"
                        .into(),
                })
        };
        let assets = crate::controlplane::Assets::find().map_err(|e| Error::MissingBinary {
            name: "kubectl".into(),
            searched: e.to_string(),
            hint: "make k8s".into(),
        })?;
        Ok(Bins {
            kubectl: assets.kubectl(),
            controller: find("ringlb-controller")?,
            edge: find("ringlb-edge")?,
            lab: find("ringlb-lab")?,
        })
    }
}

/// The datapath the lab's edges run (`ringlb-edge run --datapath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeDatapath {
    /// Native XDP on eth0 (the namespace lab, `make demo`).
    Xdp,
    /// Kernel IPVS with the `mh` scheduler and IPIP tunnels (the IPVS lab in a VM).
    Ipvs,
}

/// The running programs of one lab; every daemon stops when this drops (and its log
/// tail is printed when the drop happens during a panic, i.e. a failed test).
#[derive(Debug)]
pub struct Cluster {
    pub prefix: String,
    pub dir: PathBuf,
    pub addrs: Addrs,
    pub bins: Bins,
    pub daemons: Vec<Daemon>,
    pub edge_datapath: EdgeDatapath,
    /// The XDP edges' `--failover-senders`: the other region's edges (empty:
    /// no failover traffic accepted, as the flag's default).
    pub failover_senders: Vec<String>,
    keep: bool,
}

impl Cluster {
    pub fn new(topo: &Topology, bins: Bins) -> Cluster {
        Cluster {
            prefix: topo.prefix.clone(),
            dir: topo.dir.clone(),
            addrs: topo.addrs.clone(),
            bins,
            daemons: Vec::new(),
            edge_datapath: EdgeDatapath::Xdp,
            failover_senders: Vec::new(),
            keep: false,
        }
    }

    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    /// The admin kubeconfig (for kubectl), at the ToR's bridge address.
    pub fn kubeconfig(&self) -> PathBuf {
        api::admin_kubeconfig(&self.dir)
    }

    /// The controller's kubeconfig: ServiceAccount ringlb-controller (chart RBAC).
    pub fn controller_kubeconfig(&self) -> PathBuf {
        api::sa_kubeconfig(&self.dir, api::CONTROLLER_SA)
    }

    /// The edges' kubeconfig: ServiceAccount ringlb-edge (chart RBAC).
    pub fn edge_kubeconfig(&self) -> PathBuf {
        api::sa_kubeconfig(&self.dir, api::EDGE_SA)
    }

    /// The node agents' kubeconfig: ServiceAccount ringlb-node (chart RBAC).
    pub fn node_kubeconfig(&self) -> PathBuf {
        api::sa_kubeconfig(&self.dir, api::NODE_SA)
    }

    fn bird_ctl(&self) -> String {
        self.dir.join("bird.ctl").display().to_string()
    }

    fn spawn(&mut self, name: &str, role: &str, argv: &[&str]) -> Result<()> {
        let d = Daemon::spawn(&self.dir, name, Some(&self.ns(role)), argv, &[])?;
        self.daemons.push(d);
        Ok(())
    }

    /// An error naming the first daemon that exited, with its log.
    pub fn check_daemons(&mut self) -> Result<()> {
        Ok(self.daemons.iter_mut().try_for_each(Daemon::check_alive)?)
    }

    /// [`wait_for`] that fails at once when one of the lab's daemons has exited
    /// (waiting longer cannot help then): they are checked before every try of `f`.
    fn wait_checked<T>(
        &mut self,
        what: &str,
        limit: Duration,
        every: Duration,
        mut f: impl FnMut(&Self) -> Result<Result<T, String>>,
    ) -> Result<T> {
        wait_for(what, limit, every, || {
            self.check_daemons()?;
            f(self)
        })
    }

    /// `ringlb-lab pod-http` in every pod namespace, on 0.0.0.0:TARGET_PORT (the node
    /// agent maps the Service port to it).
    pub fn start_pods(&mut self) -> Result<()> {
        (1..=self.addrs.pods.len()).try_for_each(|i| self.start_pod(i))
    }

    /// `ringlb-lab pod-http` in pod namespace `i` (1-based), replacing one that exited.
    pub fn start_pod(&mut self, i: usize) -> Result<()> {
        let lab = self.bins.lab.display().to_string();
        let listen = format!("0.0.0.0:{}", self.addrs.target_port);
        let name = format!("pod{i}");
        self.daemons.retain_mut(|d| d.name != name || d.alive());
        self.spawn(
            &name,
            &name,
            &[&lab, "pod-http", "--listen", &listen, "--name", &name],
        )
    }

    /// Tells the lab kubelet whether the pods of Deployment `app` pass their
    /// readiness probe (annotation [`crate::controlplane::kubelet::READY_ANNOTATION`]): what a
    /// kubelet reports when a pod's process dies or comes back.
    pub fn set_pods_ready(&self, app: &str, ready: bool) -> Result<String> {
        let ann = format!("{}={ready}", crate::controlplane::kubelet::READY_ANNOTATION);
        let sel = format!("app={app}");
        self.kubectl(&["annotate", "pods", "-l", &sel, &ann, "--overwrite"])
    }

    /// BIRD in the ToR namespace; waits until `birdc` answers.
    pub fn start_bird(&mut self) -> Result<()> {
        let conf = self.dir.join("bird.conf");
        std::fs::write(&conf, config::bird_conf(&self.addrs))
            .map_err(Error::io(format!("writing {}", conf.display())))?;
        let (conf, ctl) = (conf.display().to_string(), self.bird_ctl());
        self.spawn("bird", "tor", &["bird", "-f", "-c", &conf, "-s", &ctl])?;
        self.wait_checked(
            "BIRD to answer on its control socket",
            Duration::from_secs(10),
            Duration::from_millis(100),
            |this| Ok(this.birdc(&["show", "status"]).map_err(|e| e.to_string())),
        )
        .map(|_| ())
    }

    /// The command line [`Cluster::birdc`] runs, for a person to paste into a root
    /// shell: `ip netns exec <tor> /usr/sbin/birdc -s <ctl> ARGS`.
    pub fn birdc_shown(&self, args: &str) -> String {
        let birdc = super::cmd::which("birdc").map_or("birdc".into(), |p| p.display().to_string());
        format!(
            "ip netns exec {} {birdc} -s {} {args}",
            self.ns("tor"),
            self.bird_ctl()
        )
    }

    /// The command line [`Cluster::kubectl`] runs, for a person to paste into a root
    /// shell: `ip netns exec <tor> <kubectl> --kubeconfig <admin> ARGS`.
    pub fn kubectl_shown(&self, args: &str) -> String {
        format!(
            "ip netns exec {} {} --kubeconfig {} {args}",
            self.ns("tor"),
            self.bins.kubectl.display(),
            self.kubeconfig().display()
        )
    }

    /// `birdc -s <ctl> ARGS` in the ToR namespace.
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let ctl = self.bird_ctl();
        let mut argv = vec!["birdc", "-s", &ctl];
        argv.extend_from_slice(args);
        run_in(&self.ns("tor"), &argv)
    }

    /// The real control plane (`ringlb-lab control-plane` on the host, a daemon of
    /// this lab) with the lab kubelet, bridged to the ToR's fabric address; waits until
    /// it wrote the kubeconfigs and kubectl gets through the bridge.
    pub fn start_control_plane(&mut self) -> Result<()> {
        let lab = self.bins.lab.display().to_string();
        let dir = self.dir.display().to_string();
        let (net, edges, nodes) = (
            self.addrs.net.to_string(),
            self.addrs.edges.len().to_string(),
            self.addrs.nodes.len().to_string(),
        );
        let ready = self.dir.join(api::READY_FILE);
        let _ = std::fs::remove_file(&ready);
        // TMPDIR: the control plane's folder (PKI, etcd data, its PID file) goes under
        // the lab's, where `ringlb-lab down` finds it
        let d = Daemon::spawn(
            &self.dir,
            "control-plane",
            None,
            &[
                &lab,
                "--prefix",
                &self.prefix,
                "--dir",
                &dir,
                "control-plane",
                "--net",
                &net,
                "--edges",
                &edges,
                "--nodes",
                &nodes,
            ],
            &[("TMPDIR", &dir)],
        )?;
        self.daemons.push(d);
        self.wait_checked(
            "the control plane to start",
            Duration::from_secs(90),
            Duration::from_millis(100),
            |this| {
                if !ready.exists() {
                    return Ok(Err("not ready yet".into()));
                }
                Ok(this
                    .kubectl(&["get", "--raw", "/readyz"])
                    .map_err(|e| e.to_string()))
            },
        )
        .map(|_| ())
    }

    /// The controller in the ToR namespace (one replica, no leader election), as
    /// ServiceAccount ringlb-controller.
    pub fn start_controller(&mut self) -> Result<()> {
        let ctl = self.bins.controller.display().to_string();
        let kubeconfig = self.controller_kubeconfig().display().to_string();
        self.spawn(
            "controller",
            "tor",
            &[
                &ctl,
                "--kubeconfig",
                &kubeconfig,
                "--metrics-addr",
                "127.0.0.1:9091",
                "--leader-elect=false",
            ],
        )
    }

    /// One `ringlb-edge run` per edge namespace: native XDP on eth0, maps pinned in the
    /// lab's bpffs, BGP peers from the BGPPeer objects; as ServiceAccount ringlb-edge.
    pub fn start_edges(&mut self, pin_dirs: &[PathBuf]) -> Result<()> {
        for (i, pin) in pin_dirs.iter().enumerate() {
            self.start_edge(i + 1, pin)?;
        }
        Ok(())
    }

    /// `ringlb-edge run` in edge `i` (1-based), replacing an earlier one that exited.
    pub fn start_edge(&mut self, i: usize, pin_dir: &Path) -> Result<()> {
        self.start_edge_with(i, pin_dir, &[])
    }

    /// [`Cluster::start_edge`] with more `run` flags (e.g. `--on-sigterm restart`).
    pub fn start_edge_with(&mut self, i: usize, pin_dir: &Path, extra: &[&str]) -> Result<()> {
        let edge = self.bins.edge.display().to_string();
        let kubeconfig = self.edge_kubeconfig().display().to_string();
        let mtu = FABRIC_MTU.to_string();
        let ip = self.addrs.edges[i - 1].clone();
        let name = format!("edge{i}");
        let pin = pin_dir.display().to_string();
        let senders = format!("--failover-senders={}", self.failover_senders.join(","));
        self.daemons.retain_mut(|d| d.name != name || d.alive());
        let http = format!("0.0.0.0:{EDGE_HTTP_PORT}");
        let mut argv = vec![
            edge.as_str(),
            "--kubeconfig",
            &kubeconfig,
            "--metrics-addr",
            &http,
            "run",
            "--node-name",
            &name,
            "--source-v4",
            &ip,
            "--drain",
            "0s",
        ];
        match self.edge_datapath {
            EdgeDatapath::Xdp => {
                argv.extend([
                    "--interface",
                    "eth0",
                    "--xdp-mode",
                    "native",
                    "--pin-dir",
                    &pin,
                    "--mtu",
                    &mtu,
                ]);
                if !self.failover_senders.is_empty() {
                    argv.push(&senders);
                }
            }
            // IPVS tunnels to the pod IPs with `mh` (mh-port, mh-fallback: the defaults)
            EdgeDatapath::Ipvs => argv.extend(["--datapath", "ipvs", "--forwarding", "tunnel"]),
        }
        argv.extend_from_slice(extra);
        self.spawn(&name, &name, &argv)
    }

    /// Something a thread can poll the ToR's routes with while the test drives the
    /// cluster (see [`RouteProbe::sample`]).
    pub fn route_probe(&self) -> RouteProbe {
        RouteProbe {
            tor: self.ns("tor"),
            bird_ctl: self.bird_ctl(),
        }
    }

    /// One `ringlb-edge node` per worker node namespace: tc programs on eth0 (the
    /// uplink), maps pinned in the lab's bpffs; as ServiceAccount ringlb-node.
    pub fn start_node_agents(&mut self, pin_dirs: &[PathBuf]) -> Result<()> {
        let edge = self.bins.edge.display().to_string();
        let kubeconfig = self.node_kubeconfig().display().to_string();
        for i in 1..=self.addrs.nodes.len() {
            let name = format!("node{i}");
            let pin = pin_dirs[i - 1].display().to_string();
            self.spawn(
                &format!("{name}-agent"),
                &name,
                &[
                    &edge,
                    "--kubeconfig",
                    &kubeconfig,
                    "--metrics-addr",
                    "127.0.0.1:9090",
                    "node",
                    "--node-name",
                    &name,
                    "--interface",
                    "eth0",
                    "--pin-dir",
                    &pin,
                ],
            )?;
        }
        Ok(())
    }

    /// Waits until every worker node's agent has attached and programmed its local
    /// pod (`ringlb_node_local_pods` on its /metrics); one line per node.
    pub fn wait_tc(&mut self, limit: Duration) -> Result<Vec<String>> {
        self.wait_node_gauge(
            "the node agents to program their pods",
            "ringlb_node_local_pods",
            limit,
        )
    }

    /// Waits until every node agent has programmed at least one Service entry for
    /// its pod (`ringlb_node_service_entries`).
    pub fn wait_node_services(&mut self, vip: &str, limit: Duration) -> Result<()> {
        let what = format!("the node agents to map {vip}");
        self.wait_node_gauge(&what, "ringlb_node_service_entries", limit)
            .map(|_| ())
    }

    /// Waits until gauge `metric` is at least 1 on every node agent's /metrics;
    /// one `NS: metric = V` line per node.
    fn wait_node_gauge(
        &mut self,
        what: &str,
        metric: &str,
        limit: Duration,
    ) -> Result<Vec<String>> {
        let n = self.addrs.nodes.len();
        self.wait_checked(what, limit, Duration::from_millis(100), |this| {
            let mut lines = Vec::new();
            for i in 1..=n {
                let ns = this.ns(&format!("node{i}"));
                match this.node_metric(&ns, metric) {
                    Some(v) if v >= 1.0 => lines.push(format!("{ns}: {metric} = {v}")),
                    m => return Ok(Err(format!("{ns}: {metric} = {m:?}"))),
                }
            }
            Ok(Ok(lines))
        })
    }

    /// A gauge from the node agent's /metrics in namespace `ns` (`None` while the
    /// agent does not answer or has not set it).
    fn node_metric(&self, ns: &str, name: &str) -> Option<f64> {
        let url = "http://127.0.0.1:9090/metrics";
        let args = ["curl", "--noproxy", "*", "-sS", "--max-time", "2", url];
        let body = run_in(ns, &args).ok()?;
        config::metric_value(&body, name)
    }

    /// `kubectl expose deployment NAME --port=PORT --target-port=TARGET_PORT
    /// --type=LoadBalancer`.
    pub fn expose(&self, name: &str) -> Result<String> {
        self.kubectl(&[
            "expose",
            "deployment",
            name,
            &format!("--port={}", self.addrs.port),
            &format!("--target-port={}", self.addrs.target_port),
            "--type=LoadBalancer",
        ])
    }

    /// Waits until every edge has an XDP program on eth0; returns `ip -d link`'s
    /// `prog/xdp` line per edge.
    pub fn wait_xdp(&mut self, limit: Duration) -> Result<Vec<String>> {
        let n = self.addrs.edges.len();
        self.wait_checked(
            "XDP programs on the edges' eth0",
            limit,
            Duration::from_millis(100),
            |this| {
                let mut lines = Vec::new();
                for i in 1..=n {
                    let ns = this.ns(&format!("edge{i}"));
                    let link = run_in(&ns, &["ip", "-d", "link", "show", "dev", "eth0"])?;
                    match link.lines().find(|l| l.contains("prog/xdp")) {
                        Some(l) => lines.push(format!("{ns} eth0: {}", l.trim())),
                        None => return Ok(Err(format!("{ns}: no XDP program yet"))),
                    }
                }
                Ok(Ok(lines))
            },
        )
    }

    /// Waits until BGPPeer `peer`'s status lists every edge as Established with one
    /// route advertised; returns the `node state advertised` lines.
    pub fn wait_peer_status(&mut self, peer: &str, limit: Duration) -> Result<String> {
        let n = self.addrs.edges.len();
        let path = PEER_STATUS;
        self.wait_checked(
            &format!("BGPPeer {peer} status: {n} nodes Established"),
            limit,
            Duration::from_millis(250),
            |this| {
                let out = this.kubectl(&["get", "bgppeers", peer, "-o", path])?;
                let up = out
                    .lines()
                    .filter(|l| l.contains("Established") && l.contains("advertised=1"))
                    .count();
                Ok(if up == n { Ok(out) } else { Err(out) })
            },
        )
    }

    /// SIGKILLs the daemon `name` (e.g. `edge1`) and reaps it.
    /// SIGTERM to daemon `name` (an edge drains: GRACEFUL_SHUTDOWN, withdraw, exit);
    /// waits up to `limit` for it to exit.
    pub fn terminate(&mut self, name: &str, limit: Duration) -> Result<()> {
        self.running_daemon(name)?.terminate(limit)?;
        Ok(())
    }

    pub fn kill(&mut self, name: &str) -> Result<()> {
        self.running_daemon(name)?.kill();
        Ok(())
    }

    /// The running daemon named `name`.
    fn running_daemon(&mut self, name: &str) -> Result<&mut Daemon> {
        self.daemons
            .iter_mut()
            .filter(|d| d.name == name)
            .find_map(|d| d.alive().then_some(d))
            .ok_or_else(|| Error::Unsupported(format!("no running daemon named {name}")))
    }

    /// The built kubectl as the admin, from the ToR namespace (through the bridge),
    /// with a private HOME and discovery cache in the lab directory.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let kubectl = self.bins.kubectl.display().to_string();
        let kubeconfig = self.kubeconfig().display().to_string();
        let home = self.dir.join("home").display().to_string();
        let cache = self.dir.join("home/cache").display().to_string();
        let mut argv = vec![kubectl.as_str(), "--kubeconfig", &kubeconfig];
        argv.extend_from_slice(args);
        run_in_env(
            &self.ns("tor"),
            &argv,
            &[("HOME", &home), ("KUBECACHEDIR", &cache)],
        )
    }

    /// Writes the manifests into `<dir>/manifests` and returns that directory.
    pub fn write_manifests(&self) -> Result<PathBuf> {
        let dir = self.dir.join("manifests");
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        for (name, yaml) in config::manifests(&self.addrs) {
            let p = dir.join(name);
            std::fs::write(&p, yaml).map_err(Error::io(format!("writing {}", p.display())))?;
        }
        Ok(dir)
    }

    /// `kubectl apply -f <dir>`.
    pub fn apply(&self, dir: &Path) -> Result<String> {
        self.kubectl(&["apply", "-f", &dir.display().to_string()])
    }

    /// Waits until Service `name` has an address in `status.loadBalancer.ingress`.
    pub fn wait_vip(&mut self, name: &str, limit: Duration) -> Result<String> {
        self.wait_checked(
            &format!("an EXTERNAL-IP on Service {name}"),
            limit,
            Duration::from_millis(100),
            |this| {
                let ip = this.kubectl(&[
                    "get",
                    "svc",
                    name,
                    "-o",
                    "jsonpath={.status.loadBalancer.ingress[0].ip}",
                ])?;
                let ip = ip.trim().to_string();
                Ok(if ip.is_empty() {
                    Err("<pending>".into())
                } else {
                    Ok(ip)
                })
            },
        )
    }

    /// BIRD's paths to `vip` and the ToR kernel's next hops for it (as
    /// [`RouteProbe::sample`], with the texts).
    pub fn routes(
        &self,
        vip: &str,
    ) -> Result<(String, Vec<std::net::IpAddr>, String, Vec<std::net::IpAddr>)> {
        let bird = self.birdc(&["show", "route", "for", vip, "all"])?;
        let kernel_json = run_in(&self.ns("tor"), &["ip", "-j", "route", "show", vip])?;
        let kernel = run_in(&self.ns("tor"), &["ip", "route", "show", vip])?;
        let khops = config::kernel_next_hops(&kernel_json).map_err(|detail| Error::Parse {
            what: "ip -j route".into(),
            detail,
        })?;
        Ok((bird.clone(), config::bird_next_hops(&bird), kernel, khops))
    }

    /// Waits until BIRD has `n` paths to `vip` and the kernel route has `n` next hops.
    pub fn wait_ecmp(&mut self, vip: &str, n: usize, limit: Duration) -> Result<()> {
        self.wait_checked(
            &format!("{n} BGP paths and {n} kernel next hops for {vip}"),
            limit,
            Duration::from_millis(200),
            |this| {
                let (_, bird, _, kernel) = this.routes(vip)?;
                Ok(if bird.len() == n && kernel.len() == n {
                    Ok(())
                } else {
                    Err(format!("BIRD via {bird:?}, kernel via {kernel:?}"))
                })
            },
        )
    }

    /// One HTTP GET from the client namespace to `vip` (curl, a new connection each).
    pub fn http_get(&self, vip: &str) -> Result<String> {
        let url = format!("http://{vip}:{}/", self.addrs.port);
        run_in(
            &self.ns("client"),
            &["curl", "--noproxy", "*", "-sS", "--max-time", "5", &url],
        )
    }

    /// The last lines of every daemon's log.
    pub fn log_tails(&self, n: usize) -> String {
        self.daemons
            .iter()
            .map(|d| {
                format!(
                    "--- {} ({}) ---\n{}\n",
                    d.name,
                    d.log.display(),
                    d.log_tail(n)
                )
            })
            .collect()
    }

    /// Leaves every daemon running when this value drops (`ringlb-lab up`).
    pub fn keep(&mut self) {
        self.keep = true;
        self.daemons.iter_mut().for_each(Daemon::keep);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if std::thread::panicking() {
            eprintln!("lab daemon logs:\n{}", self.log_tails(25));
        }
        // edges first (they withdraw), then the rest
        for d in self.daemons.iter_mut().rev() {
            d.stop(Duration::from_secs(3));
        }
    }
}

/// The ToR's routes, for a polling thread.
#[derive(Clone, Debug)]
pub struct RouteProbe {
    tor: String,
    bird_ctl: String,
}

impl RouteProbe {
    /// BIRD's next hops for `vip` (`birdc show route for`) and the ToR kernel's.
    pub fn sample(&self, vip: &str) -> Result<(Vec<std::net::IpAddr>, Vec<std::net::IpAddr>)> {
        let bird = run_in(
            &self.tor,
            &[
                "birdc",
                "-s",
                &self.bird_ctl,
                "show",
                "route",
                "for",
                vip,
                "all",
            ],
        )?;
        let kernel_json = run_in(&self.tor, &["ip", "-j", "route", "show", vip])?;
        let khops = config::kernel_next_hops(&kernel_json).map_err(|detail| Error::Parse {
            what: "ip -j route".into(),
            detail,
        })?;
        Ok((config::bird_next_hops(&bird), khops))
    }
}
