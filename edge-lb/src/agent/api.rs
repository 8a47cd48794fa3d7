//! The agent's view of the API: the CRD check at start-up and the reflectors the
//! sync reads.

use std::sync::Arc;

use anyhow::Context;
use kube::api::Api;
use ringlb_crds::{BGPPeer, IPPool};
use tokio::sync::Notify;

use super::sync::Stores;
use crate::watch::{first_list, watch_services};

/// Watches Services and EndpointSlices (every change pokes `notify`) and waits for
/// their first lists.
pub(super) async fn watch_stores(
    client: &kube::Client,
    notify: &Arc<Notify>,
) -> anyhow::Result<Stores> {
    let (services, slices) = watch_services(client, notify);
    first_list(&services).await?;
    first_list(&slices).await?;
    Ok(Stores { services, slices })
}

/// Exits with a clear message when ringlb's CRDs are not installed.
pub(super) async fn check_crds(client: &kube::Client) -> anyhow::Result<()> {
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
