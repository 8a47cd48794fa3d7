//! What the chart tests share: helm and kubectl runs, rendering, the control plane.
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ringlb_e2e::controlplane::{Assets, ControlPlane, Options, chart_dir};
use serde_json::Value;

pub(crate) const RELEASE: &str = "ringlb";
pub(crate) const NS: &str = "ringlb-system";

pub(crate) fn example_values() -> PathBuf {
    chart_dir().join("examples/values-lab.yaml")
}

pub(crate) fn helm_path() -> PathBuf {
    let assets = Assets::find().unwrap_or_else(|e| panic!("{e}"));
    assets
        .helm()
        .unwrap_or_else(|| panic!("no helm in {}: run `make k8s`", assets.dir.display()))
}

/// helm with its config, cache and data in `home` (never the user's ~/.config/helm).
pub(crate) fn helm(home: &Path) -> Command {
    let mut cmd = Command::new(helm_path());
    for (var, sub) in [
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, home.join("helm").join(sub));
    }
    cmd
}

/// Runs `cmd` with `stdin`: (succeeded, stdout, stderr).
pub(crate) fn run(mut cmd: Command, stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("the command finishes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template ringlb charts/ringlb -n ringlb-system ARGS`: Ok(yaml) or Err(stderr).
pub(crate) fn template(args: &[&str]) -> Result<String, String> {
    let home = std::env::temp_dir();
    let mut cmd = helm(&home);
    cmd.args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NS])
        .args(args);
    match run(cmd, "") {
        (true, out, _) => Ok(out),
        (false, _, err) => Err(err),
    }
}

pub(crate) fn template_ok(args: &[&str]) -> String {
    template(args).unwrap_or_else(|e| panic!("helm template {args:?}: {e}"))
}

/// The objects of a multi-document YAML stream (empty documents left out).
pub(crate) fn docs(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML parses"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

pub(crate) fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

// ---------------------------------------------------------------------------------
// The values table
// ---------------------------------------------------------------------------------

pub(crate) async fn control_plane(install_crds: bool) -> ControlPlane {
    ControlPlane::start(Options {
        install_crds,
        ..Options::default()
    })
    .await
    .expect("the control plane starts")
}

/// kubectl as the cluster admin, with `stdin`: (succeeded, stdout, stderr).
pub(crate) fn kubectl(cp: &ControlPlane, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut cmd = cp.kubectl();
    cmd.args(args);
    run(cmd, stdin)
}

/// helm as the cluster admin against `cp`.
pub(crate) fn helm_on(cp: &ControlPlane, args: &[&str]) -> String {
    let mut cmd = helm(cp.dir());
    cmd.arg("--kubeconfig").arg(cp.kubeconfig_path()).args(args);
    let (ok, out, err) = run(cmd, "");
    assert!(ok, "helm {args:?}:\n{out}{err}");
    out
}
