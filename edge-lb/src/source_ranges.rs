//! `spec.loadBalancerSourceRanges` and the legacy annotation
//! `service.beta.kubernetes.io/load-balancer-source-ranges` -> the source prefixes a
//! Service's VIPs accept. Pure.
//!
//! As kube-proxy: the spec field when it lists anything, else the annotation
//! (comma-separated); neither means every source. When both are set and differ, the
//! spec field wins and the difference is reported.
//!
//! Bad input never opens a restricted Service: an entry that is not a CIDR is left
//! out and reported, and the Service stays restricted to the valid entries; when no
//! entry is valid it accepts no source at all (kube-proxy would open it to the world
//! in that case). The datapath keeps only the prefixes of each VIP's own family
//! (`ServiceEntry::with_source_ranges`): a VIP whose Service lists ranges of the
//! other family only accepts no source either, and that is reported too.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use ringlb_datapath::SourceRange;

/// The legacy annotation kube-proxy still honours.
pub const ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
/// The spec field, as Events name it.
pub const FIELD: &str = "spec.loadBalancerSourceRanges";

/// A Service's source ranges and what was wrong with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceRanges {
    /// `Some`: only these sources (empty: none at all); `None`: every source.
    pub ranges: Option<Vec<SourceRange>>,
    /// One line per problem, naming the field and the value (for a Warning Event).
    pub problems: Vec<String>,
}

/// The source ranges of `svc`, whose VIPs are `vips`.
pub fn of_service(svc: &Service, vips: &[IpAddr]) -> SourceRanges {
    let spec: Vec<&str> = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.as_ref())
        .into_iter()
        .flatten()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    let ann_raw = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION));
    let ann: Vec<&str> = ann_raw
        .into_iter()
        .flat_map(|a| a.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = SourceRanges::default();
    let (field, entries) = match (spec.is_empty(), ann.is_empty()) {
        (true, true) => return out,
        (false, _) => (FIELD, &spec),
        (true, false) => (ANNOTATION, &ann),
    };
    let mut ranges: Vec<SourceRange> = Vec::new();
    for e in entries {
        match parse(e) {
            Some(r) => ranges.push(r),
            None => out.problems.push(format!(
                "{field}: {e:?} is not a CIDR (address/prefix); left out, the Service \
                 stays restricted to the other entries"
            )),
        }
    }
    ranges.sort();
    ranges.dedup();
    if ranges.is_empty() {
        out.problems.push(format!(
            "{field}: no valid CIDR in {:?}; the Service accepts no source until it is fixed",
            entries.join(",")
        ));
    }
    if !spec.is_empty() && !ann.is_empty() {
        let mut other: Vec<SourceRange> = ann.iter().filter_map(|e| parse(e)).collect();
        other.sort();
        other.dedup();
        if other != ranges {
            out.problems.push(format!(
                "annotation {ANNOTATION}={:?} disagrees with {FIELD} {:?}; {FIELD} is used",
                ann_raw.map(String::as_str).unwrap_or_default(),
                spec.join(",")
            ));
        }
    }
    if !ranges.is_empty() {
        for vip in vips {
            if !ranges.iter().any(|r| r.addr().is_ipv4() == vip.is_ipv4()) {
                let fam = if vip.is_ipv4() { "IPv4" } else { "IPv6" };
                out.problems.push(format!(
                    "{field}: no {fam} range; the VIP {vip} accepts no source"
                ));
            }
        }
    }
    out.ranges = Some(ranges);
    out
}

