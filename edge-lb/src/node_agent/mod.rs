//! `ringlb-edge node`: the node agent, a DaemonSet on worker nodes. It feeds the
//! `ringlb-node` tc datapath (decapsulation, VIP:port -> pod:targetPort, DSR replies)
//! from the API. See docs/node.md.
//!
//! ```text
//!  reflectors: Services, EndpointSlices, Pods (spec.nodeName=<node>),
//!              edge Nodes (--edge-selector)
//!        │ any event ──> notify (coalesced for DEBOUNCE)
//!        ▼
//!  sync (this task owns the datapath, through the `NodeProgram` seam; sync.rs):
//!     desired::build (serving::build, this node's pods)
//!       + desired::edge_addresses (allowed tunnel sources) ──> NodeDatapath::apply (diff)
//!  every RESYNC: the same sync; after a failure: again after RETRY
//!  every COUNTERS: node_stats ──> ringlb_node_packets_total
//!  SIGTERM ──> exit. Programs, links and maps stay pinned: flows keep being
//!  translated, and a restart swaps its program into the pinned links.
//! ```

use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use ringlb_node::loader::{DEFAULT_PIN_DIR, remove_pins};
use ringlb_node::{NodeDatapath, NodeOptions};
use ringlb_ops::{CommonArgs, Health, Heartbeat};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Mutex, Notify};

use crate::watch::{first_list, watch_into, watch_services};

pub mod desired;
pub mod sync;

/// The datapath crate the agent feeds; its types (`NodeState`, `maps::Applier`,
/// `maps::FakeMaps`) are part of this module's API.
pub use ringlb_node as datapath;

use sync::{NodeMetrics, NodeProgram, Stores, SyncConfig, SyncState};

/// How long the agent waits for more events before it syncs.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// A full resync even without events.
const RESYNC: Duration = Duration::from_secs(30);
/// How soon a failed apply is retried.
const RETRY: Duration = Duration::from_secs(1);
/// How often the datapath counters are read into /metrics.
const COUNTERS: Duration = Duration::from_secs(10);
/// How long the loop may be silent before /healthz fails. It wakes at least every
/// RESYNC (also while the API is down: it works from its reflectors), so a silent
/// loop is a stuck one.
const LOOP_ALLOWANCE: Duration = Duration::from_secs(120);

/// `(MSS v4, MSS v6)` for a 1,500-byte fabric: 1440 and 1400.
const MSS: (u16, u16) = NodeOptions::mss_for_mtu(1500);

/// Flags of `ringlb-edge node`.
#[derive(clap::Args, Debug, Clone)]
#[command(subcommand_negates_reqs = true)]
pub struct NodeArgs {
    /// This node's name: only pods with this `spec.nodeName` are programmed. Required
    /// (not for `uninstall`).
    #[arg(long, env = "NODE_NAME", required = true)]
    pub node_name: Option<String>,
    /// Uplink to attach to (tc ingress and egress); repeat for several. Default: the
    /// interface(s) of the default routes (`ip route get` of a public IPv4 and IPv6
    /// address, over rtnetlink).
    #[arg(long = "interface")]
    pub interfaces: Vec<String>,
    /// Where the maps and tcx links are pinned (a bpffs); a restart reuses them.
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// MSS written into IPv4 SYN-ACKs of VIP flows (fabric MTU - 60); 0 turns it off.
    #[arg(long, default_value_t = MSS.0)]
    pub mss_v4: u16,
    /// MSS written into IPv6 SYN-ACKs of VIP flows (fabric MTU - 100); 0 turns it off.
    #[arg(long, default_value_t = MSS.1)]
    pub mss_v6: u16,
    /// Also serve LoadBalancer Services that set no spec.loadBalancerClass (as the
    /// edges do). `--default-class=false` serves only class ringlb.io/maglev.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub default_class: bool,
    /// Label selector of the edges' Nodes: their addresses are the only outer sources
    /// whose tunnels to local pods are decapsulated (the edge DaemonSet's selector).
    #[arg(long, default_value = "ringlb.io/edge=true")]
    pub edge_selector: String,
    /// Refuse (drop and count, `drop_source`) tunnels to local pods from any address
    /// that is no edge's. `--check-tunnel-source=false` takes them from anywhere.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub check_tunnel_source: bool,
    #[command(subcommand)]
    pub command: Option<NodeCommand>,
}

