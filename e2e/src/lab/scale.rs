//! The edge at datacenter scale (`ringlb-lab scale`): many LoadBalancer Services
//! against the real kube-apiserver, one `ringlb-edge run` started cold against them.
//!
//! Each Service `scale-<i>` has `ports` TCP ports (80, 81, ...) and no selector; the
//! bench writes its EndpointSlice itself, `pods` ready endpoints in the lab's pod
//! CIDRs (nothing answers on them: the bench measures the control path, not
//! traffic). The controller gives each Service a VIP from the pool [`addrs`] sets
//! up (`10.212.0.0/16`); the ToR's BIRD accepts /32s from it.
//!
//! This module holds the pure pieces (the objects, parsers of `bpftool` and `birdc`
//! output, the table) and the API calls; `ringlb-lab scale` runs the lab around them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapError};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use ringlb_bpf_types::Be16;
use ringlb_xdp::abi::{self, VipInfo, VipKey};

use super::addrs::Addrs;
use super::{Error, Result};

/// The label on every object the bench creates.
pub const LABEL_KEY: &str = "ringlb.io/bench";
pub const LABEL_VALUE: &str = "scale";
/// The first Service port; port `k` of a Service is `FIRST_PORT + k`.
pub const FIRST_PORT: u16 = 80;
/// The pods' first port; Service port `FIRST_PORT + k` goes to `TARGET_PORT + k`.
pub const TARGET_PORT: u16 = 8080;
/// Creates in flight at once (the API server, not the bench, is the limit).
pub const IN_FLIGHT: usize = 64;

/// The default lab with its VIP pool widened to `10.212.0.0/16` (65,534 addresses):
/// the IPPool the lab applies and the ToR's import filter follow it.
pub fn addrs() -> Addrs {
    Addrs {
        vip_range: "10.212.0.0/16".into(),
        vip_first: "10.212.0.1".into(),
        vip_last: "10.212.255.254".into(),
        ..Addrs::default()
    }
}

/// `n` endpoint addresses, alternating between the lab's pod CIDRs (hosts .100 up).
pub fn pod_addrs(a: &Addrs, n: usize) -> Result<Vec<Ipv4Addr>> {
    let cidrs = a
        .pod_cidrs
        .iter()
        .map(|c| c.parse::<ipnetwork::Ipv4Network>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Parse {
            what: "a pod CIDR".into(),
            detail: e.to_string(),
        })?;
    if cidrs.is_empty() {
        return Err(Error::Unsupported("the lab has no pod CIDR".into()));
    }
    (0..n)
        .map(|k| {
            let net = cidrs[k % cidrs.len()];
            let host = 100 + (k / cidrs.len()) as u32;
            net.nth(host)
                .ok_or_else(|| Error::Unsupported(format!("{net} has no host {host}")))
        })
        .collect()
}

fn name(i: usize) -> String {
    format!("scale-{i}")
}

/// The index of a bench Service's name (`scale-<i>`).
pub fn index_of(name: &str) -> Option<usize> {
    name.strip_prefix("scale-")?.parse().ok()
}

/// Service `scale-<i>`: LoadBalancer, `ports` named TCP ports, no selector.
pub fn service(i: usize, ports: u16) -> serde_json::Value {
    let ports: Vec<_> = (0..ports)
        .map(|k| {
            serde_json::json!({"name": format!("p{k}"), "port": FIRST_PORT + k,
                               "targetPort": TARGET_PORT + k, "protocol": "TCP"})
        })
        .collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name(i), "labels": {LABEL_KEY: LABEL_VALUE}},
        // no NodePorts: the bench's Services outnumber kube-apiserver's NodePort range
        "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": ports}
    })
}

/// The EndpointSlice of Service `scale-<i>`: every address of `pods` ready, with
/// the Service's `ports` target ports (matched by name).
pub fn endpoint_slice(i: usize, ports: u16, pods: &[Ipv4Addr]) -> serde_json::Value {
    let ports: Vec<_> = (0..ports)
        .map(|k| serde_json::json!({"name": format!("p{k}"), "port": TARGET_PORT + k, "protocol": "TCP"}))
        .collect();
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name(i), "labels": {
            LABEL_KEY: LABEL_VALUE,
            "kubernetes.io/service-name": name(i),
            "endpointslice.kubernetes.io/managed-by": "ringlb-lab-scale"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints(pods),
    })
}

