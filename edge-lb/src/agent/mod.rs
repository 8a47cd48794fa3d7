//! `ringlb-edge run`: the edge agent. It derives everything from the API and its flags.
//!
//! ```text
//!  reflectors: Services, EndpointSlices
//!        │ any event ──> notify (coalesced for as long as the last sync took, 5-50 ms)
//!        ▼
//!  nexthop-watch thread: kernel route/neighbour/link changes ──> nh notify (DEBOUNCE
//!                        in nexthops) ──> Datapath::refresh_next_hops (XDP: changed
//!                        only; IPVS: nothing, the kernel routes to real servers)
//!  sync (this task owns the datapath, through the `ringlb_datapath::Datapath` seam:
//!        XdpDatapath or IpvsDatapath, chosen by --datapath; sync.rs):
//!     serving::build ──> tables::datapath_state ──> Datapath::apply (writes only the diff)
//!                    └─> vip_health::Tracker (hold-down per VIP:port) ──> Speaker::announce
//!                        (de-preferred below the threshold) / withdraw; facts ──> Board
//!  ops endpoint: /metrics /healthz /readyz and /health/vip/<ip>[/<port>] (Board, read
//!               per request with the sessions' state); health Events and metrics
//!               after each sync (health_events.rs, vip_health::metrics)
//!  peers::run task: BGPPeer/BGPAdvertisement/IPPool/Node ──> Speaker::set_peers,
//!                      BGPPeer status per node
//!  ack task: the highest Service resourceVersion a sync acted on ──> this edge's
//!            Lease (ack.rs), which the controller's cleanup finalizer waits for
//!  The BGP sessions start after the first sync, so a restarted agent's End-of-RIB
//!  follows the complete table (graceful restart).
//!  SIGTERM ──> stop.rs: drain (GRACEFUL_SHUTDOWN, drain time, withdraw, Cease) or, with
//!  --on-sigterm restart on a schedulable Node whose peers all have graceful restart,
//!  restart (close BGP without NOTIFICATION; the ToR keeps the routes) ──> exit.
//!  The XDP program and its maps stay pinned, so a restart keeps forwarding and conntrack;
//!  after a drain, IPVS services, the VIPs bound on `lo` and the nftables guard are
//!  removed once the routes are withdrawn.
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use ringlb_bgp::Speaker;
use ringlb_bgp::gr::RestartState;
use ringlb_datapath::{Datapath, DesiredState};
use ringlb_ipvs::guard::nft::NftCommand;
use ringlb_ipvs::kernel::netlink::NetlinkKernel;
use ringlb_ipvs::{Forward, IpvsDatapath};
use ringlb_maglev as maglev;
use ringlb_nexthop::{KernelResolver, WithLocalPods};
use ringlb_ops::flags::parse_duration;
use ringlb_ops::{CommonArgs, Health, Heartbeat};
use ringlb_xdp::abi::MAX_RING_SIZE;
use ringlb_xdp::maps::kernel::PinnedFlowFilter;
use ringlb_xdp::xdp::{AttachMode, DEFAULT_PIN_DIR, XdpDatapath, XdpOptions};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Mutex, Notify, oneshot};

use crate::peers::{self, NodeContext};
use crate::vip_health;

pub mod ack;
mod api;
pub mod health_events;
mod ipvs_switches;
pub mod local_pods;
pub mod metrics;
mod nexthops;
mod sources;
mod start_failure;
pub mod stop;
pub mod sync;
pub mod tx_check;

use metrics::DatapathMetrics;
pub use stop::OnSigterm;
use stop::{Exit, Stop};

use sync::{Stores, SyncConfig, SyncState};

/// A full resync even without events; it also re-resolves every next hop, in case a
/// kernel notification was missed.
const RESYNC: Duration = Duration::from_secs(30);
/// How often the datapath's counters are read into /metrics.
const COUNTERS: Duration = Duration::from_secs(10);
/// How soon a failed datapath apply is retried.
const RETRY: Duration = Duration::from_secs(1);

/// How long the agent loop may be silent before /healthz fails. The loop wakes at
/// least every RESYNC (also while the API is down: it works from its reflectors), so
/// a silent loop is a stuck one.
const LOOP_ALLOWANCE: Duration = Duration::from_secs(120);
/// The same for the BGP configuration loop, which wakes at least every minute.
const PEERS_ALLOWANCE: Duration = Duration::from_secs(180);

