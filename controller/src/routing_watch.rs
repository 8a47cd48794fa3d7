//! Keeps the [`Routing`] facts current: watches the IPPools (their labels and
//! addresses), the `BGPAdvertisement`s and the `BGPPeer`s (their labels and the
//! sessions the edges write into their status), and when the facts change, asks for
//! every Service to be reconciled (their `ringlb.io/Announced` condition) and for the
//! pools' status (their `Advertised` condition).
//!
//! ```text
//!  watch IPPools ────────────┐
//!  watch BGPAdvertisements ──┼─► Routing::new ─► changed? ─► cell, reconcile_all, pools_dirty
//!  watch BGPPeers ───────────┘
//! ```

use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{StreamExt, stream};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use ringlb_crds::{BGPAdvertisement, BGPPeer, IPPool};
use ringlb_ops::Heartbeat;
use serde::de::DeserializeOwned;

use crate::announce::Routing;

/// The current facts, shared by the reconciler and the pool status writer; `None`
/// until all three kinds are listed (the conditions are left as they are till then).
pub type RoutingCell = Arc<Mutex<Option<Arc<Routing>>>>;

/// The current facts in `cell`.
pub fn current(cell: &RoutingCell) -> Option<Arc<Routing>> {
    cell.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Which watch an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pools,
    Adverts,
    Peers,
}

/// `(kind, listed)` for each event of a reflected watch of `K`: `listed` once its
/// first list is complete.
fn reflected<K>(
    client: &Client,
    kind: Kind,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<(Kind, bool), watcher::Error>> + Send + use<K>,
)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .backoff(ringlb_ops::WatchBackoff::default())
        .reflect(writer)
        .map(move |r| r.map(|e| (kind, matches!(e, Event::InitDone))));
    (store, events)
}

/// Runs until the task is dropped, beating `heartbeat` while it waits.
pub async fn watch_routing(
    client: Client,
    cell: RoutingCell,
    reconcile_all: mpsc::UnboundedSender<()>,
    pools_dirty: Arc<tokio::sync::Notify>,
    heartbeat: Heartbeat,
) {
    let (pools, pool_events) = reflected::<IPPool>(&client, Kind::Pools);
    let (adverts, advert_events) = reflected::<BGPAdvertisement>(&client, Kind::Adverts);
    let (peers, peer_events) = reflected::<BGPPeer>(&client, Kind::Peers);
    let events = stream::select(stream::select(pool_events, advert_events), peer_events);
    // One recompute for a burst (the first lists, a peer's sessions on every edge).
    let mut changes = std::pin::pin!(events.ready_chunks(256));
    let mut listed = std::collections::BTreeSet::new();
    while let Some(batch) = heartbeat.next(&mut changes).await {
        for ev in &batch {
            match ev {
                Ok((kind, true)) => {
                    listed.insert(*kind as u8);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "BGP objects watch"),
            }
        }
        if listed.len() < 3 {
            continue;
        }
        let (p, a, r) = (pools.state(), adverts.state(), peers.state());
        let routing = Routing::new(
            &p.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            &a.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
            &r.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        );
        let changed = {
            let mut cur = cell.lock().unwrap_or_else(|e| e.into_inner());
            if cur.as_deref() == Some(&routing) {
                false
            } else {
                *cur = Some(Arc::new(routing));
                true
            }
        };
        if changed {
            tracing::debug!("routing facts changed; re-checking every Service");
            let _ = reconcile_all.unbounded_send(());
            pools_dirty.notify_one();
        }
    }
}
