//! ringlb-controller: allocates VIPs for `type: LoadBalancer` Services.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use prometheus_client::registry::Registry;
use ringlb_ops::{CommonArgs, Health};
use tokio::sync::Mutex;

/// Allocates VIPs from IPPools for Services of type LoadBalancer and writes them to
/// status.loadBalancer.ingress.
#[derive(Parser, Debug)]
#[command(name = "ringlb-controller", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringlb_ops::logging::init(&args.common.log_level).map_err(anyhow::Error::msg)?;
    let health = Health::new();
    let registry = Arc::new(Mutex::new(Registry::with_prefix("ringlb")));
    let (addr, _ops) = ringlb_ops::serve_ops(args.common.metrics_addr, registry, health.clone())
        .await
        .with_context(|| format!("binding --metrics-addr {}", args.common.metrics_addr))?;
    tracing::info!(%addr, "serving /metrics /healthz /readyz");
    let _client = args.common.kube_client().await?;
    anyhow::bail!("the controller loop is not built yet")
}
