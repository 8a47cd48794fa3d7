//! Real frames through native XDP with a next hop behind a VLAN:
//!
//! ```text
//!  peer ns  vp 10.60.0.2/24 (XDP_PASS: veth XDP_TX needs a program on the peer)
//!             |  VIP 10.100.0.7 via 10.60.0.1
//!  edge ns  ve 10.60.0.1/24  ringlb_xdp (native), every backend's next hop:
//!             ifindex of ve, MACs ve -> vp, VLAN 100 (802.1Q)
//! ```
//!
//! The peer sends untagged UDP datagrams to the VIP; the edge encapsulates them
//! (IPIP to 10.1.0.7) and sends them back out of `ve` with XDP_TX, tag pushed.
//! tcpdump on `vp` must see them with `vlan 100` and the outer header. Then a frame
//! tagged with VLAN 7, written raw onto `vp`, must come back with VLAN 100. The static
//! next hop stands in for the resolver: this VM's kernel has no VLAN devices
//! (tests/nexthop_netlink.rs covers the resolver where it has). Needs root.

mod xdp_support;

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, UdpSocket},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use ringlb_nexthop::{NextHop, StaticResolver, Vlan, VlanProtocol};
use ringlb_testkit::packet::Frame;
use ringlb_xdp::{
    Datapath, DesiredState, Proto, ServiceEntry, Vip,
    xdp::{AttachMode, XdpDatapath, XdpOptions},
};
use xdp_support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn link_mac(ns: &str, dev: &str) -> [u8; 6] {
    let out = sh(&["ip", "-n", ns, "-o", "link", "show", "dev", dev]);
    let at = out.find("link/ether ").expect("ether address") + "link/ether ".len();
    let v: Vec<u8> = out[at..at + 17]
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

fn ifindex(ns: &str, dev: &str) -> u32 {
    let out = sh(&["ip", "-n", ns, "-o", "link", "show", "dev", dev]);
    out.split(':').next().unwrap().trim().parse().unwrap()
}

/// tcpdump in a namespace, killed on drop.
struct Capture(std::process::Child);

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn xdp_tx_puts_the_next_hops_vlan_tag_on_the_wire_pushed_or_rewritten() {
    if !require_root("xdp_vlan_netns (namespaces, native XDP)") {
        return;
    }
    let [edge, peer] = Netns::per_process("rlvx", ["e", "p"]);
    let (e, p) = (edge.0.as_str(), peer.0.as_str());
    link_edge_and_peer(e, p);
    // veth XDP_TX frames only arrive when the peer has an XDP program
    let _pass = attach_pass(p, "vp");
    let nh = NextHop {
        ifindex: ifindex(e, "ve"),
        smac: link_mac(e, "ve"),
        dmac: link_mac(p, "vp"),
        vlan: Some(Vlan {
            id: 100,
            protocol: VlanProtocol::Dot1Q,
        }),
    };
    let dp = the_edge(e, nh);

    let mut wire = Wire::listen(p);
    an_untagged_datagram_leaves_with_the_tag_pushed(&mut wire, p, &dp, &nh);
    a_frame_tagged_7_leaves_with_the_tag_rewritten(&mut wire, p, &dp, &nh);

    let c = dp.read_counters().unwrap();
    let get = |label: &str| c.global.iter().find(|(l, _)| *l == label).unwrap().1;
    assert!(get("tx") >= 2, "{:?}", c.global);
    assert_eq!(get("redirect"), 0, "{:?}", c.global);
}

/// The veth pair `ve` (edge) -- `vp` (peer), and the peer's route to the VIP.
fn link_edge_and_peer(e: &str, p: &str) {
    sh(&[
        "ip", "-n", e, "link", "add", "ve", "type", "veth", "peer", "name", "vp", "netns", p,
    ]);
    sh(&["ip", "-n", e, "addr", "add", "10.60.0.1/24", "dev", "ve"]);
    sh(&["ip", "-n", p, "addr", "add", "10.60.0.2/24", "dev", "vp"]);
    sh(&["ip", "-n", e, "link", "set", "ve", "up"]);
    sh(&["ip", "-n", p, "link", "set", "vp", "up"]);
    sh(&[
        "ip",
        "-n",
        p,
        "route",
        "add",
        "10.100.0.7/32",
        "via",
        "10.60.0.1",
    ]);
}

/// The edge: one UDP VIP whose only backend's next hop is `nh`, attached natively
/// to `ve`.
fn the_edge(e: &str, nh: NextHop) -> XdpDatapath {
    let opts = XdpOptions {
        pin_dir: None,
        src4: Some("10.60.0.1".parse().unwrap()),
        fib_fallback: false,
        vip_capacity: ringlb_testkit::TEST_VIP_CAPACITY,
        ..XdpOptions::default()
    };
    let resolver = StaticResolver::everywhere(nh);
    let mut dp = XdpDatapath::load(&opts, Box::new(resolver)).unwrap();
    let vip = Vip {
        addr: ip("10.100.0.7"),
        port: 5000,
        proto: Proto::Udp,
    };
    let entry = ServiceEntry::new(&vip, vec![ip("10.1.0.7")], vec![0; 13]).unwrap();
    dp.apply(&DesiredState {
        services: [(vip, entry)].into_iter().collect(),
    })
    .unwrap();
    let mode = in_netns(e, || dp.attach("ve", AttachMode::Native).unwrap());
    assert_eq!(mode, "native");
    dp
}

/// tcpdump on `vp`: its lines as they come, the lines seen so far (for failure
/// messages), and the deadline of the whole test.
struct Wire {
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
    deadline: Instant,
    _capture: Capture,
}

impl Wire {
    /// Starts tcpdump in `p` and waits until it listens.
    fn listen(p: &str) -> Self {
        // -e: link-level header (the tag); -l: line-buffered; no filter (ARP is fine)
        let mut child = Command::new("ip")
            .args(["netns", "exec", p, "tcpdump", "-i", "vp", "-nn", "-e", "-l"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump");
        let (tx, rx) = mpsc::channel::<String>();
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let _capture = Capture(child);
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines().map_while(Result::ok) {
                    let _ = tx.send(format!("stderr: {l}"));
                }
            });
        }
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        // wait until tcpdump listens
        while !seen.iter().any(|l: &String| l.contains("listening on")) {
            let left = deadline.saturating_duration_since(Instant::now());
            seen.push(
                rx.recv_timeout(left)
                    .unwrap_or_else(|_| panic!("tcpdump did not start: {seen:?}")),
            );
        }
        Wire {
            rx,
            seen,
            deadline,
            _capture,
        }
    }
}

