//! The guard's script, byte for byte. `ipvs/tests/guard_netns.rs` loads the same
//! builder's scripts into a real nftables and sends packets through them.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn key(addr: &str, port: u16, proto: Proto) -> ServiceKey {
    ServiceKey {
        addr: ip(addr),
        port,
        proto,
    }
}

fn range(addr: &str, prefix: u8) -> SourceRange {
    SourceRange::new(ip(addr), prefix).unwrap()
}

fn ranges(list: &[(&str, u8)]) -> Option<BTreeSet<SourceRange>> {
    Some(list.iter().map(|(a, p)| range(a, *p)).collect())
}

/// The lines every table starts with: the replacement idiom and the global counters.
const HEAD: &str = "add table inet ringlb_guard
delete table inet ringlb_guard
table inet ringlb_guard {
  counter drop_no_service {
  }
  counter drop_vip_icmp {
  }
  counter drop_vip_other {
  }
";

const TO_VIP4: &str = r#"  chain to_vip4 {
    ip daddr . meta l4proto . th dport vmap @ports4
    ip frag-off & 0x1fff != 0 accept
    icmp type { echo-request, destination-unreachable, time-exceeded } accept
    meta l4proto icmp counter name "drop_vip_icmp" drop
    meta l4proto { tcp, udp } counter name "drop_no_service" drop
    counter name "drop_vip_other" drop
  }
"#;

const TO_VIP6: &str = r#"  chain to_vip6 {
    ip6 daddr . meta l4proto . th dport vmap @ports6
    frag frag-off != 0 accept
    icmpv6 type { echo-request, destination-unreachable, packet-too-big, time-exceeded, parameter-problem, nd-neighbor-solicit, nd-neighbor-advert } accept
    meta l4proto ipv6-icmp counter name "drop_vip_icmp" drop
    meta l4proto { tcp, udp } counter name "drop_no_service" drop
    counter name "drop_vip_other" drop
  }
"#;

/// IPv4: a VIP:port open to every source, one with ranges (a range inside another
/// and one of the other family left out), one refusing every source (an empty
/// set), on two addresses.
#[test]
fn ipv4_open_restricted_and_closed_ports() {
    let admitted: Admitted = [
        (key("10.100.0.1", 80, Proto::Tcp), None),
        (
            key("10.100.0.1", 443, Proto::Tcp),
            ranges(&[
                ("192.0.2.0", 24),
                ("192.0.2.128", 25),
                ("203.0.113.7", 32),
                ("2001:db8::", 32),
            ]),
        ),
        (key("10.100.0.2", 53, Proto::Udp), Some(BTreeSet::new())),
    ]
    .into();
    let got = ruleset(&admitted);
    let want = HEAD.to_string()
        + r#"  counter src_10.100.0.1_tcp_443 {
  }
  counter src_10.100.0.2_udp_53 {
  }
  set addrs4 {
    type ipv4_addr
    elements = {
      10.100.0.1,
      10.100.0.2,
    }
  }
  map ports4 {
    type ipv4_addr . inet_proto . inet_service : verdict
    elements = {
      10.100.0.1 . tcp . 80 : accept,
      10.100.0.1 . tcp . 443 : jump src_10.100.0.1_tcp_443,
      10.100.0.2 . udp . 53 : jump src_10.100.0.2_udp_53,
    }
  }
  chain prerouting {
    type filter hook prerouting priority raw; policy accept;
    iif "lo" accept
    ip daddr @addrs4 jump to_vip4
  }
"# + TO_VIP4
        + r#"  chain src_10.100.0.1_tcp_443 {
    ip saddr { 192.0.2.0/24, 203.0.113.7/32 } accept
    counter name "src_10.100.0.1_tcp_443" drop
  }
  chain src_10.100.0.2_udp_53 {
    counter name "src_10.100.0.2_udp_53" drop
  }
}
"#;
    assert_eq!(got.script, want, "{}", got.script);
    assert_eq!(
        got.counters,
        BTreeMap::from([
            (
                "src_10.100.0.1_tcp_443".to_string(),
                key("10.100.0.1", 443, Proto::Tcp)
            ),
            (
                "src_10.100.0.2_udp_53".to_string(),
                key("10.100.0.2", 53, Proto::Udp)
            ),
        ])
    );
}

