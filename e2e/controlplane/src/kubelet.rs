//! The lab kubelet: what a kubelet does for the API, without a container runtime.
//!
//! There is no CRI here and nothing to run a container image with, so no real kubelet
//! can join the control plane. This stand-in does only the API side of a kubelet's
//! job (docs/controlplane.md, "The lab kubelet", lists exactly what it fakes):
//!
//! ```text
//!  LabKubelet::start ─► Node objects (labels, addresses, Ready=True, the admission
//!                       plugin's not-ready taint lifted), once
//!        └─► task: watch Pods (all namespaces)
//!              no spec.nodeName        ─► pods/binding to the next node that runs pods
//!                                         (only when no kube-scheduler runs)
//!              on our node, no IP yet   ─► next IP per family (list, then CIDRs),
//!                                         status Running + Ready
//!              deletionTimestamp set    ─► stays Ready for the grace period, then
//!                                         DELETE with grace 0 (as a kubelet does)
//!              deleted                  ─► its IPs are free; waiting pods retry
//! ```
//!
//! Its identity is the admin client (system:masters), not `system:node:<name>`: the
//! Node authorizer would want one kubelet credential per node, and the tests gain
//! nothing from proving the kubelet's own RBAC.

pub mod podips;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};

use super::{ControlPlane, Error, Result};
use podips::PodIps;

/// The field manager of the kubelet's writes.
const MANAGER: &str = "ringlb-lab-kubelet";
/// Annotation: this pod's IPs, comma-separated, instead of the next free ones.
pub const POD_IPS_ANNOTATION: &str = "lab.ringlb.io/pod-ips";
/// Annotation: `"false"` keeps the pod Running but not Ready (a failing probe).
pub const READY_ANNOTATION: &str = "lab.ringlb.io/ready";
/// How often pods that could not be handled (no free IP, a failed write) are retried.
const RETRY: Duration = Duration::from_secs(1);

/// A Node the kubelet registers and reports Ready.
#[derive(Debug, Clone)]
pub struct LabNode {
    pub name: String,
    /// Its InternalIP (and the hostIP of its pods); `None`: a Hostname address only.
    pub address: Option<IpAddr>,
    /// Labels besides `kubernetes.io/hostname` and `kubernetes.io/os`.
    pub labels: BTreeMap<String, String>,
    /// Whether the kubelet binds pods to it (an edge node, say, runs none).
    pub runs_pods: bool,
    /// IPs for the pods bound to this node, handed out in order before any other
    /// (a lab node whose pod namespaces have fixed addresses).
    pub pod_ips: Vec<IpAddr>,
}

impl LabNode {
    /// A node that runs pods, with no address and no extra labels.
    pub fn new(name: impl Into<String>) -> LabNode {
        LabNode {
            name: name.into(),
            address: None,
            labels: BTreeMap::new(),
            runs_pods: true,
            pod_ips: Vec::new(),
        }
    }

    /// The pods bound to this node get these IPs first.
    pub fn pod_ips(mut self, ips: Vec<IpAddr>) -> LabNode {
        self.pod_ips = ips;
        self
    }

