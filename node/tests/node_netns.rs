//! Real traffic through the node datapath in network namespaces:
//!
//! ```text
//!  client 10.202.1.2 ---- tor (router) ---- edge 10.202.0.11   XDP ringlb_xdp (native)
//!   (MTU 1500)               |
//!                     node 10.202.2.2     tc ringlb_node_ingress / _egress on eth0
//!                            | vp0 10.202.3.1
//!                     pod  10.202.3.5     TCP server on :8080, no VIP anywhere
//! ```
//! client -> tor -> edge (XDP: Maglev + IPIP to the pod, XDP_TX) -> tor ->
//! node (decap, VIP:80 -> pod:8080) -> pod; the pod's reply -> node (egress:
//! pod:8080 -> VIP:80, SYN-ACK MSS clamped) -> tor -> client, never the edge.
//! Every link has MTU 1500, so a client segment of the default MSS (1460)
//! would not fit the tunnel (1460 + 40 + 20 = 1520): only the clamp (1440)
//! lets uploads through. The node checks tunnel sources (as `ringlb-edge node`
//! does): the edge is its only allowed one, and an IPIP packet the client crafts
//! for the pod (a host that is no edge) is dropped and counted. Needs root; skips
//! loudly otherwise.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::KernelResolver;
use ringlb_node::{NodeDatapath, NodeOptions, NodeState, Proto as NodeProto, abi::Stat};
use ringlb_testkit::netns::{Netns, attach_pass, in_netns, nsx, sh, tx_checksum_off};
use ringlb_testkit::tier::require_root;
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};

