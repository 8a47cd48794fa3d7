use std::collections::BTreeMap;
use std::net::IpAddr;

use ringlb_crds::ippool::IPRange;
use ringlb_crds::{IPPoolSpec, LabelSelector};

use super::*;

fn spec(cidrs: &[&str]) -> IPPoolSpec {
    IPPoolSpec::from_cidrs(cidrs)
}

fn pool(name: &str, s: IPPoolSpec) -> Pool {
    Pool::from_spec(name, &s).unwrap()
}

fn ipam(pools: Vec<Pool>) -> Ipam {
    let mut i = Ipam::new();
    i.set_pools(pools, BTreeMap::new());
    i
}

fn req(key: &str) -> Request {
    Request {
        key: key.into(),
        labels: Labels::new(),
        namespace_labels: Labels::new(),
        families: wants(&[(Family::V4, true)]),
        requested: vec![],
        pool: None,
        sharing_key: None,
        ports: port_protos(&[(80, "TCP")]),
    }
}

/// The families a request asks for, in order, each required or not.
fn wants(families: &[(Family, bool)]) -> Vec<FamilyWant> {
    families
        .iter()
        .map(|&(family, required)| FamilyWant { family, required })
        .collect()
}

fn port_protos(ports: &[(i32, &str)]) -> Vec<PortProto> {
    ports
        .iter()
        .map(|(p, proto)| PortProto {
            port: *p,
            protocol: proto.to_string(),
        })
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn allocates_lowest_first_and_exhausts() {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/30"]))]);
    let got: Vec<IpAddr> = (0..4)
        .map(|i| m.ensure(&req(&format!("ns/s{i}")), &[]).unwrap().ips[0])
        .collect();
    assert_eq!(
        got,
        ["192.0.2.0", "192.0.2.1", "192.0.2.2", "192.0.2.3"].map(ip)
    );
    let err = m.ensure(&req("ns/s4"), &[]).unwrap_err();
    assert_eq!(
        err,
        Refusal::PoolExhausted {
            family: Family::V4,
            pools: vec!["a".into()]
        }
    );
    assert_eq!(err.metric_label(), "pool_exhausted");
    assert!(m.held("ns/s4").is_empty());
    // Release one: it is reused.
    assert_eq!(m.release("ns/s1"), vec![ip("192.0.2.1")]);
    assert_eq!(
        m.ensure(&req("ns/s4"), &[]).unwrap().ips,
        vec![ip("192.0.2.1")]
    );
}

#[test]
fn ensure_is_idempotent() {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/24"]))]);
    let first = m.ensure(&req("ns/a"), &[]).unwrap();
    let again = m.ensure(&req("ns/a"), &first.ips).unwrap();
    assert_eq!(first.ips, again.ips);
    assert!(again.allocated.is_empty() && again.released.is_empty());
    assert_eq!(m.allocated_count(), 1);
}

#[test]
fn avoid_buggy_ips_skips_dot0_and_dot255() {
    let mut s = spec(&["192.0.2.254/31", "198.51.100.0/31"]);
    s.avoid_buggy_ips = true;
    s.ranges.push(IPRange {
        start: "203.0.113.255".into(),
        end: "203.0.114.0".into(),
    });
    let p = pool("a", s);
    assert_eq!(p.usable(Family::V4), 2); // .254 and .1
    let mut m = ipam(vec![p]);
    assert_eq!(
        m.ensure(&req("ns/a"), &[]).unwrap().ips,
        vec![ip("192.0.2.254")]
    );
    assert_eq!(
        m.ensure(&req("ns/b"), &[]).unwrap().ips,
        vec![ip("198.51.100.1")]
    );
    assert!(matches!(
        m.ensure(&req("ns/c"), &[]),
        Err(Refusal::PoolExhausted { .. })
    ));
    // A request for a buggy address in such a pool is outside what it offers.
    let mut r = req("ns/d");
    r.requested = vec![ip("198.51.100.0")];
    assert_eq!(
        m.ensure(&r, &[]).unwrap_err(),
        Refusal::OutsidePools {
            ip: ip("198.51.100.0")
        }
    );
}

#[test]
fn buggy_count_is_arithmetic() {
    let r = Range {
        family: Family::V4,
        start: 0,
        end: u128::from(u32::MAX),
    };
    assert_eq!(r.buggy_count(), 2 * 16_777_216);
    let r = Range {
        family: Family::V4,
        start: 1,
        end: 254,
    };
    assert_eq!(r.buggy_count(), 0);
    let r = Range {
        family: Family::V4,
        start: 255,
        end: 256,
    };
    assert_eq!(r.buggy_count(), 2);
}

#[test]
fn v6_slash64_uses_memory_proportional_to_allocations() {
    let p = pool("v6", spec(&["2001:db8::/64"]));
    assert_eq!(p.usable(Family::V6), (1u128 << 64) - 1);
    let mut m = ipam(vec![p]);
    let mut r = req("ns/x");
    r.families = wants(&[(Family::V6, true)]);
    for i in 0..2000 {
        r.key = format!("ns/s{i}");
        m.ensure(&r, &[]).unwrap();
    }
    assert_eq!(m.allocated_count(), 2000);
    // 2001:db8:: is the subnet-router anycast address, never handed out.
    assert_eq!(m.held("ns/s0"), &[ip("2001:db8::1")]);
    assert_eq!(m.held("ns/s1999"), &[ip("2001:db8::7d0")]);
    let u = m.usage("v6");
    assert_eq!(u[0].allocated, 2000);
    assert_eq!(u[0].free, (1u128 << 64) - 1 - 2000);
    // The pool's own footprint does not depend on its size: one range, no bitmap.
    assert_eq!(m.pools()[0].ranges.len(), 1);
    // Release in the middle and re-fill from the gap.
    m.release("ns/s5");
    r.key = "ns/new".into();
    assert_eq!(m.ensure(&r, &[]).unwrap().ips, vec![ip("2001:db8::6")]);
    // A whole ::/0 does not overflow (its size saturates, less its anycast address).
    let all = pool("all", spec(&["::/0"]));
    assert_eq!(all.usable(Family::V6), u128::MAX - 1);
}

#[test]
fn priority_then_name_order() {
    let mut lo = spec(&["192.0.2.0/32"]);
    lo.priority = 10;
    let mut hi = spec(&["198.51.100.0/32"]);
    hi.priority = -1;
    let mut m = ipam(vec![
        pool("z-low", lo),
        pool("b", spec(&["203.0.113.0/32"])),
        pool("a-hi", hi),
    ]);
    let order: Vec<IpAddr> = (0..3)
        .map(|i| m.ensure(&req(&format!("ns/{i}")), &[]).unwrap().ips[0])
        .collect();
    assert_eq!(order, ["198.51.100.0", "203.0.113.0", "192.0.2.0"].map(ip));
}

#[test]
fn auto_assign_off_needs_explicit_pool() {
    let mut s = spec(&["192.0.2.0/30"]);
    s.auto_assign = false;
    let mut m = ipam(vec![pool("manual", s)]);
    assert_eq!(
        m.ensure(&req("ns/a"), &[]).unwrap_err(),
        Refusal::NoMatchingPool { family: Family::V4 }
    );
    let mut r = req("ns/a");
    r.pool = Some("manual".into());
    assert_eq!(m.ensure(&r, &[]).unwrap().ips, vec![ip("192.0.2.0")]);
    r.pool = Some("nope".into());
    r.key = "ns/b".into();
    assert_eq!(
        m.ensure(&r, &[]).unwrap_err().metric_label(),
        "pool_not_found"
    );
}

#[test]
fn selectors_match_labels_and_expressions() {
    let sel: LabelSelector = serde_json::from_value(serde_json::json!({
        "matchLabels": {"team": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "edge"]},
            {"key": "legacy", "operator": "DoesNotExist"}
        ]
    }))
    .unwrap();
    let nsel: LabelSelector = serde_json::from_value(serde_json::json!({
        "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]
    }))
    .unwrap();
    let mut s = spec(&["192.0.2.0/24"]);
    s.service_selector = Some(sel);
    s.namespace_selector = Some(nsel);
    s.priority = -1;
    let p = pool("web", s);
    let l = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Labels>()
    };
    assert!(p.admits(
        &l(&[("team", "web"), ("tier", "edge")]),
        &l(&[("env", "prod")])
    ));
    assert!(p.admits(&l(&[("team", "web"), ("tier", "front")]), &l(&[])));
    assert!(!p.admits(&l(&[("team", "web"), ("tier", "back")]), &l(&[])));
    assert!(!p.admits(
        &l(&[("team", "web"), ("tier", "edge"), ("legacy", "")]),
        &l(&[])
    ));
    assert!(!p.admits(
        &l(&[("team", "web"), ("tier", "edge")]),
        &l(&[("env", "dev")])
    ));
    assert!(!p.admits(&l(&[("tier", "edge")]), &l(&[])));

    let mut m = ipam(vec![p, pool("other", spec(&["198.51.100.0/24"]))]);
    let mut r = req("ns/a");
    r.labels = l(&[("team", "web"), ("tier", "edge")]);
    assert_eq!(m.ensure(&r, &[]).unwrap().ips, vec![ip("192.0.2.0")]);
    assert_eq!(
        m.ensure(&req("ns/b"), &[]).unwrap().ips,
        vec![ip("198.51.100.0")]
    );
    // Asking for a pool whose selector rejects the Service.
    let mut r = req("ns/c");
    r.pool = Some("web".into());
    assert_eq!(
        m.ensure(&r, &[]).unwrap_err().metric_label(),
        "pool_not_allowed"
    );
}

