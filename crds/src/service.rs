//! The Service contract shared by the controller and the edges: which Services are
//! ringlb's, the annotations users set, and where the VIPs are written.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use crate::LOAD_BALANCER_CLASS;
use crate::failover::{
    ANNOTATION_ACCEPT_FAILOVER_FROM, ANNOTATION_FAILOVER_VIP, ANNOTATION_FAILOVER_WEIGHT,
    CONDITION_FAILOVER_ACTIVE,
};

/// Specific IPs, comma-separated, at most one per family.
pub const ANNOTATION_IPS: &str = "ringlb.io/load-balancer-ips";
/// Draw from this pool only.
pub const ANNOTATION_POOL: &str = "ringlb.io/ip-pool";
/// Services with the same key and disjoint ports may share one VIP.
pub const ANNOTATION_SHARED: &str = "ringlb.io/allow-shared-ip";
/// A VIP:port is healthy with at least this many ready backends (default 1).
pub const ANNOTATION_MIN_READY: &str = "ringlb.io/min-ready-backends";
/// What the edges do with the route of a VIP below its threshold: `withdraw`
/// (default) or a de-preference, `prepend=N,med=N,local-pref=N` (any of the three).
pub const ANNOTATION_UNHEALTHY_BGP: &str = "ringlb.io/unhealthy-bgp";
/// How long a VIP that went unhealthy must stay at or above its threshold before the
/// edges treat it as healthy again (default 15s; `0s` turns the hold-down off).
pub const ANNOTATION_HOLD_DOWN: &str = "ringlb.io/health-hold-down";

/// The controller's condition on the address allocation.
pub const CONDITION_IP_ALLOCATED: &str = "ringlb.io/IPAllocated";
/// The controller's condition on the Service's ready backends.
pub const CONDITION_BACKENDS_READY: &str = "ringlb.io/BackendsReady";
/// The controller's condition on whether a router is offered the Service's VIPs.
pub const CONDITION_ANNOUNCED: &str = "ringlb.io/Announced";

/// Every Service condition ringlb writes (`status.conditions`), with its reasons
/// (for the generated docs/crd-reference.md).
pub const CONDITIONS: &[(&str, &str)] = &[
    (
        CONDITION_IP_ALLOCATED,
        "`True`/`Allocated` once the VIPs are in `status.loadBalancer.ingress`; `False` with the refusal's reason (`PoolExhausted`, `IPOutsidePools`, `IPInUse`, ...; docs/controller.md) otherwise. `kubectl wait --for=condition=ringlb.io/IPAllocated svc/NAME`.",
    ),
    (
        CONDITION_BACKENDS_READY,
        "Whether every TCP/UDP port of the Service has at least `ringlb.io/min-ready-backends` (default 1) endpoints taking new flows in its EndpointSlices (the edges' rule: ready and not terminating; one count per port and per family of the Service's VIPs, as an edge serves a VIP only from endpoints of its family): `True`/`BackendsReady`, `False`/`NoReadyBackends` (a port has none: the edges withdraw its VIP, unless terminating endpoints still serve, which then take its new flows, as Kubernetes' rule for terminating endpoints says; the message names those ports), `False`/`NoEndpointsOfFamily` (a port has ready endpoints, none of some VIP's family, e.g. IPv4-only pods on a dual-stack Service: the edges do not announce that VIP; the message names it, and a Warning Event says so), `False`/`BelowMinReady` (a port has fewer: the edges withdraw or de-prefer per `ringlb.io/unhealthy-bgp`). The message gives the count per port. Cluster-wide, from the EndpointSlices: an edge's own view (its hold-down, its BGP state) is in its `VIPHealthy`/`VIPUnhealthy` Events and metrics.",
    ),
    (
        CONDITION_ANNOUNCED,
        "Whether every VIP of the Service has a way to a router: a `BGPAdvertisement` selects its address's pool and a `BGPPeer`, and that peer has an Established session of the VIP's family on at least one edge (from the peers' `status.nodes`): `True`/`Announced` (the message names the peers and how many edges), `False`/`NoAdvertisement` (no `BGPAdvertisement` selects the address's pool), `False`/`NoPeer` (the advertisements that select it select no `BGPPeer`), `False`/`NoSession` (no selected peer is Established on any edge), `False`/`FamilyNotNegotiated` (sessions are up, none carries the VIP's family). The message names each VIP that is not. Whether an edge announces a VIP also depends on its backends (`ringlb.io/BackendsReady`); each edge's exact view, route by route, is its health page and `ringlb_vip_announced`.",
    ),
    (
        CONDITION_FAILOVER_ACTIVE,
        "Only on a Service with a valid `ringlb.io/failover-vip`: `True`/`NoReadyBackends` while no endpoint of the failover VIP's family takes new flows on a port (the edges send its new flows to the failover VIP), `False`/`LocalBackendsReady` otherwise. The message names the failover VIP and the weight. Cluster-wide, from the EndpointSlices; each edge's own view is in its `FailoverActive`/`FailoverEnded` Events and `ringlb_vip_failover_active`.",
    ),
];

