//! Byte fixtures, checked both ways. Every fixture was written by hand from
//! the uapi layout (linux/netlink.h, linux/genetlink.h, linux/ip_vs.h,
//! linux/if_addr.h) and the kernel's own encoder (`ip_vs_genl_fill_service`,
//! `ip_vs_genl_fill_dest` in net/netfilter/ipvs/ip_vs_ctl.c), one attribute a
//! line: `len type | payload | pad`. Netlink integers are host order and these
//! are little-endian hosts' bytes; ports (`__be16`) are network order.
#![cfg(target_endian = "little")]

use std::net::IpAddr;

use super::consts::*;
use super::ipvs::{Command, DestAttr, Message, SvcAttr};
use super::*;
use crate::model::{Dest, DestKey, Forward, Proto, Service, ServiceKey, Stats};

/// Hex with whitespace and `|` separators, `#` comments to the end of a line.
fn hex(s: &str) -> Vec<u8> {
    let clean: String = s
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.chars())
        .filter(|c| c.is_ascii_hexdigit())
        .collect();
    (0..clean.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&clean[i..i + 2], 16).unwrap())
        .collect()
}

const FAMILY: u16 = 0x25;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc4() -> ServiceKey {
    ServiceKey {
        addr: ip("10.100.0.1"),
        port: 80,
        proto: Proto::Tcp,
    }
}

fn svc6() -> ServiceKey {
    ServiceKey {
        addr: ip("fd00::1"),
        port: 443,
        proto: Proto::Udp,
    }
}

/// Both ways: the value encodes to the bytes, the bytes decode to the value.
fn both_ways(m: &Message, seq: u32, bytes: &[u8]) {
    assert_eq!(m.encode(FAMILY, seq), bytes, "encode {m:?}");
    let raw = split(bytes).unwrap();
    assert_eq!(raw.len(), 1);
    assert_eq!((raw[0].ty, raw[0].seq), (FAMILY, seq));
    assert_eq!(raw[0].flags, m.request_flags());
    assert_eq!(&Message::decode(&raw[0].payload).unwrap(), m);
}

const NEW_SERVICE_V4: &str = "
    68000000 2500 0500 01000000 00000000    # nlmsghdr: len 104, IPVS, REQUEST|ACK, seq 1
    01 01 0000                              # genlmsghdr: NEW_SERVICE, version 1
    5400 0100                               # IPVS_CMD_ATTR_SERVICE, 84 bytes
      0600 0100 | 0200 | 0000               #   AF = AF_INET
      0600 0200 | 0600 | 0000               #   PROTOCOL = 6 (TCP)
      1400 0300 | 0a640001 000000000000000000000000   # ADDR, union nf_inet_addr
      0600 0400 | 0050 | 0000               #   PORT = 80 (be16)
      0700 0600 | 6d6800 | 00               #   SCHED_NAME = \"mh\"
      0c00 0700 | 18000000 3d000000         #   FLAGS {SCHED1|SCHED2, mask 0x3d}
      0800 0800 | 00000000                  #   TIMEOUT = 0
      0800 0900 | ffffffff                  #   NETMASK = 255.255.255.255
";

#[test]
fn new_service_ipv4_mh_fallback_port() {
    let s = Service::mh(svc4(), IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2);
    both_ways(&Message::new_service(s), 1, &hex(NEW_SERVICE_V4));
}

/// Client affinity: PERSISTENT with mh-fallback (no mh-port), the timeout in
/// host order, the host netmask.
#[test]
fn new_service_ipv4_persistent() {
    let mut s = Service::mh(svc4(), IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_PERSISTENT);
    s.timeout = 10_800;
    let bytes = NEW_SERVICE_V4
        .replace("18000000 3d000000", "09000000 3d000000")
        .replace("0800 0800 | 00000000", "0800 0800 | 302a0000");
    both_ways(&Message::new_service(s), 1, &hex(&bytes));
}