#[test]
fn bad_selector_operator_makes_pool_invalid() {
    let mut s = spec(&["192.0.2.0/24"]);
    s.service_selector = Some(
        serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "a", "operator": "Like", "values": ["x"]}]
        }))
        .unwrap(),
    );
    let errs = Pool::from_spec("p", &s).unwrap_err();
    assert!(errs[0].message.contains("unknown operator"), "{errs:?}");
}

#[test]
fn invalid_specs_name_every_bad_field() {
    let mut s = spec(&["192.0.2.1/24", "nonsense", "2001:db8::/64"]);
    s.ranges.push(IPRange {
        start: "10.0.0.9".into(),
        end: "10.0.0.1".into(),
    });
    s.ranges.push(IPRange {
        start: "10.0.0.1".into(),
        end: "2001:db8::1".into(),
    });
    s.ranges.push(IPRange {
        start: "x".into(),
        end: "y".into(),
    });
    let errs = Pool::from_spec("p", &s).unwrap_err();
    // Host bits are refused, as the CRD schema does: 192.0.2.1/24 is not widened.
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.cidrs[0]",
            "spec.cidrs[1]",
            "spec.ranges[0]",
            "spec.ranges[1]",
            "spec.ranges[2].start"
        ]
    );
    assert!(Pool::from_spec("p", &spec(&[])).is_err());
    let p = Pool::from_spec("p", &spec(&["192.0.2.0/24"])).unwrap();
    assert_eq!(p.ranges[0].to_string(), "192.0.2.0-192.0.2.255");
    // Overlaps inside one pool are refused (they would double-count).
    let errs = Pool::from_spec("p", &spec(&["192.0.2.0/24", "192.0.2.128/25"])).unwrap_err();
    assert!(errs[0].message.contains("overlaps"), "{errs:?}");
}