fn endpoints(pods: &[Ipv4Addr]) -> Vec<serde_json::Value> {
    pods.iter()
        .map(|ip| {
            serde_json::json!({"addresses": [ip.to_string()],
                               "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect()
}

fn kube_err(what: String) -> impl FnOnce(kube::Error) -> Error {
    move |e| Error::Io {
        what,
        source: std::io::Error::other(e),
    }
}

fn parsed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| Error::Parse {
        what: "a bench object".into(),
        detail: e.to_string(),
    })
}

/// Creates Services `scale-<from>..scale-<to>` and their EndpointSlices, [`IN_FLIGHT`]
/// at a time.
pub async fn create(
    client: &kube::Client,
    range: std::ops::Range<usize>,
    ports: u16,
    pods: &[Ipv4Addr],
) -> Result<()> {
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    futures::stream::iter(range)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                let svc: Service = parsed(service(i, ports))?;
                let pp = PostParams::default();
                retried(409, || services.create(&pp, &svc))
                    .await
                    .map_err(kube_err(format!("creating Service {}", name(i))))?;
                let slice: EndpointSlice = parsed(endpoint_slice(i, ports, pods))?;
                retried(409, || slices.create(&pp, &slice))
                    .await
                    .map_err(kube_err(format!("creating EndpointSlice {}", name(i))))?;
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<()>()
        .await
}

/// Deletes Services `scale-<from>..scale-<to>` and their EndpointSlices,
/// [`IN_FLIGHT`] at a time (each Service stays until the controller's cleanup
/// finalizer lets it go).
pub async fn delete(client: &kube::Client, range: std::ops::Range<usize>) -> Result<()> {
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    futures::stream::iter(range)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                let (n, dp) = (name(i), DeleteParams::default());
                retried(404, || services.delete(&n, &dp))
                    .await
                    .map_err(kube_err(format!("deleting Service {n}")))?;
                retried(404, || slices.delete(&n, &dp))
                    .await
                    .map_err(kube_err(format!("deleting EndpointSlice {n}")))?;
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<()>()
        .await
}

/// `call`, again after a second while the connection fails (an API server that
/// went away and came back: the request may or may not have been done), at most
/// 10 times; the API's answer `done` (409 for a create, 404 for a delete) means
/// an earlier try did it.
async fn retried<T, F: std::future::Future<Output = kube::Result<T>>>(
    done: u16,
    mut call: impl FnMut() -> F,
) -> kube::Result<()> {
    let mut tries = 0;
    loop {
        match call().await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == done && tries > 0 => return Ok(()),
            Err(e @ kube::Error::Api(_)) => return Err(e),
            Err(_) if tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The VIP of every bench Service that has one, by index.
pub async fn vips(client: &kube::Client) -> Result<BTreeMap<usize, Ipv4Addr>> {
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let lp = ListParams::default().labels(&format!("{LABEL_KEY}={LABEL_VALUE}"));
    let list = services
        .list(&lp)
        .await
        .map_err(kube_err("listing the bench's Services".into()))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|s| {
            let i = index_of(s.metadata.name.as_deref()?)?;
            let ip = s.status?.load_balancer?.ingress?.into_iter().next()?.ip?;
            Some((i, ip.parse().ok()?))
        })
        .collect())
}

/// Replaces the endpoints of Service `scale-<i>`'s EndpointSlice with `pods`.
pub async fn set_endpoints(client: &kube::Client, i: usize, pods: &[Ipv4Addr]) -> Result<()> {
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let patch = serde_json::json!({"endpoints": endpoints(pods)});
    slices
        .patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!("patching EndpointSlice {}", name(i))))?;
    Ok(())
}

/// The edge's pinned `vips` map, read as `ringlb-edge datapath dump` would.
pub struct VipsMap(BpfHashMap<MapData, VipKey, VipInfo>);

impl VipsMap {
    /// Opens `<pin_dir>/vips`; `Ok(None)` while the edge has not pinned it yet.
    pub fn open(pin_dir: &Path) -> Result<Option<VipsMap>> {
        let path = pin_dir.join(abi::map::VIPS);
        if !path.exists() {
            return Ok(None);
        }
        let bpf_err = |e: MapError| Error::Io {
            what: format!("opening {}", path.display()),
            source: std::io::Error::other(e),
        };
        let data = MapData::from_pin(&path).map_err(bpf_err)?;
        let map = BpfHashMap::try_from(Map::HashMap(data)).map_err(bpf_err)?;
        Ok(Some(VipsMap(map)))
    }

