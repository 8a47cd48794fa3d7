//! Pure route logic: the table of routes the speaker was asked to announce, a peer's
//! Adj-RIB-Out computed from it under the peer's export policy, and the difference
//! between what a peer was sent and what it should have (withdrawals + UPDATE groups
//! of prefixes that share attributes).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::codec::PathAttrs;
use super::config::{ExportRule, GRACEFUL_SHUTDOWN, PeerConfig, RouteAttrs};

/// What the speaker was asked to announce, shared with every peer task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    pub routes: BTreeMap<IpNetwork, RouteAttrs>,
    /// Graceful shutdown in progress: tag everything with GRACEFUL_SHUTDOWN.
    pub draining: bool,
}

/// Session facts the export depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionView {
    /// Local address of the TCP connection (for next-hop self).
    pub local_addr: IpAddr,
    pub ipv4: bool,
    pub ipv6: bool,
}

/// A peer's Adj-RIB-Out: prefix -> attributes.
pub type AdjRibOut = BTreeMap<IpNetwork, PathAttrs>;

fn covers(rule: &ExportRule, p: &IpNetwork) -> bool {
    match &rule.prefixes {
        None => true,
        Some(nets) => nets.iter().any(|n| {
            n.is_ipv4() == p.is_ipv4() && n.prefix() <= p.prefix() && n.contains(p.network())
        }),
    }
}

fn aggregate(p: &IpNetwork, rules: &[&ExportRule]) -> IpNetwork {
    let len = rules
        .iter()
        .filter_map(|r| {
            if p.is_ipv4() {
                r.aggregate_v4
            } else {
                r.aggregate_v6
            }
        })
        .min();
    match len {
        Some(l) if l < p.prefix() => IpNetwork::new(p.ip(), l)
            .and_then(|n| IpNetwork::new(n.network(), l))
            .unwrap_or(*p),
        _ => *p,
    }
}

fn next_hop(peer: &PeerConfig, s: &SessionView, v4: bool) -> Option<IpAddr> {
    if v4 {
        peer.next_hop_v4.map(IpAddr::V4).or(match s.local_addr {
            IpAddr::V4(a) => Some(IpAddr::V4(a)),
            IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4),
        })
    } else {
        peer.next_hop_v6.map(IpAddr::V6).or(match s.local_addr {
            IpAddr::V6(a) if a.to_ipv4_mapped().is_none() => Some(IpAddr::V6(a)),
            _ => None,
        })
    }
}

fn sorted_union<T: Ord + Clone>(a: &mut Vec<T>, b: &[T]) {
    a.extend_from_slice(b);
    a.sort();
    a.dedup();
}

/// A route below its health threshold: prepend (eBGP), raise MED, lower LOCAL_PREF
/// (iBGP), never making it more attractive than the rules made it.
fn deprefer(a: &mut PathAttrs, d: &super::config::Deprefer, peer: &PeerConfig, ibgp: bool) {
    if !ibgp {
        a.as_path
            .extend(std::iter::repeat_n(peer.local_asn, usize::from(d.prepend)));
    }
    if let Some(m) = d.med {
        a.med = Some(a.med.map_or(m, |x| x.max(m)));
    }
    if ibgp && let Some(lp) = d.local_pref {
        a.local_pref = Some(a.local_pref.map_or(lp, |x| x.min(lp)));
    }
}

