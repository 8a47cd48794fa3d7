//! The TTL (IPv4) or hop limit (IPv6) of a session's packets, and GTSM (RFC 5082).
//!
//! - iBGP: the kernel default.
//! - eBGP without `ebgpMultihop`: 1, so the session cannot leave the link.
//! - `ebgpMultihop: N`: N.
//! - `ttlSecurity`: send 255 and make the kernel drop every segment from the peer
//!   that arrives with less than 256 - hops (hops = `ebgpMultihop`, default 1;
//!   `IP_MINTTL` / `IPV6_MINHOPCOUNT`), so a spoofer further away cannot reach
//!   the session.

use std::os::fd::AsFd;

use super::config::PeerConfig;

/// Socket settings for one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlPolicy {
    /// TTL / hop limit to send with; `None`: the kernel default.
    pub send: Option<u8>,
    /// Least TTL / hop limit accepted from the peer (GTSM).
    pub min_recv: Option<u8>,
}

/// The policy of `cfg` (pure).
pub fn policy(cfg: &PeerConfig) -> TtlPolicy {
    if cfg.ttl_security {
        let hops = u16::from(cfg.ebgp_multihop.unwrap_or(1).max(1));
        return TtlPolicy {
            send: Some(255),
            min_recv: Some((256 - hops) as u8),
        };
    }
    let send = match cfg.ebgp_multihop {
        Some(n) => Some(n),
        None if !cfg.is_ibgp() => Some(1),
        None => None,
    };
    TtlPolicy {
        send,
        min_recv: None,
    }
}

/// IPv6 socket option, from `<linux/in6.h>` (the libc crate lacks it).
const IPV6_MINHOPCOUNT: libc::c_int = 73;

/// Applies `p` to a socket of family `v6`.
pub fn apply(sock: &impl AsFd, v6: bool, p: TtlPolicy) -> std::io::Result<()> {
    let s = socket2::SockRef::from(sock);
    if let Some(t) = p.send {
        if v6 {
            s.set_unicast_hops_v6(u32::from(t))?;
        } else {
            s.set_ttl_v4(u32::from(t))?;
        }
    }
    if let Some(m) = p.min_recv {
        let (level, name) = if v6 {
            (libc::IPPROTO_IPV6, IPV6_MINHOPCOUNT)
        } else {
            (libc::IPPROTO_IP, libc::IP_MINTTL)
        };
        setsockopt_int(sock, level, name, libc::c_int::from(m))?;
    }
    Ok(())
}

#[allow(unsafe_code)] // the one libc call: setsockopt(fd, level, name, &int)
fn setsockopt_int(
    sock: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid fd, a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ExportPolicy, PeerSpec, peer_from_spec};

    fn cfg(my: u32, multihop: Option<u8>, gtsm: bool) -> PeerConfig {
        let spec = PeerSpec {
            peer_address: "10.0.0.1".into(),
            peer_asn: 65000,
            my_asn: my,
            ebgp_multihop: multihop,
            ttl_security: gtsm,
            ..Default::default()
        };
        peer_from_spec(&spec, "10.0.0.11".parse().unwrap(), ExportPolicy::default()).unwrap()
    }

    #[test]
    fn single_hop_ebgp_sends_ttl_1_ibgp_the_default_multihop_n() {
        let p = |send, min_recv| TtlPolicy { send, min_recv };
        assert_eq!(policy(&cfg(65011, None, false)), p(Some(1), None));
        assert_eq!(policy(&cfg(65000, None, false)), p(None, None));
        assert_eq!(policy(&cfg(65011, Some(4), false)), p(Some(4), None));
        assert_eq!(policy(&cfg(65011, None, true)), p(Some(255), Some(255)));
        assert_eq!(policy(&cfg(65011, Some(2), true)), p(Some(255), Some(254)));
        assert_eq!(policy(&cfg(65000, Some(255), true)), p(Some(255), Some(1)));
    }

    #[test]
    fn applies_to_v4_and_v6_sockets() {
        for v6 in [false, true] {
            let s = if v6 {
                std::net::UdpSocket::bind("[::1]:0")
            } else {
                std::net::UdpSocket::bind("127.0.0.1:0")
            };
            let Ok(s) = s else { continue };
            let pol = TtlPolicy {
                send: Some(255),
                min_recv: Some(254),
            };
            apply(&s, v6, pol).unwrap();
            let r = socket2::SockRef::from(&s);
            let got = if v6 {
                r.unicast_hops_v6().unwrap()
            } else {
                r.ttl_v4().unwrap()
            };
            assert_eq!(got, 255, "v6={v6}");
        }
    }
}
