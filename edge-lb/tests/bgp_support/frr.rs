//! FRR (zebra, bfdd, bgpd) as the ToR of a [`Lab`], from Debian's `frr` package.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Lab, wait_until};

/// Where Debian installs the daemons.
pub(crate) const FRR: &str = "/usr/lib/frr";

/// Why the FRR tests cannot run here, if they cannot.
pub(crate) fn missing() -> Option<String> {
    ["zebra", "bgpd", "bfdd"]
        .into_iter()
        .find(|d| !Path::new(FRR).join(d).is_file())
        .map(|d| format!("{FRR}/{d} missing (scripts/setup.sh installs frr)"))
}

/// zebra, bfdd and bgpd in the ToR namespace with `bgpd` (a bgpd.conf) and
/// `bfdd` (a bfdd.conf), their sockets and logs in DIR/frr (writable by the `frr`
/// user the daemons switch to).
pub(crate) fn start_frr(lab: &mut Lab, bgpd: &str, bfdd: &str) -> PathBuf {
    let dir = lab.path("frr");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let confs = [("zebra", "hostname tor\n"), ("bfdd", bfdd), ("bgpd", bgpd)];
    let d = dir.display().to_string();
    for (daemon, conf) in confs {
        let f = dir.join(format!("{daemon}.conf"));
        std::fs::write(&f, conf).unwrap();
        let (f, pid, log, zs) = (
            f.display().to_string(),
            format!("{d}/{daemon}.pid"),
            format!("file:{d}/{daemon}.log"),
            format!("{d}/zserv.api"),
        );
        let mut args = vec![
            "-f",
            &f,
            "-i",
            &pid,
            "--vty_socket",
            &d,
            "-z",
            &zs,
            "-P",
            "0",
            "--log",
            &log,
        ];
        let ctl = format!("{d}/bfdd.sock");
        if daemon == "bfdd" {
            args.extend(["--bfdctl", ctl.as_str()]);
        }
        lab.spawn(daemon, "tor", &Path::new(FRR).join(daemon), &args);
        // zebra first: the others connect to its socket at start.
        let sock = if daemon == "zebra" {
            dir.join("zserv.api")
        } else {
            dir.join(format!("{daemon}.vty"))
        };
        assert!(
            wait_until(Duration::from_secs(10), || sock.exists()),
            "{daemon} did not start:\n{}",
            lab.logs()
        );
    }
    dir
}

/// One `vtysh -c CMD` at the ToR's FRR (`dir`: what [`start_frr`] returned).
pub(crate) fn vtysh(lab: &Lab, dir: &Path, cmd: &str) -> String {
    let d = dir.display().to_string();
    lab.exec("tor", "vtysh", &["--vty_socket", &d, "-c", cmd])
        .unwrap_or_else(|e| e)
}
