//! The controller's tasks and the order they start in (docs/controller.md).
//!
//! ```text
//!  check CRDs ─► ready ─► acquire the Lease ─► rebuild ─► Namespaces listed ─► running
//!                               │
//!                               └─ hold: renew every retry period; lost ─► exit(1) at once
//!
//!  running (the leader only):
//!   namespace watch ─► Store<Namespace> ──────────────────────────┐
//!   IPPool watch ─► pools::sync_pools ─► reconcile_all ─► reconcile::run (Service controller)
//!                                        (its EndpointSlice watch: the BackendsReady condition)
//!   pools::status_writer ◄── pools_dirty ◄────────────────────────┘
//!   edge Lease watch ─► Store<Lease> (the cleanup finalizer's acknowledgements)
//! ```
//!
//! Liveness: the Lease loop (`leader-election`), the Service controller
//! (`service-controller`), the IPPool watch (`ippool-watch`), the Namespace watch
//! (`namespace-watch`) and the edge Lease watch (`edge-lease-watch`) each beat a [`Heartbeat`] with the allowance `--stall-timeout`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use ringlb_crds::IPPool;
use ringlb_ops::{Health, Heartbeat};
use tokio::task::JoinHandle;

use crate::events::Events;
use crate::ipam::Ipam;
use crate::leader::{self, Elector, LeaderConfig};
use crate::metrics::Metrics;
use crate::{edge_acks, pools, rebuild, reconcile, routing_watch};

/// How often pool status is written at most.
const POOL_STATUS_INTERVAL: Duration = Duration::from_millis(500);

