//! What a user does on the real cluster after `helm install`, and what they look at:
//! a Deployment of agnhost (`netexec`: `/hostname` answers the pod's name,
//! `/clientip` the address the pod saw), `kubectl expose --type=LoadBalancer`, the
//! VIPs in the Service's status, the ToR's ECMP routes, and requests from the client.
//! Shared by `make demo` and the real-cluster tests.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::{RealCluster, plan};
use crate::lab::{Error, Result, wait_for};

/// The Deployment and Service name.
pub const WEB: &str = "web";
/// agnhost's HTTP port in the pods; the Service's port is 80.
pub const TARGET_PORT: u16 = 8080;

impl RealCluster {
    /// `kubectl create deployment web --image=<agnhost> --replicas=N -- /agnhost netexec
    /// --http-port=8080 --udp-port=-1`, kept off the edge nodes unless `on_edges`
    /// (a node affinity on `ringlb.io/edge`); waits until every replica is Ready.
    pub fn deploy_web(&self, replicas: u32, on_edges: bool) -> Result<String> {
        let out = self.kubectl(&[
            "create",
            "deployment",
            WEB,
            &format!("--image={}", plan::AGNHOST_IMAGE),
            &format!("--replicas={replicas}"),
            &format!("--port={TARGET_PORT}"),
            "--",
            "/agnhost",
            "netexec",
            &format!("--http-port={TARGET_PORT}"),
            "--udp-port=-1",
        ])?;
        if !on_edges {
            self.kubectl(&[
                "patch",
                "deployment",
                WEB,
                "--type=merge",
                "-p",
                r#"{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"ringlb.io/edge","operator":"DoesNotExist"}]}]}}}}}}}"#,
            ])?;
        }
        self.kubectl(&[
            "rollout",
            "status",
            &format!("deployment/{WEB}"),
            "--timeout=120s",
        ])?;
        Ok(out)
    }

    /// `kubectl expose deployment web --type=LoadBalancer --port=80 --target-port=8080`,
    /// then asks for both families (`ipFamilyPolicy: PreferDualStack`), as a dual-stack
    /// user would.
    pub fn expose_web(&self) -> Result<String> {
        let out = self.kubectl(&[
            "expose",
            "deployment",
            WEB,
            "--type=LoadBalancer",
            "--port=80",
            &format!("--target-port={TARGET_PORT}"),
        ])?;
        self.kubectl(&[
            "patch",
            "service",
            WEB,
            "--type=merge",
            "-p",
            r#"{"spec":{"ipFamilyPolicy":"PreferDualStack"}}"#,
        ])?;
        Ok(out)
    }

    /// The Service's ingress IPs once it has one of each family.
    pub fn wait_vips(&self, svc: &str, limit: Duration) -> Result<(IpAddr, IpAddr)> {
        wait_for(
            &format!("Service {svc} to get an IPv4 and an IPv6 VIP"),
            limit,
            Duration::from_millis(200),
            || {
                let out = self.kubectl(&[
                    "get",
                    "service",
                    svc,
                    "-o",
                    "jsonpath={.status.loadBalancer.ingress[*].ip}",
                ])?;
                let ips: Vec<IpAddr> = out
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                let v4 = ips.iter().find(|i| i.is_ipv4());
                let v6 = ips.iter().find(|i| i.is_ipv6());
                Ok(match (v4, v6) {
                    (Some(a), Some(b)) => Ok((*a, *b)),
                    _ => Err(out),
                })
            },
        )
    }

    /// Waits until the ToR's kernel has a route to `vip` with `n` next hops (ECMP).
    pub fn wait_ecmp(&self, vip: IpAddr, n: usize, limit: Duration) -> Result<Vec<IpAddr>> {
        let prefix = match vip {
            IpAddr::V4(_) => format!("{vip}/32"),
            IpAddr::V6(_) => format!("{vip}/128"),
        };
        wait_for(
            &format!("{n} next hops for {vip} at the ToR"),
            limit,
            Duration::from_millis(200),
            || {
                let hops = self.tor_next_hops(&prefix, vip.is_ipv6())?;
                Ok(if hops.len() == n {
                    Ok(hops)
                } else {
                    Err(format!("{hops:?}"))
                })
            },
        )
    }