#[test]
fn overlapping_pools_are_reported() {
    let m = ipam(vec![
        pool("a", spec(&["192.0.2.0/24"])),
        pool("b", spec(&["192.0.2.128/25"])),
        pool("c", spec(&["198.51.100.0/24"])),
    ]);
    let o = m.overlaps();
    assert_eq!(o.get("a"), Some(&vec!["b".to_string()]));
    assert_eq!(o.get("b"), Some(&vec!["a".to_string()]));
    assert!(!o.contains_key("c"));
}

fn shared(key: &str, sk: &str, ports: &[(i32, &str)]) -> Request {
    let mut r = req(key);
    r.sharing_key = Some(sk.into());
    r.ports = port_protos(ports);
    r
}

/// The first address `key` gets, sharing with key `sk` on `ports`, when it holds none.
fn ensure_shared(m: &mut Ipam, key: &str, sk: &str, ports: &[(i32, &str)]) -> IpAddr {
    m.ensure(&shared(key, sk, ports), &[]).unwrap().ips[0]
}

/// One pool, and `ns/a` (80/TCP) and `ns/b` (443/TCP) sharing key `k`: one address.
fn two_sharing_one_address() -> (Ipam, IpAddr) {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/24"]))]);
    let a = ensure_shared(&mut m, "ns/a", "k", &[(80, "TCP")]);
    // Same key, disjoint ports: same address.
    assert_eq!(ensure_shared(&mut m, "ns/b", "k", &[(443, "TCP")]), a);
    (m, a)
}

