//! setsockopt(2) for the options socket2 does not offer (the speaker's
//! `TCP_MD5SIG`, `IP_MINTTL`, `IP_RECVTTL` and their IPv6 twins, the XDP
//! benchmark's `AF_PACKET` options): the one call of it programs and benchmarks
//! share.

use std::io;
use std::os::fd::RawFd;

/// Sets option `level`/`name` of socket `fd` to `value`, a plain C value (an
/// `int`, a `repr(C)` struct) laid out as the option expects.
#[allow(unsafe_code)] // the one libc call: setsockopt(fd, level, name, &value)
pub fn set<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live, initialised `T` for the duration of the call and
    // its exact size is passed; the kernel only reads it (a bad `fd` is EBADF).
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast::<libc::c_void>(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// [`set`] of an `int` option.
pub fn set_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    set(fd, level, name, &value)
}