    pub fn address(mut self, ip: IpAddr) -> LabNode {
        self.address = Some(ip);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> LabNode {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The kubelet binds no pods to this node.
    pub fn without_pods(mut self) -> LabNode {
        self.runs_pods = false;
        self
    }
}

/// What the kubelet serves.
#[derive(Debug, Clone, Default)]
pub struct KubeletOptions {
    pub nodes: Vec<LabNode>,
    /// Pod IPs handed out first, in order (the lab's pod namespaces' addresses).
    pub pod_ips: Vec<IpAddr>,
    /// Then the next free address of these, at most one CIDR per family.
    pub pod_cidrs: Vec<IpNetwork>,
}

impl KubeletOptions {
    /// The families a pod gets an IP of, primary first: in the order they first
    /// appear in the nodes' and the global `pod_ips`, then `pod_cidrs` (one IPv4 and
    /// one IPv6 IP: dual stack).
    fn families(&self) -> Vec<bool> {
        let mut v: Vec<bool> = Vec::new();
        let all = self
            .nodes
            .iter()
            .flat_map(|n| &n.pod_ips)
            .chain(&self.pod_ips)
            .map(IpAddr::is_ipv4)
            .chain(self.pod_cidrs.iter().map(IpNetwork::is_ipv4));
        for v4 in all {
            if !v.contains(&v4) {
                v.push(v4);
            }
        }
        v
    }
}

/// The running kubelet; its task stops when this drops (the Nodes stay).
pub struct LabKubelet {
    task: JoinHandle<()>,
}

impl LabKubelet {
    /// Registers the nodes and starts the pod task. `bind`: bind unbound pods (leave
    /// it false when a kube-scheduler runs).
    pub async fn start(client: Client, opts: KubeletOptions, bind: bool) -> Result<LabKubelet> {
        for n in &opts.nodes {
            register_node(&client, n).await?;
        }
        let state = State::new(client.clone(), &opts, bind);
        let task = tokio::spawn(state.run(Api::<Pod>::all(client)));
        Ok(LabKubelet { task })
    }
}

impl Drop for LabKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ControlPlane {
    /// Starts a [`LabKubelet`] with the admin client; it binds pods itself unless this
    /// control plane runs kube-scheduler.
    pub async fn start_kubelet(&self, opts: KubeletOptions) -> Result<LabKubelet> {
        LabKubelet::start(self.client().await, opts, !self.opts.scheduler).await
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Creates (server-side apply) the Node and writes a Ready status with its addresses.
async fn register_node(client: &Client, n: &LabNode) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut labels = n.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), n.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": labels}});
    let pp = PatchParams::apply(MANAGER).force();
    api.patch(&n.name, &pp, &Patch::Apply(&node))
        .await
        .map_err(Error::kube(format!("registering Node {}", n.name)))?;
    let t = now();
    let cond = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason,
               "lastHeartbeatTime": t, "lastTransitionTime": t})
    };
    let mut addresses = vec![json!({"type": "Hostname", "address": n.name})];
    if let Some(ip) = n.address {
        addresses.insert(0, json!({"type": "InternalIP", "address": ip.to_string()}));
    }
    let resources = json!({"cpu": "2", "memory": "4Gi", "pods": "110"});
    let status = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name},
        "status": {
        "conditions": [
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": addresses,
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {"kubeletVersion": super::kubernetes_version(), "operatingSystem": "linux",
                     "architecture": std::env::consts::ARCH, "containerRuntimeVersion": "none://lab",
                     "kubeProxyVersion": "", "osImage": "ringlb lab", "kernelVersion": "",
                     "machineID": "", "systemUUID": "", "bootID": ""},
    }});
    api.patch_status(&n.name, &pp, &Patch::Apply(&status))
        .await
        .map_err(Error::kube(format!("writing Node {} status", n.name)))?;
    // The TaintNodesByCondition admission plugin gave the new Node the not-ready
    // taint; the node-lifecycle controller (not run here: it would want heartbeats)
    // would lift it once the node reports Ready, so the kubelet does that.
    let node = api
        .get(&n.name)
        .await
        .map_err(Error::kube(format!("reading Node {}", n.name)))?;
    let taints: Vec<_> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !NOT_READY_TAINTS.contains(&t.key.as_str()))
        .collect();
    api.patch(
        &n.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"taints": taints}})),
    )
    .await
    .map_err(Error::kube(format!(
        "lifting Node {}'s not-ready taint",
        n.name
    )))?;
    Ok(())
}

/// The status of a pod's Ready condition, if it has one.
fn ready_condition(p: &Pod) -> Option<bool> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// The taints the node-lifecycle controller keeps on a node that is not Ready.
const NOT_READY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

fn key(p: &Pod) -> (String, String) {
    (p.namespace().unwrap_or_default(), p.name_any())
}