/// What the flags decide.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Also serve LoadBalancer Services without `spec.loadBalancerClass`.
    pub default_class: bool,
    /// Leader election; `None` runs as the only writer.
    pub leader: Option<LeaderConfig>,
    /// This replica's name in Events (`reportingInstance`).
    pub identity: String,
    /// How long a loop may go without a heartbeat before `/healthz` fails.
    pub stall_timeout: Duration,
    /// The release namespace: the edges' Leases (`ringlb_crds::edge_ack`).
    pub namespace: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Leader(#[from] leader::Error),
    #[error(
        "--stall-timeout ({stall_timeout:?}) must be longer than --retry-period + \
         --renew-deadline ({round:?}), the longest a leader goes between two renewals"
    )]
    StallTimeout {
        stall_timeout: Duration,
        round: Duration,
    },
    #[error(
        "the IPPool CRD (ippools.ringlb.io) is not installed: apply crds/*.yaml \
         (or install the Helm chart) and restart"
    )]
    CrdsMissing,
    #[error("checking that the ringlb CRDs are installed: {0}")]
    CrdCheck(#[source] kube::Error),
    #[error(transparent)]
    Rebuild(#[from] rebuild::Error),
    #[error("first list of Namespaces: {0}")]
    Namespaces(#[source] reflector::store::WriterDropped),
    #[error("first list of the edges' Leases: {0}")]
    EdgeLeases(#[source] reflector::store::WriterDropped),
    #[error("the Service controller stopped")]
    ControllerStopped,
    #[error("the leader election task failed: {0}")]
    LeaderTask(#[source] tokio::task::JoinError),
}

impl Settings {
    pub fn validate(&self) -> Result<(), Error> {
        let Some(leader) = &self.leader else {
            return Ok(());
        };
        leader.validate()?;
        let round = leader.retry_period + leader.renew_deadline;
        if self.stall_timeout <= round {
            return Err(Error::StallTimeout {
                stall_timeout: self.stall_timeout,
                round,
            });
        }
        Ok(())
    }
}

/// Fails with an operator-readable message when the IPPool CRD is missing.
pub async fn check_crds(client: &Client) -> Result<(), Error> {
    let api: Api<IPPool> = Api::all(client.clone());
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(Error::CrdsMissing),
        Err(e) => Err(Error::CrdCheck(e)),
    }
}

/// Runs the controller until `shutdown` completes (`Ok`) or something stops it.
pub async fn run(
    client: Client,
    settings: Settings,
    health: &Health,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    check_crds(&client).await?;
    let events = Events::new(client.clone(), Some(settings.identity.clone()));
    let mut shutdown = std::pin::pin!(shutdown);

    // Standby replicas are healthy and ready; only the leader writes.
    health.set_ready(true);
    let Some(mut lost) =
        become_leader(&client, &settings, health, &metrics, shutdown.as_mut()).await
    else {
        tracing::info!("shutting down (standby)");
        return Ok(());
    };

    let ipam = Arc::new(Mutex::new(Ipam::new()));
    rebuild::rebuild(&client, &ipam, &events, &metrics, settings.default_class).await?;
    let loops = start_loops(&client, &settings, health, ipam, events, metrics).await?;

    tracing::info!(default_class = settings.default_class, "controller running");
    let heartbeat = health.heartbeat("service-controller", settings.stall_timeout);
    let services = reconcile::run(loops.ctx, loops.retry_rx, loops.reconcile_all, heartbeat);
    let result = tokio::select! {
        () = services => Err(Error::ControllerStopped),
        res = &mut lost => {
            // `hold_or_exit` never returns: only a panic in it ends the task.
            let Err(e) = res;
            Err(Error::LeaderTask(e))
        }
        () = &mut shutdown => {
            tracing::info!("shutting down; releasing the Lease");
            // Stop renewing first, or a renewal could re-take the Lease after release.
            lost.abort();
            if let Some(cfg) = &settings.leader {
                Elector::new(client.clone(), cfg.clone()).release().await;
            }
            Ok(())
        }
    };
    for task in loops.tasks {
        task.abort();
    }
    result
}

/// Makes this replica the writer: acquires the Lease (when electing) and spawns the
/// task that renews it. `None` when `shutdown` came first.
async fn become_leader(
    client: &Client,
    settings: &Settings,
    health: &Health,
    metrics: &Metrics,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<JoinHandle<Infallible>> {
    let Some(cfg) = &settings.leader else {
        // Without election this replica is the (only) writer.
        metrics.leader.set(1);
        return Some(tokio::spawn(futures::future::pending()));
    };
    let heartbeat = health.heartbeat("leader-election", settings.stall_timeout);
    let mut elector = Elector::new(client.clone(), cfg.clone());
    tokio::select! {
        () = elector.acquire(&heartbeat) => {}
        () = shutdown => return None,
    }
    metrics.leader.set(1);
    Some(tokio::spawn(hold_or_exit(elector, heartbeat)))
}

/// Renews the Lease. Once it is lost, exits at once, wherever the rest of the program
/// is (start-up included): a replica that lost the Lease must not write again. A
/// restart makes it a candidate.
async fn hold_or_exit(mut elector: Elector, heartbeat: Heartbeat) -> Infallible {
    let e = elector.hold(&heartbeat).await;
    tracing::error!(error = %e, "stopping: no longer the leader, so no more writes");
    std::process::exit(1)
}

/// What the Service controller needs from the loops beside it.
struct Loops {
    ctx: Arc<reconcile::Ctx>,
    retry_rx: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    reconcile_all: mpsc::UnboundedReceiver<()>,
    tasks: Vec<JoinHandle<()>>,
}

/// Starts the Namespace and IPPool watches and the pool status writer, once the
/// Namespaces are listed.
async fn start_loops(
    client: &Client,
    settings: &Settings,
    health: &Health,
    ipam: Arc<Mutex<Ipam>>,
    events: Events,
    metrics: Metrics,
) -> Result<Loops, Error> {
    let (ns_reader, ns_writer) = reflector::store::<Namespace>();
    let ns_heartbeat = health.heartbeat("namespace-watch", settings.stall_timeout);
    let ns_task = tokio::spawn(watch_namespaces(
        Api::all(client.clone()),
        ns_writer,
        ns_heartbeat,
    ));
    // Pools with a namespaceSelector need the namespaces' labels: allocating before
    // the first list would pick a wrong pool, and a Service never moves afterwards.
    ns_reader
        .wait_until_ready()
        .await
        .map_err(Error::Namespaces)?;
    // The edges' acknowledgements: a cleanup before their first list would wait for
    // no edge at all.
    let (acks_reader, acks_writer) = reflector::store::<Lease>();
    let acks_changed = Arc::new(tokio::sync::Notify::new());
    let acks_task = tokio::spawn(edge_acks::watch(
        Api::namespaced(client.clone(), &settings.namespace),
        acks_writer,
        acks_changed.clone(),
        health.heartbeat("edge-lease-watch", settings.stall_timeout),
    ));
    acks_reader
        .wait_until_ready()
        .await
        .map_err(Error::EdgeLeases)?;

    let pools_dirty = Arc::new(tokio::sync::Notify::new());
    pools_dirty.notify_one();
    let (ctx, retry_rx) = reconcile::Ctx::new(
        client.clone(),
        ipam.clone(),
        events,
        metrics.clone(),
        settings.default_class,
        reconcile::Caches {
            namespaces: ns_reader,
            edge_acks: acks_reader,
        },
        pools_dirty.clone(),
    );
    let retry_task = tokio::spawn(edge_acks::retry_on_change(ctx.clone(), acks_changed));

    // IPPools: every change replaces the allocator's pool set and re-checks all Services.
    let (all_tx, all_rx) = mpsc::unbounded::<()>();
    let (pool_reader, pool_writer) = reflector::store::<IPPool>();
    let pool_api: Api<IPPool> = Api::all(client.clone());
    let pool_task = tokio::spawn(pools::sync_pools(
        pool_api.clone(),
        pool_writer,
        ipam.clone(),
        pools_dirty.clone(),
        all_tx.clone(),
        health.heartbeat("ippool-watch", settings.stall_timeout),
    ));
    let routing_task = tokio::spawn(routing_watch::watch_routing(
        client.clone(),
        ctx.routing.clone(),
        all_tx,
        pools_dirty.clone(),
        health.heartbeat("bgp-objects-watch", settings.stall_timeout),
    ));
    let status_task = tokio::spawn(pools::status_writer(
        pool_api,
        pool_reader,
        pools::StatusInputs {
            ipam,
            routing: ctx.routing.clone(),
        },
        metrics,
        pools_dirty,
        POOL_STATUS_INTERVAL,
    ));
    Ok(Loops {
        ctx,
        retry_rx,
        reconcile_all: all_rx,
        tasks: vec![
            ns_task,
            acks_task,
            retry_task,
            pool_task,
            routing_task,
            status_task,
        ],
    })
}

/// Keeps the Namespace cache (labels for `namespaceSelector`) current.
async fn watch_namespaces(
    api: Api<Namespace>,
    writer: reflector::store::Writer<Namespace>,
    heartbeat: Heartbeat,
) {
    let events = watcher(api, watcher::Config::default())
        .backoff(ringlb_ops::WatchBackoff::default())
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    while let Some(ev) = heartbeat.next(&mut events).await {
        if let Err(e) = ev {
            tracing::debug!(error = %e, "namespace watch");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(stall_timeout: Duration) -> Settings {
        Settings {
            default_class: true,
            leader: Some(crate::leader::tests::config()),
            identity: "me".into(),
            stall_timeout,
            namespace: "ringlb-system".into(),
        }
    }

    #[test]
    fn the_stall_timeout_must_outlast_a_leader_round() {
        assert!(settings(Duration::from_secs(60)).validate().is_ok());
        let err = settings(Duration::from_secs(12)).validate().unwrap_err();
        assert!(err.to_string().contains("--stall-timeout"), "{err}");
        // Without election there is no Lease round to outlast.
        let mut single = settings(Duration::from_secs(1));
        single.leader = None;
        assert!(single.validate().is_ok());
    }
}
