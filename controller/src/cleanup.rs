//! The load-balancer cleanup finalizer, `service.kubernetes.io/load-balancer-cleanup`,
//! as Kubernetes' own service controller keeps it for every cloud load balancer.
//!
//! ```text
//!  ours, no finalizer ──► add it (before the first VIP is written)
//!  deleted, or no longer ours, with the finalizer:
//!    status holds our VIP ──► clear it (the edges withdraw the VIP)
//!      ──► wait until every live edge has acted on that status (its Lease), at most
//!          CLEANUP_MAX_WAIT ──► release the address in the allocator ──► remove the
//!          finalizer
//!  `ringlb-controller remove-finalizers` (helm uninstall): wait until no controller
//!    holds the Lease, then remove the finalizer from every Service and delete the
//!    edges' Leases
//! ```
//!
//! The edges take what they announce from `status.loadBalancer.ingress` of the
//! Services they see (`ringlb-edge`'s `serving`). Each edge acknowledges in its own
//! Lease the highest Service resourceVersion it has programmed and handed to its BGP
//! sessions (`ringlb_crds::edge_ack`). The VIP is released once every live edge's
//! acknowledgement reaches the resourceVersion of the cleared status: each has
//! withdrawn the route by then. An edge whose Lease has expired (stopped, or cut off
//! from the API server, where no wait would help) is not waited for; one that stays
//! silent while its Lease is valid is waited for up to `CLEANUP_MAX_WAIT`, then the
//! release goes ahead with a warning that names it.
//!
//! The decisions here are pure; `reconcile` does the writes.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use ringlb_crds::edge_ack::EdgeAck;
use serde_json::{Value, json};

use crate::status::FIELD_MANAGER;

/// The finalizer every load-balancer implementation puts on the Services it serves.
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

/// The longest the controller waits for the live edges to acknowledge a withdrawn
/// VIP before it releases the address anyway: an edge Lease's validity, so an edge
/// that stopped renewing has expired by then.
pub const CLEANUP_MAX_WAIT: Duration = ringlb_crds::edge_ack::LEASE_DURATION;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// These live edges have not acknowledged the withdrawal yet: look again when an
    /// edge Lease changes, or after this long at the latest.
    Wait {
        after: Duration,
        pending: Vec<String>,
    },
    /// Release the address and remove the finalizer. `unconfirmed`: the live edges
    /// that had not acknowledged within the longest wait.
    Release { unconfirmed: Vec<String> },
}

/// A Service whose VIP left its status: how long ago this controller saw that, and
/// the Service's resourceVersion then (`None`: not an integer; no edge can be known
/// to have reached it, so the longest wait applies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Withdrawn {
    pub for_: Duration,
    pub rv: Option<u64>,
}

/// `holds`: the allocator still holds addresses for the Service (so they may have
/// been announced); `withdrawn`: since when and at which resourceVersion the status
/// is without them; `edges`: every edge's acknowledgement at `now`;
/// `max_wait`: [`CLEANUP_MAX_WAIT`] (shorter in tests).
///
/// A Service that holds nothing (refused, or found with its status already cleared
/// after a restart: the address was not adopted) is released at once, and so is one
/// when no live edge is left to withdraw it.
pub fn cleanup_step(
    holds: bool,
    w: Withdrawn,
    edges: &[EdgeAck],
    now: Timestamp,
    max_wait: Duration,
) -> Step {
    if !holds {
        return Step::Release {
            unconfirmed: Vec::new(),
        };
    }
    let mut pending: Vec<String> = edges
        .iter()
        .filter(|e| e.alive(now) && !w.rv.is_some_and(|rv| e.has_applied(rv)))
        .map(|e| e.node.clone())
        .collect();
    pending.sort();
    if pending.is_empty() {
        return Step::Release {
            unconfirmed: Vec::new(),
        };
    }
    if w.for_ >= max_wait {
        return Step::Release {
            unconfirmed: pending,
        };
    }
    Step::Wait {
        after: max_wait - w.for_,
        pending,
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
/// the finalizer from every Service that has it, and returns how many; then deletes
/// the edges' Leases in `lease_namespace` (an edge stopped for a hitless restart
/// keeps its own). Statuses are left as they are, so a later installation adopts the
/// same addresses.
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
    // Leftover edge Leases are inert (each expires; nothing else reads them), so a
    // failure here is reported, not fatal to the uninstall.
    let leases: Api<Lease> = Api::namespaced(client.clone(), lease_namespace);
    let edges = ListParams::default().labels(&format!("{}=true", ringlb_crds::edge_ack::ACK_LABEL));
    match leases.delete_collection(&Default::default(), &edges).await {
        Ok(_) => tracing::info!(namespace = %lease_namespace, "the edges' Leases deleted"),
        Err(e) => tracing::warn!(namespace = %lease_namespace, error = %e,
            "deleting the edges' Leases (label ringlb.io/edge-ack=true) failed; delete them by hand"),
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

    fn edge(node: &str, applied: Option<u64>, valid_until: &str) -> EdgeAck {
        EdgeAck {
            node: node.into(),
            applied,
            valid_until: Some(valid_until.parse().unwrap()),
        }
    }

    #[test]
    fn waits_for_every_live_edge_to_reach_the_withdrawal() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let max = Duration::from_secs(30);
        let w = |secs: u64, rv: Option<u64>| Withdrawn {
            for_: Duration::from_secs(secs),
            rv,
        };
        let edges = [
            edge("e2", Some(99), "2026-12-01T10:00:20Z"),
            edge("e1", Some(120), "2026-12-01T10:00:20Z"),
            // expired: stopped or cut off, not waited for
            edge("e3", Some(1), "2026-12-01T09:59:59Z"),
        ];
        let released = Step::Release {
            unconfirmed: vec![],
        };
        assert_eq!(cleanup_step(false, w(0, None), &edges, now, max), released);
        assert_eq!(
            cleanup_step(true, w(2, Some(100)), &edges, now, max),
            Step::Wait {
                after: Duration::from_secs(28),
                pending: vec!["e2".into()]
            }
        );
        assert_eq!(
            cleanup_step(true, w(2, Some(99)), &edges, now, max),
            released
        );
        assert_eq!(cleanup_step(true, w(0, Some(100)), &[], now, max), released);
        // a resourceVersion that is not an integer: nobody can have reached it
        assert_eq!(
            cleanup_step(true, w(5, None), &edges, now, max),
            Step::Wait {
                after: Duration::from_secs(25),
                pending: vec!["e1".into(), "e2".into()]
            }
        );
        assert_eq!(
            cleanup_step(true, w(30, Some(100)), &edges, now, max),
            Step::Release {
                unconfirmed: vec!["e2".into()]
            }
        );
        assert!(matches!(
            cleanup_step(true, w(0, None), &edges, now, max),
            Step::Wait { after, .. } if after == max
        ));
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
