//! Built-in controllers, as kube-controller-manager and the kubelet would run them:
//!
//! - Deployment → ReplicaSet (named `<deploy>-<template hash>`, older ones scaled to 0);
//! - ReplicaSet → Pods (`generateName: <rs>-`);
//! - kubelet: Pending pods get `spec.nodeName`, `status.podIP(s)` (from
//!   `SimOptions::pod_ips`, then `pod_cidrs`, or the `apisim.ringlb.io/pod-ips`
//!   annotation), phase Running and Ready=True (unless annotated
//!   `apisim.ringlb.io/ready: "false"`);
//! - EndpointSlices for every Service with a selector, from the selected Pods'
//!   IPs and Ready condition, ports resolved from `targetPort` (named ports
//!   through the Pods' container ports);
//! - garbage collection of ReplicaSets, Pods and EndpointSlices whose owner is gone.
//!
//! One task: it follows the store's change history, collects what is dirty, and
//! reconciles in batches. Its own writes come back as changes and settle because
//! no-op writes are not stored.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

use super::api::{Api, DeleteOptions, Sub, Target};
use super::endpointslices::{desired_slices, is_ready, pod_ips_of};
use super::meta;
use super::patch::PatchKind;
use super::podips::PodIps;
use super::resources::ResourceInfo;
use super::select::LabelSelector;
use super::store::EventType;

pub const POD_IPS_ANNOTATION: &str = "apisim.ringlb.io/pod-ips";
pub const READY_ANNOTATION: &str = "apisim.ringlb.io/ready";
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

#[derive(Debug, Clone)]
pub struct Config {
    pub kubelet: bool,
    pub controllers: bool,
    pub node_name: String,
    pub pod_ips: Vec<IpAddr>,
    pub pod_cidrs: Vec<IpNetwork>,
}

impl From<&super::SimOptions> for Config {
    fn from(o: &super::SimOptions) -> Self {
        Config {
            kubelet: o.kubelet,
            controllers: o.controllers,
            node_name: o.node_name.clone(),
            pod_ips: o.pod_ips.clone(),
            pod_cidrs: o.pod_cidrs.clone(),
        }
    }
}

struct Ctl {
    api: Arc<Api>,
    cfg: Config,
    ips: PodIps,
    deployments: Arc<ResourceInfo>,
    replicasets: Arc<ResourceInfo>,
    pods: Arc<ResourceInfo>,
    services: Arc<ResourceInfo>,
    slices: Arc<ResourceInfo>,
    /// uids of pods whose removal is scheduled
    terminating: HashSet<String>,
    /// (namespace, Service) -> names of the EndpointSlices we manage for it
    slice_index: HashMap<(String, String), BTreeSet<String>>,
}

#[derive(Default)]
struct Dirty {
    deployments: BTreeSet<(String, String)>,
    replicasets: BTreeSet<(String, String)>,
    services: BTreeSet<(String, String)>,
    pods_to_start: BTreeSet<(String, String)>,
    /// Namespaces whose pods changed (services there may select them).
    pod_namespaces: BTreeMap<String, Vec<Value>>,
    gone_owners: Vec<(Arc<ResourceInfo>, String, String)>,
}

/// `map` with `pod-template-hash: hash` added.
fn with_hash(mut map: serde_json::Map<String, Value>, hash: &str) -> Value {
    map.insert("pod-template-hash".into(), json!(hash));
    Value::Object(map)
}

/// An object (from `obj` if it is one) whose map field `field` carries the hash label.
fn with_label(obj: Option<&Value>, field: &str, hash: &str) -> Value {
    let mut o = obj.and_then(Value::as_object).cloned().unwrap_or_default();
    let inner = o
        .get(field)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    o.insert(field.into(), with_hash(inner, hash));
    Value::Object(o)
}