/// The IPs in a pod's status.
fn pod_ips_of(p: &Pod) -> Vec<IpAddr> {
    let st = p.status.as_ref();
    let mut v: Vec<IpAddr> = st
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.parse().ok())
        .collect();
    if v.is_empty()
        && let Some(ip) = st
            .and_then(|s| s.pod_ip.as_ref())
            .and_then(|i| i.parse().ok())
    {
        v.push(ip);
    }
    v
}

/// The status a kubelet writes once a pod's containers run: phase Running, every
/// condition True (Ready per `ready`), one ready container status per container.
pub fn running_status(pod: &Pod, ips: &[IpAddr], host_ip: &str, ready: bool) -> Value {
    let t = now();
    let r = if ready { "True" } else { "False" };
    let cond = |type_: &str, status: &str| json!({"type": type_, "status": status, "lastProbeTime": null, "lastTransitionTime": t});
    let containers: Vec<Value> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| {
            json!({"name": c.name, "image": c.image.clone().unwrap_or_default(),
                   "imageID": "", "containerID": format!("lab://{}", c.name),
                   "ready": ready, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": t}}})
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "conditions": [cond("PodScheduled", "True"), cond("Initialized", "True"),
                       cond("ContainersReady", r), cond("Ready", r)],
        "containerStatuses": containers,
        "podIP": ips[0].to_string(),
        "podIPs": ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect::<Vec<_>>(),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": t,
    }})
}

/// The pod task's state: it is the only writer of it.
struct State {
    client: Client,
    bind: bool,
    /// every node's hostIP, by name
    nodes: HashMap<String, String>,
    /// the IPs reserved for each node's pods, by node name
    node_pod_ips: HashMap<String, Vec<IpAddr>>,
    /// the nodes pods are bound to, round robin
    pod_nodes: Vec<String>,
    next_node: usize,
    families: Vec<bool>,
    ips: PodIps,
    /// pod uid -> the IPs it holds
    assigned: HashMap<String, Vec<IpAddr>>,
    /// pods not done yet (no free IP, a failed write): retried
    waiting: BTreeMap<(String, String), Pod>,
    /// uids whose deletion is scheduled
    reaping: HashSet<String>,
    timers: JoinSet<()>,
}

