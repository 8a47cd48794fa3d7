//! Pure pieces of the lab: the BIRD configuration, the lab's Nodes and the Kubernetes
//! manifests the demo applies, and parsers for what `birdc`, `ip -j route` and `nft -j` print. No I/O here,
//! so all of it is unit-tested.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::addrs::Addrs;
use crate::controlplane::LabNode;

/// `a`'s VIP ranges as the members of a BIRD prefix set that matches their /32s:
/// `10.0.0.0/24{32,32}, ...`.
pub fn bird_vip_set(a: &Addrs) -> String {
    a.vip_ranges()
        .iter()
        .map(|r| format!("{r}{{32,32}}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The BGP timers of every session in the lab's BIRD configurations (a BIRD
/// `protocol bgp` body's lines): hold 3 s, and the waits short.
pub(crate) const BIRD_FAST_TIMERS: &str = concat!(
    "\thold time 3;\n",
    "\tkeepalive time 1;\n",
    "\tconnect delay time 1;\n",
    "\tconnect retry time 1;\n",
    "\terror wait time 1, 5;",
);

/// BIRD 2 as the ToR: eBGP to every edge, accept only /32s from the VIP range, install
/// them into the kernel as one multipath (ECMP) route.
pub fn bird_conf(a: &Addrs) -> String {
    let mut s = format!(
        r#"# BIRD 2 as the lab's top-of-rack router (written by ringlb-lab).
log stderr all;
timeformat protocol "%F %T.%3f";
router id {tor};

define VIP_RANGE = [ {vips} ];

protocol device {{ scan time 2; }}

# BFD toward the edges (100 ms x 3). A BGPPeer without `bfd` runs none on the edge:
# the session stays Down here, which `bfd on` ignores (only Up -> Down stops BGP).
protocol bfd {{
	interface "*" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};
	debug {{ states, events }};
}}

protocol kernel kernel4 {{
	merge paths on limit 16;   # ECMP: one kernel route with a nexthop per edge
	learn off;
	persist off;
	ipv4 {{
		import none;
		export filter {{ if source = RTS_BGP then accept; reject; }};
	}};
}}

template bgp edge {{
	local {tor} as {tor_asn};
	direct;
	graceful restart on;   # helper for edges whose BGPPeer sets gracefulRestart
	bfd on;                # not `bfd graceful`: a BFD failure flushes the edge at once
{BIRD_FAST_TIMERS}
	ipv4 {{
		import filter {{ if net ~ VIP_RANGE then accept; reject; }};
		export none;
	}};
}}
"#,
        tor = a.tor_fabric,
        tor_asn = a.tor_asn,
        vips = bird_vip_set(a),
    );
    for (i, ip) in a.edges.iter().enumerate() {
        s.push_str(&format!(
            "\nprotocol bgp edge{n} from edge {{ neighbor {ip} as {asn}; }}\n",
            n = i + 1,
            asn = a.edge_asn
        ));
    }
    if let Some(u) = &a.uplink {
        // one region of several: tell the core router the VIPs (next hop: this ToR)
        s.push_str(&format!(
            r#"
protocol bgp uplink {{
	local {me} as {tor_asn};
	neighbor {core} as {core_asn};
	direct;
{BIRD_FAST_TIMERS}
	ipv4 {{
		import none;
		export filter {{ if net ~ VIP_RANGE then accept; reject; }};
	}};
}}
"#,
            me = a.tor_client_side,
            tor_asn = a.tor_asn,
            core = a.client,
            core_asn = u.asn,
        ));
    }
    s
}

/// The Nodes the lab kubelet registers: the edges (labelled `ringlb.io/edge=true`,
/// which the BGPPeer selects; no pods) and the worker nodes, each holding the pod
/// whose namespace sits behind it (the kubelet gives it that pod's IP).
pub fn lab_nodes(a: &Addrs) -> Vec<LabNode> {
    let mut nodes: Vec<LabNode> = a
        .edges
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let n = LabNode::new(format!("edge{}", i + 1)).label("ringlb.io/edge", "true");
            match ip.parse() {
                Ok(ip) => n.address(ip),
                Err(_) => n,
            }
            .without_pods()
        })
        .collect();
    for (i, (ip, pod)) in a.nodes.iter().zip(&a.pods).enumerate() {
        let mut n = LabNode::new(format!("node{}", i + 1));
        if let Ok(ip) = ip.parse() {
            n = n.address(ip);
        }
        nodes.push(n.pod_ips(pod.parse().into_iter().collect()));
    }
    nodes
}

