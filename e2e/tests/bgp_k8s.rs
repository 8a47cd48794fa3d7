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
use ringlb_bgp::codec::{self, Afi, Decoded, Message, Open};
use ringlb_bgp::{RouteAttrs, Speaker};
use ringlb_crds::{BGPAdvertisement, BGPPeer};
use ringlb_e2e::controlplane::{ControlPlane, Options};
use ringlb_edge::peers::{NodeContext, run};
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

/// Secret `default/tor-md5` with key `password`, as a BGPPeer's passwordSecretRef names.
async fn create_md5_secret(client: &kube::Client, password: &str) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("tor-md5".into()),
            ..Default::default()
        },
        data: Some(
            [(
                "password".to_string(),
                k8s_openapi::ByteString(password.as_bytes().to_vec()),
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

/// The BGP peer: a loopback listener, with the MD5 key if the kernel supports it.
fn peer_listener() -> (TcpListener, Option<String>) {
    let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let password = match ringlb_bgp::md5::set_md5_key(
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
    (bgp_l, password)
}

/// Two BGPPeers (one per rack), an advertisement with a community, this node in
/// rack a, and the MD5 Secret when there is a password.
async fn create_objects(client: &kube::Client, bgp_port: u16, password: Option<&str>) {
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
    if let Some(pw) = password {
        create_md5_secret(client, pw).await;
    }
}

/// A control plane with the chart's RBAC applied; an admin client, and one as
/// ServiceAccount `ringlb-edge`.
async fn control_plane_and_edge_client() -> (ControlPlane, kube::Client, kube::Client) {
    let cp = ControlPlane::start_with_chart_rbac(Options::default(), RELEASE_NS)
        .await
        .expect("the control plane starts with the chart's RBAC");
    let client = cp.client().await;
    let edge_client = cp
        .service_account_client(RELEASE_NS, "ringlb-edge")
        .await
        .expect("a client as ringlb-edge");
    (cp, client, edge_client)
}

/// A speaker (no listening port) announcing `routes`.
fn start_speaker(routes: &[&str]) -> Arc<Speaker> {
    let speaker = Arc::new(Speaker::start(0, &mut Registry::default()).unwrap());
    for r in routes {
        speaker.announce(IpNetwork::V4(r.parse().unwrap()), RouteAttrs::default());
    }
    speaker
}

/// Runs the edge's BGP glue as node `node_name` with router ID `router_id`.
fn spawn_edge(
    client: kube::Client,
    node_name: &str,
    router_id: Ipv4Addr,
    speaker: &Arc<Speaker>,
) -> tokio::task::JoinHandle<Result<(), ringlb_bgp::Error>> {
    let node = NodeContext {
        node_name: node_name.into(),
        router_id,
    };
    tokio::spawn(run(client, node, speaker.clone(), heartbeat()))
}

#[tokio::test]
async fn objects_become_sessions_policy_and_status() {
    let (bgp_l, password) = peer_listener();
    let bgp_port = bgp_l.local_addr().unwrap().port();
    let (_cp, client, edge_client) = control_plane_and_edge_client().await;
    // the edge's role reads the Secrets BGPPeers name (get), and nothing more of them
    match Api::<Secret>::all(edge_client.clone())
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("ringlb-edge may list Secrets: {other:?}"),
    }
    create_objects(&client, bgp_port, password.as_deref()).await;
    let peers: Api<BGPPeer> = Api::all(client.clone());

    let speaker = start_speaker(&["10.1.0.1/32"]);
    spawn_edge(edge_client, "edge-1", Ipv4Addr::new(10, 0, 0, 11), &speaker);

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

    keep_up(s);
    established_status(&peers).await;
}

/// Each BGPPeer's status is its own. A second BGPPeer with the first one's address
/// (another ASN and port) used to be dropped without a word while its status showed
/// the first one's session; a peer whose Secret is missing had no status at all. Now
/// the later peer says `Conflict` (naming the earlier one, which keeps its session)
/// with a Warning Event, and a missing Secret and a missing key say two different
/// things on the BGPPeer's status. Runs as `ringlb-edge` under the chart's RBAC.
#[tokio::test]
async fn conflicting_and_secretless_peers_say_so_on_their_own_status() {
    let (_cp, client, edge_client) = control_plane_and_edge_client().await;
    create_conflicting_and_secretless_peers(&client).await;
    let peers: Api<BGPPeer> = Api::all(client.clone());

    let speaker = start_speaker(&[]);
    spawn_edge(edge_client, "edge-1", Ipv4Addr::new(10, 0, 0, 11), &speaker);

    let seen = later_and_secretless_peers_say_so(&peers).await;
    first_peer_keeps_its_session_and_status(&speaker, &peers, &seen).await;
    conflict_event_names_the_earlier_peer(&client).await;
}

/// Node `edge-1`, a Secret without the named key, and BGPPeers `first`, `second` (first's
/// address, created a second later), `no-secret` and `no-key`.
async fn create_conflicting_and_secretless_peers(client: &kube::Client) {
    create(&Api::<Node>::all(client.clone()), json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1", "labels": {"rack": "a"}}})).await;
    // A Secret without the key the peer names.
    create(
        &Api::<Secret>::namespaced(client.clone(), "default"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wrong-key"},
               "data": {"pw": "c2VjcmV0"}}),
    )
    .await;
    // Nobody listens here: the first peer's session stays short of Established.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let peers: Api<BGPPeer> = Api::all(client.clone());
    let mk = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
               "metadata": {"name": name}, "spec": spec})
    };
    create(
        &peers,
        mk(
            "first",
            json!({"peerAddress": "127.0.0.1", "peerASN": 65000, "myASN": 65011, "port": port}),
        ),
    )
    .await;
    // creationTimestamp has one-second resolution.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (name, spec) in [
        (
            "second",
            json!({"peerAddress": "127.0.0.1", "peerASN": 65100, "myASN": 65011, "port": 1179}),
        ),
        (
            "no-secret",
            json!({"peerAddress": "127.0.0.2", "peerASN": 65000, "myASN": 65011,
                   "passwordSecretRef": {"name": "absent", "namespace": "default"}}),
        ),
        (
            "no-key",
            json!({"peerAddress": "127.0.0.3", "peerASN": 65000, "myASN": 65011,
                   "passwordSecretRef": {"name": "wrong-key", "namespace": "default"}}),
        ),
    ] {
        create(&peers, mk(name, spec)).await;
    }
}