#[test]
fn sharing_rules() {
    let (mut m, a) = two_sharing_one_address();
    // Same port, other protocol: still disjoint.
    assert_eq!(ensure_shared(&mut m, "ns/c", "k", &[(80, "UDP")]), a);
    // Same key, overlapping port: a new address.
    let d = ensure_shared(&mut m, "ns/d", "k", &[(80, "TCP")]);
    assert_ne!(d, a);
    // Other key: never shares.
    let e = ensure_shared(&mut m, "ns/e", "other", &[(8080, "TCP")]);
    assert!(e != a && e != d);
    assert_eq!(m.holders(&a), ["ns/a", "ns/b", "ns/c"]);

    // Asking for the shared address explicitly.
    let mut r = shared("ns/f", "k", &[(443, "TCP")]);
    r.requested = vec![a];
    let err = m.ensure(&r, &[]).unwrap_err();
    assert_eq!(err.metric_label(), "sharing_conflict", "{err}");
    let mut r = shared("ns/f", "other", &[(9, "TCP")]);
    r.requested = vec![a];
    assert_eq!(
        m.ensure(&r, &[]).unwrap_err().metric_label(),
        "sharing_conflict"
    );
    let mut r = req("ns/g");
    r.requested = vec![a];
    assert_eq!(
        m.ensure(&r, &[]).unwrap_err(),
        Refusal::InUse {
            ip: a,
            holder: "ns/a".into()
        }
    );

    // The address is freed only when its last holder goes.
    m.release("ns/a");
    m.release("ns/b");
    assert_eq!(m.holders(&a), ["ns/c"]);
    m.release("ns/c");
    assert!(m.holders(&a).is_empty());
    let mut r = req("ns/g");
    r.requested = vec![a];
    assert_eq!(m.ensure(&r, &[]).unwrap().ips, vec![a]);
}

#[test]
fn port_change_into_conflict_moves_only_that_service() {
    let (mut m, a) = two_sharing_one_address();
    let out = m
        .ensure(&shared("ns/b", "k", &[(80, "TCP")]), &[a])
        .unwrap();
    assert_ne!(out.ips[0], a);
    assert_eq!(out.released, vec![a]);
    assert_eq!(m.held("ns/a"), &[a]);
}

#[test]
fn requested_ips() {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/24", "2001:db8::/120"]))]);
    let mut r = req("ns/a");
    r.requested = vec![ip("192.0.2.77")];
    assert_eq!(m.ensure(&r, &[]).unwrap().ips, vec![ip("192.0.2.77")]);
    // Changing the request moves the Service and frees the old address.
    r.requested = vec![ip("192.0.2.78")];
    let out = m.ensure(&r, &[]).unwrap();
    assert_eq!(
        (out.ips.clone(), out.released.clone()),
        (vec![ip("192.0.2.78")], vec![ip("192.0.2.77")])
    );
    let mut r2 = req("ns/b");
    r2.requested = vec![ip("10.9.9.9")];
    assert_eq!(
        m.ensure(&r2, &[]).unwrap_err(),
        Refusal::OutsidePools { ip: ip("10.9.9.9") }
    );
}

#[test]
fn dual_stack_policies() {
    let v4 = pool("v4", spec(&["192.0.2.0/31"]));
    let v6 = pool("v6", spec(&["2001:db8::/64"]));
    let mut m = ipam(vec![v4, v6]);
    let mut r = req("ns/ds");
    r.families = wants(&[(Family::V6, true), (Family::V4, true)]);
    assert_eq!(
        m.ensure(&r, &[]).unwrap().ips,
        vec![ip("2001:db8::1"), ip("192.0.2.0")]
    );

    // Prefer: v4 exhausted after one more, then only v6 (no refusal).
    m.ensure(&req("ns/fill"), &[]).unwrap();
    let mut p = req("ns/prefer");
    p.families = wants(&[(Family::V6, true), (Family::V4, false)]);
    let out = m.ensure(&p, &[]).unwrap();
    assert_eq!(out.ips, vec![ip("2001:db8::2")]);
    assert_eq!(out.missing_optional.len(), 1);
    // Require: all or nothing; nothing is held after the refusal.
    let mut q = req("ns/require");
    q.families = wants(&[(Family::V6, true), (Family::V4, true)]);
    assert!(matches!(
        m.ensure(&q, &[]),
        Err(Refusal::PoolExhausted {
            family: Family::V4,
            ..
        })
    ));
    assert!(m.held("ns/require").is_empty());
    assert_eq!(m.usage("v6")[0].allocated, 2);
    // Once a v4 address frees up, Prefer fills its missing family on the next pass.
    m.release("ns/fill");
    assert_eq!(
        m.ensure(&p, &[ip("2001:db8::2")]).unwrap().ips,
        vec![ip("2001:db8::2"), ip("192.0.2.1")]
    );

    // No v6 pool at all: unsupported family.
    let mut m = ipam(vec![pool("v4", spec(&["192.0.2.0/24"]))]);
    let mut r = req("ns/v6only");
    r.families = wants(&[(Family::V6, true)]);
    assert_eq!(
        m.ensure(&r, &[]).unwrap_err().metric_label(),
        "unsupported_family"
    );
}

