//! Harness for the controller integration tests: a real control plane (etcd +
//! kube-apiserver, `ringlb_controlplane`), the real `ringlb-controller` binary as
//! a child process running as the chart's ServiceAccount under the chart's RBAC.

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use ringlb_controlplane::{ControlPlane, Options};
use ringlb_crds::{IPPool, IPPoolSpec};
use serde_json::json;

pub(crate) const CONDITION: &str = "ringlb.io/IPAllocated";

/// The chart's release namespace in these tests: the controller's ServiceAccount and
/// its leader-election Lease live here.
pub(crate) const RELEASE_NS: &str = "ringlb-system";

/// A control plane with the chart's RBAC applied, and the controller's
/// ServiceAccount kubeconfig.
pub(crate) struct Cluster {
    pub cp: ControlPlane,
    controller_kubeconfig: PathBuf,
}

impl Cluster {
    /// An admin client, for the test's own reads and writes.
    pub(crate) async fn client(&self) -> Client {
        self.cp.client().await
    }

    /// The kubeconfig the controller runs with: ServiceAccount
    /// `ringlb-system/ringlb-controller`, bound by the chart's RBAC.
    pub(crate) fn kubeconfig_path(&self) -> &Path {
        &self.controller_kubeconfig
    }

    /// Points the controller's kubeconfig somewhere else (a fault proxy); same token.
    pub(crate) fn set_kubeconfig(&mut self, path: PathBuf) {
        self.controller_kubeconfig = path;
    }
}

/// A control plane without kube-controller-manager (nothing here needs it), the
/// chart's CRDs and RBAC.
pub(crate) async fn cluster() -> Cluster {
    cluster_with(Options {
        controller_manager: false,
        ..Options::default()
    })
    .await
}

/// [`cluster`] with IPPool `main` of `cidr`, and an admin client.
pub(crate) async fn cluster_with_pool(cidr: &str) -> (Cluster, Client) {
    let cluster = cluster().await;
    let client = cluster.client().await;
    create_pool(&client, "main", &[cidr], |_| {}).await;
    (cluster, client)
}

pub(crate) async fn cluster_with(opts: Options) -> Cluster {
    let cp = ControlPlane::start_with_chart_rbac(opts, RELEASE_NS)
        .await
        .unwrap_or_else(|e| panic!("the control plane starts with the chart's RBAC: {e}"));
    let controller_kubeconfig = cp
        .service_account_kubeconfig(RELEASE_NS, "ringlb-controller")
        .await
        .unwrap_or_else(|e| panic!("a ServiceAccount token: {e}"));
    Cluster {
        cp,
        controller_kubeconfig,
    }
}

/// A running controller process; killed (and reaped) on drop.
pub(crate) struct Ctrl {
    pub child: Child,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    pub identity: String,
}

impl Ctrl {
    pub(crate) fn start(cluster: &Cluster, identity: &str, extra: &[&str]) -> Ctrl {
        let metrics = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            l.local_addr().expect("local addr")
        };
        let log = std::env::temp_dir().join(format!(
            "ringlb-ctrl-test-{}-{identity}-{}.log",
            std::process::id(),
            metrics.port()
        ));
        let out = std::fs::File::create(&log).expect("create log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlb-controller"));
        if !extra.contains(&"--log-level") {
            cmd.args(["--log-level", "info,kube=warn"]);
        }
        // Short Lease timings unless the test gives its own.
        if !extra.contains(&"--lease-duration") {
            cmd.args([
                "--lease-duration",
                "2s",
                "--renew-deadline",
                "1500ms",
                "--retry-period",
                "250ms",
            ]);
        }
        let child = cmd
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--identity", identity, "--lease-namespace", RELEASE_NS])
            .env("POD_SERVICE_ACCOUNT", "ringlb-controller")
            .args(extra)
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn ringlb-controller");
        Ctrl {
            child,
            metrics,
            log,
            identity: identity.into(),
        }
    }

    pub(crate) fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `/metrics` text, or "" while not serving.
    pub(crate) async fn metrics_text(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(self.metrics).await else {
            return String::new();
        };
        if s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .is_err()
        {
            return String::new();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    /// The value of one metric line (exact series text before the value).
    pub(crate) async fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for exit.
    pub(crate) async fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                eprintln!("controller {} exited: {st}", self.identity);
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "controller {} did not exit on SIGTERM; killing it",
            self.identity
        );
        self.kill();
    }

    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits until the process has exited, or panics after `timeout` with `what`
    /// (and, on drop, its log).
    pub(crate) async fn wait_exited(&mut self, timeout: Duration, what: &str) {
        wait_for(timeout, what, || {
            let exited = self.exited();
            async move { exited.then_some(()) }
        })
        .await
    }
}