/// Which datapath forwards VIP traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DatapathKind {
    /// The XDP program on --interface (BPF maps, our Maglev table).
    Xdp,
    /// Kernel IPVS with the `mh` scheduler (docs/ipvs.md).
    Ipvs,
}

impl DatapathKind {
    /// The name in metrics (`ringlb_xdp_*`, `ringlb_ipvs_*`) and logs.
    pub fn name(self) -> &'static str {
        match self {
            DatapathKind::Xdp => "xdp",
            DatapathKind::Ipvs => "ipvs",
        }
    }
}

/// How IPVS reaches a real server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Forwarding {
    /// IPIP (or IPv6) encapsulation to the pod.
    Tunnel,
    /// Direct routing: the MAC rewritten, for pods on the edge's L2 only.
    Dr,
}

/// Flags of `ringlb-edge run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// This node's name (its labels select BGPPeers).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Namespace of this edge's Lease (`ringlb-edge-<node>`), which acknowledges the
    /// Services it has acted on; the controller's cleanup finalizer waits for it.
    /// The controller's --lease-namespace (the release namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "ringlb-system")]
    pub lease_namespace: String,
    /// The datapath: xdp, or ipvs where XDP cannot run (docs/ipvs.md). The flags
    /// marked "XDP only" are ignored with ipvs, the "IPVS only" ones with xdp.
    #[arg(long, value_enum, default_value = "xdp")]
    pub datapath: DatapathKind,
    /// Interface that receives VIP traffic from the ToR; the XDP program attaches here.
    /// Required with --datapath xdp; ignored (with a warning) with ipvs.
    #[arg(long)]
    pub interface: Option<String>,
    /// IPVS only: how real servers are reached.
    #[arg(long, value_enum, default_value = "tunnel")]
    pub forwarding: Forwarding,
    /// IPVS only: the `mh` scheduler hashes the client's source port too, not only
    /// its address (flows of one client spread over the pods, as with XDP).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub mh_port: bool,
    /// IPVS only: a new connection whose slot names a draining pod (weight 0) goes
    /// to another pod instead of being refused.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub mh_fallback: bool,
    /// XDP only. XDP attach mode: auto tries native and falls back to generic with a
    /// warning, and picks generic on a veth whose peer runs no XDP program (native
    /// XDP_TX is dropped there).
    #[arg(long, value_enum, default_value = "auto")]
    pub xdp_mode: AttachMode,
    /// XDP only. Where the XDP maps and link are pinned (a bpffs).
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Outer source address of IPv4 encapsulation (this edge's address toward the pods;
    /// with ipvs the kernel chooses it, and this is only the default --router-id).
    #[arg(long)]
    pub source_v4: Option<Ipv4Addr>,
    /// Outer source address of IPv6 encapsulation.
    #[arg(long)]
    pub source_v6: Option<Ipv6Addr>,
    /// This node's addresses (the chart passes the pod's `status.hostIPs`): where
    /// --source-v4 or --source-v6 is not given, the node's address of that family is
    /// the outer source, so a dual-stack node encapsulates both families with no
    /// per-node setting.
    #[arg(long, env = "RINGLB_HOST_IPS", value_delimiter = ',')]
    pub host_ips: Vec<IpAddr>,
    /// XDP only. How often the flow filter (which lets a new flow's SYN skip its
    /// conntrack lookup) is rebuilt from the conntrack keys, so that the slots of
    /// evicted entries clear (docs/datapath.md); e.g. 30s. Unused on kernels
    /// before 5.12, which get the program without the filter.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub flow_filter_rebuild: Duration,
    /// XDP only. New conntrack entries one VIP may insert per CPU per second. A new
    /// flow's packet over it goes by the Maglev ring without an entry (counter
    /// ct_over_budget), so a flood of new flows (spoofed ACKs, UDP) evicts no
    /// established flow. `auto`: an eighth of one CPU's share of the conntrack table
    /// (16384 with 2 CPUs, 2048 with 16); a number; 0 = no limit.
    #[arg(long, default_value = "auto", value_parser = parse_ct_insert_budget)]
    pub ct_insert_budget: CtInsertBudget,
    /// XDP only. The other region's edges (IPv4 addresses or prefixes,
    /// comma-separated) whose IPIP packets to this edge's VIPs are decapsulated
    /// for a failover alias (`ringlb.io/accept-failover-from`). IPIP from any other
    /// source to a VIP is dropped and counted (`drop_decap_sender`). Empty (the
    /// default): no failover traffic is accepted; `0.0.0.0/0` accepts any sender.
    #[arg(long, env = "RINGLB_FAILOVER_SENDERS", value_delimiter = ',')]
    pub failover_senders: Vec<ipnetwork::Ipv4Network>,
    /// XDP only. Largest packet after encapsulation (the fabric MTU). Larger ones are answered
    /// with ICMP Fragmentation Needed / Packet Too Big; IPv4 without DF is passed.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// BGP router id. Default: --source-v4.
    #[arg(long)]
    pub router_id: Option<Ipv4Addr>,
    /// TCP port for passive BGP opens; 0 turns passive open off.
    #[arg(long, default_value_t = 179)]
    pub bgp_listen_port: u16,
    /// The largest Maglev table of a VIP:port: a prime from 251 to 65537 (the
    /// largest ring the XDP datapath holds). Each table is sized to its backends,
    /// at least 100 slots per backend, up to this.
    #[arg(long, default_value_t = maglev::DEFAULT_TABLE_SIZE)]
    pub ring_size: u32,
    /// Also serve LoadBalancer Services that set no spec.loadBalancerClass.
    /// `--default-class=false` serves only class ringlb.io/maglev.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub default_class: bool,
    /// On SIGTERM, how long routes stay announced with GRACEFUL_SHUTDOWN before they
    /// are withdrawn (e.g. 30s, 500ms).
    #[arg(long, alias = "drain-seconds", default_value = "30s", value_parser = parse_duration)]
    pub drain: Duration,
    /// What SIGTERM does: `drain` takes the edge out of service (GRACEFUL_SHUTDOWN,
    /// --drain, withdraw); `restart` is for upgrades: BGP closes without NOTIFICATION,
    /// nothing is withdrawn, the datapath forwards on, and peers with graceful restart
    /// keep the routes until the next agent re-announces them. With `restart`, a
    /// cordoned Node (`kubectl cordon`), or a BGPPeer without `gracefulRestart`,
    /// still drains. SIGINT always drains.
    #[arg(long, env = "RINGLB_ON_SIGTERM", value_enum, default_value = "drain")]
    pub on_sigterm: OnSigterm,
}

