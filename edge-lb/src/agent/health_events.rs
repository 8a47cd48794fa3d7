//! Events on a Service when a VIP:port of it changes health on this edge (Warning
//! `VIPUnhealthy`, Normal `VIPHealthy` after the hold-down), written as
//! `ringlb-edge` with the node name as the instance, so each edge's view shows.
//! A VIP:port that is healthy for the first time (a new Service, an edge starting)
//! makes no Event.
//!
//! Cross-region failover: Warning `FailoverActive` when a VIP:port with a failover VIP
//! has no ready local backend left and its new flows go to the remote VIP, Normal
//! `FailoverEnded` when local backends take them again; once per change.
//!
//! Bad annotations (health or failover; the Service is served without them): Warning
//! `BadAnnotation`, once per Service and reason while this edge runs.
//!
//! A VIP:port this edge would announce but no router has, for a cause of the
//! Service's own (`ringlb_bgp::reach`): Warning `NoAdvertisement` (no
//! `BGPAdvertisement` selects its pool for an Established peer) or
//! `FamilyNotNegotiated` (no session carries its address family), once per cause
//! while it lasts.

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::serving::Skipped;

use crate::vip_health::hysteresis::Transition;
use crate::vip_health::{Changed, FailoverChanged};

/// `edge <node>: VIP <addr>:<port>/<PROTO>`.
fn what(vip: &ringlb_datapath::Vip, node: &str) -> String {
    let proto = match vip.proto {
        ringlb_datapath::Proto::Tcp => "TCP",
        ringlb_datapath::Proto::Udp => "UDP",
    };
    format!("edge {node}: VIP {}:{}/{proto}", vip.addr, vip.port)
}

/// The Event for one change, or `None` for a first-time healthy.
pub fn event_for(c: &Changed, node: &str) -> Option<Event> {
    let what = what(&c.vip, node);
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

/// The Event of a VIP:port that started or stopped failing over.
pub fn failover_event_for(c: &FailoverChanged, node: &str) -> Event {
    let what = what(&c.vip, node);
    let (type_, reason, note) = if c.active {
        (
            EventType::Warning,
            "FailoverActive",
            format!(
                "{what} has no ready pods; new flows go to remote VIP {}",
                c.remote
            ),
        )
    } else {
        (
            EventType::Normal,
            "FailoverEnded",
            format!(
                "{what}: new flows go to local pods again, no longer to remote VIP {}",
                c.remote
            ),
        )
    };
    Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Failover".into(),
        secondary: None,
    }
}

