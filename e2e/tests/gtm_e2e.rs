//! Cross-region failover end to end: two regions behind a core router, PowerDNS as the
//! global traffic manager probing the edges' per-VIP health endpoints.
//!
//! Each region is the one-region lab's unit (`lab::gtm`): a BIRD ToR, one
//! `ringlb-edge run` (XDP, BGP), two worker nodes running `ringlb-edge node` with a
//! pod each, its own real control plane and ringlb-controller, and a Service `web`
//! with a VIP from the region's pool. The core router (BIRD) hears both regions'
//! VIPs from their ToRs; a client and PowerDNS (`pdns_server`, bind backend, LUA
//! records, `ifurlextup` over `http://EDGE:9090/health/vip/VIP/80`) hang off it.
//!
//! - both regions healthy: the health endpoints answer 200, an unknown VIP 404, and
//!   `dig @pdns app.gtm.test` answers both VIPs; the client reaches both;
//! - every pod of region A killed (processes gone, pods not Ready): region A's edge
//!   answers 503 with a JSON reason, the core loses the route to VIP A, and PowerDNS
//!   answers only VIP B (seconds measured: kill -> 503, 503 -> DNS); VIP B serves;
//! - region A's pods back: 200 again, and the answer includes VIP A again.
//!
//! The failover VIP: Service `fo` (`gtm::FAILOVER_SVC`) exists in both regions, each
//! naming the other's VIP (`ringlb.io/failover-vip`) and accepting it
//! (`ringlb.io/accept-failover-from`):
//! - healthy: each region's `fo` VIP is served by its own pods; with
//!   `ringlb.io/failover-weight=50` region A's is served by both regions' pods;
//! - region A's pods killed: a client that still uses A's `fo` VIP (as one that cached
//!   the DNS answer would) is served by region B's pods (A's edge encapsulates to B's
//!   VIP, B's edge decapsulates), the core keeps routing it to region A, and A's health
//!   page answers 503 naming B's VIP (seconds to recovery measured);
//! - region A back: its own pods serve it again.
//!
//! Needs root, BIRD, nftables, ethtool, `pdns_server` (pdns-server,
//! pdns-backend-bind) and `dig` (bind9-dnsutils); skips loudly otherwise. Needs the
//! binaries (`make test` builds them) and the control plane (`make k8s`).

use std::time::{Duration, Instant};

use ringlb_e2e::lab::cluster::EDGE_HTTP_PORT;
use ringlb_e2e::lab::gtm::{self, Core, GtmLab};
use ringlb_e2e::lab::pdns::{self, PowerDns};
use ringlb_e2e::lab::{self, Bins, Topology, cmd};

/// Which region's pod answered a GET of `vip` from the client ("a" or "b"), by the
/// pod address in the body; a failed GET (1 s at most) is an error.
fn served_by(core: &Core, vip: &str) -> Result<&'static str, String> {
    served_by_in(&core.ns("client"), vip, "1")
}

/// [`served_by`] from namespace `ns`, giving up on the connection after
/// `connect_timeout` seconds.
fn served_by_in(ns: &str, vip: &str, connect_timeout: &str) -> Result<&'static str, String> {
    let url = format!("http://{vip}/");
    let argv = [
        "curl",
        "--noproxy",
        "*",
        "-sS",
        "--connect-timeout",
        connect_timeout,
        "--max-time",
        "1",
        &url,
    ];
    let body = cmd::run_in(ns, &argv).map_err(|e| e.to_string())?;
    if body.contains(" 10.210.") {
        Ok("a")
    } else if body.contains(" 10.220.") {
        Ok("b")
    } else {
        Err(format!("an answer from neither region: {body}"))
    }
}

/// Waits until `n` GETs of `vip` in a row are served by `region`'s pods.
fn wait_served_by(core: &Core, vip: &str, region: &str, n: usize, limit: Duration) {
    let mut streak = 0;
    lab::wait_for(
        &format!("{n} GETs of {vip} in a row served by region {region}"),
        limit,
        Duration::from_millis(50),
        || {
            let got = served_by(core, vip);
            streak = if got.as_deref() == Ok(region) {
                streak + 1
            } else {
                0
            };
            Ok(if streak >= n {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            })
        },
    )
    .unwrap()
}

