//! Entering a network namespace for one thread: the one `setns(2)` call every program
//! and test harness shares (the edge's netlink sockets in a named namespace, the lab's
//! API bridge, the XDP benchmark's client).
//!
//! A socket keeps the namespace it was created in, so the pattern is: enter on a
//! thread made for it, create the socket there, let the thread end.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// Moves the calling thread (only) into the network namespace `fd` refers to.
#[allow(unsafe_code)] // setns(2) has no safe wrapper in libc
pub fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns takes a valid, open descriptor (borrowed for the call) and only
    // changes the network namespace of the calling thread.
    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens `/run/netns/NAME` (as `ip netns add` creates it), refusing names that are
/// not a single path component.
pub fn open_named(name: &str) -> io::Result<File> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::other(format!(
            "{name:?} is not a namespace name"
        )));
    }
    File::open(format!("/run/netns/{name}"))
}

/// Moves the calling thread into the named namespace.
pub fn enter_named(name: &str) -> io::Result<()> {
    setns_net(open_named(name)?.as_fd())
}

/// Runs `make` (which creates sockets) inside namespace `name`, on a thread made for
/// it; no other thread of the process changes namespace.
pub fn in_named<T: Send>(name: &str, make: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = open_named(name)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            setns_net(ns.as_fd())?;
            make()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn refuses_names_that_are_paths() {
        for bad in ["", "a/b", ".", ".."] {
            assert!(super::open_named(bad).is_err(), "{bad:?}");
        }
    }
}
