//! ringlb test harness: a real Kubernetes control plane (`controlplane`: etcd,
//! kube-apiserver, kube-controller-manager built from their Go modules, and a lab
//! kubelet) and the network-namespace lab (`lab`) that the end-to-end tests and
//! `make demo` run.

pub mod controlplane;
pub mod lab;

pub use controlplane::ControlPlane;
