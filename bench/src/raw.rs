//! A raw IPv4 socket (IP_HDRINCL) to send crafted UDP packets, each a new
//! flow, without a socket per flow.
use std::{
    io,
    net::Ipv4Addr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

pub(crate) struct RawSock(OwnedFd);

impl RawSock {
    pub(crate) fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned by OwnedFd right away.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor nobody else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    pub(crate) fn send(&self, pkt: &[u8], dst: Ipv4Addr) -> io::Result<()> {
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: pkt and sa are valid for the lengths given; sendto does
        // not keep the pointers.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&sa as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
