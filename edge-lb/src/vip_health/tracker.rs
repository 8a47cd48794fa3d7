//! The hold-down of every VIP:port the edge serves, stepped once per sync: the
//! desired backends and what the datapath holds in, the routes to announce (with
//! their de-preference) and the facts the health URL reads out. Pure: time is an
//! argument.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use ipnetwork::IpNetwork;
use ringlb_bgp::RouteAttrs;
use ringlb_datapath::{DesiredState, Vip};

use super::assess::{PortFacts, route, verdict};
use super::hysteresis::{Hysteresis, Transition};
use crate::serving::Serving;

/// A VIP:port whose healthy verdict changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub vip: Vip,
    pub service: String,
    pub transition: Transition,
    /// The facts at the change, for the Event's message.
    pub ready: u32,
    pub min_ready: u32,
}

/// A VIP:port that started or stopped failing over (no ready local backend, new
/// flows to its failover VIP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverChanged {
    pub vip: Vip,
    pub service: String,
    /// The failover VIP (while failing over, or the one it failed over to).
    pub remote: IpAddr,
    /// Failing over now.
    pub active: bool,
}

/// The outcome of one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evaluation {
    pub facts: Vec<PortFacts>,
    /// Host routes to announce, with their attributes.
    pub routes: BTreeMap<IpNetwork, RouteAttrs>,
    pub changed: Vec<Changed>,
    /// VIP:ports that started or stopped failing over.
    pub failovers: Vec<FailoverChanged>,
    /// Failover aliases in the datapath (never announced, no health page).
    pub aliases: usize,
    /// The earliest end of a running hold-down: sync again then.
    pub due: Option<Instant>,
}

/// The hold-down state of every VIP:port, kept from sync to sync.
#[derive(Debug, Default)]
pub struct Tracker {
    states: BTreeMap<Vip, Hysteresis>,
    /// The failover VIP of every VIP:port failing over.
    failing: BTreeMap<Vip, IpAddr>,
}

impl Tracker {
    /// Steps every VIP:port of `want` (programmed when `programmed` holds it) at
    /// `now`; forgets the ones that are gone.
    pub fn evaluate(
        &mut self,
        want: &Serving,
        programmed: &DesiredState,
        now: Instant,
    ) -> Evaluation {
        let real = |v: &Vip| want.vips.get(v).is_some_and(|b| !b.alias);
        self.states.retain(|v, _| real(v));
        let mut ev = Evaluation {
            failovers: self.step_failovers(want, programmed),
            ..Default::default()
        };
        for (vip, b) in &want.vips {
            if b.alias {
                ev.aliases += usize::from(programmed.services.contains_key(vip));
                continue;
            }
            let mut f = PortFacts {
                vip: *vip,
                service: b.service.clone(),
                ready: u32::try_from(b.ready.len()).unwrap_or(u32::MAX),
                programmed: programmed.services.contains_key(vip),
                policy: b.policy,
                phase: super::hysteresis::Phase::Unhealthy,
                failover: b.failover.map(|f| f.remote),
                serving_terminating: if b.ready.is_empty() {
                    u32::try_from(b.draining.len()).unwrap_or(u32::MAX)
                } else {
                    0
                },
            };
            let h = self.states.entry(*vip).or_default();
            if let Some(transition) = h.step(f.good(), now, b.policy.hold_down) {
                ev.changed.push(Changed {
                    vip: *vip,
                    service: b.service.clone(),
                    transition,
                    ready: f.ready,
                    min_ready: f.policy.min_ready,
                });
            }
            f.phase = h.phase();
            if let Some(due) = h.due(b.policy.hold_down) {
                ev.due = Some(ev.due.map_or(due, |d| d.min(due)));
            }
            ev.facts.push(f);
        }
        let mut by_addr: BTreeMap<IpAddr, Vec<_>> = BTreeMap::new();
        for f in &ev.facts {
            by_addr.entry(f.vip.addr).or_default().push(verdict(f));
        }
        ev.routes = by_addr
            .into_iter()
            .filter_map(|(a, v)| Some((IpNetwork::from(a), route(v)?)))
            .collect();
        ev
    }

