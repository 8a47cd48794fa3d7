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

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_peak_rss_and_cpu_time() {
        let me = std::process::id();
        assert!(super::status_kb(me, "VmHWM:").is_some_and(|k| k > 0));
        assert!(super::status_kb(me, "NoSuchField:").is_none());
        assert!(super::cpu_seconds(me).is_some());
    }
}
