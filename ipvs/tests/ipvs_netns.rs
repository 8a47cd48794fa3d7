//! Real TCP through a real kernel's IPVS, programmed by the IPVS datapath, in
//! network namespaces (the picture is in `ipvs_support`). The kernel matrix runs
//! it in every Debian kernel; a kernel without IPVS skips it loudly.
//! - IPIP tunnel: the pod's `tunl0` decapsulates and the pod answers the client
//!   directly (DSR); connections stay up while pods are added, drained, removed
//!   and re-added, with no failed request.
//! - Direct routing on the shared L2.
//! - Two edges (two namespaces, each its own IPVS) with the same real-server list
//!   send a flow (client address and port) to the same pod, though they got the
//!   list by different histories; a removed pod moves its own flows.

mod ipvs_support;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use ipvs_support::*;
use ringlb_datapath::Datapath;
use ringlb_ipvs::{Config, Forward, IpvsDatapath, kernel::netlink::NetlinkKernel};

fn count(answers: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for a in answers {
        *m.entry(a.clone()).or_default() += 1;
    }
    m
}

/// `n` connections held open, each asked once: the pod of each.
fn open_many(lab: &Lab, n: usize) -> Vec<(std::io::BufReader<std::net::TcpStream>, String)> {
    in_netns(&lab.client.0, || {
        (0..n)
            .map(|i| {
                let mut c = connect(None).unwrap_or_else(|e| panic!("connection {i}: {e}"));
                let who = ask(&mut c).unwrap_or_else(|e| panic!("connection {i}: {e}"));
                (c, who)
            })
            .collect()
    })
}

/// The edge never saw a reply: it received about what the client sent (plus the
/// shared L2's broadcasts), far less than the client sent and received together,
/// and the client received every answer.
fn replies_bypass_the_edge(lab: &Lab, edge: usize, min_replies: u64) {
    let e = &lab.edges[edge].0;
    let edge_rx = Lab::stat(e, "eth0", "rx_packets");
    let client_tx = Lab::stat(&lab.client.0, "eth0", "tx_packets");
    let client_rx = Lab::stat(&lab.client.0, "eth0", "rx_packets");
    eprintln!("edge rx {edge_rx}, client tx {client_tx}, client rx {client_rx}");
    assert!(
        client_rx >= min_replies,
        "the client got the replies ({client_rx})"
    );
    assert!(
        edge_rx < client_tx + client_rx / 2,
        "the edge received {edge_rx}, the client sent {client_tx} and received \
         {client_rx}: replies must not pass the edge"
    );
}

/// Short requests in a loop from the client until stopped: successes, failures.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<BTreeMap<String, usize>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Load {
    fn start(client: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, o, f, w) = (stop.clone(), ok.clone(), failures.clone(), seen.clone());
        let ns = client.to_string();
        let thread = std::thread::spawn(move || {
            ringlb_testkit::netns::enter_netns(&ns);
            while !s.load(Ordering::Relaxed) {
                match one_request(None) {
                    Ok(who) => {
                        *w.lock().unwrap().entry(who).or_default() += 1;
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => f.lock().unwrap().push(e.to_string()),
                }
            }
        });
        Load {
            stop,
            ok,
            failures,
            seen,
            thread,
        }
    }

    /// Waits until `n` more requests succeeded (generous on a loaded machine).
    fn wait_more(&self, n: usize) {
        let target = self.ok.load(Ordering::Relaxed) + n;
        let t0 = Instant::now();
        while self.ok.load(Ordering::Relaxed) < target {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "load stalled; failures: {:?}",
                self.failures.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(self) -> (usize, Vec<String>, BTreeMap<String, usize>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        let f = self.failures.lock().unwrap().clone();
        let seen = self.seen.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), f, seen)
    }
}