/// The Service an EndpointSlice belongs to, if this controller manages it.
fn managed_slice_owner(slice: &Value) -> Option<&str> {
    let l = slice.pointer("/metadata/labels")?;
    if l.get(MANAGED_BY_LABEL).and_then(Value::as_str) != Some(MANAGED_BY) {
        return None;
    }
    l.get(SERVICE_NAME_LABEL).and_then(Value::as_str)
}

fn key(obj: &Value) -> (String, String) {
    (
        meta::namespace(obj).to_string(),
        meta::name(obj).to_string(),
    )
}

fn controller_owner(obj: &Value) -> Option<(&str, &str)> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o.get("controller") == Some(&json!(true)))
        .map(|o| {
            (
                o.get("kind").and_then(Value::as_str).unwrap_or(""),
                o.get("name").and_then(Value::as_str).unwrap_or(""),
            )
        })
}

fn owned_by(obj: &Value, uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .any(|o| o.get("uid").and_then(Value::as_str) == Some(uid))
        })
}

fn owner_ref(owner: &Value, api_version: &str, kind: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": meta::name(owner), "uid": meta::uid(owner),
            "controller": true, "blockOwnerDeletion": true}])
}

/// The parts of a Service that decide its EndpointSlices.
fn slice_inputs(svc: &Value) -> Value {
    json!([
        svc.pointer("/spec/selector"),
        svc.pointer("/spec/ports"),
        svc.pointer("/spec/ipFamilies"),
        svc.pointer("/spec/publishNotReadyAddresses"),
        svc.pointer("/spec/type")
    ])
}

pub async fn run(api: Arc<Api>, cfg: Config) {
    let lookup = |g: &str, p: &str| api.registry.lookup(g, "v1", p);
    let (Some(deployments), Some(replicasets), Some(pods), Some(services), Some(slices)) = (
        lookup("apps", "deployments"),
        lookup("apps", "replicasets"),
        lookup("", "pods"),
        lookup("", "services"),
        lookup("discovery.k8s.io", "endpointslices"),
    ) else {
        tracing::error!("built-in resources missing; controllers not started");
        return;
    };
    let ips = PodIps {
        explicit: cfg.pod_ips.clone(),
        cidrs: cfg.pod_cidrs.clone(),
        used: HashSet::new(),
        next: HashMap::new(),
    };
    let mut ctl = Ctl {
        api: api.clone(),
        cfg,
        ips,
        deployments,
        replicasets,
        pods,
        services,
        slices,
        terminating: HashSet::new(),
        slice_index: HashMap::new(),
    };
    let mut changed = api.store.subscribe();
    let mut cursor = 0u64;
    let mut full = true;
    loop {
        changed.borrow_and_update();
        let mut dirty = Dirty::default();
        if full {
            cursor = api.store.current_rv();
            ctl.resync(&mut dirty);
            full = false;
        } else {
            match api.store.changes_since(cursor) {
                Ok(changes) => {
                    for c in changes {
                        cursor = c.rv;
                        ctl.classify(&c.resource, c.kind, &c.object, c.old.as_deref(), &mut dirty);
                    }
                }
                Err(_) => {
                    full = true;
                    continue;
                }
            }
        }
        ctl.reconcile(dirty);
        if changed.changed().await.is_err() {
            return;
        }
    }
}

impl Ctl {
    fn target(&self, info: &Arc<ResourceInfo>, ns: &str, name: &str) -> Target {
        Target {
            info: info.clone(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    /// The kubelet side of graceful deletion: a terminating pod is removed when
    /// its grace period is over.
    fn schedule_removal(&mut self, pod: &Value) {
        let Some(secs) = pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_u64)
            .filter(|s| *s > 0)
        else {
            return;
        };
        let uid = meta::uid(pod).to_string();
        if !self.terminating.insert(uid.clone()) {
            return;
        }
        let configured = self.api.pod_grace;
        let wait = if configured.as_secs_f64().ceil() as u64 == secs {
            configured
        } else {
            std::time::Duration::from_secs(secs)
        };
        let api = self.api.clone();
        let t = self.target(&self.pods, meta::namespace(pod), meta::name(pod));
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let force = DeleteOptions {
                uid: Some(uid),
                grace_period_seconds: Some(0),
                ..DeleteOptions::default()
            };
            let _ = api.delete(&t, &force);
        });
    }

