//! Byte fixtures, checked both ways: decode(bytes) == value and encode(value) == bytes.
//! Every fixture is written out field by field from the RFCs, not captured from our
//! own encoder.

use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::IpNetwork;

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const MARKER: &str = "ffffffffffffffffffffffffffffffff";

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn decode_msg(b: &[u8]) -> Message {
    match decode(b, true).unwrap() {
        Decoded::Message(m) => m,
        Decoded::Update(u) => {
            assert_eq!(u.treat_as_withdraw, None);
            Message::Update(u.update)
        }
    }
}

fn both_ways(bytes: &[u8], msg: Message) {
    assert_eq!(msg.encode().unwrap(), bytes, "encode(value) == bytes");
    assert_eq!(decode_msg(bytes), msg, "decode(bytes) == value");
}

#[test]
fn open_with_each_capability() {
    let bytes = hex(&format!(
        "{MARKER} 0039 01
         04 fdf3 0003 0ac8000b 1c
         02 06 01 04 0001 00 01
         02 06 01 04 0002 00 01
         02 02 02 00
         02 06 41 04 0000fdf3"
    ));
    let open = Open::new(
        65011,
        3,
        Ipv4Addr::new(10, 200, 0, 11),
        &[Afi::Ipv4, Afi::Ipv6],
    );
    assert_eq!(open.families(), vec![Afi::Ipv4, Afi::Ipv6]);
    assert!(open.route_refresh() && open.four_octet_asn());
    both_ways(&bytes, Message::Open(open));
}

#[test]
fn open_with_a_4_octet_asn_uses_as_trans() {
    let bytes = hex(&format!(
        "{MARKER} 0025 01
         04 5ba0 005a 0a000001 08
         02 06 41 04 fa56ea00"
    ));
    let mut open = Open::new(4_200_000_000, 90, Ipv4Addr::new(10, 0, 0, 1), &[]);
    open.capabilities
        .retain(|c| matches!(c, Capability::FourOctetAsn(_)));
    assert_eq!(open.my_as, AS_TRANS);
    assert_eq!(open.asn(), 4_200_000_000);
    both_ways(&bytes, Message::Open(open));
}

#[test]
fn open_unknown_capability_is_kept_and_mp_less_peer_means_ipv4() {
    // Graceful restart (64) and FQDN (73) in one parameter, as BIRD and GoBGP send them.
    let bytes = hex(&format!(
        "{MARKER} 0027 01
         04 fde8 0003 0a000001 0a
         02 08 40 02 0078 49 02 0100"
    ));
    let Message::Open(o) = decode_msg(&bytes) else {
        panic!()
    };
    assert_eq!(o.asn(), 65000);
    assert_eq!(o.families(), vec![Afi::Ipv4]);
    assert_eq!(
        o.capabilities,
        vec![
            Capability::Unknown {
                code: 64,
                value: vec![0, 0x78]
            },
            Capability::Unknown {
                code: 73,
                value: vec![1, 0]
            },
        ]
    );
}

#[test]
fn update_ipv4_nlri_with_communities_and_large_communities() {
    let bytes = hex(&format!(
        "{MARKER} 0052 02
         0000 0031
         40 01 01 00
         40 02 06 02 01 0000fdf3
         40 03 04 0ac8000b
         80 04 04 0000000a
         c0 08 04 fdf30064
         c0 20 0c 0000fdf3 00000001 00000002
         20 0ac86401 20 0ac86402"
    ));
    let u = Update {
        withdrawn: vec![],
        attrs: Some(PathAttrs {
            origin: 0,
            as_path: vec![65011],
            next_hop: Some(IpAddr::V4(Ipv4Addr::new(10, 200, 0, 11))),
            med: Some(10),
            local_pref: None,
            communities: vec![(65011 << 16) | 100],
            large_communities: vec![[65011, 1, 2]],
        }),
        nlri: vec![net("10.200.100.1/32"), net("10.200.100.2/32")],
    };
    both_ways(&bytes, Message::Update(u));
}

