//! Where the control-plane programs are: the folder `scripts/build-k8s.sh` builds into.

use std::path::{Path, PathBuf};

use super::Error;

/// The programs, by name, that a complete assets folder holds.
pub(crate) const PROGRAMS: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// The pinned module file the binaries are built from; the version comes from here, so
/// the script and the harness cannot disagree.
const GO_MOD: &str = include_str!("../go/go.mod");

/// The Kubernetes version the harness is built for (`v1.34.4`).
pub fn kubernetes_version() -> &'static str {
    GO_MOD
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
        .map(str::trim)
        .expect("e2e/controlplane/go/go.mod requires k8s.io/kubernetes")
}

/// The folder holding etcd, kube-apiserver, kube-controller-manager and kubectl.
#[derive(Debug, Clone)]
pub struct Assets {
    pub dir: PathBuf,
}

impl Assets {
    /// `RINGLB_K8S_ASSETS`, then `KUBEBUILDER_ASSETS` (envtest's variable), then the
    /// build script's cache folder. The first that holds every program wins.
    pub fn find() -> Result<Assets, Error> {
        let mut searched = Vec::new();
        for var in ["RINGLB_K8S_ASSETS", "KUBEBUILDER_ASSETS"] {
            if let Some(dir) = std::env::var_os(var) {
                let dir = PathBuf::from(dir);
                if complete(&dir) {
                    return Ok(Assets { dir });
                }
                searched.push(format!("{var}={}", dir.display()));
            }
        }
        let dir = default_dir();
        if complete(&dir) {
            return Ok(Assets { dir });
        }
        searched.push(dir.display().to_string());
        Err(Error::MissingAssets {
            searched: searched.join(", "),
        })
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn kubectl(&self) -> PathBuf {
        self.bin("kubectl")
    }

    /// helm, which the build script puts beside the control plane (an envtest folder
    /// named by `KUBEBUILDER_ASSETS` may not have it).
    pub fn helm(&self) -> Option<PathBuf> {
        Some(self.bin("helm")).filter(|p| p.is_file())
    }
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/ringlb/k8s-<version>`, as the build script writes.
pub(crate) fn default_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    cache
        .join("ringlb")
        .join(format!("k8s-{}", kubernetes_version()))
}

fn complete(dir: &Path) -> bool {
    PROGRAMS.iter().all(|p| dir.join(p).is_file())
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_comes_from_go_mod() {
        let v = super::kubernetes_version();
        assert!(v.starts_with("v1."), "{v}");
    }
}
