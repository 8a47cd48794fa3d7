//! Selection from CRD objects, built from JSON as the API server would send them.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;

use super::*;
use crate::peers::report::SecretProblem;
use ringlb_bgp::fsm::State;

fn peer(name: &str, labels: serde_json::Value, spec: serde_json::Value) -> BGPPeer {
    serde_json::from_value(json!({
        "apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
        "metadata": {"name": name, "labels": labels}, "spec": spec
    }))
    .unwrap()
}

fn advert(spec: serde_json::Value) -> BGPAdvertisement {
    serde_json::from_value(json!({
        "apiVersion": "ringlb.io/v1alpha1", "kind": "BGPAdvertisement",
        "metadata": {"name": "a"}, "spec": spec
    }))
    .unwrap()
}

fn pool(name: &str, labels: serde_json::Value, spec: serde_json::Value) -> IPPool {
    serde_json::from_value(json!({
        "apiVersion": "ringlb.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "labels": labels}, "spec": spec
    }))
    .unwrap()
}

fn node(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

#[test]
fn node_selector_and_peer_selector_build_per_peer_policy() {
    let peers = vec![
        peer(
            "tor-a",
            json!({"rack": "a"}),
            json!({
                "peerAddress": "10.0.0.1", "peerASN": 65000, "myASN": 65011, "holdTime": 3,
                "nodeSelector": {"matchLabels": {"rack": "a"}}
            }),
        ),
        peer(
            "tor-b",
            json!({"rack": "b"}),
            json!({
                "peerAddress": "10.0.1.1", "peerASN": 65000, "myASN": 65011,
                "nodeSelector": {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["b"]}]}
            }),
        ),
        peer(
            "everyone",
            json!({}),
            json!({"peerAddress": "fd00::1", "peerASN": 65011, "myASN": 65011}),
        ),
    ];
    let pools = vec![
        pool(
            "public",
            json!({"tier": "public"}),
            json!({
                "cidrs": ["192.0.2.0/24"], "ranges": [{"start": "198.51.100.1", "end": "198.51.100.2"}]
            }),
        ),
        pool(
            "internal",
            json!({"tier": "internal"}),
            json!({"cidrs": ["10.9.0.0/16"]}),
        ),
    ];
    let adverts = vec![
        advert(json!({
            "peerSelector": {"matchLabels": {"rack": "a"}},
            "ipPoolSelector": {"matchLabels": {"tier": "public"}},
            "communities": ["65011:100"], "largeCommunities": ["65011:1:2"], "localPref": 150
        })),
        advert(json!({"communities": ["65011:1"]})),
    ];
    let sel = select_for_node(
        &node(&[("rack", "a")]),
        Ipv4Addr::new(10, 0, 0, 11),
        &peers,
        &adverts,
        &pools,
        &|_| Err(SecretProblem::NotFound),
    );
    assert!(sel.errors.is_empty(), "{:?}", sel.errors);
    let addrs: Vec<String> = sel.peers.iter().map(|p| p.address.to_string()).collect();
    assert_eq!(addrs, vec!["10.0.0.1", "fd00::1"], "tor-b is for rack b");
    let tor_a = &sel.peers[0];
    assert_eq!(tor_a.hold_time, 3);
    assert_eq!(tor_a.policy.rules.len(), 2);
    let r = &tor_a.policy.rules[0];
    assert_eq!(
        r.prefixes.as_deref().unwrap(),
        &[
            net("192.0.2.0/24"),
            net("198.51.100.1/32"),
            net("198.51.100.2/32")
        ]
    );
    assert_eq!(r.communities, vec![(65011 << 16) | 100]);
    assert_eq!(r.large_communities, vec![[65011, 1, 2]]);
    assert_eq!(r.local_pref, Some(150));
    // Only the catch-all advertisement selects the iBGP peer.
    assert_eq!(sel.peers[1].policy.rules.len(), 1);
    assert_eq!(sel.peers[1].policy.rules[0].prefixes, None);
}

