//! The load-balancer cleanup finalizer, `service.kubernetes.io/load-balancer-cleanup`,
//! as Kubernetes' own service controller keeps it for every cloud load balancer.
//!
//! ```text
//!  ours, no finalizer ──► add it (before the first VIP is written)
//!  deleted, or no longer ours, with the finalizer:
//!    status holds our VIP ──► clear it (the edges withdraw the VIP) ──► wait CLEANUP_WAIT
//!      ──► release the address in the allocator ──► remove the finalizer
//!  `ringlb-controller remove-finalizers` (helm uninstall): wait until no controller
//!    holds the Lease, then remove the finalizer from every Service
//! ```
//!
//! The edges take what they announce from `status.loadBalancer.ingress` of the
//! Services they see (`ringlb-edge`'s `serving`); none of them writes per-VIP
//! announcement state to the API (their `VIPHealthy`/`VIPUnhealthy` Events are
//! best-effort, folded and expired, so they cannot gate anything). So "the edges have
//! stopped announcing it" is a bounded wait after the status is cleared: long enough
//! for a connected edge's watch, its debounce (at most 50 ms), a sync and a BGP withdrawal (well
//! under a second), with room for a loaded edge. An edge cut off from the API server
//! does not see the change within any wait; see docs/controller.md.
//!
//! The decisions here are pure; `reconcile` does the writes.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::status::FIELD_MANAGER;

/// The finalizer every load-balancer implementation puts on the Services it serves.
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// How long after a VIP left a Service's status the controller assumes every
/// connected edge has withdrawn it.
pub const CLEANUP_WAIT: Duration = Duration::from_secs(5);

/// Whether `svc` carries the finalizer.
pub fn has_finalizer(svc: &Service) -> bool {
    svc.finalizers().iter().any(|f| f == FINALIZER)
}

/// The merge patch that adds (`add`) or removes the finalizer, conditional on the
/// resourceVersion read (409 Conflict instead of overwriting another writer's
/// finalizers); `None` when the list already says so.
pub fn finalizer_patch(svc: &Service, add: bool) -> Option<Value> {
    if has_finalizer(svc) == add {
        return None;
    }
    let mut list: Vec<String> = svc
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if add {
        list.push(FINALIZER.to_string());
    }
    let list = if list.is_empty() {
        Value::Null
    } else {
        json!(list)
    };
    Some(json!({
        "metadata": {
            "resourceVersion": svc.resource_version(),
            "finalizers": list,
        }
    }))
}

/// The next step of cleaning up a Service that is deleted or no longer ours, once its
/// status holds no VIP of ours any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The edges may still announce the address: look again after this long.
    Wait(Duration),
    /// Release the address and remove the finalizer.
    Release,
}

