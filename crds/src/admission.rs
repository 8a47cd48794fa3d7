//! Validation of an object against a CRD's OpenAPI schema the way kube-apiserver does
//! it: types, required fields, numeric and length limits, then the CEL rules
//! (`x-kubernetes-validations`, evaluated with kube-cel's Kubernetes CEL libraries).
//!
//! Only built with the `server-validation` feature, for the crate's own schema tests;
//! the programs use the specs' `validate()`, and kube-apiserver itself checks the same
//! rules in the control-plane tests (e2e/tests/controlplane.rs).

use kube::core::cel::Validator;
use serde_json::Value;

/// One refusal, as `field: message`, the way the API server words it.
pub type FieldError = String;

/// The `openAPIV3Schema` of a CRD's first version, as JSON.
pub fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Option<Value> {
    let s = crd
        .spec
        .versions
        .first()?
        .schema
        .as_ref()?
        .open_api_v3_schema
        .as_ref()?;
    serde_json::to_value(s).ok()
}

/// Every reason the API server would refuse `object` (empty when it is valid).
pub fn validate(schema: &Value, object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check(schema, object, "", &mut errors);
    if errors.is_empty()
        && let Err(cel) = Validator::new().validate(schema, object, None)
    {
        errors.extend(cel.iter().map(|e| e.to_string()));
    }
    errors
}

fn check(schema: &Value, v: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let at = if path.is_empty() { "<root>" } else { path };
    if v.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) && !path.is_empty() {
            errors.push(format!("{at}: Invalid value: null: must not be null"));
        }
        return;
    }
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
    {
        return;
    }
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
    let ok = match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    };
    if !ok {
        errors.push(format!("{at}: Invalid value: {v}: must be of type {ty}"));
        return;
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    if let Some(n) = v.as_f64() {
        if let Some(min) = num("minimum")
            && n < min
        {
            errors.push(format!(
                "{at}: Invalid value: {v}: should be greater than or equal to {min}"
            ));
        }
        if let Some(max) = num("maximum")
            && n > max
        {
            errors.push(format!(
                "{at}: Invalid value: {v}: should be less than or equal to {max}"
            ));
        }
    }
    if let Some(s) = v.as_str() {
        if let Some(max) = num("maxLength")
            && s.chars().count() as f64 > max
        {
            errors.push(format!("{at}: Too long: may not be more than {max} bytes"));
        }
        if let Some(min) = num("minLength")
            && (s.chars().count() as f64) < min
        {
            errors.push(format!(
                "{at}: Invalid value: {v}: should be at least {min} chars long"
            ));
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(max) = num("maxItems")
            && items.len() as f64 > max
        {
            errors.push(format!(
                "{at}: Too many: {}: must have at most {max} items",
                items.len()
            ));
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                check(item_schema, item, &format!("{path}[{i}]"), errors);
            }
        }
    }
    if let Some(obj) = v.as_object() {
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(name) = req.as_str()
                && !obj.contains_key(name)
            {
                errors.push(format!("{}: Required value", join(path, name)));
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, child) in obj {
            let sub = join(path, k);
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(s, child, &sub, errors),
                None => {
                    if let Some(extra) =
                        schema.get("additionalProperties").filter(|a| a.is_object())
                    {
                        check(extra, child, &sub, errors);
                    }
                    // Unknown fields are pruned by the API server, not refused.
                }
            }
        }
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}
