//! The rtnetlink messages of next-hop resolution, without I/O: the requests as bytes
//! (`route get`, `link get`, `neigh get`, `neigh use`) and what the kernel's answers and
//! notifications say. Which notifications matter is `filter.rs`; the socket side is in
//! `socket.rs`.

use std::net::IpAddr;

use super::link::{Link, link_of};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::LinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage},
    route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteType, RouteVia},
};

/// Neighbour states whose link-layer address can be used (`NUD_VALID` in the kernel:
/// PERMANENT | NOARP | REACHABLE | PROBE | STALE | DELAY).
const NUD_VALID: u16 = 0x80 | 0x40 | 0x02 | 0x10 | 0x04 | 0x08;
/// A neighbour whose MAC still holds but that the kernel has not confirmed lately.
pub(crate) const NUD_STALE: u16 = 0x04;
/// A neighbour the kernel is resolving (solicitations sent, no answer yet).
pub(crate) const NUD_INCOMPLETE: u16 = 0x01;

/// Where the route to a backend leaves: the output interface, and the gateway unless
/// the backend is on-link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub oif: u32,
    pub gateway: Option<IpAddr>,
}

impl Route {
    /// The address whose MAC the packet goes to: the gateway, or the backend itself.
    pub fn next_hop(&self, dst: IpAddr) -> IpAddr {
        self.gateway.unwrap_or(dst)
    }
}

/// One neighbour table entry as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neigh {
    pub ifindex: u32,
    pub addr: Option<IpAddr>,
    /// `NUD_*` bits.
    pub state: u16,
    pub lladdr: Option<[u8; 6]>,
}

impl Neigh {
    /// The MAC, when the entry is in a state whose address may be used.
    pub fn usable_mac(&self) -> Option<[u8; 6]> {
        if self.state & NUD_VALID != 0 {
            self.lladdr
        } else {
            None
        }
    }
}

/// Where a route message's route lives: its table, and whether it is a cached
/// (`RTM_F_CLONED`) route rather than one of the routing table's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RouteMeta {
    /// RTA_TABLE, or the header's 8-bit table when the attribute is absent
    pub table: u32,
    pub cloned: bool,
}

/// The kernel's local table: the host's own addresses (local, broadcast, anycast).
pub(crate) const RT_TABLE_LOCAL: u32 = 255;

impl RouteMeta {
    /// Can a change of this route move a next hop? Not a cached clone (PMTU or
    /// redirect exceptions, `ip route get` answers), and not a local-table route (the
    /// edge's own addresses, never a unicast path to a pod). Every other table
    /// counts: the resolver's `RTM_GETROUTE` follows the policy rules, which may send
    /// it to any table.
    pub(crate) fn can_move_next_hops(&self) -> bool {
        !self.cloned && self.table != RT_TABLE_LOCAL
    }
}

/// One decoded message from the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Route(Result<Route, String>, RouteMeta),
    Link(Link),
    Neigh(Neigh),
    /// NLMSG_ERROR: 0 is an ACK, otherwise a negative errno.
    Error(i32),
    /// Anything else (NLMSG_DONE, other message types).
    Other,
}

pub(super) fn message(msg: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    m.finalize();
    let mut buf = vec![0; m.buffer_len()];
    m.serialize(&mut buf);
    buf
}

