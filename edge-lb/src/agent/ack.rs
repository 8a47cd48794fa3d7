//! This edge's acknowledgement Lease (`ringlb_crds::edge_ack`): the highest Service
//! resourceVersion whose state the last sync programmed and handed to the BGP
//! sessions. The controller removes a Service's cleanup finalizer once every live
//! edge has reached the resourceVersion of its cleared status.
//!
//! ```text
//!  sync ──applied rv──► watch channel ──► this task: server-side apply of the Lease
//!                                         (at most every MIN_INTERVAL; renewed every
//!                                         RENEW_EVERY when nothing changes)
//!  drain (SIGTERM, routes withdrawn) ──► the Lease is deleted: nothing to wait for
//! ```

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use ringlb_crds::edge_ack::{
    ACK_LABEL, APPLIED_ANNOTATION, LEASE_DURATION, RENEW_EVERY, lease_name,
};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The field manager of the edge's Lease writes.
const FIELD_MANAGER: &str = "ringlb-edge";
/// Writes of the Lease are at least this far apart (a burst of Service changes is
/// one write).
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The Lease of the edge on `node` acknowledging `applied`, as applied server-side.
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

/// The Lease writer of the edge on `node`.
pub struct Acks {
    api: Api<Lease>,
    namespace: String,
    node: String,
}

impl Acks {
    pub fn new(client: &Client, namespace: &str, node: &str) -> Acks {
        Acks {
            api: Api::namespaced(client.clone(), namespace),
            namespace: namespace.into(),
            node: node.into(),
        }
    }

    async fn write(&self, applied: Option<u64>) -> Result<(), kube::Error> {
        let manifest = lease_manifest(&self.namespace, &self.node, applied, Timestamp::now());
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.api
            .patch(&lease_name(&self.node), &pp, &Patch::Apply(&manifest))
            .await
            .map(|_| ())
    }

    /// Writes the Lease whenever `applied` changes, and renews it, until the
    /// sender is dropped.
    pub async fn run(self, mut applied: watch::Receiver<Option<u64>>) {
        let mut failing = false;
        loop {
            let rv = *applied.borrow_and_update();
            match self.write(rv).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(lease = %lease_name(&self.node), "edge Lease written again");
                }
                Ok(()) => {}
                Err(e) => {
                    // Until it is written again, the controller waits for this edge
                    // (at most its cleanup wait) before it releases a withdrawn VIP.
                    if !failing {
                        tracing::warn!(lease = %lease_name(&self.node), namespace = %self.namespace,
                            error = %e, "writing the edge Lease that acknowledges withdrawn VIPs; retrying");
                    }
                    failing = true;
                }
            }
            let wait = if failing {
                MIN_INTERVAL * 10
            } else {
                RENEW_EVERY
            };
            tokio::select! {
                changed = applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::time::sleep(MIN_INTERVAL).await;
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Deletes the Lease: a drained edge announces nothing, so nothing waits for it.
    pub async fn remove(&self) {
        match self
            .api
            .delete(&lease_name(&self.node), &DeleteParams::default())
            .await
        {
            Ok(_) => tracing::info!(lease = %lease_name(&self.node), "edge Lease deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(lease = %lease_name(&self.node), error = %e,
                "deleting the edge Lease; it expires on its own"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlb_crds::edge_ack::EdgeAck;

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
