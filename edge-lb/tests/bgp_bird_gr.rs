//! Graceful restart (RFC 4724) and TTL handling of our speaker (the `ringlb-edge
//! speaker` binary) against a real BIRD 2 ToR in network namespaces:
//! - a hitless restart (`onSigterm: restart`, then a new speaker with
//!   `forwardingPreserved`) never takes the edge's nexthop out of the ToR's FIB,
//!   and the End-of-RIB of the new session flushes what it did not re-announce;
//! - kill -9 with graceful restart on keeps the dead edge's nexthop for the whole
//!   restart time (what BFD is for), then it goes;
//! - single-hop eBGP sends TTL 1, `ebgpMultihop` sets the IPv6 hop limit, and GTSM
//!   (`ttlSecurity`, BIRD `ttl security on`) establishes, while a speaker without it
//!   is refused by BIRD.
//!
//! Needs root, BIRD, nft; skips loudly otherwise.

mod bgp_support;

use std::time::{Duration, Instant};

use bgp_support::poll::Poller;
use bgp_support::{Lab, TOR_V4, TOR_V6, edge_v4, edge_v6, wait_until};

const VIP: &str = "10.92.100.1";
const EXTRA: &str = "10.92.100.2";

/// Speaker file of edge 1: one eBGP IPv4 peer (the ToR), `peer_extra` appended to
/// the peer, `top` to the top level.
fn yaml(top: &str, peer_extra: &str, prefixes: &[&str]) -> String {
    let p: String = prefixes
        .iter()
        .map(|p| format!("  - prefix: {p}/32\n"))
        .collect();
    format!(
        "routerId: {}\ndrainSeconds: 1\n{top}peers:\n  - peerAddress: {TOR_V4}\n    peerASN: 65000\n    \
         myASN: 65011\n    holdTime: 3\n    connectRetrySeconds: 1\n    families: [ipv4]\n{peer_extra}prefixes:\n{p}",
        edge_v4(1)
    )
}

const BIRD_GR: &str = r#"
protocol bgp e1 from edge {
  local 10.91.0.1 as 65000; neighbor 10.91.0.11 as 65011;
  graceful restart on;
  ipv4 { import all; export none; };
}
"#;

#[test]
fn bird_keeps_the_nexthop_through_a_hitless_restart_then_flushes_the_stale() {
    require_lab!("bird", "birdc");
    let mut lab = Lab::new("gr", 1);
    lab.start_bird(BIRD_GR);
    let gr = "    gracefulRestartTime: 30\n";
    let old = lab.start_speaker(
        "edge1",
        "e1",
        &yaml("onSigterm: restart\n", gr, &[VIP, EXTRA]),
    );
    let via = format!("via {}", edge_v4(1));
    assert!(
        wait_until(Duration::from_secs(20), || lab
            .tor_route(VIP)
            .contains(&via)
            && lab.tor_route(EXTRA).contains(&via)),
        "routes never reached the ToR's FIB\n{}",
        lab.logs()
    );
    let caps = lab.birdc(&["show", "protocols", "all", "e1"]);
    assert!(
        caps.matches("Graceful restart").count() >= 2 && caps.contains("Restart time: 30"),
        "BIRD did not see our graceful restart capability:\n{caps}"
    );

    let poller = Poller::start(lab.ns("tor"), VIP, via.clone());
    let t0 = Instant::now();
    lab.terminate(old);
    let status = lab.daemons[old].child.try_wait().unwrap().unwrap();
    assert!(status.success(), "exit status {status}");
    // the upgrade's gap: BIRD holds the routes as stale meanwhile
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !lab.bird_established("e1"),
        "BIRD still sees the old session"
    );
    let stale = lab.birdc(&["show", "route", "for", VIP, "all"]);
    assert!(
        lab.tor_route(VIP).contains(&via),
        "the nexthop left the FIB while the speaker was down: {stale}"
    );

    // The new speaker no longer announces EXTRA: its End-of-RIB must flush it.
    let t1 = Instant::now();
    let new = lab.start_speaker(
        "edge1-new",
        "e1",
        &yaml(
            "onSigterm: restart\nforwardingPreserved: true\n",
            gr,
            &[VIP],
        ),
    );
    let back = wait_until(Duration::from_secs(20), || {
        lab.bird_established("e1") && !lab.tor_route(EXTRA).contains(&via)
    });
    let restart = t0.elapsed();
    let recovery = t1.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let (samples, missing, seen) = poller.finish();
    assert!(
        back,
        "not re-established, or the stale {EXTRA} not flushed after End-of-RIB:\n{}\n{}",
        lab.birdc(&["show", "protocols", "all", "e1"]),
        lab.logs()
    );
    assert_eq!(
        missing,
        0,
        "the ToR dropped the nexthop in {missing} of {samples} samples: {seen:?}\n{}",
        lab.log(new)
    );
    assert!(samples > 20, "polled too rarely: {samples} samples");
    let caps = lab.birdc(&["show", "protocols", "all", "e1"]);
    assert!(
        caps.contains("AF preserved: ipv4"),
        "the new OPEN should say forwarding was preserved:\n{caps}"
    );
    eprintln!(
        "hitless restart: SIGTERM -> re-established + End-of-RIB in {restart:?} (1.5 s of it \
         with no speaker; new speaker start -> stale flushed {recovery:?}); nexthop present in \
         all {samples} samples"
    );
}

