//! What `--xdp-mode auto` attaches in, and why.
//!
//! Native XDP is the fast path, but on a veth a native `XDP_TX` (or a redirect
//! into the veth) is dropped unless the peer end runs an XDP program (its NAPI
//! receive path is off otherwise): the program counts every packet as sent
//! while the driver counts `xdp_tx_errors` and nothing arrives. Generic (skb)
//! mode transmits through the stack and works on any veth. So `auto` picks:
//!
//! - a veth whose peer, in this network namespace, runs a native XDP program:
//!   native (with the usual fallback to generic if the attach fails);
//! - a veth whose peer has none, is in another namespace (`IFLA_LINK_NETNSID`:
//!   its programs cannot be read from here), or cannot be read: generic;
//! - anything else (a NIC, a bond, ...): native, falling back to generic if the
//!   driver refuses.
//!
//! The link facts come from one or two `RTM_GETLINK`s ([`probe`]); the choice is
//! pure ([`choose`]).

use std::io;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage, LinkXdp};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::{attach_mode::AttachMode, batch::if_index};

/// What [`choose`] needs to know about the interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uplink {
    /// Not a veth (`IFLA_INFO_KIND`, if any).
    Other { kind: Option<String> },
    /// A veth whose peer is in this namespace: whether it runs a native XDP program.
    VethPeerHere { peer: u32, peer_native_xdp: bool },
    /// A veth whose peer is in another network namespace.
    VethPeerElsewhere,
    /// The facts could not be read (the reason).
    Unknown(String),
}

/// The mode `auto` resolves to, and the reason (for the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// `Auto` (native, generic if the driver refuses) or `Generic`.
    pub mode: AttachMode,
    pub why: String,
}

/// The pure rule (module docs).
pub fn choose(uplink: &Uplink) -> Choice {
    let (mode, why) = match uplink {
        Uplink::Other { kind } => (
            AttachMode::Auto,
            format!(
                "not a veth ({}): native, generic if the driver refuses it",
                kind.as_deref().unwrap_or("a physical NIC")
            ),
        ),
        Uplink::VethPeerHere {
            peer,
            peer_native_xdp: true,
        } => (
            AttachMode::Auto,
            format!("a veth whose peer (ifindex {peer}) runs a native XDP program: native transmits work"),
        ),
        Uplink::VethPeerHere {
            peer,
            peer_native_xdp: false,
        } => (
            AttachMode::Generic,
            format!("a veth whose peer (ifindex {peer}) runs no native XDP program: native XDP_TX would be dropped"),
        ),
        Uplink::VethPeerElsewhere => (
            AttachMode::Generic,
            "a veth whose peer is in another network namespace (its XDP programs cannot be read from here): native XDP_TX would be dropped unless it runs one".into(),
        ),
        Uplink::Unknown(e) => (
            AttachMode::Generic,
            format!("the interface could not be read ({e}): generic, which transmits on any device"),
        ),
    };
    Choice { mode, why }
}

/// `mode` as attached: `Auto` resolved by [`choose`] over [`probe`] (logged),
/// the others as they are.
pub fn resolve(iface: &str, mode: AttachMode) -> AttachMode {
    if mode != AttachMode::Auto {
        return mode;
    }
    let uplink = probe(iface);
    let c = choose(&uplink);
    tracing::info!(
        iface,
        mode = if c.mode == AttachMode::Generic { "generic" } else { "native" },
        why = %c.why,
        "--xdp-mode auto"
    );
    c.mode
}

/// The facts of `iface` in the calling thread's network namespace.
pub fn probe(iface: &str) -> Uplink {
    let index = if_index(iface);
    if index == 0 {
        return Uplink::Unknown(format!("no interface {iface:?}"));
    }
    let link = match get_link(index) {
        Ok(l) => l,
        Err(e) => return Uplink::Unknown(format!("RTM_GETLINK {iface}: {e}")),
    };
    let facts = facts_of(&link);
    if facts.kind.as_deref() != Some("veth") {
        return Uplink::Other { kind: facts.kind };
    }
    match (facts.link, facts.link_netnsid) {
        (_, Some(_)) => Uplink::VethPeerElsewhere,
        (None, None) => Uplink::Unknown(format!("veth {iface} names no peer")),
        (Some(peer), None) => match get_link(peer) {
            Ok(p) => Uplink::VethPeerHere {
                peer,
                peer_native_xdp: facts_of(&p).native_xdp,
            },
            Err(e) => Uplink::Unknown(format!("RTM_GETLINK of the peer (ifindex {peer}): {e}")),
        },
    }
}

