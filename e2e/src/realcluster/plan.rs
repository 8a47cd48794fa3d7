//! The real cluster's address plan and every file it writes, as pure functions: the
//! nodes and their addresses, containerd's configuration, the CNI network, the
//! kubelet's configuration, the BIRD ToR, kube-apiserver's egress selector, the
//! cluster Services the harness provides itself (the API and DNS), and the chart's
//! values file. No I/O here, so all of it is unit-tested.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// kube-proxy's mode on every node (`--proxy-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables,
    Nftables,
    /// Needs the kernel's IPVS, which this host kernel lacks: refused at start with
    /// that reason (docs/real-cluster.md).
    Ipvs,
}

impl ProxyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
            ProxyMode::Ipvs => "ipvs",
        }
    }
}

impl std::str::FromStr for ProxyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "iptables" => Ok(ProxyMode::Iptables),
            "nftables" => Ok(ProxyMode::Nftables),
            "ipvs" => Ok(ProxyMode::Ipvs),
            other => Err(format!(
                "kube-proxy mode {other:?}: expected iptables, nftables or ipvs"
            )),
        }
    }
}

/// One node: a network namespace and a mount namespace with its own containerd,
/// kubelet and kube-proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// The Node's name (`e1`, `w1`, ...), also the suffix of its namespaces.
    pub name: String,
    /// An edge: labelled `ringlb.io/edge=true`, so the chart's edge DaemonSet runs
    /// on it and the BGPPeers select it; its ToR-side port runs an XDP program.
    pub edge: bool,
    /// 1-based; picks the pod CIDRs `10.244.<index>.0/24` and `fd00:10:244:<index>::/64`.
    pub index: u8,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    /// A bpffs at /sys/fs/bpf from the start, as systemd mounts it. The last worker
    /// has none (a tmpfs there, as on a node image without that mount): the chart's
    /// `mount-bpffs` init container must mount it.
    pub bpffs: bool,
}

impl NodePlan {
    pub fn pod_cidr_v4(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }
    pub fn pod_cidr_v6(&self) -> String {
        format!("fd00:10:244:{}::/64", self.index)
    }
    /// The ToR-side port of this node's link.
    pub fn tor_port(&self) -> String {
        format!("p-{}", self.name)
    }
}

/// The whole cluster's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Namespace prefix: `<prefix>-tor`, `<prefix>-client`, `<prefix>-<node>`.
    pub prefix: String,
    pub nodes: Vec<NodePlan>,
    pub proxy_mode: ProxyMode,
}

/// The fabric: every node's uplink and the ToR on one bridge in the ToR namespace.
pub const TOR_V4: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 254);
pub const TOR_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x31, 0, 0, 0, 0, 0, 0xfe);
/// The client's link to the ToR.
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 211, 1, 2);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x211, 1, 0, 0, 0, 0, 2);
pub const TOR_CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 211, 1, 1);
pub const TOR_CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x211, 1, 0, 0, 0, 0, 1);
/// The VIP pools the values file gives the chart.
pub const POOL_V4_FIRST: &str = "10.211.100.10";
pub const POOL_V4_LAST: &str = "10.211.100.250";
pub const POOL_V4_CIDR: &str = "10.211.100.0/24";
pub const POOL_V6_CIDR: &str = "fd00:211:100::/120";
pub const POOL_V6_FIRST: &str = "fd00:211:100::10";
pub const POOL_V6_LAST: &str = "fd00:211:100::fa";
/// The port kube-apiserver is reached at on the fabric (a bridge in the ToR) and
/// through the `kubernetes` Service.
pub const API_PORT: u16 = 6443;
/// Service CIDRs (the control plane's defaults) and the DNS Service's address.
pub const SERVICE_CIDRS: [&str; 2] = ["10.96.0.0/16", "fd00:10:96::/112"];
pub const CLUSTER_CIDRS: &str = "10.244.0.0/16,fd00:10:244::/56";
pub const DNS_V4: &str = "10.96.0.10";
pub const KUBERNETES_V4: &str = "10.96.0.1";
pub const KUBERNETES_V6: &str = "fd00:10:96::1";
pub const TOR_ASN: u32 = 65000;
pub const EDGE_ASN: u32 = 65001;
/// The images the nodes hold (docker archives imported into every containerd).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
pub const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.56";

