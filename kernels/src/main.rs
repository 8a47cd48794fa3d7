//! `kernel-matrix`: boots Debian kernels under qemu and runs the XDP and tc BPF
//! tests inside each; prints a kernel × test table and fails on any unexpected
//! failure. See docs/kernels.md.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::Parser;
use ringlb_kernels::{Plan, catalog, qemu::BootOptions};

#[derive(Parser)]
#[command(name = "kernel-matrix", about)]
struct Args {
    /// Kernels to boot: a line (5.10, 6.1, 6.12, newest) or a linux-image-* package.
    /// Default: 5.10, 6.1, 6.12, newest.
    #[arg(long = "kernel", short = 'k')]
    kernels: Vec<String>,
    /// Test executables to run (default: all of them).
    #[arg(long = "test", short = 't')]
    tests: Vec<String>,
    /// Kernels and apt state kept between runs.
    #[arg(long, env = "RINGLB_KERNEL_CACHE")]
    cache: Option<PathBuf>,
    /// Images, consoles, results and report.md of this run.
    #[arg(long, default_value = "target/kernel-matrix")]
    out: PathBuf,
    /// Guests booted at once (default: all).
    #[arg(long)]
    jobs: Option<usize>,
    /// qemu accelerator: tcg, or kvm where the host's KVM boots stock kernels.
    #[arg(long, default_value = "tcg")]
    accel: String,
    #[arg(long, default_value_t = 2048)]
    memory_mb: u32,
    #[arg(long, default_value_t = 2)]
    smp: u32,
    /// Seconds a guest may take from boot to power-off (the slowest, 5.10, took
    /// 474 s with four guests on two busy cores).
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
    /// Seconds one test executable may take inside a guest (xdp_conntrack took
    /// up to 423 s on 5.10 in CI until its SYN flood, 163,840 test runs, kept
    /// the program in the XDP dispatcher; 87 s since, docs/kernels.md).
    #[arg(long, default_value_t = 600)]
    test_timeout: u64,
    /// apt-get update the private lists even if they are recent.
    #[arg(long)]
    refresh: bool,
    /// Run this benchmark program of ringlb-bench (release build) in each guest
    /// instead of the tests, e.g. ipvs-bench; prints its report per kernel.
    #[arg(long, conflicts_with = "tests")]
    bench: Option<String>,
    /// The benchmark's arguments.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    bench_args: String,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let kernels = if a.kernels.is_empty() {
        catalog::DEFAULT.iter().map(|s| s.to_string()).collect()
    } else {
        a.kernels
    };
    let plan = Plan {
        jobs: a.jobs.unwrap_or(kernels.len()),
        kernels,
        cache: a.cache.unwrap_or_else(ringlb_kernels::default_cache),
        // absolute: cpio and qemu run in other directories
        out: std::path::absolute(&a.out).unwrap_or(a.out),
        workspace: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        boot: BootOptions {
            accel: a.accel,
            memory_mb: a.memory_mb,
            smp: a.smp,
            timeout: Duration::from_secs(a.timeout),
            test_timeout: Duration::from_secs(a.test_timeout),
            tests: match &a.bench {
                Some(b) => vec![b.clone()],
                None => a.tests,
            },
            extra_initrd: Vec::new(),
            qemu_args: Vec::new(),
        },
        refresh: a.refresh,
        bench: a.bench.map(|b| (b, a.bench_args)),
    };
    match ringlb_kernels::run(&plan) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("kernel-matrix: {e:#}");
            ExitCode::from(2)
        }
    }
}