#[test]
fn pool_edits_never_move_services() {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/30"]))]);
    let a = m.ensure(&req("ns/a"), &[]).unwrap().ips[0];
    let b = m.ensure(&req("ns/b"), &[]).unwrap().ips[0];
    // Widen with a higher-priority CIDR in front, change selectors: nothing moves.
    let mut wider = spec(&["10.0.0.0/24", "192.0.2.0/24"]);
    wider.service_selector = Some(LabelSelector::default());
    m.set_pools(vec![pool("a", wider)], BTreeMap::new());
    assert_eq!(m.ensure(&req("ns/a"), &[a]).unwrap().ips, vec![a]);
    // Shrink so that b falls outside every pool: kept and reported.
    m.set_pools(vec![pool("a", spec(&["192.0.2.0/32"]))], BTreeMap::new());
    let out = m.ensure(&req("ns/b"), &[b]).unwrap();
    assert_eq!(out.ips, vec![b]);
    assert_eq!(out.outside_pools, vec![b]);
    // Delete every pool: still kept.
    m.set_pools(vec![], BTreeMap::new());
    assert_eq!(m.ensure(&req("ns/a"), &[a]).unwrap().ips, vec![a]);
}

#[test]
fn rebuild_from_status_restores_state_and_reports_conflicts() {
    let pools = || vec![pool("a", spec(&["192.0.2.0/24"]))];
    let mut m = ipam(pools());
    // Statuses as a previous leader left them: a and b share legally, c conflicts with a.
    let shared_ip = [ip("192.0.2.5")];
    let mut conflicts = m.adopt("ns/a", &shared_ip, Some("k"), &port_protos(&[(80, "TCP")]));
    conflicts.extend(m.adopt("ns/b", &shared_ip, Some("k"), &port_protos(&[(443, "TCP")])));
    conflicts.extend(m.adopt("ns/c", &shared_ip, None, &port_protos(&[(53, "UDP")])));
    conflicts.extend(m.adopt("ns/d", &[ip("192.0.2.0")], None, &[]));
    assert_eq!(
        conflicts,
        vec![RebuildConflict {
            service: "ns/c".into(),
            ip: ip("192.0.2.5"),
            holder: "ns/a".into()
        }]
    );
    assert_eq!(m.holders(&ip("192.0.2.5")), ["ns/a", "ns/b"]);
    // A new Service never gets an adopted address.
    assert_eq!(
        m.ensure(&req("ns/new"), &[]).unwrap().ips,
        vec![ip("192.0.2.1")]
    );
    // The conflicting Service is reported on reconcile, its status left alone.
    let mut c = req("ns/c");
    c.ports = port_protos(&[(53, "UDP")]);
    assert_eq!(
        m.ensure(&c, &[ip("192.0.2.5")]).unwrap_err(),
        Refusal::Conflict {
            ip: ip("192.0.2.5"),
            holder: "ns/a".into()
        }
    );
    assert!(m.held("ns/c").is_empty());
    // Reconcile of adopted Services keeps their addresses.
    assert_eq!(
        m.ensure(&shared("ns/b", "k", &[(443, "TCP")]), &[ip("192.0.2.5")])
            .unwrap()
            .ips,
        vec![ip("192.0.2.5")]
    );
}

#[test]
fn first_sight_adopts_status() {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/24"]))]);
    let out = m.ensure(&req("ns/a"), &[ip("192.0.2.200")]).unwrap();
    assert_eq!(out.ips, vec![ip("192.0.2.200")]);
    assert_eq!(out.adopted, vec![ip("192.0.2.200")]);
    assert!(out.allocated.is_empty());
}