/// Every Service annotation ringlb reads, with what it means (for the generated
/// docs/crd-reference.md).
pub const ANNOTATIONS: &[(&str, &str, &str)] = &[
    (
        ANNOTATION_IPS,
        "controller",
        "These addresses, comma-separated, at most one per family (`spec.loadBalancerIP` is accepted too).",
    ),
    (
        ANNOTATION_POOL,
        "controller",
        "Allocate only from this `IPPool`.",
    ),
    (
        ANNOTATION_SHARED,
        "controller",
        "Services with the same key and no overlapping port/protocol share one VIP.",
    ),
    (
        ANNOTATION_MIN_READY,
        "edges, controller",
        "Whole number >= 1, default 1. A VIP:port is healthy on an edge while it is programmed, announced and has at least this many ready backends; `GET /health/vip/<ip>[/<port>]` on the edge answers 200 then, 503 otherwise. The controller's `ringlb.io/BackendsReady` condition uses the same threshold.",
    ),
    (
        ANNOTATION_UNHEALTHY_BGP,
        "edges",
        "What the edges do with the route of a VIP:port below its threshold (or in its hold-down) that still has a ready backend: `withdraw` (default), or a de-preference: any of `prepend=N` (1..10 extra copies of the edge's ASN, eBGP), `med=N` (MED at least N), `local-pref=N` (LOCAL_PREF at most N, iBGP), comma-separated, e.g. `prepend=3,local-pref=50`. A VIP:port with no ready backend is always withdrawn. Several ports of one address: withdrawn when every port asks so, else de-preferred by the strongest.",
    ),
    (
        ANNOTATION_HOLD_DOWN,
        "edges",
        "Duration (`30s`, `500ms`, `2m`; at most 1h), default `15s`. A VIP:port goes unhealthy at once and counts as healthy again only after it has stayed at or above its threshold this long, so flapping pods do not flap routes. `0s`: no hold-down. One that has never been healthy (a new Service, an edge just started) is healthy at once.",
    ),
    (
        ANNOTATION_FAILOVER_VIP,
        "edges, controller",
        "Another region's IPv4 VIP of the same app (same ports and protocols; IPv6 is refused: edges decapsulate IPv4-in-IPv4 only). While a VIP:port of this Service has no ready local backend, the edges send its new flows to that VIP (IPIP, as to a pod) instead of dropping them; the VIP stays announced whatever `ringlb.io/unhealthy-bgp` says, and its health page answers 503 `failing over to <ip>`. Applies to the Service's IPv4 VIP. The remote region must accept it (`ringlb.io/accept-failover-from`) and run the XDP datapath in IPIP mode. docs/failover.md.",
    ),
    (
        ANNOTATION_FAILOVER_WEIGHT,
        "edges",
        "Whole percent 0..50, default 0: the share of new flows sent to `ringlb.io/failover-vip` while local backends ARE ready (e.g. `1`: 99% local, 1% remote).",
    ),
    (
        ANNOTATION_ACCEPT_FAILOVER_FROM,
        "edges",
        "Other regions' IPv4 VIPs, comma-separated, accepted as failover aliases of each port of this Service: the edges serve `<ip>:port` with this Service's ready backends for the IPIP packets another region's edges send to this Service's VIP, from the senders the edges' `--failover-senders` (chart `edge.failoverSenders`) names; from any other sender they are dropped. Never announced, no health page. An alias equal to one of this edge's own VIP:ports is ignored (the real VIP wins).",
    ),
];

