//! Which notifications can move a next hop, without I/O: `Filter` turns the decoded
//! messages of the subscription socket into `Change`s.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use super::in_use::NextHopsInUse;
use super::rtnl::{
    RTM_DELLINK, RTM_DELNEIGH, RTM_DELROUTE, RTM_NEWLINK, RTM_NEWNEIGH, RTM_NEWROUTE, Reply,
};

/// A notification that can change some backend's next hop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A neighbour gained, lost or changed its usable MAC.
    Neigh {
        ifindex: u32,
        addr: IpAddr,
        mac: Option<[u8; 6]>,
    },
    /// A route was added or removed (`RTM_NEWROUTE` / `RTM_DELROUTE`).
    Route { deleted: bool },
    /// A link was added, removed or changed (address, state).
    Link { ifindex: u32, deleted: bool },
    /// The kernel dropped notifications (ENOBUFS): anything may have changed.
    Overflow,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Neigh {
                ifindex,
                addr,
                mac: Some(m),
            } => write!(
                f,
                "neigh {addr} if{ifindex} -> {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ),
            Change::Neigh { ifindex, addr, .. } => write!(f, "neigh {addr} if{ifindex} unusable"),
            Change::Route { deleted } => {
                f.write_str(if *deleted { "route del" } else { "route new" })
            }
            Change::Link { ifindex, deleted } => {
                write!(
                    f,
                    "link if{ifindex} {}",
                    if *deleted { "del" } else { "changed" }
                )
            }
            Change::Overflow => f.write_str("overflow (events lost)"),
        }
    }
}

/// Turns notifications into the changes that matter:
///
/// - a neighbour: only one that some backend's next hop uses (`NextHopsInUse`, kept
///   by the resolver), and only a change of its usable MAC. Notifications come for
///   every state transition (REACHABLE -> STALE -> DELAY -> ...), mostly with the
///   same MAC, and for every host on the segment that the kernel learns or forgets;
/// - a route: only one that can move a next hop (`RouteMeta::can_move_next_hops`:
///   not a clone, not the local table);
/// - a link: every change (the resolver's link cache must be cleared).
#[derive(Debug, Default)]
pub(crate) struct Filter {
    /// the last usable MAC of every neighbour seen (in use or not, so that one that
    /// comes into use has a known MAC)
    macs: HashMap<(u32, IpAddr), [u8; 6]>,
    in_use: NextHopsInUse,
}

impl Filter {
    pub(crate) fn new(in_use: NextHopsInUse) -> Self {
        Filter {
            macs: HashMap::new(),
            in_use,
        }
    }