/// The value of metric `name` (no labels) in a Prometheus text exposition.
pub fn metric_value(body: &str, name: &str) -> Option<f64> {
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The manifests `ringlb-lab` applies with `kubectl apply -f`, as (file name, YAML).
pub fn manifests(a: &Addrs) -> Vec<(&'static str, String)> {
    vec![
        (
            "20-ippool.yaml",
            format!(
                "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: lab-vips\n  labels:\n    ringlb.io/pool: lab\nspec:\n  ranges:\n  - start: {}\n    end: {}\n",
                a.vip_first, a.vip_last
            ),
        ),
        (
            "30-bgppeer.yaml",
            format!(
                "apiVersion: ringlb.io/v1alpha1\nkind: BGPPeer\nmetadata:\n  name: tor\n  labels:\n    ringlb.io/peer: tor\nspec:\n  peerAddress: {}\n  peerASN: {}\n  myASN: {}\n  holdTime: 3\n  keepaliveTime: 1\n  nodeSelector:\n    matchLabels:\n      ringlb.io/edge: \"true\"\n",
                a.tor_fabric, a.tor_asn, a.edge_asn
            ),
        ),
        (
            "40-bgpadvertisement.yaml",
            "apiVersion: ringlb.io/v1alpha1\nkind: BGPAdvertisement\nmetadata:\n  name: lab\nspec:\n  ipPoolSelector:\n    matchLabels:\n      ringlb.io/pool: lab\n  peerSelector:\n    matchLabels:\n      ringlb.io/peer: tor\n  communities:\n  - \"65000:100\"\n".to_string(),
        ),
        (
            "50-deployment.yaml",
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels:\n    app: web\nspec:\n  replicas: {}\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n      - name: web\n        image: ringlb-lab/pod-http   # the lab runs `ringlb-lab pod-http` in each pod netns\n        ports:\n        - containerPort: {}\n",
                a.pods.len(),
                a.target_port
            ),
        ),
    ]
}

/// The next hops BIRD shows for a route (`birdc show route for VIP`): every
/// `via ADDR on DEV` line.
pub fn bird_next_hops(show_route: &str) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = show_route
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            while let Some(t) = w.next() {
                if t == "via" {
                    return w.next().and_then(|a| a.parse().ok());
                }
            }
            None
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The gateways of a kernel route from `ip -j route show PREFIX`: a multipath route's
/// `nexthops[].gateway`, or a single route's `gateway`.
pub fn kernel_next_hops(ip_json: &str) -> Result<Vec<IpAddr>, String> {
    let v: serde_json::Value =
        serde_json::from_str(ip_json.trim()).map_err(|e| format!("not JSON ({e}): {ip_json:?}"))?;
    let mut out = Vec::new();
    for route in v.as_array().into_iter().flatten() {
        if let Some(nhs) = route["nexthops"].as_array() {
            out.extend(
                nhs.iter()
                    .filter_map(|n| n["gateway"].as_str()?.parse::<IpAddr>().ok()),
            );
        } else if let Some(g) = route["gateway"].as_str().and_then(|g| g.parse().ok()) {
            out.push(g);
        }
    }
    out.sort();
    Ok(out)
}

/// Named counters' packet counts from `nft -j list counters table ...`.
pub fn nft_counters(nft_json: &str) -> Result<BTreeMap<String, u64>, String> {
    let v: serde_json::Value =
        serde_json::from_str(nft_json.trim()).map_err(|e| format!("not JSON ({e})"))?;
    let mut out = BTreeMap::new();
    for item in v["nftables"].as_array().into_iter().flatten() {
        if let Some(c) = item.get("counter")
            && let (Some(name), Some(packets)) = (c["name"].as_str(), c["packets"].as_u64())
        {
            out.insert(name.to_string(), packets);
        }
    }
    Ok(out)
}