impl Plan {
    /// `edges` edge nodes (`e1..`) then `workers` worker nodes (`w1..`).
    pub fn new(prefix: &str, edges: u8, workers: u8, proxy_mode: ProxyMode) -> Plan {
        let mut nodes = Vec::new();
        for i in 1..=edges {
            nodes.push(node(format!("e{i}"), true, i, 10 + i));
        }
        for i in 1..=workers {
            let mut n = node(format!("w{i}"), false, edges + i, 20 + i);
            n.bpffs = i != workers;
            nodes.push(n);
        }
        Plan {
            prefix: prefix.to_string(),
            nodes,
            proxy_mode,
        }
    }

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    pub fn edges(&self) -> impl Iterator<Item = &NodePlan> {
        self.nodes.iter().filter(|n| n.edge)
    }

    pub fn workers(&self) -> impl Iterator<Item = &NodePlan> {
        self.nodes.iter().filter(|n| !n.edge)
    }

    pub fn node(&self, name: &str) -> Option<&NodePlan> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

fn node(name: String, edge: bool, index: u8, host: u8) -> NodePlan {
    NodePlan {
        name,
        edge,
        index,
        v4: Ipv4Addr::new(172, 31, 0, host),
        // the same digits as the IPv4 host part: fd00:31::11 for 172.31.0.11
        v6: Ipv6Addr::new(
            0xfd00,
            0x31,
            0,
            0,
            0,
            0,
            0,
            (host / 10 * 16 + host % 10) as u16,
        ),
        bpffs: true,
    }
}

/// containerd's own default configuration (`containerd config default`) with one
/// node's folders, socket and CNI folder, the pause image built here, and
/// `restrict_oom_score_adj = true` (this sandbox lacks CAP_SYS_RESOURCE, without which
/// runc fails every pod sandbox). An error names a setting the default no longer has.
pub fn containerd_config(default: &str, dir: &Path) -> Result<String, String> {
    let d = dir.display();
    let edits: [(&str, String); 7] = [
        ("root = ", format!("root = \"{d}/containerd/root\"")),
        ("state = ", format!("state = \"{d}/containerd/state\"")),
        (
            "address = \"/run/containerd/containerd.sock\"",
            format!("address = \"{d}/containerd.sock\""),
        ),
        (
            "sandbox_image = ",
            format!("sandbox_image = \"{PAUSE_IMAGE}\""),
        ),
        ("bin_dir = ", "bin_dir = \"/usr/lib/cni\"".to_string()),
        ("conf_dir = ", format!("conf_dir = \"{d}/cni/net.d\"")),
        (
            "restrict_oom_score_adj = ",
            "restrict_oom_score_adj = true".to_string(),
        ),
    ];
    let mut out = Vec::new();
    let mut seen = [false; 7];
    for line in default.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        match edits.iter().position(|(key, _)| trimmed.starts_with(key)) {
            // only the first `root =` / `state =` (the top-level ones) and the grpc address
            Some(i) if !seen[i] || (i != 0 && i != 1) => {
                seen[i] = true;
                out.push(format!("{indent}{}", edits[i].1));
            }
            _ => out.push(line.to_string()),
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(format!(
            "containerd's default configuration has no `{}` line to set",
            edits[i].0.trim()
        ));
    }
    Ok(out.join("\n") + "\n")
}

/// The node's CNI network: the reference `bridge` plugin (bridge `cni0`, the pods'
/// gateway) with `host-local` addresses from both pod CIDRs, and `portmap`. No
/// masquerade: the ToR routes the pod CIDRs, so pods keep their addresses on the
/// fabric, as on a routed bare-metal cluster.
pub fn cni_conflist(n: &NodePlan, dir: &Path) -> String {
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "ringlb-lab",
  "plugins": [
    {{
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {{
        "type": "host-local", "dataDir": "{ipam}",
        "ranges": [[{{"subnet": "{v4}"}}], [{{"subnet": "{v6}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}, {{"dst": "::/0"}}]
      }}
    }},
    {{ "type": "portmap", "capabilities": {{"portMappings": true}} }}
  ]
}}
"#,
        ipam = dir.join("cni/ipam").display(),
        v4 = n.pod_cidr_v4(),
        v6 = n.pod_cidr_v6(),
    )
}

/// The kubelet's configuration: this node's containerd, cgroupfs under its own
/// cgroup root (the host has cgroup v1), webhook authentication and authorization
/// (kube-apiserver authenticates with its client certificate, signed by `ca`), the
/// cluster DNS, and eviction thresholds that a shared test machine does not trip.
pub fn kubelet_config(n: &NodePlan, dir: &Path, cgroup_root: &str, ca: &Path) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{sock}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failCgroupV1: false
failSwapOn: false
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
clusterDNS: [{DNS_V4}]
clusterDomain: cluster.local
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
resolvConf: /etc/resolv.conf
serializeImagePulls: false
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podPidsLimit: -1
"#,
        sock = dir.join("containerd.sock").display(),
        ca = ca.display(),
    ) + &format!("# node {}\n", n.name)
}

