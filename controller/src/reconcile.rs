//! The Service reconciler: one `kube_runtime::Controller` over Services, sharing one
//! [`Ipam`] behind a mutex (allocation decisions are made under the lock, API writes
//! after it is released).
//!
//! ```text
//!  watch Services ──reflect──► Store ──► Controller ──► reconcile(svc) ──► status patch
//!        │ Delete / relist                     ▲   ▲                    └─► Event, metrics
//!        └──► forget(key): release ────────────┘   │ retry pending (IP released)
//!  watch IPPools ──► set_pools ──► reconcile_all ───┤
//!  watch EndpointSlices ──reflect──► Store ─────────┤ its Service (kubernetes.io/service-name);
//!        └─ listed (InitDone) ──► reconcile_all ────┘ the BackendsReady condition
//! ```
//!
//! A ringlb Service carries the cleanup finalizer (`cleanup`): deleted or no longer
//! ours, its VIP leaves the status first, and only once every live edge has
//! acknowledged that status (its Lease, at most `CLEANUP_MAX_WAIT`) is the address
//! released and the finalizer removed. A Delete seen on the watch (or a Service missing
//! from a relist) releases whatever is still held; see docs/controller.md.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::{Stream, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, ResourceExt};
use ringlb_ops::Heartbeat;
use tracing::Instrument;

use crate::backends::{
    BACKENDS_CONDITION_TYPE, BackendsState, NO_ENDPOINTS_OF_FAMILY, SERVICE_NAME_LABEL,
    backends_state, slice_of,
};
use crate::cleanup::{
    CLEANUP_MAX_WAIT, Step, Withdrawn, cleanup_step, finalizer_patch, has_finalizer,
};
use crate::events::Events;
use crate::ipam::request::{is_ours, request_from_service, service_key, status_ips};
use crate::ipam::{Family, Ipam};
use crate::metrics::Metrics;
use crate::status::{FIELD_MANAGER, WantedStatus, has_our_status, status_patch};

