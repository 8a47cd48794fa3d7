//! The workspace as cargo sees it, for the tests that check the tree itself
//! (`tests/architecture.rs`, `tests/licenses.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cargo metadata --format-version 1 --offline ARGS...` of the workspace, parsed.
pub fn metadata(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}
