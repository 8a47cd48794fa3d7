//! The pure decisions about one VIP:port: what its route should be ([`verdict`],
//! [`route`]) and what the health URL answers about it ([`assess`], [`aggregate`]).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ringlb_bgp::reach::Reach;
use ringlb_bgp::{Deprefer, RouteAttrs};
use ringlb_datapath::Vip;
use serde::Serialize;

use super::hysteresis::Phase;
use super::policy::{Below, HealthPolicy};

/// What the edge knows about one VIP:port after a sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    pub vip: Vip,
    /// `namespace/name` of the Service.
    pub service: String,
    /// Ready backends (the ones in the Maglev table).
    pub ready: u32,
    /// The datapath holds an entry for the VIP:port.
    pub programmed: bool,
    pub policy: HealthPolicy,
    /// Where the VIP:port is in its hold-down.
    pub phase: Phase,
    /// The failover VIP (`ringlb.io/failover-vip`) of this VIP:port, if any.
    pub failover: Option<IpAddr>,
    /// Terminating endpoints still serving that take new flows because none is
    /// ready (Kubernetes' rule for terminating endpoints, KEP-1669; without a
    /// failover VIP, which takes them then); 0 while one is ready.
    pub serving_terminating: u32,
}

impl PortFacts {
    /// Programmed, with enough ready backends: what the hold-down is fed.
    pub fn good(&self) -> bool {
        self.programmed && self.ready >= self.policy.min_ready
    }

    /// Programmed with no ready local backend: new flows go to the failover VIP.
    pub fn failing_over(&self) -> Option<IpAddr> {
        self.failover.filter(|_| self.programmed && self.ready == 0)
    }

    /// Programmed with no ready backend, new flows going to terminating ones that
    /// still serve.
    pub fn serving_from_terminating(&self) -> bool {
        self.programmed
            && self.ready == 0
            && self.failover.is_none()
            && self.serving_terminating > 0
    }
}

/// What one VIP:port asks of its address's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Serve,
    Deprefer(Deprefer),
    Withdraw,
}

/// The route one VIP:port asks for: withdrawn without a ready backend or a datapath
/// entry (nothing could serve it), as announced while healthy, as its policy says
/// below its threshold or during the hold-down.
///
/// A programmed VIP:port with a failover VIP always has somewhere to send new flows
/// (its pods or the remote VIP), so it is never withdrawn for its health: clients that
/// cached its address keep reaching this region's edges, which forward to the remote
/// VIP. `ringlb.io/unhealthy-bgp`'s `withdraw` reads as "announce" for it; a
/// de-preference still applies below the threshold. The GTM learns from the health
/// page (503 `failing over to ...`), not from BGP.
///
/// So does one with no ready backend whose terminating endpoints still serve: they
/// take its new flows (Kubernetes' rule when no endpoint is ready), so it stays
/// announced, as it is, while the page answers 503.
pub fn verdict(f: &PortFacts) -> Verdict {
    if f.serving_from_terminating() {
        return Verdict::Serve;
    }
    if !f.programmed || (f.ready == 0 && f.failover.is_none()) {
        return Verdict::Withdraw;
    }
    if f.phase == Phase::Healthy {
        return Verdict::Serve;
    }
    match f.policy.below {
        Below::Withdraw if f.failover.is_some() => Verdict::Serve,
        Below::Withdraw => Verdict::Withdraw,
        Below::Deprefer(d) => Verdict::Deprefer(d),
    }
}

/// The route of one address from the verdicts of its VIP:ports (Services sharing the
/// VIP, several ports): withdrawn when every port asks so; else announced, de-preferred
/// by the strongest de-preference any port asks for.
pub fn route(verdicts: impl IntoIterator<Item = Verdict>) -> Option<RouteAttrs> {
    let mut announce = false;
    let mut deprefer: Option<Deprefer> = None;
    for v in verdicts {
        match v {
            Verdict::Withdraw => {}
            Verdict::Serve => announce = true,
            Verdict::Deprefer(d) => {
                announce = true;
                deprefer = Some(deprefer.map_or(d, |m| m.merge(d)));
            }
        }
    }
    announce.then_some(RouteAttrs {
        deprefer,
        ..Default::default()
    })
}

