//! What the benchmark programs read of a process under /proc.

/// A `kB` field of `/proc/<pid>/status` (`VmHWM:`, `VmRSS:`), in KiB.
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The descendants of `root` (children, their children, ...) whose command name
/// (`/proc/<pid>/comm`, at most 15 bytes) is `comm`.
pub fn descendants_named(root: u32, comm: &str) -> Vec<u32> {
    // (pid, parent, name) of every process
    let procs: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (open, close) = (stat.find('(')?, stat.rfind(')')?);
            let ppid = stat[close + 2..].split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid, stat[open + 1..close].to_string()))
        })
        .collect();
    let mut family = vec![root];
    let mut i = 0;
    while let Some(&p) = family.get(i) {
        family.extend(procs.iter().filter(|c| c.1 == p).map(|c| c.0));
        i += 1;
    }
    procs
        .iter()
        .filter(|(pid, _, name)| name == comm && *pid != root && family.contains(pid))
        .map(|p| p.0)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_peak_rss_and_cpu_time() {
        let me = std::process::id();
        assert!(super::status_kb(me, "VmHWM:").is_some_and(|k| k > 0));
        assert!(super::status_kb(me, "NoSuchField:").is_none());
        assert!(super::cpu_seconds(me).is_some());
    }

    #[test]
    fn a_child_is_found_by_its_name_and_only_below_its_root() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let found = super::descendants_named(me, "sleep");
        let elsewhere = super::descendants_named(child.id(), "sleep");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, [child.id()]);
        assert!(elsewhere.is_empty(), "{elsewhere:?}");
    }
}
