//! A real Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager (and kube-scheduler on request), the upstream programs built
//! from their Go modules by `scripts/build-k8s.sh` (docs/controlplane.md).
//!
//! ```text
//!  ControlPlane::start ─► pki (CA, serving cert, SA key) + token file
//!        │
//!        ├─► etcd            127.0.0.1:<free>   data in the temp dir, no fsync
//!        ├─► kube-apiserver  https://127.0.0.1:<free>   TLS, RBAC, default admission,
//!        │                   token auth (admin = system:masters), SA tokens
//!        ├─► CRDs from charts/ringlb/crds, waited until Established
//!        └─► kube-controller-manager  (Deployment, ReplicaSet, EndpointSlice, namespace,
//!                                      GC, ServiceAccount, ... ; no node lifecycle)
//! ```
//!
//! Programs under test get a kubeconfig with a ServiceAccount token
//! ([`ControlPlane::service_account_kubeconfig`]) bound by the chart's RBAC
//! ([`ControlPlane::apply_chart_rbac`]); the test itself uses the admin client.
//! Everything lives in one temporary folder that is removed on drop, and every process
//! is killed on drop.

mod assets;
pub mod audit;
pub mod daemon;
mod etcd;
pub mod kubelet;
mod manifests;
mod pki;
mod proxy;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use daemon::Daemon;

pub use assets::{Assets, kubernetes_version};
pub use kubelet::{KubeletOptions, LabKubelet, LabNode};
pub use manifests::{
    chart_dir, chart_rbac_templates, helm_template_rbac, render_release_namespace,
};
use pki::Pki;
pub use proxy::StallProxy;

/// What can go wrong starting or driving the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the Kubernetes control-plane programs are not built (looked in {searched}); \
         run `make k8s` (scripts/build-k8s.sh) or point RINGLB_K8S_ASSETS at a folder \
         holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl"
    )]
    MissingAssets { searched: String },
    #[error("generating certificates: {0}")]
    Pki(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Process(#[from] daemon::Error),
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("timed out after {waited:?} waiting for {what}; {detail}")]
    Timeout {
        what: String,
        waited: Duration,
        detail: String,
    },
    #[error("{0}")]
    Manifest(String),
    #[error("{0}")]
    Etcd(String),
}

impl Error {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
    fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to run the control plane. `Default`: dual-stack Service CIDRs, the controller
/// manager on, the ringlb CRDs installed, the watch cache on.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--service-cluster-ip-range`, primary family first.
    pub service_cidrs: Vec<String>,
    /// Run kube-controller-manager.
    pub controller_manager: bool,
    /// Run kube-scheduler.
    pub scheduler: bool,
    /// Apply `charts/ringlb/crds/*.yaml` and wait until they are Established.
    pub install_crds: bool,
    /// kube-apiserver's watch cache. Off, watches are served by etcd directly, so an
    /// etcd compaction reaches a watcher as 410 Gone.
    pub watch_cache: bool,
    /// Extra kube-apiserver flags.
    pub apiserver_args: Vec<String>,
    /// kube-apiserver's audit log (every request at level Metadata) in the temp
    /// folder, read back with [`ControlPlane::audited_access`].
    pub audit: bool,
    /// Extra IP SANs of the serving certificate: addresses at which clients outside
    /// the host's loopback reach the API server (a lab namespace's bridge).
    pub extra_sans: Vec<IpAddr>,
    /// Node names that get a kubelet credential (user `system:node:<name>`, group
    /// `system:nodes`, so the Node authorizer and NodeRestriction apply), written by
    /// [`ControlPlane::node_kubeconfig`]; a kube-proxy credential (`system:kube-proxy`)
    /// comes with them.
    pub nodes: Vec<String>,
    /// kube-controller-manager's `--controllers`; `None`: [`KCM_CONTROLLERS`].
    pub kcm_controllers: Option<String>,
    /// The folder the control plane's own folder is made in; `None`: the system's
    /// temporary folder. A lab puts it under its own folder, so its teardown finds
    /// the control plane's recorded PIDs after a crash.
    pub parent_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            service_cidrs: vec!["10.96.0.0/16".into(), "fd00:10:96::/112".into()],
            controller_manager: true,
            scheduler: false,
            install_crds: true,
            watch_cache: true,
            apiserver_args: Vec::new(),
            extra_sans: Vec::new(),
            audit: false,
            nodes: Vec::new(),
            kcm_controllers: None,
            parent_dir: None,
        }
    }
}