/// Sub-commands of `ringlb-edge node`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum NodeCommand {
    /// Detach and remove every program, map and pin of the node datapath (stop the
    /// DaemonSet first: a running agent holds its links open).
    Uninstall {
        #[arg(long, default_value = DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
    },
}

/// Runs `ringlb-edge node` (or its `uninstall`) until SIGTERM/SIGINT.
///
/// Start-up order: flags, uplinks, pin directory, kubeconfig and API, the ops port and
/// the first lists first; the tc programs last (see [`load_datapath`]).
pub async fn run(common: &CommonArgs, args: &NodeArgs) -> anyhow::Result<()> {
    if let Some(NodeCommand::Uninstall { pin_dir }) = &args.command {
        remove_pins(pin_dir).with_context(|| format!("removing {}", pin_dir.display()))?;
        tracing::info!(pin_dir = %pin_dir.display(), "node datapath uninstalled");
        return Ok(());
    }
    let node_name = args.node_name.clone().context("--node-name is required")?;
    ringlb_ops::kernel::require(&ringlb_ops::kernel::NODE)?;
    let interfaces = if args.interfaces.is_empty() {
        default_uplinks()?
    } else {
        args.interfaces.clone()
    };
    for iface in &interfaces {
        anyhow::ensure!(
            ringlb_xdp::batch::if_index(iface) != 0,
            "--interface {iface}: no such interface in this network namespace"
        );
    }
    ringlb_xdp::xdp::check_pin_dir(&args.pin_dir)
        .with_context(|| format!("--pin-dir {}", args.pin_dir.display()))?;
    let client = common.connect().await?;

    let health = Health::new();
    let registry = Arc::new(Mutex::new(Registry::with_prefix("ringlb")));
    let metrics = NodeMetrics::register(&mut *registry.lock().await);
    let metrics_addr = common.metrics_addr_or(ringlb_ops::flags::ops_port::NODE);
    let (addr, _ops) = ringlb_ops::serve_ops(metrics_addr, registry, health.clone())
        .await
        .with_context(|| format!("binding --metrics-addr {metrics_addr}"))?;
    tracing::info!(%addr, "serving /metrics /healthz /readyz");
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;

    // Registered before the first lists: an API that never answers them turns
    // /healthz to 503 after the allowance instead of a healthy-looking wait forever.
    let heartbeat = sync_heartbeat(&health);
    let notify = Arc::new(Notify::new());
    let stores = watch_stores(&client, &node_name, &args.edge_selector, &notify).await?;
    let mut dp = load_datapath(args, &interfaces)?;
    let agent = Agent {
        stores,
        notify,
        cfg: SyncConfig {
            node_name,
            default_class: args.default_class,
        },
        health,
        heartbeat,
        metrics,
    };
    agent
        .run_until(&mut dp, async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
        .await;
    tracing::info!("node agent stopped; programs, links and maps stay pinned for the next start");
    Ok(())
}

/// The `node-sync` heartbeat of [`Agent::run_until`]; register it before waiting for
/// the first lists, so that a wait that never ends shows on /healthz.
pub fn sync_heartbeat(health: &Health) -> Heartbeat {
    health.heartbeat("node-sync", LOOP_ALLOWANCE)
}

/// The interfaces of the default IPv4 and IPv6 routes (deduplicated).
fn default_uplinks() -> anyhow::Result<Vec<String>> {
    let probes: [IpAddr; 2] = [
        IpAddr::from([8, 8, 8, 8]),
        IpAddr::from([0x2001, 0x4860, 0x4860, 0, 0, 0, 0, 0x8888]),
    ];
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for dst in probes {
        match ringlb_nexthop::route_interface(None, dst) {
            Ok((_, name)) if !out.contains(&name) => out.push(name),
            Ok(_) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    anyhow::ensure!(
        !out.is_empty(),
        "no default route to find the uplink by ({}); pass --interface",
        errors.join("; ")
    );
    tracing::info!(interfaces = ?out, "uplinks from the default routes");
    Ok(out)
}

/// Loads the datapath (reusing pinned maps), detaches uplinks a previous run attached
/// that are no longer configured, and attaches to `interfaces`. When the pin directory
/// held nothing and this fails, what it pinned and attached is removed again; over an
/// earlier install a failure leaves that install's pins as they were.
fn load_datapath(args: &NodeArgs, interfaces: &[String]) -> anyhow::Result<NodeDatapath> {
    let fresh = std::fs::read_dir(&args.pin_dir).map_or(true, |mut rd| rd.next().is_none());
    let loaded = load_and_attach(args, interfaces);
    if loaded.is_err()
        && fresh
        && let Err(e) = remove_pins(&args.pin_dir)
    {
        tracing::warn!(error = %e, pin_dir = %args.pin_dir.display(), "removing what the failed start pinned");
    }
    loaded
}

fn load_and_attach(args: &NodeArgs, interfaces: &[String]) -> anyhow::Result<NodeDatapath> {
    let opts = NodeOptions {
        pin_dir: Some(args.pin_dir.clone()),
        mss4: args.mss_v4,
        mss6: args.mss_v6,
        check_source: args.check_tunnel_source,
    };
    let mut dp = NodeDatapath::load(&opts).context("loading the node datapath")?;
    for stale in stale_links(&args.pin_dir, interfaces) {
        tracing::info!(link = %stale.display(), "detaching an uplink that is no longer configured");
        std::fs::remove_file(&stale).with_context(|| format!("removing {}", stale.display()))?;
    }
    for iface in interfaces {
        dp.attach_uplink(iface)
            .with_context(|| format!("attaching to {iface}"))?;
    }
    tracing::info!(
        ?interfaces,
        mss_v4 = args.mss_v4,
        mss_v6 = args.mss_v6,
        check_tunnel_source = args.check_tunnel_source,
        "node datapath attached"
    );
    Ok(dp)
}

/// Pinned links (`link_<iface>_<hook>`) of interfaces not in `keep`.
fn stale_links(pin_dir: &Path, keep: &[String]) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(pin_dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            link_interface(&name).is_some_and(|i| !keep.iter().any(|k| k == i))
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The interface of a pinned link's file name.
fn link_interface(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("link_")?;
    ringlb_node::Hook::BOTH
        .iter()
        .find_map(|h| rest.strip_suffix(&format!("_{}", h.label())))
}

/// Watches Services, EndpointSlices, this node's Pods and the edges' Nodes (Nodes
/// matching `edge_selector`; every change pokes `notify`) and waits for their first
/// lists.
pub async fn watch_stores(
    client: &kube::Client,
    node_name: &str,
    edge_selector: &str,
    notify: &Arc<Notify>,
) -> anyhow::Result<Stores> {
    let (services, slices) = watch_services(client, notify);
    let local = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let pods = watch_into(Api::<Pod>::all(client.clone()), local, notify.clone()).0;
    let edge_nodes = watcher::Config::default().labels(edge_selector);
    let edges = watch_into(Api::<Node>::all(client.clone()), edge_nodes, notify.clone()).0;
    first_list(&services).await?;
    first_list(&slices).await?;
    first_list(&pods).await?;
    first_list(&edges)
        .await
        .with_context(|| format!("listing the edge Nodes (--edge-selector {edge_selector})"))?;
    Ok(Stores {
        services,
        slices,
        pods,
        edges,
    })
}

/// What the agent loop owns besides the datapath.
pub struct Agent {
    pub stores: Stores,
    pub notify: Arc<Notify>,
    pub cfg: SyncConfig,
    pub health: Arc<Health>,
    /// The loop's `node-sync` heartbeat ([`sync_heartbeat`]).
    pub heartbeat: Heartbeat,
    pub metrics: NodeMetrics,
}

impl Agent {
    /// Syncs on API events (debounced), at least every RESYNC, RETRY after a failed
    /// apply, reads counters, and beats the `node-sync` heartbeat, until `stop`.
    /// `/readyz` turns true after the first successful apply.
    pub async fn run_until(
        self,
        dp: &mut (dyn NodeProgram + Send),
        stop: impl Future<Output = ()>,
    ) {
        let heartbeat = self.heartbeat;
        let mut st = SyncState::default();
        let mut counters_tick = tokio::time::interval(COUNTERS);
        let mut due = true;
        let mut next_sync = tokio::time::Instant::now();
        tokio::pin!(stop);
        loop {
            heartbeat.beat();
            if due {
                sync::sync(&self.stores, &self.cfg, dp, &self.metrics, &mut st);
                self.health.set_ready(st.synced_once);
                next_sync = tokio::time::Instant::now() + if st.retry { RETRY } else { RESYNC };
            }
            due = true;
            tokio::select! {
                _ = self.notify.notified() => tokio::time::sleep(DEBOUNCE).await,
                _ = tokio::time::sleep_until(next_sync) => {}
                _ = counters_tick.tick() => {
                    match dp.counters() {
                        Ok(c) => self.metrics.update(&c),
                        Err(e) => tracing::warn!(error = %e, "reading node counters"),
                    }
                    due = false;
                }
                _ = &mut stop => break,
            }
        }
        self.health.set_ready(false);
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: Top,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Top {
        Node(NodeArgs),
    }

    fn parse(args: &[&str]) -> Result<NodeArgs, clap::Error> {
        let mut v = vec!["ringlb-edge", "node"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| match c.cmd {
            Top::Node(n) => n,
        })
    }

    #[test]
    fn flags_default_to_the_node_pin_dir_and_a_1500_byte_fabric() {
        let a = parse(&["--node-name", "n1"]).unwrap();
        assert_eq!(a.pin_dir, Path::new("/sys/fs/bpf/ringlb-node"));
        assert_ne!(a.pin_dir, Path::new("/sys/fs/bpf/ringlb"), "not the edge's");
        assert_eq!((a.mss_v4, a.mss_v6), (1440, 1400));
        assert!(a.interfaces.is_empty() && a.default_class && a.command.is_none());
        assert_eq!(a.node_name.as_deref(), Some("n1"));
        let a = parse(&[
            "--node-name",
            "n1",
            "--interface",
            "eth0",
            "--interface",
            "eth1",
            "--mss-v4",
            "0",
        ])
        .unwrap();
        assert_eq!(a.interfaces, ["eth0", "eth1"]);
        assert_eq!(a.mss_v4, 0);
    }

    #[test]
    fn uninstall_needs_no_node_name() {
        let a = parse(&["uninstall", "--pin-dir", "/sys/fs/bpf/x"]).unwrap();
        assert_eq!(a.node_name, std::env::var("NODE_NAME").ok());
        assert!(matches!(
            a.command,
            Some(NodeCommand::Uninstall { pin_dir }) if pin_dir == Path::new("/sys/fs/bpf/x")
        ));
    }

    #[test]
    fn pinned_links_of_unconfigured_interfaces_are_stale() {
        assert_eq!(link_interface("link_eth0_ingress"), Some("eth0"));
        assert_eq!(link_interface("link_my_if_egress"), Some("my_if"));
        assert_eq!(link_interface("services"), None);
        let dir = std::env::temp_dir().join(format!("ringlb-node-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "link_eth0_ingress",
            "link_eth0_egress",
            "link_eth1_ingress",
            "local_pods",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let stale = stale_links(&dir, &["eth0".to_string()]);
        assert_eq!(stale, [dir.join("link_eth1_ingress")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
