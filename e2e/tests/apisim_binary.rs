//! The `ringlb-apisim` program: starts, writes a kubeconfig that kube-rs can use,
//! stops on SIGTERM, and refuses bad flags with a clear message.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

/// Kills the child on drop (also when an assertion fails).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A temporary directory removed on drop (also when an assertion fails).
struct TmpDir(std::path::PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(tag: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("ringlb-apisim-bin-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

#[tokio::test]
async fn program_serves_through_its_kubeconfig_and_stops_on_sigterm() {
    let dir = tmpdir("run");
    let kc = dir.0.join("kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_ringlb-apisim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "warn",
            "--kubeconfig-out",
        ])
        .arg(&kc)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut proc = Proc(child);
    let t = Instant::now();
    while !kc.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no kubeconfig written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kc).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let names: Vec<String> = Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");
    // SIGTERM: a clean exit
    let pid = proc.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let t = Instant::now();
    let status = loop {
        if let Some(s) = proc.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn bad_flags_are_refused_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlb-apisim"))
        .args([
            "--kubeconfig-out",
            "/nonexistent/x",
            "--service-cidrs",
            "not-a-cidr",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--service-cidrs") && err.contains("not-a-cidr"),
        "{err}"
    );
}
