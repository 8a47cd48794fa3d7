//! Running programs, on the host or inside a lab namespace (`ip netns exec`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::{Error, Result};

// Whether the effective uid is 0: the test kit's check.
pub use ringlb_testkit::netns::is_root;

/// The full path of `tool` on PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn show(argv: &[&str]) -> String {
    argv.join(" ")
}

/// Runs `argv` with stdin closed; its stdout on success, an error with its stderr
/// otherwise.
pub fn run(argv: &[&str]) -> Result<String> {
    run_env(argv, &[])
}

/// [`run`] with extra environment variables.
pub fn run_env(argv: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| Error::Unsupported("empty command".into()))?;
    let out = Command::new(prog)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            cmd: show(argv),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            cmd: show(argv),
            status: out.status.to_string(),
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        })
    }
}

/// `ip netns exec NS argv...`
pub fn ns_argv<'a>(ns: &'a str, argv: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(argv);
    v
}

/// Runs `argv` inside network namespace `ns`.
pub fn run_in(ns: &str, argv: &[&str]) -> Result<String> {
    run(&ns_argv(ns, argv))
}

/// Runs `argv` inside `ns` with extra environment variables.
pub fn run_in_env(ns: &str, argv: &[&str], env: &[(&str, &str)]) -> Result<String> {
    run_env(&ns_argv(ns, argv), env)
}

/// `sysctl -qw key=value` inside `ns`.
pub fn sysctl(ns: &str, kv: &str) -> Result<()> {
    run_in(ns, &["sysctl", "-qw", kv]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_returns_stdout_and_reports_failures_with_stderr() {
        assert_eq!(run(&["echo", "hi"]).unwrap(), "hi\n");
        let e = run(&["sh", "-c", "echo oops >&2; exit 3"]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("oops") && msg.contains('3'), "{msg}");
        assert!(matches!(
            run(&["/nonexistent/program"]),
            Err(Error::Spawn { .. })
        ));
        assert!(run(&[]).is_err());
    }

    #[test]
    fn ns_argv_prefixes_ip_netns_exec() {
        assert_eq!(
            ns_argv("x", &["ip", "route"]),
            ["ip", "netns", "exec", "x", "ip", "route"]
        );
    }
}
