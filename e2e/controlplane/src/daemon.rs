//! Long-running programs: the control plane's, and the lab's inside its namespaces.
//!
//! `ip netns exec NS PROG ...` execs PROG in place, so the child's PID is the daemon's
//! own. Each daemon gets its own process group (a Ctrl-C at the terminal reaches only
//! `ringlb-lab`, which then tears down in order), a log file, and a line `PID NAME` in
//! the lab's PID file so `ringlb-lab down` can stop exactly what the lab started.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What can go wrong with a daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} exited early ({status}); log {log}:\n{tail}")]
    DaemonExited {
        name: String,
        status: String,
        log: String,
        tail: String,
    },
    #[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
}

impl Error {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `kill -SIG PID`, ignoring failure (the process may be gone already).
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A spawned daemon; stopped (TERM, then KILL) on drop unless kept.
#[derive(Debug)]
pub struct Daemon {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    keep: bool,
    /// Stopped on purpose ([`Daemon::kill`]): not an early exit.
    killed: bool,
}

impl Daemon {
    /// Starts `argv` inside `ns` (or on the host when `ns` is None), logging stdout and
    /// stderr to `<dir>/<name>.log` and recording the PID in `<dir>/pids`.
    pub fn spawn(
        dir: &Path,
        name: &str,
        ns: Option<&str>,
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Daemon> {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)
            .map_err(Error::io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let mut full: Vec<&str> = Vec::new();
        if let Some(ns) = ns {
            full.extend(["ip", "netns", "exec", ns]);
        }
        full.extend_from_slice(argv);
        let child = Command::new(full[0])
            .args(&full[1..])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| Error::Spawn {
                cmd: full.join(" "),
                source,
            })?;
        let pids = dir.join("pids");
        let line = format!("{} {name}\n", child.id());
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&pids)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(Error::io(format!("writing {}", pids.display())))?;
        Ok(Daemon {
            name: name.to_string(),
            log,
            child,
            keep: false,
            killed: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL now (a crash, as far as its peers can tell) and reap it.
    pub fn kill(&mut self) {
        self.killed = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (an orderly stop, on purpose) and up to `limit` for it to exit.
    pub fn terminate(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        self.killed = true;
        signal(self.pid(), "TERM");
        self.wait_exit(limit)
    }

    /// An error naming the daemon and its log when it has exited (unless it was
    /// stopped on purpose).
    pub fn check_alive(&mut self) -> Result<()> {
        if self.killed {
            return Ok(());
        }
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::DaemonExited {
                name: self.name.clone(),
                status: status.to_string(),
                log: self.log.display().to_string(),
                tail: self.log_tail(15),
            }),
            Err(e) => Err(Error::io(format!("waiting for {}", self.name))(e)),
        }
    }

    /// Waits up to `limit` for the daemon to exit by itself; its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Ok(st),
                Ok(None) if Instant::now() >= until => {
                    return Err(Error::Timeout {
                        what: format!("{} to exit", self.name),
                        waited: limit,
                        last: self.log_tail(5),
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(Error::io(format!("waiting for {}", self.name))(e)),
            }
        }
    }

    /// The last `n` lines of the daemon's log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// Stops it now: SIGTERM, up to `grace` to exit, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        if !self.alive() {
            return;
        }
        signal(self.pid(), "TERM");
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if !self.alive() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Leaves the daemon running when this guard drops (`ringlb-lab up`).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.keep {
            self.stop(Duration::from_secs(3));
        }
    }
}

/// The last `n` lines of a file ("" when unreadable).
///
/// A backtrace's frames are left out: with them, a panicking program's last lines
/// are frames, and its panic message scrolls out of a short tail.
pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().filter(|l| !is_backtrace_frame(l)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `  12: std::panicking::...` or `             at /rustc/...`.
fn is_backtrace_frame(line: &str) -> bool {
    let t = line.trim_start();
    if t.starts_with("at /") || t.starts_with("at ./") {
        return true;
    }
    t.split_once(": ")
        .is_some_and(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// Stops every process listed in `<dir>/pids` (TERM, then KILL), for `ringlb-lab down`.
/// Only PIDs whose command line still mentions the recorded program are signalled, so
/// a reused PID is left alone.
pub fn stop_recorded(dir: &Path) -> usize {
    let Ok(s) = std::fs::read_to_string(dir.join("pids")) else {
        return 0;
    };
    let mut stopped = 0;
    for line in s.lines() {
        let mut it = line.split_whitespace();
        let (Some(pid), Some(name)) = (it.next().and_then(|p| p.parse::<u32>().ok()), it.next())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.is_empty() || !recorded_matches(&cmdline, name) {
            continue;
        }
        signal(pid, "TERM");
        let until = Instant::now() + Duration::from_secs(3);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if Path::new(&format!("/proc/{pid}")).exists() {
            signal(pid, "KILL");
        }
        stopped += 1;
    }
    stopped
}

/// Does a `/proc/PID/cmdline` belong to the daemon recorded as `name`? The lab names
/// daemons after their program (`bird`, `control-plane`, `controller`, `edge1`,
/// `pod1`; the control plane's own `etcd`, `kube-apiserver`, ...), and
/// every lab program's command line carries the lab's directory or namespace prefix.
fn recorded_matches(cmdline: &[u8], name: &str) -> bool {
    let s = String::from_utf8_lossy(cmdline);
    let prog = match name {
        n if n.starts_with("edge") => "ringlb-edge",
        n if n.starts_with("pod") => "ringlb-lab",
        "control-plane" => "ringlb-lab",
        "controller" => "ringlb-controller",
        other => other,
    };
    s.contains(prog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_matches_by_program_name() {
        assert!(recorded_matches(b"/x/ringlb-edge\0run\0", "edge1"));
        assert!(recorded_matches(b"bird\0-f\0-c\0/tmp/x\0", "bird"));
        assert!(!recorded_matches(b"/usr/bin/vim\0", "edge2"));
        assert!(!recorded_matches(b"/usr/bin/vim\0", "control-plane"));
        assert!(recorded_matches(
            b"/x/ringlb-lab\0--prefix\0p\0control-plane\0",
            "control-plane"
        ));
        assert!(recorded_matches(b"/c/etcd\0--name=default\0", "etcd"));
    }

    #[test]
    fn a_tail_leaves_backtrace_frames_out() {
        let dir = std::env::temp_dir().join(format!("ringlb-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        std::fs::write(
            &log,
            "starting\nthread 'main' panicked at src/x.rs:3:5:\nport 6443 in use\n\
             stack backtrace:\n   0: std::panicking::begin_panic\n             at /rustc/abc/panicking.rs:1:1\n\
            25: main\n2026-12-02T02:31:50Z INFO 12: not a frame\n",
        )
        .unwrap();
        assert_eq!(
            tail(&log, 3),
            "port 6443 in use\nstack backtrace:\n2026-12-02T02:31:50Z INFO 12: not a frame"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn spawn_logs_records_pid_and_stops_on_drop() {
        let dir = std::env::temp_dir().join(format!("ringlb-lab-daemon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid = {
            let mut d = Daemon::spawn(
                &dir,
                "sleeper",
                None,
                &["sh", "-c", "echo started; exec sleep 30"],
                &[],
            )
            .unwrap();
            assert!(d.alive());
            let pid = d.pid();
            let recorded = std::fs::read_to_string(dir.join("pids")).unwrap();
            assert_eq!(recorded.trim(), format!("{pid} sleeper"));
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(d.log_tail(5), "started");
            pid
        };
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z"))
                    .unwrap_or(true),
            "the daemon is gone after drop"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
