//! What a Service's status should say, as pure functions: given the Service as it
//! is and what the allocator decided, the merge patch to send (or `None` when the
//! status already says it).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use crate::announce::ANNOUNCED_CONDITION_TYPE;
use crate::backends::{BACKENDS_CONDITION_TYPE, BackendsState, FAILOVER_CONDITION_TYPE};

/// The Service condition tools can wait on (`kubectl wait --for=condition=...`).
pub const CONDITION_TYPE: &str = ringlb_crds::service::CONDITION_IP_ALLOCATED;
/// The one field manager every write of the controller uses.
pub const FIELD_MANAGER: &str = "ringlb-controller";

/// What the controller wants the status to say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WantedStatus {
    /// These VIPs, condition True.
    Allocated(Vec<IpAddr>),
    /// Condition False with this reason and message; ingress left as it is.
    Refused { reason: String, message: String },
    /// Not ours any more: our ingress and our condition removed.
    Clear,
}

/// (status, reason, message) of the condition to write.
type CondWant<'a> = Option<(&'a str, String, String)>;

/// Every condition type this controller writes (and so replaces in the list).
const OUR_TYPES: [&str; 4] = [
    CONDITION_TYPE,
    BACKENDS_CONDITION_TYPE,
    FAILOVER_CONDITION_TYPE,
    ANNOUNCED_CONDITION_TYPE,
];

