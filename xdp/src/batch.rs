//! The raw bpf(2) and mmap calls aya 0.14 has no wrapper for, in one place:
//! `BPF_MAP_UPDATE_BATCH` (many elements in one call), `BPF_MAP_LOOKUP_BATCH`
//! (the conntrack keys), reads and writes of `BPF_F_MMAPABLE` arrays, and the
//! XDP link's interface (`bpf_link_info`).

use std::{
    ffi::CString,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

use super::Error;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
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
        let ret = sys_bpf_batch(BPF_MAP_UPDATE_BATCH, &mut attr);
        if ret < 0 {
            return Err(Error::Syscall {
                call: "bpf(BPF_MAP_UPDATE_BATCH)",
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// Every key of the hash map behind `fd` (key type `K`, values of
/// `value_size` bytes), `chunk` per call. A hash map's batch walks whole
/// buckets under their lock: a key present for the whole walk is returned
/// (once), whatever is inserted or deleted meanwhile (`bpf/flow_filter.h`
/// relies on that). Kernel >= 5.6.
pub fn lookup_batch_keys<K: aya::Pod + Default>(
    fd: BorrowedFd<'_>,
    value_size: usize,
    chunk: u32,
) -> Result<Vec<K>, Error> {
    let mut all = Vec::new();
    let mut keys = vec![K::default(); chunk as usize];
    let mut values = vec![0u8; value_size * chunk as usize];
    // the token: a bucket index for hash maps (u32); room for more
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const token_in as u64 },
            out_batch: &raw mut token_out as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let ret = sys_bpf_batch(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let err = (ret < 0).then(std::io::Error::last_os_error);
        let n = (attr.count as usize).min(keys.len());
        all.extend_from_slice(&keys[..n]);
        match err {
            None => {}
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(all),
            Some(source) => {
                return Err(Error::Syscall {
                    call: "bpf(BPF_MAP_LOOKUP_BATCH)",
                    source,
                });
            }
        }
        token_in = token_out;
        first = false;
    }
}

// SAFETY: bpf(2) reads `attr` (valid for its size) and, through the keys,
// values and token pointers, `count` elements of the caller's buffers (8 bytes
// of each token), which outlive the call; it writes at most `count` elements
// into them, the out token and `attr.count`. Nothing is retained after return.
#[allow(unsafe_code)]
fn sys_bpf_batch(cmd: libc::c_long, attr: &mut BatchAttr) -> libc::c_long {
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
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
    if let Some(&(i, _)) = writes.iter().find(|(i, _)| *i >= max_entries) {
        return Err(outside(format!("slot {i} outside a ring of {max_entries}")));
    }
    let len = mmapped_len(max_entries);
    let base = mmap_shared(fd, len)?;
    store_u32s(base, MMAP_STRIDE, writes);
    munmap(base, len);
    Ok(())
}

/// Writes `ids[i]` into slot `i` of a `BPF_F_MMAPABLE` array of `u32` with
/// `max_entries` slots, for every `i`, as [`write_mmapped_u32`] writes pairs.
pub fn write_mmapped_ring(fd: BorrowedFd<'_>, max_entries: u32, ids: &[u32]) -> Result<(), Error> {
    if ids.len() > max_entries as usize {
        return Err(outside(format!(
            "{} slots for a ring of {max_entries}",
            ids.len()
        )));
    }
    let len = mmapped_len(max_entries);
    let base = mmap_shared(fd, len)?;
    store_ring(base, MMAP_STRIDE, ids);
    munmap(base, len);
    Ok(())
}

/// Array maps round every value up to 8 bytes.
const MMAP_STRIDE: usize = 8;

/// The bytes to map of an array of `max_entries` `u32` values: whole pages.
fn mmapped_len(max_entries: u32) -> usize {
    (max_entries as usize * MMAP_STRIDE).div_ceil(4096) * 4096
}

fn outside(what: String) -> Error {
    Error::Syscall {
        call: "ring write",
        source: std::io::Error::other(what),
    }
}

/// Reads the first `n` slots of a `BPF_F_MMAPABLE` array of `u32` with
/// `max_entries` slots straight from its memory (restart: the rings are read
/// back without a syscall per slot). Fails for an array without the flag.
pub fn read_mmapped_u32(fd: BorrowedFd<'_>, max_entries: u32, n: u32) -> Result<Vec<u32>, Error> {
    let len = mmapped_len(max_entries);
    let n = n.min(max_entries) as usize;
    let base = mmap_shared(fd, len)?;
    let v = load_u32s(base, MMAP_STRIDE, n);
    munmap(base, len);
    Ok(v)
}

// SAFETY: n <= max_entries, so every base + i * stride (i < n) lies inside
// the mapping of max_entries * stride bytes; each slot is 8-byte aligned.
#[allow(unsafe_code)]
fn load_u32s(base: *mut u8, stride: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| unsafe { std::ptr::read_volatile(base.add(i * stride).cast::<u32>()) })
        .collect()
}

/// Runs `f` over the first `len` bytes of the `BPF_F_MMAPABLE` array behind
/// `fd` (at least `len` bytes of values), mapped shared: the program's memory,
/// which other CPUs write concurrently, hence atomics.
pub fn with_mmapped_bytes<T>(
    fd: BorrowedFd<'_>,
    len: usize,
    f: impl FnOnce(&[std::sync::atomic::AtomicU8]) -> T,
) -> Result<T, Error> {
    let map_len = len.div_ceil(4096).max(1) * 4096;
    let base = mmap_shared(fd, map_len)?;
    // unmapped also when `f` panics
    struct Unmap(*mut u8, usize);
    impl Drop for Unmap {
        fn drop(&mut self) {
            munmap(self.0, self.1);
        }
    }
    let _unmap = Unmap(base, map_len);
    Ok(f(atomic_bytes(base, len)))
}

// SAFETY: base is a live shared mapping of at least len bytes (with_mmapped_bytes
// unmaps it only after the borrow ends); AtomicU8 has the size and alignment
// of u8, and every access through it is atomic, so concurrent writes by the
// program are not a data race.
#[allow(unsafe_code)]
fn atomic_bytes<'a>(base: *mut u8, len: usize) -> &'a [std::sync::atomic::AtomicU8] {
    unsafe { std::slice::from_raw_parts(base.cast(), len) }
}

/// `bytes` as 64-bit atomic words (the flow filter's body); `None` unless it
/// starts 8-byte aligned and is a whole number of words.
#[allow(unsafe_code)]
pub fn atomic_words(
    bytes: &[std::sync::atomic::AtomicU8],
) -> Option<&[std::sync::atomic::AtomicU64]> {
    let p = bytes.as_ptr();
    if !(p as usize).is_multiple_of(8) || !bytes.len().is_multiple_of(8) {
        return None;
    }
    // SAFETY: in bounds and aligned (checked above), borrowed for as long as
    // `bytes`; every access through either view is atomic (the BPF program
    // shares this memory, and stores to it only with atomic ORs and bytes)
    Some(unsafe { std::slice::from_raw_parts(p.cast(), bytes.len() / 8) })
}

/// `words` as atomic bytes (the opposite view of [`atomic_words`]; tests
/// build a flow filter's memory this way, aligned).
#[cfg(test)]
#[allow(unsafe_code)]
pub(crate) fn atomic_bytes_of(
    words: &[std::sync::atomic::AtomicU64],
) -> &[std::sync::atomic::AtomicU8] {
    // SAFETY: the same memory, borrowed as long; AtomicU8 has alignment 1
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) }
}

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_LINK_TYPE_XDP` of `enum bpf_link_type`.
pub const BPF_LINK_TYPE_XDP: u32 = 6;

/// The `obj_pin` member of `union bpf_attr`.
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The `info` member of `union bpf_attr`.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// (link type, XDP ifindex) of the bpf_link pinned at `pin`. The ifindex is
/// 0 when the link is defunct: its interface was deleted (the kernel detaches
/// an XDP link when its device unregisters, and the link stays pinned).
pub fn pinned_link_ifindex(pin: &Path) -> Result<(u32, u32), Error> {
    pinned_link_info(pin).map(|i| (i.link_type, i.ifindex))
}

/// What `bpf_link_info` says of a pinned XDP link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedLinkInfo {
    /// `enum bpf_link_type` ([`BPF_LINK_TYPE_XDP`] for ours).
    pub link_type: u32,
    /// The id of the program inside the link.
    pub prog_id: u32,
    /// The interface it drives; 0 when defunct.
    pub ifindex: u32,
}

/// [`PinnedLinkInfo`] of the bpf_link pinned at `pin`.
pub fn pinned_link_info(pin: &Path) -> Result<PinnedLinkInfo, Error> {
    let path = CString::new(pin.as_os_str().as_encoded_bytes()).map_err(|e| Error::Syscall {
        call: "bpf(BPF_OBJ_GET)",
        source: std::io::Error::other(e),
    })?;
    let mut get = ObjGetAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    let fd = sys_bpf(
        BPF_OBJ_GET,
        (&mut get as *mut ObjGetAttr).cast(),
        size_of::<ObjGetAttr>(),
    );
    if fd < 0 {
        return Err(Error::Syscall {
            call: "bpf(BPF_OBJ_GET)",
            source: std::io::Error::last_os_error(),
        });
    }
    let fd = owned(fd as i32);
    // struct bpf_link_info: type, id, prog_id, (pad), then the union at 16;
    // for XDP its first member is the ifindex
    let mut info = [0u64; 8];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    let rc = sys_bpf(
        BPF_OBJ_GET_INFO_BY_FD,
        (&mut attr as *mut InfoAttr).cast(),
        size_of::<InfoAttr>(),
    );
    if rc < 0 {
        return Err(Error::Syscall {
            call: "bpf(BPF_OBJ_GET_INFO_BY_FD)",
            source: std::io::Error::last_os_error(),
        });
    }
    let word = |i: usize| {
        let b = info[i / 2].to_ne_bytes();
        let o = (i % 2) * 4;
        u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    };
    Ok(PinnedLinkInfo {
        link_type: word(0),
        prog_id: word(2),
        ifindex: word(4),
    })
}

/// The index of interface `name` in the calling thread's network namespace;
/// 0 if there is no such interface.
pub fn if_index(name: &str) -> u32 {
    CString::new(name).map_or(0, |c| if_nametoindex(&c))
}

// SAFETY: if_nametoindex reads the NUL-terminated string, which outlives the call.
#[allow(unsafe_code)]
fn if_nametoindex(name: &CString) -> u32 {
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

// SAFETY: `fd` was just returned by bpf(2) and is owned by nobody else.
#[allow(unsafe_code)]
fn owned(fd: i32) -> OwnedFd {
    unsafe { OwnedFd::from_raw_fd(fd) }
}

// SAFETY: bpf(2) reads `size` bytes of `attr`, a live #[repr(C)] prefix of
// union bpf_attr whose pointers (path, info buffer) outlive the call, and
// writes at most `info_len` bytes into the info buffer.
#[allow(unsafe_code)]
fn sys_bpf(cmd: libc::c_long, attr: *mut u8, size: usize) -> libc::c_long {
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr, size as libc::c_uint) }
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
            call: "mmap(BPF_F_MMAPABLE array)",
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

// SAFETY: ids.len() <= max_entries was checked, so base + i * stride lies
// inside the mapping for every i; each slot is 8-byte aligned.
#[allow(unsafe_code)]
fn store_ring(base: *mut u8, stride: usize, ids: &[u32]) {
    for (i, &v) in ids.iter().enumerate() {
        unsafe { std::ptr::write_volatile(base.add(i * stride).cast::<u32>(), v) };
    }
}

// SAFETY: base/len are exactly what mmap_shared returned.
#[allow(unsafe_code)]
fn munmap(base: *mut u8, len: usize) {
    unsafe { libc::munmap(base.cast(), len) };
}