#[test]
fn update_ipv6_in_mp_reach_with_local_pref_and_graceful_shutdown() {
    let bytes = hex(&format!(
        "{MARKER} 005b 02
         0000 0044
         40 01 01 00
         40 02 06 02 01 0000fdf3
         40 05 04 00000064
         c0 08 04 ffff0000
         80 0e 26 0002 01 10 fd000200000000000000000000000011 00
            80 fd000200010000000000000000000001"
    ));
    let u = Update {
        withdrawn: vec![],
        attrs: Some(PathAttrs {
            origin: 0,
            as_path: vec![65011],
            next_hop: Some("fd00:200::11".parse().unwrap()),
            med: None,
            local_pref: Some(100),
            communities: vec![0xffff_0000],
            large_communities: vec![],
        }),
        nlri: vec![net("fd00:200:100::1/128")],
    };
    both_ways(&bytes, Message::Update(u));
}

#[test]
fn withdrawals_ipv4_in_the_withdrawn_field_ipv6_in_mp_unreach() {
    let v4 = hex(&format!("{MARKER} 001c 02 0005 200ac86401 0000"));
    let v6 = hex(&format!(
        "{MARKER} 002e 02 0000 0017
         80 0f 14 0002 01 80 fd000200010000000000000000000001"
    ));
    let msgs = encode_updates(
        &[net("10.200.100.1/32"), net("fd00:200:100::1/128")],
        None,
        true,
    )
    .unwrap();
    assert_eq!(msgs, vec![v4.clone(), v6.clone()]);
    let w = |p: &str| {
        Message::Update(Update {
            withdrawn: vec![net(p)],
            ..Default::default()
        })
    };
    assert_eq!(decode_msg(&v4), w("10.200.100.1/32"));
    assert_eq!(decode_msg(&v6), w("fd00:200:100::1/128"));
}

#[test]
fn two_octet_session_gets_as_trans_and_as4_path() {
    let attrs = PathAttrs {
        as_path: vec![4_200_000_000],
        next_hop: Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
        ..Default::default()
    };
    let msgs = encode_updates(&[], Some((&attrs, &[net("192.0.2.0/24")])), false).unwrap();
    let expect = hex(&format!(
        "{MARKER} 0036 02 0000 001b
         40 01 01 00
         40 02 04 02 01 5ba0
         40 03 04 c0000201
         c0 11 06 02 01 fa56ea00
         18 c00002"
    ));
    assert_eq!(msgs, vec![expect]);
}

#[test]
fn notification_keepalive_route_refresh() {
    both_ways(
        &hex(&format!("{MARKER} 0015 03 06 02")),
        Message::Notification(Notification::new(6, 2)),
    );
    both_ways(
        &hex(&format!("{MARKER} 0017 03 02 01 0004")),
        Message::Notification(Notification::with_data(2, 1, vec![0, 4])),
    );
    both_ways(&hex(&format!("{MARKER} 0013 04")), Message::Keepalive);
    both_ways(
        &hex(&format!("{MARKER} 0017 05 0002 00 01")),
        Message::RouteRefresh { afi: 2, safi: 1 },
    );
}

#[test]
fn many_prefixes_pack_into_full_messages() {
    let nlri: Vec<IpNetwork> = (0..20_000u32)
        .map(|i| IpNetwork::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)), 32).unwrap())
        .collect();
    let attrs = PathAttrs {
        as_path: vec![65011],
        next_hop: Some(IpAddr::V4(Ipv4Addr::new(10, 200, 0, 11))),
        communities: vec![1, 2, 3],
        ..Default::default()
    };
    let msgs = encode_updates(&[], Some((&attrs, &nlri)), true).unwrap();
    // 5 bytes per /32 and ~50 bytes of attributes: 20,000 prefixes need 25 messages.
    assert_eq!(msgs.len(), 25);
    let mut back = Vec::new();
    for m in &msgs {
        assert!(m.len() <= MAX_MESSAGE_LEN);
        let Decoded::Update(u) = decode(m, true).unwrap() else {
            panic!()
        };
        assert_eq!(u.update.attrs.as_ref(), Some(&attrs));
        back.extend(u.update.nlri);
    }
    assert_eq!(back, nlri);
}

// ---- receive-side errors (RFC 4271 §6, RFC 7606)

fn err_of(b: &[u8]) -> (u8, u8) {
    let n = decode(b, true).unwrap_err().notification();
    (n.code, n.subcode)
}

fn taw_of(b: &[u8]) -> DecodedUpdate {
    match decode(b, true).unwrap() {
        Decoded::Update(u) => u,
        other => panic!("{other:?}"),
    }
}

