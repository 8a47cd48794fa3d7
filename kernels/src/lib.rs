//! The kernel test matrix: the XDP and tc BPF tests run inside stock Debian
//! kernels booted under qemu, one guest per kernel, in parallel.
//!
//! ```text
//!  apt (private config) --download--> <cache>/<abi>/{vmlinuz, modules.cpio}
//!  cargo test --no-run  --> common.cpio (busybox, ip, tc, iptables, tests, /init)
//!  per kernel: qemu -kernel vmlinuz -initrd common+modules
//!      ttyS0 -> console.log     ttyS1 -> results.txt --parse--> report table
//! ```
//! docs/kernels.md says how to run it and what it found.

pub mod apt;
pub mod catalog;
pub mod initramfs;
pub mod kernel;
pub mod qemu;
pub mod report;
pub mod testbins;

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::Instant,
};

use anyhow::{Context, Result};

use crate::{kernel::Kernel, qemu::BootOptions, report::GuestReport};

/// Where kernels are kept between runs: `$XDG_CACHE_HOME/ringlb/kernels`.
pub fn default_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("ringlb/kernels")
}

/// What one run of the matrix does.
pub struct Plan {
    pub kernels: Vec<String>,
    pub cache: PathBuf,
    pub out: PathBuf,
    pub workspace: PathBuf,
    pub boot: BootOptions,
    pub jobs: usize,
    pub refresh: bool,
    /// A benchmark of `ringlb-bench` to run instead of the tests: its name and
    /// arguments (`boot.tests` must name it).
    pub bench: Option<(String, String)>,
}

/// Fetches and prepares the kernels (sequentially: apt holds a lock).
pub fn prepare_kernels(plan: &Plan) -> Result<Vec<Kernel>> {
    let apt = apt::Apt::new(&plan.cache.join("apt"))?;
    apt.update(plan.refresh)?;
    let mut refreshed = plan.refresh;
    plan.kernels
        .iter()
        .map(|which| {
            let pkgs = kernel::packages(&apt, which)?;
            match kernel::prepare(&apt, &plan.cache, which, &pkgs) {
                // the archive drops a superseded build: lists older than it name
                // files it no longer has
                Err(e) if !refreshed => {
                    eprintln!("kernel-matrix: {which}: {e:#}; refreshing the lists");
                    refreshed = true;
                    apt.update(true)?;
                    let pkgs = kernel::packages(&apt, which)?;
                    kernel::prepare(&apt, &plan.cache, which, &pkgs)
                }
                r => r,
            }
            .with_context(|| format!("kernel {which}"))
        })
        .collect()
}

/// Boots every kernel (`plan.jobs` at a time) and parses what each reported.
pub fn run_guests(plan: &Plan, kernels: &[Kernel], common: &Path) -> Vec<(String, GuestReport)> {
    let queue = Mutex::new(kernels.iter().enumerate().rev().collect::<Vec<_>>());
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..plan.jobs.max(1) {
            s.spawn(|| {
                loop {
                    // the guard must not live across the boot
                    let next = queue.lock().unwrap().pop();
                    let Some((i, k)) = next else { break };
                    let dir = plan.out.join(&k.label);
                    let g = match boot_retrying_an_early_panic(k, common, &dir, &plan.boot) {
                        Ok(b) => {
                            eprintln!(
                                "kernel-matrix: {} ({}) finished in {:.1}s{}; console: {}",
                                k.label,
                                k.abi,
                                b.wall.as_secs_f64(),
                                if b.timed_out { " (TIMED OUT)" } else { "" },
                                b.console.display()
                            );
                            report::parse(&b.results)
                        }
                        Err(e) => {
                            eprintln!("kernel-matrix: {}: {e:#}", k.label);
                            GuestReport::default()
                        }
                    };
                    done.lock().unwrap().push((i, k.label.clone(), g));
                }
            });
        }
    });
    let mut v = done.into_inner().unwrap();
    v.sort_by_key(|(i, _, _)| *i);
    v.into_iter().map(|(_, l, g)| (l, g)).collect()
}

