//! The fault steps of the real-cluster faults test, each with traffic running
//! through it ([`super::through`]).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ringlb_e2e::realcluster::{self, RealCluster};

use super::*;

/// The controller's leader goes: another replica takes over, no VIP changes.
pub(crate) fn leader_deleted(rc: &RealCluster) {
    let vips_before = web_field(rc, ".status.loadBalancer.ingress");
    let old = leader(rc);
    assert!(!old.is_empty(), "no leader holds the Lease");
    rc.kubectl(&["delete", "pod", "-n", "ringlb-system", &old, "--wait=false"])
        .unwrap();
    let t = Instant::now();
    let new = ringlb_e2e::lab::wait_for(
        "another controller replica to lead",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let l = leader(rc);
            Ok(if !l.is_empty() && l != old {
                Ok(l)
            } else {
                Err(l)
            })
        },
    )
    .unwrap();
    eprintln!(
        "leader {old} deleted: {new} leads after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(2));
    let vips_after = web_field(rc, ".status.loadBalancer.ingress");
    assert_eq!(vips_before, vips_after, "a new leader changed the VIPs");
}

/// An edge pod deleted; the DaemonSet starts another: no connection breaks.
pub(crate) fn edge_pod_deleted(rc: &RealCluster, client: &str, v4: IpAddr) {
    let edge_pod = pod_on(
        rc,
        "ringlb-system",
        "app.kubernetes.io/component=edge",
        "e1",
    );
    let r = through(client, v4, 100, Duration::from_secs(3), || {
        rc.kubectl(&["delete", "pod", "-n", "ringlb-system", &edge_pod])
            .unwrap();
        wait_ds_ready(rc, "edge");
    });
    r.assert_hitless("edge pod deleted");
}

/// A rolling `helm upgrade` of the edges: no connection breaks, no request fails.
pub(crate) fn edges_rolled(rc: &RealCluster, client: &str, v4: IpAddr) {
    let chart = realcluster::repo_root().join("charts/ringlb");
    let values = rc.dir.join("values.yaml");
    let r = through(client, v4, 100, Duration::from_secs(3), || {
        rc.helm(&[
            "upgrade",
            "ringlb",
            &chart.display().to_string(),
            "-n",
            "ringlb-system",
            "-f",
            &values.display().to_string(),
            "--set",
            "edge.podAnnotations.rolled=yes",
            "--wait",
            "--timeout",
            "180s",
        ])
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
        wait_ds_ready(rc, "edge");
    });
    r.assert_hitless("helm upgrade rolled the edges");
}

/// `auto` attached generic (a veth whose peer is in another namespace); `helm upgrade
/// --set edge.xdpMode=native` makes the new edge pods re-attach in native mode instead
/// of keeping the pinned generic link, and traffic flows on (the ToR's side of each
/// edge's link runs an XDP program, so native XDP_TX is delivered).
pub(crate) fn attach_mode_upgraded(rc: &RealCluster) {
    let mode = |node: &str| {
        rc.node(node)
            .unwrap()
            .exec(&["ip", "-d", "link", "show", "eth0"])
            .unwrap()
    };
    assert!(
        mode("e1").contains("xdpgeneric"),
        "auto chose generic first:\n{}",
        mode("e1")
    );
    let chart = realcluster::repo_root().join("charts/ringlb");
    let values = rc.dir.join("values.yaml");
    rc.helm(&[
        "upgrade",
        "ringlb",
        &chart.display().to_string(),
        "-n",
        "ringlb-system",
        "-f",
        &values.display().to_string(),
        "--set",
        "edge.podAnnotations.rolled=yes",
        "--set",
        "edge.xdpMode=native",
        "--wait",
        "--timeout",
        "180s",
    ])
    .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    wait_ds_ready(rc, "edge");
    for e in ["e1", "e2"] {
        let link = mode(e);
        assert!(
            link.contains(" xdp ") && !link.contains("xdpgeneric"),
            "{e} not in native mode:\n{link}"
        );
    }
    let spread = rc
        .spread(rc.wait_vips(WEB, Duration::from_secs(5)).unwrap().0, 10)
        .unwrap();
    eprintln!("edge.xdpMode=native applied on both edges; served: {spread:?}");
}

