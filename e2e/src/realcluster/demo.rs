//! `make demo`: the real cluster, step by step, each step with its evidence and the
//! command that shows it (copy-pasteable while the cluster is up; `--keep` leaves it
//! up until Ctrl-C).

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::workload::WEB;
use super::{Options, RealCluster, plan};
use crate::lab::{Error, Result};

/// Prints numbered steps with the time since the start.
pub struct Steps {
    n: usize,
    total: usize,
    start: Instant,
}

impl Steps {
    pub fn new(total: usize) -> Steps {
        Steps {
            n: 0,
            total,
            start: Instant::now(),
        }
    }

    pub fn step(&mut self, title: &str) {
        self.n += 1;
        println!(
            "\n==> [{}/{}] {title}  (t={:.1}s)",
            self.n,
            self.total,
            self.start.elapsed().as_secs_f64()
        );
    }

    /// A command as the user would type it, and what it printed.
    pub fn shown(&self, cmd: &str, out: &str) {
        println!("$ {cmd}");
        for l in out.trim_end().lines() {
            println!("  {l}");
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

impl RealCluster {
    /// `kubectl --kubeconfig <admin> ARGS` as a user pastes it.
    pub fn kubectl_shown(&self, args: &str) -> String {
        format!(
            "{} --kubeconfig {} {args}",
            self.assets().kubectl().display(),
            self.cp.kubeconfig_path().display()
        )
    }

    fn in_ns_shown(&self, role: &str, cmd: &str) -> String {
        format!("ip netns exec {} {cmd}", self.plan.ns(role))
    }
}

/// Brings the cluster up, installs ringlb, exposes a Deployment and shows the path;
/// returns the cluster (still up) and the two VIPs.
pub async fn bring_up(o: Options, s: &mut Steps) -> Result<(RealCluster, IpAddr, IpAddr)> {
    s.step(
        "cluster: control plane on the host, a BIRD ToR, a client, 2 edges + 2 workers \
         (each: own network and mount namespace, containerd, kubelet, kube-proxy)",
    );
    let rc = RealCluster::up(o).await?;
    for (what, took) in &rc.timings {
        println!("  {what}: {:.1} s", took.as_secs_f64());
    }
    tokio::task::block_in_place(|| show(&rc, s)).map(|(a, b)| (rc, a, b))
}

fn show(rc: &RealCluster, s: &mut Steps) -> Result<(IpAddr, IpAddr)> {
    s.shown(
        &rc.kubectl_shown("get nodes -o wide"),
        &rc.kubectl(&["get", "nodes", "-o", "wide"])?,
    );

    s.step("helm install ringlb charts/ringlb -f values.yaml (images imported into every node)");
    let t = Instant::now();
    let out = rc.helm_install("")?;
    println!(
        "  installed and Ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    s.shown(
        &format!(
            "helm --kubeconfig {} install ringlb charts/ringlb -n ringlb-system --create-namespace -f {} --wait",
            rc.cp.kubeconfig_path().display(),
            rc.dir.join("values.yaml").display()
        ),
        out.lines().take(6).collect::<Vec<_>>().join("\n").as_str(),
    );
    s.shown(
        &rc.kubectl_shown("get pods -n ringlb-system -o wide"),
        &rc.kubectl(&["get", "pods", "-n", "ringlb-system", "-o", "wide"])?,
    );

    s.step("kubectl create deployment web (agnhost netexec :8080) + kubectl expose --type=LoadBalancer");
    rc.deploy_web(6, true)?;
    let exposed = rc.expose_web()?;
    s.shown(
        &rc.kubectl_shown(&format!(
            "create deployment {WEB} --image={} --replicas=6 -- /agnhost netexec --http-port=8080",
            plan::AGNHOST_IMAGE
        )),
        "deployment.apps/web created",
    );
    s.shown(
        &rc.kubectl_shown("expose deployment web --type=LoadBalancer --port=80 --target-port=8080"),
        &exposed,
    );
    let t = Instant::now();
    let (v4, v6) = rc.wait_vips(WEB, Duration::from_secs(30))?;
    println!(
        "  an IPv4 and an IPv6 VIP in the Service's status after {} ms",
        t.elapsed().as_millis()
    );
    s.shown(
        &rc.kubectl_shown("get service web -o wide"),
        &rc.kubectl(&["get", "service", WEB, "-o", "wide"])?,
    );
    s.shown(
        &rc.kubectl_shown("get pods -l app=web -o wide"),
        &rc.kubectl(&["get", "pods", "-l", "app=web", "-o", "wide"])?,
    );

    s.step("BGP: both edges announce both VIPs; the ToR installs ECMP routes");
    for vip in [v4, v6] {
        rc.wait_ecmp(vip, 2, Duration::from_secs(60))?;
        let fam = if vip.is_ipv6() { "-6" } else { "-4" };
        s.shown(
            &rc.in_ns_shown("tor", &format!("ip {fam} route show {vip}")),
            &crate::lab::cmd::run_in(
                &rc.plan.ns("tor"),
                &["ip", fam, "route", "show", &vip.to_string()],
            )?,
        );
    }

    s.step("traffic: the client reaches the pods on every node through the edges; the pods see the client");
    rc.count_vip_sources()?;
    for vip in [v4, v6] {
        let url = match vip {
            IpAddr::V4(_) => format!("http://{vip}/clientip"),
            IpAddr::V6(_) => format!("http://[{vip}]/clientip"),
        };
        s.shown(
            &rc.in_ns_shown("client", &format!("curl -g {url}")),
            &rc.get(vip, "clientip")?,
        );
        let spread = rc.spread(vip, 20)?;
        println!("  20 requests to {vip}/hostname answered by: {spread:?}");
    }
    let counters = rc.vip_source_counters()?;
    println!(
        "  frames at the ToR, per node port (<node>-encap: IPIP from the node; \
         <node>-reply: a VIP as source):"
    );
    for (k, v) in &counters {
        println!("    {k}: {v}");
    }
    println!(
        "  => the edges encapsulated the requests; every pod answered the client straight from \
         its own node (DSR): an edge's port carries only the replies of the pods on that edge"
    );
    println!(
        "  ({})",
        rc.in_ns_shown("tor", "nft list table bridge ringlb_lab")
    );
    Ok((v4, v6))
}

/// What to paste while `--keep` holds the cluster up.
pub fn print_try(rc: &RealCluster, v4: IpAddr, v6: IpAddr, lab: &Path) {
    println!("\nThe cluster stays up until Ctrl-C. Try:");
    println!("  {}", rc.kubectl_shown("get nodes,pods -A -o wide"));
    println!(
        "  {}",
        rc.in_ns_shown("client", &format!("curl http://{v4}/hostname"))
    );
    println!(
        "  {}",
        rc.in_ns_shown("client", &format!("curl -g http://[{v6}]/clientip"))
    );
    println!(
        "  {}",
        rc.kubectl_shown("logs -n ringlb-system -l app.kubernetes.io/component=edge --tail=20")
    );
    println!(
        "  ip netns exec {} birdc -s {} show route",
        rc.plan.ns("tor"),
        rc.dir.join("bird.ctl").display()
    );
    println!(
        "  {} --prefix {} cluster-down   (after a crash: removes what is left)",
        lab.display(),
        rc.plan.prefix
    );
}

/// `ringlb-lab cluster-demo`: [`bring_up`] with every step shown, torn down at the end
/// or, with `keep`, at Ctrl-C/SIGTERM; a sweep of anything left follows either way.
pub fn cli(prefix: &str, dir: &Path, keep: bool, mode: &str) -> Result<()> {
    let (proxy_mode, rt) = super::cli_start(prefix, dir, mode)?;
    let lab_bin = std::env::current_exe().map_err(Error::io("finding ringlb-lab"))?;
    let result = rt.block_on(async {
        let mut o = Options::new(prefix, dir);
        o.proxy_mode = proxy_mode;
        let mut steps = Steps::new(5);
        let up = tokio::select! {
            r = bring_up(o, &mut steps) => r,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("\ninterrupted");
                return Ok(());
            }
        };
        let (rc, v4, v6) = up?;
        println!(
            "\ndemo OK in {:.0} s: kubectl expose --type=LoadBalancer -> VIPs {v4} and {v6} -> \
             BGP ECMP at the ToR -> XDP on both edges -> node agents -> pods on every node, \
             replies by DSR",
            steps.elapsed().as_secs_f64()
        );
        if keep {
            print_try(&rc, v4, v6, &lab_bin);
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .map_err(Error::io("waiting for SIGTERM"))?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        println!("\n==> teardown");
        drop(rc);
        Ok(())
    });
    let removed = super::teardown(prefix, dir);
    let left = crate::lab::netns::list()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .count();
    println!(
        "  every process stopped, namespaces deleted{}; {prefix}-* namespaces left: {left}",
        if removed.is_empty() {
            String::new()
        } else {
            format!(" (swept: {})", removed.join(", "))
        }
    );
    if !keep {
        println!(
            "  to keep the cluster up and try it yourself: {} --prefix {prefix} cluster-demo --keep",
            lab_bin.display()
        );
    }
    result
}
