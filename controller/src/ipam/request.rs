//! What a Service asks for, read from its spec and annotations. Pure: a `Service` in,
//! a [`Request`] (or a user-facing [`Refusal`]) out.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use super::Refusal;
use super::pool::{Family, Labels};

pub use ringlb_crds::service::{
    ANNOTATION_IPS, ANNOTATION_POOL, ANNOTATION_SHARED, is_ours, service_key, status_ips,
};

/// One `port/protocol` pair a Service listens on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortProto {
    pub port: i32,
    pub protocol: String,
}

/// One family the Service wants, and whether the Service fails without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FamilyWant {
    pub family: Family,
    pub required: bool,
}

/// Everything the allocator needs to know about one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `namespace/name`.
    pub key: String,
    pub labels: Labels,
    pub namespace_labels: Labels,
    /// In the Service's family order (`spec.ipFamilies`).
    pub families: Vec<FamilyWant>,
    /// Specific addresses asked for, at most one per family.
    pub requested: Vec<IpAddr>,
    pub pool: Option<String>,
    pub sharing_key: Option<String>,
    pub ports: Vec<PortProto>,
}

impl Request {
    pub fn requested_ip(&self, family: Family) -> Option<IpAddr> {
        self.requested
            .iter()
            .copied()
            .find(|ip| Family::of(ip) == family)
    }

    pub fn wants(&self, family: Family) -> bool {
        self.families.iter().any(|f| f.family == family)
    }
}

fn malformed(annotation: &str, value: &str, reason: impl Into<String>) -> Refusal {
    Refusal::Malformed {
        annotation: annotation.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Reads a Service into a [`Request`]. `namespace_labels` are the labels of the
/// Service's namespace (for pools with a `namespaceSelector`).
pub fn request_from_service(svc: &Service, namespace_labels: Labels) -> Result<Request, Refusal> {
    let annotations = svc.metadata.annotations.clone().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();

    let mut requested: Vec<IpAddr> = Vec::new();
    let (source, raw) = match annotations.get(ANNOTATION_IPS) {
        Some(v) => (ANNOTATION_IPS, Some(v.clone())),
        None => (
            "spec.loadBalancerIP",
            spec.load_balancer_ip.clone().filter(|s| !s.is_empty()),
        ),
    };
    if let Some(raw) = raw {
        for part in raw.split(',').map(str::trim) {
            let ip: IpAddr = part
                .parse()
                .map_err(|_| malformed(source, &raw, format!("{part:?} is not an IP address")))?;
            if requested.iter().any(|o| Family::of(o) == Family::of(&ip)) {
                return Err(malformed(
                    source,
                    &raw,
                    format!("more than one {} address", Family::of(&ip)),
                ));
            }
            requested.push(ip);
        }
    }

    let pool = match annotations.get(ANNOTATION_POOL) {
        Some(p) if p.trim().is_empty() => {
            return Err(malformed(ANNOTATION_POOL, p, "empty pool name"));
        }
        Some(p) => Some(p.trim().to_string()),
        None => None,
    };
    let sharing_key = sharing_key(svc)?;

    let mut listed = Vec::new();
    for f in spec.ip_families.iter().flatten() {
        let fam = match f.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            other => {
                return Err(Refusal::UnsupportedFamily {
                    reason: format!("spec.ipFamilies has unknown family {other:?}"),
                });
            }
        };
        if !listed.contains(&fam) {
            listed.push(fam);
        }
    }
    let primary = listed
        .first()
        .copied()
        .or_else(|| requested.first().map(Family::of))
        .unwrap_or(Family::V4);
    let second = listed.get(1).copied().unwrap_or(primary.other());
    let families = match spec.ip_family_policy.as_deref() {
        None | Some("SingleStack") => vec![FamilyWant {
            family: primary,
            required: true,
        }],
        Some("PreferDualStack") => vec![
            FamilyWant {
                family: primary,
                required: true,
            },
            FamilyWant {
                family: second,
                required: false,
            },
        ],
        Some("RequireDualStack") => vec![
            FamilyWant {
                family: primary,
                required: true,
            },
            FamilyWant {
                family: second,
                required: true,
            },
        ],
        Some(other) => {
            return Err(Refusal::UnsupportedFamily {
                reason: format!("unknown spec.ipFamilyPolicy {other:?}"),
            });
        }
    };
    for ip in &requested {
        let fam = Family::of(ip);
        if !families.iter().any(|f| f.family == fam) {
            return Err(Refusal::UnsupportedFamily {
                reason: format!(
                    "requested {ip} is {fam} but the Service's families are {}",
                    families
                        .iter()
                        .map(|f| f.family.k8s_name())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            });
        }
    }

    let mut namespace_labels = namespace_labels;
    let ns = svc
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    // The API server sets this label on every namespace; make it work even when the
    // Namespace object is not (yet) in our cache.
    namespace_labels
        .entry("kubernetes.io/metadata.name".into())
        .or_insert(ns);

    Ok(Request {
        key: service_key(svc),
        labels: svc.metadata.labels.clone().unwrap_or_default(),
        namespace_labels,
        families,
        requested,
        pool,
        sharing_key,
        ports: ports(svc),
    })
}

/// The `ringlb.io/allow-shared-ip` key, trimmed; a blank key is malformed.
pub fn sharing_key(svc: &Service) -> Result<Option<String>, Refusal> {
    match svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SHARED))
    {
        Some(k) if k.trim().is_empty() => Err(malformed(ANNOTATION_SHARED, k, "empty sharing key")),
        Some(k) => Ok(Some(k.trim().to_string())),
        None => Ok(None),
    }
}