    /// `GET http://<vip>/<path>` from the client.
    pub fn get(&self, vip: IpAddr, path: &str) -> Result<String> {
        let url = match vip {
            IpAddr::V4(_) => format!("http://{vip}/{path}"),
            IpAddr::V6(_) => format!("http://[{vip}]/{path}"),
        };
        self.curl(&url)
    }

    /// `n` requests for `/hostname` from the client, each a new connection: the pods
    /// that answered and how often; a failed request is an error.
    pub fn spread(&self, vip: IpAddr, n: usize) -> Result<BTreeMap<String, usize>> {
        let mut seen = BTreeMap::new();
        for _ in 0..n {
            let pod = self.get(vip, "hostname")?;
            *seen.entry(pod.trim().to_string()).or_insert(0) += 1;
        }
        Ok(seen)
    }

    /// The pods of the Deployment: name -> node.
    pub fn web_pods(&self) -> Result<BTreeMap<String, String>> {
        let out = self.kubectl(&[
            "get",
            "pods",
            "-l",
            &format!("app={WEB}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName} {end}",
        ])?;
        Ok(out
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(p, n)| (p.to_string(), n.to_string()))
            .collect())
    }

    /// The ToR's per-port counters that [`RealCluster::count_vip_sources`] installed:
    /// `<node>-reply` counts frames from that node whose source is a VIP (replies by
    /// DSR come from workers; none may come from an edge), `<node>-encap` IPIP and
    /// IP6IP6 frames from it (the edges' requests to the pods).
    pub fn vip_source_counters(&self) -> Result<BTreeMap<String, u64>> {
        let out = crate::lab::cmd::run_in(
            &self.plan.ns("tor"),
            &[
                "nft",
                "-j",
                "list",
                "counters",
                "table",
                "bridge",
                "ringlb_lab",
            ],
        )?;
        crate::lab::config::nft_counters(&out).map_err(|detail| Error::Parse {
            what: "nft -j list counters table bridge ringlb_lab".into(),
            detail,
        })
    }

    /// Installs the bridge-family nftables table of [`RealCluster::vip_source_counters`]
    /// in the ToR.
    pub fn count_vip_sources(&self) -> Result<()> {
        let mut rules = String::from("table bridge ringlb_lab {\n");
        for n in &self.plan.nodes {
            rules.push_str(&format!(
                "  counter {0}-reply {{ }}\n  counter {0}-encap {{ }}\n",
                n.name
            ));
        }
        rules.push_str("  chain input {\n    type filter hook input priority 0; policy accept;\n");
        for n in &self.plan.nodes {
            let port = n.tor_port();
            let name = &n.name;
            rules.push_str(&format!(
                "    iifname \"{port}\" ip saddr {v4} counter name \"{name}-reply\"\n\
                 \x20   iifname \"{port}\" ip6 saddr {v6} counter name \"{name}-reply\"\n\
                 \x20   iifname \"{port}\" ip protocol 4 counter name \"{name}-encap\"\n\
                 \x20   iifname \"{port}\" ip6 nexthdr 41 counter name \"{name}-encap\"\n",
                v4 = plan::POOL_V4_CIDR,
                v6 = plan::POOL_V6_CIDR,
            ));
        }
        rules.push_str("  }\n}\n");
        let path = self.dir.join("tor-counters.nft");
        super::node::write(&path, &rules)?;
        crate::lab::cmd::run_in(
            &self.plan.ns("tor"),
            &["nft", "-f", &path.display().to_string()],
        )?;
        Ok(())
    }
}
