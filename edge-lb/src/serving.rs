//! API objects -> what an edge serves. Pure: Services and EndpointSlices in, the
//! backends of every VIP:port:protocol out.
//!
//! For each port of each ringlb Service that has a VIP in its status, the backends are
//! the EndpointSlice endpoints of that Service and port, as (pod IP, target port):
//! `ready` endpoints take new flows; `serving && terminating` endpoints are kept only so
//! established flows can finish (they are left out of the Maglev table). Endpoints of the
//! VIP's own family are used when there are any, else the other family's (the datapath
//! encapsulates 4-in-6 and 6-in-4). Every edge sorts backends the same way, so every
//! edge builds the same Maglev table.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use ringlb_crds::service::{is_ours, service_key, status_ips};

use ringlb_datapath::{Proto, Vip};
use ringlb_maglev::Backend;

use crate::vip_health::policy::{self, HealthPolicy};

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
    /// Bad health annotations (the Service is served with the defaults).
    pub bad_annotations: Vec<Skipped>,
}

/// Builds the desired state from every Service and EndpointSlice the edge sees.
pub fn build(services: &[Service], slices: &[EndpointSlice], default_class: bool) -> Serving {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
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
    for svc in ours {
        let key = service_key(svc);
        let vips = status_ips(svc);
        if vips.is_empty() {
            continue;
        }
        let (health, problems) = policy::from_annotations(svc.metadata.annotations.as_ref());
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
            for addr in &vips {
                let vip = Vip {
                    addr: *addr,
                    port: vip_port,
                    proto,
                };
                let pick = |list: &[Backend], same_family: bool| -> Vec<Backend> {
                    list.iter()
                        .copied()
                        .filter(|b| (b.addr.is_ipv4() == addr.is_ipv4()) == same_family)
                        .collect()
                };
                let (mut ready, mut draining) = (pick(&all_ready, true), pick(&all_draining, true));
                if ready.is_empty() && draining.is_empty() {
                    ready = pick(&all_ready, false);
                    draining = pick(&all_draining, false);
                }
                normalize(&mut ready);
                normalize(&mut draining);
                draining.retain(|b| !ready.contains(b));
                if let Some(owner) = out.vips.get(&vip) {
                    out.skipped.push(Skipped {
                        service: key.clone(),
                        reason: format!("{vip} is already served for {}", owner.service),
                    });
                    continue;
                }
                out.vips.insert(
                    vip,
                    VipBackends {
                        service: key.clone(),
                        ready,
                        draining,
                        policy: health,
                    },
                );
            }
        }
    }
    out
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
            // An unset `ready` means ready; `serving` defaults to `ready`.
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let takes_new_flows = ringlb_crds::service::endpoint_takes_new_flows(c);
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
            } else if serving && terminating {
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

    pub fn service(name: &str, vips: &[&str], ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": ports},
            "status": {"loadBalancer": {"ingress": vips.iter().map(|ip| json!({"ip": ip, "ipMode": "VIP"})).collect::<Vec<_>>()}}
        }))
        .unwrap()
    }

    pub fn slice(
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

    pub fn ep(ip: &str, ready: bool, serving: bool, terminating: bool) -> serde_json::Value {
        json!({"addresses": [ip], "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{ep, service, slice};
    use super::*;
    use serde_json::json;

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
        let a = slice(
            "web",
            "a",
            "IPv4",
            json!([{"port": 8080}]),
            json!([ep("10.0.0.9", true, true, false)]),
        );
        let c = slice(
            "web",
            "c",
            "IPv4",
            json!([{"port": 8080}]),
            json!([ep("10.0.0.1", true, true, false)]),
        );
        assert_eq!(
            build(std::slice::from_ref(&svc), &[a.clone(), c.clone()], true),
            build(&[svc], &[c, a], true)
        );
    }

    #[test]
    fn dual_stack_prefers_own_family_and_falls_back_to_the_other() {
        let svc = service("web", &["192.0.2.1", "2001:db8::1"], json!([{"port": 80}]));
        let v4 = slice(
            "web",
            "v4",
            "IPv4",
            json!([{"port": 80}]),
            json!([ep("10.0.0.1", true, true, false)]),
        );
        let v6 = slice(
            "web",
            "v6",
            "IPv6",
            json!([{"port": 80}]),
            json!([ep("fd00::1", true, true, false)]),
        );
        let d = build(std::slice::from_ref(&svc), &[v4, v6.clone()], true);
        assert_eq!(
            d.vips[&vip("192.0.2.1", 80, Proto::Tcp)].ready,
            vec![b("10.0.0.1", 80)]
        );
        assert_eq!(
            d.vips[&vip("2001:db8::1", 80, Proto::Tcp)].ready,
            vec![b("fd00::1", 80)]
        );
        // Only IPv6 pods: the IPv4 VIP is served 4-in-6.
        let d = build(&[svc], &[v6], true);
        assert_eq!(
            d.vips[&vip("192.0.2.1", 80, Proto::Tcp)].ready,
            vec![b("fd00::1", 80)]
        );
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
        let d = build(&[other, pending, sctp], &[], true);
        assert!(d.vips.is_empty());
        assert_eq!(d.skipped.len(), 1);
        assert!(d.skipped[0].reason.contains("SCTP"), "{:?}", d.skipped);
    }

    #[test]
    fn a_vip_port_claimed_twice_goes_to_one_service_and_reports_the_other() {
        let a = service("a", &["192.0.2.1"], json!([{"port": 80}]));
        let b_ = service("b", &["192.0.2.1"], json!([{"port": 80}, {"port": 443}]));
        let d = build(&[b_, a], &[], true);
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
}
