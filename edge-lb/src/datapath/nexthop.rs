//! Next-hop resolution for backends: which interface and which MAC addresses
//! an encapsulated packet to a pod IP leaves with.
//!
//! First version: it asks iproute2 (`ip -j route get`, `ip -j neigh show`)
//! and parses the JSON, instead of speaking rtnetlink itself. The parsers are
//! pure and tested; the loader re-resolves on every apply and on
//! `XdpDatapath::refresh_next_hops` so the map follows neighbour changes.
//! When a backend cannot be resolved its entry is written with `nh_valid = 0`
//! and the program falls back to `bpf_fib_lookup`.

use std::{collections::BTreeMap, net::IpAddr, process::Command};

use serde::Deserialize;

use super::Error;

/// Where packets to one backend go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// Resolves the next hop of a backend address.
pub trait Resolver: Send {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error>;
}

/// Fixed answers: for benchmarks and packet fixtures.
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    pub default: Option<NextHop>,
    pub per_addr: BTreeMap<IpAddr, NextHop>,
}

impl Resolver for StaticResolver {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error> {
        self.per_addr
            .get(&addr)
            .or(self.default.as_ref())
            .copied()
            .ok_or_else(|| Error::NextHop {
                addr,
                reason: "no static next hop".into(),
            })
    }
}

/// Resolution through the kernel's routes and neighbours (iproute2 JSON),
/// in the current network namespace or in the named one (`ip -n NETNS`).
#[derive(Clone, Debug, Default)]
pub struct KernelResolver {
    pub netns: Option<String>,
}

#[derive(Deserialize)]
struct RouteJson {
    dev: String,
    #[serde(default)]
    gateway: Option<IpAddr>,
}

#[derive(Deserialize)]
struct LinkJson {
    ifindex: u32,
    address: String,
}

#[derive(Deserialize)]
struct NeighJson {
    #[serde(default)]
    lladdr: Option<String>,
}

/// Parses `ip -j route get ADDR`: (device, next-hop address).
pub fn parse_route_get(json: &str, addr: IpAddr) -> Result<(String, IpAddr), Error> {
    let routes: Vec<RouteJson> = serde_json::from_str(json).map_err(|e| Error::NextHop {
        addr,
        reason: format!("unparsable `ip -j route get` output: {e}"),
    })?;
    let r = routes.into_iter().next().ok_or_else(|| Error::NextHop {
        addr,
        reason: "no route".into(),
    })?;
    Ok((r.dev, r.gateway.unwrap_or(addr)))
}

/// Parses `ip -j neigh show to NH dev DEV`: the MAC, if resolved.
pub fn parse_neigh(json: &str) -> Option<[u8; 6]> {
    let n: Vec<NeighJson> = serde_json::from_str(json).ok()?;
    n.into_iter()
        .find_map(|e| e.lladdr.as_deref().and_then(parse_mac))
}

/// "02:00:0a:00:00:01" -> bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Parses `ip -j link show dev DEV`: (ifindex, MAC).
pub fn parse_link(json: &str) -> Option<(u32, [u8; 6])> {
    let l: Vec<LinkJson> = serde_json::from_str(json).ok()?;
    let l = l.into_iter().next()?;
    Some((l.ifindex, parse_mac(&l.address)?))
}

fn ip_json(netns: Option<&str>, args: &[&str], addr: IpAddr) -> Result<String, Error> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(args).output().map_err(|e| Error::NextHop {
        addr,
        reason: format!("running ip: {e}"),
    })?;
    if !out.status.success() {
        return Err(Error::NextHop {
            addr,
            reason: format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Resolver for KernelResolver {
    fn resolve(&self, addr: IpAddr) -> Result<NextHop, Error> {
        let ns = self.netns.as_deref();
        let a = addr.to_string();
        let (dev, nh) = parse_route_get(&ip_json(ns, &["-j", "route", "get", &a], addr)?, addr)?;
        let (ifindex, smac) = parse_link(&ip_json(ns, &["-j", "link", "show", "dev", &dev], addr)?)
            .ok_or_else(|| Error::NextHop {
                addr,
                reason: format!("cannot read ifindex/MAC of {dev}"),
            })?;
        let nh_s = nh.to_string();
        let neigh = || ip_json(ns, &["-j", "neigh", "show", "to", &nh_s, "dev", &dev], addr);
        if let Some(dmac) = parse_neigh(&neigh()?) {
            return Ok(NextHop {
                ifindex,
                smac,
                dmac,
            });
        }
        // Not in the neighbour table yet: let the kernel resolve it (a ping
        // in the right namespace), then look again for up to ~300 ms.
        let mut ping = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "ping"]);
                c
            }
            None => Command::new("ping"),
        };
        let _ = ping
            .args(["-c", "1", "-W", "0.3", &nh_s])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        for _ in 0..10 {
            if let Some(dmac) = parse_neigh(&neigh()?) {
                return Ok(NextHop {
                    ifindex,
                    smac,
                    dmac,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        Err(Error::NextHop {
            addr,
            reason: format!("neighbour {nh} on {dev} not resolved"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_route_get_with_and_without_gateway() {
        let a: IpAddr = "10.2.0.5".parse().unwrap();
        let j = r#"[{"dst":"10.2.0.5","gateway":"10.0.0.1","dev":"eth0","prefsrc":"10.0.0.11","flags":[],"uid":0,"cache":[]}]"#;
        assert_eq!(
            parse_route_get(j, a).unwrap(),
            ("eth0".into(), "10.0.0.1".parse().unwrap())
        );
        let j = r#"[{"dst":"10.2.0.5","dev":"br0","prefsrc":"10.2.0.1","flags":[],"uid":0,"cache":[]}]"#;
        assert_eq!(parse_route_get(j, a).unwrap(), ("br0".into(), a));
        assert!(parse_route_get("[]", a).is_err());
        assert!(parse_route_get("garbage", a).is_err());
    }

    #[test]
    fn parses_neighbours_and_macs() {
        let j = r#"[{"dst":"10.0.0.1","dev":"eth0","lladdr":"02:00:0a:00:00:01","state":["REACHABLE"]}]"#;
        assert_eq!(parse_neigh(j), Some([2, 0, 0x0a, 0, 0, 1]));
        assert_eq!(
            parse_neigh(r#"[{"dst":"10.0.0.1","dev":"eth0","state":["FAILED"]}]"#),
            None
        );
        assert_eq!(parse_neigh("[]"), None);
        assert_eq!(parse_mac("02:00:0a:00:00"), None);
        assert_eq!(parse_mac("02:00:0a:00:00:01:02"), None);
        assert_eq!(parse_mac("zz:00:0a:00:00:01"), None);
        let l = r#"[{"ifindex":7,"ifname":"eth0","address":"02:00:0a:00:00:0b","mtu":1500}]"#;
        assert_eq!(parse_link(l), Some((7, [2, 0, 0x0a, 0, 0, 0x0b])));
        assert_eq!(parse_link("[]"), None);
    }
}
