//! Flags every program takes.

use std::net::SocketAddr;
use std::path::PathBuf;

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
