//! ringlb-edge: the edge node's datapath and BGP speaker.

use clap::{Parser, Subcommand};
use ringlb_ops::CommonArgs;

/// Programs the Maglev datapath for ringlb VIPs and announces them over BGP.
#[derive(Parser, Debug)]
#[command(name = "ringlb-edge", version, about)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the edge agent: watch the API, program the datapath, announce VIPs.
    Run(ringlb_edge::agent::RunArgs),
    /// Run only the BGP speaker, with peers, policy and prefixes from a YAML file (no
    /// Kubernetes); see docs/bgp.md.
    Speaker {
        /// The speaker's YAML configuration file.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Operator commands against the running edge's pinned XDP maps: dump VIPs and
    /// backends, show counters, look up a 5-tuple, uninstall; see docs/datapath.md.
    Datapath(ringlb_xdp::cli::DatapathArgs),
    /// Run the node agent on a worker node: feed the tc datapath (decap, VIP:port ->
    /// pod:targetPort, DSR replies) from Services, EndpointSlices and this node's Pods;
    /// `node uninstall` removes it; see docs/node.md.
    Node(ringlb_edge::node::NodeArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringlb_ops::logging::init(&args.common.log_level).map_err(anyhow::Error::msg)?;
    match args.command {
        Command::Run(run) => ringlb_edge::agent::run(&args.common, &run).await,
        Command::Speaker { config } => {
            Ok(ringlb_bgp::standalone::run(&config, args.common.metrics_addr).await?)
        }
        Command::Datapath(dp) => Ok(ringlb_xdp::cli::run(&dp, &mut std::io::stdout())?),
        Command::Node(node) => ringlb_edge::node::run(&args.common, &node).await,
    }
}
