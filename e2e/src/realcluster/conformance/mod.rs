//! `make conformance`: Kubernetes' own e2e suite (`e2e.test`, built from the pinned
//! module by `scripts/build-k8s.sh`) against ringlb on the real cluster. The suite
//! runs in the client's namespace behind the ToR, so VIP traffic crosses ringlb's
//! edges and never a node's kube-proxy; afterwards nothing of the suite's Services
//! may be left: no allocated address, no route at the ToR, no BPF entry on a node,
//! no panic or restart of a ringlb pod (docs/conformance.md).

pub mod summary;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Options, RELEASE_NAMESPACE, RealCluster};
use crate::lab::{Error, Result};
use summary::{Spec, State, Totals};

/// Every `[Feature:LoadBalancer]` test (test/e2e/network/loadbalancer.go).
pub const LOADBALANCER: &str = r"\[Feature:LoadBalancer\]";
/// The Services conformance tests: ringlb installed breaks none of them.
pub const SERVICES_CONFORMANCE: &str = r"\[sig-network\] Services .*\[Conformance\]";

/// What `make test` runs (`e2e/tests/upstream_loadbalancer.rs`), about 5 minutes:
/// 13 of the 17 `[Feature:LoadBalancer]` tests, every behaviour ringlb implements.
/// `make conformance` also runs the other four: the two rolling-update tests (about
/// 20 minutes each: a DaemonSet rolled five times with 60 s of grace per pod; in
/// `make test`, `real_cluster.rs` checks rolling updates and drains), the UDP
/// variant of the type-and-ports test (the TCP one runs; ringlb's path is the same
/// but for the protocol) and "should only target nodes with endpoints" (it checks
/// kube-proxy's health-check node port, which ringlb does not use). Each entry
/// matches exactly one spec.
pub const MAKE_TEST: &[&str] = &[
    r"\[Feature:LoadBalancer\] should be able to change the type and ports of a TCP service",
    r"\[Feature:LoadBalancer\] should only allow access from service loadbalancer source ranges",
    r"\[Feature:LoadBalancer\] should have session affinity work for LoadBalancer service with Local",
    r"\[Feature:LoadBalancer\] should be able to switch session affinity for LoadBalancer service with Local",
    r"\[Feature:LoadBalancer\] should have session affinity work for LoadBalancer service with Cluster",
    r"\[Feature:LoadBalancer\] should be able to switch session affinity for LoadBalancer service with Cluster",
    r"\[Feature:LoadBalancer\] should handle load balancer cleanup finalizer",
    r"\[Feature:LoadBalancer\] should be able to create LoadBalancer Service without NodePort",
    r"\[Feature:LoadBalancer\] should be able to preserve UDP traffic when server pod cycles for a LoadBalancer service on different nodes",
    r"\[Feature:LoadBalancer\] should be able to preserve UDP traffic when server pod cycles for a LoadBalancer service on the same nodes",
    r"\[Feature:LoadBalancer\].* should work for type=LoadBalancer",
    r"\[Feature:LoadBalancer\].* should target all nodes with endpoints",
    r"\[Feature:LoadBalancer\].* should work from pods",
];

/// One run of the suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// `--ginkgo.focus`
    pub focus: String,
    /// `--ginkgo.skip`, if any.
    pub skip: Option<String>,
    /// The JUnit report and the suite's log go here.
    pub report_dir: PathBuf,
    /// `--ginkgo.timeout`
    pub timeout: Duration,
}

impl Suite {
    /// The LoadBalancer tests and the Services conformance tests.
    pub fn full(report_dir: &Path) -> Suite {
        Suite {
            focus: format!("{LOADBALANCER}|{SERVICES_CONFORMANCE}"),
            skip: None,
            report_dir: report_dir.to_path_buf(),
            timeout: Duration::from_secs(3 * 3600),
        }
    }
}

/// What one run found.
#[derive(Debug)]
pub struct Outcome {
    /// `None` if the suite never printed its summary.
    pub totals: Option<Totals>,
    pub specs: Vec<Spec>,
    pub took: Duration,
    pub log: PathBuf,
    pub junit: PathBuf,
}

