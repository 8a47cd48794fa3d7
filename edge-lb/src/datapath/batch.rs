//! `BPF_MAP_UPDATE_BATCH`: write many elements with one bpf(2) call. aya 0.14
//! has no wrapper, so this is the one place with a raw syscall.

use std::os::fd::{AsRawFd, BorrowedFd};

use super::Error;

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `keys[i] -> values[i]` into the map behind `fd` in one call
/// (chunks of 64k elements). Key and value types must have the map's sizes.
pub fn update_batch<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), Error> {
    assert_eq!(
        keys.len(),
        values.len(),
        "update_batch: keys and values differ in length"
    );
    for (k, v) in keys.chunks(65_536).zip(values.chunks(65_536)) {
        let mut attr = BatchAttr {
            keys: k.as_ptr() as u64,
            values: v.as_ptr() as u64,
            count: k.len() as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let ret = sys_bpf_batch(&mut attr);
        if ret < 0 {
            return Err(Error::Syscall {
                call: "bpf(BPF_MAP_UPDATE_BATCH)",
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

// SAFETY: bpf(2) reads `attr` (valid for its size) and, through the keys and
// values pointers, `count` elements of the caller's slices, which outlive the
// call; it writes back only `attr.count`. Nothing is retained after return.
#[allow(unsafe_code)]
fn sys_bpf_batch(attr: &mut BatchAttr) -> libc::c_long {
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>() as libc::c_uint,
        )
    }
}
