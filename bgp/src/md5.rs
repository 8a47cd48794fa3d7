//! TCP MD5 signatures (RFC 2385) through the Linux `TCP_MD5SIG` socket option.
//!
//! The key is bound to the peer's address: set it on the listening socket for every
//! peer with a password (passive open), and on the connecting socket before
//! `connect()` (active open). A zero-length key removes it.

use std::net::IpAddr;
use std::os::fd::AsRawFd;

/// Largest key the kernel takes.
pub const MAX_KEY_LEN: usize = 80;

/// `struct tcp_md5sig` from `<linux/tcp.h>`.
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: libc::c_int,
    key: [u8; MAX_KEY_LEN],
}

#[derive(Debug, thiserror::Error)]
pub enum Md5Error {
    #[error("TCP MD5 key for {peer} is {len} bytes; the kernel takes 1..=80")]
    KeyLength { peer: IpAddr, len: usize },
    #[error("setsockopt(TCP_MD5SIG) for {peer}: {source}")]
    Setsockopt {
        peer: IpAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Md5Error {
    /// True when the kernel has no TCP MD5 support (CONFIG_TCP_MD5SIG unset).
    pub fn unsupported(&self) -> bool {
        matches!(self, Md5Error::Setsockopt { source, .. }
            if source.raw_os_error() == Some(libc::ENOPROTOOPT))
    }
}

fn sockaddr_for(peer: IpAddr, socket_is_v6: bool) -> libc::sockaddr_storage {
    // SAFETY-free construction: zeroed storage, then the family-specific prefix.
    let mut ss: libc::sockaddr_storage = zeroed_storage();
    let peer = match (peer, socket_is_v6) {
        (IpAddr::V4(a), true) => IpAddr::V6(a.to_ipv6_mapped()),
        (p, _) => p,
    };
    match peer {
        IpAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                },
                sin_zero: [0; 8],
            };
            write_prefix(&mut ss, &sin);
        }
        IpAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                sin6_scope_id: 0,
            };
            write_prefix(&mut ss, &sin6);
        }
    }
    ss
}

#[allow(unsafe_code)] // plain-old-data zero init of a libc struct
fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is a C struct of integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

#[allow(unsafe_code)] // copy a sockaddr_in/in6 into the front of sockaddr_storage
fn write_prefix<T>(ss: &mut libc::sockaddr_storage, v: &T) {
    assert!(size_of::<T>() <= size_of::<libc::sockaddr_storage>());
    // SAFETY: T is a sockaddr_* POD no larger than sockaddr_storage (checked above);
    // both pointers are valid and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (v as *const T).cast::<u8>(),
            (ss as *mut libc::sockaddr_storage).cast::<u8>(),
            size_of::<T>(),
        );
    }
}

/// Install (or with an empty `key`, remove) the MD5 key for `peer` on `sock`.
pub fn set_md5_key(
    sock: &impl AsRawFd,
    socket_is_v6: bool,
    peer: IpAddr,
    key: &[u8],
) -> Result<(), Md5Error> {
    if key.len() > MAX_KEY_LEN {
        return Err(Md5Error::KeyLength {
            peer,
            len: key.len(),
        });
    }
    let mut sig = TcpMd5Sig {
        addr: sockaddr_for(peer, socket_is_v6),
        flags: 0,
        prefixlen: 0,
        keylen: key.len() as u16,
        ifindex: 0,
        key: [0; MAX_KEY_LEN],
    };
    sig.key[..key.len()].copy_from_slice(key);
    setsockopt_md5(sock.as_raw_fd(), &sig).map_err(|source| Md5Error::Setsockopt { peer, source })
}

#[allow(unsafe_code)] // the one libc call: setsockopt(fd, IPPROTO_TCP, TCP_MD5SIG, &sig)
fn setsockopt_md5(fd: libc::c_int, sig: &TcpMd5Sig) -> std::io::Result<()> {
    // SAFETY: `sig` is a valid, initialised repr(C) tcp_md5sig for the duration of the
    // call and its exact size is passed; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            (sig as *const TcpMd5Sig).cast::<libc::c_void>(),
            size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_matches_the_kernel_abi() {
        // 128 (sockaddr_storage) + 1 + 1 + 2 + 4 + 80
        assert_eq!(size_of::<TcpMd5Sig>(), 216);
    }

    #[test]
    fn key_too_long_is_refused_before_the_syscall() {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = set_md5_key(&s, false, "127.0.0.1".parse().unwrap(), &[b'x'; 81]).unwrap_err();
        assert!(matches!(e, Md5Error::KeyLength { len: 81, .. }));
    }

    #[test]
    fn key_can_be_set_on_a_listener() {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        match set_md5_key(&s, false, "127.0.0.2".parse().unwrap(), b"secret") {
            Ok(()) => {}
            Err(e) if e.unsupported() => {
                eprintln!("SKIP: kernel without TCP_MD5SIG ({e})");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