#[test]
fn tcp_over_ipip_with_dsr_and_no_failed_request_while_pods_change() {
    require_ipvs!("tcp_over_ipip_with_dsr_and_no_failed_request_while_pods_change");
    let lab = Lab::new("a");
    lab.serve();
    let mut dp = datapath_in(&lab.edges[0].0, Config::default());
    Datapath::apply(&mut dp, &one_service(&PODS[..2], &[])).unwrap();

    let mut conns = open_many(&lab, 60);
    let per_pod = count(&conns.iter().map(|c| c.1.clone()).collect::<Vec<_>>());
    eprintln!("60 connections per pod: {per_pod:?}");
    assert!(
        per_pod.get("pod1") >= Some(&10) && per_pod.get("pod2") >= Some(&10),
        "both pods get a fair share: {per_pod:?}"
    );
    assert!(!per_pod.contains_key("pod3"));
    replies_bypass_the_edge(&lab, 0, 120);
    // at least each connection's SYN and its request; IPVS folds its per-CPU
    // counters into what a dump reports every 2 s (its rate estimator)
    let t0 = Instant::now();
    let mut c = Datapath::counters(&mut dp).unwrap();
    while c.per_vip[0].1 < 60 * 2 && t0.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(200));
        c = Datapath::counters(&mut dp).unwrap();
    }
    assert!(
        c.per_vip[0].1 >= 60 * 2,
        "IPVS counted the packets in: {:?}",
        c.per_vip
    );
    eprintln!("{}", nsx(&lab.edges[0].0, &["ipvsadm", "-Ln", "--stats"]));

    // pod3 joins: established connections keep their pod (IPVS's connection table)
    Datapath::apply(&mut dp, &one_service(&PODS, &[])).unwrap();
    in_netns(&lab.client.0, || {
        for (i, (c, who)) in conns.iter_mut().enumerate() {
            let now = ask(c).unwrap_or_else(|e| panic!("connection {i} on {who} broke: {e}"));
            assert_eq!(&now, who, "connection {i} kept its pod");
        }
    });
    drop(conns);

    // short connections, one after the other, while pods come and go the way the
    // agent does it: a leaving pod drains (weight 0) before it is removed
    let load = Load::start(&lab.client.0);
    load.wait_more(20);
    let steps: [(&str, &[&str], &[&str]); 6] = [
        ("pod1 drains", &PODS, &[PODS[0]]),
        ("pod1 removed", &PODS[1..], &[]),
        (
            "pod1 back (lowest: pod2 and pod3 re-added above it)",
            &PODS,
            &[],
        ),
        ("pod3 drains", &PODS, &[PODS[2]]),
        ("pod3 removed", &PODS[..2], &[]),
        ("pod3 back (highest: one NEW_DEST)", &PODS, &[]),
    ];
    for (what, pods, draining) in steps {
        Datapath::apply(&mut dp, &one_service(pods, draining)).unwrap();
        eprintln!(
            "{what}: {:?}",
            ipvsadm(&lab.edges[0].0)["TCP 10.203.100.1:80"].dests
        );
        load.wait_more(25);
    }
    let (ok, failures, seen) = load.finish();
    eprintln!(
        "{ok} requests while pods changed, {} failed; per pod {seen:?}",
        failures.len()
    );
    assert!(failures.is_empty(), "no request may fail: {failures:?}");
    assert!(ok >= 170 && seen.len() == 3, "{ok} {seen:?}");

    Datapath::uninstall(dp).unwrap();
    assert!(ipvsadm(&lab.edges[0].0).is_empty());
    assert!(!lo_addrs(&lab.edges[0].0).contains(&format!("{VIP}/32")));
}