#[test]
fn bird_keeps_a_killed_gr_edge_for_the_restart_time() {
    require_lab!("bird", "birdc");
    let mut lab = Lab::new("grkill", 1);
    lab.start_bird(BIRD_GR);
    let restart = 4u64;
    let e = lab.start_speaker(
        "edge1",
        "e1",
        &yaml("", &format!("    gracefulRestartTime: {restart}\n"), &[VIP]),
    );
    let via = format!("via {}", edge_v4(1));
    assert!(
        wait_until(Duration::from_secs(20), || lab
            .tor_route(VIP)
            .contains(&via)),
        "no route\n{}",
        lab.logs()
    );
    let t0 = Instant::now();
    lab.signal(e, "KILL");
    // Past the hold time (3 s) the route is still there: graceful restart holds it.
    std::thread::sleep(Duration::from_millis(3200));
    assert!(
        lab.tor_route(VIP).contains(&via),
        "gone before the restart time"
    );
    let gone = wait_until(Duration::from_secs(restart + 5), || {
        !lab.tor_route(VIP).contains(&via)
    });
    let after = t0.elapsed();
    assert!(gone, "kept past the restart time: {}", lab.tor_route(VIP));
    assert!(
        after >= Duration::from_secs(restart - 1),
        "gone after {after:?}"
    );
    eprintln!("kill -9 with graceful restart {restart}s: nexthop kept {after:?}");
}

/// Counts, in the ToR namespace, BGP packets from the edge by TTL / hop limit. Not
/// RSTs: the kernel sends those for a closed socket (a lost connection collision,
/// more likely under load) with the default TTL.
fn count_ttl(lab: &Lab) {
    let rules = format!(
        "table inet ttl {{\n chain in {{\n  type filter hook prerouting priority -500;\n  \
         ip saddr {e4} tcp dport 179 tcp flags & rst == 0 ip ttl 1 counter comment \"v4ttl1\"\n  \
         ip saddr {e4} tcp dport 179 tcp flags & rst == 0 ip ttl != 1 counter comment \"v4other\"\n  \
         ip6 saddr {e6} tcp dport 179 tcp flags & rst == 0 ip6 hoplimit 3 counter comment \"v6hl3\"\n  \
         ip6 saddr {e6} tcp dport 179 tcp flags & rst == 0 ip6 hoplimit != 3 counter comment \"v6other\"\n }}\n}}\n",
        e4 = edge_v4(1),
        e6 = edge_v6(1)
    );
    let f = lab.write("ttl.nft", &rules);
    lab.exec("tor", "nft", &["-f", &f.display().to_string()])
        .unwrap();
}

fn counter(lab: &Lab, comment: &str) -> u64 {
    let out = lab
        .exec("tor", "nft", &["list", "table", "inet", "ttl"])
        .unwrap();
    out.lines()
        .find(|l| l.contains(&format!("\"{comment}\"")))
        .and_then(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "packets")
                .nth(1)
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("no counter {comment}: {out}"))
}

