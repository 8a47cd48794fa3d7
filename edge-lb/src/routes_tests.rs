//! The routes an edge announces for what the API says, through the whole pure path:
//! `serving::build` -> `tables::datapath_state` -> `vip_health::Tracker`. Test-only;
//! it sits above the three modules so none of them needs another for its tests.

use std::time::Instant;

use crate::vip_health::Tracker;

#[test]
fn a_vip_without_endpoints_of_its_family_is_not_announced() {
    use crate::serving::build;
    use crate::serving::fixtures::{ep, one_pod_slice, service};
    use crate::tables::{Tables, datapath_state};
    use serde_json::json;
    let svc = service("web", &["192.0.2.1", "2001:db8::1"], json!([{"port": 80}]));
    let v4 = one_pod_slice("v4", "IPv4", 80, ep("10.0.0.1", true, true, false));
    let v6 = one_pod_slice("v6", "IPv6", 80, ep("fd00::1", true, true, false));
    let routes = |slices: &[_]| {
        let want = build(std::slice::from_ref(&svc), slices, true);
        let (programmed, problems) = datapath_state(&want, 251, &mut Tables::default());
        assert!(problems.is_empty(), "{problems:?}");
        let ev = Tracker::default().evaluate(&want, &programmed, Instant::now());
        ev.routes
            .into_keys()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
    };
    // Dual-stack pods: both VIPs served and announced.
    assert_eq!(
        routes(&[v4.clone(), v6]),
        ["192.0.2.1/32", "2001:db8::1/128"]
    );
    // IPv4-only pods: the IPv6 VIP has no entry and no route, as with no pods.
    assert_eq!(routes(&[v4]), ["192.0.2.1/32"]);
    assert!(routes(&[]).is_empty());
}

/// Every pod terminating, still serving (a rollout of the last pods): they take
/// the new flows and the VIP stays announced; terminating and no longer
/// serving, it is withdrawn.
#[test]
fn terminating_pods_that_still_serve_keep_the_vip_announced() {
    use crate::serving::build;
    use crate::serving::fixtures::{ep, one_pod_slice, service};
    use crate::tables::{Tables, datapath_state};
    use serde_json::json;
    let svc = service("web", &["192.0.2.1"], json!([{"port": 80}]));
    let routes = |serving: bool| {
        let s = one_pod_slice("v4", "IPv4", 80, ep("10.0.0.1", false, serving, true));
        let want = build(std::slice::from_ref(&svc), &[s], true);
        let (programmed, _) = datapath_state(&want, 251, &mut Tables::default());
        let ev = Tracker::default().evaluate(&want, &programmed, Instant::now());
        (ev.routes.len(), ev.facts[0].serving_terminating)
    };
    assert_eq!(routes(true), (1, 1));
    assert_eq!(routes(false), (0, 0));
}
