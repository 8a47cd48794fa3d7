//! BFD between our speaker (the `ringlb-edge speaker` binary) and a real BIRD 2 ToR
//! (`protocol bfd` + `bfd on` in its BGP protocols) in network namespaces:
//!
//! - an edge frozen with SIGSTOP (it closes nothing, its TCP session stays open) leaves
//!   the ToR's ECMP route within the BFD detection time (100 ms x 3), far inside the
//!   9 s BGP hold time; after SIGCONT our side sees BFD Down, resets its session and
//!   the edge comes back;
//! - an edge killed with graceful restart on (BIRD would keep its routes stale for the
//!   30 s restart time) and BFD on leaves within the detection time too;
//! - a hitless restart (`onSigterm: restart`, graceful restart) with BFD: the edge
//!   sends AdminDown before it goes, and with BIRD's `bfd graceful` the route stays
//!   through the gap (BIRD stops the session on AdminDown under plain `bfd on`);
//! - garbage sent to the edge's BFD port is dropped and counted, and neither session
//!   notices.
//!
//! Needs root; skips loudly otherwise.

mod bgp_support;

use std::path::PathBuf;
use std::time::Duration;

use bgp_support::{Lab, TOR_V4, edge_v4, wait_until};

const VIP4: &str = "10.91.100.1";
/// Edge metrics, on each edge namespace's own loopback.
const METRICS: &str = "127.0.0.1:9464";

const BFD: &str = "    bfd:\n      minRxMs: 100\n      minTxMs: 100\n      multiplier: 3\n";

/// `extra` is appended to the peer.
fn speaker_yaml(i: u8, asn: u32, extra: &str) -> String {
    format!(
        "routerId: {}\ndrainSeconds: 1\npeers:\n  - peerAddress: {TOR_V4}\n    peerASN: 65000\n    \
         myASN: {asn}\n    holdTime: 9\n    keepaliveTime: 3\n    connectRetrySeconds: 1\n    \
         families: [ipv4]\n{BFD}{extra}prefixes:\n  - prefix: {VIP4}/32\n",
        edge_v4(i)
    )
}

/// Our speaker with its metrics on a known port of the edge namespace's loopback.
fn start_edge(lab: &mut Lab, i: u8, name: &str, extra: &str) -> usize {
    let cfg = lab.write(
        &format!("{name}.yaml"),
        &speaker_yaml(i, 65010 + u32::from(i), extra),
    );
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ringlb-edge"));
    let c = cfg.display().to_string();
    lab.spawn(
        name,
        &format!("e{i}"),
        &bin,
        &[
            "--metrics-addr",
            METRICS,
            "--log-level",
            "info,ringlb_bgp=debug",
            "speaker",
            "--config",
            &c,
        ],
    )
}

/// `extra` goes into each BGP protocol.
fn bird_conf(extra: &str) -> String {
    // hold 9 s: only BFD can explain a removal in well under a second.
    let mut p = String::from(
        "protocol bfd {\n  interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; \
         multiplier 3; };\n}\n",
    );
    for i in 1..=2u8 {
        p.push_str(&format!(
            "protocol bgp e{i} from edge {{ local {TOR_V4} as 65000; neighbor {} as {}; \
             hold time 9; keepalive time 3; bfd on; debug {{ states, routes, events }}; {extra} ipv4 {{ import all; export none; }}; }}\n",
            edge_v4(i),
            65010 + u32::from(i)
        ));
    }
    p
}

fn route(lab: &Lab) -> String {
    lab.tor_route(VIP4)
}

