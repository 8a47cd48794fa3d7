//! ringlb CustomResourceDefinitions: group `ringlb.io`, version `v1alpha1`, all
//! cluster-scoped, each with a status subresource.
//!
//! The YAML under `crds/` is generated from these types by the `crdgen` binary and is
//! never edited by hand. `validate()` on each spec repeats the schema's rules so that
//! an object which slipped past the API server (or a server without CEL) still gets a
//! clear, field-named error from the programs.

#[cfg(feature = "server-validation")]
pub mod admission;
pub mod bgpadvertisement;
pub mod bgppeer;
pub mod common;
pub mod edge_ack;
pub mod failover;
pub mod generate;
pub mod ippool;
pub mod labels;
pub mod service;

pub use bgpadvertisement::{
    AggregationLength, BGPAdvertisement, BGPAdvertisementSpec, BGPAdvertisementStatus, Community,
    LargeCommunity,
};
pub use bgppeer::{BGPPeer, BGPPeerSpec, BGPPeerStatus, BfdSpec, NodeSession};
pub use common::{Condition, LabelSelector, SecretKeyRef, ValidationError, ValidationErrors};
pub use ippool::{Block, FamilyUsage, IPPool, IPPoolSpec, IPPoolStatus, IPRange};

/// The API group of every ringlb CRD.
pub const GROUP: &str = "ringlb.io";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The `spec.loadBalancerClass` that marks a Service as ringlb's.
pub const LOAD_BALANCER_CLASS: &str = "ringlb.io/maglev";
