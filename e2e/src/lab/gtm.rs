//! The two-region lab: two copies of the one-region lab ([`Topology`] + [`Cluster`],
//! each with its own control plane), a core router that hears both regions' VIPs over
//! BGP, a client, and PowerDNS ([`super::pdns`]) as the global traffic manager.
//!
//! ```text
//!        client 10.230.1.2          dns 10.230.2.53 (pdns_server, LUA records)
//!              \                      /
//!      +------------- core (BIRD, AS 64900, ECMP) --------------+
//!      | ra 10.210.1.2                           rb 10.220.1.2  |
//!      +-------|-------------------------------------|----------+
//!        region A: <prefix>-a-*               region B: <prefix>-b-*
//!        ToR 10.210.1.1 (AS 65000)            ToR 10.220.1.1 (AS 65100)
//!        edge1 10.210.0.11 (AS 65001)         edge1 10.220.0.11 (AS 65101)
//!        node1..N + pods 10.210.{3..}.2x      node1..N + pods 10.220.{3..}.2x
//!        control plane (API 10.210.0.1:6443)  control plane (API 10.220.0.1:6443)
//! ```
//!
//! Each region is the unit the one-region lab builds (`Addrs::region`), its ToR's
//! client link going to the core instead of a client namespace. The ToRs export
//! their regions' VIPs to the core; the core routes to the regions' fabric /24s
//! statically (PowerDNS probes the edges' health URLs there).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::addrs::{Addrs, Uplink};
use super::cmd::run_in;
use super::config::{self, BIRD_FAST_TIMERS};
use super::daemon::Daemon;
use super::netns::{self, Netns};
use super::{Cluster, Error, Result, Topology, wait_for};

/// The core's ASN.
pub const CORE_ASN: u32 = 64900;
pub const CLIENT: &str = "10.230.1.2";
pub const CORE_CLIENT_SIDE: &str = "10.230.1.1";
pub const DNS: &str = "10.230.2.53";
pub const CORE_DNS_SIDE: &str = "10.230.2.1";
/// The anycast range every region's ToR accepts, and the one VIP the Service
/// `anycast` gets in every region (from IPPool `anycast`, not auto-assigned).
pub const ANYCAST_RANGE: &str = "10.240.0.0/24";
pub const ANYCAST_VIP: &str = "10.240.0.10";
/// The Services' hold-down (`ringlb.io/health-hold-down`): a region that lost its
/// pods is healthy again only after its pods have been back this long.
pub const HOLD_DOWN_S: u64 = 5;
/// The Service that fails over across regions: in each region it names the other
/// region's VIP of the same Service (`ringlb.io/failover-vip`) and accepts it
/// (`ringlb.io/accept-failover-from`).
pub const FAILOVER_SVC: &str = "fo";

/// Region `name` (`a`, `b`, ...) of the lab `prefix`: its namespaces are
/// `<prefix>-<name>-*`, its addresses `10.<net>.0.0/16`, its ToR linked to the core's
/// interface `r<name>`.
pub fn region_addrs(prefix: &str, name: &str, net: u8, edges: usize, nodes: usize) -> Addrs {
    let mut a = Addrs::region(net, edges, nodes).with_uplink(Uplink {
        ns: format!("{prefix}-core"),
        ifname: format!("r{name}"),
        asn: CORE_ASN,
    });
    a.anycast_range = Some(ANYCAST_RANGE.to_string());
    a
}

/// The manifests a region adds to the one-region lab's: IPPool `anycast` (only
/// [`ANYCAST_VIP`], never auto-assigned, announced like the lab's pool) and Service
/// `anycast` over the same pods, drawing from it; both get the hold-down.
pub fn region_manifests() -> Vec<(&'static str, String)> {
    vec![
        (
            "60-anycast-pool.yaml",
            format!(
                "apiVersion: ringlb.io/v1alpha1\nkind: IPPool\nmetadata:\n  name: anycast\n  labels:\n    ringlb.io/pool: lab\nspec:\n  autoAssign: false\n  ranges:\n  - start: {ANYCAST_VIP}\n    end: {ANYCAST_VIP}\n"
            ),
        ),
        (
            "70-anycast-service.yaml",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: anycast\n  annotations:\n    ringlb.io/ip-pool: anycast\n    ringlb.io/health-hold-down: {HOLD_DOWN_S}s\nspec:\n  type: LoadBalancer\n  selector:\n    app: web\n  ports:\n  - port: 80\n    targetPort: 8080\n"
            ),
        ),
    ]
}

