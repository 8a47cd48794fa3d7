//! Next hops from the kernel over rtnetlink, in network namespaces this test makes:
//!
//! ```text
//!  edge ns                                  peer ns
//!   e0 10.77.0.1/24 fd77::1/64  ---------  p0 10.77.0.2/24 fd77::2/64
//!   e1 10.78.0.1/24 fd78::1/64  ---------  p1 10.78.0.2/24 fd78::2/64
//!   10.88.0.0/24, fd88::/64 via the peer (first over e0, then moved to e1)
//! ```
//!
//! It resolves an on-link backend whose neighbour the kernel does not know yet (the
//! resolver's NTF_USE must make the kernel resolve it; the peer answers ARP/ND), a
//! backend behind a gateway, v4 and v6; then the peer changes its MAC (announced with
//! arp_notify/ndisc_notify) and a route's gateway moves to the other link, and the
//! subscription must report each change and a fresh resolve return the new next hop.
//! The refresh test runs it through `XdpDatapath::refresh_next_hops`: only the backends
//! whose next hop changed are rewritten. The VLAN test has its own pair of namespaces
//! with VLAN subinterfaces on the veth (see there). Needs root.

mod xdp_support;

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::{Change, KernelResolver, NextHop, Resolver, Subscription, Vlan, VlanProtocol};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{XdpDatapath, XdpOptions},
};
use xdp_support::{Netns, require_root, sh, sysctl};

const PEER_MAC0: &str = "02:77:00:00:00:02";
const PEER_MAC1: &str = "02:78:00:00:00:02";
const NEW_MAC: &str = "02:77:00:00:00:99";
/// p0's link-local address (EUI-64 of PEER_MAC0).
const PEER_LL0: &str = "fe80::77:ff:fe00:2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

fn link_mac(ns: &str, dev: &str) -> [u8; 6] {
    let out = sh(&["ip", "-n", ns, "-o", "link", "show", "dev", dev]);
    let at = out.find("link/ether ").expect("ether address") + "link/ether ".len();
    mac(&out[at..at + 17])
}

fn ifindex(ns: &str, dev: &str) -> u32 {
    let out = sh(&["ip", "-n", ns, "-o", "link", "show", "dev", dev]);
    out.split(':').next().unwrap().trim().parse().unwrap()
}

struct Lab {
    edge: Netns,
    peer: Netns,
}

/// For `test`: the two namespaces and both links, dropped (deleted) also when
/// the test panics; `None` (after a loud SKIP) without root.
fn lab(test: &str, tag: &str) -> Option<Lab> {
    if !root_or_skip(test) {
        return None;
    }
    let [edge, peer] = Netns::per_process("rlnh", [&format!("{tag}e"), &format!("{tag}p")]);
    let lab = Lab { edge, peer };
    let (e, p) = (lab.edge.0.as_str(), lab.peer.0.as_str());
    for (i, pmac) in [(0, PEER_MAC0), (1, PEER_MAC1)] {
        let net = 77 + i;
        ipn(
            e,
            &format!("link add e{i} type veth peer name p{i} netns {p}"),
        );
        ipn(p, &format!("link set p{i} address {pmac}"));
        // the peer announces a MAC change (gratuitous ARP / unsolicited NA)
        for key in ["ipv4.conf.p{i}.arp_notify", "ipv6.conf.p{i}.ndisc_notify"] {
            let key = key.replace("{i}", &i.to_string());
            sysctl(p, &format!("net.{key}=1"));
        }
        ipn(e, &format!("addr add 10.{net}.0.1/24 dev e{i}"));
        ipn(e, &format!("addr add fd{net}::1/64 dev e{i} nodad"));
        ipn(p, &format!("addr add 10.{net}.0.2/24 dev p{i}"));
        ipn(p, &format!("addr add fd{net}::2/64 dev p{i} nodad"));
        ipn(e, &format!("link set e{i} up"));
        ipn(p, &format!("link set p{i} up"));
    }
    ipn(e, "route add 10.88.0.0/24 via 10.77.0.2");
    ipn(e, "-6 route add fd88::/64 via fd77::2");
    // routes over the peer's link-local address, used by the first test only
    ipn(e, &format!("-6 route add fd89::/64 via {PEER_LL0} dev e0"));
    ipn(
        e,
        &format!("route add 10.89.0.0/24 via inet6 {PEER_LL0} dev e0"),
    );
    // The kernel solicits a neighbour it is asked to resolve (NTF_USE, no packet
    // queued) from the interface's link-local address, and sends nothing while that is
    // tentative: wait for DAD to end on both sides (about a second after link up),
    // check ND works, then forget every neighbour, so the tests start from an empty table.
    let t0 = Instant::now();
    while [e, p]
        .iter()
        .any(|ns| !ipn(ns, "-6 addr show tentative").trim().is_empty())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "IPv6 DAD did not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for net in [77, 78] {
        let to = format!("fd{net}::2");
        sh(&["ip", "netns", "exec", e, "ping", "-6", "-c1", "-w3", &to]);
    }
    for ns in [e, p] {
        ipn(ns, "neigh flush all");
    }
    Some(lab)
}

