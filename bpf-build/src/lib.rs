//! The one place BPF C is compiled: every crate that embeds a BPF object calls
//! [`compile`] from its `build.rs` with an explicit file list, and the loader embeds
//! the objects with aya's `include_bytes_aligned!(concat!(env!("OUT_DIR"), ...))`.
//!
//! Debian's clang needs `-I/usr/include/x86_64-linux-gnu` for `<asm/types.h>`;
//! `CLANG` overrides the compiler. `-mcpu=v3` (32-bit ALU and jumps, kernel
//! 5.1+; every supported kernel has them): fewer instructions than v1, whose
//! 32-bit values take shifts to zero-extend (a new flow's SYN 268-302 ns
//! against 328-331 by method S, docs/bench-xdp.md), and the ISA that has
//! atomic OR (`xdp/bpf/flow_filter.h`).

use std::{env, path::PathBuf, process::Command};

use anyhow::{Context, bail};

/// One object to build.
pub struct Object<'a> {
    /// The C source, relative to the crate's manifest directory.
    pub source: &'a str,
    /// The object's file name in OUT_DIR.
    pub name: &'a str,
    /// Extra compiler flags (`-DNAME`).
    pub defines: &'a [&'a str],
}

/// Compiles `objects` into OUT_DIR. `headers` (paths relative to the crate) rebuild
/// every object when they change; `include_dirs` are searched for `"..."` includes.
pub fn compile(
    objects: &[Object<'_>],
    headers: &[&str],
    include_dirs: &[&str],
) -> anyhow::Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR").context("OUT_DIR not set")?);
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=CLANG");
    for h in headers {
        println!("cargo:rerun-if-changed={h}");
    }
    for o in objects {
        println!("cargo:rerun-if-changed={}", o.source);
        let result = Command::new(&clang)
            .args([
                "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-mcpu=v3",
            ])
            .arg("-I/usr/include/x86_64-linux-gnu")
            .args(include_dirs.iter().map(|d| format!("-I{d}")))
            .args(o.defines)
            .arg("-c")
            .arg(o.source)
            .arg("-o")
            .arg(out.join(o.name))
            .output();
        let output = match result {
            Ok(output) => output,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "`{clang}` not found: the BPF programs need clang (and libbpf-dev for \
                 <bpf/bpf_helpers.h>); run `scripts/setup.sh` (or `make setup`) as root"
            ),
            Err(e) => return Err(e).with_context(|| format!("running {clang}")),
        };
        if !output.status.success() {
            bail!(
                "clang failed on {} ({}):\n{}\n(missing <bpf/bpf_helpers.h> or \
                 <asm/types.h>? run `scripts/setup.sh` to install libbpf-dev)",
                o.source,
                o.name,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    Ok(())
}