fn bins() -> Bins {
    Bins::beside(std::path::Path::new(env!("CARGO_BIN_EXE_ringlb-lab")))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn skip_reason() -> Option<String> {
    lab::skip_reason().or_else(|| {
        [("pdns_server", "pdns-server"), ("dig", "bind9-dnsutils")]
            .into_iter()
            .find(|(tool, _)| cmd::which(tool).is_none())
            .map(|(tool, pkg)| format!("`{tool}` is not installed ({pkg}; scripts/setup.sh)"))
    })
}

/// The health URL of region `topo`'s first edge for `vip`.
fn health(topo: &Topology, vip: &str) -> String {
    pdns::health_url(&topo.addrs.edges[0], EDGE_HTTP_PORT, vip, topo.addrs.port)
}

/// Waits until the health endpoint at `url` (asked from the DNS namespace, as
/// PowerDNS asks) answers `code`; returns the body.
fn wait_health(core: &Core, url: &str, code: u16, limit: Duration) -> String {
    lab::wait_for(
        &format!("{url} to answer {code}"),
        limit,
        Duration::from_millis(50),
        || {
            let (c, body) = core.http_status("dns", url)?;
            Ok(if c == code {
                Ok(body)
            } else {
                Err(format!("{c} {body}"))
            })
        },
    )
    .unwrap()
}

const HOLD: u64 = gtm::HOLD_DOWN_S;

/// What the GTM saw at one instant: region A's health code and the DNS answer.
#[derive(Debug)]
#[allow(dead_code)] // printed on failure
struct Sample {
    at: Instant,
    code: u16,
    answer: Vec<String>,
}

/// Samples region A's health URL and the DNS answer until `va` is in the answer for
/// two samples in a row, or `limit` passes.
fn sample_until_a_is_back(
    core: &Core,
    dns: &PowerDns,
    health_a: &str,
    va: &str,
    limit: Duration,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut out: Vec<Sample> = Vec::new();
    while start.elapsed() < limit {
        let code = core.http_status("dns", health_a).map_or(0, |(c, _)| c);
        let answer = dns.app_addresses(&core.ns("client")).unwrap_or_default();
        let back = answer.iter().any(|a| a == va);
        out.push(Sample {
            at: Instant::now(),
            code,
            answer,
        });
        let n = out.len();
        if back && n >= 2 && out[n - 2].answer.iter().any(|a| a == va) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out
}

/// Waits until PowerDNS answers exactly `want` (sorted) for app.gtm.test.
fn wait_dns(core: &Core, dns: &PowerDns, want: &[&str], limit: Duration) {
    lab::wait_for(
        &format!("dig {} to answer {want:?}", pdns::APP),
        limit,
        Duration::from_millis(50),
        || {
            let got = dns.app_addresses(&core.ns("client"))?;
            Ok(if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            })
        },
    )
    .unwrap()
}

#[test]
fn powerdns_answers_only_the_healthy_region_and_takes_a_back() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED gtm_e2e: {why}");
        return;
    }
    let bins = bins();
    let start = Instant::now();
    let pid = std::process::id();
    let prefix = format!("rlg{pid}");
    let dir = std::env::temp_dir().join(format!("ringlb-gtm-test-{pid}"));
    // declared first, dropped last: daemons stop before their namespaces go
    let t = Instant::now();
    let mut g = GtmLab::up(&prefix, &dir, &bins).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "two regions, core and PowerDNS up in {:?}: VIP A {}, VIP B {}",
        t.elapsed(),
        g.va,
        g.vb
    );
    both_regions_serve_and_pdns_answers_both(&g);
    failover_vips_serve_locally_and_trickle(&g);
    region_a_loses_its_pods(&mut g);
    region_a_comes_back_after_the_hold_down(&mut g);
    anycast_is_depreferred_below_its_threshold(&mut g);
    eprintln!("gtm e2e done in {:?}", start.elapsed());
}

/// Both regions healthy: routes, traffic, health 200 / 404, both VIPs in DNS.
fn both_regions_serve_and_pdns_answers_both(g: &GtmLab) {
    let (core, dns, topo_a, topo_b) = (&g.core, &g.dns, &g.topo_a, &g.topo_b);
    let (va, vb) = (g.va.clone(), g.vb.clone());
    let (tor_a, tor_b) = (
        topo_a.addrs.tor_client_side.as_str(),
        topo_b.addrs.tor_client_side.as_str(),
    );
    for vip in [&va, &vb] {
        let body = core.http_get(&format!("http://{vip}/")).unwrap();
        assert!(body.starts_with("pod"), "the client reaches {vip}: {body}");
    }
    // the anycast VIP: both regions announce it, the core spreads over both ToRs
    core.wait_route(gtm::ANYCAST_VIP, &[tor_a, tor_b], Duration::from_secs(20))
        .unwrap();

    // the health endpoints, as PowerDNS sees them
    let (ha, hb) = (health(topo_a, &va), health(topo_b, &vb));
    wait_health(core, &ha, 200, Duration::from_secs(15));
    wait_health(core, &hb, 200, Duration::from_secs(15));
    let unknown = health(topo_a, "10.210.100.99");
    let (code, body) = core.http_status("dns", &unknown).unwrap();
    assert_eq!(code, 404, "an unknown VIP is 404: {body}");
    wait_dns(core, dns, &[&va, &vb], Duration::from_secs(5));
}

