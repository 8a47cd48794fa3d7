//! The edges' Leases (`ringlb_crds::edge_ack`), which say how far each edge has acted
//! on the Services: the cleanup finalizer waits for them (`cleanup`).
//!
//! ```text
//!  Lease watch (release namespace, label ringlb.io/edge-ack) ──reflect──► Store<Lease>
//!        └─ any change ──► Ctx::retry_withdrawn: the Services waiting for the edges
//! ```

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event, watcher};
use ringlb_crds::edge_ack::ACK_LABEL;
use ringlb_ops::Heartbeat;
use tokio::sync::Notify;

/// Keeps `writer`'s store of edge Leases current and pokes `changed` on each change.
pub async fn watch(
    api: Api<Lease>,
    writer: Writer<Lease>,
    changed: Arc<Notify>,
    heartbeat: Heartbeat,
) {
    let cfg = watcher::Config::default().labels(&format!("{ACK_LABEL}=true"));
    let events = watcher(api, cfg)
        .backoff(ringlb_ops::WatchBackoff::default())
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    while let Some(ev) = heartbeat.next(&mut events).await {
        match ev {
            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => changed.notify_one(),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "edge Lease watch"),
        }
    }
}

/// Re-checks the Services waiting for the edges whenever an edge Lease changes.
pub async fn retry_on_change(ctx: Arc<crate::reconcile::Ctx>, changed: Arc<Notify>) {
    loop {
        changed.notified().await;
        ctx.retry_withdrawn();
    }
}