/// `ip -n NS ARGS...`
fn ipn(ns: &str, args: &str) -> String {
    let mut v = vec!["ip", "-n", ns];
    v.extend(args.split_whitespace());
    sh(&v)
}

fn root_or_skip(name: &str) -> bool {
    require_root(&format!("{name} (network namespaces, rtnetlink writes)"))
}

fn neigh_known(ns: &str, addr: &str) -> bool {
    sh(&["ip", "-n", ns, "neigh", "show", "to", addr]).contains("lladdr")
}

/// Waits up to `within` for the subscription to report a change matching `want`.
fn wait_change(
    sub: &mut Subscription,
    within: Duration,
    want: impl Fn(&Change) -> bool,
) -> Duration {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < within {
        let changes = sub.recv_changes().expect("subscription");
        if changes.iter().any(&want) {
            return t0.elapsed();
        }
        seen.extend(changes);
    }
    panic!("no matching change within {within:?}; saw {seen:?}");
}

/// Resolves until `want` holds or `within` passes (the kernel applies a change a
/// moment after notifying it).
fn resolve_until(
    r: &KernelResolver,
    addr: IpAddr,
    within: Duration,
    want: impl Fn(&NextHop) -> bool,
) -> NextHop {
    let t0 = Instant::now();
    loop {
        let got = r.resolve(addr);
        match &got {
            Ok(nh) if want(nh) => return *nh,
            _ if t0.elapsed() > within => panic!("{addr}: {got:?} after {within:?}"),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[test]
fn resolves_onlink_and_gateway_v4_v6_triggering_unknown_neighbours() {
    let Some(lab) = lab(
        "resolves_onlink_and_gateway_v4_v6_triggering_unknown_neighbours",
        "a",
    ) else {
        return;
    };
    let e = lab.edge.0.as_str();
    let want = NextHop {
        ifindex: ifindex(e, "e0"),
        smac: link_mac(e, "e0"),
        dmac: mac(PEER_MAC0),
        vlan: None,
    };
    let r = KernelResolver::new(Some(e.to_string()));
    for (backend, nh) in [
        ("10.77.0.2", "10.77.0.2"), // on-link
        ("10.88.0.5", "10.77.0.2"), // via the gateway
        ("fd77::2", "fd77::2"),
        ("fd88::5", "fd77::2"),
        // a link-local gateway (RA default routes, BGP unnumbered), for v6 and for v4
        // (RFC 5549: an IPv4 route with an IPv6 next hop, RTA_VIA)
        ("fd89::5", PEER_LL0),
        ("10.89.0.5", PEER_LL0),
    ] {
        let first = !neigh_known(e, nh);
        let t0 = Instant::now();
        let got = r
            .resolve(ip(backend))
            .unwrap_or_else(|err| panic!("{backend}: {err}"));
        assert_eq!(got, want, "{backend}");
        eprintln!(
            "{backend}: resolved in {:?}{}",
            t0.elapsed(),
            if first {
                " (neighbour was unknown: the resolver made the kernel resolve it)"
            } else {
                ""
            }
        );
        assert!(neigh_known(e, nh), "the kernel holds {nh} now");
    }
    // a STALE entry is used as it is, and the kernel is asked to confirm it again
    // (XDP_TX traffic never does): STALE -> DELAY -> PROBE -> REACHABLE
    ipn(
        e,
        &format!("neigh replace 10.77.0.2 dev e0 lladdr {PEER_MAC0} nud stale"),
    );
    assert!(ipn(e, "neigh show to 10.77.0.2").contains("STALE"));
    assert_eq!(r.resolve(ip("10.77.0.2")).unwrap(), want);
    let state = ipn(e, "neigh show to 10.77.0.2");
    assert!(!state.contains("STALE"), "re-probe not started: {state}");
    // an address with no route is a clear error, not a panic or a wait
    let err = r.resolve(ip("192.0.2.1")).unwrap_err();
    assert!(err.to_string().contains("192.0.2.1"), "{err}");
    // a neighbour that never answers: bounded wait, then an error (fib fallback)
    let t0 = Instant::now();
    let err = r.resolve(ip("10.77.0.200")).unwrap_err();
    let first = t0.elapsed();
    assert!(first < Duration::from_millis(600), "{first:?}");
    assert!(err.to_string().contains("not resolved"), "{err}");
    // asked again at once: no second wait. Bounded by half the first call, not by
    // a fixed time: under emulation (the kernel matrix) a call without any wait
    // took 70 ms.
    let t0 = Instant::now();
    assert!(r.resolve(ip("10.77.0.200")).is_err());
    assert!(
        t0.elapsed() < first / 2,
        "{:?} after a first call of {first:?}",
        t0.elapsed()
    );
}

#[test]
fn subscription_sees_mac_and_gateway_changes() {
    let Some(lab) = lab("subscription_sees_mac_and_gateway_changes", "b") else {
        return;
    };
    let (e, p) = (lab.edge.0.as_str(), lab.peer.0.as_str());
    let r = KernelResolver::new(Some(e.to_string()));
    for b in ["10.88.0.5", "fd88::5"] {
        assert_eq!(r.resolve(ip(b)).unwrap().dmac, mac(PEER_MAC0), "{b}");
    }
    ipn(e, "route add 10.66.0.0/24 via 10.77.0.2");
    let mut sub = Subscription::open(Some(e), r.next_hops_in_use()).unwrap();

    // Noise that moves no next hop must not be reported: a host on the segment that
    // no backend uses (learned, then deleted) and a route in the local table. Then a
    // main-table route is deleted; notifications arrive in order, so that deletion
    // must be the first change seen (apart from the used neighbours' own).
    ipn(
        e,
        "neigh replace 10.77.0.50 dev e0 lladdr 02:77:00:00:00:50 nud reachable",
    );
    ipn(e, "neigh del 10.77.0.50 dev e0");
    ipn(e, "route add local 10.79.0.1 dev e0 table local");
    ipn(e, "route del 10.66.0.0/24");
    let t0 = Instant::now();
    let mut noise = Vec::new();
    'marker: loop {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "no route deletion reported; saw {noise:?}"
        );
        for c in sub.recv_changes().expect("subscription") {
            match c {
                Change::Route { deleted: true } => break 'marker,
                Change::Neigh { addr, .. } if addr == ip("10.77.0.2") || addr == ip("fd77::2") => {}
                c => noise.push(c),
            }
        }
    }
    assert!(
        noise.is_empty(),
        "reported changes that move no next hop: {noise:?}"
    );

    // the peer's MAC changes; it announces it; the edge's kernel updates its entries
    ipn(p, &format!("link set p0 address {NEW_MAC}"));
    for (b, gw) in [("10.88.0.5", "10.77.0.2"), ("fd88::5", "fd77::2")] {
        let gw = ip(gw);
        let took = wait_change(
            &mut sub,
            Duration::from_secs(3),
            |c| matches!(c, Change::Neigh { addr, mac: Some(m), .. } if *addr == gw && *m == mac(NEW_MAC)),
        );
        let nh = resolve_until(&r, ip(b), Duration::from_secs(1), |nh| {
            nh.dmac == mac(NEW_MAC)
        });
        eprintln!("{b}: MAC change notified after {took:?}, resolves to the new MAC");
        assert_eq!(nh.ifindex, ifindex(e, "e0"));
    }

    // the gateway moves to the other link: new interface, source and destination MAC
    let e1 = NextHop {
        ifindex: ifindex(e, "e1"),
        smac: link_mac(e, "e1"),
        dmac: mac(PEER_MAC1),
        vlan: None,
    };
    for (b, cmd) in [
        ("10.88.0.5", "-4 route replace 10.88.0.0/24 via 10.78.0.2"),
        ("fd88::5", "-6 route replace fd88::/64 via fd78::2"),
    ] {
        ipn(e, cmd);
        let took = wait_change(&mut sub, Duration::from_secs(3), |c| {
            matches!(c, Change::Route { .. })
        });
        let nh = resolve_until(&r, ip(b), Duration::from_secs(1), |nh| *nh == e1);
        assert_eq!(nh, e1);
        eprintln!("{b}: route change notified after {took:?}, resolves via e1");
    }
}

#[test]
fn refresh_rewrites_only_the_backends_whose_next_hop_changed() {
    let Some(lab) = lab(
        "refresh_rewrites_only_the_backends_whose_next_hop_changed",
        "c",
    ) else {
        return;
    };
    let e = lab.edge.0.as_str();
    // two backends behind the gateway, one on the other link
    let backends: Vec<Backend> = ["10.88.0.5", "10.88.0.6", "10.78.0.2"]
        .iter()
        .map(|a| Backend {
            addr: ip(a),
            port: 80,
            weight: 1,
        })
        .collect();
    let vip = Vip {
        addr: ip("10.99.0.1"),
        port: 80,
        proto: Proto::Tcp,
    };
    let table = Table::build(&backends, 251).unwrap();
    let desired = DesiredState {
        services: [(vip, ServiceEntry::from_table(&vip, &table).unwrap())]
            .into_iter()
            .collect(),
    };
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some("10.77.0.1".parse().unwrap()),
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    };
    let r = KernelResolver::new(Some(e.to_string()));
    let in_use = r.next_hops_in_use();
    let mut dp = XdpDatapath::load(&opts, Box::new(r)).unwrap();
    dp.apply(&desired).unwrap();
    // the two gateways' neighbours: 10.77.0.2 on e0, 10.78.0.2 (on-link) on e1
    assert_eq!(in_use.len(), 2, "neighbours in use after apply");
    assert_eq!(dp.refresh_next_hops().unwrap(), 0, "nothing changed yet");
    // as the edge agent runs it: the subscription on its own thread wakes the refresh
    let (tx, rx) = std::sync::mpsc::channel();
    let watch = Subscription::open(Some(e), in_use)
        .unwrap()
        .spawn(move |changes| {
            let _ = tx.send(changes.to_vec());
        });
    assert!(watch.running());
    // the gateway of 10.88.0.0/24 moves to e1: the two backends behind it change.
    // Other notifications (a neighbour's state) may come first: wait for the route.
    ipn(e, "route replace 10.88.0.0/24 via 10.78.0.2");
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut seen = Vec::new();
    while !seen.iter().any(|c| matches!(c, Change::Route { .. })) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(changes) => seen.extend(changes),
            Err(_) => panic!("no route notification within 3 s; saw {seen:?}"),
        }
    }
    assert_eq!(dp.refresh_next_hops().unwrap(), 2);
    assert_eq!(dp.refresh_next_hops().unwrap(), 0, "written once");
    let t0 = Instant::now();
    drop(watch);
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "the watch thread stops"
    );
}

