//! sessionAffinity: ClientIP in the XDP program, by BPF_PROG_TEST_RUN with exact
//! frames: with affinity, a client's address alone picks the ring slot, so every
//! connection of that client (any source port) reaches one pod, the same on two
//! edges (two programs with their own maps); without it, the same connections
//! spread. Switching it on or off changes new connections at once while
//! established ones keep their pod; a removed pod's client moves to a live pod
//! on its next packet, and a terminating pod's client (its pod kept for its
//! established connections only) takes a ready pod for its new ones. The
//! affinity map keeps a client's pod across a change of the backend set that
//! keeps that pod, on each edge that saw the client, until the timeout after
//! its last new connection. Needs root (BPF); skips loudly
//! otherwise.

mod xdp_support;
use xdp_support::fixture::*;
use xdp_support::maglev_table;

use std::collections::BTreeSet;
use std::net::IpAddr;

use ringlb_maglev::Table;
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{Datapath, ServiceEntry, Vip, lookup::client_hash, xdp::XdpDatapath};

const PODS: [&str; 4] = ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"];

fn table(pods: &[&str]) -> Table {
    maglev_table(pods, 8080)
}

fn entry(v: &Vip, pods: &[&str], affinity: bool) -> ServiceEntry {
    let e = ServiceEntry::from_table(v, &table(pods)).unwrap();
    if affinity {
        e.with_client_affinity(10_800)
    } else {
        e
    }
}

/// `pods` with client affinity of `timeout` seconds.
fn with_timeout(v: &Vip, pods: &[&str], timeout: u32) -> ServiceEntry {
    ServiceEntry::from_table(v, &table(pods))
        .unwrap()
        .with_client_affinity(timeout)
}

/// A client whose ring pod differs between `before` and `after` while its
/// pod of `before` is in `after` too: the change the affinity map is for.
fn client_moved_by(before: &[&str], after: &[&str]) -> IpAddr {
    (1..=254)
        .map(|i| IpAddr::from([192, 0, 2, i]))
        .find(|c| {
            let was = pod_of(before, *c);
            was != pod_of(after, *c) && after.iter().any(|p| ip(p) == was)
        })
        .expect("some client's slot changes owner")
}

/// The pod a new connection of `client` from `sport` reaches.
fn pod_for(dp: &XdpDatapath, client: IpAddr, sport: u16) -> IpAddr {
    let (verdict, out) = run(dp, &Frame::tcp(client, ip("10.100.0.1"), sport, 80).bytes());
    assert_eq!(verdict, XDP_TX);
    pod(&out)
}

/// The pod the Rust Maglev table gives `client` with client affinity.
fn pod_of(pods: &[&str], client: IpAddr) -> IpAddr {
    let t = table(pods);
    let slot = client_hash(client) % t.slots().len() as u32;
    t.backends()[t.slots()[slot as usize] as usize].addr
}

/// The pod an encapsulated frame is sent to (outer IPv4 destination).
fn pod(out: &[u8]) -> IpAddr {
    IpAddr::from([out[30], out[31], out[32], out[33]])
}

fn syn(sport: u16) -> Frame {
    Frame::tcp(ip("192.0.2.7"), ip("10.100.0.1"), sport, 80)
}

/// The pods `n` new connections of one client reach.
fn pods_of_client(dp: &XdpDatapath, n: u16) -> BTreeSet<IpAddr> {
    (0..n)
        .map(|i| {
            let (verdict, out) = run(dp, &syn(40_000 + i).bytes());
            assert_eq!(verdict, XDP_TX);
            pod(&out)
        })
        .collect()
}

