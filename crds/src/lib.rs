//! ringlb CustomResourceDefinitions: group `ringlb.io`, version `v1alpha1`, all
//! cluster-scoped, each with a status subresource.
//!
//! The YAML under `crds/` is generated from these types by the `crdgen` binary and is
//! never edited by hand. `validate()` on each spec repeats the schema's rules so that
//! an object which slipped past the API server (or a server without CEL) still gets a
//! clear, field-named error from the programs.

pub mod bgpadvertisement;
pub mod bgppeer;
pub mod common;
pub mod ippool;

pub use bgpadvertisement::{BGPAdvertisement, BGPAdvertisementSpec};
pub use bgppeer::{BGPPeer, BGPPeerSpec, BGPPeerStatus};
pub use common::{Condition, LabelSelector, ValidationError};
pub use ippool::{IPPool, IPPoolSpec, IPPoolStatus};

/// The API group of every ringlb CRD.
pub const GROUP: &str = "ringlb.io";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The `spec.loadBalancerClass` that marks a Service as ringlb's.
pub const LOAD_BALANCER_CLASS: &str = "ringlb.io/maglev";
