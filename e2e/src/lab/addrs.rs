//! The lab's address plan: every address, ASN and port of one region, which the
//! fabric ([`super::topology`]) builds and the configs ([`super::config`]) name.

/// The lab's addresses and numbers (IPv4 only; see docs/lab.md). One value describes
/// one region: a ToR with its edges, worker nodes and pods, all in `10.<net>.0.0/16`.
#[derive(Debug, Clone)]
pub struct Addrs {
    /// The second octet of every address of this region (210 for the default lab).
    pub net: u8,
    pub tor_fabric: String,
    pub tor_client_side: String,
    pub tor_pod_side: String,
    /// The far end of the ToR's `ve-cl` link: the client, or the core router's port
    /// when [`Addrs::uplink`] is set.
    pub client: String,
    pub edges: Vec<String>,
    /// The worker nodes' uplink addresses (on br-pod).
    pub nodes: Vec<String>,
    /// One pod per node: its IP, in its node's pod CIDR.
    pub pods: Vec<String>,
    /// Each node's pod CIDR (the ToR routes it to the node).
    pub pod_cidrs: Vec<String>,
    pub vip_range: String,
    pub vip_first: String,
    pub vip_last: String,
    pub tor_asn: u32,
    pub edge_asn: u32,
    /// The Service port; the node agent maps it to `target_port`.
    pub port: u16,
    /// The pods' port.
    pub target_port: u16,
    pub api_port: u16,
    /// `None`: the ToR's `ve-cl` link goes to a client namespace of this lab.
    /// `Some`: it goes to a router of a larger lab (the two-region lab's core), which
    /// the ToR peers with over BGP and uses as its default route.
    pub uplink: Option<Uplink>,
    /// A range of VIPs several regions announce (anycast): the ToR accepts /32s from
    /// it besides `vip_range`, and exports them to the core.
    pub anycast_range: Option<String>,
}

/// Where a region's ToR connects when it is one region of several: the namespace
/// and interface name of the far end (which takes [`Addrs::client`]) and its ASN.
#[derive(Debug, Clone)]
pub struct Uplink {
    pub ns: String,
    pub ifname: String,
    pub asn: u32,
}

impl Default for Addrs {
    fn default() -> Self {
        Addrs::region(210, 2, 2)
    }
}

impl Addrs {
    /// A region in `10.<net>.0.0/16` with `edges` edges and `nodes` worker nodes (one
    /// pod each): ToR `.0.1` (br-lb), `.1.1` (toward the client), `.2.1` (br-pod);
    /// edges `.0.11..`, nodes `.2.11..`, pod `i` in `.<2+i>.0/24`, VIPs from
    /// `.100.0/24`. The ToR's ASN is `65000 + 10 * (net - 210)`, the edges' one more.
    pub fn region(net: u8, edges: usize, nodes: usize) -> Addrs {
        let ip = |rest: &str| format!("10.{net}.{rest}");
        let tor_asn = 65000 + 10 * u32::from(net.saturating_sub(210));
        Addrs {
            net,
            tor_fabric: ip("0.1"),
            tor_client_side: ip("1.1"),
            tor_pod_side: ip("2.1"),
            client: ip("1.2"),
            edges: (1..=edges).map(|i| ip(&format!("0.{}", 10 + i))).collect(),
            nodes: (1..=nodes).map(|i| ip(&format!("2.{}", 10 + i))).collect(),
            pods: (1..=nodes)
                .map(|i| ip(&format!("{}.{}", 2 + i, 20 + i)))
                .collect(),
            pod_cidrs: (1..=nodes)
                .map(|i| ip(&format!("{}.0/24", 2 + i)))
                .collect(),
            vip_range: ip("100.0/24"),
            vip_first: ip("100.10"),
            vip_last: ip("100.250"),
            tor_asn,
            edge_asn: tor_asn + 1,
            port: 80,
            target_port: 8080,
            api_port: 6443,
            uplink: None,
            anycast_range: None,
        }
    }

    /// The same region, its ToR's `ve-cl` connected to `uplink` instead of a client.
    pub fn with_uplink(mut self, uplink: Uplink) -> Addrs {
        self.uplink = Some(uplink);
        self
    }

    /// The prefixes the ToR accepts /32 VIP routes from: the region's pool and the
    /// anycast range, if any.
    pub fn vip_ranges(&self) -> Vec<&str> {
        std::iter::once(self.vip_range.as_str())
            .chain(self.anycast_range.as_deref())
            .collect()
    }
}

impl Addrs {
    /// The IPVS lab's fabric (`ringlb-lab ipvs-vm`): the same, with a third worker
    /// node and pod, so that removing one backend leaves two whose flows must stay.
    pub fn three_workers() -> Addrs {
        Addrs::region(210, 2, 3)
    }
}
