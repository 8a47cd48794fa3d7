//! The test executables that run inside each guest, built on the host with
//! `cargo test --no-run` (the BPF objects are embedded in them).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// (package, test target): the BPF_PROG_TEST_RUN fixtures (exact bytes), then
/// real traffic in namespaces, then the real-VLAN next-hop resolver, then the
/// IPVS datapath against the kernel's IPVS (read-back, then real TCP).
pub const TESTS: &[(&str, &str)] = &[
    ("ringlb-xdp", "xdp_fixtures"),
    ("ringlb-xdp", "xdp_vlan"),
    ("ringlb-xdp", "xdp_ptb"),
    ("ringlb-xdp", "xdp_conntrack"),
    ("ringlb-xdp", "xdp_failover"),
    ("ringlb-xdp", "xdp_bfd_hold"),
    ("ringlb-node", "node_fixtures"),
    ("ringlb-node", "node_icmp"),
    ("ringlb-node", "kernel_floor"),
    ("ringlb-xdp", "xdp_netns"),
    ("ringlb-xdp", "xdp_netns_failover"),
    ("ringlb-node", "node_netns"),
    ("ringlb-xdp", "nexthop_netlink"),
    ("ringlb-ipvs", "ipvs_kernel"),
    ("ringlb-ipvs", "ipvs_netns"),
];

/// Test executables named by their target, from cargo's JSON messages.
pub fn executables(json_lines: &str) -> Vec<(String, PathBuf)> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter_map(|v| {
            let exe = v["executable"].as_str()?;
            Some((
                v["target"]["name"].as_str()?.to_string(),
                PathBuf::from(exe),
            ))
        })
        .collect()
}

/// Builds `wanted` (target names; empty = all of [`TESTS`]) in `workspace`; their
/// paths, in [`TESTS`] order.
pub fn build(workspace: &Path, wanted: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let chosen: Vec<&(&str, &str)> = TESTS
        .iter()
        .filter(|(_, t)| wanted.is_empty() || wanted.iter().any(|w| w == t))
        .collect();
    if chosen.is_empty() {
        bail!("no test target among {wanted:?}; known: {TESTS:?}");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    // The whole matrix takes its executables from the workspace's test build
    // (`cargo test --no-run --workspace`, what `make test`'s unit step builds), so
    // after that step nothing is compiled again: cargo unifies dependency features
    // over the packages it builds, and `-p` per package made it rebuild tokio,
    // serde and others with another feature set. A chosen subset (`-t`) builds
    // only those targets.
    cmd.args([
        "test",
        "--no-run",
        "--workspace",
        "--message-format=json-render-diagnostics",
    ])
    .current_dir(workspace)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for name in cargo_run_vars(std::env::vars().map(|(k, _)| k)) {
        cmd.env_remove(name);
    }
    if !wanted.is_empty() {
        for (_, t) in &chosen {
            cmd.args(["--test", t]);
        }
    }
    eprintln!("kernel-matrix: building the test executables");
    let out = cmd.output().context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed");
    }
    let built = executables(&String::from_utf8_lossy(&out.stdout));
    chosen
        .iter()
        .map(|(_, t)| {
            built
                .iter()
                .find(|(n, _)| n == t)
                .cloned()
                .with_context(|| format!("cargo built no executable for {t}"))
        })
        .collect()
}

/// The variables `cargo run` sets for the program it runs (`CARGO_PKG_NAME`,
/// `CARGO_MANIFEST_DIR`, ...), among `names`. A cargo started with them in its
/// environment sees build scripts that declare them (`ring` does) as dirty and
/// rebuilds them and everything above them, so they are taken out first.
fn cargo_run_vars(names: impl Iterator<Item = String>) -> Vec<String> {
    const PREFIXES: &[&str] = &[
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
    ];
    names
        .filter(|n| {
            PREFIXES.iter().any(|p| n.starts_with(p))
                || n == "CARGO_PRIMARY_PACKAGE"
                || n == "OUT_DIR"
        })
        .collect()
}

/// Builds the benchmark program `name` of `ringlb-bench` (release: its figures
/// are what it is for); its path.
pub fn build_bench(workspace: &Path, name: &str) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("kernel-matrix: building the benchmark {name} (release)");
    let out = Command::new(cargo)
        .args(["build", "--release", "-p", "ringlb-bench", "--bin", name])
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .context("cargo build --release -p ringlb-bench")?;
    if !out.status.success() {
        bail!("cargo build of the benchmark {name} failed");
    }
    bench_executable(&String::from_utf8_lossy(&out.stdout), name)
        .with_context(|| format!("cargo built no binary named {name} in ringlb-bench"))
}

/// The binary `name` among cargo's JSON messages.
pub fn bench_executable(json_lines: &str, name: &str) -> Option<PathBuf> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == name)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_variables_of_cargo_run_are_taken_out_and_cargos_own_kept() {
        let names = [
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "OUT_DIR",
            "CARGO_HOME",
            "CARGO",
            "CARGO_TARGET_DIR",
            "PATH",
        ];
        let out = super::cargo_run_vars(names.iter().map(|n| n.to_string()));
        assert_eq!(out, ["CARGO_PKG_NAME", "CARGO_MANIFEST_DIR", "OUT_DIR"]);
    }

    use super::*;

    #[test]
    fn test_executables_come_from_compiler_artifacts() {
        let json = r#"{"reason":"compiler-artifact","target":{"name":"ringlb_xdp","kind":["lib"]},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","target":{"name":"xdp_fixtures","kind":["test"]},"profile":{"test":true},"executable":"/t/debug/deps/xdp_fixtures-2e7a"}
{"reason":"build-finished","success":true}
not json"#;
        assert_eq!(
            bench_executable(json, "xdp_fixtures"),
            Some(PathBuf::from("/t/debug/deps/xdp_fixtures-2e7a"))
        );
        assert_eq!(bench_executable(json, "ringlb_xdp"), None);
        assert_eq!(
            executables(json),
            [(
                "xdp_fixtures".to_string(),
                PathBuf::from("/t/debug/deps/xdp_fixtures-2e7a")
            )]
        );
    }
}
