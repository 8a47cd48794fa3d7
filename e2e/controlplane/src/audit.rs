//! kube-apiserver's audit log, read back as what RBAC saw: for each request of one
//! user, (API group, resource[/subresource], verb). This is the authorizer's own view
//! of the request (watch vs list, subresources, namespaced or not), so a test can
//! compare a program's real requests with what the chart grants.

use std::collections::BTreeSet;

/// Every request at level Metadata (no bodies), without the RequestReceived stage.
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
  - level: Metadata
";

/// (API group, `resource` or `resource/subresource`, verb), as RBAC rules name them.
pub type Access = (String, String, String);

/// The accesses of `user` in an audit log (JSON lines). Non-resource requests
/// (`/version`, `/api`) have no objectRef and are left out.
pub fn accesses(log: &str, user: &str) -> BTreeSet<Access> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["user"]["username"] == user)
        .filter_map(|e| {
            let o = e.get("objectRef")?;
            let resource = o["resource"].as_str()?;
            let resource = match o["subresource"].as_str() {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_string(),
            };
            Some((
                o["apiGroup"].as_str().unwrap_or("").to_string(),
                resource,
                e["verb"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_resource_subresource_and_verb_of_one_user() {
        let log = r#"{"kind":"Event","verb":"watch","user":{"username":"u"},"objectRef":{"resource":"services","apiVersion":"v1"}}
{"kind":"Event","verb":"patch","user":{"username":"u"},"objectRef":{"resource":"services","namespace":"d","name":"x","subresource":"status","apiVersion":"v1"}}
{"kind":"Event","verb":"get","user":{"username":"other"},"objectRef":{"resource":"secrets","apiVersion":"v1"}}
{"kind":"Event","verb":"get","user":{"username":"u"},"requestURI":"/version"}
{"kind":"Event","verb":"create","user":{"username":"u"},"objectRef":{"resource":"leases","apiGroup":"coordination.k8s.io","apiVersion":"v1"}}"#;
        let got: Vec<_> = super::accesses(log, "u").into_iter().collect();
        let t = |g: &str, r: &str, v: &str| (g.to_string(), r.to_string(), v.to_string());
        assert_eq!(
            got,
            vec![
                t("", "services", "watch"),
                t("", "services/status", "patch"),
                t("coordination.k8s.io", "leases", "create"),
            ]
        );
    }
}