/// `second` says Conflict, `no-secret` and `no-key` say Invalid with their own reasons,
/// on their entry for `edge-1` and their conditions; returns every status, for messages.
async fn later_and_secretless_peers_say_so(peers: &Api<BGPPeer>) -> String {
    // (BGPPeer, its entry's state, words in its lastError, condition, reason)
    let wanted = [
        (
            "second",
            "Conflict",
            "BGPPeer \"first\"",
            "Conflict",
            "SessionConflict",
        ),
        (
            "no-secret",
            "Invalid",
            "Secret default/absent does not exist",
            "Invalid",
            "SecretNotFound",
        ),
        (
            "no-key",
            "Invalid",
            "Secret default/wrong-key has no key \"password\" (it has: pw)",
            "Invalid",
            "SecretKeyMissing",
        ),
    ];
    let check = |p: &BGPPeer, w: &(&str, &str, &str, &str, &str)| -> bool {
        let Some(st) = p.status.as_ref() else {
            return false;
        };
        let entry = st.nodes.iter().find(|n| n.node == "edge-1");
        let cond = st.conditions.iter().find(|c| c.type_ == w.3);
        entry.is_some_and(|e| {
            e.state == w.1
                && e.advertised == 0
                && e.last_error.as_deref().unwrap_or("").contains(w.2)
        }) && cond.is_some_and(|c| c.status == "True" && c.reason == w.4)
    };
    let done = timeout(Duration::from_secs(30), async {
        loop {
            let mut all = true;
            for w in &wanted {
                let p = peers.get_status(w.0).await.unwrap();
                all &= check(&p, w);
            }
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let mut seen = String::new();
    for name in ["first", "second", "no-secret", "no-key"] {
        let st = peers.get_status(name).await.unwrap().status;
        seen.push_str(&format!("{name}: {st:?}\n"));
    }
    assert!(done.is_ok(), "statuses never said so:\n{seen}");
    eprintln!("{seen}");
    seen
}

/// The earlier peer keeps its session and its status is its own.
async fn first_peer_keeps_its_session_and_status(
    speaker: &Speaker,
    peers: &Api<BGPPeer>,
    seen: &str,
) {
    assert_eq!(speaker.peers(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    let first = peers.get_status("first").await.unwrap();
    let st = first.status.unwrap_or_default();
    assert!(
        st.nodes
            .iter()
            .any(|n| n.node == "edge-1" && n.state != "Conflict" && n.state != "Invalid"),
        "{seen}"
    );
    assert!(
        st.conditions
            .iter()
            .filter(|c| c.type_ == "Conflict" || c.type_ == "Invalid")
            .all(|c| c.status == "False"),
        "{seen}"
    );
}

/// A Warning Event on the later peer, naming the earlier one.
async fn conflict_event_names_the_earlier_peer(client: &kube::Client) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let found = timeout(Duration::from_secs(10), async {
        loop {
            let list = events.list(&Default::default()).await.unwrap();
            if let Some(e) = list.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("second")
                    && e.reason.as_deref() == Some("SessionConflict")
            }) {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("no SessionConflict Event on BGPPeer second");
    assert_eq!(found.type_.as_deref(), Some("Warning"));
    assert!(
        found
            .note
            .as_deref()
            .unwrap_or("")
            .contains("BGPPeer \"first\""),
        "{found:?}"
    );
}

/// Keeps the session up (keepalives out, everything in drained) while the status
/// loop runs.
fn keep_up(s: TcpStream) {
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
}

/// Status: this node's entry, eventually Established with 1 prefix, on tor-a only.
async fn established_status(peers: &Api<BGPPeer>) {
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

/// What a role without one rule must break.
#[derive(Debug, Clone, Copy)]
enum Broken {
    /// the BGPPeer never becomes a session
    NoSession,
    /// the session comes up but no route is announced (no export policy)
    NoRoute,
    /// the session and route come up, the node's status entry is never written
    NoStatus,
    /// nothing (the full role, the control case): session, route and status entry
    Nothing,
}

/// The edge ClusterRole's rules (`charts/ringlb/templates/edge-rbac.yaml`).
fn edge_role_rules() -> Vec<serde_json::Value> {
    let path = ringlb_e2e::controlplane::chart_dir().join("templates/edge-rbac.yaml");
    let yaml = ringlb_e2e::controlplane::render_release_namespace(
        &std::fs::read_to_string(&path).unwrap(),
        RELEASE_NS,
    );
    serde_yaml::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|v: &serde_json::Value| v["kind"] == "ClusterRole")
        .expect("a ClusterRole in edge-rbac.yaml")["rules"]
        .as_array()
        .unwrap()
        .clone()
}

/// The scripted peer's side of one case: what it sees within a few seconds.
async fn observe(
    l: TcpListener,
    peers: Api<BGPPeer>,
    peer: String,
    node: String,
    broken: Broken,
) -> Result<(), String> {
    let accepted = timeout(Duration::from_secs(8), l.accept()).await;
    let mut s = match (broken, accepted) {
        (Broken::NoSession, Err(_)) => return Ok(()),
        (Broken::NoSession, Ok(_)) => return Err("a session came up".into()),
        (_, Err(_)) => return Err("no session, which this rule is not for".into()),
        (_, Ok(r)) => r.map_err(|e| e.to_string())?.0,
    };
    let Some(Message::Open(_)) = read_msg(&mut s).await else {
        return Err("no OPEN".into());
    };
    let ours = Open::new(65000, 3, Ipv4Addr::new(10, 0, 0, 1), &[Afi::Ipv4]);
    s.write_all(&Message::Open(ours).encode().unwrap())
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(&Message::Keepalive.encode().unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let route = timeout(Duration::from_secs(6), async {
        loop {
            match read_msg(&mut s).await {
                Some(Message::Update(u)) if !u.nlri.is_empty() => return true,
                Some(_) => {}
                None => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    match broken {
        Broken::NoRoute if route => return Err("a route was announced".into()),
        Broken::NoRoute => return Ok(()),
        _ if !route => return Err("no route, which this rule is not for".into()),
        _ => {}
    }
    // keep the session up over more than one status interval (5 s)
    let (mut rd, mut wr) = s.into_split();
    let keep = tokio::spawn(async move {
        let ka = Message::Keepalive.encode().unwrap();
        let mut sink = vec![0u8; 4096];
        loop {
            tokio::select! {
                r = rd.read(&mut sink) => if !r.is_ok_and(|n| n > 0) { return },
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if wr.write_all(&ka).await.is_err() { return }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    keep.abort();
    let status = peers.get_status(&peer).await.map_err(|e| e.to_string())?;
    let written = status
        .status
        .iter()
        .flat_map(|s| &s.nodes)
        .any(|e| e.node == node);
    match (broken, written) {
        (Broken::Nothing, true) | (Broken::NoStatus, false) => Ok(()),
        (Broken::Nothing, false) => Err("no status entry under the full role".into()),
        _ => Err("the status entry was written".into()),
    }
}

/// The edge role is minimal for the BGP glue: run it as a ServiceAccount whose role
/// is the chart's minus one rule, and what that rule is for fails: without `nodes` or
/// `bgppeers` no session, without `bgpadvertisements` no route, without
/// `bgppeers/status` no status entry, without `secrets` (when the kernel has
/// TCP_MD5SIG) no session with the MD5 peer; the control case with the full role gets
/// all three. All cases run side by side on one control plane. (Services, EndpointSlices and IPPools are read by the agent around the glue;
/// the lab test runs that under the full role.)
#[tokio::test]
async fn the_edge_role_without_one_rule_breaks_what_needs_it() {
    let cp = ControlPlane::start_with_chart_rbac(Options::default(), RELEASE_NS)
        .await
        .expect("the control plane starts with the chart's RBAC");
    let admin = cp.client().await;
    let rules = edge_role_rules();
    let md5 = ringlb_bgp::md5::set_md5_key(
        &std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        false,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        b"probe",
    )
    .is_ok();
    let mut cases = vec![
        ("(none)", Broken::Nothing),
        ("nodes", Broken::NoSession),
        ("bgppeers", Broken::NoSession),
        ("bgpadvertisements", Broken::NoRoute),
        ("bgppeers/status", Broken::NoStatus),
    ];
    if md5 {
        cases.push(("secrets", Broken::NoSession));
    } else {
        eprintln!("note: no TCP_MD5SIG here; the secrets rule is not checked");
    }
    create(
        &Api::<BGPAdvertisement>::all(admin.clone()),
        json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPAdvertisement",
               "metadata": {"name": "tor"}, "spec": {"peerSelector": {"matchLabels": {"role": "tor"}}}}),
    )
    .await;
    let password = "from-the-secret";
    create_md5_secret(&admin, password).await;

    let mut checks = Vec::new();
    let mut _speakers = Vec::new();
    for (i, (resource, broken)) in cases.iter().copied().enumerate() {
        let (sa, node, peer) = (
            format!("edge-minus-{i}"),
            format!("edge-{i}"),
            format!("tor-{i}"),
        );
        let kept: Vec<&serde_json::Value> = rules
            .iter()
            .filter(|r| r["resources"] != json!([resource]))
            .collect();
        let removed = usize::from(!matches!(broken, Broken::Nothing));
        assert_eq!(
            kept.len() + removed,
            rules.len(),
            "one rule is for {resource}"
        );
        let objects = [
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": sa, "namespace": RELEASE_NS}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": sa}, "rules": kept}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": sa},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
                   "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NS}]}),
        ];
        for o in &objects {
            cp.apply_yaml(&o.to_string()).await.unwrap();
        }
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // the control case peers with MD5 too, so its session proves the setup works
        let with_md5 = md5 && matches!(resource, "secrets" | "(none)");
        if with_md5 {
            ringlb_bgp::md5::set_md5_key(
                &std_l,
                false,
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                password.as_bytes(),
            )
            .unwrap();
        }
        std_l.set_nonblocking(true).unwrap();
        let l = TcpListener::from_std(std_l).unwrap();
        let mut spec = json!({"peerAddress": "127.0.0.1", "peerASN": 65000, "myASN": 65011,
            "port": l.local_addr().unwrap().port(), "holdTime": 3,
            "nodeSelector": {"matchLabels": {"case": i.to_string()}}});
        if with_md5 {
            spec["passwordSecretRef"] = json!({"name": "tor-md5", "namespace": "default"});
        }
        create(
            &Api::<BGPPeer>::all(admin.clone()),
            json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
                   "metadata": {"name": peer, "labels": {"role": "tor"}}, "spec": spec}),
        )
        .await;
        create(
            &Api::<Node>::all(admin.clone()),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": node, "labels": {"case": i.to_string()}}}),
        )
        .await;
        let client = cp.service_account_client(RELEASE_NS, &sa).await.unwrap();
        let speaker = start_speaker(&["10.1.0.1/32"]);
        let router_id = Ipv4Addr::new(10, 0, 0, 11 + i as u8);
        _speakers.push(spawn_edge(client, &node, router_id, &speaker));
        let peers = Api::<BGPPeer>::all(admin.clone());
        checks.push(async move {
            (
                resource,
                broken,
                observe(l, peers, peer, node, broken).await,
            )
        });
    }
    let results = futures::future::join_all(checks).await;
    for (resource, broken, r) in &results {
        eprintln!("without the {resource} rule: {broken:?}: {r:?}");
    }
    for (resource, broken, r) in results {
        assert!(
            r.is_ok(),
            "without the {resource} rule the glue should show {broken:?}: {}",
            r.unwrap_err()
        );
    }
}

/// A heartbeat nobody checks (the tests watch the speaker, not /healthz).
fn heartbeat() -> ringlb_ops::Heartbeat {
    ringlb_ops::Health::new().heartbeat("bgp-config", Duration::from_secs(3600))
}