    fn resync(&mut self, d: &mut Dirty) {
        self.slice_index.clear();
        for s in self.api.store.list(&self.slices.id, None).0 {
            if let Some(svc) = managed_slice_owner(&s) {
                let owner = (meta::namespace(&s).to_string(), svc.to_string());
                self.slice_index
                    .entry(owner)
                    .or_default()
                    .insert(meta::name(&s).to_string());
            }
        }
        for p in self.api.store.list(&self.pods.id, None).0 {
            self.ips.used.extend(pod_ips_of(&p));
            d.pods_to_start.insert(key(&p));
            if self.cfg.kubelet {
                self.schedule_removal(&p);
            }
        }
        for o in self.api.store.list(&self.deployments.id, None).0 {
            d.deployments.insert(key(&o));
        }
        for o in self.api.store.list(&self.replicasets.id, None).0 {
            d.replicasets.insert(key(&o));
        }
        for o in self.api.store.list(&self.services.id, None).0 {
            d.services.insert(key(&o));
        }
    }

    fn classify(
        &mut self,
        res: &Arc<str>,
        kind: EventType,
        obj: &Value,
        old: Option<&Value>,
        d: &mut Dirty,
    ) {
        let k = key(obj);
        if *res == self.deployments.id {
            d.deployments.insert(k);
            if kind == EventType::Deleted {
                d.gone_owners.push((
                    self.replicasets.clone(),
                    meta::namespace(obj).into(),
                    meta::uid(obj).into(),
                ));
            }
        } else if *res == self.replicasets.id {
            d.replicasets.insert(k);
            if let Some(("Deployment", name)) = controller_owner(obj) {
                d.deployments
                    .insert((meta::namespace(obj).into(), name.into()));
            }
            if kind == EventType::Deleted {
                d.gone_owners.push((
                    self.pods.clone(),
                    meta::namespace(obj).into(),
                    meta::uid(obj).into(),
                ));
            }
        } else if *res == self.pods.id {
            if kind == EventType::Deleted {
                for ip in pod_ips_of(obj) {
                    self.ips.used.remove(&ip);
                }
                self.terminating.remove(meta::uid(obj));
            } else {
                d.pods_to_start.insert(k);
                if self.cfg.kubelet {
                    self.schedule_removal(obj);
                }
            }
            if let Some(("ReplicaSet", name)) = controller_owner(obj) {
                d.replicasets
                    .insert((meta::namespace(obj).into(), name.into()));
            }
            let list = d
                .pod_namespaces
                .entry(meta::namespace(obj).into())
                .or_default();
            list.push(obj.clone());
            if let Some(o) = old {
                list.push(o.clone());
            }
        } else if *res == self.services.id {
            let relevant = kind != EventType::Modified
                || old.is_none_or(|o| slice_inputs(o) != slice_inputs(obj));
            if relevant {
                d.services.insert(k);
            }
            if kind == EventType::Deleted {
                d.gone_owners.push((
                    self.slices.clone(),
                    meta::namespace(obj).into(),
                    meta::uid(obj).into(),
                ));
            }
        } else if *res == self.slices.id
            && let Some(svc) = managed_slice_owner(obj)
        {
            let owner = (meta::namespace(obj).to_string(), svc.to_string());
            if kind == EventType::Deleted {
                if let Some(set) = self.slice_index.get_mut(&owner) {
                    set.remove(meta::name(obj));
                }
                d.services.insert(owner);
            } else {
                self.slice_index
                    .entry(owner)
                    .or_default()
                    .insert(meta::name(obj).to_string());
            }
        }
    }

