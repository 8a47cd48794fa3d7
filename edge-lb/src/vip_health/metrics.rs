//! Prometheus metrics of per-VIP health, refreshed after every sync:
//!
//! - `ringlb_vip_health_state{vip,port,protocol,service}`: 2 healthy, 1 degraded,
//!   0 down (what `/health/vip/<ip>/<port>` answers, as of the sync)
//! - `ringlb_vip_health_transitions_total{vip,port,protocol,service,to}`: hold-down
//!   verdict changes, `to` = `healthy` (first time), `recovered` (after the
//!   hold-down) or `unhealthy`
//!
//! A VIP:port the edge no longer serves loses its state series.

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
    pub transitions: Family<Labels, Counter>,
    shown: Arc<Mutex<BTreeSet<Labels>>>,
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
        m
    }

    /// The state of every VIP:port in `reports`; series of the others are removed.
    pub fn update(&self, reports: &[Report]) {
        let mut now = BTreeSet::new();
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
            now.insert(l);
        }
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        for gone in shown.difference(&now) {
            self.state.remove(gone);
        }
        *shown = now;
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

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

    #[test]
    fn state_and_transitions_per_vip_port() {
        let mut reg = Registry::with_prefix("ringlb");
        let m = HealthMetrics::register(&mut reg);
        let vip = Vip {
            addr: "192.0.2.1".parse().unwrap(),
            port: 80,
            proto: Proto::Tcp,
        };
        let ready = vec![ringlb_maglev::Backend {
            addr: "10.1.0.1".parse().unwrap(),
            port: 80,
            weight: 1,
        }];
        let mut s = Serving::default();
        s.vips.insert(
            vip,
            VipBackends {
                service: "default/web".into(),
                ready: ready.clone(),
                ..Default::default()
            },
        );
        let mut d = DesiredState::default();
        let ips = vec![ready[0].addr];
        d.services
            .insert(vip, ServiceEntry::new(&vip, ips, vec![0; 251]).unwrap());
        let mut t = Tracker::default();
        let now = Instant::now();
        let ev = t.evaluate(&s, &d, now);
        m.count(&ev.changed);
        let route = ev.routes.values().next();
        m.update(&[assess(&ev.facts[0], route, 1, now)]);
        let out = text(&reg);
        let series = r#"{vip="192.0.2.1",port="80",protocol="TCP",service="default/web"}"#;
        assert!(
            out.contains(&format!("ringlb_vip_health_state{series} 2")),
            "{out}"
        );
        let to = r#"service="default/web",to="healthy"} 1"#;
        assert!(out.contains(to), "{out}");
        // Pods gone: unhealthy, counted; the VIP gone: its state series removed.
        s.vips.get_mut(&vip).unwrap().ready.clear();
        let ev = t.evaluate(&s, &DesiredState::default(), now + Duration::from_secs(1));
        m.count(&ev.changed);
        m.update(&[assess(&ev.facts[0], None, 1, now)]);
        let out = text(&reg);
        assert!(
            out.contains(&format!("ringlb_vip_health_state{series} 0")),
            "{out}"
        );
        assert!(out.contains(r#"to="unhealthy"} 1"#), "{out}");
        m.update(&[]);
        assert!(!text(&reg).contains("ringlb_vip_health_state{"));
    }
}
