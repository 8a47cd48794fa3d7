//! `ringlb-edge mount-bpffs` in a private mount namespace (root; skips otherwise):
//! mounts a bpffs where there is none, does nothing where there is one, and the
//! loaders' check then passes there. Nothing leaves the namespace: `unshare
//! --mount --propagation private` runs the program and the checks in one shell.

use std::process::Command;

use ringlb_testkit::netns::is_root;

#[test]
fn mount_bpffs_mounts_once_and_is_idempotent() {
    if !is_root() {
        eprintln!("SKIP: mount-bpffs needs root (unshare --mount, mount -t bpf)");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_ringlb-edge");
    let dir = std::env::temp_dir().join(format!("ringlb-mount-bpffs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("sys-fs-bpf");
    // The target does not exist yet: it is created, then mounted. Before: a plain
    // directory's filesystem; after: BPF_FS_MAGIC (cafe4a11); the second run finds it.
    let script = format!(
        r#"set -e
export RINGLB_LOG_FORMAT=text
echo "fs-before: $(stat -f -c %t {dir})"
{bin} mount-bpffs --path {target}
echo "fs-after: $(stat -f -c %t {target})"
{bin} mount-bpffs --path {target}
echo "fs-again: $(stat -f -c %t {target})"
echo "mounts: $(grep -c ' {target} bpf ' /proc/self/mounts)"
"#,
        dir = dir.display(),
        target = target.display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("run unshare");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let host_mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("fs-before: cafe4a11"), "{text}");
    assert!(text.contains("fs-after: cafe4a11"), "{text}");
    assert!(text.contains("fs-again: cafe4a11"), "{text}");
    assert!(text.contains("mounts: 1"), "mounted exactly once:\n{text}");
    assert!(text.contains("mounted a bpffs"), "{text}");
    assert!(
        text.contains("a bpffs is already mounted here; nothing to do"),
        "{text}"
    );
    assert!(
        !text.contains("\x1b["),
        "no colour off a terminal: {text:?}"
    );
    assert!(
        !host_mounts.contains(&target.display().to_string()),
        "the mount stayed in the test's namespace"
    );
}

/// Without CAP_SYS_ADMIN the mount is refused with what it needs.
#[test]
fn mount_bpffs_without_the_capability_says_what_it_needs() {
    if !is_root() {
        eprintln!("SKIP: needs root to drop the capability with setpriv");
        return;
    }
    let has_setpriv = Command::new("setpriv").arg("--help").output().is_ok();
    if !has_setpriv {
        eprintln!("SKIP: no setpriv");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_ringlb-edge");
    let dir = std::env::temp_dir().join(format!("ringlb-mount-bpffs-nocap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .args([
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-sys_admin",
            "--",
        ])
        .args([bin, "mount-bpffs", "--path"])
        .arg(&dir)
        .output()
        .expect("run unshare");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("CAP_SYS_ADMIN"), "{text}");
    assert!(text.contains(&dir.display().to_string()), "{text}");
}
