//! `spec.sessionAffinity` and `spec.sessionAffinityConfig.clientIP.timeoutSeconds`
//! -> a Service's client affinity. Pure.
//!
//! `ClientIP` turns it on with the timeout (default 10800 s, valid 1..=86400, as the
//! API server validates it); `None` or no value turns it off. A timeout out of range
//! is reported and the default used; an unknown value is reported and the Service
//! served without affinity.

use k8s_openapi::api::core::v1::Service;

/// The timeout kube-proxy and the API use when none is given (3 hours).
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 10_800;
/// The longest timeout the API accepts (a day).
pub const MAX_TIMEOUT_SECONDS: u32 = 86_400;

/// A Service's client affinity and what was wrong with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Affinity {
    /// `Some(timeout in seconds)`: every connection of one client to the same pod.
    pub client_ip: Option<u32>,
    /// One line per problem, naming the field and the value (for a Warning Event).
    pub problems: Vec<String>,
}

/// The client affinity of `svc`.
pub fn of_service(svc: &Service) -> Affinity {
    let Some(spec) = svc.spec.as_ref() else {
        return Affinity::default();
    };
    let mut out = Affinity::default();
    match spec.session_affinity.as_deref() {
        None | Some("None") => return out,
        Some("ClientIP") => {}
        Some(other) => {
            out.problems.push(format!(
                "spec.sessionAffinity: {other:?} is neither \"ClientIP\" nor \"None\"; \
                 served without affinity"
            ));
            return out;
        }
    }
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    out.client_ip = Some(match timeout {
        None => DEFAULT_TIMEOUT_SECONDS,
        Some(t) if (1..=i64::from(MAX_TIMEOUT_SECONDS)).contains(&i64::from(t)) => t as u32,
        Some(t) => {
            out.problems.push(format!(
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds: {t} is outside \
                 1..={MAX_TIMEOUT_SECONDS}; {DEFAULT_TIMEOUT_SECONDS} is used"
            ));
            DEFAULT_TIMEOUT_SECONDS
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(spec: serde_json::Value) -> Service {
        let mut s = json!({"metadata": {"name": "web", "namespace": "default"},
                           "spec": {"type": "LoadBalancer"}});
        for (k, v) in spec.as_object().unwrap() {
            s["spec"][k] = v.clone();
        }
        serde_json::from_value(s).unwrap()
    }

    #[test]
    fn off_unless_client_ip() {
        assert_eq!(of_service(&svc(json!({}))), Affinity::default());
        assert_eq!(
            of_service(&svc(json!({"sessionAffinity": "None"}))),
            Affinity::default()
        );
        let a = of_service(&svc(json!({"sessionAffinity": "Cookie"})));
        assert_eq!(a.client_ip, None);
        assert!(
            a.problems[0].contains("spec.sessionAffinity: \"Cookie\""),
            "{a:?}"
        );
    }

    #[test]
    fn client_ip_with_the_default_or_a_valid_timeout() {
        let a = of_service(&svc(json!({"sessionAffinity": "ClientIP"})));
        assert_eq!(a.client_ip, Some(10_800));
        assert!(a.problems.is_empty());
        for t in [1, 60, 86_400] {
            let a = of_service(&svc(json!({"sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": t}}})));
            assert_eq!((a.client_ip, a.problems.len()), (Some(t as u32), 0));
        }
    }

    #[test]
    fn a_timeout_out_of_range_is_reported_and_the_default_used() {
        for t in [0, -5, 86_401] {
            let a = of_service(&svc(json!({"sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": t}}})));
            assert_eq!(a.client_ip, Some(DEFAULT_TIMEOUT_SECONDS));
            let p = &a.problems[0];
            assert!(
                p.contains("spec.sessionAffinityConfig.clientIP.timeoutSeconds")
                    && p.contains(&t.to_string())
                    && p.contains("10800 is used"),
                "{p}"
            );
        }
    }
}