/// The nftables ruleset of the ToR: named counters on the forward path that tell the
/// DSR story (requests in, IPIP per edge, replies out, replies that went to an edge).
pub fn nft_ruleset(a: &Addrs) -> String {
    let mut s = String::from("table inet ringlb_lab {\n");
    let mut counters = vec!["to_vip", "replies_to_client", "replies_toward_edges"];
    let ipip: Vec<String> = (1..=a.edges.len())
        .map(|i| format!("ipip_from_edge{i}"))
        .collect();
    counters.extend(ipip.iter().map(String::as_str));
    for c in &counters {
        s.push_str(&format!("  counter {c} {{ }}\n"));
    }
    s.push_str("  chain forward {\n    type filter hook forward priority 0; policy accept;\n");
    s.push_str(&format!(
        "    iifname \"ve-cl\" ip daddr {} counter name \"to_vip\"\n",
        a.vip_range
    ));
    for (i, e) in a.edges.iter().enumerate() {
        s.push_str(&format!(
            "    ip protocol 4 ip saddr {e} oifname \"br-pod\" counter name \"ipip_from_edge{}\"\n",
            i + 1
        ));
    }
    s.push_str(&format!(
        "    ip saddr {} iifname \"br-pod\" oifname \"ve-cl\" counter name \"replies_to_client\"\n",
        a.vip_range
    ));
    s.push_str(&format!(
        "    ip saddr {} oifname \"br-lb\" counter name \"replies_toward_edges\"\n",
        a.vip_range
    ));
    s.push_str("  }\n}\n");
    s
}

