//! API objects -> what an edge serves. Pure: Services and EndpointSlices in, the
//! backends of every VIP:port:protocol out.
//!
//! For each port of each ringlb Service that has a VIP in its status, the backends are
//! the EndpointSlice endpoints of that Service and port, as (pod IP, target port):
//! `ready` endpoints take new flows; `serving && terminating` endpoints are kept so
//! established flows can finish (they are left out of the Maglev table while a ready
//! one exists; with none ready they take new flows too, Kubernetes' rule for
//! terminating endpoints, and the VIP stays announced: `tables`, `vip_health`). Only endpoints
//! of the VIP's own family serve it: an endpoint of the other family is a pod address
//! the pod cannot take the VIP's traffic on (the node agent translates to the pod's
//! address of the VIP's family, and Kubernetes lists a pod in that family's slice when
//! it has one), so an IPv6 VIP whose pods are IPv4-only has no backends and, like a VIP
//! without pods, is not announced. Every edge sorts backends the same way, so every
//! edge builds the same Maglev table.
//!
//! Cross-region failover (`ringlb_crds::failover`): a VIP:port whose Service
//! names a failover VIP of its family carries it in [`VipBackends::failover`] (the
//! datapath adds it as a remote backend, see `tables`). Each address a Service accepts
//! (`ringlb.io/accept-failover-from`) becomes one more VIP:port per Service port, a
//! failover alias ([`VipBackends::alias`]) with the same backends as the port; aliases
//! are placed after every real VIP:port, and one that equals a real VIP:port (of any
//! Service) or another Service's alias is left out and reported in `bad_annotations`.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_crds::failover;
use ringlb_crds::service::{is_ours, service_key, status_ips};

use ringlb_datapath::{Proto, SourceRange, Vip};
use ringlb_maglev::Backend;

use crate::vip_health::policy::{self, HealthPolicy};
use crate::{affinity, source_ranges};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The backends of one VIP:port:protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VipBackends {
    /// `namespace/name` of the Service that owns the VIP:port.
    pub service: String,
    /// Endpoints that take new flows, sorted and deduplicated.
    pub ready: Vec<Backend>,
    /// Endpoints that are terminating but still serving: existing flows only.
    pub draining: Vec<Backend>,
    /// The Service's health policy (its annotations; see `vip_health::policy`).
    pub policy: HealthPolicy,
    /// Another region's VIP that takes new flows while `ready` is empty.
    pub failover: Option<Failover>,
    /// This VIP:port is another region's VIP accepted for failover: served only for
    /// packets that other region's edges tunnel here, never announced, no health page.
    pub alias: bool,
    /// The Service's `loadBalancerSourceRanges` (`source_ranges`): `Some`, only these
    /// sources (none at all when empty); `None`, every source.
    pub source_ranges: Option<Vec<SourceRange>>,
    /// `sessionAffinity: ClientIP` with its timeout in seconds (`affinity`).
    pub client_affinity: Option<u32>,
}

/// A VIP:port's failover target (`ringlb.io/failover-vip`, `ringlb.io/failover-weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failover {
    /// The remote VIP (same port and protocol).
    pub remote: IpAddr,
    /// Percent (0..=50) of new flows sent to `remote` while local backends are ready.
    pub weight: u8,
}

impl VipBackends {
    /// No ready local backend, and a failover VIP to send new flows to.
    pub fn failing_over(&self) -> bool {
        self.ready.is_empty() && self.failover.is_some()
    }
}

/// Something in the API objects the edge cannot serve, for a log line or an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub service: String,
    pub reason: String,
}

/// What the edge should serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Serving {
    pub vips: BTreeMap<Vip, VipBackends>,
    pub skipped: Vec<Skipped>,
    /// Bad health or failover annotations (the Service is served with the defaults,
    /// or without the failover part), and bad source ranges (`source_ranges`).
    pub bad_annotations: Vec<Skipped>,
}