#[test]
fn one_clients_connections_reach_one_pod_on_every_edge() {
    let (Some(mut a), Some(mut b)) = (load(1500, true), load(1500, true)) else {
        return;
    };
    let v = vip4();
    let want = pod_of(&PODS, ip("192.0.2.7"));
    for dp in [&mut a, &mut b] {
        dp.apply(&state(vec![(v, entry(&v, &PODS, true))])).unwrap();
    }
    for dp in [&a, &b] {
        for i in 0..50 {
            let f = syn(40_000 + i);
            assert_eq!(
                run(dp, &f.bytes()),
                (XDP_TX, encapped(&f, "10.0.0.11", &want.to_string(), 0)),
                "source port {}",
                40_000 + i
            );
        }
    }
    // the CLI's lookup predicts the same pod
    let l = a
        .lookup(&ringlb_xdp::cli::flow(
            ringlb_xdp::Proto::Tcp,
            "192.0.2.7:41234".parse().unwrap(),
            "10.100.0.1:80".parse().unwrap(),
        ))
        .unwrap();
    assert!(format!("{l:?}").contains(&want.to_string()), "{l:?}");
    // without affinity the same connections spread over the pods
    a.apply(&state(vec![(v, entry(&v, &PODS, false))])).unwrap();
    assert!(pods_of_client(&a, 50).len() >= 3);
}

/// On and off take effect for new connections at once; an established
/// connection keeps its pod (conntrack) either way.
#[test]
fn switching_affinity_changes_new_connections_at_once() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    dp.apply(&state(vec![(v, entry(&v, &PODS, false))]))
        .unwrap();
    assert!(
        pods_of_client(&dp, 50).len() >= 3,
        "spread without affinity"
    );
    // an established connection, on whatever pod its 5-tuple hashes to
    let first = syn(50_000).established();
    let (_, out) = run(&dp, &first.bytes());
    let established = pod(&out);

    dp.apply(&state(vec![(v, entry(&v, &PODS, true))])).unwrap();
    let want = pod_of(&PODS, ip("192.0.2.7"));
    assert_eq!(pods_of_client(&dp, 50), BTreeSet::from([want]));
    assert_eq!(pod(&run(&dp, &first.bytes()).1), established, "kept");

    dp.apply(&state(vec![(v, entry(&v, &PODS, false))]))
        .unwrap();
    assert!(pods_of_client(&dp, 50).len() >= 3, "spread again");
    assert_eq!(pod(&run(&dp, &first.bytes()).1), established, "kept");
}

/// Client 192.0.2.7 of `v` over every pod with affinity, with one established
/// connection from `sport` on its pod: that pod and the connection's packet.
fn client_with_a_connection(dp: &mut XdpDatapath, v: &Vip, sport: u16) -> (IpAddr, Frame) {
    let client = ip("192.0.2.7");
    dp.apply(&state(vec![(*v, entry(v, &PODS, true))])).unwrap();
    let was = pod_of(&PODS, client);
    let ack = Frame::tcp(client, ip("10.100.0.1"), sport, 80).established();
    assert_eq!(pod(&run(dp, &ack.bytes()).1), was);
    (was, ack)
}

/// A removed pod's client moves to a live pod on its next packet: new
/// connections and its established one (whose conntrack entry turned stale).
#[test]
fn a_removed_pods_client_moves_on_its_next_packet() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    let client = ip("192.0.2.7");
    let (was, ack) = client_with_a_connection(&mut dp, &v, 40_000);

    let left: Vec<&str> = PODS.iter().copied().filter(|p| ip(p) != was).collect();
    dp.apply(&state(vec![(v, entry(&v, &left, true))])).unwrap();
    let now = pod_of(&left, client);
    assert_ne!(now, was);
    assert_eq!(
        run(&dp, &ack.bytes()),
        (XDP_TX, encapped(&ack, "10.0.0.11", &now.to_string(), 0)),
        "the established connection follows the client's new pod"
    );
    assert_eq!(counter(&dp, "ct_stale"), 1);
    assert_eq!(pods_of_client(&dp, 20), BTreeSet::from([now]));
}

/// `ready` in the ring and `terminating` kept beside it for its established
/// flows (no slot), with affinity.
fn with_terminating(v: &Vip, ready: &[&str], terminating: IpAddr) -> ServiceEntry {
    let t = table(ready);
    let mut backends: Vec<IpAddr> = t.backends().iter().map(|b| b.addr).collect();
    backends.push(terminating);
    ServiceEntry::new(v, backends, t.slots().to_vec())
        .unwrap()
        .with_client_affinity(10_800)
}