/// Which pod answered, per pod name, from the bodies `ringlb-lab pod-http` returns
/// (`NAME ADDR\n`).
pub fn count_answers<'a>(bodies: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for b in bodies {
        let name = b.split_whitespace().next().unwrap_or("(empty)").to_string();
        *m.entry(name).or_default() += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    #[test]
    fn metric_values_are_read_by_exact_name() {
        let body = "# HELP x\nringlb_node_local_pods 1\nringlb_node_local_pods_total 9\n";
        assert_eq!(metric_value(body, "ringlb_node_local_pods"), Some(1.0));
        assert_eq!(metric_value(body, "ringlb_node_service_entries"), None);
    }

    use super::*;
    use ringlb_crds::{BGPAdvertisement, BGPPeer, IPPool};

    #[test]
    fn bird_conf_has_a_session_per_edge_and_ecmp() {
        let a = Addrs::default();
        let c = bird_conf(&a);
        assert!(c.contains("merge paths on"));
        assert!(c.contains("router id 10.210.0.1;"));
        assert!(c.contains("protocol bfd {") && c.contains("\tbfd on;"));
        assert!(c.contains("protocol bgp edge1 from edge { neighbor 10.210.0.11 as 65001; }"));
        assert!(c.contains("protocol bgp edge2 from edge { neighbor 10.210.0.12 as 65001; }"));
        assert!(c.contains("[ 10.210.100.0/24{32,32} ]"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
        assert!(!c.contains("uplink"));
    }

    #[test]
    fn a_region_with_an_uplink_exports_its_vips_to_the_core() {
        use crate::lab::addrs::Uplink;
        let a = Addrs::region(220, 1, 2).with_uplink(Uplink {
            ns: "x-core".into(),
            ifname: "rb".into(),
            asn: 64900,
        });
        let c = bird_conf(&a);
        assert!(c.contains("router id 10.220.0.1;"));
        assert!(c.contains("protocol bgp edge1 from edge { neighbor 10.220.0.11 as 65101; }"));
        assert!(!c.contains("edge2"));
        assert!(c.contains("local 10.220.1.1 as 65100;"));
        assert!(c.contains("neighbor 10.220.1.2 as 64900;"));
        assert!(c.contains("export filter { if net ~ VIP_RANGE then accept; reject; };"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }

    #[test]
    fn lab_nodes_are_the_edges_and_the_workers_with_their_pod_ips() {
        let nodes = lab_nodes(&Addrs::default());
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["edge1", "edge2", "node1", "node2"]);
        assert_eq!(nodes[1].address, Some("10.210.0.12".parse().unwrap()));
        assert_eq!(nodes[0].labels["ringlb.io/edge"], "true");
        assert!(!nodes[0].runs_pods && !nodes[1].runs_pods && nodes[2].runs_pods);
        assert_eq!(nodes[3].address, Some("10.210.2.12".parse().unwrap()));
        assert_eq!(
            nodes[3].pod_ips,
            ["10.210.4.22".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    #[test]
    fn manifests_are_valid_ringlb_objects() {
        let a = Addrs::default();
        let m: BTreeMap<_, _> = manifests(&a).into_iter().collect();
        let pool: IPPool = serde_yaml::from_str(&m["20-ippool.yaml"]).unwrap();
        pool.spec.validate().unwrap();
        assert_eq!(pool.spec.ranges[0].start, "10.210.100.10");
        let peer: BGPPeer = serde_yaml::from_str(&m["30-bgppeer.yaml"]).unwrap();
        peer.spec.validate().unwrap();
        assert_eq!((peer.spec.peer_asn, peer.spec.my_asn), (65000, 65001));
        let adv: BGPAdvertisement = serde_yaml::from_str(&m["40-bgpadvertisement.yaml"]).unwrap();
        adv.spec.validate().unwrap();
        let dep: serde_json::Value = serde_yaml::from_str(&m["50-deployment.yaml"]).unwrap();
        assert_eq!(dep["spec"]["replicas"], 2);
        assert_eq!(
            dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
            8080
        );
    }

    #[test]
    fn bird_next_hops_reads_every_path() {
        let out = "Table master4:\n10.210.100.10/32    unicast [edge1 04:20:01.123] * (100) [AS65001i]\n\tvia 10.210.0.11 on br-lb\n                     unicast [edge2 04:20:01.456] (100) [AS65001i]\n\tvia 10.210.0.12 on br-lb\n";
        assert_eq!(
            bird_next_hops(out),
            vec![
                "10.210.0.11".parse::<IpAddr>().unwrap(),
                "10.210.0.12".parse().unwrap()
            ]
        );
        assert!(bird_next_hops("Network not found\n").is_empty());
    }

    #[test]
    fn kernel_next_hops_multipath_single_and_none() {
        let multi = r#"[{"dst":"10.210.100.10","protocol":"bird","metric":32,"flags":[],"nexthops":[{"gateway":"10.210.0.11","dev":"br-lb","weight":1,"flags":[]},{"gateway":"10.210.0.12","dev":"br-lb","weight":1,"flags":[]}]}]"#;
        assert_eq!(kernel_next_hops(multi).unwrap().len(), 2);
        let single = r#"[{"dst":"10.210.100.10","gateway":"10.210.0.12","dev":"br-lb","protocol":"bird","metric":32,"flags":[]}]"#;
        assert_eq!(
            kernel_next_hops(single).unwrap(),
            vec!["10.210.0.12".parse::<IpAddr>().unwrap()]
        );
        assert!(kernel_next_hops("[ ]").unwrap().is_empty());
        assert!(kernel_next_hops("garbage").is_err());
    }

    #[test]
    fn nft_counters_and_ruleset() {
        let a = Addrs::default();
        let r = nft_ruleset(&a);
        assert!(r.contains("counter ipip_from_edge2 { }"));
        assert!(r.contains("ip protocol 4 ip saddr 10.210.0.11 oifname \"br-pod\""));
        let j = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"counter": {"family": "inet", "name": "to_vip", "table": "ringlb_lab", "handle": 1, "packets": 42, "bytes": 3000}}, {"counter": {"family": "inet", "name": "replies_toward_edges", "table": "ringlb_lab", "handle": 3, "packets": 0, "bytes": 0}}]}"#;
        let c = nft_counters(j).unwrap();
        assert_eq!(c["to_vip"], 42);
        assert_eq!(c["replies_toward_edges"], 0);
        assert!(nft_counters("{").is_err());
    }

    #[test]
    fn count_answers_by_pod_name() {
        let c = count_answers([
            "pod1 10.210.2.21\n",
            "pod2 10.210.2.22\n",
            "pod1 10.210.2.21\n",
            "",
        ]);
        assert_eq!(c["pod1"], 2);
        assert_eq!(c["pod2"], 1);
        assert_eq!(c["(empty)"], 1);
    }
}
