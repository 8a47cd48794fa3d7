//! ringlb-controller: allocates VIPs for `type: LoadBalancer` Services.
//!
//! Wiring only: flags, logging, the ops endpoint, the Kubernetes client, signals. The
//! controller itself, and its start-up order, is `ringlb_controller::app`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use prometheus_client::registry::Registry;
use ringlb_controller::app::{self, Settings};
use ringlb_controller::leader::LeaderConfig;
use ringlb_controller::metrics::Metrics;
use ringlb_ops::flags::parse_duration;
use ringlb_ops::{CommonArgs, Health};

/// Allocates VIPs from IPPools for Services of type LoadBalancer and writes them to
/// status.loadBalancer.ingress.
#[derive(Parser, Debug)]
#[command(name = "ringlb-controller", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Option<Command>,

    /// Also serve LoadBalancer Services that set no spec.loadBalancerClass.
    /// `--default-class=false` serves only class ringlb.io/maglev.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    default_class: bool,

    /// Run leader election (needed with more than one replica).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,

    /// Namespace of the leader Lease, and of the edges' Leases the cleanup finalizer
    /// waits for (the release namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "ringlb-system")]
    lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, default_value = "ringlb-controller")]
    lease_name: String,

    /// This replica's identity in the Lease. Default: $POD_NAME, else hostname-pid.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// This replica's ServiceAccount (in the Lease's namespace), made the Lease's
    /// owner: the Lease goes with it, and a new installation's ServiceAccount takes
    /// over a Lease left by the previous one at once. Unset: no owner.
    #[arg(long, env = "POD_SERVICE_ACCOUNT")]
    service_account: Option<String>,

    /// How long a Lease is valid without renewal (e.g. 15s, 1500ms).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,

    /// The leader gives up (and exits) when it could not renew for this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,

    /// How often candidates retry and the leader renews.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,

    /// A loop (Lease, Service controller, IPPool or Namespace watch) silent for this
    /// long is stalled: /healthz answers 503 naming it.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    stall_timeout: Duration,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// For uninstalling: waits until no controller holds the Lease (--lease-namespace,
    /// --lease-name), then removes the finalizer service.kubernetes.io/load-balancer-cleanup
    /// from every Service and exits. Statuses are left as they are.
    RemoveFinalizers {
        /// Give up when a controller still leads after this long.
        #[arg(long, default_value = "120s", value_parser = parse_duration)]
        timeout: Duration,
    },
}

impl Args {
    fn settings(&self) -> Settings {
        let identity = self.identity.clone().unwrap_or_else(default_identity);
        let leader = self.leader_elect.then(|| LeaderConfig {
            namespace: self.lease_namespace.clone(),
            name: self.lease_name.clone(),
            identity: identity.clone(),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            service_account: self.service_account.clone(),
        });
        Settings {
            default_class: self.default_class,
            leader,
            identity,
            stall_timeout: self.stall_timeout,
            namespace: self.lease_namespace.clone(),
        }
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}-{}", std::process::id())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringlb_ops::logging::init(&args.common.log_level, args.common.log_format)
        .map_err(anyhow::Error::msg)?;
    if let Some(Command::RemoveFinalizers { timeout }) = args.command {
        let client = args.common.connect().await?;
        let n = ringlb_controller::cleanup::remove_all(
            &client,
            &args.lease_namespace,
            &args.lease_name,
            timeout,
        )
        .await?;
        tracing::info!(services = n, "finalizers removed");
        return Ok(());
    }
    let settings = args.settings();
    settings.validate()?;

    let health = Health::new();
    let mut registry = Registry::with_prefix("ringlb");
    let metrics = Metrics::register(&mut registry);
    let registry = Arc::new(tokio::sync::Mutex::new(registry));
    let metrics_addr = args
        .common
        .metrics_addr_or(ringlb_ops::flags::ops_port::CONTROLLER);
    let (addr, _ops) = ringlb_ops::serve_ops(metrics_addr, registry, health.clone())
        .await
        .with_context(|| format!("binding --metrics-addr {metrics_addr}"))?;
    tracing::info!(%addr, identity = %settings.identity, "serving /metrics /healthz /readyz");

    let client = args.common.connect().await?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    app::run(client, settings, &health, metrics, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let a =
            Args::try_parse_from(["c", "--default-class=false", "--leader-elect=false"]).unwrap();
        assert!(!a.default_class && !a.leader_elect);
        assert!(a.settings().leader.is_none());
        let a = Args::try_parse_from(["c", "--identity", "r1"]).unwrap();
        assert!(a.default_class && a.leader_elect);
        let s = a.settings();
        assert_eq!(s.leader.unwrap().identity, "r1");
        assert_eq!(s.stall_timeout, Duration::from_secs(60));
        assert!(Args::try_parse_from(["c", "--lease-duration", "fast"]).is_err());
    }

    /// Every flag of `--help` is in docs/operating.md's "### Flags" section, and every flag the
    /// section's `ringlb-controller` paragraph names is one the program takes.
    #[test]
    fn readme_flags_section_matches_help() {
        use clap::CommandFactory;
        let readme = include_str!("../../docs/operating.md");
        let start = readme
            .find("### Flags")
            .expect("docs/operating.md has a ### Flags section");
        let section = &readme[start..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let help = Args::command().render_long_help().to_string();
        let helped = flags_in(&help);
        let documented = flags_in(section);
        for flag in &helped {
            if flag != "--help" && flag != "--version" {
                assert!(
                    documented.contains(flag),
                    "ringlb-controller takes {flag}, docs/operating.md's Flags section does not name it"
                );
            }
        }
        for para in section.split("\n\n") {
            if para.trim_start().starts_with("`ringlb-controller`") {
                for flag in flags_in(para) {
                    assert!(
                        helped.contains(&flag),
                        "docs/operating.md names {flag}:\n{para}"
                    );
                }
            }
        }
    }

    /// The `--flags` in `text`.
    fn flags_in(text: &str) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let mut rest = text;
        while let Some(i) = rest.find("--") {
            let tail = &rest[i + 2..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(tail.len());
            if tail[..end].starts_with(|c: char| c.is_ascii_lowercase()) {
                out.insert(format!("--{}", &tail[..end]));
            }
            rest = &tail[end..];
        }
        out
    }
}
