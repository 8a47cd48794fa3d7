//! The EndpointSlices a Service should have, from the Pods it selects: pure
//! functions, no I/O (the controller in `controllers.rs` writes the result).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::meta;
use super::select::LabelSelector;

const MAX_ENDPOINTS: usize = 100;

/// A pod's IPs from `status.podIPs`, else `status.podIP`.
pub fn pod_ips_of(pod: &Value) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = pod
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("ip")?.as_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if ips.is_empty()
        && let Some(ip) = pod
            .pointer("/status/podIP")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
    {
        ips.push(ip);
    }
    ips
}

/// The pod's Ready condition is True.
pub fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type") == Some(&json!("Ready")) && c.get("status") == Some(&json!("True"))
            })
        })
}

/// Resolves a Service port's targetPort for one pod: numbers as they are, names via
/// the pod's container ports.
fn resolve_target(pod: &Value, sp: &Value) -> Option<u64> {
    match sp.get("targetPort") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => match s.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => pod
                .pointer("/spec/containers")?
                .as_array()?
                .iter()
                .flat_map(|c| {
                    c.get("ports")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .find(|p| p.get("name").and_then(Value::as_str) == Some(s.as_str()))
                .and_then(|p| p.get("containerPort")?.as_u64()),
        },
        _ => sp.get("port").and_then(Value::as_u64),
    }
}

/// The EndpointSlice bodies (addressType, endpoints, ports) a Service should have:
/// per address family, pods grouped by their resolved port list, at most 100
/// endpoints per slice. A Service that selects nothing gets one empty slice.
pub fn desired_slices(svc: &Value, sel: &LabelSelector, pods: &[Arc<Value>]) -> Vec<Value> {
    let families: Vec<String> = svc
        .pointer("/spec/ipFamilies")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .filter(|v: &Vec<String>| !v.is_empty())
        .unwrap_or_else(|| vec!["IPv4".into()]);
    let publish_not_ready = svc.pointer("/spec/publishNotReadyAddresses") == Some(&json!(true));
    let svc_ports: Vec<Value> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for fam in &families {
        let v4 = fam == "IPv4";
        let mut groups: BTreeMap<String, (Value, Vec<Value>)> = BTreeMap::new();
        let mut selected: Vec<&Arc<Value>> = pods.iter().filter(|p| sel.matches(p)).collect();
        selected.sort_by_key(|p| meta::name(p).to_string());
        for pod in selected {
            if matches!(
                pod.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            ) {
                continue;
            }
            let Some(ip) = pod_ips_of(pod).into_iter().find(|ip| ip.is_ipv4() == v4) else {
                continue;
            };
            let ports: Vec<Value> = svc_ports
                .iter()
                .filter_map(|sp| {
                    let port = resolve_target(pod, sp)?;
                    let mut p = json!({"name": sp.get("name").and_then(Value::as_str).unwrap_or(""),
                        "port": port, "protocol": sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP")});
                    if let Some(ap) = sp.get("appProtocol") {
                        p["appProtocol"] = ap.clone();
                    }
                    Some(p)
                })
                .collect();
            let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
            let serving = is_ready(pod) || publish_not_ready;
            let mut ep = json!({"addresses": [ip.to_string()],
                "conditions": {"ready": serving && !terminating, "serving": serving, "terminating": terminating},
                "targetRef": {"kind": "Pod", "namespace": meta::namespace(pod), "name": meta::name(pod), "uid": meta::uid(pod)}});
            if let Some(n) = pod.pointer("/spec/nodeName") {
                ep["nodeName"] = n.clone();
            }
            let ports = json!(ports);
            groups
                .entry(ports.to_string())
                .or_insert_with(|| (ports, Vec::new()))
                .1
                .push(ep);
        }
        for (_, (ports, eps)) in groups {
            for chunk in eps.chunks(MAX_ENDPOINTS) {
                out.push(json!({"addressType": fam, "endpoints": chunk, "ports": ports}));
            }
        }
    }
    if out.is_empty() {
        out.push(json!({"addressType": families[0], "endpoints": [], "ports": Value::Null}));
    }
    out.sort_by_key(|s| (s["addressType"].to_string(), s["ports"].to_string()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, ready: bool, labels: Value) -> Arc<Value> {
        Arc::new(
            json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}),
        )
    }

    #[test]
    fn slices_from_pods() {
        let svc = json!({"spec": {"selector": {"app": "web"}, "ipFamilies": ["IPv4"],
            "ports": [{"name": "web", "port": 80, "targetPort": "http", "protocol": "TCP"}]}});
        let sel = LabelSelector::parse("app=web").unwrap();
        let pods = vec![
            pod("a", "10.0.0.1", true, json!({"app": "web"})),
            pod("b", "10.0.0.2", false, json!({"app": "web"})),
            pod("c", "10.0.0.3", true, json!({"app": "other"})),
            pod("d", "fd00::4", true, json!({"app": "web"})),
        ];
        let s = desired_slices(&svc, &sel, &pods);
        assert_eq!(s.len(), 1);
        assert_eq!(
            s[0]["ports"],
            json!([{"name": "web", "port": 8080, "protocol": "TCP"}])
        );
        let eps = s[0]["endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0]["addresses"], json!(["10.0.0.1"]));
        assert_eq!(eps[0]["conditions"]["ready"], true);
        assert_eq!(eps[1]["conditions"]["ready"], false);
        assert_eq!(eps[1]["targetRef"]["name"], "b");
        let empty = desired_slices(&svc, &LabelSelector::parse("app=none").unwrap(), &pods);
        assert_eq!(empty[0]["endpoints"], json!([]));
    }
}