/// BIRD 2 as the ToR: static routes to every node's pod CIDRs, eBGP (IPv4 and IPv6
/// sessions) with every edge accepting only host routes from the VIP pools, and the
/// kernel table with ECMP (`merge paths`).
pub fn bird_conf(p: &Plan) -> String {
    let mut s = format!(
        r#"# BIRD 2 as the real cluster's top-of-rack router (written by ringlb-lab).
log stderr all;
timeformat protocol "%F %T.%3f";
router id {TOR_V4};

protocol device {{ scan time 2; }}

protocol bfd {{
	interface "*" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }};
}}

protocol kernel kernel4 {{
	merge paths on limit 16;
	learn off;
	persist off;
	ipv4 {{ import none; export all; }};
}}

protocol kernel kernel6 {{
	merge paths on limit 16;
	learn off;
	persist off;
	ipv6 {{ import none; export all; }};
}}

protocol static pods4 {{
	ipv4;
"#
    );
    for n in &p.nodes {
        s.push_str(&format!("\troute {} via {};\n", n.pod_cidr_v4(), n.v4));
    }
    s.push_str("}\n\nprotocol static pods6 {\n\tipv6;\n");
    for n in &p.nodes {
        s.push_str(&format!("\troute {} via {};\n", n.pod_cidr_v6(), n.v6));
    }
    s.push_str(&format!(
        r#"}}

template bgp edge4 {{
	local {TOR_V4} as {TOR_ASN};
	direct;
	graceful restart on;
	bfd on;
	hold time 9;
	connect retry time 1;
	error wait time 1, 5;
	ipv4 {{ import filter {{ if net ~ [ {POOL_V4_CIDR}{{32,32}} ] then accept; reject; }}; export none; }};
}}

template bgp edge6 {{
	local {TOR_V6} as {TOR_ASN};
	direct;
	graceful restart on;
	hold time 9;
	connect retry time 1;
	error wait time 1, 5;
	ipv6 {{ import filter {{ if net ~ [ {POOL_V6_CIDR}{{128,128}} ] then accept; reject; }}; export none; }};
}}
"#
    ));
    for n in p.edges() {
        s.push_str(&format!(
            "\nprotocol bgp {name}v4 from edge4 {{ neighbor {v4} as {EDGE_ASN}; }}\n\
             protocol bgp {name}v6 from edge6 {{ neighbor {v6} as {EDGE_ASN}; }}\n",
            name = n.name,
            v4 = n.v4,
            v6 = n.v6,
        ));
    }
    s
}

/// kube-apiserver's egress selector: connections to nodes, pods and Services
/// (`kubectl logs/exec`, proxy) go through an HTTP CONNECT proxy on a unix socket,
/// which dials them from inside the fabric (the API server itself runs on the
/// host's loopback).
pub fn egress_selector(sock: &Path) -> String {
    format!(
        r#"apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: {}
"#,
        sock.display()
    )
}