#[test]
fn tcp_with_direct_routing_on_a_shared_l2() {
    require_ipvs!("tcp_with_direct_routing_on_a_shared_l2");
    let lab = Lab::new("b");
    lab.serve();
    let cfg = Config {
        forward: Forward::DirectRoute,
        ..Config::default()
    };
    let mut dp = datapath_in(&lab.edges[0].0, cfg);
    Datapath::apply(&mut dp, &one_service(&PODS[..2], &[])).unwrap();
    let conns = open_many(&lab, 40);
    let per_pod = count(&conns.iter().map(|c| c.1.clone()).collect::<Vec<_>>());
    eprintln!("40 connections per pod: {per_pod:?}");
    assert!(
        per_pod.get("pod1") >= Some(&6) && per_pod.get("pod2") >= Some(&6),
        "{per_pod:?}"
    );
    replies_bypass_the_edge(&lab, 0, 80);
    // DR rewrote the MAC only: nothing arrived on the pods' tunnel devices
    for p in &lab.pods {
        assert_eq!(Lab::stat(&p.0, "tunl0", "rx_packets"), 0, "no IPIP with dr");
    }
    drop(conns);
    Datapath::uninstall(dp).unwrap();
}

/// Through the edge the ToR routes to: the pod of each client port.
fn flows(lab: &Lab, ports: std::ops::Range<u16>) -> BTreeMap<u16, String> {
    in_netns(&lab.client.0, || {
        ports
            .map(|p| {
                let who = one_request(Some(p)).unwrap_or_else(|e| panic!("from port {p}: {e}"));
                (p, who)
            })
            .collect()
    })
}

fn dest_list(lab: &Lab, edge: usize) -> Vec<(String, String, u32)> {
    ipvsadm(&lab.edges[edge].0)["TCP 10.203.100.1:80"]
        .dests
        .clone()
}

#[test]
fn two_edges_with_the_same_list_agree_and_a_removed_pod_moves_its_flows() {
    require_ipvs!("two_edges_with_the_same_list_agree_and_a_removed_pod_moves_its_flows");
    let lab = Lab::new("c");
    lab.serve();
    let mut e1: IpvsDatapath<NetlinkKernel> = datapath_in(&lab.edges[0].0, Config::default());
    let mut e2: IpvsDatapath<NetlinkKernel> = datapath_in(&lab.edges[1].0, Config::default());
    // the same set by different histories: all at once, and one by one out of order
    Datapath::apply(&mut e1, &one_service(&PODS, &[])).unwrap();
    Datapath::apply(&mut e2, &one_service(&[PODS[2]], &[])).unwrap();
    Datapath::apply(&mut e2, &one_service(&[PODS[0], PODS[2]], &[])).unwrap();
    Datapath::apply(&mut e2, &one_service(&PODS, &[])).unwrap();
    assert_eq!(
        dest_list(&lab, 0),
        dest_list(&lab, 1),
        "the same list, the same order"
    );

    let ports = 41000..41090;
    lab.route_vip_to(0);
    let via1 = flows(&lab, ports.clone());
    lab.route_vip_to(1);
    let via2 = flows(&lab, ports.clone());
    let per_pod = count(&via1.values().cloned().collect::<Vec<_>>());
    eprintln!("90 flows per pod: {per_pod:?}");
    assert_eq!(per_pod.len(), 3, "every pod has flows: {per_pod:?}");
    assert_eq!(via1, via2, "both edges send each flow to the same pod");

    // pod2 leaves on both edges
    for e in [&mut e1, &mut e2] {
        Datapath::apply(e, &one_service(&[PODS[0], PODS[2]], &[])).unwrap();
    }
    let after2 = flows(&lab, ports.clone());
    lab.route_vip_to(0);
    let after1 = flows(&lab, ports);
    assert_eq!(after1, after2, "the edges still agree");
    let own = via1.values().filter(|p| *p == "pod2").count();
    let mut others_moved = 0;
    for (port, before) in &via1 {
        let now = &after1[port];
        assert_ne!(now, "pod2", "port {port}: pod2 is gone");
        if before != "pod2" && now != before {
            others_moved += 1;
        }
    }
    let others = via1.len() - own;
    eprintln!(
        "pod2 removed: its {own} flows moved; {others_moved} of the other {others} flows moved \
         (Maglev's surplus, 0.3-0.9x the removed backend's share on average)"
    );
    assert!(
        others_moved <= own,
        "{others_moved} of {others} flows on the remaining pods moved (removed pod had {own})"
    );
    e1.uninstall().unwrap();
    e2.uninstall().unwrap();
}