/// The health URL's three answers; only `healthy` is a 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Down,
    Degraded,
    Healthy,
}

/// The body of `/health/vip/<ip>[/<port>]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub vip: IpAddr,
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<&'static str>,
    pub service: String,
    pub programmed: bool,
    /// A router has the route: it was sent in an UPDATE to at least one Established
    /// peer (which implies the family was negotiated and a `BGPAdvertisement`
    /// selects it for that peer; `ringlb_bgp::reach`).
    pub announced: bool,
    pub depreferred: bool,
    pub ready_backends: u32,
    pub min_ready: u32,
    pub state: State,
    pub reason: String,
    /// The failover VIP (`ringlb.io/failover-vip`), when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover_vip: Option<IpAddr>,
    /// New flows go to the failover VIP: no ready local backend.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub failing_over: bool,
    /// Every VIP:port the answer covers, when it covers more than one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Report>,
    /// Why no router has a route this edge would announce, when the cause is the
    /// Service's own (`NoAdvertisement`, `FamilyNotNegotiated`; not a session that is
    /// down, which every VIP shares): for the Warning Event. Not in the page.
    #[serde(skip)]
    pub unannounced: Option<Reach>,
}

impl Report {
    pub fn http_status(&self) -> u16 {
        if self.state == State::Healthy {
            200
        } else {
            503
        }
    }
}

/// What the health URL says about one VIP:port, given its address's route and
/// whether a router has it, at `now`.
pub fn assess(f: &PortFacts, route: Option<&RouteAttrs>, reach: Reach, now: Instant) -> Report {
    let depreferred = route.is_some_and(|r| r.deprefer.is_some());
    let (min, ready) = (f.policy.min_ready, f.ready);
    let counts = format!("{ready} ready backends, {min} required");
    let recovering = match f.phase {
        Phase::Recovering { since } => Some(format!(
            "recovering: good for {} of the {} hold-down",
            secs(now.saturating_duration_since(since)),
            secs(f.policy.hold_down)
        )),
        _ => None,
    };
    let (state, reason) = if let Some(r) = f.failing_over() {
        let why = format!("failing over to {r}: no ready local backends ({min} required)");
        (State::Down, why)
    } else if f.serving_from_terminating() {
        let why = format!(
            "no ready backends ({min} required); {} terminating ones still serving take new flows",
            f.serving_terminating
        );
        (State::Down, why)
    } else if ready == 0 {
        (State::Down, format!("no ready backends ({min} required)"))
    } else if !f.programmed {
        (State::Down, "not programmed in the datapath".to_string())
    } else if route.is_none() {
        let why = recovering.unwrap_or(counts);
        (State::Down, format!("route withdrawn: {why}"))
    } else if !reach.announced() {
        (State::Down, reach.message())
    } else if ready < min || recovering.is_some() {
        let why = if ready < min {
            counts
        } else {
            recovering.unwrap_or_default()
        };
        let tail = if depreferred {
            "; route de-preferred"
        } else {
            ""
        };
        (State::Degraded, format!("{why}{tail}"))
    } else if depreferred {
        let why = "route de-preferred: another port of this VIP is below its threshold";
        (State::Degraded, why.into())
    } else {
        (State::Healthy, "ok".into())
    };
    Report {
        vip: f.vip.addr,
        port: Some(f.vip.port),
        protocol: Some(proto_name(f.vip.proto)),
        service: f.service.clone(),
        programmed: f.programmed,
        announced: route.is_some() && reach.announced(),
        unannounced: match reach {
            Reach::NotSelected | Reach::FamilyNotNegotiated(_)
                if route.is_some() && f.programmed =>
            {
                Some(reach)
            }
            _ => None,
        },
        depreferred,
        ready_backends: ready,
        min_ready: min,
        state,
        reason,
        failover_vip: f.failover,
        failing_over: f.failing_over().is_some(),
        ports: Vec::new(),
    }
}