/// `namespace/name` of a Service.
pub fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

/// Whether ringlb is responsible for the Service: `type: LoadBalancer` and class
/// `ringlb.io/maglev`, or no class when `default_class` is on.
pub fn is_ours(svc: &Service, default_class: bool) -> bool {
    let Some(spec) = &svc.spec else { return false };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return false;
    }
    match spec.load_balancer_class.as_deref() {
        Some(class) => class == LOAD_BALANCER_CLASS,
        None => default_class,
    }
}

/// The VIPs written in a Service's `status.loadBalancer.ingress`. Hostname-only or
/// unparsable entries are ignored.
pub fn status_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ing| {
            ing.iter()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether an EndpointSlice endpoint takes new flows, the rule the edges forward by
/// and the controller's `ringlb.io/BackendsReady` condition counts by: `ready` (unset
/// means ready) and not `terminating`.
pub fn endpoint_takes_new_flows(
    c: Option<&k8s_openapi::api::discovery::v1::EndpointConditions>,
) -> bool {
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    ready && !terminating
}

/// Whether an EndpointSlice endpoint is terminating but still serving (`serving`
/// unset means `ready`): it keeps its established flows, and takes new ones only
/// while no endpoint of the port is ready (Kubernetes' rule, KEP-1669).
pub fn endpoint_serving_terminating(
    c: Option<&k8s_openapi::api::discovery::v1::EndpointConditions>,
) -> bool {
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let serving = c.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    serving && terminating
}

/// `ringlb.io/min-ready-backends`: a whole number >= 1, `None` when it is not one.
pub fn parse_min_ready(v: &str) -> Option<u32> {
    v.trim().parse::<u32>().ok().filter(|n| *n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
    };

    fn svc(type_: &str, class: Option<&str>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                load_balancer_class: class.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn selection_follows_type_and_class() {
        assert!(is_ours(
            &svc("LoadBalancer", Some("ringlb.io/maglev")),
            false
        ));
        assert!(is_ours(&svc("LoadBalancer", None), true));
        assert!(!is_ours(&svc("LoadBalancer", None), false));
        assert!(!is_ours(&svc("LoadBalancer", Some("other.io/lb")), true));
        assert!(!is_ours(&svc("ClusterIP", Some("ringlb.io/maglev")), true));
        assert!(!is_ours(&Service::default(), true));
    }

    #[test]
    fn reads_status_ips() {
        let mut s = svc("LoadBalancer", None);
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![
                    LoadBalancerIngress {
                        ip: Some("192.0.2.1".into()),
                        ..Default::default()
                    },
                    LoadBalancerIngress {
                        hostname: Some("lb.example".into()),
                        ..Default::default()
                    },
                    LoadBalancerIngress {
                        ip: Some("2001:db8::1".into()),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        });
        assert_eq!(
            status_ips(&s),
            vec![
                "192.0.2.1".parse::<IpAddr>().unwrap(),
                "2001:db8::1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn new_flows_go_to_ready_endpoints_not_terminating() {
        use k8s_openapi::api::discovery::v1::EndpointConditions;
        let c = |ready, terminating| EndpointConditions {
            ready,
            serving: None,
            terminating,
        };
        assert!(endpoint_takes_new_flows(None), "unset means ready");
        assert!(endpoint_takes_new_flows(Some(&c(Some(true), Some(false)))));
        assert!(!endpoint_takes_new_flows(Some(&c(Some(false), None))));
        assert!(!endpoint_takes_new_flows(Some(&c(Some(true), Some(true)))));
        // terminating and still serving (serving unset means ready)
        let t = |ready, serving, terminating| EndpointConditions {
            ready,
            serving,
            terminating,
        };
        assert!(endpoint_serving_terminating(Some(&t(
            Some(false),
            Some(true),
            Some(true)
        ))));
        assert!(!endpoint_serving_terminating(Some(&t(
            Some(false),
            Some(false),
            Some(true)
        ))));
        assert!(!endpoint_serving_terminating(Some(&t(
            Some(true),
            None,
            None
        ))));
        assert!(!endpoint_serving_terminating(None));
        assert_eq!(parse_min_ready(" 3 "), Some(3));
        assert_eq!(parse_min_ready("0"), None);
        assert_eq!(parse_min_ready("two"), None);
    }
}