const NEW_DEST_TUNNEL: &str = "
    94000000 2500 0500 02000000 00000000    # len 148, REQUEST|ACK, seq 2
    05 01 0000                              # NEW_DEST
    3000 0100                               # SERVICE (key only), 48 bytes
      0600 0100 | 0200 | 0000
      0600 0200 | 0600 | 0000
      1400 0300 | 0a640001 000000000000000000000000
      0600 0400 | 0050 | 0000
    5000 0200                               # IPVS_CMD_ATTR_DEST, 80 bytes
      1400 0100 | 0a010007 000000000000000000000000   # ADDR 10.1.0.7
      0600 0200 | 0050 | 0000               #   PORT = 80 (the service's)
      0600 0b00 | 0200 | 0000               #   ADDR_FAMILY = AF_INET
      0800 0300 | 02000000                  #   FWD_METHOD = IP_VS_CONN_F_TUNNEL
      0800 0400 | 01000000                  #   WEIGHT = 1
      0800 0500 | 00000000                  #   U_THRESH
      0800 0600 | 00000000                  #   L_THRESH
      0500 0d00 | 00 | 000000               #   TUN_TYPE = IPIP
";

#[test]
fn new_dest_tunnel() {
    let d = Dest::new(ip("10.1.0.7"), 80, Forward::Tunnel, 1);
    both_ways(&Message::new_dest(svc4(), d), 2, &hex(NEW_DEST_TUNNEL));
}

const SET_DEST_DROUTE: &str = "
    8c000000 2500 0500 09000000 00000000    # len 140, seq 9
    06 01 0000                              # SET_DEST
    3000 0100
      0600 0100 | 0200 | 0000
      0600 0200 | 0600 | 0000
      1400 0300 | 0a640001 000000000000000000000000
      0600 0400 | 0050 | 0000
    4800 0200                               # DEST, 72 bytes (no TUN_TYPE)
      1400 0100 | 0a010007 000000000000000000000000
      0600 0200 | 0050 | 0000
      0600 0b00 | 0200 | 0000
      0800 0300 | 03000000                  #   FWD_METHOD = IP_VS_CONN_F_DROUTE
      0800 0400 | 00000000                  #   WEIGHT = 0 (drain)
      0800 0500 | 00000000
      0800 0600 | 00000000
";

#[test]
fn set_dest_direct_routing_weight_zero() {
    let d = Dest::new(ip("10.1.0.7"), 80, Forward::DirectRoute, 0);
    assert_eq!(d.tun_type, None);
    both_ways(&Message::set_dest(svc4(), d), 9, &hex(SET_DEST_DROUTE));
}

const DEL_DEST_V6: &str = "
    6c000000 2500 0500 03000000 00000000    # len 108, seq 3
    07 01 0000                              # DEL_DEST
    3000 0100
      0600 0100 | 0a00 | 0000               #   AF = AF_INET6
      0600 0200 | 1100 | 0000               #   PROTOCOL = 17 (UDP)
      1400 0300 | fd000000000000000000000000000001
      0600 0400 | 01bb | 0000               #   PORT = 443
    2800 0200                               # DEST (key only), 40 bytes
      1400 0100 | fd000001000000000000000000000005
      0600 0200 | 01bb | 0000
      0600 0b00 | 0a00 | 0000
";

#[test]
fn del_dest_ipv6_key_only() {
    let d = DestKey {
        addr: ip("fd00:1::5"),
        port: 443,
    };
    both_ways(&Message::del_dest(svc6(), d), 3, &hex(DEL_DEST_V6));
}

const DEL_SERVICE_V6: &str = "
    44000000 2500 0500 04000000 00000000    # len 68, seq 4
    03 01 0000                              # DEL_SERVICE
    3000 0100
      0600 0100 | 0a00 | 0000
      0600 0200 | 1100 | 0000
      1400 0300 | fd000000000000000000000000000001
      0600 0400 | 01bb | 0000
";