    /// The VIP:ports (not aliases) failing over now, programmed so, against the last
    /// step: a change is reported once; one first seen failing over is reported too
    /// (an edge that starts in that state says so), one first seen not, not.
    fn step_failovers(
        &mut self,
        want: &Serving,
        programmed: &DesiredState,
    ) -> Vec<FailoverChanged> {
        let mut now = BTreeMap::new();
        for (vip, b) in &want.vips {
            if let Some(f) = b.failover
                && b.failing_over()
                && !b.alias
                && programmed.services.contains_key(vip)
            {
                now.insert(*vip, (f.remote, b.service.clone()));
            }
        }
        let mut out = Vec::new();
        for (vip, (remote, service)) in &now {
            if self.failing.get(vip) != Some(remote) {
                out.push(FailoverChanged {
                    vip: *vip,
                    service: service.clone(),
                    remote: *remote,
                    active: true,
                });
            }
        }
        for (vip, remote) in &self.failing {
            if !now.contains_key(vip) {
                let service = want.vips.get(vip).map(|b| b.service.clone());
                out.push(FailoverChanged {
                    vip: *vip,
                    service: service.unwrap_or_default(),
                    remote: *remote,
                    active: false,
                });
            }
        }
        self.failing = now.into_iter().map(|(v, (r, _))| (v, r)).collect();
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ringlb_bgp::Deprefer;
    use ringlb_datapath::{Proto, ServiceEntry};
    use ringlb_maglev::Backend;

    use super::*;
    use crate::serving::VipBackends;
    use crate::vip_health::hysteresis::Phase;
    use crate::vip_health::policy::{Below, HealthPolicy};

    fn vip(port: u16) -> Vip {
        Vip {
            addr: "192.0.2.1".parse().unwrap(),
            port,
            proto: Proto::Tcp,
        }
    }

    fn serving(ports: &[(u16, usize, HealthPolicy)]) -> (Serving, DesiredState) {
        let mut s = Serving::default();
        let mut d = DesiredState::default();
        for (port, ready, policy) in ports {
            let ready: Vec<Backend> = (0..*ready)
                .map(|i| Backend {
                    addr: format!("10.1.0.{}", i + 1).parse().unwrap(),
                    port: 8080,
                    weight: 1,
                })
                .collect();
            if !ready.is_empty() {
                let ips = ready.iter().map(|b| b.addr).collect();
                let entry = ServiceEntry::new(&vip(*port), ips, vec![0; 251]).unwrap();
                d.services.insert(vip(*port), entry);
            }
            let b = VipBackends {
                service: "default/web".into(),
                ready,
                draining: vec![],
                policy: *policy,
                ..Default::default()
            };
            s.vips.insert(vip(*port), b);
        }
        (s, d)
    }

    fn policy(min_ready: u32, below: Below) -> HealthPolicy {
        HealthPolicy {
            min_ready,
            below,
            hold_down: Duration::from_secs(10),
        }
    }

    fn net() -> IpNetwork {
        "192.0.2.1/32".parse().unwrap()
    }

    #[test]
    fn deprefers_below_the_threshold_and_waits_out_the_hold_down() {
        let d = Deprefer {
            prepend: 2,
            ..Default::default()
        };
        let p = policy(2, Below::Deprefer(d));
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let (s, dp) = serving(&[(80, 3, p)]);
        let ev = t.evaluate(&s, &dp, t0);
        assert_eq!(ev.routes[&net()].deprefer, None);
        assert_eq!(ev.changed[0].transition, Transition::Healthy);
        // One pod left of two required: de-preferred at once.
        let (s1, dp1) = serving(&[(80, 1, p)]);
        let ev = t.evaluate(&s1, &dp1, t0 + Duration::from_secs(1));
        assert_eq!(ev.routes[&net()].deprefer, Some(d));
        assert_eq!(ev.changed[0].transition, Transition::Unhealthy);
        // Back to three: still de-preferred for the hold-down, due at its end.
        let back = t0 + Duration::from_secs(2);
        let ev = t.evaluate(&s, &dp, back);
        assert_eq!(ev.routes[&net()].deprefer, Some(d));
        assert!(ev.changed.is_empty());
        assert_eq!(ev.due, Some(back + Duration::from_secs(10)));
        assert!(matches!(ev.facts[0].phase, Phase::Recovering { .. }));
        let ev = t.evaluate(&s, &dp, back + Duration::from_secs(10));
        assert_eq!(ev.routes[&net()].deprefer, None);
        assert_eq!(ev.changed[0].transition, Transition::Recovered);
        assert_eq!(ev.due, None);
    }

    #[test]
    fn withdraws_when_every_port_asks_and_forgets_gone_vips() {
        let p = policy(2, Below::Withdraw);
        let mut t = Tracker::default();
        let now = Instant::now();
        let (s, dp) = serving(&[(80, 1, p), (443, 0, p)]);
        let ev = t.evaluate(&s, &dp, now);
        assert!(ev.routes.is_empty(), "{:?}", ev.routes);
        assert!(!ev.facts[1].programmed, "no backend: no datapath entry");
        // One healthy port keeps the address announced.
        let (s, dp) = serving(&[(80, 2, p), (443, 0, p)]);
        assert!(t.evaluate(&s, &dp, now).routes.contains_key(&net()));
        let ev = t.evaluate(&Serving::default(), &DesiredState::default(), now);
        assert!(ev.facts.is_empty() && ev.routes.is_empty());
        assert!(t.states.is_empty());
    }

    #[test]
    fn failing_over_stays_announced_reports_503_and_says_so_once() {
        use crate::serving::Failover;
        use crate::vip_health::assess::{State, assess};
        let remote: IpAddr = "198.51.100.7".parse().unwrap();
        let p = policy(1, Below::Withdraw);
        let with_failover = |ready: usize| {
            let (mut s, mut d) = serving(&[(80, ready, p)]);
            let b = s.vips.get_mut(&vip(80)).unwrap();
            b.failover = Some(Failover { remote, weight: 0 });
            if ready == 0 {
                let e = ServiceEntry::new(&vip(80), vec![remote], vec![0; 251]).unwrap();
                d.services
                    .insert(vip(80), e.with_remote(&vip(80), [remote]).unwrap());
            }
            // An alias accepted from another region: programmed, never announced.
            let alias = Vip {
                addr: "203.0.113.9".parse().unwrap(),
                ..vip(80)
            };
            let mut a = s.vips[&vip(80)].clone();
            (a.alias, a.failover, a.ready) = (
                true,
                None,
                vec![Backend {
                    addr: "10.2.0.1".parse().unwrap(),
                    port: 8080,
                    weight: 1,
                }],
            );
            s.vips.insert(alias, a);
            let e = ServiceEntry::new(&alias, vec!["10.2.0.1".parse().unwrap()], vec![0; 251]);
            d.services
                .insert(alias, e.unwrap().as_failover_alias(&alias).unwrap());
            (s, d)
        };
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let (s, d) = with_failover(2);
        let ev = t.evaluate(&s, &d, t0);
        assert!(
            ev.failovers.is_empty(),
            "not failing over at first: no change"
        );
        assert_eq!(ev.aliases, 1);
        assert_eq!(ev.facts.len(), 1, "an alias has no health facts");
        assert_eq!(
            ev.routes.keys().collect::<Vec<_>>(),
            vec![&net()],
            "alias not announced"
        );
        // Every pod gone: still announced under `withdraw`, the health page says 503.
        let (s0, d0) = with_failover(0);
        let t1 = t0 + Duration::from_secs(1);
        let ev = t.evaluate(&s0, &d0, t1);
        assert_eq!(ev.routes[&net()].deprefer, None);
        assert_eq!(
            ev.failovers,
            vec![FailoverChanged {
                vip: vip(80),
                service: "default/web".into(),
                remote,
                active: true
            }]
        );
        let r = assess(
            &ev.facts[0],
            ev.routes.get(&net()),
            ringlb_bgp::reach::Reach::Sent,
            t1,
        );
        assert_eq!((r.state, r.http_status()), (State::Down, 503));
        assert_eq!(
            r.reason,
            "failing over to 198.51.100.7: no ready local backends (1 required)"
        );
        assert!(r.failing_over && r.announced && r.failover_vip == Some(remote));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            (&json["failingOver"], &json["failoverVip"]),
            (&serde_json::json!(true), &serde_json::json!("198.51.100.7"))
        );
        assert!(
            t.evaluate(&s0, &d0, t1).failovers.is_empty(),
            "once per change"
        );
        // Pods back: new flows local at once (FailoverEnded), the page waits out the
        // hold-down (503 recovering), and the VIP is never withdrawn on the way.
        let t2 = t1 + Duration::from_secs(1);
        let ev = t.evaluate(&s, &d, t2);
        assert!(!ev.failovers[0].active);
        assert!(ev.routes.contains_key(&net()));
        let r = assess(
            &ev.facts[0],
            ev.routes.get(&net()),
            ringlb_bgp::reach::Reach::Sent,
            t2,
        );
        assert!(!r.failing_over);
        assert!(r.reason.starts_with("recovering"), "{}", r.reason);
        assert_eq!(r.http_status(), 503);
        let ev = t.evaluate(&s, &d, t2 + Duration::from_secs(10));
        let r = assess(
            &ev.facts[0],
            ev.routes.get(&net()),
            ringlb_bgp::reach::Reach::Sent,
            t2,
        );
        assert_eq!(r.http_status(), 200, "{}", r.reason);
        // Without a failover VIP the same loss withdraws the route.
        let (plain, dp) = serving(&[(80, 0, p)]);
        assert!(t.evaluate(&plain, &dp, t2).routes.is_empty());
    }
}
