//! ringlb-apisim: the Kubernetes API simulator as a program, for `make demo` and for
//! pointing kubectl at by hand.
//!
//! ```text
//! ringlb-apisim --listen 127.0.0.1:6443 --kubeconfig-out /tmp/apisim/kubeconfig
//! kubectl --kubeconfig /tmp/apisim/kubeconfig get svc
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use ipnetwork::IpNetwork;
use ringlb_e2e::{SimOptions, Simulator};

#[derive(Debug, Parser)]
#[command(
    name = "ringlb-apisim",
    about = "Kubernetes API simulator (plain HTTP, no auth) for tests and demos"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at the simulator.
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// Service CIDRs (primary family first), comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10.96.0.0/16,fd00:10:96::/112"
    )]
    service_cidrs: Vec<IpNetwork>,
    /// Pod CIDRs the simulated kubelet allocates from, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10.244.0.0/16,fd00:10:244::/64"
    )]
    pod_cidrs: Vec<IpNetwork>,
    /// Explicit pod IPs handed out first (e.g. lab host addresses), comma separated.
    #[arg(long, value_delimiter = ',')]
    pod_ips: Vec<IpAddr>,
    /// Do not start pods (they stay Pending until their status is written).
    #[arg(long)]
    no_kubelet: bool,
    /// Changes kept for watches; older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = 100_000)]
    history_limit: usize,
    /// Log filter (error, warn, info, debug, trace or an EnvFilter directive).
    #[arg(long, default_value = "info", env = "RINGLB_LOG")]
    log_level: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringlb_ops::logging::init(&args.log_level).map_err(anyhow::Error::msg)?;
    let opts = SimOptions {
        listen: args.listen,
        kubeconfig_path: Some(args.kubeconfig_out.clone()),
        service_cidrs: args.service_cidrs,
        pod_cidrs: args.pod_cidrs,
        pod_ips: args.pod_ips,
        kubelet: !args.no_kubelet,
        history_limit: args.history_limit,
        ..SimOptions::default()
    };
    let sim = Simulator::start(opts)
        .await
        .context("starting the API simulator")?;
    println!(
        "apisim listening on {} (kubeconfig {})",
        sim.url(),
        sim.kubeconfig_path().display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    sim.shutdown().await;
    Ok(())
}
