//! Control-plane latency through the whole lab (`ringlb-lab bench`): for each new
//! LoadBalancer Service, the time from the API create call to
//! 1. the VIP in `status.loadBalancer.ingress` (controller),
//! 2. the first route for the VIP in the ToR's kernel FIB (an edge programmed XDP,
//!    announced over BGP, BIRD installed it),
//! 3. the route with a next hop per edge (ECMP).
//!
//! It runs *inside* the ToR namespace (`ip netns exec <tor> ringlb-lab measure`), so
//! it reaches the API server (through the lab's bridge) and sees the ToR's FIB through `ip monitor route`, whose
//! lines are timestamped as they arrive.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::io::AsyncBufReadExt;

use super::{Error, Result};

/// One line of `ip monitor route`.
#[derive(Debug, PartialEq, Eq)]
pub enum MonitorLine {
    /// A route header: destination, deleted?, and whether it names a gateway itself
    /// (a single-path route) rather than `nexthop` lines below it.
    Route {
        dst: IpAddr,
        deleted: bool,
        single_via: bool,
    },
    /// `\tnexthop via ...` under the last route header.
    NextHop,
    Other,
}

/// Parses one line of `ip monitor route` (pure).
pub fn parse_monitor_line(line: &str) -> MonitorLine {
    if line.starts_with(char::is_whitespace) {
        return if line.trim_start().starts_with("nexthop") {
            MonitorLine::NextHop
        } else {
            MonitorLine::Other
        };
    }
    let mut w = line.split_whitespace().peekable();
    let deleted = w.next_if_eq(&"Deleted").is_some();
    let Some(dst) = w.next().and_then(|d| d.split('/').next()?.parse().ok()) else {
        return MonitorLine::Other;
    };
    MonitorLine::Route {
        dst,
        deleted,
        single_via: line.contains(" via "),
    }
}

/// When each VIP first appeared in the FIB, and when with `edges` next hops.
#[derive(Debug, Default, Clone, Copy)]
pub struct FibTimes {
    pub first: Option<Instant>,
    pub ecmp: Option<Instant>,
}

/// Folds monitor lines into [`FibTimes`] per destination (pure state machine).
#[derive(Debug, Default)]
pub struct FibTracker {
    pub times: HashMap<IpAddr, FibTimes>,
    current: Option<(IpAddr, Instant, usize)>,
    edges: usize,
}

impl FibTracker {
    pub fn new(edges: usize) -> Self {
        FibTracker {
            edges,
            ..Default::default()
        }
    }

    pub fn feed(&mut self, line: &str, at: Instant) {
        match parse_monitor_line(line) {
            MonitorLine::Route {
                dst,
                deleted,
                single_via,
            } => {
                self.current = (!deleted).then_some((dst, at, 0));
                if single_via && !deleted {
                    self.bump();
                }
            }
            MonitorLine::NextHop => self.bump(),
            MonitorLine::Other => {}
        }
    }

    fn bump(&mut self) {
        let Some((dst, at, n)) = self.current.as_mut() else {
            return;
        };
        *n += 1;
        let t = self.times.entry(*dst).or_default();
        t.first.get_or_insert(*at);
        if *n >= self.edges {
            t.ecmp.get_or_insert(*at);
        }
    }
}

/// One Service's latencies.
#[derive(Debug, Clone)]
pub struct Sample {
    pub vip: IpAddr,
    pub to_status: Duration,
    pub to_first_route: Duration,
    pub to_ecmp: Duration,
}

fn kube_err(what: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |e| Error::Io {
        what: what.to_string(),
        source: std::io::Error::other(e),
    }
}