#[test]
fn a_silent_mac_change_is_found_by_reprobing_a_stale_entry() {
    let Some(lab) = lab(
        "a_silent_mac_change_is_found_by_reprobing_a_stale_entry",
        "d",
    ) else {
        return;
    };
    let (e, p) = (lab.edge.0.as_str(), lab.peer.0.as_str());
    // fast neighbour timers on the edge, so the probe sequence takes a fraction of a second
    for (key, v) in [("delay_first_probe_time", "0"), ("retrans_time_ms", "100")] {
        let kv = format!("net.ipv4.neigh.e0.{key}={v}");
        sysctl(e, &kv);
    }
    let r = KernelResolver::new(Some(e.to_string()));
    assert_eq!(r.resolve(ip("10.77.0.2")).unwrap().dmac, mac(PEER_MAC0));
    let mut sub = Subscription::open(Some(e), r.next_hops_in_use()).unwrap();
    // the peer changes its MAC without telling anyone; the edge's entry has aged to
    // STALE (XDP_TX traffic never confirms it)
    sysctl(p, "net.ipv4.conf.p0.arp_notify=0");
    ipn(p, &format!("link set p0 address {NEW_MAC}"));
    ipn(
        e,
        &format!("neigh change 10.77.0.2 dev e0 lladdr {PEER_MAC0} nud stale"),
    );
    // the resolver still answers the old MAC, and asks the kernel to re-probe; the
    // probe fails, the subscription reports it, and the agent's next resolve finds the
    // new MAC: the agent's loop, one change batch at a time
    assert_eq!(r.resolve(ip("10.77.0.2")).unwrap().dmac, mac(PEER_MAC0));
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "new MAC not found: {}",
            ipn(e, "neigh show to 10.77.0.2")
        );
        if sub.recv_changes().unwrap().is_empty() {
            continue;
        }
        if r.resolve(ip("10.77.0.2"))
            .is_ok_and(|nh| nh.dmac == mac(NEW_MAC))
        {
            break;
        }
    }
    eprintln!("silent MAC change found after {:?}", t0.elapsed());
}

