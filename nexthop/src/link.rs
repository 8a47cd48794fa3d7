//! What an `RTM_NEWLINK` says about the port a next hop leaves by, without I/O.
//!
//! The route to a pod names its output interface. On an edge with a trunk port the
//! node's address is usually on a VLAN subinterface (`eth0.100`), while XDP runs on
//! the physical port: a VLAN device has no `ndo_xdp_xmit`, so a frame redirected to
//! it in native mode is dropped. So a VLAN output interface is turned into its
//! parent's ifindex plus the tag (id and protocol) the frame must carry there; the
//! source MAC stays the VLAN device's own. One level only: a VLAN on a VLAN (QinQ
//! stack) is refused with the devices' names, since the XDP program pushes one
//! tag. The parent may be any other port XDP can run on: a NIC, a veth, a bond
//! (the usual bare-metal trunk), ... but not a device of another network namespace:
//! then the kernel adds IFLA_LINK_NETNSID and IFLA_LINK is an index over there, which
//! names an unrelated device (or none) here, so such a VLAN is refused by name.

use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVlan, LinkAttribute, LinkInfo, LinkMessage, VlanProtocol as NlVlan,
};

use super::{Vlan, VlanProtocol};

/// The fields of one link that next-hop resolution needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub index: u32,
    /// IFLA_IFNAME ("" if the kernel sent none)
    pub name: String,
    /// IFLA_ADDRESS when it is an Ethernet address
    pub mac: Option<[u8; 6]>,
    /// IFLA_INFO_KIND ("vlan", "veth", "bond", ...); None for a physical NIC
    pub kind: Option<String>,
    /// IFLA_LINK: the lower device (a VLAN's parent), an index in the namespace
    /// `link_netnsid` names when that is set
    pub parent: Option<u32>,
    /// IFLA_LINK_NETNSID: set when the lower device (or a veth's peer) is in another
    /// network namespace; `parent` is then an index there, not here
    pub link_netnsid: Option<i32>,
    /// IFLA_VLAN_ID / IFLA_VLAN_PROTOCOL of a "vlan" link
    pub vlan: Option<Vlan>,
}

/// The port, source MAC and tag of frames sent through one output interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Egress {
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub vlan: Option<Vlan>,
}

/// Lower devices a VLAN may sit on: anything but another VLAN (the program
/// writes one tag). Bonds are the usual trunk on bare metal and run XDP.
fn is_plain_port(l: &Link) -> bool {
    !l.is_vlan()
}

impl Link {
    fn describe(&self) -> String {
        if self.name.is_empty() {
            format!("interface {}", self.index)
        } else {
            format!("interface {} ({})", self.name, self.index)
        }
    }

    pub(crate) fn is_vlan(&self) -> bool {
        self.kind.as_deref() == Some("vlan")
    }
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::Other(s) => s.clone(),
        // Display gives the kernel's kind string ("vlan", "veth", "bond", ...)
        k => k.to_string(),
    }
}

fn vlan_of(data: &[InfoVlan]) -> Option<Vlan> {
    let mut id = None;
    let mut protocol = VlanProtocol::Dot1Q;
    for d in data {
        match d {
            InfoVlan::Id(i) => id = Some(*i),
            InfoVlan::Protocol(NlVlan::Ieee8021Ad) => protocol = VlanProtocol::Dot1Ad,
            InfoVlan::Protocol(_) => protocol = VlanProtocol::Dot1Q,
            _ => {}
        }
    }
    Some(Vlan { id: id?, protocol })
}

/// Decodes the fields of a link message.
pub(crate) fn link_of(m: &LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        mac: None,
        kind: None,
        parent: None,
        link_netnsid: None,
        vlan: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::Address(b) => l.mac = b.as_slice().try_into().ok(),
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Link(p) => l.parent = Some(*p),
            LinkAttribute::LinkNetNsId(n) => l.link_netnsid = Some(*n),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => l.kind = Some(kind_name(k)),
                        LinkInfo::Data(InfoData::Vlan(v)) => l.vlan = vlan_of(v),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    l
}