/// Requeue after success: a periodic re-check (cheap: no write when in sync).
const RESYNC: Duration = Duration::from_secs(600);
/// Requeue after a refusal, in case nothing else triggers a retry.
const REFUSED_RETRY: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing status of Service {key}: {source}")]
    Status {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} the finalizer {finalizer} of Service {key}: {source}", finalizer = crate::cleanup::FINALIZER)]
    Finalizer {
        key: String,
        action: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Services being cleaned up: when their status was seen without our VIP, and its
/// resourceVersion then (the edges' acknowledgements must reach it).
type Withdrawals = HashMap<ObjectRef<Service>, (Instant, Option<u64>)>;

/// The caches the reconciler reads beside its own.
pub struct Caches {
    /// Namespace labels, for pools' `namespaceSelector`.
    pub namespaces: Store<Namespace>,
    /// The edges' Leases (`ringlb_crds::edge_ack`): how far each has acted on the
    /// Services.
    pub edge_acks: Store<Lease>,
}

/// Shared state of the reconciler.
pub struct Ctx {
    pub client: Client,
    pub ipam: Arc<Mutex<Ipam>>,
    pub events: Events,
    pub metrics: Metrics,
    pub default_class: bool,
    pub namespaces: Store<Namespace>,
    /// The Service reflector's cache (the Controller's own store).
    services: Store<Service>,
    services_writer: Mutex<Option<reflector::store::Writer<Service>>>,
    /// EndpointSlices of Services (for the BackendsReady condition), and whether
    /// they have been listed once (before that the condition is left as it is).
    slices: Store<EndpointSlice>,
    slices_writer: Mutex<Option<reflector::store::Writer<EndpointSlice>>>,
    slices_listed: AtomicBool,
    /// Set when allocations change, so the pool status writer runs.
    pub pools_dirty: Arc<tokio::sync::Notify>,
    /// The BGP objects' facts, for the `ringlb.io/Announced` condition.
    pub routing: crate::routing_watch::RoutingCell,
    /// Refused Services, retried when an address is released.
    pending: Mutex<HashSet<ObjectRef<Service>>>,
    retry_tx: mpsc::UnboundedSender<ObjectRef<Service>>,
    /// (service, ip) already warned about being outside every pool.
    warned_outside: Mutex<HashSet<(String, IpAddr)>>,
    /// Consecutive API failures per Service, for the error backoff.
    failures: Mutex<HashMap<ObjectRef<Service>, u32>>,
    /// Services being cleaned up: when their status was seen without our VIP, and
    /// its resourceVersion then.
    withdrawn: Mutex<Withdrawals>,
    /// The edges' Leases (`ringlb_crds::edge_ack`): how far each has acted on the
    /// Services.
    edge_acks: Store<Lease>,
    /// The longest the edges get to withdraw a VIP before its address is released
    /// ([`CLEANUP_MAX_WAIT`]; shorter in tests).
    pub cleanup_wait: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the data half-updated in a way
    // that matters more than stopping the controller would; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ctx {
    pub fn new(
        client: Client,
        ipam: Arc<Mutex<Ipam>>,
        events: Events,
        metrics: Metrics,
        default_class: bool,
        caches: Caches,
        pools_dirty: Arc<tokio::sync::Notify>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<ObjectRef<Service>>) {
        let Caches {
            namespaces,
            edge_acks,
        } = caches;
        let (retry_tx, retry_rx) = mpsc::unbounded();
        let (services, services_writer) = reflector::store();
        let (slices, slices_writer) = reflector::store();
        let ctx = Ctx {
            client,
            ipam,
            events,
            metrics,
            default_class,
            namespaces,
            services,
            services_writer: Mutex::new(Some(services_writer)),
            slices,
            slices_writer: Mutex::new(Some(slices_writer)),
            slices_listed: AtomicBool::new(false),
            pools_dirty,
            routing: Default::default(),
            pending: Mutex::default(),
            retry_tx,
            warned_outside: Mutex::default(),
            failures: Mutex::default(),
            withdrawn: Mutex::default(),
            edge_acks,
            cleanup_wait: CLEANUP_MAX_WAIT,
        };
        (Arc::new(ctx), retry_rx)
    }

    /// Re-queues every refused Service (an address was released).
    pub fn retry_pending(&self) {
        let pending = std::mem::take(&mut *lock(&self.pending));
        for r in pending {
            let _ = self.retry_tx.unbounded_send(r);
        }
    }

    /// Re-queues every Service waiting for the edges (an edge Lease changed).
    pub fn retry_withdrawn(&self) {
        let waiting: Vec<_> = lock(&self.withdrawn).keys().cloned().collect();
        for r in waiting {
            let _ = self.retry_tx.unbounded_send(r);
        }
    }

    /// Every edge's acknowledgement (`ringlb_crds::edge_ack`).
    fn edge_acks(&self) -> Vec<ringlb_crds::edge_ack::EdgeAck> {
        self.edge_acks
            .state()
            .iter()
            .filter_map(|l| ringlb_crds::edge_ack::EdgeAck::from_lease(l))
            .collect()
    }

    /// Releases everything a Service held (deleted, or no longer ours).
    pub fn forget(&self, key: &str) -> Vec<IpAddr> {
        let released = lock(&self.ipam).release(key);
        lock(&self.warned_outside).retain(|(k, _)| k != key);
        if !released.is_empty() {
            tracing::info!(service = %key, ?released, "released");
            self.metrics.releases.inc_by(released.len() as u64);
            self.pools_dirty.notify_one();
            self.retry_pending();
        }
        released
    }

    /// The BackendsReady condition `svc` with the VIPs `vips` should carry, with the
    /// Announced one; `None` until the EndpointSlices are listed.
    fn backends(&self, svc: &Service, vips: &[IpAddr]) -> Option<BackendsState> {
        if !self.slices_listed.load(Ordering::Acquire) {
            return None;
        }
        let own: Vec<Arc<EndpointSlice>> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| slice_of(s, svc))
            .collect();
        let own: Vec<&EndpointSlice> = own.iter().map(AsRef::as_ref).collect();
        let mut state = backends_state(svc, vips, &own);
        state.announced =
            crate::routing_watch::current(&self.routing).and_then(|r| r.service(vips));
        Some(state)
    }

    /// After a (re)list: releases Services the allocator knows but the list lacks.
    fn forget_missing(&self, present: &HashSet<String>) {
        let gone: Vec<String> = lock(&self.ipam)
            .services()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.forget(&key);
        }
    }
}

