//! A Kubernetes API server simulator: real HTTP, real JSON, kube-apiserver's
//! semantics where kube-rs and kubectl depend on them (see docs/apisim.md).
//!
//! ```text
//!  Simulator::start ──► accept loop (server.rs) ──► one task per connection
//!                            │                        │ get/list/create/... ─► Api (api.rs) ─► Store (store.rs)
//!                            │                        └ watch ─► watch task (watch.rs) ◄─ store change history
//!                            └ built-in controllers (controllers.rs): Deployment→ReplicaSet→Pod,
//!                              kubelet (pod IPs, Ready), EndpointSlices, garbage collection
//! ```

mod admission;
mod api;
mod controllers;
mod convert;
mod crschema;
mod discovery;
mod endpointslices;
mod error;
mod faults;
mod fields;
mod kubeconfig;
mod meta;
mod patch;
use crate::controlplane::kubelet::podips;
mod protobuf;
mod resources;
mod select;
mod services;
mod store;
mod table;
mod watch;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ipnetwork::IpNetwork;
use kube::CustomResourceExt;
use serde_json::json;
use tokio::task::JoinHandle;

pub use error::ApiError;
pub use faults::Faults;

use api::Api;
use resources::Registry;
use store::Store;

/// How to run the simulator. `Default` gives a dual-stack cluster on 127.0.0.1:0.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Where to listen; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Where to write the kubeconfig; `None` writes it into a fresh temp directory
    /// that is removed when the handle goes away.
    pub kubeconfig_path: Option<PathBuf>,
    /// Service CIDRs, primary family first (one per family).
    pub service_cidrs: Vec<IpNetwork>,
    /// Pod IPs the simulated kubelet hands out, in order, before falling back to
    /// `pod_cidrs`. Use lab host IPs here so Deployment pods get reachable IPs.
    pub pod_ips: Vec<IpAddr>,
    /// Pod CIDRs (one per family) for pods beyond `pod_ips`.
    pub pod_cidrs: Vec<IpNetwork>,
    /// Run the simulated kubelet: Pending pods get an IP, phase Running, Ready=True.
    pub kubelet: bool,
    /// Run the built-in controllers (Deployment, ReplicaSet, EndpointSlice, GC).
    pub controllers: bool,
    /// Node name set on started pods (`spec.nodeName`), also created as a Node.
    pub node_name: String,
    /// How many changes the watch history keeps; older resourceVersions get 410.
    pub history_limit: usize,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Install the ringlb CRDs (IPPool, BGPPeer, BGPAdvertisement) at start.
    pub install_crds: bool,
    /// Graceful pod deletion: a deleted pod keeps running with a deletionTimestamp
    /// (its endpoints `serving`+`terminating`) for this long, then the simulated
    /// kubelet removes it. Zero deletes pods at once. A delete with
    /// `gracePeriodSeconds` overrides it.
    pub pod_termination_grace: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        let net = |s: &str| s.parse::<IpNetwork>().expect("constant CIDR parses");
        SimOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kubeconfig_path: None,
            service_cidrs: vec![net("10.96.0.0/16"), net("fd00:10:96::/112")],
            pod_ips: Vec::new(),
            pod_cidrs: vec![net("10.244.0.0/16"), net("fd00:10:244::/64")],
            kubelet: true,
            controllers: true,
            node_name: "apisim-node".into(),
            history_limit: 100_000,
            bookmark_interval: Duration::from_secs(5),
            install_crds: true,
            pod_termination_grace: Duration::ZERO,
        }
    }
}

/// Starts simulators.
pub struct Simulator;

