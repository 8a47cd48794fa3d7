//! `GET /health/vip/<ip>` and `/health/vip/<ip>/<port>` on the edge's ops endpoint:
//! what a global traffic manager (PowerDNS `ifurlup`, k8gb, NS1, F5 DNS) probes.
//! 200 with a JSON body while the VIP (every port of it, or the one port) is healthy,
//! 503 with the same body and the reason otherwise (`failing over to <ip>` while a
//! VIP:port sends its new flows to its failover VIP), 404 for a VIP or port this edge
//! does not serve (a failover alias included), 400 for a malformed address or port.
//!
//! The sync publishes its facts here; the answer is computed per request, so the BGP
//! sessions and a running hold-down are read as they are now.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::RwLock;
use std::time::Instant;

use ipnetwork::IpNetwork;
use ringlb_bgp::RouteAttrs;
use ringlb_ops::{ExtraPages, Page};

use super::assess::{PortFacts, Report, aggregate, assess};
use ringlb_bgp::reach::{PeerView, reach};

/// The path prefix of the per-VIP health pages.
pub const PREFIX: &str = "/health/vip/";

/// Every BGP peer's state, families and sent prefixes, as of now.
type PeersUp = Box<dyn Fn() -> Vec<PeerView> + Send + Sync>;

#[derive(Default)]
struct Snapshot {
    synced: bool,
    facts: Vec<PortFacts>,
    routes: BTreeMap<IpNetwork, RouteAttrs>,
}

/// What the health pages answer from: the last sync's facts and routes, and what
/// each BGP peer was sent (whether a router has a VIP: `ringlb_bgp::reach`).
pub struct Board {
    snapshot: RwLock<Snapshot>,
    peers_up: PeersUp,
    /// A fault of the whole datapath (its transmits fail): every VIP answers 503
    /// with it, whatever its own health.
    datapath_fault: RwLock<Option<String>>,
}

impl Default for Board {
    /// No sessions ever (for tests of the sync alone).
    fn default() -> Self {
        Board::new(Box::new(Vec::new))
    }
}

impl Board {
    pub fn new(peers_up: PeersUp) -> Self {
        Board {
            snapshot: RwLock::default(),
            peers_up,
            datapath_fault: RwLock::default(),
        }
    }

    /// Sets (`Some(reason)`) or clears the datapath's fault.
    pub fn set_datapath_fault(&self, reason: Option<String>) {
        *self
            .datapath_fault
            .write()
            .unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// The facts and routes of a sync that reached the datapath.
    pub fn publish(&self, facts: Vec<PortFacts>, routes: BTreeMap<IpNetwork, RouteAttrs>) {
        let mut s = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        *s = Snapshot {
            synced: true,
            facts,
            routes,
        };
    }

    /// Every VIP:port's report, as of `now`.
    pub fn reports(&self, now: Instant) -> Vec<Report> {
        let s = self.snapshot.read().unwrap_or_else(|e| e.into_inner());
        let peers = (self.peers_up)();
        s.facts
            .iter()
            .map(|f| {
                let reach = reach(f.vip.addr, &peers);
                assess(f, s.routes.get(&IpNetwork::from(f.vip.addr)), reach, now)
            })
            .collect()
    }

    /// The answer for `path`, or `None` when the path is not a health page.
    pub fn answer_at(&self, path: &str, now: Instant) -> Option<Page> {
        let rest = path.strip_prefix(PREFIX)?;
        let (vip, port) = match parse(rest) {
            Ok(q) => q,
            Err(why) => return Some(error(400, &why)),
        };
        if !self
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .synced
        {
            return Some(error(503, "the edge has not synced yet"));
        }
        let known: Vec<Report> = self
            .reports(now)
            .into_iter()
            .filter(|r| r.vip == vip)
            .collect();
        if known.is_empty() {
            return Some(error(404, &format!("VIP {vip} is not served by this edge")));
        }
        let parts: Vec<Report> = known
            .into_iter()
            .filter(|r| port.is_none() || r.port == port)
            .collect();
        if parts.is_empty() {
            let p = port.unwrap_or_default();
            return Some(error(
                404,
                &format!("VIP {vip} has no port {p} on this edge"),
            ));
        }
        let fault = self
            .datapath_fault
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(why) = fault {
            return Some(error(503, &why));
        }
        let report = aggregate(vip, port, parts);
        Some(json(report.http_status(), &report))
    }
}

impl ExtraPages for Board {
    fn answer(&self, path: &str) -> Option<Page> {
        self.answer_at(path, Instant::now())
    }
}

/// `<ip>` or `<ip>/<port>`; IPv6 bare or in brackets; one trailing `/` allowed.
fn parse(rest: &str) -> Result<(IpAddr, Option<u16>), String> {
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (ip, port) = match rest.split_once('/') {
        Some((ip, port)) => (ip, Some(port)),
        None => (rest, None),
    };
    let bare = ip
        .strip_prefix('[')
        .and_then(|i| i.strip_suffix(']'))
        .unwrap_or(ip);
    let vip: IpAddr = bare
        .parse()
        .map_err(|_| format!("{ip:?} is not an IPv4 or IPv6 address"))?;
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))?,
        ),
    };
    Ok((vip, port))
}