/// Writes the status when it differs; returns whether the allocation part (ingress,
/// IPAllocated) changed, i.e. whether there is something to announce.
async fn write_status(
    api: &Api<Service>,
    svc: &Service,
    key: &str,
    wanted: &WantedStatus,
    backends: Option<&BackendsState>,
) -> Result<bool, Error> {
    let now = Time(Timestamp::now());
    let Some(patch) = status_patch(svc, wanted, backends, now.clone()) else {
        return Ok(false);
    };
    // A BackendsReady flip alone is no new allocation or refusal to announce.
    let allocation_changed = backends.is_none() || status_patch(svc, wanted, None, now).is_some();
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(&svc.name_any(), &pp, &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Status {
            key: key.to_string(),
            source,
        })?;
    Ok(allocation_changed)
}

/// Reconciles one Service. Idempotent: with nothing to change it writes nothing.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let key = service_key(&svc);
    let span = tracing::info_span!("service", service = %key);
    let start = Instant::now();
    let res = reconcile_inner(&svc, &ctx, &key).instrument(span).await;
    ctx.metrics
        .reconcile_duration
        .observe(start.elapsed().as_secs_f64());
    if res.is_ok() {
        lock(&ctx.failures).remove(&ObjectRef::from_obj(&*svc));
    }
    res
}

async fn reconcile_inner(svc: &Service, ctx: &Ctx, key: &str) -> Result<Action, Error> {
    let oref = ObjectRef::from_obj(svc);
    let ns = svc.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);

    let deleting = svc.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer(svc) {
        // Being deleted without our finalizer (deleted before it could be added),
        // held by someone else's: the edges still serve its VIP until the object is
        // gone, so the address stays taken until the Delete event (or a relist
        // without it) releases it.
        lock(&ctx.pending).remove(&oref);
        return Ok(Action::await_change());
    }
    if deleting || !is_ours(svc, ctx.default_class) {
        lock(&ctx.pending).remove(&oref);
        return clean_up(&api, svc, ctx, key, deleting).await;
    }
    lock(&ctx.withdrawn).remove(&oref);
    // The finalizer goes on before the first VIP is written, so no VIP is ever
    // announced for a Service that can disappear without the controller seeing it.
    let added;
    let svc = match finalizer_patch(svc, true) {
        None => svc,
        Some(patch) => {
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            added = api
                .patch(&svc.name_any(), &pp, &Patch::Merge(&patch))
                .await
                .map_err(|source| Error::Finalizer {
                    key: key.to_string(),
                    action: "adding",
                    source,
                })?;
            tracing::debug!("finalizer added");
            &added
        }
    };

    let ns_labels = ctx
        .namespaces
        .get(&ObjectRef::new(&ns))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    let result = request_from_service(svc, ns_labels.into_iter().collect())
        .and_then(|req| lock(&ctx.ipam).ensure(&req, &status_ips(svc)));

    // A Delete may have been applied while this reconcile ran on the old object; the
    // reflector removes the object from the store before `forget` runs, so checking
    // the store after `ensure` closes the window in which we could re-take its IPs.
    if result.is_ok() && ctx.services.get(&oref).is_none() {
        ctx.forget(key);
        return Ok(Action::await_change());
    }

    let vips = match &result {
        Ok(out) => out.ips.clone(),
        Err(_) => status_ips(svc),
    };
    let backends = ctx.backends(svc, &vips);
    match result {
        Ok(out) => {
            lock(&ctx.pending).remove(&oref);
            for ip in &out.allocated {
                ctx.metrics.allocated(Family::of(ip).label());
            }
            ctx.metrics.adoptions.inc_by(out.adopted.len() as u64);
            if !out.allocated.is_empty() || !out.released.is_empty() || !out.adopted.is_empty() {
                ctx.pools_dirty.notify_one();
            }
            if !out.released.is_empty() {
                ctx.metrics.releases.inc_by(out.released.len() as u64);
                ctx.retry_pending();
            }
            for ip in &out.outside_pools {
                if lock(&ctx.warned_outside).insert((key.to_string(), *ip)) {
                    tracing::warn!(%ip, "Service keeps an address no IPPool covers any more");
                    ctx.metrics.warned("ip_outside_pools");
                    let note = format!(
                        "keeps {ip}, which no IPPool covers any more; it is not renumbered"
                    );
                    ctx.events.warn(svc, "IPOutsidePools", note).await;
                }
            }
            for m in &out.missing_optional {
                tracing::debug!(reason = %m, "optional family not allocated (PreferDualStack)");
            }
            let wanted = WantedStatus::Allocated(out.ips.clone());
            let allocation_changed =
                write_status(&api, svc, key, &wanted, backends.as_ref()).await?;
            warn_unservable(svc, ctx, backends.as_ref()).await;
            if allocation_changed {
                tracing::info!(ips = %join(&out.ips), "allocated");
                ctx.events
                    .normal(svc, "IPAllocated", format!("allocated {}", join(&out.ips)))
                    .await;
            }
            Ok(Action::requeue(RESYNC))
        }
        Err(refusal) => {
            lock(&ctx.pending).insert(oref);
            let wanted = WantedStatus::Refused {
                reason: refusal.reason().into(),
                message: refusal.to_string(),
            };
            let allocation_changed =
                write_status(&api, svc, key, &wanted, backends.as_ref()).await?;
            warn_unservable(svc, ctx, backends.as_ref()).await;
            if allocation_changed {
                tracing::warn!(reason = refusal.reason(), "{refusal}");
                ctx.metrics.refused(refusal.metric_label());
                ctx.events
                    .warn(svc, refusal.reason(), refusal.to_string())
                    .await;
            }
            Ok(Action::requeue(REFUSED_RETRY))
        }
    }
}