/// IPv6 only: no IPv4 set, map, chain or jump.
#[test]
fn ipv6_only() {
    let admitted: Admitted = [
        (key("2001:db8::5", 53, Proto::Udp), None),
        (
            key("2001:db8::5", 443, Proto::Tcp),
            ranges(&[("2001:db8:1::", 48), ("2001:db8:1:2::", 64)]),
        ),
    ]
    .into();
    let got = ruleset(&admitted);
    let want = HEAD.to_string()
        + r#"  counter src_2001-db8--5_tcp_443 {
  }
  set addrs6 {
    type ipv6_addr
    elements = {
      2001:db8::5,
    }
  }
  map ports6 {
    type ipv6_addr . inet_proto . inet_service : verdict
    elements = {
      2001:db8::5 . udp . 53 : accept,
      2001:db8::5 . tcp . 443 : jump src_2001-db8--5_tcp_443,
    }
  }
  chain prerouting {
    type filter hook prerouting priority raw; policy accept;
    iif "lo" accept
    ip6 daddr @addrs6 jump to_vip6
  }
"# + TO_VIP6
        + r#"  chain src_2001-db8--5_tcp_443 {
    ip6 saddr { 2001:db8:1::/48 } accept
    counter name "src_2001-db8--5_tcp_443" drop
  }
}
"#;
    assert_eq!(got.script, want, "{}", got.script);
}

/// Two Services on one IP, each port with its own ranges; and both families in
/// one table.
#[test]
fn one_ip_two_services_keep_their_own_ranges() {
    let admitted: Admitted = [
        (
            key("10.100.0.1", 80, Proto::Tcp),
            ranges(&[("10.0.0.0", 8)]),
        ),
        (
            key("10.100.0.1", 8080, Proto::Tcp),
            ranges(&[("192.168.1.0", 24)]),
        ),
        (key("2001:db8::5", 80, Proto::Tcp), None),
    ]
    .into();
    let got = ruleset(&admitted);
    let want = HEAD.to_string()
        + r#"  counter src_10.100.0.1_tcp_80 {
  }
  counter src_10.100.0.1_tcp_8080 {
  }
  set addrs4 {
    type ipv4_addr
    elements = {
      10.100.0.1,
    }
  }
  map ports4 {
    type ipv4_addr . inet_proto . inet_service : verdict
    elements = {
      10.100.0.1 . tcp . 80 : jump src_10.100.0.1_tcp_80,
      10.100.0.1 . tcp . 8080 : jump src_10.100.0.1_tcp_8080,
    }
  }
  set addrs6 {
    type ipv6_addr
    elements = {
      2001:db8::5,
    }
  }
  map ports6 {
    type ipv6_addr . inet_proto . inet_service : verdict
    elements = {
      2001:db8::5 . tcp . 80 : accept,
    }
  }
  chain prerouting {
    type filter hook prerouting priority raw; policy accept;
    iif "lo" accept
    ip daddr @addrs4 jump to_vip4
    ip6 daddr @addrs6 jump to_vip6
  }
"# + TO_VIP4
        + TO_VIP6
        + r#"  chain src_10.100.0.1_tcp_80 {
    ip saddr { 10.0.0.0/8 } accept
    counter name "src_10.100.0.1_tcp_80" drop
  }
  chain src_10.100.0.1_tcp_8080 {
    ip saddr { 192.168.1.0/24 } accept
    counter name "src_10.100.0.1_tcp_8080" drop
  }
}
"#;
    assert_eq!(got.script, want, "{}", got.script);
}

/// Nothing served: no table at all (no hook left on the packet path), removed
/// whether it exists or not.
#[test]
fn no_vip_is_no_table() {
    let got = ruleset(&Admitted::new());
    assert_eq!(
        got.script,
        "add table inet ringlb_guard\ndelete table inet ringlb_guard\n"
    );
    assert_eq!(got.script, removal());
    assert!(got.counters.is_empty());
}

/// The same state gives the same script whatever order it was built in.
#[test]
fn the_script_does_not_depend_on_insertion_order() {
    let entries = [
        (
            key("10.100.0.2", 80, Proto::Tcp),
            ranges(&[("10.0.0.0", 8)]),
        ),
        (key("2001:db8::1", 53, Proto::Udp), None),
        (key("10.100.0.1", 443, Proto::Tcp), None),
    ];
    let forward: Admitted = entries.iter().cloned().collect();
    let backward: Admitted = entries.iter().rev().cloned().collect();
    assert_eq!(ruleset(&forward), ruleset(&backward));
    assert_eq!(
        counter_name(&key("2001:db8::1", 53, Proto::Udp)),
        "src_2001-db8--1_udp_53"
    );
}