#[test]
fn del_service_ipv6() {
    both_ways(&Message::del_service(svc6()), 4, &hex(DEL_SERVICE_V6));
}

const SET_SERVICE_V6: &str = "
    68000000 2500 0500 05000000 00000000    # len 104, seq 5
    02 01 0000                              # SET_SERVICE
    5400 0100                               # 84 bytes
      0600 0100 | 0a00 | 0000
      0600 0200 | 1100 | 0000
      1400 0300 | fd000000000000000000000000000001
      0600 0400 | 01bb | 0000
      0700 0600 | 6d6800 | 00
      0c00 0700 | 10000000 3d000000         #   FLAGS {SCHED2 (mh-port), mask}
      0800 0800 | 00000000
      0800 0900 | 80000000                  #   NETMASK = 128 (IPv6: a prefix length)
";

#[test]
fn set_service_ipv6_netmask_is_a_prefix_length() {
    let s = Service::mh(svc6(), IP_VS_SVC_F_SCHED2);
    both_ways(&Message::set_service(s), 5, &hex(SET_SERVICE_V6));
}

#[test]
fn dumps_of_services_and_dests() {
    let get_services = "14000000 2500 0103 06000000 00000000 | 04 01 0000"; // REQUEST|DUMP
    both_ways(&Message::get_services(), 6, &hex(get_services));
    let get_dests = "
        44000000 2500 0103 07000000 00000000 | 08 01 0000   # GET_DEST, dump
        3000 0100
          0600 0100 | 0200 | 0000
          0600 0200 | 0600 | 0000
          1400 0300 | 0a640001 000000000000000000000000
          0600 0400 | 0050 | 0000
    ";
    both_ways(&Message::get_dests(svc4()), 7, &hex(get_dests));
}

/// A service as the kernel dumps it (`ip_vs_genl_fill_service`): NLA_F_NESTED
/// on the nests, `IP_VS_SVC_F_HASHED` among the flags with mask ~0, the
/// 32-bit STATS nest, then STATS64 (with a PAD attribute, as
/// `nla_put_u64_64bit` adds where u64s need aligning), and an attribute this
/// codec does not know (a newer kernel's).
const KERNEL_SERVICE: &str = "
    bc000000 2500 0200 01000000 39300000    # len 188, NLM_F_MULTI, seq 1, pid 12345
    01 01 0000                              # NEW_SERVICE
    a800 0180                               # SERVICE | NLA_F_NESTED, 168 bytes
      0600 0100 | 0200 | 0000
      0600 0200 | 0600 | 0000
      1400 0300 | 0a640001 000000000000000000000000
      0600 0400 | 0050 | 0000
      0700 0600 | 6d6800 | 00
      0c00 0700 | 1a000000 ffffffff         #   FLAGS {HASHED|SCHED1|SCHED2, ~0}
      0800 0800 | 00000000
      0800 0900 | ffffffff
      1400 0a80                             #   STATS (32-bit) nest, 20 bytes: skipped
        0800 0100 | 03000000
        0800 0200 | 0a000000
      3800 0c80                             #   STATS64 nest, 56 bytes
        0400 0b00                           #     PAD
        0c00 0100 | 0300000000000000        #     CONNS = 3
        0c00 0200 | 0a00000000000000        #     INPKTS = 10
        0c00 0400 | 9808000000000000        #     INBYTES = 2200
        0c00 0500 | 0000000000000000        #     OUTBYTES = 0
      0800 1f00 | 01000000                  #   attribute 31: unknown, skipped
";

