//! The reflectors both agents read from: every change pokes one `Notify` (the
//! agent's loop coalesces them), and start-up waits for each store's first list.

use std::sync::Arc;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Resource};
use tokio::sync::Notify;

/// A reflector for `api` whose every change (and every completed relist) pokes
/// `dirty`; watch errors are logged and retried with backoff.
pub fn watch_into<K>(
    api: Api<K>,
    cfg: watcher::Config,
    dirty: Arc<Notify>,
) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store::<K>();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let task = tokio::spawn(
        watcher(api, cfg)
            .backoff(ringlb_ops::WatchBackoff::default())
            .reflect(writer)
            .for_each(move |ev| {
                let dirty = dirty.clone();
                let kind = kind.clone();
                async move {
                    match ev {
                        Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => {
                            dirty.notify_one()
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(%kind, error = %e, "watch error; retrying with backoff")
                        }
                    }
                }
            }),
    );
    (reader, task)
}

/// Every Service and EndpointSlice, each change poking `notify`: what both the
/// edge and the node agent serve from.
pub fn watch_services(
    client: &kube::Client,
    notify: &Arc<Notify>,
) -> (Store<Service>, Store<EndpointSlice>) {
    let all = watcher::Config::default();
    let services = watch_into(Api::all(client.clone()), all.clone(), notify.clone()).0;
    let slices = watch_into(Api::all(client.clone()), all, notify.clone()).0;
    (services, slices)
}

/// Waits for `store`'s first list.
pub async fn first_list<K>(store: &Store<K>) -> anyhow::Result<()>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    store
        .wait_until_ready()
        .await
        .with_context(|| format!("first list of {kind}s"))
}
