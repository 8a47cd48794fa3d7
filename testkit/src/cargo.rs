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
    let mut all = vec!["metadata", "--format-version", "1", "--offline"];
    all.extend_from_slice(args);
    serde_json::from_slice(&cargo(&all)).expect("metadata JSON")
}

/// The output of `cargo ARGS...` run in the workspace root; panics, with its
/// stderr, when cargo fails.
pub fn cargo(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("cargo {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "cargo {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
