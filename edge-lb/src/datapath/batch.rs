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

/// BPF_F_MMAPABLE: array maps whose values userspace can mmap.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Writes `(index, value)` pairs straight into the memory of a
/// `BPF_F_MMAPABLE` array of `u32` with `max_entries` slots: no syscall per
/// element. Each store is one aligned 4-byte write, so the program sees either
/// the old or the new backend id of a slot, never a torn value.
pub fn write_mmapped_u32(
    fd: BorrowedFd<'_>,
    max_entries: u32,
    writes: &[(u32, u32)],
) -> Result<(), Error> {
    // array maps round every value up to 8 bytes
    const STRIDE: usize = 8;
    let page = 4096usize;
    let len = (max_entries as usize * STRIDE).div_ceil(page) * page;
    if let Some(&(i, _)) = writes.iter().find(|(i, _)| *i >= max_entries) {
        return Err(Error::Syscall {
            call: "ring write",
            source: std::io::Error::other(format!("slot {i} outside a ring of {max_entries}")),
        });
    }
    let base = mmap_shared(fd, len)?;
    store_u32s(base, STRIDE, writes);
    munmap(base, len);
    Ok(())
}

// SAFETY: maps `len` bytes of the map behind `fd` (a BPF_F_MMAPABLE array of
// at least len / 8 entries); the mapping is private to the caller until munmap.
#[allow(unsafe_code)]
fn mmap_shared(fd: BorrowedFd<'_>, len: usize) -> Result<*mut u8, Error> {
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::Syscall {
            call: "mmap(ring)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(p.cast())
}

// SAFETY: every index was checked against max_entries, so base + i * stride
// lies inside the mapping; the slot is 8-byte aligned (page-aligned base).
#[allow(unsafe_code)]
fn store_u32s(base: *mut u8, stride: usize, writes: &[(u32, u32)]) {
    for &(i, v) in writes {
        unsafe { std::ptr::write_volatile(base.add(i as usize * stride).cast::<u32>(), v) };
    }
}

// SAFETY: base/len are exactly what mmap_shared returned.
#[allow(unsafe_code)]
fn munmap(base: *mut u8, len: usize) {
    unsafe { libc::munmap(base.cast(), len) };
}