/// Creates `n` LoadBalancer Services selecting `app=web` one after the other and
/// times each (see the module doc). Needs an IPPool with `n` free addresses.
pub async fn measure(kubeconfig: &Path, n: usize, edges: usize, port: u16) -> Result<Vec<Sample>> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Io {
        what: format!("reading {}", kubeconfig.display()),
        source: std::io::Error::other(e),
    })?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| Error::Io {
            what: "kubeconfig".into(),
            source: std::io::Error::other(e),
        })?;
    // the programs' client (TCP_NODELAY): kube-client's own would hold each create on
    // a new connection ~40 ms behind the TLS handshake (Nagle, delayed ACK)
    let client = ringlb_ops::kube_client::client(cfg).map_err(kube_err("kube client"))?;
    let api: Api<Service> = Api::namespaced(client, "default");

    let tracker = Arc::new(Mutex::new(FibTracker::new(edges)));
    let mut mon = tokio::process::Command::new("ip")
        .args(["monitor", "route"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| Error::Spawn {
            cmd: "ip monitor route".into(),
            source,
        })?;
    let stdout = mon
        .stdout
        .take()
        .ok_or_else(|| Error::Unsupported("no stdout".into()))?;
    let t2 = tracker.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            let now = Instant::now();
            t2.lock().unwrap_or_else(|p| p.into_inner()).feed(&l, now);
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("bench-{i}");
        let wp = WatchParams::default().fields(&format!("metadata.name={name}"));
        let mut watch = api
            .watch(&wp, "0")
            .await
            .map_err(kube_err("watch"))?
            .boxed();
        let svc: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                     "ports": [{"port": port, "targetPort": port, "protocol": "TCP"}]}
        }))
        .map_err(|e| Error::Parse {
            what: "service".into(),
            detail: e.to_string(),
        })?;
        let t0 = Instant::now();
        api.create(&PostParams::default(), &svc)
            .await
            .map_err(kube_err("creating a Service"))?;
        let vip = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(ev) = watch.try_next().await.map_err(kube_err("watch"))? {
                if let WatchEvent::Added(s) | WatchEvent::Modified(s) = ev
                    && let Some(ip) = s
                        .status
                        .and_then(|st| st.load_balancer?.ingress?.into_iter().next()?.ip)
                {
                    return Ok::<_, Error>(Some(ip));
                }
            }
            Ok(None)
        })
        .await
        .map_err(|_| timeout(&name, "a VIP", Duration::from_secs(10)))??
        .ok_or_else(|| timeout(&name, "a VIP (watch ended)", Duration::from_secs(10)))?;
        let to_status = t0.elapsed();
        let vip: IpAddr = vip.parse().map_err(|_| Error::Parse {
            what: "VIP".into(),
            detail: vip.clone(),
        })?;
        let limit = Instant::now() + Duration::from_secs(15);
        let times = loop {
            let t = tracker
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .times
                .get(&vip)
                .copied();
            if let Some(FibTimes {
                first: Some(f),
                ecmp: Some(e),
            }) = t
            {
                break (f, e);
            }
            if Instant::now() > limit {
                return Err(timeout(
                    &name,
                    "ECMP route in the FIB",
                    Duration::from_secs(15),
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        out.push(Sample {
            vip,
            to_status,
            to_first_route: times.0.saturating_duration_since(t0),
            to_ecmp: times.1.saturating_duration_since(t0),
        });
    }
    let _ = mon.kill().await;
    Ok(out)
}

fn timeout(name: &str, what: &str, waited: Duration) -> Error {
    Error::Timeout {
        what: format!("{what} for Service {name}"),
        waited,
        last: String::new(),
    }
}

/// p-th percentile (0..=100) of `v` (nearest rank); zero for an empty slice.
pub fn percentile(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines() {
        assert_eq!(
            parse_monitor_line("10.210.100.11 via 10.210.0.12 dev br-lb proto bird metric 32 "),
            MonitorLine::Route {
                dst: "10.210.100.11".parse().unwrap(),
                deleted: false,
                single_via: true
            }
        );
        assert_eq!(
            parse_monitor_line("Deleted 10.210.100.11 proto bird metric 32 "),
            MonitorLine::Route {
                dst: "10.210.100.11".parse().unwrap(),
                deleted: true,
                single_via: false
            }
        );
        assert_eq!(
            parse_monitor_line("\tnexthop via 10.210.0.11 dev br-lb weight 1 "),
            MonitorLine::NextHop
        );
        assert_eq!(
            parse_monitor_line("local 10.0.0.1 dev lo"),
            MonitorLine::Other
        );
    }

    #[test]
    fn tracker_records_first_route_and_ecmp() {
        let mut t = FibTracker::new(2);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(5);
        let t2 = t0 + Duration::from_millis(9);
        t.feed(
            "10.210.100.11 via 10.210.0.12 dev br-lb proto bird metric 32 ",
            t1,
        );
        t.feed("10.210.100.11 proto bird metric 32 ", t2);
        t.feed("\tnexthop via 10.210.0.11 dev br-lb weight 1 ", t2);
        t.feed("\tnexthop via 10.210.0.12 dev br-lb weight 1 ", t2);
        let v = t.times[&"10.210.100.11".parse::<IpAddr>().unwrap()];
        assert_eq!((v.first, v.ecmp), (Some(t1), Some(t2)));
        t.feed(
            "Deleted 10.210.100.12 via 10.210.0.12 dev br-lb proto bird",
            t2,
        );
        assert!(
            !t.times
                .contains_key(&"10.210.100.12".parse::<IpAddr>().unwrap())
        );
    }

    #[test]
    fn percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&v, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }
}