impl RunArgs {
    /// Checks the flags before anything is started: ring size, interface, pin
    /// directory (XDP); returns the BGP router id.
    fn check(&self) -> anyhow::Result<Ipv4Addr> {
        let router_id = self.router_id.or(self.src4()).context(
            "--router-id (or --source-v4, or an IPv4 address in --host-ips) is required for BGP",
        );
        maglev::Table::build(
            &[maglev::Backend {
                addr: Ipv4Addr::LOCALHOST.into(),
                port: 1,
                weight: 1,
            }],
            self.ring_size,
        )
        .with_context(|| format!("--ring-size {}", self.ring_size))?;
        if self.datapath == DatapathKind::Ipvs {
            if let Some(i) = &self.interface {
                tracing::warn!(interface = %i, "--interface is ignored with --datapath ipvs (IPVS serves every interface)");
            }
            return router_id;
        }
        anyhow::ensure!(
            self.ring_size <= MAX_RING_SIZE,
            "--ring-size {}: the XDP datapath holds rings of at most {MAX_RING_SIZE} slots",
            self.ring_size
        );
        let interface = self.xdp_interface()?;
        anyhow::ensure!(
            ringlb_xdp::batch::if_index(interface) != 0,
            "{}",
            start_failure::no_such_interface(interface)
        );
        ringlb_xdp::xdp::check_pin_dir(&self.pin_dir)
            .with_context(|| format!("--pin-dir {}", self.pin_dir.display()))?;
        router_id
    }

