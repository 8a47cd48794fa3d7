//! Compiles the BPF C programs in `bpf/` with clang into OUT_DIR; the loader
//! embeds the objects with aya's `include_bytes_aligned!`.

use std::{env, path::PathBuf, process::Command};

use anyhow::{Context, bail};

/// Every header the programs include: a change to any of them rebuilds all.
const HEADERS: &[&str] = &["bpf/abi.h", "bpf/parse.h", "bpf/flow_hash.h"];

/// (source, object name, extra -D flags)
const OBJECTS: &[(&str, &str, &[&str])] = &[
    ("bpf/xdp_lb.bpf.c", "xdp_lb.o", &[]),
    // benchmark-only builds (never attached): see the header of xdp_lb.bpf.c
    (
        "bpf/xdp_lb.bpf.c",
        "xdp_lb_bench.o",
        &["-DRINGLB_BENCH_RESTORE"],
    ),
    (
        "bpf/xdp_lb.bpf.c",
        "xdp_lb_bench_miss.o",
        &["-DRINGLB_BENCH_RESTORE", "-DRINGLB_BENCH_NO_CT_INSERT"],
    ),
    ("bpf/xdp_floor.bpf.c", "xdp_floor.o", &[]),
    ("bpf/tc_decap.bpf.c", "tc_decap.o", &[]),
];

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR").context("OUT_DIR not set")?);
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=CLANG");
    for h in HEADERS {
        println!("cargo:rerun-if-changed={h}");
    }
    for (src, obj, defs) in OBJECTS {
        println!("cargo:rerun-if-changed={src}");
        let dst = out.join(obj);
        let result = Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
            .args(["-I/usr/include/x86_64-linux-gnu", "-Ibpf"])
            .args(*defs)
            .arg("-c")
            .arg(src)
            .arg("-o")
            .arg(&dst)
            .output();
        let output = match result {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "`{clang}` not found: the BPF programs in edge-lb/bpf need clang \
                 (and libbpf-dev for <bpf/bpf_helpers.h>); run `scripts/setup.sh` \
                 (or `make setup`) as root"
            ),
            Err(e) => return Err(e).with_context(|| format!("running {clang}")),
        };
        if !output.status.success() {
            bail!(
                "clang failed on {src} ({obj}):\n{}\n(missing <bpf/bpf_helpers.h> or \
                 <asm/types.h>? run `scripts/setup.sh` to install libbpf-dev)",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    Ok(())
}
