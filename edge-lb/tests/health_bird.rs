//! Health-driven BGP against a real BIRD 2 ToR: two edges (think: two regions
//! announcing one anycast VIP) run the edge's real sync (Services and EndpointSlices
//! -> Maglev tables -> the XDP apply path over in-memory maps -> the health tracker ->
//! our speaker) inside their network namespaces, each with its ops endpoint serving
//! `/health/vip/...`. Below `ringlb.io/min-ready-backends` an edge's route is
//! prepended (the ToR's FIB drops its next hop) or withdrawn; it comes back only
//! after the hold-down; flapping pods do not flap the route. The health URL is
//! fetched with curl from the ToR, as a GTM would. Needs root; skips loudly otherwise.

mod bgp_support;

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bgp_support::{Lab, TOR_V4, edge_v4, wait_until};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use prometheus_client::registry::Registry;
use ringlb_bgp::codec::Afi;
use ringlb_bgp::config::{ExportPolicy, ExportRule};
use ringlb_bgp::{PeerConfig, Speaker};
use ringlb_edge::agent::established_sessions;
use ringlb_edge::agent::metrics::DatapathMetrics;
use ringlb_edge::agent::sync::{Stores, SyncConfig, SyncState, sync};
use ringlb_edge::vip_health::Board;
use ringlb_nexthop::StaticResolver;
use ringlb_xdp::apply::Applier;
use ringlb_xdp::maps::memory::MemoryMaps;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

const VIP: &str = "10.91.100.7";
const HOLD_DOWN: &str = "2s";

/// `web` on VIP:80, with the health annotations given.
fn web(unhealthy_bgp: &str) -> Service {
    web_on(VIP, unhealthy_bgp)
}

/// `web` on `vip`:80, with the health annotations given.
fn web_on(vip: &str, unhealthy_bgp: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "annotations": {
            "ringlb.io/min-ready-backends": "2",
            "ringlb.io/unhealthy-bgp": unhealthy_bgp,
            "ringlb.io/health-hold-down": HOLD_DOWN,
        }},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]},
        "status": {"loadBalancer": {"ingress": [{"ip": vip, "ipMode": "VIP"}]}}
    }))
    .unwrap()
}

