//! What both real-cluster tests share: traffic through a fault, and lookups of pods
//! and leases.

pub(crate) mod faults;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ringlb_e2e::realcluster::RealCluster;
use ringlb_e2e::realcluster::traffic::{self, KeepAlive, Outcome};
use ringlb_e2e::realcluster::workload::WEB;

/// What a fault did to the traffic that ran through it.
pub(crate) struct Through {
    pub keepalive: Outcome,
    pub requests: u64,
    pub failed: u64,
    pub first_failure: Option<String>,
}

impl Through {
    /// Prints what `fault` did to the traffic and asserts that no keep-alive
    /// connection broke and no new connection failed.
    pub(crate) fn assert_hitless(&self, fault: &str) {
        eprintln!(
            "{fault}: {} keep-alive requests, {} broken; {} new connections, {} failed",
            self.keepalive.requests, self.keepalive.broken, self.requests, self.failed
        );
        assert_eq!(self.keepalive.broken, 0, "{:?}", self.keepalive.first_error);
        assert_eq!(self.failed, 0, "{:?}", self.first_failure);
    }
}

/// Runs `fault` while `conns` keep-alive connections ask every 100 ms and a loop of
/// new connections asks every 50 ms, then `settle` more of both.
pub(crate) fn through(
    client: &str,
    vip: IpAddr,
    conns: usize,
    settle: Duration,
    fault: impl FnOnce(),
) -> Through {
    let mut ka = KeepAlive::open(client, vip, 80, conns)
        .unwrap_or_else(|e| panic!("opening {conns} connections: {e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let looped = traffic::request_loop(client, vip, 80, stop.clone(), Duration::from_millis(50));
    let keepalive = std::thread::scope(|s| {
        let stop2 = stop.clone();
        let h = s.spawn(move || ka.rounds(&stop2, Duration::from_millis(100)));
        fault();
        std::thread::sleep(settle);
        stop.store(true, Ordering::SeqCst);
        h.join().expect("keep-alive thread")
    });
    let (requests, failed, first_failure) = looped.join().expect("request loop");
    Through {
        keepalive,
        requests,
        failed,
        first_failure,
    }
}

pub(crate) fn pod_on(rc: &RealCluster, ns: &str, selector: &str, node: &str) -> String {
    let out = rc
        .kubectl(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName} {end}",
        ])
        .unwrap();
    out.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .find(|(_, n)| *n == node)
        .map(|(p, _)| p.to_string())
        .unwrap_or_else(|| panic!("no pod {selector} on {node}: {out}"))
}

/// The controller's leader (its Lease's holder; empty while none). The edges'
/// Leases sit in the same namespace.
pub(crate) fn leader(rc: &RealCluster) -> String {
    rc.kubectl(&[
        "get",
        "lease",
        "ringlb-controller",
        "--ignore-not-found",
        "-n",
        "ringlb-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
    .unwrap()
    .trim()
    .to_string()
}

pub(crate) fn wait_ds_ready(rc: &RealCluster, component: &str) {
    rc.kubectl(&[
        "rollout",
        "status",
        "-n",
        "ringlb-system",
        "daemonset",
        "-l",
        &format!("app.kubernetes.io/component={component}"),
        "--timeout=120s",
    ])
    .unwrap_or_else(|e| panic!("{component} DaemonSet: {e}"));
}

/// The Service `web`'s field at `path` (a JSONPath such as `.metadata.finalizers`).
pub(crate) fn web_field(rc: &RealCluster, path: &str) -> String {
    rc.kubectl(&["get", "service", WEB, "-o", &format!("jsonpath={{{path}}}")])
        .unwrap()
}
