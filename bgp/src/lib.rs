//! The BGP speaker of an edge node: announces VIPs to the top-of-rack routers.
//!
//! - `codec`: the wire format (bgp-rs for encoding, our own strict decoder).
//! - `fsm`: the RFC 4271 state machine, pure and synchronous.
//! - `session`: one owner task per peer running the FSM over TCP.
//! - `speaker`: the in-process API (`announce`, `withdraw`, peer state as a watch).
//! - `rib`: pure export policy and Adj-RIB-Out diffing.
//! - `config`: peers and policy, from the standalone file or a [`config::PeerSpec`]
//!   (the edge agent builds those from the `BGPPeer` objects);
//!   `standalone`: `ringlb-edge speaker --config FILE`.
//!
//! No Kubernetes type appears here: the edge agent's `peers` module holds the glue.
//! - `bfd`: BFD (RFC 5880/5881) sessions that reset a peer's BGP session when the
//!   peer stops forwarding.
//! - `md5`: TCP MD5 signatures; `metrics`: Prometheus metrics per peer.
//! - `gr`: the graceful restart capability (RFC 4724); `ttl`: TTL / hop limit and
//!   GTSM (RFC 5082) of a session's sockets.

pub mod bfd;
pub mod codec;
pub mod config;
pub mod fsm;
pub mod gr;
pub mod md5;
pub mod metrics;
pub mod reach;
pub mod rib;
pub mod session;
pub mod speaker;
pub mod standalone;
pub mod ttl;

use std::net::IpAddr;

pub use config::{Deprefer, PeerConfig, RouteAttrs};
pub use session::PeerStatus;
pub use speaker::Speaker;

/// Errors of the BGP speaker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid BGP configuration, {field}: {reason}")]
    Config { field: String, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Md5(#[from] md5::Md5Error),
    #[error(transparent)]
    Codec(#[from] codec::CodecError),
    #[error("peer {0} is already configured")]
    DuplicatePeer(IpAddr),
}

/// A configuration error naming the field.
pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Config { .. } => "invalid_config",
            Error::Io { .. } => "io",
            Error::Md5(_) => "md5",
            Error::Codec(e) => e.metric_label(),
            Error::DuplicatePeer(_) => "duplicate_peer",
        }
    }
}