fn metrics(lab: &Lab, edge: &str) -> String {
    lab.exec(
        edge,
        "curl",
        &[
            "-s",
            "--max-time",
            "2",
            &format!("http://{METRICS}/metrics"),
        ],
    )
    .unwrap_or_default()
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Both edges in ECMP and both BFD sessions Up at BIRD.
fn converge(lab: &Lab) {
    let (via1, via2) = (format!("via {}", edge_v4(1)), format!("via {}", edge_v4(2)));
    let ok = wait_until(Duration::from_secs(20), || {
        let r = route(lab);
        let bfd = lab.birdc(&["show", "bfd", "sessions"]);
        r.contains(&via1) && r.contains(&via2) && bfd.matches(" Up ").count() >= 2
    });
    assert!(
        ok,
        "no ECMP with BFD Up: {}\n{}\n{}\n{}",
        route(lab),
        lab.birdc(&["show", "bfd", "sessions"]),
        lab.birdc(&["show", "protocols"]),
        lab.logs()
    );
}

#[test]
fn bird_bfd_removes_a_frozen_edge_within_the_detection_time() {
    require_lab!("bird", "birdc", "curl");
    let mut lab = Lab::new("bfd", 2);
    lab.start_bird(&bird_conf(""));
    let e1 = start_edge(&mut lab, 1, "edge1", "");
    start_edge(&mut lab, 2, "edge2", "");
    converge(&lab);
    let m = metrics(&lab, "e1");
    assert_eq!(
        metric(&m, "ringlb_bfd_session_state{peer=\"10.91.0.1\"}"),
        3.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "ringlb_bfd_detection_time_milliseconds{"),
        300.0,
        "{m}"
    );

    let via1 = format!("via {}", edge_v4(1));
    let via2 = format!("via {}", edge_v4(2));
    lab.signal(e1, "STOP");
    let (r, took) = lab.wait_route_without(VIP4, &via1, Duration::from_secs(8));
    let e1_state = lab.birdc(&["show", "protocols", "all", "e1"]);
    lab.signal(e1, "CONT");
    eprintln!("BFD 100 ms x 3: frozen edge removed from the ToR's ECMP route after {took:?}");
    assert!(
        !r.contains(&via1) && r.contains(&via2),
        "edge1 still routed {took:?} after SIGSTOP: {r}\n{}",
        lab.birdc(&["show", "bfd", "sessions"])
    );
    // Goal 300 ms. The bound, half the 9 s hold time (and far below the 30 s restart
    // time where graceful restart is on), leaves room for a loaded 2-core machine but
    // only BFD can meet it.
    assert!(took < Duration::from_millis(4500), "took {took:?}");
    // BIRD's log, not `show protocols` (its last error may already be a reconnect's).
    let log = lab.log(0);
    assert!(
        log.contains("e1: BFD session down"),
        "BIRD's session did not end by BFD:\n{e1_state}\n{log}"
    );

    // Thawed, our side hears BIRD's BFD Down, resets its BGP session and comes back.
    lab.assert_ecmp_within(VIP4, Duration::from_secs(20), "edge1 did not come back");
    let m = metrics(&lab, "e1");
    assert!(
        metric(
            &m,
            "ringlb_bfd_transitions_total{peer=\"10.91.0.1\",state=\"Down\"}"
        ) >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "ringlb_bgp_session_flaps_total{") >= 1.0,
        "our side did not reset its session:\n{m}"
    );
    assert!(lab.bird_established("e2"), "edge2's session was disturbed");
}

#[test]
fn bird_bfd_garbage_to_the_edge_is_counted_and_sessions_stay_up() {
    require_lab!("bird", "birdc", "curl", "python3");
    let mut lab = Lab::new("bfdg", 2);
    lab.start_bird(&bird_conf(""));
    start_edge(&mut lab, 1, "edge1", "");
    start_edge(&mut lab, 2, "edge2", "");
    converge(&lab);
    let flaps_before = metric(&metrics(&lab, "e1"), "ringlb_bgp_session_flaps_total{");
    // From the ToR's namespace: short packets, bad versions, random bytes, a
    // well-formed packet with a discriminator the edge never gave out, and the same
    // with TTL 64.
    let script = format!(
        r#"
import random, socket, struct, time
random.seed(5)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 255)
dst = ("{edge}", 3784)
good = struct.pack("!BBBBIIIII", 0x20, 0xc0, 3, 24, 7, 0xdeadbeef, 100000, 100000, 0)
pkts = [b"", b"\xff" * 7, good[:20], b"\x40" + good[1:], good]
pkts += [bytes(random.getrandbits(8) for _ in range(random.randrange(40))) for _ in range(300)]
for p in pkts:
    s.sendto(p, dst)
    time.sleep(0.001)
low = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
low.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 64)
low.sendto(good, dst)
print(len(pkts) + 1)
"#,
        edge = edge_v4(1)
    );
    let sent: f64 = lab
        .exec("tor", "python3", &["-c", &script])
        .expect("python3 sender")
        .trim()
        .parse()
        .unwrap();
    let mut m = String::new();
    let counted = wait_until(Duration::from_secs(5), || {
        m = metrics(&lab, "e1");
        metric(&m, "ringlb_bfd_packets_dropped_total{") >= sent
    });
    assert!(counted, "sent {sent} bad packets, counted:\n{m}");
    for reason in ["short", "version", "unknown_session", "ttl"] {
        assert!(
            m.contains(&format!(
                "ringlb_bfd_packets_dropped_total{{reason=\"{reason}\"}}"
            )),
            "no {reason} drop:\n{m}"
        );
    }
    // A detection time later everything is still up, nothing flapped.
    std::thread::sleep(Duration::from_millis(600));
    let m = metrics(&lab, "e1");
    assert_eq!(metric(&m, "ringlb_bfd_session_state{"), 3.0, "{m}");
    assert_eq!(metric(&m, "ringlb_bgp_session_state{"), 6.0, "{m}");
    assert_eq!(
        metric(&m, "ringlb_bgp_session_flaps_total{"),
        flaps_before,
        "{m}"
    );
    let bfd = lab.birdc(&["show", "bfd", "sessions"]);
    assert!(bfd.matches(" Up ").count() >= 2, "{bfd}");
    let log = lab.log(1);
    assert!(
        log.contains("dropped BFD packet"),
        "no log line with context for the drops:\n{log}"
    );
}

