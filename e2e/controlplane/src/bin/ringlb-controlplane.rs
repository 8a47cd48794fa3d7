//! ringlb-controlplane: the tests' control plane (etcd, kube-apiserver,
//! kube-controller-manager; [`ringlb_controlplane::ControlPlane`],
//! docs/controlplane.md) as a daemon, for a script that needs a real API server
//! outside a test (scripts/first-install.sh).
//!
//! ```text
//! ringlb-controlplane DIR [--crds]
//! ```
//!
//! Starts it, writes `DIR/kubeconfig` (the admin, `system:masters`), then `DIR/ready`
//! (the API server's URL), and runs until SIGTERM or SIGINT; then every process is
//! stopped and its temporary folder removed (the control plane's drop). Without
//! `--crds` the cluster has no ringlb CRDs, as a new cluster: `helm install` brings
//! them. `$TMPDIR` picks where the temporary folder goes.

use std::path::PathBuf;
use std::process::ExitCode;

use ringlb_controlplane::{ControlPlane, Options};
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: ringlb-controlplane DIR [--crds]";

fn parse() -> Result<(PathBuf, bool), String> {
    let mut dir = None;
    let mut crds = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--crds" => crds = true,
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with('-') => return Err(format!("unknown flag {s}; {USAGE}")),
            _ if dir.is_some() => return Err(format!("one DIR only; {USAGE}")),
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    Ok((dir.ok_or(USAGE)?, crds))
}

async fn run(dir: PathBuf, crds: bool) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let cp = ControlPlane::start(Options {
        install_crds: crds,
        ..Options::default()
    })
    .await
    .map_err(|e| format!("starting the control plane: {e}"))?;
    let write = |name: &str, text: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))
    };
    let kubeconfig = std::fs::read(cp.kubeconfig_path()).map_err(|e| e.to_string())?;
    write("kubeconfig", &kubeconfig)?;
    write("ready", format!("{}\n", cp.url()).as_bytes())?;
    println!(
        "ringlb-controlplane: {} ready ({})",
        cp.url(),
        cp.dir().display()
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    println!("ringlb-controlplane: stopping");
    drop(cp);
    Ok(())
}

fn main() -> ExitCode {
    let (dir, crds) = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringlb-controlplane: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(dir, crds)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlb-controlplane: {e}");
            ExitCode::FAILURE
        }
    }
}