/// Service [`FAILOVER_SVC`] over the same pods, from the lab's pool, with the
/// hold-down; applied after `web` has its VIP, so that `web` keeps the pool's first
/// address. Its failover annotations come once both regions' VIPs are known
/// ([`GtmLab::up`]).
pub fn failover_manifest() -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {FAILOVER_SVC}\n  annotations:\n    ringlb.io/health-hold-down: {HOLD_DOWN_S}s\nspec:\n  type: LoadBalancer\n  selector:\n    app: web\n  ports:\n  - port: 80\n    targetPort: 8080\n"
    )
}

/// BIRD on the core: eBGP to every region's ToR, accepting only /32s of that
/// region's VIP range, installed in the kernel (ECMP when several regions announce
/// one VIP).
pub fn core_bird_conf(regions: &[(&str, &Addrs)]) -> String {
    let mut s = format!(
        r#"# BIRD 2 as the two-region lab's core router (written by ringlb-lab).
log stderr all;
timeformat protocol "%F %T.%3f";
router id {CORE_CLIENT_SIDE};

protocol device {{ scan time 2; }}

protocol kernel kernel4 {{
	merge paths on limit 16;
	learn off;
	persist off;
	ipv4 {{
		import none;
		export filter {{ if source = RTS_BGP then accept; reject; }};
	}};
}}

template bgp tor {{
	direct;
{BIRD_FAST_TIMERS}
}}
"#
    );
    for (name, a) in regions {
        s.push_str(&format!(
            r#"
protocol bgp region_{name} from tor {{
	local {me} as {CORE_ASN};
	neighbor {tor} as {asn};
	ipv4 {{
		import filter {{ if net ~ [ {vips} ] then accept; reject; }};
		export none;
	}};
}}
"#,
            me = a.client,
            tor = a.tor_client_side,
            asn = a.tor_asn,
            vips = config::bird_vip_set(a),
        ));
    }
    s
}

/// The core's namespaces (`<prefix>-core`, `-client`, `-dns`), removed on drop.
#[derive(Debug)]
pub struct Core {
    pub prefix: String,
    pub dir: PathBuf,
    namespaces: Vec<Netns>,
    keep: bool,
}

impl Core {
    /// The core router, the client and the DNS namespace, linked to the core;
    /// leftovers of the lab `prefix` are removed first. The regions link themselves
    /// to the core when they are built ([`Core::region`]).
    pub fn up(prefix: &str, dir: &Path) -> Result<Core> {
        super::topology::teardown(prefix, dir);
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let mut c = Core {
            prefix: prefix.to_string(),
            dir: dir.to_path_buf(),
            namespaces: Vec::new(),
            keep: false,
        };
        for role in ["core", "client", "dns"] {
            let ns = c.ns(role);
            c.namespaces.push(Netns::create(&ns)?);
            // the core: loose, replies of an anycast VIP may come from either region
            let rpf = if role == "core" { "2" } else { "0" };
            netns::sysctls(
                &ns,
                &[
                    &format!("net.ipv4.conf.all.rp_filter={rpf}"),
                    &format!("net.ipv4.conf.default.rp_filter={rpf}"),
                ],
            )?;
        }
        let core = c.ns("core");
        netns::sysctls(
            &core,
            &[
                "net.ipv4.ip_forward=1",
                "net.ipv4.fib_multipath_hash_policy=3",
                "net.ipv4.fib_multipath_hash_fields=0x0037",
            ],
        )?;
        for (role, me, gw) in [
            ("client", CLIENT, CORE_CLIENT_SIDE),
            ("dns", DNS, CORE_DNS_SIDE),
        ] {
            let ns = c.ns(role);
            let port = format!("ve-{role}");
            netns::veth(&ns, "eth0", &core, &port, 1500)?;
            netns::addr(&ns, "eth0", &format!("{me}/24"))?;
            netns::addr(&core, &port, &format!("{gw}/24"))?;
            netns::default_route(&ns, gw)?;
            // veth leaves TCP checksums partial; the edges' XDP_TX would lose that
            run_in(&ns, &["ethtool", "-K", "eth0", "tx", "off"])?;
        }
        Ok(c)
    }

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    /// Leaves the namespaces and files in place when this value drops (`gtm-up`).
    pub fn keep(&mut self) {
        self.keep = true;
        self.namespaces.iter_mut().for_each(Netns::keep);
    }