#[test]
fn bird_bfd_removes_a_killed_graceful_restart_edge_within_the_detection_time() {
    require_lab!("bird", "birdc", "curl");
    let mut lab = Lab::new("bfdgr", 2);
    lab.start_bird(&bird_conf("graceful restart on;"));
    let gr = "    gracefulRestartTime: 30\n";
    let e1 = start_edge(&mut lab, 1, "edge1", gr);
    start_edge(&mut lab, 2, "edge2", gr);
    converge(&lab);
    let caps = lab.birdc(&["show", "protocols", "all", "e1"]);
    assert!(
        caps.contains("Restart time: 30"),
        "BIRD did not see our graceful restart capability:\n{caps}"
    );
    let via1 = format!("via {}", edge_v4(1));
    let via2 = format!("via {}", edge_v4(2));
    // kill -9 closes the TCP session: alone, that starts BIRD's graceful restart and
    // keeps the stale routes for 30 s (edge-lb/tests/bgp_bird_gr.rs shows it).
    lab.signal(e1, "KILL");
    let (r, took) = lab.wait_route_without(VIP4, &via1, Duration::from_secs(8));
    eprintln!(
        "BFD 100 ms x 3, graceful restart 30 s: killed edge removed from the ToR's ECMP \
         route after {took:?}"
    );
    assert!(
        !r.contains(&via1) && r.contains(&via2),
        "edge1 still routed {took:?} after kill -9: {r}\n{}",
        lab.birdc(&["show", "protocols", "all", "e1"])
    );
    // Goal 300 ms. The bound, half the 9 s hold time (and far below the 30 s restart
    // time where graceful restart is on), leaves room for a loaded 2-core machine but
    // only BFD can meet it.
    assert!(took < Duration::from_millis(4500), "took {took:?}");
    // BIRD's log: the TCP close started graceful restart (stale routes kept), then
    // BFD ended it and flushed them.
    let log = lab.log(0);
    let pos = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in bird.log:\n{log}"))
    };
    assert!(
        pos("e1: Neighbor graceful restart detected") < pos("e1: BFD session down"),
        "{log}"
    );
    assert!(lab.bird_established("e2"), "edge2's session was disturbed");
}

#[test]
fn bird_bfd_graceful_keeps_the_route_through_a_hitless_restart() {
    require_lab!("bird", "birdc", "curl");
    let mut lab = Lab::new("bfdhr", 1);
    // BIRD 2.0.12 stops the BGP session on a peer's BFD AdminDown too (RFC 5882 §3.2
    // says it should not), so `bfd on` would flush the routes of an edge restarting
    // hitlessly; `bfd graceful` turns BFD down into a graceful restart instead.
    lab.start_bird(&bird_conf("graceful restart on; bfd graceful;"));
    let gr = "    gracefulRestartTime: 30\n";
    let y = |top: &str| {
        speaker_yaml(1, 65011, gr).replace("drainSeconds: 1\n", &format!("drainSeconds: 1\n{top}"))
    };
    let cfg = lab.write("edge1.yaml", &y("onSigterm: restart\n"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ringlb-edge"));
    let c = cfg.display().to_string();
    let args = ["--metrics-addr", METRICS, "speaker", "--config", c.as_str()];
    let old = lab.spawn("edge1", "e1", &bin, &args);
    let via1 = format!("via {}", edge_v4(1));
    let up = wait_until(Duration::from_secs(20), || {
        route(&lab).contains(&via1) && lab.birdc(&["show", "bfd", "sessions"]).contains(" Up ")
    });
    assert!(up, "no route with BFD Up:\n{}", lab.logs());
    // SIGTERM for a restart: BFD says AdminDown before the process goes; BIRD's BFD
    // goes down and, with `bfd graceful`, keeps the route as stale through the gap.
    lab.terminate(old);
    std::thread::sleep(Duration::from_millis(1500));
    let bfd = lab.birdc(&["show", "bfd", "sessions"]);
    assert!(
        route(&lab).contains(&via1),
        "the route left during the restart gap (BFD {bfd}):\n{}",
        lab.birdc(&["show", "protocols", "all", "e1"])
    );
    let cfg = lab.write(
        "edge1-new.yaml",
        &y("onSigterm: restart\nforwardingPreserved: true\n"),
    );
    let c = cfg.display().to_string();
    let args = ["--metrics-addr", METRICS, "speaker", "--config", c.as_str()];
    lab.spawn("edge1-new", "e1", &bin, &args);
    let back = wait_until(Duration::from_secs(20), || {
        lab.bird_established("e1") && lab.birdc(&["show", "bfd", "sessions"]).contains(" Up ")
    });
    assert!(back, "not back with BFD Up:\n{}", lab.logs());
    assert!(route(&lab).contains(&via1), "{}", route(&lab));
}
