//! ringlb test harness: a real Kubernetes control plane (`controlplane`: etcd,
//! kube-apiserver, kube-controller-manager built from their Go modules, and a lab
//! kubelet), the network-namespace lab (`lab`) that the end-to-end tests run, and the
//! real cluster (`realcluster`: kubelet + containerd nodes, kube-proxy, CoreDNS, the
//! chart installed with helm) that `make demo` and the real-cluster tests run.

pub mod lab;
pub mod procfs;
pub mod realcluster;

/// The control-plane harness lives in its own crate (`e2e/controlplane`), so the
/// controller's tests use it without building the edge.
pub use ringlb_controlplane as controlplane;
pub use ringlb_controlplane::ControlPlane;
