//! Network namespaces, veth pairs and bridges, with Drop-guard cleanup.
//!
//! Every namespace is named `<prefix>-<role>`; the prefix is unique per lab (tests put
//! the process id in it), so [`teardown_prefix`] can find and remove exactly one lab's
//! namespaces, also the leftovers of an interrupted run.

use std::time::{Duration, Instant};

use super::Result;
use super::cmd::{run, sysctl};

/// A network namespace, deleted (with every process inside it) on drop unless
/// [`Netns::keep`] was called.
#[derive(Debug)]
pub struct Netns {
    name: String,
    keep: bool,
}

impl Netns {
    /// Creates `name` (removing a leftover of the same name first) with `lo` up.
    pub fn create(name: &str) -> Result<Netns> {
        if exists(name) {
            delete(name);
        }
        run(&["ip", "netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
            keep: false,
        };
        run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Leaves the namespace in place when this guard drops (`ringlb-lab up`).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.keep {
            delete(&self.name);
        }
    }
}

/// Names of the existing namespaces.
pub fn list() -> Vec<String> {
    run(&["ip", "netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn exists(name: &str) -> bool {
    list().iter().any(|n| n == name)
}

/// PIDs of the processes running in namespace `name`.
pub fn pids(name: &str) -> Vec<u32> {
    run(&["ip", "netns", "pids", name])
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

pub use super::daemon::signal;

/// Stops every process in `name` (TERM, then KILL after a second) and deletes it.
pub fn delete(name: &str) {
    let before = pids(name);
    for p in &before {
        signal(*p, "TERM");
    }
    let until = Instant::now() + Duration::from_secs(2);
    while !pids(name).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in pids(name) {
        signal(p, "KILL");
    }
    let _ = run(&["ip", "netns", "del", name]);
}

/// Deletes every namespace named `<prefix>-*` (and the processes in it).
pub fn teardown_prefix(prefix: &str) -> Vec<String> {
    let mine: Vec<String> = list()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    for n in &mine {
        delete(n);
    }
    mine
}

/// A veth pair: `a` in `a_ns`, `b` in `b_ns`, both up with `mtu`.
pub fn veth(a_ns: &str, a: &str, b_ns: &str, b: &str, mtu: u32) -> Result<()> {
    let mtu = mtu.to_string();
    run(&[
        "ip", "-n", a_ns, "link", "add", "name", a, "mtu", &mtu, "type", "veth", "peer", "name", b,
        "mtu", &mtu, "netns", b_ns,
    ])?;
    run(&["ip", "-n", a_ns, "link", "set", a, "up"])?;
    run(&["ip", "-n", b_ns, "link", "set", b, "up"])?;
    Ok(())
}

/// Adds `cidr` to `dev` in `ns`.
pub fn addr(ns: &str, dev: &str, cidr: &str) -> Result<()> {
    run(&["ip", "-n", ns, "addr", "add", cidr, "dev", dev]).map(|_| ())
}

/// A bridge `br` in `ns` with address `cidr`, `mtu`, and `ports` enslaved.
pub fn bridge(ns: &str, br: &str, cidr: &str, mtu: u32, ports: &[&str]) -> Result<()> {
    run(&[
        "ip",
        "-n",
        ns,
        "link",
        "add",
        "name",
        br,
        "mtu",
        &mtu.to_string(),
        "type",
        "bridge",
    ])?;
    for p in ports {
        run(&["ip", "-n", ns, "link", "set", p, "master", br])?;
    }
    run(&["ip", "-n", ns, "link", "set", br, "up"])?;
    addr(ns, br, cidr)
}

/// A default route in `ns` via `gw`.
pub fn default_route(ns: &str, gw: &str) -> Result<()> {
    run(&["ip", "-n", ns, "route", "add", "default", "via", gw]).map(|_| ())
}

/// Sets several sysctls in `ns`.
pub fn sysctls(ns: &str, kvs: &[&str]) -> Result<()> {
    for kv in kvs {
        sysctl(ns, kv)?;
    }
    Ok(())
}

/// Attaches the test kit's `ringlb_pass` program (in object file `obj`) natively to
/// `dev` in `ns`: a native XDP_TX frame only reaches a veth peer that runs an XDP
/// program.
pub fn xdp_pass(ns: &str, dev: &str, obj: &str) -> Result<()> {
    run(&[
        "ip",
        "-n",
        ns,
        "link",
        "set",
        "dev",
        dev,
        "xdpdrv",
        "obj",
        obj,
        "program",
        "ringlb_pass",
    ])
    .map(|_| ())
}