    /// Builds region `name` on network `net` and links it to the core: its fabric,
    /// and the core's static route to the region's edges and API (`10.<net>.0.0/24`).
    pub fn region(&self, name: &str, net: u8, edges: usize, nodes: usize) -> Result<Topology> {
        let a = region_addrs(&self.prefix, name, net, edges, nodes);
        let dir = self.dir.join(name);
        let topo = Topology::up(&format!("{}-{name}", self.prefix), &dir, a.clone())?;
        let fabric = format!("10.{net}.0.0/24");
        run_in(
            &self.ns("core"),
            &["ip", "route", "add", &fabric, "via", &a.tor_client_side],
        )?;
        Ok(topo)
    }

    /// BIRD on the core, peering with every region's ToR; waits until it answers.
    pub fn start_bird(&self, regions: &[(&str, &Addrs)]) -> Result<Daemon> {
        let conf = self.dir.join("core-bird.conf");
        std::fs::write(&conf, core_bird_conf(regions))
            .map_err(Error::io(format!("writing {}", conf.display())))?;
        let (conf, ctl) = (conf.display().to_string(), self.bird_ctl());
        let mut d = Daemon::spawn(
            &self.dir,
            "core-bird",
            Some(&self.ns("core")),
            &["bird", "-f", "-c", &conf, "-s", &ctl],
            &[],
        )?;
        wait_for(
            "the core's BIRD to answer",
            Duration::from_secs(10),
            Duration::from_millis(100),
            || {
                d.check_alive()?;
                Ok(self.birdc(&["show", "status"]).map_err(|e| e.to_string()))
            },
        )?;
        Ok(d)
    }

    fn bird_ctl(&self) -> String {
        self.dir.join("core-bird.ctl").display().to_string()
    }

