//! Shared by the benchmark programs (`#[path]`-included; not a library API):
//! a network namespace that is deleted again on drop, and running a command.

use std::process::Command;

use anyhow::{Context, bail};

/// A network namespace made for one benchmark run; deleted on drop (a
/// leftover of the same name from a killed run is deleted first).
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: String) -> anyhow::Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name])?;
        Ok(Netns(name))
    }

    /// Runs `args` inside the namespace; its stdout.
    #[allow(dead_code)] // not every benchmark program runs commands inside
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut v = vec!["ip", "netns", "exec", &self.0];
        v.extend_from_slice(args);
        sh(&v)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn sh(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("{args:?}"))?;
    if !out.status.success() {
        bail!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