    fn reconcile(&mut self, mut d: Dirty) {
        // Pods that changed make the Services selecting them (before or after) dirty.
        for (ns, pods) in std::mem::take(&mut d.pod_namespaces) {
            for svc in self.api.store.list(&self.services.id, Some(&ns)).0 {
                let Some(sel) = svc
                    .pointer("/spec/selector")
                    .and_then(Value::as_object)
                    .filter(|m| !m.is_empty())
                else {
                    continue;
                };
                let sel = LabelSelector::from_map(sel);
                if pods.iter().any(|p| sel.matches(p)) {
                    d.services.insert(key(&svc));
                }
            }
        }
        if self.cfg.controllers {
            for (info, ns, uid) in std::mem::take(&mut d.gone_owners) {
                for o in self.api.store.list(&info.id, Some(&ns)).0 {
                    if owned_by(&o, &uid) {
                        let _ = self.api.delete(
                            &self.target(&info, &ns, meta::name(&o)),
                            &DeleteOptions::default(),
                        );
                    }
                }
            }
            for (ns, name) in &d.deployments {
                self.deployment(ns, name);
            }
            for (ns, name) in &d.replicasets {
                self.replicaset(ns, name);
            }
        }
        if self.cfg.kubelet {
            for (ns, name) in &d.pods_to_start {
                self.start_pod(ns, name);
            }
        }
        if self.cfg.controllers {
            for (ns, name) in &d.services {
                self.endpoint_slices(ns, name);
            }
        }
    }