#[test]
fn a_dual_stack_service_with_one_conflicting_address_adopts_neither() {
    let mut m = ipam(vec![pool("a", spec(&["192.0.2.0/24", "2001:db8::/64"]))]);
    assert!(m.adopt("ns/a", &[ip("192.0.2.5")], None, &[]).is_empty());
    let conflicts = m.adopt("ns/b", &[ip("192.0.2.5"), ip("2001:db8::5")], None, &[]);
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].ip, ip("192.0.2.5"));
    assert!(
        m.held("ns/b").is_empty(),
        "no half-adoption that ensure() would later complete with a new v4 address"
    );
    assert!(m.holders(&ip("2001:db8::5")).is_empty());
}

fn v6_req(key: &str) -> Request {
    let mut r = req(key);
    r.families = wants(&[(Family::V6, true)]);
    r
}

#[test]
fn the_v6_subnet_router_anycast_address_is_never_handed_out() {
    let mut m = ipam(vec![pool("v6", spec(&["2001:db8::/126"]))]);
    assert_eq!(m.pools()[0].usable(Family::V6), 3);
    let got: Vec<IpAddr> = (0..3)
        .map(|i| m.ensure(&v6_req(&format!("ns/s{i}")), &[]).unwrap().ips[0])
        .collect();
    assert_eq!(got, ["2001:db8::1", "2001:db8::2", "2001:db8::3"].map(ip));
    assert!(matches!(
        m.ensure(&v6_req("ns/more"), &[]),
        Err(Refusal::PoolExhausted { .. })
    ));
    assert_eq!(m.usage("v6")[0].free, 0);
    // Released and re-drawn: still never the anycast address.
    m.release("ns/s0");
    assert_eq!(
        m.ensure(&v6_req("ns/again"), &[]).unwrap().ips,
        vec![ip("2001:db8::1")]
    );
    // Asked for by name: refused with its own reason, not "outside every pool".
    let mut r = v6_req("ns/asks");
    r.requested = vec![ip("2001:db8::")];
    let e = m.ensure(&r, &[]).unwrap_err();
    assert_eq!(
        e,
        Refusal::Reserved {
            ip: ip("2001:db8::"),
            pool: "v6".into()
        }
    );
    assert_eq!(
        (e.reason(), e.metric_label()),
        ("IPReserved", "ip_reserved")
    );
    assert!(e.to_string().contains("subnet-router anycast"), "{e}");
}

#[test]
fn only_v6_cidrs_shorter_than_127_reserve_their_zero_address() {
    // A /127 (RFC 6164) and a /128 have no subnet-router anycast address; IPv4 CIDRs
    // and explicit ranges hand out their first address.
    let mut s = spec(&["2001:db8:1::/127", "2001:db8:2::/128", "192.0.2.0/31"]);
    s.ranges.push(IPRange {
        start: "2001:db8:3::".into(),
        end: "2001:db8:3::1".into(),
    });
    let p = pool("p", s);
    assert!(p.reserved.is_empty(), "{:?}", p.reserved);
    assert_eq!(p.usable(Family::V6), 5);
    let mut m = ipam(vec![p]);
    assert_eq!(
        m.ensure(&v6_req("ns/a"), &[]).unwrap().ips,
        vec![ip("2001:db8:1::")]
    );
    assert_eq!(
        m.ensure(&req("ns/b"), &[]).unwrap().ips,
        vec![ip("192.0.2.0")]
    );
    // Two /64s in one pool: each reserves its own.
    let p = pool("two", spec(&["2001:db8:a::/64", "2001:db8:b::/64"]));
    assert_eq!(
        p.reserved.iter().copied().collect::<Vec<_>>(),
        [ip("2001:db8:a::"), ip("2001:db8:b::")]
    );
    assert!(!p.offers(&ip("2001:db8:b::")) && p.offers(&ip("2001:db8:b::1")));
}

#[test]
fn a_cidr_with_host_bits_is_refused_naming_the_entry() {
    let errs = Pool::from_spec("p", &spec(&["192.0.2.0/28", "10.9.1.5/24"])).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "spec.cidrs[1]");
    assert_eq!(
        errs[0].to_string(),
        "spec.cidrs[1]: 10.9.1.5/24 has host bits set; write its network address or list \
         the addresses in ranges (the network is 10.9.1.0/24)"
    );
    let errs = Pool::from_spec("p", &spec(&["2001:db8::1/64"])).unwrap_err();
    assert!(
        errs[0].message.contains("(the network is 2001:db8::/64)"),
        "{errs:?}"
    );
}
