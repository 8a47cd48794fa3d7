//! Events on a Service when a VIP:port of it changes health on this edge (Warning
//! `VIPUnhealthy`, Normal `VIPHealthy` after the hold-down), written as
//! `ringlb-edge` with the node name as the instance, so each edge's view shows.
//! A VIP:port that is healthy for the first time (a new Service, an edge starting)
//! makes no Event.

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::vip_health::Changed;
use crate::vip_health::hysteresis::Transition;

/// The Event for one change, or `None` for a first-time healthy.
pub fn event_for(c: &Changed, node: &str) -> Option<Event> {
    let proto = match c.vip.proto {
        ringlb_datapath::Proto::Tcp => "TCP",
        ringlb_datapath::Proto::Udp => "UDP",
    };
    let what = format!("edge {node}: VIP {}:{}/{proto}", c.vip.addr, c.vip.port);
    let counts = format!("{} ready backends, {} required", c.ready, c.min_ready);
    let (type_, reason, note) = match c.transition {
        Transition::Healthy => return None,
        Transition::Unhealthy => (
            EventType::Warning,
            "VIPUnhealthy",
            format!("{what} unhealthy ({counts}); its route follows ringlb.io/unhealthy-bgp"),
        ),
        Transition::Recovered => (
            EventType::Normal,
            "VIPHealthy",
            format!("{what} healthy again after the hold-down ({counts})"),
        ),
    };
    Some(Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "CheckVIPHealth".into(),
        secondary: None,
    })
}

/// Writes the Events of health changes.
pub struct HealthEvents {
    recorder: Recorder,
    node: String,
}

impl HealthEvents {
    pub fn new(client: kube::Client, node: String) -> Self {
        let reporter = Reporter {
            controller: "ringlb-edge".into(),
            instance: Some(node.clone()),
        };
        HealthEvents {
            recorder: Recorder::new(client, reporter),
            node,
        }
    }

    /// Publishes the Events of `changed` in the background (an API that is down
    /// costs a log line, never the sync).
    pub fn publish(&self, services: &Store<Service>, changed: &[Changed]) {
        for c in changed {
            let Some(ev) = event_for(c, &self.node) else {
                continue;
            };
            let Some((ns, name)) = c.service.split_once('/') else {
                continue;
            };
            let Some(svc) = services.get(&ObjectRef::new(name).within(ns)) else {
                continue;
            };
            let (recorder, obj) = (self.recorder.clone(), svc.object_ref(&()));
            tokio::spawn(async move {
                if let Err(e) = recorder.publish(&ev, &obj).await {
                    tracing::warn!(error = %e, reason = %ev.reason, "writing Event failed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlb_datapath::{Proto, Vip};

    fn changed(t: Transition) -> Changed {
        Changed {
            vip: Vip {
                addr: "192.0.2.1".parse().unwrap(),
                port: 80,
                proto: Proto::Tcp,
            },
            service: "default/web".into(),
            transition: t,
            ready: 1,
            min_ready: 2,
        }
    }

    #[test]
    fn warning_when_unhealthy_normal_when_recovered_none_at_first() {
        assert!(event_for(&changed(Transition::Healthy), "edge-1").is_none());
        let w = event_for(&changed(Transition::Unhealthy), "edge-1").unwrap();
        assert_eq!(
            (w.type_, w.reason.as_str()),
            (EventType::Warning, "VIPUnhealthy")
        );
        assert_eq!(
            w.note.unwrap(),
            "edge edge-1: VIP 192.0.2.1:80/TCP unhealthy (1 ready backends, 2 required); \
             its route follows ringlb.io/unhealthy-bgp"
        );
        let n = event_for(&changed(Transition::Recovered), "edge-1").unwrap();
        assert_eq!(
            (n.type_, n.reason.as_str()),
            (EventType::Normal, "VIPHealthy")
        );
    }
}
