//! The kubeconfig the simulator writes: one cluster with a plain-HTTP server URL, an
//! empty user (no auth), namespace `default`. kube-rs and kubectl both accept it.

use std::path::Path;

/// Renders the kubeconfig YAML for `server` (e.g. `http://127.0.0.1:6443`).
pub fn render(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: apisim
  cluster:
    server: {server}
contexts:
- name: apisim
  context:
    cluster: apisim
    user: apisim
    namespace: default
current-context: apisim
users:
- name: apisim
  user: {{}}
preferences: {{}}
"
    )
}

/// Writes the kubeconfig to `path`, creating parent directories.
pub fn write(path: &Path, server: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, render(server))
}

#[cfg(test)]
mod tests {
    #[test]
    fn kube_rs_parses_it() {
        let kc: kube::config::Kubeconfig =
            serde_yaml::from_str(&super::render("http://127.0.0.1:1")).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("apisim"));
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("http://127.0.0.1:1")
        );
    }
}
