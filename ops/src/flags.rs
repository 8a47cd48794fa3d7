//! Flags every program takes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Flags shared by every ringlb program; `#[command(flatten)]` them into a binary's args.
/// They are global: `prog --kubeconfig X run` and `prog run --kubeconfig X` both work.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Path to a kubeconfig. Default: $KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster service account.
    #[arg(long, env = "KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// Address for /metrics, /healthz and /readyz. Default: 0.0.0.0 and the
    /// program's port in the Helm chart: 9090 ringlb-controller, 9472 ringlb-edge run
    /// and speaker, 9473 ringlb-edge node.
    #[arg(long, global = true)]
    pub metrics_addr: Option<SocketAddr>,

    /// Log filter: a level (error, warn, info, debug, trace) or a tracing
    /// EnvFilter directive such as `info,ringlb_edge::bgp=debug`.
    #[arg(long, default_value = "info", env = "RINGLB_LOG", global = true)]
    pub log_level: String,

    /// Log line format: `text` (coloured only when standard output is a terminal) or
    /// `json` (one object per line, for log collectors).
    #[arg(
        long,
        value_enum,
        default_value_t = crate::logging::LogFormat::Text,
        env = "RINGLB_LOG_FORMAT",
        global = true
    )]
    pub log_format: crate::logging::LogFormat,
}

/// The ops (metrics and health) port of each program when `--metrics-addr` is not
/// given: the Helm chart's `metricsPort` of each component, so that the program, the
/// chart and the docs say one number.
pub mod ops_port {
    /// `ringlb-controller` (chart `controller.metricsPort`).
    pub const CONTROLLER: u16 = 9090;
    /// `ringlb-edge run` and `ringlb-edge speaker` (chart `edge.metricsPort`).
    pub const EDGE: u16 = 9472;
    /// `ringlb-edge node` (chart `node.metricsPort`; beside an edge on one host).
    pub const NODE: u16 = 9473;
}

impl CommonArgs {
    /// `--metrics-addr`, or `0.0.0.0:port` (the program's [`ops_port`]).
    pub fn metrics_addr_or(&self, port: u16) -> SocketAddr {
        self.metrics_addr
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], port)))
    }
}

/// A duration flag: `15s`, `1500ms`, `2m`, or plain seconds. Use as
/// `#[arg(value_parser = ringlb_ops::flags::parse_duration)]`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (like 15s or 500ms)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?} is not a duration (like 15s or 500ms)"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

#[cfg(feature = "kube")]
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("building Kubernetes config: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("building Kubernetes client for {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the Kubernetes API at {url} (from {from}) did not answer: {source}; is the API \
         server up and reachable from here, and is this the right --kubeconfig?"
    )]
    Unreachable {
        url: String,
        /// Where the URL came from: the kubeconfig's path, or the inference.
        from: String,
        #[source]
        source: kube::Error,
    },
}

#[cfg(feature = "kube")]
impl CommonArgs {
    /// The kube config from `--kubeconfig`, or the usual inference when it is unset.
    pub async fn kube_config(&self) -> Result<kube::Config, ClientError> {
        Ok(match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                    ClientError::Kubeconfig {
                        path: path.clone(),
                        source,
                    }
                })?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .map_err(|source| ClientError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            None => kube::Config::infer().await?,
        })
    }

    /// A kube client from `--kubeconfig`, or the usual inference when it is unset.
    /// Makes no request: see [`CommonArgs::connect`].
    pub async fn kube_client(&self) -> Result<kube::Client, ClientError> {
        let config = self.kube_config().await?;
        let url = config.cluster_url.to_string();
        crate::kube_client::client(config).map_err(|source| ClientError::Client { url, source })
    }

    /// A kube client that has answered once (`GET /version`): a start-up check whose
    /// error names the API server's URL and where it came from.
    pub async fn connect(&self) -> Result<kube::Client, ClientError> {
        let config = self.kube_config().await?;
        let url = config.cluster_url.to_string();
        let from = match &self.kubeconfig {
            Some(path) => path.display().to_string(),
            None => "$KUBECONFIG, ~/.kube/config or the in-cluster service account".into(),
        };
        let client = crate::kube_client::client(config).map_err(|source| ClientError::Client {
            url: url.clone(),
            source,
        })?;
        client
            .apiserver_version()
            .await
            .map_err(|source| ClientError::Unreachable { url, from, source })?;
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The programs' default ops ports are the chart's `metricsPort`s.
    #[test]
    fn default_ops_ports_are_the_charts() {
        let values = include_str!("../../charts/ringlb/values.yaml");
        let mut section = "";
        let mut chart = Vec::new();
        for line in values.lines() {
            if !line.starts_with(' ') && line.ends_with(':') {
                section = line.trim_end_matches(':');
            } else if let Some(port) = line.strip_prefix("  metricsPort: ") {
                chart.push((section, port.trim().parse::<u16>().unwrap()));
            }
        }
        assert_eq!(
            chart,
            [
                ("controller", ops_port::CONTROLLER),
                ("edge", ops_port::EDGE),
                ("nodeAgent", ops_port::NODE)
            ]
        );
        let mut c = CommonArgs {
            kubeconfig: None,
            metrics_addr: None,
            log_level: "info".into(),
            log_format: Default::default(),
        };
        assert_eq!(
            c.metrics_addr_or(ops_port::EDGE).to_string(),
            "0.0.0.0:9472"
        );
        c.metrics_addr = Some("127.0.0.1:1".parse().unwrap());
        assert_eq!(c.metrics_addr_or(ops_port::EDGE).to_string(), "127.0.0.1:1");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[derive(clap::Parser, Debug)]
    struct Prog {
        #[command(flatten)]
        common: CommonArgs,
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        Run {
            #[arg(long)]
            x: Option<u32>,
        },
    }

    #[test]
    fn common_flags_go_before_or_after_the_subcommand() {
        use clap::Parser;
        for args in [
            &["p", "--kubeconfig", "/k", "--log-level", "debug", "run"][..],
            &["p", "run", "--kubeconfig", "/k", "--log-level", "debug"],
            &["p", "--log-level", "debug", "run", "--kubeconfig", "/k"],
        ] {
            let p = Prog::try_parse_from(args).unwrap();
            assert_eq!(
                p.common.kubeconfig.as_deref(),
                Some("/k".as_ref()),
                "{args:?}"
            );
            assert_eq!(p.common.log_level, "debug", "{args:?}");
        }
        use crate::logging::LogFormat;
        let p = Prog::try_parse_from(["p", "run", "--log-format", "json"]).unwrap();
        assert_eq!(p.common.log_format, LogFormat::Json);
        let p = Prog::try_parse_from(["p", "run"]).unwrap();
        assert_eq!(p.common.log_format, LogFormat::Text);
        assert!(Prog::try_parse_from(["p", "run", "--log-format", "xml"]).is_err());
    }

    #[cfg(feature = "kube")]
    #[tokio::test]
    async fn an_unreachable_api_is_named_by_its_url() {
        let dir = std::env::temp_dir().join(format!("ringlb-ops-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        // port 1 on loopback: nothing listens, the connection is refused at once
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {}\n",
        )
        .unwrap();
        let common = CommonArgs {
            kubeconfig: Some(path.clone()),
            metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
            log_level: "info".into(),
            log_format: Default::default(),
        };
        let Err(err) = common.connect().await else {
            panic!("nothing listens on port 1")
        };
        let err = err.to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("http://127.0.0.1:1"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}
