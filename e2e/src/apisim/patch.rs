//! Patch flavours the API server accepts, applied to JSON:
//!
//! - JSON merge patch (RFC 7386), `application/merge-patch+json`;
//! - JSON patch (RFC 6902), `application/json-patch+json`;
//! - strategic merge patch, `application/strategic-merge-patch+json`: a merge patch
//!   where the lists kubectl cares about are merged by their key (containers by
//!   `name`, ports by `port`/`containerPort`, conditions by `type`, ...), with the
//!   `$patch: delete|replace` and `$setElementOrder`/`$retainKeys` directives honoured
//!   or ignored as documented in docs/apisim.md;
//! - server-side apply, `application/apply-patch+yaml`: the given fields are merged
//!   into the object (maps deep-merged, keyed lists merged by key, other lists
//!   replaced). Field ownership is not tracked, so fields another manager set are
//!   never removed and there are no apply conflicts.

use serde_json::{Map, Value};

/// A patch that could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("the body of the request was in an unknown format: {0}")]
    Body(String),
    #[error("json patch: {0}")]
    Json(String),
    #[error("unsupported patch content type {0:?}")]
    ContentType(String),
}

/// The patch flavours, from the request's Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Result<Self, PatchError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchKind::Apply),
            other => Err(PatchError::ContentType(other.to_string())),
        }
    }
}

/// Applies `patch` (the raw body, already parsed to JSON) to `doc`.
pub fn apply(kind: PatchKind, doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    let mut out = doc.clone();
    match kind {
        PatchKind::Merge => json_patch::merge(&mut out, patch),
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| PatchError::Body(e.to_string()))?;
            // One op at a time on a copy (the caller drops it on error, so the patch
            // stays atomic). A `test` for `null` at a missing path succeeds, as in
            // kube-apiserver's JSON patch library: kube-runtime's finalizer helper
            // relies on it (`test /metadata/finalizers == null`, then `add`).
            for op in ops.iter() {
                if let json_patch::PatchOperation::Test(t) = op
                    && t.value.is_null()
                    && out.pointer(t.path.as_str()).is_none()
                {
                    continue;
                }
                json_patch::patch(&mut out, std::slice::from_ref(op))
                    .map_err(|e| PatchError::Json(e.to_string()))?;
            }
        }
        PatchKind::Strategic => strategic(&mut out, patch, ""),
        PatchKind::Apply => {
            if !patch.is_object() {
                return Err(PatchError::Body("apply patch must be an object".into()));
            }
            strategic(&mut out, patch, "")
        }
    }
    Ok(out)
}

/// The merge key of a list field `field` inside the object at dotted `path`, if the
/// built-in types give it one. Keys are the ones kubectl and controllers touch;
/// other lists are atomic (replaced as a whole).
pub(crate) fn merge_key(path: &str, field: &str) -> Option<&'static [&'static str]> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets" => &["name"],
        "ports" if path.ends_with("containers") => &["containerPort", "protocol"],
        "ports" if path.ends_with("spec") => &["port", "protocol"],
        "conditions" => &["type"],
        "ownerReferences" => &["uid"],
        "tolerations" => &["key"],
        "hostAliases" => &["ip"],
        _ => return None,
    })
}

/// Lists of scalars that strategic merge patch merges as sets.
fn is_set_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

pub(crate) fn same_key(a: &Value, b: &Value, keys: &[&str]) -> bool {
    keys.iter().all(|k| {
        let (x, y) = (a.get(*k), b.get(*k));
        // protocol defaults to TCP when one side omits it
        if *k == "protocol" {
            x.and_then(Value::as_str).unwrap_or("TCP") == y.and_then(Value::as_str).unwrap_or("TCP")
        } else {
            x == y
        }
    }) && keys.iter().any(|k| a.get(*k).is_some())
}

fn strategic(doc: &mut Value, patch: &Value, path: &str) {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut m = p.clone();
        m.remove("$patch");
        *doc = Value::Object(m);
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return };
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (d.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            d.remove(k);
            continue;
        }
        let sub = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match (d.get_mut(k), v) {
            (Some(Value::Array(cur)), Value::Array(items)) => {
                if let Some(keys) = merge_key(path, k) {
                    merge_keyed(cur, items, keys, &sub);
                } else if is_set_list(k) {
                    for it in items {
                        if !cur.contains(it) {
                            cur.push(it.clone());
                        }
                    }
                } else {
                    *cur = items.iter().map(strip_directives).collect();
                }
            }
            (Some(cur @ Value::Object(_)), Value::Object(_)) => strategic(cur, v, &sub),
            _ => {
                d.insert(k.clone(), strip_directives(v));
            }
        }
    }
}

fn merge_keyed(cur: &mut Vec<Value>, items: &[Value], keys: &[&str], path: &str) {
    for it in items {
        let delete = it.get("$patch").and_then(Value::as_str) == Some("delete");
        match cur.iter().position(|c| same_key(c, it, keys)) {
            Some(i) if delete => {
                cur.remove(i);
            }
            Some(i) => strategic(&mut cur[i], it, path),
            None if delete => {}
            None => cur.push(strip_directives(it)),
        }
    }
}

/// Removes `$`-directives from a value that is inserted as a whole.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let d = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        let out = apply(PatchKind::Merge, &d, &json!({"a": {"b": null}, "l": [3]})).unwrap();
        assert_eq!(out, json!({"a": {"c": 2}, "l": [3]}));
    }

    #[test]
    fn json_patch_ops_and_failed_test() {
        let d = json!({"metadata": {"resourceVersion": "5"}, "spec": {"x": 1}});
        let ok = json!([{"op": "replace", "path": "/spec/x", "value": 2}]);
        assert_eq!(apply(PatchKind::Json, &d, &ok).unwrap()["spec"]["x"], 2);
        let stale = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}]);
        assert!(apply(PatchKind::Json, &d, &stale).is_err());
        assert!(apply(PatchKind::Json, &d, &json!({"op": 1})).is_err());
    }

    #[test]
    fn json_patch_test_null_on_missing_path_passes() {
        let d = json!({"metadata": {}});
        let p = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                       {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]);
        let out = apply(PatchKind::Json, &d, &p).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x"]));
        // ...but not when the path exists with another value
        assert!(apply(PatchKind::Json, &out, &p).is_err());
    }

    #[test]
    fn strategic_merges_containers_by_name() {
        let d = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]}}}});
        let p = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "y:2"}, {"name": "a", "$patch": "delete"}]}}}});
        let out = apply(PatchKind::Strategic, &d, &p).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "b", "image": "y:2"}])
        );
    }

    #[test]
    fn strategic_merges_service_ports_and_conditions() {
        let d = json!({"spec": {"ports": [{"port": 80, "protocol": "TCP", "nodePort": 31000}]},
                       "status": {"conditions": [{"type": "A", "status": "False"}]}});
        let p = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}]},
                       "status": {"conditions": [{"type": "A", "status": "True"}]}});
        let out = apply(PatchKind::Apply, &d, &p).unwrap();
        assert_eq!(out["spec"]["ports"][0]["nodePort"], 31000);
        assert_eq!(out["spec"]["ports"][0]["targetPort"], 8080);
        assert_eq!(out["spec"]["ports"].as_array().unwrap().len(), 2);
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "A", "status": "True"}])
        );
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchKind::from_content_type("application/merge-patch+json; charset=utf-8").unwrap(),
            PatchKind::Merge
        );
        assert!(PatchKind::from_content_type("text/plain").is_err());
    }
}