/// The attributes of one link message [`probe`] reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Facts {
    kind: Option<String>,
    link: Option<u32>,
    link_netnsid: Option<i32>,
    native_xdp: bool,
}

fn facts_of(m: &LinkMessage) -> Facts {
    let mut f = Facts::default();
    for a in &m.attributes {
        match a {
            LinkAttribute::Link(p) => f.link = Some(*p),
            LinkAttribute::LinkNetNsId(n) => f.link_netnsid = Some(*n),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        f.kind = Some(match k {
                            InfoKind::Other(s) => s.clone(),
                            k => k.to_string(),
                        });
                    }
                }
            }
            LinkAttribute::Xdp(x) => {
                f.native_xdp |= x
                    .iter()
                    .any(|x| matches!(x, LinkXdp::DrvProgId(id) if *id != 0));
            }
            _ => {}
        }
    }
    f
}

fn get_link(index: u32) -> io::Result<LinkMessage> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut m = LinkMessage::default();
    m.header.index = index;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut msg = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(m)),
    );
    msg.finalize();
    let mut out = vec![0; msg.buffer_len()];
    msg.serialize(&mut out);
    sock.send(&out, 0)?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = sock.recv(&mut &mut buf[..], 0)?;
    let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[..n])
        .map_err(|e| io::Error::other(format!("decoding the answer: {e}")))?;
    match answer.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => Ok(l),
        NetlinkPayload::Error(e) => Err(io::Error::other(format!("refused: {e}"))),
        other => Err(io::Error::other(format!("unexpected answer {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_veth_gets_generic_unless_its_peer_here_runs_native_xdp() {
        let here = |x| Uplink::VethPeerHere {
            peer: 4,
            peer_native_xdp: x,
        };
        assert_eq!(choose(&here(true)).mode, AttachMode::Auto);
        assert_eq!(choose(&here(false)).mode, AttachMode::Generic);
        assert!(choose(&here(false)).why.contains("no native XDP program"));
        assert_eq!(choose(&Uplink::VethPeerElsewhere).mode, AttachMode::Generic);
        assert_eq!(
            choose(&Uplink::Unknown("x".into())).mode,
            AttachMode::Generic
        );
        assert_eq!(choose(&Uplink::Other { kind: None }).mode, AttachMode::Auto);
        assert_eq!(
            choose(&Uplink::Other {
                kind: Some("bond".into())
            })
            .mode,
            AttachMode::Auto
        );
        // explicit modes are not second-guessed
        assert_eq!(
            resolve("no-such-if", AttachMode::Native),
            AttachMode::Native
        );
        assert_eq!(
            resolve("no-such-if", AttachMode::Generic),
            AttachMode::Generic
        );
        assert_eq!(resolve("no-such-if", AttachMode::Auto), AttachMode::Generic);
    }

    #[test]
    fn link_facts_are_read_from_the_attributes() {
        let mut m = LinkMessage::default();
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Veth,
            )]));
        m.attributes.push(LinkAttribute::Link(9));
        m.attributes.push(LinkAttribute::LinkNetNsId(2));
        m.attributes
            .push(LinkAttribute::Xdp(vec![LinkXdp::DrvProgId(17)]));
        let f = facts_of(&m);
        assert_eq!(
            f,
            Facts {
                kind: Some("veth".into()),
                link: Some(9),
                link_netnsid: Some(2),
                native_xdp: true
            }
        );
        let mut g = LinkMessage::default();
        g.attributes
            .push(LinkAttribute::Xdp(vec![LinkXdp::SkbProgId(3)]));
        assert!(
            !facts_of(&g).native_xdp,
            "a generic program on the peer does not count"
        );
    }
}
