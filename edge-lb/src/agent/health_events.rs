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
//! while it lasts, and only once it has lasted [`UNANNOUNCED_GRACE`]: a route the
//! sync just handed to the speaker is unsent for the few ms until the sessions send it.

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

/// How long a VIP:port must stay unannounced for a cause of its own before it is
/// warned. The sync hands a new route to the speaker and reads the health reports
/// right after; each BGP session sends the UPDATE from its own task a few ms later,
/// so the report of that sync finds a route just handed over still unsent, which
/// looks like `NoAdvertisement` (every new or reused VIP, worst under a burst of new
/// Services).
pub const UNANNOUNCED_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// (Service, VIP:port, reason) of one unannounced VIP:port.
type UnannouncedKey = (String, String, &'static str);

/// The unannounced VIP:ports of the last sync: since when each cause has lasted, or
/// that it was warned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unannounced(std::collections::BTreeMap<UnannouncedKey, Seen>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Since(std::time::Instant),
    Warned,
}

/// What [`unannounced_events`] decided at one sync.
#[derive(Default)]
pub struct UnannouncedStep {
    /// (Service, Event) of each Warning to send.
    pub events: Vec<(String, Event)>,
    /// The state for the next sync.
    pub seen: Unannounced,
    /// When a cause still within its grace is to be looked at again.
    pub due: Option<std::time::Instant>,
}