const VIP: &str = "10.202.100.1";
const POD: &str = "10.202.3.5";
const CLIENT: &str = "10.202.1.2";
const EDGE: &str = "10.202.0.11";
const MB10: usize = 10 * 1024 * 1024;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn veth(a_ns: &str, a: &str, a_ip: &str, b_ns: &str, b: &str, b_ip: &str) {
    sh(&[
        "ip", "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ]);
    for (ns, dev, addr) in [(a_ns, a, a_ip), (b_ns, b, b_ip)] {
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
        sh(&["ip", "-n", ns, "link", "set", dev, "mtu", "1500", "up"]);
    }
}

fn route(ns: &str, dst: &str, via: &str) {
    sh(&["ip", "-n", ns, "route", "add", dst, "via", via]);
}

fn sysctl(ns: &str, kv: &str) {
    nsx(ns, &["sysctl", "-qw", kv]);
}

/// The namespaces of the picture: links, routes, and what DSR needs.
fn wire([c, t, e, n, p]: [&str; 5]) {
    veth(c, "eth0", "10.202.1.2/24", t, "ve-cl", "10.202.1.1/24");
    veth(e, "eth0", "10.202.0.11/24", t, "ve-e", "10.202.0.1/24");
    veth(n, "eth0", "10.202.2.2/24", t, "ve-n", "10.202.2.1/24");
    veth(p, "eth0", "10.202.3.5/24", n, "vp0", "10.202.3.1/24");
    route(c, "default", "10.202.1.1");
    route(e, "default", "10.202.0.1");
    route(n, "default", "10.202.2.1");
    route(p, "default", "10.202.3.1");
    route(t, &format!("{VIP}/32"), "10.202.0.11"); // BGP's job in production
    route(t, "10.202.3.0/24", "10.202.2.2"); // the node's pod CIDR
    for ns in [t, n] {
        sysctl(ns, "net.ipv4.ip_forward=1");
    }
    // the VIP comes back from the node while the ToR routes it to the edge
    for ns in [c, t, e, n, p] {
        sysctl(ns, "net.ipv4.conf.all.rp_filter=0");
        sysctl(ns, "net.ipv4.conf.default.rp_filter=0");
    }
    for dev in ["ve-cl", "ve-e", "ve-n"] {
        sysctl(t, &format!("net.ipv4.conf.{dev}.rp_filter=0"));
    }
    // a veth frame sent with XDP_TX keeps a partial checksum otherwise
    in_netns(c, || tx_checksum_off("eth0"));
    // the client counts what comes back: from VIP:80 (DSR, translated) and
    // from the pod's own address (a reply that escaped translation)
    for rule in [
        vec!["-s", VIP, "-p", "tcp", "--sport", "80", "-j", "ACCEPT"],
        vec!["-s", POD, "-j", "ACCEPT"],
    ] {
        let mut a = vec!["iptables", "-w", "-A", "INPUT"];
        a.extend(rule);
        nsx(c, &a);
    }
}

/// (bytes from VIP:80, packets from the pod) the client received.
fn client_counts(c: &str) -> (u64, u64) {
    let out = nsx(c, &["iptables", "-w", "-L", "INPUT", "-v", "-x", "-n"]);
    // columns: pkts bytes target prot opt in out source destination
    let col = |src: &str, i: usize| {
        out.lines()
            .find(|l| l.split_whitespace().nth(7) == Some(src))
            .and_then(|l| l.split_whitespace().nth(i)?.parse().ok())
            .unwrap_or_else(|| panic!("no counter for {src} in\n{out}"))
    };
    (col(VIP, 1), col(POD, 0))
}

/// (rx bytes, tx bytes) of `dev` (bytes: veths carry GSO packets, so packet
/// counts depend on segmentation).
fn link_bytes(ns: &str, dev: &str) -> (u64, u64) {
    let j: serde_json::Value =
        serde_json::from_str(&nsx(ns, &["ip", "-j", "-s", "link", "show", "dev", dev])).unwrap();
    let s = &j[0]["stats64"];
    (
        s["rx"]["bytes"].as_u64().unwrap(),
        s["tx"]["bytes"].as_u64().unwrap(),
    )
}

/// The edge: ringlb_xdp with VIP:80 -> the pod, native on eth0, and
/// ringlb_pass on the ToR's side (veth XDP_TX needs a program on the peer).
fn the_edge(t: &str, e: &str) -> (XdpDatapath, aya::Ebpf) {
    let pass = attach_pass(t, "ve-e");
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some("10.202.0.11".parse().unwrap()),
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    };
    let mut dp = XdpDatapath::load(&opts, Box::new(KernelResolver::new(Some(e.into())))).unwrap();
    let vip = Vip {
        addr: ip(VIP),
        port: 80,
        proto: Proto::Tcp,
    };
    let backend = Backend {
        addr: ip(POD),
        port: 8080,
        weight: 1,
    };
    let table = Table::build(&[backend], 251).unwrap();
    let entry = ServiceEntry::from_table(&vip, &table).unwrap();
    dp.apply(&DesiredState {
        services: [(vip, entry)].into_iter().collect(),
    })
    .unwrap();
    assert_eq!(
        in_netns(e, || dp.attach("eth0", AttachMode::Native).unwrap()),
        "native"
    );
    (dp, pass)
}

/// The node: both programs on its uplink, Service 80 -> targetPort 8080 on
/// the pod, MSS clamp for a 1500-byte fabric (1440), tunnels taken from the
/// edge's address only.
fn the_node(n: &str) -> NodeDatapath {
    let opts = NodeOptions {
        pin_dir: None,
        check_source: true,
        ..NodeOptions::default()
    };
    assert_eq!(opts.mss4, 1440);
    let mut dp = NodeDatapath::load(&opts).unwrap();
    let mut s = NodeState::default();
    s.add_backend(ip(VIP), 80, NodeProto::Tcp, ip(POD), 8080);
    s.edges.insert(ip(EDGE));
    dp.apply(&s).unwrap();
    in_netns(n, || dp.attach_uplink("eth0").unwrap());
    dp
}

/// What the pod's server saw: (local address, peer address) per connection.
type Seen = Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>;

/// The pod's server on 0.0.0.0:8080. One request line per connection:
/// `hello` -> `pod <local> <peer>`; `get N` -> N bytes; `put N` -> reads N
/// bytes, answers `got N`.
fn serve(p: &str) -> Seen {
    let seen: Seen = Arc::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let (ns, s2) = (p.to_string(), seen.clone());
    std::thread::spawn(move || {
        ringlb_testkit::netns::enter_netns(&ns);
        let l = TcpListener::bind(("0.0.0.0", 8080)).expect("bind :8080");
        tx.send(()).unwrap();
        for c in l.incoming().flatten() {
            s2.lock()
                .unwrap()
                .push((c.local_addr().unwrap(), c.peer_addr().unwrap()));
            std::thread::spawn(move || answer(c));
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("server up");
    seen
}

fn answer(c: TcpStream) {
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut words = line.split_whitespace();
    let (cmd, n) = (
        words.next(),
        words.next().and_then(|n| n.parse::<usize>().ok()),
    );
    let _ = match (cmd, n) {
        (Some("hello"), _) => {
            let (l, p) = (w.local_addr().unwrap(), w.peer_addr().unwrap());
            w.write_all(format!("pod {l} {p}\n").as_bytes())
        }
        (Some("get"), Some(n)) => w.write_all(&vec![0x5a; n]),
        (Some("put"), Some(n)) => {
            let mut buf = vec![0; 64 * 1024];
            let mut got = 0;
            while got < n {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got += k,
                }
            }
            w.write_all(format!("got {got}\n").as_bytes())
        }
        _ => Ok(()),
    };
}

fn connect(c: &str) -> TcpStream {
    in_netns(c, || {
        let s = TcpStream::connect_timeout(&(ip(VIP), 80).into(), Duration::from_secs(3))
            .expect("connect to VIP:80");
        // a stalled transfer (e.g. segments too big for the tunnel) fails
        // the test instead of hanging it
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    })
}

#[test]
fn edge_to_node_to_pod_with_port_translation_dsr_and_mss_clamp() {
    if !require_root("the node netns traffic test (netns, BPF, tc)") {
        return;
    }
    let nss = Netns::per_process("rlbn", ["c", "t", "e", "n", "p"]);
    let [c, t, e, n, p] = [0, 1, 2, 3, 4].map(|i| nss[i].0.as_str());
    wire([c, t, e, n, p]);
    let (edge, _pass) = the_edge(t, e);
    let node = the_node(n);
    let seen = serve(p);

    // 20 short connections: each answered by the pod on :8080, from VIP:80
    for i in 0..20 {
        let s = connect(c);
        assert_eq!(s.peer_addr().unwrap(), SocketAddr::new(ip(VIP), 80));
        // the clamp reached the client: it sends at most 1440-byte segments
        let mss = socket2::SockRef::from(&s).tcp_mss().unwrap();
        assert!(mss <= 1440, "connection {i}: client MSS {mss}");
        let mut r = BufReader::new(s);
        r.get_mut().write_all(b"hello\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(&format!("pod {POD}:8080 {CLIENT}:")),
            "connection {i}: the pod saw {line:?}"
        );
    }
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 20, "the pod's server accepted every connection");
        assert!(
            seen.iter()
                .all(|(l, p)| l.port() == 8080 && p.ip() == ip(CLIENT))
        );
    }

    // 10 MB down (full-size DSR segments pod -> client) and 10 MB up
    // (client segments through the tunnel: only fit with the clamp)
    let mut down = connect(c);
    down.write_all(format!("get {MB10}\n").as_bytes()).unwrap();
    let mut got = Vec::with_capacity(MB10);
    down.read_to_end(&mut got).expect("10 MB download");
    assert_eq!(got.len(), MB10, "the whole download arrived");
    assert!(got.iter().all(|b| *b == 0x5a));
    let mut up = connect(c);
    up.write_all(format!("put {MB10}\n").as_bytes()).unwrap();
    up.write_all(&vec![0xa5; MB10]).expect("10 MB upload");
    let mut line = String::new();
    BufReader::new(up).read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        format!("got {MB10}"),
        "the whole upload arrived"
    );

    // every reply came from VIP:80, none from the pod's own address
    let (from_vip, from_pod) = client_counts(c);
    assert!(from_vip > MB10 as u64, "bytes from VIP:80: {from_vip}");
    assert_eq!(from_pod, 0, "no untranslated reply reached the client");

    // DSR: the replies (over 10 MB) never crossed the edge. The edge
    // received what the client sent (a little ARP aside) and nothing else.
    let (edge_rx, _) = link_bytes(e, "eth0");
    let (_, client_tx) = link_bytes(c, "eth0");
    assert!(
        edge_rx < client_tx + 4096,
        "edge received {edge_rx} bytes, client sent {client_tx}: replies must not pass the edge"
    );
    assert!(
        client_tx > MB10 as u64 && edge_rx > MB10 as u64,
        "the upload went through the edge"
    );
    let ec = edge.read_counters().unwrap();
    let ecount = |l: &str| ec.global.iter().find(|(x, _)| *x == l).map_or(0, |x| x.1);
    assert!(
        ecount("tx") >= MB10 as u64 / 1440,
        "the edge tunnelled the upload"
    );
    assert_eq!(
        ecount("pass_mtu"),
        0,
        "no client segment was too big for the tunnel"
    );

    let count = |s| node.counter(s).unwrap();
    assert!(count(Stat::Decap4) >= MB10 as u64 / 1440);
    assert_eq!(count(Stat::Decap4), count(Stat::Dnat));
    assert!(count(Stat::ReplySnat) > 0);
    assert!(count(Stat::MssClamped) >= 22, "every SYN-ACK was clamped");
    eprintln!(
        "edge tx {} pkts, rx {edge_rx} B; node decap {} reply_snat {} (GSO packets) mss_clamped {}; client got {from_vip} B from VIP:80",
        ecount("tx"),
        count(Stat::Decap4),
        count(Stat::ReplySnat),
        count(Stat::MssClamped)
    );
    assert_eq!(
        count(Stat::DropSource),
        0,
        "the edge's tunnels are all taken"
    );

    // The client (no edge) hands the node an IPIP packet for the pod itself: a
    // SYN "from" 192.0.2.66 to VIP:80. Dropped at the node, counted, never seen
    // by the pod.
    let accepted = seen.lock().unwrap().len();
    let syn = ringlb_testkit::packet::Segment::tcp(
        "192.0.2.66:40000".parse().unwrap(),
        SocketAddr::new(ip(VIP), 80),
        ringlb_testkit::packet::TCP_SYN,
    );
    in_netns(c, || {
        use socket2::{Domain, Protocol, Socket, Type};
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(4)))
            .expect("a raw IPIP socket");
        let to: SocketAddr = (ip(POD), 0).into();
        for _ in 0..5 {
            raw.send_to(&syn.l3(), &to.into()).expect("send IPIP");
        }
    });
    let t0 = std::time::Instant::now();
    while count(Stat::DropSource) < 5 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        count(Stat::DropSource),
        5,
        "the client's tunnels were refused"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        seen.lock().unwrap().len(),
        accepted,
        "the pod saw none of them"
    );
    drop(node);
    drop(edge);
}
