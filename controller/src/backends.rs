//! The `ringlb.io/BackendsReady` Service condition, as a pure function of the Service
//! and its EndpointSlices: whether every TCP/UDP port of the Service has at least
//! `ringlb.io/min-ready-backends` endpoints that take new flows, counted by the rule
//! the edges forward by ([`endpoint_takes_new_flows`]).
//!
//! Beside it, on a Service with `ringlb.io/failover-vip` only, the
//! `ringlb.io/FailoverActive` condition: `True` while a port has no endpoint taking
//! new flows (the edges send that port's new flows to the failover VIP).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_crds::failover::{self, ANNOTATION_FAILOVER_VIP};
use ringlb_crds::service::{
    ANNOTATION_MIN_READY, endpoint_takes_new_flows, parse_min_ready, status_ips,
};

/// The condition type.
pub const BACKENDS_CONDITION_TYPE: &str = ringlb_crds::service::CONDITION_BACKENDS_READY;
/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The FailoverActive condition type.
pub const FAILOVER_CONDITION_TYPE: &str = failover::CONDITION_FAILOVER_ACTIVE;

/// What the condition should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendsState {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
    /// The FailoverActive condition; `None` on a Service without a failover VIP.
    pub failover: Option<FailoverState>,
}

/// What the FailoverActive condition should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverState {
    pub active: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The FailoverActive condition from the ready count of each port (`"80/TCP"`, n);
/// `None` without the annotation, `False`/`InvalidFailoverVIP` with a bad one.
fn failover_state(svc: &Service, counts: &[(String, usize)]) -> Option<FailoverState> {
    let ann = svc.metadata.annotations.as_ref();
    ann?.get(ANNOTATION_FAILOVER_VIP)?;
    let spec = failover::from_annotations(ann, &status_ips(svc));
    let Some(remote) = spec.remote else {
        return Some(FailoverState {
            active: false,
            reason: "InvalidFailoverVIP",
            message: spec.problems.join("; "),
        });
    };
    let empty: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(p, _)| p.as_str())
        .collect();
    let mut state = if empty.is_empty() {
        let share = match spec.weight {
            0 => "no new flows".to_string(),
            w => format!("{w}% of new flows"),
        };
        FailoverState {
            active: false,
            reason: "LocalBackendsReady",
            message: format!("every port has ready endpoints; failover VIP {remote} takes {share}"),
        }
    } else {
        FailoverState {
            active: true,
            reason: "NoReadyBackends",
            message: format!(
                "no ready endpoint on {}: the edges send its new flows to failover VIP {remote}",
                empty.join(", ")
            ),
        }
    };
    if !spec.problems.is_empty() {
        state.message = format!("{}; {}", state.message, spec.problems.join("; "));
    }
    Some(state)
}

/// Whether `slice` belongs to `svc` (same namespace, `kubernetes.io/service-name`).
pub fn slice_of(slice: &EndpointSlice, svc: &Service) -> bool {
    slice.metadata.namespace == svc.metadata.namespace
        && slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            == svc.metadata.name.as_ref()
}

/// Distinct addresses of endpoints taking new flows for one Service port (matched in
/// each slice by port name and protocol, as the edges match it).
fn ready_count<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    port_name: &str,
    protocol: &str,
) -> usize {
    let mut addrs = BTreeSet::new();
    for slice in slices {
        let matches = slice.ports.iter().flatten().any(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && p.protocol.as_deref().unwrap_or("TCP") == protocol
                && p.port.is_some()
        });
        if !matches {
            continue;
        }
        for ep in &slice.endpoints {
            if endpoint_takes_new_flows(ep.conditions.as_ref())
                && let Some(a) = ep.addresses.first()
            {
                addrs.insert(a.as_str());
            }
        }
    }
    addrs.len()
}

