//! The guests' initramfs, in two newc cpio archives that the kernel unpacks one
//! after the other (`cat common.cpio modules.cpio`):
//! - common, built each run: static busybox, iproute2 and iptables with their
//!   shared libraries, the test executables, `/init`;
//! - per kernel, cached beside it: the modules the tests need (dependency closure,
//!   `.ko.xz`/`.ko.zst` decompressed, `busybox depmod`) and the list to load.
//!
//! Uncompressed on purpose: gunzip of ~150 MB under emulation costs more than
//! reading it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

const BUSYBOX: &str = "/bin/busybox";
const INIT: &str = include_str!("../guest/init.sh");

/// Host tools the tests call inside the guest, copied with their libraries. They
/// go first on the guest's PATH, ahead of busybox's applets of the same name.
const TOOLS: &[&str] = &[
    "/usr/sbin/ip",
    "/usr/sbin/tc",
    "/usr/sbin/xtables-nft-multi",
    // the IPVS tests' independent read-back (`ipvsadm -Ln`)
    "/usr/sbin/ipvsadm",
];
/// iptables-nft finds its match and target plugins here (dlopen).
const XTABLES_PLUGINS: &str = "/usr/lib/x86_64-linux-gnu/xtables";

/// Modules the tests need where Debian builds them as modules: veth pairs, VLAN
/// devices, clsact + cls_bpf for the tc fallback before tcx, nftables for the
/// counters `iptables` reads in the node namespace test; IPVS with the Maglev
/// scheduler and the IPIP device the pods decapsulate with (`ip_vs` pulls in
/// nf_conntrack, nf_defrag_ipv4/6 and libcrc32c; `ipip` tunnel4 and ip_tunnel),
/// a bridge for the shared L2 that IPVS direct routing needs, and the virtio NIC
/// through which the IPVS lab's guest reaches the host's kube-apiserver (qemu
/// user networking; `ringlb-lab ipvs-vm`, docs/lab.md; `virtio_pci` is built in
/// from 6.12, a module before).
pub const MODULES: &[&str] = &[
    "veth",
    "8021q",
    "dummy",
    "sch_ingress",
    // libcrc32c's soft dependency, which busybox modprobe does not follow
    "crc32c_generic",
    "cls_bpf",
    "nf_tables",
    "nft_compat",
    "nft_counter",
    "x_tables",
    "xt_tcpudp",
    "xt_tcp",
    "ip_vs",
    "ip_vs_mh",
    "ipip",
    "bridge",
    "virtio_pci",
    "virtio_net",
    // the IPVS lab's ToR counters (`counter name`): a module before 6.12
    "nft_objref",
    // ipvs-bench's flood section: the kernel's packet generator
    "pktgen",
];

/// A directory being filled as the guest's root.
pub struct Rootfs {
    pub root: PathBuf,
}

impl Rootfs {
    pub fn new(root: &Path) -> Result<Self> {
        if root.exists() {
            fs::remove_dir_all(root)?;
        }
        fs::create_dir_all(root)?;
        Ok(Rootfs {
            root: root.to_path_buf(),
        })
    }

    fn dst(&self, guest: &str) -> PathBuf {
        self.root.join(guest.trim_start_matches('/'))
    }

    pub fn write(&self, guest: &str, data: &[u8], exec: bool) -> Result<()> {
        let d = self.dst(guest);
        fs::create_dir_all(d.parent().unwrap())?;
        fs::write(&d, data)?;
        if exec {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&d, fs::Permissions::from_mode(0o755))?;
        }
        Ok(())
    }

    /// Copies a host file (following links) to `guest`.
    pub fn copy(&self, host: &Path, guest: &str) -> Result<()> {
        let d = self.dst(guest);
        fs::create_dir_all(d.parent().unwrap())?;
        fs::copy(host, &d).with_context(|| format!("copy {} -> {guest}", host.display()))?;
        Ok(())
    }

    pub fn symlink(&self, target: &str, guest: &str) -> Result<()> {
        let d = self.dst(guest);
        fs::create_dir_all(d.parent().unwrap())?;
        let _ = fs::remove_file(&d);
        std::os::unix::fs::symlink(target, &d)?;
        Ok(())
    }

    /// Copies an executable and the shared libraries `ldd` names for it, at the
    /// same paths.
    pub fn copy_with_libs(&self, host: &Path, guest: &str) -> Result<()> {
        self.copy(host, guest)?;
        let out = Command::new("ldd").arg(host).output().context("ldd")?;
        for lib in ldd_paths(&String::from_utf8_lossy(&out.stdout)) {
            if !self.dst(&lib).exists() {
                self.copy(Path::new(&lib), &lib)?;
            }
        }
        Ok(())
    }

    /// Writes the tree as one newc archive (`cpio -o -H newc`).
    pub fn archive(&self, out: &Path) -> Result<()> {
        let mut list = Vec::new();
        walk(&self.root, &self.root, &mut list)?;
        let mut child = Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet", "-O"])
            .arg(out)
            .current_dir(&self.root)
            .stdin(Stdio::piped())
            .spawn()
            .context("cpio (scripts/kernel-setup.sh installs it)")?;
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(list.join("\n").as_bytes())?;
        if !child.wait()?.success() {
            bail!("cpio failed for {}", self.root.display());
        }
        Ok(())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        out.push(p.strip_prefix(root)?.to_string_lossy().into_owned());
        if e.file_type()?.is_dir() {
            walk(root, &p, out)?;
        }
    }
    Ok(())
}