#[test]
fn kernel_service_dump_decodes() {
    let raw = split(&hex(KERNEL_SERVICE)).unwrap();
    assert_eq!(raw.len(), 1);
    assert_eq!(raw[0].flags, NLM_F_MULTI);
    let m = Message::decode(&raw[0].payload).unwrap();
    let mut want = Service::mh(svc4(), IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2);
    assert!(
        want.same_settings(&Service {
            flags: 0x1a,
            ..want.clone()
        }),
        "HASHED is the kernel's"
    );
    want.flags = 0x1a;
    assert_eq!(m.cmd, Command::NewService);
    assert_eq!(m.service, Some(SvcAttr::Full(want)));
    assert_eq!(m.dest, None);
    let stats = Stats {
        conns: 3,
        inpkts: 10,
        outpkts: 0,
        inbytes: 2200,
        outbytes: 0,
    };
    assert_eq!(m.stats, Some(stats));
}

/// A real server as the kernel dumps it (`ip_vs_genl_fill_dest`, 5.3+): the
/// dest nest only, with tunnel type/port/flags, connection counts, ADDR_FAMILY.
const KERNEL_DEST: &str = "
    a8000000 2500 0200 02000000 39300000    # len 168, NLM_F_MULTI, seq 2
    05 01 0000                              # NEW_DEST
    9400 0280                               # DEST | NLA_F_NESTED, 148 bytes
      1400 0100 | 0a010007 000000000000000000000000
      0600 0200 | 0050 | 0000
      0800 0300 | 02000000                  #   FWD_METHOD = TUNNEL
      0800 0400 | 05000000                  #   WEIGHT = 5
      0500 0d00 | 00 | 000000               #   TUN_TYPE = IPIP
      0600 0e00 | 0000 | 0000               #   TUN_PORT
      0600 0f00 | 0000 | 0000               #   TUN_FLAGS
      0800 0500 | 00000000
      0800 0600 | 00000000
      0800 0700 | 04000000                  #   ACTIVE_CONNS = 4
      0800 0800 | 00000000
      0800 0900 | 00000000
      0600 0b00 | 0200 | 0000               #   ADDR_FAMILY
      1c00 0c80                             #   STATS64, 28 bytes
        0c00 0100 | 0700000000000000        #     CONNS = 7
        0c00 0300 | 0200000000000000        #     OUTPKTS = 2
";

#[test]
fn kernel_dest_dump_decodes() {
    let raw = split(&hex(KERNEL_DEST)).unwrap();
    let m = Message::decode(&raw[0].payload).unwrap();
    assert_eq!(m.cmd, Command::NewDest);
    assert_eq!(m.service, None);
    let want = Dest::new(ip("10.1.0.7"), 80, Forward::Tunnel, 5);
    assert_eq!(m.dest, Some(DestAttr::Full(want)));
    assert_eq!(
        m.stats,
        Some(Stats {
            conns: 7,
            outpkts: 2,
            ..Stats::default()
        })
    );
}

#[test]
fn get_family_request_and_answer() {
    let req = "
        20000000 1000 0500 01000000 00000000    # len 32, GENL_ID_CTRL, REQUEST|ACK
        03 01 0000                              # CTRL_CMD_GETFAMILY, version 1
        0900 0200 | 4950565300 | 000000         # CTRL_ATTR_FAMILY_NAME = \"IPVS\"
    ";
    assert_eq!(ctrl::get_family("IPVS", 1), hex(req));
    // The kernel's answer (ctrl_fill_info): id, name, version, hdrsize,
    // maxattr, then an OPS nest this codec skips; then the ACK.
    let answer = "
        44000000 1000 0000 01000000 39300000    # len 68
        01 02 0000                              # CTRL_CMD_NEWFAMILY, version 2
        0600 0100 | 2500 | 0000                 # FAMILY_ID = 0x25
        0900 0200 | 4950565300 | 000000         # FAMILY_NAME = \"IPVS\"
        0800 0300 | 01000000                    # VERSION
        0800 0400 | 00000000                    # HDRSIZE
        0800 0500 | 06000000                    # MAXATTR
        0400 0680                               # OPS (empty nest)
        24000000 0200 0001 01000000 39300000    # NLMSG_ERROR, NLM_F_CAPPED; len 36
        00000000                                # error 0: ACK
        20000000 1000 0500 01000000 00000000    # the request's header
    ";
    let raw = split(&hex(answer)).unwrap();
    assert_eq!(raw.len(), 2);
    let fam = ctrl::Family::decode(&raw[0].payload).unwrap();
    assert_eq!(
        fam,
        ctrl::Family {
            name: "IPVS".into(),
            id: 0x25
        }
    );
    assert_eq!(raw[1].clone().answer().unwrap(), Answer::Ack);
    // The codec's own encoding of the answer decodes to the same value.
    let mine = split(&fam.encode(1)).unwrap();
    assert_eq!(ctrl::Family::decode(&mine[0].payload).unwrap(), fam);
}