    /// VIP:port entries programmed.
    pub fn count(&self) -> usize {
        self.0.keys().filter(|k| k.is_ok()).count()
    }

    /// The IPv4 VIPs with at least one port programmed.
    pub fn v4_vips(&self) -> BTreeSet<Ipv4Addr> {
        self.0
            .keys()
            .filter_map(|k| k.ok())
            .filter_map(|k| match k.addr.to_ip(k.family)? {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            })
            .collect()
    }

    /// The ring size of `vip`:`port`/TCP, if programmed.
    pub fn ring_size(&self, vip: Ipv4Addr, port: u16) -> Option<u32> {
        let (addr, family) = ringlb_bpf_types::RawAddr::from_ip(IpAddr::V4(vip));
        let key = VipKey {
            addr,
            port: Be16::from_host(port),
            proto: 6,
            family,
        };
        self.0.get(&key, 0).ok().map(|v| v.ring_size)
    }
}

/// The highest map id in `bpftool -j map show` output (0 for none).
pub fn max_map_id(bpftool_json: &str) -> Result<u32> {
    Ok(maps(bpftool_json)?.iter().map(|m| m.0).max().unwrap_or(0))
}

/// Bytes of kernel memory (`bytes_memlock`) and how many maps, of the maps in
/// `bpftool -j map show` output with an id above `after`.
pub fn memlock_after(bpftool_json: &str, after: u32) -> Result<(u64, usize)> {
    let new: Vec<_> = maps(bpftool_json)?
        .into_iter()
        .filter(|m| m.0 > after)
        .collect();
    Ok((new.iter().map(|m| m.1).sum(), new.len()))
}

fn maps(bpftool_json: &str) -> Result<Vec<(u32, u64)>> {
    let v: serde_json::Value = serde_json::from_str(bpftool_json).map_err(|e| Error::Parse {
        what: "bpftool -j map show".into(),
        detail: e.to_string(),
    })?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| {
                    let id = u32::try_from(m["id"].as_u64()?).ok()?;
                    Some((id, m["bytes_memlock"].as_u64().unwrap_or(0)))
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The route count of `birdc show route count ...`: `N of M routes for K networks
/// in table master4` gives N.
pub fn route_count(birdc: &str) -> Option<usize> {
    birdc.lines().find_map(|l| {
        let (n, rest) = l.trim().split_once(" of ")?;
        rest.contains("routes").then(|| n.trim().parse().ok())?
    })
}

/// The IPv4 /32 prefixes of `birdc show route ...` output (ECMP paths after the
/// first start with blanks and are skipped).
pub fn bird_host_routes(birdc: &str) -> BTreeSet<Ipv4Addr> {
    birdc
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_suffix("/32")?
                .parse()
                .ok()
        })
        .collect()
}

/// The burst of deletions and creations with the API server frozen in the middle:
/// what it measured.
#[derive(Debug, Clone, Default)]
pub struct Burst {
    /// Service ports deleted, and as many created under new names.
    pub ports: usize,
    /// How long the API server was frozen (SIGSTOP .. SIGCONT).
    pub outage: Duration,
    /// Looks at the edge while the API was frozen.
    pub samples: usize,
    /// The untouched Services' VIPs (first port) in the `vips` map and in BIRD:
    /// the fewest over the samples, of how many.
    pub untouched: usize,
    pub min_programmed: usize,
    pub min_announced: usize,
    /// /32s BIRD had from the edge whose VIP was not in the `vips` map, summed
    /// over the samples (announced without being served).
    pub announced_unserved: usize,
    /// The burst's requests, from the first sent to the last answered.
    pub requests: Duration,
    /// The API back -> every VIP:port programmed and every VIP announced.
    pub caught_up: Duration,
}

