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
pub fn remove_stale(obj: &mut Value, prev: &Value, new: &Value, others: &[Value]) {
    let others: Vec<&Value> = others.iter().collect();
    walk(obj, prev, new, &others, "");
}

/// The sub-node `k` of every other manager's set that has one.
fn children<'a>(others: &[&'a Value], k: &str) -> Vec<&'a Value> {
    others.iter().filter_map(|o| o.get(k)).collect()
}

fn walk(obj: &mut Value, prev: &Value, new: &Value, others: &[&Value], path: &str) {
    let (Some(p), Some(o)) = (prev.as_object(), obj.as_object_mut()) else {
        return;
    };
    let empty = json!({});
    for (pk, psub) in p {
        let Some(field) = pk.strip_prefix("f:") else {
            continue;
        };
        let sub = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        let theirs = children(others, pk);
        // A field another manager also owns stays; only our part of it goes.
        let nsub = match (new.get(pk), theirs.is_empty()) {
            (None, true) => {
                o.remove(field);
                continue;
            }
            (None, false)
                if theirs
                    .iter()
                    .any(|t| t.as_object().is_some_and(|m| m.is_empty())) =>
            {
                continue;
            }
            (None, false) => &empty,
            (Some(n), _) => n,
        };
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
                let their_items = children(&theirs, ik);
                match (pos, nsub.get(ik)) {
                    (Some(i), None) if their_items.is_empty() => {
                        items.remove(i);
                    }
                    (Some(i), None) => walk(&mut items[i], isub, &empty, &their_items, &sub),
                    (Some(i), Some(n)) => walk(&mut items[i], isub, n, &their_items, &sub),
                    (None, _) => {}
                }
            }
        } else {
            walk(child, psub, nsub, &theirs, &sub);
        }
    }
}

/// Fields that `new` (the field set of `applied`) shares with another Apply
/// manager's set in `owners` and whose applied value differs from the object's:
/// the conflicts a non-forced apply is refused for. Returns (manager, path).
pub fn conflicts(
    obj: &Value,
    applied: &Value,
    new: &Value,
    owners: &[(String, Value)],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (manager, set) in owners {
        let mut paths = Vec::new();
        shared(Some(obj), Some(applied), new, set, "", "", &mut paths);
        out.extend(paths.into_iter().map(|p| (manager.clone(), p)));
    }
    out
}

fn shared(
    obj: Option<&Value>,
    applied: Option<&Value>,
    a: &Value,
    b: &Value,
    path: &str,
    shown: &str,
    out: &mut Vec<String>,
) {
    let (Some(am), Some(bm)) = (a.as_object(), b.as_object()) else {
        return;
    };
    if am.is_empty() || bm.is_empty() {
        // one side owns this node as a whole: compare the values here
        if obj != applied {
            out.push(if shown.is_empty() {
                ".".into()
            } else {
                shown.to_string()
            });
        }
        return;
    }
    for (k, asub) in am {
        let Some(bsub) = bm.get(k) else { continue };
        if let Some(field) = k.strip_prefix("f:") {
            let sub = if path.is_empty() {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            shared(
                obj.and_then(|o| o.get(field)),
                applied.and_then(|o| o.get(field)),
                asub,
                bsub,
                &sub,
                &format!("{shown}.{field}"),
                out,
            );
        } else if let Some(key) = k
            .strip_prefix("k:")
            .and_then(|k| serde_json::from_str::<Value>(k).ok())
        {
            let keys: Vec<&str> = key
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let find = |list: Option<&Value>| -> Option<Value> {
                list?
                    .as_array()?
                    .iter()
                    .find(|it| same_key(it, &key, &keys))
                    .cloned()
            };
            let (o, ap) = (find(obj), find(applied));
            shared(
                o.as_ref(),
                ap.as_ref(),
                asub,
                bsub,
                path,
                &format!("{shown}[{key}]"),
                out,
            );
        }
    }
}

/// Every other manager's Apply field set on `subresource`.
pub fn other_owners(obj: &Value, manager: &str, subresource: Option<&str>) -> Vec<(String, Value)> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| {
            e.get("manager").and_then(Value::as_str) != Some(manager)
                && e.get("operation").and_then(Value::as_str) == Some("Apply")
                && e.get("subresource").and_then(Value::as_str) == subresource
        })
        .filter_map(|e| {
            Some((
                e.get("manager")?.as_str()?.to_string(),
                e.get("fieldsV1")?.clone(),
            ))
        })
        .collect()
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
        remove_stale(&mut obj, &prev, &next, &[]);
        assert_eq!(
            obj,
            // loadBalancer was only this manager's: it goes as a whole
            json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "C"}]}})
        );
    }

    #[test]
    fn fields_another_manager_owns_stay() {
        let prev = field_set(&json!({"data": {"a": "1", "b": "2"}}), "");
        let next = field_set(&json!({"data": {}}), "");
        let theirs = field_set(&json!({"data": {"b": "2"}}), "");
        let mut obj = json!({"data": {"a": "1", "b": "2"}});
        remove_stale(&mut obj, &prev, &next, &[theirs]);
        assert_eq!(obj, json!({"data": {"b": "2"}}));
    }

    #[test]
    fn conflicts_are_shared_fields_with_other_values() {
        let obj = json!({"spec": {"size": 3, "color": "red", "ports": [{"port": 80, "protocol": "TCP", "name": "a"}]}});
        let theirs = field_set(
            &json!({"spec": {"size": 3, "ports": [{"port": 80, "protocol": "TCP", "name": "a"}]}}),
            "",
        );
        let owners = vec![("other".to_string(), theirs)];
        // same values: no conflict
        let same = json!({"spec": {"size": 3}});
        assert!(conflicts(&obj, &same, &field_set(&same, ""), &owners).is_empty());
        // a different value of a field they own
        let diff = json!({"spec": {"size": 4, "color": "blue"}});
        assert_eq!(
            conflicts(&obj, &diff, &field_set(&diff, ""), &owners),
            [("other".to_string(), ".spec.size".to_string())]
        );
        // inside a keyed list item
        let port = json!({"spec": {"ports": [{"port": 80, "protocol": "TCP", "name": "b"}]}});
        let c = conflicts(&obj, &port, &field_set(&port, ""), &owners);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].1.ends_with(".name"), "{c:?}");
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
