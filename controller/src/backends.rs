//! The `ringlb.io/BackendsReady` Service condition, as a pure function of the Service
//! and its EndpointSlices: whether every TCP/UDP port of the Service has at least
//! `ringlb.io/min-ready-backends` endpoints that take new flows, counted by the rule
//! the edges forward by ([`endpoint_takes_new_flows`]). The edges serve a VIP only
//! from endpoints of its own family, so each port is counted per family of the
//! Service's VIPs: a dual-stack Service whose pods are IPv4-only has no backend for
//! its IPv6 VIP (`False`/`NoEndpointsOfFamily`, the message names the VIP).
//!
//! Beside it, on a Service with `ringlb.io/failover-vip` only, the
//! `ringlb.io/FailoverActive` condition: `True` while a port has no endpoint taking
//! new flows (the edges send that port's new flows to the failover VIP).

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointConditions;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_crds::failover::{self, ANNOTATION_FAILOVER_VIP};
use ringlb_crds::service::{
    ANNOTATION_MIN_READY, endpoint_serving_terminating, endpoint_takes_new_flows, parse_min_ready,
};

use crate::ipam::Family;

/// The condition type.
pub const BACKENDS_CONDITION_TYPE: &str = ringlb_crds::service::CONDITION_BACKENDS_READY;
/// The reason of a False condition for a VIP none of whose pods has an address of
/// its family (the edges do not announce it).
pub const NO_ENDPOINTS_OF_FAMILY: &str = "NoEndpointsOfFamily";
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
    /// The `ringlb.io/Announced` condition; `None` leaves it as it is (no VIP yet, or
    /// the BGP objects are not listed yet).
    pub announced: Option<crate::announce::AnnouncedState>,
}

/// What the FailoverActive condition should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverState {
    pub active: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The ready endpoints of one Service port (`"80/TCP"`): per family of the
/// Service's VIPs, in the VIPs' order (empty without a VIP), and over both families.
struct PortCount {
    port: String,
    by_family: Vec<(Family, usize)>,
    total: usize,
}

impl PortCount {
    /// The count the edges serve a VIP of `family` with; without a VIP, the total.
    fn of(&self, family: Family) -> usize {
        self.by_family
            .iter()
            .find(|(f, _)| *f == family)
            .map_or(self.total, |(_, n)| *n)
    }

    /// The count that decides the condition: the lowest over the VIPs' families.
    fn lowest(&self) -> usize {
        self.by_family
            .iter()
            .map(|(_, n)| *n)
            .min()
            .unwrap_or(self.total)
    }

    /// `80/TCP 2`, or per family with VIPs of both: `80/TCP IPv4 2 / IPv6 0`.
    fn describe(&self) -> String {
        match self.by_family.as_slice() {
            [_, _, ..] => {
                let each: Vec<String> = self
                    .by_family
                    .iter()
                    .map(|(f, n)| format!("{} {n}", f.k8s_name()))
                    .collect();
                format!("{} {}", self.port, each.join(" / "))
            }
            _ => format!("{} {}", self.port, self.lowest()),
        }
    }
}

/// The FailoverActive condition from the ready counts of each port (those of the
/// failover VIP's family: the VIP of that family is the one that fails over);
/// `None` without the annotation, `False`/`InvalidFailoverVIP` with a bad one.
fn failover_state(svc: &Service, vips: &[IpAddr], counts: &[PortCount]) -> Option<FailoverState> {
    let ann = svc.metadata.annotations.as_ref();
    ann?.get(ANNOTATION_FAILOVER_VIP)?;
    let spec = failover::from_annotations(ann, vips);
    let Some(remote) = spec.remote else {
        return Some(FailoverState {
            active: false,
            reason: "InvalidFailoverVIP",
            message: spec.problems.join("; "),
        });
    };
    let empty: Vec<&str> = counts
        .iter()
        .filter(|c| c.of(Family::of(&remote)) == 0)
        .map(|c| c.port.as_str())
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

/// Distinct addresses of the endpoints `which` picks for one Service port (matched
/// in each slice by port name and protocol, as the edges match it; an address that
/// is no IP, which the edges cannot forward to, is left out).
fn addresses<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    port_name: &str,
    protocol: &str,
    which: fn(Option<&EndpointConditions>) -> bool,
) -> BTreeSet<IpAddr> {
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
            if which(ep.conditions.as_ref())
                && let Some(a) = ep.addresses.first().and_then(|a| a.parse().ok())
            {
                addrs.insert(a);
            }
        }
    }
    addrs
}