/// Compute what `peer` should currently be told. Routes of a family the session did
/// not negotiate, or with no usable next hop, are left out.
pub fn adj_rib_out(table: &RouteTable, peer: &PeerConfig, s: &SessionView) -> AdjRibOut {
    let ibgp = peer.is_ibgp();
    let nh4 = next_hop(peer, s, true);
    let nh6 = next_hop(peer, s, false);
    let mut out = AdjRibOut::new();
    for (p, ra) in &table.routes {
        let v4 = p.is_ipv4();
        if (v4 && !s.ipv4) || (!v4 && !s.ipv6) {
            continue;
        }
        let Some(nh) = (if v4 { nh4 } else { nh6 }) else {
            continue;
        };
        let rules: Vec<&ExportRule> = peer.policy.rules.iter().filter(|r| covers(r, p)).collect();
        if !peer.policy.rules.is_empty() && rules.is_empty() {
            continue;
        }
        let mut a = PathAttrs {
            origin: 0,
            as_path: if ibgp { vec![] } else { vec![peer.local_asn] },
            next_hop: Some(nh),
            med: rules.iter().rev().find_map(|r| r.med).or(ra.med),
            local_pref: None,
            communities: ra.communities.clone(),
            large_communities: ra.large_communities.clone(),
        };
        for r in &rules {
            sorted_union(&mut a.communities, &r.communities);
            sorted_union(&mut a.large_communities, &r.large_communities);
        }
        if ibgp {
            let lp = rules
                .iter()
                .filter_map(|r| r.local_pref)
                .max()
                .or(ra.local_pref);
            a.local_pref = Some(lp.unwrap_or(100));
        }
        if let Some(d) = &ra.deprefer {
            deprefer(&mut a, d, peer, ibgp);
        }
        if table.draining {
            // RFC 8326 §4: tag, and for iBGP also lower LOCAL_PREF ourselves.
            sorted_union(&mut a.communities, &[GRACEFUL_SHUTDOWN]);
            if ibgp {
                a.local_pref = Some(0);
            }
        }
        sorted_union(&mut a.communities, &[]);
        sorted_union(&mut a.large_communities, &[]);
        let key = aggregate(p, &rules);
        match out.get_mut(&key) {
            // Several routes under one aggregate: merge their communities.
            Some(existing) => {
                let (c, l) = (a.communities, a.large_communities);
                sorted_union(&mut existing.communities, &c);
                sorted_union(&mut existing.large_communities, &l);
            }
            None => {
                out.insert(key, a);
            }
        }
    }
    out
}

/// Announcements grouped by shared attributes (one family per group).
pub type Groups = Vec<(PathAttrs, Vec<IpNetwork>)>;