#[test]
fn single_hop_ebgp_sends_ttl_1_and_multihop_sets_the_ipv6_hop_limit() {
    require_lab!("bird", "birdc", "nft");
    let mut lab = Lab::new("ttl", 1);
    count_ttl(&lab);
    lab.start_bird(&format!(
        r#"
protocol bgp e1 from edge {{ local {TOR_V4} as 65000; neighbor {} as 65011; passive on; ipv4 {{ import all; export none; }}; }}
protocol bgp e1v6 {{
  local {TOR_V6} as 65000; neighbor {} as 65011; multihop 3; passive on; hold time 3; keepalive time 1;
  connect delay time 1; connect retry time 1;
  ipv6 {{ import all; export none; }};
}}
"#,
        edge_v4(1),
        edge_v6(1)
    ));
    let peers = format!(
        "  - peerAddress: {TOR_V4}\n    peerASN: 65000\n    myASN: 65011\n    holdTime: 3\n    \
         connectRetrySeconds: 1\n    families: [ipv4]\n  - peerAddress: {TOR_V6}\n    peerASN: 65000\n    \
         myASN: 65011\n    holdTime: 3\n    connectRetrySeconds: 1\n    families: [ipv6]\n    ebgpMultihop: 3\n"
    );
    lab.start_speaker(
        "edge1",
        "e1",
        &format!("routerId: {}\npeers:\n{peers}prefixes: []\n", edge_v4(1)),
    );
    lab.assert_established_within(&["e1", "e1v6"], Duration::from_secs(20), "sessions");
    // keepalives flow both ways for a while (polled: a loaded machine may take longer
    // than the 1 s keepalive interval suggests to send a few). The ToR is passive, so
    // the edge's connection is the session and its packets go to port 179, which
    // is what the counters match (a session BIRD opened would go unseen).
    wait_until(Duration::from_secs(20), || {
        counter(&lab, "v4ttl1") > 3 && counter(&lab, "v6hl3") > 3
    });
    let (v4_1, v4_other) = (counter(&lab, "v4ttl1"), counter(&lab, "v4other"));
    let (v6_3, v6_other) = (counter(&lab, "v6hl3"), counter(&lab, "v6other"));
    eprintln!(
        "ToR saw: IPv4 TTL 1 {v4_1}, other {v4_other}; IPv6 hop limit 3 {v6_3}, other {v6_other}"
    );
    assert!(v4_1 > 3 && v4_other == 0, "IPv4 single hop must be TTL 1");
    assert!(
        v6_3 > 3 && v6_other == 0,
        "IPv6 ebgpMultihop 3 must be hop limit 3"
    );
}

#[test]
fn gtsm_with_bird_ttl_security_both_families_and_refused_without() {
    require_lab!("bird", "birdc");
    let mut lab = Lab::new("gtsm", 2);
    lab.start_bird(&format!(
        r#"
protocol bgp e1 from edge {{ local {TOR_V4} as 65000; neighbor {e1} as 65011; ttl security on; ipv4 {{ import all; export none; }}; }}
protocol bgp e1v6 from edge {{ local {TOR_V6} as 65000; neighbor {e16} as 65011; ttl security on; ipv6 {{ import all; export none; }}; }}
protocol bgp e2 from edge {{ local {TOR_V4} as 65000; neighbor {e2} as 65012; ttl security on; ipv4 {{ import all; export none; }}; }}
"#,
        e1 = edge_v4(1),
        e16 = edge_v6(1),
        e2 = edge_v4(2),
    ));
    let peer = |addr: &str, my: u32, fam: &str, gtsm: bool| {
        format!(
            "  - peerAddress: {addr}\n    peerASN: 65000\n    myASN: {my}\n    holdTime: 3\n    \
             connectRetrySeconds: 1\n    families: [{fam}]\n    ttlSecurity: {gtsm}\n"
        )
    };
    let y1 = format!(
        "routerId: {}\npeers:\n{}{}prefixes:\n  - prefix: {VIP}/32\n",
        edge_v4(1),
        peer(TOR_V4, 65011, "ipv4", true),
        peer(TOR_V6, 65011, "ipv6", true)
    );
    let y2 = format!(
        "routerId: {}\npeers:\n{}prefixes:\n  - prefix: {VIP}/32\n",
        edge_v4(2),
        peer(TOR_V4, 65012, "ipv4", false)
    );
    lab.start_speaker("edge1", "e1", &y1);
    lab.start_speaker("edge2", "e2", &y2);
    lab.assert_established_within(&["e1", "e1v6"], Duration::from_secs(20), "GTSM sessions");
    assert!(
        wait_until(Duration::from_secs(10), || lab
            .tor_route(VIP)
            .contains(&format!("via {}", edge_v4(1)))),
        "no route over the GTSM session"
    );
    // edge2 sends TTL 1: BIRD's IP_MINTTL 255 drops it; it never establishes.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !lab.bird_established("e2"),
        "BIRD with ttl security accepted a TTL-1 speaker"
    );
    eprintln!("GTSM: v4 and v6 Established; the TTL-1 speaker refused");
}

