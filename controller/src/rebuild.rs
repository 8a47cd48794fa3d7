//! The rebuild before the first allocation: load the pools, then adopt every address
//! written in a ringlb Service's status, oldest Service first. Conflicts are reported,
//! not fixed (docs/controller.md, "Restarts, failovers and pool edits never renumber").

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Service;
use kube::api::ListParams;
use kube::{Api, Client};
use ringlb_crds::IPPool;

use crate::events::Events;
use crate::ipam::request::{self, is_ours, service_key, status_ips};
use crate::ipam::{Ipam, RebuildConflict};
use crate::metrics::Metrics;
use crate::pools;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing {what} for the rebuild: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Lists IPPools and Services and rebuilds `ipam` from them; Warning Events for the
/// conflicts found.
pub async fn rebuild(
    client: &Client,
    ipam: &Mutex<Ipam>,
    events: &Events,
    metrics: &Metrics,
    default_class: bool,
) -> Result<(), Error> {
    let failed = |what| move |source| Error::List { what, source };
    let pool_objs = Api::<IPPool>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(failed("IPPools"))?;
    let svcs = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(failed("Services"))?
        .items;

    let (adopted, conflicts) = {
        let mut ipam = ipam.lock().unwrap_or_else(|e| e.into_inner());
        let (p, invalid) = pools::pools_from(pool_objs.items.iter());
        pools::log_invalid(&invalid);
        ipam.set_pools(p, invalid);
        let (adopted, conflicts) = adopt_statuses(&mut ipam, &svcs, default_class);
        tracing::info!(
            services = ipam.service_count(),
            addresses = ipam.allocated_count(),
            conflicts = conflicts.len(),
            "rebuilt the allocator from Service statuses"
        );
        (adopted, conflicts)
    };
    metrics.adoptions.inc_by(adopted as u64);
    for (svc, c) in conflicts {
        tracing::error!(service = %c.service, ip = %c.ip, holder = %c.holder, "two Services hold one address without a legal share; leaving both alone");
        metrics.warned("rebuild_conflict");
        let note = format!(
            "status holds {}, which {} also holds without a legal share; not renumbering either, fix one of them",
            c.ip, c.holder
        );
        events.warn(svc, "IPConflict", note).await;
    }
    Ok(())
}

/// Adopts the status addresses of every ringlb Service, oldest first, so on a conflict
/// the Service that had the address first keeps it. Returns how many Services had
/// addresses to adopt, and the conflicts with the Service that lost each.
///
/// The sharing key is read as the reconcile reads it ([`request::sharing_key`]). A
/// blank key is malformed there, and the reconcile refuses the Service without touching
/// what it holds; here it holds its addresses unshared, so they are neither handed to
/// another Service nor shared under a key nobody wrote.
pub fn adopt_statuses<'a>(
    ipam: &mut Ipam,
    svcs: &'a [Service],
    default_class: bool,
) -> (usize, Vec<(&'a Service, RebuildConflict)>) {
    let mut held: Vec<&Service> = svcs
        .iter()
        .filter(|s| is_ours(s, default_class) && !status_ips(s).is_empty())
        .collect();
    held.sort_by_cached_key(|s| {
        (
            s.metadata.creation_timestamp.as_ref().map(|t| t.0),
            service_key(s),
        )
    });
    let mut conflicts = Vec::new();
    for s in &held {
        let sharing = request::sharing_key(s).unwrap_or(None);
        let found = ipam.adopt(
            &service_key(s),
            &status_ips(s),
            sharing.as_deref(),
            &request::ports(s),
        );
        conflicts.extend(found.into_iter().map(|c| (*s, c)));
    }
    (held.len(), conflicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ringlb Service created at `created` (seconds) holding 192.0.2.1 on `port`.
    fn holder(name: &str, created: i64, port: i32, key: Option<&str>) -> Service {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "default",
                         "creationTimestamp": format!("1970-01-01T00:00:{created:02}Z")},
            "spec": {"type": "LoadBalancer", "ports": [{"port": port}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}
        });
        if let Some(k) = key {
            v["metadata"]["annotations"] = json!({ request::ANNOTATION_SHARED: k });
        }
        serde_json::from_value(v).unwrap()
    }

    fn adopt(svcs: &[Service]) -> (Ipam, Vec<String>) {
        let mut ipam = Ipam::new();
        let (_, conflicts) = adopt_statuses(&mut ipam, svcs, true);
        let losers = conflicts.iter().map(|(_, c)| c.service.clone()).collect();
        (ipam, losers)
    }

    #[test]
    fn the_older_service_keeps_a_contested_address() {
        let (ipam, losers) = adopt(&[holder("new", 9, 80, None), holder("old", 1, 443, None)]);
        assert_eq!(losers, ["default/new"]);
        assert_eq!(ipam.holders(&"192.0.2.1".parse().unwrap()), ["default/old"]);
    }

    #[test]
    fn sharing_keys_are_read_as_the_reconcile_reads_them() {
        // Trimmed: " k " and "k" are one key, so the two share.
        let (_, losers) = adopt(&[
            holder("a", 1, 80, Some(" k ")),
            holder("b", 2, 443, Some("k")),
        ]);
        assert!(losers.is_empty(), "{losers:?}");
        // A blank key (malformed: the reconcile refuses it) holds unshared: two
        // Services with blank keys do not share, the newer is the conflict.
        let (_, losers) = adopt(&[
            holder("a", 1, 80, Some("  ")),
            holder("b", 2, 443, Some(" ")),
        ]);
        assert_eq!(losers, ["default/b"]);
        let (_, losers) = adopt(&[
            holder("a", 1, 80, Some("k")),
            holder("b", 2, 443, Some(" ")),
        ]);
        assert_eq!(losers, ["default/b"]);
    }
}
