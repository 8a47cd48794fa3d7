//! Field ownership for server-side apply, reduced to what appliers rely on: each
//! field manager's last applied field set is kept in `metadata.managedFields`
//! (FieldsV1 format: `f:<field>` for map keys, `k:{...}` for items of keyed lists,
//! `{}` leaves), and a field the manager applied before but leaves out now is
//! removed from the object. Conflicts between managers are not detected (every
//! apply behaves as if forced).

use serde_json::{Map, Value, json};

use super::patch::{merge_key, same_key};

/// The FieldsV1 set of an applied configuration.
pub fn field_set(v: &Value, path: &str) -> Value {
    let Value::Object(m) = v else {
        return json!({});
    };
    let mut out = Map::new();
    for (k, child) in m {
        if k.starts_with('$') {
            continue;
        }
        let sub = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let node = match child {
            Value::Object(_) => field_set(child, &sub),
            Value::Array(items) => match merge_key(path, k) {
                Some(keys) => {
                    let mut l = Map::new();
                    for it in items {
                        let key: Map<String, Value> = keys
                            .iter()
                            .filter_map(|kk| it.get(*kk).map(|v| (kk.to_string(), v.clone())))
                            .collect();
                        if key.is_empty() {
                            continue;
                        }
                        l.insert(format!("k:{}", Value::Object(key)), field_set(it, &sub));
                    }
                    Value::Object(l)
                }
                None => json!({}),
            },
            _ => json!({}),
        };
        out.insert(format!("f:{k}"), node);
    }
    Value::Object(out)
}

/// Removes from `obj` what `prev` owned and `new` no longer does.
pub fn remove_stale(obj: &mut Value, prev: &Value, new: &Value) {
    walk(obj, prev, new, "");
}

fn walk(obj: &mut Value, prev: &Value, new: &Value, path: &str) {
    let (Some(p), Some(o)) = (prev.as_object(), obj.as_object_mut()) else {
        return;
    };
    for (pk, psub) in p {
        let Some(field) = pk.strip_prefix("f:") else {
            continue;
        };
        let sub = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        match new.get(pk) {
            None => {
                o.remove(field);
            }
            Some(nsub) => {
                let Some(child) = o.get_mut(field) else {
                    continue;
                };
                if let Value::Array(items) = child {
                    let Some(keys) = merge_key(path, field) else {
                        continue;
                    };
                    for (ik, isub) in psub.as_object().into_iter().flatten() {
                        let Some(key) = ik
                            .strip_prefix("k:")
                            .and_then(|k| serde_json::from_str::<Value>(k).ok())
                        else {
                            continue;
                        };
                        let pos = items.iter().position(|it| same_key(it, &key, keys));
                        match (pos, nsub.get(ik)) {
                            (Some(i), None) => {
                                items.remove(i);
                            }
                            (Some(i), Some(n)) => walk(&mut items[i], isub, n, &sub),
                            (None, _) => {}
                        }
                    }
                } else {
                    walk(child, psub, nsub, &sub);
                }
            }
        }
    }
}

/// The managedFields entry of an apply by `manager` on `subresource`.
pub fn entry(
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    fields: Value,
    time: &str,
) -> Value {
    let mut e = json!({"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": time,
        "fieldsType": "FieldsV1", "fieldsV1": fields});
    if let Some(s) = subresource {
        e["subresource"] = json!(s);
    }
    e
}

/// The previous apply field set of `manager` on `subresource`, if any.
pub fn previous(obj: &Value, manager: &str, subresource: Option<&str>) -> Option<Value> {
    obj.pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .find_map(|e| {
            (e.get("manager").and_then(Value::as_str) == Some(manager)
                && e.get("operation").and_then(Value::as_str) == Some("Apply")
                && e.get("subresource").and_then(Value::as_str) == subresource)
                .then(|| e.get("fieldsV1").cloned())
                .flatten()
        })
}

/// Replaces (or adds) the entry of the same manager, operation and subresource.
pub fn record(obj: &mut Value, e: Value) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta.entry("managedFields").or_insert_with(|| json!([]));
    let Some(list) = list.as_array_mut() else {
        return;
    };
    list.retain(|x| {
        !(x.get("manager") == e.get("manager")
            && x.get("operation") == e.get("operation")
            && x.get("subresource") == e.get("subresource"))
    });
    list.push(e);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_sets_use_keys_for_keyed_lists() {
        let applied = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]},
            "conditions": [{"type": "A", "status": "True"}]}});
        let f = field_set(&applied, "");
        assert_eq!(f["f:status"]["f:loadBalancer"]["f:ingress"], json!({}));
        assert!(
            f["f:status"]["f:conditions"]
                .get(r#"k:{"type":"A"}"#)
                .is_some(),
            "{f}"
        );
    }

    #[test]
    fn dropped_fields_are_removed() {
        let prev = field_set(
            &json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]},
            "conditions": [{"type": "A"}, {"type": "B"}]}}),
            "",
        );
        let next = field_set(&json!({"status": {"conditions": [{"type": "A"}]}}), "");
        let mut obj = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]},
            "conditions": [{"type": "A", "status": "True"}, {"type": "B"}, {"type": "C"}]}});
        remove_stale(&mut obj, &prev, &next);
        assert_eq!(
            obj,
            // loadBalancer was only this manager's: it goes as a whole
            json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "C"}]}})
        );
    }

    #[test]
    fn entries_are_replaced_per_manager() {
        let mut o = json!({"metadata": {}});
        record(
            &mut o,
            entry("m", "v1", Some("status"), json!({"f:a": {}}), "t"),
        );
        record(
            &mut o,
            entry("m", "v1", Some("status"), json!({"f:b": {}}), "t"),
        );
        record(&mut o, entry("m", "v1", None, json!({"f:c": {}}), "t"));
        assert_eq!(o["metadata"]["managedFields"].as_array().unwrap().len(), 2);
        assert_eq!(previous(&o, "m", Some("status")), Some(json!({"f:b": {}})));
        assert_eq!(previous(&o, "other", None), None);
    }
}
