//! `ringlb-edge run`: the edge agent. It derives everything from the API and its flags.
//! It lives in the binary: it is the orchestration `main` does, over the library's pieces.
//!
//! ```text
//!  reflectors: Services, EndpointSlices
//!        │ any event ──> notify (coalesced for DEBOUNCE)
//!        ▼
//!  nexthop-watch thread: kernel route/neighbour/link changes ──> nh notify (DEBOUNCE
//!                        in nexthops) ──> XdpDatapath::refresh_next_hops (changed only)
//!  sync (this task owns the datapath):
//!     serving::build ──> tables::datapath_state ──> Datapath::apply (writes only the diff)
//!                    └─> tables::routes ──────────> Speaker::announce / withdraw
//!  peers::run task: BGPPeer/BGPAdvertisement/IPPool/Node ──> Speaker::set_peers,
//!                      BGPPeer status per node
//!  SIGTERM ──> Speaker::drain (GRACEFUL_SHUTDOWN, drain time, withdraw, Cease) ──> exit.
//!  The XDP program and its maps stay pinned, so a restart keeps forwarding and conntrack.
//! ```

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use ringlb_crds::{BGPPeer, IPPool};
use ringlb_ops::{CommonArgs, Health};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Mutex, Notify};

use crate::peers::{self, NodeContext, watch_into};
use crate::{serving, tables};
use ringlb_bgp::{RouteAttrs, Speaker};
use ringlb_maglev as maglev;
use ringlb_nexthop::KernelResolver;
use ringlb_xdp::Datapath;
use ringlb_xdp::abi::MAX_RING_SIZE;
use ringlb_xdp::metrics::XdpMetrics;
use ringlb_xdp::xdp::{AttachMode, DEFAULT_PIN_DIR, XdpDatapath, XdpOptions};

mod nexthops;

/// How long the agent waits for more events before it syncs.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// A full resync even without events; it also re-resolves every next hop, in case a
/// kernel notification was missed.
const RESYNC: Duration = Duration::from_secs(30);
/// How often the XDP counters are read into /metrics.
const COUNTERS: Duration = Duration::from_secs(10);
/// How soon a failed datapath apply is retried.
const RETRY: Duration = Duration::from_secs(1);

/// Flags of `ringlb-edge run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// This node's name (its labels select BGPPeers).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Interface that receives VIP traffic from the ToR; the XDP program attaches here.
    #[arg(long)]
    pub interface: String,
    /// XDP attach mode: auto tries native and falls back to generic with a warning.
    #[arg(long, value_enum, default_value = "auto")]
    pub xdp_mode: AttachMode,
    /// Where the XDP maps and link are pinned (a bpffs).
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Outer source address of IPv4 encapsulation (this edge's address toward the pods).
    #[arg(long)]
    pub source_v4: Option<Ipv4Addr>,
    /// Outer source address of IPv6 encapsulation.
    #[arg(long)]
    pub source_v6: Option<Ipv6Addr>,
    /// Largest packet after encapsulation; larger ones are counted and passed.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// BGP router id. Default: --source-v4.
    #[arg(long)]
    pub router_id: Option<Ipv4Addr>,
    /// TCP port for passive BGP opens; 0 turns passive open off.
    #[arg(long, default_value_t = 179)]
    pub bgp_listen_port: u16,
    /// Maglev table size per VIP:port: a prime from 251 to 65537 (the XDP ring's size).
    #[arg(long, default_value_t = maglev::DEFAULT_TABLE_SIZE)]
    pub ring_size: u32,
    /// Serve LoadBalancer Services that set no loadBalancerClass.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub default_class: bool,
    /// On SIGTERM, how long routes stay announced with GRACEFUL_SHUTDOWN before they
    /// are withdrawn.
    #[arg(long, default_value_t = 30)]
    pub drain_seconds: u64,
}