/// The Warnings of VIP:ports no router has for a cause of their own that has lasted
/// [`UNANNOUNCED_GRACE`] by `now` (so at least past the sync that first saw it),
/// each once while it lasts; a cause that went away (the VIP:port announced, its
/// Service deleted) is forgotten.
pub fn unannounced_events(
    reports: &[crate::vip_health::Report],
    node: &str,
    before: &Unannounced,
    now: std::time::Instant,
) -> UnannouncedStep {
    let mut step = UnannouncedStep::default();
    for r in reports {
        let Some(reach) = r.unannounced else {
            continue;
        };
        let at = match (r.port, r.protocol) {
            (Some(p), Some(proto)) => format!("{}:{p}/{proto}", r.vip),
            _ => r.vip.to_string(),
        };
        let key = (r.service.clone(), at.clone(), reach.reason());
        let since = match before.0.get(&key) {
            Some(Seen::Warned) => {
                step.seen.0.insert(key, Seen::Warned);
                continue;
            }
            Some(Seen::Since(t)) => *t,
            None => now,
        };
        let warn_at = since + UNANNOUNCED_GRACE;
        if now < warn_at {
            step.due = Some(step.due.map_or(warn_at, |d| d.min(warn_at)));
            step.seen.0.insert(key, Seen::Since(since));
            continue;
        }
        step.events.push((
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
        step.seen.0.insert(key, Seen::Warned);
    }
    step
}

/// Writes the Events of health changes.
pub struct HealthEvents {
    recorder: Recorder,
    node: String,
    /// (Service, reason) of the bad annotations already reported.
    reported: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// The unannounced VIP:ports of the last sync.
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
    /// the cause has lasted [`UNANNOUNCED_GRACE`] and once while it lasts
    /// ([`unannounced_events`]). Returns when to sync again to look at a cause still
    /// within its grace.
    pub fn publish_unannounced(
        &self,
        services: &Store<Service>,
        reports: &[crate::vip_health::Report],
        now: std::time::Instant,
    ) -> Option<std::time::Instant> {
        let mut done = self.unannounced.lock().unwrap_or_else(|e| e.into_inner());
        let step = unannounced_events(reports, &self.node, &done, now);
        for (service, ev) in step.events {
            tracing::warn!(service = %service, reason = %ev.reason, "{}", ev.note.as_deref().unwrap_or(""));
            self.send(services, &service, ev);
        }
        *done = step.seen;
        step.due
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

    fn unannounced(
        service: &str,
        vip: &str,
        why: Option<ringlb_bgp::reach::Reach>,
    ) -> crate::vip_health::Report {
        use crate::vip_health::{Report, State};
        Report {
            vip: vip.parse().unwrap(),
            port: Some(80),
            protocol: Some("TCP"),
            service: service.into(),
            programmed: true,
            announced: why.is_none(),
            depreferred: false,
            ready_backends: 1,
            min_ready: 1,
            state: if why.is_none() {
                State::Healthy
            } else {
                State::Down
            },
            reason: String::new(),
            failover_vip: None,
            failing_over: false,
            ports: Vec::new(),
            unannounced: why,
        }
    }

    fn reasons(step: &UnannouncedStep) -> Vec<(&str, &str)> {
        step.events
            .iter()
            .map(|(s, e)| (s.as_str(), e.reason.as_str()))
            .collect()
    }

    #[test]
    fn an_unannounced_vip_is_warned_once_its_cause_outlasts_the_grace() {
        use ringlb_bgp::reach::Reach;
        use std::time::{Duration, Instant};
        let no_adv = unannounced("default/web", "10.9.1.0", Some(Reach::NotSelected));
        let v6 = unannounced(
            "default/web",
            "2001:db8::1",
            Some(Reach::FamilyNotNegotiated(ringlb_bgp::codec::Afi::Ipv6)),
        );
        let fine = unannounced("default/other", "10.9.0.1", None);
        let all = [no_adv.clone(), v6.clone(), fine.clone()];
        let t0 = Instant::now();
        // The sync that first sees it: not yet, but look again when the grace ends.
        let first = unannounced_events(&all, "edge-1", &Default::default(), t0);
        assert!(first.events.is_empty(), "warned at first sight");
        assert_eq!(first.due, Some(t0 + UNANNOUNCED_GRACE));
        let ev = unannounced_events(&all, "edge-1", &first.seen, t0 + UNANNOUNCED_GRACE);
        assert_eq!(
            reasons(&ev),
            [
                ("default/web", "NoAdvertisement"),
                ("default/web", "FamilyNotNegotiated")
            ]
        );
        assert_eq!(ev.due, None);
        assert_eq!(ev.events[0].1.type_, EventType::Warning);
        let note = ev.events[0].1.note.clone().unwrap();
        assert!(
            note.starts_with(
                "edge edge-1: VIP 10.9.1.0:80/TCP is not announced: no BGPAdvertisement selects"
            ),
            "{note}"
        );
        // Still so at the next sync: no repeat. Gone and back: warned again, after
        // the grace again.
        let s = Duration::from_secs(1);
        let again = unannounced_events(&[no_adv.clone(), v6], "edge-1", &ev.seen, t0 + 2 * s);
        assert!(again.events.is_empty(), "repeated {}", again.events.len());
        let gone = unannounced_events(&[fine], "edge-1", &again.seen, t0 + 3 * s);
        let only = [no_adv];
        let back = unannounced_events(&only, "edge-1", &gone.seen, t0 + 4 * s);
        assert!(back.events.is_empty());
        let t = t0 + 4 * s + UNANNOUNCED_GRACE;
        let back = unannounced_events(&only, "edge-1", &back.seen, t);
        assert_eq!(reasons(&back), [("default/web", "NoAdvertisement")]);
    }

    #[test]
    fn a_reused_vip_is_not_warned_while_its_update_is_on_its_way() {
        use ringlb_bgp::reach::Reach;
        use std::time::{Duration, Instant};
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let vip = "10.9.1.7";
        let old = unannounced("default/bench-1", vip, None);
        let step = unannounced_events(&[old], "edge-1", &Default::default(), t0);
        // The Service is deleted: its VIP is withdrawn and leaves the reports.
        let step = unannounced_events(&[], "edge-1", &step.seen, t0 + ms(10));
        // A new Service gets the address. The sync that hands its route to the
        // speaker reads the reports before the sessions sent the UPDATE: not in
        // any peer's sent prefixes yet, which reads as NoAdvertisement. Next to it,
        // a VIP that no BGPAdvertisement selects.
        let reused = |reach| unannounced("default/bench-2", vip, reach);
        let unselected = unannounced("default/lost", "10.66.0.1", Some(Reach::NotSelected));
        let racing = [reused(Some(Reach::NotSelected)), unselected.clone()];
        let step = unannounced_events(&racing, "edge-1", &step.seen, t0 + ms(20));
        assert!(reasons(&step).is_empty(), "{:?}", reasons(&step));
        let due = step.due.expect("a look again at the grace's end");
        // The sessions sent it by the next sync: never warned.
        let sent = [reused(None), unselected];
        let step = unannounced_events(&sent, "edge-1", &step.seen, t0 + ms(25));
        assert!(step.events.is_empty());
        let step = unannounced_events(&sent, "edge-1", &step.seen, due);
        assert_eq!(reasons(&step), [("default/lost", "NoAdvertisement")]);
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
