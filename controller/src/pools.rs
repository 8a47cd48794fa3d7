//! IPPools: turning objects into allocator pools, keeping the allocator's pool set
//! equal to the IPPools in the API, and writing pool status (allocated/free per
//! family; Ready, Invalid, Overlapping and Advertised conditions).
//!
//! ```text
//!  watch IPPools ──reflect──► Store ──────────────────────────► status_writer ──► status
//!    ├─ Apply / InitApply ─► predicate_filter(generation) ─┐          ▲
//!    └─ Delete / InitDone (relist) ────────────────────────┴─► set_pools ─► reconcile_all
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use futures::{Stream, StreamExt, TryStreamExt, future, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::runtime::{WatchStreamExt, predicates};
use kube::{Api, ResourceExt};
use ringlb_crds::ippool::FamilyUsage;
use ringlb_crds::{Condition, IPPool, IPPoolStatus};
use ringlb_ops::Heartbeat;

use crate::announce::{ADVERTISED_CONDITION_TYPE, Routing};
use crate::ipam::{Family, Ipam, Pool, PoolError};
use crate::metrics::Metrics;
use crate::routing_watch::{RoutingCell, current};
use crate::status::FIELD_MANAGER;

/// Parses every IPPool; invalid ones are set aside with their errors.
pub fn pools_from<'a>(
    objs: impl IntoIterator<Item = &'a IPPool>,
) -> (Vec<Pool>, BTreeMap<String, Vec<PoolError>>) {
    let mut pools = Vec::new();
    let mut invalid = BTreeMap::new();
    for obj in objs {
        let name = obj.name_any();
        match Pool::from_spec(&name, &obj.spec) {
            Ok(p) => pools.push(p),
            Err(errs) => {
                invalid.insert(name, errs);
            }
        }
    }
    (pools, invalid)
}

/// One log line per invalid pool, naming every bad field (the pool's status carries an
/// `Invalid` condition too).
pub fn log_invalid(invalid: &BTreeMap<String, Vec<PoolError>>) {
    for (name, errs) in invalid {
        tracing::warn!(
            pool = %name,
            errors = ?errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "IPPool is invalid; not used"
        );
    }
}

/// Yields whenever the set of pools may have changed, reading `events` (a reflected
/// IPPool watch). A spec edit bumps `metadata.generation` and a new pool is not in
/// the predicate's cache, so kube-runtime's `predicates::generation` passes both and
/// drops status-only updates (the status writer's own). A Delete or a relist can change
/// the set without changing any object's generation, so those always pass.
pub fn pool_set_changes(
    events: impl Stream<Item = Result<Event<IPPool>, watcher::Error>> + Send,
) -> impl Stream<Item = Result<(), watcher::Error>> + Send {
    let (applied_tx, applied_rx) = mpsc::unbounded();
    let structural = events.filter_map(move |ev| {
        future::ready(match ev {
            Ok(Event::Apply(p) | Event::InitApply(p)) => {
                // The receiver lives as long as this stream: the send cannot fail.
                let _ = applied_tx.unbounded_send(Ok(p));
                None
            }
            Ok(Event::Delete(_) | Event::InitDone) => Some(Ok(())),
            Ok(Event::Init) => None,
            Err(e) => Some(Err(e)),
        })
    });
    let edited = applied_rx
        .predicate_filter(predicates::generation, Default::default())
        .map_ok(|_| ());
    stream::select(structural, edited)
}

/// Keeps `ipam`'s pool set equal to the IPPools in the API: on every change, replaces
/// it, asks for every Service to be reconciled (`reconcile_all`) and for pool status
/// (`dirty`). Runs until the task is dropped, beating `heartbeat` while it waits.
pub async fn sync_pools(
    api: Api<IPPool>,
    writer: reflector::store::Writer<IPPool>,
    ipam: Arc<Mutex<Ipam>>,
    dirty: Arc<tokio::sync::Notify>,
    reconcile_all: mpsc::UnboundedSender<()>,
    heartbeat: Heartbeat,
) {
    let reader = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .backoff(ringlb_ops::WatchBackoff::default())
        .reflect(writer);
    // One recompute for a burst (the first list is one change per pool).
    let mut changes = std::pin::pin!(pool_set_changes(events).ready_chunks(256));
    while let Some(batch) = heartbeat.next(&mut changes).await {
        for e in batch.iter().filter_map(|r| r.as_ref().err()) {
            tracing::warn!(error = %e, "IPPool watch");
        }
        if batch.iter().all(Result::is_err) {
            continue;
        }
        let objs = reader.state();
        let (p, invalid) = pools_from(objs.iter().map(|o| o.as_ref()));
        tracing::info!(pools = p.len(), invalid = invalid.len(), "IPPools changed");
        log_invalid(&invalid);
        ipam.lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_pools(p, invalid);
        let _ = reconcile_all.unbounded_send(());
        dirty.notify_one();
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    old: Option<&IPPoolStatus>,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" }.to_string();
    let prev = old.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
    Condition {
        type_: type_.into(),
        last_transition_time: match prev {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now.clone(),
        },
        status,
        reason: reason.into(),
        message,
        observed_generation: None,
    }
}

/// The status a pool should have now. `routing` gives the `Advertised` condition;
/// `None` (the BGP objects not listed yet) keeps the old one.
pub fn pool_status(
    ipam: &Ipam,
    routing: Option<&Routing>,
    name: &str,
    old: Option<&IPPoolStatus>,
    now: Time,
) -> IPPoolStatus {
    let mut st = IPPoolStatus::default();
    let invalid = ipam.invalid_pools().get(name);
    for u in ipam.usage(name) {
        let fu = FamilyUsage {
            allocated: u.allocated,
            free: u.free.to_string(),
        };
        match u.family {
            Family::V4 => st.ipv4 = Some(fu),
            Family::V6 => st.ipv6 = Some(fu),
        }
    }
    let overlaps = ipam.overlaps().remove(name).unwrap_or_default();
    st.conditions = vec![
        condition(
            "Ready",
            invalid.is_none(),
            if invalid.is_none() {
                "Valid"
            } else {
                "Invalid"
            },
            if invalid.is_none() {
                "pool is in use".into()
            } else {
                "pool is invalid; see the Invalid condition".into()
            },
            old,
            &now,
        ),
        match invalid {
            Some(errs) => condition(
                "Invalid",
                true,
                "InvalidSpec",
                errs.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                old,
                &now,
            ),
            None => condition("Invalid", false, "Valid", String::new(), old, &now),
        },
        if overlaps.is_empty() {
            condition("Overlapping", false, "NoOverlap", String::new(), old, &now)
        } else {
            condition(
                "Overlapping",
                true,
                "Overlaps",
                format!(
                    "overlaps pool(s) {}; an address is still given to one Service at most",
                    overlaps.join(", ")
                ),
                old,
                &now,
            )
        },
    ];
    let advertised = match routing {
        Some(r) => {
            let (ok, reason, message) = r.pool(name);
            Some(condition(
                ADVERTISED_CONDITION_TYPE,
                ok,
                reason,
                message,
                old,
                &now,
            ))
        }
        None => old.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ADVERTISED_CONDITION_TYPE)
                .cloned()
        }),
    };
    st.conditions.extend(advertised);
    st
}

