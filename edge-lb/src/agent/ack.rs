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
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use ringlb_crds::edge_ack::{RENEW_EVERY, lease_manifest, lease_name};
use tokio::sync::watch;

/// The field manager of the edge's Lease writes.
const FIELD_MANAGER: &str = "ringlb-edge";
/// Writes of the Lease are at least this far apart (a burst of Service changes is
/// one write).
const MIN_INTERVAL: Duration = Duration::from_millis(100);

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
