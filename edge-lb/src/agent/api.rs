//! The agent's view of the API: the CRD check at start-up and the reflectors the
//! sync reads.

use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher;
use ringlb_crds::{BGPPeer, IPPool};
use tokio::sync::Notify;

use super::sync::Stores;
use crate::peers::watch_into;

/// Watches Services and EndpointSlices (every change pokes `notify`) and waits for
/// their first lists.
pub async fn watch_stores(client: &kube::Client, notify: &Arc<Notify>) -> anyhow::Result<Stores> {
    let all = watcher::Config::default();
    let stores = Stores {
        services: watch_into(
            Api::<Service>::all(client.clone()),
            all.clone(),
            notify.clone(),
        )
        .0,
        slices: watch_into(
            Api::<EndpointSlice>::all(client.clone()),
            all,
            notify.clone(),
        )
        .0,
    };
    for (kind, ready) in [
        ("Service", stores.services.wait_until_ready().await),
        ("EndpointSlice", stores.slices.wait_until_ready().await),
    ] {
        ready.with_context(|| format!("first list of {kind}s"))?;
    }
    Ok(stores)
}

/// Exits with a clear message when ringlb's CRDs are not installed.
pub async fn check_crds(client: &kube::Client) -> anyhow::Result<()> {
    for (kind, res) in [
        (
            "BGPPeer",
            Api::<BGPPeer>::all(client.clone())
                .list(&Default::default())
                .await
                .map(|_| ()),
        ),
        (
            "IPPool",
            Api::<IPPool>::all(client.clone())
                .list(&Default::default())
                .await
                .map(|_| ()),
        ),
    ] {
        if let Err(kube::Error::Api(e)) = &res
            && e.code == 404
        {
            anyhow::bail!(
                "the {kind} CRD is not installed: kubectl apply -f crds/ (or install the Helm chart)"
            );
        }
        res.with_context(|| format!("listing {kind}s"))?;
    }
    Ok(())
}
