//! A backend on the edge's own node, with real traffic in network namespaces
//! (XDP native, and generic):
//!
//! ```text
//!  client 10.203.1.2 ---- tor ---- edge 10.203.0.11  eth0: XDP ringlb_xdp
//!                          |                          + tc ringlb_node_ingress/_egress
//!                          |       br0 10.203.4.1 ---- pod A 10.203.4.5 (a bridge, as
//!                          |                           CNI's bridge plugin makes)
//!                    node 10.203.2.2  eth0: tc ringlb_node_ingress/_egress
//!                          vp0 10.203.3.1 ---- pod B 10.203.3.5
//! ```
//! VIP:80 has both pods as backends. Pod B is reached as on any worker (IPIP
//! by XDP_TX, decapsulated on the node). Pod A is a pod on this node
//! ([`ringlb_nexthop::LocalPods`]): the XDP program passes its encapsulated
//! frame up eth0's stack and the node agent's tc program on the same eth0
//! decapsulates it. Every request must be answered, and both pods must serve.
//! Needs root; skips loudly otherwise.

use std::{
    io::{BufRead, BufReader, Write},
    net::{IpAddr, TcpListener, TcpStream},
    time::Duration,
};

use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::{KernelResolver, LocalPods, WithLocalPods};
use ringlb_node::{NodeDatapath, NodeOptions, NodeState, Proto as NodeProto, abi::Stat};
use ringlb_testkit::netns::{Netns, enter_netns, in_netns, is_root, nsx, sh, tx_checksum_off};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};

