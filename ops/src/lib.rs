//! What every ringlb program shares: the common flags, logging set-up, the Kubernetes
//! client, liveness fed by the programs' loops (heartbeats), and the `/metrics`,
//! `/healthz`, `/readyz` endpoint.

#[cfg(feature = "kube")]
pub mod backoff;
pub mod flags;
pub mod health;
pub mod http;
pub mod kernel;
#[cfg(feature = "kube")]
pub mod kube_client;
pub mod logging;
pub mod netns;
pub mod sockopt;

#[cfg(feature = "kube")]
pub use backoff::WatchBackoff;
pub use flags::CommonArgs;
pub use health::{Health, Heartbeat, Stalled};
pub use http::{ExtraPages, Page, serve_ops, serve_ops_with};
