//! The real controller binary against a real kube-apiserver: the
//! `ringlb.io/Announced` Service condition and the IPPool `Advertised` condition
//! follow the `BGPAdvertisement`s, the `BGPPeer`s and the sessions the edges write
//! into the peers' status (written here as an edge would).

mod common;

use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use ringlb_crds::{BGPAdvertisement, BGPPeer, IPPool};
use serde_json::json;

const ANNOUNCED: &str = "ringlb.io/Announced";

/// (status, reason, message) of the Announced condition of Service `name`.
async fn announced(client: &kube::Client, name: &str) -> Option<(String, String, String)> {
    let c = get_svc(client, name)
        .await
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == ANNOUNCED)?;
    Some((c.status, c.reason, c.message))
}

/// Waits until Service `name`'s Announced condition reads `status`/`reason`; its message.
async fn becomes(client: &kube::Client, name: &str, status: &str, reason: &str) -> String {
    let what = format!("{name}: {ANNOUNCED} = {status}/{reason}");
    wait_for(Duration::from_secs(20), &what, || {
        let client = client.clone();
        async move {
            let (s, r, m) = announced(&client, name).await?;
            (s == status && r == reason).then_some(m)
        }
    })
    .await
}

/// Waits until pool `name`'s Advertised condition reads `status`/`reason`; its message.
async fn pool_becomes(client: &kube::Client, name: &str, status: &str, reason: &str) -> String {
    let what = format!("IPPool {name}: Advertised = {status}/{reason}");
    wait_for(Duration::from_secs(20), &what, || {
        let api = Api::<IPPool>::all(client.clone());
        async move {
            let p = api.get(name).await.ok()?;
            let c = p
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Advertised")?;
            (c.status == status && c.reason == reason).then_some(c.message)
        }
    })
    .await
}

/// Writes the peer's status as edges do: one entry per (node, state, families).
async fn sessions(client: &kube::Client, peer: &str, nodes: &[(&str, &str, &[&str])]) {
    let nodes: Vec<_> = nodes
        .iter()
        .map(|(n, s, f)| json!({"node": n, "state": s, "advertised": 1, "families": f}))
        .collect();
    Api::<BGPPeer>::all(client.clone())
        .patch_status(
            peer,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodes": nodes}})),
        )
        .await
        .expect("patch BGPPeer status");
}

#[tokio::test]
async fn announced_follows_advertisements_peers_and_negotiated_families() {
    let cluster = cluster().await;
    let client = cluster.client().await;
    create_pool(
        &client,
        "dark",
        &["198.51.100.0/30", "2001:db8:9::/126"],
        |_| {},
    )
    .await;
    let pools = Api::<IPPool>::all(client.clone());
    pools
        .patch(
            "dark",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "dark"}}})),
        )
        .await
        .unwrap();
    let _ctrl = Ctrl::start(&cluster, "c1", &[]);
    let dual =
        json!({"spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}});
    create_svc(&client, &lb_service("web", 80, dual)).await;
    let ips = wait_ips(&client, "web", Duration::from_secs(20)).await;
    assert_eq!(ips.len(), 2, "{ips:?}");

    // no BGPAdvertisement: handed out, sent to no router
    let m = becomes(&client, "web", "False", "NoAdvertisement").await;
    assert!(m.contains(&ips[0].to_string()), "{m}");
    pool_becomes(&client, "dark", "False", "NoAdvertisement").await;

    // an advertisement of the pool and a peer that no edge has a session with yet
    let peer: BGPPeer = serde_json::from_value(json!({
        "apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
        "metadata": {"name": "tor"},
        "spec": {"peerAddress": "192.0.2.254", "peerASN": 65000, "myASN": 65001}
    }))
    .unwrap();
    Api::<BGPPeer>::all(client.clone())
        .create(&PostParams::default(), &peer)
        .await
        .expect("create BGPPeer");
    let adv: BGPAdvertisement = serde_json::from_value(json!({
        "apiVersion": "ringlb.io/v1alpha1", "kind": "BGPAdvertisement",
        "metadata": {"name": "dark"},
        "spec": {"ipPoolSelector": {"matchLabels": {"tier": "dark"}}}
    }))
    .unwrap();
    Api::<BGPAdvertisement>::all(client.clone())
        .create(&PostParams::default(), &adv)
        .await
        .expect("create BGPAdvertisement");
    let m = becomes(&client, "web", "False", "NoSession").await;
    assert!(m.contains("BGPPeer tor"), "{m}");
    pool_becomes(&client, "dark", "True", "Advertised").await;

    // sessions up that negotiated IPv4 only: the IPv6 VIP reaches no router
    sessions(
        &client,
        "tor",
        &[
            ("edge-a", "Established", &["IPv4"]),
            ("edge-b", "Established", &["IPv4"]),
        ],
    )
    .await;
    let m = becomes(&client, "web", "False", "FamilyNotNegotiated").await;
    assert!(m.contains(&ips[1].to_string()) && m.contains("IPv6"), "{m}");
    assert!(
        !m.contains(&ips[0].to_string()),
        "names only what is missing: {m}"
    );

    // one edge's session carries IPv6 too
    sessions(
        &client,
        "tor",
        &[
            ("edge-a", "Established", &["IPv4"]),
            ("edge-b", "Established", &["IPv4", "IPv6"]),
        ],
    )
    .await;
    let m = becomes(&client, "web", "True", "Announced").await;
    assert!(m.contains("from 2 edge(s)"), "{m}");

    // the advertisement now selects other peers only
    Api::<BGPAdvertisement>::all(client.clone())
        .patch(
            "dark",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"peerSelector": {"matchLabels": {"rack": "r9"}}}})),
        )
        .await
        .unwrap();
    becomes(&client, "web", "False", "NoPeer").await;
    pool_becomes(&client, "dark", "False", "NoPeer").await;
}