#[test]
fn header_errors() {
    let mut bad_marker = hex(&format!("{MARKER} 0013 04"));
    bad_marker[3] = 0;
    assert_eq!(err_of(&bad_marker), (1, 1));
    assert_eq!(err_of(&hex(&format!("{MARKER} 0012 04"))), (1, 2));
    assert_eq!(err_of(&hex(&format!("{MARKER} 0014 04 00"))), (1, 2));
    assert_eq!(err_of(&hex(&format!("{MARKER} 0013 09"))), (1, 3));
    let e = decode(&hex(&format!("{MARKER} 1001 02")), true).unwrap_err();
    assert_eq!(
        e.notification().data,
        vec![0x10, 0x01],
        "data = the bad length"
    );
}

#[test]
fn open_errors() {
    let v3 = hex(&format!("{MARKER} 001d 01 03 fde8 0003 0a000001 00"));
    let e = decode(&v3, true).unwrap_err().notification();
    assert_eq!((e.code, e.subcode, e.data), (2, 1, vec![0, 4]));
    let hold2 = hex(&format!("{MARKER} 001d 01 04 fde8 0002 0a000001 00"));
    assert_eq!(err_of(&hold2), (2, 6));
    let id0 = hex(&format!("{MARKER} 001d 01 04 fde8 0003 00000000 00"));
    assert_eq!(err_of(&id0), (2, 3));
    let auth = hex(&format!("{MARKER} 001f 01 04 fde8 0003 0a000001 02 01 00"));
    assert_eq!(err_of(&auth), (2, 4));
}

#[test]
fn update_session_reset_errors() {
    // Withdrawn length overruns the message.
    assert_eq!(err_of(&hex(&format!("{MARKER} 0017 02 0005 0000"))), (3, 1));
    // Prefix length 33 in the NLRI.
    let p33 = hex(&format!(
        "{MARKER} 0024 02 0000 0007 40 01 01 00 40 02 00 21 0a000001 01"
    ));
    assert_eq!(err_of(&p33), (3, 10));
    // Unrecognized well-known attribute (type 99, not optional).
    assert_eq!(
        err_of(&hex(&format!("{MARKER} 001a 02 0000 0003 40 63 00"))),
        (3, 2)
    );
    // MP_UNREACH twice.
    let twice = hex(&format!(
        "{MARKER} 0023 02 0000 000c 80 0f 03 0002 01 80 0f 03 0002 01"
    ));
    assert_eq!(err_of(&twice), (3, 1));
}

#[test]
fn update_treat_as_withdraw() {
    // ORIGIN value 5.
    let u = taw_of(&hex(&format!(
        "{MARKER} 002a 02 0000 000e 40 01 01 05 40 02 00 40 03 04 0a000001 20 0ac86401"
    )));
    assert_eq!(u.treat_as_withdraw, Some("malformed ORIGIN"));
    assert_eq!(u.update.withdrawn, vec![net("10.200.100.1/32")]);
    assert!(u.update.nlri.is_empty() && u.update.attrs.is_none());
    // Missing NEXT_HOP.
    let u = taw_of(&hex(&format!(
        "{MARKER} 0023 02 0000 0007 40 01 01 00 40 02 00 20 0ac86401"
    )));
    assert!(u.treat_as_withdraw.is_some());
    // COMMUNITIES of length 3.
    let u = taw_of(&hex(&format!(
        "{MARKER} 0030 02 0000 0014 40 01 01 00 40 02 00 40 03 04 0a000001 c0 08 03 000000 20 0ac86401"
    )));
    assert!(u.treat_as_withdraw.is_some());
    // Last attribute overruns the attribute field (RFC 7606 §4).
    let u = taw_of(&hex(&format!(
        "{MARKER} 0020 02 0000 0004 40 01 05 00 20 0ac86401"
    )));
    assert!(u.treat_as_withdraw.is_some());
}

#[test]
fn duplicate_attribute_is_discarded_and_unknown_optional_ignored() {
    let u = taw_of(&hex(&format!(
        "{MARKER} 0033 02 0000 0017
         40 01 01 00 40 01 01 02 40 02 00 40 03 04 0a000001 c0 63 02 abcd
         20 0ac86401"
    )));
    assert_eq!(u.treat_as_withdraw, None);
    assert_eq!(u.discarded, vec![1]);
    assert_eq!(u.update.attrs.unwrap().origin, 0, "first ORIGIN wins");
}