/// `holds`: the allocator still holds addresses for the Service (so they may have
/// been announced); `withdrawn_for`: how long ago this controller saw the status
/// without them (`None`: not seen yet, the wait starts now).
///
/// A Service that holds nothing (refused, or found with its status already cleared
/// after a restart: the address was not adopted) is released at once.
pub fn cleanup_step(holds: bool, withdrawn_for: Option<Duration>, wait: Duration) -> Step {
    if !holds {
        return Step::Release;
    }
    match withdrawn_for {
        None => Step::Wait(wait),
        Some(d) if d >= wait => Step::Release,
        Some(d) => Step::Wait(wait - d),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing Services: {0}")]
    List(#[source] kube::Error),
    #[error("removing {FINALIZER} from Service {key}: {source}")]
    Patch {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "Lease {namespace}/{name} is still held by {holder} after {waited:?}; stop the controller first"
    )]
    StillLeading {
        namespace: String,
        name: String,
        holder: String,
        waited: Duration,
    },
}

/// The Lease holder that is still alive, judged as a candidate does: a holder whose
/// record has not changed for its `leaseDurationSeconds` is gone.
fn live_holder(lease: Option<&Lease>) -> Option<(String, Value, Duration)> {
    let spec = lease?.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
    let record = json!([
        holder,
        spec.renew_time,
        spec.acquire_time,
        spec.lease_transitions
    ]);
    Some((holder, record, duration))
}

/// Waits until no controller leads (Lease `namespace/name` released, absent, or
/// not renewed for its duration), for at most `timeout`.
async fn wait_for_no_leader(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let start = Instant::now();
    let mut seen: Option<(Value, Instant)> = None;
    loop {
        let lease = api.get_opt(name).await.map_err(|source| Error::Lease {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })?;
        let Some((holder, record, duration)) = live_holder(lease.as_ref()) else {
            return Ok(());
        };
        match &seen {
            Some((r, since)) if *r == record => {
                if since.elapsed() >= duration {
                    tracing::info!(%holder, "the Lease holder stopped renewing");
                    return Ok(());
                }
            }
            _ => seen = Some((record, Instant::now())),
        }
        if start.elapsed() >= timeout {
            return Err(Error::StillLeading {
                namespace: namespace.into(),
                name: name.into(),
                holder,
                waited: timeout,
            });
        }
        tracing::info!(%holder, "waiting for the controller to stop");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `ringlb-controller remove-finalizers`: once no controller leads (the Lease), removes
/// the finalizer from every Service that has it, and returns how many. Statuses are
/// left as they are, so a later installation adopts the same addresses.
pub async fn remove_all(
    client: &Client,
    lease_namespace: &str,
    lease_name: &str,
    timeout: Duration,
) -> Result<usize, Error> {
    wait_for_no_leader(client, lease_namespace, lease_name, timeout).await?;
    let all: Api<Service> = Api::all(client.clone());
    let list = all
        .list(&ListParams::default())
        .await
        .map_err(Error::List)?;
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let mut n = 0;
    for svc in list.items.iter().filter(|s| has_finalizer(s)) {
        let Some(patch) = finalizer_patch(svc, false) else {
            continue;
        };
        let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
        let api: Api<Service> =
            Api::namespaced(client.clone(), &svc.namespace().unwrap_or_default());
        match api.patch(&svc.name_any(), &pp, &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(service = %key, "finalizer removed");
                n += 1;
            }
            // Gone meanwhile: nothing left to do for it.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => return Err(Error::Patch { key, source }),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(finalizers: &[&str]) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "9",
                         "finalizers": finalizers}
        }))
        .unwrap()
    }

    #[test]
    fn adds_the_finalizer_beside_others_conditionally() {
        let p = finalizer_patch(&svc(&["other.io/x"]), true).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"resourceVersion": "9",
                                "finalizers": ["other.io/x", FINALIZER]}})
        );
        assert_eq!(finalizer_patch(&svc(&[FINALIZER]), true), None);
    }

    #[test]
    fn removes_only_its_own_finalizer() {
        let p = finalizer_patch(&svc(&["other.io/x", FINALIZER]), false).unwrap();
        assert_eq!(p["metadata"]["finalizers"], json!(["other.io/x"]));
        let p = finalizer_patch(&svc(&[FINALIZER]), false).unwrap();
        assert_eq!(p["metadata"]["finalizers"], Value::Null, "the list goes");
        assert_eq!(p["metadata"]["resourceVersion"], "9");
        assert_eq!(finalizer_patch(&svc(&["other.io/x"]), false), None);
    }

    #[test]
    fn waits_for_the_edges_only_when_an_address_is_held() {
        let w = Duration::from_secs(5);
        assert_eq!(cleanup_step(false, None, w), Step::Release);
        assert_eq!(cleanup_step(true, None, w), Step::Wait(w));
        assert_eq!(
            cleanup_step(true, Some(Duration::from_secs(2)), w),
            Step::Wait(Duration::from_secs(3))
        );
        assert_eq!(cleanup_step(true, Some(w), w), Step::Release);
    }

    #[test]
    fn a_lease_holder_counts_until_released() {
        let lease = |holder: Option<&str>| -> Lease {
            serde_json::from_value(json!({
                "metadata": {"name": "ringlb-controller"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2}
            }))
            .unwrap()
        };
        assert!(live_holder(None).is_none());
        assert!(live_holder(Some(&lease(None))).is_none());
        assert!(live_holder(Some(&lease(Some("")))).is_none(), "released");
        let (h, _, d) = live_holder(Some(&lease(Some("c1")))).unwrap();
        assert_eq!((h.as_str(), d), ("c1", Duration::from_secs(2)));
    }
}
