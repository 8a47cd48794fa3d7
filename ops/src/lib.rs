//! What every ringlb program shares: the common flags, logging set-up, the Kubernetes
//! client, and the `/metrics`, `/healthz`, `/readyz` endpoint.

pub mod backoff;
pub mod flags;
pub mod http;
pub mod logging;
pub mod netns;

pub use backoff::WatchBackoff;
pub use flags::CommonArgs;
pub use http::{Health, serve_ops};