fn family(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn route_addr(addr: IpAddr) -> RouteAddress {
    match addr {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

pub(super) fn neigh_addr(addr: IpAddr) -> NeighbourAddress {
    match addr {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

/// RTM_GETROUTE for one address (what `ip route get ADDR` sends): the kernel answers
/// with the route it would use, reduced to the chosen path.
pub(crate) fn route_get(addr: IpAddr, seq: u32) -> Vec<u8> {
    let mut m = RouteMessage::default();
    m.header.address_family = family(addr);
    m.header.destination_prefix_length = if addr.is_ipv4() { 32 } else { 128 };
    m.attributes
        .push(RouteAttribute::Destination(route_addr(addr)));
    message(RouteNetlinkMessage::GetRoute(m), NLM_F_REQUEST, seq)
}

/// RTM_GETLINK for one interface index.
pub(crate) fn link_get(ifindex: u32, seq: u32) -> Vec<u8> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    message(RouteNetlinkMessage::GetLink(m), NLM_F_REQUEST, seq)
}

/// RTM_GETNEIGH for one entry (kernel >= 5.0; the kernel answers ENOENT if absent).
pub(crate) fn neigh_get(ifindex: u32, addr: IpAddr, seq: u32) -> Vec<u8> {
    let mut m = NeighbourMessage::default();
    m.header.family = family(addr);
    m.header.ifindex = ifindex;
    m.attributes
        .push(NeighbourAttribute::Destination(neigh_addr(addr)));
    message(RouteNetlinkMessage::GetNeighbour(m), NLM_F_REQUEST, seq)
}

/// RTM_NEWNEIGH with NTF_USE and NLM_F_CREATE (`ip neigh replace ADDR dev DEV use`):
/// the kernel creates the entry if it is missing and runs `neigh_event_send` on it, as
/// if a packet were waiting: NONE/FAILED -> INCOMPLETE with a solicitation sent at
/// once, STALE -> DELAY (then a unicast probe). No state or MAC is written.
pub(crate) fn neigh_use(ifindex: u32, addr: IpAddr, seq: u32) -> Vec<u8> {
    let mut m = NeighbourMessage::default();
    m.header.family = family(addr);
    m.header.ifindex = ifindex;
    m.header.flags = NeighbourFlags::Use;
    m.attributes
        .push(NeighbourAttribute::Destination(neigh_addr(addr)));
    message(
        RouteNetlinkMessage::NewNeighbour(m),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        seq,
    )
}

fn mac(bytes: &[u8]) -> Option<[u8; 6]> {
    bytes.try_into().ok()
}

fn ip_of_route(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(a) => Some((*a).into()),
        RouteAddress::Inet6(a) => Some((*a).into()),
        _ => None,
    }
}

/// What a route answer means for the next hop: its output interface and gateway
/// (RTA_GATEWAY, or RTA_VIA for an IPv4 route over an IPv6 gateway). A multipath
/// answer uses its first path. Local, blackhole, unreachable and other non-unicast
/// routes are errors: nothing can be encapsulated toward them.
pub(crate) fn route_of(m: &RouteMessage) -> Result<Route, String> {
    if m.header.kind != RouteType::Unicast {
        return Err(format!("route is {:?}, not unicast", m.header.kind));
    }
    let mut oif = None;
    let mut gateway = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(g) => gateway = ip_of_route(g),
            RouteAttribute::Via(RouteVia::Inet(g)) => gateway = Some((*g).into()),
            RouteAttribute::Via(RouteVia::Inet6(g)) => gateway = Some((*g).into()),
            RouteAttribute::MultiPath(paths) if oif.is_none() => {
                if let Some(p) = paths.first() {
                    oif = Some(p.interface_index);
                    for pa in &p.attributes {
                        match pa {
                            RouteAttribute::Gateway(g) => gateway = ip_of_route(g),
                            RouteAttribute::Via(RouteVia::Inet(g)) => gateway = Some((*g).into()),
                            RouteAttribute::Via(RouteVia::Inet6(g)) => gateway = Some((*g).into()),
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }
    match oif {
        Some(oif) if oif != 0 => Ok(Route { oif, gateway }),
        _ => Err("route has no output interface".into()),
    }
}

/// The table and clone flag of a route message.
pub(crate) fn route_meta(m: &RouteMessage) -> RouteMeta {
    let table = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(m.header.table.into());
    RouteMeta {
        table,
        cloned: m.header.flags.contains(RouteFlags::Cloned),
    }
}

/// Fields of a neighbour message.
pub(crate) fn neigh_of(m: &NeighbourMessage) -> Neigh {
    let mut n = Neigh {
        ifindex: m.header.ifindex,
        addr: None,
        state: m.header.state.into(),
        lladdr: None,
    };
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                n.addr = Some((*a).into())
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                n.addr = Some((*a).into())
            }
            NeighbourAttribute::LinkLayerAddress(l) => n.lladdr = mac(l),
            _ => {}
        }
    }
    n
}

/// Splits a datagram into its netlink messages and decodes each: (sequence, type, reply).
/// A message that does not decode ends the datagram with an error.
pub(crate) fn decode(buf: &[u8]) -> Result<Vec<(u32, u16, Reply)>, String> {
    let mut out = Vec::new();
    let mut rest = buf;
    while rest.len() >= 16 {
        let nb = NetlinkBuffer::new_checked(rest).map_err(|e| e.to_string())?;
        let len = nb.length() as usize;
        let (seq, kind) = (nb.sequence_number(), nb.message_type());
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len])
            .map_err(|e| format!("netlink message type {kind}: {e}"))?;
        let reply = match msg.payload {
            NetlinkPayload::Error(e) => Error(e.raw_code()),
            // the deletions decode too: the message type tells them apart
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r),
            ) => Reply::Route(route_of(&r), route_meta(&r)),
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewLink(l) | RouteNetlinkMessage::DelLink(l),
            ) => Reply::Link(link_of(&l)),
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewNeighbour(n) | RouteNetlinkMessage::DelNeighbour(n),
            ) => Reply::Neigh(neigh_of(&n)),
            _ => Reply::Other,
        };
        out.push((seq, kind, reply));
        let aligned = (len + 3) & !3;
        rest = rest.get(aligned..).unwrap_or(&[]);
    }
    Ok(out)
}

