//! `bgp::k8s::run` against a real kube-apiserver (`ringlb_e2e::controlplane`), with a
//! scripted BGP peer: the BGPPeer selecting this node becomes a session (MD5 key from
//! the Secret when the kernel has TCP_MD5SIG), the BGPAdvertisement becomes the peer's
//! policy, the BGPPeer for another rack is ignored, and this node's entry lands in
//! `BGPPeer.status.nodes`. The glue runs as ServiceAccount `ringlb-edge` under the
//! chart's RBAC (`charts/ringlb/templates/edge-rbac.yaml`), as an edge does in a
//! cluster; the test sets things up as the admin.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;
use kube::api::PostParams;
use prometheus_client::registry::Registry;
use ringlb_crds::{BGPAdvertisement, BGPPeer};
use ringlb_e2e::controlplane::{ControlPlane, Options, client_for};
use ringlb_edge::bgp::codec::{self, Afi, Decoded, Message, Open};
use ringlb_edge::bgp::k8s::{NodeContext, run};
use ringlb_edge::bgp::{RouteAttrs, Speaker};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

async fn create<K>(api: &Api<K>, v: serde_json::Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let obj: K = serde_json::from_value(v).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// The chart's release namespace in this test (its ServiceAccounts live there).
const RELEASE_NS: &str = "ringlb-system";

async fn read_msg(s: &mut TcpStream) -> Option<Message> {
    loop {
        let mut h = [0u8; 19];
        timeout(Duration::from_secs(8), s.read_exact(&mut h))
            .await
            .ok()?
            .ok()?;
        let len = usize::from(u16::from_be_bytes([h[16], h[17]]));
        let mut m = vec![0u8; len];
        m[..19].copy_from_slice(&h);
        s.read_exact(&mut m[19..]).await.ok()?;
        let msg = match codec::decode(&m, true).ok()? {
            Decoded::Message(m) => m,
            Decoded::Update(u) => Message::Update(u.update),
        };
        if msg != Message::Keepalive {
            return Some(msg);
        }
    }
}

#[tokio::test]
async fn objects_become_sessions_policy_and_status() {
    // The BGP peer: a loopback listener, with the MD5 key if the kernel supports it.
    let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let password = match ringlb_edge::bgp::md5::set_md5_key(
        &std_l,
        false,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        b"from-the-secret",
    ) {
        Ok(()) => Some("from-the-secret".to_string()),
        Err(e) => {
            eprintln!("note: no TCP_MD5SIG here ({e}); testing without the Secret/MD5 part");
            None
        }
    };
    std_l.set_nonblocking(true).unwrap();
    let bgp_l = TcpListener::from_std(std_l).unwrap();
    let bgp_port = bgp_l.local_addr().unwrap().port();
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("the control plane starts");
    let client = cp.client().await;
    cp.apply_chart_rbac(RELEASE_NS)
        .await
        .expect("the chart's RBAC applies");
    let edge_kubeconfig = cp
        .service_account_kubeconfig(RELEASE_NS, "ringlb-edge")
        .await
        .expect("a token for ringlb-edge");
    let edge_client = client_for(&edge_kubeconfig).await.unwrap();
    // the edge's role reads the Secrets BGPPeers name (get), and nothing more of them
    match Api::<Secret>::all(edge_client.clone())
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("ringlb-edge may list Secrets: {other:?}"),
    }
    let peers: Api<BGPPeer> = Api::all(client.clone());
    for (name, addr, rack) in [("tor-a", "127.0.0.1", "a"), ("tor-b", "127.0.0.9", "b")] {
        let mut spec = json!({"peerAddress": addr, "peerASN": 65000, "myASN": 65011, "port": bgp_port,
                              "holdTime": 3, "nodeSelector": {"matchLabels": {"rack": rack}}});
        if password.is_some() {
            spec["passwordSecretRef"] = json!({"name": "tor-md5", "namespace": "default"});
        }
        create(
            &peers,
            json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
            "metadata": {"name": name, "labels": {"role": "tor"}}, "spec": spec}),
        )
        .await;
    }
    create(
        &Api::<BGPAdvertisement>::all(client.clone()),
        json!({
        "apiVersion": "ringlb.io/v1alpha1", "kind": "BGPAdvertisement", "metadata": {"name": "tor"},
        "spec": {"peerSelector": {"matchLabels": {"role": "tor"}}, "communities": ["65011:42"]}}),
    )
    .await;
    create(&Api::<Node>::all(client.clone()), json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1", "labels": {"rack": "a"}}})).await;
    if let Some(pw) = &password {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("tor-md5".into()),
                ..Default::default()
            },
            data: Some(
                [(
                    "password".to_string(),
                    k8s_openapi::ByteString(pw.clone().into_bytes()),
                )]
                .into(),
            ),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    let mut reg = Registry::default();
    let speaker = Arc::new(Speaker::start(0, &mut reg).unwrap());
    speaker.announce(
        IpNetwork::V4("10.1.0.1/32".parse().unwrap()),
        RouteAttrs::default(),
    );
    let node = NodeContext {
        node_name: "edge-1".into(),
        router_id: Ipv4Addr::new(10, 0, 0, 11),
    };
    tokio::spawn(run(edge_client, node, speaker.clone()));

    let (mut s, _) = timeout(Duration::from_secs(10), bgp_l.accept())
        .await
        .expect("the BGPPeer selecting this node never became a session")
        .unwrap();
    let Some(Message::Open(o)) = read_msg(&mut s).await else {
        panic!("no OPEN")
    };
    assert_eq!(o.asn(), 65011);
    let ours = Open::new(65000, 3, Ipv4Addr::new(10, 0, 0, 1), &[Afi::Ipv4]);
    s.write_all(&Message::Open(ours).encode().unwrap())
        .await
        .unwrap();
    s.write_all(&Message::Keepalive.encode().unwrap())
        .await
        .unwrap();
    let mut got = None;
    while got.is_none() {
        match read_msg(&mut s).await {
            Some(Message::Update(u)) if !u.nlri.is_empty() => got = Some(u),
            Some(_) => {}
            None => panic!("session closed"),
        }
    }
    let u = got.unwrap();
    assert_eq!(
        u.attrs.unwrap().communities,
        vec![(65011 << 16) | 42],
        "BGPAdvertisement not applied"
    );
    assert_eq!(
        speaker.peers(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        "tor-b is for rack b"
    );

    // Keep the session up (keepalives out, everything in drained) while the status
    // loop runs.
    let (mut rd, mut wr) = s.into_split();
    tokio::spawn(async move {
        let mut sink = vec![0u8; 4096];
        while rd.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    });
    tokio::spawn(async move {
        let ka = Message::Keepalive.encode().unwrap();
        while wr.write_all(&ka).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    // Status: this node's entry, eventually Established with 1 prefix.
    let ok = timeout(Duration::from_secs(15), async {
        loop {
            let p = peers.get_status("tor-a").await.unwrap();
            let done = p
                .status
                .iter()
                .flat_map(|s| &s.nodes)
                .any(|e| e.node == "edge-1" && e.state == "Established" && e.advertised == 1);
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let status = peers.get_status("tor-a").await.unwrap().status;
    assert!(ok.is_ok(), "no Established status written: {status:?}");
    let other = peers.get_status("tor-b").await.unwrap().status;
    assert!(
        other
            .iter()
            .flat_map(|s| &s.nodes)
            .all(|e| e.node != "edge-1"),
        "tor-b is not this node's peer: {other:?}"
    );
}