/// The controllers kube-controller-manager runs: what Deployments, Services and
/// namespaces need. Node lifecycle is off: lab nodes have no kubelet heartbeats, and
/// that controller would taint them and evict their pods.
pub const KCM_CONTROLLERS: &str = "deployment,replicaset,endpointslice,endpointslicemirroring,\
namespace,garbagecollector,serviceaccount,serviceaccount-token,root-ca-certificate-publisher-controller,\
podgc,statefulset,daemonset,job,disruption,resourcequota,ttl-after-finished";

/// A running control plane; every process is killed and the folder removed on drop.
pub struct ControlPlane {
    dir: PathBuf,
    keep_dir: bool,
    assets: Assets,
    pki: Pki,
    opts: Options,
    etcd: Option<Daemon>,
    etcd_addr: SocketAddr,
    etcd_peer: SocketAddr,
    apiserver: Option<Daemon>,
    api_addr: SocketAddr,
    kcm: Option<Daemon>,
    scheduler: Option<Daemon>,
    admin_kubeconfig: PathBuf,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver (waited until `/readyz`), installs the CRDs and
    /// starts the controller manager.
    pub async fn start(opts: Options) -> Result<ControlPlane> {
        let assets = Assets::find()?;
        let dir = opts
            .parent_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .join(format!(
                "ringlb-cp-{}-{}",
                std::process::id(),
                random_suffix()
            ));
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let pki = Pki::write(&dir, &opts.extra_sans)?;
        let tokens = Tokens::new(&opts.nodes);
        let token_file = dir.join("tokens.csv");
        std::fs::write(&token_file, tokens.csv())
            .map_err(Error::io(format!("writing {}", token_file.display())))?;
        let api_addr = free_addr()?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            api_addr,
            &pki.ca_cert,
            &tokens.admin,
            "default",
        )?;
        let kcm_kubeconfig = dir.join("kube-controller-manager.kubeconfig");
        write_kubeconfig(
            &kcm_kubeconfig,
            api_addr,
            &pki.ca_cert,
            &tokens.kcm,
            "default",
        )?;
        let sched_kubeconfig = dir.join("kube-scheduler.kubeconfig");
        write_kubeconfig(
            &sched_kubeconfig,
            api_addr,
            &pki.ca_cert,
            &tokens.scheduler,
            "default",
        )?;
        for (name, token) in &tokens.nodes {
            write_kubeconfig(
                &dir.join(format!("node-{name}.kubeconfig")),
                api_addr,
                &pki.ca_cert,
                token,
                "default",
            )?;
        }
        if let Some(token) = &tokens.proxy {
            write_kubeconfig(
                &dir.join("kube-proxy.kubeconfig"),
                api_addr,
                &pki.ca_cert,
                token,
                "default",
            )?;
        }
        let mut cp = ControlPlane {
            keep_dir: std::env::var_os("RINGLB_KEEP_CONTROLPLANE").is_some(),
            etcd: None,
            etcd_addr: free_addr()?,
            etcd_peer: free_addr()?,
            apiserver: None,
            api_addr,
            kcm: None,
            scheduler: None,
            admin_kubeconfig,
            assets,
            pki,
            opts,
            dir,
        };
        let t0 = Instant::now();
        cp.start_etcd().await?;
        cp.start_apiserver().await?;
        if cp.opts.install_crds {
            let client = cp.client().await;
            manifests::install_crds(&client).await?;
        }
        if cp.opts.scheduler {
            cp.start_scheduler()?;
        }
        if cp.opts.controller_manager {
            cp.start_controller_manager()?;
            cp.wait_controller_manager(Duration::from_secs(60)).await?;
        }
        cp.check("kube-scheduler")?;
        tracing::info!(
            url = %cp.url(),
            dir = %cp.dir.display(),
            took_ms = t0.elapsed().as_millis() as u64,
            "control plane up"
        );
        Ok(cp)
    }

    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("https://{}", self.api_addr)
    }

    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// The admin kubeconfig (system:masters; for the test itself and kubectl).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Node `name`'s kubelet kubeconfig (`system:node:<name>`; see [`Options::nodes`]),
    /// pointing at [`ControlPlane::url`].
    pub fn node_kubeconfig(&self, name: &str) -> PathBuf {
        self.dir.join(format!("node-{name}.kubeconfig"))
    }

    /// kube-proxy's kubeconfig (`system:kube-proxy`, bound to `system:node-proxier` by
    /// the API server's bootstrap RBAC); written when [`Options::nodes`] is not empty.
    pub fn proxy_kubeconfig(&self) -> PathBuf {
        self.dir.join("kube-proxy.kubeconfig")
    }

    /// The temporary folder holding the PKI, kubeconfigs, logs and etcd's data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn assets(&self) -> &Assets {
        &self.assets
    }

    pub fn ca_cert(&self) -> &Path {
        &self.pki.ca_cert
    }

    /// An admin kube client (default namespace `default`).
    pub async fn client(&self) -> kube::Client {
        client_for(&self.admin_kubeconfig)
            .await
            .expect("the admin kubeconfig makes a client")
    }

    /// `kubectl --kubeconfig <admin> ARGS...`
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.assets.kubectl());
        cmd.arg("--kubeconfig").arg(&self.admin_kubeconfig);
        cmd
    }

    /// Creates the namespace if needed and applies the chart's RBAC templates
    /// (`charts/ringlb/templates/*-rbac.yaml`) rendered by `helm template` for release
    /// namespace `ns` (or, without helm, with `{{ .Release.Namespace }}` replaced).
    pub async fn apply_chart_rbac(&self, ns: &str) -> Result<()> {
        let client = self.client().await;
        manifests::ensure_namespace(&client, ns).await?;
        match self.assets.helm() {
            // `helm template`, as `helm install` renders it.
            Some(helm) => {
                let yaml = manifests::helm_template_rbac(&helm, ns)?;
                manifests::apply_yaml(&client, &yaml).await?;
            }
            // An envtest folder without helm: the one expression the RBAC files use.
            None => {
                for yaml in manifests::chart_rbac_templates()? {
                    manifests::apply_yaml(&client, &render_release_namespace(&yaml, ns)).await?;
                }
            }
        }
        Ok(())
    }

    /// A kubeconfig like `from` but pointing at `addr` (a [`StallProxy`] in front of
    /// this API server); the serving certificate is valid for 127.0.0.1.
    pub fn kubeconfig_via(&self, from: &Path, addr: SocketAddr) -> Result<PathBuf> {
        let text = std::fs::read_to_string(from)
            .map_err(Error::io(format!("reading {}", from.display())))?;
        let text = text.replace(
            &format!("server: https://{}", self.api_addr),
            &format!("server: https://{addr}"),
        );
        let path = self
            .dir
            .join(format!("via-{}-{}", addr.port(), file_name(from)));
        std::fs::write(&path, text).map_err(Error::io(format!("writing {}", path.display())))?;
        Ok(path)
    }

    /// Applies a multi-document YAML manifest (server-side apply, as the admin).
    pub async fn apply_yaml(&self, yaml: &str) -> Result<()> {
        manifests::apply_yaml(&self.client().await, yaml).await
    }

    /// A kubeconfig authenticating as ServiceAccount `ns/name` with a fresh bound token
    /// (TokenRequest, 24 h): what a pod of that ServiceAccount would hold. The
    /// ServiceAccount must exist (the chart's RBAC creates it).
    pub async fn service_account_kubeconfig(&self, ns: &str, name: &str) -> Result<PathBuf> {
        let token = manifests::request_token(&self.client().await, ns, name).await?;
        let path = self.dir.join(format!("sa-{ns}-{name}.kubeconfig"));
        write_kubeconfig(&path, self.api_addr, &self.pki.ca_cert, &token, ns)?;
        Ok(path)
    }

    /// [`ControlPlane::start`], then [`ControlPlane::apply_chart_rbac`] in `ns`: the
    /// chart's ServiceAccounts and roles are there.
    pub async fn start_with_chart_rbac(opts: Options, ns: &str) -> Result<ControlPlane> {
        let cp = ControlPlane::start(opts).await?;
        cp.apply_chart_rbac(ns).await?;
        Ok(cp)
    }

    /// A client authenticating as ServiceAccount `ns/name`, through
    /// [`ControlPlane::service_account_kubeconfig`].
    pub async fn service_account_client(&self, ns: &str, name: &str) -> Result<kube::Client> {
        client_for(&self.service_account_kubeconfig(ns, name).await?).await
    }

    async fn start_etcd(&mut self) -> Result<()> {
        let data = self.dir.join("etcd-data");
        let client_url = format!("http://{}", self.etcd_addr);
        let peer_url = format!("http://{}", self.etcd_peer);
        let bin = self.assets.bin("etcd");
        let argv: Vec<String> = vec![
            bin.display().to_string(),
            "--name=default".into(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        self.etcd = Some(self.spawn("etcd", &argv)?);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if etcd::healthy(self.etcd_addr).await {
                return Ok(());
            }
            self.check("etcd")?;
            if Instant::now() > deadline {
                return Err(self.timeout("etcd /health", Duration::from_secs(30), "etcd"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts kube-apiserver (again, after [`ControlPlane::stop_apiserver`]) and waits
    /// until `/readyz` answers 200.
    pub async fn start_apiserver(&mut self) -> Result<()> {
        let bin = self.assets.bin("kube-apiserver");
        let mut argv: Vec<String> = vec![
            bin.display().to_string(),
            format!("--etcd-servers=http://{}", self.etcd_addr),
            format!("--secure-port={}", self.api_addr.port()),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", self.pki.serving_cert.display()),
            format!("--tls-private-key-file={}", self.pki.serving_key.display()),
            format!("--client-ca-file={}", self.pki.ca_cert.display()),
            format!(
                "--token-auth-file={}",
                self.dir.join("tokens.csv").display()
            ),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", self.pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                self.pki.sa_key.display()
            ),
            format!(
                "--service-cluster-ip-range={}",
                self.opts.service_cidrs.join(",")
            ),
            "--allow-privileged=true".into(),
            format!(
                "--kubelet-client-certificate={}",
                self.pki.kubelet_client_cert.display()
            ),
            format!(
                "--kubelet-client-key={}",
                self.pki.kubelet_client_key.display()
            ),
            // The `kubernetes` Service's endpoints would be 127.0.0.1, which the
            // endpoint reconciler refuses (an error every 10 s on v1.34, a start
            // failure from v1.37); nothing here reaches the API by its ClusterIP.
            "--endpoint-reconciler-type=none".into(),
            format!("--watch-cache={}", self.opts.watch_cache),
            "--v=1".into(),
        ];
        if self.opts.audit {
            let policy = self.dir.join("audit-policy.yaml");
            std::fs::write(&policy, audit::POLICY)
                .map_err(Error::io(format!("writing {}", policy.display())))?;
            argv.push(format!("--audit-policy-file={}", policy.display()));
            argv.push(format!("--audit-log-path={}", self.audit_log().display()));
            argv.push("--audit-log-mode=blocking".into());
        }
        argv.extend(self.opts.apiserver_args.iter().cloned());
        self.apiserver = Some(self.spawn("kube-apiserver", &argv)?);
        self.wait_ready(Duration::from_secs(90)).await
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let client = client_for(&self.admin_kubeconfig).await?;
        let deadline = Instant::now() + limit;
        let mut last;
        loop {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("request");
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            self.check("kube-apiserver")?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "kube-apiserver /readyz".into(),
                    waited: limit,
                    detail: format!("last answer: {last}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Every (API group, resource[/subresource], verb) that `user` was allowed or
    /// refused, as kube-apiserver's audit log recorded it (needs `Options::audit`).
    /// `user` is the authenticated name, e.g.
    /// `system:serviceaccount:ringlb-system:ringlb-controller`.
    pub fn audited_access(&self, user: &str) -> Result<std::collections::BTreeSet<audit::Access>> {
        let path = self.audit_log();
        let text = std::fs::read_to_string(&path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        Ok(audit::accesses(&text, user))
    }

    /// Kills kube-apiserver (SIGKILL): every connection and watch breaks at once.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut d) = self.apiserver.take() {
            d.kill();
        }
    }

    /// Kills kube-apiserver and starts it again on the same address; returns once it is
    /// ready. Watches break and clients must re-list or resume.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        self.stop_apiserver();
        self.start_apiserver().await
    }

    /// Compacts etcd's history up to its current revision: a watch or list that
    /// resumes from an older resourceVersion gets 410 Gone (with the watch cache off;
    /// with it on, once the cache's window has moved on).
    pub async fn compact_etcd(&self) -> Result<i64> {
        etcd::compact(self.etcd_addr)
            .await
            .map_err(|e| Error::Etcd(format!("compacting etcd at {}: {e}", self.etcd_addr)))
    }

    fn start_controller_manager(&mut self) -> Result<()> {
        let bin = self.assets.bin("kube-controller-manager");
        let kubeconfig = self.dir.join("kube-controller-manager.kubeconfig");
        let argv: Vec<String> = vec![
            bin.display().to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!(
                "--controllers={}",
                self.opts
                    .kcm_controllers
                    .as_deref()
                    .unwrap_or(KCM_CONTROLLERS)
            ),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            format!(
                "--service-cluster-ip-range={}",
                self.opts.service_cidrs.join(",")
            ),
            "--secure-port=0".into(),
            "--concurrent-service-endpoint-syncs=10".into(),
            "--v=1".into(),
        ];
        self.kcm = Some(self.spawn("kube-controller-manager", &argv)?);
        Ok(())
    }

    /// Waits until kube-controller-manager has done its first work: the
    /// ServiceAccount controller created `default/default` (pods need it to pass
    /// ServiceAccount admission). A controller manager that exits at start (a flag it
    /// does not know) is an error with its log, not a silently missing controller.
    async fn wait_controller_manager(&mut self, limit: Duration) -> Result<()> {
        let client = self.client().await;
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client, "default");
        let deadline = Instant::now() + limit;
        loop {
            self.check("kube-controller-manager")?;
            if let Ok(Some(_)) = sas.get_opt("default").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.timeout(
                    "kube-controller-manager to create ServiceAccount default/default",
                    limit,
                    "kube-controller-manager",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn start_scheduler(&mut self) -> Result<()> {
        let bin = self.assets.bin("kube-scheduler");
        let kubeconfig = self.dir.join("kube-scheduler.kubeconfig");
        let argv: Vec<String> = vec![
            bin.display().to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--v=1".into(),
        ];
        self.scheduler = Some(self.spawn("kube-scheduler", &argv)?);
        Ok(())
    }

    /// Is kube-controller-manager (still) running? An error with its log tail if not.
    pub fn check_controller_manager(&mut self) -> Result<()> {
        self.check("kube-controller-manager")
    }

    fn spawn(&self, name: &str, argv: &[String]) -> Result<Daemon> {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        Ok(Daemon::spawn(&self.dir, name, None, &argv, &[])?)
    }

    fn daemon(&mut self, name: &str) -> Option<&mut Daemon> {
        match name {
            "etcd" => self.etcd.as_mut(),
            "kube-apiserver" => self.apiserver.as_mut(),
            "kube-controller-manager" => self.kcm.as_mut(),
            "kube-scheduler" => self.scheduler.as_mut(),
            _ => None,
        }
    }

    fn check(&mut self, name: &str) -> Result<()> {
        match self.daemon(name) {
            Some(d) => Ok(d.check_alive()?),
            None => Ok(()),
        }
    }

    fn timeout(&mut self, what: &str, waited: Duration, name: &str) -> Error {
        let detail = self
            .daemon(name)
            .map(|d| format!("{name} log tail:\n{}", d.log_tail(15)))
            .unwrap_or_default();
        Error::Timeout {
            what: what.into(),
            waited,
            detail,
        }
    }

    /// The last `n` lines of one program's log (`etcd`, `kube-apiserver`, ...).
    pub fn log_tail(&self, name: &str, n: usize) -> String {
        daemon::tail(&self.dir.join(format!("{name}.log")), n)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for d in [
            self.scheduler.as_mut(),
            self.kcm.as_mut(),
            self.apiserver.as_mut(),
            self.etcd.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            d.kill();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- kube-apiserver log tail ({}) ----\n{}",
                self.dir.display(),
                self.log_tail("kube-apiserver", 20)
            );
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The bearer tokens of the static token file: the test's admin (system:masters),
/// kube-controller-manager and kube-scheduler (their bootstrap RBAC users), and with
/// nodes, each node's kubelet and kube-proxy.
struct Tokens {
    admin: String,
    kcm: String,
    scheduler: String,
    nodes: Vec<(String, String)>,
    proxy: Option<String>,
}

impl Tokens {
    fn new(nodes: &[String]) -> Tokens {
        Tokens {
            admin: random_token(),
            kcm: random_token(),
            scheduler: random_token(),
            nodes: nodes.iter().map(|n| (n.clone(), random_token())).collect(),
            proxy: (!nodes.is_empty()).then(random_token),
        }
    }

    fn csv(&self) -> String {
        let mut out = format!(
            "{},ringlb-test-admin,uid-admin,\"system:masters\"\n\
             {},system:kube-controller-manager,uid-kcm\n\
             {},system:kube-scheduler,uid-scheduler\n",
            self.admin, self.kcm, self.scheduler
        );
        for (name, token) in &self.nodes {
            out.push_str(&format!(
                "{token},system:node:{name},uid-node-{name},\"system:nodes\"\n"
            ));
        }
        if let Some(token) = &self.proxy {
            out.push_str(&format!("{token},system:kube-proxy,uid-kube-proxy\n"));
        }
        out
    }
}

/// Writes a kubeconfig for `https://addr` trusting `ca`, authenticating with `token`.
pub fn write_kubeconfig(
    path: &Path,
    addr: SocketAddr,
    ca: &Path,
    token: &str,
    namespace: &str,
) -> Result<()> {
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: ringlb-test\n  cluster:\n    server: https://{addr}\n    certificate-authority: {ca}\n\
         users:\n\
         - name: user\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: ringlb-test\n  context:\n    cluster: ringlb-test\n    user: user\n    namespace: {namespace}\n\
         current-context: ringlb-test\n",
        ca = ca.display()
    );
    std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
}

/// A kube client from a kubeconfig file: the programs' (`TCP_NODELAY` on).
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Manifest(format!("reading {}: {e}", kubeconfig.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Manifest(format!("loading {}: {e}", kubeconfig.display())))?;
    ringlb_ops::kube_client::client(config).map_err(Error::kube("building a kube client"))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A free loopback port (bound and released; another process could take it first,
/// which the caller then sees as a failed start).
fn free_addr() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::io("binding 127.0.0.1:0"))?;
    l.local_addr().map_err(Error::io("reading a bound address"))
}

fn random_suffix() -> String {
    random_token()[..10].to_string()
}

fn random_token() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < 32 {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}
