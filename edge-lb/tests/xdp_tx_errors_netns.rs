//! XDP that cannot transmit, in network namespaces (root; skips otherwise):
//!
//! ```text
//!  client 10.204.0.2 eth0 ======= eth0 10.204.0.11 edge (XDP ringlb_xdp)
//!          (no XDP program)                 VIP 10.204.100.1:80/udp -> 10.204.0.2
//! ```
//! The edge's backend is on the ingress port, so every forwarded packet leaves by
//! XDP_TX. Native XDP on a veth whose peer runs no XDP program drops those in the
//! driver (`rx_queue_0_xdp_tx_errors`): the edge's transmit check
//! (`agent::tx_check`) must say so (not ready, the reason names the tx errors).
//! `--xdp-mode auto` must pick generic there, where the same traffic gets through
//! and the check recovers.

use std::{net::UdpSocket, time::Duration};

use ringlb_edge::agent::tx_check::{FAULT, TxCheck};
use ringlb_edge::vip_health::Board;
use ringlb_maglev::{Backend, Table};
use ringlb_nexthop::KernelResolver;
use ringlb_ops::Health;
use ringlb_testkit::netns::{Netns, in_netns, is_root, nsx, sh};
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    auto_mode::{self, Uplink},
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};

const VIP: &str = "10.204.100.1";
const CLIENT: &str = "10.204.0.2";

fn wire(c: &str, e: &str) {
    sh(&[
        "ip", "-n", c, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", e,
    ]);
    for (ns, addr) in [(c, "10.204.0.2/24"), (e, "10.204.0.11/24")] {
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"]);
        sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
    }
    sh(&[
        "ip",
        "-n",
        c,
        "route",
        "add",
        &format!("{VIP}/32"),
        "via",
        "10.204.0.11",
    ]);
    // the client receives the IPIP packets it is sent back and drops them; all
    // that matters is whether they arrive: count them
    nsx(
        c,
        &["iptables", "-w", "-t", "raw", "-A", "PREROUTING", "-p", "4"],
    );
}

fn edge(e: &str) -> XdpDatapath {
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some("10.204.0.11".parse().unwrap()),
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    };
    let mut dp = XdpDatapath::load(&opts, Box::new(KernelResolver::new(Some(e.into())))).unwrap();
    let vip = Vip {
        addr: VIP.parse().unwrap(),
        port: 80,
        proto: Proto::Udp,
    };
    let backend = Backend {
        addr: CLIENT.parse().unwrap(),
        port: 8080,
        weight: 1,
    };
    let table = Table::build(&[backend], 251).unwrap();
    let entry = ServiceEntry::from_table(&vip, &table).unwrap();
    dp.apply(&DesiredState {
        services: [(vip, entry)].into_iter().collect(),
    })
    .unwrap();
    dp
}

/// `n` datagrams from the client to VIP:80.
fn send(c: &str, n: usize) {
    in_netns(c, || {
        let s = UdpSocket::bind("10.204.0.2:0").unwrap();
        for i in 0..n {
            s.send_to(format!("packet {i}").as_bytes(), (VIP, 80))
                .unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(200));
}

/// The IPIP packets the client received (a raw-table rule counts them; ARP
/// and neighbour discovery do not count).
fn client_rx(c: &str) -> u64 {
    let out = nsx(
        c,
        &[
            "iptables",
            "-w",
            "-t",
            "raw",
            "-L",
            "PREROUTING",
            "-v",
            "-x",
            "-n",
        ],
    );
    // columns: pkts bytes target prot ...
    out.lines()
        .skip(2)
        .find_map(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no counter in\n{out}"))
}

#[test]
fn native_xdp_on_a_veth_without_a_peer_program_is_reported_and_auto_picks_generic() {
    if !is_root() {
        eprintln!("SKIP: the XDP transmit-error test needs root (netns, BPF)");
        return;
    }
    let pid = std::process::id();
    let nss = ["c", "e"].map(|x| Netns::new(&format!("rlbtx{pid}{x}")));
    let (c, e) = (nss[0].0.as_str(), nss[1].0.as_str());
    wire(c, e);

    // auto: the peer is in another namespace, so generic
    let uplink = in_netns(e, || auto_mode::probe("eth0"));
    assert_eq!(uplink, Uplink::VethPeerElsewhere);
    assert_eq!(auto_mode::choose(&uplink).mode, AttachMode::Generic);

    // native anyway: every XDP_TX is lost, and the check says why
    let mut dp = edge(e);
    assert_eq!(
        in_netns(e, || dp.attach("eth0", AttachMode::Native).unwrap()),
        "native"
    );
    let (health, board) = (Health::new(), Board::default());
    health.set_ready(true);
    let mut registry = prometheus_client::registry::Registry::default();
    let mut check = TxCheck::new("eth0", &mut registry);
    let mut tick = |dp: &mut XdpDatapath| {
        let counters = dp.counters().unwrap();
        in_netns(e, || check.check(&counters, &health, &board))
    };
    assert_eq!(tick(&mut dp), None, "the baseline");
    let rx_before = client_rx(c);
    send(c, 20);
    let why = tick(&mut dp).expect("the transmit errors are reported");
    let lost = client_rx(c) - rx_before;
    eprintln!("native: client received {lost} of 20; reported: {why}");
    assert_eq!(lost, 0, "native XDP_TX on this veth delivers nothing");
    assert!(
        why.contains("xdp tx errors") && why.contains("eth0"),
        "{why}"
    );
    assert!(!health.is_ready(), "not ready while the transmits fail");
    let faults = health.faults();
    assert_eq!(faults.len(), 1);
    assert_eq!(faults[0].0, FAULT);
    assert!(faults[0].1.contains("xdp tx errors"), "{faults:?}");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("xdp_tx_failing 1"), "{text}");

    // what auto attaches: generic, and the same traffic arrives
    dp.detach().unwrap();
    assert_eq!(
        in_netns(e, || dp.attach("eth0", AttachMode::Auto).unwrap()),
        "generic"
    );
    let rx_before = client_rx(c);
    send(c, 20);
    assert_eq!(tick(&mut dp), None, "recovered: nothing new to report");
    let got = client_rx(c) - rx_before;
    eprintln!("generic: client received {got} of 20");
    assert_eq!(got, 20, "generic XDP_TX delivers every packet");
    assert!(health.is_ready(), "ready again: {:?}", health.faults());
    drop(dp);
}
