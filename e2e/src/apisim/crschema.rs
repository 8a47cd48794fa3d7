//! Custom resources against their CRD's structural schema, as kube-apiserver
//! handles them on every write: unknown fields pruned, `default`s filled in, then
//! validated (types, limits, required fields and the CEL rules in
//! `x-kubernetes-validations`, through `ringlb_crds::admission`).

use serde_json::{Map, Value};

/// Prunes fields the schema does not know and fills in defaults, in place.
pub fn default_and_prune(schema: &Value, obj: &mut Value) {
    let Some(o) = obj.as_object_mut() else { return };
    // The root keeps apiVersion/kind/metadata whatever the schema says.
    let mut kept = Map::new();
    for k in ["apiVersion", "kind", "metadata"] {
        if let Some(v) = o.remove(k) {
            kept.insert(k.to_string(), v);
        }
    }
    walk(schema, obj);
    if let Some(o) = obj.as_object_mut() {
        o.extend(kept);
    }
}

fn walk(schema: &Value, v: &mut Value) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && schema.get("properties").is_none()
    {
        return;
    }
    match v {
        Value::Object(o) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve =
                schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if let Some(props) = props {
                if !preserve && additional.is_none() {
                    o.retain(|k, _| props.contains_key(k));
                }
                for (k, s) in props {
                    if !o.contains_key(k)
                        && let Some(d) = s.get("default")
                    {
                        o.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = o.get_mut(k) {
                        walk(s, child);
                    }
                }
            } else if let Some(extra) = additional {
                for child in o.values_mut() {
                    walk(extra, child);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for item in a {
                    walk(items, item);
                }
            }
        }
        _ => {}
    }
}

/// Every reason to refuse `obj` (empty when it is valid).
pub fn validate(schema: &Value, obj: &Value) -> Vec<String> {
    ringlb_crds::admission::validate(schema, obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_and_defaults() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "auto": {"type": "boolean", "default": true},
            "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}});
        let mut o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"junk": 1, "list": [{"a": "x", "b": "y"}], "free": {"anything": 1}}, "other": 2});
        default_and_prune(&schema, &mut o);
        assert_eq!(
            o,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
                "spec": {"auto": true, "list": [{"a": "x"}], "free": {"anything": 1}}})
        );
    }

    #[test]
    fn ippool_rules_refuse_bad_cidrs() {
        use kube::CustomResourceExt;
        let crd = ringlb_crds::IPPool::crd();
        let schema = ringlb_crds::admission::schema_of(&crd).unwrap();
        let good = json!({"spec": {"cidrs": ["192.0.2.0/24"]}});
        assert!(
            validate(&schema, &good).is_empty(),
            "{:?}",
            validate(&schema, &good)
        );
        let bad = json!({"spec": {"cidrs": ["not-a-cidr"]}});
        assert!(!validate(&schema, &bad).is_empty());
    }
}