fn condition<'a>(svc: &'a Service, type_: &str) -> Option<&'a Condition> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The condition to write, keeping `lastTransitionTime` while the status holds.
fn build(
    existing: Option<&Condition>,
    type_: &str,
    (status, reason, message): (&str, String, String),
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = match existing {
        Some(e) if e.status == status => e.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason,
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

fn differs(want: Option<&Condition>, existing: Option<&Condition>) -> bool {
    match (want, existing) {
        (Some(c), Some(e)) => {
            c.status != e.status
                || c.reason != e.reason
                || c.message != e.message
                || c.observed_generation != e.observed_generation
        }
        (None, None) => false,
        _ => true,
    }
}

/// Whether the Service carries anything this controller wrote.
pub fn has_our_status(svc: &Service) -> bool {
    OUR_TYPES.iter().any(|t| condition(svc, t).is_some())
}

fn current_ingress(svc: &Service) -> Vec<(Option<String>, Option<String>)> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| {
            i.iter()
                .map(|i| (i.ip.clone(), i.ip_mode.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The status merge patch to send, or `None` when nothing would change.
///
/// `backends` is the `ringlb.io/BackendsReady` condition to write, with the
/// `ringlb.io/FailoverActive` one (removed when it has none) and the
/// `ringlb.io/Announced` one (left as it is when it has none); `None` leaves all
/// three as they are (the EndpointSlices are not listed yet). [`WantedStatus::Clear`] removes
/// all of this controller's conditions; other writers' conditions are kept.
pub fn status_patch(
    svc: &Service,
    wanted: &WantedStatus,
    backends: Option<&BackendsState>,
    now: Time,
) -> Option<Value> {
    let generation = svc.metadata.generation;
    let others: Vec<Condition> = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !OUR_TYPES.contains(&c.type_.as_str()))
        .collect();
    let existing = condition(svc, CONDITION_TYPE);
    let existing_backends = condition(svc, BACKENDS_CONDITION_TYPE);
    let existing_failover = condition(svc, FAILOVER_CONDITION_TYPE);
    let existing_announced = condition(svc, ANNOUNCED_CONDITION_TYPE);

    let (want_ingress, want_cond): (Option<Vec<IpAddr>>, CondWant) = match wanted {
        WantedStatus::Allocated(ips) => (
            Some(ips.clone()),
            Some((
                "True",
                "Allocated".to_string(),
                format!(
                    "allocated {}",
                    ips.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        ),
        WantedStatus::Refused { reason, message } => {
            (None, Some(("False", reason.clone(), message.clone())))
        }
        WantedStatus::Clear => (Some(Vec::new()), None),
    };

    // An API server without the LoadBalancerIPMode feature drops `ipMode`: a missing
    // mode is not a difference, or every reconcile would patch (and announce) again.
    let ingress_changed = want_ingress.as_ref().is_some_and(|ips| {
        let current = current_ingress(svc);
        current.len() != ips.len()
            || ips.iter().zip(&current).any(|(ip, (cur_ip, cur_mode))| {
                cur_ip.as_deref() != Some(ip.to_string().as_str())
                    || cur_mode.as_deref().is_some_and(|m| m != "VIP")
            })
    });
    let cond = want_cond.map(|w| build(existing, CONDITION_TYPE, w, generation, &now));
    let backends_cond = match (wanted, backends) {
        (WantedStatus::Clear, _) => None,
        (_, Some(b)) => {
            let status = if b.ready { "True" } else { "False" };
            let w = (status, b.reason.to_string(), b.message.clone());
            let t = BACKENDS_CONDITION_TYPE;
            Some(build(existing_backends, t, w, generation, &now))
        }
        (_, None) => existing_backends.cloned(),
    };
    let failover_cond = match (wanted, backends) {
        (WantedStatus::Clear, _) => None,
        (_, Some(b)) => b.failover.as_ref().map(|f| {
            let status = if f.active { "True" } else { "False" };
            let w = (status, f.reason.to_string(), f.message.clone());
            build(
                existing_failover,
                FAILOVER_CONDITION_TYPE,
                w,
                generation,
                &now,
            )
        }),
        (_, None) => existing_failover.cloned(),
    };
    let announced_cond = match (wanted, backends.and_then(|b| b.announced.as_ref())) {
        (WantedStatus::Clear, _) => None,
        (_, Some(a)) => {
            let status = if a.announced { "True" } else { "False" };
            let w = (status, a.reason.to_string(), a.message.clone());
            let t = ANNOUNCED_CONDITION_TYPE;
            Some(build(existing_announced, t, w, generation, &now))
        }
        (_, None) => existing_announced.cloned(),
    };
    let cond_changed = differs(cond.as_ref(), existing)
        || differs(backends_cond.as_ref(), existing_backends)
        || differs(failover_cond.as_ref(), existing_failover)
        || differs(announced_cond.as_ref(), existing_announced);
    if !ingress_changed && !cond_changed {
        return None;
    }
    let mut status = serde_json::Map::new();
    if let Some(ips) = want_ingress {
        let ingress: Vec<Value> = ips
            .iter()
            .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"}))
            .collect();
        status.insert(
            "loadBalancer".into(),
            if ingress.is_empty() {
                json!({ "ingress": null })
            } else {
                json!({ "ingress": ingress })
            },
        );
    }
    if cond_changed {
        let mut all = others;
        all.extend(cond);
        all.extend(backends_cond);
        all.extend(failover_cond);
        all.extend(announced_cond);
        status.insert(
            "conditions".into(),
            if all.is_empty() {
                Value::Null
            } else {
                serde_json::to_value(all).unwrap_or(Value::Null)
            },
        );
    }
    let mut patch = json!({ "status": status });
    if let Some(rv) = &svc.metadata.resource_version {
        // A precondition: the patch fails with 409 if the Service changed meanwhile,
        // so the full `conditions` list never overwrites someone else's update.
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
    use k8s_openapi::jiff::Timestamp;

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn apply(svc: &mut Service, patch: &Value) {
        let mut v = serde_json::to_value(&*svc).unwrap();
        json_merge(&mut v, patch);
        *svc = serde_json::from_value(v).unwrap();
    }

    fn json_merge(a: &mut Value, b: &Value) {
        if let (Value::Object(a), Value::Object(b)) = (&mut *a, b) {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(k);
                } else {
                    json_merge(a.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        } else {
            *a = b.clone();
        }
    }

    #[test]
    fn allocated_then_idempotent() {
        let mut svc = Service::default();
        let ips = vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
        let p = status_patch(&svc, &WantedStatus::Allocated(ips.clone()), None, t(10)).unwrap();
        assert_eq!(
            p["status"]["loadBalancer"]["ingress"],
            json!([{"ip": "192.0.2.1", "ipMode": "VIP"}, {"ip": "2001:db8::1", "ipMode": "VIP"}])
        );
        apply(&mut svc, &p);
        assert_eq!(
            status_patch(&svc, &WantedStatus::Allocated(ips.clone()), None, t(20)),
            None
        );
        assert!(has_our_status(&svc));
        // A server without the LoadBalancerIPMode feature drops ipMode: still no patch.
        for ing in svc
            .status
            .as_mut()
            .unwrap()
            .load_balancer
            .as_mut()
            .unwrap()
            .ingress
            .as_mut()
            .unwrap()
        {
            ing.ip_mode = None;
        }
        assert_eq!(
            status_patch(&svc, &WantedStatus::Allocated(ips.clone()), None, t(30)),
            None
        );
        // A different mode, or a different address, is a change.
        svc.status
            .as_mut()
            .unwrap()
            .load_balancer
            .as_mut()
            .unwrap()
            .ingress
            .as_mut()
            .unwrap()[0]
            .ip_mode = Some("Proxy".into());
        assert!(status_patch(&svc, &WantedStatus::Allocated(ips), None, t(40)).is_some());
    }

    #[test]
    fn refusal_keeps_ingress_and_other_conditions_and_transition_time() {
        let mut svc = Service {
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some("192.0.2.9".into()),
                        ..Default::default()
                    }]),
                }),
                conditions: Some(vec![foreign_condition()]),
            }),
            ..Default::default()
        };
        let refused = WantedStatus::Refused {
            reason: "PoolExhausted".into(),
            message: "full".into(),
        };
        let p = status_patch(&svc, &refused, None, t(10)).unwrap();
        assert!(p["status"].get("loadBalancer").is_none());
        apply(&mut svc, &p);
        let conds = svc.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[1].status, "False");
        // Same refusal: no write. A new message: write, transition time kept.
        assert_eq!(status_patch(&svc, &refused, None, t(20)), None);
        let refused2 = WantedStatus::Refused {
            reason: "PoolExhausted".into(),
            message: "still full".into(),
        };
        let p = status_patch(&svc, &refused2, None, t(30)).unwrap();
        apply(&mut svc, &p);
        let c = condition(&svc, CONDITION_TYPE).unwrap();
        assert_eq!(
            (c.message.as_str(), c.last_transition_time.clone()),
            ("still full", t(10))
        );
        // Clear removes our condition and the ingress, keeps the other condition.
        let p = status_patch(&svc, &WantedStatus::Clear, None, t(40)).unwrap();
        apply(&mut svc, &p);
        assert!(!has_our_status(&svc));
        assert_eq!(
            svc.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            1
        );
        assert!(crate::ipam::request::status_ips(&svc).is_empty());
        assert_eq!(status_patch(&svc, &WantedStatus::Clear, None, t(50)), None);
    }

    fn backends(ready: bool, reason: &'static str, message: &str) -> BackendsState {
        BackendsState {
            ready,
            reason,
            message: message.into(),
            failover: None,
            announced: None,
        }
    }

    fn types(svc: &Service) -> Vec<(String, String)> {
        let conds = svc.status.as_ref().unwrap().conditions.as_ref().unwrap();
        conds
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    }

    /// A condition another writer owns, which every patch must keep.
    fn foreign_condition() -> Condition {
        Condition {
            type_: "other.io/Thing".into(),
            status: "True".into(),
            reason: "X".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: t(1),
        }
    }

    #[test]
    fn both_conditions_are_kept_and_each_changes_alone() {
        let mut svc = Service {
            status: Some(ServiceStatus {
                conditions: Some(vec![foreign_condition()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let alloc = WantedStatus::Allocated(vec!["192.0.2.1".parse().unwrap()]);
        let up = backends(true, "BackendsReady", "80/TCP 2");
        let p = status_patch(&svc, &alloc, Some(&up), t(10)).unwrap();
        apply(&mut svc, &p);
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            types(&svc),
            [
                s("other.io/Thing", "True"),
                s(CONDITION_TYPE, "True"),
                s(BACKENDS_CONDITION_TYPE, "True")
            ]
        );
        assert_eq!(status_patch(&svc, &alloc, Some(&up), t(20)), None);
        // The EndpointSlices not listed yet: the backends condition is left as it is.
        assert_eq!(status_patch(&svc, &alloc, None, t(20)), None);

        // Backends go away: only that condition flips; the allocation keeps its time.
        let down = backends(false, "NoReadyBackends", "80/TCP 0");
        let p = status_patch(&svc, &alloc, Some(&down), t(30)).unwrap();
        apply(&mut svc, &p);
        assert_eq!(crate::ipam::request::status_ips(&svc).len(), 1);
        let b = condition(&svc, BACKENDS_CONDITION_TYPE).unwrap();
        assert_eq!(
            (b.status.as_str(), b.reason.as_str()),
            ("False", "NoReadyBackends")
        );
        assert_eq!(b.last_transition_time, t(30));
        assert_eq!(
            condition(&svc, CONDITION_TYPE)
                .unwrap()
                .last_transition_time,
            t(10)
        );
        assert_eq!(types(&svc).len(), 3);

        // A refusal rewrites the allocation condition and keeps the backends one.
        let refused = WantedStatus::Refused {
            reason: "PoolExhausted".into(),
            message: "full".into(),
        };
        let p = status_patch(&svc, &refused, None, t(40)).unwrap();
        apply(&mut svc, &p);
        assert_eq!(
            types(&svc),
            [
                s("other.io/Thing", "True"),
                s(CONDITION_TYPE, "False"),
                s(BACKENDS_CONDITION_TYPE, "False")
            ]
        );
        // Back up: True again, with a new transition time.
        let p = status_patch(&svc, &refused, Some(&up), t(50)).unwrap();
        apply(&mut svc, &p);
        let b = condition(&svc, BACKENDS_CONDITION_TYPE).unwrap();
        assert_eq!(
            (b.status.as_str(), b.last_transition_time.clone()),
            ("True", t(50))
        );

        // Clear removes both of ours, keeps the other writer's.
        let p = status_patch(&svc, &WantedStatus::Clear, Some(&up), t(60)).unwrap();
        apply(&mut svc, &p);
        assert_eq!(types(&svc), [s("other.io/Thing", "True")]);
        assert!(!has_our_status(&svc));
        // Only the backends condition left (an older controller wrote the other):
        // still ours, still cleared.
        let p = status_patch(&Service::default(), &alloc, Some(&up), t(70)).unwrap();
        let mut only = Service::default();
        apply(&mut only, &p);
        only.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .remove(0);
        assert!(has_our_status(&only));
    }

    #[test]
    fn the_failover_condition_follows_the_backends_and_leaves_with_the_annotation() {
        use crate::backends::FailoverState;
        let mut svc = Service::default();
        let alloc = WantedStatus::Allocated(vec!["192.0.2.1".parse().unwrap()]);
        let failover = |active, reason: &'static str| FailoverState {
            active,
            reason,
            message: "m".into(),
        };
        let mut down = backends(false, "NoReadyBackends", "80/TCP 0");
        down.failover = Some(failover(true, "NoReadyBackends"));
        let p = status_patch(&svc, &alloc, Some(&down), t(10)).unwrap();
        apply(&mut svc, &p);
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        let step = |svc: &mut Service, w: &WantedStatus, b: &BackendsState, at| {
            let p = status_patch(svc, w, Some(b), t(at)).unwrap();
            apply(svc, &p);
        };
        assert_eq!(
            types(&svc),
            [
                s(CONDITION_TYPE, "True"),
                s(BACKENDS_CONDITION_TYPE, "False"),
                s(FAILOVER_CONDITION_TYPE, "True")
            ]
        );
        assert_eq!(status_patch(&svc, &alloc, Some(&down), t(20)), None);
        assert_eq!(
            status_patch(&svc, &alloc, None, t(20)),
            None,
            "slices not listed"
        );
        let mut up = backends(true, "BackendsReady", "80/TCP 1");
        up.failover = Some(failover(false, "LocalBackendsReady"));
        step(&mut svc, &alloc, &up, 30);
        let f = condition(&svc, FAILOVER_CONDITION_TYPE).unwrap();
        assert_eq!(
            (f.status.as_str(), f.last_transition_time.clone()),
            ("False", t(30))
        );
        // The annotation removed: the condition goes; Clear removes it too.
        step(&mut svc, &alloc, &backends(true, "BackendsReady", ""), 40);
        assert!(condition(&svc, FAILOVER_CONDITION_TYPE).is_none());
        step(&mut svc, &alloc, &down, 50);
        step(&mut svc, &WantedStatus::Clear, &down, 60);
        assert!(!has_our_status(&svc));
    }

    #[test]
    fn the_announced_condition_is_written_kept_and_cleared() {
        let mut svc = Service::default();
        let alloc = WantedStatus::Allocated(vec!["10.9.1.0".parse().unwrap()]);
        let mut b = backends(true, "BackendsReady", "80/TCP 2");
        b.announced = Some(crate::announce::AnnouncedState {
            announced: false,
            reason: "NoAdvertisement",
            message: "not announced: 10.9.1.0: no BGPAdvertisement selects a pool covering it"
                .into(),
        });
        let p = status_patch(&svc, &alloc, Some(&b), t(10)).unwrap();
        apply(&mut svc, &p);
        let found = |svc: &Service| condition(svc, ANNOUNCED_CONDITION_TYPE).cloned();
        let c = found(&svc).expect("written");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "NoAdvertisement")
        );
        // facts not known (None): left as it is, nothing to write
        b.announced = None;
        assert_eq!(status_patch(&svc, &alloc, Some(&b), t(20)), None);
        // a flip alone is a write, with a new transition time
        b.announced = Some(crate::announce::AnnouncedState {
            announced: true,
            reason: "Announced",
            message: "offered 10.9.1.0 to BGPPeer tor from 2 edge(s)".into(),
        });
        let p = status_patch(&svc, &alloc, Some(&b), t(30)).unwrap();
        apply(&mut svc, &p);
        let c = found(&svc).unwrap();
        assert_eq!(
            (c.status.as_str(), c.last_transition_time.clone()),
            ("True", t(30))
        );
        // Clear removes it with the others
        let p = status_patch(&svc, &WantedStatus::Clear, None, t(40)).unwrap();
        apply(&mut svc, &p);
        assert!(found(&svc).is_none());
    }
}
