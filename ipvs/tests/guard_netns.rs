//! The IPVS edge's nftables guard (`ringlb_ipvs::guard`) in a real kernel's
//! nftables, through the real `nft` layer, with real TCP, UDP and ping. No IPVS is
//! needed: the guard sits in prerouting, before IPVS, and a plain TCP listener on
//! the VIP stands in for it.
//!
//! ```text
//!  client 10.204.0.2 (inside the ranges)  ─ veth ─  edge 10.204.0.1, fd00:204::1
//!         10.204.0.3 (outside)                      lo: VIP 10.204.100.1, fd00:204:100::1
//!         fd00:204::2 (inside), ::3 (outside)       a line server on VIP:80 (both families)
//! ```
//!
//! Checked: served from inside the ranges; nothing at all (no RST) from outside,
//! counted per VIP:port; narrowing the ranges cuts an established connection at its
//! next packet and widening them lets it go on; ping answered; TCP and UDP to
//! unused ports dropped without RST or Port Unreachable (`drop_no_service`), where
//! the same probes without the guard are refused; after removal the table is gone
//! and the stack answers again.

mod ipvs_support;

use std::collections::BTreeSet;
use std::io::{BufRead, ErrorKind, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use ipvs_support::{Netns, in_netns, ip, nsx, serve, sh, veth};
use ringlb_datapath::SourceRange;
use ringlb_ipvs::guard::nft::NftCommand;
use ringlb_ipvs::guard::ruleset::Admitted;
use ringlb_ipvs::guard::{Guard, GuardCounters};
use ringlb_ipvs::{Proto, ServiceKey};
use socket2::{Domain, Socket, Type};

const VIP4: &str = "10.204.100.1";
const VIP6: &str = "fd00:204:100::1";
const IN4: &str = "10.204.0.2";
const OUT4: &str = "10.204.0.3";
const IN6: &str = "fd00:204::2";
const OUT6: &str = "fd00:204::3";
/// How long a probe waits for an answer that must not come.
const SILENCE: Duration = Duration::from_millis(1500);

fn tcp(addr: &str, port: u16) -> ServiceKey {
    ServiceKey {
        addr: ip(addr),
        port,
        proto: Proto::Tcp,
    }
}

fn only(addr: &str) -> Option<BTreeSet<SourceRange>> {
    let a = ip(addr);
    Some([SourceRange::new(a, if a.is_ipv4() { 32 } else { 128 }).unwrap()].into())
}

/// VIP:80 in both families, each open to the one client address `v4` / `v6`.
fn admitted(v4: &str, v6: &str) -> Admitted {
    [(tcp(VIP4, 80), only(v4)), (tcp(VIP6, 80), only(v6))].into()
}

/// A TCP connection from `src` to `dst`:`port` made within [`SILENCE`].
fn connect(src: &str, dst: &str, port: u16) -> std::io::Result<TcpStream> {
    let dst = SocketAddr::new(ip(dst), port);
    let s = Socket::new(Domain::for_address(dst), Type::STREAM, None)?;
    s.bind(&SocketAddr::new(ip(src), 0).into())?;
    s.connect_timeout(&dst.into(), SILENCE)?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(SILENCE))?;
    Ok(s)
}

/// One line out, the answer's line back.
fn ask(s: &mut TcpStream) -> std::io::Result<String> {
    s.write_all(b"hello\n")?;
    let mut line = String::new();
    std::io::BufReader::new(s.try_clone()?).read_line(&mut line)?;
    Ok(line.trim().to_string())
}

/// A UDP datagram from `src` to `dst`:`port`, then a wait for any answer: an ICMP
/// Port Unreachable shows as `ConnectionRefused` on the connected socket.
fn udp_probe(src: &str, dst: &str, port: u16) -> ErrorKind {
    let s = UdpSocket::bind(SocketAddr::new(ip(src), 0)).unwrap();
    s.connect(SocketAddr::new(ip(dst), port)).unwrap();
    s.set_read_timeout(Some(SILENCE)).unwrap();
    s.send(b"probe").unwrap();
    match s.recv(&mut [0; 64]) {
        Ok(n) => panic!("UDP {dst}:{port} answered {n} bytes"),
        Err(e) => e.kind(),
    }
}

/// Whether a connection failed by silence (a timeout), not by an RST.
fn silent(r: std::io::Result<TcpStream>) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
    }
}

fn global(c: &GuardCounters, label: &str) -> u64 {
    c.global.iter().find(|(l, _)| *l == label).unwrap().1
}

fn refused(c: &GuardCounters, key: ServiceKey) -> u64 {
    c.per_service
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, n)| *n)
}