/// The VIPs whose family no ready endpoint of a port has while the port has ready
/// endpoints of the other family (pods without an address of the VIP's family):
/// `"VIP 2001:db8::1 has no ready IPv6 endpoint on 80/TCP"`, one part per VIP.
fn family_gaps(vips: &[IpAddr], counts: &[PortCount]) -> Vec<String> {
    vips.iter()
        .filter_map(|vip| {
            let family = Family::of(vip);
            let ports: Vec<&str> = counts
                .iter()
                .filter(|c| c.total > 0 && c.of(family) == 0)
                .map(|c| c.port.as_str())
                .collect();
            (!ports.is_empty()).then(|| {
                format!(
                    "VIP {vip} has no ready {} endpoint on {} (its pods have no {} address; \
                     the edges do not announce it)",
                    family.k8s_name(),
                    ports.join(", "),
                    family.k8s_name()
                )
            })
        })
        .collect()
}

/// The condition for `svc` with the VIPs `vips` (its status, or the addresses about
/// to be written there), given (at least) its EndpointSlices. Without a VIP, each
/// port counts over both families.
pub fn backends_state(svc: &Service, vips: &[IpAddr], slices: &[&EndpointSlice]) -> BackendsState {
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
    // ports without a ready endpoint whose terminating ones still serve: "80/TCP 2"
    let mut terminating = Vec::new();
    for port in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        if protocol != "TCP" && protocol != "UDP" {
            continue; // the edges forward TCP and UDP only
        }
        let name = port.name.as_deref().unwrap_or("");
        let addrs = addresses(
            own.iter().copied(),
            name,
            protocol,
            endpoint_takes_new_flows,
        );
        if addrs.is_empty() {
            let t = addresses(
                own.iter().copied(),
                name,
                protocol,
                endpoint_serving_terminating,
            );
            if !t.is_empty() {
                terminating.push(format!("{}/{protocol} {}", port.port, t.len()));
            }
        }
        let mut by_family: Vec<(Family, usize)> = Vec::new();
        for family in vips.iter().map(Family::of) {
            if !by_family.iter().any(|(f, _)| *f == family) {
                let n = addrs.iter().filter(|a| Family::of(a) == family).count();
                by_family.push((family, n));
            }
        }
        counts.push(PortCount {
            port: format!("{}/{protocol}", port.port),
            by_family,
            total: addrs.len(),
        });
    }
    let lowest = counts.iter().map(PortCount::lowest).min().unwrap_or(0);
    let gaps = family_gaps(vips, &counts);
    let (ready, reason) = if counts.iter().any(|c| c.total == 0) || counts.is_empty() {
        (false, "NoReadyBackends")
    } else if !gaps.is_empty() {
        (false, NO_ENDPOINTS_OF_FAMILY)
    } else if lowest < min as usize {
        (false, "BelowMinReady")
    } else {
        (true, "BackendsReady")
    };
    let mut message = if counts.is_empty() {
        "no TCP or UDP port to serve".to_string()
    } else {
        let per_port: Vec<String> = counts.iter().map(PortCount::describe).collect();
        format!(
            "ready backends per port: {}; at least {min} needed ({ANNOTATION_MIN_READY})",
            per_port.join(", ")
        )
    };
    for gap in &gaps {
        message.push_str(&format!("; {gap}"));
    }
    if !terminating.is_empty() {
        message.push_str(&format!(
            "; terminating endpoints still serving take the new flows of a port with no \
             ready one, and the edges keep its VIP announced: {}",
            terminating.join(", ")
        ));
    }
    if let (Some(v), Some(None)) = (annotation, parsed) {
        message.push_str(&format!(
            "; {ANNOTATION_MIN_READY}={v:?} is not a whole number >= 1, using 1"
        ));
    }
    BackendsState {
        ready,
        reason,
        message,
        failover: failover_state(svc, vips, &counts),
        announced: None,
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
        let st = backends_state(&s, &[], &[&sl]);
        assert!(st.ready, "{st:?}");
        assert_eq!(st.reason, "BackendsReady");
        assert!(st.message.contains("80/TCP 1;"), "{}", st.message);
    }

    #[test]
    fn no_ready_endpoint_or_no_slice_is_no_ready_backends() {
        let s = svc(json!({}), json!([{"name": "http", "port": 80}]));
        let sl = slice("shop", "web", http(), json!([ep("10.0.0.2", false, false)]));
        for slices in [vec![&sl], vec![]] {
            let st = backends_state(&s, &[], &slices);
            assert_eq!((st.ready, st.reason), (false, "NoReadyBackends"), "{st:?}");
            assert!(!st.message.contains("terminating"), "{}", st.message);
        }
    }

    #[test]
    fn terminating_endpoints_still_serving_are_named_when_none_is_ready() {
        let s = svc(json!({}), json!([{"name": "http", "port": 80}]));
        // `serving` unset on a terminating endpoint means its `ready`: not serving
        let eps = json!([
            {"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            ep("10.0.0.3", false, true)
        ]);
        let sl = slice("shop", "web", http(), eps);
        let st = backends_state(&s, &[], &[&sl]);
        assert_eq!((st.ready, st.reason), (false, "NoReadyBackends"), "{st:?}");
        assert!(
            st.message
                .ends_with("the edges keep its VIP announced: 80/TCP 2"),
            "{}",
            st.message
        );
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
        let st = backends_state(&s, &[], &[&other_ns, &other_svc, &other_port]);
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
        let st = backends_state(&s, &[], &[&a, &b]);
        assert_eq!((st.ready, st.reason), (false, "BelowMinReady"), "{st:?}");
        assert_eq!(
            st.message,
            "ready backends per port: 80/TCP 2, 53/UDP 1; at least 2 needed \
             (ringlb.io/min-ready-backends)"
        );
        // One address listed in two slices counts once.
        let dup = slice("shop", "web", http(), json!([ep("10.0.0.1", true, false)]));
        let st = backends_state(&s, &[], &[&a, &dup]);
        assert!(st.message.contains("80/TCP 1,"), "{}", st.message);
    }

    #[test]
    fn a_bad_annotation_falls_back_to_one_and_says_so() {
        let s = svc(
            json!({ANNOTATION_MIN_READY: "zero"}),
            json!([{"name": "http", "port": 80}]),
        );
        let sl = slice("shop", "web", http(), json!([ep("10.0.0.1", true, false)]));
        let st = backends_state(&s, &[], &[&sl]);
        assert!(st.ready, "{st:?}");
        assert!(
            st.message.contains("\"zero\" is not a whole number"),
            "{st:?}"
        );
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn family_slice(family: &str, eps: Value) -> EndpointSlice {
        let mut s = slice("shop", "web", http(), eps);
        s.metadata.name = Some(format!("web-{family}"));
        s.address_type = family.into();
        s
    }

    #[test]
    fn each_vip_counts_only_endpoints_of_its_family() {
        let s = svc(json!({}), json!([{"name": "http", "port": 80}]));
        let dual = ips(&["192.0.2.1", "2001:db8::1"]);
        let v4 = family_slice("IPv4", json!([ep("10.0.0.1", true, false)]));
        let v6 = family_slice("IPv6", json!([ep("fd00::1", true, false)]));
        // Dual-stack pods: both VIPs served.
        let st = backends_state(&s, &dual, &[&v4, &v6]);
        assert_eq!((st.ready, st.reason), (true, "BackendsReady"), "{st:?}");
        assert!(
            st.message.contains("80/TCP IPv4 1 / IPv6 1;"),
            "{}",
            st.message
        );
        // IPv4-only pods on a dual-stack Service: the IPv6 VIP has no backend.
        let st = backends_state(&s, &dual, &[&v4]);
        assert_eq!(
            (st.ready, st.reason),
            (false, "NoEndpointsOfFamily"),
            "{st:?}"
        );
        assert_eq!(
            st.message,
            "ready backends per port: 80/TCP IPv4 1 / IPv6 0; at least 1 needed \
             (ringlb.io/min-ready-backends); VIP 2001:db8::1 has no ready IPv6 endpoint \
             on 80/TCP (its pods have no IPv6 address; the edges do not announce it)"
        );
        // An IPv6-only Service with IPv4 pods (hand-made slices): the same.
        let st = backends_state(&s, &ips(&["2001:db8::1"]), &[&v4]);
        assert_eq!(st.reason, "NoEndpointsOfFamily", "{st:?}");
        assert!(st.message.contains("80/TCP 0;"), "{}", st.message);
        // No pod at all stays NoReadyBackends.
        let st = backends_state(&s, &dual, &[]);
        assert_eq!(st.reason, "NoReadyBackends", "{st:?}");
    }

    #[test]
    fn failover_follows_the_failover_vips_family() {
        let s = svc(
            json!({ANNOTATION_FAILOVER_VIP: "198.51.100.7"}),
            json!([{"name": "http", "port": 80}]),
        );
        let dual = ips(&["192.0.2.1", "2001:db8::1"]);
        let v4 = family_slice("IPv4", json!([ep("10.0.0.1", true, false)]));
        let v6 = family_slice("IPv6", json!([ep("fd00::1", true, false)]));
        // IPv4-only pods: the IPv4 VIP (the one with a failover VIP) is served.
        let fo = backends_state(&s, &dual, &[&v4]).failover.unwrap();
        assert_eq!((fo.active, fo.reason), (false, "LocalBackendsReady"));
        // IPv6-only pods: the IPv4 VIP has no backend of its family, it fails over.
        let fo = backends_state(&s, &dual, &[&v6]).failover.unwrap();
        assert_eq!((fo.active, fo.reason), (true, "NoReadyBackends"), "{fo:?}");
    }

    #[test]
    fn failover_active_only_with_a_failover_vip_while_a_port_has_no_ready_endpoint() {
        let ports = json!([{"name": "http", "port": 80}]);
        let ready = slice("shop", "web", http(), json!([ep("10.0.0.1", true, false)]));
        let gone = slice("shop", "web", http(), json!([ep("10.0.0.1", false, false)]));
        assert_eq!(
            backends_state(&svc(json!({}), ports.clone()), &[], &[&gone]).failover,
            None
        );
        let fo = svc(
            json!({ANNOTATION_FAILOVER_VIP: "198.51.100.7", "ringlb.io/failover-weight": "1"}),
            ports.clone(),
        );
        let st = backends_state(&fo, &[], &[&ready]).failover.unwrap();
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
            let st = backends_state(&fo, &[], &slices).failover.unwrap();
            assert_eq!((st.active, st.reason), (true, "NoReadyBackends"), "{st:?}");
            assert_eq!(
                st.message,
                "no ready endpoint on 80/TCP: the edges send its new flows to failover VIP \
                 198.51.100.7"
            );
        }
        // A bad value: False, and the message says why (the edges only log it).
        let bad = svc(json!({ANNOTATION_FAILOVER_VIP: "region-b"}), ports);
        let st = backends_state(&bad, &[], &[&gone]).failover.unwrap();
        assert_eq!((st.active, st.reason), (false, "InvalidFailoverVIP"));
        assert!(st.message.contains("not an IPv4 address"), "{st:?}");
    }
}
