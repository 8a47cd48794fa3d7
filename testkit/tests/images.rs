//! The container images (docs/images.md).
//! - Always: the names and tag the build produces are the chart's defaults, and
//!   images/Dockerfile labels each image with the workspace version and the licence
//!   of its program (docs/operating.md, "Licences").
//! - With `RINGLB_IMAGES=1`, after `make images` (scripts/build-images.sh): each OCI
//!   layout under images/out/oci (or `$RINGLB_IMAGES_OUT/oci`) is re-read from scratch: every blob re-hashed and
//!   sized, every layer's uncompressed digest equal to the config's diff_id, the
//!   tag, user, entrypoint and licence label as the Dockerfile sets them. The
//!   build script has already run each program inside its unpacked image.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const REGISTRY: &str = "ghcr.io/ringlb";
/// Program, user, licence label: as images/Dockerfile's stages set them.
const IMAGES: &[(&str, &str, &str)] = &[
    ("ringlb-controller", "65532:65532", "Apache-2.0"),
    ("ringlb-edge", "0:0", "GPL-3.0-only"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where scripts/build-images.sh writes (`RINGLB_IMAGES_OUT`, as the script reads it).
fn out_dir() -> PathBuf {
    std::env::var_os("RINGLB_IMAGES_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("images/out"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn workspace_version() -> String {
    let toml = read(&root().join("Cargo.toml"));
    let line = toml
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find(|l| l.starts_with("version"))
        .expect("[workspace.package] version");
    line.split('"').nth(1).unwrap().to_string()
}

#[test]
fn names_and_tags_are_the_charts_defaults() {
    let version = workspace_version();
    let chart = read(&root().join("charts/ringlb/Chart.yaml"));
    assert!(
        chart
            .lines()
            .any(|l| l.trim() == format!("appVersion: \"{version}\"")),
        "charts/ringlb/Chart.yaml appVersion must be the workspace version {version}: \
         the images are tagged with it"
    );
    let dockerfile = read(&root().join("images/Dockerfile"));
    for (program, _, licence) in IMAGES {
        let stage = dockerfile
            .split("\nFROM ")
            .find(|s| s.contains(&format!(" AS {program}\n")))
            .unwrap_or_else(|| panic!("images/Dockerfile: no stage `AS {program}`"));
        for label in [
            format!("org.opencontainers.image.version=\"{version}\""),
            format!("org.opencontainers.image.licenses=\"{licence}\""),
        ] {
            assert!(
                stage.contains(&label),
                "images/Dockerfile, {program}: no {label}"
            );
        }
    }
    // The chart is written beside this work; once it has values, they must name
    // what scripts/build-images.sh produces.
    let values = root().join("charts/ringlb/values.yaml");
    if values.exists() {
        let values = read(&values);
        for (program, _, _) in IMAGES {
            let repo = format!("{REGISTRY}/{program}");
            assert!(
                values.contains(&repo),
                "charts/ringlb/values.yaml: no {repo}"
            );
        }
    }
}

fn sha256(path: &Path, gunzip: bool) -> String {
    let cmd = if gunzip {
        format!("gzip -dc '{}' | sha256sum", path.display())
    } else {
        format!("sha256sum '{}'", path.display())
    };
    let out = Command::new("sh")
        .args(["-c", &cmd])
        .stderr(Stdio::inherit())
        .output()
        .expect("sha256sum");
    assert!(out.status.success(), "{cmd}");
    let hex = String::from_utf8(out.stdout).unwrap();
    format!("sha256:{}", hex.split_whitespace().next().unwrap())
}

/// Reads the blob a descriptor names, after checking its digest and size.
fn blob(layout: &Path, desc: &Value) -> PathBuf {
    let digest = desc["digest"].as_str().unwrap();
    let path = layout.join("blobs").join(digest.replacen(':', "/", 1));
    assert_eq!(sha256(&path, false), digest, "{}", path.display());
    let size = std::fs::metadata(&path).unwrap().len();
    assert_eq!(Some(size), desc["size"].as_u64(), "{}", path.display());
    path
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&read(path)).unwrap()
}

fn check_layout(program: &str, user: &str, licence: &str, version: &str) {
    let layout = out_dir().join("oci").join(program);
    assert!(
        layout.join("index.json").exists(),
        "{}: not built; run `make images` first",
        layout.display()
    );
    assert_eq!(
        json(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    let desc = manifests
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == version)
        .unwrap_or_else(|| panic!("{program}: no tag {version} in index.json"));
    assert_eq!(
        desc["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let manifest = json(&blob(&layout, desc));
    let config = json(&blob(&layout, &manifest["config"]));
    let layers = manifest["layers"].as_array().unwrap();
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "{program}: base + program layers");
    assert_eq!(layers.len(), diff_ids.len());
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let path = blob(&layout, layer);
        assert_eq!(sha256(&path, true), diff_id.as_str().unwrap(), "{program}");
    }
    let c = &config["config"];
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(c["User"], user, "{program}");
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!([format!("/usr/local/bin/{program}")])
    );
    assert_eq!(c["Labels"]["org.opencontainers.image.licenses"], licence);
    assert_eq!(c["Labels"]["org.opencontainers.image.version"], version);
    let archive = out_dir().join(format!("{program}-{version}.tar"));
    assert!(archive.exists(), "{}", archive.display());
}

#[test]
fn built_oci_layouts_are_sound() {
    if std::env::var_os("RINGLB_IMAGES").is_none() {
        eprintln!(
            "SKIPPED: set RINGLB_IMAGES=1 after `make images` to check the built OCI layouts"
        );
        return;
    }
    let version = workspace_version();
    for (program, user, licence) in IMAGES {
        check_layout(program, user, licence, &version);
    }
}
