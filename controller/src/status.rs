//! What a Service's status should say, as pure functions: given the Service as it
//! is and what the allocator decided, the merge patch to send (or `None` when the
//! status already says it).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

/// The Service condition tools can wait on (`kubectl wait --for=condition=...`).
pub const CONDITION_TYPE: &str = "ringlb.io/IPAllocated";
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

fn our_condition(svc: &Service) -> Option<&Condition> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_TYPE)
}

/// Whether the Service carries anything this controller wrote.
pub fn has_our_status(svc: &Service) -> bool {
    our_condition(svc).is_some()
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
pub fn status_patch(svc: &Service, wanted: &WantedStatus, now: Time) -> Option<Value> {
    let generation = svc.metadata.generation;
    let others: Vec<Condition> = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != CONDITION_TYPE)
        .collect();
    let existing = our_condition(svc);

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
    let cond = want_cond.map(|(status, reason, message)| {
        let same_status = existing.is_some_and(|c| c.status == status);
        Condition {
            type_: CONDITION_TYPE.to_string(),
            status: status.to_string(),
            reason,
            message,
            observed_generation: generation,
            last_transition_time: if same_status {
                existing
                    .map(|c| c.last_transition_time.clone())
                    .unwrap_or(now.clone())
            } else {
                now.clone()
            },
        }
    });
    let cond_changed = match (&cond, existing) {
        (Some(c), Some(e)) => {
            c.status != e.status
                || c.reason != e.reason
                || c.message != e.message
                || c.observed_generation != e.observed_generation
        }
        (None, None) => false,
        _ => true,
    };
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
        let p = status_patch(&svc, &WantedStatus::Allocated(ips.clone()), t(10)).unwrap();
        assert_eq!(
            p["status"]["loadBalancer"]["ingress"],
            json!([{"ip": "192.0.2.1", "ipMode": "VIP"}, {"ip": "2001:db8::1", "ipMode": "VIP"}])
        );
        apply(&mut svc, &p);
        assert_eq!(
            status_patch(&svc, &WantedStatus::Allocated(ips.clone()), t(20)),
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
            status_patch(&svc, &WantedStatus::Allocated(ips.clone()), t(30)),
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
        assert!(status_patch(&svc, &WantedStatus::Allocated(ips), t(40)).is_some());
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
                conditions: Some(vec![Condition {
                    type_: "other.io/Thing".into(),
                    status: "True".into(),
                    reason: "X".into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: t(1),
                }]),
            }),
            ..Default::default()
        };
        let refused = WantedStatus::Refused {
            reason: "PoolExhausted".into(),
            message: "full".into(),
        };
        let p = status_patch(&svc, &refused, t(10)).unwrap();
        assert!(p["status"].get("loadBalancer").is_none());
        apply(&mut svc, &p);
        let conds = svc.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[1].status, "False");
        // Same refusal: no write. A new message: write, transition time kept.
        assert_eq!(status_patch(&svc, &refused, t(20)), None);
        let refused2 = WantedStatus::Refused {
            reason: "PoolExhausted".into(),
            message: "still full".into(),
        };
        let p = status_patch(&svc, &refused2, t(30)).unwrap();
        apply(&mut svc, &p);
        let c = our_condition(&svc).unwrap();
        assert_eq!(
            (c.message.as_str(), c.last_transition_time.clone()),
            ("still full", t(10))
        );
        // Clear removes our condition and the ingress, keeps the other condition.
        let p = status_patch(&svc, &WantedStatus::Clear, t(40)).unwrap();
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
        assert_eq!(status_patch(&svc, &WantedStatus::Clear, t(50)), None);
    }
}
