//! Our speaker (the `ringlb-edge speaker` binary) against a real gobgpd acting as the
//! ToR, in network namespaces: IPv4 and IPv6 sessions, with and without TCP MD5, and
//! the announced VIPs in gobgpd's RIB with their communities, large communities and
//! local-pref. Needs root; skips loudly otherwise.

mod bgp_support;

use std::path::Path;
use std::time::Duration;

use bgp_support::{Lab, TOR_V4, TOR_V6, edge_v4, edge_v6, wait_until};

const API_PORT: &str = "50061";

fn gobgp(lab: &Lab, args: &[&str]) -> String {
    let mut a = vec!["-p", API_PORT];
    a.extend_from_slice(args);
    lab.exec("tor", "gobgp", &a).unwrap_or_else(|e| e)
}

fn neighbor_toml(addr: &str, asn: u32, family: &str, password: Option<&str>) -> String {
    let pw = password
        .map(|p| format!("    auth-password = \"{p}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[[neighbors]]
  [neighbors.config]
    neighbor-address = "{addr}"
    peer-as = {asn}
{pw}  [neighbors.timers.config]
    hold-time = 3
    keepalive-interval = 1
    connect-retry = 1
    idle-hold-time-after-reset = 1
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "{family}"
"#
    )
}

fn start_gobgpd(lab: &mut Lab, neighbors: &str) -> usize {
    let conf = format!(
        "[global.config]\n  as = 65000\n  router-id = \"{TOR_V4}\"\n  port = 179\n{neighbors}"
    );
    let f = lab.write("gobgpd.toml", &conf).display().to_string();
    let api = format!("127.0.0.1:{API_PORT}");
    lab.spawn(
        "gobgpd",
        "tor",
        Path::new("gobgpd"),
        &[
            "-f",
            &f,
            "-t",
            "toml",
            "--api-hosts",
            &api,
            "--pprof-disable",
        ],
    )
}

fn run_interop(tag: &str, password: Option<&str>) {
    let mut lab = Lab::new(tag, 1);
    let nbrs = format!(
        "{}{}",
        neighbor_toml(&edge_v4(1), 65011, "ipv4-unicast", password),
        neighbor_toml(&edge_v6(1), 65000, "ipv6-unicast", password)
    );
    start_gobgpd(&mut lab, &nbrs);
    let pw = password
        .map(|p| format!("    password: {p}\n"))
        .unwrap_or_default();
    let yaml = format!(
        r#"routerId: {e1}
drainSeconds: 1
peers:
  - peerAddress: {TOR_V4}
    peerASN: 65000
    myASN: 65011
    holdTime: 3
    connectRetrySeconds: 1
    families: [ipv4]
{pw}    advertisements:
      - communities: ["65011:100"]
        largeCommunities: ["65011:1:2"]
  - peerAddress: {TOR_V6}
    peerASN: 65000
    myASN: 65000
    holdTime: 3
    connectRetrySeconds: 1
    families: [ipv6]
{pw}    advertisements:
      - localPref: 300
        communities: ["65000:6"]
        largeCommunities: ["65000:6:6"]
prefixes:
  - prefix: 10.91.100.1/32
  - prefix: 10.91.100.2/32
  - prefix: fd91:100::1/128
"#,
        e1 = edge_v4(1)
    );
    lab.start_speaker("edge1", "e1", &yaml);

    let up = wait_until(Duration::from_secs(20), || {
        let n = gobgp(&lab, &["neighbor"]);
        n.lines().filter(|l| l.contains("Establ")).count() == 2
    });
    assert!(
        up,
        "not Established at gobgpd:\n{}\n{}",
        gobgp(&lab, &["neighbor"]),
        lab.logs()
    );

    let mut rib4 = String::new();
    let ok4 = wait_until(Duration::from_secs(5), || {
        rib4 = gobgp(&lab, &["-j", "global", "rib", "-a", "ipv4"]);
        rib4.contains("10.91.100.1/32") && rib4.contains("10.91.100.2/32")
    });
    assert!(
        ok4,
        "IPv4 VIPs missing in gobgpd's RIB:\n{rib4}\n{}",
        lab.logs()
    );
    // 65011:100 = 65011 * 65536 + 100; large community as GoBGP prints it.
    for want in [
        "\"communities\":[4260560996]",
        "{\"ASN\":65011,\"LocalData1\":1,\"LocalData2\":2}",
        &format!("\"nexthop\":\"{}\"", edge_v4(1)),
        "\"as_paths\":[{\"segment_type\":2,\"num\":1,\"asns\":[65011]}]",
    ] {
        assert!(
            rib4.contains(want),
            "missing {want} in gobgpd IPv4 RIB:\n{rib4}"
        );
    }

    let mut rib6 = String::new();
    let ok6 = wait_until(Duration::from_secs(5), || {
        rib6 = gobgp(&lab, &["-j", "global", "rib", "-a", "ipv6"]);
        rib6.contains("fd91:100::1/128")
    });
    assert!(
        ok6,
        "IPv6 VIP missing in gobgpd's RIB:\n{rib6}\n{}",
        lab.logs()
    );
    for want in [
        "{\"type\":5,\"value\":300}",
        "\"communities\":[4259840006]",
        "{\"ASN\":65000,\"LocalData1\":6,\"LocalData2\":6}",
        &format!("\"nexthop\":\"{}\"", edge_v6(1)),
    ] {
        assert!(
            rib6.contains(want),
            "missing {want} in gobgpd IPv6 RIB:\n{rib6}"
        );
    }
}

#[test]
fn gobgp_ipv4_ebgp_and_ipv6_ibgp() {
    require_lab!("gobgpd", "gobgp");
    run_interop("gob", None);
}

#[test]
fn gobgp_with_md5() {
    require_lab!("gobgpd", "gobgp");
    require_md5!("gobgp md5 test");
    run_interop("gobmd5", Some("g0bgp-md5"));
}
