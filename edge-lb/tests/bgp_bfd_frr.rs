//! BFD between our speaker and FRR 8 (zebra + bgpd + bfdd) as the ToR, in network
//! namespaces: an edge frozen with SIGSTOP leaves the ToR's ECMP route (installed by
//! zebra) within the BFD detection time (100 ms x 3), far inside the 9 s hold time.
//! Needs root and FRR (`frr`, installed by scripts/setup.sh); skips loudly otherwise.

mod bgp_support;

use std::path::PathBuf;
use std::time::Duration;

use bgp_support::{Lab, TOR_V4, edge_v4, frr, wait_until};

const VIP4: &str = "10.91.100.1";

fn speaker_yaml(i: u8) -> String {
    format!(
        "routerId: {}\ndrainSeconds: 1\npeers:\n  - peerAddress: {TOR_V4}\n    peerASN: 65000\n    \
         myASN: {}\n    holdTime: 9\n    keepaliveTime: 3\n    connectRetrySeconds: 1\n    \
         families: [ipv4]\n    bfd:\n      minRxMs: 100\n      minTxMs: 100\n      multiplier: 3\n\
         prefixes:\n  - prefix: {VIP4}/32\n",
        edge_v4(i),
        65010 + u32::from(i)
    )
}

/// bgpd's configuration: both edges as eBGP neighbours with the BFD profile `fast`.
fn bgpd_conf() -> String {
    let mut bgp = format!(
        "router bgp 65000\n bgp router-id {TOR_V4}\n no bgp ebgp-requires-policy\n \
         bgp bestpath as-path multipath-relax\n"
    );
    for i in 1..=2u8 {
        let n = edge_v4(i);
        bgp.push_str(&format!(
            " neighbor {n} remote-as {}\n neighbor {n} timers 3 9\n neighbor {n} timers connect 1\n \
             neighbor {n} bfd profile fast\n",
            65010 + u32::from(i)
        ));
    }
    bgp.push_str(" address-family ipv4 unicast\n  maximum-paths 16\n exit-address-family\n!\n");
    bgp
}

const BFDD_FAST: &str = "bfd\n profile fast\n  receive-interval 100\n  transmit-interval 100\n  \
                         detect-multiplier 3\n !\n!\n";

fn route(lab: &Lab) -> String {
    lab.tor_route(VIP4)
}

fn spawn_edge(lab: &mut Lab, i: u8) -> usize {
    let cfg = lab.write(&format!("edge{i}.yaml"), &speaker_yaml(i));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ringlb-edge"));
    let c = cfg.display().to_string();
    lab.spawn(
        &format!("edge{i}"),
        &format!("e{i}"),
        &bin,
        &["--metrics-addr", "127.0.0.1:0", "speaker", "--config", &c],
    )
}

#[test]
fn frr_bfd_removes_a_frozen_edge_within_the_detection_time() {
    require_frr!("frr_bfd");
    let mut lab = Lab::new("frrbfd", 2);
    let dir = frr::start_frr(&mut lab, &bgpd_conf(), BFDD_FAST);
    let e1 = spawn_edge(&mut lab, 1);
    spawn_edge(&mut lab, 2);
    let (via1, via2) = (format!("via {}", edge_v4(1)), format!("via {}", edge_v4(2)));
    let ok = wait_until(Duration::from_secs(30), || {
        let r = route(&lab);
        let bfd = frr::vtysh(&lab, &dir, "show bfd peers brief");
        r.contains(&via1) && r.contains(&via2) && bfd.matches(" up ").count() >= 2
    });
    assert!(
        ok,
        "no ECMP with BFD up at FRR: {}\n{}\n{}\n{}",
        route(&lab),
        frr::vtysh(&lab, &dir, "show bfd peers"),
        frr::vtysh(&lab, &dir, "show bgp summary"),
        lab.logs()
    );

    lab.signal(e1, "STOP");
    let (r, took) = lab.wait_route_without(VIP4, &via1, Duration::from_secs(8));
    let neighbor = frr::vtysh(&lab, &dir, &format!("show bgp neighbors {}", edge_v4(1)));
    lab.signal(e1, "CONT");
    eprintln!("FRR, BFD 100 ms x 3: frozen edge removed from the ToR's ECMP route after {took:?}");
    assert!(
        !r.contains(&via1) && r.contains(&via2),
        "edge1 still routed {took:?} after SIGSTOP: {r}"
    );
    // Goal 300 ms. The bound, half the 9 s hold time, leaves room for a loaded 2-core machine but
    // only BFD can meet it.
    assert!(took < Duration::from_millis(4500), "took {took:?}");
    let reset = neighbor
        .lines()
        .find(|l| l.contains("Last reset"))
        .unwrap_or_default();
    eprintln!("FRR: {}", reset.trim());
    assert!(
        reset.contains("BFD"),
        "FRR's session did not end by BFD:\n{neighbor}"
    );
    lab.assert_ecmp_within(VIP4, Duration::from_secs(30), "edge1 did not come back");
}