    fn xdp_interface(&self) -> anyhow::Result<&str> {
        self.interface
            .as_deref()
            .context("--interface is required with --datapath xdp (the XDP program attaches there)")
    }

    fn ipvs_config(&self) -> ringlb_ipvs::Config {
        ringlb_ipvs::Config {
            forward: match self.forwarding {
                Forwarding::Tunnel => Forward::Tunnel,
                Forwarding::Dr => Forward::DirectRoute,
            },
            mh_port: self.mh_port,
            mh_fallback: self.mh_fallback,
            ..Default::default()
        }
    }

    fn sync_config(&self) -> SyncConfig {
        SyncConfig {
            ring_size: self.ring_size,
            default_class: self.default_class,
        }
    }
}

/// What the agent loop owns.
struct Agent {
    stores: Stores,
    notify: Arc<Notify>,
    dp: Box<dyn Datapath + Send>,
    speaker: Arc<Speaker>,
    dp_metrics: DatapathMetrics,
    nh_metrics: nexthops::Metrics,
    nh_watch: nexthops::Watcher,
    health: Arc<Health>,
    heartbeat: Heartbeat,
    /// Fired after the first complete sync: the BGP sessions start then.
    first_sync: Option<oneshot::Sender<()>>,
    board: Arc<vip_health::Board>,
    health_metrics: vip_health::HealthMetrics,
    health_events: health_events::HealthEvents,
    /// This node's pods, shared with the XDP datapath's resolver.
    local_pods: local_pods::LocalPodsOf,
    /// XDP: whether the driver transmits what the program sends.
    tx_check: Option<tx_check::TxCheck>,
    /// What this edge's Lease acknowledges (ack.rs).
    applied: tokio::sync::watch::Sender<Option<u64>>,
}

/// Every BGP peer's state, families and sent prefixes right now: what the health
/// pages' "announced" is decided from (`ringlb_bgp::reach`).
pub fn established_sessions(
    speaker: &Arc<Speaker>,
) -> Box<dyn Fn() -> Vec<ringlb_bgp::reach::PeerView> + Send + Sync> {
    let speaker = Arc::downgrade(speaker);
    Box::new(move || {
        speaker
            .upgrade()
            .map(|sp| sp.peer_views())
            .unwrap_or_default()
    })
}

