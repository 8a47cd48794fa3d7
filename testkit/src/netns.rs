//! Network namespaces, bpffs mounts, commands and the test programs a veth lab
//! needs, for tests and benchmarks: guards that always clean up (Drop, also on
//! panic), and commands that report stderr.
//! `run`/`Netns::create` return errors (benchmarks); `sh`/`Netns::new` panic (tests).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("{args:?}"))?;
    if !out.status.success() {
        bail!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run`] for tests: panics with the command's stderr on failure.
pub fn sh(args: &[&str]) -> String {
    run(args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `ip netns exec NS <args>`
pub fn nsx(ns: &str, args: &[&str]) -> String {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v)
}

/// A network namespace deleted on drop.
pub struct Netns(pub String);

impl Netns {
    /// Creates `name` with `lo` up (a leftover of the same name from a killed run is
    /// deleted first).
    pub fn create(name: &str) -> anyhow::Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run(&["ip", "netns", "add", name])?;
        let ns = Netns(name.to_string());
        run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// [`Netns::create`] for tests: panics on failure.
    pub fn new(name: &str) -> Self {
        Self::create(name).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Netns::new`] for each of `names`, as `<prefix><pid><name>`: names no
    /// other test process uses.
    pub fn per_process<const N: usize>(prefix: &str, names: [&str; N]) -> [Self; N] {
        let pid = std::process::id();
        names.map(|n| Self::new(&format!("{prefix}{pid}{n}")))
    }

    /// Runs `args` inside the namespace; its stdout.
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut v = vec!["ip", "netns", "exec", &self.0];
        v.extend_from_slice(args);
        run(&v)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // kill anything still running inside first (servers started by the test)
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.0]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A private bpffs mounted on a unique directory, unmounted on drop.
pub struct BpfFs(pub PathBuf);

impl BpfFs {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ringlb-bpffs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        sh(&["mount", "-t", "bpf", "bpf", dir.to_str().unwrap()]);
        BpfFs(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Moves the calling thread into network namespace `name` (setns(2)). Every
/// `ip`/aya call from this thread afterwards acts inside it.
pub fn enter_netns(name: &str) {
    ringlb_ops::netns::enter_named(name).unwrap_or_else(|e| panic!("setns into {name}: {e}"));
}

/// The XDP program id attached to `dev` (in the current netns), if any.
pub fn xdp_prog_id(dev: &str) -> Option<u64> {
    let j = sh(&["ip", "-j", "-d", "link", "show", "dev", dev]);
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    v[0]["xdp"]["prog"]["id"]
        .as_u64()
        .or_else(|| v[0]["xdp"]["attached"][0]["prog"]["id"].as_u64())
}

/// Runs `f` on a thread that lives in network namespace `name`.
pub fn in_netns<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(name);
            f()
        })
        .join()
        .expect("netns thread panicked")
    })
}

/// `ringlb_pass` (XDP) on `dev` in `ns`: a veth receives XDP_TX frames of
/// its peer only with a program of its own. Keep the object alive.
pub fn attach_pass(ns: &str, dev: &str) -> aya::Ebpf {
    use aya::programs::{Xdp, XdpMode};
    let mut pass = aya::Ebpf::load(crate::objects::XDP_FLOOR).unwrap();
    let prog: &mut Xdp = pass.program_mut("ringlb_pass").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(ns, || prog.attach(dev, XdpMode::Driver).unwrap());
    pass
}

/// The tc decap (`ringlb_decap`) on `eth0` ingress of pod namespace `ns`. Keep
/// the object alive.
pub fn attach_decap(ns: &str) -> aya::Ebpf {
    use aya::programs::{SchedClassifier, TcAttachType, tc};
    let mut d = aya::Ebpf::load(crate::objects::TC_DECAP).unwrap();
    let prog: &mut SchedClassifier = d.program_mut("ringlb_decap").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(ns, || {
        let _ = tc::qdisc_add_clsact("eth0");
        prog.attach("eth0", TcAttachType::Ingress).unwrap();
    });
    d
}

/// Turns TX checksum offload off on `dev` in the current thread's netns
/// (`ethtool -K dev tx off` through SIOCETHTOOL; there is no ethtool here).
/// A veth leaves checksums partial and native XDP_TX loses that state.
#[allow(unsafe_code)]
pub fn tx_checksum_off(dev: &str) {
    use std::os::fd::AsRawFd;
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_STXCSUM: u32 = 0x17;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        data: *mut EthtoolValue,
        pad: [u8; 16],
    }
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("socket");
    let mut val = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: 0,
    };
    let mut ifr = IfReq {
        name: [0; 16],
        data: &mut val,
        pad: [0; 16],
    };
    ifr.name[..dev.len()].copy_from_slice(dev.as_bytes());
    // SAFETY: SIOCETHTOOL reads ifr (name + pointer to val), both alive for
    // the call; the kernel writes nothing back for a set command.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr as *mut IfReq) };
    assert_eq!(
        rc,
        0,
        "SIOCETHTOOL tx off on {dev}: {}",
        std::io::Error::last_os_error()
    );
}
