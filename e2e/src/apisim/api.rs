//! Kubernetes object semantics over the store: create/update/patch/delete with
//! resourceVersion preconditions, generation, status subresource isolation,
//! finalizers and deletionTimestamp, Service allocation, CRD registration,
//! namespace checks. No HTTP here; `server.rs` maps requests onto these calls and the
//! built-in controllers call them directly.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::admission::{applied_part, check_schema, check_type, crd_status, reset_status};
use super::convert;
use super::error::ApiError;
use super::fields;
use super::meta;
use super::patch::{self, PatchKind};
use super::resources::{self, Registry, ResourceInfo};
use super::select::{FieldSelector, LabelSelector};
use super::services::{self, Allocator};
use super::store::{Mutation, Store};

/// One addressed object.
#[derive(Debug, Clone)]
pub struct Target {
    pub info: Arc<ResourceInfo>,
    /// Empty for cluster-scoped resources.
    pub namespace: String,
    pub name: String,
}

/// How a write names its subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
}

/// A list request's options.
#[derive(Debug, Default, Clone)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// A page of a list.
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// Delete options from the body or query.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `gracePeriodSeconds`; 0 forces an immediate delete of a terminating pod.
    pub grace_period_seconds: Option<u64>,
}

/// The API: store, registry and allocators.
pub struct Api {
    pub store: Arc<Store>,
    pub registry: Registry,
    services: Mutex<Allocator>,
    /// Pods are deleted gracefully: deletionTimestamp first, the simulated
    /// kubelet removes them after this (zero: at once).
    pub pod_grace: std::time::Duration,
}

impl Api {
    pub fn new(store: Arc<Store>, registry: Registry, services: Allocator) -> Self {
        Api {
            store,
            registry,
            services: Mutex::new(services),
            pod_grace: std::time::Duration::ZERO,
        }
    }

    /// A throw-away copy of the whole state for a dry run.
    pub fn fork(&self) -> Api {
        Api {
            store: Arc::new(self.store.fork()),
            registry: self.registry.fork(),
            services: Mutex::new(self.alloc().clone()),
            pod_grace: self.pod_grace,
        }
    }

    fn alloc(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.services.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, t: &Target) -> Result<Arc<Value>, ApiError> {
        self.store
            .get(&t.info.id, &t.namespace, &t.name)
            .map(|o| with_type(&t.info, o))
            .ok_or_else(|| ApiError::not_found(&t.info.qualified(), &t.name))
    }

    /// Lists with selectors and `limit`/`continue` paging. The continue token is
    /// `<rv>/<namespace>/<name>` of the last item returned; later pages read the
    /// current state from there on and report the first page's resourceVersion.
    pub fn list(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: Option<&str>,
        o: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let (items, rv) = self.store.list(&info.id, namespace);
        let (mut rv_out, mut after) = (rv, None);
        if let Some(tok) = o.continue_token.as_deref().filter(|t| !t.is_empty()) {
            let mut parts = tok.splitn(3, '/');
            let (Some(r), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(ApiError::bad_request(format!(
                    "invalid continue token {tok:?}"
                )));
            };
            rv_out = r
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid continue token {tok:?}")))?;
            after = Some((ns.to_string(), name.to_string()));
        }
        let mut matching = items
            .into_iter()
            .map(|obj| with_type(info, obj))
            .filter(|obj| {
                after.as_ref().is_none_or(|(ns, name)| {
                    (meta::namespace(obj), meta::name(obj)) > (ns.as_str(), name.as_str())
                }) && o.labels.matches(obj)
                    && o.fields.matches(obj)
            });
        let mut out = Vec::new();
        let limit = o.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        for obj in matching.by_ref() {
            out.push(obj);
            if out.len() >= limit {
                break;
            }
        }
        let remaining = matching.count();
        let continue_token = (remaining > 0).then(|| {
            let last = out
                .last()
                .map(|o| (meta::namespace(o).to_string(), meta::name(o).to_string()));
            let (ns, name) = last.unwrap_or_default();
            format!("{rv_out}/{ns}/{name}")
        });
        Ok(ListPage {
            items: out,
            resource_version: rv_out,
            continue_token,
            remaining: (remaining > 0).then_some(remaining),
        })
    }

