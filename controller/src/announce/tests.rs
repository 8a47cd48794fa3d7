use super::*;
use ringlb_crds::{BGPAdvertisementSpec, BGPPeerSpec, BGPPeerStatus, LabelSelector, NodeSession};

fn labels(kv: &[(&str, &str)]) -> Option<std::collections::BTreeMap<String, String>> {
    Some(
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn selector(kv: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: labels(kv),
        ..Default::default()
    })
}

fn pool(name: &str, cidrs: &[&str], l: &[(&str, &str)]) -> IPPool {
    let mut p = crate::pools::tests::obj(name, cidrs);
    p.metadata.labels = labels(l);
    p
}

fn advert(name: &str, pools: &[(&str, &str)], peers: &[(&str, &str)]) -> BGPAdvertisement {
    let mut spec: BGPAdvertisementSpec = serde_json::from_value(serde_json::json!({})).unwrap();
    spec.ip_pool_selector = (!pools.is_empty()).then(|| selector(pools)).flatten();
    spec.peer_selector = (!peers.is_empty()).then(|| selector(peers)).flatten();
    BGPAdvertisement::new(name, spec)
}

/// A peer with one entry per (node, state, families).
fn peer(name: &str, l: &[(&str, &str)], nodes: &[(&str, &str, &[&str])]) -> BGPPeer {
    let spec: BGPPeerSpec = serde_json::from_value(serde_json::json!({
        "peerAddress": "192.0.2.254", "peerASN": 65000, "myASN": 65001
    }))
    .unwrap();
    let mut p = BGPPeer::new(name, spec);
    p.metadata.labels = labels(l);
    p.status = Some(BGPPeerStatus {
        nodes: nodes
            .iter()
            .map(|(node, state, fams)| NodeSession {
                node: node.to_string(),
                state: state.to_string(),
                families: fams.iter().map(|f| f.to_string()).collect(),
                ..Default::default()
            })
            .collect(),
        conditions: vec![],
    });
    p
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn routing(pools: &[IPPool], adverts: &[BGPAdvertisement], peers: &[BGPPeer]) -> Routing {
    Routing::new(
        &pools.iter().collect::<Vec<_>>(),
        &adverts.iter().collect::<Vec<_>>(),
        &peers.iter().collect::<Vec<_>>(),
    )
}

const BOTH: &[&str] = &["IPv4", "IPv6"];

#[test]
fn a_pool_no_advertisement_selects_is_not_announced() {
    let pools = [
        pool("main", &["10.9.0.0/24"], &[("tier", "main")]),
        pool("dark", &["10.9.1.0/24"], &[("tier", "dark")]),
    ];
    let adverts = [advert("main", &[("tier", "main")], &[])];
    let peers = [peer("tor", &[], &[("edge-a", "Established", BOTH)])];
    let r = routing(&pools, &adverts, &peers);
    assert_eq!(
        r.reach(&ip("10.9.0.1")),
        Reach::Announced {
            peers: vec!["tor".into()],
            edges: 1
        }
    );
    assert_eq!(r.reach(&ip("10.9.1.0")), Reach::NoAdvertisement);
    let s = r.service(&[ip("10.9.1.0")]).unwrap();
    assert!(!s.announced);
    assert_eq!(s.reason, "NoAdvertisement");
    assert!(s.message.contains("10.9.1.0"), "{}", s.message);
    let (ok, reason, msg) = r.pool("dark");
    assert!(!ok);
    assert_eq!(reason, "NoAdvertisement");
    assert!(msg.contains("no BGPAdvertisement"), "{msg}");
    assert_eq!(r.pool("main").1, "Advertised");
}

#[test]
fn an_ipv6_vip_without_an_ipv6_session_is_not_announced() {
    let pools = [pool("ds", &["10.9.0.0/24", "2001:db8:9::/64"], &[])];
    let adverts = [advert("all", &[], &[])];
    let peers = [peer(
        "tor",
        &[],
        &[
            ("edge-a", "Established", &["IPv4"]),
            ("edge-b", "Established", &["IPv4"]),
        ],
    )];
    let r = routing(&pools, &adverts, &peers);
    let s = r.service(&[ip("10.9.0.1"), ip("2001:db8:9::1")]).unwrap();
    assert!(!s.announced);
    assert_eq!(s.reason, "FamilyNotNegotiated");
    assert!(s.message.contains("2001:db8:9::1"), "{}", s.message);
    assert!(s.message.contains("IPv6"), "{}", s.message);
    assert!(
        !s.message.contains("10.9.0.1"),
        "only what is missing: {}",
        s.message
    );
    // an edge that negotiates IPv6 too is enough
    let peers = [peer(
        "tor",
        &[],
        &[
            ("edge-a", "Established", &["IPv4"]),
            ("edge-b", "Established", BOTH),
        ],
    )];
    let r = routing(&pools, &adverts, &peers);
    let s = r.service(&[ip("10.9.0.1"), ip("2001:db8:9::1")]).unwrap();
    assert!(s.announced, "{s:?}");
    assert!(s.message.contains("from 2 edge(s)"), "{}", s.message);
}

#[test]
fn sessions_down_advertisements_without_peers_and_old_edges() {
    let pools = [pool("main", &["10.9.0.0/24"], &[])];
    // the advertisement selects peers labelled rack=r1; the one peer is not
    let adverts = [advert("main", &[], &[("rack", "r1")])];
    let peers = [peer(
        "tor",
        &[("rack", "r2")],
        &[("edge-a", "Established", BOTH)],
    )];
    let r = routing(&pools, &adverts, &peers);
    assert_eq!(
        r.reach(&ip("10.9.0.1")),
        Reach::NoPeer {
            adverts: vec!["main".into()]
        }
    );
    assert_eq!(r.pool("main").1, "NoPeer");
    // selected, but Active on every edge
    let peers = [peer(
        "tor",
        &[("rack", "r1")],
        &[("edge-a", "Active", &[]), ("edge-b", "Conflict", &[])],
    )];
    let r = routing(&pools, &adverts, &peers);
    assert_eq!(
        r.reach(&ip("10.9.0.1")),
        Reach::NoSession {
            peers: vec!["tor".into()]
        }
    );
    // an Established entry without families (an edge from before the field) carries both
    let peers = [peer(
        "tor",
        &[("rack", "r1")],
        &[("edge-a", "Established", &[])],
    )];
    let r = routing(&pools, &adverts, &peers);
    assert!(r.service(&[ip("10.9.0.1")]).unwrap().announced);
}

#[test]
fn no_vip_no_condition_and_equal_facts_compare_equal() {
    let pools = [pool("main", &["10.9.0.0/24"], &[])];
    let adverts = [advert("main", &[], &[])];
    let a = routing(
        &pools,
        &adverts,
        &[peer("tor", &[], &[("edge-a", "Established", BOTH)])],
    );
    assert_eq!(a.service(&[]), None);
    // a new advertised count or timestamp is no change of the facts
    let mut p = peer("tor", &[], &[("edge-a", "Established", BOTH)]);
    p.status.as_mut().unwrap().nodes[0].advertised = 7;
    p.status.as_mut().unwrap().nodes[0].last_transition = Some("2026-01-01T00:00:00Z".into());
    assert_eq!(a, routing(&pools, &adverts, &[p]));
    // a session going down is
    let down = routing(
        &pools,
        &adverts,
        &[peer("tor", &[], &[("edge-a", "Idle", &[])])],
    );
    assert_ne!(a, down);
}

#[test]
fn an_address_outside_every_pool_matches_only_advertisements_of_every_pool() {
    let pools = [pool("main", &["10.9.0.0/24"], &[("tier", "main")])];
    let only_main = [advert("main", &[("tier", "main")], &[])];
    let peers = [peer("tor", &[], &[("edge-a", "Established", BOTH)])];
    let r = routing(&pools, &only_main, &peers);
    assert_eq!(r.reach(&ip("198.51.100.1")), Reach::NoAdvertisement);
    let all = [advert("all", &[], &[])];
    let r = routing(&pools, &all, &peers);
    assert!(matches!(
        r.reach(&ip("198.51.100.1")),
        Reach::Announced { .. }
    ));
}