/// Boots `k`, and once more when its kernel panicked before the guest reported
/// anything: under TCG on a loaded host the boot itself can fail (the IO-APIC
/// timer check, before `no_timer_check`). A failing test always reports first,
/// so this never hides one. The first console is kept beside the second. The IPVS
/// lab in a VM (`ringlb-lab ipvs-vm`) boots through this too.
pub fn boot_retrying_an_early_panic(
    k: &Kernel,
    common: &Path,
    dir: &Path,
    o: &BootOptions,
) -> Result<qemu::Boot> {
    let b = qemu::boot(k, common, dir, o)?;
    if !b.results.trim().is_empty() || b.timed_out {
        return Ok(b);
    }
    let console = std::fs::read_to_string(&b.console).unwrap_or_default();
    let Some(panic) = console.lines().find(|l| l.contains("Kernel panic")) else {
        return Ok(b);
    };
    let first = dir.join("console-first-boot.log");
    std::fs::rename(&b.console, &first)?;
    eprintln!(
        "kernel-matrix: {} panicked while booting, before any test ({}); booting it once more (first console: {})",
        k.label,
        panic.trim(),
        first.display()
    );
    qemu::boot(k, common, dir, o)
}

/// A benchmark in each guest instead of the tests: its output per kernel on
/// stdout and in `bench.md`; true when it ran to the end with status 0 everywhere.
pub fn run_bench(plan: &Plan, name: &str, args: &str) -> Result<bool> {
    let kernels = prepare_kernels(plan)?;
    let exe = testbins::build_bench(&plan.workspace, name)?;
    std::fs::create_dir_all(&plan.out)?;
    let common = plan.out.join("common.cpio");
    let tests = [(name.to_string(), exe)];
    let args = [(name.to_string(), args.to_string())];
    initramfs::build_common(&plan.out.join("stage"), &tests, &args, &common)?;
    std::fs::remove_dir_all(plan.out.join("stage"))?;
    run_guests(plan, &kernels, &common);
    let mut all_ok = true;
    let mut md = String::new();
    for k in &kernels {
        let results = std::fs::read_to_string(plan.out.join(&k.label).join("results.txt"))
            .unwrap_or_default();
        let text = match report::section(&results, name) {
            Some((out, 0)) => out,
            Some((out, rc)) => {
                all_ok = false;
                format!("{out}\n(exit status {rc})\n")
            }
            None => {
                all_ok = false;
                "(did not finish; see console.log)\n".to_string()
            }
        };
        md.push_str(&format!("## {name} in {} ({})\n\n{text}\n", k.label, k.abi));
    }
    std::fs::write(plan.out.join("bench.md"), &md)?;
    println!("\n{md}");
    Ok(all_ok)
}

/// The whole matrix; true when nothing failed unexpectedly.
pub fn run(plan: &Plan) -> Result<bool> {
    if let Some((name, args)) = &plan.bench {
        return run_bench(plan, name, args);
    }
    let t0 = Instant::now();
    let kernels = prepare_kernels(plan)?;
    let t_kernels = t0.elapsed();
    let tests = testbins::build(&plan.workspace, &plan.boot.tests)?;
    std::fs::create_dir_all(&plan.out)?;
    let common = plan.out.join("common.cpio");
    initramfs::build_common(&plan.out.join("stage"), &tests, &[], &common)?;
    std::fs::remove_dir_all(plan.out.join("stage"))?;
    let t_built = t0.elapsed();
    let runs = run_guests(plan, &kernels, &common);
    let table = report::table(&runs);
    std::fs::write(plan.out.join("report.md"), &table)?;
    println!("\n{table}");
    for (label, g) in &runs {
        println!("{}", report::notes(label, g));
    }
    let n = report::totals(&runs);
    println!(
        "timings: kernels ready {:.0}s, tests built + image {:.0}s, guests {:.0}s, total {:.0}s",
        t_kernels.as_secs_f64(),
        (t_built - t_kernels).as_secs_f64(),
        (t0.elapsed() - t_built).as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    println!(
        "skipped: {} expected failures (report::EXPECTED), {} ignored; counted as failed: {} \
         tests that skipped themselves in a guest (a module or feature missing)",
        n.expected, n.skipped, n.self_skipped
    );
    print!("{}", report::failures(&runs));
    // the closing line CI reads
    println!(
        "kernels: {} passed, {} failed, {} skipped",
        n.passed,
        n.failed,
        n.expected + n.skipped
    );
    Ok(n.failed == 0)
}