#[test]
fn errors_and_done() {
    let enoent =
        "24000000 0200 0000 01000000 00000000 | feffffff | 20000000 1000 0500 01000000 00000000";
    let raw = split(&hex(enoent)).unwrap();
    assert_eq!(raw[0].clone().answer().unwrap(), Answer::Error(-2));
    let done = "14000000 0300 0200 07000000 00000000 | 00000000";
    assert_eq!(
        split(&hex(done)).unwrap()[0].clone().answer().unwrap(),
        Answer::Done
    );
    assert!(matches!(
        split(&hex("14000000 0300")),
        Err(DecodeError::Short { .. })
    ));
    assert!(matches!(
        split(&hex("ff000000 0300 0200 07000000 00000000")),
        Err(DecodeError::BadLength { .. })
    ));
}

#[test]
fn decode_errors_are_typed() {
    // A service with no AF.
    let no_af = hex("01 01 0000 | 0c00 0100 | 0600 0200 | 0600 | 0000");
    assert_eq!(
        Message::decode(&no_af),
        Err(DecodeError::Missing {
            within: "IPVS_CMD_ATTR_SERVICE",
            attr: IPVS_SVC_ATTR_AF
        })
    );
    // A port of 3 bytes.
    let bad_port = hex("
        01 01 0000 | 2c00 0100
          0600 0100 | 0200 | 0000
          0600 0200 | 0600 | 0000
          0800 0300 | 0a640001
          0700 0400 | 005000 | 00
          0700 0600 | 6d6800 | 00
    ");
    assert!(matches!(
        Message::decode(&bad_port),
        Err(DecodeError::AttrSize {
            attr: IPVS_SVC_ATTR_PORT,
            ..
        })
    ));
    assert!(matches!(
        Message::decode(&hex("63 01 0000")),
        Err(DecodeError::Value { .. })
    ));
}

const NEW_ADDR_V4: &str = "
    40000000 1400 0506 01000000 00000000    # len 64, RTM_NEWADDR, REQUEST|ACK|EXCL|CREATE
    02 20 00 00 01000000                    # ifaddrmsg: AF_INET, /32, lo (1)
    0800 0200 | 0a640001                    # IFA_LOCAL
    0800 0100 | 0a640001                    # IFA_ADDRESS
    0e00 0300 | 6c6f3a72696e676c6200 | 0000 # IFA_LABEL = \"lo:ringlb\"
    0800 0800 | 00020000                    # IFA_FLAGS = IFA_F_NOPREFIXROUTE
";

#[test]
fn vip_address_messages() {
    assert_eq!(addr::add(ip("10.100.0.1"), 1, 1), hex(NEW_ADDR_V4));
    let add6 = "
        48000000 1400 0506 02000000 00000000    # len 72
        0a 80 00 00 01000000                    # AF_INET6, /128, lo
        1400 0200 | fd000000000000000000000000000001
        1400 0100 | fd000000000000000000000000000001
        0800 0800 | 02020000                    # NOPREFIXROUTE | NODAD
    ";
    assert_eq!(addr::add(ip("fd00::1"), 1, 2), hex(add6));
    let del = "
        28000000 1500 0500 03000000 00000000    # len 40, RTM_DELADDR, REQUEST|ACK
        02 20 00 00 01000000
        0800 0200 | 0a640001
        0800 0100 | 0a640001
    ";
    assert_eq!(addr::del(ip("10.100.0.1"), 1, 3), hex(del));
    let dump = "18000000 1600 0103 04000000 00000000 | 00 00 00 00 00000000";
    assert_eq!(addr::dump(4), hex(dump));
}

#[test]
fn kernel_address_answers_tell_ringlb_vips_apart() {
    // What `ip addr` dumps for ringlb's VIP: IFA_ADDRESS, IFA_LOCAL, IFA_LABEL,
    // IFA_FLAGS, IFA_CACHEINFO (skipped).
    let ours = "
        54000000 1400 0200 04000000 39300000    # len 84, RTM_NEWADDR, MULTI
        02 20 80 00 01000000                    # flags8 = IFA_F_PERMANENT
        0800 0100 | 0a640001
        0800 0200 | 0a640001
        0e00 0300 | 6c6f3a72696e676c6200 | 0000
        0800 0800 | 80020000                    # PERMANENT | NOPREFIXROUTE
        1400 0600 | ffffffff ffffffff 10000000 10000000   # IFA_CACHEINFO
    ";
    let raw = split(&hex(ours)).unwrap();
    let a = addr::LocalAddr::decode(&raw[0].payload).unwrap();
    assert_eq!(a.addr, ip("10.100.0.1"));
    assert_eq!(a.label.as_deref(), Some(addr::LABEL));
    assert!(a.is_ringlb_vip());
    // 127.0.0.1/8 on lo, label "lo": not ours.
    let lo = "
        38000000 1400 0200 04000000 39300000    # len 56
        02 08 80 fe 01000000
        0800 0100 | 7f000001
        0800 0200 | 7f000001
        0700 0300 | 6c6f00 | 00
        0800 0800 | 80000000
    ";
    let raw = split(&hex(lo)).unwrap();
    let a = addr::LocalAddr::decode(&raw[0].payload).unwrap();
    assert_eq!((a.addr, a.prefix_len), (ip("127.0.0.1"), 8));
    assert!(!a.is_ringlb_vip());
    // An operator's /32 on lo without the marks: not ours either.
    let theirs = addr::LocalAddr {
        addr: ip("192.0.2.1"),
        prefix_len: 32,
        ifindex: 1,
        label: Some("lo".into()),
        flags: 0x80,
    };
    assert!(!theirs.is_ringlb_vip());
    let again = split(&theirs.encode(1)).unwrap();
    assert_eq!(addr::LocalAddr::decode(&again[0].payload).unwrap(), theirs);
}

#[test]
fn every_command_roundtrips() {
    let d = Dest::new(ip("fd00:1::5"), 443, Forward::Tunnel, 3);
    let s = Service::mh(svc6(), IP_VS_SVC_F_SCHED1);
    let mut with_stats = Message::new_service(s.clone());
    with_stats.stats = Some(Stats {
        conns: 1,
        inpkts: 2,
        outpkts: 3,
        inbytes: 4,
        outbytes: 5,
    });
    let mut dest_stats = Message::new_dest(svc6(), d.clone());
    dest_stats.stats = with_stats.stats;
    let fwmark = Message {
        cmd: Command::NewService,
        service: Some(SvcAttr::Fwmark {
            af: AF_INET,
            fwmark: 7,
        }),
        dest: None,
        stats: None,
    };
    for m in [
        Message::new_service(s.clone()),
        Message::set_service(s),
        Message::del_service(svc6()),
        Message::get_services(),
        Message::new_dest(svc6(), d.clone()),
        Message::set_dest(svc6(), d.clone()),
        Message::del_dest(svc6(), d.key),
        Message::get_dests(svc6()),
        with_stats,
        dest_stats,
        fwmark,
    ] {
        let bytes = m.encode(FAMILY, 42);
        let raw = split(&bytes).unwrap();
        assert_eq!(Message::decode(&raw[0].payload).unwrap(), m);
    }
}
