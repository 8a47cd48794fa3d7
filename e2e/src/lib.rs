//! ringlb test harness: a Kubernetes API simulator (`apisim`) that the controller, the
//! edges, kubectl and the end-to-end tests talk to through an ordinary kubeconfig.

pub mod apisim;
pub mod controlplane;
pub mod lab;

pub use apisim::{Faults, SimHandle, SimOptions, Simulator};
pub use controlplane::ControlPlane;
