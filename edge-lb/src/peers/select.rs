//! Which peers this edge node talks to, and what it tells each of them, from the
//! `BGPPeer`, `BGPAdvertisement` and `IPPool` objects: a pure function of the node's
//! labels and the objects, so it is tested without an API server. Also the builder of
//! the per-node entry in `BGPPeer.status.nodes`.

use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::IpNetwork;
use ringlb_crds::bgppeer::BGPPeerSpec;
use ringlb_crds::{
    BGPAdvertisement, BGPPeer, BGPPeerStatus, IPPool, LabelSelector, NodeSession, SecretKeyRef,
};

use ringlb_bgp::Error;
use ringlb_bgp::bfd::BfdSpec;
use ringlb_bgp::config::{
    ExportPolicy, ExportRule, PeerConfig, PeerSpec, parse_community, parse_large_community,
    peer_from_spec,
};
use ringlb_bgp::session::PeerStatus;

use super::report::{Conflict, SecretProblem, resolve_sessions};

pub use ringlb_crds::labels::Labels;

/// Kubernetes label-selector semantics (`ringlb_crds::labels`): `None` or empty
/// selects everything; `matchLabels` and every `matchExpressions` entry must hold.
/// `what` names the selector in errors.
pub fn selector_matches(
    sel: Option<&LabelSelector>,
    labels: &Labels,
    what: &str,
) -> Result<bool, Error> {
    ringlb_crds::labels::selects(what, sel, labels).map_err(|e| Error::Config {
        field: e.field,
        reason: e.message,
    })
}

/// The CIDRs covering an inclusive range (the usual greedy split).
pub fn range_to_cidrs(start: IpAddr, end: IpAddr) -> Vec<IpNetwork> {
    let (bits, s, e) = match (start, end) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            (32u32, u128::from(u32::from(a)), u128::from(u32::from(b)))
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => (128, u128::from(a), u128::from(b)),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    let mut cur = s;
    while cur <= e {
        // Largest block aligned at `cur` that does not pass `e`.
        let mut size_bits = if cur == 0 {
            bits
        } else {
            cur.trailing_zeros().min(bits)
        };
        while size_bits > 0 && (size_bits >= 128 || cur + ((1u128 << size_bits) - 1) > e) {
            size_bits -= 1;
        }
        let addr = if bits == 32 {
            IpAddr::V4(Ipv4Addr::from(cur as u32))
        } else {
            IpAddr::V6(cur.into())
        };
        if let Ok(n) = IpNetwork::new(addr, (bits - size_bits) as u8) {
            out.push(n);
        }
        let step = 1u128.checked_shl(size_bits).unwrap_or(0);
        match cur.checked_add(step) {
            Some(n) if step > 0 => cur = n,
            _ => break,
        }
    }
    out
}

fn pool_prefixes(pool: &IPPool) -> Vec<IpNetwork> {
    let mut v: Vec<IpNetwork> = pool
        .spec
        .cidrs
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    for r in &pool.spec.ranges {
        if let (Ok(s), Ok(e)) = (r.start.parse(), r.end.parse()) {
            v.extend(range_to_cidrs(s, e));
        }
    }
    v
}

fn labels_of(meta: &kube::api::ObjectMeta) -> Labels {
    meta.labels.clone().unwrap_or_default()
}