/// Absolute library paths in `ldd` output.
pub fn ldd_paths(ldd: &str) -> Vec<String> {
    ldd.split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(str::to_string)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The common archive: busybox, tools, the test executables under /tests (with
/// `/tests/<name>.args` where `args` names arguments for one), /init.
pub fn build_common(
    stage: &Path,
    tests: &[(String, PathBuf)],
    args: &[(String, String)],
    out: &Path,
) -> Result<()> {
    let fs = Rootfs::new(stage)?;
    for d in ["proc", "sys", "dev", "run", "tmp", "etc", "var"] {
        fs::create_dir_all(fs.dst(d))?;
    }
    // `ip netns` and the next-hop resolver name namespaces by /var/run/netns
    fs.symlink("../run", "/var/run")?;
    fs.copy(Path::new(BUSYBOX), "/bin/busybox")
        .context("busybox-static (scripts/kernel-setup.sh installs it)")?;
    let list = Command::new(BUSYBOX).arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
        if applet != "busybox" {
            fs.symlink("busybox", &format!("/bin/{applet}"))?;
        }
    }
    for tool in TOOLS {
        fs.copy_with_libs(Path::new(tool), tool)?;
    }
    // iproute2 ahead of busybox's `ip` applet wherever a script looks it up
    fs.symlink("/usr/sbin/ip", "/bin/ip")?;
    for name in ["iptables", "ip6tables"] {
        fs.symlink("xtables-nft-multi", &format!("/usr/sbin/{name}"))?;
    }
    for e in fs::read_dir(XTABLES_PLUGINS)
        .context(XTABLES_PLUGINS)?
        .flatten()
    {
        let guest = format!("{XTABLES_PLUGINS}/{}", e.file_name().to_string_lossy());
        fs.copy_with_libs(&e.path(), &guest)?;
    }
    // the kernel's request_module() runs /sbin/modprobe
    fs.symlink("/bin/busybox", "/sbin/modprobe")?;
    for (name, exe) in tests {
        fs.copy_with_libs(exe, &format!("/tests/{name}"))?;
    }
    for (name, a) in args {
        fs.write(&format!("/tests/{name}.args"), a.as_bytes(), false)?;
    }
    fs.write("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", false)?;
    fs.write("/init", INIT.as_bytes(), true)?;
    fs.archive(out)
}

/// `depends=` of a module's .modinfo section, from the (decompressed) .ko bytes.
pub fn modinfo_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|b| *b == 0)
        .find_map(|s| s.strip_prefix(b"depends="))
        .map(|d| {
            String::from_utf8_lossy(d)
                .split(',')
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn norm(m: &str) -> String {
    m.replace('-', "_")
}

fn decompress(f: &Path) -> Result<Vec<u8>> {
    let name = f.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return Ok(fs::read(f)?);
    };
    let out = Command::new(tool).arg("-dc").arg(f).output()?;
    if !out.status.success() {
        bail!("{tool} -dc {name} failed");
    }
    Ok(out.stdout)
}

/// The per-kernel archive: `wanted` and what they depend on, from the extracted
/// `<modbase>/<kver>/`, plus `/etc/ringlb-modules` (what /init loads, in order).
/// Modules built into this kernel are skipped. Returns the modules it holds.
pub fn build_modules(
    stage: &Path,
    modbase: &Path,
    kver: &str,
    wanted: &[&str],
    out: &Path,
) -> Result<Vec<String>> {
    let fs = Rootfs::new(stage)?;
    let src = modbase.join(kver);
    let mut index: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut files = Vec::new();
    walk(&src.join("kernel"), &src.join("kernel"), &mut files)?;
    for rel in files.into_iter().filter(|f| f.contains(".ko")) {
        let base = rel.rsplit('/').next().unwrap();
        let name = base.split(".ko").next().unwrap();
        index.insert(norm(name), src.join("kernel").join(&rel));
    }
    let mut held = Vec::new();
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = wanted.iter().map(|m| norm(m)).collect();
    while let Some(m) = todo.pop() {
        if !seen.insert(m.clone()) {
            continue;
        }
        let Some(f) = index.get(&m) else { continue }; // built in
        let ko = decompress(f)?;
        todo.extend(modinfo_depends(&ko).iter().map(|d| norm(d)));
        let rel = f.strip_prefix(&src)?.to_string_lossy().into_owned();
        let rel = rel.trim_end_matches(".xz").trim_end_matches(".zst");
        fs.write(&format!("/lib/modules/{kver}/{rel}"), &ko, false)?;
        held.push(m);
    }
    for meta in [
        "modules.order",
        "modules.builtin",
        "modules.builtin.modinfo",
    ] {
        if src.join(meta).exists() {
            fs.copy(&src.join(meta), &format!("/lib/modules/{kver}/{meta}"))?;
        }
    }
    let st = Command::new(BUSYBOX)
        .args(["depmod", "-b"])
        .arg(&fs.root)
        .arg(kver)
        .status()?;
    if !st.success() {
        bail!("busybox depmod for {kver} failed");
    }
    // load order: the wanted ones as listed; modprobe pulls in their dependencies
    let load: Vec<String> = wanted
        .iter()
        .map(|m| norm(m))
        .filter(|m| held.contains(m))
        .collect();
    fs.write(
        "/etc/ringlb-modules",
        (load.join("\n") + "\n").as_bytes(),
        false,
    )?;
    fs.archive(out)?;
    held.sort();
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_library_paths() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007fa5)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fa5)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007fa5)\n";
        assert_eq!(
            ldd_paths(ldd),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
    }

    #[test]
    fn module_dependencies_come_from_modinfo() {
        let ko = b"\x7fELF\0junk\0license=GPL\0depends=nfnetlink,libcrc32c\0intree=Y\0";
        assert_eq!(modinfo_depends(ko), ["nfnetlink", "libcrc32c"]);
        assert!(modinfo_depends(b"\0depends=\0").is_empty());
        assert!(modinfo_depends(b"no modinfo").is_empty());
    }
}
