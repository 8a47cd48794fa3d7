//! Writes the CRD YAML (crds/ and the chart's crds/) and docs/crd-reference.md from the
//! Rust types. `crdgen --check` exits non-zero when a checked-in file differs.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

/// Generate ringlb's CRD YAML and CRD reference from the Rust types.
#[derive(Parser, Debug)]
#[command(name = "crdgen", version, about)]
struct Args {
    /// Repository root the generated paths are relative to.
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Do not write; fail if any generated file differs from what is on disk.
    #[arg(long)]
    check: bool,
    /// Print every CRD as one multi-document YAML stream on stdout instead.
    #[arg(long, conflicts_with = "check")]
    stdout: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.stdout {
        for crd in ringlb_crds::generate::crds() {
            print!("---\n{}", ringlb_crds::generate::yaml(&crd)?);
        }
        return Ok(());
    }
    let mut stale = Vec::new();
    for (rel, body) in ringlb_crds::generate::files()? {
        let path = args.root.join(&rel);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == body {
            continue;
        }
        if args.check {
            stale.push(rel);
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {rel}");
    }
    if !stale.is_empty() {
        anyhow::bail!("out of date (run `make crds`): {}", stale.join(", "));
    }
    Ok(())
}
