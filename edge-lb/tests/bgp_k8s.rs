//! `bgp::k8s::run` against a minimal fake Kubernetes API on loopback (lists, watches
//! that stay open, a Secret, BGPPeer status GET/PUT), with a scripted BGP peer: the
//! BGPPeer selecting this node becomes a session (MD5 key from the Secret when the
//! kernel has TCP_MD5SIG), the BGPAdvertisement becomes the peer's policy, the one for
//! another rack is ignored, and this node's entry lands in `BGPPeer.status.nodes`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use ipnetwork::IpNetwork;
use prometheus_client::registry::Registry;
use ringlb_edge::bgp::codec::{self, Afi, Decoded, Message, Open};
use ringlb_edge::bgp::k8s::{NodeContext, run};
use ringlb_edge::bgp::{RouteAttrs, Speaker};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

type Puts = Arc<Mutex<Vec<Value>>>;

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": "1"}, "items": items})
}

struct World {
    bgp_port: u16,
    password: Option<String>,
}

impl World {
    fn peer(&self, name: &str, addr: &str, rack: &str) -> Value {
        let mut spec = json!({"peerAddress": addr, "peerASN": 65000, "myASN": 65011, "port": self.bgp_port,
                              "holdTime": 3, "nodeSelector": {"matchLabels": {"rack": rack}}});
        if self.password.is_some() {
            spec["passwordSecretRef"] = json!({"name": "tor-md5", "namespace": "ringlb"});
        }
        json!({"apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
               "metadata": {"name": name, "resourceVersion": "1", "uid": format!("uid-{name}"),
                            "labels": {"role": "tor"}},
               "spec": spec})
    }

    fn respond(
        &self,
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
        puts: &Puts,
    ) -> (u16, Value) {
        let v1 = "ringlb.io/v1alpha1";
        match (method, path) {
            ("GET", "/apis/ringlb.io/v1alpha1/bgppeers") => (
                200,
                list(
                    "BGPPeer",
                    v1,
                    vec![
                        self.peer("tor-a", "127.0.0.1", "a"),
                        self.peer("tor-b", "127.0.0.9", "b"),
                    ],
                ),
            ),
            ("GET", "/apis/ringlb.io/v1alpha1/bgppeers/tor-a") => {
                (200, self.peer("tor-a", "127.0.0.1", "a"))
            }
            ("PUT", "/apis/ringlb.io/v1alpha1/bgppeers/tor-a/status") => {
                let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                puts.lock().unwrap().push(v.clone());
                (200, v)
            }
            ("GET", "/apis/ringlb.io/v1alpha1/bgpadvertisements") => (
                200,
                list(
                    "BGPAdvertisement",
                    v1,
                    vec![json!({"apiVersion": v1, "kind": "BGPAdvertisement",
                                "metadata": {"name": "tor", "resourceVersion": "1"},
                                "spec": {"peerSelector": {"matchLabels": {"role": "tor"}},
                                         "communities": ["65011:42"]}})],
                ),
            ),
            ("GET", "/apis/ringlb.io/v1alpha1/ippools") => (200, list("IPPool", v1, vec![])),
            ("GET", "/api/v1/nodes") => {
                assert!(
                    query.contains("fieldSelector=metadata.name%3Dedge-1"),
                    "node watch is not scoped: {query}"
                );
                (
                    200,
                    list(
                        "Node",
                        "v1",
                        vec![json!({"apiVersion": "v1", "kind": "Node",
                                    "metadata": {"name": "edge-1", "resourceVersion": "1", "labels": {"rack": "a"}}})],
                    ),
                )
            }
            ("GET", "/api/v1/namespaces/ringlb/secrets/tor-md5") => {
                let secret = k8s_openapi::api::core::v1::Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some("tor-md5".into()),
                        namespace: Some("ringlb".into()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(
                        "password".to_string(),
                        k8s_openapi::ByteString(
                            self.password.clone().unwrap_or_default().into_bytes(),
                        ),
                    )])),
                    ..Default::default()
                };
                (200, serde_json::to_value(secret).unwrap())
            }
            _ => (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                              "reason": "NotFound", "message": format!("{method} {path}")}),
            ),
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    world: Arc<World>,
    puts: Puts,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if query.contains("watch=true") || query.contains("watch=1") {
        // Nothing ever changes: hold the watch open.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (code, v) = world.respond(&method, &path, &query, &body, &puts);
    Ok(Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&v).unwrap())))
        .unwrap())
}

async fn fake_api(world: World, puts: Puts) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let world = Arc::new(world);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let (w, p) = (world.clone(), puts.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| handle(r, w.clone(), p.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    port
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
    let puts: Puts = Arc::default();
    let api_port = fake_api(
        World {
            bgp_port: bgp_l.local_addr().unwrap().port(),
            password,
        },
        puts.clone(),
    )
    .await;

    let cfg = kube::Config::new(format!("http://127.0.0.1:{api_port}").parse().unwrap());
    let client = kube::Client::try_from(cfg).unwrap();
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
    tokio::spawn(run(client, node, speaker.clone()));

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
            let done = puts.lock().unwrap().iter().any(|v| {
                v["status"]["nodes"].as_array().is_some_and(|n| {
                    n.iter().any(|e| {
                        e["node"] == "edge-1" && e["state"] == "Established" && e["advertised"] == 1
                    })
                })
            });
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ok.is_ok(),
        "no Established status written: {:?}",
        puts.lock().unwrap()
    );
}