/// Each region's `fo` VIP is served by its own pods; with a failover weight of 50 %
/// region A's is served by both regions' pods, and only by its own again without it.
fn failover_vips_serve_locally_and_trickle(g: &GtmLab) {
    let core = &g.core;
    wait_served_by(core, &g.fa, "a", 5, Duration::from_secs(15));
    wait_served_by(core, &g.fb, "b", 5, Duration::from_secs(15));
    let svc = gtm::FAILOVER_SVC;
    g.ca.kubectl(&["annotate", "svc", svc, "ringlb.io/failover-weight=50"])
        .unwrap();
    let (mut a, mut b, mut failed) = (0, 0, Vec::new());
    lab::wait_for(
        "GETs of region A's fo VIP served by both regions",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            match served_by(core, &g.fa) {
                Ok("a") => a += 1,
                Ok(_) => b += 1,
                Err(e) => failed.push(e),
            }
            Ok(if a >= 3 && b >= 3 {
                Ok(())
            } else {
                Err(format!("a {a}, b {b}"))
            })
        },
    )
    .unwrap();
    eprintln!(
        "failover weight 50: region A's fo VIP served {a} times by A, {b} by B; {} failed GETs {failed:?}",
        failed.len()
    );
    assert!(failed.len() <= 1, "a trickle loses no GETs: {failed:?}");
    g.ca.kubectl(&["annotate", "svc", svc, "ringlb.io/failover-weight-"])
        .unwrap();
    wait_served_by(core, &g.fa, "a", 10, Duration::from_secs(15));
}

