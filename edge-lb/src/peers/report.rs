//! What a `BGPPeer` that selects this node but runs no session here says about it:
//! a session conflict with another `BGPPeer`, or a password Secret that cannot be
//! used. Pure: tested without an API server; `peers::run` logs, writes status and
//! sends Events from it.
//!
//! The speaker keys its sessions by the peer's address (one session per neighbour
//! address, whatever the port or ASN), so two `BGPPeer`s selecting one node with the
//! same `peerAddress` are one session. The one created first (then by name) keeps
//! it; each later one is a conflict that names it, and its status says so instead of
//! showing the other one's session.

use std::collections::HashMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use ringlb_crds::{BGPPeer, NodeSession, SecretKeyRef};

/// `NodeSession.state` of a `BGPPeer` that lost its session to an earlier one.
pub const STATE_CONFLICT: &str = "Conflict";
/// `NodeSession.state` of a `BGPPeer` whose spec or Secret cannot be used here.
pub const STATE_INVALID: &str = "Invalid";

/// Why a `BGPPeer`'s password cannot be had: three cases a user fixes differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretProblem {
    /// No such Secret.
    NotFound,
    /// The Secret has no such key (or its value is not UTF-8 text).
    NoKey { key: String, keys: Vec<String> },
    /// The Secret could not be read (forbidden, or the API failed) and no earlier
    /// read of it is kept.
    Unreadable { reason: String },
}

impl SecretProblem {
    /// The one-line message for the log, the status and the Event.
    pub fn message(&self, r: &SecretKeyRef) -> String {
        let (ns, name) = (&r.namespace, &r.name);
        match self {
            SecretProblem::NotFound => format!(
                "Secret {ns}/{name} does not exist; \
                 the session is not started without its password"
            ),
            SecretProblem::NoKey { key, keys } => format!(
                "Secret {ns}/{name} has no key {key:?} (it has: {}); \
                 set passwordSecretRef.key or add the key",
                if keys.is_empty() {
                    "no keys".to_string()
                } else {
                    keys.join(", ")
                }
            ),
            SecretProblem::Unreadable { reason } => {
                format!("Secret {ns}/{name} cannot be read: {reason}")
            }
        }
    }

    /// CamelCase reason for the condition and the Event.
    pub fn reason(&self) -> &'static str {
        match self {
            SecretProblem::NotFound => "SecretNotFound",
            SecretProblem::NoKey { .. } => "SecretKeyMissing",
            SecretProblem::Unreadable { .. } => "SecretUnreadable",
        }
    }
}

/// A `BGPPeer` that selects this node but whose session another one holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The later `BGPPeer`, which runs no session here.
    pub peer: String,
    /// The earlier one, which keeps the session.
    pub holder: String,
    pub address: IpAddr,
}

impl Conflict {
    pub fn message(&self) -> String {
        format!(
            "peer address {} is already the session of BGPPeer {:?} (created earlier) on this \
             node; one session per peer address: this BGPPeer runs none here (merge the two or \
             give them disjoint nodeSelectors)",
            self.address, self.holder
        )
    }
}

/// Splits the `BGPPeer`s selecting one node into those that run a session (in their
/// given order) and the later ones of each peer address. Earlier means older
/// `creationTimestamp`, then smaller name. A `peerAddress` that is not an address is
/// left in (its own check reports it).
pub fn resolve_sessions<'a>(peers: &[&'a BGPPeer]) -> (Vec<&'a BGPPeer>, Vec<Conflict>) {
    let created = |p: &BGPPeer| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let name = |p: &BGPPeer| p.metadata.name.clone().unwrap_or_default();
    let mut order: Vec<&BGPPeer> = peers.to_vec();
    order.sort_by_key(|p| (created(p), name(p)));
    let mut holder: HashMap<IpAddr, String> = HashMap::new();
    let mut conflicts = Vec::new();
    for p in order {
        let Ok(addr) = p.spec.peer_address.parse::<IpAddr>() else {
            continue;
        };
        match holder.get(&addr) {
            Some(h) => conflicts.push(Conflict {
                peer: name(p),
                holder: h.clone(),
                address: addr,
            }),
            None => {
                holder.insert(addr, name(p));
            }
        }
    }
    let kept = peers
        .iter()
        .copied()
        .filter(|p| !conflicts.iter().any(|c| c.peer == name(p)))
        .collect();
    (kept, conflicts)
}

/// This node's status entry for a `BGPPeer` that runs no session here.
pub fn problem_entry(node: &str, state: &str, message: String) -> NodeSession {
    NodeSession {
        node: node.to_string(),
        state: state.to_string(),
        advertised: 0,
        families: Vec::new(),
        last_transition: None,
        last_error: Some(message),
    }
}