impl State {
    fn new(client: Client, opts: &KubeletOptions, bind: bool) -> State {
        State {
            client,
            bind,
            nodes: opts
                .nodes
                .iter()
                .map(|n| {
                    let ip = n.address.map(|a| a.to_string());
                    (n.name.clone(), ip.unwrap_or_else(|| "127.0.0.1".into()))
                })
                .collect(),
            node_pod_ips: opts
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.pod_ips.clone()))
                .collect(),
            pod_nodes: opts
                .nodes
                .iter()
                .filter(|n| n.runs_pods)
                .map(|n| n.name.clone())
                .collect(),
            next_node: 0,
            families: opts.families(),
            ips: PodIps {
                explicit: opts.pod_ips.clone(),
                cidrs: opts.pod_cidrs.clone(),
                used: HashSet::new(),
                next: HashMap::new(),
            },
            assigned: HashMap::new(),
            waiting: BTreeMap::new(),
            reaping: HashSet::new(),
            timers: JoinSet::new(),
        }
    }

    async fn run(mut self, api: Api<Pod>) {
        let mut events = watcher(api, watcher::Config::default())
            .backoff(ringlb_ops::WatchBackoff::default())
            .boxed();
        let mut listed: Vec<Pod> = Vec::new();
        let mut tick = tokio::time::interval(RETRY);
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    None => return,
                    Some(Err(e)) => tracing::warn!(error = %e, "lab kubelet: pod watch error; retrying"),
                    Some(Ok(Event::Init)) => listed.clear(),
                    Some(Ok(Event::InitApply(p))) => listed.push(p),
                    Some(Ok(Event::InitDone)) => self.resync(std::mem::take(&mut listed)).await,
                    Some(Ok(Event::Apply(p))) => self.handle(p).await,
                    Some(Ok(Event::Delete(p))) => self.gone(&p).await,
                },
                _ = tick.tick() => self.retry().await,
                Some(_) = self.timers.join_next() => {}
            }
        }
    }

    /// After a (re-)list: the IPs in use are exactly those the listed pods hold.
    async fn resync(&mut self, pods: Vec<Pod>) {
        self.assigned.clear();
        self.ips.used.clear();
        self.waiting.clear();
        for p in &pods {
            let ips = pod_ips_of(p);
            self.ips.used.extend(ips.iter().copied());
            self.assigned.insert(p.uid().unwrap_or_default(), ips);
        }
        for p in pods {
            self.handle(p).await;
        }
    }

    async fn retry(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for (_, p) in waiting {
            self.handle(p).await;
        }
    }

    async fn gone(&mut self, p: &Pod) {
        let uid = p.uid().unwrap_or_default();
        self.reaping.remove(&uid);
        self.waiting.remove(&key(p));
        for ip in self.assigned.remove(&uid).unwrap_or_default() {
            self.ips.used.remove(&ip);
        }
        // a freed IP may be what a waiting pod needs
        self.retry().await;
    }

    async fn handle(&mut self, p: Pod) {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        if p.metadata.deletion_timestamp.is_some() {
            self.waiting.remove(&key(&p));
            if node.is_some_and(|n| self.nodes.contains_key(&n)) {
                self.reap_later(&p);
            }
            return;
        }
        let Some(node) = node else {
            if self.bind {
                self.bind(p).await;
            }
            return;
        };
        let Some(host_ip) = self.nodes.get(&node).cloned() else {
            return;
        };
        let uid = p.uid().unwrap_or_default();
        let held = pod_ips_of(&p);
        let ready = p.annotations().get(READY_ANNOTATION).map(String::as_str) != Some("false");
        if !held.is_empty() {
            self.ips.used.extend(held.iter().copied());
            self.assigned.insert(uid, held.clone());
            // the annotation changed on a running pod: its probe now fails or passes
            if ready_condition(&p) != Some(ready) {
                self.write_status(&p, &held, &host_ip, ready).await;
            }
            return;
        }
        let Some(ips) = self.allocate(&p, &node) else {
            tracing::debug!(pod = ?key(&p), "lab kubelet: no free pod IP yet");
            self.waiting.insert(key(&p), p);
            return;
        };
        let status = running_status(&p, &ips, &host_ip, ready);
        let (ns, name) = key(&p);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %format!("{ns}/{name}"), ?ips, %node, "lab kubelet: pod running");
                self.assigned.insert(uid, ips);
            }
            Err(e) => {
                for ip in &ips {
                    self.ips.used.remove(ip);
                }
                if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "lab kubelet: writing pod status");
                    self.waiting.insert(key(&p), p);
                }
            }
        }
    }

    /// Rewrites a running pod's status with readiness `ready` (its IPs unchanged).
    async fn write_status(&mut self, p: &Pod, ips: &[IpAddr], host_ip: &str, ready: bool) {
        let status = running_status(p, ips, host_ip, ready);
        let (ns, name) = key(p);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404)
        {
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "lab kubelet: writing pod readiness");
            self.waiting.insert(key(p), p.clone());
        }
    }

    /// One IP per family: the annotation's, or the next free ones (the node's own
    /// first).
    fn allocate(&mut self, p: &Pod, node: &str) -> Option<Vec<IpAddr>> {
        if let Some(list) = p.annotations().get(POD_IPS_ANNOTATION) {
            let ips: Vec<IpAddr> = list
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect();
            self.ips.used.extend(ips.iter().copied());
            return (!ips.is_empty()).then_some(ips);
        }
        let own = self.node_pod_ips.get(node).cloned().unwrap_or_default();
        let mut ips = Vec::new();
        for v4 in self.families.clone() {
            let mine = own
                .iter()
                .copied()
                .find(|ip| ip.is_ipv4() == v4 && !self.ips.used.contains(ip));
            if let Some(ip) = mine {
                self.ips.used.insert(ip);
                ips.push(ip);
                continue;
            }
            match self.ips.allocate(v4) {
                Some(ip) => ips.push(ip),
                None => {
                    for ip in &ips {
                        self.ips.used.remove(ip);
                    }
                    return None;
                }
            }
        }
        (!ips.is_empty()).then_some(ips)
    }

    /// `POST pods/<name>/binding` to the next node that runs pods (and has a free IP
    /// of its own, when it has any).
    async fn bind(&mut self, p: Pod) {
        if self.pod_nodes.is_empty() {
            return;
        }
        // round robin, past nodes whose own pod IPs are all taken
        let n = self.pod_nodes.len();
        let full = |node: &String| {
            let own = self
                .node_pod_ips
                .get(node)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            !own.is_empty() && own.iter().all(|ip| self.ips.used.contains(ip))
        };
        let pick = (0..n)
            .map(|k| (self.next_node + k) % n)
            .find(|&i| !full(&self.pod_nodes[i]))
            .unwrap_or(self.next_node % n);
        let node = self.pod_nodes[pick].clone();
        self.next_node = pick + 1;
        let (ns, name) = key(&p);
        let binding = json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api
            .create_subresource::<Value, Value>("binding", &name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => tracing::debug!(pod = %format!("{ns}/{name}"), %node, "lab kubelet: bound"),
            // already bound (409) or gone (404): the watch brings what happened
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "lab kubelet: binding");
                self.waiting.insert(key(&p), p);
            }
        }
    }

    /// At the end of its grace period (`deletionTimestamp`), deletes the pod with
    /// grace 0 and its uid as precondition: the kubelet's "containers have stopped".
    fn reap_later(&mut self, p: &Pod) {
        let uid = p.uid().unwrap_or_default();
        if !self.reaping.insert(uid.clone()) {
            return;
        }
        let when = p
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
        let wait = when
            .duration_since(k8s_openapi::jiff::Timestamp::now())
            .try_into()
            .unwrap_or(Duration::ZERO);
        let (ns, name) = key(p);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        self.timers.spawn(async move {
            tokio::time::sleep(wait).await;
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => tracing::debug!(pod = %format!("{ns}/{name}"), "lab kubelet: grace period over, deleted"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "lab kubelet: deleting"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_in_order_of_first_appearance() {
        let o = KubeletOptions {
            pod_ips: vec!["10.0.0.5".parse().unwrap()],
            pod_cidrs: vec!["fd00::/64".parse().unwrap(), "10.1.0.0/24".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(o.families(), vec![true, false]);
        let v6 = KubeletOptions {
            pod_cidrs: vec!["fd00::/64".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(v6.families(), vec![false]);
    }

    #[test]
    fn running_status_is_ready_with_every_ip() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "web", "image": "x"}]}}))
        .unwrap();
        let ips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let s = running_status(&pod, &ips, "192.0.2.1", true);
        assert_eq!(s["status"]["podIP"], "10.0.0.5");
        assert_eq!(s["status"]["podIPs"][1]["ip"], "fd00::5");
        assert_eq!(s["status"]["conditions"][3]["type"], "Ready");
        assert_eq!(s["status"]["conditions"][3]["status"], "True");
        assert_eq!(s["status"]["containerStatuses"][0]["ready"], true);
        let not = running_status(&pod, &ips, "192.0.2.1", false);
        assert_eq!(not["status"]["conditions"][3]["status"], "False");
        // what the kubelet compares with the annotation on a running pod
        assert_eq!(ready_condition(&pod), None);
        for (status, want) in [(s, true), (not, false)] {
            let mut p = serde_json::to_value(&pod).unwrap();
            p["status"] = status["status"].clone();
            let p: Pod = serde_json::from_value(p).unwrap();
            assert_eq!(ready_condition(&p), Some(want));
        }
    }
}