    fn deployment(&self, ns: &str, name: &str) {
        let Some(dep) = self.api.store.get(&self.deployments.id, ns, name) else {
            return;
        };
        if dep.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let replicas = dep
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        // Built defensively: a malformed Deployment must not panic this task.
        let template = dep
            .pointer("/spec/template")
            .filter(|t| t.is_object())
            .cloned()
            .unwrap_or_else(|| json!({}));
        let hash = template_hash(&template);
        let rs_name = format!("{name}-{hash}");
        let mut tmpl = template.clone();
        tmpl["metadata"] = with_label(tmpl.get("metadata"), "labels", &hash);
        let mut selector = dep
            .pointer("/spec/selector")
            .filter(|s| s.is_object())
            .cloned()
            .unwrap_or_else(|| json!({}));
        let ml = selector
            .get("matchLabels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        selector["matchLabels"] = with_hash(ml, &hash);
        let uid = meta::uid(&dep).to_string();
        let owned: Vec<Arc<Value>> = self
            .api
            .store
            .list(&self.replicasets.id, Some(ns))
            .0
            .into_iter()
            .filter(|r| owned_by(r, &uid))
            .collect();
        if !owned.iter().any(|r| meta::name(r) == rs_name) {
            let rs = json!({"metadata": {"name": rs_name, "namespace": ns, "labels": tmpl["metadata"]["labels"],
                    "ownerReferences": owner_ref(&dep, "apps/v1", "Deployment")},
                "spec": {"replicas": replicas, "selector": selector, "template": tmpl}});
            if let Err(e) = self.api.create(&self.replicasets, ns, rs) {
                tracing::warn!(deployment = %name, error = %e, "creating ReplicaSet");
            }
        }
        let (mut ready, mut total, mut updated) = (0, 0, 0);
        for rs in &owned {
            let want = if meta::name(rs) == rs_name {
                replicas
            } else {
                0
            };
            if rs.pointer("/spec/replicas").and_then(Value::as_i64) != Some(want) {
                let _ = self.api.patch(
                    &self.target(&self.replicasets, ns, meta::name(rs)),
                    Sub::Main,
                    PatchKind::Merge,
                    &json!({"spec": {"replicas": want}}),
                    None,
                    false,
                );
            }
            let r = rs
                .pointer("/status/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            total += r;
            ready += rs
                .pointer("/status/readyReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if meta::name(rs) == rs_name {
                updated = r;
            }
        }
        let available = ready >= replicas;
        let status = json!({"status": {
            "observedGeneration": dep.pointer("/metadata/generation"),
            "replicas": total, "readyReplicas": ready, "availableReplicas": ready, "updatedReplicas": updated,
            "conditions": [{"type": "Available", "status": if available { "True" } else { "False" },
                            "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }}],
        }});
        let _ = self.api.patch(
            &self.target(&self.deployments, ns, name),
            Sub::Status,
            PatchKind::Merge,
            &status,
            None,
            false,
        );
    }

    fn replicaset(&self, ns: &str, name: &str) {
        let Some(rs) = self.api.store.get(&self.replicasets.id, ns, name) else {
            return;
        };
        if rs.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let want = rs
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0) as usize;
        let uid = meta::uid(&rs).to_string();
        let pods: Vec<Arc<Value>> = self
            .api
            .store
            .list(&self.pods.id, Some(ns))
            .0
            .into_iter()
            .filter(|p| owned_by(p, &uid) && p.pointer("/metadata/deletionTimestamp").is_none())
            .collect();
        if pods.len() < want {
            let tmpl = rs
                .pointer("/spec/template")
                .cloned()
                .unwrap_or_else(|| json!({}));
            for _ in pods.len()..want {
                let pod = json!({"metadata": {"generateName": format!("{name}-"), "namespace": ns,
                        "labels": tmpl.pointer("/metadata/labels"), "annotations": tmpl.pointer("/metadata/annotations"),
                        "ownerReferences": owner_ref(&rs, "apps/v1", "ReplicaSet")},
                    "spec": tmpl.get("spec").cloned().unwrap_or_else(|| json!({}))});
                if let Err(e) = self.api.create(&self.pods, ns, pod) {
                    tracing::warn!(replicaset = %name, error = %e, "creating Pod");
                }
            }
        } else {
            for p in pods.iter().skip(want) {
                let _ = self.api.delete(
                    &self.target(&self.pods, ns, meta::name(p)),
                    &DeleteOptions::default(),
                );
            }
        }
        let live = pods.len().min(want) as i64;
        let ready = pods.iter().take(want).filter(|p| is_ready(p)).count() as i64;
        let status = json!({"status": {"observedGeneration": rs.pointer("/metadata/generation"), "replicas": live,
            "fullyLabeledReplicas": live, "readyReplicas": ready, "availableReplicas": ready}});
        let _ = self.api.patch(
            &self.target(&self.replicasets, ns, name),
            Sub::Status,
            PatchKind::Merge,
            &status,
            None,
            false,
        );
    }

    fn start_pod(&mut self, ns: &str, name: &str) {
        let Some(pod) = self.api.store.get(&self.pods.id, ns, name) else {
            return;
        };
        if pod.pointer("/metadata/deletionTimestamp").is_some() || !pod_ips_of(&pod).is_empty() {
            return;
        }
        if !matches!(
            pod.pointer("/status/phase").and_then(Value::as_str),
            None | Some("Pending")
        ) {
            return;
        }
        let annotations = pod.pointer("/metadata/annotations");
        let ann = |k: &str| annotations.and_then(|a| a.get(k)).and_then(Value::as_str);
        let ips: Vec<IpAddr> = match ann(POD_IPS_ANNOTATION) {
            Some(list) => list
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect(),
            None => {
                let mut fams: Vec<bool> = self.ips.cidrs.iter().map(IpNetwork::is_ipv4).collect();
                fams.dedup();
                fams.into_iter()
                    .filter_map(|v4| self.ips.allocate(v4))
                    .collect()
            }
        };
        if ips.is_empty() {
            tracing::warn!(pod = %name, "no pod IP available");
            return;
        }
        self.ips.used.extend(ips.iter().copied());
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or(&self.cfg.node_name)
            .to_string();
        if pod.pointer("/spec/nodeName").is_none() {
            let _ = self.api.patch(
                &self.target(&self.pods, ns, name),
                Sub::Main,
                PatchKind::Merge,
                &json!({"spec": {"nodeName": node}}),
                None,
                false,
            );
        }
        let ready = if ann(READY_ANNOTATION) == Some("false") {
            "False"
        } else {
            "True"
        };
        let now = meta::now();
        let cond = |t: &str, s: &str| json!({"type": t, "status": s, "lastTransitionTime": now});
        let status = json!({"status": {
            "phase": "Running",
            "podIP": ips[0].to_string(),
            "podIPs": ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect::<Vec<_>>(),
            "hostIP": "127.0.0.1",
            "startTime": now,
            "conditions": [cond("PodScheduled", "True"), cond("Initialized", "True"),
                           cond("ContainersReady", ready), cond("Ready", ready)],
        }});
        let _ = self.api.patch(
            &self.target(&self.pods, ns, name),
            Sub::Status,
            PatchKind::Merge,
            &status,
            None,
            false,
        );
    }

    fn endpoint_slices(&self, ns: &str, name: &str) {
        // From the index (kept from the change stream), not a scan of every slice
        // in the namespace: O(slices of this Service) per reconcile.
        let existing: Vec<Arc<Value>> = self
            .slice_index
            .get(&(ns.to_string(), name.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|n| self.api.store.get(&self.slices.id, ns, n))
            .collect();
        let svc = self.api.store.get(&self.services.id, ns, name);
        let selector = svc
            .as_ref()
            .filter(|s| s.pointer("/spec/type").and_then(Value::as_str) != Some("ExternalName"))
            .and_then(|s| {
                s.pointer("/spec/selector")
                    .and_then(Value::as_object)
                    .filter(|m| !m.is_empty())
                    .cloned()
            });
        let (Some(svc), Some(selector)) = (svc, selector) else {
            for s in existing {
                let _ = self.api.delete(
                    &self.target(&self.slices, ns, meta::name(&s)),
                    &DeleteOptions::default(),
                );
            }
            return;
        };
        let pods: Vec<Arc<Value>> = self.api.store.list(&self.pods.id, Some(ns)).0;
        let desired = desired_slices(&svc, &LabelSelector::from_map(&selector), &pods);
        // Reuse existing slices in order of (addressType, ports), update what differs.
        let mut existing: Vec<Arc<Value>> = existing;
        existing.sort_by_key(|s| {
            (
                s.get("addressType").map(Value::to_string),
                s.get("ports").map(Value::to_string),
                meta::name(s).to_string(),
            )
        });
        let mut existing = existing.into_iter();
        for body in desired {
            match existing.next() {
                Some(cur) => {
                    let same = ["addressType", "endpoints", "ports"]
                        .iter()
                        .all(|k| cur.get(*k) == body.get(*k));
                    if !same {
                        let mut upd = (*cur).clone();
                        for k in ["addressType", "endpoints", "ports"] {
                            upd[k] = body.get(k).cloned().unwrap_or(Value::Null);
                        }
                        if let Err(e) = self.api.update(
                            &self.target(&self.slices, ns, meta::name(&cur)),
                            Sub::Main,
                            upd,
                        ) {
                            tracing::warn!(service = %name, error = %e, "updating EndpointSlice");
                        }
                    }
                }
                None => {
                    let mut obj = body;
                    obj["metadata"] = json!({"generateName": format!("{name}-"), "namespace": ns,
                        "labels": {SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY},
                        "ownerReferences": owner_ref(&svc, "v1", "Service")});
                    if let Err(e) = self.api.create(&self.slices, ns, obj) {
                        tracing::warn!(service = %name, error = %e, "creating EndpointSlice");
                    }
                }
            }
        }
        for s in existing {
            let _ = self.api.delete(
                &self.target(&self.slices, ns, meta::name(&s)),
                &DeleteOptions::default(),
            );
        }
    }
}

/// A stable 10-character hash of a pod template (the `pod-template-hash` label).
fn template_hash(t: &Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in t.to_string().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|_| {
            let c = ALPHA[(h % ALPHA.len() as u64) as usize] as char;
            h /= ALPHA.len() as u64;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_hash_is_stable() {
        assert_eq!(
            template_hash(&json!({"a": 1})),
            template_hash(&json!({"a": 1}))
        );
    }
}
