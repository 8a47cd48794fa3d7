//! Whether a router is offered a VIP's route, from the BGP objects: the
//! `ringlb.io/Announced` Service condition and the IPPool `Advertised` condition.
//! Pure: [`Routing`] is built from the IPPools, `BGPAdvertisement`s and `BGPPeer`s
//! (with the sessions the edges write into each peer's `status.nodes`) and asked
//! about addresses and pools.
//!
//! The edges export a VIP to a peer when a `BGPAdvertisement` selects both the peer
//! (`peerSelector`) and a pool whose addresses cover the VIP (`ipPoolSelector`; absent
//! selects every pool), over a session that negotiated the VIP's family. This module
//! applies the same rules cluster-wide: a VIP is announced when such a peer is
//! Established with its family on at least one edge. Which edges serve it (ready
//! backends, a withdrawn route) is the `ringlb.io/BackendsReady` condition's and each
//! edge's health page's business.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kube::ResourceExt;
use ringlb_crds::labels::{Labels, selects};
use ringlb_crds::{BGPAdvertisement, BGPPeer, Block, IPPool};

/// The Service condition type.
pub const ANNOUNCED_CONDITION_TYPE: &str = ringlb_crds::service::CONDITION_ANNOUNCED;
/// The IPPool condition type.
pub const ADVERTISED_CONDITION_TYPE: &str = "Advertised";

/// One pool as the advertisements see it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PoolFacts {
    name: String,
    labels: Labels,
    blocks: Vec<Block>,
}

/// One `BGPAdvertisement`: the pools and peers it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AdvertFacts {
    name: String,
    /// The names of the pools it selects; `None` selects every address.
    pools: Option<BTreeSet<String>>,
    /// The names of the peers it selects.
    peers: BTreeSet<String>,
}

/// One edge's session with one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    node: String,
    established: bool,
    /// The negotiated families (`IPv4`, `IPv6`); empty when the edge did not say
    /// (an edge from before the field), which counts as both.
    families: Vec<String>,
}

/// The routing facts the conditions are computed from. Equal values give equal
/// conditions, so a change of anything else (a peer's advertised count, a
/// timestamp) is no reason to look at every Service again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    pools: Vec<PoolFacts>,
    adverts: Vec<AdvertFacts>,
    /// Each peer's name with its sessions, by name.
    peers: Vec<(String, Vec<Session>)>,
}

/// Whether, and if not why not, a router is offered an address's route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Peers Established with the address's family, and on how many edges.
    Announced { peers: Vec<String>, edges: usize },
    /// No `BGPAdvertisement` selects a pool covering the address.
    NoAdvertisement,
    /// The advertisements that select it select no `BGPPeer`.
    NoPeer { adverts: Vec<String> },
    /// No selected peer is Established on any edge.
    NoSession { peers: Vec<String> },
    /// Selected peers are Established, none with the address's family.
    FamilyNotNegotiated {
        peers: Vec<String>,
        family: &'static str,
    },
}

impl Reach {
    pub fn reason(&self) -> &'static str {
        match self {
            Reach::Announced { .. } => "Announced",
            Reach::NoAdvertisement => "NoAdvertisement",
            Reach::NoPeer { .. } => "NoPeer",
            Reach::NoSession { .. } => "NoSession",
            Reach::FamilyNotNegotiated { .. } => "FamilyNotNegotiated",
        }
    }

    /// What is true of `ip`, as one phrase.
    fn describe(&self, ip: &IpAddr) -> String {
        match self {
            Reach::Announced { peers, edges } => {
                format!("{ip} to BGPPeer {} from {edges} edge(s)", peers.join(", "))
            }
            Reach::NoAdvertisement => {
                format!("{ip}: no BGPAdvertisement selects a pool covering it")
            }
            Reach::NoPeer { adverts } => format!(
                "{ip}: BGPAdvertisement {} selects no BGPPeer",
                adverts.join(", ")
            ),
            Reach::NoSession { peers } => format!(
                "{ip}: no session with BGPPeer {} is Established on any edge",
                peers.join(", ")
            ),
            Reach::FamilyNotNegotiated { peers, family } => format!(
                "{ip}: the Established sessions with BGPPeer {} did not negotiate {family}",
                peers.join(", ")
            ),
        }
    }
}

/// What the Announced condition should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncedState {
    pub announced: bool,
    pub reason: &'static str,
    pub message: String,
}

