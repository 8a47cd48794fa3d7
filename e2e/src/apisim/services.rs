//! Service defaulting and allocation, as kube-apiserver's Service REST storage does:
//! `ipFamilyPolicy`/`ipFamilies`, ClusterIPs from the service CIDRs, NodePorts for
//! NodePort/LoadBalancer Services (unless `allocateLoadBalancerNodePorts: false`), port
//! protocol/targetPort defaults, and release of all of it on delete or type change.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

/// ClusterIP and NodePort allocation state.
#[derive(Debug, Clone)]
pub struct Allocator {
    /// Service CIDRs, primary family first.
    cidrs: Vec<IpNetwork>,
    used_ips: HashSet<IpAddr>,
    used_ports: HashSet<u16>,
    next_port: u16,
}

pub const NODE_PORT_MIN: u16 = 30000;
pub const NODE_PORT_MAX: u16 = 32767;

fn family_of(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

impl Allocator {
    pub fn new(cidrs: Vec<IpNetwork>) -> Self {
        Allocator {
            cidrs,
            used_ips: HashSet::new(),
            used_ports: HashSet::new(),
            next_port: NODE_PORT_MIN,
        }
    }

    fn cidr(&self, family: &str) -> Option<IpNetwork> {
        self.cidrs
            .iter()
            .copied()
            .find(|c| (family == "IPv4") == c.is_ipv4())
    }

    /// Marks a specific IP as used; false when it is taken or outside the CIDRs.
    pub fn claim_ip(&mut self, ip: IpAddr) -> Result<(), String> {
        if !self.cidrs.iter().any(|c| c.contains(ip)) {
            return Err(format!(
                "spec.clusterIPs: Invalid value: {ip:?}: provided IP is not in the valid range"
            ));
        }
        if !self.used_ips.insert(ip) {
            return Err(format!(
                "spec.clusterIPs: Invalid value: {ip:?}: provided IP is already allocated"
            ));
        }
        Ok(())
    }

    /// The lowest free IP of the family (offset 1 upward; offset 1 is the
    /// `kubernetes` Service's). Bounded scan: the simulator never holds more than a
    /// few hundred thousand Services.
    pub fn allocate_ip(&mut self, family: &str) -> Result<IpAddr, String> {
        let cidr = self.cidr(family).ok_or_else(|| {
            format!("spec.ipFamilies: Invalid value: {family:?}: not configured on this cluster")
        })?;
        let limit: u128 = match cidr {
            IpNetwork::V4(n) => 1u128 << (32 - n.prefix()),
            IpNetwork::V6(n) => 1u128 << (128 - n.prefix()).min(24),
        };
        for off in 1..limit.saturating_sub(1) {
            let ip = match cidr {
                IpNetwork::V4(n) => {
                    IpAddr::from(((u32::from(n.network()) as u128 + off) as u32).to_be_bytes())
                }
                IpNetwork::V6(n) => IpAddr::from((u128::from(n.network()) + off).to_be_bytes()),
            };
            if self.used_ips.insert(ip) {
                return Ok(ip);
            }
        }
        Err(format!(
            "failed to allocate a serviceIP: range is full ({cidr})"
        ))
    }

    pub fn claim_port(&mut self, port: u16) -> Result<(), String> {
        if !(NODE_PORT_MIN..=NODE_PORT_MAX).contains(&port) {
            return Err(format!(
                "spec.ports[].nodePort: Invalid value: {port}: provided port is not in the valid range. The range of valid ports is {NODE_PORT_MIN}-{NODE_PORT_MAX}"
            ));
        }
        if !self.used_ports.insert(port) {
            return Err(format!(
                "spec.ports[].nodePort: Invalid value: {port}: provided port is already allocated"
            ));
        }
        Ok(())
    }

    pub fn allocate_port(&mut self) -> Result<u16, String> {
        let span = NODE_PORT_MAX - NODE_PORT_MIN + 1;
        for i in 0..span {
            let p = NODE_PORT_MIN + (self.next_port - NODE_PORT_MIN + i) % span;
            if self.used_ports.insert(p) {
                self.next_port = if p == NODE_PORT_MAX {
                    NODE_PORT_MIN
                } else {
                    p + 1
                };
                return Ok(p);
            }
        }
        Err("failed to allocate a nodePort: range is full".into())
    }

    pub fn release_ip(&mut self, ip: IpAddr) {
        self.used_ips.remove(&ip);
    }

    pub fn release_port(&mut self, port: u16) {
        self.used_ports.remove(&port);
    }

    /// Releases everything a stored Service holds.
    pub fn release_service(&mut self, svc: &Value) {
        for ip in cluster_ips(svc) {
            self.release_ip(ip);
        }
        for p in node_ports(svc) {
            self.release_port(p);
        }
    }
}

fn cluster_ips(svc: &Value) -> Vec<IpAddr> {
    svc.pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

fn node_ports(svc: &Value) -> Vec<u16> {
    node_ports_in(svc.pointer("/spec/ports"))
}

fn node_ports_in(ports: Option<&Value>) -> Vec<u16> {
    ports
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("nodePort")?.as_u64())
                .filter_map(|p| u16::try_from(p).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn wants_node_ports(spec: &Value) -> bool {
    match spec.get("type").and_then(Value::as_str) {
        Some("NodePort") => true,
        Some("LoadBalancer") => {
            spec.get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false)
        }
        _ => false,
    }
}

/// Defaults and allocates a Service `new` (being created when `old` is `None`, else
/// updated from `old`). On error nothing stays allocated.
pub fn prepare(new: &mut Value, old: Option<&Value>, alloc: &mut Allocator) -> Result<(), String> {
    let primary = alloc
        .cidrs
        .first()
        .map_or("IPv4", |c| if c.is_ipv4() { "IPv4" } else { "IPv6" });
    let dual =
        alloc.cidrs.iter().any(IpNetwork::is_ipv4) && alloc.cidrs.iter().any(IpNetwork::is_ipv6);
    let Some(spec) = new.get_mut("spec").filter(|s| s.is_object()) else {
        return Err("spec: Required value".into());
    };
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    if !matches!(
        ty.as_str(),
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        return Err(format!("spec.type: Unsupported value: {ty:?}"));
    }
    spec["type"] = json!(ty);
    if spec.get("sessionAffinity").is_none() {
        spec["sessionAffinity"] = json!("None");
    }
    if ty == "ExternalName" {
        return Ok(());
    }
    if spec.get("internalTrafficPolicy").is_none() {
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    if matches!(ty.as_str(), "NodePort" | "LoadBalancer")
        && spec.get("externalTrafficPolicy").is_none()
    {
        spec["externalTrafficPolicy"] = json!("Cluster");
    }
    if ty == "LoadBalancer" && spec.get("allocateLoadBalancerNodePorts").is_none() {
        spec["allocateLoadBalancerNodePorts"] = json!(true);
    }
    // Ports: protocol and targetPort defaults, names required when more than one.
    let ports = spec.get_mut("ports").and_then(Value::as_array_mut);
    let nports = ports.as_ref().map_or(0, |p| p.len());
    let mut seen_names = HashSet::new();
    let mut seen_ports = HashSet::new();
    if let Some(ports) = ports {
        for (i, p) in ports.iter_mut().enumerate() {
            let Some(port) = p
                .get("port")
                .and_then(Value::as_u64)
                .filter(|p| (1..=65535).contains(p))
            else {
                return Err(format!(
                    "spec.ports[{i}].port: Invalid value: must be between 1 and 65535"
                ));
            };
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none() {
                p["targetPort"] = json!(port);
            }
            if nports > 1
                && p.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                return Err(format!("spec.ports[{i}].name: Required value"));
            }
            let name = p
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let proto = p
                .get("protocol")
                .and_then(Value::as_str)
                .unwrap_or("TCP")
                .to_string();
            if !name.is_empty() && !seen_names.insert(name.clone()) {
                return Err(format!("spec.ports[{i}].name: Duplicate value: {name:?}"));
            }
            if !seen_ports.insert((port, proto.clone())) {
                return Err(format!(
                    "spec.ports[{i}]: Duplicate value: {{port: {port}, protocol: {proto:?}}}"
                ));
            }
        }
    }
    if nports == 0 {
        return Err("spec.ports: Required value".into());
    }

    // Carry over what was allocated before (updates may omit it, as PUTs often do).
    if let Some(old) = old {
        for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if spec.get(f).is_none()
                && let Some(v) = old.get("spec").and_then(|s| s.get(f))
            {
                spec[f] = v.clone();
            }
        }
        if old.pointer("/spec/clusterIP") != spec.get("clusterIP") {
            return Err("spec.clusterIP: Invalid value: field is immutable".into());
        }
    }

    // IP families.
    let policy = spec
        .get("ipFamilyPolicy")
        .and_then(Value::as_str)
        .unwrap_or("SingleStack")
        .to_string();
    if !matches!(
        policy.as_str(),
        "SingleStack" | "PreferDualStack" | "RequireDualStack"
    ) {
        return Err(format!(
            "spec.ipFamilyPolicy: Unsupported value: {policy:?}"
        ));
    }
    if policy == "RequireDualStack" && !dual {
        return Err("spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services".into());
    }
    let mut families: Vec<String> = spec
        .get("ipFamilies")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if families.is_empty() {
        // From explicit clusterIPs, else the primary family.
        for ip in spec
            .get("clusterIPs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(ip) = ip.as_str().and_then(|s| s.parse::<IpAddr>().ok()) {
                families.push(family_of(&ip).into());
            }
        }
        if families.is_empty() {
            families.push(primary.into());
        }
    }
    if families.iter().any(|f| f != "IPv4" && f != "IPv6") {
        return Err(format!("spec.ipFamilies: Unsupported value: {families:?}"));
    }
    if policy != "SingleStack" && dual && families.len() == 1 {
        let other = if families[0] == "IPv4" {
            "IPv6"
        } else {
            "IPv4"
        };
        families.push(other.into());
    }
    if policy == "SingleStack" && families.len() > 1 {
        return Err("spec.ipFamilies: Invalid value: when spec.ipFamilyPolicy is SingleStack, only one family may be given".into());
    }
    spec["ipFamilyPolicy"] = json!(policy);
    spec["ipFamilies"] = json!(families);

    // ClusterIPs.
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    let old_ips: Vec<IpAddr> = old.map(cluster_ips).unwrap_or_default();
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut claimed: Vec<IpAddr> = Vec::new();
    let mut claimed_ports: Vec<u16> = Vec::new();
    let result = (|| {
        if headless {
            return Ok(());
        }
        let given: Vec<Option<IpAddr>> = match spec.get("clusterIPs").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|v| v.as_str().and_then(|s| s.parse().ok()))
                .collect(),
            None => vec![
                spec.get("clusterIP")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok()),
            ],
        };
        for (i, fam) in families.iter().enumerate() {
            match given.get(i).copied().flatten() {
                Some(ip) if old_ips.contains(&ip) => ips.push(ip),
                Some(ip) => {
                    if family_of(&ip) != fam {
                        return Err(format!(
                            "spec.clusterIPs[{i}]: Invalid value: {ip:?}: expected an {fam} address"
                        ));
                    }
                    alloc.claim_ip(ip)?;
                    claimed.push(ip);
                    ips.push(ip);
                }
                None => {
                    let ip = alloc.allocate_ip(fam)?;
                    claimed.push(ip);
                    ips.push(ip);
                }
            }
        }
        Ok(())
    })()
    .and_then(|()| {
        // NodePorts.
        let want = wants_node_ports(spec);
        let old_ports: Vec<u16> = old.map(node_ports).unwrap_or_default();
        let old_spec_ports = old
            .and_then(|o| o.pointer("/spec/ports"))
            .and_then(Value::as_array)
            .cloned();
        let explicit_new: Vec<u16> = node_ports_in(spec.get("ports"));
        let ports = spec
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten();
        let mut assigned: Vec<u16> = Vec::new();
        for p in ports {
            if !want {
                if let Some(o) = p.as_object_mut() {
                    o.remove("nodePort");
                }
                continue;
            }
            let explicit = p
                .get("nodePort")
                .and_then(Value::as_u64)
                .and_then(|v| u16::try_from(v).ok());
            // An update that omits a nodePort keeps the one the old port of the
            // same name had, unless another port took it (kube-apiserver's
            // patchAllocatedValues matches by name too).
            let inherited = explicit.or_else(|| {
                let name = p.get("name").and_then(Value::as_str).unwrap_or("");
                old_spec_ports
                    .as_ref()?
                    .iter()
                    .find(|op| op.get("name").and_then(Value::as_str).unwrap_or("") == name)
                    .and_then(|op| op.get("nodePort")?.as_u64())
                    .and_then(|v| u16::try_from(v).ok())
                    .filter(|n| !explicit_new.contains(n) && !assigned.contains(n))
            });
            let port = match inherited {
                Some(n) if old_ports.contains(&n) => n,
                Some(n) => {
                    alloc.claim_port(n)?;
                    claimed_ports.push(n);
                    n
                }
                None => {
                    let n = alloc.allocate_port()?;
                    claimed_ports.push(n);
                    n
                }
            };
            assigned.push(port);
            p["nodePort"] = json!(port);
        }
        Ok(())
    });
    if let Err(e) = result {
        for ip in claimed {
            alloc.release_ip(ip);
        }
        for p in claimed_ports {
            alloc.release_port(p);
        }
        return Err(e);
    }
    if headless {
        spec["clusterIPs"] = json!(["None"]);
    } else {
        spec["clusterIP"] = json!(ips[0].to_string());
        spec["clusterIPs"] = json!(ips.iter().map(ToString::to_string).collect::<Vec<_>>());
    }
    // Release what the old object held and the new one no longer does.
    if let Some(old) = old {
        let new_ips = cluster_ips(new);
        for ip in old_ips.into_iter().filter(|ip| !new_ips.contains(ip)) {
            alloc.release_ip(ip);
        }
        let new_ports = node_ports(new);
        for p in node_ports(old)
            .into_iter()
            .filter(|p| !new_ports.contains(p))
        {
            alloc.release_port(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc() -> Allocator {
        Allocator::new(vec![
            "10.96.0.0/16".parse().unwrap(),
            "fd00:10:96::/112".parse().unwrap(),
        ])
    }

    #[test]
    fn defaults_like_kubectl_expose_expects() {
        let mut a = alloc();
        let mut s = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": "web"}}});
        prepare(&mut s, None, &mut a).unwrap();
        let spec = &s["spec"];
        assert_eq!(spec["clusterIP"], "10.96.0.1");
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        assert_eq!(spec["ports"][0]["protocol"], "TCP");
        assert_eq!(spec["ports"][0]["nodePort"], 30000);
        assert_eq!(spec["externalTrafficPolicy"], "Cluster");
    }

    #[test]
    fn dual_stack_and_no_node_ports() {
        let mut a = alloc();
        let mut s = json!({"spec": {"type": "LoadBalancer", "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv6"], "allocateLoadBalancerNodePorts": false, "ports": [{"port": 53, "protocol": "UDP"}]}});
        prepare(&mut s, None, &mut a).unwrap();
        assert_eq!(s["spec"]["ipFamilies"], json!(["IPv6", "IPv4"]));
        assert_eq!(
            s["spec"]["clusterIPs"],
            json!(["fd00:10:96::1", "10.96.0.1"])
        );
        assert!(s["spec"]["ports"][0].get("nodePort").is_none());
    }

    #[test]
    fn conflicts_release_and_update_keeps() {
        let mut a = alloc();
        let mut s1 = json!({"spec": {"type": "NodePort", "clusterIP": "10.96.0.9", "ports": [{"port": 80, "nodePort": 30080}]}});
        prepare(&mut s1, None, &mut a).unwrap();
        let mut s2 = json!({"spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}});
        assert!(
            prepare(&mut s2, None, &mut a)
                .unwrap_err()
                .contains("already allocated")
        );
        let mut s3 =
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}});
        assert!(prepare(&mut s3, None, &mut a).is_err());
        // the failed attempt released its ClusterIP: the next gets .1
        let mut s4 = json!({"spec": {"ports": [{"port": 80}]}});
        prepare(&mut s4, None, &mut a).unwrap();
        assert_eq!(s4["spec"]["clusterIP"], "10.96.0.1");
        // an update that omits clusterIP and nodePort keeps both
        let mut upd =
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP"}]}});
        prepare(&mut upd, Some(&s1), &mut a).unwrap();
        assert_eq!(upd["spec"]["clusterIP"], "10.96.0.9");
        assert_eq!(upd["spec"]["ports"][0]["nodePort"], 30080);
        // type change to ClusterIP releases the node port
        let mut ci = json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}});
        prepare(&mut ci, Some(&upd), &mut a).unwrap();
        assert!(ci["spec"]["ports"][0].get("nodePort").is_none());
        a.claim_port(30080).unwrap();
        a.release_service(&s4);
        a.claim_ip("10.96.0.1".parse().unwrap()).unwrap();
        assert!(
            prepare(
                &mut json!({"spec": {"type": "Bogus", "ports": [{"port": 1}]}}),
                None,
                &mut a
            )
            .is_err()
        );
        assert!(prepare(&mut json!({"spec": {"ports": [{"port": 0}]}}), None, &mut a).is_err());
        let dup =
            json!({"spec": {"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}});
        assert!(
            prepare(&mut dup.clone(), None, &mut a)
                .unwrap_err()
                .contains("Duplicate")
        );
        let dup2 = json!({"spec": {"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80, "protocol": "TCP"}]}});
        assert!(
            prepare(&mut dup2.clone(), None, &mut a)
                .unwrap_err()
                .contains("Duplicate")
        );
    }
}
