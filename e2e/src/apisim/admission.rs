//! Admission-time helpers of `api.rs`: what an apply request owns, custom
//! resource schema checks, kind/apiVersion checks, status reset on create, and the
//! status a new CRD gets.

use serde_json::{Value, json};

use super::api::Sub;
use super::crschema;
use super::error::ApiError;
use super::meta;
use super::resources::ResourceInfo;

/// The fields an apply request sets: for `/status` only `status`; for the main
/// resource everything but identity metadata (and `status` when it is a
/// subresource).
pub fn applied_part(body: &Value, sub: Sub, has_status: bool) -> Value {
    if sub == Sub::Status {
        return json!({"status": body.get("status").cloned().unwrap_or_else(|| json!({}))});
    }
    let mut out = serde_json::Map::new();
    for (k, v) in body.as_object().into_iter().flatten() {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "status" if has_status => {}
            "metadata" => {
                let mut m = serde_json::Map::new();
                for f in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(x) = v.get(f) {
                        m.insert(f.into(), x.clone());
                    }
                }
                if !m.is_empty() {
                    out.insert(k.clone(), Value::Object(m));
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Custom resources: prune, default and validate against the CRD schema.
pub fn check_schema(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    let Some(schema) = &info.schema else {
        return Ok(());
    };
    crschema::default_and_prune(schema, obj);
    let errors = crschema::validate(schema, obj);
    if errors.is_empty() {
        return Ok(());
    }
    let kind = format!("{}.{}", info.kind, info.group);
    let msg = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("[{}]", errors.join(", "))
    };
    Err(ApiError::invalid(&kind, meta::name(obj), msg))
}

pub fn check_type(info: &ResourceInfo, body: &Value) -> Result<(), ApiError> {
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized ({kind} is not {})",
            info.kind
        )));
    }
    let av = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if !av.is_empty() && av != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            info.api_version()
        )));
    }
    Ok(())
}

/// Creates drop client-written status on resources with a status subresource.
pub fn reset_status(info: &ResourceInfo, body: &mut Value) {
    if let Some(o) = body.as_object_mut() {
        o.remove("status");
        o.insert("apiVersion".into(), json!(info.api_version()));
        o.insert("kind".into(), json!(info.kind));
    }
    if info.group.is_empty() && matches!(info.plural.as_str(), "services") {
        body["status"] = json!({"loadBalancer": {}});
    }
}

pub fn crd_status(crd: &Value) -> Value {
    let now = meta::now();
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage") == Some(&json!(true)))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    })
}