/// What the pool status writer reads.
pub struct StatusInputs {
    pub ipam: Arc<Mutex<Ipam>>,
    pub routing: RoutingCell,
}

/// Writes changed pool statuses and pool gauges, at most every `interval`, while
/// `dirty` is set. Runs only on the leader.
pub async fn status_writer(
    api: Api<IPPool>,
    store: Store<IPPool>,
    inputs: StatusInputs,
    metrics: Metrics,
    dirty: Arc<tokio::sync::Notify>,
    interval: Duration,
) {
    loop {
        dirty.notified().await;
        let objs = store.state();
        let now = Time(Timestamp::now());
        let routing = current(&inputs.routing);
        let wanted: Vec<(String, IPPoolStatus, bool)> = {
            let ipam = inputs.ipam.lock().unwrap_or_else(|e| e.into_inner());
            // Deleted pools must not leave stale gauges behind.
            metrics.pool_allocated.clear();
            metrics.pool_free.clear();
            objs.iter()
                .map(|o| {
                    let name = o.name_any();
                    let st = pool_status(
                        &ipam,
                        routing.as_deref(),
                        &name,
                        o.status.as_ref(),
                        now.clone(),
                    );
                    let same = o.status.as_ref() == Some(&st);
                    for u in ipam.usage(&name) {
                        metrics.set_pool_usage(&name, u.family.label(), u.allocated, u.free);
                    }
                    (name, st, same)
                })
                .collect()
        };
        for (name, st, same) in wanted {
            if same {
                continue;
            }
            let patch = serde_json::json!({ "status": st });
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            if let Err(e) = api.patch_status(&name, &pp, &Patch::Merge(&patch)).await {
                tracing::warn!(pool = %name, error = %e, "writing IPPool status failed");
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ringlb_crds::IPPoolSpec;

    /// An auto-assigned IPPool of these CIDRs (for the crate's tests).
    pub(crate) fn obj(name: &str, cidrs: &[&str]) -> IPPool {
        IPPool::new(name, IPPoolSpec::from_cidrs(cidrs))
    }

    #[test]
    fn status_counts_and_conditions() {
        let objs = [
            obj("a", &["192.0.2.0/24", "2001:db8::/64"]),
            obj("b", &["192.0.2.128/25"]),
            obj("bad", &["x"]),
        ];
        let (pools, invalid) = pools_from(objs.iter());
        let mut ipam = Ipam::new();
        ipam.set_pools(pools, invalid);
        let now = Time(Timestamp::from_second(100).unwrap());
        let st = pool_status(&ipam, None, "a", None, now.clone());
        assert_eq!(
            st.ipv4,
            Some(FamilyUsage {
                allocated: 0,
                free: "256".into()
            })
        );
        assert_eq!(st.ipv6.as_ref().unwrap().free, "18446744073709551615");
        let c = |st: &IPPoolStatus, t: &str| {
            st.conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .status
                .clone()
        };
        assert_eq!(c(&st, "Ready"), "True");
        assert_eq!(c(&st, "Overlapping"), "True");
        let bad = pool_status(&ipam, None, "bad", None, now.clone());
        assert_eq!(c(&bad, "Ready"), "False");
        assert!(
            bad.conditions[1].message.contains("spec.cidrs[0]"),
            "{:?}",
            bad.conditions
        );
        // Unchanged state: identical status (so no write), transition time kept.
        let later = Time(Timestamp::from_second(200).unwrap());
        assert_eq!(pool_status(&ipam, None, "a", Some(&st), later), st);
    }
}
