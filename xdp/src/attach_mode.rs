//! Which mode an interface's XDP program runs in, as the kernel reports it
//! (`RTM_GETLINK`, `IFLA_XDP`), and whether a pinned link can be kept for the mode
//! the edge is asked for.
//!
//! A restarted edge replaces the program inside its pinned XDP link, so the
//! interface never goes without XDP. But a link keeps the mode it was attached in:
//! after `helm upgrade` changes `edge.xdpMode`, keeping the link would silently
//! keep the old mode. [`reuse`] says when the link must be detached and attached
//! again instead.

use std::io;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkMessage, LinkXdp};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// How to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic with a warning; generic on a
    /// veth whose peer runs no XDP program (`auto_mode`).
    Auto,
    Native,
    Generic,
}

/// The mode an XDP program is attached in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    /// Native: in the driver (`ip link` shows `xdp`, `xdpdrv`).
    Native,
    /// Generic: after the skb is built (`xdpgeneric`).
    Generic,
    /// Offloaded to the NIC (`xdpoffload`).
    Offload,
}

impl LinkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkMode::Native => "native",
            LinkMode::Generic => "generic",
            LinkMode::Offload => "offload",
        }
    }
}

/// The program ids attached to one interface, per mode (`IFLA_XDP_*_PROG_ID`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpProgs {
    pub native: Option<u32>,
    pub generic: Option<u32>,
    pub offload: Option<u32>,
}

impl XdpProgs {
    /// The mode program `prog_id` runs in on this interface, if it is attached.
    pub fn mode_of(&self, prog_id: u32) -> Option<LinkMode> {
        [
            (self.native, LinkMode::Native),
            (self.generic, LinkMode::Generic),
            (self.offload, LinkMode::Offload),
        ]
        .into_iter()
        .find_map(|(id, mode)| (id == Some(prog_id)).then_some(mode))
    }
}

/// What to do with a pinned link found at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// Replace the program inside it: nothing changes for the interface.
    Keep,
    /// Detach it and attach afresh: it runs in `have`, the edge is asked for `want`.
    Reattach { have: LinkMode, want: AttachMode },
}

/// The pure rule. `auto` keeps whatever mode the link has (it was chosen by the
/// same rule when the link was made), so a restart stays hitless; `native` and
/// `generic` must be met exactly. A link whose mode is unknown (the kernel
/// reported none for its program) is kept: there is nothing to compare.
pub fn reuse(have: Option<LinkMode>, want: AttachMode) -> Reuse {
    match (have, want) {
        (None, _) | (Some(_), AttachMode::Auto) => Reuse::Keep,
        (Some(LinkMode::Native), AttachMode::Native)
        | (Some(LinkMode::Generic), AttachMode::Generic) => Reuse::Keep,
        (Some(have), want) => Reuse::Reattach { have, want },
    }
}

/// The XDP programs attached to interface `ifindex`, per mode, in the calling
/// thread's network namespace.
pub fn xdp_progs(ifindex: u32) -> io::Result<XdpProgs> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    sock.send(&link_get(ifindex, 1), 0)?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = sock.recv(&mut &mut buf[..], 0)?;
    progs_of_answer(&buf[..n]).map_err(io::Error::other)
}

/// RTM_GETLINK for one interface index.
fn link_get(ifindex: u32, seq: u32) -> Vec<u8> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(
        header,
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(m)),
    );
    msg.finalize();
    let mut out = vec![0; msg.buffer_len()];
    msg.serialize(&mut out);
    out
}

/// The XDP programs of the RTM_NEWLINK answer in `buf`.
fn progs_of_answer(buf: &[u8]) -> Result<XdpProgs, String> {
    let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(buf)
        .map_err(|e| format!("decoding the RTM_GETLINK answer: {e}"))?;
    match msg.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Ok(progs_of(&link)),
        NetlinkPayload::Error(e) => Err(format!("RTM_GETLINK refused: {e}")),
        other => Err(format!("unexpected answer to RTM_GETLINK: {other:?}")),
    }
}

/// The XDP programs of one link message.
pub fn progs_of(link: &LinkMessage) -> XdpProgs {
    let mut out = XdpProgs::default();
    for attr in &link.attributes {
        let LinkAttribute::Xdp(xdp) = attr else {
            continue;
        };
        for x in xdp {
            match x {
                LinkXdp::DrvProgId(id) => out.native = Some(*id),
                LinkXdp::SkbProgId(id) => out.generic = Some(*id),
                LinkXdp::HwProgId(id) => out.offload = Some(*id),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::XdpAttached;

    use super::*;

    #[test]
    fn a_link_is_kept_unless_an_explicit_mode_differs() {
        use AttachMode::*;
        use LinkMode::Generic as G;
        use LinkMode::Native as N;
        assert_eq!(reuse(Some(N), Native), Reuse::Keep);
        assert_eq!(reuse(Some(G), Generic), Reuse::Keep);
        assert_eq!(
            reuse(Some(G), Auto),
            Reuse::Keep,
            "auto: a restart stays hitless"
        );
        assert_eq!(reuse(Some(N), Auto), Reuse::Keep);
        assert_eq!(reuse(None, Native), Reuse::Keep);
        assert_eq!(
            reuse(Some(G), Native),
            Reuse::Reattach {
                have: G,
                want: Native
            }
        );
        assert_eq!(
            reuse(Some(N), Generic),
            Reuse::Reattach {
                have: N,
                want: Generic
            }
        );
        assert_eq!(
            reuse(Some(LinkMode::Offload), Native),
            Reuse::Reattach {
                have: LinkMode::Offload,
                want: Native
            }
        );
    }

    fn answer(xdp: Vec<LinkXdp>) -> Vec<u8> {
        let mut link = LinkMessage::default();
        link.header.index = 7;
        link.attributes.push(LinkAttribute::IfName("eth0".into()));
        link.attributes.push(LinkAttribute::Xdp(xdp));
        let mut msg = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)),
        );
        msg.finalize();
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        out
    }

    #[test]
    fn the_mode_of_a_program_is_read_from_the_per_mode_ids() {
        // One program, generic: the kernel sends ATTACHED, SKB_PROG_ID, PROG_ID.
        let p = progs_of_answer(&answer(vec![
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::SkbProgId(42),
            LinkXdp::ProgId(42),
        ]))
        .unwrap();
        assert_eq!(p.mode_of(42), Some(LinkMode::Generic));
        assert_eq!(p.mode_of(41), None);
        // Two programs (MULTI): each by its own id.
        let p = progs_of_answer(&answer(vec![
            LinkXdp::Attached(XdpAttached::Multiple),
            LinkXdp::SkbProgId(5),
            LinkXdp::DrvProgId(6),
        ]))
        .unwrap();
        assert_eq!(p.mode_of(5), Some(LinkMode::Generic));
        assert_eq!(p.mode_of(6), Some(LinkMode::Native));
        // None attached.
        let p = progs_of_answer(&answer(vec![LinkXdp::Attached(XdpAttached::None)])).unwrap();
        assert_eq!(p, XdpProgs::default());
        assert!(progs_of_answer(&[1, 2, 3]).is_err());
    }
}