fn json(status: u16, body: &impl serde::Serialize) -> Page {
    Page {
        status,
        content_type: "application/json",
        body: serde_json::to_string(body).unwrap_or_default() + "\n",
    }
}

fn error(status: u16, reason: &str) -> Page {
    json(
        status,
        &serde_json::json!({"state": if status == 503 { "down" } else { "error" }, "reason": reason}),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ringlb_datapath::{Proto, Vip};

    use super::*;
    use crate::vip_health::assess::{route, verdict};
    use crate::vip_health::hysteresis::Phase;
    use crate::vip_health::policy::HealthPolicy;

    #[test]
    fn parses_addresses_and_ports() {
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(parse("192.0.2.1"), Ok((v4, None)));
        assert_eq!(parse("192.0.2.1/"), Ok((v4, None)));
        assert_eq!(parse("192.0.2.1/80"), Ok((v4, Some(80))));
        assert_eq!(parse("2001:db8::1/443"), Ok((v6, Some(443))));
        assert_eq!(parse("[2001:db8::1]/443"), Ok((v6, Some(443))));
        for bad in [
            "",
            "192.0.2",
            "192.0.2.1/0",
            "192.0.2.1/http",
            "192.0.2.1/80/x",
            "x/80",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// A board whose `peers` sessions are up and were sent every route.
    fn board(peers: usize) -> Board {
        let b = Board::new(Box::new(move || vec![PeerView::everything(); peers]));
        let f = PortFacts {
            vip: Vip {
                addr: "192.0.2.1".parse().unwrap(),
                port: 80,
                proto: Proto::Tcp,
            },
            service: "default/web".into(),
            ready: 2,
            programmed: true,
            policy: HealthPolicy {
                min_ready: 2,
                hold_down: Duration::from_secs(5),
                ..Default::default()
            },
            phase: Phase::Healthy,
            failover: None,
            serving_terminating: 0,
        };
        let mut routes = BTreeMap::new();
        routes.insert(
            "192.0.2.1/32".parse().unwrap(),
            route([verdict(&f)]).unwrap(),
        );
        b.publish(vec![f], routes);
        b
    }

    #[test]
    fn answers_each_case_with_its_status() {
        let now = Instant::now();
        let unsynced = Board::default();
        assert_eq!(
            unsynced
                .answer_at("/health/vip/192.0.2.1", now)
                .unwrap()
                .status,
            503
        );
        let b = board(1);
        assert_eq!(b.answer_at("/metrics", now), None, "not ours");
        let ok = b.answer_at("/health/vip/192.0.2.1/80", now).unwrap();
        assert_eq!(ok.status, 200, "{}", ok.body);
        let v: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
        assert_eq!(v["state"], "healthy");
        assert_eq!(v["readyBackends"], 2);
        assert_eq!(
            b.answer_at("/health/vip/192.0.2.1", now).unwrap().status,
            200
        );
        assert_eq!(
            b.answer_at("/health/vip/192.0.2.1/81", now).unwrap().status,
            404
        );
        assert_eq!(
            b.answer_at("/health/vip/192.0.2.9", now).unwrap().status,
            404
        );
        let bad = b.answer_at("/health/vip/not-an-ip", now).unwrap();
        assert_eq!(bad.status, 400);
        assert!(
            bad.body.contains("not an IPv4 or IPv6 address"),
            "{}",
            bad.body
        );
        // The same facts with no BGP session up: 503, and why.
        let down = board(0).answer_at("/health/vip/192.0.2.1/80", now).unwrap();
        assert_eq!(down.status, 503);
        assert!(down.body.contains("\"state\":\"down\""), "{}", down.body);
        assert!(down.body.contains("no BGP session"), "{}", down.body);
        // A datapath that cannot transmit: every served VIP is down, with why;
        // an unknown one is still 404.
        b.set_datapath_fault(Some("XDP transmits fail on eth0".into()));
        let f = b.answer_at("/health/vip/192.0.2.1/80", now).unwrap();
        assert_eq!(f.status, 503);
        assert!(f.body.contains("XDP transmits fail on eth0"), "{}", f.body);
        assert_eq!(
            b.answer_at("/health/vip/192.0.2.9", now).unwrap().status,
            404
        );
        b.set_datapath_fault(None);
        assert_eq!(
            b.answer_at("/health/vip/192.0.2.1/80", now).unwrap().status,
            200
        );
    }
}