use Reply::Error;

/// RTM_* message types of the notifications.
pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_DELLINK: u16 = 17;
pub(crate) const RTM_NEWROUTE: u16 = 24;
pub(crate) const RTM_DELROUTE: u16 = 25;
pub(crate) const RTM_NEWNEIGH: u16 = 28;
pub(crate) const RTM_DELNEIGH: u16 = 29;

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::LinkAttribute;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn route_get_request_bytes() {
        // nlmsghdr(len 36, RTM_GETROUTE=26, NLM_F_REQUEST, seq 7, port 0),
        // rtmsg(AF_INET, dst_len 32, ...), RTA_DST(1) 10.2.0.5
        let b = route_get(ip("10.2.0.5"), 7);
        assert_eq!(
            b,
            [
                36, 0, 0, 0, 26, 0, 1, 0, 7, 0, 0, 0, 0, 0, 0, 0, //
                2, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
                8, 0, 1, 0, 10, 2, 0, 5
            ]
        );
        let b = route_get(ip("fd00::5"), 1);
        assert_eq!(b.len(), 16 + 12 + 4 + 16);
        assert_eq!((b[16], b[17]), (10, 128)); // AF_INET6, /128
    }

    #[test]
    fn neigh_requests_bytes() {
        // RTM_GETNEIGH=30, ndmsg(AF_INET, ifindex 3, state 0, flags 0, type 0), NDA_DST(1)
        let b = neigh_get(3, ip("10.0.0.1"), 9);
        assert_eq!(
            b,
            [
                36, 0, 0, 0, 30, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0, //
                2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, //
                8, 0, 1, 0, 10, 0, 0, 1
            ]
        );
        // RTM_NEWNEIGH=28, REQUEST|ACK|CREATE = 0x405, NTF_USE = 1
        let b = neigh_use(3, ip("10.0.0.1"), 9);
        assert_eq!(&b[4..8], &[28, 0, 0x05, 0x04]);
        assert_eq!(b[16 + 10], 1, "ndm_flags = NTF_USE");
        assert_eq!(&b[16 + 8..16 + 10], &[0, 0], "no state written");
        // RTM_GETLINK=18, ifinfomsg index 4
        let b = link_get(4, 2);
        assert_eq!(&b[4..6], &[18, 0]);
        assert_eq!(&b[16 + 4..16 + 8], &[4, 0, 0, 0]);
    }

    /// Bytes of a kernel answer built with the same codec, decoded back.
    fn roundtrip(msg: RouteNetlinkMessage, seq: u32) -> Vec<(u32, u16, Reply)> {
        decode(&message(msg, 0, seq)).unwrap()
    }

    fn route_msg(kind: RouteType, attrs: Vec<RouteAttribute>) -> RouteNetlinkMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.kind = kind;
        m.attributes = attrs;
        RouteNetlinkMessage::NewRoute(m)
    }

    #[test]
    fn route_answers_gateway_onlink_and_errors() {
        let gw = route_msg(
            RouteType::Unicast,
            vec![
                RouteAttribute::Destination(route_addr(ip("10.2.0.5"))),
                RouteAttribute::Gateway(route_addr(ip("10.0.0.1"))),
                RouteAttribute::Oif(3),
            ],
        );
        let r = roundtrip(gw, 5);
        assert_eq!(r[0].0, 5);
        assert_eq!(r[0].1, RTM_NEWROUTE);
        let Reply::Route(Ok(route), _) = r[0].2 else {
            panic!("{r:?}")
        };
        assert_eq!(
            route,
            Route {
                oif: 3,
                gateway: Some(ip("10.0.0.1"))
            }
        );
        assert_eq!(route.next_hop(ip("10.2.0.5")), ip("10.0.0.1"));

        let onlink = route_msg(RouteType::Unicast, vec![RouteAttribute::Oif(4)]);
        let Reply::Route(Ok(route), _) = roundtrip(onlink, 1)[0].2 else {
            panic!()
        };
        assert_eq!(route.gateway, None);
        assert_eq!(route.next_hop(ip("10.2.0.5")), ip("10.2.0.5"));

        // IPv4 over an IPv6 gateway (RTA_VIA)
        let via = route_msg(
            RouteType::Unicast,
            vec![
                RouteAttribute::Oif(2),
                RouteAttribute::Via(RouteVia::Inet6("fe80::1".parse().unwrap())),
            ],
        );
        let Reply::Route(Ok(route), _) = roundtrip(via, 1)[0].2 else {
            panic!()
        };
        assert_eq!(route.gateway, Some(ip("fe80::1")));

        let local = route_msg(RouteType::Local, vec![RouteAttribute::Oif(1)]);
        assert!(matches!(roundtrip(local, 1)[0].2, Reply::Route(Err(_), _)));
        let no_oif = route_msg(RouteType::Unicast, vec![]);
        assert!(matches!(roundtrip(no_oif, 1)[0].2, Reply::Route(Err(_), _)));
    }

    #[test]
    fn neighbour_states_and_macs() {
        let mut n = NeighbourMessage::default();
        n.header.family = AddressFamily::Inet;
        n.header.ifindex = 3;
        n.header.state = netlink_packet_route::neighbour::NeighbourState::Stale;
        n.attributes = vec![
            NeighbourAttribute::Destination(neigh_addr(ip("10.0.0.1"))),
            NeighbourAttribute::LinkLayerAddress(vec![2, 0, 0, 0, 0, 1]),
        ];
        let r = roundtrip(RouteNetlinkMessage::NewNeighbour(n.clone()), 3);
        let Reply::Neigh(neigh) = r[0].2 else {
            panic!()
        };
        assert_eq!(neigh.addr, Some(ip("10.0.0.1")));
        assert_eq!(neigh.state, NUD_STALE);
        assert_eq!(neigh.usable_mac(), Some([2, 0, 0, 0, 0, 1]));
        for (state, usable) in [
            (0x01, false),
            (0x20, false),
            (0x00, false),
            (0x02, true),
            (0x80, true),
            (0x10, true),
        ] {
            let x = Neigh { state, ..neigh };
            assert_eq!(x.usable_mac().is_some(), usable, "state {state:#x}");
        }
        // a short link-layer address (not Ethernet) is no MAC
        n.attributes[1] = NeighbourAttribute::LinkLayerAddress(vec![1, 2, 3, 4]);
        let Reply::Neigh(neigh) = roundtrip(RouteNetlinkMessage::NewNeighbour(n), 3)[0].2 else {
            panic!()
        };
        assert_eq!(neigh.lladdr, None);
    }

    #[test]
    fn errors_acks_several_messages_and_garbage() {
        // NLMSG_ERROR with -ENOENT (-2) echoing a 16-byte header, then an ACK
        let mut b = vec![36, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&(-2i32).to_ne_bytes());
        b.extend_from_slice(&[0; 16]);
        let mut ack = b.clone();
        ack[8] = 5;
        ack[16..20].copy_from_slice(&0i32.to_ne_bytes());
        b.extend_from_slice(&ack);
        let r = decode(&b).unwrap();
        assert_eq!(r, vec![(4, 2, Reply::Error(-2)), (5, 2, Reply::Error(0))]);
        assert!(decode(&[200, 0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert_eq!(decode(&[]).unwrap(), vec![]);
    }

    #[test]
    fn link_answer_mac() {
        let mut l = LinkMessage::default();
        l.header.index = 7;
        l.attributes
            .push(LinkAttribute::Address(vec![2, 0, 0x0a, 0, 0, 0x0b]));
        let r = roundtrip(RouteNetlinkMessage::NewLink(l.clone()), 1);
        let Reply::Link(link) = &r[0].2 else {
            panic!("{r:?}")
        };
        assert_eq!(
            (link.index, link.mac, link.kind.as_deref()),
            (7, Some([2, 0, 0x0a, 0, 0, 0x0b]), None)
        );
        l.attributes.clear(); // lo-like, tun: no Ethernet address
        let Reply::Link(link) = &roundtrip(RouteNetlinkMessage::NewLink(l), 1)[0].2 else {
            panic!()
        };
        assert_eq!((link.index, link.mac), (7, None));
    }
}