/// The EndpointSlice of `web` with `ready` of its three pods ready.
fn pods(ready: usize) -> EndpointSlice {
    let eps: Vec<_> = (0..3)
        .map(|i| json!({"addresses": [format!("10.1.0.{}", i + 1)], "conditions": {"ready": i < ready}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap()
}

/// `pods(ready)`, IPv6 pods.
fn pods6(ready: usize) -> EndpointSlice {
    let mut s = pods(ready);
    s.address_type = "IPv6".into();
    for (i, e) in s.endpoints.iter_mut().enumerate() {
        e.addresses = vec![format!("fd00:1::{}", i + 1)];
    }
    s
}

type Objects = (Service, EndpointSlice);

/// One edge agent's sync loop on its own thread, inside the edge's namespace.
struct Edge {
    tx: Option<mpsc::UnboundedSender<(Objects, oneshot::Sender<()>)>>,
    http: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Edge {
    fn start(lab: &Lab, i: u8, asn: u32) -> Edge {
        Edge::start_with(lab, i, asn, ExportPolicy::default())
    }

    /// An edge whose peer exports only what `policy` lets out (as built from the
    /// `BGPAdvertisement`s that select the ToR).
    fn start_with(lab: &Lab, i: u8, asn: u32, policy: ExportPolicy) -> Edge {
        Edge::start_peer(
            lab,
            i,
            PeerConfig {
                policy,
                ..peer(i, asn)
            },
        )
    }

    /// An edge with one peer, the ToR, as `cfg` says.
    fn start_peer(lab: &Lab, i: u8, cfg: PeerConfig) -> Edge {
        let ns = lab.ns(&format!("e{i}"));
        let (tx, mut rx) = mpsc::unbounded_channel::<(Objects, oneshot::Sender<()>)>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let f = ringlb_ops::netns::open_named(&ns).expect("the edge namespace");
            ringlb_ops::netns::setns_net(f.as_fd()).expect("entering the edge namespace");
            // One thread: every socket of the speaker and the ops endpoint is made here.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut reg = Registry::default();
                let speaker = Arc::new(Speaker::start(0, &mut reg).unwrap());
                let metrics = DatapathMetrics::register(&mut reg, "xdp");
                speaker.add_peer(cfg).unwrap();
                let board = Arc::new(Board::new(established_sessions(&speaker)));
                let pages: Arc<dyn ringlb_ops::ExtraPages> = board.clone();
                let bind = SocketAddr::new(edge_v4(i).parse().unwrap(), 0);
                let reg = Arc::new(tokio::sync::Mutex::new(reg));
                let health = ringlb_ops::Health::new();
                let (addr, _ops) = ringlb_ops::serve_ops_with(bind, reg, health, Some(pages))
                    .await
                    .unwrap();
                addr_tx.send(addr).unwrap();
                let resolver = Box::new(StaticResolver::default());
                let mut dp = Applier::new(MemoryMaps::default(), resolver).unwrap();
                let mut st = SyncState {
                    board,
                    ..Default::default()
                };
                let cfg = SyncConfig {
                    ring_size: 251,
                    default_class: true,
                };
                while let Some(((svc, slice), done)) = rx.recv().await {
                    let stores = stores(svc, slice);
                    sync(&stores, &cfg, &mut dp, &speaker, &metrics, &mut st);
                    let _ = done.send(());
                }
                speaker.withdraw_all();
            });
        });
        let http = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the edge's ops endpoint");
        Edge {
            tx: Some(tx),
            http,
            thread: Some(thread),
        }
    }

    /// One sync over these objects; returns once it is done.
    fn sync(&self, objs: Objects) {
        let (done, wait) = oneshot::channel();
        self.tx.as_ref().unwrap().send((objs, done)).unwrap();
        wait.blocking_recv().unwrap();
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        // Closing the channel ends the loop; the runtime drops its sockets.
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn stores(svc: Service, slice: EndpointSlice) -> Stores {
    let (services, mut w1) = reflector::store::<Service>();
    let (slices, mut w2) = reflector::store::<EndpointSlice>();
    w1.apply_watcher_event(&Event::Apply(svc));
    w2.apply_watcher_event(&Event::Apply(slice));
    Stores { services, slices }
}

fn peer(i: u8, asn: u32) -> PeerConfig {
    let (tor, id) = (TOR_V4.parse().unwrap(), edge_v4(i).parse().unwrap());
    PeerConfig {
        hold_time: 3,
        keepalive: 1,
        connect_retry: Duration::from_secs(1),
        families: vec![Afi::Ipv4],
        ..PeerConfig::new(tor, asn, 65000, id)
    }
}

fn fib(lab: &Lab) -> String {
    lab.tor_route(VIP)
}

/// docs/gtm.md's command, `curl -s -w '%{http_code}\n' URL`, from the ToR (where a GTM's
/// probe would come from): (HTTP status, body as printed, body parsed). The output
/// must be the body's line, then the status's.
fn probe(lab: &Lab, edge: &Edge, path: &str) -> (u16, String, serde_json::Value) {
    let url = format!("http://{}{path}", edge.http);
    let out = lab
        .exec("tor", "curl", &["-s", "-w", "%{http_code}\n", &url])
        .unwrap_or_default();
    let lines: Vec<&str> = out.split_terminator('\n').collect();
    assert_eq!(lines.len(), 2, "not a body line and a status line: {out:?}");
    (
        lines[1].parse().unwrap_or(0),
        lines[0].to_string(),
        serde_json::from_str(lines[0]).unwrap_or_default(),
    )
}

/// docs/gtm.md's health example: the VIP in its `curl -s -w '%{http_code}\n'
/// http://EDGE:PORT/health/vip/VIP/80` line, and the two lines it prints (body,
/// status). Panics if docs/gtm.md no longer has the command `probe` runs.
fn readme_health_example() -> (String, String, String) {
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gtm.md");
    let text = std::fs::read_to_string(readme).unwrap();
    let prefix = "$ curl -s -w '%{http_code}\\n' http://";
    let mut lines = text.lines().skip_while(|l| !l.starts_with(prefix));
    let cmd = lines
        .next()
        .unwrap_or_else(|| panic!("docs/gtm.md has no line starting {prefix:?}"));
    let vip = cmd
        .split("/health/vip/")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no /health/vip/VIP/ in {cmd:?}"));
    let body = lines.next().expect("docs/gtm.md: the example's body line");
    let status = lines
        .next()
        .expect("docs/gtm.md: the example's status line");
    (vip.to_string(), body.to_string(), status.to_string())
}

#[test]
fn bird_sees_prepend_med_and_withdraw_below_the_threshold_with_hold_down() {
    require_lab!("bird", "birdc", "curl");
    let lab = Lab::with_bird_two_edges("health");
    let e1 = Edge::start(&lab, 1, 65011);
    let e2 = Edge::start(&lab, 2, 65012);
    let prepend = || (web("prepend=3"), pods(2));
    e1.sync(prepend());
    e2.sync(prepend());
    let (via1, via2) = (format!("via {}", edge_v4(1)), format!("via {}", edge_v4(2)));
    let ecmp = |lab: &Lab| lab.routes_via_both_edges(VIP);
    let only_e1 = |lab: &Lab| {
        let r = fib(lab);
        r.contains(&via1) && !r.contains(&via2)
    };
    lab.assert_ecmp_within(
        VIP,
        Duration::from_secs(20),
        "no ECMP route from both healthy edges",
    );
    let path = format!("/health/vip/{VIP}/80");
    let (code, printed, _) = probe(&lab, &e2, &path);
    // docs/gtm.md's example as printed there (read now, so an edit of the page is
    // checked too), with this lab's VIP for the page's.
    let (readme_vip, body, status) = readme_health_example();
    assert_eq!(code.to_string(), status, "{printed}");
    assert_eq!(
        printed,
        body.replace(&readme_vip, VIP),
        "docs/gtm.md's example output"
    );

    // Edge 2's region loses a pod: one ready of two required. Prepended at once.
    let t0 = Instant::now();
    e2.sync((web("prepend=3"), pods(1)));
    let show_e2 = || lab.birdc(&["show", "route", "all", "protocol", "e2"]);
    assert!(
        wait_until(Duration::from_secs(5), || show_e2()
            .contains("BGP.as_path: 65012 65012 65012 65012")),
        "edge2's route is not prepended:\n{}",
        show_e2()
    );
    assert!(
        wait_until(Duration::from_secs(5), || only_e1(&lab)),
        "the ToR still sends to edge2: {}",
        fib(&lab)
    );
    eprintln!(
        "below threshold -> ToR FIB without edge2 after {:?}",
        t0.elapsed()
    );
    let (code, _, body) = probe(&lab, &e2, &path);
    assert_eq!((code, &body["state"]), (503, &json!("degraded")), "{body}");
    assert_eq!(
        body["reason"],
        "1 ready backends, 2 required; route de-preferred"
    );
    assert_eq!(probe(&lab, &e1, &path).0, 200, "edge1 is unaffected");

    // Pods flap faster than the hold-down: the route stays prepended throughout.
    let flaps = Instant::now();
    for n in 0..6 {
        e2.sync((web("prepend=3"), pods(if n % 2 == 0 { 2 } else { 1 })));
        std::thread::sleep(Duration::from_millis(300));
        assert!(only_e1(&lab), "route flapped with the pods: {}", fib(&lab));
    }
    eprintln!("6 flaps in {:?}: no route change", flaps.elapsed());

    // Steady again: de-preferred until the hold-down has passed, then ECMP.
    let back = Instant::now();
    e2.sync((web("prepend=3"), pods(2)));
    let (code, _, body) = probe(&lab, &e2, &path);
    assert_eq!(code, 503, "{body}");
    assert!(
        body["reason"].as_str().unwrap().starts_with("recovering"),
        "{body}"
    );
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        only_e1(&lab),
        "recovered before the hold-down: {}",
        fib(&lab)
    );
    // Resync (the agent also syncs when a hold-down ends) until the ToR has ECMP again.
    assert!(
        wait_until(Duration::from_secs(8), || {
            e2.sync((web("prepend=3"), pods(2)));
            ecmp(&lab)
        }),
        "edge2 did not come back after the hold-down: {}",
        fib(&lab)
    );
    assert!(
        back.elapsed() >= Duration::from_secs(2),
        "back after {:?}, inside the {HOLD_DOWN} hold-down",
        back.elapsed()
    );
    eprintln!(
        "restored -> ECMP again after {:?} (hold-down {HOLD_DOWN})",
        back.elapsed()
    );
    assert_eq!(probe(&lab, &e2, &path).0, 200);

    // Policy `withdraw`: below the threshold the route is gone from the ToR.
    e2.sync((web("withdraw"), pods(1)));
    assert!(
        wait_until(Duration::from_secs(5), || !show_e2().contains(VIP)
            && only_e1(&lab)),
        "edge2's route was not withdrawn:\n{}",
        show_e2()
    );
    let (code, _, body) = probe(&lab, &e2, &format!("/health/vip/{VIP}"));
    assert_eq!((code, &body["state"]), (503, &json!("down")), "{body}");
    assert_eq!(body["announced"], false);
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .starts_with("route withdrawn"),
        "{body}"
    );
    // Policy `med=500`: announced again, with the MED (BIRD compares MEDs only
    // between routes from one AS, so this is for a ToR that hears one AS per region).
    e2.sync((web("med=500"), pods(1)));
    assert!(
        wait_until(Duration::from_secs(5), || show_e2()
            .contains("BGP.med: 500")),
        "edge2's route has no MED 500:\n{}",
        show_e2()
    );
    // Unknown VIP, malformed address.
    assert_eq!(probe(&lab, &e2, "/health/vip/10.91.100.99").0, 404);
    assert_eq!(probe(&lab, &e2, "/health/vip/10.91.100.999").0, 400);
    drop((e1, e2));
}