    fn check_namespace(&self, info: &ResourceInfo, ns: &str) -> Result<(), ApiError> {
        if !info.namespaced {
            return Ok(());
        }
        if ns.is_empty() {
            return Err(ApiError::bad_request(
                "a namespaced resource needs a namespace in the path",
            ));
        }
        let nsinfo = self
            .registry
            .lookup("", "v1", "namespaces")
            .ok_or_else(|| ApiError::internal("no namespaces"))?;
        match self.store.get(&nsinfo.id, "", ns) {
            None => Err(ApiError::not_found("namespaces", ns)),
            Some(n) if n.pointer("/metadata/deletionTimestamp").is_some() => {
                Err(ApiError::forbidden(format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// POST: creates `body` in `namespace` (name from the body or `generateName`).
    pub fn create(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        body: Value,
    ) -> Result<Arc<Value>, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        check_type(info, &body)?;
        let mut body = convert::to_storage(info, body);
        self.check_namespace(info, namespace)?;
        let m = meta::meta_mut(&mut body);
        let body_ns = m.get("namespace").and_then(Value::as_str).unwrap_or("");
        if info.namespaced && !body_ns.is_empty() && body_ns != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty()
            && let Some(g) = m.get("generateName").and_then(Value::as_str)
        {
            name = format!("{g}{}", meta::random_suffix(5));
        }
        meta::validate_name(&name).map_err(|e| ApiError::invalid(&info.kind, &name, e))?;
        m.insert("name".into(), json!(name));
        if info.namespaced {
            m.insert("namespace".into(), json!(namespace));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now()));
        m.insert("generation".into(), json!(1));
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            // kube-apiserver's storage refuses this with exactly these words (500).
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
        ] {
            m.remove(f);
        }
        if info.status {
            reset_status(info, &mut body);
        }
        self.admit_create(info, &mut body)?;
        check_schema(info, &mut body)?;
        let t = Target {
            info: info.clone(),
            namespace: if info.namespaced {
                namespace.into()
            } else {
                String::new()
            },
            name,
        };
        let allocating = info.plural == "services" && info.group.is_empty();
        let (stored, ()) = self
            .store
            .mutate(&info.id, &t.namespace, &t.name, |old, _| {
                if old.is_some() {
                    return Err(ApiError::already_exists(&info.qualified(), &t.name));
                }
                if allocating {
                    services::prepare(&mut body, None, &mut self.alloc())
                        .map_err(|e| ApiError::invalid(&info.kind, &t.name, e))?;
                }
                Ok((Mutation::Put(body), ()))
            })?;
        let stored = stored.ok_or_else(|| ApiError::internal("create stored nothing"))?;
        self.after_write(info, &stored);
        Ok(with_type(info, stored))
    }

    /// Checks and hooks that run before a create is stored.
    fn admit_create(&self, info: &ResourceInfo, body: &mut Value) -> Result<(), ApiError> {
        let name = meta::name(body).to_string();
        match (info.group.as_str(), info.plural.as_str()) {
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let entries = resources::from_crd(body)
                    .map_err(|e| ApiError::invalid(&info.kind, &name, e))?;
                if entries.is_empty() {
                    return Err(ApiError::invalid(
                        &info.kind,
                        &name,
                        "spec.versions: must have exactly one version marked as storage version",
                    ));
                }
                let want = format!("{}.{}", entries[0].plural, entries[0].group);
                if name != want {
                    return Err(ApiError::invalid(
                        &info.kind,
                        &name,
                        format!(
                            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
                        ),
                    ));
                }
                body["status"] = crd_status(body);
            }
            ("", "namespaces") => {
                body["spec"] = json!({"finalizers": ["kubernetes"]});
                body["status"] = json!({"phase": "Active"});
                let labels = meta::meta_mut(body)
                    .entry("labels")
                    .or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
            }
            ("", "secrets")
                if body
                    .get("type")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty) =>
            {
                body["type"] = json!("Opaque");
            }
            ("", "pods") => {
                body["status"] = json!({"phase": "Pending"});
            }
            _ => {}
        }
        Ok(())
    }

    /// Hooks after a successful write (CRD registration).
    fn after_write(&self, info: &ResourceInfo, stored: &Value) {
        if info.group == "apiextensions.k8s.io"
            && info.plural == "customresourcedefinitions"
            && let Ok(entries) = resources::from_crd(stored)
        {
            for e in entries {
                self.registry.add(e);
            }
        }
    }