/// Runs the edge agent until SIGTERM/SIGINT.
///
/// Start-up order: everything that can fail without touching the node first (flags,
/// interface, pin directory, kubeconfig, API reachable, CRDs, ports, first lists),
/// the datapath last. A start that fails before the attach leaves the node as it
/// found it; one that fails in the load or attach of a fresh install removes what it
/// pinned (see [`load_xdp`]). With `--datapath ipvs` a kernel without IPVS stops the
/// start right after the kernel version check, before the API is asked anything.
pub async fn run(common: &CommonArgs, args: &RunArgs) -> anyhow::Result<()> {
    let router_id = start_failure::checked(common, args).await?;
    // an old kernel is refused by name here, not by a verifier log or netlink later
    ringlb_ops::kernel::require(match args.datapath {
        DatapathKind::Xdp => &ringlb_ops::kernel::XDP_EDGE,
        DatapathKind::Ipvs => &ringlb_ops::kernel::IPVS_EDGE,
    })?;
    // A kernel without IPVS, or no nft for the guard, is named now, before the API
    // is asked anything.
    let ipvs = match args.datapath {
        DatapathKind::Ipvs => Some((
            NetlinkKernel::open().context("starting the IPVS datapath")?,
            NftCommand::open().context("starting the IPVS datapath's nftables guard")?,
        )),
        DatapathKind::Xdp => None,
    };
    let client = common.connect().await?;
    api::check_crds(&client).await?;

    let health = Health::new();
    let registry = Arc::new(Mutex::new(Registry::with_prefix("ringlb")));
    let (speaker, dp_metrics, nh_metrics, health_metrics, tx_check) = {
        let mut r = registry.lock().await;
        let tx_check = match (args.datapath, &args.interface) {
            (DatapathKind::Xdp, Some(i)) => Some(tx_check::TxCheck::new(i, &mut r)),
            _ => None,
        };
        let speaker = Arc::new(Speaker::start(args.bgp_listen_port, &mut r)?);
        (
            speaker,
            DatapathMetrics::register(&mut r, args.datapath.name()),
            nexthops::Metrics::register(&mut r),
            vip_health::HealthMetrics::register(&mut r),
            tx_check,
        )
    };
    let board = Arc::new(vip_health::Board::new(established_sessions(&speaker)));
    let pages: Arc<dyn ringlb_ops::ExtraPages> = board.clone();
    let metrics_addr = common.metrics_addr_or(ringlb_ops::flags::ops_port::EDGE);
    let (addr, _ops) =
        ringlb_ops::serve_ops_with(metrics_addr, registry, health.clone(), Some(pages))
            .await
            .with_context(|| format!("binding --metrics-addr {metrics_addr}"))?;
    tracing::info!(%addr, "serving /metrics /healthz /readyz /health/vip/<ip>[/<port>]");
    let signals = Signals::install()?;

    // Registered before the first lists: an API that never answers them turns
    // /healthz to 503 after the allowance instead of leaving a healthy-looking
    // process that never starts.
    let heartbeat = health.heartbeat("edge-sync", LOOP_ALLOWANCE);
    let notify = Arc::new(Notify::new());
    let stores = api::watch_stores(&client, &notify).await?;

    let resolver = KernelResolver::default();
    let nh_watch = nexthops::Watcher::start(&resolver, &nh_metrics);
    let local_pods = local_pods::LocalPodsOf::new(&args.node_name, Default::default())
        .on_interface(
            args.interface
                .as_deref()
                .filter(|_| args.datapath == DatapathKind::Xdp),
        );
    let resolver = WithLocalPods::new(resolver, local_pods.pods.clone());
    let (dp, kept) = load_datapath(args, resolver, ipvs)?;
    tracing::info!(
        datapath = args.datapath.name(),
        kept_forwarding = kept,
        "datapath ready"
    );
    // Graceful restart: an earlier agent's datapath found and reused means this is a
    // restart with the forwarding state kept (R and F bits of our OPENs).
    speaker.set_restart_state(RestartState {
        restarted: kept,
        forwarding: kept,
    });
    // BFD held by the XDP program across a hitless restart (IPVS: not held)
    if let (DatapathKind::Xdp, Some(iface)) = (args.datapath, &args.interface) {
        let store = crate::bfd_hold::XdpHoldStore::new(args.pin_dir.clone(), iface.clone());
        speaker.set_bfd_hold_store(Arc::new(store));
    }
    let (first_sync, synced) = oneshot::channel();

    // Peers and policy come from BGPPeer / BGPAdvertisement / IPPool for this node.
    let node = NodeContext {
        node_name: args.node_name.clone(),
        router_id,
    };
    let bgp_task = tokio::spawn({
        let (client, speaker) = (client.clone(), speaker.clone());
        let heartbeat = health.heartbeat("bgp-config", PEERS_ALLOWANCE);
        async move {
            if synced.await.is_err() {
                return; // stopped before the first sync
            }
            if let Err(e) = peers::run(client, node, speaker, heartbeat).await {
                tracing::error!(error = %e, "BGP configuration from the API stopped");
            }
        }
    });
    let acks = ack::Acks::new(&client, &args.lease_namespace, &args.node_name);
    let (applied, applied_rx) = tokio::sync::watch::channel(None);
    let ack_task = tokio::spawn(acks.run(applied_rx));
    let agent = Agent {
        stores,
        notify,
        dp,
        speaker,
        dp_metrics,
        nh_metrics,
        nh_watch,
        heartbeat,
        health,
        first_sync: Some(first_sync),
        board,
        health_metrics,
        health_events: health_events::HealthEvents::new(client.clone(), args.node_name.clone()),
        local_pods,
        tx_check,
        applied,
    };
    let (speaker, dp, sig) = agent.run_loop(args, signals).await;
    ack_task.abort();
    let cordoned = match (sig, args.on_sigterm) {
        (Stop::Term, OnSigterm::Restart) => stop::node_cordoned(&client, &args.node_name).await,
        _ => None,
    };
    let all_gr = speaker.all_peers_graceful_restart();
    let (exit, why) = stop::decide(args.on_sigterm, sig, cordoned, all_gr);
    tracing::info!(?exit, reason = why, "stopping");
    match exit {
        Exit::Restart => stop::restart(speaker, bgp_task).await,
        Exit::Drain => {
            stop::drain(args, speaker, bgp_task).await;
            ack::Acks::new(&client, &args.lease_namespace, &args.node_name)
                .remove()
                .await;
            if args.datapath == DatapathKind::Ipvs {
                // The withdrawal is out, but the ToR may send this edge packets for a
                // moment more: forward them before the services go (a VIP left on lo
                // without its service would answer them with a RST).
                tracing::info!(linger = ?stop::IPVS_LINGER, "withdrawn; IPVS forwards on for the peers to converge");
                tokio::time::sleep(stop::IPVS_LINGER).await;
                remove_ipvs(dp);
            }
        }
    }
    Ok(())
}