#[test]
fn peer_without_advertisement_is_told_nothing() {
    let peers = vec![peer(
        "p",
        json!({}),
        json!({"peerAddress": "10.0.0.1", "peerASN": 1, "myASN": 2}),
    )];
    let sel = select_for_node(&node(&[]), Ipv4Addr::LOCALHOST, &peers, &[], &[], &|_| {
        Err(SecretProblem::NotFound)
    });
    assert_eq!(sel.peers[0].policy.rules[0].prefixes, Some(vec![]));
}

#[test]
fn bad_objects_are_reported_by_name_and_do_not_stop_the_others() {
    let peers = vec![
        peer(
            "bad-addr",
            json!({}),
            json!({"peerAddress": "nope", "peerASN": 1, "myASN": 2}),
        ),
        peer(
            "no-secret",
            json!({}),
            json!({
                "peerAddress": "10.0.0.2", "peerASN": 1, "myASN": 2,
                "passwordSecretRef": {"name": "s", "namespace": "ringlb"}
            }),
        ),
        peer(
            "with-secret",
            json!({}),
            json!({
                "peerAddress": "10.0.0.3", "peerASN": 1, "myASN": 2,
                "passwordSecretRef": {"name": "good", "namespace": "ringlb"}
            }),
        ),
    ];
    let pw = |r: &SecretKeyRef| {
        if r.name == "good" {
            Ok("pw".to_string())
        } else {
            Err(SecretProblem::NotFound)
        }
    };
    let sel = select_for_node(&node(&[]), Ipv4Addr::LOCALHOST, &peers, &[], &[], &pw);
    let names: Vec<&str> = sel.errors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["bad-addr", "no-secret"]);
    assert_eq!(sel.peers.len(), 1);
    assert_eq!(sel.peers[0].password.as_deref(), Some("pw"));
    assert_eq!(
        sel.secret_problems,
        vec![("no-secret".to_string(), "SecretNotFound")]
    );
    assert!(
        sel.errors[1]
            .1
            .to_string()
            .contains("spec.passwordSecretRef: Secret ringlb/s does not exist"),
        "{}",
        sel.errors[1].1
    );
}

/// A second BGPPeer with the first one's address (another ASN and port) is a
/// conflict on this node, not a silent no-op: the earlier one keeps the session.
#[test]
fn a_later_peer_with_the_same_address_is_a_conflict() {
    let mk = |name: &str, created: &str, spec: serde_json::Value| {
        let mut p = peer(name, json!({}), spec);
        p.metadata.creation_timestamp = Some(serde_json::from_value(json!(created)).unwrap());
        p
    };
    let peers = vec![
        mk(
            "second",
            "2026-01-02T00:00:00Z",
            json!({"peerAddress": "10.0.0.1", "peerASN": 65100, "myASN": 2, "port": 1179}),
        ),
        mk(
            "first",
            "2026-01-01T00:00:00Z",
            json!({"peerAddress": "10.0.0.1", "peerASN": 65000, "myASN": 2}),
        ),
        mk(
            "elsewhere",
            "2026-01-03T00:00:00Z",
            json!({"peerAddress": "10.0.0.1", "peerASN": 1, "myASN": 2,
                   "nodeSelector": {"matchLabels": {"rack": "b"}}}),
        ),
    ];
    let sel = select_for_node(&node(&[]), Ipv4Addr::LOCALHOST, &peers, &[], &[], &|_| {
        Err(SecretProblem::NotFound)
    });
    assert_eq!(sel.names, vec!["first"]);
    assert_eq!(sel.peers[0].peer_asn, 65000);
    assert_eq!(sel.conflicts.len(), 1, "{:?}", sel.conflicts);
    assert_eq!(
        (
            sel.conflicts[0].peer.as_str(),
            sel.conflicts[0].holder.as_str()
        ),
        ("second", "first")
    );
}

#[test]
fn selector_operators() {
    let l = node(&[("a", "1")]);
    let matches = |expr: serde_json::Value| {
        let s = serde_json::from_value::<LabelSelector>(json!({"matchExpressions": [expr]}));
        selector_matches(Some(&s.unwrap()), &l, "x")
    };
    assert!(matches(json!({"key": "a", "operator": "Exists"})).unwrap());
    assert!(!matches(json!({"key": "a", "operator": "DoesNotExist"})).unwrap());
    assert!(matches(json!({"key": "a", "operator": "NotIn", "values": ["2"]})).unwrap());
    assert!(matches(json!({"key": "a", "operator": "Bogus"})).is_err());
}