/// A Warning Event when the BackendsReady condition turns to `NoEndpointsOfFamily`
/// (a VIP none of whose pods has an address of its family: the edges do not announce
/// it); once per change of the condition's reason, as `svc` is the object before the
/// status write.
async fn warn_unservable(svc: &Service, ctx: &Ctx, backends: Option<&BackendsState>) {
    let Some(b) = backends.filter(|b| b.reason == NO_ENDPOINTS_OF_FAMILY) else {
        return;
    };
    let before = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == BACKENDS_CONDITION_TYPE);
    if before.is_some_and(|c| c.reason == b.reason) {
        return;
    }
    tracing::warn!(reason = b.reason, "{}", b.message);
    ctx.metrics.warned("no_endpoints_of_family");
    ctx.events
        .warn_backends(svc, b.reason, b.message.clone())
        .await;
}

/// A Service that is deleted or no longer ours: its VIP leaves the status, the live
/// edges acknowledge that status (at most `cleanup_wait`), then the address is
/// released and the finalizer (if any) removed.
async fn clean_up(
    api: &Api<Service>,
    svc: &Service,
    ctx: &Ctx,
    key: &str,
    deleting: bool,
) -> Result<Action, Error> {
    let oref = ObjectRef::from_obj(svc);
    if has_our_status(svc) {
        write_status(api, svc, key, &WantedStatus::Clear, None).await?;
        tracing::info!("VIP withdrawn from the status; the edges stop announcing it");
        // The wait runs from here; our own status write brings the Service back
        // with the resourceVersion the edges must reach.
        lock(&ctx.withdrawn).insert(oref, (Instant::now(), None));
        return Ok(Action::requeue(ctx.cleanup_wait));
    }
    let holds = !lock(&ctx.ipam).held(key).is_empty();
    let withdrawn = {
        let mut w = lock(&ctx.withdrawn);
        let rv = svc
            .resource_version()
            .and_then(|rv| ringlb_crds::edge_ack::parse_resource_version(&rv));
        let e = w.entry(oref.clone()).or_insert((Instant::now(), None));
        e.1 = e.1.or(rv);
        let (since, rv) = *e;
        Withdrawn {
            for_: since.elapsed(),
            rv,
        }
    };
    let step = cleanup_step(
        holds,
        withdrawn,
        &ctx.edge_acks(),
        Timestamp::now(),
        ctx.cleanup_wait,
    );
    match step {
        Step::Wait { after, pending } => {
            tracing::debug!(?pending, rv = ?withdrawn.rv, "waiting for the edges to withdraw the VIP");
            Ok(Action::requeue(after))
        }
        Step::Release { unconfirmed } => {
            if !unconfirmed.is_empty() {
                tracing::warn!(
                    edges = ?unconfirmed,
                    waited = ?withdrawn.for_,
                    "releasing the VIP although these edges did not acknowledge its withdrawal"
                );
            }
            let released = ctx.forget(key);
            if let Some(patch) = finalizer_patch(svc, false) {
                let pp = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                api.patch(&svc.name_any(), &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(|source| Error::Finalizer {
                        key: key.to_string(),
                        action: "removing",
                        source,
                    })?;
                tracing::info!(?released, "finalizer removed");
            }
            lock(&ctx.withdrawn).remove(&oref);
            if !deleting && !released.is_empty() {
                let note = format!("no longer a ringlb Service; released {}", join(&released));
                ctx.events.normal(svc, "IPReleased", note).await;
            }
            Ok(Action::await_change())
        }
    }
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// API failures: exponential backoff per Service, 250 ms doubling to 30 s.
pub fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.reconcile_errors.inc();
    let n = {
        let mut f = lock(&ctx.failures);
        let n = f.entry(ObjectRef::from_obj(&*svc)).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay =
        Duration::from_millis(250u64.saturating_mul(1 << n.min(7))).min(Duration::from_secs(30));
    tracing::warn!(service = %service_key(&svc), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The Service watch, with releases on Delete and after relists.
fn service_stream(
    api: Api<Service>,
    writer: reflector::store::Writer<Service>,
    ctx: Arc<Ctx>,
) -> impl Stream<Item = Result<Service, watcher::Error>> + Send {
    let mut listing: Option<HashSet<String>> = None;
    watcher(api, watcher::Config::default())
        .backoff(ringlb_ops::WatchBackoff::default())
        // Keep the cache small: nothing here reads managedFields or the (often
        // large) last-applied-configuration annotation.
        .modify(|s| {
            s.managed_fields_mut().clear();
            if let Some(a) = s.metadata.annotations.as_mut() {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
            }
        })
        .reflect(writer)
        .inspect_ok(move |ev| match ev {
            Event::Delete(s) => {
                ctx.forget(&service_key(s));
            }
            Event::Init => listing = Some(HashSet::new()),
            Event::InitApply(s) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(service_key(s));
                }
            }
            Event::InitDone => {
                if let Some(l) = listing.take() {
                    ctx.forget_missing(&l);
                }
            }
            Event::Apply(_) => {}
        })
        .applied_objects()
}

/// The EndpointSlice watch (only slices of a Service), feeding `ctx.slices`; every
/// (re)list done marks them listed and re-checks all Services through `relisted`.
fn slice_stream(
    api: Api<EndpointSlice>,
    writer: reflector::store::Writer<EndpointSlice>,
    ctx: Arc<Ctx>,
    relisted: mpsc::UnboundedSender<()>,
) -> impl Stream<Item = Result<EndpointSlice, watcher::Error>> + Send {
    watcher(api, watcher::Config::default().labels(SERVICE_NAME_LABEL))
        .backoff(ringlb_ops::WatchBackoff::default())
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(writer)
        .inspect_ok(move |ev| {
            if let Event::InitDone = ev {
                ctx.slices_listed.store(true, Ordering::Release);
                let _ = relisted.unbounded_send(());
            }
        })
        .touched_objects()
}

/// The Service an EndpointSlice belongs to.
fn owning_service(slice: EndpointSlice) -> Option<ObjectRef<Service>> {
    let name = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(ObjectRef::new(name).within(&slice.namespace()?))
}

/// Runs the Service controller until the watch ends (it does not, normally), beating
/// `heartbeat` while it waits for the next reconcile to finish.
pub async fn run(
    ctx: Arc<Ctx>,
    retry_rx: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    reconcile_all: impl Stream<Item = ()> + Send + 'static,
    heartbeat: Heartbeat,
) {
    let api: Api<Service> = Api::all(ctx.client.clone());
    let Some(writer) = lock(&ctx.services_writer).take() else {
        tracing::error!(
            "reconcile::run called twice for one Ctx; not starting a second controller"
        );
        return;
    };
    let Some(slices_writer) = lock(&ctx.slices_writer).take() else {
        return;
    };
    let stream = service_stream(api, writer, ctx.clone());
    let (relisted_tx, relisted_rx) = mpsc::unbounded();
    let slices = slice_stream(
        Api::all(ctx.client.clone()),
        slices_writer,
        ctx.clone(),
        relisted_tx,
    );
    let results = Controller::for_stream(stream, ctx.services.clone())
        // The Controller backs its trigger stream off again on top of the watch's
        // own backoff; kube-runtime's default there (up to 30 s and more) delayed
        // recovery after an API outage by as long.
        .trigger_backoff(ringlb_ops::WatchBackoff::default())
        .reconcile_on(retry_rx)
        .reconcile_all_on(reconcile_all)
        .watches_stream(slices, owning_service)
        .reconcile_all_on(relisted_rx)
        .run(reconcile, error_policy, ctx);
    let mut results = std::pin::pin!(results);
    while let Some(res) = heartbeat.next(&mut results).await {
        if let Err(e) = res {
            tracing::debug!(error = %e, "controller event");
        }
    }
}