/// The Service's distinct `port/protocol` pairs (protocol TCP when unset), sorted.
pub fn ports(svc: &Service) -> Vec<PortProto> {
    let mut ports: Vec<PortProto> = svc
        .spec
        .iter()
        .flat_map(|spec| spec.ports.iter().flatten())
        .map(|p| PortProto {
            port: p.port,
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
        })
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(extra: serde_json::Value) -> Service {
        let mut v = json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 443}, {"port": 53, "protocol": "UDP"}]}
        });
        for (k, val) in extra.as_object().unwrap() {
            for (k2, v2) in val.as_object().unwrap() {
                v[k][k2] = v2.clone();
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn fams(r: &Request) -> Vec<(Family, bool)> {
        r.families.iter().map(|f| (f.family, f.required)).collect()
    }

    #[test]
    fn defaults() {
        let r = request_from_service(&svc(json!({})), Labels::new()).unwrap();
        assert_eq!(r.key, "shop/web");
        assert_eq!(fams(&r), [(Family::V4, true)]);
        assert_eq!(
            r.ports,
            [
                PortProto {
                    port: 53,
                    protocol: "UDP".into()
                },
                PortProto {
                    port: 443,
                    protocol: "TCP".into()
                }
            ]
        );
        assert_eq!(
            r.namespace_labels
                .get("kubernetes.io/metadata.name")
                .map(String::as_str),
            Some("shop")
        );
    }

    #[test]
    fn family_policies() {
        let f = |fam: serde_json::Value, pol: &str| {
            let r = request_from_service(
                &svc(json!({"spec": {"ipFamilies": fam, "ipFamilyPolicy": pol}})),
                Labels::new(),
            );
            fams(&r.unwrap())
        };
        assert_eq!(f(json!(["IPv6"]), "SingleStack"), [(Family::V6, true)]);
        assert_eq!(
            f(json!(["IPv4"]), "PreferDualStack"),
            [(Family::V4, true), (Family::V6, false)]
        );
        assert_eq!(
            f(json!(["IPv6", "IPv4"]), "RequireDualStack"),
            [(Family::V6, true), (Family::V4, true)]
        );
        let bad = request_from_service(
            &svc(json!({"spec": {"ipFamilyPolicy": "Sometimes"}})),
            Labels::new(),
        );
        assert_eq!(bad.unwrap_err().metric_label(), "unsupported_family");
    }

    #[test]
    fn annotations() {
        let r = request_from_service(
            &svc(json!({"metadata": {"annotations": {
                ANNOTATION_IPS: "2001:db8::5, 192.0.2.5", ANNOTATION_POOL: " gold ", ANNOTATION_SHARED: "k1"
            }}, "spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}})),
            Labels::new(),
        )
        .unwrap();
        assert_eq!(
            r.requested_ip(Family::V4),
            Some("192.0.2.5".parse().unwrap())
        );
        assert_eq!(
            r.requested_ip(Family::V6),
            Some("2001:db8::5".parse().unwrap())
        );
        assert_eq!(
            (r.pool.as_deref(), r.sharing_key.as_deref()),
            (Some("gold"), Some("k1"))
        );

        // spec.loadBalancerIP when the annotation is absent.
        let r = request_from_service(
            &svc(json!({"spec": {"loadBalancerIP": "192.0.2.9"}})),
            Labels::new(),
        )
        .unwrap();
        assert_eq!(r.requested, ["192.0.2.9".parse::<IpAddr>().unwrap()]);

        let err = |a: serde_json::Value| {
            request_from_service(&svc(json!({"metadata": {"annotations": a}})), Labels::new())
                .unwrap_err()
        };
        for a in [
            json!({ANNOTATION_IPS: "192.0.2.1,banana"}),
            json!({ANNOTATION_IPS: "192.0.2.1,192.0.2.2"}),
            json!({ANNOTATION_POOL: ""}),
            json!({ANNOTATION_SHARED: "  "}),
        ] {
            assert_eq!(err(a.clone()).metric_label(), "malformed_annotation", "{a}");
        }
        // A v6 address on a single-stack v4 Service.
        let r = request_from_service(
            &svc(
                json!({"metadata": {"annotations": {ANNOTATION_IPS: "2001:db8::1"}}, "spec": {"ipFamilies": ["IPv4"]}}),
            ),
            Labels::new(),
        );
        assert_eq!(r.unwrap_err().metric_label(), "unsupported_family");
        let msg = err(json!({ANNOTATION_IPS: "x"})).to_string();
        assert!(
            msg.contains("ringlb.io/load-balancer-ips") && msg.contains("\"x\""),
            "{msg}"
        );
    }

    #[test]
    fn sharing_key_is_trimmed_and_a_blank_one_is_malformed() {
        let key = |v: &str| {
            sharing_key(&svc(
                json!({"metadata": {"annotations": {ANNOTATION_SHARED: v}}}),
            ))
        };
        assert_eq!(key(" k1 "), Ok(Some("k1".into())));
        assert_eq!(
            key("  ").unwrap_err().metric_label(),
            "malformed_annotation"
        );
        assert_eq!(sharing_key(&svc(json!({}))), Ok(None));
    }

    #[test]
    fn requested_ip_sets_family_when_ip_families_unset() {
        let mut s = svc(json!({"metadata": {"annotations": {ANNOTATION_IPS: "2001:db8::7"}}}));
        s.spec.as_mut().unwrap().ip_families = None;
        let r = request_from_service(&s, Labels::new()).unwrap();
        assert_eq!(fams(&r), [(Family::V6, true)]);
    }
}