const VIP: &str = "10.203.100.1";
const POD_A: &str = "10.203.4.5"; // on the edge node
const POD_B: &str = "10.203.3.5"; // on the worker
const REQUESTS: usize = 30;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn veth(a_ns: &str, a: &str, a_ip: Option<&str>, b_ns: &str, b: &str, b_ip: Option<&str>) {
    sh(&[
        "ip", "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ]);
    for (ns, dev, addr) in [(a_ns, a, a_ip), (b_ns, b, b_ip)] {
        if let Some(addr) = addr {
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
        }
        sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
    }
}

fn route(ns: &str, dst: &str, via: &str) {
    sh(&["ip", "-n", ns, "route", "add", dst, "via", via]);
}

/// The namespaces of the picture.
fn wire([c, t, e, n, pa, pb]: [&str; 6]) {
    veth(
        c,
        "eth0",
        Some("10.203.1.2/24"),
        t,
        "ve-cl",
        Some("10.203.1.1/24"),
    );
    veth(
        e,
        "eth0",
        Some("10.203.0.11/24"),
        t,
        "ve-e",
        Some("10.203.0.1/24"),
    );
    veth(
        n,
        "eth0",
        Some("10.203.2.2/24"),
        t,
        "ve-n",
        Some("10.203.2.1/24"),
    );
    veth(
        pb,
        "eth0",
        Some("10.203.3.5/24"),
        n,
        "vp0",
        Some("10.203.3.1/24"),
    );
    // the edge node's pod behind a bridge: a veth with its host end enslaved
    sh(&["ip", "-n", e, "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "-n", e, "addr", "add", "10.203.4.1/24", "dev", "br0"]);
    sh(&["ip", "-n", e, "link", "set", "br0", "up"]);
    veth(pa, "eth0", Some("10.203.4.5/24"), e, "vethpa", None);
    sh(&["ip", "-n", e, "link", "set", "vethpa", "master", "br0"]);
    route(c, "default", "10.203.1.1");
    route(e, "default", "10.203.0.1");
    route(n, "default", "10.203.2.1");
    route(pa, "default", "10.203.4.1");
    route(pb, "default", "10.203.3.1");
    route(t, &format!("{VIP}/32"), "10.203.0.11"); // BGP's job in production
    route(t, "10.203.3.0/24", "10.203.2.2"); // the pod CIDRs
    route(t, "10.203.4.0/24", "10.203.0.11");
    for ns in [t, e, n] {
        nsx(ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    }
    // DSR: the VIP comes back from the nodes while the ToR routes it to the edge
    for ns in [c, t, e, n, pa, pb] {
        nsx(ns, &["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"]);
        nsx(ns, &["sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0"]);
    }
    // a veth frame sent with XDP_TX keeps a partial checksum otherwise
    in_netns(c, || tx_checksum_off("eth0"));
}

/// The edge: ringlb_xdp in `mode` on eth0 (the ToR's end runs ringlb_pass: a
/// veth drops native XDP_TX otherwise), VIP:80 -> both pods, pod A local.
fn the_edge(t: &str, e: &str, mode: AttachMode) -> (XdpDatapath, aya::Ebpf) {
    let mut pass = aya::Ebpf::load(ringlb_testkit::objects::XDP_FLOOR).unwrap();
    let prog: &mut aya::programs::Xdp =
        pass.program_mut("ringlb_pass").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(t, || {
        prog.attach("ve-e", aya::programs::XdpMode::Driver).unwrap()
    });
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some("10.203.0.11".parse().unwrap()),
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    };
    let local = LocalPods::default();
    local.set([ip(POD_A)].into());
    let resolver = WithLocalPods::new(KernelResolver::new(Some(e.into())), local);
    let mut dp = XdpDatapath::load(&opts, Box::new(resolver)).unwrap();
    let vip = Vip {
        addr: ip(VIP),
        port: 80,
        proto: Proto::Tcp,
    };
    let backends = [POD_A, POD_B].map(|p| Backend {
        addr: ip(p),
        port: 8080,
        weight: 1,
    });
    let table = Table::build(&backends, 251).unwrap();
    let entry = ServiceEntry::from_table(&vip, &table).unwrap();
    dp.apply(&DesiredState {
        services: [(vip, entry)].into_iter().collect(),
    })
    .unwrap();
    in_netns(e, || dp.attach("eth0", mode).unwrap());
    (dp, pass)
}

/// A node agent's programs on `ns`'s eth0, VIP:80 -> `pod`:8080, taking
/// tunnels from the edge's address only (as `ringlb-edge node` does).
fn node_agent(ns: &str, pod: &str) -> NodeDatapath {
    let opts = NodeOptions {
        pin_dir: None,
        check_source: true,
        ..NodeOptions::default()
    };
    let mut dp = NodeDatapath::load(&opts).unwrap();
    let mut s = NodeState::default();
    s.edges.insert(ip("10.203.0.11"));
    s.add_backend(ip(VIP), 80, NodeProto::Tcp, ip(pod), 8080);
    dp.apply(&s).unwrap();
    in_netns(ns, || dp.attach_uplink("eth0").unwrap());
    dp
}

/// A server on :8080 in `ns` that answers each connection's line with
/// `<its own address> <the peer>`.
fn serve(ns: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let l = TcpListener::bind(("0.0.0.0", 8080)).expect("bind :8080");
        tx.send(()).unwrap();
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let mut line = String::new();
                if BufReader::new(c).read_line(&mut line).is_ok() {
                    let (l, p) = (w.local_addr().unwrap(), w.peer_addr().unwrap());
                    let _ = w.write_all(format!("{} {p}\n", l.ip()).as_bytes());
                }
            });
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("server up");
}

/// One request to VIP:80 from the client: which pod answered, or why none did.
fn request(c: &str) -> Result<String, String> {
    in_netns(c, || {
        let s = TcpStream::connect_timeout(&(ip(VIP), 80).into(), Duration::from_secs(2))
            .map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut r = BufReader::new(s);
        r.get_mut()
            .write_all(b"hello\n")
            .map_err(|e| format!("send: {e}"))?;
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
        let mut w = line.split_whitespace();
        match (w.next(), w.next()) {
            (Some(pod), Some(peer)) if peer.starts_with("10.203.1.2:") => Ok(pod.to_string()),
            _ => Err(format!("answer {line:?}")),
        }
    })
}

#[test]
fn a_backend_on_the_edge_node_is_served_by_the_node_agent_there_native() {
    served_on_the_edge_node(AttachMode::Native);
}

#[test]
fn a_backend_on_the_edge_node_is_served_by_the_node_agent_there_generic() {
    served_on_the_edge_node(AttachMode::Generic);
}

fn served_on_the_edge_node(mode: AttachMode) {
    if !is_root() {
        eprintln!("SKIP: the edge-local pod netns test needs root (netns, BPF, tc)");
        return;
    }
    let pid = std::process::id();
    // one process may run both modes (cargo test): a name per mode
    let m = if mode == AttachMode::Native { "n" } else { "g" };
    let nss = ["c", "t", "e", "n", "pa", "pb"].map(|x| Netns::new(&format!("rlbl{pid}{m}{x}")));
    let [c, t, e, n, pa, pb] = [0, 1, 2, 3, 4, 5].map(|i| nss[i].0.as_str());
    wire([c, t, e, n, pa, pb]);
    let (edge, _pass) = the_edge(t, e, mode);
    // what the edge agent checks when it has local pods (None: no tcx here)
    let agent_on = || in_netns(e, || ringlb_xdp::node_agent::ingress_attached("eth0"));
    let before = agent_on();
    let edge_node = node_agent(e, POD_A);
    let after = agent_on();
    eprintln!(
        "{mode:?}: node agent program on the edge's eth0: before {before:?}, after {after:?}"
    );
    assert!(
        before != Some(true) && after != Some(false),
        "node agent on eth0: before {before:?}, after {after:?}"
    );
    let worker = node_agent(n, POD_B);
    serve(pa);
    serve(pb);

    let answers: Vec<Result<String, String>> = (0..REQUESTS).map(|_| request(c)).collect();
    let failed: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    let by = |pod: &str| answers.iter().filter(|a| a.as_deref() == Ok(pod)).count();
    let (a, b) = (by(POD_A), by(POD_B));
    let ec = edge.read_counters().unwrap();
    let ecount = |l: &str| ec.global.iter().find(|(x, _)| *x == l).map_or(0, |x| x.1);
    eprintln!(
        "{mode:?}: {REQUESTS} requests: pod A (edge node) {a}, pod B (worker) {b}, failed {}; edge local {} tx {}; edge node decap {}, worker decap {}",
        failed.len(),
        ecount("local"),
        ecount("tx"),
        edge_node.counter(Stat::Decap4).unwrap(),
        worker.counter(Stat::Decap4).unwrap(),
    );
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert_eq!(a + b, REQUESTS);
    assert!(a > 0 && b > 0, "both pods serve: A {a}, B {b}");
    assert!(
        ecount("local") > 0,
        "the edge passed pod A's packets up its stack"
    );
    assert!(edge_node.counter(Stat::Decap4).unwrap() >= ecount("local"));
    assert!(worker.counter(Stat::Decap4).unwrap() > 0);
    drop(worker);
    drop(edge_node);
    drop(edge);
}