/// What the harness provides in place of in-cluster add-ons: the `kubernetes`
/// Service's endpoints (the API bridge on the ToR; kube-apiserver runs with
/// `--endpoint-reconciler-type=none` because its own address is the host's
/// loopback), and the `kube-dns` Service with CoreDNS on the ToR as its endpoint.
pub fn cluster_services() -> String {
    format!(
        r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-fabric
  namespace: default
  labels:
    kubernetes.io/service-name: kubernetes
    endpointslice.kubernetes.io/managed-by: ringlb-lab
addressType: IPv4
endpoints:
- addresses: ["{TOR_V4}"]
  conditions: {{ready: true}}
ports:
- name: https
  port: {API_PORT}
  protocol: TCP
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  clusterIP: {DNS_V4}
  ports:
  - {{name: dns, port: 53, protocol: UDP}}
  - {{name: dns-tcp, port: 53, protocol: TCP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-tor
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: ringlb-lab
addressType: IPv4
endpoints:
- addresses: ["{TOR_V4}"]
  conditions: {{ready: true}}
ports:
- {{name: dns, port: 53, protocol: UDP}}
- {{name: dns-tcp, port: 53, protocol: TCP}}
"#
    )
}

/// CoreDNS on the ToR: the cluster zone from the API (as kubeadm's Corefile does),
/// nothing forwarded off the machine.
pub fn corefile(kubeconfig: &Path) -> String {
    format!(
        r#".:53 {{
    bind {TOR_V4}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"#,
        kubeconfig.display()
    )
}

/// The one values file `helm install` gets: the edges' uplink, the VIP pools, the
/// IPv4 and IPv6 BGP sessions to the ToR (BFD 100 ms x 3 on the IPv4 one, which the
/// ToR's `bfd on` follows) and an advertisement of every pool to it.
pub fn values_yaml(extra: &str) -> String {
    format!(
        r#"# The real cluster's values (written by ringlb-lab; docs/real-cluster.md).
edge:
  interface: eth0
  mtu: 1500
controller:
  logLevel: info,kube=warn
pools:
  - name: lab-v4
    spec:
      ranges:
        - {{start: {POOL_V4_FIRST}, end: {POOL_V4_LAST}}}
      autoAssign: true
  - name: lab-v6
    spec:
      ranges:
        - {{start: "{POOL_V6_FIRST}", end: "{POOL_V6_LAST}"}}
      autoAssign: true
bgpPeers:
  - name: tor-v4
    labels: {{role: tor}}
    spec:
      peerAddress: {TOR_V4}
      peerASN: {TOR_ASN}
      myASN: {EDGE_ASN}
      holdTime: 9
      bfd: {{minRxMs: 100, minTxMs: 100, multiplier: 3}}
      nodeSelector:
        matchLabels: {{ringlb.io/edge: "true"}}
  - name: tor-v6
    labels: {{role: tor}}
    spec:
      peerAddress: "{TOR_V6}"
      peerASN: {TOR_ASN}
      myASN: {EDGE_ASN}
      holdTime: 9
      nodeSelector:
        matchLabels: {{ringlb.io/edge: "true"}}
bgpAdvertisements:
  - name: tor
    spec:
      peerSelector:
        matchLabels: {{role: tor}}
{extra}"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = false
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.snapshotter.v1.devmapper"]
    root_path = ""
  [plugins."io.containerd.internal.v1.opt"]
    path = "/opt/containerd"
    state = "/other"
"#;

    #[test]
    fn containerd_config_sets_the_nodes_folders_and_the_sandbox_settings() {
        let c = containerd_config(DEFAULT, Path::new("/x/e1")).unwrap();
        assert!(c.contains("root = \"/x/e1/containerd/root\""), "{c}");
        assert!(c.contains("state = \"/x/e1/containerd/state\""), "{c}");
        assert!(c.contains("  address = \"/x/e1/containerd.sock\""), "{c}");
        assert!(c.contains("restrict_oom_score_adj = true"), "{c}");
        assert!(
            c.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")),
            "{c}"
        );
        assert!(c.contains("bin_dir = \"/usr/lib/cni\""), "{c}");
        assert!(c.contains("conf_dir = \"/x/e1/cni/net.d\""), "{c}");
        // a later `state =` (another plugin's) is left alone
        assert!(c.contains("state = \"/other\""), "{c}");
        assert!(c.contains("root_path = \"\""), "{c}");
        let e = containerd_config("version = 2\n", Path::new("/x")).unwrap_err();
        assert!(e.contains("root ="), "{e}");
    }

    #[test]
    fn the_plan_numbers_edges_then_workers() {
        let p = Plan::new("rc1", 2, 2, ProxyMode::Iptables);
        let names: Vec<_> = p.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["e1", "e2", "w1", "w2"]);
        let w2 = p.node("w2").unwrap();
        assert_eq!(w2.v4, Ipv4Addr::new(172, 31, 0, 22));
        assert_eq!(w2.pod_cidr_v4(), "10.244.4.0/24");
        assert_eq!(w2.pod_cidr_v6(), "fd00:10:244:4::/64");
        assert_eq!(p.edges().count(), 2);
        let no_bpffs: Vec<_> = p
            .nodes
            .iter()
            .filter(|n| !n.bpffs)
            .map(|n| &n.name)
            .collect();
        assert_eq!(no_bpffs, ["w2"]);
        assert_eq!(p.ns("tor"), "rc1-tor");
        assert_eq!("nftables".parse::<ProxyMode>(), Ok(ProxyMode::Nftables));
        assert!("userspace".parse::<ProxyMode>().is_err());
    }

    #[test]
    fn bird_routes_every_pod_cidr_and_peers_with_every_edge_in_both_families() {
        let p = Plan::new("rc1", 2, 2, ProxyMode::Iptables);
        let c = bird_conf(&p);
        assert!(c.contains("route 10.244.3.0/24 via 172.31.0.21;"), "{c}");
        assert!(
            c.contains("route fd00:10:244:4::/64 via fd00:31::22;"),
            "{c}"
        );
        assert!(c.contains("protocol bgp e2v4 from edge4 { neighbor 172.31.0.12 as 65001; }"));
        assert!(c.contains("protocol bgp e1v6 from edge6 { neighbor fd00:31::11 as 65001; }"));
        assert!(!c.contains("w1v4"), "workers run no BGP");
    }

    #[test]
    fn cni_gives_both_families_and_the_kubelet_its_containerd() {
        let p = Plan::new("rc1", 2, 2, ProxyMode::Iptables);
        let n = p.node("w1").unwrap();
        let c = cni_conflist(n, Path::new("/d/w1"));
        let v: serde_json::Value = serde_json::from_str(&c).unwrap();
        assert_eq!(
            v["plugins"][0]["ipam"]["ranges"][1][0]["subnet"],
            "fd00:10:244:3::/64"
        );
        let k = kubelet_config(n, Path::new("/d/w1"), "/rc1-w1", Path::new("/d/ca.crt"));
        let y: serde_yaml::Value = serde_yaml::from_str(&k).unwrap();
        assert_eq!(
            y["containerRuntimeEndpoint"],
            "unix:///d/w1/containerd.sock"
        );
        assert_eq!(y["cgroupRoot"], "/rc1-w1");
    }

    #[test]
    fn the_generated_yaml_parses() {
        for doc in cluster_services().split("\n---\n") {
            let _: serde_yaml::Value = serde_yaml::from_str(doc).unwrap();
        }
        let v: serde_yaml::Value = serde_yaml::from_str(&values_yaml("")).unwrap();
        assert_eq!(v["bgpPeers"][1]["spec"]["peerAddress"], "fd00:31::fe");
        assert_eq!(v["pools"][1]["spec"]["ranges"][0]["start"], POOL_V6_FIRST);
        let e: serde_yaml::Value =
            serde_yaml::from_str(&egress_selector(Path::new("/s.sock"))).unwrap();
        assert_eq!(
            e["egressSelections"][0]["connection"]["transport"]["uds"]["udsName"],
            "/s.sock"
        );
    }
}