/// The `Conflict` and `Invalid` conditions of a `BGPPeer`, from every node's entry:
/// True while any node reports that state (the message lists them by node), False
/// otherwise. `reasons` gives the reason of this writer's own problem, if any; a True
/// condition otherwise keeps its previous reason.
pub fn peer_conditions(
    nodes: &[NodeSession],
    reasons: &[(&str, &str)],
    old: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    [
        (STATE_CONFLICT, "Conflict", "SessionConflict", "NoConflict"),
        (STATE_INVALID, "Invalid", "InvalidSpec", "Valid"),
    ]
    .into_iter()
    .map(|(state, type_, default_reason, ok_reason)| {
        let hits: Vec<String> = nodes
            .iter()
            .filter(|n| n.state == state)
            .map(|n| format!("{}: {}", n.node, n.last_error.as_deref().unwrap_or("")))
            .collect();
        let prev = old.iter().find(|c| c.type_ == type_);
        let (status, reason, message) = if hits.is_empty() {
            ("False", ok_reason.to_string(), String::new())
        } else {
            let reason = reasons
                .iter()
                .find(|(t, _)| *t == type_)
                .map(|(_, r)| r.to_string())
                .or_else(|| {
                    prev.filter(|p| p.status == "True")
                        .map(|p| p.reason.clone())
                })
                .unwrap_or_else(|| default_reason.to_string());
            ("True", reason, hits.join("; "))
        };
        Condition {
            type_: type_.to_string(),
            last_transition_time: match prev {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => now.clone(),
            },
            status: status.to_string(),
            reason,
            message,
            observed_generation: None,
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn peer(name: &str, created: &str, addr: &str) -> BGPPeer {
        serde_json::from_value(json!({
            "apiVersion": "ringlb.io/v1alpha1", "kind": "BGPPeer",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"peerAddress": addr, "peerASN": 65000, "myASN": 65001}
        }))
        .unwrap()
    }

    fn names(v: &[&BGPPeer]) -> Vec<String> {
        v.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    }

    #[test]
    fn the_earlier_peer_keeps_the_session_the_later_one_is_a_conflict() {
        let old = peer("z-old", "2026-01-01T00:00:00Z", "10.0.0.1");
        let new = peer("a-new", "2026-01-02T00:00:00Z", "10.0.0.1");
        let other = peer("other", "2026-01-03T00:00:00Z", "10.0.0.2");
        // Given order does not matter; the winners keep the given order.
        let (kept, conflicts) = resolve_sessions(&[&new, &other, &old]);
        assert_eq!(names(&kept), ["other", "z-old"]);
        assert_eq!(
            conflicts,
            [Conflict {
                peer: "a-new".into(),
                holder: "z-old".into(),
                address: "10.0.0.1".parse().unwrap(),
            }]
        );
        assert!(conflicts[0].message().contains("BGPPeer \"z-old\""));
    }

    #[test]
    fn same_creation_time_is_decided_by_name_and_addresses_compare_parsed() {
        let b = peer("b", "2026-01-01T00:00:00Z", "2001:db8::1");
        let a = peer("a", "2026-01-01T00:00:00Z", "2001:0db8::0001");
        let c = peer("c", "2026-01-01T00:00:00Z", "2001:db8::1");
        let bad = peer("bad", "2026-01-01T00:00:00Z", "tor-1");
        let (kept, conflicts) = resolve_sessions(&[&c, &b, &a, &bad]);
        assert_eq!(names(&kept), ["a", "bad"]);
        let lost: Vec<(&str, &str)> = conflicts
            .iter()
            .map(|c| (c.peer.as_str(), c.holder.as_str()))
            .collect();
        assert_eq!(lost, [("b", "a"), ("c", "a")]);
    }

    #[test]
    fn three_secret_problems_say_three_different_things() {
        let r = SecretKeyRef {
            name: "tor-md5".into(),
            namespace: "ringlb".into(),
            key: None,
        };
        let msgs = [
            SecretProblem::NotFound,
            SecretProblem::NoKey {
                key: "password".into(),
                keys: vec!["pw".into()],
            },
            SecretProblem::Unreadable {
                reason: "forbidden".into(),
            },
        ]
        .map(|p| (p.reason(), p.message(&r)));
        assert!(
            msgs[0].1.contains("ringlb/tor-md5 does not exist"),
            "{msgs:?}"
        );
        assert!(
            msgs[1].1.contains("has no key \"password\" (it has: pw)"),
            "{msgs:?}"
        );
        assert!(msgs[2].1.contains("cannot be read: forbidden"), "{msgs:?}");
        assert_eq!(
            msgs.map(|m| m.0),
            ["SecretNotFound", "SecretKeyMissing", "SecretUnreadable"]
        );
    }

    fn entry(node: &str, state: &str, err: Option<&str>) -> NodeSession {
        NodeSession {
            node: node.into(),
            state: state.into(),
            advertised: 0,
            families: Vec::new(),
            last_transition: None,
            last_error: err.map(str::to_string),
        }
    }

    #[test]
    fn conditions_follow_every_nodes_entry() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(200).unwrap());
        let nodes = [
            entry("edge-1", STATE_CONFLICT, Some("held by \"a\"")),
            entry("edge-2", "Established", None),
        ];
        let c = peer_conditions(&nodes, &[], &[], &t0);
        assert_eq!(
            (
                c[0].type_.as_str(),
                c[0].status.as_str(),
                c[0].reason.as_str()
            ),
            ("Conflict", "True", "SessionConflict")
        );
        assert_eq!(c[0].message, "edge-1: held by \"a\"");
        assert_eq!(
            (c[1].type_.as_str(), c[1].status.as_str()),
            ("Invalid", "False")
        );
        // A Secret problem keeps its reason when another node writes.
        let nodes = [entry("edge-1", STATE_INVALID, Some("no Secret"))];
        let c = peer_conditions(&nodes, &[("Invalid", "SecretNotFound")], &c, &t1);
        assert_eq!(
            (c[0].status.as_str(), c[0].last_transition_time.clone()),
            ("False", t1.clone())
        );
        assert_eq!(c[1].reason, "SecretNotFound");
        let again = peer_conditions(&nodes, &[], &c, &t0);
        assert_eq!(again[1].reason, "SecretNotFound");
        assert_eq!(
            again[1].last_transition_time, t1,
            "no change, no transition"
        );
        // Resolved everywhere: False.
        let c = peer_conditions(&[entry("edge-1", "Established", None)], &[], &again, &t1);
        assert!(c.iter().all(|c| c.status == "False"), "{c:?}");
    }
}
