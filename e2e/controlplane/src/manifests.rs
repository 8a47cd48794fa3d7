//! Objects the harness puts into the cluster: the chart's CRDs and RBAC, arbitrary
//! YAML (server-side apply), namespaces, ServiceAccount tokens.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use kube::{Api, Client};

use super::{Error, Result};

/// The field manager of everything the harness applies.
const MANAGER: &str = "ringlb-test";

/// `charts/ringlb` in this checkout.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../charts/ringlb")
}

/// Replaces `{{ .Release.Namespace }}`, the one template expression the RBAC files use.
pub fn render_release_namespace(yaml: &str, ns: &str) -> String {
    yaml.replace("{{ .Release.Namespace }}", ns)
}

fn read_dir_yaml(dir: PathBuf, suffix: &str) -> Result<Vec<String>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(Error::io(format!("reading {}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| std::fs::read_to_string(&p).map_err(Error::io(format!("reading {}", p.display()))))
        .collect()
}

/// The chart's RBAC templates (`templates/*-rbac.yaml`), unrendered.
pub fn chart_rbac_templates() -> Result<Vec<String>> {
    read_dir_yaml(chart_dir().join("templates"), "-rbac.yaml")
}

/// `helm template ringlb charts/ringlb --namespace NS --show-only` each RBAC template.
pub fn helm_template_rbac(helm: &Path, ns: &str) -> Result<String> {
    let dir = chart_dir().join("templates");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(Error::io(format!("reading {}", dir.display())))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with("-rbac.yaml"))
        .collect();
    names.sort();
    let mut cmd = std::process::Command::new(helm);
    cmd.args(["template", "ringlb"])
        .arg(chart_dir())
        .args(["--namespace", ns]);
    for n in &names {
        cmd.args(["--show-only", &format!("templates/{n}")]);
    }
    let out = cmd
        .output()
        .map_err(Error::io(format!("running {}", helm.display())))?;
    if !out.status.success() {
        return Err(Error::Manifest(format!(
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    String::from_utf8(out.stdout).map_err(|e| Error::Manifest(format!("helm output: {e}")))
}

/// Applies the chart's CRDs and waits until each is Established.
pub(crate) async fn install_crds(client: &Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for yaml in read_dir_yaml(chart_dir().join("crds"), ".yaml")? {
        let crd: CustomResourceDefinition = serde_yaml::from_str(&yaml)
            .map_err(|e| Error::Manifest(format!("a chart CRD does not parse: {e}")))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(Error::kube(format!("applying CRD {name}")))?;
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let crd = api
                .get(&name)
                .await
                .map_err(Error::kube(format!("reading CRD {name}")))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("CRD {name} to be Established"),
                    waited: Duration::from_secs(30),
                    detail: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Creates namespace `ns` unless it exists.
pub(crate) async fn ensure_namespace(client: &Client, ns: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
        .expect("a namespace object");
    api.patch(ns, &PatchParams::apply(MANAGER), &Patch::Apply(&obj))
        .await
        .map_err(Error::kube(format!("creating namespace {ns}")))?;
    Ok(())
}

/// Server-side applies every document of `yaml`, resolving each kind by discovery.
pub(crate) async fn apply_yaml(client: &Client, yaml: &str) -> Result<()> {
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_json::to_value(
            serde::Deserialize::deserialize(doc)
                .map(|v: serde_yaml::Value| v)
                .map_err(|e| Error::Manifest(format!("YAML does not parse: {e}")))?,
        )
        .map_err(|e| Error::Manifest(format!("YAML is not JSON-like: {e}")))?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value)
            .map_err(|e| Error::Manifest(format!("not a Kubernetes object: {e}")))?;
        let types = obj
            .types
            .clone()
            .ok_or_else(|| Error::Manifest("an object without apiVersion/kind".into()))?;
        let gvk = GroupVersionKind::try_from(&types)
            .map_err(|e| Error::Manifest(format!("bad apiVersion {}: {e}", types.api_version)))?;
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(Error::kube(format!("discovering {}", types.kind)))?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(Error::kube(format!("applying {} {name}", types.kind)))?;
    }
    Ok(())
}

/// A bound token for ServiceAccount `ns/name` (TokenRequest, 24 h).
pub(crate) async fn request_token(client: &Client, ns: &str, name: &str) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(24 * 3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let tr: TokenRequest = api
        .create_subresource("token", name, &PostParams::default(), &req)
        .await
        .map_err(Error::kube(format!(
            "TokenRequest for ServiceAccount {ns}/{name}"
        )))?;
    tr.status
        .map(|s| s.token)
        .ok_or_else(|| Error::Manifest(format!("TokenRequest for {ns}/{name} returned no token")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_the_release_namespace() {
        let y = "namespace: {{ .Release.Namespace }}\n";
        assert_eq!(
            super::render_release_namespace(y, "ringlb"),
            "namespace: ringlb\n"
        );
    }
}