impl Simulator {
    /// Binds, bootstraps the cluster (namespaces, the `kubernetes` Service, CRDs),
    /// writes the kubeconfig and starts serving.
    pub async fn start(opts: SimOptions) -> anyhow::Result<SimHandle> {
        let store = Arc::new(Store::new(opts.history_limit));
        let mut api = Api::new(
            store.clone(),
            Registry::new(),
            services::Allocator::new(opts.service_cidrs.clone()),
        );
        api.pod_grace = opts.pod_termination_grace;
        let api = Arc::new(api);
        bootstrap(&api, &opts).context("bootstrapping the simulated cluster")?;
        let faults = Arc::new(Faults::new(store));
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .with_context(|| format!("binding {}", opts.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let url = format!("http://{addr}");
        let (kubeconfig, temp_dir) = match &opts.kubeconfig_path {
            Some(p) => (p.clone(), None),
            None => {
                let dir = std::env::temp_dir().join(format!(
                    "ringlb-apisim-{}-{}",
                    std::process::id(),
                    meta::random_suffix(8)
                ));
                (dir.join("kubeconfig"), Some(dir))
            }
        };
        kubeconfig::write(&kubeconfig, &url)
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(server::State {
            api: api.clone(),
            faults: faults.clone(),
            bookmark_every: opts.bookmark_interval,
        });
        let mut tasks = vec![tokio::spawn(server::serve(listener, state, rx))];
        if opts.controllers || opts.kubelet {
            tasks.push(tokio::spawn(supervise(
                api.clone(),
                controllers::Config::from(&opts),
            )));
        }
        tracing::info!(%url, kubeconfig = %kubeconfig.display(), "API simulator listening");
        Ok(SimHandle {
            addr,
            url,
            kubeconfig,
            temp_dir,
            faults,
            api,
            shutdown,
            tasks,
        })
    }
}

mod server;

/// Runs the built-in controllers and restarts them (with a full resync) if they
/// panic, so one bad object cannot silently stop them for the rest of a test.
async fn supervise(api: Arc<Api>, cfg: controllers::Config) {
    /// Aborts the inner task when the supervisor itself is aborted.
    struct AbortOnDrop(JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    loop {
        let mut inner = AbortOnDrop(tokio::spawn(controllers::run(api.clone(), cfg.clone())));
        match (&mut inner.0).await {
            Err(e) if e.is_panic() => {
                tracing::error!("built-in controllers panicked; restarting them");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return,
        }
    }
}

fn bootstrap(api: &Api, opts: &SimOptions) -> Result<(), ApiError> {
    let reg = &api.registry;
    let lookup = |g: &str, p: &str| {
        reg.lookup(g, "v1", p)
            .ok_or_else(|| ApiError::internal(format!("{p} not registered")))
    };
    let ns = lookup("", "namespaces")?;
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        api.create(&ns, "", json!({"metadata": {"name": name}}))?;
    }
    let nodes = lookup("", "nodes")?;
    let node = api.create(&nodes, "", json!({"metadata": {"name": opts.node_name, "labels": {"kubernetes.io/hostname": opts.node_name}}}))?;
    let t = api::Target {
        info: nodes,
        namespace: String::new(),
        name: meta::name(&node).to_string(),
    };
    api.update(&t, api::Sub::Status, json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}))?;
    let svc = lookup("", "services")?;
    let first = opts.service_cidrs.first().map(|c| match c {
        IpNetwork::V4(n) => IpAddr::from((u32::from(n.network()) + 1).to_be_bytes()),
        IpNetwork::V6(n) => IpAddr::from((u128::from(n.network()) + 1).to_be_bytes()),
    });
    let mut kubernetes = json!({"metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}});
    if let Some(ip) = first {
        kubernetes["spec"]["clusterIP"] = json!(ip.to_string());
    }
    api.create(&svc, "default", kubernetes)?;
    if opts.install_crds {
        let crds = reg
            .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .ok_or_else(|| ApiError::internal("CRDs not registered"))?;
        for crd in [
            ringlb_crds::IPPool::crd(),
            ringlb_crds::BGPPeer::crd(),
            ringlb_crds::BGPAdvertisement::crd(),
        ] {
            let v = serde_json::to_value(&crd).map_err(|e| ApiError::internal(e.to_string()))?;
            api.create(&crds, "", v)?;
        }
    }
    Ok(())
}

/// A running simulator. Dropping it stops the server too (without waiting).
pub struct SimHandle {
    addr: SocketAddr,
    url: String,
    kubeconfig: PathBuf,
    temp_dir: Option<PathBuf>,
    faults: Arc<Faults>,
    api: Arc<Api>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl SimHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The kubeconfig file (plain HTTP, no auth, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kube client for this simulator (default namespace `default`).
    pub async fn client(&self) -> kube::Client {
        let uri = self.url.parse().expect("the simulator URL is a valid URI");
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).expect("a plain-HTTP kube client builds")
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The latest resourceVersion the store handed out.
    pub fn resource_version(&self) -> u64 {
        self.api.store.current_rv()
    }

    /// Stops serving, ends all connections and watches, removes the temp kubeconfig.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
