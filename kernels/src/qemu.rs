//! Booting one guest: qemu with two serial ports, the kernel console on the
//! first (kept as `console.log` for reading failures) and the framed results on
//! the second; a wall-clock limit; niced, since the host is shared.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::kernel::Kernel;

/// How guests are booted.
#[derive(Debug, Clone)]
pub struct BootOptions {
    /// `tcg` (software emulation; what stock kernels need here) or `kvm`.
    pub accel: String,
    pub memory_mb: u32,
    pub smp: u32,
    /// The whole guest, boot to power-off.
    pub timeout: Duration,
    /// Per test executable inside the guest.
    pub test_timeout: Duration,
    /// Test executables to run (empty: all in the image).
    pub tests: Vec<String>,
    /// More newc archives appended to the initramfs after the module archive
    /// (files of a scenario that are not test executables).
    pub extra_initrd: Vec<PathBuf>,
    /// More qemu arguments (a scenario's NIC; the matrix adds none).
    pub qemu_args: Vec<String>,
}

/// What a boot left behind.
pub struct Boot {
    pub results: String,
    pub console: PathBuf,
    pub wall: Duration,
    /// The guest did not power off within the limit.
    pub timed_out: bool,
}

/// The guest kernel's command line. `no_timer_check`: under TCG on a loaded host
/// the kernel's IO-APIC timer check can miss its ticks and panic at boot (the
/// panic "IO-APIC + timer doesn't work!", seen once in CI on 6.12); the check
/// proves nothing about an emulated PC.
pub fn cmdline(o: &BootOptions) -> String {
    let mut s = format!(
        "console=ttyS0 panic=-1 oops=panic quiet loglevel=3 no_timer_check ringlb_timeout={}",
        o.test_timeout.as_secs()
    );
    if !o.tests.is_empty() {
        s.push_str(&format!(" ringlb_tests={}", o.tests.join(",")));
    }
    s
}

/// Boots `k` with the common archive `common`; its files go under `dir`.
pub fn boot(k: &Kernel, common: &Path, dir: &Path, o: &BootOptions) -> Result<Boot> {
    fs::create_dir_all(dir)?;
    let initrd = dir.join("initrd.cpio");
    {
        let mut f = fs::File::create(&initrd)?;
        f.write_all(&fs::read(common)?)?;
        f.write_all(&fs::read(&k.modules)?)?;
        for extra in &o.extra_initrd {
            f.write_all(&fs::read(extra).with_context(|| extra.display().to_string())?)?;
        }
    }
    let (console, results) = (dir.join("console.log"), dir.join("results.txt"));
    let accel = match o.accel.as_str() {
        "kvm" => "kvm".to_string(),
        other => format!("{other},thread=multi"),
    };
    let start = Instant::now();
    let status = Command::new("nice")
        .args(["-n", "10", "timeout", "-k", "10"])
        .arg(o.timeout.as_secs().to_string())
        .arg("qemu-system-x86_64")
        .args(["-accel", &accel, "-cpu", "max"])
        .args(["-smp", &o.smp.to_string(), "-m", &o.memory_mb.to_string()])
        .args(["-display", "none", "-monitor", "none", "-nodefaults"])
        .args(["-no-reboot"])
        .args(&o.qemu_args)
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()))
        .arg("-kernel")
        .arg(&k.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", &cmdline(o)])
        .stdin(Stdio::null())
        .status()
        .context("qemu-system-x86_64 (scripts/kernel-setup.sh installs it)")?;
    let wall = start.elapsed();
    let _ = fs::remove_file(&initrd);
    Ok(Boot {
        results: String::from_utf8_lossy(&fs::read(&results).unwrap_or_default()).into_owned(),
        console,
        wall,
        timed_out: status.code() == Some(124) || status.code() == Some(137),
    })
}
