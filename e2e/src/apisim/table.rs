//! Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`),
//! which is where `kubectl get` takes its columns from: Services get the real
//! NAME/TYPE/CLUSTER-IP/EXTERNAL-IP/PORT(S)/AGE columns, a few other built-ins get
//! theirs, CRDs use their `additionalPrinterColumns`, the rest NAME/AGE.

use std::sync::Arc;

use serde_json::{Value, json};

use super::meta;
use super::resources::ResourceInfo;

pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|a| a.contains("as=Table"))
}

/// `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`
/// (kube-rs `Api::get_metadata`, `metadata_watcher`).
pub fn wants_metadata(accept: &str) -> bool {
    !wants_table(accept)
        && accept
            .split(',')
            .any(|a| a.contains("as=PartialObjectMetadata"))
}

/// An object reduced to `meta.k8s.io/v1` PartialObjectMetadata.
pub fn partial(obj: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({}))})
}

fn s<'a>(o: &'a Value, ptr: &str) -> &'a str {
    o.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn age(o: &Value) -> String {
    meta::age_seconds(s(o, "/metadata/creationTimestamp"))
        .map_or("<unknown>".into(), meta::short_age)
}

fn col(name: &str, ty: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority})
}

fn arr(o: &Value, ptr: &str) -> Vec<Value> {
    o.pointer(ptr)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn service_row(o: &Value) -> Vec<Value> {
    let ty = s(o, "/spec/type");
    let cluster_ip = match s(o, "/spec/clusterIP") {
        "" => "<none>",
        ip => ip,
    };
    let mut ext: Vec<String> = arr(o, "/status/loadBalancer/ingress")
        .iter()
        .filter_map(|i| {
            i.get("ip")
                .or(i.get("hostname"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    ext.extend(
        arr(o, "/spec/externalIPs")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string)),
    );
    let external = if !ext.is_empty() {
        ext.join(",")
    } else if ty == "LoadBalancer" {
        "<pending>".into()
    } else if ty == "ExternalName" {
        s(o, "/spec/externalName").into()
    } else {
        "<none>".into()
    };
    let ports: Vec<String> = arr(o, "/spec/ports")
        .iter()
        .map(|p| {
            let port = p.get("port").and_then(Value::as_u64).unwrap_or(0);
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            match p.get("nodePort").and_then(Value::as_u64) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    };
    let selector = o
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "<none>".into());
    vec![
        json!(meta::name(o)),
        json!(ty),
        json!(cluster_ip),
        json!(external),
        json!(ports),
        json!(age(o)),
        json!(selector),
    ]
}

fn int(o: &Value, ptr: &str) -> i64 {
    o.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// Evaluates the simple JSONPaths CRDs use (`.a.b`, `.a[0].b`).
fn json_path<'a>(o: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = o;
    for part in path.trim_start_matches('.').split('.') {
        let (field, idx) = match part.split_once('[') {
            Some((f, rest)) => (f, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !field.is_empty() {
            cur = cur.get(field)?;
        }
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn columns_and_rows(info: &ResourceInfo, items: &[Arc<Value>]) -> (Vec<Value>, Vec<Vec<Value>>) {
    let name = || col("Name", "string", 0);
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "services") => (
            vec![
                name(),
                col("Type", "string", 0),
                col("Cluster-IP", "string", 0),
                col("External-IP", "string", 0),
                col("Port(s)", "string", 0),
                col("Age", "string", 0),
                col("Selector", "string", 1),
            ],
            items.iter().map(|o| service_row(o)).collect(),
        ),
        ("", "pods") => (
            vec![
                name(),
                col("Ready", "string", 0),
                col("Status", "string", 0),
                col("Restarts", "string", 0),
                col("Age", "string", 0),
                col("IP", "string", 1),
                col("Node", "string", 1),
            ],
            items
                .iter()
                .map(|o| {
                    let ready = arr(o, "/status/conditions")
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    let status = if o.pointer("/metadata/deletionTimestamp").is_some() {
                        "Terminating"
                    } else {
                        s(o, "/status/phase")
                    };
                    let ip = match s(o, "/status/podIP") {
                        "" => "<none>",
                        ip => ip,
                    };
                    let node = match s(o, "/spec/nodeName") {
                        "" => "<none>",
                        n => n,
                    };
                    vec![
                        json!(meta::name(o)),
                        json!(if ready { "1/1" } else { "0/1" }),
                        json!(status),
                        json!("0"),
                        json!(age(o)),
                        json!(ip),
                        json!(node),
                    ]
                })
                .collect(),
        ),
        ("apps", "deployments") => (
            vec![
                name(),
                col("Ready", "string", 0),
                col("Up-to-date", "string", 0),
                col("Available", "string", 0),
                col("Age", "string", 0),
            ],
            items
                .iter()
                .map(|o| {
                    let want = o
                        .pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1);
                    vec![
                        json!(meta::name(o)),
                        json!(format!("{}/{want}", int(o, "/status/readyReplicas"))),
                        json!(int(o, "/status/updatedReplicas")),
                        json!(int(o, "/status/availableReplicas")),
                        json!(age(o)),
                    ]
                })
                .collect(),
        ),
        ("apps", "replicasets") => (
            vec![
                name(),
                col("Desired", "integer", 0),
                col("Current", "integer", 0),
                col("Ready", "integer", 0),
                col("Age", "string", 0),
            ],
            items
                .iter()
                .map(|o| {
                    vec![
                        json!(meta::name(o)),
                        json!(int(o, "/spec/replicas")),
                        json!(int(o, "/status/replicas")),
                        json!(int(o, "/status/readyReplicas")),
                        json!(age(o)),
                    ]
                })
                .collect(),
        ),
        ("", "events") | ("events.k8s.io", "events") => {
            let core = info.group.is_empty();
            let (regarding, note) = if core {
                ("involvedObject", "message")
            } else {
                ("regarding", "note")
            };
            (
                vec![
                    col("Last Seen", "string", 0),
                    col("Type", "string", 0),
                    col("Reason", "string", 0),
                    col("Object", "string", 0),
                    col("Message", "string", 0),
                ],
                items
                    .iter()
                    .map(|o| {
                        let last = [
                            "/series/lastObservedTime",
                            "/lastTimestamp",
                            "/deprecatedLastTimestamp",
                            "/eventTime",
                            "/metadata/creationTimestamp",
                        ]
                        .iter()
                        .find_map(|p| {
                            o.pointer(p)
                                .and_then(Value::as_str)
                                .filter(|s| !s.is_empty())
                        })
                        .and_then(meta::age_seconds)
                        .map_or("<unknown>".into(), meta::short_age);
                        let r = o.get(regarding);
                        let kind = r
                            .and_then(|r| r.get("kind"))
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_ascii_lowercase();
                        let name = r
                            .and_then(|r| r.get("name"))
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        vec![
                            json!(last),
                            json!(s(o, "/type")),
                            json!(s(o, "/reason")),
                            json!(format!("{kind}/{name}")),
                            json!(o.get(note).and_then(Value::as_str).unwrap_or("")),
                        ]
                    })
                    .collect(),
            )
        }
        ("", "namespaces") => (
            vec![name(), col("Status", "string", 0), col("Age", "string", 0)],
            items
                .iter()
                .map(|o| {
                    vec![
                        json!(meta::name(o)),
                        json!(s(o, "/status/phase")),
                        json!(age(o)),
                    ]
                })
                .collect(),
        ),
        ("discovery.k8s.io", "endpointslices") => (
            vec![
                name(),
                col("AddressType", "string", 0),
                col("Ports", "string", 0),
                col("Endpoints", "string", 0),
                col("Age", "string", 0),
            ],
            items
                .iter()
                .map(|o| {
                    let ports: Vec<String> = arr(o, "/ports")
                        .iter()
                        .filter_map(|p| p.get("port").map(|v| v.to_string()))
                        .collect();
                    let eps: Vec<String> = arr(o, "/endpoints")
                        .iter()
                        .flat_map(|e| {
                            e.get("addresses")
                                .and_then(Value::as_array)
                                .cloned()
                                .unwrap_or_default()
                        })
                        .filter_map(|a| a.as_str().map(str::to_string))
                        .collect();
                    vec![
                        json!(meta::name(o)),
                        json!(s(o, "/addressType")),
                        json!(if ports.is_empty() {
                            "<unset>".into()
                        } else {
                            ports.join(",")
                        }),
                        json!(if eps.is_empty() {
                            "<unset>".into()
                        } else {
                            eps.join(",")
                        }),
                        json!(age(o)),
                    ]
                })
                .collect(),
        ),
        _ if !info.printer_columns.is_empty() => {
            let pcs = &info.printer_columns;
            let mut cols = vec![name()];
            for pc in pcs {
                let ty = pc.get("type").and_then(Value::as_str).unwrap_or("string");
                let prio = pc.get("priority").and_then(Value::as_u64).unwrap_or(0) as u8;
                cols.push(col(
                    pc.get("name").and_then(Value::as_str).unwrap_or(""),
                    if ty == "date" { "string" } else { ty },
                    prio,
                ));
            }
            let rows = items
                .iter()
                .map(|o| {
                    let mut row = vec![json!(meta::name(o))];
                    for pc in pcs {
                        let path = pc.get("jsonPath").and_then(Value::as_str).unwrap_or("");
                        let v = json_path(o, path).cloned().unwrap_or(Value::Null);
                        let cell = match (pc.get("type").and_then(Value::as_str), &v) {
                            (Some("date"), Value::String(ts)) => json!(
                                meta::age_seconds(ts).map_or("<unknown>".into(), meta::short_age)
                            ),
                            (_, Value::Null) => json!("<none>"),
                            _ => v,
                        };
                        row.push(cell);
                    }
                    row
                })
                .collect();
            (cols, rows)
        }
        _ => (
            vec![name(), col("Age", "string", 0)],
            items
                .iter()
                .map(|o| vec![json!(meta::name(o)), json!(age(o))])
                .collect(),
        ),
    }
}

/// A `meta.k8s.io/v1` Table of `items`.
pub fn render(info: &ResourceInfo, items: &[Arc<Value>], rv: u64) -> Value {
    let (cols, rows) = columns_and_rows(info, items);
    let rows: Vec<Value> = rows
        .into_iter()
        .zip(items)
        .map(|(cells, o)| {
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({}))}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": cols, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apisim::resources::builtins;

    #[test]
    fn service_external_ip_column() {
        let info = builtins()
            .into_iter()
            .find(|r| r.plural == "services")
            .unwrap();
        let mut svc = json!({"metadata": {"name": "web", "creationTimestamp": meta::now()},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.5", "ports": [{"port": 80, "nodePort": 30001, "protocol": "TCP"}]}});
        let t = render(&info, &[Arc::new(svc.clone())], 7);
        assert_eq!(t["rows"][0]["cells"][3], "<pending>");
        assert_eq!(t["rows"][0]["cells"][4], "80:30001/TCP");
        svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}});
        let t = render(&info, &[Arc::new(svc)], 8);
        assert_eq!(t["rows"][0]["cells"][3], "192.0.2.10");
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
    }

    #[test]
    fn json_paths() {
        let o = json!({"status": {"a": [{"b": 3}]}});
        assert_eq!(json_path(&o, ".status.a[0].b"), Some(&json!(3)));
        assert_eq!(json_path(&o, ".nope"), None);
    }
}
