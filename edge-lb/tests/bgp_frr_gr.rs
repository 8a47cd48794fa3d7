//! Graceful restart (RFC 4724) of our speaker (`ringlb-edge speaker`) with FRR 8
//! (zebra + bgpd, `bgp graceful-restart`) as the ToR, in network namespaces: FRR
//! records our capability as received, and a hitless restart (`onSigterm:
//! restart`, then a new speaker with `forwardingPreserved`) never takes the
//! edge's next hop out of the ToR's kernel route (installed by zebra).
//!
//! Needs root and FRR (`frr`, installed by scripts/setup.sh); skips loudly otherwise.

mod bgp_support;

use std::time::{Duration, Instant};

use bgp_support::poll::Poller;
use bgp_support::{Lab, TOR_V4, edge_v4, frr, wait_until};

const VIP: &str = "10.93.100.1";

/// bgpd: graceful restart on (helper for our restart), one eBGP neighbour.
fn bgpd_conf() -> String {
    let n = edge_v4(1);
    format!(
        "router bgp 65000\n bgp router-id {TOR_V4}\n no bgp ebgp-requires-policy\n \
         bgp graceful-restart\n neighbor {n} remote-as 65011\n neighbor {n} timers 3 9\n \
         neighbor {n} timers connect 1\n!\n"
    )
}

fn speaker_yaml(top: &str) -> String {
    format!(
        "routerId: {}\ndrainSeconds: 1\n{top}peers:\n  - peerAddress: {TOR_V4}\n    peerASN: 65000\n    \
         myASN: 65011\n    holdTime: 9\n    keepaliveTime: 3\n    connectRetrySeconds: 1\n    \
         families: [ipv4]\n    gracefulRestartTime: 30\nprefixes:\n  - prefix: {VIP}/32\n",
        edge_v4(1)
    )
}

/// FRR's JSON view of the neighbour edge1, as one line of text.
fn neighbor(lab: &Lab, dir: &std::path::Path) -> String {
    frr::vtysh(lab, dir, &format!("show bgp neighbors {} json", edge_v4(1)))
}

fn established(lab: &Lab, dir: &std::path::Path) -> bool {
    neighbor(lab, dir).contains("\"bgpState\":\"Established\"")
}

#[test]
fn frr_keeps_the_nexthop_through_a_hitless_restart() {
    require_frr!("frr_gr");
    let mut lab = Lab::new("frrgr", 1);
    let dir = frr::start_frr(&mut lab, &bgpd_conf(), "");
    let old = lab.start_speaker("edge1", "e1", &speaker_yaml("onSigterm: restart\n"));
    let via = format!("via {}", edge_v4(1));
    assert!(
        wait_until(Duration::from_secs(30), || lab
            .tor_route(VIP)
            .contains(&via)),
        "no route at FRR: {}\n{}\n{}",
        lab.tor_route(VIP),
        frr::vtysh(&lab, &dir, "show bgp summary"),
        lab.logs()
    );
    let json: serde_json::Value = serde_json::from_str(&neighbor(&lab, &dir)).unwrap();
    let n = &json[edge_v4(1)];
    assert_eq!(
        n["neighborCapabilities"]["gracefulRestart"], "advertisedAndReceived",
        "FRR did not record our graceful restart capability: {n:#}"
    );
    let info = &n["gracefulRestartInfo"];
    eprintln!("FRR's view of our graceful restart: {info}");
    assert_eq!(info["remoteGrMode"], "Restart", "{info:#}");
    assert_eq!(info["timers"]["receivedRestartTimer"], 30, "{info:#}");

    let poller = Poller::start(lab.ns("tor"), VIP, via.clone());
    let t0 = Instant::now();
    lab.terminate(old);
    // the upgrade's gap: FRR holds the routes as stale meanwhile
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!established(&lab, &dir), "FRR still sees the old session");
    assert!(
        lab.tor_route(VIP).contains(&via),
        "the next hop left the FIB while the speaker was down: {}",
        frr::vtysh(&lab, &dir, &format!("show bgp ipv4 unicast {VIP}"))
    );
    let new = lab.start_speaker(
        "edge1-new",
        "e1",
        &speaker_yaml("onSigterm: restart\nforwardingPreserved: true\n"),
    );
    let back = wait_until(Duration::from_secs(20), || established(&lab, &dir));
    let took = t0.elapsed();
    std::thread::sleep(Duration::from_millis(1000));
    let (samples, missing, seen) = poller.finish();
    assert!(back, "not re-established:\n{}", lab.log(new));
    assert_eq!(
        missing,
        0,
        "FRR dropped the next hop in {missing} of {samples} samples: {seen:?}\n{}",
        lab.log(new)
    );
    assert!(samples > 20, "polled too rarely: {samples} samples");
    eprintln!(
        "FRR, hitless restart: SIGTERM -> re-established in {took:?}; next hop present in all {samples} samples"
    );
}