/// Builds the desired state from every Service and EndpointSlice the edge sees.
/// Takes the objects owned or shared (`Arc`, as a reflector's store holds them).
pub fn build<S: Borrow<Service>, E: Borrow<EndpointSlice>>(
    services: &[S],
    slices: &[E],
    default_class: bool,
) -> Serving {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let slice = slice.borrow();
        let Some(name) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        by_service
            .entry((ns, name.clone()))
            .or_default()
            .push(slice);
    }

    let mut ours: Vec<&Service> = services
        .iter()
        .map(Borrow::borrow)
        .filter(|s| is_ours(s, default_class))
        .collect();
    // Deterministic owner when two Services claim one VIP:port: the older one, then by name.
    ours.sort_by_key(|s| {
        (
            s.metadata.creation_timestamp.clone().map(|t| t.0),
            service_key(s),
        )
    });

    let mut out = Serving::default();
    let mut aliases = Vec::new();
    for svc in ours {
        let key = service_key(svc);
        let vips = status_ips(svc);
        if vips.is_empty() {
            continue;
        }
        let ann = svc.metadata.annotations.as_ref();
        let (health, mut problems) = policy::from_annotations(ann);
        let fo = failover::from_annotations(ann, &vips);
        problems.extend(fo.problems.iter().cloned());
        let src = source_ranges::of_service(svc, &vips);
        problems.extend(src.problems.iter().cloned());
        let aff = affinity::of_service(svc);
        problems.extend(aff.problems.iter().cloned());
        out.bad_annotations
            .extend(problems.into_iter().map(|reason| Skipped {
                service: key.clone(),
                reason,
            }));
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let svc_slices = by_service
            .get(&(ns, name))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for port in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            let proto = match protocol {
                "TCP" => Proto::Tcp,
                "UDP" => Proto::Udp,
                other => {
                    out.skipped.push(Skipped {
                        service: key.clone(),
                        reason: format!(
                            "port {}/{other}: only TCP and UDP are forwarded",
                            port.port
                        ),
                    });
                    continue;
                }
            };
            let Ok(vip_port) = u16::try_from(port.port) else {
                out.skipped.push(Skipped {
                    service: key.clone(),
                    reason: format!("port {} is out of range", port.port),
                });
                continue;
            };
            let (all_ready, all_draining) = endpoints(svc_slices, port.name.as_deref(), protocol);
            let backends_of = |addr: IpAddr| {
                let (ready, draining) = for_family(addr, &all_ready, &all_draining);
                VipBackends {
                    service: key.clone(),
                    ready,
                    draining,
                    policy: health,
                    failover: None,
                    alias: false,
                    source_ranges: src.ranges.clone(),
                    client_affinity: aff.client_ip,
                }
            };
            for addr in &fo.accept {
                let vip = Vip {
                    addr: *addr,
                    port: vip_port,
                    proto,
                };
                let alias = VipBackends {
                    alias: true,
                    ..backends_of(*addr)
                };
                aliases.push((vip, alias));
            }
            for addr in &vips {
                let vip = Vip {
                    addr: *addr,
                    port: vip_port,
                    proto,
                };
                let failover = fo.remote_for(*addr).map(|remote| Failover {
                    remote,
                    weight: fo.weight,
                });
                let backends = VipBackends {
                    failover,
                    ..backends_of(*addr)
                };
                if let Some(owner) = out.vips.get(&vip) {
                    out.skipped.push(Skipped {
                        service: key.clone(),
                        reason: format!("{vip} is already served for {}", owner.service),
                    });
                    continue;
                }
                out.vips.insert(vip, backends);
            }
        }
    }
    add_aliases(&mut out, aliases);
    out
}

/// The backends of a VIP of `addr`'s family: the endpoints of that family only (none
/// when the pods have no address of it); sorted, and a ready one never also draining.
fn for_family(
    addr: IpAddr,
    ready: &[Backend],
    draining: &[Backend],
) -> (Vec<Backend>, Vec<Backend>) {
    let pick = |list: &[Backend]| -> Vec<Backend> {
        list.iter()
            .copied()
            .filter(|b| b.addr.is_ipv4() == addr.is_ipv4())
            .collect()
    };
    let (mut r, mut d) = (pick(ready), pick(draining));
    normalize(&mut r);
    normalize(&mut d);
    d.retain(|b| !r.contains(b));
    (r, d)
}

