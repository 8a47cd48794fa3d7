//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`), `/version`, and
//! the minimal OpenAPI v3 documents kubectl reads to learn that the server validates
//! fields itself (`fieldValidation`), so that `kubectl apply -f` works with defaults.

use serde_json::{Value, json};

use super::resources::{Registry, ResourceInfo};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-ringlb-apisim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`: the legacy core group's versions.
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    })
}

fn group_entry(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// `/apis`: every named group.
pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = reg.groups().into_iter().find(|(g, _)| g == name)?;
    let mut e = group_entry(&g, &vs);
    e["kind"] = json!("APIGroup");
    e["apiVersion"] = json!("v1");
    Some(e)
}

fn resource_entries(r: &ResourceInfo) -> Vec<Value> {
    let mut main = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": VERBS,
    });
    if !r.short_names.is_empty() {
        main["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        main["categories"] = json!(r.categories);
    }
    let mut out = vec![main];
    if r.status {
        out.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
            "kind": r.kind, "verbs": ["get", "patch", "update"]}));
    }
    if r.scale {
        out.push(json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
            "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
    }
    out
}

/// `/api/v1` or `/apis/<g>/<v>`: an APIResourceList.
pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut rs = reg.group_version(group, version)?;
    rs.sort_by(|a, b| a.plural.cmp(&b.plural));
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let resources: Vec<Value> = rs.iter().flat_map(|r| resource_entries(r)).collect();
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn gv_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of per-group-version documents.
pub fn openapi_index(reg: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, vs) in reg.groups() {
        for v in vs {
            let key = gv_key(&g, &v);
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=apisim")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<api/v1 | apis/g/v>`: paths with the PATCH operation of every
/// resource, tagged with its group/version/kind and the `fieldValidation` query
/// parameter. No schemas: kubectl then leaves validation to the server and builds
/// strategic merge patches from its compiled-in types (JSON merge patch for CRs).
pub fn openapi_gv(reg: &Registry, key: &str) -> Option<Value> {
    let (group, version) = match key.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    let rs = reg.group_version(&group, &version)?;
    let mut paths = serde_json::Map::new();
    for r in rs {
        let base = r.gv_path();
        let path = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{base}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        paths.insert(
            path,
            json!({
                "get": {"x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk, "responses": {}},
                "put": {"x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}},
                "patch": {"x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}},
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_cover_builtins() {
        let reg = Registry::new();
        let core = resource_list(&reg, "", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"services")
                && names.contains(&"services/status")
                && names.contains(&"pods")
        );
        let groups = group_list(&reg);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "discovery.k8s.io")
        );
        assert!(resource_list(&reg, "nope", "v1").is_none());
        let apps = openapi_gv(&reg, "apis/apps/v1").unwrap();
        let p = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"];
        assert_eq!(
            p["patch"]["x-kubernetes-group-version-kind"]["kind"],
            "Deployment"
        );
        assert!(openapi_index(&reg)["paths"]["api/v1"]["serverRelativeURL"].is_string());
    }
}
