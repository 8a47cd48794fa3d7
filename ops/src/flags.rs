//! Flags every program takes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Flags shared by every ringlb program; `#[command(flatten)]` them into a binary's args.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Path to a kubeconfig. Default: $KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster service account.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,

    /// Log filter: a level (error, warn, info, debug, trace) or a tracing
    /// EnvFilter directive such as `info,ringlb_edge::bgp=debug`.
    #[arg(long, default_value = "info", env = "RINGLB_LOG")]
    pub log_level: String,
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
    #[error("building Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

#[cfg(feature = "kube")]
impl CommonArgs {
    /// A kube client from `--kubeconfig`, or the usual inference when it is unset.
    pub async fn kube_client(&self) -> Result<kube::Client, ClientError> {
        let config = match &self.kubeconfig {
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
        };
        Ok(kube::Client::try_from(config)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