/// The condition for `svc`, given (at least) its EndpointSlices.
pub fn backends_state(svc: &Service, slices: &[&EndpointSlice]) -> BackendsState {
    let annotation = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MIN_READY));
    let parsed = annotation.map(|v| parse_min_ready(v));
    let min = parsed.flatten().unwrap_or(1);
    let own: Vec<&EndpointSlice> = slices
        .iter()
        .copied()
        .filter(|s| slice_of(s, svc))
        .collect();
    let mut counts = Vec::new();
    for port in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        if protocol != "TCP" && protocol != "UDP" {
            continue; // the edges forward TCP and UDP only
        }
        let n = ready_count(
            own.iter().copied(),
            port.name.as_deref().unwrap_or(""),
            protocol,
        );
        counts.push((format!("{}/{protocol}", port.port), n));
    }
    let lowest = counts.iter().map(|(_, n)| *n).min().unwrap_or(0);
    let (ready, reason) = if lowest == 0 {
        (false, "NoReadyBackends")
    } else if lowest < min as usize {
        (false, "BelowMinReady")
    } else {
        (true, "BackendsReady")
    };
    let mut message = if counts.is_empty() {
        "no TCP or UDP port to serve".to_string()
    } else {
        let per_port: Vec<String> = counts.iter().map(|(p, n)| format!("{p} {n}")).collect();
        format!(
            "ready backends per port: {}; at least {min} needed ({ANNOTATION_MIN_READY})",
            per_port.join(", ")
        )
    };
    if let (Some(v), Some(None)) = (annotation, parsed) {
        message.push_str(&format!(
            "; {ANNOTATION_MIN_READY}={v:?} is not a whole number >= 1, using 1"
        ));
    }
    BackendsState {
        ready,
        reason,
        message,
        failover: failover_state(svc, &counts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn svc(annotations: Value, ports: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": ports}
        }))
        .unwrap()
    }

    fn slice(ns: &str, svc: &str, ports: Value, eps: Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{svc}-x"), "namespace": ns,
                         "labels": {SERVICE_NAME_LABEL: svc}},
            "addressType": "IPv4", "ports": ports, "endpoints": eps
        }))
        .unwrap()
    }

    fn ep(ip: &str, ready: bool, terminating: bool) -> Value {
        json!({"addresses": [ip], "conditions": {"ready": ready, "terminating": terminating}})
    }

    fn http() -> Value {
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    }

    #[test]
    fn counts_ready_endpoints_not_terminating_ones() {
        let s = svc(json!({}), json!([{"name": "http", "port": 80}]));
        let eps = json!([
            ep("10.0.0.1", true, false),
            ep("10.0.0.2", false, false),
            ep("10.0.0.3", true, true)
        ]);
        let sl = slice("shop", "web", http(), eps);
        let st = backends_state(&s, &[&sl]);
        assert!(st.ready, "{st:?}");
        assert_eq!(st.reason, "BackendsReady");
        assert!(st.message.contains("80/TCP 1;"), "{}", st.message);
    }

    #[test]
    fn no_ready_endpoint_or_no_slice_is_no_ready_backends() {
        let s = svc(json!({}), json!([{"name": "http", "port": 80}]));
        let sl = slice("shop", "web", http(), json!([ep("10.0.0.2", false, false)]));
        for slices in [vec![&sl], vec![]] {
            let st = backends_state(&s, &slices);
            assert_eq!((st.ready, st.reason), (false, "NoReadyBackends"), "{st:?}");
        }
    }

    #[test]
    fn other_services_slices_and_other_ports_do_not_count() {
        let s = svc(json!({}), json!([{"name": "http", "port": 80}]));
        let ready = json!([ep("10.0.0.1", true, false)]);
        let other_ns = slice("prod", "web", http(), ready.clone());
        let other_svc = slice("shop", "api", http(), ready.clone());
        let other_port = slice(
            "shop",
            "web",
            json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
            ready,
        );
        let st = backends_state(&s, &[&other_ns, &other_svc, &other_port]);
        assert_eq!(st.reason, "NoReadyBackends", "{st:?}");
    }

    #[test]
    fn below_the_annotation_is_below_min_ready_per_port() {
        let ports = json!([{"name": "http", "port": 80},
                           {"name": "dns", "port": 53, "protocol": "UDP"}]);
        let s = svc(json!({ANNOTATION_MIN_READY: "2"}), ports);
        let a = slice(
            "shop",
            "web",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!([ep("10.0.0.1", true, false)]),
        );
        // A second slice adds one more ready endpoint to http only.
        let b = slice("shop", "web", http(), json!([ep("10.0.0.2", true, false)]));
        let st = backends_state(&s, &[&a, &b]);
        assert_eq!((st.ready, st.reason), (false, "BelowMinReady"), "{st:?}");
        assert_eq!(
            st.message,
            "ready backends per port: 80/TCP 2, 53/UDP 1; at least 2 needed \
             (ringlb.io/min-ready-backends)"
        );
        // One address listed in two slices counts once.
        let dup = slice("shop", "web", http(), json!([ep("10.0.0.1", true, false)]));
        let st = backends_state(&s, &[&a, &dup]);
        assert!(st.message.contains("80/TCP 1,"), "{}", st.message);
    }

    #[test]
    fn a_bad_annotation_falls_back_to_one_and_says_so() {
        let s = svc(
            json!({ANNOTATION_MIN_READY: "zero"}),
            json!([{"name": "http", "port": 80}]),
        );
        let sl = slice("shop", "web", http(), json!([ep("10.0.0.1", true, false)]));
        let st = backends_state(&s, &[&sl]);
        assert!(st.ready, "{st:?}");
        assert!(
            st.message.contains("\"zero\" is not a whole number"),
            "{st:?}"
        );
    }

    #[test]
    fn failover_active_only_with_a_failover_vip_while_a_port_has_no_ready_endpoint() {
        let ports = json!([{"name": "http", "port": 80}]);
        let ready = slice("shop", "web", http(), json!([ep("10.0.0.1", true, false)]));
        let gone = slice("shop", "web", http(), json!([ep("10.0.0.1", false, false)]));
        assert_eq!(
            backends_state(&svc(json!({}), ports.clone()), &[&gone]).failover,
            None
        );
        let fo = svc(
            json!({ANNOTATION_FAILOVER_VIP: "198.51.100.7", "ringlb.io/failover-weight": "1"}),
            ports.clone(),
        );
        let st = backends_state(&fo, &[&ready]).failover.unwrap();
        assert_eq!(
            (st.active, st.reason),
            (false, "LocalBackendsReady"),
            "{st:?}"
        );
        assert_eq!(
            st.message,
            "every port has ready endpoints; failover VIP 198.51.100.7 takes 1% of new flows"
        );
        for slices in [vec![&gone], vec![]] {
            let st = backends_state(&fo, &slices).failover.unwrap();
            assert_eq!((st.active, st.reason), (true, "NoReadyBackends"), "{st:?}");
            assert_eq!(
                st.message,
                "no ready endpoint on 80/TCP: the edges send its new flows to failover VIP \
                 198.51.100.7"
            );
        }
        // A bad value: False, and the message says why (the edges only log it).
        let bad = svc(json!({ANNOTATION_FAILOVER_VIP: "region-b"}), ports);
        let st = backends_state(&bad, &[&gone]).failover.unwrap();
        assert_eq!((st.active, st.reason), (false, "InvalidFailoverVIP"));
        assert!(st.message.contains("not an IPv4 address"), "{st:?}");
    }
}