    /// PUT: replaces the object (or only its status with `Sub::Status`).
    pub fn update(&self, t: &Target, sub: Sub, body: Value) -> Result<Arc<Value>, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        if sub == Sub::Main {
            check_type(&t.info, &body)?;
        }
        let body_name = meta::name(&body);
        if !body_name.is_empty() && body_name != t.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                t.name
            )));
        }
        let want_rv = meta::meta_str(&body, "resourceVersion")
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        self.write(t, sub, |cur| {
            if let Some(rv) = &want_rv
                && meta::meta_str(cur, "resourceVersion") != Some(rv.as_str())
            {
                return Err(ApiError::conflict(&t.info.qualified(), &t.name));
            }
            Ok(body)
        })
    }

    /// PATCH of any kind; server-side apply creates a missing object.
    pub fn patch(
        &self,
        t: &Target,
        sub: Sub,
        kind: PatchKind,
        body: &Value,
        manager: Option<&str>,
        force: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let rv_pre = if kind == PatchKind::Json {
            None
        } else {
            body.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        if kind == PatchKind::Apply {
            if !body.is_object() {
                return Err(ApiError::bad_request("apply patch must be an object"));
            }
            let body_name = meta::name(body);
            if !body_name.is_empty() && body_name != t.name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({})",
                    t.name
                )));
            }
            if self.store.get(&t.info.id, &t.namespace, &t.name).is_none() && sub == Sub::Main {
                let mut obj = body.clone();
                let om = meta::meta_mut(&mut obj);
                om.insert("name".into(), json!(t.name));
                om.remove("resourceVersion");
                let fs = fields::field_set(&applied_part(body, sub, t.info.status), "");
                let m = manager.unwrap_or("unknown");
                fields::record(
                    &mut obj,
                    fields::entry(m, &t.info.api_version(), None, fs, &meta::now()),
                );
                return match self.create(&t.info, &t.namespace, obj) {
                    // lost a race with another creator: fall through to a merge
                    Err(e) if e.reason == "AlreadyExists" => {
                        self.patch(t, sub, kind, body, manager, force)
                    }
                    r => r,
                };
            }
        }
        self.write(t, sub, |cur| {
            if let Some(rv) = &rv_pre
                && meta::meta_str(cur, "resourceVersion") != Some(rv.as_str())
            {
                return Err(ApiError::conflict(&t.info.qualified(), &t.name));
            }
            let mut out = patch::apply(kind, cur, body).map_err(|e| match e {
                patch::PatchError::Json(m) => ApiError::invalid(&t.info.kind, &t.name, m),
                other => ApiError::bad_request(other.to_string()),
            })?;
            if !out.is_object() {
                return Err(ApiError::bad_request("the patch result is not an object"));
            }
            if kind == PatchKind::Apply {
                let m = manager.unwrap_or("unknown");
                let subname = (sub == Sub::Status).then_some("status");
                let applied = applied_part(body, sub, t.info.status);
                let fs = fields::field_set(&applied, "");
                let owners = fields::other_owners(cur, m, subname);
                if !force {
                    let found = fields::conflicts(cur, &applied, &fs, &owners);
                    if !found.is_empty() {
                        let list: Vec<String> = found
                            .iter()
                            .map(|(mgr, p)| format!("conflict with \"{mgr}\": {p}"))
                            .collect();
                        return Err(ApiError::apply_conflict(
                            &t.info.qualified(),
                            &t.name,
                            &list,
                        ));
                    }
                }
                let prev = fields::previous(cur, m, subname);
                if let Some(prev) = &prev {
                    let theirs: Vec<Value> = owners.into_iter().map(|(_, s)| s).collect();
                    fields::remove_stale(&mut out, prev, &fs, &theirs);
                }
                // Unchanged field sets keep their entry (and its time), so that a
                // repeated identical apply stays a no-op.
                if prev.as_ref() != Some(&fs) {
                    let e = fields::entry(m, &t.info.api_version(), subname, fs, &meta::now());
                    fields::record(&mut out, e);
                }
            }
            Ok(out)
        })
    }

    /// The shared read-modify-write of update and patch: `f` turns the current object
    /// into the requested one; this keeps immutable metadata, isolates status,
    /// bumps generation, finishes deletion when the last finalizer goes, and skips
    /// no-op writes (no new resourceVersion, as kube-apiserver does).
    fn write(
        &self,
        t: &Target,
        sub: Sub,
        f: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let info = &t.info;
        if sub == Sub::Status && !info.status {
            return Err(ApiError::path_not_found(&format!(
                "{}/status",
                info.qualified()
            )));
        }
        let is_service = info.plural == "services" && info.group.is_empty();
        let (stored, deleted) = self
            .store
            .mutate(&info.id, &t.namespace, &t.name, |old, _| {
                let Some(old) = old else {
                    return Err(ApiError::not_found(&info.qualified(), &t.name));
                };
                let requested = convert::to_storage(info, f(&with_type(info, old.clone()))?);
                let mut new = match sub {
                    Sub::Status => {
                        let mut n = (**old).clone();
                        if let Some(mf) = requested.pointer("/metadata/managedFields") {
                            meta::meta_mut(&mut n).insert("managedFields".into(), mf.clone());
                        }
                        n["status"] = requested.get("status").cloned().unwrap_or(Value::Null);
                        if n["status"].is_null()
                            && let Some(o) = n.as_object_mut()
                        {
                            o.remove("status");
                        }
                        n
                    }
                    Sub::Main => {
                        let mut n = requested;
                        if n.pointer("/metadata/managedFields").is_none()
                            && let Some(mf) = old.pointer("/metadata/managedFields")
                        {
                            meta::meta_mut(&mut n).insert("managedFields".into(), mf.clone());
                        }
                        if info.status {
                            match old.get("status") {
                                Some(s) => n["status"] = s.clone(),
                                None => {
                                    if let Some(o) = n.as_object_mut() {
                                        o.remove("status");
                                    }
                                }
                            }
                        }
                        n
                    }
                };
                // Immutable and server-owned metadata.
                {
                    let om = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
                    let m = meta::meta_mut(&mut new);
                    for f in [
                        "uid",
                        "creationTimestamp",
                        "deletionTimestamp",
                        "deletionGracePeriodSeconds",
                        "name",
                        "namespace",
                        "generation",
                    ] {
                        match om.get(f) {
                            Some(v) => {
                                m.insert(f.into(), v.clone());
                            }
                            None => {
                                m.remove(f);
                            }
                        }
                    }
                }
                if let Some(o) = new.as_object_mut() {
                    o.insert(
                        "apiVersion".into(),
                        json!(convert::storage_api_version(info)),
                    );
                    o.insert("kind".into(), json!(info.kind));
                }
                check_schema(info, &mut new)?;
                if is_service && sub == Sub::Main {
                    services::prepare(&mut new, Some(old), &mut self.alloc())
                        .map_err(|e| ApiError::invalid(&info.kind, &t.name, e))?;
                }
                if sub == Sub::Main && meta::spec_part(&new) != meta::spec_part(old) {
                    let g = old
                        .pointer("/metadata/generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(1);
                    meta::meta_mut(&mut new).insert("generation".into(), json!(g + 1));
                }
                // The last finalizer removed from an object being deleted: it goes now.
                if new.pointer("/metadata/deletionTimestamp").is_some()
                    && meta::finalizers(&new) == 0
                {
                    if is_service {
                        self.alloc().release_service(&new);
                    }
                    return Ok((Mutation::Remove, Some(new)));
                }
                let mut cmp = new.clone();
                meta::meta_mut(&mut cmp).insert(
                    "resourceVersion".into(),
                    old.pointer("/metadata/resourceVersion")
                        .cloned()
                        .unwrap_or(Value::Null),
                );
                if cmp == **old {
                    return Ok((Mutation::Keep, None));
                }
                Ok((Mutation::Put(new), None))
            })?;
        if let Some(gone) = deleted {
            self.after_delete(info, &gone);
            return Ok(with_type(info, Arc::new(gone)));
        }
        let stored = stored.ok_or_else(|| ApiError::internal("write stored nothing"))?;
        self.after_write(info, &stored);
        Ok(with_type(info, stored))
    }

    /// DELETE: removes the object, or marks it with deletionTimestamp while it still
    /// has finalizers. Returns the object as it was last stored.
    pub fn delete(&self, t: &Target, opts: &DeleteOptions) -> Result<Arc<Value>, ApiError> {
        let info = &t.info;
        if info.group.is_empty() && info.plural == "namespaces" {
            self.delete_namespace_contents(&t.name);
        }
        let is_service = info.plural == "services" && info.group.is_empty();
        let is_pod = info.plural == "pods" && info.group.is_empty();
        let (stored, gone) = self.store.mutate(&info.id, &t.namespace, &t.name, |old, _| {
            let Some(old) = old else {
                return Err(ApiError::not_found(&info.qualified(), &t.name));
            };
            if let Some(uid) = &opts.uid
                && meta::uid(old) != uid
            {
                return Err(ApiError::precondition(&info.qualified(), &t.name, &format!("UID in precondition: {uid}, UID in object meta: {}", meta::uid(old))));
            }
            if let Some(rv) = &opts.resource_version
                && meta::meta_str(old, "resourceVersion") != Some(rv.as_str())
            {
                return Err(ApiError::precondition(&info.qualified(), &t.name, &format!("ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", meta::meta_str(old, "resourceVersion").unwrap_or(""))));
            }
            let terminating = old.pointer("/metadata/deletionTimestamp").is_some();
            let grace = opts.grace_period_seconds.map_or(self.pod_grace, std::time::Duration::from_secs);
            if is_pod && !terminating && !grace.is_zero() {
                let mut n = (**old).clone();
                let until = jiff::Timestamp::now().as_second() + grace.as_secs_f64().ceil() as i64;
                let m = meta::meta_mut(&mut n);
                let ts = jiff::Timestamp::from_second(until).map(|t| t.to_string()).unwrap_or_else(|_| meta::now());
                m.insert("deletionTimestamp".into(), json!(ts));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace.as_secs_f64().ceil() as i64));
                return Ok((Mutation::Put(n), None));
            }
            if is_pod && terminating && !grace.is_zero() {
                return Ok((Mutation::Keep, None));
            }
            if meta::finalizers(old) > 0 {
                if terminating {
                    return Ok((Mutation::Keep, None));
                }
                let mut n = (**old).clone();
                let m = meta::meta_mut(&mut n);
                m.insert("deletionTimestamp".into(), json!(meta::now()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if info.group.is_empty() && info.plural == "namespaces" {
                    n["status"] = json!({"phase": "Terminating"});
                }
                return Ok((Mutation::Put(n), None));
            }
            if is_service {
                self.alloc().release_service(old);
            }
            Ok((Mutation::Remove, Some((**old).clone())))
        })?;
        if let Some(gone) = gone {
            self.after_delete(info, &gone);
            return Ok(with_type(info, Arc::new(gone)));
        }
        stored
            .map(|s| with_type(info, s))
            .ok_or_else(|| ApiError::internal("delete kept nothing"))
    }

    fn after_delete(&self, info: &ResourceInfo, gone: &Value) {
        if info.group == "apiextensions.k8s.io"
            && info.plural == "customresourcedefinitions"
            && let Ok(entries) = resources::from_crd(gone)
            && let Some(e) = entries.first()
        {
            // Delete every custom object of the CRD, then stop serving it.
            let id = e.id.clone();
            let (items, _) = self.store.list(&id, None);
            for obj in items {
                let _ = self.store.mutate::<_, ApiError>(
                    &id,
                    meta::namespace(&obj),
                    meta::name(&obj),
                    |_, _| Ok((Mutation::Remove, ())),
                );
            }
            self.registry.remove(&e.group, &e.plural);
        }
    }

    /// Namespace deletion: everything inside goes first (objects with finalizers are
    /// only marked), then the namespace's own `kubernetes` finalizer is dropped so
    /// the namespace disappears. Real namespace deletion waits for the contents.
    fn delete_namespace_contents(&self, ns: &str) {
        for (res, name) in self.store.keys_in_namespace(ns) {
            let Some(info) = self.registry.all().into_iter().find(|i| i.id == res) else {
                // resource no longer served (CRD deleted): drop the leftovers
                let _ = self
                    .store
                    .mutate::<_, ApiError>(&res, ns, &name, |_, _| Ok((Mutation::Remove, ())));
                continue;
            };
            let t = Target {
                info,
                namespace: ns.into(),
                name,
            };
            let _ = self.delete(&t, &DeleteOptions::default());
        }
        let nsinfo = self.registry.lookup("", "v1", "namespaces");
        if let Some(info) = nsinfo {
            let _ = self
                .store
                .mutate::<_, ApiError>(&info.id, "", ns, |old, _| match old {
                    Some(o) => {
                        let mut n = (**o).clone();
                        n["spec"] = json!({});
                        Ok((Mutation::Put(n), ()))
                    }
                    None => Ok((Mutation::Keep, ())),
                });
        }
    }
}

fn with_type(info: &ResourceInfo, obj: Arc<Value>) -> Arc<Value> {
    convert::present(info, obj)
}