/// Adds the failover aliases after every real VIP:port: a real VIP:port wins over an
/// alias of the same address, port and protocol, and the first Service to accept an
/// alias (oldest, then by name) keeps it.
fn add_aliases(out: &mut Serving, aliases: Vec<(Vip, VipBackends)>) {
    for (vip, b) in aliases {
        let why = match out.vips.get(&vip) {
            None => {
                out.vips.insert(vip, b);
                continue;
            }
            Some(o) if !o.alias => {
                format!("is one of this edge's own VIPs (served for {})", o.service)
            }
            Some(o) => format!("is already accepted by {}", o.service),
        };
        out.bad_annotations.push(Skipped {
            reason: format!(
                "annotation {}: failover alias {vip} {why}; ignored",
                failover::ANNOTATION_ACCEPT_FAILOVER_FROM
            ),
            service: b.service,
        });
    }
}

/// (ready, draining) endpoints of one Service port, as (pod IP, target port).
fn endpoints(
    slices: &[&EndpointSlice],
    port_name: Option<&str>,
    protocol: &str,
) -> (Vec<Backend>, Vec<Backend>) {
    let (mut ready_out, mut draining_out) = (Vec::new(), Vec::new());
    let want_name = port_name.unwrap_or("");
    for slice in slices {
        let Some(target) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == want_name
                && p.protocol.as_deref().unwrap_or("TCP") == protocol
        }) else {
            continue;
        };
        let Some(target_port) = target.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for ep in &slice.endpoints {
            let c = ep.conditions.as_ref();
            let takes_new_flows = ringlb_crds::service::endpoint_takes_new_flows(c);
            let serving_terminating = ringlb_crds::service::endpoint_serving_terminating(c);
            let Some(addr) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let backend = Backend {
                addr,
                port: target_port,
                weight: 1,
            };
            if takes_new_flows {
                ready_out.push(backend);
            } else if serving_terminating {
                draining_out.push(backend);
            }
        }
    }
    (ready_out, draining_out)
}