/// A pod that starts terminating keeps its established connections, but its
/// clients' new connections go to a ready pod, as kube-proxy moves them: the
/// affinity does not hold for a pod the ring no longer names.
#[test]
fn a_terminating_pods_client_takes_a_ready_pod_for_new_connections() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    let client = ip("192.0.2.7");
    let (was, ack) = client_with_a_connection(&mut dp, &v, 39_000);
    assert_eq!(pods_of_client(&dp, 5), BTreeSet::from([was]));

    let ready: Vec<&str> = PODS.iter().copied().filter(|p| ip(p) != was).collect();
    dp.apply(&state(vec![(v, with_terminating(&v, &ready, was))]))
        .unwrap();
    assert_eq!(
        pod(&run(&dp, &ack.bytes()).1),
        was,
        "the established connection stays on the terminating pod"
    );
    let now = pod_of(&ready, client);
    assert_ne!(now, was);
    assert_eq!(pods_of_client(&dp, 20), BTreeSet::from([now]));
    assert_eq!(counter(&dp, "ct_stale"), 0);
}

/// A pod added to the set takes ring slots from the others; a client whose
/// slot it took keeps its pod from the affinity map, on both edges that saw
/// it, while a client first seen after the change gets the ring's pod.
#[test]
fn an_affinity_survives_a_backend_change_that_keeps_its_pod() {
    let (Some(mut a), Some(mut b)) = (load(1500, true), load(1500, true)) else {
        return;
    };
    let v = vip4();
    let three = &PODS[..3];
    let client = client_moved_by(three, &PODS);
    let kept = pod_of(three, client);
    for dp in [&mut a, &mut b] {
        dp.apply(&state(vec![(v, entry(&v, three, true))])).unwrap();
        assert_eq!(pod_for(dp, client, 40_000), kept);
        assert_eq!(counter(dp, "affinity_new"), 1);
        dp.apply(&state(vec![(v, entry(&v, &PODS, true))])).unwrap();
    }
    // the CLI's lookup names the pod the table keeps, not the ring's
    let l = a
        .lookup(&ringlb_xdp::cli::flow(
            ringlb_xdp::Proto::Tcp,
            std::net::SocketAddr::new(client, 41_234),
            "10.100.0.1:80".parse().unwrap(),
        ))
        .unwrap();
    assert!(
        matches!(l, ringlb_xdp::lookup::Lookup::Affinity { addr, .. } if addr == kept),
        "{l:?}"
    );
    for dp in [&a, &b] {
        for sport in 40_001..40_011 {
            assert_eq!(
                pod_for(dp, client, sport),
                kept,
                "the ring says {}",
                pod_of(&PODS, client)
            );
        }
        assert_eq!(counter(dp, "affinity_hit"), 10);
    }
    // a client no edge saw before the change: the ring's pod
    let fresh = (1..=254)
        .map(|i| IpAddr::from([198, 51, 100, i]))
        .find(|c| pod_of(three, *c) != pod_of(&PODS, *c))
        .unwrap();
    assert_eq!(pod_for(&a, fresh, 40_000), pod_of(&PODS, fresh));
}

/// The affinity lasts `timeoutSeconds` after the client's last new
/// connection; a later one takes the ring's pod and is recorded anew.
#[test]
fn an_affinity_expires_after_its_timeout() {
    let Some(mut dp) = load(1500, true) else {
        return;
    };
    let v = vip4();
    let three = &PODS[..3];
    let client = client_moved_by(three, &PODS);
    let kept = pod_of(three, client);
    dp.apply(&state(vec![(v, with_timeout(&v, three, 1))]))
        .unwrap();
    assert_eq!(pod_for(&dp, client, 40_000), kept);
    dp.apply(&state(vec![(v, with_timeout(&v, &PODS, 1))]))
        .unwrap();
    assert_eq!(pod_for(&dp, client, 40_001), kept, "within the timeout");
    std::thread::sleep(std::time::Duration::from_millis(1_300));
    let now = pod_of(&PODS, client);
    assert_eq!(pod_for(&dp, client, 40_002), now, "expired: the ring's pod");
    assert_eq!(pod_for(&dp, client, 40_003), now, "and kept from then on");
    assert_eq!(
        (counter(&dp, "affinity_hit"), counter(&dp, "affinity_new")),
        (2, 2)
    );
}
