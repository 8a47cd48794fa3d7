//! The edges' acknowledgements: how far each edge has acted on the Services.
//!
//! Every edge keeps a `coordination.k8s.io/v1` Lease, `ringlb-edge-<node>`, in the
//! release namespace. Its annotation [`APPLIED_ANNOTATION`] holds the highest
//! Service `resourceVersion` whose state the edge has programmed and handed to its
//! BGP sessions (announced or withdrawn); `spec.renewTime` says it is alive. The
//! controller reads them to remove the cleanup finalizer only after every live edge
//! has withdrawn a Service's VIP.
//!
//! Service resourceVersions are compared as integers: Kubernetes defines them as
//! comparable for objects of one resource since v1.35 (KEP-5504), and an
//! etcd-backed server of any earlier version gives the same integers. A value that
//! is not one is ignored; the controller then falls back to its bounded wait.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use std::time::Duration;

/// The label every edge Lease carries (value `"true"`); the controller watches
/// the Leases it selects.
pub const ACK_LABEL: &str = "ringlb.io/edge-ack";
/// The annotation with the highest Service resourceVersion the edge has acted on.
pub const APPLIED_ANNOTATION: &str = "ringlb.io/services-applied";
/// How long an edge Lease stays valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(30);
/// How often an edge renews its Lease when nothing changed.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);

/// The Lease name of the edge on `node`.
pub fn lease_name(node: &str) -> String {
    format!("ringlb-edge-{node}")
}

/// The Lease of the edge on `node` acknowledging `applied`, as the edge applies it
/// server-side (and as tests write it).
pub fn lease_manifest(namespace: &str, node: &str, applied: Option<u64>, now: Timestamp) -> Value {
    let annotations = match applied {
        Some(rv) => json!({ APPLIED_ANNOTATION: rv.to_string() }),
        None => json!({}),
    };
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(node),
            "namespace": namespace,
            "labels": {
                ACK_LABEL: "true",
                "app.kubernetes.io/name": "ringlb",
                "app.kubernetes.io/component": "edge",
            },
            "annotations": annotations,
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            // MicroTime: the API server takes exactly six fractional digits
            "renewTime": MicroTime(now),
        }
    })
}

/// A resourceVersion as the integer KEP-5504 defines: decimal digits, no leading
/// zero, not zero. Anything else is `None`.
pub fn parse_resource_version(rv: &str) -> Option<u64> {
    if rv.is_empty() || rv.starts_with('0') || !rv.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rv.parse().ok()
}

/// One edge's acknowledgement, read from its Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeAck {
    /// The node the edge runs on (the Lease's holder).
    pub node: String,
    /// The highest Service resourceVersion it has acted on; `None` before its first
    /// sync or when the annotation is not an integer.
    pub applied: Option<u64>,
    /// When the Lease stops being valid (`renewTime` + `leaseDurationSeconds`);
    /// `None` when it has no renewTime.
    pub valid_until: Option<Timestamp>,
}

impl EdgeAck {
    /// The acknowledgement in `lease`; `None` for a Lease that is not an edge's.
    pub fn from_lease(lease: &Lease) -> Option<EdgeAck> {
        let meta = &lease.metadata;
        let labels = meta.labels.as_ref()?;
        if labels.get(ACK_LABEL).map(String::as_str) != Some("true") {
            return None;
        }
        let spec = lease.spec.as_ref()?;
        let node = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
        let applied = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPLIED_ANNOTATION))
            .and_then(|v| parse_resource_version(v));
        let duration = SignedDuration::from_secs(
            spec.lease_duration_seconds
                .unwrap_or(LEASE_DURATION.as_secs() as i32)
                .max(1)
                .into(),
        );
        let valid_until = spec
            .renew_time
            .as_ref()
            .and_then(|t| t.0.checked_add(duration).ok());
        Some(EdgeAck {
            node,
            applied,
            valid_until,
        })
    }

    /// Whether the edge counts as running at `now`.
    pub fn alive(&self, now: Timestamp) -> bool {
        self.valid_until.is_some_and(|t| t > now)
    }

    /// Whether the edge has acted on the Service state at resourceVersion `rv`.
    pub fn has_applied(&self, rv: u64) -> bool {
        self.applied.is_some_and(|a| a >= rv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(v: serde_json::Value) -> Lease {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn resource_versions_are_kep_5504_integers() {
        assert_eq!(parse_resource_version("12345"), Some(12345));
        for bad in ["", "0", "012", "12a", "-1", " 1"] {
            assert_eq!(parse_resource_version(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_edge_lease_says_what_was_applied_and_until_when_it_holds() {
        let l = lease(json!({
            "metadata": {"name": "ringlb-edge-e1", "labels": {ACK_LABEL: "true"},
                         "annotations": {APPLIED_ANNOTATION: "900"}},
            "spec": {"holderIdentity": "e1", "leaseDurationSeconds": 30,
                     "renewTime": "2026-12-01T10:00:00.000000Z"}
        }));
        let a = EdgeAck::from_lease(&l).unwrap();
        assert_eq!(a.node, "e1");
        assert!(a.has_applied(900) && a.has_applied(899) && !a.has_applied(901));
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        assert!(a.alive(at("2026-12-01T10:00:29Z")));
        assert!(!a.alive(at("2026-12-01T10:00:30Z")));
    }

    #[test]
    fn other_leases_and_garbage_annotations_count_for_nothing() {
        let controller = lease(json!({
            "metadata": {"name": "ringlb-controller"},
            "spec": {"holderIdentity": "c1"}
        }));
        assert_eq!(EdgeAck::from_lease(&controller), None);
        let garbage = lease(json!({
            "metadata": {"name": "ringlb-edge-e2", "labels": {ACK_LABEL: "true"},
                         "annotations": {APPLIED_ANNOTATION: "soon"}},
            "spec": {"holderIdentity": "e2"}
        }));
        let a = EdgeAck::from_lease(&garbage).unwrap();
        assert_eq!((a.applied, a.valid_until), (None, None));
        assert!(!a.has_applied(1) && !a.alive(Timestamp::now()));
    }

    #[test]
    fn the_manifest_reads_back_as_the_acknowledgement() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let m = lease_manifest("ringlb-system", "edge-a", Some(4242), now);
        assert_eq!(m["metadata"]["name"], "ringlb-edge-edge-a");
        let lease: Lease = serde_json::from_value(m).unwrap();
        let ack = EdgeAck::from_lease(&lease).unwrap();
        assert_eq!((ack.node.as_str(), ack.applied), ("edge-a", Some(4242)));
        assert!(ack.alive(now) && !ack.alive("2026-12-01T10:00:30Z".parse().unwrap()));
        let none: Lease =
            serde_json::from_value(lease_manifest("ringlb-system", "edge-a", None, now)).unwrap();
        assert_eq!(EdgeAck::from_lease(&none).unwrap().applied, None);
    }
}