/// Waits until `path` on `edge` answers 503 with a reason containing `why`, and
/// `announced: false`; the page's body.
fn not_announced_saying(lab: &Lab, edge: &Edge, path: &str, why: &str) -> serde_json::Value {
    let mut last = json!(null);
    let said = wait_until(Duration::from_secs(20), || {
        let (code, _, body) = probe(lab, edge, path);
        last = body.clone();
        code == 503 && body["reason"].as_str().is_some_and(|r| r.contains(why))
    });
    assert!(said, "the page never said {why:?}: {last}\n{}", lab.logs());
    assert_eq!(last["announced"], json!(false), "{last}");
    last
}

/// A VIP of a pool no `BGPAdvertisement` selects: the session to the ToR is up and
/// the route is in the speaker's table, but the export policy lets only the other
/// pool out, so no router has it. The health page answers 503, `announced: false`,
/// and says why (it used to answer 200 "healthy" because a session was up).
#[test]
fn an_unadvertised_pool_vip_answers_503_not_announced() {
    require_lab!("bird", "birdc", "curl");
    let lab = Lab::with_bird_two_edges("unadv");
    // The advertisement selects the pool of VIP (10.91.100.0/24) only.
    let policy = ExportPolicy {
        rules: vec![ExportRule {
            prefixes: Some(vec!["10.91.100.0/24".parse().unwrap()]),
            ..Default::default()
        }],
    };
    let e1 = Edge::start_with(&lab, 1, 65011, policy);
    let other = "10.92.0.7";
    e1.sync((web_on(other, "withdraw"), pods(3)));
    let path = format!("/health/vip/{other}/80");
    // Until the session is up the page says "no BGP session"; then why it is not sent.
    let last = not_announced_saying(&lab, &e1, &path, "no BGPAdvertisement selects this VIP");
    assert_eq!(last["state"], json!("down"), "{last}");
    let protocols = lab.birdc(&["show", "protocols"]);
    assert!(
        protocols
            .lines()
            .any(|l| l.starts_with("e1") && l.contains("Established")),
        "the session is up, so the reason is the advertisement: {protocols}"
    );
    assert!(
        !lab.tor_route(other).contains("via"),
        "the ToR has a route it should not: {}",
        lab.tor_route(other)
    );
    // The same edge, the advertised pool's VIP: announced, 200.
    e1.sync((web_on(VIP, "withdraw"), pods(3)));
    let ok = wait_until(Duration::from_secs(20), || {
        probe(&lab, &e1, &format!("/health/vip/{VIP}/80")).0 == 200
    });
    let (_, _, body) = probe(&lab, &e1, &format!("/health/vip/{VIP}/80"));
    assert!(ok && body["announced"] == json!(true), "{body}");
}

