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
        /// With `onSigterm: restart`: hold the Up BFD sessions of peers routed via
        /// this interface in the XDP program pinned in --pin-dir across the restart
        /// (its `bfd_hold` map), and resume them at start; see docs/bgp.md.
        #[arg(long)]
        bfd_hold_interface: Option<String>,
        /// Where that XDP program's maps are pinned.
        #[arg(long, default_value = ringlb_xdp::xdp::DEFAULT_PIN_DIR)]
        pin_dir: std::path::PathBuf,
    },
    /// Operator commands against the running edge's pinned XDP maps: dump VIPs and
    /// backends, show counters, look up a 5-tuple, uninstall; see docs/datapath.md.
    Datapath(Offline<ringlb_xdp::cli::DatapathArgs>),
    /// Run the node agent on a worker node: feed the tc datapath (decap, VIP:port ->
    /// pod:targetPort, DSR replies) from Services, EndpointSlices and this node's Pods;
    /// `node uninstall` removes it; see docs/node.md.
    Node(ringlb_edge::node_agent::NodeArgs),
    /// Mount a bpffs at --path unless one is there already (idempotent), then exit.
    /// The Helm chart's init container runs it so that nodes need no setup; see
    /// docs/install.md.
    MountBpffs {
        /// Where the bpffs belongs: the host's /sys/fs/bpf, mounted into the
        /// container with mountPropagation Bidirectional.
        #[arg(long, default_value = "/sys/fs/bpf")]
        path: std::path::PathBuf,
    },
}