/// (Service, VIP:port, reason) of the unannounced VIP:ports reported.
pub type Unannounced = std::collections::BTreeSet<(String, String, &'static str)>;

/// The Warnings of VIP:ports no router has for a cause of their own, except those in
/// `already`: (Service, Event) each, and the new `already`.
pub fn unannounced_events(
    reports: &[crate::vip_health::Report],
    node: &str,
    already: &Unannounced,
) -> (Vec<(String, Event)>, Unannounced) {
    let mut now = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for r in reports {
        let Some(reach) = r.unannounced else {
            continue;
        };
        let at = match (r.port, r.protocol) {
            (Some(p), Some(proto)) => format!("{}:{p}/{proto}", r.vip),
            _ => r.vip.to_string(),
        };
        let key = (r.service.clone(), at.clone(), reach.reason());
        if !already.contains(&key) {
            out.push((
                r.service.clone(),
                Event {
                    type_: EventType::Warning,
                    reason: reach.reason().into(),
                    note: Some(format!(
                        "edge {node}: VIP {at} is not announced: {}",
                        reach.message()
                    )),
                    action: "Announce".into(),
                    secondary: None,
                },
            ));
        }
        now.insert(key);
    }
    (out, now)
}

/// Writes the Events of health changes.
pub struct HealthEvents {
    recorder: Recorder,
    node: String,
    /// (Service, reason) of the bad annotations already reported.
    reported: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// The unannounced VIP:ports already reported.
    unannounced: std::sync::Mutex<Unannounced>,
}

/// The Warning of one bad annotation.
pub fn bad_annotation_event(s: &Skipped, node: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: "BadAnnotation".into(),
        note: Some(format!("edge {node}: {}", s.reason)),
        action: "ReadAnnotations".into(),
        secondary: None,
    }
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
            reported: Default::default(),
            unannounced: Default::default(),
        }
    }

    /// Publishes the Events of `changed` in the background (an API that is down
    /// costs a log line, never the sync).
    pub fn publish(&self, services: &Store<Service>, changed: &[Changed]) {
        for c in changed {
            if let Some(ev) = event_for(c, &self.node) {
                self.send(services, &c.service, ev);
            }
        }
    }

    /// Publishes the Events of failover changes, as [`HealthEvents::publish`] does.
    pub fn publish_failovers(&self, services: &Store<Service>, changed: &[FailoverChanged]) {
        for c in changed {
            self.send(services, &c.service, failover_event_for(c, &self.node));
        }
    }

    /// Publishes a Warning per bad annotation not reported before; one that went away
    /// is forgotten, so it is reported again if it comes back.
    pub fn publish_bad_annotations(&self, services: &Store<Service>, bad: &[Skipped]) {
        let now: std::collections::BTreeSet<(String, String)> = bad
            .iter()
            .map(|s| (s.service.clone(), s.reason.clone()))
            .collect();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for s in bad {
            if !reported.contains(&(s.service.clone(), s.reason.clone())) {
                self.send(services, &s.service, bad_annotation_event(s, &self.node));
            }
        }
        *reported = now;
    }

    /// Publishes a Warning per VIP:port no router has for a cause of its own, once
    /// while the cause lasts ([`unannounced_events`]).
    pub fn publish_unannounced(
        &self,
        services: &Store<Service>,
        reports: &[crate::vip_health::Report],
    ) {
        let mut done = self.unannounced.lock().unwrap_or_else(|e| e.into_inner());
        let (events, now) = unannounced_events(reports, &self.node, &done);
        for (service, ev) in events {
            tracing::warn!(service = %service, reason = %ev.reason, "{}", ev.note.as_deref().unwrap_or(""));
            self.send(services, &service, ev);
        }
        *done = now;
    }

    /// Sends `ev` about this edge's Node in the background (a fault of the edge
    /// itself, not of one Service).
    pub fn publish_on_node(&self, ev: Event) {
        let (recorder, obj) = (self.recorder.clone(), super::tx_check::node_ref(&self.node));
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &obj).await {
                tracing::warn!(error = %e, reason = %ev.reason, "writing Event failed");
            }
        });
    }

    /// Sends `ev` about the Service `service` (`namespace/name`) in the background;
    /// a Service that is gone gets none.
    fn send(&self, services: &Store<Service>, service: &str, ev: Event) {
        let Some((ns, name)) = service.split_once('/') else {
            return;
        };
        let Some(svc) = services.get(&ObjectRef::new(name).within(ns)) else {
            return;
        };
        let (recorder, obj) = (self.recorder.clone(), svc.object_ref(&()));
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &obj).await {
                tracing::warn!(error = %e, reason = %ev.reason, "writing Event failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlb_datapath::{Proto, Vip};

    #[test]
    fn an_unannounced_vip_is_warned_once_per_cause_while_it_lasts() {
        use crate::vip_health::{Report, State};
        use ringlb_bgp::reach::Reach;
        let report = |service: &str, vip: &str, unannounced: Option<Reach>| Report {
            vip: vip.parse().unwrap(),
            port: Some(80),
            protocol: Some("TCP"),
            service: service.into(),
            programmed: true,
            announced: unannounced.is_none(),
            depreferred: false,
            ready_backends: 1,
            min_ready: 1,
            state: if unannounced.is_none() {
                State::Healthy
            } else {
                State::Down
            },
            reason: String::new(),
            failover_vip: None,
            failing_over: false,
            ports: Vec::new(),
            unannounced,
        };
        let no_adv = report("default/web", "10.9.1.0", Some(Reach::NotSelected));
        let v6 = report(
            "default/web",
            "2001:db8::1",
            Some(Reach::FamilyNotNegotiated(ringlb_bgp::codec::Afi::Ipv6)),
        );
        let fine = report("default/other", "10.9.0.1", None);
        let (ev, seen) = unannounced_events(
            &[no_adv.clone(), v6.clone(), fine.clone()],
            "edge-1",
            &Default::default(),
        );
        let got: Vec<(&str, &str)> = ev
            .iter()
            .map(|(s, e)| (s.as_str(), e.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("default/web", "NoAdvertisement"),
                ("default/web", "FamilyNotNegotiated")
            ]
        );
        assert_eq!(ev[0].1.type_, EventType::Warning);
        let note = ev[0].1.note.clone().unwrap();
        assert!(
            note.starts_with(
                "edge edge-1: VIP 10.9.1.0:80/TCP is not announced: no BGPAdvertisement selects"
            ),
            "{note}"
        );
        // Still so at the next sync: no repeat. Gone and back: warned again.
        let (again, seen) = unannounced_events(&[no_adv.clone(), v6], "edge-1", &seen);
        assert!(again.is_empty(), "repeated {} Events", again.len());
        let (_, seen) = unannounced_events(&[fine], "edge-1", &seen);
        let (back, _) = unannounced_events(&[no_adv], "edge-1", &seen);
        assert_eq!(back.len(), 1);
    }

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

    #[test]
    fn warning_when_failing_over_normal_when_it_ends() {
        let mut c = FailoverChanged {
            vip: changed(Transition::Healthy).vip,
            service: "default/web".into(),
            remote: "198.51.100.7".parse().unwrap(),
            active: true,
        };
        let w = failover_event_for(&c, "edge-1");
        assert_eq!(
            (w.type_, w.reason.as_str()),
            (EventType::Warning, "FailoverActive")
        );
        assert_eq!(
            w.note.unwrap(),
            "edge edge-1: VIP 192.0.2.1:80/TCP has no ready pods; new flows go to remote \
             VIP 198.51.100.7"
        );
        c.active = false;
        let n = failover_event_for(&c, "edge-1");
        assert_eq!(
            (n.type_, n.reason.as_str()),
            (EventType::Normal, "FailoverEnded")
        );
        assert!(n.note.unwrap().contains("198.51.100.7"));
    }
}