/// Where frames routed out of `oif` leave. `parent` is the link `oif.parent` names,
/// which the caller fetches when `oif` is a VLAN device.
pub(crate) fn egress(oif: &Link, parent: Option<&Link>) -> Result<Egress, String> {
    let smac = oif
        .mac
        .ok_or_else(|| format!("{} has no Ethernet address", oif.describe()))?;
    if !oif.is_vlan() {
        return Ok(Egress {
            ifindex: oif.index,
            smac,
            vlan: None,
        });
    }
    let vlan = oif
        .vlan
        .ok_or_else(|| format!("VLAN {} reports no VLAN id", oif.describe()))?;
    if vlan.id == 0 || vlan.id > 4094 {
        return Err(format!(
            "VLAN {} has id {}, not 1..=4094",
            oif.describe(),
            vlan.id
        ));
    }
    if let Some(nsid) = oif.link_netnsid {
        // its IFLA_LINK is an index in that namespace: a local device with the same
        // index is an unrelated one, and XDP here cannot send on the real parent
        return Err(format!(
            "VLAN {} is on a device in another network namespace (netnsid {nsid}, \
             ifindex {} there): its parent is not a port of this namespace",
            oif.describe(),
            oif.parent.map_or_else(|| "?".into(), |p| p.to_string())
        ));
    }
    let parent = match (oif.parent, parent) {
        (Some(want), Some(p)) if p.index == want => p,
        (Some(want), _) => {
            return Err(format!(
                "VLAN {} is on interface {want}, which was not found (another namespace?)",
                oif.describe()
            ));
        }
        (None, _) => {
            return Err(format!(
                "VLAN {} reports no parent interface",
                oif.describe()
            ));
        }
    };
    if !is_plain_port(parent) {
        return Err(format!(
            "VLAN {} is on {}, a {} device: only one VLAN level is supported",
            oif.describe(),
            parent.describe(),
            parent.kind.as_deref().unwrap_or("?")
        ));
    }
    Ok(Egress {
        ifindex: parent.index,
        smac,
        vlan: Some(vlan),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload of an RTM_NEWLINK for `ip link add link veth0 name veth0.100 type
    /// vlan id 100` (ifindex 5 on parent 3, MAC 02:00:00:00:01:64), laid out as the
    /// kernel's rtnl_fill_ifinfo/vlan_fill_info write it (nests without
    /// NLA_F_NESTED, protocol before id), reduced to the attributes the decoder reads
    /// plus two it must skip (IFLA_MTU, IFLA_OPERSTATE). Types from linux/if_link.h.
    /// tests/nexthop_netlink.rs decodes the real thing from the kernel.
    #[rustfmt::skip]
    const VLAN_NEWLINK: &[u8] = &[
        // ifinfomsg: family 0, pad, type ARPHRD_ETHER (1), index 5, flags, change
        0, 0, 1, 0, 5, 0, 0, 0, 0x43, 0x10, 1, 0, 0, 0, 0, 0,
        // IFLA_IFNAME (3) "veth0.100\0" (len 14, padded to 16)
        14, 0, 3, 0, b'v', b'e', b't', b'h', b'0', b'.', b'1', b'0', b'0', 0, 0, 0,
        // IFLA_MTU (4) 1500
        8, 0, 4, 0, 0xdc, 0x05, 0, 0,
        // IFLA_LINK (5) 3
        8, 0, 5, 0, 3, 0, 0, 0,
        // IFLA_OPERSTATE (16) UP (6), padded
        5, 0, 16, 0, 6, 0, 0, 0,
        // IFLA_ADDRESS (1) 02:00:00:00:01:64 (len 10, padded to 12)
        10, 0, 1, 0, 2, 0, 0, 0, 1, 0x64, 0, 0,
        // IFLA_LINKINFO (18, nested) len 48
        48, 0, 18, 0,
        //   IFLA_INFO_KIND (1) "vlan\0" (len 9, padded to 12)
        9, 0, 1, 0, b'v', b'l', b'a', b'n', 0, 0, 0, 0,
        //   IFLA_INFO_DATA (2, nested) len 32
        32, 0, 2, 0,
        //     IFLA_VLAN_PROTOCOL (5) be16 0x8100, padded
        6, 0, 5, 0, 0x81, 0x00, 0, 0,
        //     IFLA_VLAN_ID (1) 100, padded
        6, 0, 1, 0, 100, 0, 0, 0,
        //     IFLA_VLAN_FLAGS (2) {flags 1 (REORDER_HDR), mask 0xffffffff}
        12, 0, 2, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
    ];

    fn parse(payload: &[u8]) -> Link {
        use netlink_packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload};
        use netlink_packet_route::RouteNetlinkMessage;
        let mut msg = vec![0u8; 16];
        let len = (16 + payload.len()) as u32;
        msg[0..4].copy_from_slice(&len.to_ne_bytes());
        msg[4..6].copy_from_slice(&16u16.to_ne_bytes()); // RTM_NEWLINK
        msg.extend_from_slice(payload);
        NetlinkBuffer::new_checked(&msg[..]).unwrap();
        let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&msg).unwrap();
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) = m.payload else {
            panic!("not a link message: {m:?}");
        };
        link_of(&l)
    }

    fn plain(index: u32, name: &str, kind: Option<&str>) -> Link {
        Link {
            index,
            name: name.into(),
            mac: Some([2, 0, 0, 0, 0, index as u8]),
            kind: kind.map(String::from),
            parent: None,
            link_netnsid: None,
            vlan: None,
        }
    }

    #[test]
    fn kernel_bytes_of_a_vlan_device_decode() {
        let l = parse(VLAN_NEWLINK);
        assert_eq!(
            l,
            Link {
                index: 5,
                name: "veth0.100".into(),
                mac: Some([2, 0, 0, 0, 1, 0x64]),
                kind: Some("vlan".into()),
                parent: Some(3),
                link_netnsid: None,
                vlan: Some(Vlan {
                    id: 100,
                    protocol: VlanProtocol::Dot1Q
                }),
            }
        );
        // the same device as 802.1ad (IFLA_VLAN_PROTOCOL 0x88a8)
        let mut ad = VLAN_NEWLINK.to_vec();
        let at = ad.len() - 28;
        assert_eq!(&ad[at..at + 6], &[6, 0, 5, 0, 0x81, 0x00]);
        ad[at + 4..at + 6].copy_from_slice(&[0x88, 0xa8]);
        assert_eq!(parse(&ad).vlan.unwrap().protocol, VlanProtocol::Dot1Ad);
    }

    #[test]
    fn a_vlan_leaves_by_its_parent_with_its_own_mac_and_tag() {
        let v = parse(VLAN_NEWLINK);
        let parent = plain(3, "veth0", Some("veth"));
        let e = egress(&v, Some(&parent)).unwrap();
        assert_eq!(
            e,
            Egress {
                ifindex: 3,
                smac: [2, 0, 0, 0, 1, 0x64],
                vlan: Some(Vlan {
                    id: 100,
                    protocol: VlanProtocol::Dot1Q
                }),
            }
        );
        // a physical NIC (no kind) is a plain parent too
        let nic = plain(3, "eth0", None);
        assert_eq!(egress(&v, Some(&nic)).unwrap().ifindex, 3);
        // a non-VLAN output interface is used as it is
        let e = egress(&nic, None).unwrap();
        assert_eq!((e.ifindex, e.vlan), (3, None));
    }

    #[test]
    fn unsupported_vlan_setups_are_errors_naming_the_device() {
        let v = parse(VLAN_NEWLINK);
        let p = plain(3, "lower0", Some("vlan"));
        let e = egress(&v, Some(&p)).unwrap_err();
        assert!(
            e.contains("veth0.100") && e.contains("lower0") && e.contains("vlan"),
            "{e}"
        );
        // a VLAN on a bond (the usual trunk) or another port XDP runs on
        for kind in ["bond", "team", "bridge"] {
            let p = plain(3, "lower0", Some(kind));
            let e = egress(&v, Some(&p)).unwrap();
            assert_eq!((e.ifindex, e.vlan.map(|v| v.id)), (3, Some(100)), "{kind}");
        }
        let e = egress(&v, None).unwrap_err();
        assert!(e.contains("veth0.100") && e.contains("not found"), "{e}");
        let e = egress(&v, Some(&plain(9, "other", None))).unwrap_err();
        assert!(e.contains("not found"), "{e}");
        let no_parent = Link {
            parent: None,
            ..v.clone()
        };
        assert!(egress(&no_parent, None).unwrap_err().contains("no parent"));
        let no_id = Link {
            vlan: None,
            ..v.clone()
        };
        assert!(egress(&no_id, None).unwrap_err().contains("no VLAN id"));
        let no_mac = Link { mac: None, ..v };
        assert!(
            egress(&no_mac, None)
                .unwrap_err()
                .contains("no Ethernet address")
        );
    }

    #[test]
    fn a_vlan_on_a_device_of_another_namespace_is_refused_by_name() {
        // the same message plus IFLA_LINK_NETNSID (37), s32 0: `ip link add link
        // veth0 name veth0.100 netns OTHER ...` seen from OTHER, where IFLA_LINK 3 is
        // veth0's index in the first namespace
        let mut b = VLAN_NEWLINK.to_vec();
        b.extend_from_slice(&[8, 0, 37, 0, 0, 0, 0, 0]);
        let v = parse(&b);
        assert_eq!((v.parent, v.link_netnsid), (Some(3), Some(0)));
        // a local device that happens to have index 3 must not be taken for the parent
        let unrelated = plain(3, "eth7", None);
        let e = egress(&v, Some(&unrelated)).unwrap_err();
        assert!(
            e.contains("veth0.100") && e.contains("another network namespace"),
            "{e}"
        );
        assert!(!e.contains("eth7"), "{e}");
        assert!(egress(&v, None).is_err());
        // without the attribute the same bytes resolve to the parent
        assert_eq!(
            egress(&parse(VLAN_NEWLINK), Some(&unrelated))
                .unwrap()
                .ifindex,
            3
        );
        // a non-VLAN device with a peer elsewhere (a veth) is a port as usual
        let veth = Link {
            link_netnsid: Some(1),
            ..plain(4, "veth1", Some("veth"))
        };
        assert_eq!(egress(&veth, None).unwrap().ifindex, 4);
    }

    #[test]
    fn truncated_link_info_does_not_panic() {
        for cut in 16..VLAN_NEWLINK.len() {
            use netlink_packet_core::NetlinkMessage;
            use netlink_packet_route::RouteNetlinkMessage;
            let payload = &VLAN_NEWLINK[..cut];
            let mut msg = vec![0u8; 16];
            let len = (16 + payload.len()) as u32;
            msg[0..4].copy_from_slice(&len.to_ne_bytes());
            msg[4..6].copy_from_slice(&16u16.to_ne_bytes());
            msg.extend_from_slice(payload);
            // may fail to decode, must not panic
            let _ = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&msg);
        }
    }
}
