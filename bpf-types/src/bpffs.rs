//! Is a pin directory on a bpffs? Both loaders check before they create or pin
//! anything, so a wrong `--pin-dir` fails with what is wrong and how to fix it
//! rather than a raw `BPF_OBJ_PIN` error after half a load.
//!
//! [`mount_bpffs`] mounts one where there is none (`ringlb-edge mount-bpffs`, the
//! Helm chart's init container), as CNIs do: a node without bpffs at `/sys/fs/bpf`
//! needs no setup by hand.

use std::path::{Path, PathBuf};

/// `f_type` of a bpffs in statfs(2) (`BPF_FS_MAGIC`, linux/magic.h).
pub const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

/// A pin directory that cannot hold BPF pins.
#[derive(Debug, thiserror::Error)]
pub enum PinDirError {
    #[error(
        "{dir} is not on a bpffs ({on} is on {fs}): BPF maps and links can only be pinned \
         on a bpffs. Mount one on the node with `mount -t bpf bpf /sys/fs/bpf` or \
         `ringlb-edge mount-bpffs --path /sys/fs/bpf` (the Helm chart's init container \
         `mount-bpffs` does this unless mountBpffs=false; in a pod of your own: a hostPath \
         volume of /sys/fs/bpf with mountPropagation HostToContainer), or choose a pin \
         directory under a mounted bpffs"
    )]
    NotBpffs {
        dir: PathBuf,
        /// The directory that was checked: `dir`, or its nearest existing ancestor.
        on: PathBuf,
        /// The filesystem found there, by name when it is a well-known one.
        fs: String,
    },
    #[error("checking the filesystem of {path}: {source}")]
    Statfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Ok when `dir`, or the nearest ancestor of it that exists (where it would be
/// created), is on a bpffs. Creates nothing.
pub fn check_pin_dir(dir: &Path) -> Result<(), PinDirError> {
    let on = existing_ancestor(dir);
    let magic = fs_magic(&on).map_err(|source| PinDirError::Statfs {
        path: on.clone(),
        source,
    })?;
    if magic == BPF_FS_MAGIC {
        return Ok(());
    }
    Err(PinDirError::NotBpffs {
        dir: dir.to_path_buf(),
        on,
        fs: fs_name(magic),
    })
}

/// The pin directory made ready for a loader: checked to be on a bpffs before
/// anything is created (so a wrong `--pin-dir` fails with the fix), then created.
pub fn prepare_pin_dir(dir: &Path) -> Result<(), crate::BpfError> {
    check_pin_dir(dir).map_err(|e| crate::BpfError::Pin {
        path: dir.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    std::fs::create_dir_all(dir).map_err(|source| crate::BpfError::Pin {
        path: dir.to_path_buf(),
        source,
    })
}

/// What [`mount_bpffs`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpffsMount {
    /// A bpffs was there already; nothing was done.
    AlreadyMounted,
    /// A bpffs was mounted.
    Mounted,
}

/// Why a bpffs could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("creating {path} to mount a bpffs on: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "mounting a bpffs on {path} (`mount -t bpf bpf {path}`): {source}; this needs \
         CAP_SYS_ADMIN in the node's mount namespace (in a pod: a privileged container \
         whose hostPath volume of {path} has mountPropagation Bidirectional)"
    )]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mounted a bpffs on {path}, yet statfs finds {fs} there")]
    NotAfterMount { path: PathBuf, fs: String },
    #[error("checking the filesystem of {path}: {source}")]
    Statfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Mounts a bpffs on `path` (created when missing) unless `path` is on one
/// already: idempotent. Mode 0700, nosuid, nodev, noexec, as systemd mounts it.
pub fn mount_bpffs(path: &Path) -> Result<BpffsMount, MountError> {
    let statfs = |source| MountError::Statfs {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() && fs_magic(path).map_err(statfs)? == BPF_FS_MAGIC {
        return Ok(BpffsMount::AlreadyMounted);
    }
    std::fs::create_dir_all(path).map_err(|source| MountError::Create {
        path: path.to_path_buf(),
        source,
    })?;
    mount_bpf(path).map_err(|source| MountError::Mount {
        path: path.to_path_buf(),
        source,
    })?;
    let magic = fs_magic(path).map_err(statfs)?;
    if magic != BPF_FS_MAGIC {
        return Err(MountError::NotAfterMount {
            path: path.to_path_buf(),
            fs: fs_name(magic),
        });
    }
    Ok(BpffsMount::Mounted)
}

#[allow(unsafe_code)] // mount(2) through libc: no safe wrapper in std
fn mount_bpf(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: every pointer is to a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            flags,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `dir` itself, or the closest ancestor that exists (`.` for a relative path
/// with none).
fn existing_ancestor(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// A readable name for well-known filesystem magics.
fn fs_name(magic: u64) -> String {
    let name = match magic {
        0x0102_1994 => "tmpfs",
        0x6265_6572 => "sysfs",
        0x9fa0 => "procfs",
        0xef53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x794c_7630 => "overlayfs",
        0x6e73_6673 => "nsfs",
        0x6367_7270 => "cgroup2",
        _ => return format!("a filesystem of type {magic:#x}"),
    };
    format!("{name} (type {magic:#x})")
}

#[allow(unsafe_code)] // statfs(2) through libc: no safe wrapper in std
fn fs_magic(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero `statfs` is a valid value of the plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and outlives the call; `st` is a valid,
    // writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // f_type's C type differs by architecture; the magic fits in 32 bits.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as u64 & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_not_on_a_bpffs_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join("ringlb-no-such-dir/pins");
        let err = check_pin_dir(&dir).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, PinDirError::NotBpffs { .. }), "{text}");
        assert!(text.contains("mount -t bpf bpf /sys/fs/bpf"), "{text}");
        assert!(text.contains("ringlb-edge mount-bpffs"), "{text}");
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(!dir.exists(), "the check creates nothing");
    }

    #[test]
    fn the_nearest_existing_ancestor_is_checked() {
        assert_eq!(
            existing_ancestor(Path::new("/proc/no/such")),
            Path::new("/proc")
        );
        assert_eq!(existing_ancestor(Path::new("no-such-rel")), Path::new("."));
        assert!(fs_name(0x0102_1994).starts_with("tmpfs"));
        assert_eq!(fs_name(0x1234), "a filesystem of type 0x1234");
        let err = check_pin_dir(Path::new("/proc/no/such")).unwrap_err();
        assert!(err.to_string().contains("procfs"), "{err}");
    }

    #[test]
    fn a_mounted_bpffs_passes() {
        // Only where one is mounted (CI mounts /sys/fs/bpf); nothing to assert else.
        let bpffs = Path::new("/sys/fs/bpf");
        if fs_magic(bpffs).ok() != Some(BPF_FS_MAGIC) {
            eprintln!("SKIP: no bpffs mounted at /sys/fs/bpf");
            return;
        }
        check_pin_dir(&bpffs.join("ringlb-no-such-subdir")).unwrap();
    }
}