/// `addr/prefix` (host bits allowed, and cleared, as Go's `net.ParseCIDR` does).
fn parse(s: &str) -> Option<SourceRange> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
        return None;
    }
    SourceRange::new(addr, prefix.parse().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(spec: Option<&[&str]>, ann: Option<&str>) -> Service {
        let mut v = json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer"},
        });
        if let Some(s) = spec {
            v["spec"]["loadBalancerSourceRanges"] = json!(s);
        }
        if let Some(a) = ann {
            v["metadata"]["annotations"] = json!({ ANNOTATION: a });
        }
        serde_json::from_value(v).unwrap()
    }

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn shown(r: &SourceRanges) -> Option<Vec<String>> {
        r.ranges
            .as_ref()
            .map(|v| v.iter().map(ToString::to_string).collect())
    }

    const V4: &[&str] = &["192.0.2.10"];

    #[test]
    fn neither_field_nor_annotation_accepts_every_source() {
        let r = of_service(&svc(None, None), &ips(V4));
        assert_eq!(r, SourceRanges::default());
        let r = of_service(&svc(Some(&[]), Some(" , ")), &ips(V4));
        assert_eq!(r.ranges, None);
        assert!(r.problems.is_empty());
    }

    #[test]
    fn the_spec_field_v4_and_v6_with_host_bits_cleared() {
        let s = svc(
            Some(&[
                "192.0.2.77/24",
                " 2001:db8::1/32",
                "198.51.100.7/32",
                "192.0.2.0/24",
            ]),
            None,
        );
        let r = of_service(&s, &ips(&["192.0.2.10", "2001:db8::10"]));
        assert_eq!(
            shown(&r).unwrap(),
            ["192.0.2.0/24", "198.51.100.7/32", "2001:db8::/32"]
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }

    #[test]
    fn the_annotation_is_comma_separated_and_used_without_the_field() {
        let r = of_service(&svc(None, Some("10.0.0.0/8, 172.16.0.0/12,")), &ips(V4));
        assert_eq!(shown(&r).unwrap(), ["10.0.0.0/8", "172.16.0.0/12"]);
        assert!(r.problems.is_empty());
    }

    #[test]
    fn the_spec_field_wins_over_a_disagreeing_annotation() {
        let r = of_service(&svc(Some(&["192.0.2.0/24"]), Some("0.0.0.0/0")), &ips(V4));
        assert_eq!(shown(&r).unwrap(), ["192.0.2.0/24"]);
        assert_eq!(r.problems.len(), 1);
        let p = &r.problems[0];
        assert!(p.contains(ANNOTATION) && p.contains("\"0.0.0.0/0\""), "{p}");
        assert!(p.contains("spec.loadBalancerSourceRanges is used"), "{p}");
        // the same set written otherwise is no disagreement
        let r = of_service(
            &svc(Some(&["192.0.2.0/24"]), Some("192.0.2.9/24")),
            &ips(V4),
        );
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }

    /// A malformed entry is left out and the rest kept (the Service stays
    /// restricted); with no valid entry it is closed, never opened.
    #[test]
    fn malformed_entries_never_open_the_service() {
        let r = of_service(
            &svc(
                Some(&["192.0.2.0/24", "10.0.0.0/33", "office", "10.1.2.3"]),
                None,
            ),
            &ips(V4),
        );
        assert_eq!(shown(&r).unwrap(), ["192.0.2.0/24"]);
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(r.problems[0].contains("spec.loadBalancerSourceRanges: \"10.0.0.0/33\""));
        assert!(r.problems[1].contains("\"office\""));
        assert!(r.problems[2].contains("\"10.1.2.3\" is not a CIDR"));

        let r = of_service(&svc(None, Some("10.0.0.0/8x,nope")), &ips(V4));
        assert_eq!(r.ranges, Some(vec![]), "closed");
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains(ANNOTATION) && p.contains("accepts no source")),
            "{:?}",
            r.problems
        );
        for bad in ["10.0.0.0/", "10.0.0.0/+8", "10.0.0.0/0008", "::/129", "/8"] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_vip_without_a_range_of_its_family_is_reported_closed() {
        let r = of_service(
            &svc(Some(&["2001:db8::/32"]), None),
            &ips(&["192.0.2.10", "2001:db8::10"]),
        );
        assert_eq!(shown(&r).unwrap(), ["2001:db8::/32"]);
        assert_eq!(r.problems.len(), 1);
        assert!(
            r.problems[0].contains("no IPv4 range; the VIP 192.0.2.10 accepts no source"),
            "{:?}",
            r.problems
        );
    }
}
