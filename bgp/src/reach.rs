//! Whether a router has a VIP's route: the one definition of "announced" that the
//! health pages, metrics and conditions share. Pure.
//!
//! A VIP is announced when a prefix covering its address was sent in an UPDATE to at
//! least one peer whose session is Established. The Adj-RIB-Out a peer is sent is
//! already filtered by the families the session negotiated and by the peer's export
//! policy (the `BGPAdvertisement`s that select it), so "sent" implies both. When it
//! was not sent, the reason says which of the three is missing.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;

use crate::codec::Afi;

/// What the speaker knows of one peer, for [`reach`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerView {
    pub established: bool,
    /// The address families the session negotiated (empty while it is down).
    pub families: Vec<Afi>,
    /// The prefixes sent to the peer and not withdrawn since.
    pub sent: Arc<BTreeSet<IpNetwork>>,
}

impl PeerView {
    /// An Established peer of both families that was sent every address (for tests
    /// of what the health pages say once a router has a route).
    pub fn everything() -> Self {
        PeerView {
            established: true,
            families: vec![Afi::Ipv4, Afi::Ipv6],
            sent: Arc::new(
                ["0.0.0.0/0", "::/0"]
                    .iter()
                    .filter_map(|n| n.parse().ok())
                    .collect(),
            ),
        }
    }
}

/// Whether, and if not why not, a router has an address's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Sent to at least one Established peer.
    Sent,
    /// No BGP session is Established.
    NoSession,
    /// Sessions are up, but none negotiated the address's family.
    FamilyNotNegotiated(Afi),
    /// A session carries the family, but no peer's export policy (no
    /// `BGPAdvertisement` selecting the peer and the address's pool) lets the route out.
    NotSelected,
}

impl Reach {
    pub fn announced(self) -> bool {
        self == Reach::Sent
    }

    /// CamelCase reason for conditions: `Announced`, `NoSession`,
    /// `FamilyNotNegotiated`, `NoAdvertisement`.
    pub fn reason(self) -> &'static str {
        match self {
            Reach::Sent => "Announced",
            Reach::NoSession => "NoSession",
            Reach::FamilyNotNegotiated(_) => "FamilyNotNegotiated",
            Reach::NotSelected => "NoAdvertisement",
        }
    }

    /// One line for the health page and Events.
    pub fn message(self) -> String {
        match self {
            Reach::Sent => "announced to an established BGP peer".into(),
            Reach::NoSession => "no BGP session established: the route reaches no peer".into(),
            Reach::FamilyNotNegotiated(afi) => format!(
                "no established BGP session negotiated {}: the route reaches no peer",
                afi.name()
            ),
            Reach::NotSelected => "no BGPAdvertisement selects this VIP for an established \
                                   peer: the route was sent to no router"
                .into(),
        }
    }
}

/// Whether `sent` holds a prefix that covers `addr`: the host route by lookup
/// (a VIP's own /32 or /128, the common case), else a scan for a covering
/// prefix. Called per VIP:port for every health report, so the lookup keeps
/// that linear, not quadratic, in the number of routes.
fn sent_covers(sent: &BTreeSet<IpNetwork>, addr: IpAddr) -> bool {
    sent.contains(&IpNetwork::from(addr)) || sent.iter().any(|net| net.contains(addr))
}

/// Whether a router has the route of `addr`, given every peer of the speaker.
pub fn reach(addr: IpAddr, peers: &[PeerView]) -> Reach {
    let up: Vec<&PeerView> = peers.iter().filter(|p| p.established).collect();
    if up.iter().any(|p| sent_covers(&p.sent, addr)) {
        return Reach::Sent;
    }
    if up.is_empty() {
        return Reach::NoSession;
    }
    let afi = if addr.is_ipv4() { Afi::Ipv4 } else { Afi::Ipv6 };
    if !up.iter().any(|p| p.families.contains(&afi)) {
        return Reach::FamilyNotNegotiated(afi);
    }
    Reach::NotSelected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(established: bool, families: &[Afi], sent: &[&str]) -> PeerView {
        PeerView {
            established,
            families: families.to_vec(),
            sent: Arc::new(sent.iter().map(|s| s.parse().unwrap()).collect()),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_host_route_among_many_is_found() {
        let routes: Vec<String> = (0..=255).map(|i| format!("10.9.0.{i}/32")).collect();
        let peers = [view(
            true,
            &[Afi::Ipv4],
            &routes.iter().map(String::as_str).collect::<Vec<_>>(),
        )];
        assert_eq!(reach(ip("10.9.0.77"), &peers), Reach::Sent);
        assert_eq!(reach(ip("10.9.1.77"), &peers), Reach::NotSelected);
    }

    #[test]
    fn sent_to_an_established_peer_is_announced_covering_prefixes_count() {
        let peers = [view(true, &[Afi::Ipv4], &["10.9.1.0/24"])];
        assert_eq!(reach(ip("10.9.1.7"), &peers), Reach::Sent);
        assert!(Reach::Sent.announced());
        // Another address of the family, in no sent prefix: not selected.
        assert_eq!(reach(ip("10.9.2.1"), &peers), Reach::NotSelected);
        assert_eq!(Reach::NotSelected.reason(), "NoAdvertisement");
    }

    #[test]
    fn no_session_and_family_not_negotiated_are_told_apart() {
        assert_eq!(reach(ip("10.9.1.1"), &[]), Reach::NoSession);
        // A down session's stale view does not count.
        let down = [view(false, &[Afi::Ipv4], &["10.9.1.1/32"])];
        assert_eq!(reach(ip("10.9.1.1"), &down), Reach::NoSession);
        let v4_only = [view(true, &[Afi::Ipv4], &["10.9.1.1/32"])];
        let r = reach(ip("2001:db8::1"), &v4_only);
        assert_eq!(r, Reach::FamilyNotNegotiated(Afi::Ipv6));
        assert_eq!(r.reason(), "FamilyNotNegotiated");
        assert!(r.message().contains("negotiated IPv6"), "{}", r.message());
        // One peer of two carries it: announced.
        let both = [
            view(true, &[Afi::Ipv4], &[]),
            view(true, &[Afi::Ipv4, Afi::Ipv6], &["2001:db8::1/128"]),
        ];
        assert_eq!(reach(ip("2001:db8::1"), &both), Reach::Sent);
    }
}