impl Outcome {
    /// One line per spec that ran: state, seconds, name (and why, if not passed).
    pub fn table(&self) -> String {
        let mut out = String::new();
        for s in &self.specs {
            let state = match s.state {
                State::Passed => "passed ",
                State::Failed => "FAILED ",
                State::Skipped => "SKIPPED",
            };
            out.push_str(&format!(
                "  {state} {:>7.1}s  {}\n",
                s.time.as_secs_f64(),
                s.name
            ));
            if s.state != State::Passed && !s.message.is_empty() {
                out.push_str(&format!("           {}\n", s.message));
            }
        }
        out
    }
}

impl Outcome {
    /// The specs as a Markdown table (test, result, seconds), for docs/conformance.md.
    pub fn markdown(&self) -> String {
        let mut out = String::from("| test | result | seconds |\n|---|---|---|\n");
        for s in &self.specs {
            let name = s
                .name
                .trim_start_matches("[It] ")
                .split(" [sig-")
                .next()
                .unwrap_or(&s.name);
            let state = match s.state {
                State::Passed => "passed".to_string(),
                State::Failed => format!("FAILED: {}", s.message),
                State::Skipped => format!("skipped: {}", s.message),
            };
            out.push_str(&format!(
                "| {} | {state} | {:.0} |\n",
                name.replace('|', "\\|"),
                s.time.as_secs_f64()
            ));
        }
        out
    }
}