/// What to send to move a peer from `sent` to `want`.
pub fn diff(sent: &AdjRibOut, want: &AdjRibOut) -> (Vec<IpNetwork>, Groups) {
    let withdrawn: Vec<IpNetwork> = sent
        .keys()
        .filter(|p| !want.contains_key(p))
        .copied()
        .collect();
    let mut groups: BTreeMap<(bool, &PathAttrs), Vec<IpNetwork>> = BTreeMap::new();
    for (p, a) in want {
        if sent.get(p) != Some(a) {
            groups.entry((p.is_ipv4(), a)).or_default().push(*p);
        }
    }
    let groups = groups
        .into_iter()
        .map(|((_, a), ps)| (a.clone(), ps))
        .collect();
    (withdrawn, groups)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::net::Ipv4Addr;

    use super::*;
    use crate::config::ExportPolicy;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn peer(local: u32, remote: u32, rules: Vec<ExportRule>) -> PeerConfig {
        let address = "10.0.0.1".parse().unwrap();
        PeerConfig {
            hold_time: 3,
            keepalive: 1,
            connect_retry: Duration::from_secs(1),
            next_hop_v6: Some("fd00::11".parse().unwrap()),
            policy: ExportPolicy { rules },
            ..PeerConfig::new(address, local, remote, Ipv4Addr::new(10, 0, 0, 11))
        }
    }

    fn view() -> SessionView {
        SessionView {
            local_addr: "10.0.0.11".parse().unwrap(),
            ipv4: true,
            ipv6: true,
        }
    }

    fn table(ps: &[&str]) -> RouteTable {
        RouteTable {
            routes: ps.iter().map(|p| (net(p), RouteAttrs::default())).collect(),
            draining: false,
        }
    }

    #[test]
    fn ebgp_gets_our_as_and_next_hop_self_no_local_pref() {
        let t = table(&["10.1.0.1/32", "fd00:1::1/128"]);
        let out = adj_rib_out(&t, &peer(65011, 65000, vec![]), &view());
        let a = &out[&net("10.1.0.1/32")];
        assert_eq!(a.as_path, vec![65011]);
        assert_eq!(a.next_hop, Some("10.0.0.11".parse().unwrap()));
        assert_eq!(a.local_pref, None);
        assert_eq!(
            out[&net("fd00:1::1/128")].next_hop,
            Some("fd00::11".parse().unwrap())
        );
    }

    #[test]
    fn a_depreferred_route_is_prepended_to_ebgp_and_lowered_to_ibgp() {
        let d = crate::config::Deprefer {
            prepend: 3,
            med: Some(500),
            local_pref: Some(50),
        };
        let mut t = table(&["10.1.0.1/32"]);
        t.routes.get_mut(&net("10.1.0.1/32")).unwrap().deprefer = Some(d);
        let rule = ExportRule {
            local_pref: Some(250),
            med: Some(900),
            ..Default::default()
        };
        let e =
            &adj_rib_out(&t, &peer(65011, 65000, vec![rule.clone()]), &view())[&net("10.1.0.1/32")];
        assert_eq!(e.as_path, vec![65011; 4], "our ASN plus three copies");
        assert_eq!(e.med, Some(900), "never lower than the rule's MED");
        assert_eq!(e.local_pref, None);
        let i = &adj_rib_out(&t, &peer(65000, 65000, vec![rule]), &view())[&net("10.1.0.1/32")];
        assert!(i.as_path.is_empty(), "no prepending to iBGP");
        assert_eq!(i.local_pref, Some(50), "lower than the rule's 250");
        // Without a rule the MED is the deprefer's own.
        let e = &adj_rib_out(&t, &peer(65011, 65000, vec![]), &view())[&net("10.1.0.1/32")];
        assert_eq!(e.med, Some(500));
        let merged = d.merge(crate::config::Deprefer {
            prepend: 1,
            med: Some(700),
            local_pref: None,
        });
        assert_eq!(
            (merged.prepend, merged.med, merged.local_pref),
            (3, Some(700), Some(50))
        );
    }

    #[test]
    fn ibgp_gets_empty_path_and_local_pref_from_the_rule() {
        let rule = ExportRule {
            local_pref: Some(250),
            communities: vec![7],
            ..Default::default()
        };
        let t = table(&["10.1.0.1/32"]);
        let out = adj_rib_out(&t, &peer(65000, 65000, vec![rule]), &view());
        let a = &out[&net("10.1.0.1/32")];
        assert!(a.as_path.is_empty());
        assert_eq!(a.local_pref, Some(250));
        assert_eq!(a.communities, vec![7]);
    }

    #[test]
    fn rules_filter_by_prefix_and_aggregate() {
        let rule = ExportRule {
            prefixes: Some(vec![net("10.1.0.0/24")]),
            aggregate_v4: Some(24),
            ..Default::default()
        };
        let t = table(&["10.1.0.1/32", "10.1.0.2/32", "10.2.0.1/32"]);
        let out = adj_rib_out(&t, &peer(65011, 65000, vec![rule]), &view());
        assert_eq!(
            out.keys().copied().collect::<Vec<_>>(),
            vec![net("10.1.0.0/24")]
        );
    }

    #[test]
    fn draining_adds_graceful_shutdown_and_zero_local_pref_for_ibgp() {
        let mut t = table(&["10.1.0.1/32"]);
        t.draining = true;
        let out = adj_rib_out(&t, &peer(65000, 65000, vec![]), &view());
        let a = &out[&net("10.1.0.1/32")];
        assert_eq!(a.communities, vec![GRACEFUL_SHUTDOWN]);
        assert_eq!(a.local_pref, Some(0));
    }

    #[test]
    fn family_not_negotiated_or_without_next_hop_is_skipped() {
        let t = table(&["10.1.0.1/32", "fd00:1::1/128"]);
        let mut p = peer(65011, 65000, vec![]);
        p.next_hop_v6 = None;
        let out = adj_rib_out(&t, &p, &view());
        assert_eq!(out.len(), 1, "no IPv6 next hop on an IPv4 session");
        let v = SessionView {
            ipv4: false,
            ..view()
        };
        assert!(adj_rib_out(&t, &p, &v).is_empty());
    }

    #[test]
    fn diff_groups_by_attributes_and_withdraws_the_rest() {
        let t = table(&["10.1.0.1/32", "10.1.0.2/32", "10.1.0.3/32"]);
        let p = peer(65011, 65000, vec![]);
        let before = adj_rib_out(&t, &p, &view());
        let (w, g) = diff(&AdjRibOut::new(), &before);
        assert!(w.is_empty());
        assert_eq!(g.len(), 1, "one shared attribute set -> one group");
        assert_eq!(g[0].1.len(), 3);

        let mut t2 = table(&["10.1.0.1/32", "10.1.0.2/32"]);
        t2.routes.get_mut(&net("10.1.0.2/32")).unwrap().communities = vec![9];
        let after = adj_rib_out(&t2, &p, &view());
        let (w, g) = diff(&before, &after);
        assert_eq!(w, vec![net("10.1.0.3/32")]);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].1, vec![net("10.1.0.2/32")]);
        assert_eq!(g[0].0.communities, vec![9]);
    }
}