#[test]
fn ranges_split_into_cidrs() {
    let r = range_to_cidrs("10.0.0.1".parse().unwrap(), "10.0.0.6".parse().unwrap());
    let s: Vec<String> = r.iter().map(|n| n.to_string()).collect();
    assert_eq!(
        s,
        vec!["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"]
    );
    assert_eq!(
        range_to_cidrs("::".parse().unwrap(), "::ffff".parse().unwrap()),
        vec![net("::/112")]
    );
}

#[test]
fn node_session_status() {
    let st = PeerStatus {
        state: State::Established,
        advertised: 3,
        last_transition: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        last_error: Some("x".into()),
        ..Default::default()
    };
    let n = node_session("edge-1", &st);
    assert_eq!(n.state, "Established");
    assert_eq!(n.advertised, 3);
    assert_eq!(n.last_transition.as_deref(), Some("2023-11-14T22:13:20Z"));
    assert!(
        n.families.is_empty(),
        "nothing negotiated: {:?}",
        n.families
    );
    // the negotiated families, only while Established (the controller's Announced
    // condition reads them)
    let negotiated = ringlb_bgp::fsm::Negotiated {
        hold_time: Duration::from_secs(90),
        keepalive: Duration::from_secs(30),
        four_octet_asn: true,
        families: vec![ringlb_bgp::codec::Afi::Ipv4],
        route_refresh: true,
        peer_bgp_id: std::net::Ipv4Addr::new(192, 0, 2, 1),
        peer_graceful_restart: false,
    };
    let up = PeerStatus {
        negotiated: Some(negotiated),
        ..st.clone()
    };
    assert_eq!(node_session("edge-1", &up).families, ["IPv4"]);
    let down = PeerStatus {
        state: State::OpenConfirm,
        ..up
    };
    assert!(node_session("edge-1", &down).families.is_empty());
}

#[test]
fn merge_node_session_replaces_only_this_node() {
    let mut st = BGPPeerStatus::default();
    let e = |node: &str, state: &str| NodeSession {
        node: node.into(),
        state: state.into(),
        ..Default::default()
    };
    assert!(merge_node_session(&mut st, e("b", "Active")));
    assert!(merge_node_session(&mut st, e("a", "Established")));
    assert!(
        !merge_node_session(&mut st, e("a", "Established")),
        "no change, no write"
    );
    assert!(merge_node_session(&mut st, e("b", "Established")));
    let nodes: Vec<(&str, &str)> = st
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.state.as_str()))
        .collect();
    assert_eq!(nodes, vec![("a", "Established"), ("b", "Established")]);
}

#[test]
fn bfd_block_reaches_the_peer_config_with_defaults_and_checks() {
    let peers = vec![
        peer(
            "bfd",
            json!({}),
            json!({
                "peerAddress": "10.0.0.1", "peerASN": 1, "myASN": 2,
                "bfd": {"minRxMs": 100, "multiplier": 5}
            }),
        ),
        peer(
            "no-bfd",
            json!({}),
            json!({"peerAddress": "10.0.0.2", "peerASN": 1, "myASN": 2}),
        ),
        peer(
            "bad-bfd",
            json!({}),
            json!({"peerAddress": "10.0.0.3", "peerASN": 1, "myASN": 2, "bfd": {"minTxMs": 5}}),
        ),
    ];
    let sel = select_for_node(&node(&[]), Ipv4Addr::LOCALHOST, &peers, &[], &[], &|_| {
        Err(SecretProblem::NotFound)
    });
    let b = sel.peers[0].bfd.expect("bfd configured");
    assert_eq!(b.min_rx, Duration::from_millis(100));
    assert_eq!(b.min_tx, Duration::from_millis(300));
    assert_eq!((b.multiplier, b.port), (5, 3784));
    assert_eq!(sel.peers[1].bfd, None);
    assert_eq!(sel.errors.len(), 1);
    assert_eq!(sel.errors[0].0, "bad-bfd");
    assert!(
        sel.errors[0].1.to_string().contains("bfd.minTxMs"),
        "{}",
        sel.errors[0].1
    );
}