struct Stores {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

/// Runs the edge agent until SIGTERM/SIGINT.
pub async fn run(common: &CommonArgs, args: &RunArgs) -> anyhow::Result<()> {
    maglev::Table::build(
        &[maglev::Backend {
            addr: Ipv4Addr::LOCALHOST.into(),
            port: 1,
            weight: 1,
        }],
        args.ring_size,
    )
    .with_context(|| format!("--ring-size {}", args.ring_size))?;
    anyhow::ensure!(
        args.ring_size <= MAX_RING_SIZE,
        "--ring-size {}: the XDP datapath holds rings of at most {MAX_RING_SIZE} slots",
        args.ring_size
    );
    let router_id = args
        .router_id
        .or(args.source_v4)
        .context("--router-id (or --source-v4) is required for BGP")?;

    let health = Health::new();
    let registry = Arc::new(Mutex::new(Registry::with_prefix("ringlb")));
    let (speaker, xdp_metrics, nh_metrics) = {
        let mut r = registry.lock().await;
        let speaker = Arc::new(Speaker::start(args.bgp_listen_port, &mut r)?);
        (
            speaker,
            XdpMetrics::register(&mut r),
            nexthops::Metrics::register(&mut r),
        )
    };
    let (addr, _ops) = ringlb_ops::serve_ops(common.metrics_addr, registry, health.clone())
        .await
        .with_context(|| format!("binding --metrics-addr {}", common.metrics_addr))?;
    tracing::info!(%addr, "serving /metrics /healthz /readyz");

    let opts = XdpOptions {
        pin_dir: Some(args.pin_dir.clone()),
        src4: args.source_v4,
        src6: args.source_v6,
        mtu: args.mtu,
        ..Default::default()
    };
    let resolver = KernelResolver::default();
    let nh_watch = nexthops::Watcher::start(&resolver, &nh_metrics);
    let mut dp =
        XdpDatapath::load(&opts, Box::new(resolver)).context("loading the XDP datapath")?;
    let mode = dp
        .attach(&args.interface, args.xdp_mode)
        .with_context(|| format!("attaching XDP to {}", args.interface))?;
    tracing::info!(interface = %args.interface, mode, "XDP attached");

    let client = common.kube_client().await?;
    check_crds(&client).await?;
    let notify = Arc::new(Notify::new());
    let all = watcher::Config::default();
    let stores = Stores {
        services: watch_into(
            Api::<Service>::all(client.clone()),
            all.clone(),
            notify.clone(),
        )
        .0,
        slices: watch_into(
            Api::<EndpointSlice>::all(client.clone()),
            all,
            notify.clone(),
        )
        .0,
    };
    for (kind, ready) in [
        ("Service", stores.services.wait_until_ready().await),
        ("EndpointSlice", stores.slices.wait_until_ready().await),
    ] {
        ready.with_context(|| format!("first list of {kind}s"))?;
    }
    // Peers and policy come from BGPPeer / BGPAdvertisement / IPPool for this node.
    let node = NodeContext {
        node_name: args.node_name.clone(),
        router_id,
    };
    let bgp_task = tokio::spawn({
        let (client, speaker) = (client.clone(), speaker.clone());
        async move {
            if let Err(e) = peers::run(client, node, speaker).await {
                tracing::error!(error = %e, "BGP configuration from the API stopped");
            }
        }
    });

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut state = SyncState::default();
    let mut counters_tick = tokio::time::interval(COUNTERS);
    let mut due = true;
    let mut next_sync = tokio::time::Instant::now();
    let mut refresh_next_hops = Some("start");
    let mut last_nh_refresh = tokio::time::Instant::now();
    loop {
        // At least every RESYNC, whatever else wakes the loop: API events
        // push `next_sync` back, and a busy cluster must not starve the
        // refresh that re-probes STALE neighbours and covers lost notifications.
        if refresh_next_hops.is_none() && last_nh_refresh.elapsed() >= RESYNC {
            refresh_next_hops = Some("resync");
        }
        if let Some(trigger) = refresh_next_hops.take() {
            tokio::task::block_in_place(|| {
                nexthops::refresh(&mut dp, &nh_watch, &nh_metrics, trigger)
            });
            last_nh_refresh = tokio::time::Instant::now();
        }
        if due {
            // The sync resolves next hops with blocking calls: keep it off the workers
            // that run the BGP sessions.
            tokio::task::block_in_place(|| {
                sync(&stores, args, &mut dp, &speaker, &xdp_metrics, &mut state)
            });
            health.set_ready(state.synced_once && !state.retry);
            next_sync = tokio::time::Instant::now() + if state.retry { RETRY } else { RESYNC };
        }
        due = true;
        tokio::select! {
            _ = notify.notified() => tokio::time::sleep(DEBOUNCE).await,
            _ = tokio::time::sleep_until(next_sync) => {}
            _ = tokio::time::sleep_until(last_nh_refresh + RESYNC) => {
                refresh_next_hops = Some("resync");
                due = false;
            }
            _ = nh_watch.notify.notified() => {
                tokio::time::sleep(nh_watch.delay()).await;
                refresh_next_hops = Some("netlink");
                due = false;
            }
            _ = counters_tick.tick() => {
                match dp.counters() {
                    Ok(c) => xdp_metrics.update(&c),
                    Err(e) => tracing::warn!(error = %e, "reading XDP counters"),
                }
                due = false;
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!(
        drain_seconds = args.drain_seconds,
        "shutting down: draining BGP"
    );
    health.set_ready(false);
    tokio::select! {
        _ = speaker.drain(Duration::from_secs(args.drain_seconds)) => {}
        _ = term.recv() => { tracing::warn!("second signal: cutting the drain short"); speaker.withdraw_all(); }
    }
    bgp_task.abort();
    let _ = bgp_task.await;
    match Arc::try_unwrap(speaker) {
        Ok(speaker) => speaker.shutdown().await,
        Err(_) => tracing::warn!("speaker still shared at exit; sessions close with the process"),
    }
    tracing::info!("edge agent stopped; XDP program and maps stay pinned for the next start");
    Ok(())
}

#[derive(Default)]
struct SyncState {
    announced: BTreeSet<IpNetwork>,
    synced_once: bool,
    /// The last apply failed: sync again soon without waiting for an event.
    retry: bool,
    /// Maglev tables of the last sync, reused while their backends do not change.
    tables: tables::Tables,
}

fn sync(
    stores: &Stores,
    args: &RunArgs,
    dp: &mut XdpDatapath,
    speaker: &Speaker,
    metrics: &XdpMetrics,
    st: &mut SyncState,
) {
    let start = Instant::now();
    let services: Vec<Service> = stores
        .services
        .state()
        .iter()
        .map(|s| (**s).clone())
        .collect();
    let slices: Vec<EndpointSlice> = stores
        .slices
        .state()
        .iter()
        .map(|s| (**s).clone())
        .collect();
    let want = serving::build(&services, &slices, args.default_class);
    for s in &want.skipped {
        tracing::warn!(service = %s.service, reason = %s.reason, "not served");
    }
    let (state, problems) = tables::datapath_state(&want, args.ring_size, &mut st.tables);
    for p in &problems {
        tracing::warn!(what = %p.what, reason = %p.reason, "not programmed");
    }
    let applied = Instant::now();
    let result = dp.apply(&state);
    metrics.observe_apply(applied.elapsed().as_secs_f64(), result.as_ref().map(|_| ()));
    let routes = match result {
        Ok(stats) => {
            tracing::debug!(?stats, vips = state.services.len(), "datapath applied");
            st.retry = false;
            tables::routes(&want, &state)
        }
        Err(e) => {
            // Announce nothing new and withdraw nothing until the datapath is right.
            tracing::error!(error = %e, kind = e.metric_label(), "datapath apply failed; retrying");
            st.retry = true;
            st.announced.clone()
        }
    };
    for gone in st.announced.difference(&routes) {
        speaker.withdraw(*gone);
    }
    speaker.announce_many(
        routes
            .difference(&st.announced)
            .map(|r| (*r, RouteAttrs::default())),
    );
    st.announced = routes;
    st.synced_once |= !st.retry;
    tracing::debug!(
        elapsed_ms = start.elapsed().as_millis() as u64,
        announced = st.announced.len(),
        "synced"
    );
}

/// Exits with a clear message when ringlb's CRDs are not installed.
async fn check_crds(client: &kube::Client) -> anyhow::Result<()> {
    for (kind, res) in [
        (
            "BGPPeer",
            Api::<BGPPeer>::all(client.clone())
                .list(&Default::default())
                .await
                .map(|_| ()),
        ),
        (
            "IPPool",
            Api::<IPPool>::all(client.clone())
                .list(&Default::default())
                .await
                .map(|_| ()),
        ),
    ] {
        if let Err(kube::Error::Api(e)) = &res
            && e.code == 404
        {
            anyhow::bail!(
                "the {kind} CRD is not installed: kubectl apply -f crds/ (or install the Helm chart)"
            );
        }
        res.with_context(|| format!("listing {kind}s"))?;
    }
    Ok(())
}
