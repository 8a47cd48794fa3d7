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

/// The outcome of one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evaluation {
    pub facts: Vec<PortFacts>,
    /// Host routes to announce, with their attributes.
    pub routes: BTreeMap<IpNetwork, RouteAttrs>,
    pub changed: Vec<Changed>,
    /// The earliest end of a running hold-down: sync again then.
    pub due: Option<Instant>,
}

/// The hold-down state of every VIP:port, kept from sync to sync.
#[derive(Debug, Default)]
pub struct Tracker {
    states: BTreeMap<Vip, Hysteresis>,
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
        self.states.retain(|v, _| want.vips.contains_key(v));
        let mut ev = Evaluation::default();
        for (vip, b) in &want.vips {
            let mut f = PortFacts {
                vip: *vip,
                service: b.service.clone(),
                ready: u32::try_from(b.ready.len()).unwrap_or(u32::MAX),
                programmed: programmed.services.contains_key(vip),
                policy: b.policy,
                phase: super::hysteresis::Phase::Unhealthy,
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
}