/// One answer for several VIP:ports (every port of an address, or TCP and UDP of one
/// port): as healthy as the worst of them, which also gives the reason. `parts` must
/// not be empty; a single part is returned as it is.
pub fn aggregate(vip: IpAddr, port: Option<u16>, mut parts: Vec<Report>) -> Report {
    if parts.len() == 1 {
        return parts.remove(0);
    }
    let worst = parts
        .iter()
        .min_by_key(|r| (r.state, r.ready_backends))
        .cloned()
        .unwrap_or_else(|| unknown(vip, port));
    let mut services: Vec<&str> = parts.iter().map(|r| r.service.as_str()).collect();
    services.sort_unstable();
    services.dedup();
    let reason = match (worst.state, worst.port, worst.protocol) {
        (State::Healthy, ..) => "ok".to_string(),
        (_, Some(p), Some(proto)) => format!("port {p}/{proto}: {}", worst.reason),
        _ => worst.reason.clone(),
    };
    Report {
        vip,
        port,
        protocol: None,
        service: services.join(","),
        programmed: parts.iter().all(|r| r.programmed),
        announced: parts.iter().all(|r| r.announced),
        depreferred: parts.iter().any(|r| r.depreferred),
        ready_backends: worst.ready_backends,
        min_ready: worst.min_ready,
        state: worst.state,
        reason,
        failover_vip: worst.failover_vip,
        failing_over: parts.iter().any(|r| r.failing_over),
        unannounced: parts.iter().find_map(|r| r.unannounced),
        ports: parts,
    }
}

fn unknown(vip: IpAddr, port: Option<u16>) -> Report {
    Report {
        vip,
        port,
        protocol: None,
        service: String::new(),
        programmed: false,
        announced: false,
        depreferred: false,
        ready_backends: 0,
        min_ready: 0,
        state: State::Down,
        reason: "unknown".into(),
        failover_vip: None,
        failing_over: false,
        ports: Vec::new(),
        unannounced: None,
    }
}