/// SIGTERM and SIGINT, installed before the datapath is touched.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }
}

/// Next hops from the kernel, and this node's pods passed up its stack.
type EdgeResolver = WithLocalPods<KernelResolver>;

/// The datapath `--datapath` names, behind the seam (IPVS with its nftables guard
/// when `ipvs`, the kernel and nft opened at start-up, is given; else XDP), and
/// whether it was kept from an earlier agent (pinned XDP install, IPVS services)
/// and so forwarded on.
fn load_datapath(
    args: &RunArgs,
    resolver: EdgeResolver,
    ipvs: Option<(NetlinkKernel, NftCommand)>,
) -> anyhow::Result<(Box<dyn Datapath + Send>, bool)> {
    Ok(match ipvs {
        None => {
            let kept = XdpDatapath::is_installed(&args.pin_dir);
            (Box::new(load_xdp(args, resolver)?), kept)
        }
        Some((kernel, nft)) => {
            // The kernel resolves the real servers' next hops itself.
            drop(resolver);
            let dp = IpvsDatapath::with_guard(kernel, args.ipvs_config(), Box::new(nft))
                .context("reading what IPVS holds")?;
            ipvs_switches::switch_on_all()?;
            let kept = !dp.held().services.is_empty();
            (Box::new(dp), kept)
        }
    })
}

/// On exit, once the routes are withdrawn: IPVS services and the VIPs bound on `lo`
/// go (an empty desired state), then the guard's nftables table, so the node does
/// not keep answering for VIPs it no longer announces.
fn remove_ipvs(mut dp: Box<dyn Datapath + Send>) {
    match dp.apply(&DesiredState::default()) {
        Ok(st) => tracing::info!(services = st.vips_deleted, "IPVS services and VIPs removed"),
        Err(e) => {
            tracing::warn!(error = %e, kind = e.metric_label(), "removing the IPVS services on exit")
        }
    }
}