    /// `birdc` of the core.
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let ctl = self.bird_ctl();
        let mut argv = vec!["birdc", "-s", &ctl];
        argv.extend_from_slice(args);
        run_in(&self.ns("core"), &argv)
    }

    /// The core kernel's next hops for `vip` (empty: no route).
    pub fn next_hops(&self, vip: &str) -> Result<Vec<std::net::IpAddr>> {
        let json = run_in(&self.ns("core"), &["ip", "-j", "route", "show", vip])?;
        config::kernel_next_hops(&json).map_err(|detail| Error::Parse {
            what: "ip -j route".into(),
            detail,
        })
    }

    /// Waits until the core's kernel routes `vip` via exactly `hops`.
    pub fn wait_route(&self, vip: &str, hops: &[&str], limit: Duration) -> Result<()> {
        let mut want: Vec<std::net::IpAddr> = hops.iter().filter_map(|h| h.parse().ok()).collect();
        want.sort();
        wait_for(
            &format!("the core's route to {vip} via {hops:?}"),
            limit,
            Duration::from_millis(100),
            || {
                let got = self.next_hops(vip)?;
                Ok(if got == want {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                })
            },
        )
    }

    /// One HTTP GET from the client to `url`.
    pub fn http_get(&self, url: &str) -> Result<String> {
        run_in(
            &self.ns("client"),
            &["curl", "--noproxy", "*", "-sS", "--max-time", "5", url],
        )
    }

    /// `(status code, body)` of a GET from namespace `from` (the GTM's view).
    pub fn http_status(&self, from: &str, url: &str) -> Result<(u16, String)> {
        let out = run_in(
            &self.ns(from),
            &[
                "curl",
                "--noproxy",
                "*",
                "-sS",
                "--max-time",
                "3",
                "-w",
                "\n%{http_code}",
                url,
            ],
        )?;
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", out.as_str()));
        let code = code.trim().parse().map_err(|_| Error::Parse {
            what: format!("curl -w %{{http_code}} {url}"),
            detail: out.clone(),
        })?;
        Ok((code, body.to_string()))
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        self.namespaces.clear();
        if std::thread::panicking() {
            eprintln!("two-region lab files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Brings one region's programs up, as the one-region lab does: pods, BIRD, its
/// control plane, the controller, the manifests, the edges (XDP), the node agents, the
/// Service `web` (`kubectl expose`, then the hold-down annotation) and, with an
/// anycast range, Services `anycast` and [`FAILOVER_SVC`] ([`region_manifests`]);
/// waits until the node agents map the VIP and the ToR has a path through every edge
/// for each. Returns the VIPs of `web` and of [`FAILOVER_SVC`] (empty without an
/// anycast range).
pub fn start_region(topo: &Topology, cluster: &mut Cluster) -> Result<(String, String)> {
    let n_edges = topo.addrs.edges.len();
    cluster.start_pods()?;
    cluster.start_bird()?;
    cluster.start_control_plane()?;
    cluster.start_controller()?;
    let manifests = cluster.write_manifests()?;
    if topo.addrs.anycast_range.is_some() {
        for (name, yaml) in region_manifests() {
            let p = manifests.join(name);
            std::fs::write(&p, yaml).map_err(Error::io(format!("writing {}", p.display())))?;
        }
    }
    cluster.apply(&manifests)?;
    let pins: Vec<PathBuf> = (1..=n_edges).map(|i| topo.pin_dir(i)).collect();
    cluster.start_edges(&pins)?;
    cluster.wait_xdp(Duration::from_secs(30))?;
    let pins: Vec<PathBuf> = (1..=topo.addrs.nodes.len())
        .map(|i| topo.node_pin_dir(i))
        .collect();
    cluster.start_node_agents(&pins)?;
    cluster.wait_tc(Duration::from_secs(30))?;
    cluster.expose("web")?;
    let hold = format!(
        "{}={HOLD_DOWN_S}s",
        ringlb_crds::service::ANNOTATION_HOLD_DOWN
    );
    cluster.kubectl(&["annotate", "svc", "web", &hold])?;
    let vip = cluster.wait_vip("web", Duration::from_secs(30))?;
    cluster.wait_node_services(&vip, Duration::from_secs(30))?;
    cluster.wait_ecmp(&vip, n_edges, Duration::from_secs(30))?;
    if topo.addrs.anycast_range.is_some() {
        let any = cluster.wait_vip("anycast", Duration::from_secs(30))?;
        if any != ANYCAST_VIP {
            return Err(Error::Parse {
                what: "Service anycast's VIP".into(),
                detail: format!("{any}, want {ANYCAST_VIP}"),
            });
        }
        cluster.wait_ecmp(&any, n_edges, Duration::from_secs(30))?;
        let p = manifests.join("80-failover-service.yaml");
        std::fs::write(&p, failover_manifest())
            .map_err(Error::io(format!("writing {}", p.display())))?;
        cluster.apply(&p)?;
        let fo = cluster.wait_vip(FAILOVER_SVC, Duration::from_secs(30))?;
        cluster.wait_ecmp(&fo, n_edges, Duration::from_secs(30))?;
        return Ok((vip, fo));
    }
    Ok((vip, String::new()))
}

/// Each region's [`FAILOVER_SVC`] names the other's VIP as its failover VIP and
/// accepts it as an alias.
fn pair_failover(ca: &Cluster, fa: &str, cb: &Cluster, fb: &str) -> Result<()> {
    for (c, remote) in [(ca, fb), (cb, fa)] {
        let failover = format!("ringlb.io/failover-vip={remote}");
        let accept = format!("ringlb.io/accept-failover-from={remote}");
        c.kubectl(&["annotate", "svc", FAILOVER_SVC, &failover, &accept])?;
    }
    Ok(())
}

/// The whole two-region lab, running (`ringlb-lab gtm-up`). Fields drop in this
/// order: PowerDNS, the core's BIRD, region B's and A's programs, their fabrics, the
/// core.
#[derive(Debug)]
pub struct GtmLab {
    pub dns: super::pdns::PowerDns,
    pub core_bird: Daemon,
    pub cb: Cluster,
    pub ca: Cluster,
    pub topo_b: Topology,
    pub topo_a: Topology,
    pub core: Core,
    /// Service `web`'s VIP in region A and in region B.
    pub va: String,
    pub vb: String,
    /// Service [`FAILOVER_SVC`]'s VIP in region A and in region B.
    pub fa: String,
    pub fb: String,
}

impl GtmLab {
    /// Builds and starts everything: the core, regions A (`10.210/16`) and B
    /// (`10.220/16`) with 1 edge and 2 worker nodes each (started in parallel), the
    /// core's BIRD, PowerDNS probing both edges; waits until the core routes both VIPs
    /// and PowerDNS answers both.
    pub fn up(prefix: &str, dir: &Path, bins: &super::Bins) -> Result<GtmLab> {
        let core = Core::up(prefix, dir)?;
        let topo_a = core.region("a", 210, 1, 2)?;
        let topo_b = core.region("b", 220, 1, 2)?;
        let mut ca = Cluster::new(&topo_a, bins.clone());
        let mut cb = Cluster::new(&topo_b, bins.clone());
        // each region takes failover traffic from the other's edges only
        ca.failover_senders = topo_b.addrs.edges.clone();
        cb.failover_senders = topo_a.addrs.edges.clone();
        let (va, vb) = std::thread::scope(|s| {
            let a = s.spawn(|| start_region(&topo_a, &mut ca));
            let b = s.spawn(|| start_region(&topo_b, &mut cb));
            let join = |h: std::thread::ScopedJoinHandle<'_, Result<(String, String)>>| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Unsupported("a region thread panicked".into())))
            };
            (join(a), join(b))
        });
        let logs = |e: Error| {
            Error::Unsupported(format!(
                "starting the regions: {e}\n{}{}",
                ca.log_tails(15),
                cb.log_tails(15)
            ))
        };
        let ((va, fa), (vb, fb)) = (va.map_err(logs)?, vb.map_err(logs)?);
        pair_failover(&ca, &fa, &cb, &fb)?;
        let core_bird = core.start_bird(&[("a", &topo_a.addrs), ("b", &topo_b.addrs)])?;
        core.wait_route(
            &va,
            &[&topo_a.addrs.tor_client_side],
            Duration::from_secs(20),
        )?;
        core.wait_route(
            &vb,
            &[&topo_b.addrs.tor_client_side],
            Duration::from_secs(20),
        )?;
        let port = super::cluster::EDGE_HTTP_PORT;
        let targets = [
            super::pdns::Target::new(&va, &topo_a.addrs.edges[0], port, topo_a.addrs.port),
            super::pdns::Target::new(&vb, &topo_b.addrs.edges[0], port, topo_b.addrs.port),
        ];
        let listen = DNS
            .parse()
            .map_err(|e| Error::Unsupported(format!("{DNS}: {e}")))?;
        let dns = super::pdns::PowerDns::start(
            &core.ns("dns"),
            listen,
            &dir.join("pdns"),
            dir,
            &targets,
        )?;
        let client = core.ns("client");
        let mut want = vec![va.clone(), vb.clone()];
        want.sort();
        wait_for(
            "PowerDNS to answer both regions' VIPs",
            Duration::from_secs(20),
            Duration::from_millis(100),
            || {
                let got = dns.app_addresses(&client)?;
                Ok(if got == want {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                })
            },
        )?;
        Ok(GtmLab {
            dns,
            core_bird,
            cb,
            ca,
            topo_b,
            topo_a,
            core,
            va,
            vb,
            fa,
            fb,
        })
    }

    /// Leaves everything running when this value drops.
    pub fn keep(&mut self) {
        self.dns.daemon.keep();
        self.core_bird.keep();
        self.ca.keep();
        self.cb.keep();
        self.topo_a.keep();
        self.topo_b.keep();
        self.core.keep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_peers_with_each_regions_tor_and_takes_only_its_vips() {
        let a = region_addrs("x", "a", 210, 1, 2);
        let b = region_addrs("x", "b", 220, 1, 2);
        assert_eq!(a.uplink.as_ref().unwrap().ifname, "ra");
        assert_eq!(b.uplink.as_ref().unwrap().ns, "x-core");
        let c = core_bird_conf(&[("a", &a), ("b", &b)]);
        assert!(c.contains("protocol bgp region_a from tor {"));
        assert!(c.contains("local 10.210.1.2 as 64900;"));
        assert!(c.contains("neighbor 10.210.1.1 as 65000;"));
        assert!(c.contains("neighbor 10.220.1.1 as 65100;"));
        assert!(
            c.contains("if net ~ [ 10.220.100.0/24{32,32}, 10.240.0.0/24{32,32} ] then accept;")
        );
        assert!(c.contains("merge paths on"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }
}