/// A subcommand that reads no API and serves no metrics. It declares the global
/// `--kubeconfig` and `--metrics-addr` itself, hidden, so clap does not copy the
/// shown ones into its help (and its subcommands'); they are accepted and unused.
#[derive(clap::Args, Debug)]
struct Offline<T: clap::Args> {
    #[command(flatten)]
    args: T,
    #[arg(long, hide = true, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    #[arg(long, hide = true, global = true)]
    metrics_addr: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ringlb_ops::logging::init(&args.common.log_level, args.common.log_format)
        .map_err(anyhow::Error::msg)?;
    match args.command {
        Command::Run(run) => ringlb_edge::agent::run(&args.common, &run).await,
        Command::Speaker {
            config,
            bfd_hold_interface,
            pin_dir,
        } => {
            let hold = bfd_hold_interface.map(|i| {
                let s = ringlb_edge::bfd_hold::XdpHoldStore::new(pin_dir, i);
                std::sync::Arc::new(s) as std::sync::Arc<dyn ringlb_bgp::bfd::hold::HoldStore>
            });
            let addr = args
                .common
                .metrics_addr_or(ringlb_ops::flags::ops_port::EDGE);
            Ok(ringlb_bgp::standalone::run_with_hold(&config, addr, hold).await?)
        }
        Command::Datapath(dp) => Ok(ringlb_xdp::cli::run(&dp.args, &mut std::io::stdout())?),
        Command::Node(node) => ringlb_edge::node_agent::run(&args.common, &node).await,
        Command::MountBpffs { path } => {
            use ringlb_bpf_types::{BpffsMount, mount_bpffs};
            let path_text = path.display().to_string();
            match mount_bpffs(&path)? {
                BpffsMount::AlreadyMounted => tracing::info!(
                    path = %path_text,
                    "a bpffs is already mounted here; nothing to do"
                ),
                BpffsMount::Mounted => tracing::info!(path = %path_text, "mounted a bpffs"),
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn datapath_help_does_not_list_the_flags_it_ignores() {
        let help = |path: &[&str]| {
            let mut c = Args::command();
            c.build();
            let mut cur = &mut c;
            for p in path {
                cur = cur.find_subcommand_mut(p).unwrap();
            }
            cur.render_long_help().to_string()
        };
        for path in [
            &["datapath"][..],
            &["datapath", "dump"],
            &["datapath", "lookup"],
        ] {
            let h = help(path);
            assert!(
                !h.contains("--kubeconfig") && !h.contains("--metrics-addr"),
                "{path:?}: {h}"
            );
            assert!(h.contains("--log-level"), "{path:?}: {h}");
        }
        for path in [&["run"][..], &["node"], &["speaker"]] {
            let h = help(path);
            assert!(
                h.contains("--kubeconfig") && h.contains("--metrics-addr"),
                "{path:?}: {h}"
            );
        }
        // Still accepted there, before or after the subcommand.
        for args in [
            &["e", "datapath", "--metrics-addr", "127.0.0.1:1", "counters"][..],
            &["e", "--kubeconfig", "/k", "datapath", "dump"],
        ] {
            let a = Args::try_parse_from(args);
            assert!(
                matches!(
                    a,
                    Ok(Args {
                        command: Command::Datapath(_),
                        ..
                    })
                ),
                "{args:?}"
            );
        }
    }

    #[test]
    fn common_flags_go_before_or_after_the_subcommand() {
        let tail = ["--node-name", "n", "--interface", "eth0"];
        for args in [
            vec![
                "e",
                "--kubeconfig",
                "/k",
                "--metrics-addr",
                "127.0.0.1:1",
                "run",
            ],
            vec![
                "e",
                "run",
                "--kubeconfig",
                "/k",
                "--metrics-addr",
                "127.0.0.1:1",
            ],
            vec![
                "e",
                "--kubeconfig",
                "/k",
                "run",
                "--metrics-addr",
                "127.0.0.1:1",
            ],
        ] {
            let args: Vec<&str> = args.into_iter().chain(tail).collect();
            let a = Args::try_parse_from(&args).unwrap();
            assert_eq!(
                a.common.kubeconfig.as_deref(),
                Some("/k".as_ref()),
                "{args:?}"
            );
            assert_eq!(a.common.metrics_addr.map(|a| a.port()), Some(1), "{args:?}");
            assert!(matches!(a.command, Command::Run(_)), "{args:?}");
        }
        for sub in [
            &["node", "--node-name", "n"][..],
            &["node", "uninstall"],
            &["speaker", "--config", "f"],
            &["datapath", "counters"],
        ] {
            let args: Vec<&str> = ["e"]
                .into_iter()
                .chain(sub.iter().copied())
                .chain(["--log-level", "debug"])
                .collect();
            let a = Args::try_parse_from(&args).unwrap();
            assert_eq!(a.common.log_level, "debug", "{args:?}");
        }
    }

    #[test]
    fn durations_and_booleans_are_written_as_in_the_controller() {
        let run = |extra: &[&str]| {
            let mut v = vec!["e", "run", "--node-name", "n", "--interface", "eth0"];
            v.extend_from_slice(extra);
            match Args::try_parse_from(v).map(|a| a.command) {
                Ok(Command::Run(r)) => Ok(r),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e),
            }
        };
        let r = run(&[]).unwrap();
        assert_eq!(r.drain, std::time::Duration::from_secs(30));
        assert!(r.default_class);
        assert_eq!(run(&["--drain", "1500ms"]).unwrap().drain.as_millis(), 1500);
        // the old spelling, integer seconds
        assert_eq!(run(&["--drain-seconds", "5"]).unwrap().drain.as_secs(), 5);
        assert!(run(&["--drain", "soon"]).is_err());
        assert!(run(&["--default-class"]).unwrap().default_class);
        assert!(!run(&["--default-class=false"]).unwrap().default_class);
        use ringlb_edge::agent::OnSigterm;
        assert_eq!(run(&[]).unwrap().on_sigterm, OnSigterm::Drain);
        let r = run(&["--on-sigterm", "restart"]).unwrap();
        assert_eq!(r.on_sigterm, OnSigterm::Restart);
        assert!(run(&["--on-sigterm", "reboot"]).is_err());
        use ringlb_edge::agent::{DatapathKind, Forwarding};
        let r = run(&[]).unwrap();
        assert_eq!(r.datapath, DatapathKind::Xdp);
        assert_eq!(r.forwarding, Forwarding::Tunnel);
        assert!(r.mh_port && r.mh_fallback);
        let r = run(&[
            "--datapath",
            "ipvs",
            "--forwarding",
            "dr",
            "--mh-port=false",
        ])
        .unwrap();
        assert_eq!(r.datapath, DatapathKind::Ipvs);
        assert_eq!(r.forwarding, Forwarding::Dr);
        assert!(!r.mh_port && r.mh_fallback);
    }
}