    /// The change one decoded notification makes, if any.
    pub(crate) fn observe(&mut self, kind: u16, reply: &Reply) -> Option<Change> {
        match (kind, reply) {
            (RTM_NEWNEIGH | RTM_DELNEIGH, Reply::Neigh(n)) => {
                let addr = n.addr?;
                let key = (n.ifindex, addr);
                let mac = if kind == RTM_DELNEIGH {
                    None
                } else {
                    n.usable_mac()
                };
                let old = match mac {
                    Some(m) => self.macs.insert(key, m),
                    None => self.macs.remove(&key),
                };
                // an unusable entry we never saw usable (INCOMPLETE, FAILED) changes nothing
                let changed = old != mac && !(old.is_none() && mac.is_none());
                (changed && self.in_use.contains(n.ifindex, addr)).then_some(Change::Neigh {
                    ifindex: n.ifindex,
                    addr,
                    mac,
                })
            }
            (RTM_NEWROUTE | RTM_DELROUTE, Reply::Route(_, meta)) => {
                meta.can_move_next_hops().then_some(Change::Route {
                    deleted: kind == RTM_DELROUTE,
                })
            }
            (RTM_NEWLINK | RTM_DELLINK, Reply::Link(l)) => Some(Change::Link {
                ifindex: l.index,
                deleted: kind == RTM_DELLINK,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Link;
    use crate::rtnl::{Neigh, Route, decode, message, neigh_addr, route_get};
    use netlink_packet_route::{
        AddressFamily, RouteNetlinkMessage,
        link::LinkMessage,
        neighbour::{NeighbourAttribute, NeighbourMessage},
        route::{RouteAttribute, RouteFlags, RouteMessage, RouteType},
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Bytes of a kernel message built with the same codec, decoded back.
    fn roundtrip(msg: RouteNetlinkMessage, seq: u32) -> Vec<(u32, u16, Reply)> {
        decode(&message(msg, 0, seq)).unwrap()
    }

    /// A filter whose in-use set holds (ifindex 3, 10.0.0.1), as if a backend's last
    /// resolve had gone through that neighbour.
    fn filter_using_10_0_0_1() -> (Filter, NextHopsInUse) {
        let in_use = NextHopsInUse::default();
        in_use.record(
            ip("10.2.0.5"),
            Some((3, ip("10.0.0.1"))),
            std::time::Instant::now(),
        );
        (Filter::new(in_use.clone()), in_use)
    }

    fn neigh(ifindex: u32, addr: &str, state: u16, mac: Option<[u8; 6]>) -> Reply {
        Reply::Neigh(Neigh {
            ifindex,
            addr: Some(ip(addr)),
            state,
            lladdr: mac,
        })
    }

    #[test]
    fn filter_reports_only_mac_changes() {
        let (mut f, _) = filter_using_10_0_0_1();
        let n = |state, mac| neigh(3, "10.0.0.1", state, mac);
        let a = Some([2, 0, 0, 0, 0, 1]);
        let b = Some([2, 0, 0, 0, 0, 2]);
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &n(0x01, None)),
            None,
            "INCOMPLETE, never usable"
        );
        assert!(f.observe(RTM_NEWNEIGH, &n(0x02, a)).is_some(), "resolved");
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &n(0x04, a)),
            None,
            "REACHABLE -> STALE, same MAC"
        );
        assert_eq!(f.observe(RTM_NEWNEIGH, &n(0x08, a)), None, "DELAY");
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &n(0x02, b)),
            Some(Change::Neigh {
                ifindex: 3,
                addr: ip("10.0.0.1"),
                mac: b
            })
        );
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &n(0x20, b)),
            Some(Change::Neigh {
                ifindex: 3,
                addr: ip("10.0.0.1"),
                mac: None
            }),
            "FAILED"
        );
        assert!(f.observe(RTM_NEWNEIGH, &n(0x02, b)).is_some());
        assert!(f.observe(RTM_DELNEIGH, &n(0x02, b)).is_some(), "deleted");
        assert_eq!(
            f.observe(
                RTM_NEWLINK,
                &Reply::Link(Link {
                    index: 4,
                    name: "x".into(),
                    mac: None,
                    kind: None,
                    parent: None,
                    link_netnsid: None,
                    vlan: None
                })
            ),
            Some(Change::Link {
                ifindex: 4,
                deleted: false
            })
        );
        assert_eq!(f.observe(RTM_NEWNEIGH, &Reply::Other), None);
        assert_eq!(
            Change::Neigh {
                ifindex: 3,
                addr: ip("10.0.0.1"),
                mac: a
            }
            .to_string(),
            "neigh 10.0.0.1 if3 -> 02:00:00:00:00:01"
        );
    }

    #[test]
    fn filter_ignores_neighbours_no_next_hop_uses() {
        let (mut f, in_use) = filter_using_10_0_0_1();
        let a = Some([2, 0, 0, 0, 0, 1]);
        let b = Some([2, 0, 0, 0, 0, 2]);
        // another host on the segment: learned, changed, aged out, deleted
        for (kind, state, mac) in [
            (RTM_NEWNEIGH, 0x02, a),
            (RTM_NEWNEIGH, 0x02, b),
            (RTM_NEWNEIGH, 0x20, None),
            (RTM_NEWNEIGH, 0x02, a),
            (RTM_DELNEIGH, 0x02, a),
        ] {
            let r = neigh(3, "10.0.0.77", state, mac);
            assert_eq!(f.observe(kind, &r), None, "{r:?}");
        }
        // the used address, but on another interface
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &neigh(4, "10.0.0.1", 0x02, a)),
            None
        );
        // a backend comes to use 10.0.0.77 (e.g. its resolve started the resolution):
        // the neighbour resolving is a change now
        in_use.record(
            ip("10.2.0.6"),
            Some((3, ip("10.0.0.77"))),
            std::time::Instant::now(),
        );
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &neigh(3, "10.0.0.77", 0x02, b)),
            Some(Change::Neigh {
                ifindex: 3,
                addr: ip("10.0.0.77"),
                mac: b
            })
        );
        // and it stops mattering once no backend uses it
        in_use.record(ip("10.2.0.6"), None, std::time::Instant::now());
        assert_eq!(
            f.observe(RTM_NEWNEIGH, &neigh(3, "10.0.0.77", 0x02, a)),
            None
        );
    }

    /// A route notification as the kernel sends it, through the decoder.
    fn route_note(kind: u16, table: u8, rta_table: Option<u32>, cloned: bool) -> (u16, Reply) {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.kind = RouteType::Unicast;
        m.header.table = table;
        if cloned {
            m.header.flags = RouteFlags::Cloned;
        }
        if let Some(t) = rta_table {
            m.attributes.push(RouteAttribute::Table(t));
        }
        m.attributes.push(RouteAttribute::Oif(3));
        let msg = if kind == RTM_DELROUTE {
            RouteNetlinkMessage::DelRoute(m)
        } else {
            RouteNetlinkMessage::NewRoute(m)
        };
        let mut d = roundtrip(msg, 0);
        let (_, k, r) = d.remove(0);
        assert_eq!(k, kind);
        (k, r)
    }

    #[test]
    fn filter_reports_routes_of_routing_tables_only() {
        let mut f = Filter::default();
        let route = |deleted| Some(Change::Route { deleted });
        for (kind, table, rta, cloned, want, what) in [
            (RTM_NEWROUTE, 254, Some(254), false, route(false), "main"),
            (
                RTM_DELROUTE,
                254,
                Some(254),
                false,
                route(true),
                "main, deleted",
            ),
            (
                RTM_NEWROUTE,
                254,
                None,
                false,
                route(false),
                "main, no RTA_TABLE",
            ),
            (
                RTM_NEWROUTE,
                252,
                Some(1000),
                false,
                route(false),
                "policy table 1000",
            ),
            (RTM_NEWROUTE, 255, Some(255), false, None, "local table"),
            (RTM_DELROUTE, 255, None, false, None, "local table, deleted"),
            (RTM_NEWROUTE, 254, Some(254), true, None, "cloned (cached)"),
        ] {
            let (k, r) = route_note(kind, table, rta, cloned);
            assert_eq!(f.observe(k, &r), want, "{what}");
        }
    }

    #[test]
    fn deletions_decode_like_additions() {
        let (k, r) = route_note(RTM_DELROUTE, 254, None, false);
        assert_eq!(k, RTM_DELROUTE);
        assert!(
            matches!(r, Reply::Route(Ok(Route { oif: 3, .. }), _)),
            "{r:?}"
        );
        let mut n = NeighbourMessage::default();
        n.header.family = AddressFamily::Inet;
        n.header.ifindex = 3;
        n.attributes = vec![NeighbourAttribute::Destination(neigh_addr(ip("10.0.0.1")))];
        let d = roundtrip(RouteNetlinkMessage::DelNeighbour(n), 0);
        assert_eq!(d[0].1, RTM_DELNEIGH);
        assert!(matches!(&d[0].2, Reply::Neigh(x) if x.addr == Some(ip("10.0.0.1"))));
        let mut l = LinkMessage::default();
        l.header.index = 9;
        let d = roundtrip(RouteNetlinkMessage::DelLink(l), 0);
        assert_eq!(d[0].1, RTM_DELLINK);
        let mut f = Filter::default();
        assert_eq!(
            f.observe(d[0].1, &d[0].2),
            Some(Change::Link {
                ifindex: 9,
                deleted: true
            })
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever arrives on the socket, decoding and filtering return (no panic,
        /// no endless loop), and a valid message followed by garbage still decodes.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let mut f = Filter::default();
            if let Ok(replies) = decode(&bytes) {
                for (_, kind, r) in &replies {
                    let _ = f.observe(*kind, r);
                }
            }
            let mut b = route_get(ip("10.2.0.5"), 1);
            b.extend_from_slice(&bytes);
            let _ = decode(&b);
        }

        /// Valid headers with random lengths and types over random payloads.
        #[test]
        fn decode_never_panics_on_plausible_headers(
            len in 0u32..400, kind in 0u16..40, flags in proptest::num::u16::ANY,
            payload in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
        ) {
            let mut b = Vec::new();
            b.extend_from_slice(&len.to_ne_bytes());
            b.extend_from_slice(&kind.to_ne_bytes());
            b.extend_from_slice(&flags.to_ne_bytes());
            b.extend_from_slice(&[0; 8]);
            b.extend_from_slice(&payload);
            let mut f = Filter::default();
            if let Ok(replies) = decode(&b) {
                for (_, kind, r) in &replies {
                    let _ = f.observe(*kind, r);
                }
            }
        }
    }
}