/// Next hops behind VLAN devices, in two namespaces of their own:
///
/// ```text
///  edge ns                                     peer ns
///   v0 (veth, no address) ------------------- w0
///    v0.100 802.1Q 100  10.180.0.1/24           w0.100  10.180.0.2/24  fd80::2/64
///                       fd80::1/64
///      10.90.0.0/24, fd90::/64 via the peer on VLAN 100
///    v0.200 802.1ad 200 10.181.0.1/24           w0.200  10.181.0.2/24
///      10.91.0.0/24 via 10.181.0.2
///    v0.100.5 (a VLAN on the VLAN) 10.182.0.1/24
///      10.92.0.0/24 via 10.182.0.2
/// ```
///
/// Each VLAN device has a MAC of its own (not its parent's), so the answer shows
/// which device each MAC came from.
#[test]
fn a_next_hop_behind_a_vlan_device_leaves_by_its_parent_with_the_tag() {
    if !root_or_skip("a_next_hop_behind_a_vlan_device_leaves_by_its_parent_with_the_tag") {
        return;
    }
    let [edge, peer] = Netns::per_process("rlnh", ["ve", "vp"]);
    let (e, p) = (edge.0.as_str(), peer.0.as_str());
    ipn(e, &format!("link add v0 type veth peer name w0 netns {p}"));
    // kernels built without CONFIG_VLAN_8021Q (this project's dev VM) have no VLAN devices
    let probe = std::process::Command::new("ip")
        .args(["-n", e, "link", "add", "link", "v0", "name", "v0.probe"])
        .args(["type", "vlan", "id", "4000"])
        .output()
        .expect("ip");
    if !probe.status.success() {
        eprintln!(
            "SKIPPED a_next_hop_behind_a_vlan_device_leaves_by_its_parent_with_the_tag: this \
             kernel cannot create VLAN devices (CONFIG_VLAN_8021Q): {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        return;
    }
    ipn(e, "link del v0.probe");
    ipn(e, "link set v0 address 02:90:00:00:00:01");
    ipn(p, "link set w0 address 02:90:00:00:00:02");
    for (ns, dev, host) in [(e, "v0", 1), (p, "w0", 2)] {
        ipn(
            ns,
            &format!("link add link {dev} name {dev}.100 type vlan id 100"),
        );
        ipn(
            ns,
            &format!("link add link {dev} name {dev}.200 type vlan proto 802.1ad id 200"),
        );
        ipn(
            ns,
            &format!("link set {dev}.100 address 02:90:01:00:00:0{host}"),
        );
        ipn(
            ns,
            &format!("link set {dev}.200 address 02:90:02:00:00:0{host}"),
        );
        ipn(ns, &format!("addr add 10.180.0.{host}/24 dev {dev}.100"));
        ipn(ns, &format!("addr add fd80::{host}/64 dev {dev}.100 nodad"));
        ipn(ns, &format!("addr add 10.181.0.{host}/24 dev {dev}.200"));
        for d in [dev.to_string(), format!("{dev}.100"), format!("{dev}.200")] {
            ipn(ns, &format!("link set {d} up"));
        }
    }
    ipn(e, "link add link v0.100 name v0.100.5 type vlan id 5");
    ipn(e, "addr add 10.182.0.1/24 dev v0.100.5");
    ipn(e, "link set v0.100.5 up");
    ipn(e, "route add 10.90.0.0/24 via 10.180.0.2");
    ipn(e, "-6 route add fd90::/64 via fd80::2");
    ipn(e, "route add 10.91.0.0/24 via 10.181.0.2");
    ipn(e, "route add 10.92.0.0/24 via 10.182.0.2");

    let r = KernelResolver::new(Some(e.to_string())).with_wait(Duration::from_millis(500));
    let parent = ifindex(e, "v0");
    let q100 = NextHop {
        ifindex: parent,
        smac: mac("02:90:01:00:00:01"),
        dmac: mac("02:90:01:00:00:02"),
        vlan: Some(Vlan {
            id: 100,
            protocol: VlanProtocol::Dot1Q,
        }),
    };
    // the neighbour (unknown so far) is resolved on the VLAN device; the frame
    // leaves by the parent, with the VLAN device's MAC and its tag
    for backend in ["10.90.0.5", "10.180.0.2", "fd90::5"] {
        let got = resolve_until(&r, ip(backend), Duration::from_secs(3), |_| true);
        assert_eq!(got, q100, "{backend}");
    }
    let ad = resolve_until(&r, ip("10.91.0.5"), Duration::from_secs(3), |_| true);
    assert_eq!(
        ad,
        NextHop {
            ifindex: parent,
            smac: mac("02:90:02:00:00:01"),
            dmac: mac("02:90:02:00:00:02"),
            vlan: Some(Vlan {
                id: 200,
                protocol: VlanProtocol::Dot1Ad,
            }),
        }
    );
    // a VLAN on a VLAN: refused, naming both devices
    let err = r.resolve(ip("10.92.0.5")).unwrap_err().to_string();
    assert!(
        err.contains("v0.100.5") && err.contains("v0.100") && err.contains("vlan"),
        "{err}"
    );
}