impl Drop for Ctrl {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- controller {} log ----\n{}",
                self.identity,
                self.logs()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

pub(crate) async fn create_pool(
    client: &Client,
    name: &str,
    cidrs: &[&str],
    f: impl FnOnce(&mut IPPoolSpec),
) {
    let mut spec = IPPoolSpec::from_cidrs(cidrs);
    f(&mut spec);
    Api::<IPPool>::all(client.clone())
        .create(&PostParams::default(), &IPPool::new(name, spec))
        .await
        .expect("create IPPool");
}

/// A LoadBalancer Service `name` in `default` with one TCP port, plus `extra` merged
/// into its JSON (annotations, spec fields).
pub(crate) fn lb_service(name: &str, port: i32, extra: serde_json::Value) -> Service {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"port": port, "protocol": "TCP", "targetPort": 8080}]}
    });
    merge(&mut v, &extra);
    serde_json::from_value(v).expect("valid Service")
}

fn merge(a: &mut serde_json::Value, b: &serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

pub(crate) async fn create_svc(client: &Client, svc: &Service) {
    Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), svc)
        .await
        .expect("create Service");
}

pub(crate) async fn delete_svc(client: &Client, name: &str) {
    Api::<Service>::namespaced(client.clone(), "default")
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete Service");
}

pub(crate) fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    ringlb_crds::service::status_ips(svc)
}

pub(crate) fn condition(svc: &Service) -> Option<(String, String)> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Polls until `f` returns Some, or panics after `timeout` with `what`.
pub(crate) async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creates `lb_service(name, 80, extra)` and waits until it has VIPs in status;
/// returns them.
pub(crate) async fn create_and_wait_ips(
    client: &Client,
    name: &str,
    extra: serde_json::Value,
    timeout: Duration,
) -> Vec<IpAddr> {
    create_svc(client, &lb_service(name, 80, extra)).await;
    wait_ips(client, name, timeout).await
}

/// Waits until the Service has VIPs in status and returns them.
pub(crate) async fn wait_ips(client: &Client, name: &str, timeout: Duration) -> Vec<IpAddr> {
    let api = Api::<Service>::namespaced(client.clone(), "default");
    wait_for(timeout, &format!("VIP of Service {name}"), || {
        let api = api.clone();
        async move {
            let s = api.get(name).await.ok()?;
            let ips = ingress_ips(&s);
            (!ips.is_empty() && condition(&s).is_some_and(|c| c.0 == "True")).then_some(ips)
        }
    })
    .await
}

pub(crate) async fn get_svc(client: &Client, name: &str) -> Service {
    Api::<Service>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .expect("get Service")
}

/// Waits until Service `name`'s IPAllocated condition has reason `reason`.
pub(crate) async fn wait_reason(client: &Client, name: &str, reason: &str, timeout: Duration) {
    wait_for(timeout, &format!("{reason} on {name}"), || async {
        (condition(&get_svc(client, name).await)?.1 == reason).then_some(())
    })
    .await
}

/// Waits until the controller has written a Warning Event with `reason` about
/// Service `name`, and returns its note.
pub(crate) async fn wait_warning(
    client: &Client,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> String {
    wait_for(
        timeout,
        &format!("{reason} Warning Event on {name}"),
        || async {
            warnings(client, name)
                .await
                .into_iter()
                .find_map(|(r, note)| (r == reason).then_some(note))
        },
    )
    .await
}

/// Warning Events (events.k8s.io/v1) that the ringlb controller wrote about a
/// Service, as (reason, note). Only the controller's: kube-apiserver's own repair
/// loop can warn about the same Service (`ClusterIPNotAllocated`) on a fresh
/// apiserver, and that must neither fail nor satisfy a test.
pub(crate) async fn warnings(client: &Client, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "default");
    let list = api.list(&Default::default()).await.expect("list Events");
    list.items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.reporting_controller.as_deref() == Some(ringlb_controller::status::FIELD_MANAGER)
        })
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Writes edge `node`'s Lease (as the edge agent does, `edge-lb/src/agent/ack.rs`),
/// valid from now, acknowledging `applied`.
pub(crate) async fn edge_lease(client: &kube::Client, node: &str, applied: Option<&str>) {
    let applied = applied.map(|a| a.parse().expect("a resourceVersion"));
    let now = k8s_openapi::jiff::Timestamp::now();
    let lease = ringlb_crds::edge_ack::lease_manifest(RELEASE_NS, node, applied, now);
    kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), RELEASE_NS)
        .patch(
            &ringlb_crds::edge_ack::lease_name(node),
            &kube::api::PatchParams::apply("test-edge").force(),
            &kube::api::Patch::Apply(&lease),
        )
        .await
        .expect("write the edge Lease");
}

/// The controller's leader-election Lease, if there is one.
pub(crate) async fn lease(client: &Client) -> Option<Lease> {
    let api: Api<Lease> = Api::namespaced(client.clone(), RELEASE_NS);
    api.get_opt("ringlb-controller").await.ok()?
}

/// Who holds the controller's Lease.
pub(crate) async fn holder(client: &Client) -> Option<String> {
    lease(client).await?.spec?.holder_identity
}

/// Waits until `who` holds the controller's Lease; returns how long that took.
pub(crate) async fn wait_holder(client: &Client, who: &str, timeout: Duration) -> Duration {
    let t0 = Instant::now();
    wait_for(timeout, &format!("{who} holds the Lease"), || {
        let client = client.clone();
        async move { (holder(&client).await.as_deref() == Some(who)).then_some(()) }
    })
    .await;
    t0.elapsed()
}