/// An IPv6 VIP on an edge whose session negotiated IPv4 only (the edge offers both
/// families, the ToR's BIRD has no `ipv6` channel): the route is in the speaker's
/// table and the session is up, yet no router can have it. The health page answers
/// 503, `announced: false`, naming the family; an IPv4 VIP on the same session is
/// announced.
#[test]
fn an_ipv6_vip_over_an_ipv4_only_session_answers_503_not_announced() {
    require_lab!("bird", "birdc", "curl");
    let lab = Lab::with_bird_two_edges("fam6");
    let both = PeerConfig {
        families: vec![Afi::Ipv4, Afi::Ipv6],
        ..peer(1, 65011)
    };
    let e1 = Edge::start_peer(&lab, 1, both);
    let v6 = "fd00:91::7";
    e1.sync((web_on(v6, "withdraw"), pods6(3)));
    let path = format!("/health/vip/{v6}/80");
    let last = not_announced_saying(&lab, &e1, &path, "negotiated IPv6");
    assert_eq!(
        last["programmed"],
        json!(true),
        "served, only not announced: {last}"
    );
    let protocols = lab.birdc(&["show", "protocols", "all", "e1"]);
    assert!(
        protocols.contains("Established") && !protocols.contains("Channel ipv6"),
        "an IPv4-only session: {protocols}"
    );
    e1.sync((web_on(VIP, "withdraw"), pods(3)));
    let ok = wait_until(Duration::from_secs(20), || {
        probe(&lab, &e1, &format!("/health/vip/{VIP}/80")).0 == 200
    });
    let (_, _, body) = probe(&lab, &e1, &format!("/health/vip/{VIP}/80"));
    assert!(ok && body["announced"] == json!(true), "{body}");
}
