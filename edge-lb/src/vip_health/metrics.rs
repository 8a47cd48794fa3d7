//! Prometheus metrics of per-VIP health, refreshed after every sync:
//!
//! - `ringlb_vip_health_state{vip,port,protocol,service}`: 2 healthy, 1 degraded,
//!   0 down (what `/health/vip/<ip>/<port>` answers, as of the sync)
//! - `ringlb_vip_health_transitions_total{vip,port,protocol,service,to}`: hold-down
//!   verdict changes, `to` = `healthy` (first time), `recovered` (after the
//!   hold-down) or `unhealthy`
//! - `ringlb_vip_announced{vip,port,protocol,service}`: 1 when a router has the
//!   VIP's route (sent to an Established peer: `ringlb_bgp::reach`, the health
//!   page's `announced`), 0 otherwise
//! - `ringlb_vip_failover_active{vip,port,protocol,service}`: 1 while the VIP:port
//!   has no ready local backend and sends new flows to its failover VIP, 0 while it
//!   has ready ones; only VIP:ports with a `ringlb.io/failover-vip`
//! - `ringlb_failover_aliases`: other regions' VIP:ports this edge serves as
//!   failover aliases (`ringlb.io/accept-failover-from`)
//!
//! A VIP:port the edge no longer serves loses its state and failover series.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::assess::{Report, State};
use super::hysteresis::Transition;
use super::tracker::Changed;

type Labels = Vec<(String, String)>;

#[derive(Clone, Default)]
pub struct HealthMetrics {
    pub state: Family<Labels, Gauge>,
    pub announced: Family<Labels, Gauge>,
    pub transitions: Family<Labels, Counter>,
    pub failover_active: Family<Labels, Gauge>,
    pub aliases: Gauge,
    shown: Arc<Mutex<BTreeSet<Labels>>>,
    shown_announced: Arc<Mutex<BTreeSet<Labels>>>,
    shown_failover: Arc<Mutex<BTreeSet<Labels>>>,
}

fn labels(vip: String, port: String, protocol: &str, service: &str) -> Labels {
    vec![
        ("vip".into(), vip),
        ("port".into(), port),
        ("protocol".into(), protocol.into()),
        ("service".into(), service.into()),
    ]
}

impl HealthMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = HealthMetrics::default();
        registry.register(
            "vip_health_state",
            "Health of each VIP:port on this edge: 2 healthy, 1 degraded, 0 down",
            m.state.clone(),
        );
        registry.register(
            "vip_health_transitions",
            "Hold-down verdict changes of each VIP:port (to: healthy, recovered, unhealthy)",
            m.transitions.clone(),
        );
        registry.register(
            "vip_announced",
            "1 when a router has the VIP's route (sent to an Established BGP peer), 0 otherwise",
            m.announced.clone(),
        );
        registry.register(
            "vip_failover_active",
            "1 while a VIP:port with a failover VIP has no ready local backend (new flows go to the failover VIP)",
            m.failover_active.clone(),
        );
        registry.register(
            "failover_aliases",
            "Other regions' VIP:ports served here as failover aliases",
            m.aliases.clone(),
        );
        m
    }

    /// The state of every VIP:port in `reports`; series of the others are removed.
    pub fn update(&self, reports: &[Report]) {
        let mut now = BTreeSet::new();
        let mut failover = BTreeSet::new();
        for r in reports {
            let port = r.port.map(|p| p.to_string()).unwrap_or_default();
            let l = labels(
                r.vip.to_string(),
                port,
                r.protocol.unwrap_or(""),
                &r.service,
            );
            let v = match r.state {
                State::Healthy => 2,
                State::Degraded => 1,
                State::Down => 0,
            };
            self.state.get_or_create(&l).set(v);
            self.announced.get_or_create(&l).set(i64::from(r.announced));
            if r.failover_vip.is_some() {
                let active = self.failover_active.get_or_create(&l);
                active.set(i64::from(r.failing_over));
                failover.insert(l.clone());
            }
            now.insert(l);
        }
        forget(&self.announced, &self.shown_announced, now.clone());
        forget(&self.state, &self.shown, now);
        forget(&self.failover_active, &self.shown_failover, failover);
    }

    /// The number of failover aliases in the datapath.
    pub fn set_aliases(&self, n: usize) {
        self.aliases.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn count(&self, changed: &[Changed]) {
        for c in changed {
            let proto = match c.vip.proto {
                ringlb_datapath::Proto::Tcp => "TCP",
                ringlb_datapath::Proto::Udp => "UDP",
            };
            let mut l = labels(
                c.vip.addr.to_string(),
                c.vip.port.to_string(),
                proto,
                &c.service,
            );
            let to = match c.transition {
                Transition::Healthy => "healthy",
                Transition::Recovered => "recovered",
                Transition::Unhealthy => "unhealthy",
            };
            l.push(("to".into(), to.into()));
            self.transitions.get_or_create(&l).inc();
        }
    }
}