fn normalize(b: &mut Vec<Backend>) {
    b.sort();
    b.dedup();
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Services and EndpointSlices as the API serves them, for tests.
    use super::*;
    use serde_json::json;

    pub(crate) fn service(name: &str, vips: &[&str], ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": ports},
            "status": {"loadBalancer": {"ingress": vips.iter().map(|ip| json!({"ip": ip, "ipMode": "VIP"})).collect::<Vec<_>>()}}
        }))
        .unwrap()
    }

    pub(crate) fn slice(
        svc: &str,
        name: &str,
        family: &str,
        ports: serde_json::Value,
        eps: serde_json::Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {SERVICE_NAME_LABEL: svc}},
            "addressType": family,
            "ports": ports,
            "endpoints": eps,
        }))
        .unwrap()
    }

    pub(crate) fn ep(ip: &str, ready: bool, serving: bool, terminating: bool) -> serde_json::Value {
        json!({"addresses": [ip], "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
    }

    /// A slice `name` of Service `web` with one unnamed TCP port and the one
    /// endpoint `ep` (see [`ep`]).
    pub(crate) fn one_pod_slice(
        name: &str,
        family: &str,
        port: u16,
        ep: serde_json::Value,
    ) -> EndpointSlice {
        slice("web", name, family, json!([{"port": port}]), json!([ep]))
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{ep, one_pod_slice, service, slice};
    use super::*;
    use serde_json::json;

    const NO_SLICES: &[EndpointSlice] = &[];

    fn b(ip: &str, port: u16) -> Backend {
        Backend {
            addr: ip.parse().unwrap(),
            port,
            weight: 1,
        }
    }

    fn vip(addr: &str, port: u16, proto: Proto) -> Vip {
        Vip {
            addr: addr.parse().unwrap(),
            port,
            proto,
        }
    }

    #[test]
    fn ready_and_draining_backends_per_port() {
        let svc = service(
            "web",
            &["192.0.2.1"],
            json!([
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
            ]),
        );
        let s = slice(
            "web",
            "web-abc",
            "IPv4",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!([
                ep("10.0.0.2", true, true, false),
                ep("10.0.0.1", true, true, false),
                ep("10.0.0.3", false, true, true),
                ep("10.0.0.4", false, false, false)
            ]),
        );
        let d = build(&[svc], &[s], true);
        let http = &d.vips[&vip("192.0.2.1", 80, Proto::Tcp)];
        assert_eq!(http.service, "default/web");
        assert_eq!(
            http.ready,
            vec![b("10.0.0.1", 8080), b("10.0.0.2", 8080)],
            "sorted, not-ready dropped"
        );
        assert_eq!(http.draining, vec![b("10.0.0.3", 8080)]);
        assert_eq!(
            d.vips[&vip("192.0.2.1", 53, Proto::Udp)].ready[0].port,
            5353
        );
    }

    #[test]
    fn same_result_whatever_the_input_order() {
        let svc = service(
            "web",
            &["192.0.2.1"],
            json!([{"port": 80, "targetPort": 8080}]),
        );
        let a = one_pod_slice("a", "IPv4", 8080, ep("10.0.0.9", true, true, false));
        let c = one_pod_slice("c", "IPv4", 8080, ep("10.0.0.1", true, true, false));
        assert_eq!(
            build(std::slice::from_ref(&svc), &[a.clone(), c.clone()], true),
            build(&[svc], &[c, a], true)
        );
    }

    #[test]
    fn dual_stack_serves_each_vip_from_its_own_family_only() {
        let svc = service("web", &["192.0.2.1", "2001:db8::1"], json!([{"port": 80}]));
        let v4 = one_pod_slice("v4", "IPv4", 80, ep("10.0.0.1", true, true, false));
        let v6 = one_pod_slice("v6", "IPv6", 80, ep("fd00::1", true, true, false));
        let d = build(std::slice::from_ref(&svc), &[v4, v6.clone()], true);
        assert_eq!(
            d.vips[&vip("192.0.2.1", 80, Proto::Tcp)].ready,
            vec![b("10.0.0.1", 80)]
        );
        assert_eq!(
            d.vips[&vip("2001:db8::1", 80, Proto::Tcp)].ready,
            vec![b("fd00::1", 80)]
        );
        // Only IPv6 pods: the IPv4 VIP has no backend (a pod without an IPv4 address
        // cannot take its traffic), ready or draining; the IPv6 VIP keeps its own.
        let draining6 = one_pod_slice("v6d", "IPv6", 80, ep("fd00::2", false, true, true));
        let d = build(&[svc], &[v6, draining6], true);
        let v4_vip = &d.vips[&vip("192.0.2.1", 80, Proto::Tcp)];
        assert!(
            v4_vip.ready.is_empty() && v4_vip.draining.is_empty(),
            "{v4_vip:?}"
        );
        assert_eq!(
            d.vips[&vip("2001:db8::1", 80, Proto::Tcp)].ready,
            vec![b("fd00::1", 80)]
        );
    }

    #[test]
    fn an_ipv6_vip_with_ipv4_only_pods_has_no_backends() {
        let svc = service("web", &["2001:db8::1"], json!([{"port": 80}]));
        let v4 = one_pod_slice("v4", "IPv4", 80, ep("10.0.0.1", true, true, false));
        let d = build(&[svc], &[v4], true);
        let b6 = &d.vips[&vip("2001:db8::1", 80, Proto::Tcp)];
        assert!(b6.ready.is_empty() && b6.draining.is_empty(), "{b6:?}");
    }

    #[test]
    fn not_ours_or_without_vip_or_sctp_is_skipped() {
        let mut other = service("other", &["192.0.2.9"], json!([{"port": 80}]));
        other.spec.as_mut().unwrap().load_balancer_class = Some("metallb.io/x".into());
        let pending = service("pending", &[], json!([{"port": 80}]));
        let sctp = service(
            "sctp",
            &["192.0.2.2"],
            json!([{"port": 9, "protocol": "SCTP"}]),
        );
        let d = build(&[other, pending, sctp], NO_SLICES, true);
        assert!(d.vips.is_empty());
        assert_eq!(d.skipped.len(), 1);
        assert!(d.skipped[0].reason.contains("SCTP"), "{:?}", d.skipped);
    }

    #[test]
    fn a_vip_port_claimed_twice_goes_to_one_service_and_reports_the_other() {
        let a = service("a", &["192.0.2.1"], json!([{"port": 80}]));
        let b_ = service("b", &["192.0.2.1"], json!([{"port": 80}, {"port": 443}]));
        let d = build(&[b_, a], NO_SLICES, true);
        assert_eq!(
            d.vips[&vip("192.0.2.1", 80, Proto::Tcp)].service,
            "default/a"
        );
        assert_eq!(
            d.vips[&vip("192.0.2.1", 443, Proto::Tcp)].service,
            "default/b"
        );
        assert!(d.skipped[0].reason.contains("already served for default/a"));
    }

    /// The reasons of `d`'s bad annotations, in order.
    fn reasons(d: &Serving) -> Vec<&str> {
        d.bad_annotations
            .iter()
            .map(|s| s.reason.as_str())
            .collect()
    }

    fn annotated(name: &str, vips: &[&str], ann: serde_json::Value) -> Service {
        let mut s = service(
            name,
            vips,
            json!([{"name": "http", "port": 80, "targetPort": 8080},
                   {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]),
        );
        s.metadata.annotations = serde_json::from_value(ann).unwrap();
        s
    }

    fn web_slice(svc: &str, family: &str, ips: &[&str]) -> EndpointSlice {
        let eps: Vec<_> = ips.iter().map(|ip| ep(ip, true, true, false)).collect();
        slice(
            svc,
            &format!("{svc}-{family}"),
            family,
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!(eps),
        )
    }

    #[test]
    fn the_failover_vip_goes_to_the_vips_of_its_family() {
        let a = annotated(
            "web",
            &["192.0.2.1", "2001:db8::1"],
            json!({"ringlb.io/failover-vip": "198.51.100.7", "ringlb.io/failover-weight": "1"}),
        );
        let d = build(&[a], &[web_slice("web", "IPv4", &["10.0.0.1"])], true);
        assert!(d.bad_annotations.is_empty(), "{:?}", d.bad_annotations);
        let v4 = &d.vips[&vip("192.0.2.1", 80, Proto::Tcp)];
        assert_eq!(
            v4.failover,
            Some(Failover {
                remote: "198.51.100.7".parse().unwrap(),
                weight: 1
            })
        );
        assert!(!v4.failing_over() && !v4.alias);
        assert_eq!(
            d.vips[&vip("192.0.2.1", 53, Proto::Udp)].failover,
            v4.failover
        );
        assert_eq!(d.vips[&vip("2001:db8::1", 80, Proto::Tcp)].failover, None);
        // No ready pod: failing over.
        let a = annotated(
            "web",
            &["192.0.2.1"],
            json!({"ringlb.io/failover-vip": "198.51.100.7"}),
        );
        let d = build(&[a], NO_SLICES, true);
        assert!(d.vips[&vip("192.0.2.1", 80, Proto::Tcp)].failing_over());
    }

    #[test]
    fn accepted_aliases_serve_every_port_with_the_services_backends() {
        let b_ = annotated(
            "web",
            &["198.51.100.7"],
            json!({"ringlb.io/accept-failover-from": "192.0.2.1, 192.0.2.2"}),
        );
        let slices = [
            web_slice("web", "IPv4", &["10.2.0.1", "10.2.0.2"]),
            web_slice("web", "IPv6", &["fd00:2::1"]),
        ];
        let d = build(&[b_], &slices, true);
        assert!(d.bad_annotations.is_empty(), "{:?}", d.bad_annotations);
        let real = &d.vips[&vip("198.51.100.7", 80, Proto::Tcp)];
        let alias = &d.vips[&vip("192.0.2.1", 80, Proto::Tcp)];
        assert!(alias.alias && !real.alias);
        assert_eq!((&alias.ready, &alias.service), (&real.ready, &real.service));
        assert!(d.vips[&vip("192.0.2.1", 53, Proto::Udp)].alias);
        // A second alias gets the same (IPv4) pods; IPv6 aliases are refused in
        // crds::failover (IPv4-in-IPv4 only).
        let second = &d.vips[&vip("192.0.2.2", 80, Proto::Tcp)];
        assert_eq!(second.ready, real.ready);
        assert_eq!(d.vips.len(), 6);
    }

    #[test]
    fn a_real_vip_wins_over_an_alias_and_the_first_service_keeps_an_alias() {
        let mut a = service("a-real", &["192.0.2.1"], json!([{"port": 80}]));
        a.metadata.creation_timestamp = None;
        let b1 = annotated(
            "b1",
            &["198.51.100.7"],
            json!({"ringlb.io/accept-failover-from": "192.0.2.1,203.0.113.9"}),
        );
        let b2 = annotated(
            "b2",
            &["198.51.100.8"],
            json!({"ringlb.io/accept-failover-from": "203.0.113.9"}),
        );
        let d = build(&[b2, b1, a], NO_SLICES, true);
        let real = &d.vips[&vip("192.0.2.1", 80, Proto::Tcp)];
        assert_eq!(
            (real.service.as_str(), real.alias),
            ("default/a-real", false)
        );
        // The alias of 192.0.2.1 on port 53/UDP does not collide: it is kept.
        assert!(d.vips[&vip("192.0.2.1", 53, Proto::Udp)].alias);
        assert_eq!(
            d.vips[&vip("203.0.113.9", 80, Proto::Tcp)].service,
            "default/b1"
        );
        let reasons = reasons(&d);
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(
            reasons[0].contains(
                "192.0.2.1:80/tcp is one of this edge's own VIPs (served for default/a-real)"
            ),
            "{reasons:?}"
        );
        assert!(
            reasons[1].contains("already accepted by default/b1"),
            "{reasons:?}"
        );
        assert_eq!(d.bad_annotations[1].service, "default/b2");
        // A bad failover value leaves the Service served, without that part.
        let own = annotated(
            "own",
            &["192.0.2.5"],
            json!({"ringlb.io/failover-vip": "192.0.2.5"}),
        );
        let d = build(&[own], NO_SLICES, true);
        assert_eq!(d.vips[&vip("192.0.2.5", 80, Proto::Tcp)].failover, None);
        assert!(
            d.bad_annotations[0].reason.contains("own VIP"),
            "{:?}",
            d.bad_annotations
        );
    }

    /// A Service's source ranges reach every VIP:port of it; a bad entry is left
    /// out and reported, the Service still served (and still restricted).
    #[test]
    fn source_ranges_go_to_every_port_and_bad_entries_are_reported() {
        let mut s = annotated(
            "web",
            &["192.0.2.1"],
            json!({"service.beta.kubernetes.io/load-balancer-source-ranges": "0.0.0.0/0"}),
        );
        s.spec.as_mut().unwrap().load_balancer_source_ranges =
            Some(vec!["198.51.100.0/24".into(), "bogus".into()]);
        let d = build(
            &[s, annotated("open", &["192.0.2.2"], json!({}))],
            NO_SLICES,
            true,
        );
        let want = Some(vec![
            SourceRange::new("198.51.100.0".parse().unwrap(), 24).unwrap(),
        ]);
        for port in [(80, Proto::Tcp), (53, Proto::Udp)] {
            let b = &d.vips[&vip("192.0.2.1", port.0, port.1)];
            assert_eq!(b.source_ranges, want);
        }
        assert_eq!(
            d.vips[&vip("192.0.2.2", 80, Proto::Tcp)].source_ranges,
            None
        );
        let reasons = reasons(&d);
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("spec.loadBalancerSourceRanges: \"bogus\""));
        assert!(reasons[1].contains("disagrees"));
        assert!(d.bad_annotations.iter().all(|s| s.service == "default/web"));
    }

    /// `sessionAffinity: ClientIP` reaches every port; a bad timeout is reported
    /// and the default used.
    #[test]
    fn client_affinity_goes_to_every_port_with_its_timeout() {
        let mut s = annotated("web", &["192.0.2.1"], json!({}));
        let spec = s.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        spec.session_affinity_config =
            serde_json::from_value(json!({"clientIP": {"timeoutSeconds": 90_000}})).unwrap();
        let d = build(&[s], NO_SLICES, true);
        for port in [(80, Proto::Tcp), (53, Proto::Udp)] {
            let b = &d.vips[&vip("192.0.2.1", port.0, port.1)];
            assert_eq!(b.client_affinity, Some(10_800));
        }
        assert!(
            d.bad_annotations[0]
                .reason
                .contains("timeoutSeconds: 90000"),
            "{:?}",
            d.bad_annotations
        );
    }
}