fn name_of(meta: &kube::api::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// This node's sessions. Peers whose objects are invalid are reported in `errors`
/// (by object name) and left out; the others still run. A later peer with the
/// address of an earlier one is left out and reported in `conflicts`.
#[derive(Debug, Default)]
pub struct Selection {
    pub peers: Vec<PeerConfig>,
    /// The `BGPPeer` object name of each entry of `peers`, in the same order.
    pub names: Vec<String>,
    pub errors: Vec<(String, Error)>,
    /// The reason (`SecretNotFound`, ...) of each entry of `errors` whose Secret is
    /// the problem, by object name.
    pub secret_problems: Vec<(String, &'static str)>,
    pub conflicts: Vec<Conflict>,
}

/// Pick the `BGPPeer`s whose `nodeSelector` matches this node, and for each the export
/// policy made of the `BGPAdvertisement`s whose `peerSelector` matches the peer. A peer
/// no advertisement selects is still peered with but told nothing.
pub fn select_for_node(
    node_labels: &Labels,
    router_id: Ipv4Addr,
    peers: &[BGPPeer],
    adverts: &[BGPAdvertisement],
    pools: &[IPPool],
    password: &dyn Fn(&SecretKeyRef) -> Result<String, SecretProblem>,
) -> Selection {
    let mut sel = Selection::default();
    let mut here = Vec::new();
    for p in peers {
        match selector_matches(p.spec.node_selector.as_ref(), node_labels, "nodeSelector") {
            Ok(true) => here.push(p),
            Ok(false) => {}
            Err(e) => sel.errors.push((name_of(&p.metadata), e)),
        }
    }
    let (here, conflicts) = resolve_sessions(&here);
    sel.conflicts = conflicts;
    for p in here {
        let pname = name_of(&p.metadata);
        let r = (|| -> Result<Option<PeerConfig>, Error> {
            let plabels = labels_of(&p.metadata);
            let mut rules = Vec::new();
            for a in adverts {
                if !selector_matches(a.spec.peer_selector.as_ref(), &plabels, "peerSelector")? {
                    continue;
                }
                let prefixes = match &a.spec.ip_pool_selector {
                    None => None,
                    Some(s) => {
                        let mut v = Vec::new();
                        for pool in pools {
                            if selector_matches(
                                Some(s),
                                &labels_of(&pool.metadata),
                                "ipPoolSelector",
                            )? {
                                v.extend(pool_prefixes(pool));
                            }
                        }
                        Some(v)
                    }
                };
                let agg = a.spec.aggregation_length.as_ref();
                rules.push(ExportRule {
                    prefixes,
                    communities: a
                        .spec
                        .communities
                        .iter()
                        .map(|c| parse_community(c))
                        .collect::<Result<_, _>>()?,
                    large_communities: a
                        .spec
                        .large_communities
                        .iter()
                        .map(|c| parse_large_community(c))
                        .collect::<Result<_, _>>()?,
                    local_pref: a.spec.local_pref,
                    med: None,
                    aggregate_v4: agg.and_then(|x| x.v4),
                    aggregate_v6: agg.and_then(|x| x.v6),
                });
            }
            if rules.is_empty() {
                rules.push(ExportRule {
                    prefixes: Some(Vec::new()),
                    ..Default::default()
                });
            }
            let pw = match &p.spec.password_secret_ref {
                None => None,
                Some(r) => Some(password(r).map_err(|e| {
                    sel.secret_problems.push((pname.clone(), e.reason()));
                    Error::Config {
                        field: "spec.passwordSecretRef".into(),
                        reason: e.message(r),
                    }
                })?),
            };
            let spec = PeerSpec {
                password: pw,
                ..peer_spec(&p.spec)
            };
            peer_from_spec(&spec, router_id, ExportPolicy { rules }).map(Some)
        })();
        match r {
            Ok(Some(c)) => {
                sel.peers.push(c);
                sel.names.push(pname);
            }
            Ok(None) => {}
            Err(e) => sel.errors.push((pname, e)),
        }
    }
    sel
}

/// A `BGPPeer`'s session settings for the speaker (which knows no Kubernetes types);
/// the password comes from its Secret, the file-only settings stay at their defaults.
pub fn peer_spec(spec: &BGPPeerSpec) -> PeerSpec {
    PeerSpec {
        peer_address: spec.peer_address.clone(),
        peer_asn: spec.peer_asn,
        my_asn: spec.my_asn,
        port: spec.port,
        hold_time: spec.hold_time,
        keepalive_time: spec.keepalive_time,
        ebgp_multihop: spec.ebgp_multihop,
        source_address: spec.source_address.clone(),
        bfd: spec.bfd.as_ref().map(|b| BfdSpec {
            min_rx_ms: b.min_rx_ms,
            min_tx_ms: b.min_tx_ms,
            multiplier: b.multiplier,
        }),
        ttl_security: spec.ttl_security.unwrap_or(false),
        graceful_restart_time: spec.restart_time(),
        ..Default::default()
    }
}

/// This node's entry for `BGPPeer.status.nodes`.
pub fn node_session(node: &str, st: &PeerStatus) -> NodeSession {
    let ts = st
        .last_transition
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| rfc3339(d.as_secs()));
    NodeSession {
        node: node.to_string(),
        state: st.state.as_str().to_string(),
        advertised: st.advertised as u32,
        families: st
            .negotiated
            .iter()
            .filter(|_| st.state == ringlb_bgp::fsm::State::Established)
            .flat_map(|n| n.families.iter().map(|f| f.name().to_string()))
            .collect(),
        last_transition: ts,
        last_error: st.last_error.clone(),
    }
}

/// Put this node's entry into a `BGPPeer` status, leaving the other nodes' entries
/// alone. Returns whether anything changed (so unchanged statuses are not written).
pub fn merge_node_session(status: &mut BGPPeerStatus, entry: NodeSession) -> bool {
    match status.nodes.iter_mut().find(|n| n.node == entry.node) {
        Some(n) if *n == entry => false,
        Some(n) => {
            *n = entry;
            true
        }
        None => {
            status.nodes.push(entry);
            status.nodes.sort_by(|a, b| a.node.cmp(&b.node));
            true
        }
    }
}

/// Seconds since the epoch as RFC 3339 UTC (civil-from-days, H. Hinnant).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;
