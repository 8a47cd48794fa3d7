//! Shared helpers for the XDP tests: root check, network namespaces and a
//! bpffs that are always removed again (Drop guards, also on panic).
#![allow(dead_code)]

pub mod fixture;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

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

/// Runs a command, panicking with its stderr on failure.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    pub fn new(name: &str) -> Self {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh(&["ip", "netns", "add", name]);
        sh(&["ip", "-n", name, "link", "set", "lo", "up"]);
        Netns(name.to_string())
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
#[allow(unsafe_code)]
pub fn enter_netns(name: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/var/run/netns/{name}")).expect("open netns");
    // SAFETY: setns on a valid, open namespace fd; it only changes this
    // thread's network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
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

/// A line server in `ns` on `vip:80`, answering every line with `name` (which pod).
pub fn serve(ns: String, vip: std::net::IpAddr, name: &'static str) {
    use std::io::{BufRead, BufReader, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let l = std::net::TcpListener::bind((vip, 80)).expect("bind VIP:80");
        tx.send(()).unwrap();
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                for line in BufReader::new(c).lines() {
                    if line.is_err() || w.write_all(format!("{name}\n").as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("server up");
}

/// The lab's BPF around the edge: `ringlb_pass` on the ToR's side of the edge link
/// (`ve-e`; veth XDP_TX needs a program on the peer) and the tc decap on each pod's
/// eth0 ingress. Keep the returned objects alive for the test's duration.
pub fn attach_lab_programs(tor: &str, pods: [&str; 2]) -> Vec<aya::Ebpf> {
    use aya::programs::{SchedClassifier, TcAttachType, Xdp, XdpMode, tc};
    use ringlb_edge::datapath::xdp::objects;
    let mut pass = aya::Ebpf::load(objects::XDP_FLOOR).unwrap();
    let prog: &mut Xdp = pass.program_mut("ringlb_pass").unwrap().try_into().unwrap();
    prog.load().unwrap();
    in_netns(tor, || prog.attach("ve-e", XdpMode::Driver).unwrap());
    let mut objs = vec![pass];
    for ns in pods {
        let mut d = aya::Ebpf::load(objects::TC_DECAP).unwrap();
        let prog: &mut SchedClassifier = d.program_mut("ringlb_decap").unwrap().try_into().unwrap();
        prog.load().unwrap();
        in_netns(ns, || {
            let _ = tc::qdisc_add_clsact("eth0");
            prog.attach("eth0", TcAttachType::Ingress).unwrap();
        });
        objs.push(d);
    }
    objs
}