/// Loads the XDP program (reusing pinned maps) and attaches it. When there was no
/// earlier install in `--pin-dir` and the load or attach fails, what this start
/// pinned is removed, so a failed first start leaves no program or pin behind. Over
/// an earlier install a failure leaves that install as it was: its pinned link keeps
/// forwarding.
fn load_xdp(args: &RunArgs, resolver: EdgeResolver) -> anyhow::Result<XdpDatapath> {
    let interface = args.xdp_interface()?;
    let ct_insert_budget = args.ct_insert_budget.resolve()?;
    tracing::info!(
        ct_insert_budget,
        "conntrack inserts per VIP per CPU per second (0 = no limit)"
    );
    let opts = XdpOptions {
        pin_dir: Some(args.pin_dir.clone()),
        src4: args.src4(),
        src6: args.src6(),
        mtu: args.mtu,
        ct_insert_budget,
        decap_senders: args
            .failover_senders
            .iter()
            .map(|n| (n.network(), n.prefix()))
            .collect(),
        ..Default::default()
    };
    if opts.decap_senders.is_empty() {
        tracing::info!(
            "--failover-senders is empty: IPIP to this edge's VIPs is dropped, so a \
             Service's ringlb.io/accept-failover-from aliases receive nothing"
        );
    } else {
        tracing::info!(senders = ?args.failover_senders, "failover traffic accepted from");
    }
    let fresh = !XdpDatapath::is_installed(&args.pin_dir);
    let attached = XdpDatapath::load(&opts, Box::new(resolver))
        .context("loading the XDP datapath")
        .and_then(|mut dp| {
            let mode = dp
                .attach(interface, args.xdp_mode)
                .with_context(|| format!("attaching XDP to {interface}"))?;
            Ok((dp, mode))
        });
    match attached {
        Ok((dp, mode)) => {
            tracing::info!(interface, mode, "XDP attached");
            if dp.flow_filter() {
                spawn_flow_filter_rebuild(args.pin_dir.clone(), args.flow_filter_rebuild);
            }
            Ok(dp)
        }
        Err(e) if fresh => {
            if let Err(clean) = XdpDatapath::remove_pins(&args.pin_dir) {
                tracing::warn!(error = %clean, pin_dir = %args.pin_dir.display(), "removing what the failed start pinned");
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// `--ct-insert-budget`: `auto` or a number (0 = no limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtInsertBudget {
    Auto,
    Fixed(u32),
}

impl CtInsertBudget {
    /// The number the program gets: `auto` from this machine's possible CPUs.
    fn resolve(self) -> anyhow::Result<u32> {
        match self {
            CtInsertBudget::Fixed(n) => Ok(n),
            CtInsertBudget::Auto => ringlb_xdp::xdp::auto_ct_insert_budget()
                .context("--ct-insert-budget=auto: counting the possible CPUs"),
        }
    }
}

fn parse_ct_insert_budget(s: &str) -> Result<CtInsertBudget, String> {
    if s == "auto" {
        return Ok(CtInsertBudget::Auto);
    }
    s.parse().map(CtInsertBudget::Fixed).map_err(|_| {
        format!(
            "{s:?}: want `auto` or a number of inserts per VIP per CPU per second (0 = no limit)"
        )
    })
}

/// Rebuilds the XDP flow filter now (the loader left it all "maybe") and every
/// `every`, on a thread of its own over the pinned maps, for the life of the
/// process (`ringlb_xdp::flow_filter`).
fn spawn_flow_filter_rebuild(pin_dir: PathBuf, every: Duration) {
    let run = move || {
        loop {
            // a panic in one rebuild is logged and the next one still runs
            let once = std::panic::catch_unwind(|| {
                PinnedFlowFilter::open(&pin_dir).and_then(|f| f.rebuild())
            });
            let Ok(result) = once else {
                tracing::error!("the XDP flow filter rebuild panicked; retrying next interval");
                std::thread::sleep(every.max(Duration::from_secs(1)));
                continue;
            };
            match result {
                Ok(st) => tracing::debug!(
                    keys = st.keys,
                    set = st.set,
                    slots = st.slots,
                    fill = st.fill(),
                    took_ms = st.took.as_secs_f64() * 1e3,
                    "flow filter rebuilt"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "rebuilding the XDP flow filter (SYNs keep looking conntrack up where it has slots set)")
                }
            }
            std::thread::sleep(every.max(Duration::from_secs(1)));
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("flow-filter".into())
        .spawn(run)
    {
        tracing::warn!(error = %e, "no flow filter rebuild thread: every SYN looks conntrack up");
    }
}

impl Agent {
    /// Syncs on API events (debounced), refreshes next hops on kernel changes, reads
    /// counters, and resyncs at least every RESYNC, until SIGTERM/SIGINT. Returns the
    /// speaker for the drain and the datapath.
    async fn run_loop(
        mut self,
        args: &RunArgs,
        signals: Signals,
    ) -> (Arc<Speaker>, Box<dyn Datapath + Send>, Stop) {
        let cfg = args.sync_config();
        let Signals { mut term, mut int } = signals;
        let mut state = SyncState {
            board: self.board.clone(),
            local_pods: self.local_pods.clone(),
            ..Default::default()
        };
        let mut counters_tick = tokio::time::interval(COUNTERS);
        let mut due = true;
        let mut next_sync = tokio::time::Instant::now();
        let mut refresh_next_hops = Some("start");
        let mut last_nh_refresh = tokio::time::Instant::now();
        let mut last_sync_took = Duration::ZERO;
        let sig = loop {
            self.heartbeat.beat();
            // At least every RESYNC, whatever else wakes the loop: API events
            // push `next_sync` back, and a busy cluster must not starve the
            // refresh that re-probes STALE neighbours and covers lost notifications.
            if refresh_next_hops.is_none() && last_nh_refresh.elapsed() >= RESYNC {
                refresh_next_hops = Some("resync");
            }
            if let Some(trigger) = refresh_next_hops.take() {
                tokio::task::block_in_place(|| {
                    nexthops::refresh(self.dp.as_mut(), &self.nh_watch, &self.nh_metrics, trigger)
                });
                last_nh_refresh = tokio::time::Instant::now();
            }
            if due {
                let started = tokio::time::Instant::now();
                // The sync resolves next hops with blocking calls: keep it off the
                // workers that run the BGP sessions.
                tokio::task::block_in_place(|| {
                    sync::sync(
                        &self.stores,
                        &cfg,
                        self.dp.as_mut(),
                        &self.speaker,
                        &self.dp_metrics,
                        &mut state,
                    )
                });
                last_sync_took = started.elapsed();
                self.applied.send_if_modified(|rv| {
                    std::mem::replace(rv, state.applied_rv) != state.applied_rv
                });
                self.health.set_ready(state.synced_once && !state.retry);
                if state.synced_once
                    && let Some(tx) = self.first_sync.take()
                {
                    let _ = tx.send(());
                }
                self.health_metrics.count(&state.changed);
                let now = std::time::Instant::now();
                let reports = self.board.reports(now);
                self.health_metrics.update(&reports);
                let recheck =
                    self.health_events
                        .publish_unannounced(&self.stores.services, &reports, now);
                self.health_metrics.set_aliases(state.aliases);
                self.health_events
                    .publish(&self.stores.services, &state.changed);
                self.health_events
                    .publish_failovers(&self.stores.services, &state.failovers);
                self.health_events
                    .publish_bad_annotations(&self.stores.services, &state.bad_annotations);
                next_sync = tokio::time::Instant::now() + if state.retry { RETRY } else { RESYNC };
                // A hold-down that ends before then, or an unannounced VIP's grace:
                // sync at its end (plus a little, so the step sees it elapsed).
                if let Some(due) = state.due.into_iter().chain(recheck).min() {
                    let due = tokio::time::Instant::from_std(due) + Duration::from_millis(5);
                    next_sync = next_sync.min(due);
                }
            }
            due = true;
            tokio::select! {
                _ = self.notify.notified() => tokio::time::sleep(sync::debounce(last_sync_took)).await,
                _ = tokio::time::sleep_until(next_sync) => {}
                _ = tokio::time::sleep_until(last_nh_refresh + RESYNC) => {
                    refresh_next_hops = Some("resync");
                    due = false;
                }
                _ = self.nh_watch.notify.notified() => {
                    tokio::time::sleep(self.nh_watch.delay()).await;
                    refresh_next_hops = Some("netlink");
                    due = false;
                }
                _ = counters_tick.tick() => {
                    match self.dp.counters() {
                        Ok(c) => {
                            self.dp_metrics.update(&c);
                            if let Some(why) = self.tx_check.as_mut().and_then(|tx| tx.check(&c, &self.health, &self.board)) {
                                self.health_events.publish_on_node(tx_check::event(why));
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, kind = e.metric_label(), "reading the datapath's counters"),
                    }
                    due = false;
                }
                _ = term.recv() => break Stop::Term,
                _ = int.recv() => break Stop::Int,
            }
        };
        self.health.set_ready(false);
        (self.speaker, self.dp, sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_insert_budget_is_auto_a_number_or_a_clear_error() {
        assert_eq!(parse_ct_insert_budget("auto"), Ok(CtInsertBudget::Auto));
        assert_eq!(parse_ct_insert_budget("0"), Ok(CtInsertBudget::Fixed(0)));
        assert_eq!(
            parse_ct_insert_budget("50000"),
            Ok(CtInsertBudget::Fixed(50_000))
        );
        let e = parse_ct_insert_budget("lots").unwrap_err();
        assert!(e.contains("want `auto` or a number"), "{e}");
        assert!(parse_ct_insert_budget("-1").is_err());
        // auto: a positive number from this machine's CPUs
        assert!(CtInsertBudget::Auto.resolve().unwrap() > 0);
    }
}