fn ping(client: &str, vip: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", client, "ping", "-c", "1", "-W", "2", vip])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn guard_drops_and_counts_by_reason_in_a_real_nftables() {
    if !ringlb_testkit::tier::require_root("the guard's netns test (namespaces, nftables)") {
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        ringlb_testkit::tier::skip("the guard's netns test needs nft (Debian's nftables)");
        return;
    }
    let t0 = Instant::now();
    let p = format!("rlbg{}", std::process::id());
    let (client, edge) = (Netns::new(&format!("{p}c")), Netns::new(&format!("{p}e")));
    let (c, e) = (client.0.as_str(), edge.0.as_str());
    veth(
        c,
        "eth0",
        Some("10.204.0.2/24"),
        e,
        "eth0",
        Some("10.204.0.1/24"),
    );
    for (ns, addr, dev) in [
        (c, "10.204.0.3/24", "eth0"),
        (c, "fd00:204::2/64", "eth0"),
        (c, "fd00:204::3/64", "eth0"),
        (e, "fd00:204::1/64", "eth0"),
        (e, "10.204.100.1/32", "lo"),
        (e, "fd00:204:100::1/128", "lo"),
    ] {
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev, "nodad"]);
    }
    sh(&[
        "ip",
        "-n",
        c,
        "route",
        "add",
        "10.204.100.0/24",
        "via",
        "10.204.0.1",
    ]);
    sh(&[
        "ip",
        "-n",
        c,
        "route",
        "add",
        "fd00:204:100::/64",
        "via",
        "fd00:204::1",
    ]);
    for vip in [VIP4, VIP6] {
        serve(e.to_string(), ip(vip), "edge".into());
    }

    // without the guard the edge's stack answers unused ports: RST, Port Unreachable
    in_netns(c, || {
        let r = connect(IN4, VIP4, 81).map(drop).unwrap_err();
        assert_eq!(r.kind(), ErrorKind::ConnectionRefused, "{r}");
        assert_eq!(udp_probe(IN4, VIP4, 9999), ErrorKind::ConnectionRefused);
    });

    let nft =
        NftCommand::with_command(["ip", "netns", "exec", e, "nft"].map(String::from).to_vec())
            .expect("nft answers in the edge namespace");
    let mut guard = Guard::new(Box::new(nft));
    guard.admit_all(admitted(IN4, IN6));
    assert!(guard.sync().expect("load the guard"));
    let tables = nsx(e, &["nft", "list", "tables"]);
    assert!(tables.contains("table inet ringlb_guard"), "{tables}");

    let (k4, k6) = (tcp(VIP4, 80), tcp(VIP6, 80));
    let mut held = in_netns(c, || {
        // inside the ranges: served
        for (src, vip) in [(IN4, VIP4), (IN6, VIP6)] {
            let mut s = connect(src, vip, 80).unwrap_or_else(|e| panic!("{src} -> {vip}: {e}"));
            assert_eq!(ask(&mut s).unwrap(), "edge", "{src} -> {vip}");
        }
        // outside: silence, not an RST
        assert!(silent(connect(OUT4, VIP4, 80)), "{OUT4} must get no answer");
        assert!(silent(connect(OUT6, VIP6, 80)), "{OUT6} must get no answer");
        let mut held = connect(IN4, VIP4, 80).unwrap();
        assert_eq!(ask(&mut held).unwrap(), "edge");
        held
    });
    let c1 = guard.counters().unwrap();
    assert!(refused(&c1, k4) >= 1 && refused(&c1, k6) >= 1, "{c1:?}");
    assert_eq!(
        global(&c1, "drop_source_range"),
        refused(&c1, k4) + refused(&c1, k6)
    );

    // narrowed to the other client address: the held connection's next line
    // gets no answer; widened again, TCP's retransmission gets through
    guard.admit_all(admitted(OUT4, OUT6));
    assert!(guard.sync().unwrap());
    held.write_all(b"hello\n").unwrap();
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(held.try_clone().unwrap());
    let cut = reader.read_line(&mut line).unwrap_err();
    assert!(
        matches!(cut.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{cut}"
    );
    let c2 = guard.counters().unwrap();
    assert!(refused(&c2, k4) > refused(&c1, k4), "{c1:?} -> {c2:?}");
    guard.admit_all(admitted(IN4, IN6));
    guard.sync().unwrap();
    held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "edge", "the same connection goes on");

    // ping answered; unused TCP and UDP ports dropped in silence
    assert!(ping(c, VIP4), "ping {VIP4}");
    assert!(ping(c, VIP6), "ping {VIP6}");
    let before = global(&guard.counters().unwrap(), "drop_no_service");
    in_netns(c, || {
        assert!(
            silent(connect(IN4, VIP4, 81)),
            "TCP to an unused port: no RST"
        );
        assert!(
            silent(connect(IN6, VIP6, 81)),
            "TCP to an unused port: no RST"
        );
        assert_ne!(udp_probe(IN4, VIP4, 9999), ErrorKind::ConnectionRefused);
        assert_ne!(udp_probe(IN6, VIP6, 9999), ErrorKind::ConnectionRefused);
    });
    let c3 = guard.counters().unwrap();
    assert!(
        global(&c3, "drop_no_service") >= before + 4,
        "2 SYNs at least and 2 datagrams: {c3:?}"
    );
    assert_eq!(
        global(&c3, "drop_vip_icmp"),
        0,
        "echo requests are answered"
    );

    // removed: no table, and the stack answers again
    guard.admit_all(Admitted::new());
    assert!(guard.sync().unwrap());
    let tables = nsx(e, &["nft", "list", "tables"]);
    assert!(!tables.contains("ringlb_guard"), "{tables}");
    in_netns(c, || {
        let r = connect(IN4, VIP4, 81).map(drop).unwrap_err();
        assert_eq!(r.kind(), ErrorKind::ConnectionRefused, "{r}");
    });
    eprintln!("guard_netns: {:?}", t0.elapsed());
}