/// A values change naming an interface the edges do not have: the first edge pod
/// rolled says why (a Warning Event on its Node, its log) and never turns Ready,
/// the roll stops there, the other edge serves on; `helm rollback` mends it. No
/// request fails throughout.
pub(crate) fn wrong_interface_stops_the_roll(rc: &RealCluster, client: &str, v4: IpAddr) {
    let chart = realcluster::repo_root().join("charts/ringlb");
    let chart = chart.display().to_string();
    let r = through(client, v4, 100, Duration::from_secs(3), || {
        rc.helm(&[
            "upgrade",
            "ringlb",
            &chart,
            "-n",
            "ringlb-system",
            "--reuse-values",
            "--set",
            "edge.interface=nope0",
        ])
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
        let note = ringlb_e2e::lab::wait_for(
            "the EdgeConfigInvalid Event",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || {
                let notes = rc.kubectl(&[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    "reason=EdgeConfigInvalid",
                    "-o",
                    "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
                ])?;
                Ok(match notes.lines().find(|l| l.contains("nope0")) {
                    Some(l) => Ok(l.to_string()),
                    None => Err(notes),
                })
            },
        )
        .unwrap();
        eprintln!("Event: {note}");
        assert!(
            note.contains("edge.interface") && note.contains("eth0"),
            "the Event names the value and the interfaces the node has: {note}"
        );
        let bad = ringlb_e2e::lab::wait_for(
            "the failing edge pod's log",
            Duration::from_secs(60),
            Duration::from_millis(500),
            || {
                let pods = edge_readiness(rc)?;
                let Some((pod, _)) = pods.iter().find(|(_, ready)| !ready) else {
                    return Ok(Err(format!("{pods:?}")));
                };
                for previous in [false, true] {
                    let mut args = vec!["logs", "-n", "ringlb-system", pod.as_str()];
                    args.extend(previous.then_some("--previous"));
                    if rc
                        .kubectl(&args)
                        .is_ok_and(|l| l.contains("--interface nope0"))
                    {
                        return Ok(Ok(pods));
                    }
                }
                Ok(Err(format!("{pods:?}")))
            },
        )
        .unwrap();
        assert_eq!(
            bad.iter().filter(|(_, ready)| *ready).count(),
            1,
            "the roll stops at the first edge, the other serves on: {bad:?}"
        );
        let hops = rc.wait_ecmp(v4, 1, Duration::from_secs(30)).unwrap();
        eprintln!("edge.interface=nope0: the roll stopped at one edge; ToR: {hops:?}");
        rc.helm(&[
            "rollback",
            "ringlb",
            "-n",
            "ringlb-system",
            "--wait",
            "--timeout",
            "180s",
        ])
        .unwrap_or_else(|e| panic!("helm rollback: {e}"));
        wait_ds_ready(rc, "edge");
        rc.wait_ecmp(v4, 2, Duration::from_secs(60)).unwrap();
    });
    r.assert_hitless("wrong interface, then rolled back");
}

/// Each edge pod with whether it is Ready.
fn edge_readiness(rc: &RealCluster) -> ringlb_e2e::lab::Result<Vec<(String, bool)>> {
    let out = rc.kubectl(&[
        "get",
        "pods",
        "-n",
        "ringlb-system",
        "-l",
        "app.kubernetes.io/component=edge",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].ready} {end}",
    ])?;
    Ok(out
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(p, r)| (p.to_string(), r == "true"))
        .collect())
}

/// A worker's containerd, then its kubelet, killed and restarted: no connection breaks.
pub(crate) fn worker_daemons_restarted(rc: &mut RealCluster, client: &str, v4: IpAddr) {
    let r = through(client, v4, 100, Duration::from_secs(3), || {
        rc.node_mut("w1").unwrap().restart_containerd().unwrap();
        rc.restart_kubelet("w1").unwrap();
        std::thread::sleep(Duration::from_secs(5));
    });
    r.assert_hitless("w1's containerd and kubelet restarted");
}

/// A worker drained: its pods go, the connections to the other worker's pods stay.
pub(crate) fn worker_drained(rc: &RealCluster, client: &str, v4: IpAddr) {
    let pods = rc.web_pods().unwrap();
    let r = through(client, v4, 100, Duration::from_secs(3), || {
        rc.kubectl(&[
            "drain",
            "w1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
        ])
        .unwrap_or_else(|e| panic!("kubectl drain w1: {e}"));
        rc.kubectl(&["rollout", "status", "deployment/web", "--timeout=120s"])
            .unwrap();
    });
    eprintln!(
        "w1 drained: {} keep-alive requests, {} broken (pods {:?}); {} new connections, {} failed ({:?})",
        r.keepalive.requests,
        r.keepalive.broken,
        r.keepalive
            .broken_pods
            .iter()
            .collect::<std::collections::BTreeSet<_>>(),
        r.requests,
        r.failed,
        r.first_failure
    );
    for p in &r.keepalive.broken_pods {
        assert_eq!(
            pods.get(p).map(String::as_str),
            Some("w1"),
            "a connection to {p}, which was not on the drained node, broke: {:?}",
            r.keepalive.first_error
        );
    }
    let moved = rc.web_pods().unwrap();
    assert!(
        moved.values().all(|n| n != "w1"),
        "pods left on w1: {moved:?}"
    );
    rc.kubectl(&["uncordon", "w1"]).unwrap();
}

/// An edge node cut off: the ToR drops it within the BFD time.
pub(crate) fn edge_cut_off(rc: &RealCluster, v4: IpAddr) {
    let ns = rc.plan.ns("e2");
    let e2 = rc.plan.node("e2").unwrap().v4;
    let t = Instant::now();
    ringlb_e2e::lab::cmd::run(&["ip", "-n", &ns, "link", "set", "eth0", "down"]).unwrap();
    let hops = rc.wait_ecmp(v4, 1, Duration::from_secs(15)).unwrap();
    let took = t.elapsed();
    eprintln!(
        "edge e2 cut off: out of the ToR's ECMP after {} ms ({hops:?})",
        took.as_millis()
    );
    assert!(!hops.contains(&IpAddr::from(e2)), "{hops:?}");
    assert!(
        took < Duration::from_secs(2),
        "BFD is 100 ms x 3; took {took:?}"
    );
    let spread = rc.spread(v4, 10).unwrap();
    eprintln!("through e1 alone: {spread:?}");
}