impl RealCluster {
    /// Runs `e2e.test --provider=local` from the client's namespace against this
    /// cluster, streaming its output to stdout and `<report_dir>/e2e.log`.
    pub fn run_e2e(&self, suite: &Suite) -> Result<Outcome> {
        let e2e = self.assets().bin("e2e.test");
        if !e2e.is_file() {
            return Err(Error::MissingBinary {
                name: "e2e.test".into(),
                searched: self.assets().dir.display().to_string(),
                hint: "`make k8s` (scripts/build-k8s.sh)".into(),
            });
        }
        std::fs::create_dir_all(&suite.report_dir)
            .map_err(Error::io("creating the report folder"))?;
        let log_path = suite.report_dir.join("e2e.log");
        let junit = suite.report_dir.join("junit.xml");
        let _ = std::fs::remove_file(&junit);
        let log = std::fs::File::create(&log_path).map_err(Error::io("creating e2e.log"))?;
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            self.plan.ns("client"),
            e2e.display().to_string(),
            "--provider=local".into(),
            format!("--kubeconfig={}", self.fabric_kubeconfig().display()),
            format!("--kubectl-path={}", self.assets().kubectl().display()),
            format!("--report-dir={}", suite.report_dir.display()),
            format!("--ginkgo.focus={}", suite.focus),
            format!("--ginkgo.junit-report={}", junit.display()),
            format!("--ginkgo.timeout={}s", suite.timeout.as_secs()),
            "--ginkgo.no-color".into(),
            "--ginkgo.v".into(),
            // nodes' logs are in the cluster's folder already
            "--disable-log-dump".into(),
        ];
        if let Some(skip) = &suite.skip {
            args.push(format!("--ginkgo.skip={skip}"));
        }
        let started = Instant::now();
        let mut child = Command::new("ip")
            .args(&args)
            .current_dir(&suite.report_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(Error::io("starting e2e.test"))?;
        let sink = Arc::new(Mutex::new((log, String::new())));
        let pipes: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stdout.take().expect("piped")),
            Box::new(child.stderr.take().expect("piped")),
        ];
        let threads: Vec<_> = pipes
            .into_iter()
            .map(|p| {
                let sink = Arc::clone(&sink);
                std::thread::spawn(move || {
                    for line in BufReader::new(p).lines().map_while(|l| l.ok()) {
                        println!("{line}");
                        let mut s = sink.lock().expect("the log lock");
                        let _ = writeln!(s.0, "{line}");
                        s.1.push_str(&line);
                        s.1.push('\n');
                    }
                })
            })
            .collect();
        let status = child.wait().map_err(Error::io("waiting for e2e.test"))?;
        for t in threads {
            let _ = t.join();
        }
        let output = std::mem::take(&mut sink.lock().expect("the log lock").1);
        let specs = std::fs::read_to_string(&junit)
            .map(|x| summary::specs(&x))
            .unwrap_or_default();
        let totals = summary::totals(&output);
        if totals.is_none() {
            eprintln!("e2e.test ended ({status}) without its summary; its log: {log_path:?}");
        }
        Ok(Outcome {
            totals,
            specs,
            took: started.elapsed(),
            log: log_path,
            junit,
        })
    }

    /// The admin kubeconfig that reaches kube-apiserver through the ToR's bridge.
    pub fn fabric_kubeconfig(&self) -> &Path {
        &self.fabric_admin
    }

    /// What the suite's Services left behind, waiting up to `limit` for it to go:
    /// allocated pool addresses, routes to pool addresses at the ToR, VIP entries in
    /// the edges' BPF maps, and panics or restarts of ringlb's pods. Empty if clean.
    pub fn leftovers(&self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let mut left = Vec::new();
            left.extend(self.pool_leftovers());
            left.extend(self.route_leftovers());
            left.extend(self.bpf_leftovers());
            if left.is_empty() || Instant::now() >= deadline {
                left.extend(self.pod_troubles());
                return left;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    fn pool_leftovers(&self) -> Vec<String> {
        let out = match self.kubectl(&[
            "get",
            "ippools",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.ipv4.allocated} {.status.ipv6.allocated}{\"\\n\"}{end}",
        ]) {
            Ok(o) => o,
            Err(e) => return vec![format!("reading the IPPools: {e}")],
        };
        out.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let name = w.next()?;
                let used: u64 = w.filter_map(|n| n.parse::<u64>().ok()).sum();
                (used > 0).then(|| format!("IPPool {name}: {used} addresses still allocated"))
            })
            .collect()
    }

    fn route_leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        use super::plan::{POOL_V4_FIRST, POOL_V4_LAST, POOL_V6_FIRST, POOL_V6_LAST};
        for (fam, first, last) in [
            ("-4", POOL_V4_FIRST, POOL_V4_LAST),
            ("-6", POOL_V6_FIRST, POOL_V6_LAST),
        ] {
            let pool = format!("{first}-{last}");
            match crate::lab::cmd::run_in(&self.plan.ns("tor"), &["ip", fam, "route", "show"]) {
                Ok(out) => left.extend(
                    out.lines()
                        .filter(|l| route_in_pool(l, &pool))
                        .map(|l| format!("route at the ToR: {l}")),
                ),
                Err(e) => left.push(format!("reading the ToR's routes: {e}")),
            }
        }
        left
    }

    fn bpf_leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for n in self.nodes.iter().filter(|n| n.plan.edge) {
            // the chart's edge.pinDir
            let map = "/sys/fs/bpf/ringlb/vips";
            match n.exec(&["bpftool", "-j", "map", "dump", "pinned", map]) {
                Ok(out) => {
                    let entries = out.matches("\"key\"").count();
                    if entries > 0 {
                        left.push(format!("{}: {entries} entries left in {map}", n.plan.name));
                    }
                }
                Err(e) => left.push(format!("{}: reading {map}: {e}", n.plan.name)),
            }
        }
        left
    }

    /// Restarts of ringlb's pods, and `panicked at` in their logs.
    fn pod_troubles(&self) -> Vec<String> {
        let mut left = Vec::new();
        let pods = self
            .kubectl(&[
                "get",
                "pods",
                "-n",
                RELEASE_NAMESPACE,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[*].restartCount}{\"\\n\"}{end}",
            ])
            .unwrap_or_default();
        for l in pods.lines() {
            let mut w = l.split_whitespace();
            let Some(pod) = w.next() else { continue };
            let restarts: u64 = w.filter_map(|n| n.parse::<u64>().ok()).sum();
            if restarts > 0 {
                left.push(format!("pod {pod}: {restarts} restarts"));
            }
            let logs = self
                .kubectl(&["logs", "-n", RELEASE_NAMESPACE, pod, "--all-containers"])
                .unwrap_or_default();
            if let Some(p) = logs.lines().find(|l| l.contains("panicked at")) {
                left.push(format!("pod {pod} panicked: {p}"));
            }
        }
        left
    }
}