fn proto_name(p: ringlb_datapath::Proto) -> &'static str {
    match p {
        ringlb_datapath::Proto::Tcp => "TCP",
        ringlb_datapath::Proto::Udp => "UDP",
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlb_datapath::Proto;

    fn facts(ready: u32, min: u32, phase: Phase, below: Below) -> PortFacts {
        PortFacts {
            vip: Vip {
                addr: "192.0.2.1".parse().unwrap(),
                port: 80,
                proto: Proto::Tcp,
            },
            service: "default/web".into(),
            ready,
            programmed: true,
            policy: HealthPolicy {
                min_ready: min,
                below,
                hold_down: Duration::from_secs(30),
            },
            phase,
            failover: None,
            serving_terminating: 0,
        }
    }

    const PREPEND: Below = Below::Deprefer(Deprefer {
        prepend: 3,
        med: None,
        local_pref: None,
    });

    /// assess() over the route the facts themselves ask for, with one session up.
    fn alone(f: &PortFacts) -> Report {
        let r = route([verdict(f)]);
        assess(f, r.as_ref(), Reach::Sent, Instant::now())
    }

    #[test]
    fn healthy_only_when_programmed_announced_and_enough_ready() {
        let f = facts(3, 2, Phase::Healthy, Below::Withdraw);
        assert_eq!(verdict(&f), Verdict::Serve);
        let r = alone(&f);
        assert_eq!(
            (r.state, r.http_status(), r.reason.as_str()),
            (State::Healthy, 200, "ok")
        );
        assert!(r.announced && r.programmed && !r.depreferred);
        // No BGP session: the route reaches nobody.
        let r = assess(
            &f,
            route([verdict(&f)]).as_ref(),
            Reach::NoSession,
            Instant::now(),
        );
        assert_eq!((r.state, r.http_status()), (State::Down, 503));
        assert!(r.reason.contains("no BGP session"), "{}", r.reason);
        assert!(!r.announced);
        // Sessions up but none sent it: no advertisement selects it, or no session
        // carries its family. Neither is announced; both answer 503 and say why.
        let r = assess(
            &f,
            route([verdict(&f)]).as_ref(),
            Reach::NotSelected,
            Instant::now(),
        );
        assert_eq!(
            (r.state, r.http_status(), r.announced),
            (State::Down, 503, false)
        );
        assert!(
            r.reason.contains("no BGPAdvertisement selects"),
            "{}",
            r.reason
        );
        let v6 = Reach::FamilyNotNegotiated(ringlb_bgp::codec::Afi::Ipv6);
        let r = assess(&f, route([verdict(&f)]).as_ref(), v6, Instant::now());
        assert_eq!((r.state, r.announced), (State::Down, false));
        assert!(r.reason.contains("negotiated IPv6"), "{}", r.reason);
        // Not programmed: withdrawn whatever the backends.
        let f = PortFacts {
            programmed: false,
            ..f
        };
        assert_eq!(verdict(&f), Verdict::Withdraw);
        assert_eq!(alone(&f).reason, "not programmed in the datapath");
    }

    #[test]
    fn below_the_threshold_withdraws_or_deprefers_as_configured() {
        let f = facts(1, 2, Phase::Unhealthy, Below::Withdraw);
        assert_eq!(route([verdict(&f)]), None);
        let r = alone(&f);
        assert_eq!(r.state, State::Down);
        assert_eq!(r.reason, "route withdrawn: 1 ready backends, 2 required");
        let f = facts(1, 2, Phase::Unhealthy, PREPEND);
        let attrs = route([verdict(&f)]).unwrap();
        assert_eq!(attrs.deprefer.unwrap().prepend, 3);
        let r = alone(&f);
        assert_eq!((r.state, r.http_status()), (State::Degraded, 503));
        assert_eq!(r.reason, "1 ready backends, 2 required; route de-preferred");
        assert!(r.depreferred && r.announced);
        // No ready backend at all: withdrawn even under a de-prefer policy.
        let f = facts(0, 2, Phase::Unhealthy, PREPEND);
        assert_eq!(route([verdict(&f)]), None);
        assert_eq!(alone(&f).reason, "no ready backends (2 required)");
    }

    #[test]
    fn terminating_endpoints_that_still_serve_keep_the_route_when_none_is_ready() {
        let f = PortFacts {
            serving_terminating: 2,
            ..facts(0, 1, Phase::Unhealthy, Below::Withdraw)
        };
        // announced as it is, under `withdraw` and a de-preference alike
        assert_eq!(verdict(&f), Verdict::Serve);
        let g = PortFacts {
            serving_terminating: 2,
            ..facts(0, 1, Phase::Unhealthy, PREPEND)
        };
        assert_eq!(verdict(&g), Verdict::Serve);
        // the page says so with a 503, for a GTM to move away
        let r = alone(&f);
        assert_eq!(
            (r.state, r.http_status(), r.announced),
            (State::Down, 503, true)
        );
        assert_eq!(
            r.reason,
            "no ready backends (1 required); 2 terminating ones still serving take new flows"
        );
        // not programmed: withdrawn all the same
        let h = PortFacts {
            programmed: false,
            ..f
        };
        assert_eq!(verdict(&h), Verdict::Withdraw);
    }

    #[test]
    fn a_failover_vip_keeps_the_route_but_not_a_de_preference_away() {
        let remote: IpAddr = "198.51.100.7".parse().unwrap();
        let with = |ready, phase, below| PortFacts {
            failover: Some(remote),
            ..facts(ready, 2, phase, below)
        };
        // Failing over: announced under `withdraw`, de-preferred under a de-preference.
        assert_eq!(
            verdict(&with(0, Phase::Unhealthy, Below::Withdraw)),
            Verdict::Serve
        );
        let d = verdict(&with(0, Phase::Unhealthy, PREPEND));
        assert!(matches!(d, Verdict::Deprefer(p) if p.prepend == 3), "{d:?}");
        assert_eq!(
            verdict(&with(1, Phase::Unhealthy, Below::Withdraw)),
            Verdict::Serve
        );
        // Not programmed: nothing can forward it, withdrawn as always.
        let f = PortFacts {
            programmed: false,
            ..with(0, Phase::Unhealthy, Below::Withdraw)
        };
        assert_eq!(verdict(&f), Verdict::Withdraw);
        assert_eq!(f.failing_over(), None);
        let r = alone(&with(0, Phase::Unhealthy, PREPEND));
        assert_eq!((r.state, r.http_status()), (State::Down, 503));
        assert!(
            r.reason.starts_with("failing over to 198.51.100.7"),
            "{}",
            r.reason
        );
        assert!(r.depreferred && r.failing_over);
    }

    #[test]
    fn recovering_is_degraded_and_says_how_far() {
        let now = Instant::now();
        let since = now - Duration::from_secs(4);
        let f = facts(2, 2, Phase::Recovering { since }, PREPEND);
        let r = assess(&f, route([verdict(&f)]).as_ref(), Reach::Sent, now);
        assert_eq!(r.state, State::Degraded);
        assert_eq!(
            r.reason,
            "recovering: good for 4.0s of the 30.0s hold-down; route de-preferred"
        );
        let f = facts(2, 2, Phase::Recovering { since }, Below::Withdraw);
        let r = assess(&f, route([verdict(&f)]).as_ref(), Reach::Sent, now);
        assert_eq!(r.state, State::Down);
        assert!(
            r.reason.starts_with("route withdrawn: recovering"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn one_route_per_address_from_all_its_ports() {
        let d = |prepend, med| Deprefer {
            prepend,
            med,
            local_pref: None,
        };
        use Verdict::{Serve, Withdraw};
        assert_eq!(route([Withdraw, Withdraw]), None);
        assert_eq!(route([Withdraw, Serve]).unwrap().deprefer, None);
        let merged = route([
            Serve,
            Verdict::Deprefer(d(2, None)),
            Verdict::Deprefer(d(1, Some(9))),
        ]);
        assert_eq!(merged.unwrap().deprefer, Some(d(2, Some(9))));
    }

    #[test]
    fn the_aggregate_is_as_good_as_its_worst_port() {
        let ok = alone(&facts(3, 1, Phase::Healthy, Below::Withdraw));
        let mut low = facts(1, 2, Phase::Unhealthy, PREPEND);
        low.vip.port = 443;
        let low = assess(
            &low,
            route([Verdict::Serve]).as_ref(),
            Reach::Sent,
            Instant::now(),
        );
        let a = aggregate(ok.vip, None, vec![ok.clone(), low]);
        assert_eq!(
            (a.state, a.ready_backends, a.min_ready),
            (State::Degraded, 1, 2)
        );
        assert_eq!(a.reason, "port 443/TCP: 1 ready backends, 2 required");
        assert_eq!(a.ports.len(), 2);
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["state"], "degraded");
        assert_eq!(json["readyBackends"], 1);
        assert_eq!(json["port"], serde_json::Value::Null);
        assert_eq!(json["ports"][0]["protocol"], "TCP");
        let one = aggregate(ok.vip, Some(80), vec![ok.clone()]);
        assert_eq!(one, ok);
        let j = serde_json::to_value(&one).unwrap();
        assert!(j.get("ports").is_none(), "{j}");
        for key in [
            "vip",
            "port",
            "programmed",
            "announced",
            "readyBackends",
            "minReady",
            "state",
            "reason",
        ] {
            assert!(j.get(key).is_some(), "{key} missing in {j}");
        }
    }
}