/// The price of BFD for a hitless restart: our BFD stops with the agent. Edge1's
/// BGP protocol at BIRD has `bfd graceful` (BFD Down starts a graceful restart),
/// edge2's plain `bfd on` (BFD Down stops the protocol). Both edges restart
/// hitlessly: edge1's next hop stays in every sample, edge2's goes, and both are
/// back after the new speakers' End-of-RIB.
#[test]
fn bird_bfd_graceful_keeps_a_hitless_restart_bfd_on_does_not() {
    require_lab!("bird", "birdc");
    let mut lab = Lab::new("grbfdr", 2);
    let mut protocols = String::from(
        "protocol bfd {\n  interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; \
         multiplier 3; };\n}\n",
    );
    for (i, bfd) in [(1u8, "bfd graceful"), (2, "bfd on")] {
        protocols.push_str(&format!(
            "protocol bgp e{i} from edge {{ local {TOR_V4} as 65000; neighbor {} as {}; \
             hold time 9; keepalive time 3; graceful restart on; {bfd}; \
             ipv4 {{ import all; export none; }}; }}\n",
            edge_v4(i),
            65010 + u32::from(i)
        ));
    }
    lab.start_bird(&protocols);
    let speaker = |i: u8, preserved: bool| {
        format!(
            "routerId: {}\nonSigterm: restart\nforwardingPreserved: {preserved}\npeers:\n  - peerAddress: {TOR_V4}\n    \
             peerASN: 65000\n    myASN: {}\n    holdTime: 9\n    keepaliveTime: 3\n    connectRetrySeconds: 1\n    \
             families: [ipv4]\n    gracefulRestartTime: 30\n    bfd:\n      minRxMs: 100\n      minTxMs: 100\n      \
             multiplier: 3\nprefixes:\n  - prefix: {VIP}/32\n",
            edge_v4(i),
            65010 + u32::from(i)
        )
    };
    let old: Vec<usize> = (1..=2u8)
        .map(|i| lab.start_speaker(&format!("edge{i}"), &format!("e{i}"), &speaker(i, false)))
        .collect();
    let (via1, via2) = (format!("via {}", edge_v4(1)), format!("via {}", edge_v4(2)));
    let bfd_up = |lab: &Lab| {
        lab.birdc(&["show", "bfd", "sessions"])
            .lines()
            .filter(|l| l.contains(" Up "))
            .count()
            == 2
    };
    let both = |lab: &Lab| lab.routes_via_both_edges(VIP);
    assert!(
        wait_until(Duration::from_secs(30), || both(&lab) && bfd_up(&lab)),
        "no ECMP route with BFD up on both\n{}",
        lab.logs()
    );
    let p1 = Poller::start(lab.ns("tor"), VIP, via1.clone());
    let p2 = Poller::start(lab.ns("tor"), VIP, via2.clone());
    for &e in &old {
        lab.signal(e, "TERM");
    }
    for &e in &old {
        assert!(
            lab.wait_exit(e, Duration::from_secs(10)),
            "no exit on SIGTERM"
        );
    }
    // longer than BFD's 300 ms detection time
    std::thread::sleep(Duration::from_millis(1500));
    for i in 1..=2u8 {
        lab.start_speaker(&format!("edge{i}-new"), &format!("e{i}"), &speaker(i, true));
    }
    let back = wait_until(Duration::from_secs(30), || both(&lab));
    std::thread::sleep(Duration::from_millis(300));
    let (s1, m1, _) = p1.finish();
    let (s2, m2, _) = p2.finish();
    eprintln!(
        "hitless restart with BFD: `bfd graceful` next hop missing in {m1} of {s1} samples, \
         `bfd on` in {m2} of {s2}"
    );
    assert!(back, "edges not back after the restart\n{}", lab.logs());
    assert_eq!(m1, 0, "bfd graceful dropped the restarting edge");
    assert!(m2 > 0, "bfd on kept the restarting edge");
}