/// Whether a line of `ip route show` is a route to an address of `pool`
/// (`first-last`, as the harness's IPPool writes it).
fn route_in_pool(line: &str, pool: &str) -> bool {
    let Some(dst) = line.split_whitespace().next() else {
        return false;
    };
    let addr = dst.split('/').next().unwrap_or(dst);
    let (Some((first, last)), Ok(a)) = (pool.split_once('-'), addr.parse::<std::net::IpAddr>())
    else {
        return false;
    };
    match (
        first.parse::<std::net::IpAddr>(),
        last.parse::<std::net::IpAddr>(),
    ) {
        (Ok(f), Ok(l)) => f <= a && a <= l,
        _ => false,
    }
}

/// `ringlb-lab conformance`: the cluster, `helm install`, the suite, the leftover
/// checks; the cluster is torn down at the end. Fails unless every spec that ran
/// passed, none skipped itself, and nothing was left.
pub fn cli(prefix: &str, dir: &Path, mode: &str, suite: Suite) -> Result<()> {
    let (proxy_mode, rt) = super::cli_start(prefix, dir, mode)?;
    let result = rt.block_on(async {
        let mut o = Options::new(prefix, dir);
        o.proxy_mode = proxy_mode;
        let rc = RealCluster::up(o).await?;
        tokio::task::block_in_place(|| run_on(&rc, mode, &suite))
    });
    super::teardown(prefix, dir);
    result
}

fn run_on(rc: &RealCluster, mode: &str, suite: &Suite) -> Result<()> {
    println!("==> cluster up (kube-proxy {mode}); helm install ringlb");
    rc.helm_install("")?;
    println!("==> e2e.test --ginkgo.focus='{}'", suite.focus);
    let outcome = rc.run_e2e(suite)?;
    println!("\n==> leftovers of the suite's Services");
    let left = rc.leftovers(Duration::from_secs(90));
    for l in &left {
        println!("  LEFT: {l}");
    }
    if left.is_empty() {
        println!(
            "  none: pools empty, no route at the ToR, no VIP in any edge's BPF map, no panic or restart"
        );
    }
    println!(
        "\n==> conformance (kube-proxy {mode}, {:.0} s):\n{}",
        outcome.took.as_secs_f64(),
        outcome.table()
    );
    let md = outcome.junit.with_file_name("results.md");
    let _ = std::fs::write(&md, outcome.markdown());
    println!("  JUnit report: {}", outcome.junit.display());
    println!("  as a table: {}", md.display());
    println!("  the suite's log: {}", outcome.log.display());
    match &outcome.totals {
        Some(t) => println!(
            "  Ran {} of {} Specs: {} Passed | {} Failed | {} skipped themselves",
            t.ran, t.of, t.passed, t.failed, t.skipped
        ),
        None => println!("  the suite printed no summary"),
    }
    let clean = outcome.totals.as_ref().is_some_and(Totals::clean);
    if clean && left.is_empty() {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "conformance failed: {}{}",
            if clean {
                "every spec passed"
            } else {
                "not every spec passed"
            },
            if left.is_empty() {
                String::new()
            } else {
                format!("; {} leftovers", left.len())
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_inside_the_pool_are_leftovers() {
        let pool = "10.211.100.10-10.211.100.250";
        assert!(route_in_pool(
            "10.211.100.10 proto bird metric 32 nexthop via 172.31.0.11",
            pool
        ));
        assert!(!route_in_pool("10.244.1.0/24 via 172.31.0.11", pool));
        assert!(!route_in_pool("10.211.100.251 via 172.31.0.11", pool));
        let pool6 = "fd00:211:100::10-fd00:211:100::fa";
        assert!(route_in_pool(
            "fd00:211:100::11 proto bird metric 32",
            pool6
        ));
        assert!(!route_in_pool("fd00:10:244:1::/64 via fe80::1", pool6));
    }
}