/// Removes the series of `family` shown last time and not `now`.
fn forget(family: &Family<Labels, Gauge>, shown: &Mutex<BTreeSet<Labels>>, now: BTreeSet<Labels>) {
    let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
    for gone in shown.difference(&now) {
        family.remove(gone);
    }
    *shown = now;
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, Instant};

    use ringlb_bgp::reach::Reach;
    use ringlb_datapath::{DesiredState, Proto, ServiceEntry, Vip};

    use super::*;
    use crate::serving::{Serving, VipBackends};
    use crate::vip_health::Tracker;
    use crate::vip_health::assess::assess;

    fn text(reg: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, reg).unwrap();
        out
    }

    /// The labels of the series of `WEB`.
    const SERIES: &str = r#"{vip="192.0.2.1",port="80",protocol="TCP",service="default/web"}"#;

    const WEB: Vip = Vip {
        addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        port: 80,
        proto: Proto::Tcp,
    };

    /// Asserts that `out` shows `metric` of `WEB`'s series at `value`.
    #[track_caller]
    fn assert_shows(out: &str, metric: &str, value: u8) {
        let line = format!("{metric}{SERIES} {value}");
        assert!(out.contains(&line), "{out}");
    }

    /// The metrics in a fresh registry, and what serves `WEB` for Service
    /// `default/web` as `backends` says.
    fn setup(backends: VipBackends) -> (Registry, HealthMetrics, Serving) {
        let mut reg = Registry::with_prefix("ringlb");
        let m = HealthMetrics::register(&mut reg);
        let mut s = Serving::default();
        let service = "default/web".into();
        s.vips.insert(
            WEB,
            VipBackends {
                service,
                ..backends
            },
        );
        (reg, m, s)
    }

    #[test]
    fn state_and_transitions_per_vip_port() {
        let vip = WEB;
        let ready = vec![ringlb_maglev::Backend {
            addr: "10.1.0.1".parse().unwrap(),
            port: 80,
            weight: 1,
        }];
        let (reg, m, mut s) = setup(VipBackends {
            ready: ready.clone(),
            ..Default::default()
        });
        let mut d = DesiredState::default();
        let ips = vec![ready[0].addr];
        d.services
            .insert(vip, ServiceEntry::new(&vip, ips, vec![0; 251]).unwrap());
        let mut t = Tracker::default();
        let now = Instant::now();
        let ev = t.evaluate(&s, &d, now);
        m.count(&ev.changed);
        let route = ev.routes.values().next();
        m.update(&[assess(&ev.facts[0], route, Reach::Sent, now)]);
        let out = text(&reg);
        assert_shows(&out, "ringlb_vip_health_state", 2);
        assert_shows(&out, "ringlb_vip_announced", 1);
        // The same VIP that no advertisement selects: down and not announced.
        m.update(&[assess(&ev.facts[0], route, Reach::NotSelected, now)]);
        let out = text(&reg);
        assert_shows(&out, "ringlb_vip_announced", 0);
        assert_shows(&out, "ringlb_vip_health_state", 0);
        let to = r#"service="default/web",to="healthy"} 1"#;
        assert!(out.contains(to), "{out}");
        // Pods gone: unhealthy, counted; the VIP gone: its state series removed.
        s.vips.get_mut(&vip).unwrap().ready.clear();
        let ev = t.evaluate(&s, &DesiredState::default(), now + Duration::from_secs(1));
        m.count(&ev.changed);
        m.update(&[assess(&ev.facts[0], None, Reach::Sent, now)]);
        let out = text(&reg);
        assert_shows(&out, "ringlb_vip_health_state", 0);
        assert!(out.contains(r#"to="unhealthy"} 1"#), "{out}");
        m.update(&[]);
        assert!(!text(&reg).contains("ringlb_vip_health_state{"));
    }

    #[test]
    fn failover_active_per_vip_port_with_a_failover_vip() {
        let vip = WEB;
        let remote = "198.51.100.7".parse().unwrap();
        let (reg, m, s) = setup(VipBackends {
            failover: Some(crate::serving::Failover { remote, weight: 0 }),
            ..Default::default()
        });
        let mut d = DesiredState::default();
        let e = ServiceEntry::new(&vip, vec![remote], vec![0; 251]).unwrap();
        d.services
            .insert(vip, e.with_remote(&vip, [remote]).unwrap());
        let now = Instant::now();
        let ev = Tracker::default().evaluate(&s, &d, now);
        let route = ev.routes.values().next();
        m.update(&[assess(&ev.facts[0], route, Reach::Sent, now)]);
        m.set_aliases(2);
        let out = text(&reg);
        assert_shows(&out, "ringlb_vip_failover_active", 1);
        assert!(out.contains("ringlb_failover_aliases 2"), "{out}");
        m.update(&[]);
        assert!(!text(&reg).contains("ringlb_vip_failover_active{"));
    }
}
