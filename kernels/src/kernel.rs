//! A kernel ready to boot, from the cache or made once: its packages downloaded
//! (kept, compressed, so a change of the module list needs no download), then
//! unpacked to a scratch directory only long enough to take `vmlinuz` and build
//! the modules archive.
//!
//! ```text
//! <cache>/apt/                 private apt configuration, lists, downloads
//! <cache>/<abi>/debs/*.deb     the kernel's packages
//! <cache>/<abi>/vmlinuz
//! <cache>/<abi>/modules.cpio   + modules.stamp (the module list it was built for)
//! ```

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{apt::Apt, catalog, initramfs};

/// A bootable kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// What the report calls it ("6.1", or the package name given).
    pub label: String,
    /// The ABI name: `linux-image-<abi>`.
    pub abi: String,
    pub vmlinuz: PathBuf,
    pub modules: PathBuf,
}

/// The packages for a `--kernel` argument: a line label from the catalog or a
/// `linux-image-...` package name.
pub fn packages(apt: &Apt, which: &str) -> Result<Vec<String>> {
    if let Some(line) = catalog::line(which) {
        apt.resolve(line)
    } else if which.starts_with("linux-image-") {
        apt.packages_of(which)
    } else {
        let labels: Vec<&str> = catalog::LINES.iter().map(|l| l.label).collect();
        bail!("unknown kernel {which:?}: one of {labels:?} or a linux-image-* package")
    }
}

/// Makes (or reuses) `<cache>/<abi>/` for the kernel made of `pkgs`.
pub fn prepare(apt: &Apt, cache: &Path, label: &str, pkgs: &[String]) -> Result<Kernel> {
    let abi = pkgs[0].trim_start_matches("linux-image-").to_string();
    let dir = cache.join(&abi);
    let k = Kernel {
        label: label.to_string(),
        abi: abi.clone(),
        vmlinuz: dir.join("vmlinuz"),
        modules: dir.join("modules.cpio"),
    };
    let stamp = dir.join("modules.stamp");
    let want = initramfs::MODULES.join(" ");
    if k.vmlinuz.exists()
        && k.modules.exists()
        && fs::read_to_string(&stamp).is_ok_and(|s| s == want)
    {
        return Ok(k);
    }
    let debs = apt.download(pkgs, &dir.join("debs"))?;
    let (x, stage) = (dir.join("x"), dir.join("stage"));
    let built = unpack_and_build(&k, &debs, &x, &stage);
    // the unpacked tree is ~0.5 GB: never leave it behind, also on failure
    let _ = fs::remove_dir_all(&x);
    let _ = fs::remove_dir_all(&stage);
    built?;
    fs::write(&stamp, want)?;
    Ok(k)
}

/// Unpacks the packages into `x` and takes `vmlinuz` and the modules archive.
fn unpack_and_build(k: &Kernel, debs: &[PathBuf], x: &Path, stage: &Path) -> Result<()> {
    let abi = &k.abi;
    if x.exists() {
        fs::remove_dir_all(x)?;
    }
    fs::create_dir_all(x)?;
    for d in debs {
        let st = Command::new("dpkg-deb").arg("-x").arg(d).arg(x).status()?;
        if !st.success() {
            bail!("dpkg-deb -x {}", d.display());
        }
    }
    // up to 6.15: lib/modules/<kver> and boot/vmlinuz-<kver>; later: usr/lib/modules/<kver>/vmlinuz
    let modbase = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| x.join(m))
        .find(|m| m.is_dir())
        .with_context(|| format!("{abi}: no lib/modules in the packages"))?;
    let kver = fs::read_dir(&modbase)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .with_context(|| format!("{abi}: empty {}", modbase.display()))?;
    let vmlinuz = [
        x.join(format!("boot/vmlinuz-{kver}")),
        modbase.join(&kver).join("vmlinuz"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .with_context(|| format!("{abi}: no vmlinuz"))?;
    fs::copy(&vmlinuz, &k.vmlinuz)?;
    let held = initramfs::build_modules(stage, &modbase, &kver, initramfs::MODULES, &k.modules)?;
    eprintln!("kernel-matrix: {abi}: modules {}", held.join(" "));
    Ok(())
}
