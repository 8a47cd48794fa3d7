//! The resource registry: which group/version/resource paths exist, their kinds,
//! scope, short names and subresources. Built-in types come from a static table;
//! CustomResourceDefinitions add (and remove) entries at run time.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

/// One served resource (a group/version/plural triple).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource (main-resource writes then ignore `.status`).
    pub status: bool,
    /// Has a `/scale` subresource (`spec.replicas`).
    pub scale: bool,
    /// `additionalPrinterColumns` of a CRD version (raw JSON objects).
    pub printer_columns: Vec<Value>,
    /// Storage identity shared by all versions of the resource: `group/plural`.
    pub id: Arc<str>,
    /// A CRD version's `openAPIV3Schema` (custom resources are pruned, defaulted
    /// and validated against it).
    pub schema: Option<Arc<Value>>,
}

impl ResourceInfo {
    fn builtin(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        short: &[&str],
        status: bool,
    ) -> Self {
        ResourceInfo {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_ascii_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            status,
            scale: false,
            printer_columns: Vec::new(),
            id: format!("{group}/{plural}").into(),
            schema: None,
        }
    }

    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The URL prefix of the group/version: `/api/v1` or `/apis/group/version`.
    pub fn gv_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// Human-readable `plural.group` as the API server words it in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Errors turning a CRD object into registry entries.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("spec.{field}: Required value")]
    Missing { field: &'static str },
    #[error("spec.scope: Unsupported value {0:?}: supported values: \"Cluster\", \"Namespaced\"")]
    Scope(String),
}

/// Registry entries for every served version of a CRD (given as JSON).
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceInfo>, CrdError> {
    let spec = crd.get("spec").ok_or(CrdError::Missing { field: "" })?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let group = s(spec.get("group")).ok_or(CrdError::Missing { field: "group" })?;
    let names = spec
        .get("names")
        .ok_or(CrdError::Missing { field: "names" })?;
    let plural = s(names.get("plural")).ok_or(CrdError::Missing {
        field: "names.plural",
    })?;
    let kind = s(names.get("kind")).ok_or(CrdError::Missing {
        field: "names.kind",
    })?;
    let singular = s(names.get("singular")).unwrap_or_else(|| kind.to_ascii_lowercase());
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strings(names.get("shortNames"));
    let categories = strings(names.get("categories"));
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        Some(other) => return Err(CrdError::Scope(other.to_string())),
        None => return Err(CrdError::Missing { field: "scope" }),
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or(CrdError::Missing { field: "versions" })?;
    let mut out = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let Some(version) = s(v.get("name")) else {
            return Err(CrdError::Missing {
                field: "versions[].name",
            });
        };
        let sub = v.get("subresources");
        out.push(ResourceInfo {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: short_names.clone(),
            categories: categories.clone(),
            status: sub.and_then(|s| s.get("status")).is_some(),
            scale: sub.and_then(|s| s.get("scale")).is_some(),
            printer_columns: v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            id: format!("{group}/{plural}").into(),
            schema: v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new),
        });
    }
    Ok(out)
}

/// The built-in resources the simulator serves.
pub fn builtins() -> Vec<ResourceInfo> {
    let b = ResourceInfo::builtin;
    let mut v = vec![
        b("", "v1", "services", "Service", true, &["svc"], true),
        b("", "v1", "pods", "Pod", true, &["po"], true),
        b("", "v1", "namespaces", "Namespace", false, &["ns"], true),
        b("", "v1", "events", "Event", true, &["ev"], false),
        b("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
        b("", "v1", "secrets", "Secret", true, &[], false),
        b("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
        b(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
        ),
        b("", "v1", "nodes", "Node", false, &["no"], true),
        b(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
        ),
        b(
            "apps",
            "v1",
            "replicasets",
            "ReplicaSet",
            true,
            &["rs"],
            true,
        ),
        b("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"], true),
        b(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
            false,
        ),
        b(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
        ),
        b(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
        ),
        b(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
            false,
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            false,
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            false,
        ),
    ];
    for r in &mut v {
        if matches!(r.plural.as_str(), "deployments" | "replicasets") {
            r.scale = true;
        }
        if matches!(
            r.plural.as_str(),
            "pods" | "services" | "deployments" | "replicasets" | "daemonsets"
        ) {
            r.categories = vec!["all".into()];
        }
        if r.group == "events.k8s.io" {
            // stored as core v1 Events (see convert.rs)
            r.id = "/events".into();
        }
        if r.plural == "endpointslices" {
            r.singular = "endpointslice".into();
        }
    }
    v
}

type ByGroupVersion = BTreeMap<(String, String), Vec<Arc<ResourceInfo>>>;

/// All served resources, by group and version. Cheap to clone entries out of.
#[derive(Debug, Default)]
pub struct Registry {
    inner: RwLock<ByGroupVersion>,
}

impl Registry {
    pub fn new() -> Self {
        let r = Registry::default();
        for info in builtins() {
            r.add(info);
        }
        r
    }

    /// An independent copy (for dry runs).
    pub fn fork(&self) -> Registry {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        Registry {
            inner: RwLock::new(g.clone()),
        }
    }

    /// Adds or replaces the entry for `(group, version, plural)`.
    pub fn add(&self, info: ResourceInfo) {
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let list = g
            .entry((info.group.clone(), info.version.clone()))
            .or_default();
        list.retain(|r| r.plural != info.plural);
        list.push(Arc::new(info));
    }

    /// Removes every version of `group/plural`.
    pub fn remove(&self, group: &str, plural: &str) {
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        for ((grp, _), list) in g.iter_mut() {
            if grp == group {
                list.retain(|r| r.plural != plural);
            }
        }
        g.retain(|_, l| !l.is_empty());
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.get(&(group.to_string(), version.to_string()))?
            .iter()
            .find(|r| r.plural == plural)
            .cloned()
    }

    /// The resources of one group/version, or `None` when it is not served.
    pub fn group_version(&self, group: &str, version: &str) -> Option<Vec<Arc<ResourceInfo>>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.get(&(group.to_string(), version.to_string())).cloned()
    }

    /// `(group, [versions])` for every group (core group is `""`), versions in order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for (grp, ver) in g.keys() {
            match out.last_mut() {
                Some((last, vers)) if last == grp => vers.push(ver.clone()),
                _ => out.push((grp.clone(), vec![ver.clone()])),
            }
        }
        for (_, vers) in &mut out {
            vers.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        out
    }

    /// Every served entry (all groups and versions).
    pub fn all(&self) -> Vec<Arc<ResourceInfo>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.values().flatten().cloned().collect()
    }
}

/// Kubernetes version ordering: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_like_kubernetes() {
        let mut v = vec!["v1alpha1", "v1", "v2beta1", "v1beta2"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(v, ["v1", "v2beta1", "v1beta2", "v1alpha1"]);
    }

    #[test]
    fn crd_entries_follow_spec() {
        let crd = serde_json::json!({"spec": {"group": "x.io", "scope": "Namespaced",
            "names": {"plural": "foos", "kind": "Foo", "shortNames": ["fo"]},
            "versions": [{"name": "v1", "served": true, "subresources": {"status": {}}},
                         {"name": "v0", "served": false}]}});
        let e = from_crd(&crd).unwrap();
        assert_eq!(e.len(), 1);
        assert!(e[0].namespaced && e[0].status && !e[0].scale);
        assert_eq!(&*e[0].id, "x.io/foos");
        assert!(from_crd(&serde_json::json!({"spec": {}})).is_err());
    }
}