fn family_name(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn covers(b: &Block, ip: &IpAddr) -> bool {
    b.start.is_ipv4() == ip.is_ipv4() && b.start <= *ip && *ip <= b.end
}

impl Routing {
    /// The facts of these objects. A selector that does not parse selects nothing
    /// here (the edges report it on the object); a pool whose spec does not parse
    /// covers no address.
    pub fn new(pools: &[&IPPool], adverts: &[&BGPAdvertisement], peers: &[&BGPPeer]) -> Self {
        let mut pool_facts: Vec<PoolFacts> = pools
            .iter()
            .map(|p| PoolFacts {
                name: p.name_any(),
                labels: p.labels().clone(),
                blocks: p.spec.blocks().unwrap_or_default(),
            })
            .collect();
        pool_facts.sort_by(|a, b| a.name.cmp(&b.name));
        let mut peer_facts: Vec<(String, Labels, Vec<Session>)> = peers
            .iter()
            .map(|p| {
                let sessions = p
                    .status
                    .iter()
                    .flat_map(|s| &s.nodes)
                    .map(|n| Session {
                        node: n.node.clone(),
                        established: n.state == "Established",
                        families: n.families.clone(),
                    })
                    .collect();
                (p.name_any(), p.labels().clone(), sessions)
            })
            .collect();
        peer_facts.sort_by(|a, b| a.0.cmp(&b.0));
        let mut advert_facts: Vec<AdvertFacts> = adverts
            .iter()
            .map(|a| AdvertFacts {
                name: a.name_any(),
                pools: a.spec.ip_pool_selector.as_ref().map(|sel| {
                    pool_facts
                        .iter()
                        .filter(|p| {
                            selects("spec.ipPoolSelector", Some(sel), &p.labels).unwrap_or(false)
                        })
                        .map(|p| p.name.clone())
                        .collect()
                }),
                peers: peer_facts
                    .iter()
                    .filter(|(_, l, _)| {
                        selects("spec.peerSelector", a.spec.peer_selector.as_ref(), l)
                            .unwrap_or(false)
                    })
                    .map(|(n, _, _)| n.clone())
                    .collect(),
            })
            .collect();
        advert_facts.sort_by(|a, b| a.name.cmp(&b.name));
        Routing {
            pools: pool_facts,
            adverts: advert_facts,
            peers: peer_facts.into_iter().map(|(n, _, s)| (n, s)).collect(),
        }
    }

    /// The Established sessions with the peer `name`.
    fn established<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Session> {
        self.peers
            .iter()
            .filter(move |(n, _)| n == name)
            .flat_map(|(_, s)| s)
            .filter(|s| s.established)
    }

    fn pool_covers(&self, pool: &str, ip: &IpAddr) -> bool {
        self.pools
            .iter()
            .any(|p| p.name == pool && p.blocks.iter().any(|b| covers(b, ip)))
    }

    /// The advertisements that select `ip`.
    fn adverts_of(&self, ip: &IpAddr) -> Vec<&AdvertFacts> {
        self.adverts
            .iter()
            .filter(|a| match &a.pools {
                None => true,
                Some(names) => names.iter().any(|n| self.pool_covers(n, ip)),
            })
            .collect()
    }

    /// Whether, and if not why not, a router is offered `ip`'s route.
    pub fn reach(&self, ip: &IpAddr) -> Reach {
        let adverts = self.adverts_of(ip);
        if adverts.is_empty() {
            return Reach::NoAdvertisement;
        }
        let peers: BTreeSet<&String> = adverts.iter().flat_map(|a| &a.peers).collect();
        if peers.is_empty() {
            return Reach::NoPeer {
                adverts: adverts.iter().map(|a| a.name.clone()).collect(),
            };
        }
        let family = family_name(ip);
        let carries = |s: &Session| s.families.is_empty() || s.families.iter().any(|f| f == family);
        let mut up = Vec::new();
        let mut edges = BTreeSet::new();
        for p in &peers {
            let mut any = false;
            for s in self.established(p).filter(|s| carries(s)) {
                edges.insert(s.node.clone());
                any = true;
            }
            if any {
                up.push((*p).clone());
            }
        }
        let names = || peers.iter().map(|p| (*p).clone()).collect();
        if !up.is_empty() {
            return Reach::Announced {
                peers: up,
                edges: edges.len(),
            };
        }
        if peers.iter().any(|p| self.established(p).next().is_some()) {
            Reach::FamilyNotNegotiated {
                peers: names(),
                family,
            }
        } else {
            Reach::NoSession { peers: names() }
        }
    }

    /// The Announced condition of a Service with these VIPs; `None` without a VIP.
    /// True when every VIP is announced; otherwise False with the first VIP's reason
    /// that is not, and a message naming each such VIP.
    pub fn service(&self, vips: &[IpAddr]) -> Option<AnnouncedState> {
        if vips.is_empty() {
            return None;
        }
        let reaches: Vec<(IpAddr, Reach)> = vips.iter().map(|ip| (*ip, self.reach(ip))).collect();
        let missing: Vec<&(IpAddr, Reach)> = reaches
            .iter()
            .filter(|(_, r)| !matches!(r, Reach::Announced { .. }))
            .collect();
        let Some((_, first)) = missing.first() else {
            let parts: Vec<String> = reaches.iter().map(|(ip, r)| r.describe(ip)).collect();
            return Some(AnnouncedState {
                announced: true,
                reason: "Announced",
                message: format!("offered {}", parts.join("; ")),
            });
        };
        let parts: Vec<String> = missing.iter().map(|(ip, r)| r.describe(ip)).collect();
        Some(AnnouncedState {
            announced: false,
            reason: first.reason(),
            message: format!("not announced: {}", parts.join("; ")),
        })
    }

    /// The IPPool's Advertised condition: (true, reason, message) when some
    /// `BGPAdvertisement` selects it and a `BGPPeer`.
    pub fn pool(&self, pool: &str) -> (bool, &'static str, String) {
        let selecting: Vec<&AdvertFacts> = self
            .adverts
            .iter()
            .filter(|a| a.pools.as_ref().is_none_or(|p| p.contains(pool)))
            .collect();
        if selecting.is_empty() {
            return (
                false,
                "NoAdvertisement",
                "no BGPAdvertisement selects this pool: its addresses are handed out \
                 but sent to no router"
                    .into(),
            );
        }
        let names = |v: &[&AdvertFacts]| {
            v.iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let with_peer: Vec<&AdvertFacts> = selecting
            .iter()
            .copied()
            .filter(|a| !a.peers.is_empty())
            .collect();
        if with_peer.is_empty() {
            return (
                false,
                "NoPeer",
                format!(
                    "BGPAdvertisement {} selects this pool and no BGPPeer",
                    names(&selecting)
                ),
            );
        }
        (
            true,
            "Advertised",
            format!("selected by BGPAdvertisement {}", names(&with_peer)),
        )
    }
}

#[cfg(test)]
mod tests;