/// The peer sends untagged datagrams to the VIP; they come back encapsulated with
/// VLAN 100 pushed.
fn an_untagged_datagram_leaves_with_the_tag_pushed(
    wire: &mut Wire,
    p: &str,
    dp: &XdpDatapath,
    nh: &NextHop,
) {
    let sock = in_netns(p, || UdpSocket::bind("10.60.0.2:0").unwrap());
    let hit = loop {
        let _ = sock.send_to(b"ringlb vlan", "10.100.0.7:5000");
        match wire.rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) if l.contains("vlan 100") && l.contains("10.60.0.1 > 10.1.0.7") => break l,
            Ok(l) => wire.seen.push(l),
            Err(_) => {}
        }
        assert!(
            Instant::now() < wire.deadline,
            "no tagged IPIP frame on vp within 10 s; tcpdump saw {:#?}; counters {:?}",
            wire.seen,
            dp.read_counters().map(|c| c.global)
        );
    };
    eprintln!("on the wire: {hit}");
    // our MACs, 802.1Q with VID 100, then the outer IPv4 (IPIP) around the datagram
    let mac = |m: [u8; 6]| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    assert!(
        hit.contains(&format!("{} > {}", mac(nh.smac), mac(nh.dmac))),
        "{hit}"
    );
    assert!(hit.contains("ethertype 802.1Q (0x8100)"), "{hit}");
    assert!(hit.contains("10.60.0.2."), "inner source: {hit}");
}

/// A frame that arrives tagged with another VLAN (7), written raw onto vp
/// (AF_PACKET; this kernel has no VLAN devices): it leaves with the next
/// hop's tag (100) written over it.
fn a_frame_tagged_7_leaves_with_the_tag_rewritten(
    wire: &mut Wire,
    p: &str,
    dp: &XdpDatapath,
    nh: &NextHop,
) {
    let mut f = Frame::udp(ip("10.60.0.99"), ip("10.100.0.7"), 4242, 5000);
    f.vlan = Some(7);
    f.dst_mac = nh.smac;
    f.src_mac = nh.dmac;
    f.payload = 8;
    let hex: String = f.bytes().iter().map(|b| format!("{b:02x}")).collect();
    let send = format!(
        "import socket; s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); \
         s.bind(('vp', 0)); s.send(bytes.fromhex('{hex}'))"
    );
    let rewritten = loop {
        sh(&["ip", "netns", "exec", p, "python3", "-c", &send]);
        match wire.rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) if l.contains("10.60.0.99.4242 > 10.100.0.7.5000") && l.contains("10.1.0.7") => {
                break l;
            }
            Ok(l) => wire.seen.push(l),
            Err(_) => {}
        }
        assert!(
            Instant::now() < wire.deadline + Duration::from_secs(5),
            "the tagged frame never came back encapsulated; tcpdump saw {:#?}; counters {:?}",
            wire.seen,
            dp.read_counters().map(|c| c.global)
        );
    };
    eprintln!("tagged in, on the wire: {rewritten}");
    assert!(rewritten.contains("vlan 100, p 0"), "{rewritten}");
    assert!(!rewritten.contains("vlan 7"), "{rewritten}");
}