/// Region A's pods killed: 503, only VIP B in DNS, routes move; the figures.
fn region_a_loses_its_pods(g: &mut GtmLab) {
    let (core, dns, topo_a, topo_b) = (&g.core, &g.dns, &g.topo_a, &g.topo_b);
    let ca = &mut g.ca;
    let (va, vb) = (g.va.clone(), g.vb.clone());
    let tor_b = topo_b.addrs.tor_client_side.as_str();
    let (ha, hb) = (health(topo_a, &va), health(topo_b, &vb));
    // region A loses every pod
    let t0 = Instant::now();
    for i in 1..=topo_a.addrs.pods.len() {
        ca.kill(&format!("pod{i}")).unwrap();
    }
    ca.set_pods_ready("web", false).unwrap();
    // watch everything at once: health, DNS, the core's routes
    let (mut to_503, mut to_dns, mut to_any, mut to_gone) = (None, None, None, None);
    let mut reason = String::new();
    let client = core.ns("client");
    let (want_b, want_any): (Vec<String>, Vec<std::net::IpAddr>) =
        (vec![vb.clone()], vec![tor_b.parse().unwrap()]);
    // a client that cached region A's fo VIP, in its own thread: a GET that waits
    // for its timeout must not slow the sampling below
    let failover = std::thread::spawn({
        let (client, fa) = (core.ns("client"), g.fa.clone());
        move || {
            while t0.elapsed() < Duration::from_secs(45) {
                // a SYN lost while A's pods go costs 0.2 s here, not the 1 s RTO
                if served_by_in(&client, &fa, "0.2") == Ok("b") {
                    return Some(t0.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        }
    });
    lab::wait_for(
        "region A's 503, only VIP B in DNS, the core's routes moved",
        Duration::from_secs(45),
        Duration::from_millis(50),
        || {
            if to_503.is_none() {
                let (code, body) = core.http_status("dns", &ha)?;
                if code == 503 {
                    (to_503, reason) = (Some(t0.elapsed()), body);
                }
            }
            if to_dns.is_none() && dns.app_addresses(&client)? == want_b {
                to_dns = Some(t0.elapsed());
            }
            if to_any.is_none() && core.next_hops(gtm::ANYCAST_VIP)? == want_any {
                to_any = Some(t0.elapsed());
            }
            if to_gone.is_none() && core.next_hops(&va)?.is_empty() {
                to_gone = Some(t0.elapsed());
            }
            let all = [to_503, to_dns, to_any, to_gone];
            Ok(if all.iter().all(Option::is_some) {
                Ok(())
            } else {
                Err(format!("503/DNS/anycast/VIP A route after {all:?}"))
            })
        },
    )
    .unwrap();
    let (to_503, to_dns, to_any, to_gone) = (
        to_503.unwrap(),
        to_dns.unwrap(),
        to_any.unwrap(),
        to_gone.unwrap(),
    );
    let to_fo = failover
        .join()
        .unwrap()
        .expect("region A's fo VIP served by region B within 45 s");
    a_cached_client_is_served_through_the_failover_vip(g, to_fo);
    let json: serde_json::Value = serde_json::from_str(reason.trim())
        .unwrap_or_else(|e| panic!("the 503 body is JSON ({e}): {reason}"));
    eprintln!(
        "region A lost its pods: 503 after {to_503:?} ({json}); dig answers only VIP B after {to_dns:?} \
         (probe interval {} s); the core's route to VIP A gone after {to_gone:?}, the anycast VIP only via region B after {to_any:?}",
        pdns::CHECK_INTERVAL_S
    );
    let dns_lag = to_dns.saturating_sub(to_503);
    assert!(
        dns_lag <= Duration::from_secs(3 * pdns::CHECK_INTERVAL_S + 2),
        "PowerDNS followed the health endpoint within a few probe intervals: {dns_lag:?}"
    );
    wait_health(core, &hb, 200, Duration::from_secs(5));
    for _ in 0..5 {
        let body = core.http_get(&format!("http://{vb}/")).unwrap();
        assert!(body.starts_with("pod"), "VIP B serves: {body}");
    }
    // a client holding the anycast address is served by region B
    for _ in 0..5 {
        let body = core
            .http_get(&format!("http://{}/", gtm::ANYCAST_VIP))
            .unwrap();
        assert!(
            body.contains(&format!("10.{}.", topo_b.addrs.net)),
            "the anycast VIP is served by a region B pod: {body}"
        );
    }
}

/// While region A has no pods: its `fo` VIP stays routed to region A, its health page
/// says it fails over to B's VIP, and every GET of it is served by region B.
fn a_cached_client_is_served_through_the_failover_vip(g: &GtmLab, after: Duration) {
    let (core, topo_a) = (&g.core, &g.topo_a);
    let tor_a: std::net::IpAddr = topo_a.addrs.tor_client_side.parse().unwrap();
    assert_eq!(
        core.next_hops(&g.fa).unwrap(),
        vec![tor_a],
        "a VIP that fails over stays announced by its region"
    );
    let body = wait_health(core, &health(topo_a, &g.fa), 503, Duration::from_secs(10));
    assert!(
        body.contains(&g.fb),
        "the 503 names the failover VIP: {body}"
    );
    for _ in 0..10 {
        assert_eq!(
            served_by(core, &g.fa),
            Ok("b"),
            "region B serves VIP {}",
            g.fa
        );
    }
    eprintln!(
        "failover VIP: a client of region A's {} served by region B's pods {after:?} after the kill; health: {}",
        g.fa,
        body.trim()
    );
}

/// Region A's pods back, flapping faster than the hold-down: no flapping of health
/// or DNS; VIP A returns after the hold-down.
fn region_a_comes_back_after_the_hold_down(g: &mut GtmLab) {
    let (core, dns, topo_a, topo_b) = (&g.core, &g.dns, &g.topo_a, &g.topo_b);
    let ca = &mut g.ca;
    let (va, vb) = (g.va.clone(), g.vb.clone());
    let (tor_a, tor_b) = (
        topo_a.addrs.tor_client_side.as_str(),
        topo_b.addrs.tor_client_side.as_str(),
    );
    let ha = health(topo_a, &va);
    // region A comes back, its pods flapping (Ready, not Ready, Ready) faster than the
    // hold-down: PowerDNS must not hand out VIP A until the hold-down after the last
    for i in 1..=topo_a.addrs.pods.len() {
        ca.start_pod(i).unwrap();
    }
    let t2 = Instant::now();
    let samples = std::thread::scope(|s| {
        let flap = s.spawn(|| {
            for ready in [true, false, true] {
                ca.set_pods_ready("web", ready).unwrap();
                std::thread::sleep(Duration::from_millis(1500));
            }
            Instant::now() - Duration::from_millis(1500)
        });
        let samples = sample_until_a_is_back(core, dns, &ha, &va, Duration::from_secs(60));
        (flap.join().unwrap(), samples)
    });
    let (last_ready, samples) = samples;
    let first_back = samples
        .iter()
        .find(|s| s.answer.contains(&va))
        .map(|s| s.at)
        .expect("VIP A back in the DNS answer");
    let first_200 = samples.iter().find(|s| s.code == 200).map(|s| s.at);
    let flapping: Vec<&Sample> = samples
        .iter()
        // a sample whose curl or dig failed (loaded machine) is no evidence either way
        .filter(|s| s.at < last_ready && (s.code == 200 || s.answer.contains(&va)))
        .collect();
    eprintln!(
        "region A back: pods flapped for {:?}; after the last Ready, 200 after {:?} and VIP A in the DNS answer after {:?} (hold-down {HOLD} s); {} samples",
        last_ready - t2,
        first_200.map(|t| t.saturating_duration_since(last_ready)),
        first_back.saturating_duration_since(last_ready),
        samples.len(),
    );
    assert!(
        flapping.is_empty(),
        "no flapping while the pods flap: never 200, never VIP A in DNS: {flapping:?}"
    );
    assert!(
        first_back >= last_ready + Duration::from_secs(HOLD) - Duration::from_millis(500),
        "VIP A returns only after the hold-down"
    );
    wait_dns(core, dns, &[&va, &vb], Duration::from_secs(15));
    core.wait_route(&va, &[tor_a], Duration::from_secs(15))
        .unwrap();
    core.wait_route(gtm::ANYCAST_VIP, &[tor_a, tor_b], Duration::from_secs(15))
        .unwrap();
    let body = core.http_get(&format!("http://{va}/")).unwrap();
    assert!(body.starts_with("pod"), "VIP A serves again: {body}");
    wait_served_by(core, &g.fa, "a", 10, Duration::from_secs(20));
}

/// The de-preference variant: region A's anycast Service asks for 2 ready backends
/// and `prepend=3` below that; with one of A's pods gone, A still announces the
/// anycast VIP, but with a longer AS path, so the core routes it only to region B.
/// `web` (threshold 1) stays healthy in A, and DNS keeps answering both regions.
fn anycast_is_depreferred_below_its_threshold(g: &mut GtmLab) {
    let (core, dns, topo_a) = (&g.core, &g.dns, &g.topo_a);
    let (tor_a, tor_b) = (
        topo_a.addrs.tor_client_side.as_str(),
        g.topo_b.addrs.tor_client_side.as_str(),
    );
    let ca = &mut g.ca;
    let any_a = health(topo_a, gtm::ANYCAST_VIP);
    ca.kubectl(&[
        "annotate",
        "svc",
        "anycast",
        "ringlb.io/min-ready-backends=2",
        "ringlb.io/unhealthy-bgp=prepend=3",
        "--overwrite",
    ])
    .unwrap();
    // pod1 of region A dies: its process and its readiness
    let pods = ca
        .kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}"#,
        ])
        .unwrap();
    let pod1 = pods
        .lines()
        .find_map(|l| l.strip_suffix(&format!(" {}", topo_a.addrs.pods[0])))
        .unwrap_or_else(|| panic!("pod1 of region A in {pods}"))
        .to_string();
    let t0 = Instant::now();
    ca.kill("pod1").unwrap();
    let ann = "lab.ringlb.io/ready=false";
    ca.kubectl(&["annotate", "pod", &pod1, ann, "--overwrite"])
        .unwrap();
    let body = wait_health(core, &any_a, 503, Duration::from_secs(30));
    let json: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(json["depreferred"], true, "{json}");
    assert_eq!(json["readyBackends"], 1, "{json}");
    core.wait_route(gtm::ANYCAST_VIP, &[tor_b], Duration::from_secs(15))
        .unwrap();
    let moved = t0.elapsed();
    // BIRD at the core still knows region A's (longer) path: de-preferred, not gone
    let bird = core
        .birdc(&["show", "route", "for", gtm::ANYCAST_VIP, "all"])
        .unwrap();
    assert!(
        bird.contains(tor_a) && bird.contains(tor_b),
        "the core has both paths: {bird}"
    );
    wait_dns(core, dns, &[&g.va, &g.vb], Duration::from_secs(5));
    eprintln!(
        "anycast de-preferred in region A (1 of 2 pods, prepend=3): the core routes it only to region B {moved:?} after the kill; {json}"
    );
}