/// The burst as a Markdown table row with its header.
pub fn burst_table(b: &Burst) -> String {
    format!(
        "| ports deleted + created | API frozen | untouched VIPs programmed / announced while frozen (min of {} looks) | announced without being served | burst requests took | API back -> caught up |\n|---|---|---|---|---|---|\n| {} + {} | {:.0} s | {} / {} of {} | {} | {:.1} s | {:.2} s |\n",
        b.samples,
        b.ports,
        b.ports,
        b.outage.as_secs_f64(),
        b.min_programmed,
        b.min_announced,
        b.untouched,
        b.announced_unserved,
        b.requests.as_secs_f64(),
        b.caught_up.as_secs_f64(),
    )
}

/// One size of the bench: what it measured.
#[derive(Debug, Clone)]
pub struct Row {
    pub ports: usize,
    pub services: usize,
    /// `ringlb-edge run` started -> every VIP:port in its `vips` map.
    pub programmed: Duration,
    /// ... -> every VIP's /32 from this edge in BIRD.
    pub announced: Duration,
    /// The edge's peak RSS (VmHWM), KiB.
    pub rss_kib: u64,
    /// Kernel memory of the edge's BPF maps (`bytes_memlock`) and their number.
    pub bpf_bytes: u64,
    pub bpf_maps: usize,
    /// One Service's endpoints changed -> its ring resized in the map: p50, p99.
    pub change_p50: Duration,
    pub change_p99: Duration,
    pub changes: usize,
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| Service ports | Services | cold start: programmed | cold start: announced | edge RSS peak | BPF maps (memlock) | one change -> datapath p50 / p99 |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.2} s | {:.2} s | {:.0} MiB | {:.0} MiB in {} maps | {:.2} / {:.2} ms ({} changes) |\n",
            r.ports,
            r.services,
            r.programmed.as_secs_f64(),
            r.announced.as_secs_f64(),
            r.rss_kib as f64 / 1024.0,
            r.bpf_bytes as f64 / (1024.0 * 1024.0),
            r.bpf_maps,
            r.change_p50.as_secs_f64() * 1e3,
            r.change_p99.as_secs_f64() * 1e3,
            r.changes,
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_name_their_ports_and_match_them() {
        let pods = pod_addrs(&addrs(), 3).unwrap();
        assert_eq!(
            pods,
            ["10.210.3.100", "10.210.4.100", "10.210.3.101"]
                .map(|s| s.parse::<Ipv4Addr>().unwrap())
        );
        let svc: Service = parsed(service(7, 2)).unwrap();
        let spec = svc.spec.unwrap();
        assert_eq!(svc.metadata.name.as_deref(), Some("scale-7"));
        assert!(spec.selector.is_none());
        let ports = spec.ports.unwrap();
        assert_eq!((ports[1].name.as_deref(), ports[1].port), (Some("p1"), 81));
        let slice: EndpointSlice = parsed(endpoint_slice(7, 2, &pods)).unwrap();
        assert_eq!(
            slice.metadata.labels.unwrap()["kubernetes.io/service-name"],
            "scale-7"
        );
        let sp = slice.ports.unwrap();
        assert_eq!(
            (sp[1].name.as_deref(), sp[1].port),
            (Some("p1"), Some(8081))
        );
        assert_eq!(slice.endpoints.len(), 3);
        assert_eq!(index_of("scale-7"), Some(7));
        assert_eq!(index_of("web"), None);
    }

    #[test]
    fn bpftool_and_birdc_output_is_read() {
        let j = r#"[{"id":3,"bytes_memlock":4096},{"id":9,"bytes_memlock":8192},{"id":12,"bytes_memlock":100}]"#;
        assert_eq!(max_map_id(j).unwrap(), 12);
        assert_eq!(memlock_after(j, 3).unwrap(), (8292, 2));
        assert!(max_map_id("not json").is_err());
        let b = "BIRD 2.0.12 ready.\n2000 of 2000 routes for 2000 networks in table master4\n";
        assert_eq!(route_count(b), Some(2000));
        assert_eq!(route_count("BIRD 2.0.12 ready.\n"), None);
        let routes = "Table master4:\n10.212.0.1/32        unicast [edge1 07:41:02.123] * (100) [AS65011i]\n\tvia 10.201.0.11 on eth1\n10.212.0.2/32        unicast [edge1 07:41:02.123] * (100) [AS65011i]\n10.212.0.0/16 blackhole\n";
        assert_eq!(
            bird_host_routes(routes),
            ["10.212.0.1", "10.212.0.2"]
                .map(|a| a.parse().unwrap())
                .into()
        );
    }
}
